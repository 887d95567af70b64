// The peer's side of `scripts/bench --peers`: Powertools for AWS Lambda (TypeScript) idempotency
// over Redis (its CachePersistenceLayer on @redis/client), on the workload bench/peers_gate.cpp
// runs: the same deliveries (same generator, same order), a side effect counted exactly, 4 and 16
// concurrent workers. With --business=URI (the fair peer) the side effect also writes the
// business row the gate writes, into the same PostgreSQL and a table of the same shape: one
// prepared INSERT per event through node-postgres (a pool of 16 connections), autocommit, as a
// Powertools user writes it; without it (the effect-only peer) the side effect is a counter. It runs an untimed warm-up round of every mode, then the
// timed round, and prints `name<TAB>metric<TAB>value` lines that scripts/bench gathers.
//
// Modes, each with 4 and 16 workers (async loops in this one process, one connected Redis
// client shared by all, as a Lambda function keeps one):
//   peer/single_W    a handler wrapped by makeIdempotent, called with (event, context)
//   peer/batch10_W   10 deliveries at a time as one SQS-shaped event, through BatchProcessor
//                    and processPartialResponse, whose record handler is wrapped by makeIdempotent
//   peer/race        16 calls of one new event at once (its side effects must be 1)
// and peer/process: cpu_s of this process over all its deliveries (warm-up and race included).
// A Lambda context is passed to every call: makeIdempotent registers it, and the in-progress
// record then carries an expiry; without one, a concurrent duplicate would run the handler again.
//
// Usage: node powertools.mjs --modules=DIR --redis=HOST:PORT [--business=URI] [--side=NAME]
//          [--events=N] [--warm-up-events=N] [--duplicate-percent=N] [--tag=TEXT]
// NAME prefixes every line (default "peer").
// DIR holds node_modules with the packages scripts/bench installs (pinned versions).

import { createHash } from 'node:crypto';
import { createRequire } from 'node:module';
import path from 'node:path';

const flags = Object.fromEntries(
  process.argv.slice(2).map((arg) => {
    const m = /^--([a-z-]+)=(.*)$/.exec(arg);
    if (!m) {
      console.error(`powertools.mjs: unknown argument ${arg}`);
      process.exit(2);
    }
    return [m[1], m[2]];
  }),
);
if (!flags.modules || !flags.redis) {
  console.error('usage: node powertools.mjs --modules=DIR --redis=HOST:PORT [--events=N] ...');
  process.exit(2);
}
const events = Number(flags.events ?? 2000);
const warmUpEvents = Number(flags['warm-up-events'] ?? 1000);
const duplicatePercent = Number(flags['duplicate-percent'] ?? 3);
const tag = flags.tag ?? String(process.pid);
const side = flags.side ?? 'peer';

const require = createRequire(path.join(path.resolve(flags.modules), 'package.json'));
const { makeIdempotent, IdempotencyConfig } = require('@aws-lambda-powertools/idempotency');
const { IdempotencyAlreadyInProgressError } = require('@aws-lambda-powertools/idempotency');
const { CachePersistenceLayer } = require('@aws-lambda-powertools/idempotency/cache');
const { BatchProcessor, EventType, processPartialResponse } = require('@aws-lambda-powertools/batch');
const { createClient } = require('@redis/client');

// The deliveries of one mode, exactly as peers_gate.cpp draws them (mulberry32, same seed, same
// order of draws): `n` event numbers, `duplicatePercent` % of them repeating an earlier one.
function deliveries(n) {
  let state = 0x1de49a7e;
  const next = () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1) >>> 0;
    t = (t ^ (t + Math.imul(t ^ (t >>> 7), t | 61))) >>> 0;
    return (t ^ (t >>> 14)) >>> 0;
  };
  const duplicates = Math.floor((n * duplicatePercent) / 100);
  const distinct = n - duplicates;
  const order = [];
  for (let i = 0; i < distinct; ++i) order.push(i);
  for (let i = 0; i < duplicates; ++i) order.push(next() % distinct);
  for (let i = n - 1; i > 0; --i) {
    const j = next() % (i + 1);
    [order[i], order[j]] = [order[j], order[i]];
  }
  return { order, distinct };
}

const request = 'MSKU7000037|2025-06-09T10:00/11:00|ECT Delta|import';
const outcome = 'slot-4711';

// What a Lambda runtime passes as the context; the remaining time bounds the in-progress record.
const context = {
  callbackWaitsForEmptyEventLoop: true,
  functionName: 'peers-claim',
  functionVersion: '$LATEST',
  invokedFunctionArn: 'arn:aws:lambda:eu-west-1:123456789012:function:peers-claim',
  memoryLimitInMB: '1024',
  awsRequestId: 'peers-bench',
  logGroupName: '/aws/lambda/peers-claim',
  logStreamName: 'peers-bench',
  getRemainingTimeInMillis: () => 60_000,
  done() {},
  fail() {},
  succeed() {},
};

const [host, port] = flags.redis.split(':');
const client = await createClient({ url: `redis://${host}:${port}` }).connect();

// The fair peer's business table: the shape of the gate's (bench/peers_gate.cpp), the key the
// event's SHA-256.
const businessTable = 'peers_peer_business';
let pool;
if (flags.business) {
  const { Pool } = require('pg');
  pool = new Pool({ connectionString: flags.business, max: 16 });
  await pool.query(
    `CREATE TABLE IF NOT EXISTS ${businessTable} ` +
      '(key bytea PRIMARY KEY, request text NOT NULL, outcome text NOT NULL)',
  );
}

async function businessRows(prefix) {
  if (!pool) return 0;
  const { rows } = await pool.query(
    `SELECT count(*)::int AS n FROM ${businessTable} WHERE request LIKE $1`,
    [`${prefix}%`],
  );
  return rows[0].n;
}

let sideEffects = 0;
const effects = new Map(); // event id -> side effects, for the race

// The side effect: counted, once per run of the handler; the fair peer's writes the business
// row too, one prepared INSERT in autocommit (a second row for an event would be refused).
async function sideEffect(id) {
  sideEffects += 1;
  effects.set(id, (effects.get(id) ?? 0) + 1);
  if (pool) {
    await pool.query({
      name: 'peers_peer_business_insert',
      text: `INSERT INTO ${businessTable} (key, request, outcome) VALUES ($1, $2, $3)`,
      values: [createHash('sha256').update(id).digest(), `${id}|${request}`, outcome],
    });
  }
  return { outcome };
}

function singleHandler() {
  return makeIdempotent(async (event, _context) => sideEffect(event.id), {
    persistenceStore: new CachePersistenceLayer({ client }),
    config: new IdempotencyConfig({ eventKeyJmesPath: 'id' }),
  });
}

function batchRecordHandler() {
  return makeIdempotent(
    async (record, _context) => sideEffect(record.messageAttributes.event_id.stringValue),
    {
      persistenceStore: new CachePersistenceLayer({ client }),
      config: new IdempotencyConfig({ eventKeyJmesPath: 'messageAttributes.event_id.stringValue' }),
    },
  );
}

function sqsRecord(index, id) {
  const body = `${id}|${request}`;
  return {
    messageId: `m-${index}`,
    receiptHandle: `r-${index}`,
    body,
    attributes: {
      ApproximateReceiveCount: '1',
      SentTimestamp: '1717920000000',
      SenderId: 'peers-bench',
      ApproximateFirstReceiveTimestamp: '1717920000000',
    },
    messageAttributes: { event_id: { stringValue: id, dataType: 'String' } },
    md5OfBody: '',
    eventSource: 'aws:sqs',
    eventSourceARN: 'arn:aws:sqs:eu-west-1:123456789012:peers',
    awsRegion: 'eu-west-1',
  };
}

function count(tally, status, n = 1) {
  tally.set(status, (tally.get(status) ?? 0) + n);
}

function statusOf(error) {
  if (error instanceof IdempotencyAlreadyInProgressError) return 'in_progress';
  console.error(`powertools.mjs: ${error?.stack ?? error}`);
  return 'error';
}

// Runs `order` with `workers` concurrent loops; returns the wall time in seconds.
async function run(mode, prefix, order, tally) {
  let next = 0;
  const step = mode.batch ? 10 : 1;
  const worker = async () => {
    const processor = mode.batch ? new BatchProcessor(EventType.SQS) : undefined;
    for (;;) {
      const from = next;
      if (from >= order.length) return;
      next += step;
      const to = Math.min(order.length, from + step);
      if (mode.batch) {
        const Records = [];
        for (let i = from; i < to; ++i) Records.push(sqsRecord(i, prefix + order[i]));
        let failures;
        try {
          const response = await processPartialResponse({ Records }, mode.handler, processor, {
            context,
          });
          failures = response.batchItemFailures.length;
        } catch (error) {
          if (error?.name !== 'FullBatchFailureError') throw error;
          failures = Records.length;
        }
        for (const e of processor.errors) count(tally, statusOf(e));
        count(tally, 'ok', Records.length - failures);
      } else {
        const id = prefix + order[from];
        try {
          await mode.handler({ id, request: `${id}|${request}` }, context);
          count(tally, 'ok');
        } catch (error) {
          count(tally, statusOf(error));
        }
      }
    }
  };
  const started = process.hrtime.bigint();
  await Promise.all(Array.from({ length: mode.workers }, worker));
  return Number(process.hrtime.bigint() - started) / 1e9;
}

function print(name, metric, value) {
  process.stdout.write(`${name}\t${metric}\t${value}\n`);
}

const modes = [];
for (const workers of [4, 16]) {
  modes.push({ name: `single_${workers}`, workers, batch: false, handler: singleHandler() });
  modes.push({ name: `batch10_${workers}`, workers, batch: true, handler: batchRecordHandler() });
}

let failed = false;
async function round(n, phase, timed) {
  const { order, distinct } = deliveries(n);
  for (const mode of modes) {
    const prefix = `${tag}-${phase}-${mode.name}-`;
    const tally = new Map();
    const before = sideEffects;
    const seconds = await run(mode, prefix, order, tally);
    const effectsHere = sideEffects - before;
    if (effectsHere !== distinct) {
      console.error(`powertools.mjs: ${mode.name}: ${effectsHere} side effects for ${distinct} events`);
    }
    if (tally.has('error')) failed = true;
    if (!timed) continue;
    const name = `${side}/${mode.name}`;
    print(name, 'events_per_s', n / seconds);
    print(name, 'deliveries', n);
    print(name, 'distinct', distinct);
    print(name, 'side_effects', effectsHere);
    if (pool) print(name, 'business_rows', await businessRows(prefix));
    for (const [status, k] of [...tally].sort()) print(name, `status_${status}`, k);
  }
}

// 16 calls of one new event at the same moment: one side effect.
async function race(phase) {
  const handler = singleHandler();
  const id = `${tag}-${phase}-race-0`;
  const tally = new Map();
  await Promise.all(
    Array.from({ length: 16 }, async () => {
      try {
        await handler({ id, request: `${id}|${request}` }, context);
        count(tally, 'ok');
      } catch (error) {
        count(tally, statusOf(error));
      }
    }),
  );
  print(`${side}/race`, 'deliveries', 16);
  print(`${side}/race`, 'side_effects', effects.get(id) ?? 0);
  if (pool) print(`${side}/race`, 'business_rows', await businessRows(id));
  for (const [status, k] of [...tally].sort()) print(`${side}/race`, `status_${status}`, k);
}

try {
  await round(warmUpEvents, 'warm', false);
  await round(events, 'timed', true);
  await race('timed');
  // This process's CPU over every delivery it made (scripts/bench sets it beside the server's).
  const { user, system } = process.cpuUsage();
  print(`${side}/process`, 'cpu_s', (user + system) / 1e6);
  print(`${side}/process`, 'deliveries', modes.length * (warmUpEvents + events) + 16);
} finally {
  await client.quit();
  if (pool) await pool.end();
}
process.exit(failed ? 1 : 0);

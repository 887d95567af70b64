/*
 * idemgate's gate protocol for the SPIN model checker: one event (one key, one row) by default;
 * two rows with GROUP (two events of one gate) or GATES (one event, two gates).
 * docs/model/README.md maps every process and variable to the header and function it models;
 * scripts/model-check runs every configuration and every mutant (docs/model/mutants/).
 *
 * Configurations (cpp switches, given to spin as -D...):
 *   (none)      a downstream that honours Idempotency-Key and can look up by key; durable
 *               reservations; operator re-drive of failed events; retention
 *   RELAXED=m   relaxed writes, a mask: 1 relaxed reservations (a database crash loses
 *               unflushed reservations/takeovers); 2 relaxed outcomes (a Gate's outcome commits,
 *               the reconciler's included: a database crash loses unflushed ones, the row back in
 *               flight under its fence and its business row gone, while the caller's ack stands);
 *               3 both. With ONCE, only 2: a TransactionGate's commit stays durable
 *   NOKEYS      a downstream that ignores keys (it can still look up); relaxed reservations are
 *               off, as Gate refuses them with such a downstream (and relaxed outcomes: its gate
 *               never has an outcome to commit)
 *   POISON      the business write throws on every attempt; a message is dead-lettered after
 *               MAXDELIV deliveries, and the row must end escalated
 *   NOREDRIVE   no operator re-drive
 *   HEARTBEAT   the gate's heartbeat renews a worker's lease while it works; a renewal may fail
 *               or hang without an answer (F_HB), and the lease may then run out under the
 *               living worker
 *   GROUP       two events of one gate; every commit, the reconciler's too, goes through group
 *               commit (GateOptions::coalesce)
 *   GATES       one upstream event, two gates on one log deriving the same key (fan-out): rows
 *               are (gate, key); each gate has its own downstream, business table, reconciler,
 *               retention and operator
 *   UPGRADE     the upgrade window: the version before gates committed the event (its row
 *               belongs to no gate); the new version's workers deliver it again while an
 *               operator's adopt runs at any moment, before, between or after them
 *   ONCE        the one-transaction mode (TransactionGate): every delivery runs its reservation,
 *               business write and commit in one transaction (commit_once); no downstream, and
 *               no reconciler unless MIXED (a TransactionGate has none: its rows never stay in
 *               flight)
 *   MIXED       with ONCE: worker 0 is an ordinary Gate of the same name, whose in-flight row the
 *               others take over once its lease ran out; that gate's reconciler runs
 *   NW=n        workers (2 or 3). One row: deliveries of the event. Two rows: with NW=2 worker i
 *               delivers to row i; with 3, workers 0 and 1 to row 0, worker 2 to row 1
 *   NREC=n      reconcilers (1 or 2; by default 1 with GROUP, else 2; with GATES, one a gate;
 *               with ONCE, 0, or 1 with MIXED)
 *   MAXF=n      faults in one run; after the n-th, faults stop
 *   FAULTS=mask the fault kinds (F_* below; all by default)
 *   LIVENESS    adds the LTL property (check it with pan -a -f)
 */

#ifndef MAXF
#define MAXF 2
#endif
#ifdef NOKEYS
#define HONOURS 0
#undef RELAXED
#define RELAXED 0
#else
#define HONOURS 1
#endif
#ifndef RELAXED
#define RELAXED 0
#endif
#ifdef POISON
#define THROWS 1
#else
#define THROWS 0
#endif
/* fault classes (FAULTS is a mask of them; all by default) */
#define F_CRASH 1  /* a worker or reconciler process dies */
#define F_CUT 2    /* a connection cut mid-statement; a reply lost, COMMIT's included */
#define F_DB 4     /* a database crash loses unflushed (relaxed) writes */
#define F_THROW 8  /* the business write throws */
#define F_TRANS 16 /* the downstream fails for now (claim or lookup) */
#define F_STALL 32 /* a holder outlives its lease (a stall of its whole process) */
#define F_HB 64    /* a lease renewal fails, or hangs without an answer (HEARTBEAT) */
#ifndef FAULTS
#define FAULTS 127
#endif
#define FAULT(c) ((FAULTS & (c)) && faults < MAXF)

#ifndef MAXDELIV
#define MAXDELIV 2 /* deliveries of one message before the queue dead-letters it (POISON) */
#endif

/* rows, processes, gates */
#if defined(GROUP) && defined(GATES)
#error "GROUP and GATES are separate configurations"
#endif
#if defined(GROUP) || defined(GATES)
#define NR 2 /* rows of the log */
#else
#define NR 1
#endif
#define RELAXED_RESERVATIONS (RELAXED & 1)
#define RELAXED_OUTCOMES (RELAXED & 2)
#if RELAXED_RESERVATIONS && RELAXED_OUTCOMES
#error "RELAXED=3: the store refuses relaxed reservations and relaxed outcomes together (D3)"
#endif
#if RELAXED && NR > 1
#error "RELAXED is checked on one row: with two, flush() would have to flush both"
#endif
#if defined(UPGRADE) && (RELAXED || NR > 1 || !HONOURS || THROWS)
#error "UPGRADE is checked on one row, durable reservations, a downstream that honours keys"
#endif
#if defined(HEARTBEAT) && (!HONOURS || THROWS)
#error "HEARTBEAT is checked with a downstream that honours keys, without POISON"
#endif
#if defined(ONCE) && (RELAXED_RESERVATIONS || NR > 1 || !HONOURS || THROWS || \
                      defined(HEARTBEAT) || defined(UPGRADE))
#error "ONCE is checked on one row, durable reservations, without POISON, HEARTBEAT, UPGRADE"
#endif
#if defined(MIXED) && !defined(ONCE)
#error "MIXED goes with ONCE"
#endif
#ifndef NW
#define NW 3 /* workers: deliveries */
#endif
#ifndef NREC
#if defined(GROUP) || defined(MIXED)
#define NREC 1 /* reconcilers */
#elif defined(ONCE)
#define NREC 0
#else
#define NREC 2
#endif
#endif
#define NP (NW + NREC) /* workers 0 .. NW-1, then reconcilers */
#define ALLW ((1 << NW) - 1) /* every worker's bit in wacked */
#if NR == 1
#define WROW(i) 0
#elif NW == 2
#define WROW(i) i /* the row worker i delivers */
#else
#define WROW(i) (i < 2 -> 0 : 1)
#endif
#ifdef GATES
#define GATE_OF(i) i /* row i is gate i's row of the key */
#define EV g         /* the event a process's downstream and business write act on: its gate's */
#else
#define GATE_OF(i) 0
#define EV k         /* ... the row's */
#endif
#define TOKS (1 + 2 * NR) /* holder tokens per process: more than the rows' live and durable ones */
#define RB 20             /* reconcilers' tokens start here; workers' below */

#define MAXA 2 /* ReconcilerOptions::max_attempts */
#define CA 2   /* PostgresOptions::commit_attempts */

/* RecordStatus */
#define INF 1 /* in_flight */
#define COM 2 /* committed */
#define FAI 3 /* failed */
#define ESC 4 /* escalated */

/* outcomes and downstream answers */
#define OK_A 1
#define OK_B 2
#define PERM 3     /* PermanentFailure */
#define TRANS 4    /* TransientFailure */
#define NOTFOUND 5 /* NotFound (lookup) */

/* what a reservation found */
#define R_ACQ 1     /* Reservation::acquired */
#define R_TAKEN 2   /* Reservation::taken_over */
#define R_EXPIRED 3 /* in flight, same request, lease expired: try the takeover */
#define R_EXIST 4   /* Reservation::existing */

/* CommitStatus, and how a fenced write ended */
#define C_COMMITTED 1 /* CommitStatus::committed */
#define C_LOST 2      /* CommitStatus::lost_lease */
#define C_STOREERR 3  /* StoreError thrown */
#define C_THREW 4     /* the business write threw */
#define C_DIED 5      /* the process died with the commit group it waited in (GROUP) */

/* ---- the idempotency log's rows: the live copy, and the durable copy (flushed WAL) ---- */
bool rex[NR];    /* the row exists */
byte rst[NR];    /* status */
byte rfence[NR]; /* fence */
byte rhold[NR];  /* holder token */
bool rlive[NR];  /* lease_until >= now() */
byte ratt[NR];   /* attempts, saturating at MAXA + 1 */
byte rout[NR];   /* result (committed outcome) */
bool dex[NR];
byte dst[NR], dfence[NR], dhold[NR], datt[NR], dout[NR];
bool dlive[NR];
#ifdef UPGRADE
bool unowned[NR]; /* the row belongs to no gate (gate = ''): written before logs knew gates */
#define OWNED(i) !unowned[i]
#else
#define OWNED(i) 1
#endif
#ifdef ONCE
/* The key held by an open transaction of commit_once (its uncommitted insert, or the row lock of
   its takeover) until it ends: 0 none, w + 1 worker w's, ORPHAN one whose session is gone (its
   worker died or its connection broke: the database rolls it back once it notices). Every other
   writer of the key waits meanwhile. */
byte oheld[NR];
#define ORPHAN 255
#define FREE(i) (oheld[i] == 0)
#define WAIT_KEY oheld[k] == 0 ->
#define WAIT_KEY_AND oheld[k] == 0 &&
#else
#define FREE(i) 1
#define WAIT_KEY
#define WAIT_KEY_AND
#endif

/* ---- per event (a row's gate and key): the business table and the downstream ---- */
byte biz[NR];    /* business rows for this event */
byte bizout[NR]; /* the outcome the business row was written with */
byte dsout[NR];  /* the outcome the downstream holds under the key (0: none) */
byte dsseen[NR]; /* every outcome the downstream ever produced for the event (bits: A = 1, B = 2) */
byte dscalls;    /* calls of a downstream that ignores keys */
#if RELAXED_OUTCOMES
byte dbiz[NR], dbizout[NR]; /* the business table as the flushed WAL holds it */
#endif

/* ---- environment and ghosts ---- */
bit P1_, P2_, P3_, P4_, P5_, P6_, P7_, P8_, P9_; /* always 0: they name the property in a
                                                    violated assertion */
#ifdef ONCE
bit P10_;
#endif
byte faults;         /* faults so far; MAXF is the budget */
byte hi[NR];         /* highest fence the row ever held durably */
bool gone_final[NR]; /* retention deleted the row after it was committed or failed */
byte wacked;         /* a bit per worker whose message was acked (or dead-lettered) */
byte cur[NP];        /* the token of the attempt each process is running (0: none) */

/* A synchronous commit flushes the WAL: everything written so far is durable, the business
   table's unflushed rows included. (With two rows every write is synchronous, so the other row
   is durable already.) */
inline flush() {
  dex[k] = rex[k]; dst[k] = rst[k]; dfence[k] = rfence[k]; dhold[k] = rhold[k];
  dlive[k] = rlive[k]; datt[k] = ratt[k]; dout[k] = rout[k];
#if RELAXED_OUTCOMES
  dbiz[k] = biz[k]; dbizout[k] = bizout[k];
#endif
  if
  :: dex[k] -> assert(!P4_ && dfence[k] >= hi[k]); /* fences never decrease */
     hi[k] = dfence[k]
  :: else -> skip
  fi
}

/* A reservation or takeover: durable at once, or (relaxed) only at the next flush. */
inline relaxed_write() {
#if RELAXED_RESERVATIONS
  skip
#else
  flush()
#endif
}

/* A Gate's outcome commit (the business write and the row committed with its result, the
   reconciler's too): durable at once, or (relaxed outcomes: SET LOCAL synchronous_commit = off)
   only at the next flush, which any later synchronous commit brings. */
inline outcome_write() {
#if RELAXED_OUTCOMES
  skip
#else
  flush()
#endif
}

/* Safety properties that hold in every state a store transaction leaves: P1 one business row
   per event; P2 a committed row has its business row, written with the row's outcome (with
   relaxed outcomes, and a business row its committed row, or the row was purged after it
   committed); P3 one
   downstream outcome per key, and it is the log's; P4 fences never decrease. With ONCE, P10: no
   row is in flight under a one-transaction delivery's holder (its token, which its takeover
   stores too). */
#ifdef ONCE
/* the log's outcome is the business write's own where no downstream was called */
#define LOG_OUT(i) (dsout[i] == 0 || rout[i] == dsout[i])
#ifdef MIXED
#define NGW 1 /* workers that are ordinary Gates: worker 0 */
#else
#define NGW 0
#endif
#define ONCE_TOKEN(t) (t == 0 || (t > TOKS * NGW && t < RB))
#else
#define LOG_OUT(i) (rout[i] == dsout[i])
#endif
#if RELAXED_OUTCOMES
/* ... and a business row its committed row: a crash parts them nowhere else */
#define P2_BACK(i) assert(!P2_ && (biz[i] == 0 || (rex[i] && rst[i] == COM) || gone_final[i]));
#else
#define P2_BACK(i)
#endif
#define INVARIANTS(i) \
  assert(!P1_ && biz[i] <= 1); \
  assert(!P2_ && (!(rex[i] && rst[i] == COM) || (biz[i] == 1 && bizout[i] == rout[i]))); \
  P2_BACK(i) \
  assert(!P3_ && dsseen[i] != 3); \
  assert(!P3_ && (!(rex[i] && rst[i] == COM) || LOG_OUT(i))); \
  assert(!P4_ && (!rex[i] || rfence[i] >= hi[i]))
inline invariants() {
  INVARIANTS(0);
#if NR > 1
  INVARIANTS(1);
#endif
#ifdef ONCE
  assert(!P10_ && !(rex[0] && rst[0] == INF && ONCE_TOKEN(rhold[0])));
#endif
  skip
}

/* P9: a process writes only its own gate's rows. */
#define OWN_ROW assert(!P9_ && GATE_OF(k) == g)

/* One statement through PostgresStore::run / run_on: the first try may be cut after the
   statement ran (its reply lost); the second try runs on a fresh connection, and a cut there is
   a StoreError. (A first try cut before the statement ran, then a second try that answers, is
   the fault-free step.) REPLIED runs only with the reply the caller goes on with. With ONCE, a
   statement on a key that an open one-transaction delivery holds waits for it to end. */
#define RUN(BODY, REPLIED, ONERR) \
  if \
  :: atomic { WAIT_KEY BODY; REPLIED } \
  :: atomic { WAIT_KEY_AND FAULT(F_CUT) -> faults++; BODY }; /* it ran; its reply was lost */ \
     if \
     :: atomic { WAIT_KEY BODY; REPLIED } /* the retry on a fresh connection */ \
     :: atomic { WAIT_KEY_AND FAULT(F_CUT) -> faults++; BODY }; ONERR /* cut again: StoreError */ \
     :: atomic { FAULT(F_CUT) -> faults++ }; ONERR \
     fi \
  :: atomic { (FAULTS & F_CUT) && faults + 2 <= MAXF -> faults = faults + 2 }; ONERR \
  fi

/* A fresh holder token (detail::new_holder_token): random, so it differs from every token the
   rows hold, live or durable. Each process draws from its own TOKS values. */
#if NR == 1
#define TOKEN_TAKEN(t) (t == rhold[0] || t == dhold[0])
#else
#define TOKEN_TAKEN(t) (t == rhold[0] || t == dhold[0] || t == rhold[1] || t == dhold[1])
#endif
inline fresh_token(base) {
  tok = base;
  do
  :: TOKEN_TAKEN(tok) -> tok++
  :: else -> break
  od
}

/* ---- the gate's heartbeat (HEARTBEAT): one thread, one ticket per worker's call ---- */
#ifdef HEARTBEAT
#define HB_SENT 1 /* the renewal under way has no answer yet, and its statement has not run */
#define HB_RAN 2  /* ... its statement ran */
byte hbt[NW];    /* the worker's ticket: 0 none, 1 held and renewed, 2 given up (released) */
byte hbfen[NW];  /* the fence the ticket renews */
bool hbf[NW];    /* failing: the latest renewal answered an error */
bool hbl[NW];    /* lost: a renewal found the fence gone */
bool hbexp[NW];  /* the lease ran out since the last renewal known to have landed started
                    (Heartbeat::drop's test: none did within the last lease) */
bool hbdur[NW];  /* the lease ran out since the renewal that hangs was sent */
bool hbx[NW];    /* ghost: ... and it ran out under the working worker because the heartbeat
                    did not renew it (not a stall of the worker's whole process) */
byte hbh;        /* the heartbeat thread's renewal that hangs without an answer (HB_*), 0: none */
bool hbhx;       /* a lease ran out under its worker while it hangs (one does at most) */
byte hbin;       /* the tickets it renews (a bit per worker), */
byte hbkept;     /* those its statement extended, */
byte hbcur;      /* those still held (not dropped since), */
byte hbinf[NW];  /* and the fence it renews each with */
#define HB_HOLD hbt[w] = 1; hbfen[w] = hf
#define HB_GIVE_UP if :: w < NW -> hbt[w] = 2 :: else -> skip fi
#define HB_DROP(i) \
  hbt[i] = 0; hbfen[i] = 0; hbf[i] = 0; hbl[i] = 0; hbexp[i] = 0; hbdur[i] = 0; hbx[i] = 0; \
  hbcur = hbcur & ~(1 << (i))
#else
#define HB_HOLD skip
#define HB_GIVE_UP skip
#define HB_DROP(i) skip
#endif

/* ---- statements of PostgresStore ---- */

/* idemgate_reserve: insert in flight, or return the row with `holder = $token AS mine`. */
inline reserve_stmt() {
  if
  :: tok == 0 -> fresh_token(1 + TOKS * w); cur[w] = tok
  :: else -> skip
  fi;
  if
  :: !rex[k] ->
     rex[k] = 1; rst[k] = INF; rfence[k] = 1; rhold[k] = tok; rlive[k] = 1; ratt[k] = 1;
     rout[k] = 0;
     relaxed_write(); invariants();
     ans = R_ACQ; hf = 1
  :: else ->
#ifdef UPGRADE
     /* the key's only row belongs to no gate: the reservation gives it to its gate and answers
        from it (idemgate_reserve's unowned arm), in the one statement */
     if :: unowned[k] -> unowned[k] = 0; flush() :: else -> skip fi;
#endif
     f = rfence[k];
     if
     :: rst[k] == INF && rhold[k] == tok -> /* mine: this attempt's own row, its reply was lost */
        hf = rfence[k];
        if :: took -> ans = R_TAKEN :: else -> ans = R_ACQ fi
     :: else ->
        if
        :: rst[k] == INF && !rlive[k] -> ans = R_EXPIRED
        :: else ->
           ans = R_EXIST;
#if RELAXED_RESERVATIONS
           /* PostgresStore::make_durable: before an in-flight row is answered "in flight", a
              synchronous commit flushes the WAL, the other attempt's reservation included
              (were the database to crash first, the call would fail and not be acked). */
           if :: rst[k] == INF -> flush() :: else -> skip fi
#endif
           skip
        fi
     fi
  fi
}
/* P5: an acked answer that rests on an in-flight row: the row is not this attempt's own, and
   someone still carries the event: the row is durable (the reconciler finishes it), or it is
   held by another worker whose message is not acked (it finishes, or its redelivery does). */
#define DURABLE \
  (dex[k] && dst[k] == rst[k] && dfence[k] == rfence[k] && dhold[k] == rhold[k])
#define HW ((rhold[k] - 1) / TOKS)
#if NREC > 0
#define CARRIED (DURABLE || (rhold[k] < RB && HW != w && !(wacked & (1 << HW))))
#else
/* no reconciler (ONCE): a durable row is finished only by a delivery */
#define CARRIED (rhold[k] < RB && HW != w && !(wacked & (1 << HW)))
#endif
#define CARRIED_CHECK(c) assert(!P5_ && (!acking || !(c) || CARRIED))
#define RESERVE_REPLIED \
  assert(!P5_ && (ans != R_EXIST || rst[k] != INF || rhold[k] != tok)); \
  CARRIED_CHECK(ans == R_EXIST && rst[k] == INF); \
  if :: ans == R_EXIST -> ACK :: else -> skip fi

/* idemgate_take_over: fence + 1, new lease and holder, attempts + 1, if still expired at `f`. */
inline take_over_stmt() {
  if
  :: rex[k] && rst[k] == INF && rfence[k] == f && !rlive[k] ->
     rfence[k]++; rlive[k] = 1; rhold[k] = tok;
     if :: ratt[k] <= MAXA -> ratt[k]++ :: else -> skip fi;
     relaxed_write(); invariants();
     got = 1; hf = rfence[k]
  :: else -> got = 0
  fi
}

/* idemgate_take_stale (synchronous): takes an expired in-flight row of this gate, or returns
   the row this pass's token already holds (the statement repeated after its reply was lost). */
inline take_stale_stmt() {
  if
  :: rex[k] && rst[k] == INF && !rlive[k] ->
     OWN_ROW;
     rfence[k]++; rlive[k] = 1; rhold[k] = tok;
     if :: ratt[k] <= MAXA -> ratt[k]++ :: else -> skip fi;
     flush(); invariants();
     got = 1; hf = rfence[k]; att = ratt[k]
  :: rex[k] && rst[k] == INF && rlive[k] && rhold[k] == tok -> got = 1; hf = rfence[k]; att = ratt[k]
  :: else -> got = 0
  fi
}

#define STRANDED(i) (rex[i] && rst[i] == INF && !rlive[i] && OWNED(i))
/* The scan sees only this gate's rows (WHERE gate = $gate). */
#define SCANS(i) (GATE_OF(i) == g)
#define TAKE_STALE fresh_token(RB + TOKS * r); cur[NW + r] = tok; take_stale_stmt()

/* PostgresStore::settled_state: what a fenced write finds when it touched no row. */
inline settled_state() {
  if
  :: !rex[k] -> res = C_STOREERR /* the reservation is gone (lost in a crash) */
  :: else ->
     if
     :: rfence[k] < hf && rst[k] == INF -> res = C_STOREERR /* own takeover lost in a crash */
     :: rfence[k] == hf && rst[k] == target -> res = C_COMMITTED
     :: rfence[k] == hf && rst[k] == INF -> res = 0 /* still ours: go ahead */
     :: else -> res = C_LOST
     fi
  fi
}

/* P5: what an acked answer may rest on. processed: committed; lost_lease: finished, or in
   flight under a higher fence (another attempt holds it). */
#define SETTLED_CHECK \
  assert(!P5_ && (!acking || res != C_COMMITTED || (rex[k] && rst[k] == target))); \
  assert(!P5_ && (!acking || res != C_LOST || (rex[k] && (rst[k] != INF || rfence[k] > hf)))); \
  CARRIED_CHECK(res == C_LOST && rst[k] == INF)

/* P5 across a database crash (RELAXED): what a crash would leave of the row, its durable copy,
   carries the event too: settled, or in flight for the reconciler to finish; or, with no row
   left, another worker's message is not acked yet (its redelivery reserves the key anew). An
   answer may rest on an unflushed row (a relaxed outcome's processed, a duplicate read from
   it), but not on one whose loss would leave the event to nobody. */
#if RELAXED
#define SURVIVES ((dex[k] && (dst[k] != INF || NREC > 0)) || (wacked | (1 << w)) != ALLW)
#define ACK_CHECK assert(!P5_ && SURVIVES);
#else
#define ACK_CHECK
#endif
/* The message is acked: at once, with the answer it rests on. */
#define ACK ACK_CHECK wacked = wacked | (1 << w); cur[w] = 0; fin = 1
#define ACK_OR_DIE \
  if \
  :: ACK \
  :: FAULT(F_CRASH) -> faults++; cur[w] = 0; fin = 2 /* dies before the ack */ \
  fi

#ifdef HEARTBEAT
/* The answer is acked only after the heartbeat's ticket is dropped (vouch, in Worker). */
#define SETTLED_REPLIED \
  SETTLED_CHECK; \
  if \
  :: acking && (res == C_COMMITTED || res == C_LOST) -> fin = 3 \
  :: else -> skip \
  fi
#else
#define SETTLED_REPLIED \
  SETTLED_CHECK; \
  if \
  :: acking && (res == C_COMMITTED || res == C_LOST) -> ACK_OR_DIE \
  :: else -> skip \
  fi
#endif

/* idemgate_fail / idemgate_escalate (PostgresStore::settle): fenced; settled_earlier when it
   touched no row. */
inline settle_stmt() {
  if
  :: rex[k] && rst[k] == INF && rfence[k] == hf ->
     OWN_ROW; rst[k] = target; flush(); invariants(); res = C_COMMITTED
  :: else ->
     settled_state();
     if :: res == 0 -> res = C_LOST :: else -> skip fi
  fi
}

/* idemgate_release: fenced; ends the lease at once (lease_until = 'epoch'), keeps the row.
   Gate::release_lease first stops the heartbeat renewing it (Heartbeat::give_up). */
inline release_stmt() {
  HB_GIVE_UP;
  if
  :: rex[k] && rst[k] == INF && rfence[k] == hf -> OWN_ROW; rlive[k] = 0; flush(); invariants()
  :: else -> skip
  fi
}

/* The commit transaction (PostgresStore::commit): the business write, then the fenced update,
   then COMMIT; atomic, as the database makes it. With relaxed outcomes its COMMIT does not wait
   for the flush: a database crash before the next one loses the transaction whole. */
inline commit_tx() {
  if
  :: rex[k] && rst[k] == INF && rfence[k] == hf ->
     assert(!P7_ && rfence[k] == hf); /* only the holder of the current fence commits */
     OWN_ROW;
     biz[EV]++; bizout[EV] = ans; rst[k] = COM; rout[k] = ans; outcome_write(); invariants();
     landed = 1
  :: else -> landed = 0
  fi
}

#ifdef GROUP
/* ---- group commit (GateOptions::coalesce): concurrent calls' commits in one transaction ---- */
byte gq;             /* a bit per process whose commit waits for a group */
byte gm;             /* the running group's members still without an answer */
byte gdoubt;         /* the members the group's last COMMIT carried, when its reply was lost */
byte jrow[NP];       /* each waiting commit: its row, */
byte jfence[NP];     /* its fence, */
byte jout[NP];       /* its outcome, */
byte gres[NP];       /* and its answer (0: none yet) */

/* Gate::commit_or_release through the commit coalescer (Coalescer::submit): the call waits
   until a group, led by it or another call, has run its commit; on a throw (its business write,
   a StoreError) the lease is given back and the exception goes on. */
inline commit_or_release(me) {
  target = COM;
  atomic { jrow[me] = k; jfence[me] = hf; jout[me] = ans; gq = gq | (1 << me) };
  atomic {
    gres[me] != 0 ->
    res = gres[me]; gres[me] = 0; jrow[me] = 0; jfence[me] = 0; jout[me] = 0;
    if
    :: res == C_DIED -> fin = 2
    :: res == C_COMMITTED || res == C_LOST -> SETTLED_REPLIED
    :: else -> skip
    fi
  };
  if
  :: res == C_THREW || res == C_STOREERR -> /* give_back_one: best effort, errors swallowed */
     RUN(release_stmt(), skip, skip)
  :: else -> skip
  fi
}
#else
/* Gate::commit_or_release: PostgresStore::commit under with_commit_retries; when it throws
   (business write, StoreError), the lease is given back and the exception goes on. */
inline commit_or_release(me) {
  n = 1; target = COM;
  do
  :: atomic { /* the business write throws: the transaction rolls back */
       (THROWS || FAULT(F_THROW)) ->
       if :: !THROWS -> faults++ :: else -> skip fi;
       res = C_THREW; break }
  :: atomic { WAIT_KEY_AND !THROWS -> commit_tx();
       if
       :: landed -> res = C_COMMITTED
       :: else -> settled_state(); /* settled_earlier */
          if :: res == 0 -> res = C_LOST :: else -> skip fi
       fi;
       SETTLED_REPLIED; break }
  :: atomic { WAIT_KEY_AND !THROWS && FAULT(F_CUT) -> faults++;
       if
       :: skip       /* the connection broke before COMMIT landed */
       :: commit_tx() /* COMMIT landed, its reply was lost */
       fi };
     if
     :: n >= CA -> res = C_STOREERR; break /* commit_unknown */
     :: else -> n++;
        /* the retry reads the row first: never the business write twice for one fence */
        atomic { settled_state(); SETTLED_REPLIED };
        if :: res != 0 -> break :: else -> skip fi
     fi
  od;
  landed = 0; n = 0;
  if
  :: res == C_THREW || res == C_STOREERR -> /* give_back_one: best effort, errors swallowed */
     RUN(release_stmt(), skip, skip)
  :: else -> skip
  fi
}
#endif

/* ---- the downstream ---- */

#if HONOURS
/* A downstream that honours keys answers every claim under the key alike: runs with outcome B
   mirror those with A, so one outcome stands for both. */
#define PICK dsout[EV] = OK_A
#else
#define PICK if :: dsout[EV] = OK_A :: dsout[EV] = OK_B fi
#endif

/* Downstream::claim(request, key). Honouring keys: the same key gets the same outcome. */
inline claim() {
  atomic {
#if HONOURS
    if
    :: dsout[EV] != 0 -> ans = dsout[EV]
    :: dsout[EV] == 0 -> PICK; dsseen[EV] = dsseen[EV] | dsout[EV]; ans = dsout[EV]
    :: dsout[EV] == 0 -> ans = PERM /* refused; a later claim may succeed (after a fix, a re-drive) */
    :: FAULT(F_TRANS) -> faults++; ans = TRANS /* failed before doing anything */
    :: FAULT(F_TRANS) && dsout[EV] == 0 -> faults++; /* did the work, the answer was lost */
       PICK; dsseen[EV] = dsseen[EV] | dsout[EV]; ans = TRANS
    fi
#else
    /* P6: a downstream that ignores keys does the work again on every call */
    dscalls++; assert(!P6_ && dscalls <= 1);
    if :: ans = OK_A :: ans = OK_B fi; dsout[EV] = ans; dsseen[EV] = dsseen[EV] | ans
#endif
    ;invariants()
  }
}

/* Downstream::lookup(key): found, not found, or transient. */
inline lookup() {
  atomic {
    if
    :: dsout[EV] != 0 -> ans = dsout[EV]
    :: dsout[EV] == 0 -> ans = NOTFOUND
    :: FAULT(F_TRANS) -> faults++; ans = TRANS
    fi
  }
}

#define CRASH(TO) atomic { FAULT(F_CRASH) -> faults++; cur[IDX] = 0; DIES }; goto TO

/* ---- Gate::process, one message of the event, redelivered until acked ---- */
#define IDX w
#define DIES HB_DROP(w) /* its heartbeat dies with it */
#ifdef HEARTBEAT
/* Gate::start after finish: the ticket is dropped (Heartbeat::drop: the lease may have been lost
   when a renewal found the fence gone, or when the lease ran out since the last renewal known to
   have landed was sent, whether later ones failed, hung or were never needed) and Gate::vouch
   turns lost_lease into retry when it may have been.
   P8: a worker whose lease ran out because its renewals failed or hung (not because its whole
   process stalled) answers retry when its commit was refused, never lost_lease. */
#define TROUBLE (hbl[w] || hbexp[w])
#define P8_CHECK assert(!P8_ && (res != C_LOST || !hbx[w]))
inline vouch() {
  atomic {
    if
    :: res == C_LOST && TROUBLE -> fin = 0 /* retry: not acked */
    :: else -> P8_CHECK; CARRIED_CHECK(res == C_LOST && rst[k] == INF); ACK_OR_DIE
    fi;
    HB_DROP(w)
  }
}
#define VOUCHED if :: fin == 3 -> vouch() :: else -> skip fi;
#else
#define VOUCHED
#endif
proctype Worker(byte w; byte k; byte g) {
  byte tok, f, hf, ans, res, target, got, landed, n, deliveries;
  bool took;
  bool acking = 1; /* its answers decide whether a message is acked */
  byte fin;        /* 1: acked, 2: died before the ack, 3: answered, to be vouched */
deliver:
#if THROWS
  if
  :: deliveries >= MAXDELIV -> goto dead_lettered
  :: else -> deliveries++
  fi;
#endif
reserve: /* PostgresStore::reserve (its token is drawn with the first statement) */
  RUN(reserve_stmt(), RESERVE_REPLIED, goto not_acked);
  if
  :: ans == R_EXIST -> goto acked /* duplicate, failed, escalated, or in flight: acked */
  :: ans == R_EXPIRED -> /* take the expired lease over */
     took = 1;
     RUN(take_over_stmt(), skip, goto not_acked);
     if
     :: got -> skip
     :: else -> goto reserve /* another took it first, or ours landed and its reply was lost */
     fi
  :: else -> skip /* acquired or taken over */
  fi;
  /* Gate::start */
#if HONOURS
  if
  :: CRASH(crashed) /* dies holding the lease */
  :: atomic { HB_HOLD; claim() } /* the heartbeat keeps the lease from here on */
  fi;
  if
  :: ans == OK_A || ans == OK_B -> /* Gate::commit */
     if
     :: CRASH(crashed) /* dies after the downstream did the work */
     :: commit_or_release(w)
     fi;
     VOUCHED
     if
     :: fin == 1 -> goto acked /* processed or lost_lease */
     :: fin == 2 -> goto crashed
     :: else -> goto not_acked /* the exception reaches the caller, or retry */
     fi
  :: ans == PERM -> /* Gate::finish: store.fail */
     target = FAI;
     RUN(settle_stmt(), SETTLED_REPLIED, goto not_acked);
     VOUCHED
     if :: fin == 1 -> goto acked :: fin == 2 -> goto crashed :: else -> goto not_acked fi
  :: ans == TRANS -> /* Gate::finish: store.release with the reason; result retry */
     RUN(release_stmt(), skip, goto not_acked);
     goto not_acked
  fi;
#else
  /* the downstream does not honour keys: never called, the event is escalated */
  target = ESC;
  if
  :: CRASH(crashed)
  :: RUN(settle_stmt(), SETTLED_REPLIED, goto not_acked)
  fi;
  if :: fin == 1 -> goto acked :: fin == 2 -> goto crashed :: else -> goto not_acked fi;
#endif
crashed:
not_acked: /* retry, an exception or a crash: the queue redelivers the message */
  atomic {
    cur[w] = 0; HB_DROP(w);
    tok = 0; f = 0; hf = 0; ans = 0; res = 0; target = 0; got = 0; took = 0; fin = 0
  };
  goto deliver;
#if THROWS
dead_lettered:
#endif
acked:
  atomic {
#if THROWS
    wacked = wacked | (1 << w); cur[w] = 0; /* dead-lettered */
#endif
    tok = 0; f = 0; hf = 0; ans = 0; res = 0; target = 0; got = 0; took = 0; deliveries = 0; fin = 0
  }
}

#ifdef ONCE
/* ---- TransactionGate::process → PostgresStore::commit_once: one message of the event, all of
   it in one transaction, redelivered until acked ---- */
/* A delivery that meets the key held by another open transaction waits for it to end, or its
   wait runs past lock_timeout at any moment (busy: answered retry; not a fault). A death or a cut
   leaves its transaction open (ORPHAN) until the database rolls it back. A death before the
   transaction, or before acking an answer read from the row, is left out: the redelivery meets
   the same state. */
/* P5 for its answers: an acked one rests on the key's row, settled, or in flight under a live
   lease that someone else still carries. */
#define ONCE_REPLIED assert(!P5_ && rex[k] && (rst[k] != INF || CARRIED))
/* The transaction's writes, applied at COMMIT: the reservation's insert (fence 1, the call's
   token) or its takeover (idemgate_take_over: fence + 1, the call's token), the business write, the
   fenced update to committed. Nothing of it is seen before COMMIT, and the key is held until
   then, so the row is still as the reservation met it. (A committed row's lease is never read.)
   Its COMMIT is synchronous whatever the store's relaxed outcomes say: the row is the event's
   only record, with no reconciler to finish it. */
inline once_commit() {
  OWN_ROW;
  if
  :: took -> assert(!P7_ && rex[k] && rst[k] == INF && rfence[k] == f); /* its fence holds */
     rfence[k]++; rhold[k] = tok;
     if :: ratt[k] <= MAXA -> ratt[k]++ :: else -> skip fi
  :: else -> rex[k] = 1; rfence[k] = 1; rhold[k] = tok; ratt[k] = 1
  fi;
  rst[k] = COM; rout[k] = OK_A; rlive[k] = 0; biz[EV]++; bizout[EV] = OK_A; oheld[k] = 0;
  flush(); invariants()
}
proctype OnceWorker(byte w; byte k; byte g) {
  byte tok, f, n;
  bool took;
  bool acking = 1; /* its answers decide whether a message is acked */
  byte fin;        /* 1: acked, 2: died before the ack */
deliver: /* one token for the call: Session::retrying's attempts share it */
  atomic { fresh_token(1 + TOKS * w); n = 1 };
attempt: /* one attempt: a transaction on a connection of its own */
  if
  :: atomic { FREE(k) -> /* the reservation statement */
       if
       :: !rex[k] -> oheld[k] = w + 1; took = 0 /* inserted, uncommitted: the key is held */
       :: rex[k] && rst[k] == INF && !rlive[k] -> /* a Gate's attempt, its lease run out */
          oheld[k] = w + 1; took = 1; f = rfence[k] /* taken over in the transaction */
       :: rex[k] && rst[k] == COM && rhold[k] == tok -> /* mine: its own COMMIT landed before */
          ONCE_REPLIED; ACK /* processed */
       :: else -> ONCE_REPLIED; ACK /* duplicate, in flight, failed or escalated */
       fi }
  :: atomic { !FREE(k) -> skip }; goto not_acked /* waited past lock_timeout: busy, retry */
  fi;
  if :: fin == 1 -> goto acked :: else -> skip fi;
  /* the business write, the fenced update, COMMIT */
  if
  :: atomic { once_commit(); ONCE_REPLIED; ACK_OR_DIE } /* processed */
  :: atomic { FAULT(F_CUT) -> faults++; once_commit() }; goto again /* COMMIT landed, reply lost */
  :: atomic { FAULT(F_CUT) -> faults++; oheld[k] = ORPHAN }; goto again /* cut before it landed */
  :: atomic { FAULT(F_THROW) -> faults++; oheld[k] = 0 }; goto not_acked /* rolled back */
  :: atomic { FAULT(F_CRASH) -> faults++; oheld[k] = ORPHAN }; goto not_acked /* dies in it */
  fi;
  if :: fin == 1 -> goto acked :: else -> goto not_acked fi;
again: /* Session::retrying: a broken connection, the transaction again on a fresh one */
  if
  :: n < CA -> n++; goto attempt
  :: else -> goto not_acked /* StoreError */
  fi;
not_acked: /* retry, an exception or a crash: the queue redelivers the message */
  atomic { tok = 0; f = 0; n = 0; took = 0; fin = 0 };
  goto deliver;
acked:
  atomic { tok = 0; f = 0; n = 0; took = 0; fin = 0 }
}
#endif

/* ---- Reconciler::run_once, in a loop; a pass takes one row (ReconcilerOptions::batch = 1) ---- */
#undef IDX
#define IDX (NW + r)
#undef DIES
#define DIES skip
/* idemgate_take_stale takes stranded row i; or its reply is lost, and the retry on a fresh
   connection returns the row this token holds (or is cut too) */
#define TAKE(i) :: atomic { STRANDED(i) && SCANS(i) && FREE(i) -> k = i; TAKE_STALE }
#define TAKE_CUT(i) \
  :: atomic { STRANDED(i) && SCANS(i) && FREE(i) && FAULT(F_CUT) -> faults++; k = i; \
       TAKE_STALE }; \
     if \
     :: atomic { WAIT_KEY take_stale_stmt() } \
     :: atomic { FAULT(F_CUT) -> faults++ }; goto pass_done \
     fi
proctype Reconciler(byte r; byte g) {
  byte k, tok, hf, att, ans, res, target, got, landed, n;
  byte w = 255;
  bool acking = 0; /* no message: nothing is acked */
  byte fin;
end_idle:
  do
  :: /* a pass: idemgate_take_stale with a fresh token (a cut loses the reply or the statement) */
     if
     TAKE(0)
     TAKE_CUT(0)
#if NR > 1
     TAKE(1)
     TAKE_CUT(1)
#endif
     fi;
     if
     :: !got -> goto pass_done
     :: got -> skip
     :: atomic { got && FAULT(F_CRASH) -> faults++; cur[NW + r] = 0 }; goto pass_done /* dies holding it */
     fi;
     /* Reconciler::finish: decide, then one store call */
     if
     :: att > MAXA -> target = ESC /* used up its attempts: park with "gave up" */
     :: else ->
        lookup();
        if
        :: ans == OK_A || ans == OK_B -> target = COM /* found: commit that outcome */
        :: else ->
#if HONOURS
           /* not found, or the lookup failed: claim again under the same key */
           claim();
           if
           :: ans == OK_A || ans == OK_B ->
              if
              :: CRASH(pass_done) /* dies after the downstream did the work */
              :: target = COM
              fi
           :: ans == PERM -> target = FAI
           :: ans == TRANS -> target = INF /* defer */
           fi
#else
           if
           :: ans == TRANS -> target = INF /* defer */
           :: else -> target = ESC /* park: neither keys nor an outcome to find */
           fi
#endif
        fi
     fi;
     if
     :: target == COM -> commit_or_release(NW + r) /* Gate::commit */
     :: target == FAI || target == ESC -> RUN(settle_stmt(), skip, goto pass_done)
     :: target == INF -> RUN(release_stmt(), skip, goto pass_done) /* defer */
     fi;
pass_done:
     atomic {
       cur[NW + r] = 0; k = 0; tok = 0; hf = 0; att = 0; n = 0; ans = 0; res = 0; target = 0;
       got = 0; landed = 0; fin = 0
     }
  od
}

#ifdef GROUP
/* The leader's run of a commit group (Coalescer::lead, Gate::run_commits, then
   PostgresStore::commit_each): it takes every waiting commit, never two of one row; per member a
   savepoint, its fenced update and, when the fence held, its business write (a member whose
   fence moved writes nothing; one whose business write throws goes back to its savepoint alone);
   then one COMMIT. A lost COMMIT reply is settled by reading back each member's row before the
   group runs again; after CA attempts every member still open gets the StoreError. The
   transaction is atomic, as the database makes it (its row locks hold off every other write to
   the members' rows until COMMIT). A group of one runs PostgresStore::commit, whose steps are
   the same for one member. */
/* PostgresStore::settled_earlier for member p, on its row k */
#define MEMBER_SETTLED(p) \
  if \
  :: !rex[k] -> gres[p] = C_STOREERR \
  :: rex[k] && rfence[k] < jfence[p] && rst[k] == INF -> gres[p] = C_STOREERR \
  :: rex[k] && rfence[k] == jfence[p] && rst[k] == COM -> gres[p] = C_COMMITTED \
  :: rex[k] && !(rfence[k] < jfence[p] && rst[k] == INF) && \
     !(rfence[k] == jfence[p] && rst[k] == COM) -> gres[p] = C_LOST \
  fi
/* A member's fenced update touches its row (... AND status = 'in_flight' AND fence = $f). */
#define FENCE_HOLDS(p) (rex[k] && rst[k] == INF && rfence[k] == jfence[p])
/* For every process p in the set S: BODY. */
#define EACH(S, BODY) \
  p = 0; \
  do \
  :: p < NP -> if :: (S) & (1 << p) -> k = jrow[p]; BODY :: else -> skip fi; p++ \
  :: else -> break \
  od; \
  p = 0; k = 0
proctype CommitGroup() {
  byte p, k, n, inc, rows, how;
end_group:
  do
  :: atomic {
       gq != 0 -> /* a call leads a group: every waiting commit, one per row */
       rows = 0;
       EACH(gq, if :: !(rows & (1 << k)) -> gm = gm | (1 << p); rows = rows | (1 << k)
                   :: else -> skip /* its row's other commit came first: the next group */
                   fi);
       gq = gq & ~gm; rows = 0; n = 1
     };
attempt:
     atomic {
       if
       :: gdoubt != 0 -> /* the last COMMIT's reply was lost: all of it landed, or none */
          how = 0;
          EACH(gdoubt, if
                       :: rex[k] && rst[k] == COM && rfence[k] == jfence[p] -> how = 1
                       :: else -> skip
                       fi);
          gdoubt = 0;
          if
          :: how -> EACH(gm, MEMBER_SETTLED(p)); gm = 0; goto group_done /* it landed */
          :: else -> skip /* it did not: the group runs again */
          fi
       :: else -> skip
       fi;
       /* the transaction: per member its savepoint, its fenced update, its business write */
       inc = 0;
       EACH(gm, if
                :: FENCE_HOLDS(p) ->
                   if
                   :: inc = inc | (1 << p)
                   :: FAULT(F_THROW) -> faults++; /* back to its savepoint; the others go on */
                      gres[p] = C_THREW; gm = gm & ~(1 << p) /* (answered at once, not at the
                                                                  group's end: more behaviours) */
                   fi
                :: else -> skip /* refused: its fence moved while the group waited, or settled */
                fi);
       /* COMMIT: answered; landed with its reply lost; not landed; or the process dies with its
          group (landed or not) */
       if
       :: how = 1
       :: FAULT(F_CUT) -> faults++; how = 2; gdoubt = inc
       :: FAULT(F_CUT) -> faults++; how = 3; gdoubt = inc
       :: FAULT(F_CRASH) -> faults++; if :: how = 4 :: how = 5 fi
       fi;
       if
       :: how == 1 || how == 2 || how == 4 -> /* it landed */
          EACH(inc,
               assert(!P7_ && rfence[k] == jfence[p]); /* only the holder of the current fence */
               biz[k]++; bizout[k] = jout[p]; rst[k] = COM; rout[k] = jout[p];
               flush(); invariants())
       :: else -> skip
       fi;
       if
       :: how == 1 -> /* the included members committed; the refused ones read their row */
          EACH(gm, if :: inc & (1 << p) -> gres[p] = C_COMMITTED :: else -> MEMBER_SETTLED(p) fi);
          gm = 0; goto group_done
       :: how >= 4 -> /* every call waiting in the coalescer dies with the process */
          EACH(gm | gq, gres[p] = C_DIED; cur[p] = 0;
                        if :: p < NW -> HB_DROP(p) :: else -> skip fi);
          gm = 0; gq = 0; gdoubt = 0; goto group_done
       :: else -> skip
       fi;
       if
       :: n >= CA -> EACH(gm, gres[p] = C_STOREERR); gm = 0; gdoubt = 0; goto group_done
       :: else -> n++
       fi
     };
     goto attempt;
group_done:
     atomic { inc = 0; n = 0; how = 0 }
  od
}
#endif

/* Time: the lease of a holder that died (or finished) expires at any moment; a lease expiring
   under a holder still at work is a stall, and counts as a fault. stale_after is folded into
   the expiry. */
#if NP == 5
#define HOLDER_RUNNING(i) \
  (cur[0] == rhold[i] || cur[1] == rhold[i] || cur[2] == rhold[i] || cur[3] == rhold[i] || \
   cur[4] == rhold[i])
#elif NP == 4
#define HOLDER_RUNNING(i) \
  (cur[0] == rhold[i] || cur[1] == rhold[i] || cur[2] == rhold[i] || cur[3] == rhold[i])
#elif NP == 3
#define HOLDER_RUNNING(i) (cur[0] == rhold[i] || cur[1] == rhold[i] || cur[2] == rhold[i])
#else
#error "HOLDER_RUNNING is written for 3 to 5 processes"
#endif
#ifdef HEARTBEAT
/* The holder is a worker still at work (its ticket renewed) and the heartbeat does not renew it:
   its last renewal failed, or the thread waits on a renewal that hangs. The lease runs out, and
   that fault was the heartbeat's. One hang lets one lease run out here: in the code the reply
   watchdog (PostgresOptions::reply_timeout) ends every hang, after a few leases at most, and
   each lease that runs out meanwhile is the same case; a hang that never ended would let every
   later attempt's lease run out, each answering retry, and the fences grow without bound. */
#define HWK(i) ((rhold[i] - 1) / TOKS)
/* The lease of ticket t ran out under its worker: Heartbeat::drop's clock, since the last renewal
   known to have landed was sent (and since the renewal that hangs was sent, if t is in it). */
#define HB_RAN_OUT(t) \
  hbexp[t] = 1; if :: hbin & (1 << (t)) -> hbdur[t] = 1 :: else -> skip fi
#define HOLDER_UNRENEWED(i) \
  (rhold[i] < RB && cur[HWK(i)] == rhold[i] && hbt[HWK(i)] == 1 && \
   (hbf[HWK(i)] || (hbh != 0 && !hbhx)))
#define EXPIRY(i) \
  :: atomic { rex[i] && rlive[i] && !HOLDER_RUNNING(i) -> rlive[i] = 0; dlive[i] = 0 } \
  :: atomic { rex[i] && rlive[i] && HOLDER_RUNNING(i) && FAULT(F_STALL) -> faults++; \
       rlive[i] = 0; dlive[i] = 0; \
       if :: rhold[i] < RB && cur[HWK(i)] == rhold[i] -> HB_RAN_OUT(HWK(i)) :: else -> skip fi } \
  :: atomic { rex[i] && rlive[i] && HOLDER_UNRENEWED(i) -> \
       rlive[i] = 0; dlive[i] = 0; HB_RAN_OUT(HWK(i)); hbx[HWK(i)] = 1; \
       if :: hbh != 0 && !hbf[HWK(i)] -> hbhx = 1 :: else -> skip fi }
#else
#define EXPIRY(i) \
  :: atomic { rex[i] && rlive[i] && !HOLDER_RUNNING(i) -> rlive[i] = 0; dlive[i] = 0 } \
  :: atomic { rex[i] && rlive[i] && HOLDER_RUNNING(i) && FAULT(F_STALL) -> faults++; \
       rlive[i] = 0; dlive[i] = 0 }
#endif
active proctype Clock() {
end_clock:
  do
  EXPIRY(0)
#if NR > 1
  EXPIRY(1)
#endif
#ifdef ONCE
  :: atomic { oheld[0] == ORPHAN -> oheld[0] = 0 } /* the database rolls back a session's
                                                       transaction once it notices it is gone */
#endif
  od
}

#ifdef HEARTBEAT
/* Heartbeat::run: every period, one fenced idemgate_extend for every lease held. Its steps:
   - a renewal that lands, per ticket (a live lease under its own fence needs none): it extends
     the lease, or finds the fence gone (the ticket is lost and no longer renewed);
   - a renewal that answers an error (F_HB), per ticket: it may have landed; the ticket is
     failing until a renewal lands;
   - a renewal that hangs without an answer (F_HB): the thread waits on it, so no lease of the
     gate is renewed meanwhile; its statement may run later (it extends each lease whose fence
     holds), and its answer comes later or never before a worker drops its ticket. The answer
     (PostgresStore::renew: one state per lease): an error (the reply watchdog gave up, whether
     or not the statement ran) makes every ticket failing; otherwise each lease it extended
     counts as renewed when the renewal was sent (Heartbeat::run), and each other one as lost.
   A lease whose row another transaction is writing is skipped (`busy`), not waited for: that
   renewal neither lands nor fails for it, which the model's renewals that are never needed
   already cover (the lock is the worker's own commit, or a takeover that moves the fence). */
/* idemgate_extend for worker i's lease under fence f: WHERE key = … AND fence = … AND
   status = 'in_flight' */
#define EXTENDS(i, f) (rex[WROW(i)] && rst[WROW(i)] == INF && rfence[WROW(i)] == f)
/* A renewal that landed extends the lease; the ghost hbx is cleared only when the lease it
   extended is this ticket's own. */
#define EXTEND(i) \
  rlive[WROW(i)] = 1; dlive[WROW(i)] = 1; \
  if :: rfence[WROW(i)] == hbfen[i] -> hbx[i] = 0 :: else -> skip fi
/* ... the same for the hung renewal's statement, for the tickets still held (the heartbeat does
   not know it ran: hbexp waits for its answer) */
#define EXTEND_HUNG(i) \
  rlive[WROW(i)] = 1; dlive[WROW(i)] = 1; \
  if \
  :: hbcur & (1 << i) -> if :: rfence[WROW(i)] == hbfen[i] -> hbx[i] = 0 :: else -> skip fi \
  :: else -> skip \
  fi
#define RENEWING(i) (hbt[i] == 1 && hbh == 0 && !hbl[i])
#define RENEWAL(i) \
  :: atomic { RENEWING(i) && (hbf[i] || !(EXTENDS(i, hbfen[i]) && rlive[WROW(i)])) -> \
       if \
       :: EXTENDS(i, hbfen[i]) -> EXTEND(i); hbf[i] = 0; hbexp[i] = 0 \
       :: else -> hbl[i] = 1 /* its fence is gone */ \
       fi } \
  :: atomic { RENEWING(i) && FAULT(F_HB) -> faults++; \
       if \
       :: EXTENDS(i, hbfen[i]) && !rlive[WROW(i)] -> EXTEND(i) /* it landed, unknown to it */ \
       :: else -> skip \
       fi; \
       hbf[i] = 1 }
/* For every ticket i in the set S: BODY. */
#if NW > 2
#define ANY_RENEWING (RENEWING(0) || RENEWING(1) || RENEWING(2))
#else
#define ANY_RENEWING (RENEWING(0) || RENEWING(1))
#endif
#define TICKETS(S, BODY) \
  i = 0; \
  do \
  :: i < NW -> if :: (S) & (1 << i) -> BODY :: else -> skip fi; i++ \
  :: else -> break \
  od; \
  i = 0
active proctype Heartbeat() {
  byte i;
end_heartbeat:
  do
  RENEWAL(0)
  RENEWAL(1)
#if NW > 2
  RENEWAL(2)
#endif
  :: atomic { ANY_RENEWING && FAULT(F_HB) -> faults++; /* a renewal hangs */
       TICKETS(255, if
                    :: RENEWING(i) -> hbin = hbin | (1 << i); hbinf[i] = hbfen[i]
                    :: else -> skip
                    fi);
       TICKETS(hbin, hbdur[i] = 0);
       hbh = HB_SENT; hbcur = hbin }
  :: atomic { hbh == HB_SENT -> /* its statement runs */
       TICKETS(hbin, if :: EXTENDS(i, hbinf[i]) -> EXTEND_HUNG(i); hbkept = hbkept | (1 << i)
                     :: else -> skip fi);
       hbh = HB_RAN }
  :: atomic { hbh != 0 -> /* its answer, at last */
       if
       :: TICKETS(hbcur, hbf[i] = 1) /* an error */
       :: hbh == HB_RAN -> TICKETS(hbcur, if
                                          :: hbkept & (1 << i) -> hbf[i] = 0; hbexp[i] = hbdur[i]
                                          :: else -> hbl[i] = 1
                                          fi)
       fi;
       TICKETS(255, hbinf[i] = 0; hbdur[i] = 0);
       hbh = 0; hbhx = 0; hbin = 0; hbkept = 0; hbcur = 0 }
  od
}
#endif

#if RELAXED
/* A database crash: writes not yet flushed (relaxed reservations and takeovers, relaxed outcome
   commits with their business rows) are lost; the row falls back to its durable copy (with
   relaxed outcomes: in flight under the fence it was committed with, its lease running out as
   time goes on). An acked message stays acked. With ONCE, a crash while a one-transaction
   delivery's transaction is open is that transaction cut before COMMIT and rolled back, then the
   crash: the crash waits for the key to be free. */
active proctype DatabaseCrash() {
end_crash:
  do
  :: atomic {
       FAULT(F_DB) && FREE(0) &&
       (rex[0] != dex[0] || rst[0] != dst[0] || rfence[0] != dfence[0] || rhold[0] != dhold[0] ||
        ratt[0] != datt[0]) ->
       faults++;
       rex[0] = dex[0]; rst[0] = dst[0]; rfence[0] = dfence[0]; rhold[0] = dhold[0];
       rlive[0] = dlive[0]; ratt[0] = datt[0]; rout[0] = dout[0];
#if RELAXED_OUTCOMES
       biz[0] = dbiz[0]; bizout[0] = dbizout[0];
#endif
       invariants()
     }
  od
}
#endif

#if !THROWS && HONOURS && !defined(NOREDRIVE)
#define OPERATOR 1
/* An operator re-drives its gate's failed event once (PostgresStore::redrive_failed). */
#define REDRIVABLE(i) (rex[i] && GATE_OF(i) == g && rst[i] == FAI)
#define REDRIVE OWN_ROW; rst[k] = INF; rfence[k]++; rlive[k] = 0; flush(); invariants()
proctype Operator(byte g) {
  byte k;
end_operator:
  if
  :: atomic { REDRIVABLE(0) -> k = 0; REDRIVE }
#if NR > 1
  :: atomic { REDRIVABLE(1) -> k = 1; REDRIVE }
#endif
  fi
}
#else
#define OPERATOR 0
#endif

/* Retention::run_once: the dedup window outlasts every delivery of the event; it purges only
   its gate's rows (idemgate_purge). */
#define PURGEABLE(i) (rex[i] && GATE_OF(i) == g && OWNED(i) && (rst[i] == COM || rst[i] == FAI))
#define PURGE OWN_ROW; gone_final[k] = (rst[k] == COM || rst[k] == FAI); rex[k] = 0; flush()
proctype Retention(byte g) {
  byte k;
  (wacked == ALLW);
end_retention:
  do
  :: atomic { PURGEABLE(0) -> k = 0; PURGE }
#if NR > 1
  :: atomic { PURGEABLE(1) -> k = 1; PURGE }
#endif
  od
}

#ifdef UPGRADE
/* The operator's adopt (PostgresStore::adopt_unowned_rows): gives the gate the rows of no gate
   whose key it holds no row of, at any moment of the window. */
proctype Adopt() {
end_adopt:
  atomic { unowned[0] -> unowned[0] = 0 }
}
#endif

init {
  atomic {
#ifdef UPGRADE
    /* the version before gates met the event: its row is of no gate, committed, or in flight
       with its lease run out (that process died after the downstream did the work) */
    rex[0] = 1; rfence[0] = 1; rhold[0] = 0; rlive[0] = 0; ratt[0] = 1; unowned[0] = 1;
    dsout[0] = OK_A; dsseen[0] = 1;
    if
    :: rst[0] = COM; rout[0] = OK_A; biz[0] = 1; bizout[0] = OK_A
    :: rst[0] = INF; rout[0] = 0
    fi;
    dex[0] = 1; dst[0] = rst[0]; dfence[0] = 1; dhold[0] = 0; dlive[0] = 0; datt[0] = 1;
    dout[0] = rout[0]; hi[0] = 1;
    run Adopt();
#endif
#ifdef ONCE
#ifdef MIXED
    run Worker(0, 0, 0);
#else
    run OnceWorker(0, 0, 0);
#endif
    run OnceWorker(1, 0, 0);
#if NW > 2
    run OnceWorker(2, 0, 0);
#endif
#else
    run Worker(0, WROW(0), GATE_OF(WROW(0))); run Worker(1, WROW(1), GATE_OF(WROW(1)));
#if NW > 2
    run Worker(2, WROW(2), GATE_OF(WROW(2)));
#endif
#endif
#if NREC > 0
    run Reconciler(0, 0);
#endif
#if NREC > 1
    run Reconciler(1, GATE_OF(1)); /* with GATES, gate 1's */
#endif
#ifdef GROUP
    run CommitGroup();
#endif
#if OPERATOR
    run Operator(0);
#ifdef GATES
    run Operator(1);
#endif
#endif
    run Retention(0);
#ifdef GATES
    run Retention(1);
#endif
  }
}

#ifdef LIVENESS
/* Time goes on once every process waits: a run that ends is checked as a run that stays in its
   last state (spin's fairness search does not extend one by itself). */
active proctype Idle() {
end_idle:
  do
  :: timeout
  od
}

/* L1: once faults stop, every event ends committed, failed or escalated, and stays so. */
#define SETTLED(i) ((rex[i] && rst[i] != INF) || gone_final[i])
#if NR == 1
ltl ends { <> [] SETTLED(0) }
#else
ltl ends { <> [] (SETTLED(0) && SETTLED(1)) }
#endif
#endif

/*
 * idemgate's gate protocol on one event (one key), for the SPIN model checker.
 * docs/model/README.md maps every process and variable to the header and function it models;
 * scripts/model-check runs every configuration and every mutant (docs/model/mutants/).
 *
 * Configurations (cpp switches, given to spin as -D...):
 *   (none)      a downstream that honours Idempotency-Key and can look up by key; durable
 *               reservations; operator re-drive of failed events; retention
 *   RELAXED=1   relaxed reservations: a database crash loses unflushed reservations/takeovers
 *   NOKEYS      a downstream that ignores keys (it can still look up); relaxed reservations are
 *               off, as Gate refuses them with such a downstream
 *   POISON      the business write throws on every attempt; a message is dead-lettered after
 *               MAXDELIV deliveries, and the row must end escalated
 *   NOREDRIVE   no operator re-drive
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
#define F_STALL 32 /* a holder outlives its lease (a stall) */
#ifndef FAULTS
#define FAULTS 63
#endif
#define FAULT(c) ((FAULTS & (c)) && faults < MAXF)

#ifndef MAXDELIV
#define MAXDELIV 2 /* deliveries of one message before the queue dead-letters it (POISON) */
#endif

#define NW 3   /* workers: deliveries of the same event */
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

/* ---- the idempotency log's row: the live copy, and the durable copy (flushed WAL) ---- */
bool rex;    /* the row exists */
byte rst;    /* status */
byte rfence; /* fence */
byte rhold;  /* holder token */
bool rlive;  /* lease_until >= now() */
byte ratt;   /* attempts, saturating at MAXA + 1 */
byte rout;   /* result (committed outcome) */
bool dex;
byte dst, dfence, dhold, datt, dout;
bool dlive;

/* ---- the business table and the downstream ---- */
byte biz;     /* business rows for this event */
byte bizout;  /* the outcome the business row was written with */
byte dsout;   /* the outcome the downstream holds under the key (0: none) */
byte dsseen;  /* every outcome the downstream ever produced for the event (bits: A = 1, B = 2) */
byte dscalls; /* calls of a downstream that ignores keys */

/* ---- environment and ghosts ---- */
bit P1_, P2_, P3_, P4_, P5_, P6_, P7_; /* always 0: they name the property in a violated assertion */
byte faults;     /* faults so far; MAXF is the budget */
byte hi;         /* highest fence the row ever held durably */
bool gone_final; /* retention deleted the row after it was committed or failed */
byte wacked;     /* a bit per worker whose message was acked (or dead-lettered) */
byte cur[5];     /* the token of the attempt each process is running (0: none); workers 0-2,
                    reconcilers 3-4 */

/* A synchronous commit flushes the WAL: everything written so far is durable. */
inline flush() {
  dex = rex; dst = rst; dfence = rfence; dhold = rhold; dlive = rlive; datt = ratt; dout = rout;
  if
  :: dex -> assert(!P4_ && dfence >= hi); /* fences never decrease */
     hi = dfence
  :: else -> skip
  fi
}

/* A reservation or takeover: durable at once, or (relaxed) only at the next flush. */
inline relaxed_write() {
#if RELAXED
  skip
#else
  flush()
#endif
}

/* Safety properties that hold in every state a store transaction leaves: P1 one business row;
   P2 a committed row has its business row, written with the row's outcome; P3 one downstream
   outcome per key, and it is the log's; P4 fences never decrease. */
inline invariants() {
  assert(!P1_ && biz <= 1);
  assert(!P2_ && (!(rex && rst == COM) || (biz == 1 && bizout == rout)));
  assert(!P3_ && dsseen != 3);
  assert(!P3_ && (!(rex && rst == COM) || rout == dsout));
  assert(!P4_ && (!rex || rfence >= hi));
}

/* One statement through PostgresStore::run / run_on: the first try may be cut after the
   statement ran (its reply lost); the second try runs on a fresh connection, and a cut there is
   a StoreError. (A first try cut before the statement ran, then a second try that answers, is
   the fault-free step.) REPLIED runs only with the reply the caller goes on with. */
#define RUN(BODY, REPLIED, ONERR) \
  if \
  :: atomic { BODY; REPLIED } \
  :: atomic { FAULT(F_CUT) -> faults++; BODY }; /* it ran; its reply was lost */ \
     if \
     :: atomic { BODY; REPLIED } /* the retry on a fresh connection */ \
     :: atomic { FAULT(F_CUT) -> faults++; BODY }; ONERR /* cut again: StoreError */ \
     :: atomic { FAULT(F_CUT) -> faults++ }; ONERR \
     fi \
  :: atomic { (FAULTS & F_CUT) && faults + 2 <= MAXF -> faults = faults + 2 }; ONERR \
  fi

/* A fresh holder token (detail::new_holder_token): random, so it differs from every token the
   row holds, live or durable. Each process draws from its own three values. */
inline fresh_token(base) {
  tok = base;
  do
  :: tok == rhold || tok == dhold -> tok++
  :: else -> break
  od
}

/* ---- statements of PostgresStore ---- */

/* idemgate_reserve: insert in flight, or return the row with `holder = $token AS mine`. */
inline reserve_stmt() {
  if
  :: tok == 0 -> fresh_token(1 + 3 * w); cur[w] = tok
  :: else -> skip
  fi;
  if
  :: !rex ->
     rex = 1; rst = INF; rfence = 1; rhold = tok; rlive = 1; ratt = 1; rout = 0;
     relaxed_write(); invariants();
     ans = R_ACQ; hf = 1
  :: else ->
     f = rfence;
     if
     :: rst == INF && rhold == tok -> /* mine: this attempt's own row, its reply was lost */
        hf = rfence;
        if :: took -> ans = R_TAKEN :: else -> ans = R_ACQ fi
     :: else ->
        if
        :: rst == INF && !rlive -> ans = R_EXPIRED
        :: else ->
           ans = R_EXIST;
#if RELAXED
           /* PostgresStore::make_durable: before an in-flight row is answered "in flight", a
              synchronous commit flushes the WAL, the other attempt's reservation included
              (were the database to crash first, the call would fail and not be acked). */
           if :: rst == INF -> flush() :: else -> skip fi
#endif
           skip
        fi
     fi
  fi
}
/* P5: an acked answer that rests on an in-flight row: the row is not this attempt's own, and
   someone still carries the event: the row is durable (the reconciler finishes it), or it is
   held by another worker whose message is not acked (it finishes, or its redelivery does). */
#define DURABLE (dex && dst == rst && dfence == rfence && dhold == rhold)
#define HW ((rhold - 1) / 3)
#define CARRIED (DURABLE || (rhold < 20 && HW != w && !(wacked & (1 << HW))))
#define CARRIED_CHECK(c) assert(!P5_ && (!acking || !(c) || CARRIED))
#define RESERVE_REPLIED \
  assert(!P5_ && (ans != R_EXIST || rst != INF || rhold != tok)); \
  CARRIED_CHECK(ans == R_EXIST && rst == INF); \
  if :: ans == R_EXIST -> ACK :: else -> skip fi

/* idemgate_take_over: fence + 1, new lease and holder, attempts + 1, if still expired at `f`. */
inline take_over_stmt() {
  if
  :: rex && rst == INF && rfence == f && !rlive ->
     rfence++; rlive = 1; rhold = tok;
     if :: ratt <= MAXA -> ratt++ :: else -> skip fi;
     relaxed_write(); invariants();
     got = 1; hf = rfence
  :: else -> got = 0
  fi
}

/* idemgate_take_stale (synchronous): takes an expired in-flight row, or returns the row this
   pass's token already holds (the statement repeated after its reply was lost). */
inline take_stale_stmt() {
  if
  :: rex && rst == INF && !rlive ->
     rfence++; rlive = 1; rhold = tok;
     if :: ratt <= MAXA -> ratt++ :: else -> skip fi;
     flush(); invariants();
     got = 1; hf = rfence; att = ratt
  :: rex && rst == INF && rlive && rhold == tok -> got = 1; hf = rfence; att = ratt
  :: else -> got = 0
  fi
}

#define STRANDED (rex && rst == INF && !rlive)
#define TAKE_STALE fresh_token(20 + 3 * r); cur[3 + r] = tok; take_stale_stmt()

/* PostgresStore::settled_state: what a fenced write finds when it touched no row. */
inline settled_state() {
  if
  :: !rex -> res = C_STOREERR /* the reservation is gone (lost in a crash) */
  :: else ->
     if
     :: rfence < hf && rst == INF -> res = C_STOREERR /* own takeover lost in a crash */
     :: rfence == hf && rst == target -> res = C_COMMITTED
     :: rfence == hf && rst == INF -> res = 0 /* still ours: go ahead */
     :: else -> res = C_LOST
     fi
  fi
}

/* P5: what an acked answer may rest on. processed: committed; lost_lease: finished, or in
   flight under a higher fence (another attempt holds it). */
#define SETTLED_REPLIED \
  assert(!P5_ && (res != C_COMMITTED || (rex && rst == target))); \
  assert(!P5_ && (res != C_LOST || (rex && (rst != INF || rfence > hf)))); \
  CARRIED_CHECK(res == C_LOST && rst == INF); \
  if \
  :: acking && (res == C_COMMITTED || res == C_LOST) -> \
     if \
     :: ACK \
     :: FAULT(F_CRASH) -> faults++; cur[w] = 0; fin = 2 /* dies before the ack */ \
     fi \
  :: else -> skip \
  fi

/* The message is acked: at once, with the answer it rests on. */
#define ACK wacked = wacked | (1 << w); cur[w] = 0; fin = 1

/* idemgate_fail / idemgate_escalate (PostgresStore::settle): fenced; settled_earlier when it
   touched no row. */
inline settle_stmt() {
  if
  :: rex && rst == INF && rfence == hf ->
     rst = target; flush(); invariants(); res = C_COMMITTED
  :: else ->
     settled_state();
     if :: res == 0 -> res = C_LOST :: else -> skip fi
  fi
}

/* idemgate_release: fenced; ends the lease at once (lease_until = 'epoch'), keeps the row. */
inline release_stmt() {
  if
  :: rex && rst == INF && rfence == hf -> rlive = 0; flush(); invariants()
  :: else -> skip
  fi
}

/* The commit transaction (PostgresStore::commit): the business write, then the fenced update,
   then COMMIT; atomic, as the database makes it. */
inline commit_tx() {
  if
  :: rex && rst == INF && rfence == hf ->
     assert(!P7_ && rfence == hf); /* only the holder of the current fence commits */
     biz++; bizout = ans; rst = COM; rout = ans; flush(); invariants();
     landed = 1
  :: else -> landed = 0
  fi
}

/* Gate::commit_or_release: PostgresStore::commit under with_commit_retries; when it throws
   (business write, StoreError), the lease is given back and the exception goes on. */
inline commit_or_release() {
  n = 1; target = COM;
  do
  :: atomic { /* the business write throws: the transaction rolls back */
       (THROWS || FAULT(F_THROW)) ->
       if :: !THROWS -> faults++ :: else -> skip fi;
       res = C_THREW; break }
  :: atomic { !THROWS -> commit_tx();
       if
       :: landed -> res = C_COMMITTED
       :: else -> settled_state(); /* settled_earlier */
          if :: res == 0 -> res = C_LOST :: else -> skip fi
       fi;
       SETTLED_REPLIED; break }
  :: atomic { !THROWS && FAULT(F_CUT) -> faults++;
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

/* ---- the downstream ---- */

#if HONOURS
/* A downstream that honours keys answers every claim under the key alike: runs with outcome B
   mirror those with A, so one outcome stands for both. */
#define PICK dsout = OK_A
#else
#define PICK if :: dsout = OK_A :: dsout = OK_B fi
#endif

/* Downstream::claim(request, key). Honouring keys: the same key gets the same outcome. */
inline claim() {
  atomic {
#if HONOURS
    if
    :: dsout != 0 -> ans = dsout
    :: dsout == 0 -> PICK; dsseen = dsseen | dsout; ans = dsout
    :: dsout == 0 -> ans = PERM /* refused; a later claim may succeed (after a fix, a re-drive) */
    :: FAULT(F_TRANS) -> faults++; ans = TRANS /* failed before doing anything */
    :: FAULT(F_TRANS) && dsout == 0 -> faults++; /* did the work, the answer was lost */
       PICK; dsseen = dsseen | dsout; ans = TRANS
    fi
#else
    /* P6: a downstream that ignores keys does the work again on every call */
    dscalls++; assert(!P6_ && dscalls <= 1);
    if :: ans = OK_A :: ans = OK_B fi; dsout = ans; dsseen = dsseen | ans
#endif
    ;invariants()
  }
}

/* Downstream::lookup(key): found, not found, or transient. */
inline lookup() {
  atomic {
    if
    :: dsout != 0 -> ans = dsout
    :: dsout == 0 -> ans = NOTFOUND
    :: FAULT(F_TRANS) -> faults++; ans = TRANS
    fi
  }
}

#define CRASH(TO) atomic { FAULT(F_CRASH) -> faults++; cur[IDX] = 0 }; goto TO

/* ---- Gate::process, one message of the event, redelivered until acked ---- */
#define IDX w
proctype Worker(byte w) {
  byte tok, f, hf, ans, res, target, got, landed, n, deliveries;
  bool took;
  bool acking = 1; /* its answers decide whether a message is acked */
  byte fin;        /* 1: acked, 2: died before the ack */
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
  :: claim()
  fi;
  if
  :: ans == OK_A || ans == OK_B -> /* Gate::commit */
     if
     :: CRASH(crashed) /* dies after the downstream did the work */
     :: commit_or_release()
     fi;
     if
     :: fin == 1 -> goto acked /* processed or lost_lease */
     :: fin == 2 -> goto crashed
     :: else -> goto not_acked /* the exception reaches the caller */
     fi
  :: ans == PERM -> /* Gate::finish: store.fail */
     target = FAI;
     RUN(settle_stmt(), SETTLED_REPLIED, goto not_acked);
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
  atomic { cur[w] = 0; tok = 0; f = 0; hf = 0; ans = 0; res = 0; target = 0; got = 0; took = 0; fin = 0 };
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

/* ---- Reconciler::run_once, in a loop ---- */
#undef IDX
#define IDX (3 + r)
proctype Reconciler(byte r) {
  byte tok, hf, att, ans, res, target, got, landed, n;
  byte w = 255;
  bool acking = 0; /* no message: nothing is acked */
  byte fin;
end_idle:
  do
  :: /* a pass: idemgate_take_stale with a fresh token (a cut loses the reply or the statement) */
     if
     :: atomic { STRANDED -> TAKE_STALE }
     :: atomic { STRANDED && FAULT(F_CUT) -> faults++; TAKE_STALE };
        if /* its reply was lost: the retry returns the rows this token holds */
        :: atomic { take_stale_stmt() }
        :: atomic { FAULT(F_CUT) -> faults++ }; goto pass_done
        fi
     fi;
     if
     :: !got -> goto pass_done
     :: got -> skip
     :: atomic { got && FAULT(F_CRASH) -> faults++; cur[3 + r] = 0 }; goto pass_done /* dies holding it */
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
     :: target == COM -> commit_or_release() /* Gate::commit */
     :: target == FAI || target == ESC -> RUN(settle_stmt(), skip, goto pass_done)
     :: target == INF -> RUN(release_stmt(), skip, goto pass_done) /* defer */
     fi;
pass_done:
     atomic { cur[3 + r] = 0; tok = 0; hf = 0; att = 0; n = 0; ans = 0; res = 0; target = 0; got = 0; landed = 0 }
  od
}

/* Time: the lease of a holder that died (or finished) expires at any moment; a lease expiring
   under a holder still at work is a stall, and counts as a fault. stale_after is folded into
   the expiry. */
#define HOLDER_RUNNING \
  (cur[0] == rhold || cur[1] == rhold || cur[2] == rhold || cur[3] == rhold || cur[4] == rhold)
active proctype Clock() {
end_clock:
  do
  :: atomic { rex && rlive && !HOLDER_RUNNING -> rlive = 0; dlive = 0 }
  :: atomic { rex && rlive && HOLDER_RUNNING && FAULT(F_STALL) -> faults++; rlive = 0; dlive = 0 }
  od
}

#if RELAXED
/* A database crash: writes not yet flushed (relaxed reservations and takeovers) are lost. */
active proctype DatabaseCrash() {
end_crash:
  do
  :: atomic {
       FAULT(F_DB) &&
       (rex != dex || rst != dst || rfence != dfence || rhold != dhold || ratt != datt) ->
       faults++;
       rex = dex; rst = dst; rfence = dfence; rhold = dhold; rlive = dlive; ratt = datt;
       rout = dout; invariants()
     }
  od
}
#endif

#if !THROWS && HONOURS && !defined(NOREDRIVE)
/* An operator re-drives the failed event once (PostgresStore::redrive_failed). */
active proctype Operator() {
end_operator:
  atomic {
    rex && rst == FAI ->
    rst = INF; rfence++; rlive = 0; flush(); invariants()
  }
}
#endif

/* Retention::run_once: the dedup window outlasts every delivery of the event. */
active proctype Retention() {
  (wacked == 7);
end_retention:
  do
  :: atomic {
       rex && (rst == COM || rst == FAI) -> /* idemgate_purge */
       gone_final = (rst == COM || rst == FAI);
       rex = 0; flush()
     }
  od
}

init {
  atomic {
    run Worker(0); run Worker(1); run Worker(2);
    run Reconciler(0); run Reconciler(1)
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

/* L1: once faults stop, the event ends committed, failed or escalated, and stays so. */
ltl ends { <> [] ((rex && rst != INF) || gone_final) }
#endif

/*
 * idemgate's server side (server::Endpoint) for the SPIN model checker: clients send requests
 * under one Idempotency-Key (one client, method and target: one row of the log) and retry until
 * they get a final answer; the endpoint runs the handler once per key, inside the transaction that
 * stores its response, and answers a repeat with the stored response.
 * docs/model/README.md maps it to the code; scripts/model-check runs it with gate.pml's runs.
 *
 * Configurations (cpp switches, given to spin as -D...):
 *   (none)    three clients: two send the same request (a retry, a concurrent duplicate), one a
 *             different request under the same key (a reuse that must be refused)
 *   MAXF=n    faults in one run (a handler that throws or answers 5xx, the server killed before
 *             or after the commit, a handler slower than its lease); after the n-th, none
 *   LIVENESS  adds the LTL property (check it with pan -a -f)
 */

#ifndef MAXF
#define MAXF 2
#endif
#define NC 3

#define REQ_A 1 /* the request's fingerprint: two bodies, A and B */
#define REQ_B 2
#define INF 1 /* in flight */
#define COM 2 /* committed: the response is stored */
#define REFUSED 255 /* a client's answer: 422, the key was used with another request */

/* Property names: always 0, they name the property in a violated assertion.
   S1 the handler's writes commit at most once per key, and only with the stored response
   (no response stored without them, none of them without it);
   S2 every response a client gets for the key is the one stored (the first answer and every
   replay);
   S3 a client gets a stored response only for the request it was stored for (the fingerprint). */
bit S1_, S2_, S3_;

/* ---- the log's row for the key (Endpoint: store.reserve, commit_computed, release) ---- */
bool rex;    /* the row exists */
byte rst;    /* INF or COM */
byte rfence; /* the fence */
bool rlive;  /* the lease is live */
byte rfp;    /* the fingerprint of the request the row was reserved for */
byte rresp;  /* the stored response (a handler run's id) */

/* ---- the handler's business table, and the runs ---- */
byte writes; /* committed handler writes for the key */
byte runs;   /* handler runs so far; run n answers response n */

/* ---- clients ---- */
byte body[NC];    /* the request each client sends */
byte got[NC];     /* its final answer: 0 none yet, a response, or REFUSED */
bool working[NC]; /* its current attempt holds the lease and is running the handler */
byte held[NC];    /* the fence that attempt holds */
byte faults;

#define FAULT (faults < MAXF)
#define CHECK_STORED assert(!S1_ && (writes == (rst == COM -> 1 : 0)))

/* Endpoint::handle for one attempt of client c: one reservation, then either the answer the row
   already has, or the handler in the commit transaction. The attempt ends with a final answer
   (got[c]) or with one the client retries: 409, a 5xx, or no answer (the server was killed). */
proctype Client(byte c) {
  byte f, r;
  bool mine;
  do
  :: got[c] != 0 -> break
  :: else ->
     atomic {
       /* idemgate_reserve: insert, or take over an expired lease of the same request */
       if
       :: !rex -> rex = 1; rst = INF; rfence = 1; rlive = 1; rfp = body[c]; f = 1; mine = 1
       :: rex && rst == INF && !rlive && rfp == body[c] -> rfence++; rlive = 1; f = rfence;
          mine = 1
       :: else -> mine = 0
       fi;
       if
       :: mine -> working[c] = 1; held[c] = f
       :: !mine && rfp != body[c] -> got[c] = REFUSED /* 422 */
       :: !mine && rfp == body[c] && rst == INF -> skip /* 409, Retry-After */
       :: !mine && rfp == body[c] && rst == COM -> /* replayed: Idempotent-Replayed */
          got[c] = rresp;
          assert(!S3_ && rfp == body[c])
       fi
     }
     if
     :: mine ->
        atomic { runs++; r = runs } /* the handler runs; its writes wait for COMMIT */
        if
        :: atomic { FAULT -> faults++; /* it threw or answered 5xx: rolled back, given back */
             if :: rex && rst == INF && rfence == f -> rlive = 0 :: else -> skip fi;
             working[c] = 0 }
        :: atomic { FAULT -> faults++; working[c] = 0 } /* killed before COMMIT: rolled back */
        :: atomic { /* COMMIT: the handler's writes and its response, fenced */
             if
             :: rex && rst == INF && rfence == f ->
                rst = COM; rresp = r; writes++; CHECK_STORED;
                if
                :: FAULT -> faults++ /* killed after COMMIT, before the reply: retried */
                :: got[c] = r /* the first answer */
                fi
             :: else -> skip /* the lease was taken over: rolled back, 409 */
             fi;
             working[c] = 0 }
        fi
     :: else -> skip
     fi
  od;
  assert(!S2_ && (got[c] == REFUSED || (rst == COM && got[c] == rresp)))
}

/* A lease runs out: at any moment once its holder is gone (killed, or it gave it back), and under
   a holder still at work only as a fault (a handler slower than the lease, which has no
   heartbeat: the takeover's commit then wins, and the slow one's is rolled back). */
#define HOLDER_WORKING \
  ((working[0] && held[0] == rfence) || (working[1] && held[1] == rfence) || \
   (working[2] && held[2] == rfence))
active proctype Clock() {
end_clock:
  do
  :: atomic { rex && rst == INF && rlive && !HOLDER_WORKING -> rlive = 0 }
  :: atomic { rex && rst == INF && rlive && HOLDER_WORKING && FAULT -> faults++; rlive = 0 }
  od
}

init {
  atomic {
    body[0] = REQ_A; body[1] = REQ_A; body[2] = REQ_B;
    run Client(0); run Client(1); run Client(2)
  }
}

#ifdef LIVENESS
/* L1: once faults stop, every client gets its final answer. */
ltl answered { <> (got[0] != 0 && got[1] != 0 && got[2] != 0) }
#endif

/* Self-fencing leases (issue 27; cxlrt/runtime/membership.cc RenewLease,
 * CheckLease / LeaseHeld, HeartbeatLoop, Fence, Quiet) on x86-TSO, with
 * time. /work/notes/lease-protocol.md and docs/membership.md have the
 * protocol; this model checks it for one host H and one survivor S.
 *
 * Time is a global clock `now` advanced one tick at a time by Clock, up to
 * TMAX. A process not scheduled while Clock ticks is frozen for those
 * ticks: H's heartbeat thread, H's writer thread, S and every drainer can
 * freeze anywhere for any number of ticks, EXCEPT:
 *
 *   ASSUMPTION (the remaining window): between the writer's clock read
 *   (LeaseHeld's, or RenewLease's t0 when it renewed) at tick c and the
 *   landing of its metadata store, Clock does not pass c + WBOUND,
 *   WBOUND = 2M - 1 by default (the note: a longer freeze between check and
 *   store can land the store after recovery; only hardware fencing closes
 *   that). -DWINDOW drops the assumption. The bound is not tight: with a
 *   lease read on whole ticks (c <= t0 + L - M - 1, recovery >= t0 + L + M
 *   + 1) the model verifies up to -DWBOUND=2M+1 and fails at 2M+2 (checked
 *   for M = 1 and M = 2), i.e. "a freeze of more than 2M" as the note says.
 *
 * Every clock read is `now`: the hosts' clocks run at the same rate (D = 0;
 * clocks of different hosts are never compared, so a common `now` loses
 * only drift). A clock that stops with its host (a paused VM) is not
 * modelled: ConfirmLease covers it in the code.
 *
 * Stores: H's beat stores (from either thread: H is one core here, one
 * FIFO buffer, as TSO orders two cores' beats through renew_mu_ anyway) and
 * S's fence store go through store buffers drained by processes of their
 * own at any later step; a fence (mfence) waits for the buffer to drain.
 * The writer's metadata store is the event the assertion is about: it
 * "lands" in one step, and the window bound covers when.
 *
 * H: RenewLease (under renew_mu_) = if fenced -> fail; t0 = now; beat+1
 * stored; mfence; load its control record; epoch changed -> fenced for good
 * (lease end 0), else valid_until = max(valid_until, t0 + L - M).
 * The heartbeat renews (any number of times, at any moments); the writer
 * makes WRITES metadata writes: LeaseHeld (now < valid_until) or else
 * RenewLease; fenced -> stop; else the store lands.
 * S: watches the beat on its clock (an observation: at some moment after
 * the beat in memory changed, S notes the value and the time); dead once it
 * stood still > L + M; stores the fence (epoch+1); mfence; reloads the beat
 * (Quiet): unchanged -> recover; moved -> wait until it stood still > L + M
 * again, then recover.
 * Property: once S started recovering H, no metadata store of H lands.
 *
 * Bounds that keep the search small (each only removes behaviours): at most
 * BEATS renewals in the whole run (a further renewal blocks: that thread
 * froze), WRITES metadata writes, S recovers once, the clock stops at TMAX.
 * TMAX = 12 leaves room for S's second wait (dead at >= 5, the beat moves
 * under the fence, still again > L + M: recovery at >= 10; at TMAX = 9 no
 * run reaches it). Larger bounds verify too (TMAX=16 BEATS=5 WRITES=3:
 * 17 M states, 30 s), too slow for every ctest run.
 *
 * Broken variants (each must fail):
 *  -DNO_LEASE_CHECK  the writer checks only the fenced flag (before issue 27)
 *  -DNO_H_FENCE      RenewLease without the mfence between beat store and load
 *  -DNO_S_RECHECK    S recovers right after storing the fence
 *  -DWINDOW          the writer may freeze without bound between check and store
 * and two more that fail (not in ctest: NO_S_RECHECK covers both at once):
 *  -DNO_S_FENCE      S waits as written but without the mfence before the reload
 *  -DNO_S_WAIT       S recovers after the fence whether or not the beat moved
 */
#ifndef L
#define L 3
#endif
#ifndef M
#define M 1
#endif
#define LEASE (L - M)        /* a renew at t0 gives a lease until t0 + L - M */
#define DEAD (L + M)         /* S: dead once the beat stood still > L + M (D = 0) */
#ifndef WBOUND
#define WBOUND (2 * M - 1)
#endif
#ifndef TMAX
#define TMAX 12
#endif
#ifndef BEATS
#define BEATS 4
#endif
#ifndef WRITES
#define WRITES 2
#endif

byte now;                    /* the clock */
byte beat_mem;               /* H's owner line (beat) as memory holds it */
bit epoch_mem;               /* H's control record: 0 = H's epoch, 1 = fenced */
chan sb_h = [1] of { byte }; /* H's store buffer (beats) */
chan sb_s = [1] of { bit };  /* S's store buffer (the fence) */

byte hbeat;                  /* H's beat counter (H's own view) */
byte valid_until;            /* H's lease end on its clock (0 once fenced) */
bool fenced;                 /* H learned it was fenced */
bool mtx;                    /* renew_mu_ */
bool in_window;              /* writer between its clock read and its store landing */
byte check_time;
bool recovering;             /* S started recovering H */

#ifdef NO_H_FENCE
#define FENCE_H skip
#else
#define FENCE_H (len(sb_h) == 0)
#endif

#ifdef WINDOW
#define WINDOW_OK true
#else
#define WINDOW_OK (!in_window || now < check_time + WBOUND)
#endif

proctype Clock() {
end: do
  :: atomic { now < TMAX && WINDOW_OK -> now++ }
  od
}

proctype DrainH() {
  byte v;
end: do
  :: atomic { sb_h?v -> beat_mem = v; v = 0 }
  od
}

proctype DrainS() {
  bit v;
end: do
  :: atomic { sb_s?v -> epoch_mem = v; v = 0 }
  od
}

/* RenewLease; the caller holds renew_mu_ and has checked !fenced. `w`: the
 * writer, whose window opens at t0 (its clock read). */
inline renew(w) {
  skip;                            /* (spin: no label first in an inline) */
end_bound:                         /* the bound on renewals (under renew_mu_): */
  (hbeat < BEATS);                 /* else this thread froze here */
  atomic {
    t0 = now; hbeat++;
    if :: w -> check_time = t0; in_window = true :: else -> skip fi;
    sb_h!hbeat                     /* Beat() */
  };
  FENCE_H;                         /* FenceStoresBeforeLoads */
  atomic {
    if
    :: epoch_mem != 0 ->           /* MarkFenced; the writer then stores nothing */
       fenced = true; valid_until = 0; if :: w -> in_window = false :: else -> skip fi
    :: else -> if :: t0 + LEASE > valid_until -> valid_until = t0 + LEASE :: else -> skip fi
    fi;
    t0 = 0
  }
}

proctype Heartbeat() {
  byte t0;
end: do
  :: atomic { !mtx -> mtx = true };
     if
     :: fenced -> mtx = false; break    /* the heartbeat stops */
     :: else -> renew(false); mtx = false
     fi
  od
}

proctype Writer() {
  byte t0, n;
  for (n : 1 .. WRITES) {
#ifdef NO_LEASE_CHECK
end_fenced:
    atomic { !fenced -> check_time = now; in_window = true };
#else
    /* CheckLease: LeaseHeld (one clock read; 0 once fenced) or RenewLease */
    atomic {
      if
      :: now < valid_until -> check_time = now; in_window = true
      :: else -> skip
      fi
    };
    if
    :: !in_window ->
end_mtx: atomic { !mtx -> mtx = true };
       if
       :: fenced -> skip
       :: else -> renew(true)
       fi;
       mtx = false
    :: else -> skip
    fi;
    if
    :: !in_window -> break             /* fenced: kAborted, no more writes */
    :: else -> skip
    fi;
#endif
    atomic { assert(!recovering); in_window = false; check_time = 0 }  /* the store lands */
  }
}

proctype Survivor() {
  byte seen, since;
  /* Observe until dead: still for > L + M */
end_obs:
  do
  :: atomic { beat_mem != seen -> seen = beat_mem; since = now }
  :: atomic { beat_mem == seen && now - since > DEAD -> break }
  od;
  /* Fence, under the pool lock (epoch still the one seen): store epoch+1 */
  sb_s!1;
#ifndef NO_S_RECHECK
#ifndef NO_S_FENCE
  (len(sb_s) == 0);                     /* Quiet: FenceStoresBeforeLoads */
#endif
  /* Quiet: the beat reloaded; recover once it has stood still > L + M
   * since it last moved (at once if it did not move) */
#ifndef NO_S_WAIT
end: do
  :: atomic { beat_mem != seen -> seen = beat_mem; since = now }
  :: atomic { beat_mem == seen && now - since > DEAD -> break }
  od;
#endif
#endif
  recovering = true                     /* reads / claims H's metadata */
}

init {
  atomic {
    run Clock(); run DrainH(); run DrainS();
    run Heartbeat(); run Writer(); run Survivor()
  }
}

/* WIP (not registered in ctest): the safe run did not finish within 60 s at TMAX=8..12; state space must be cut first.
 * Self-fencing leases (issue 27; /work/notes/lease-protocol.md,
 * cxlrt/runtime/membership.cc Renew / HeartbeatLoop / Observe / Fence) on
 * x86-TSO, with time.
 *
 * Time is a global clock `now` advanced one tick at a time by Clock, up to
 * TMAX. A process that is not scheduled while Clock ticks is frozen for
 * those ticks: any process (H's heartbeat, H's writer, the survivor S, any
 * drainer) can freeze anywhere for any number of ticks, EXCEPT:
 *
 *   ASSUMPTION (the remaining window): between the writer's lease check at
 *   tick c and the landing of its metadata store, Clock does not pass
 *   c + WBOUND, WBOUND = 2M - 1 (the note: a freeze of more than 2M between
 *   check and store can land the store after recovery; only hardware
 *   fencing closes that). -DWINDOW drops the assumption.
 *
 * Each clock read is `now` (the hosts' clocks run at the same rate; D = 0,
 * and since clocks of different hosts are never compared, a common `now`
 * loses nothing but drift). The metadata store is modelled as landing
 * directly (its landing is the event the window bound covers). Beat stores
 * and S's fence store go through FIFO store buffers drained by processes of
 * their own at any later step (TSO); FENCE waits for the buffer to empty.
 *
 * H: Renew = t0 = now; beat+1 stored; mfence; load own control record; if
 * the epoch changed -> fenced for good, else valid_until = max(.., t0+L-M).
 * The heartbeat renews at most once a tick; the writer, before each
 * metadata store: if fenced -> stop; if now >= valid_until -> Renew (under
 * the process mutex); if that found the fence -> stop; else store.
 * S: watches the beat on its clock; dead once it stood still > L + M;
 * stores the fence (epoch+1); mfence; reloads the beat: unchanged ->
 * recover; moved -> wait until it stood still > L + M again, then recover.
 * Property: once S started recovering H, no metadata store of H lands.
 *
 * Broken variants (each must fail):
 *  -DNO_LEASE_CHECK  the writer checks only the fenced flag (before issue 27)
 *  -DNO_H_FENCE      Renew without the mfence between beat store and load
 *  -DNO_S_RECHECK    S recovers right after storing the fence
 *  -DWINDOW          the writer may freeze without bound between check and store
 */
#define L 4
#define M 1
#define LEASE (L - M)        /* a renew at t0 gives a lease until t0 + L - M */
#define DEAD (L + M)         /* S: dead once the beat stood still > L + M (D = 0) */
#define WBOUND (2 * M - 1)
#ifndef TMAX
#define TMAX 12
#endif

byte now;                    /* the clock */
byte beat_mem;               /* H's owner line (beat) as memory holds it */
byte epoch_mem;              /* H's control record: 0 = H's epoch, 1 = fenced */
chan sb_hb = [2] of { byte };/* store buffer of H's heartbeat thread (beats) */
chan sb_wr = [2] of { byte };/* store buffer of H's writer thread (beats it renews) */
chan sb_s  = [1] of { byte };/* S's store buffer (the fence) */

byte hbeat;                  /* H's beat counter (H's own view) */
byte valid_until;            /* H's lease, on its clock */
bool fenced;                 /* H learned it was fenced */
bool mtx;                    /* H's process mutex around Renew */
bool in_window;              /* writer between lease check and store */
byte check_time;
bool recovering;             /* S started recovering H */

#ifdef NO_H_FENCE
#define FENCE_H(sb) skip
#else
#define FENCE_H(sb) (len(sb) == 0)
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

proctype Drain(chan sb; byte which) {
  byte v;
end: do
  :: atomic { sb?v -> if :: which == 0 -> beat_mem = v :: else -> epoch_mem = v fi }
  od
}

/* H's Renew, from the thread whose store buffer is sb */
inline renew(sb) {
  atomic { !mtx -> mtx = true };
  t0 = now;
  hbeat++;
  sb!hbeat;
  FENCE_H(sb);
  if
  :: epoch_mem != 0 -> fenced = true
  :: else -> if :: t0 + LEASE > valid_until -> valid_until = t0 + LEASE :: else -> skip fi
  fi;
  mtx = false
}

proctype Heartbeat() {
  byte t0, last = 255;
end: do
  :: fenced -> break
  :: !fenced && now != last -> last = now; renew(sb_hb)
  od
}

proctype Writer() {
  byte t0;
end: do
  :: fenced -> break
  :: else ->
#ifdef NO_LEASE_CHECK
     atomic { !fenced -> check_time = now; in_window = true };
#else
     if
     :: now >= valid_until -> renew(sb_wr)
     :: else -> skip
     fi;
     atomic {
       if
       :: !fenced && now < valid_until -> check_time = now; in_window = true
       :: else -> skip
       fi
     };
#endif
     if
     :: in_window ->
        atomic { assert(!recovering); in_window = false }  /* the metadata store lands */
     :: else -> skip
     fi
  od
}

proctype Survivor() {
  byte seen, since, b;
  seen = beat_mem; since = now;
  /* Observe: the beat on S's clock; dead once still for > L + M */
  do
  :: b = beat_mem;
     if
     :: b != seen -> seen = b; since = now
     :: else -> if :: now - since > DEAD -> break :: else -> skip fi
     fi
  od;
  /* Fence: (pool lock; epoch still the one seen) store epoch+1 */
  sb_s!1;
#ifndef NO_S_RECHECK
  (len(sb_s) == 0);                     /* FenceStoresBeforeLoads */
  b = beat_mem;
  if
  :: b == seen -> skip                  /* H cannot renew without seeing the fence */
  :: else ->                            /* H renewed concurrently: wait out its lease */
     seen = b; since = now;
end: do
     :: b = beat_mem;
        if
        :: b != seen -> seen = b; since = now
        :: else -> if :: now - since > DEAD -> break :: else -> skip fi
        fi
     od
  fi;
#endif
  recovering = true                     /* reads / claims H's metadata */
}

init {
  atomic {
    run Clock();
    run Drain(sb_hb, 0); run Drain(sb_wr, 0); run Drain(sb_s, 1);
    run Heartbeat(); run Writer(); run Survivor()
  }
}

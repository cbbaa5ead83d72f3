/* The pool lock (cxlrt/runtime/bakery_lock.cc) on x86-TSO.
 *
 * Two hosts, each the only writer of its ticket (number << 1 | choosing).
 * A host's stores go into its own FIFO store buffer and reach memory when
 * its drainer process takes them, at any later step; a host reads its own
 * ticket from what it knows and the other's from memory, so the model has
 * exactly TSO's one reordering: a store followed by a load of another line.
 * FENCE (mfence) waits until the buffer is empty.
 *
 * Built with -DFENCE it is today's lock, and the model must verify mutual
 * exclusion; without, it is the lock before issue 13, and spin must find
 * two hosts in the critical section at once.
 */
#define N 2
#define ROUNDS 2

byte mem[N];                 /* ticket words as memory holds them */
chan sb[N] = [3] of { byte };/* store buffers: values of the owner's ticket */
byte in_cs;                  /* ghost: hosts inside the critical section */

inline store(i, v) { sb[i]!v }
#ifdef FENCE
inline fence(i) { (len(sb[i]) == 0) }
#else
inline fence(i) { skip }
#endif

proctype Drainer(byte i) {
  byte v;
end: do
  :: atomic { sb[i]?v -> mem[i] = v }
  od
}

proctype Host(byte i) {
  byte j = 1 - i, t, mine, r;
  for (r : 1 .. ROUNDS) {
    store(i, 1);                         /* choosing */
    fence(i);
    t = mem[j];
    mine = (t >> 1) + 1;                 /* one above the number seen */
    store(i, mine << 1);                 /* number set, choosing cleared */
    fence(i);
    do                                   /* wait while j is in the way */
    :: t = mem[j];
       if
       :: (t & 1) == 1 -> skip
       :: (t & 1) == 0 && (t >> 1) != 0 &&
          ((t >> 1) < mine || ((t >> 1) == mine && j < i)) -> skip
       :: else -> break
       fi
    od;
    in_cs++;
    assert(in_cs == 1);
    in_cs--;
    store(i, 0);                         /* unlock */
  }
}

init {
  atomic {
    run Drainer(0); run Drainer(1);
    run Host(0); run Host(1);
  }
}

/* The KV pin / evict handshake (cxlrt/kv/store.cc: Lookup and EvictSlots) on
 * x86-TSO.
 *
 * A reader pins an entry (a store to its own pin table), then checks that
 * the entry is still sealed (a load of the owner's line). The owner unseals
 * the entry (a store to its line), then reads every pin table (loads) and
 * frees the block only if nobody has pinned it; a reader that saw the
 * unseal drops its pin and does not use the entry. Safety: the owner never
 * frees a block that a reader is using.
 *
 * Each side writes its own line and then reads the other's, the pattern
 * TSO reorders: with -DFENCE (today's code, a seq_cst fence on both sides)
 * the model must verify; without, spin must find a reader using a freed
 * block.
 */
byte seal = 1;            /* owner's line as memory holds it */
byte pin = 0;             /* reader's pin record as memory holds it */
chan sb_reader = [2] of { byte };
chan sb_owner = [2] of { byte };
bool using = false, freed = false;

#ifdef FENCE
#define FENCE_R (len(sb_reader) == 0)
#define FENCE_O (len(sb_owner) == 0)
#else
#define FENCE_R skip
#define FENCE_O skip
#endif

proctype DrainReader() { byte v; end: do :: atomic { sb_reader?v -> pin = v } od }
proctype DrainOwner()  { byte v; end: do :: atomic { sb_owner?v -> seal = v } od }

proctype Reader() {
  sb_reader!1;                          /* pin */
  FENCE_R;
  if
  :: seal == 1 -> using = true;         /* still sealed: read the block */
                  assert(!freed);
                  using = false
  :: else -> skip
  fi;
  sb_reader!0                           /* release */
}

proctype Owner() {
  sb_owner!0;                           /* unseal (state evicting) */
  FENCE_O;
  if
  :: pin == 0 -> freed = true;          /* nobody pinned: free the block */
                 assert(!using)
  :: else -> sb_owner!1                 /* pinned: seal it again */
  fi
}

init { atomic { run DrainReader(); run DrainOwner(); run Reader(); run Owner() } }

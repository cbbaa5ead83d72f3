/* The post protocol of a communicator (cxlrt/collectives/pool_transport.cc:
 * Stage's AwaitPeersDone, PublishLine, WaitPosted and CheckPost, Done; the
 * model once named them Exchange, EndRound and WaitSlotFree) on x86-TSO.
 *
 * Since kCommVersion 5 a post's bytes may lie in its post line itself
 * (inline: line 0, and line 1 past 8 bytes) rather than in a slot: the
 * model's slot_data stands for whichever holds them, written before the
 * flag, read after it, and reused only once done >= k - depth. The reader
 * fetches line 0 and then line 1 (two loads after the flag load, kept in
 * order by TSO), so the model's single data load still covers it.
 *
 * Rank 0 posts round k into slot k % 2 (data, then the round flag); rank 1
 * waits for the flag, reads the data and stores done_round = k. Round k reuses
 * the slot of round k - 2, so rank 0 first waits for done_round >= k - 2. Flags
 * only grow and are never reset. Stores go through a FIFO store buffer per
 * rank (TSO); loads read memory. Safety: rank 1 reads, for every round, the
 * data of that round.
 *
 * No fence is needed: the protocol has no store followed by a load that
 * must stay behind it (TSO keeps store->store and load->load/store in
 * order). The model must verify as written; with -DNO_SLOT_WAIT (a writer
 * that does not wait for the slot to be free) spin must find a reader that
 * reads a later round's data.
 */
#define ROUNDS 4

byte slot_data[2], post_flag, done_round;      /* memory */
chan sb0 = [4] of { byte, byte };        /* rank 0's stores: (what, value) */
chan sb1 = [4] of { byte, byte };        /* rank 1's stores */
#define W_SLOT0 0
#define W_SLOT1 1
#define W_FLAG 2
#define W_DONE 3

proctype Drain(chan sb) {
  byte w, v;
end: do
  :: atomic {
       sb?w,v ->
       if
       :: w == W_SLOT0 -> slot_data[0] = v
       :: w == W_SLOT1 -> slot_data[1] = v
       :: w == W_FLAG -> post_flag = v
       :: w == W_DONE -> done_round = v
       fi
     }
  od
}

proctype Writer() {
  byte k;
  for (k : 1 .. ROUNDS) {
#ifndef NO_SLOT_WAIT
    (k <= 2 || done_round >= k - 2);           /* WaitSlotFree */
#endif
    sb0!(k % 2),k;                       /* the round's data into its slot */
    sb0!W_FLAG,k                         /* then the flag */
  }
}

proctype Reader() {
  byte k, got;
  for (k : 1 .. ROUNDS) {
    (post_flag >= k);                    /* WaitPosted */
    got = slot_data[k % 2];
    assert(got == k);
    sb1!W_DONE,k                         /* EndRound */
  }
}

init { atomic { run Drain(sb0); run Drain(sb1); run Writer(); run Reader() } }

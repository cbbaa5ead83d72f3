#include "cxlrt/collectives/comm_knobs.h"

namespace cxlrt::collectives {

using runtime::UintIn;

const runtime::Knob<uint32_t> kCommTimeoutMs({"CXLRT_COMM_TIMEOUT_MS", "60000",
                                              "Deadline of every wait of a collective call."},
                                             60000, UintIn(1, 86400000));
const runtime::Knob<uint32_t> kCommSlotBytes(
    {"CXLRT_COMM_SLOT_BYTES", "1048576",
     "Bytes of each of a rank's data slots in a communicator (the largest chunk it posts); "
     "unset on a machine with a GPU: 4194304 (docs/gpu.md)."},
    1 << 20, UintIn(4096, 1u << 30));
const runtime::Knob<uint32_t> kCommP2pBytes(
    {"CXLRT_COMM_P2P_BYTES", "0",
     "Bytes of each Send/Recv channel (one per ordered rank pair, a ring of 4 chunks); 0: the "
     "largest power of two in [64 KiB, 1 MiB] whose n x n channels take at most 1/16 of the "
     "pool."},
    0, UintIn(4096, 1u << 30));
const runtime::Knob<uint32_t> kAllreduceOneshotMax(
    {"CXLRT_ALLREDUCE_ONESHOT_MAX", "65536",
     "All-reduces up to this many bytes run one-shot; larger ones two-shot."},
    64 << 10, UintIn(0, 1u << 30));
const runtime::Knob<uint32_t> kCommDepth(
    {"CXLRT_COMM_DEPTH", "4",
     "Data slots per rank in a communicator (2-8): a rank posts up to this many chunks minus one "
     "ahead of its slowest peer."},
    4, UintIn(2, 8));
const runtime::Knob<uint32_t> kCommChunkBytes(
    {"CXLRT_COMM_CHUNK_BYTES", "0",
     "Bytes of a collective's chunks (capped by the slot); 0: the measured table of "
     "docs/collectives.md."},
    0, UintIn(0, 1u << 30));

}  // namespace cxlrt::collectives

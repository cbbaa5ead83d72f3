// The collectives' knobs: what a CommOptions field left unset takes
// (cxlrt/runtime/knobs.h). Read by communicator.cc, and by benchmarks that
// size a pool for the communicators they will make.
// Thread-safe (cxlrt/runtime/knobs.h).
#pragma once

#include <cstdint>

#include "cxlrt/runtime/knobs.h"

namespace cxlrt::collectives {

extern const runtime::Knob<uint32_t> kCommTimeoutMs;        // CXLRT_COMM_TIMEOUT_MS
extern const runtime::Knob<uint32_t> kCommSlotBytes;        // CXLRT_COMM_SLOT_BYTES
extern const runtime::Knob<uint32_t> kCommP2pBytes;         // CXLRT_COMM_P2P_BYTES, 0: by the pool
extern const runtime::Knob<uint32_t> kAllreduceOneshotMax;  // CXLRT_ALLREDUCE_ONESHOT_MAX
extern const runtime::Knob<uint32_t> kCommDepth;            // CXLRT_COMM_DEPTH
extern const runtime::Knob<uint32_t> kCommChunkBytes;       // CXLRT_COMM_CHUNK_BYTES, 0: the table

}  // namespace cxlrt::collectives

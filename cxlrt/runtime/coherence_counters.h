// The coherence layer's counters (docs/metrics.md), kept by the domains
// that can afford them. Internal to the domains (coherence.cc and the
// emulation layer's simulated domain).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cxlrt/runtime/coherence.h"
#include "cxlrt/runtime/metrics.h"

namespace cxlrt::runtime {

// Counts of the coherence layer's explicit write-backs (Flush) and
// invalidations (Invalidate, and the invalidations bulk reads do), kept by
// the software and simulated domains only: there a call costs a cache-line
// instruction per line to CXL memory (or a simulated cache walk), beside
// which one sharded relaxed add is small. In the hardware domain both are a
// fence of a nanosecond on paths that run per flag probe; a count would
// cost more than the operation, so none is kept (docs/metrics.md).
struct CoherenceCounters {
  Counter& flushes;
  Counter& flushed_lines;
  Counter& invalidates;
  Counter& invalidated_lines;
};
CoherenceCounters& GetCoherenceCounters();
inline uint64_t LinesOf(PoolOffset off, size_t n) {
  return n == 0 ? 0 : (off + n - 1) / kCacheLine - off / kCacheLine + 1;
}

}  // namespace cxlrt::runtime

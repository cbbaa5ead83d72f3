// The `simulated` coherence domain: CXL's missing cross-host coherence made
// visible on one box, so that a protocol with a missing flush or invalidate
// fails here, every time, instead of on real multi-host CXL.
//
// Each SimulatedCoherence is one emulated host with a private cache of the
// 64 B pool lines it has stored to or loaded:
//   Write          fills the line from the pool if absent, stores into the
//                  private copy (dirty); the pool is untouched
//   Read           from the private copy when present, else fills it
//   Flush          writes dirty lines of the range back (whole lines, as a
//                  cache does), keeps them cached clean (clwb)
//   Invalidate     writes back dirty lines of the range, then drops them
//                  (clflushopt)
//   StoreFlag      Write + Flush of the flag; LoadFlag: Invalidate + Read
//   CopyToPool     non-temporal: drops the range's lines (writing back dirty
//                  ones), then stores straight to the pool
//   CopyFromPool   Invalidate, then loads straight from the pool (not cached)
//   BeforeGpuWrite Invalidate (a GPU's DMA then writes the pool itself)
//   atomic RMW     refused outside declared coherent windows (coherence.h);
//                  inside one, the line is written back and dropped first
// Line write-backs and fills use aligned 8-byte atomic accesses, so a word
// is never torn; a whole-line write-back also overwrites bytes of the line
// that this host did not store, exactly as hardware does, so two writers
// sharing one line is caught as well.
//
// The cache is per process-and-Pool: two processes of one emulated host do
// not share it (stricter than a real host, whose cores are coherent). It has
// no capacity limit and never evicts on its own.
//
// Thread-safety: thread-safe (one mutex; the simulator is for tests and
// debugging, not benchmarks).
#pragma once

#include <cstdint>
#include <memory>

#include "cxlrt/runtime/coherence.h"

namespace cxlrt::emulation {

// A simulated host over the mapping [base, base+size).
std::unique_ptr<runtime::Coherence> MakeSimulatedCoherence(uint8_t* base, uint64_t size);

// Number of lines cached by `c` (a SimulatedCoherence); for tests.
size_t SimulatedCachedLines(runtime::Coherence& c);

// Makes sure the simulated domain is registered with the runtime (static
// registration does it too).
void RegisterSimulatedCoherence();

}  // namespace cxlrt::emulation

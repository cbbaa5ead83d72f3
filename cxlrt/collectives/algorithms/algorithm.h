// The collective algorithms, written against the transport (posts, waits,
// read marks) and a copy engine (every byte they move). One file per
// family: all_reduce.cc (AllReduce, Reduce), reduce_scatter.cc, gather.cc
// (AllGather, Gather), broadcast.cc (Broadcast, Scatter), all_to_all.cc.
// docs/collectives.md, "Algorithms", describes each.
//
// Every algorithm runs the same posts on every rank for the same call: the
// number of chunks and their sizes depend only on the call (ChunkBytes), not
// on whether this rank's buffers lie in the pool, so ranks that differ in
// that still agree post by post.
// Thread-safety: one call at a time per transport.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "cxlrt/collectives/copy_engine.h"
#include "cxlrt/collectives/transport.h"
#include "cxlrt/collectives/types.h"

namespace cxlrt::collectives::algorithms {

// The pool offset of [p, p+len) when it lies in the mapping [base,
// base+size) of the pool.
inline std::optional<PoolOffset> PoolOffsetOf(const uint8_t* base, uint64_t size, const void* p,
                                              size_t len) {
  const auto* b = static_cast<const uint8_t*>(p);
  if (b < base || b >= base + size || len > static_cast<uint64_t>(base + size - b)) {
    return std::nullopt;
  }
  return static_cast<PoolOffset>(b - base);
}

// A call's engine tickets and reduction sources: inline for up to 8 (no
// allocation per call; an 8-byte all-reduce is a fraction of a microsecond).
using Tickets = absl::InlinedVector<CopyEngine::Ticket, 8>;
using Sources = absl::InlinedVector<const void*, 8>;

// What an algorithm needs for one call.
struct Call {
  Transport& t;
  CopyEngine& e;
  DataType type;
  size_t es;  // bytes per element
  runtime::Coherence& coherence;
  const uint8_t* pool_base;  // this process's mapping of the pool
  uint64_t pool_size;
  uint64_t chunk_override;  // CommOptions::chunk_bytes (0: the table)
  uint64_t oneshot_max;     // all-reduces up to this many bytes run one-shot

  int rank() const { return t.rank(); }
  int nranks() const { return t.nranks(); }
  // Where [p, p+len) may be posted in place: it lies in the pool and is
  // aligned to the call's elements (a peer refuses a post that is not).
  std::optional<PoolOffset> ZeroCopyAt(const void* p, size_t len) const;
  // Before this rank reads its own input through the pool mapping without
  // posting it (a root's own part): writes back its stores to [p, p+len)
  // when it lies in the pool, as a post in place would (the simulated
  // domain keeps them in this host's cache until then).
  void SeeOwnStores(const void* p, size_t len);
  // Posts a pipeline runs ahead of its reads (< the transport's depth).
  size_t ahead() const;
};

// Slots at least this large mark a communicator of GPU ranks: ChunkBytes
// then cuts large chunks (cxlrt/collectives/gpu_engine.h, docs/gpu.md).
inline constexpr uint64_t kGpuSlotBytes = 4 << 20;

// Bytes of one chunk of a rank's contribution for a call whose largest
// contribution per rank is `bytes`, split into `pieces` pieces per post
// (one per rank for all-to-all, scatter and reduce-scatter, else 1): the
// measured table of docs/collectives.md ("Chunk sizes"), or the override,
// capped so that a post's pieces fit one slot; a multiple of `es`, >= es.
size_t ChunkBytes(const Call& c, CollKind kind, size_t bytes, int pieces);
// Chunks of `chunk` that cover `total`: at least one, so that a call of no
// elements still posts once (and the ranks still check each other's call).
inline size_t Chunks(size_t total, size_t chunk) {
  return total == 0 ? 1 : (total + chunk - 1) / chunk;
}

// Posts `pieces` pieces of `piece_len` bytes, piece j from src + j *
// src_stride, as post `s`: in place at `in_place` (the pool offset of src)
// when set, else inline when they fit the post line, else copied into this
// rank's slot packed (stride piece_len). Piece `skip` (this rank's own, which
// no peer reads; -1: none) is left out of the copy.
absl::Status PostPieces(Call& c, uint64_t s, const uint8_t* src, size_t piece_len,
                        size_t src_stride, int pieces, int skip,
                        std::optional<PoolOffset> in_place);
// Posts nothing (a rank with no bytes for this chunk).
absl::Status PostEmpty(Call& c, uint64_t s);
// The sources of a reduction of post `s`: this rank's own bytes at `own`,
// and `n` bytes from byte `offset` of every peer's post (srcs[j] for rank j).
absl::Status PeerSources(Call& c, uint64_t s, const void* own, size_t offset, size_t n,
                         Sources& srcs);
// Waits for every ticket in `tickets` and clears it.
absl::Status WaitAll(Call& c, Tickets& tickets);

absl::Status AllReduce(Call& c, const void* send, void* recv, size_t count, RedOp op);
absl::Status Reduce(Call& c, const void* send, void* recv, size_t count, RedOp op, int root);
absl::Status ReduceScatter(Call& c, const void* send, void* recv, size_t recvcount, RedOp op);
absl::Status AllGather(Call& c, const void* send, void* recv, size_t sendcount);
absl::Status Gather(Call& c, const void* send, void* recv, size_t sendcount, int root);
absl::Status Broadcast(Call& c, const void* send, void* recv, size_t count, int root);
absl::Status Scatter(Call& c, const void* send, void* recv, size_t recvcount, int root);
absl::Status AllToAll(Call& c, const void* send, void* recv, size_t count);
// Counts and displacements in elements, one per rank (Communicator::AllToAllV).
absl::Status AllToAllV(Call& c, const void* send, const std::vector<size_t>& send_counts,
                       const std::vector<size_t>& send_displs, void* recv,
                       const std::vector<size_t>& recv_counts,
                       const std::vector<size_t>& recv_displs);
absl::Status Barrier(Call& c);

}  // namespace cxlrt::collectives::algorithms

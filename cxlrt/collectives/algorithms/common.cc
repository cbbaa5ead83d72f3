// What every algorithm shares: chunk sizes, posting a rank's pieces, waits.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlrt/collectives/algorithms/algorithm.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::collectives::algorithms {

std::optional<PoolOffset> Call::ZeroCopyAt(const void* p, size_t len) const {
  const auto at = PoolOffsetOf(pool_base, pool_size, p, len);
  if (at && *at % es != 0) return std::nullopt;
  return at;
}

void Call::SeeOwnStores(const void* p, size_t len) {
  if (len == 0) return;
  if (const auto at = PoolOffsetOf(pool_base, pool_size, p, len)) coherence.Flush(*at, len);
}

absl::Status PeerSources(Call& c, uint64_t s, const void* own, size_t offset, size_t n,
                         Sources& srcs) {
  for (int j = 0; j < c.nranks(); ++j) {
    if (j == c.rank()) {
      srcs[j] = own;
    } else {
      CXLRT_ASSIGN_OR_RETURN(srcs[j], c.t.PeerBytes(j, s, offset, n));
    }
  }
  return absl::OkStatus();
}

// Two posts ahead keep a CPU pipeline busy; a GPU engine's copies and
// kernels complete tens of microseconds after they are issued, so it runs
// as far ahead as the ring allows (docs/gpu.md, "Chunks").
size_t Call::ahead() const {
  return e.host_buffers() ? std::min<size_t>(2, t.depth() - 1) : t.depth() - 1;
}

size_t ChunkBytes(const Call& c, CollKind kind, size_t bytes, int pieces) {
  (void)kind;  // one table serves every collective so far (docs/collectives.md)
  // docs/collectives.md, "Chunk sizes": up to 512 KiB one chunk (a post
  // costs flags and waits, and a small message has nothing to overlap);
  // then 512 KiB chunks, so a chunk's copy in, the peers' reads of the one
  // before and the next one's copy overlap; past 8 MiB, where every copy
  // runs from memory, 256 KiB chunks.
  size_t chunk = c.chunk_override;
  if (chunk == 0 && c.t.slot_bytes() >= kGpuSlotBytes) {
    // A communicator of GPU ranks (slots of 4 MiB or more, the default when
    // rank 0 has a GPU): every chunk costs a DMA, an event and a kernel of
    // tens of microseconds each, so chunks are an eighth of the message, 1
    // MiB at least, up to the slot (docs/gpu.md, "Chunks"). Every rank
    // sees the same slot size (rank 0's), so every rank cuts alike.
    chunk = bytes <= (1u << 20) ? bytes : std::max<size_t>(bytes / 8, 1u << 20);
  } else if (chunk == 0) {
    chunk = bytes <= (512u << 10) ? bytes : bytes <= (8u << 20) ? (512u << 10) : (256u << 10);
  }
  const size_t fit = c.t.slot_bytes() / std::max(1, pieces);
  chunk = std::min(chunk, fit) / c.es * c.es;
  return std::max(chunk, c.es);
}

absl::Status PostPieces(Call& c, uint64_t s, const uint8_t* src, size_t piece_len,
                        size_t src_stride, int pieces, int skip,
                        std::optional<PoolOffset> in_place) {
  if (in_place) {
    return c.t.Publish(s, {*in_place, piece_len, src_stride, pieces}, /*in_place=*/true, {});
  }
  const size_t total = piece_len * pieces;
  if (total <= kInlineBytes && c.e.host_buffers()) {
    uint8_t bytes[kInlineBytes];
    for (int j = 0; j < pieces; ++j) {
      if (piece_len) std::memcpy(bytes + j * piece_len, src + j * src_stride, piece_len);
    }
    return c.t.PublishInline(s, bytes, total, piece_len);
  }
  if (total > c.t.slot_bytes()) {
    return c.t.Fail(absl::InternalError(
        absl::StrCat("a post of ", total, " bytes > the slot of ", c.t.slot_bytes())));
  }
  const PoolOffset slot = c.t.SlotOf(s);
  std::vector<CopyEngine::Ticket> after;
  for (int j = 0; j < pieces; ++j) {
    if (j == skip) continue;
    if (CopyEngine::Ticket k = c.e.ToPool(slot + j * piece_len, src + j * src_stride, piece_len)) {
      after.push_back(k);
    }
  }
  return c.t.Publish(s, {slot, piece_len, piece_len, pieces}, /*in_place=*/false, std::move(after));
}

absl::Status PostEmpty(Call& c, uint64_t s) { return c.t.PublishInline(s, nullptr, 0, 0); }

absl::Status WaitAll(Call& c, Tickets& tickets) {
  for (CopyEngine::Ticket k : tickets) {
    if (k == 0) continue;
    if (absl::Status s = c.e.Wait(k, c.t.deadline()); !s.ok()) {
      return c.t.Fail(absl::Status(
          s.code(), absl::StrCat("rank ", c.rank(), " in ", c.t.Describe(c.t.desc()), ": the ",
                                 c.e.name(), " copy engine: ", s.message())));
    }
  }
  tickets.clear();
  return absl::OkStatus();
}

absl::Status Barrier(Call& c) {
  CXLRT_ASSIGN_OR_RETURN(uint64_t s, c.t.Stage());
  CXLRT_RETURN_IF_ERROR(PostEmpty(c, s));
  CXLRT_RETURN_IF_ERROR(c.t.WaitPosted(s));
  c.t.Done(s);
  return c.t.EndCall(false);
}

}  // namespace cxlrt::collectives::algorithms

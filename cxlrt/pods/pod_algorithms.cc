// The hierarchical algorithms (docs/collectives.md, "Beyond one pool",
// writes each down with its cost): every collective composed of pool
// collectives in the pod and engine operations over the rails or the world.
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/pods/pod_communicator_impl.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::pods {

using Ticket = InterPodEngine::Ticket;

// The sharded steps of all-reduce, broadcast and reduce, for one chunk of
// `len` elements: shard s is [s * q, s * q + ShardLen(len, s)) with q =
// len / m; the last shard also carries the remainder.
size_t MultiPodCommunicator::Impl::ShardLen(size_t len, int s) const {
  const size_t q = len / m();
  return s == m() - 1 ? len - q * (m() - 1) : q;
}

// (A) Shard s of `in` reduced over the pod onto local rank s, into `t`: a
// reduce-scatter (and a Reduce of the remainder) where the pod has m
// ranks, one Reduce per shard where it has more (`junk` takes a non-root's
// unused output).
absl::Status MultiPodCommunicator::Impl::ReduceShards(const uint8_t* in, size_t len, uint8_t* t,
                                                      uint8_t* junk, DataType type, RedOp rop) {
  const size_t es = SizeOf(type);
  const int l = layout.local_rank, M = m();
  const size_t q = len / M, rem = len - q * M;
  if (layout.pod_size == M) {
    if (q > 0) CXLRT_RETURN_IF_ERROR(pod->ReduceScatter(in, t, q, type, rop));
    if (rem == 0) return absl::OkStatus();
    return pod->Reduce(in + q * M * es, l == M - 1 ? t + q * es : junk, rem, type, rop, M - 1);
  }
  for (int s = 0; s < M; ++s) {
    const size_t sl = ShardLen(len, s);
    if (sl == 0) continue;
    CXLRT_RETURN_IF_ERROR(pod->Reduce(in + s * q * es, l == s ? t : junk, sl, type, rop, s));
  }
  return absl::OkStatus();
}

// (C) Shard s, held by local rank s (in `t`, or already at its place in
// `out` when `t` is null), to every rank of the pod: an all-gather (and a
// Broadcast of the remainder) where the pod has m ranks, one Broadcast per
// shard where it has more.
absl::Status MultiPodCommunicator::Impl::ShareShards(uint8_t* out, size_t len, const uint8_t* t,
                                                     DataType type) {
  const size_t es = SizeOf(type);
  const int l = layout.local_rank, M = m();
  const size_t q = len / M, rem = len - q * M;
  if (t != nullptr && l < M) std::memcpy(out + l * q * es, t, ShardLen(len, l) * es);
  if (layout.pod_size == M) {
    if (q > 0) CXLRT_RETURN_IF_ERROR(pod->AllGather(out + l * q * es, out, q, type));
    if (rem == 0) return absl::OkStatus();
    uint8_t* tail = out + q * M * es;
    return pod->Broadcast(tail, tail, rem, type, M - 1);
  }
  for (int s = 0; s < M; ++s) {
    const size_t sl = ShardLen(len, s);
    if (sl == 0) continue;
    uint8_t* at = out + s * q * es;
    CXLRT_RETURN_IF_ERROR(pod->Broadcast(at, at, sl, type, s));
  }
  return absl::OkStatus();
}

// All-reduce, per chunk: (A) ReduceShards; (E) rail s all-reduces shard s
// across the pods; (C) ShareShards. kAvg: the holder divides its shard once
// by the rank count before (C).
absl::Status MultiPodCommunicator::Impl::AllReduce(const void* send, void* recv, size_t count,
                                                   DataType type, RedOp op) {
  const size_t es = SizeOf(type);
  const RedOp rop = op == RedOp::kAvg ? RedOp::kSum : op;
  const int l = layout.local_rank, M = m();
  const size_t ce = ChunkElems(type), chunks = (count + ce - 1) / ce;
  const size_t tmp_bytes = (std::min(ce, count) / M + M) * es;
  uint8_t* tmp[2] = {Scratch(0, tmp_bytes), Scratch(1, tmp_bytes)};
  uint8_t* junk = Scratch(2, tmp_bytes);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  auto len_of = [&](size_t k) { return std::min(ce, count - k * ce); };
  auto pre = [&](size_t k) {
    return ReduceShards(in + k * ce * es, len_of(k), tmp[k % 2], junk, type, rop);
  };
  auto start = [&](size_t k) -> absl::StatusOr<std::optional<Ticket>> {
    const size_t sl = l < M ? ShardLen(len_of(k), l) : 0;
    if (sl == 0) return std::nullopt;
    CXLRT_ASSIGN_OR_RETURN(Ticket t, rail->AllReduce(tmp[k % 2], tmp[k % 2], sl, type, rop));
    return t;
  };
  auto post = [&](size_t k) -> absl::Status {
    const size_t len = len_of(k);
    if (l < M && op == RedOp::kAvg) {
      CXLRT_RETURN_IF_ERROR(DivideForAvg(tmp[k % 2], ShardLen(len, l), type));
    }
    return ShareShards(out + k * ce * es, len, tmp[k % 2], type);
  };
  return Pipeline(chunks, rail.get(), pre, start, post);
}

// Broadcast, per chunk: a pool broadcast from the root in the root's pod;
// rail s broadcasts shard s from the root's pod to every other pod; there
// ShareShards gives every rank the whole chunk.
absl::Status MultiPodCommunicator::Impl::Broadcast(const void* send, void* recv, size_t count,
                                                   DataType type, int root) {
  const size_t es = SizeOf(type), ce = ChunkElems(type), chunks = (count + ce - 1) / ce;
  const int rp = layout.pod_of[root], rl = root - layout.pod_first[rp];
  const int l = layout.local_rank, M = m();
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  auto len_of = [&](size_t k) { return std::min(ce, count - k * ce); };
  auto pre = [&](size_t k) -> absl::Status {
    if (layout.pod != rp) return absl::OkStatus();
    return pod->Broadcast(in + k * ce * es, out + k * ce * es, len_of(k), type, rl);
  };
  auto start = [&](size_t k) -> absl::StatusOr<std::optional<Ticket>> {
    const size_t len = len_of(k), sl = l < M ? ShardLen(len, l) : 0;
    if (sl == 0) return std::nullopt;
    uint8_t* shard = out + (k * ce + l * (len / M)) * es;
    CXLRT_ASSIGN_OR_RETURN(Ticket t, rail->Broadcast(shard, sl, type, rp));
    return t;
  };
  auto post = [&](size_t k) -> absl::Status {
    if (layout.pod == rp) return absl::OkStatus();
    return ShareShards(out + k * ce * es, len_of(k), nullptr, type);
  };
  return Pipeline(chunks, rail.get(), pre, start, post);
}

// Reduce, per chunk: (A) ReduceShards; (E) rail s reduces shard s onto the
// root's pod; there the shard holders hand their shards to the root (pool
// Sends; the root's own shard, when it holds one, by a copy).
absl::Status MultiPodCommunicator::Impl::Reduce(const void* send, void* recv, size_t count,
                                                DataType type, RedOp op, int root) {
  const size_t es = SizeOf(type), ce = ChunkElems(type), chunks = (count + ce - 1) / ce;
  const RedOp rop = op == RedOp::kAvg ? RedOp::kSum : op;
  const int rp = layout.pod_of[root], rl = root - layout.pod_first[rp];
  const int l = layout.local_rank, M = m();
  const size_t tmp_bytes = (std::min(ce, count) / M + M) * es;
  uint8_t* tmp[2] = {Scratch(0, tmp_bytes), Scratch(1, tmp_bytes)};
  uint8_t* red[2] = {Scratch(2, tmp_bytes), Scratch(3, tmp_bytes)};
  uint8_t* junk = Scratch(4, tmp_bytes);
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  auto len_of = [&](size_t k) { return std::min(ce, count - k * ce); };
  auto pre = [&](size_t k) {
    return ReduceShards(in + k * ce * es, len_of(k), tmp[k % 2], junk, type, rop);
  };
  auto start = [&](size_t k) -> absl::StatusOr<std::optional<Ticket>> {
    const size_t sl = l < M ? ShardLen(len_of(k), l) : 0;
    if (sl == 0) return std::nullopt;
    CXLRT_ASSIGN_OR_RETURN(Ticket t, rail->Reduce(tmp[k % 2], red[k % 2], sl, type, rop, rp));
    return t;
  };
  auto post = [&](size_t k) -> absl::Status {
    if (layout.pod != rp) return absl::OkStatus();
    const size_t len = len_of(k), q = len / M;
    uint8_t* r = red[k % 2];
    if (l < M && op == RedOp::kAvg) CXLRT_RETURN_IF_ERROR(DivideForAvg(r, ShardLen(len, l), type));
    for (int s = 0; s < M; ++s) {
      const size_t sl = ShardLen(len, s);
      uint8_t* dst = out + (k * ce + s * q) * es;
      if (sl == 0) continue;
      if (l == s && s == rl) {
        std::memcpy(dst, r, sl * es);
      } else if (l == s) {
        CXLRT_RETURN_IF_ERROR(pod->Send(r, sl, type, rl));
      } else if (l == rl) {
        CXLRT_RETURN_IF_ERROR(pod->Recv(dst, sl, type, s));
      }
    }
    return absl::OkStatus();
  };
  return Pipeline(chunks, rail.get(), pre, start, post);
}

// The shard geometry of reduce-scatter and all-gather for one chunk: the
// chunk holds elements [k * ck, k * ck + L) of every rank's block; pod q's
// region is its ranks' pieces, one after another (len_q = size_q * L
// elements), cut into m shards of w_q = ceil(len_q / m) elements; a pack
// (S elements) is shard s of every region in pod order, `skip`'s left out.
struct MultiPodCommunicator::Impl::Shards {
  std::vector<size_t> len, w, at;
  size_t S = 0;
  Shards(const PodLayout& layout, int M, size_t L, int skip) {
    const int P = layout.npods;
    len.resize(P);
    w.resize(P);
    at.resize(P);
    for (int q = 0; q < P; ++q) {
      len[q] = layout.pod_sizes[q] * L;
      w[q] = (len[q] + M - 1) / M;
      at[q] = S;
      if (q != skip) S += w[q];
    }
  }
  // The real elements of shard s of region q (the last shards may be short).
  size_t Real(int q, int s) const {
    const size_t from = std::min(len[q], s * w[q]);
    return std::min(w[q], len[q] - from);
  }
};

// Copies region elements [from, from + n) of pod q between `packed` and
// the blocks of a buffer whose rank j's block starts at element j * stride;
// the chunk is at element `off` of each block, L elements long.
void MultiPodCommunicator::Impl::CopyRegion(bool to_blocks, uint8_t* packed, uint8_t* blocks,
                                            size_t stride, size_t off, size_t L, int q, size_t from,
                                            size_t n, size_t es) const {
  while (n > 0) {
    const size_t j = from / L, o = from % L, take = std::min(n, L - o);
    uint8_t* b = blocks + ((layout.pod_first[q] + j) * stride + off + o) * es;
    if (to_blocks) {
      std::memcpy(b, packed, take * es);
    } else {
      std::memcpy(packed, b, take * es);
    }
    packed += take * es;
    from += take;
    n -= take;
  }
}

// Reduce-scatter, per chunk of every block (pipelined):
// (A) each rank packs its input shard-major (pack s = shard s of every
// region, padded), and pack s is reduced in the pod onto local rank s (a
// reduce-scatter where the pod has m ranks, one Reduce per shard where it
// has more); (E) rail s reduce-scatters it across the pods, so that pod q
// keeps shard s of its own region (a rail reduce-scatter when pods are
// equal, one rail Reduce per pod otherwise); (C) a pool all-to-all-v hands
// each rank of the pod the pieces of its block from the shard holders.
absl::Status MultiPodCommunicator::Impl::ReduceScatter(const void* send, void* recv, size_t rc,
                                                       DataType type, RedOp op) {
  const size_t es = SizeOf(type);
  const RedOp rop = op == RedOp::kAvg ? RedOp::kSum : op;
  const int P = layout.npods, M = m(), l = layout.local_rank, me = layout.pod;
  const bool equal = std::all_of(layout.pod_sizes.begin(), layout.pod_sizes.end(),
                                 [&](int s) { return s == layout.pod_sizes[0]; });
  const size_t ck = std::max<size_t>(1, chunk_bytes / es / n());
  const size_t chunks = (rc + ck - 1) / ck;
  auto* in = const_cast<uint8_t*>(static_cast<const uint8_t*>(send));
  auto* out = static_cast<uint8_t*>(recv);
  auto L_of = [&](size_t k) { return std::min(ck, rc - k * ck); };
  const Shards full(layout, M, std::min(ck, rc), -1);  // the largest chunk
  uint8_t* staging = Scratch(0, M * full.S * es);
  uint8_t* mine[2] = {Scratch(1, full.S * es), Scratch(2, full.S * es)};
  uint8_t* red[2] = {Scratch(3, full.S * es), Scratch(4, full.S * es)};
  uint8_t* junk = Scratch(5, full.S * es);
  auto pre = [&](size_t k) -> absl::Status {
    const size_t L = L_of(k);
    const Shards g(layout, M, L, -1);
    for (int s = 0; s < M; ++s) {
      for (int q = 0; q < P; ++q) {
        uint8_t* dst = staging + (s * g.S + g.at[q]) * es;
        const size_t real = g.Real(q, s);
        CopyRegion(false, dst, in, rc, k * ck, L, q, s * g.w[q], real, es);
        std::memset(dst + real * es, 0, (g.w[q] - real) * es);
      }
    }
    if (layout.pod_size == M) return pod->ReduceScatter(staging, mine[k % 2], g.S, type, rop);
    for (int s = 0; s < M; ++s) {
      CXLRT_RETURN_IF_ERROR(
          pod->Reduce(staging + s * g.S * es, l == s ? mine[k % 2] : junk, g.S, type, rop, s));
    }
    return absl::OkStatus();
  };
  auto start = [&](size_t k) -> absl::StatusOr<std::optional<Ticket>> {
    if (l >= M) return std::nullopt;
    const Shards g(layout, M, L_of(k), -1);
    uint8_t *a = mine[k % 2], *b = red[k % 2];
    if (equal) {
      CXLRT_ASSIGN_OR_RETURN(Ticket t,
                             rail->ReduceScatter(a, b + g.at[me] * es, g.w[me], type, rop));
      return t;
    }
    Ticket t = 0;
    for (int q = 0; q < P; ++q) {
      CXLRT_ASSIGN_OR_RETURN(
          t, rail->Reduce(a + g.at[q] * es, b + g.at[q] * es, g.w[q], type, rop, q));
    }
    return t;
  };
  auto post = [&](size_t k) -> absl::Status {
    const size_t L = L_of(k);
    const Shards g(layout, M, L, -1);
    uint8_t* b = red[k % 2];
    if (l < M && op == RedOp::kAvg) {
      CXLRT_RETURN_IF_ERROR(DivideForAvg(b + g.at[me] * es, g.Real(me, l), type));
    }
    // Shard s of this pod's region covers [s * w, s * w + real); local
    // rank j's piece covers [j * L, (j + 1) * L).
    const int ps = layout.pod_size;
    const size_t wm = g.w[me];
    std::vector<size_t> sc(ps, 0), sd(ps, 0), rcv(ps, 0), rdv(ps, 0);
    auto overlap = [&](int s, int j, size_t* from) {
      const size_t a = std::max(s * wm, j * L);
      const size_t e = std::min(s * wm + g.Real(me, s), (j + 1) * L);
      *from = a;
      return e > a ? e - a : 0;
    };
    for (int j = 0; j < ps; ++j) {
      size_t from = 0;
      if (l < M) {
        sc[j] = overlap(l, j, &from);
        sd[j] = sc[j] ? g.at[me] + from - l * wm : 0;
      }
      if (j < M) {
        rcv[j] = overlap(j, l, &from);
        rdv[j] = rcv[j] ? from - l * L : 0;
      }
    }
    return pod->AllToAllV(b, sc, sd, out + k * ck * es, rcv, rdv, type);
  };
  return Pipeline(chunks, rail.get(), pre, start, post);
}

// All-gather, per chunk of every block (pipelined), the mirror image:
// (1) a pool all-gather of this chunk of the pod's blocks (its region);
// (2) rail s exchanges shard s of every region (an all-to-all-v: each
// pod's shard to every other pod), packed shard-major; (3) the shard
// holders share their packs in the pod (a pool all-gather where the pod
// has m ranks, one Broadcast per shard where it has more), and every rank
// unpacks them into its result.
absl::Status MultiPodCommunicator::Impl::AllGather(const void* send, void* recv, size_t count,
                                                   DataType type) {
  const size_t es = SizeOf(type);
  const int P = layout.npods, M = m(), l = layout.local_rank, me = layout.pod;
  const size_t ck = std::max<size_t>(1, chunk_bytes / es / n());
  const size_t chunks = (count + ck - 1) / ck;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  auto L_of = [&](size_t k) { return std::min(ck, count - k * ck); };
  const Shards full(layout, M, std::min(ck, count), me);  // the largest chunk
  const size_t region_bytes = layout.pod_size * std::min(ck, count) * es;
  uint8_t* region[2] = {Scratch(0, region_bytes), Scratch(1, region_bytes)};
  uint8_t* packs[2] = {Scratch(2, M * full.S * es), Scratch(3, M * full.S * es)};
  auto pre = [&](size_t k) -> absl::Status {
    const size_t L = L_of(k);
    CXLRT_RETURN_IF_ERROR(pod->AllGather(in + k * ck * es, region[k % 2], L, type));
    CopyRegion(true, region[k % 2], out, count, k * ck, L, me, 0, layout.pod_size * L, es);
    return absl::OkStatus();
  };
  auto start = [&](size_t k) -> absl::StatusOr<std::optional<Ticket>> {
    if (l >= M) return std::nullopt;
    const Shards g(layout, M, L_of(k), me);
    std::vector<size_t> sc(P, 0), sd(P, 0), rcv(P, 0), rdv(P, 0);
    for (int q = 0; q < P; ++q) {
      if (q == me) continue;
      sc[q] = g.Real(me, l) * es;
      sd[q] = l * g.w[me] * es;
      rcv[q] = g.Real(q, l) * es;
      rdv[q] = (l * g.S + g.at[q]) * es;
    }
    CXLRT_ASSIGN_OR_RETURN(Ticket t,
                           rail->AllToAllV(region[k % 2], sc, sd, packs[k % 2], rcv, rdv));
    return t;
  };
  auto post = [&](size_t k) -> absl::Status {
    const size_t L = L_of(k);
    const Shards g(layout, M, L, me);
    uint8_t* p = packs[k % 2];
    if (g.S == 0) return absl::OkStatus();
    if (layout.pod_size == M) {
      CXLRT_RETURN_IF_ERROR(pod->AllGather(p + l * g.S * es, p, g.S, type));  // in place
    } else {
      for (int s = 0; s < M; ++s) {
        uint8_t* pack = p + s * g.S * es;
        CXLRT_RETURN_IF_ERROR(pod->Broadcast(pack, pack, g.S, type, s));
      }
    }
    for (int s = 0; s < M; ++s) {
      for (int q = 0; q < P; ++q) {
        if (q == me) continue;
        CopyRegion(true, p + (s * g.S + g.at[q]) * es, out, count, k * ck, L, q, s * g.w[q],
                   g.Real(q, s), es);
      }
    }
    return absl::OkStatus();
  };
  return Pipeline(chunks, rail.get(), pre, start, post);
}

// Gather, per chunk of every block (pipelined): a pool gather of this
// chunk onto local rank 0 of every pod (the pod's region); rail 0 sends each
// region to the root's pod (an all-to-all-v with one receiver), packed in
// rank order; the root's local rank 0 unpacks it into the result, or hands
// the pack to the root (a pool Send) when the root is another rank.
// What Gather and Scatter share: the root's pod and local index, the
// holder (local rank 0 of the root's pod, which talks to the rail), the
// chunking of a block (ck elements, `chunks` chunks, L(k) in chunk k), and
// two buffers each for the pod's region and for packs in rank order, plus
// the root's own pack when it is not the holder.
struct MultiPodCommunicator::Impl::Rooted {
  size_t es, N, count, ck, chunks;
  int P, rp, rl, l;
  bool holder;
  uint8_t* region[2];
  uint8_t* packs[2];
  uint8_t* root_pack;
  size_t L(size_t k) const { return std::min(ck, count - k * ck); }
};

MultiPodCommunicator::Impl::Rooted MultiPodCommunicator::Impl::PlanRooted(size_t count,
                                                                          DataType type, int root) {
  Rooted r;
  r.es = SizeOf(type);
  r.N = n();
  r.count = count;
  r.P = layout.npods;
  r.rp = layout.pod_of[root];
  r.rl = root - layout.pod_first[r.rp];
  r.l = layout.local_rank;
  r.holder = layout.pod == r.rp && r.l == 0;
  r.ck = std::max<size_t>(1, chunk_bytes / r.es / r.N);
  r.chunks = (count + r.ck - 1) / r.ck;
  const size_t most = std::min(r.ck, count);
  for (int i = 0; i < 2; ++i) {
    r.region[i] = Scratch(i, layout.pod_size * most * r.es);
    r.packs[i] = Scratch(2 + i, r.N * most * r.es);
  }
  r.root_pack = Scratch(4, r.N * most * r.es);
  return r;
}

absl::Status MultiPodCommunicator::Impl::Gather(const void* send, void* recv, size_t count,
                                                DataType type, int root) {
  const Rooted g = PlanRooted(count, type, root);
  const size_t es = g.es, N = g.N, ck = g.ck;
  const int P = g.P, rp = g.rp, rl = g.rl, l = g.l;
  const bool holder = g.holder;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  auto L_of = [&](size_t k) { return g.L(k); };
  uint8_t* const* region = g.region;
  uint8_t* const* packs = g.packs;
  uint8_t* got = g.root_pack;  // the root's copy of a pack
  auto unpack = [&](const uint8_t* pack, size_t k, size_t L) {
    for (size_t j = 0; j < N; ++j)
      std::memcpy(out + (j * count + k * ck) * es, pack + j * L * es, L * es);
  };
  auto pre = [&](size_t k) -> absl::Status {
    return pod->Gather(in + k * ck * es, region[k % 2], L_of(k), type, 0);
  };
  auto start = [&](size_t k) -> absl::StatusOr<std::optional<Ticket>> {
    if (l != 0) return std::nullopt;
    const size_t L = L_of(k);
    std::vector<size_t> sc(P, 0), sd(P, 0), rc(P, 0), rd(P, 0);
    sc[rp] = layout.pod_size * L * es;
    if (holder) {
      for (int q = 0; q < P; ++q) {
        rc[q] = layout.pod_sizes[q] * L * es;
        rd[q] = layout.pod_first[q] * L * es;
      }
    }
    CXLRT_ASSIGN_OR_RETURN(Ticket t, rail->AllToAllV(region[k % 2], sc, sd, packs[k % 2], rc, rd));
    return t;
  };
  auto post = [&](size_t k) -> absl::Status {
    if (layout.pod != rp) return absl::OkStatus();
    const size_t L = L_of(k);
    if (rl == 0) {
      if (holder) unpack(packs[k % 2], k, L);
      return absl::OkStatus();
    }
    if (holder) return pod->Send(packs[k % 2], N * L, type, rl);
    if (l == rl) {
      CXLRT_RETURN_IF_ERROR(pod->Recv(got, N * L, type, 0));
      unpack(got, k, L);
    }
    return absl::OkStatus();
  };
  return Pipeline(g.chunks, rail.get(), pre, start, post);
}

// Scatter, per chunk of every block (pipelined), the mirror image: the
// root packs this chunk of every block in rank order (and hands the pack to
// its local rank 0 with a pool Send when it is another rank); rail 0 sends
// each pod its region (an all-to-all-v with one sender); local rank 0 of
// every pod scatters its region in the pod.
absl::Status MultiPodCommunicator::Impl::Scatter(const void* send, void* recv, size_t count,
                                                 DataType type, int root) {
  const Rooted g = PlanRooted(count, type, root);
  const size_t es = g.es, N = g.N, ck = g.ck;
  const int P = g.P, rp = g.rp, rl = g.rl, l = g.l;
  const bool holder = g.holder;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  auto L_of = [&](size_t k) { return g.L(k); };
  uint8_t* const* region = g.region;
  uint8_t* const* packs = g.packs;
  uint8_t* mine = g.root_pack;  // the root's pack when it is not local 0
  auto pack = [&](uint8_t* dst, size_t k, size_t L) {
    for (size_t j = 0; j < N; ++j)
      std::memcpy(dst + j * L * es, in + (j * count + k * ck) * es, L * es);
  };
  auto pre = [&](size_t k) -> absl::Status {
    if (layout.pod != rp) return absl::OkStatus();
    const size_t L = L_of(k);
    if (rl == 0) {
      if (holder) pack(packs[k % 2], k, L);
      return absl::OkStatus();
    }
    if (l == rl) {
      pack(mine, k, L);
      return pod->Send(mine, N * L, type, 0);
    }
    if (holder) return pod->Recv(packs[k % 2], N * L, type, rl);
    return absl::OkStatus();
  };
  auto start = [&](size_t k) -> absl::StatusOr<std::optional<Ticket>> {
    if (l != 0) return std::nullopt;
    const size_t L = L_of(k);
    std::vector<size_t> sc(P, 0), sd(P, 0), rc(P, 0), rd(P, 0);
    if (holder) {
      for (int q = 0; q < P; ++q) {
        sc[q] = layout.pod_sizes[q] * L * es;
        sd[q] = layout.pod_first[q] * L * es;
      }
    }
    rc[rp] = layout.pod_size * L * es;
    CXLRT_ASSIGN_OR_RETURN(Ticket t, rail->AllToAllV(packs[k % 2], sc, sd, region[k % 2], rc, rd));
    return t;
  };
  auto post = [&](size_t k) -> absl::Status {
    return pod->Scatter(region[k % 2], out + k * ck * es, L_of(k), type, 0);
  };
  return Pipeline(g.chunks, rail.get(), pre, start, post);
}

// All-to-all-v: the pieces between ranks of one pod go through the pool
// (a pool all-to-all-v); the pieces between pods go straight over the world
// engine (an all-to-all-v in which same-pod pieces are empty), started
// first so that both tiers run at once.
absl::Status MultiPodCommunicator::Impl::AllToAllV(const void* send, absl::Span<const size_t> sc,
                                                   absl::Span<const size_t> sd, void* recv,
                                                   absl::Span<const size_t> rc,
                                                   absl::Span<const size_t> rd, DataType type) {
  const size_t es = SizeOf(type), N = n();
  if (sc.size() != N || sd.size() != N || rc.size() != N || rd.size() != N) {
    return absl::InvalidArgumentError(
        absl::StrCat("pods/", name, " rank ", layout.rank, ": AllToAllV needs ", N,
                     " counts and displacements per side (got ", sc.size(), ", ", sd.size(), ", ",
                     rc.size(), ", ", rd.size(), ")"));
  }
  const int first = layout.pod_first[layout.pod], ps = layout.pod_size;
  std::vector<size_t> wsc(N, 0), wsd(N, 0), wrc(N, 0), wrd(N, 0);
  bool remote = false;
  for (size_t j = 0; j < N; ++j) {
    if (layout.pod_of[j] == layout.pod) continue;
    const int w = layout.world_of[j];
    wsc[w] = sc[j] * es;
    wsd[w] = sd[j] * es;
    wrc[w] = rc[j] * es;
    wrd[w] = rd[j] * es;
    remote = true;
  }
  (void)remote;  // every rank joins the world call (zeros on both sides are fine)
  CXLRT_ASSIGN_OR_RETURN(Ticket t, world->AllToAllV(send, wsc, wsd, recv, wrc, wrd));
  CXLRT_RETURN_IF_ERROR(PodStep([&] {
    return pod->AllToAllV(send, sc.subspan(first, ps), sd.subspan(first, ps), recv,
                          rc.subspan(first, ps), rd.subspan(first, ps), type);
  }));
  return EngineWait(*world, t);
}

// Barrier: a pool barrier (every rank of the pod arrived), a barrier of
// rail 0 (every pod arrived), a pool barrier (every pod's arrival known).
absl::Status MultiPodCommunicator::Impl::Barrier() {
  CXLRT_RETURN_IF_ERROR(PodStep([&] { return pod->Barrier(); }));
  if (layout.local_rank == 0) {
    CXLRT_ASSIGN_OR_RETURN(Ticket t, rail->Barrier());
    CXLRT_RETURN_IF_ERROR(EngineWait(*rail, t));
  }
  return PodStep([&] { return pod->Barrier(); });
}

absl::Status MultiPodCommunicator::Impl::SendRecv(bool is_send, void* buf, size_t count,
                                                  DataType type, int peer) {
  if (peer < 0 || peer >= layout.world_size || peer == layout.rank) {
    return absl::InvalidArgumentError(absl::StrCat("pods/", name, " rank ", layout.rank, ": ",
                                                   is_send ? "Send" : "Recv", " peer ", peer,
                                                   " is not another rank of ", layout.world_size));
  }
  if (layout.pod_of[peer] == layout.pod) {
    const int lp = peer - layout.pod_first[layout.pod];
    return PodStep([&] {
      return is_send ? pod->Send(buf, count, type, lp) : pod->Recv(buf, count, type, lp);
    });
  }
  const size_t bytes = count * SizeOf(type);
  const int w = layout.world_of[peer];
  CXLRT_ASSIGN_OR_RETURN(Ticket t,
                         is_send ? world->Send(buf, bytes, w, 0) : world->Recv(buf, bytes, w, 0));
  return EngineWait(*world, t);
}

}  // namespace cxlrt::pods

// The layout of a communicator in the pool: one named block per
// communicator ("comm/NAME"), made by rank 0 and joined by the others.
//
//   CommHeaderLayout                      written by rank 0 once
//   RankLayout[nranks]                    rank r only: join, ring, done, posts
//   P2pLayout[nranks][nranks]             [s][d]: s writes the chunk lines, d consumed
//   p2p buffers: [s][d] x p2p_bytes       written by s only, kP2pSlots chunks each
//
// Each rank has a ring of `depth` data slots, each a block of its own
// (private: they die with its host), slot i on device (rank + i) % devices
// when the pool has several; its ring line says where. Post number s
// (counted over the communicator's life, from 1) uses slot and post line
// s % depth.
//
// Every line has one writer; every flag is a monotonic 64-bit counter that
// is never reset (MSCCL++-style): post numbers and p2p sequence numbers.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cxlrt/collectives/types.h"

namespace cxlrt::collectives {

inline constexpr uint64_t kCommMagic = 0x314d4354524c5843ull;  // "CXLRTCM1"
// 5: inline posts of up to kHeadBytes in line 0 (PostLayout).
inline constexpr uint32_t kCommVersion = 5;
inline constexpr size_t kInlineBytes = 64;
// Slots (and post lines) per rank, kMinDepth to kMaxDepth: types.h (public,
// since CommOptions::depth takes them).

struct CommHeaderLayout {
  uint64_t magic;  // published last
  uint32_t version;
  uint32_t nranks;
  uint64_t slot_bytes;
  uint64_t p2p_bytes;
  uint64_t instance;  // random per creation: joins name it
  uint32_t creator_slot;
  uint32_t depth;  // slots per rank, in [kMinDepth, kMaxDepth]
  uint64_t creator_epoch;
  uint64_t p2p_buffers_offset;  // from the block start
  uint64_t p2p_offset;
  uint32_t checksum;  // CRC32C over the bytes before it
  uint32_t pad1;
  uint8_t reserved[176];
};
static_assert(sizeof(CommHeaderLayout) == 256);

enum class JoinState : uint64_t { kNone = 0, kJoined = 1, kLeft = 2, kAborted = 3 };

struct JoinLayout {
  uint64_t state;  // JoinState; the flag of this line
  uint64_t instance;
  uint64_t host_epoch;
  uint32_t host_slot;
  uint32_t pid;
  uint8_t pad[32];
};
static_assert(sizeof(JoinLayout) == 64);

// Where a rank's data slots lie: slot[s % depth] holds post s. Published
// with the join line, before its state flag.
struct RingLayout {
  uint64_t slot[kMaxDepth];
};
static_assert(sizeof(RingLayout) == 64);

// What a rank calls, published with each post so peers can check that
// every rank runs the same call.
struct CallDesc {
  uint8_t kind = 0;  // CollKind
  uint8_t type = 0;  // DataType
  uint8_t op = 0;    // RedOp
  uint8_t pad = 0;
  int32_t root = -1;
  uint64_t count = 0;
  uint64_t call = 0;  // this rank's call number in the communicator
  bool operator==(const CallDesc& o) const {
    return kind == o.kind && type == o.type && op == o.op && root == o.root && count == o.count &&
           call == o.call;
  }
};
static_assert(sizeof(CallDesc) == 24);

// One chunk a rank posts: its bytes are inline (data == 0, at most
// kInlineBytes) or the `len` bytes at `data` in the pool (its slot, or its
// own pool-resident buffer when zero-copy). A post of several pieces (one
// per rank, as in all-to-all) has piece j at data + j * stride; len covers
// them all. Two lines; the flag (`seq`) is published last.
//
// Line 0 says everything a reader needs for a post whose bytes lie in the
// pool or fit in kHeadBytes, so such a post is one line to write and one
// to read (an 8-byte all-reduce, a barrier); line 1 is written and read
// only for inline posts of more than kHeadBytes. Inline, `len` packs the
// length (low 32 bits) and the stride between pieces (high 32), and byte
// i of the bytes lies in `stride` for i < kHeadBytes, else in
// inline_bytes[i] (inline_bytes[0, kHeadBytes) unused). CheckPost in
// pool_transport.cc unpacks it.
inline constexpr size_t kHeadBytes = 8;
struct PostLayout {
  uint64_t seq;       // the flag: this rank's post number, stored last
  uint64_t instance;  // the communicator instance it belongs to (header)
  CallDesc desc;
  uint64_t data;                       // where the bytes lie in the pool; 0: inline
  uint64_t len;                        // inline: len | stride << 32
  uint64_t stride;                     // inline: bytes [0, kHeadBytes)
  uint8_t inline_bytes[kInlineBytes];  // line 1: inline bytes [kHeadBytes, len)
};
static_assert(sizeof(PostLayout) == 128 && offsetof(PostLayout, inline_bytes) == 64);

// Lines come in 128-byte pairs that the adjacent-line prefetcher moves
// together (DESIGN.md: 128 B between flags): every post fills one pair and
// `done` has a pair to itself, so a peer reading one post or the done
// counter does not pull in a line this rank is writing for another.
struct RankLayout {
  JoinLayout join;  // line 0
  RingLayout ring;  // line 1
  uint64_t done;    // line 2: the last post whose peers' bytes this rank has read
  uint8_t pad[120];
  PostLayout post[kMaxDepth];  // post s in post[s % depth]; lines 4..
};
static_assert(sizeof(RankLayout) == 4 * 64 + kMaxDepth * 128);
static_assert(sizeof(RankLayout) % 128 == 0 && offsetof(RankLayout, post) % 128 == 0);

// Point-to-point channel s -> d: a ring of kP2pSlots chunks, each
// p2p_bytes / kP2pSlots bytes of the pair's buffer. Chunk q (counted over
// the channel's life, from 1) uses slot (q - 1) % kP2pSlots: s writes its
// bytes once d has consumed chunk q - kP2pSlots, then publishes its header
// with q as the flag; d stores q into `consumed` once it has read them. So
// s copies chunk q + 1 into the pool while d copies chunk q out.
inline constexpr uint32_t kP2pSlots = 4;
struct P2pChunkLayout {  // a 128-byte pair, s only
  uint64_t posted;       // the flag: the chunk's number q, stored last
  uint64_t bytes;        // this chunk's bytes
  uint64_t total;        // elements of the whole Send
  uint64_t type;         // DataType
  uint64_t instance;     // the communicator instance it belongs to
  uint8_t pad[88];
};
static_assert(sizeof(P2pChunkLayout) == 128);
struct P2pLayout {
  P2pChunkLayout chunk[kP2pSlots];  // s
  uint64_t consumed;                // d: chunks read so far
  uint8_t pad[120];
};
static_assert(sizeof(P2pLayout) == (kP2pSlots + 1) * 128);

}  // namespace cxlrt::collectives

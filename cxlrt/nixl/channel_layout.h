// What the CXLRT NIXL backend keeps in the pool (docs/nixl.md, "Design").
//
// Each engine (one NIXL agent's CXLRT backend) owns a named block, its
// region, and one channel block per peer it talks to. Every byte of both is
// written by the owning engine only (single writer, docs/coherence.md);
// peers only read them.
//
// - The region: a header (agent name, engine id, the owner's host slot and
//   epoch) published before `magic`, then a table of the owner's channels,
//   appended to: offsets[i] is published before `count` grows past i.
// - A channel from W (its owner) toward P: W's requests to P in a ring
//   (W publishes entry i, then raises `posted` to i + 1), and W's answers
//   to P's requests (W publishes result i, then raises `acked` to i + 1).
//   Two bounce areas: `out` holds data of W's own requests (a staged write,
//   a long notification), `resp` the data W returns for P's staged reads.
//   A slot is reused only after the request that used it completed.
// A channel names both engines by id, so a reader never takes a channel
// meant for another agent of the same name or another incarnation.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cxlrt/runtime/coherence.h"

namespace cxlrt::nixl {

using runtime::PoolOffset;

inline constexpr uint64_t kRegionMagic = 0x3147454e4c58494eull;   // "NIXLENG1"
inline constexpr uint64_t kChannelMagic = 0x314e4843484c584eull;  // "NXLCHCN1"
inline constexpr uint32_t kMaxName = 192;                         // bytes of an agent name
inline constexpr uint32_t kMaxChannels = 120;                     // channels (peers) per engine
inline constexpr uint32_t kRing = 256;                            // requests in flight per channel
inline constexpr uint32_t kSlots = 8;                             // bounce slots per direction
inline constexpr uint64_t kChunk = 512 << 10;  // bytes per bounce slot and request
inline constexpr uint32_t kInlineMsg = 192;    // notification bytes carried in a request

// Region names are kRegionPrefix + "<slot>.<epoch>.<engine id, hex>".
inline constexpr char kRegionPrefix[] = "nixl:";

struct alignas(64) RegionHeaderLayout {
  uint64_t magic;  // kRegionMagic, published last
  uint64_t engine_id;
  uint64_t epoch;  // the owner host's epoch when it made the region
  uint32_t slot;   // the owner's host slot
  uint32_t name_len;
  char name[kMaxName];
};
static_assert(sizeof(RegionHeaderLayout) == 256);

struct alignas(64) RegionLayout {
  RegionHeaderLayout header;
  uint64_t closed;  // flag: 1 once the owner closed the engine
  uint8_t pad0[120];
  uint64_t count;  // flag: channels published in offsets[]
  uint8_t pad1[56];
  PoolOffset offsets[kMaxChannels];
};
static_assert(sizeof(RegionLayout) == 1408);
static_assert(offsetof(RegionLayout, closed) % 128 == 0 && offsetof(RegionLayout, count) % 64 == 0);

enum RequestOp : uint32_t {
  kOpWrite = 1,  // the peer copies len bytes from data_off into its memory at addr
  kOpRead = 2,   // the peer copies len bytes of its memory at addr to data_off
  kOpNotif = 3,  // a notification: msg (msg_len <= kInlineMsg) or msg_len bytes at data_off
};

struct alignas(64) RequestLayout {
  uint64_t seq;  // request number + 1 (a stale entry has another)
  uint32_t op;
  uint32_t msg_len;
  uint64_t reg_id;  // the peer's registration and its key (from its public data)
  uint64_t key;
  uint64_t addr;  // in the peer's registration
  uint64_t len;
  PoolOffset data_off;
  uint64_t reserved;
  char msg[kInlineMsg];
};
static_assert(sizeof(RequestLayout) == 256);

struct ResultLayout {
  uint64_t seq;    // request number + 1
  int64_t status;  // nixl_status_t
};

struct alignas(64) ChannelHeaderLayout {
  uint64_t magic;  // kChannelMagic
  uint64_t owner_engine_id;
  uint64_t peer_engine_id;
  uint32_t owner_name_len;
  uint32_t peer_name_len;
  char owner_name[kMaxName];
  char peer_name[kMaxName];
};
static_assert(sizeof(ChannelHeaderLayout) == 448);

// Offsets inside a channel block.
inline constexpr uint64_t kChanPosted = 512;    // flag, written by the owner
inline constexpr uint64_t kChanAcked = 640;     // flag, written by the owner
inline constexpr uint64_t kChanResults = 1024;  // kRing ResultLayout
inline constexpr uint64_t kChanRing = kChanResults + kRing * sizeof(ResultLayout);
inline constexpr uint64_t kChanOut = 128 << 10;  // kSlots * kChunk
inline constexpr uint64_t kChanResp = kChanOut + kSlots * kChunk;
inline constexpr uint64_t kChannelBytes = kChanResp + kSlots * kChunk;
static_assert(kChanRing + kRing * sizeof(RequestLayout) <= kChanOut);

}  // namespace cxlrt::nixl

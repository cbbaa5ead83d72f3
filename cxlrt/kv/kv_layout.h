// The layout of a KV-cache store in the pool (docs/kv.md is the protocol).
// One durable named block "cxlrt.kv" holds the store's tables:
//
//   StoreHeaderLayout                     written once by its creator
//   NamespaceLayout[max_namespaces]       written under the pool lock
//   partition[hosts], each:               written by its host slot only
//     PartitionHeaderLayout
//     NsCountersLayout[max_namespaces]    what this host put, got, evicted
//     EntryLayout[entries_per_host]       this host's index (open addressing)
//     PinLayout[pins_per_host]            what this host, as a reader, pins
//
// Values live in blocks of the pooled allocator, allocated by the entry's
// owner: the value at the block's start (so a block is as aligned as the
// allocator makes it, for DMA, and a 16 KiB value takes a 16 KiB block),
// then the part of the key beyond its first 64 bytes, if any.
// A block is private while its put runs and becomes durable in the same step
// that seals its entry (Allocator::CommitDurable), so a writer killed
// mid-put leaves nothing visible and its block is reclaimed with its
// private blocks.
//
// Offsets in the header are from the start of the store's block and are
// bounds-checked against its size when a store is opened.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cxlrt::kv {

inline constexpr uint64_t kStoreMagic = 0x3156534b54524c43ull;  // "CLRTKSV1"
inline constexpr uint32_t kStoreVersion = 1;
inline constexpr char kStoreRegionName[] = "cxlrt.kv";
inline constexpr uint32_t kMaxKeyBytes = 256;
inline constexpr uint32_t kMaxNamespaceBytes = 256;
inline constexpr uint32_t kInlineKeyBytes = 64;

struct StoreHeaderLayout {
  uint64_t magic;  // published last: a store is usable once it is set
  uint32_t version;
  uint32_t hosts;             // partitions: host slots [0, hosts) can use the store
  uint32_t entries_per_host;  // a power of two
  uint32_t pins_per_host;
  uint32_t max_namespaces;
  uint32_t probe_limit;  // slots a search looks at from a key's home slot
  uint64_t namespaces_offset;
  uint64_t partitions_offset;
  uint64_t partition_stride;
  uint64_t counters_offset;  // within a partition
  uint64_t entries_offset;
  uint64_t pins_offset;
  uint64_t store_bytes;  // size of the whole block
  uint8_t reserved[164];
  uint32_t checksum;  // CRC-32C of bytes [0, offsetof(checksum))
};
static_assert(sizeof(StoreHeaderLayout) == 256);
static_assert(offsetof(StoreHeaderLayout, checksum) == 252);

// A namespace: its index in the table is its id in entries and counters.
// Written under the pool lock (registration, quota changes); readers check
// the checksum and retry a torn read.
struct NamespaceLayout {
  uint32_t used;  // 1 once registered; never unregistered
  uint16_t name_len;
  uint16_t pad;
  uint64_t quota;  // bytes of values across all hosts; 0: none
  uint8_t name[kMaxNamespaceBytes];
  uint8_t reserved[44];
  uint32_t checksum;  // CRC-32C of bytes [0, offsetof(checksum))
};
static_assert(sizeof(NamespaceLayout) == 320);

struct PartitionHeaderLayout {
  uint64_t epoch;      // membership epoch of the host that last opened it; 0: never used
  uint64_t pins_high;  // pin records [0, pins_high) may be in use
  uint64_t puts;       // entries this partition has sealed, ever
  uint8_t reserved[40];
};
static_assert(sizeof(PartitionHeaderLayout) == 64);

// Per namespace, per host. Value bytes and entries are this host's entries;
// hits and misses are this host's reads of any partition.
struct NsCountersLayout {
  uint64_t entries;
  uint64_t bytes;
  uint64_t hits;
  uint64_t misses;
  uint64_t evictions;
  uint64_t puts;
  uint64_t put_exists;  // puts refused because the key was there
  uint64_t pad;
};
static_assert(sizeof(NsCountersLayout) == 64);

enum class EntryState : uint64_t {
  kEmpty = 0,      // never used: a search stops here
  kTombstone = 1,  // used before: a search goes on past it
  kPut = 2,        // a put: visible when seal == gen (committed), else in flight
  kEvicting = 3,   // being evicted: its block is durable until FreeDurable
};

// One index slot: two lines, written by the partition's host only (the
// seal word also by Allocator::CommitDurable, and by the recovery of that
// host's arena). Visible to readers exactly when seal == gen and the
// checksum holds; gen is unique per put (epoch << 40 | counter), so a slot
// reused for another put never matches an older reader's gen.
struct alignas(64) EntryLayout {
  uint64_t seal;
  uint64_t state;  // EntryState; FreeDurable stores kTombstone here with the free
  uint64_t gen;
  uint64_t block;  // pool offset of the value block
  uint64_t key_hash;
  uint64_t value_size;
  uint32_t ns;  // namespace id
  uint16_t key_len;
  uint16_t pad;
  uint32_t pad2;
  uint32_t checksum;             // CRC-32C of gen..pad2 and key[]
  uint8_t key[kInlineKeyBytes];  // the key's first min(key_len, 64) bytes
};
static_assert(sizeof(EntryLayout) == 128);
static_assert(offsetof(EntryLayout, checksum) == 60);

// What a reader pins: entry (partition, index) while its gen is `gen`. Void
// once the pinning host's epoch changed (it died or restarted) or its
// heartbeat reached `expires_beat` (the lease). gen 0: a free record.
struct PinLayout {
  uint32_t partition;
  uint32_t index;
  uint64_t gen;
  uint64_t epoch;
  uint64_t expires_beat;
};
static_assert(sizeof(PinLayout) == 32);

// Bytes of a value block: the value, then the key's bytes past kInlineKeyBytes.
inline constexpr uint64_t KeyTailBytes(uint32_t key_len) {
  return key_len > kInlineKeyBytes ? key_len - kInlineKeyBytes : 0;
}
inline constexpr uint64_t BlockBytes(uint64_t value_size, uint32_t key_len) {
  return value_size + KeyTailBytes(key_len);
}

}  // namespace cxlrt::kv

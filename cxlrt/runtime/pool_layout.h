// The pool format, version 2 (kPoolFormatVersion): the structs that live in pool memory.
// docs/pool-format.md is the specification; this file must match it.
//
//   [0, 4 KiB)                 PoolHeaderLayout, then zeros
//   host_table_offset          host_slot_count x HostSlotLayout (384 B)
//   directory_offset           directory_entry_count x RegionEntryLayout (128 B)
//   heap_offset (2 MiB align)  heap_size bytes for the layers above
//
// Every field is fixed-width little-endian; offsets are from the pool base.
// Who writes what:
//   header              the creator, once, before it sets magic; never after
//   HostOwnerLine i     only the process holding host slot i
//   HostControlLine i   only the holder of the pool lock (bakery, below)
//   BakeryLine i        only the process holding host slot index i
//   RegionEntry         only the holder of the pool lock
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace cxlrt::runtime {

// "CXLRTPL1" as stored (little-endian bytes C X L R T P L 1).
inline constexpr uint64_t kPoolMagic = 0x314C5054524C5843ull;
inline constexpr uint32_t kPoolFormatVersion = 2;  // 2: owner lines carry `machine`
inline constexpr uint64_t kHeaderRegionSize = 4096;
inline constexpr uint64_t kHeapAlignment = 2ull << 20;
inline constexpr uint64_t kMinPoolSize = 4ull << 20;
inline constexpr uint32_t kDefaultHostSlots = 64;
inline constexpr uint32_t kMaxHostSlots = 1024;
inline constexpr uint32_t kDefaultDirectoryEntries = 256;
inline constexpr uint32_t kMaxDirectoryEntries = 65536;

struct PoolHeaderLayout {
  uint64_t magic;                  // kPoolMagic; written last at creation
  uint32_t format_version;         // kPoolFormatVersion
  uint32_t header_size;            // sizeof(PoolHeaderLayout)
  uint64_t pool_size;              // bytes, equals the backing's size
  uint64_t creation_id;            // random; tells pools of one name apart
  uint64_t created_unix_ns;        // creator's clock, information only
  uint32_t coherence_domain;       // CoherenceDomain
  uint32_t flags;                  // kHeaderFlag* bits
  uint64_t host_table_offset;      // 4 KiB aligned
  uint32_t host_slot_count;        // 1..kMaxHostSlots
  uint32_t host_slot_size;         // sizeof(HostSlotLayout)
  uint64_t directory_offset;       // 4 KiB aligned, after the host table
  uint32_t directory_entry_count;  // 1..kMaxDirectoryEntries
  uint32_t directory_entry_size;   // sizeof(RegionEntryLayout)
  uint64_t heap_offset;            // kHeapAlignment aligned, after the directory
  uint64_t heap_size;              // pool_size - heap_offset
  char name[64];                   // pool name, NUL-terminated
  // With kHeaderFlagDevices: the pool is device_count devices of
  // device_size bytes each, concatenated (device d holds
  // [d*device_size, (d+1)*device_size)). Without it both are 0: one device.
  uint64_t device_size;
  uint32_t device_count;
  uint8_t reserved[80];  // zero
  uint32_t checksum;     // CRC-32C of bytes [0, offsetof(checksum))
};
static_assert(sizeof(PoolHeaderLayout) == 256);
static_assert(std::is_standard_layout_v<PoolHeaderLayout>);
static_assert(offsetof(PoolHeaderLayout, checksum) == 252);
static_assert(offsetof(PoolHeaderLayout, device_size) == 160);

// PoolHeaderLayout::flags. Version 1 readers that predate a flag refuse a
// header that has it, so a flag is how v1 grows.
inline constexpr uint32_t kHeaderFlagDevices = 1;  // device_size, device_count valid
inline constexpr uint32_t kKnownHeaderFlags = kHeaderFlagDevices;
inline constexpr uint32_t kMaxDevices = 16;

// Host slot states, in HostControlLineLayout::state.
enum class SlotState : uint32_t { kFree = 0, kAttached = 1, kFenced = 2 };

// Written only by the process holding slot i (it holds local index lock i).
// `heartbeat` changes every beat; the rest only at attach and detach and is
// covered by `checksum`. A record whose epoch differs from the control
// line's epoch belongs to an incarnation that was fenced or has left: readers
// ignore it, which is what makes a fenced host's late writes harmless.
struct alignas(64) HostOwnerLineLayout {
  uint64_t heartbeat;       // +1 per beat, never reset
  uint64_t epoch;           // the control epoch this incarnation attached at
  uint64_t attach_unix_ns;  // owner's clock, information only
  // Which running kernel the owner is on: a hash of the boot id and the
  // full host name (MachineId()). Hosts with equal `machine` share local
  // locks; host names alone collide (defect 11 of issue 13).
  uint64_t machine;
  uint32_t pid;
  uint32_t lease_ms;      // others declare the host dead after DeadAfter(this)
  uint32_t heartbeat_ms;  // beat period
  char hostname[16];      // for people: NUL-terminated when shorter, else cut
  uint32_t checksum;      // CRC-32C of bytes [8, 60)
};
static_assert(sizeof(HostOwnerLineLayout) == 64);
static_assert(offsetof(HostOwnerLineLayout, checksum) == 60);

// Limits of the owner line's timing fields (the ranges CXLRT_LEASE_MS and
// CXLRT_HEARTBEAT_MS accept); a line outside them is corrupt, and a wait
// driven by them is clamped (pool destroy, pool info).
inline constexpr uint32_t kMinLeaseMs = 10, kMaxLeaseMs = 3600000;
inline constexpr uint32_t kMinHeartbeatMs = 1, kMaxHeartbeatMs = 600000;
// The longest heartbeat period a tool waits out to see whether hosts beat.
inline constexpr uint32_t kMaxSampledHeartbeatMs = 2000;

// Written only by the holder of the pool lock: at attach (epoch+1,
// kAttached), detach (epoch+1, kFree), fence (epoch+1, kFenced).
struct alignas(64) HostControlLineLayout {
  uint64_t epoch;            // only grows
  uint32_t state;            // SlotState
  uint32_t changed_by;       // host slot that made the last change
  uint64_t changed_unix_ns;  // changer's clock, information only
  uint32_t owner_pid;        // pid of the attached process (information)
  uint8_t reserved[32];
  uint32_t checksum;  // CRC-32C of bytes [0, 60)
};
static_assert(sizeof(HostControlLineLayout) == 64);

// Lamport bakery register of participant i: ticket = number << 1 | choosing.
// Written only by the process holding index i.
struct alignas(64) BakeryLineLayout {
  uint64_t ticket;
  uint8_t reserved[56];
};
static_assert(sizeof(BakeryLineLayout) == 64);

// One host slot; lines of different writers sit 128 B apart.
struct HostSlotLayout {
  HostOwnerLineLayout owner;
  uint8_t pad0[64];
  HostControlLineLayout control;
  uint8_t pad1[64];
  BakeryLineLayout bakery;
  uint8_t pad2[64];
};
static_assert(sizeof(HostSlotLayout) == 384);
static_assert(offsetof(HostSlotLayout, control) == 128);
static_assert(offsetof(HostSlotLayout, bakery) == 256);

enum class RegionState : uint32_t { kEmpty = 0, kLive = 1 };

// A named region of the heap. Written only under the pool lock; two lines,
// so readers verify the checksum and retry on a torn read.
struct alignas(64) RegionEntryLayout {
  uint64_t generation;  // +1 on every change of this entry; 0: never used
  uint32_t state;       // RegionState
  uint32_t owner_host;  // host slot that made it
  uint64_t offset;      // inside [heap_offset, pool_size), 64 B aligned
  uint64_t size;        // > 0
  char name[88];        // non-empty, NUL-terminated
  uint32_t reserved;
  uint32_t checksum;  // CRC-32C of bytes [0, 124)
};
static_assert(sizeof(RegionEntryLayout) == 128);
static_assert(offsetof(RegionEntryLayout, checksum) == 124);

}  // namespace cxlrt::runtime

// Where pool bytes live: a pool may be made of several devices (CXL pools
// are several memory devices that software interleaves; an emulated pool of
// devices=D has D backings). Devices are concatenated and equal in size:
// device d holds [d * device_size, (d + 1) * device_size).
//
// DeviceMap answers which device holds an offset, gives a device's range,
// splits a range at device boundaries, and assigns chunks of a striped
// transfer to devices, so upper layers can spread bandwidth over all of
// them. A value type; thread-safe.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace cxlrt::runtime {

using PoolOffset = uint64_t;

class DeviceMap {
 public:
  // One piece of a range, on one device.
  struct Piece {
    uint32_t device;
    PoolOffset offset;
    uint64_t length;
  };

  // REQUIRES: count >= 1, pool_size % count == 0.
  DeviceMap(uint64_t pool_size, uint32_t count)
      : pool_size_(pool_size), count_(count), device_size_(pool_size / count) {}

  uint32_t count() const { return count_; }
  uint64_t device_size() const { return device_size_; }
  uint64_t pool_size() const { return pool_size_; }

  // The device holding `off`. REQUIRES: off < pool_size().
  uint32_t DeviceOf(PoolOffset off) const { return static_cast<uint32_t>(off / device_size_); }
  // [begin, end) of device `d`. REQUIRES: d < count().
  std::pair<PoolOffset, PoolOffset> Span(uint32_t d) const {
    return {uint64_t{d} * device_size_, uint64_t{d + 1} * device_size_};
  }
  // The part of [lo, hi) on device `d`; empty (first == second) when none.
  std::pair<PoolOffset, PoolOffset> Clip(uint32_t d, PoolOffset lo, PoolOffset hi) const;

  // [off, off+n) cut at device boundaries, in order.
  // REQUIRES: the range lies inside the pool.
  std::vector<Piece> Split(PoolOffset off, uint64_t n) const;

  // The device of chunk `i` of a transfer striped round-robin from device
  // `first`: rooted collectives rotate `first` per root so that no device
  // carries every root's traffic.
  uint32_t StripeDevice(uint64_t i, uint32_t first = 0) const {
    return static_cast<uint32_t>((first + i) % count_);
  }

 private:
  uint64_t pool_size_;
  uint32_t count_;
  uint64_t device_size_;
};

}  // namespace cxlrt::runtime

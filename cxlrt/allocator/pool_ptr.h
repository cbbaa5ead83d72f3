// PoolPtr<T>: a typed 64-bit pool offset. Any host resolves it in its own
// mapping (the pool maps at a different address in each); it is what
// structures in the pool store instead of pointers. 0 is null (offset 0 is
// the pool header, never an allocation).
// Thread-safe: a value type.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/pool.h"

namespace cxlrt::allocator {

template <typename T>
class PoolPtr {
 public:
  PoolPtr() = default;
  explicit PoolPtr(runtime::PoolOffset off) : off_(off) {}

  // The PoolPtr of `p`, which must point into `pool`'s mapping with room for
  // a T; kInvalidArgument otherwise.
  static absl::StatusOr<PoolPtr> FromRaw(const runtime::Pool& pool, const T* p) {
    const auto* base = pool.backend().base();
    const auto* b = reinterpret_cast<const uint8_t*>(p);
    if (b < base || b >= base + pool.size() ||
        sizeof(T) > static_cast<uint64_t>(base + pool.size() - b)) {
      return absl::InvalidArgumentError(
          absl::StrCat("pointer ", absl::Hex(reinterpret_cast<uintptr_t>(p)),
                       " does not point into ", pool.name(), " (mapped at ",
                       absl::Hex(reinterpret_cast<uintptr_t>(base)), ", ", pool.size(), " bytes)"));
    }
    return PoolPtr(static_cast<runtime::PoolOffset>(b - base));
  }

  // This host's address of the object. REQUIRES: not null, inside `pool`
  // (aborts otherwise: an unchecked offset is a bug).
  T* Get(const runtime::Pool& pool) const {
    if (off_ == 0 || off_ > pool.size() || sizeof(T) > pool.size() - off_) __builtin_trap();
    return reinterpret_cast<T*>(pool.backend().base() + off_);
  }

  runtime::PoolOffset offset() const { return off_; }
  explicit operator bool() const { return off_ != 0; }
  friend bool operator==(PoolPtr a, PoolPtr b) { return a.off_ == b.off_; }

 private:
  runtime::PoolOffset off_ = 0;
};

static_assert(sizeof(PoolPtr<int>) == 8);

}  // namespace cxlrt::allocator

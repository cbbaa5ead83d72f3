// The pool's registration with the GPU runtime: the pool mapping made
// page-locked and mapped into every GPU's address space (portable), so that
// DMA and kernels reach pool bytes directly; GpuAddress gives the address a
// kernel uses for a host address of the mapping (docs/gpu.md,
// "Registration").
//
// Thread-safety: Get is thread-safe; a registration is immutable once made
// and shared by every engine and store over the mapping of this process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cxlrt/runtime/coherence.h"

namespace cxlrt::gpu {

class PoolRegistration {
 public:
  // Pieces of at most this size: single registrations of 512 GiB or more
  // fail on r580 drivers.
  static constexpr uint64_t kPieceBytes = uint64_t{256} << 30;

  // The registration of the mapping [base, base+size): made on first use in
  // this process (cudaHostRegister, portable and mapped, in pieces of at
  // most kPieceBytes), shared while anyone holds it, undone when the last
  // holder lets go. kUnavailable when no GPU is available;
  // kFailedPrecondition naming the CUDA error when the mapping cannot be
  // registered.
  static absl::StatusOr<std::shared_ptr<PoolRegistration>> Get(uint8_t* base, uint64_t size);

  PoolRegistration(const PoolRegistration&) = delete;
  PoolRegistration& operator=(const PoolRegistration&) = delete;
  ~PoolRegistration();

  uint8_t* base() const { return base_; }
  uint64_t size() const { return size_; }
  // Whether [p, p+n) lies in the mapping.
  bool Contains(const void* p, size_t n) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return b >= base_ && b <= base_ + size_ && n <= static_cast<uint64_t>(base_ + size_ - b);
  }
  // The address kernels use for host address p of the mapping (p itself
  // when it lies outside).
  const void* GpuAddress(const void* p) const {
    const auto* b = static_cast<const uint8_t*>(p);
    for (const Piece& q : pieces_) {
      if (b >= q.host && b < q.host + q.len) return q.gpu + (b - q.host);
    }
    return p;
  }
  // The address kernels use for pool offset `off`.
  const void* GpuAddressOf(runtime::PoolOffset off) const { return GpuAddress(base_ + off); }
  // How long the registration took (`cxlrt doctor`).
  absl::Duration took() const { return took_; }

 private:
  struct Piece {
    uint8_t* host;
    uint64_t len;
    uint8_t* gpu;
    bool ours;  // registered by us (else by someone else in this process)
  };
  PoolRegistration(uint8_t* base, uint64_t size) : base_(base), size_(size) {}
  absl::Status Register();

  uint8_t* const base_;
  const uint64_t size_;
  std::vector<Piece> pieces_;
  absl::Duration took_;
};

}  // namespace cxlrt::gpu

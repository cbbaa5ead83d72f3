#include "cxlrt/collectives/copy_engine.h"

namespace cxlrt::collectives {
namespace {

// Up to this many bytes, ToPool stores through the cache and writes back
// (Publish): the peer then takes the lines from this core's cache, while
// non-temporal stores make the writer wait for memory (the fence) and the
// reader read from it. One-shot all-reduce, best of 6-8 interleaved runs on
// the 2-vCPU VM: 8 KiB 4.40 -> 2.20 us, 16 KiB 9.3 -> 4.3, 32 KiB 8.9-15.1
// -> 4.4-4.7; at 64 KiB neither wins. Larger copies are bandwidth-bound,
// where non-temporal stores measured 2x faster (docs/collectives.md).
constexpr size_t kCachedToPoolMax = 32 << 10;

// Synchronous: each call does the work, so every ticket is complete when
// it is returned. Helper threads would only pay where a rank has a core to
// spare; on the 2-core machines we measure every rank already has one
// (docs/collectives.md, "Copy engines").
class CpuEngine final : public CopyEngine {
 public:
  explicit CpuEngine(runtime::Coherence& c) : c_(c) {}
  const char* name() const override { return "cpu"; }
  Ticket ToPool(runtime::PoolOffset dst, const void* src, size_t n) override {
    if (n > 0 && n <= kCachedToPoolMax) {
      c_.Publish(dst, src, n);
    } else if (n) {
      c_.CopyToPool(dst, src, n);
    }
    return 0;
  }
  Ticket FromPool(void* dst, const void* pool_src, size_t n) override {
    if (n) runtime::CopyBytes(dst, pool_src, n);
    return 0;
  }
  Ticket Copy(void* dst, const void* src, size_t n) override {
    if (n) runtime::CopyBytes(dst, src, n);
    return 0;
  }
  Ticket Reduce(DataType t, RedOp op, void* out, const void* const* srcs, int n, size_t count,
                int avg_divisor) override {
    if (count) collectives::Reduce(t, op, out, srcs, n, count, avg_divisor);
    return 0;
  }
  bool Poll(Ticket) override { return true; }
  absl::Status Wait(Ticket, absl::Time) override { return absl::OkStatus(); }

 private:
  runtime::Coherence& c_;
};

}  // namespace

std::unique_ptr<CopyEngine> MakeCpuEngine(runtime::Coherence& c) {
  return std::make_unique<CpuEngine>(c);
}

}  // namespace cxlrt::collectives

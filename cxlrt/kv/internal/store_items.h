// Internal to cxlrt/kv/: what the store's source files share about the
// items of a call: checking names and items, printing keys in messages, an
// item's parts, and the copies that move a value between its parts and its
// block. Also the constants more than one of those files reads.
//
// Thread-safety: pure functions and plain values.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cxlrt/kv/kv_layout.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::kv_internal {

using kv::GetItem;
using kv::GetPart;
using kv::PutItem;
using kv::PutPart;

inline constexpr uint64_t kStateTombstone = static_cast<uint64_t>(kv::EntryState::kTombstone);
// Gets and lookups publish the reader counters every this many reads.
inline constexpr uint64_t kPublishEvery = 64;
// How long a batch waits for its GPU copies before it reports them failed.
inline constexpr absl::Duration kGpuCopyDeadline = absl::Seconds(60);

inline absl::Status CheckName(absl::string_view what, absl::string_view s, size_t max) {
  if (s.empty()) return absl::InvalidArgumentError(absl::StrCat("the ", what, " is empty"));
  if (s.size() > max) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " is ", s.size(), " bytes (at most ", max, ")"));
  }
  return absl::OkStatus();
}

// A key or namespace for a message: escaped (absl::CHexEscape), cut at 48 bytes.
inline std::string Printable(absl::string_view s) {
  return absl::StrCat(absl::CHexEscape(s.substr(0, 48)), s.size() > 48 ? "..." : "");
}

// An item's parts: its own, or its one buffer as a single part.
inline absl::Span<const PutPart> PartsOf(const PutItem& it, PutPart* one) {
  if (!it.parts.empty()) return it.parts;
  *one = {it.data, it.size};
  return {one, 1};
}
inline absl::Span<const GetPart> PartsOf(const GetItem& it, GetPart* one) {
  if (!it.parts.empty()) return it.parts;
  *one = {it.dst, it.capacity};
  return {one, 1};
}

inline absl::Status CheckItem(absl::string_view key, bool has_buffer, size_t parts) {
  CXLRT_RETURN_IF_ERROR(CheckName("key", key, kv::kMaxKeyBytes));
  if (has_buffer && parts > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key '", Printable(key), "' has both a buffer and ", parts, " parts; give one of them"));
  }
  return absl::OkStatus();
}
inline absl::Status CheckItem(const PutItem& it) {
  return CheckItem(it.key, it.data != nullptr || it.size != 0, it.parts.size());
}
inline absl::Status CheckItem(const GetItem& it) {
  return CheckItem(it.key, it.dst != nullptr || it.capacity != 0, it.parts.size());
}

// The copies that move one value: (dst, src, bytes) lists, as CopyBatch
// takes them. Empty copies are left out.
struct Copies {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  void Add(void* dst, const void* src, size_t n) {
    if (n == 0) return;
    dsts.push_back(dst);
    srcs.push_back(src);
    sizes.push_back(n);
  }
};

// The bytes of a value's parts.
template <typename Part>
size_t TotalOf(absl::Span<const Part> parts) {
  size_t n = 0;
  for (const Part& p : parts) n += p.size;
  return n;
}

// A value's parts into its block, in order.
inline Copies IntoBlock(uint8_t* block, absl::Span<const PutPart> parts) {
  Copies c;
  for (size_t at = 0; const PutPart& p : parts) {
    c.Add(block + at, p.data, p.size);
    at += p.size;
  }
  return c;
}

// A value of `size` bytes out of its block, cut along the parts (the last
// one it reaches may be left short).
inline Copies OutOfBlock(const uint8_t* block, size_t size, absl::Span<const GetPart> parts) {
  Copies c;
  for (size_t i = 0, at = 0; i < parts.size() && at < size; ++i) {
    const size_t n = std::min<size_t>(parts[i].size, size - at);
    c.Add(parts[i].data, block + at, n);
    at += n;
  }
  return c;
}

}  // namespace cxlrt::kv_internal

#include "cxlrt/runtime/units.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cxlrt::runtime {

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text, absl::string_view what) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  std::string suffix = absl::AsciiStrToUpper(text.substr(digits));
  uint64_t value = 0;
  if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "' is not a byte count (e.g. 4096, 256M, 4G)"));
  }
  int shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else if (suffix == "K" || suffix == "KB" || suffix == "KIB") {
    shift = 10;
  } else if (suffix == "M" || suffix == "MB" || suffix == "MIB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "GB" || suffix == "GIB") {
    shift = 30;
  } else if (suffix == "T" || suffix == "TB" || suffix == "TIB") {
    shift = 40;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "' has unknown suffix '",
                                                   text.substr(digits), "' (use K, M, G or T)"));
  }
  if (shift > 0 && value > (UINT64_MAX >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "' overflows 64 bits"));
  }
  return value << shift;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  uint64_t v = bytes;
  while (u < 4 && v >= 1024 && v % 1024 == 0) {
    v /= 1024;
    ++u;
  }
  if (u == 0 && bytes >= 1024) {
    // Not a whole number of KiB: show a rounded figure and the exact count.
    double d = static_cast<double>(bytes);
    int k = 0;
    while (k < 4 && d >= 1024) {
      d /= 1024;
      ++k;
    }
    return absl::StrFormat("%.1f %s (%d B)", d, kUnits[k], bytes);
  }
  return absl::StrCat(v, " ", kUnits[u]);
}

}  // namespace cxlrt::runtime

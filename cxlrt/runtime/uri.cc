#include "cxlrt/runtime/uri.h"

#include <cctype>
#include <set>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cxlrt/runtime/units.h"

namespace cxlrt::runtime {

absl::string_view CoherenceDomainName(CoherenceDomain d) {
  switch (d) {
    case CoherenceDomain::kHardware:
      return "hardware";
    case CoherenceDomain::kSoftware:
      return "software";
    case CoherenceDomain::kSimulated:
      return "simulated";
  }
  return "unknown";
}

std::optional<CoherenceDomain> ParseCoherenceDomain(absl::string_view name) {
  if (name == "hardware") return CoherenceDomain::kHardware;
  if (name == "software") return CoherenceDomain::kSoftware;
  if (name == "simulated") return CoherenceDomain::kSimulated;
  return std::nullopt;
}

namespace {

absl::Status Bad(absl::string_view uri, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("bad pool URI '", uri, "': ", what));
}

bool ValidEmuName(absl::string_view n) {
  if (n.empty() || n.size() > 64 || n[0] == '.') return false;
  for (char c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

// Decodes %XX escapes; returns false on a malformed escape.
bool PercentDecode(absl::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size() || !std::isxdigit(static_cast<unsigned char>(in[i + 1])) ||
        !std::isxdigit(static_cast<unsigned char>(in[i + 2]))) {
      return false;
    }
    out->push_back(static_cast<char>(std::stoi(std::string(in.substr(i + 1, 2)), nullptr, 16)));
    i += 2;
  }
  return true;
}

// The unsigned integer `v` when it is one in [lo, hi].
std::optional<uint32_t> InRange(absl::string_view v, uint32_t lo, uint32_t hi) {
  uint32_t n = 0;
  if (!absl::SimpleAtoi(v, &n) || n < lo || n > hi) return std::nullopt;
  return n;
}

}  // namespace

absl::StatusOr<PoolUri> ParsePoolUri(absl::string_view text) {
  PoolUri uri;
  absl::string_view rest;
  if (text.substr(0, 6) == "emu://") {
    uri.scheme = PoolScheme::kEmu;
    rest = text.substr(6);
  } else if (text.substr(0, 6) == "dax://") {
    uri.scheme = PoolScheme::kDax;
    rest = text.substr(6);
  } else {
    size_t colon = text.find("://");
    return Bad(text, colon == absl::string_view::npos
                         ? std::string("no scheme (expected emu://NAME or dax:///dev/daxX.Y)")
                         : absl::StrCat("unknown scheme '", text.substr(0, colon),
                                        "' (expected emu or dax)"));
  }
  absl::string_view query;
  if (size_t q = rest.find('?'); q != absl::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  std::string name;
  if (!PercentDecode(rest, &name)) return Bad(text, "malformed %-escape in the name");
  if (uri.scheme == PoolScheme::kEmu) {
    if (!ValidEmuName(name)) {
      return Bad(text, absl::StrCat("pool name '", name,
                                    "' must be 1-64 characters of [A-Za-z0-9._-], "
                                    "not starting with '.'"));
    }
  } else if (name.empty() || name[0] != '/') {
    return Bad(text, "dax URI needs an absolute device path, as in dax:///dev/dax0.0");
  }
  uri.name = name;

  const std::set<std::string> allowed =
      uri.scheme == PoolScheme::kEmu
          ? std::set<std::string>{"size",       "node",    "coherence", "dir",
                                  "mode",       "hosts",   "devices",   "model",
                                  "latency_ns", "bw_gbps", "prefault",  "reserve"}
          : std::set<std::string>{"size", "coherence", "hosts"};
  std::set<std::string> seen;
  if (!query.empty()) {
    for (absl::string_view part : absl::StrSplit(query, '&')) {
      if (part.empty()) return Bad(text, "empty parameter (stray '&')");
      size_t eq = part.find('=');
      if (eq == absl::string_view::npos) {
        return Bad(text, absl::StrCat("parameter '", part, "' has no value (write key=value)"));
      }
      std::string key(part.substr(0, eq));
      std::string value;
      if (!PercentDecode(part.substr(eq + 1), &value)) {
        return Bad(text, absl::StrCat("malformed %-escape in parameter '", key, "'"));
      }
      if (!allowed.count(key)) {
        return Bad(text, absl::StrCat("unknown parameter '", key, "' (known for this scheme: ",
                                      absl::StrJoin(allowed, ", "), ")"));
      }
      if (!seen.insert(key).second)
        return Bad(text, absl::StrCat("parameter '", key, "' repeated"));
      if (value.empty()) return Bad(text, absl::StrCat("parameter '", key, "' is empty"));
      if (key == "size") {
        auto size = ParseByteSize(value, "size");
        if (!size.ok()) return Bad(text, size.status().message());
        if (*size == 0) return Bad(text, "size must be above 0");
        uri.size = *size;
      } else if (key == "node") {
        int node = 0;
        if (!absl::SimpleAtoi(value, &node) || node < 0 || node > 1023) {
          return Bad(text, absl::StrCat("node '", value, "' is not a NUMA node number (0-1023)"));
        }
        uri.node = node;
      } else if (key == "coherence") {
        auto domain = ParseCoherenceDomain(value);
        if (!domain) {
          return Bad(text, absl::StrCat("coherence '", value,
                                        "' is not one of hardware, software, simulated"));
        }
        uri.coherence = *domain;
      } else if (key == "dir") {
        if (value[0] != '/') return Bad(text, absl::StrCat("dir '", value, "' is not absolute"));
        uri.dir = value;
      } else if (key == "mode") {
        uint32_t mode = 0;
        bool ok = value.size() <= 4;
        for (char c : value) ok = ok && c >= '0' && c <= '7';
        if (ok) mode = static_cast<uint32_t>(std::stoul(value, nullptr, 8));
        if (!ok || (mode & 0600) != 0600) {
          return Bad(text, absl::StrCat("mode '", value,
                                        "' is not an octal file mode that lets its owner read "
                                        "and write (e.g. 0600, 0660)"));
        }
        uri.mode = mode;
      } else if (key == "hosts") {
        auto hosts = InRange(value, 1, 1024);
        if (!hosts) {
          return Bad(text, absl::StrCat("hosts '", value, "' is not a host count in [1, 1024]"));
        }
        uri.hosts = hosts;
      } else if (key == "devices") {
        auto devices = InRange(value, 1, 16);
        if (!devices) {
          return Bad(text, absl::StrCat("devices '", value, "' is not a device count in [1, 16]"));
        }
        uri.devices = devices;
      } else if (key == "prefault") {
        if (value != "0" && value != "1") {
          return Bad(text, absl::StrCat("prefault '", value,
                                        "' is not 0 (fault pages on first touch) or 1 (map "
                                        "them all when opening)"));
        }
        uri.prefault = value == "1";
      } else if (key == "reserve") {
        if (value != "all" && value != "lazy") {
          return Bad(text, absl::StrCat("reserve '", value,
                                        "' is not all (reserve the file at creation) or lazy "
                                        "(as the heap grows)"));
        }
        uri.reserve_lazy = value == "lazy";
      } else if (key == "model") {
        if (value != "switch" && value != "direct") {
          return Bad(text, absl::StrCat("model '", value,
                                        "' is not a preset (switch: a switch-attached pool, "
                                        "direct: a directly attached expander)"));
        }
        uri.model = value;
      } else if (key == "latency_ns") {
        auto ns = InRange(value, 0, 10000000);
        if (!ns) {
          return Bad(text, absl::StrCat("latency_ns '", value,
                                        "' is not a latency in nanoseconds in [0, 10000000]"));
        }
        uri.latency_ns = ns;
      } else if (key == "bw_gbps") {
        double gbps = 0;
        if (!absl::SimpleAtod(value, &gbps) || !(gbps >= 0.001 && gbps <= 10000)) {
          return Bad(text, absl::StrCat("bw_gbps '", value,
                                        "' is not a bandwidth in GB/s in [0.001, 10000]"));
        }
        uri.bw_gbps = gbps;
      }
    }
  }
  if (uri.reserve_lazy.value_or(false) && uri.prefault.value_or(false)) {
    return Bad(text, "reserve=lazy with prefault=1 would map, and so reserve, every page at once");
  }
  return uri;
}

std::string PoolUri::Identity() const {
  return absl::StrCat(scheme == PoolScheme::kEmu ? "emu://" : "dax://", name);
}

std::string PoolUri::ToString() const {
  std::vector<std::string> params;
  if (size) params.push_back(absl::StrCat("size=", *size));
  if (node) params.push_back(absl::StrCat("node=", *node));
  if (coherence) params.push_back(absl::StrCat("coherence=", CoherenceDomainName(*coherence)));
  if (dir) params.push_back(absl::StrCat("dir=", *dir));
  if (mode) params.push_back(absl::StrFormat("mode=%04o", *mode));
  if (hosts) params.push_back(absl::StrCat("hosts=", *hosts));
  if (devices) params.push_back(absl::StrCat("devices=", *devices));
  if (model) params.push_back(absl::StrCat("model=", *model));
  if (latency_ns) params.push_back(absl::StrCat("latency_ns=", *latency_ns));
  if (bw_gbps) params.push_back(absl::StrCat("bw_gbps=", *bw_gbps));
  if (prefault) params.push_back(absl::StrCat("prefault=", *prefault ? 1 : 0));
  if (reserve_lazy) params.push_back(*reserve_lazy ? "reserve=lazy" : "reserve=all");
  std::string out = Identity();
  if (!params.empty()) absl::StrAppend(&out, "?", absl::StrJoin(params, "&"));
  return out;
}

std::string PoolUri::ForOpeners() const {
  PoolUri open = *this;
  open.size.reset();
  open.hosts.reset();
  open.devices.reset();
  open.mode.reset();
  open.node.reset();
  open.coherence.reset();
  open.reserve_lazy.reset();
  return open.ToString();
}

CoherenceDomain PoolUri::CoherenceOrDefault() const {
  if (coherence) return *coherence;
  return scheme == PoolScheme::kEmu ? CoherenceDomain::kHardware : CoherenceDomain::kSoftware;
}

}  // namespace cxlrt::runtime

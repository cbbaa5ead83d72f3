#include "cxlrt/runtime/prometheus.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string_view>

#include "absl/strings/str_cat.h"

namespace cxlrt::runtime {
namespace {

bool EndsWith(std::string_view s, std::string_view t) {
  return s.size() >= t.size() && s.substr(s.size() - t.size()) == t;
}

// Prometheus names allow [a-zA-Z0-9_:]; anything else becomes '_'.
std::string Sanitize(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
          c == ':')) {
      c = '_';
    }
  }
  return out;
}

}  // namespace

std::string PrintableUtf8(std::string_view v, bool keep_newline) {
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(v.size());
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  const size_t n = v.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      if ((c < 0x20 && !(keep_newline && c == '\n')) || c == 0x7f) {
        out.append(kReplacement);
      } else {
        out.push_back(static_cast<char>(c));
      }
      ++i;
      continue;
    }
    // The length of a well-formed sequence starting at c (RFC 3629: no
    // overlong forms, no surrogates, nothing past U+10FFFF), else 0.
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the second byte's range
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    }
    bool ok = len > 0 && i + len <= n && p[i + 1] >= lo && p[i + 1] <= hi;
    for (size_t k = 2; ok && k < len; ++k) ok = p[i + k] >= 0x80 && p[i + k] <= 0xbf;
    if (ok) {
      out.append(v.substr(i, len));
      i += len;
    } else {
      out.append(kReplacement);
      ++i;
    }
  }
  return out;
}

namespace {

void AppendEscaped(std::string* out, std::string_view raw) {
  const std::string v = PrintableUtf8(raw, /*keep_newline=*/true);
  for (char c : v) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '"') {
      out->append("\\\"");
    } else if (c == '\n') {
      out->append("\\n");
    } else {
      out->push_back(c);
    }
  }
}

std::string Number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  // Shortest form that reads back the same.
  for (int prec = 1; prec < 17; ++prec) {
    char b2[40];
    std::snprintf(b2, sizeof(b2), "%.*g", prec, v);
    if (std::strtod(b2, nullptr) == v) return b2;
  }
  return buf;
}

// {a="x",b="y"} with `extra` (le) last; "" when there are none.
std::string LabelText(const Labels& labels, const char* extra_name = nullptr,
                      const std::string& extra_value = "") {
  if (labels.empty() && extra_name == nullptr) return "";
  std::string out = "{";
  bool first = true;
  for (const Label& l : labels) {
    if (!first) out.push_back(',');
    first = false;
    absl::StrAppend(&out, Sanitize(l.name), "=\"");
    AppendEscaped(&out, l.value);
    out.push_back('"');
  }
  if (extra_name != nullptr) {
    if (!first) out.push_back(',');
    absl::StrAppend(&out, extra_name, "=\"", extra_value, "\"");
  }
  out.push_back('}');
  return out;
}

// Values in ns are exposed in seconds (divided: 3200 / 1e9 reads 3.2e-06,
// where 3200 * 1e-9 reads 3.2000000000000003e-06).
double Divisor(const Sample& s) { return s.unit == "ns" ? 1e9 : 1.0; }

}  // namespace

std::string PrometheusName(const Sample& s) {
  std::string name = "cxlrt_" + Sanitize(s.name);
  if (s.unit == "ns") {
    if (!EndsWith(name, "_seconds")) name += "_seconds";
  } else if (s.unit == "bytes") {
    if (!EndsWith(name, "_bytes")) name += "_bytes";
  }
  if (s.type == MetricType::kCounter) name += "_total";
  return name;
}

std::string PrometheusText(const std::vector<Sample>& samples) {
  // Families by exposed name, each sample once, in the given order within.
  std::map<std::string, std::vector<const Sample*>> families;
  for (const Sample& s : samples) families[PrometheusName(s)].push_back(&s);
  std::string out;
  for (const auto& [name, members] : families) {
    const Sample& first = *members.front();
    std::string help = first.help;
    std::replace(help.begin(), help.end(), '\n', ' ');
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ",
                    MetricTypeName(first.type), "\n");
    for (const Sample* s : members) {
      if (s->type != first.type) continue;  // one type per family
      const double div = Divisor(*s);
      switch (s->type) {
        case MetricType::kCounter:
          if (div == 1.0) {
            absl::StrAppend(&out, name, LabelText(s->labels), " ", s->count, "\n");
          } else {
            absl::StrAppend(&out, name, LabelText(s->labels), " ",
                            Number(static_cast<double>(s->count) / div), "\n");
          }
          break;
        case MetricType::kGauge:
          absl::StrAppend(&out, name, LabelText(s->labels), " ", Number(s->gauge / div), "\n");
          break;
        case MetricType::kHistogram: {
          // Cumulative counts at le = 2^i units for every second i (powers
          // of four), from 2^8 for ns; every i of the registry is exact.
          const std::string base = name + "_bucket";
          const size_t first_i = s->unit == "ns" ? 8 : 2;
          const size_t last_i = s->unit == "ns" ? 36 : 40;
          uint64_t cum = 0;
          size_t i = 0;
          for (size_t edge = first_i; edge <= last_i; edge += 2) {
            for (; i <= edge && i < Histogram::kBuckets; ++i) cum += s->hist.buckets[i];
            absl::StrAppend(
                &out, base,
                LabelText(s->labels, "le", Number(std::ldexp(1.0, static_cast<int>(edge)) / div)),
                " ", cum, "\n");
          }
          absl::StrAppend(&out, base, LabelText(s->labels, "le", "+Inf"), " ", s->hist.count, "\n");
          absl::StrAppend(&out, name, "_sum", LabelText(s->labels), " ",
                          Number(static_cast<double>(s->hist.sum) / div), "\n");
          absl::StrAppend(&out, name, "_count", LabelText(s->labels), " ", s->hist.count, "\n");
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace cxlrt::runtime

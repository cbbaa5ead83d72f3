// The Prometheus text exposition format (version 0.0.4) of metrics
// samples (cxlrt/runtime/metrics.h): what `cxlrt metrics` prints and
// /metrics serves.
//
// Names: "cxlrt_" + the dotted name with '_' for '.', then the unit's
// suffix ("_seconds" for ns, scaled; "_bytes" for bytes unless the name
// ends so), then "_total" for counters: kv.hits (calls) ->
// cxlrt_kv_hits_total, kv.get_latency (ns) -> cxlrt_kv_get_latency_seconds.
// Histograms in ns are exposed with buckets at powers of four of ns (256 ns
// .. 68.7 s) and +Inf, from the registry's power-of-two buckets exactly.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "cxlrt/runtime/metrics.h"

namespace cxlrt::runtime {

// The exposed name of a sample's family.
std::string PrometheusName(const Sample& s);

// `v` as valid UTF-8 without control characters: each byte that does not
// start or continue a well-formed sequence, and each control character
// (newline aside when `keep_newline`), becomes U+FFFD. Names and label
// values come from callers and from other hosts' areas in the pool; one
// bad byte must not make a scraper (Prometheus rejects a whole target over
// invalid UTF-8), a terminal or Python's str decoding fail.
std::string PrintableUtf8(std::string_view v, bool keep_newline = false);

// The samples as exposition text: one HELP and TYPE per family, families
// in order of name, samples in the order given within one.
std::string PrometheusText(const std::vector<Sample>& samples);

}  // namespace cxlrt::runtime

// Status propagation macros. The Abseil shipped with Debian 12 (20220623)
// has none of its own. Header only; thread-safe by construction.
#pragma once

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CXLRT_INTERNAL_CONCAT_IMPL(a, b) a##b
#define CXLRT_INTERNAL_CONCAT(a, b) CXLRT_INTERNAL_CONCAT_IMPL(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing
// function when it is not OK.
#define CXLRT_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::absl::Status cxlrt_status_ = (expr);         \
    if (!cxlrt_status_.ok()) return cxlrt_status_; \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or returns its status.
// `lhs` may be a declaration: CXLRT_ASSIGN_OR_RETURN(auto pool, Open(uri));
#define CXLRT_ASSIGN_OR_RETURN(lhs, rexpr) \
  CXLRT_INTERNAL_ASSIGN_OR_RETURN(CXLRT_INTERNAL_CONCAT(cxlrt_statusor_, __LINE__), lhs, rexpr)

#define CXLRT_INTERNAL_ASSIGN_OR_RETURN(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                    \
  if (!tmp.ok()) return std::move(tmp).status();         \
  lhs = std::move(tmp).value()

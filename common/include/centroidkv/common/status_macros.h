// Status propagation macros (the ABSL_RETURN_IF_ERROR / ABSL_ASSIGN_OR_RETURN of newer
// Abseil releases, which Debian 12's libabsl 20220623 lacks). Same semantics.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CKV_STATUS_CONCAT_INNER_(a, b) a##b
#define CKV_STATUS_CONCAT_(a, b) CKV_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function when `expr` (an absl::Status) is not OK.
#define CKV_RETURN_IF_ERROR(expr)                  \
  do {                                             \
    if (::absl::Status ckv_status_ = (expr);       \
        !ckv_status_.ok()) {                       \
      return ckv_status_;                          \
    }                                              \
  } while (false)

// `CKV_ASSIGN_OR_RETURN(auto x, Foo());` evaluates Foo() (an absl::StatusOr<T>), returns
// its status on error, and otherwise moves the value into `x`.
#define CKV_ASSIGN_OR_RETURN(lhs, expr) \
  CKV_ASSIGN_OR_RETURN_IMPL_(CKV_STATUS_CONCAT_(ckv_statusor_, __LINE__), lhs, expr)

#define CKV_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                               \
  if (!statusor.ok()) {                                 \
    return std::move(statusor).status();                \
  }                                                     \
  lhs = *std::move(statusor)

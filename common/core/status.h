// Status helpers shared by every module.
//
// Functions that can fail return absl::Status or absl::StatusOr<T> (see absl/status/status.h
// for which code to pick). Debian's Abseil has no RETURN_IF_ERROR macros, so we define ours
// here, once.
#ifndef BATON_COMMON_CORE_STATUS_H_
#define BATON_COMMON_CORE_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

#define BATON_STATUS_CONCAT_INNER_(a, b) a##b
#define BATON_STATUS_CONCAT_(a, b) BATON_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if not OK.
#define BATON_RETURN_IF_ERROR(expr)                          \
  do {                                                       \
    ::absl::Status baton_status_ = (expr);                   \
    if (!baton_status_.ok()) return baton_status_;           \
  } while (false)

// `lhs = value of rexpr` where rexpr is an absl::StatusOr<T>; returns its status if not OK.
#define BATON_ASSIGN_OR_RETURN(lhs, rexpr) \
  BATON_ASSIGN_OR_RETURN_IMPL_(BATON_STATUS_CONCAT_(baton_statusor_, __LINE__), lhs, rexpr)
#define BATON_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                 \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

namespace baton {

// `s` with another message, its code and payloads kept (adding context to an error must not
// lose what kind of error it is).
inline absl::Status WithMessage(const absl::Status& s, absl::string_view message) {
  absl::Status out(s.code(), message);
  s.ForEachPayload([&out](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

// Training diverged: a non-finite loss or gradient. FAILED_PRECONDITION marked with a
// payload, so the worker can tell the coordinator the cause without matching messages.
inline constexpr char kDivergedPayload[] = "type.baton.dev/diverged";
inline absl::Status DivergedError(absl::string_view message) {
  absl::Status s = absl::FailedPreconditionError(message);
  s.SetPayload(kDivergedPayload, absl::Cord("1"));
  return s;
}
inline bool IsDiverged(const absl::Status& s) {
  return s.GetPayload(kDivergedPayload).has_value();
}

}  // namespace baton

#endif  // BATON_COMMON_CORE_STATUS_H_

// Error values: Error, Status and Result<T>, used by every module for input errors.
// Errors that come from input are values, never exceptions (see docs/decisions.md).
#pragma once

#include <cassert>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace kiln {

enum class ErrorCode {
  // Shape errors (docs/spec/ir.md §4).
  RankMismatch,
  IncompatibleDims,
  OutOfBounds,
  IncompatibleShapes,
  Invalid,
  // dtype rule violated (docs/spec/ir.md §6.2).
  DTypeMismatch,
  // A value the IR cannot represent or a feature kiln does not implement.
  Unsupported,
  // Malformed bytes handed to a decoder.
  Decode,
  // A tensor id that is unknown or in the wrong state.
  InvalidHandle,
  // Execution failed (kernel error, resource exhausted, ...).
  Execution,
  ResourceExhausted,
  // Configuration could not be read or is wrong.
  Config,
  // Internal invariant broken: a bug in kiln, reported instead of aborting.
  Internal,
};

const char* error_code_name(ErrorCode code);

// An error: what kind, and a message that names the operation and the offending values.
struct [[nodiscard]] Error {
  ErrorCode code = ErrorCode::Internal;
  std::string message;

  std::string to_string() const;
  friend bool operator==(const Error&, const Error&) = default;
};

inline Error make_error(ErrorCode code, std::string message) { return Error{code, std::move(message)}; }

// Success or an Error.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error e) : error_(std::move(e)), ok_(false) {}  // NOLINT: implicit on purpose

  bool ok() const { return ok_; }
  explicit operator bool() const { return ok_; }
  const Error& error() const {
    assert(!ok_);
    return error_;
  }
  static Status Ok() { return Status(); }

 private:
  Error error_;
  bool ok_ = true;
};

// A value or an Error (in the style of absl::StatusOr / std::expected).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT
  Result(Error e) : v_(std::in_place_index<1>, std::move(e)) {}      // NOLINT

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }
  Status status() const { return ok() ? Status() : Status(error()); }

 private:
  std::variant<T, Error> v_;
};

}  // namespace kiln

// Propagate an error from an expression returning Status or Result<T>.
#define KILN_CONCAT_INNER(a, b) a##b
#define KILN_CONCAT(a, b) KILN_CONCAT_INNER(a, b)
// A named Status (or Result) is read in place; a temporary lives to the end of the statement.
#define KILN_RETURN_IF_ERROR(expr)               \
  do {                                           \
    auto&& _kiln_st = (expr);                    \
    if (!_kiln_st.ok()) return _kiln_st.error(); \
  } while (0)
// `tmp` is a fresh name and `lhs` may be a declaration (`auto x`): neither can be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define KILN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.error();               \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
#define KILN_ASSIGN_OR_RETURN(lhs, expr) KILN_ASSIGN_OR_RETURN_IMPL(KILN_CONCAT(_kiln_r_, __LINE__), lhs, expr)

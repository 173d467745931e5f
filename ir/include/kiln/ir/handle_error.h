// ExecutionError and TensorError: the root cause of a failed execution and its propagation to
// the tensors that were never written because of it (docs/spec/ir.md §11.1).
//
// Thread-safety: both types are immutable once built. An ExecutionError is shared read-only
// (std::shared_ptr<const ExecutionError>) by every tensor that carries it, across containers,
// devices and threads; a TensorError is a plain value (copy it, do not share a mutable one).
//
// Usage:
//   TensorError e = TensorError::make_root(ErrorCode::ResourceExhausted, "matmul: out of memory");
//   TensorError d = e.downstream();          // one skipped op later
//   assert(d.same_root(e) && d.depth == 1);
//   d.to_string();   // "execution failed: matmul: out of memory (1 operation skipped since)"
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "kiln/base/result.h"

namespace kiln::ir {

// The original failure: what kind, a message naming the operation, and an optional context
// (a backtrace, the kernel source, the fused block ...). Immutable: built once, then only read.
class ExecutionError {
 public:
  ExecutionError(ErrorCode kind, std::string message, std::string context = {})
      : kind_(kind), message_(std::move(message)), context_(std::move(context)) {}

  // A new root, ready to be shared by every tensor the failure leaves unwritten.
  static std::shared_ptr<const ExecutionError> make(ErrorCode kind, std::string message, std::string context = {});
  // A new root from an error value (its code becomes the kind).
  static std::shared_ptr<const ExecutionError> from(const Error& error, std::string context = {});

  ErrorCode kind() const { return kind_; }
  const std::string& message() const { return message_; }
  bool has_context() const { return !context_.empty(); }
  const std::string& context() const { return context_; }

  // "ResourceExhausted: <message>", followed by "\n<context>" when there is one.
  std::string to_string() const;

 private:
  ErrorCode kind_;
  std::string message_;
  std::string context_;
};

// The error a tensor carries when the work that should have written it never ran. `root` is
// the failure itself, shared (pointer identity) by every tensor it left unwritten; `depth`
// counts the ops skipped between the failure and this tensor (0 = output of the failed op).
// `root` is never null in a TensorError built by kiln (make_root / downstream).
struct TensorError {
  std::shared_ptr<const ExecutionError> root;
  std::uint32_t depth = 0;

  // A new root at depth 0.
  static TensorError make_root(ErrorCode kind, std::string message, std::string context = {});
  static TensorError make_root(const Error& error, std::string context = {});

  // Same failure: pointer identity of the roots, never message equality.
  bool same_root(const TensorError& other) const { return root.get() == other.root.get(); }
  // The error of an output of an op skipped because one of its inputs carried *this.
  // (K) depth saturates at UINT32_MAX instead of wrapping back to 0.
  TensorError downstream() const;

  // "execution failed: <message>" at depth 0, then " (1 operation skipped since)" or
  // " (N operations skipped since)".
  std::string to_string() const;
  // As an error value: the root's kind as code, to_string() as message.
  Error to_error() const;

  // Same root object and same depth.
  friend bool operator==(const TensorError& a, const TensorError& b) { return a.same_root(b) && a.depth == b.depth; }
};

inline bool same_root(const TensorError& a, const TensorError& b) { return a.same_root(b); }

}  // namespace kiln::ir

#include "kiln/ir/handle_error.h"

#include <fmt/format.h>

#include <limits>

namespace kiln::ir {

std::shared_ptr<const ExecutionError> ExecutionError::make(ErrorCode kind, std::string message, std::string context) {
  return std::make_shared<const ExecutionError>(kind, std::move(message), std::move(context));
}

std::shared_ptr<const ExecutionError> ExecutionError::from(const Error& error, std::string context) {
  return make(error.code, error.message, std::move(context));
}

std::string ExecutionError::to_string() const {
  std::string s = fmt::format("{}: {}", error_code_name(kind_), message_);
  if (!context_.empty()) s += "\n" + context_;
  return s;
}

TensorError TensorError::make_root(ErrorCode kind, std::string message, std::string context) {
  return TensorError{ExecutionError::make(kind, std::move(message), std::move(context)), 0};
}

TensorError TensorError::make_root(const Error& error, std::string context) {
  return TensorError{ExecutionError::from(error, std::move(context)), 0};
}

TensorError TensorError::downstream() const {
  const std::uint32_t next = depth == std::numeric_limits<std::uint32_t>::max() ? depth : depth + 1;
  return TensorError{root, next};
}

std::string TensorError::to_string() const {
  std::string s = "execution failed: ";
  s += root ? root->message() : std::string("unknown error (no root)");
  if (depth == 1) {
    s += " (1 operation skipped since)";
  } else if (depth > 1) {
    s += fmt::format(" ({} operations skipped since)", depth);
  }
  return s;
}

Error TensorError::to_error() const { return make_error(root ? root->kind() : ErrorCode::Execution, to_string()); }

}  // namespace kiln::ir

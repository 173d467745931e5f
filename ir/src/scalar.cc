#include "kiln/ir/scalar.h"

#include <fmt/format.h>

namespace kiln::ir {

Result<ScalarIr> ScalarIr::from_f64(double value, DType dtype) {
  if (dtype.is_float()) return ScalarIr::Float(value);
  if (dtype.is_int()) return ScalarIr::Int(static_cast<std::int64_t>(value));
  if (dtype.is_uint()) return ScalarIr::UInt(static_cast<std::uint64_t>(value));
  if (dtype.is_bool()) return ScalarIr::Bool(value != 0);
  return make_error(ErrorCode::Unsupported,
                    fmt::format("ScalarIr::new: dtype {} cannot hold a scalar literal", dtype.name()));
}

double ScalarIr::to_f64() const {
  switch (kind_) {
    case Kind::Float: return f_;
    case Kind::Int: return static_cast<double>(i_);
    default: return static_cast<double>(u_);
  }
}
std::int64_t ScalarIr::to_i64() const {
  switch (kind_) {
    case Kind::Float: return static_cast<std::int64_t>(f_);
    case Kind::Int: return i_;
    default: return static_cast<std::int64_t>(u_);
  }
}
std::uint64_t ScalarIr::to_u64() const {
  switch (kind_) {
    case Kind::Float: return static_cast<std::uint64_t>(f_);
    case Kind::Int: return static_cast<std::uint64_t>(i_);
    default: return u_;
  }
}
bool ScalarIr::to_bool() const {
  switch (kind_) {
    case Kind::Float: return f_ != 0;
    case Kind::Int: return i_ != 0;
    default: return u_ != 0;
  }
}

std::string ScalarIr::to_string() const {
  switch (kind_) {
    case Kind::Float: return fmt::format("Float({})", f_);
    case Kind::Int: return fmt::format("Int({})", i_);
    case Kind::UInt: return fmt::format("UInt({})", u_);
    case Kind::Bool: return fmt::format("Bool({})", u_ != 0);
  }
  return "?";
}

}  // namespace kiln::ir

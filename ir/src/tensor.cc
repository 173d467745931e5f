#include "kiln/ir/tensor.h"

#include <fmt/format.h>

namespace kiln::ir {

const char* status_name(TensorStatus s) {
  switch (s) {
    case TensorStatus::ReadOnly: return "ReadOnly";
    case TensorStatus::ReadWrite: return "ReadWrite";
    case TensorStatus::NotInit: return "NotInit";
  }
  return "?";
}

std::string TensorIr::to_string() const {
  return fmt::format("t{}:{}{}", id.value(), dtype.name(), shape_to_string(shape));
}

}  // namespace kiln::ir

#include "kiln/base/result.h"

namespace kiln {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::RankMismatch: return "RankMismatch";
    case ErrorCode::IncompatibleDims: return "IncompatibleDims";
    case ErrorCode::OutOfBounds: return "OutOfBounds";
    case ErrorCode::IncompatibleShapes: return "IncompatibleShapes";
    case ErrorCode::Invalid: return "Invalid";
    case ErrorCode::DTypeMismatch: return "DTypeMismatch";
    case ErrorCode::Unsupported: return "Unsupported";
    case ErrorCode::Decode: return "Decode";
    case ErrorCode::InvalidHandle: return "InvalidHandle";
    case ErrorCode::Execution: return "Execution";
    case ErrorCode::ResourceExhausted: return "ResourceExhausted";
    case ErrorCode::Config: return "Config";
    case ErrorCode::Internal: return "Internal";
  }
  return "Unknown";
}

std::string Error::to_string() const { return std::string(error_code_name(code)) + ": " + message; }

}  // namespace kiln

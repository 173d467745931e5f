#include "kiln/base/bytes.h"

#include <fmt/format.h>

namespace kiln {

bool ByteReader::fail(std::size_t at, std::string message) {
  if (!failed_) {
    failed_ = true;
    error_offset_ = at;
    error_ = std::move(message);
  }
  return false;
}

bool ByteReader::wrap(std::string_view context) {
  error_ = fmt::format("{}: {}", context, error_);
  return false;
}

bool ByteReader::truncated(std::size_t n, const char* what) {
  return fail(fmt::format("truncated input: {} needs {} byte(s), {} left", what, n, remaining()));
}

bool ByteReader::boolean(bool& v, const char* what) {
  const std::size_t at = offset();
  std::uint8_t b = 0;
  if (!u8(b, what)) return false;
  if (b > 1) return fail(at, fmt::format("{} is {}, not 0 or 1", what, b));
  v = b == 1;
  return true;
}

bool ByteReader::bad_varint(std::size_t start, const char* what, std::size_t byte, VarintProblem problem) {
  const std::size_t at = base_ + start;
  switch (problem) {
    case VarintProblem::Truncated:
      return fail(at, fmt::format("truncated input: {} (varint) ends after {} byte(s)", what, byte));
    case VarintProblem::Overflow: return fail(at, fmt::format("{} (varint) exceeds 64 bits", what));
    case VarintProblem::NotShortest: return fail(at, fmt::format("{} (varint) is not in its shortest form", what));
    case VarintProblem::TooLong: break;
  }
  return fail(at, fmt::format("{} (varint) is too long", what));
}

bool ByteReader::bad_count(std::size_t at, const char* what, std::uint64_t v, std::size_t min_bytes, std::size_t cap) {
  if (v > cap) return fail(at, fmt::format("{} {} exceeds the limit of {}", what, v, cap));
  return fail(at, fmt::format("{} {} cannot fit in the {} remaining byte(s) (each needs at least {})", what, v,
                              remaining(), min_bytes));
}

bool ByteReader::unknown_enum(std::size_t at, const char* what, std::uint8_t v, std::uint8_t max) {
  return fail(at, fmt::format("unknown {} {} (largest is {})", what, v, max));
}

}  // namespace kiln

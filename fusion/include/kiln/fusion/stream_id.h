// StreamId: the name of one stream of a device (docs/spec/fusion.md §16.1). Its own header so
// that client code (runtime/session.h) names streams without the fusion search's headers.
#pragma once

#include <compare>
#include <cstdint>

namespace kiln::fusion {

class StreamId {
 public:
  constexpr explicit StreamId(std::uint64_t v) : value_(v) {}
  constexpr std::uint64_t value() const { return value_; }
  // User-pinned streams never collide with implicit ids (docs/spec/fusion.md §16.1).
  static constexpr StreamId from_number(std::uint64_t n) { return StreamId(n | (std::uint64_t{1} << 63)); }
  friend constexpr auto operator<=>(StreamId, StreamId) = default;

 private:
  std::uint64_t value_;
};

}  // namespace kiln::fusion

#include "kiln/ipc/arena.h"

#include <cstring>
#include <iterator>
#include <string>

namespace kiln::ipc {

namespace {
std::string range_text(ArenaRange r) { return "[" + std::to_string(r.offset) + ", +" + std::to_string(r.length) + ")"; }
}  // namespace

Result<std::span<std::uint8_t>> ArenaView::slice(ArenaRange r) const {
  if (!range_fits(r, bytes_.size())) {
    return make_error(ErrorCode::OutOfBounds, "arena range " + range_text(r) + " is outside the arena of " +
                                                  std::to_string(bytes_.size()) + " bytes");
  }
  return bytes_.subspan(static_cast<std::size_t>(r.offset), static_cast<std::size_t>(r.length));
}

Status ArenaView::write(ArenaRange r, std::span<const std::uint8_t> src) const {
  KILN_ASSIGN_OR_RETURN(auto dst, slice(r));
  if (src.size() > dst.size()) {
    return make_error(ErrorCode::OutOfBounds,
                      "arena write of " + std::to_string(src.size()) + " bytes into range " + range_text(r));
  }
  if (!src.empty()) std::memcpy(dst.data(), src.data(), src.size());
  return Status::Ok();
}

Status ArenaView::read(ArenaRange r, std::span<std::uint8_t> out) const {
  KILN_ASSIGN_OR_RETURN(auto src, slice(r));
  if (out.size() > src.size()) {
    return make_error(ErrorCode::OutOfBounds,
                      "arena read of " + std::to_string(out.size()) + " bytes from range " + range_text(r));
  }
  if (!out.empty()) std::memcpy(out.data(), src.data(), out.size());
  return Status::Ok();
}

ArenaAllocator::ArenaAllocator(std::uint64_t arena_size, std::uint64_t alignment)
    : size_(arena_size / alignment * alignment), alignment_(alignment), free_bytes_(size_) {
  if (size_ > 0) free_.emplace(0, size_);
}

std::optional<ArenaRange> ArenaAllocator::allocate(std::uint64_t length) {
  if (length == 0 || length > size_) return std::nullopt;
  const std::uint64_t want = (length + alignment_ - 1) / alignment_ * alignment_;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const std::uint64_t off = it->first;
    const std::uint64_t rest = it->second - want;
    free_.erase(it);
    if (rest > 0) free_.emplace(off + want, rest);
    used_.emplace(off, want);
    free_bytes_ -= want;
    return ArenaRange{off, length};
  }
  return std::nullopt;
}

Status ArenaAllocator::free(ArenaRange r) {
  auto u = used_.find(r.offset);
  if (u == used_.end() || r.length == 0 || r.length > u->second) {
    return make_error(ErrorCode::Invalid, "arena free of " + range_text(r) + ": not an allocated range");
  }
  std::uint64_t off = u->first;
  std::uint64_t len = u->second;
  used_.erase(u);
  free_bytes_ += len;
  // Coalesce with the neighbours so a fragmented arena heals as ranges come back.
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return Status::Ok();
    }
  }
  free_.emplace(off, len);
  return Status::Ok();
}

}  // namespace kiln::ipc

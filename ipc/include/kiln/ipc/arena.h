// The transfer arena: the part of the segment that carries tensor bytes for uploads and reads.
//
// Ownership protocol (one allocator, on the client, in client-private memory):
//   - The client allocates every range (ArenaAllocator) and names it in a command: Upload
//     (bytes the client wrote) or Read (room for the daemon to write into).
//   - From the push of that command until its completion arrives, the range belongs to the
//     daemon; the client must not touch it. The daemon copies upload bytes out of the arena
//     before using them, and writes read results only inside the named range.
//   - When the completion (Ok / Error / ReadDone) for that request arrives, the range is the
//     client's again; the client copies read results out and frees the range.
// Nothing about allocation lives in shared memory, so there is no allocator state for a peer
// to corrupt: the daemon only checks each named range against the arena size (ArenaView), and a
// client that lies about its ranges only corrupts its own data.
//
// Thread-safety: ArenaView is a non-owning view, usable from any thread that owns the range it
// touches. ArenaAllocator is not thread-safe: the client library guards it with its own lock.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>

#include "kiln/base/result.h"

namespace kiln::ipc {

// A byte range in the arena: offsets are relative to the arena start.
struct ArenaRange {
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
  friend bool operator==(const ArenaRange&, const ArenaRange&) = default;
};

// True if [offset, offset + length) lies within an arena of `arena_size` bytes (overflow-safe).
constexpr bool range_fits(ArenaRange r, std::uint64_t arena_size) {
  return r.offset <= arena_size && r.length <= arena_size - r.offset;
}

// Bounds-checked access to the arena bytes of a mapped segment.
class ArenaView {
 public:
  ArenaView() = default;
  explicit ArenaView(std::span<std::uint8_t> bytes) : bytes_(bytes) {}

  std::uint64_t size() const { return bytes_.size(); }
  // The bytes of `r`, or ErrorCode::OutOfBounds ("arena range [10, +20) is outside the arena of
  // 16 bytes"). The span points into shared memory: copy out before validating anything in it.
  Result<std::span<std::uint8_t>> slice(ArenaRange r) const;
  // Copies `src` to the start of `r` (src.size() <= r.length).
  Status write(ArenaRange r, std::span<const std::uint8_t> src) const;
  // Copies the first out.size() bytes of `r` into `out` (out.size() <= r.length).
  Status read(ArenaRange r, std::span<std::uint8_t> out) const;

 private:
  std::span<std::uint8_t> bytes_;
};

// First-fit allocator over [0, arena_size) with coalescing free list. Every range is aligned to
// `alignment` (64 by default: a cache line, and enough for every dtype and for SIMD copies).
class ArenaAllocator {
 public:
  explicit ArenaAllocator(std::uint64_t arena_size, std::uint64_t alignment = 64);

  // A free range of at least `length` bytes (rounded up to the alignment), or nullopt when no
  // free run is large enough now: wait for completions to return ranges, then retry. A length
  // above the arena size can never succeed (check it with capacity()).
  std::optional<ArenaRange> allocate(std::uint64_t length);
  // Returns a range from allocate() (exactly as returned). Error (ErrorCode::Invalid) for a range
  // that is not currently allocated: a double free or a forged range.
  Status free(ArenaRange r);

  std::uint64_t capacity() const { return size_; }
  std::uint64_t bytes_free() const { return free_bytes_; }
  std::size_t ranges_in_use() const { return used_.size(); }

 private:
  std::uint64_t size_;
  std::uint64_t alignment_;
  std::uint64_t free_bytes_;
  std::map<std::uint64_t, std::uint64_t> free_;  // offset -> length, coalesced, non-adjacent
  std::map<std::uint64_t, std::uint64_t> used_;  // offset -> rounded length
};

}  // namespace kiln::ipc

// HostAllocator and HostBuffer: the CPU device's memory, 64-byte aligned blocks pooled by size
// class, with statistics and an optional byte limit reported as an error value.
//
// Thread-safety: HostAllocator is safe to use from any number of threads at once (the streams of
// one device allocate concurrently): each size class has its own mutex around its free list,
// and the statistics are atomics; releasing idle blocks (release_idle) may run concurrently with
// allocation from any thread. A HostBuffer is owned by one thread at a time (it is move-only);
// share it as std::shared_ptr<HostBuffer> (several tensor handles aliasing one buffer), whose
// last owner returns the block to the pool from whatever thread drops it. Buffers keep the pool
// alive: an allocator may be destroyed while buffers it handed out are still in use.
//
// Usage:
//   kiln::reference::HostAllocator alloc({.byte_limit = 1ull << 30});
//   auto buf = alloc.allocate(4096);                 // Result<HostBuffer>
//   if (!buf) return buf.error();                     // ResourceExhausted: names requested/available
//   std::memset(buf->data(), 0, buf->size());
//   auto shared = alloc.allocate_shared(256);         // Result<std::shared_ptr<HostBuffer>>
//   alloc.stats().pool_hits;                          // a later allocate(4096) reuses the block
//   alloc.release_idle();                             // an owner's maintenance timer: large blocks
//                                                     // idle past large_block_retention go back
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>

#include "kiln/base/result.h"

namespace kiln::reference {

// 64 bytes: one cache line on x86-64 and AArch64, and the width of an AVX-512 vector, so a
// vectorised kernel may use aligned loads from the start of every buffer and two buffers never
// share a cache line (no false sharing between streams).
inline constexpr std::size_t kHostAlignment = 64;

struct HostAllocatorOptions {
  // Most bytes handed out at once (sum of the size classes of live buffers); none = unlimited.
  // A request that would exceed it fails with ErrorCode::ResourceExhausted.
  std::optional<std::uint64_t> byte_limit;
  // Most bytes kept in the pools for reuse; a freed block beyond it goes back to the system.
  // 1 GiB is a round bound, not a measurement: large enough to keep the temporaries of a few
  // training steps of the models kiln targets resident, small enough that an idle daemon does
  // not hold much more than its live tensors. Configurable; 0 disables pooling.
  std::uint64_t max_cached_bytes = std::uint64_t{1} << 30;
  // A freed block whose size class is at least this is "large": it is pooled for at most
  // large_block_retention, then goes back to the system, so that one big transfer or a burst of
  // big temporaries does not stay resident in an idle daemon. 16 MiB: every large block is then
  // a mapping of its own (at least kHugePageThreshold, see system_allocate in memory.cc), so
  // releasing it really returns its pages whatever glibc's heap does; and mapping a fresh one
  // again costs page faults that are small beside the work a kernel does over 16 MiB, while the
  // many smaller temporaries of a step stay pooled (bounded by max_cached_bytes) as before.
  std::uint64_t large_block_bytes = std::uint64_t{16} << 20;
  // How long a freed large block stays pooled for reuse. 2 s is a round bound, not a
  // measurement: longer than the gap between two training steps of the models kiln targets (so
  // a steady loop keeps hitting the pool), short enough that an idle daemon falls back to its
  // live tensors within seconds. Expired blocks are released lazily by later allocate/free
  // calls and by release_idle(), which an owner calls from a timer so that an allocator nobody
  // calls also gives them back. 0 (or negative) = large blocks are never pooled.
  std::chrono::milliseconds large_block_retention{2000};
};

struct HostAllocatorStats {
  std::uint64_t bytes_in_use = 0;    // size classes of the live buffers
  std::uint64_t peak_bytes = 0;      // highest bytes_in_use seen
  std::uint64_t cached_bytes = 0;    // blocks held in the pools, ready for reuse
  std::uint64_t pool_hits = 0;       // allocations served from a pool
  std::uint64_t pool_misses = 0;     // allocations that asked the system
  std::uint64_t allocations = 0;     // successful allocations (hits + misses)
  std::uint64_t deallocations = 0;   // buffers returned
  std::uint64_t failures = 0;        // requests refused (limit or system)
  std::uint64_t released_bytes = 0;  // size classes given back to the system so far (from the
                                     // pools, or freed past them); what the system handed out is
                                     // bytes_in_use + cached_bytes + released_bytes
};

namespace detail {
class HostPool;
}

// A block of memory owned by exactly one HostBuffer; returned to its pool on destruction.
// size() is what was asked for; capacity() the size class actually reserved (>= size()).
class HostBuffer {
 public:
  HostBuffer() = default;  // empty: data() == nullptr, size() == 0
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  std::uint64_t size() const { return size_; }
  std::uint64_t capacity() const { return capacity_; }
  bool empty() const { return data_ == nullptr; }
  std::span<std::byte> bytes() { return {data_, static_cast<std::size_t>(size_)}; }
  std::span<const std::byte> bytes() const { return {data_, static_cast<std::size_t>(size_)}; }

 private:
  friend class detail::HostPool;
  HostBuffer(std::shared_ptr<detail::HostPool> pool, std::byte* data, std::uint64_t size, std::uint64_t capacity)
      : pool_(std::move(pool)), data_(data), size_(size), capacity_(capacity) {}
  void reset() noexcept;

  std::shared_ptr<detail::HostPool> pool_;
  std::byte* data_ = nullptr;
  std::uint64_t size_ = 0;
  std::uint64_t capacity_ = 0;
};

class HostAllocator {
 public:
  explicit HostAllocator(HostAllocatorOptions options = {});
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;
  ~HostAllocator();

  // A 64-byte aligned block of at least `bytes` bytes (contents unspecified: a pooled block keeps
  // what its previous owner wrote). Zero bytes still yields a valid, non-null minimum block.
  // Errors (ErrorCode::ResourceExhausted): over the byte limit — the message names the requested
  // bytes, the size class, the bytes in use and the available bytes — or refused by the system.
  Result<HostBuffer> allocate(std::uint64_t bytes);
  Result<std::shared_ptr<HostBuffer>> allocate_shared(std::uint64_t bytes);

  HostAllocatorStats stats() const;
  const HostAllocatorOptions& options() const;
  // Returns every cached block to the system; returns how many bytes were released.
  std::uint64_t release_cached();
  // Returns the large blocks (options().large_block_bytes) cached for at least
  // large_block_retention as of `now` to the system; returns how many bytes were released.
  // Small blocks stay while the pool is in use; once a call finds no allocation and no free
  // since a call at least large_block_retention earlier, every cached block goes (the pool is
  // idle: a daemon between jobs). Cheap when nothing is due, so an owner may call it from a
  // timer every second or so; a `now` in the future lets a test release without waiting.
  std::uint64_t release_idle(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now());

  // The size class a request of `bytes` is served from; nullopt when it exceeds the largest
  // class (kMaxAllocation).
  static std::optional<std::uint64_t> size_class(std::uint64_t bytes);
  // 2^47 bytes (128 TiB): the x86-64 user address space; nothing larger can ever be mapped.
  static constexpr std::uint64_t kMaxAllocation = std::uint64_t{1} << 47;
  // Blocks of at least 2 MiB (one x86-64 transparent huge page) are mapped with mmap and
  // advised MADV_HUGEPAGE: large tensors get huge-page backing (fewer TLB misses when kernels
  // stream through them) and a trimmed block goes straight back to the system.
  static constexpr std::uint64_t kHugePageThreshold = std::uint64_t{2} << 20;
  // Blocks of 64 KiB or more are cache-coloured: each one the system hands out starts at a
  // rotating multiple of 64 bytes within one extra page (not counted in the statistics or the
  // limit), so that kernels streaming many large tensors at once do not map them all onto the
  // same cache sets (memory.cc says why and what it measured).

 private:
  std::shared_ptr<detail::HostPool> pool_;
};

}  // namespace kiln::reference

#include "kiln/reference/memory.h"

#include "kiln/base/mutex.h"

#include <fmt/format.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <new>
#include <vector>

namespace kiln::reference {
namespace detail {
namespace {

// Size classes. Up to 256 bytes: multiples of 64 (the alignment; nothing smaller is useful).
// Above: four classes per power of two (spacing 2^(p-3) between 2^(p-1) and 2^p), so a block is
// at most 25% larger than the request -- the geometry jemalloc and tcmalloc use for the same
// reason (bounded internal fragmentation with few classes). 4 + 4 * (47 - 9 + 1) = 160 classes
// reach kMaxAllocation.
constexpr std::size_t kNumClasses = 160;

constexpr std::uint64_t round_up(std::uint64_t n, std::uint64_t g) { return (n + g - 1) / g * g; }

constexpr std::uint64_t class_of(std::uint64_t n) {
  if (n <= 256) return std::max<std::uint64_t>(kHostAlignment, round_up(n, kHostAlignment));
  const int p = std::bit_width(n - 1);  // 2^(p-1) < n <= 2^p, p >= 9
  return round_up(n, std::uint64_t{1} << (p - 3));
}

constexpr std::size_t class_index(std::uint64_t cs) {
  if (cs <= 256) return static_cast<std::size_t>(cs / kHostAlignment - 1);
  const int p = std::bit_width(cs - 1);
  const std::uint64_t g = std::uint64_t{1} << (p - 3);
  return static_cast<std::size_t>(4 + (p - 9) * 4 + static_cast<int>(cs / g) - 5);
}

// Inverse of class_index.
constexpr std::uint64_t class_size_at(std::size_t i) {
  if (i < 4) return (i + 1) * kHostAlignment;
  const std::size_t j = i - 4;
  const int p = 9 + static_cast<int>(j / 4);
  return (5 + j % 4) * (std::uint64_t{1} << (p - 3));
}

static_assert(class_of(0) == 64 && class_of(65) == 128 && class_of(257) == 320 && class_of(513) == 640);
static_assert(class_index(64) == 0 && class_index(256) == 3 && class_index(320) == 4 && class_index(512) == 7);
static_assert(class_index(HostAllocator::kMaxAllocation) == kNumClasses - 1);
static_assert(class_size_at(0) == 64 && class_size_at(4) == 320 && class_size_at(7) == 512 &&
              class_size_at(kNumClasses - 1) == HostAllocator::kMaxAllocation);

// Cache colouring. System blocks start at addresses that repeat modulo a page (mmap: at 0;
// aligned_alloc of large sizes: at its header's offset), so without it every large tensor
// begins at the same offset in a page. An elementwise kernel streaming k tensors at the same
// index then maps all k onto the same L1 sets (a 4 KiB-way cache holds 8 of them) and trips
// the core's 4 KiB load/store aliasing check on every store. Blocks of kColourThreshold bytes
// or more therefore start at a rotating colour, a multiple of 64 bytes inside one extra page.
// Measured (this repo's CPU, AVX-512): a loop over 19 input and 16 output 4 MiB streams, the
// shape of the fused Adam kernel over four parameters, 1.20 -> 0.55 ns per element; fused Adam
// over 8 parameters in kiln-bench-runtime, see docs/benchmarks.md.
// The threshold keeps the extra page at most 1/16 of the block.
constexpr std::uint64_t kColourThreshold = std::uint64_t{64} << 10;
constexpr std::uint64_t kColourSpan = 4096;  // one page: colours 0, 64, ..., 4032 bytes

// The n-th coloured block's offset: 9 lines apart (odd, so 64 consecutive blocks take all 64
// colours; not 1, so neighbours never share the 128-byte pair the adjacent-line prefetcher
// fetches together).
constexpr std::uint64_t colour_offset(std::uint64_t n) { return (n * 9 % (kColourSpan / 64)) * 64; }
static_assert(colour_offset(0) == 0 && colour_offset(1) == 576 && colour_offset(64) == 0);

bool coloured(std::uint64_t cs) { return cs >= kColourThreshold; }

// Under AddressSanitizer the colour bytes before a block and the rest of its page after it are
// poisoned, so that an access just outside a coloured tensor is still reported (the system
// allocation they belong to would otherwise make them addressable).
#if defined(__SANITIZE_ADDRESS__)
void poison_colour(std::byte* start, std::byte* data, std::uint64_t cs) {
  ASAN_POISON_MEMORY_REGION(start, static_cast<std::size_t>(data - start));
  ASAN_POISON_MEMORY_REGION(data + cs, static_cast<std::size_t>(start + cs + kColourSpan - (data + cs)));
}
void unpoison_colour(std::byte* start, std::uint64_t cs) {
  ASAN_UNPOISON_MEMORY_REGION(start, static_cast<std::size_t>(cs + kColourSpan));
}
#else
void poison_colour(std::byte*, std::byte*, std::uint64_t) {}
void unpoison_colour(std::byte*, std::uint64_t) {}
#endif

std::byte* system_allocate(std::uint64_t cs, std::uint64_t colour) {
  if (cs >= HostAllocator::kHugePageThreshold) {
    // The mapping starts on a huge-page boundary (the kernel aligns only mappings whose length
    // is a multiple of 2 MiB, which the colour page breaks): map one huge page more and unmap
    // the unaligned head and the excess tail. Without it the blocks lost their huge pages and
    // unfused Adam over 8 parameters slowed from ~17 to ~22 ms.
    const std::size_t len = static_cast<std::size_t>(cs + kColourSpan);
    const std::size_t huge = static_cast<std::size_t>(HostAllocator::kHugePageThreshold);
    void* p = ::mmap(nullptr, len + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    auto* raw = static_cast<std::byte*>(p);
    const std::size_t head = (huge - reinterpret_cast<std::uintptr_t>(raw) % huge) % huge;
    if (head != 0) ::munmap(raw, head);
    if (huge - head != 0) ::munmap(raw + head + len, huge - head);
    std::byte* base = raw + head;
#ifdef MADV_HUGEPAGE
    // Advice only: a kernel without transparent huge pages refuses it, and the block still works.
    (void)::madvise(base, len, MADV_HUGEPAGE);
#endif
    poison_colour(base, base + colour, cs);
    return base + colour;  // huge-page aligned plus a multiple of 64
  }
  if (coloured(cs)) {
    // Page aligned, so system_free finds the start again by clearing the colour bits.
    auto* p = static_cast<std::byte*>(std::aligned_alloc(kColourSpan, static_cast<std::size_t>(cs + kColourSpan)));
    if (p == nullptr) return nullptr;
    poison_colour(p, p + colour, cs);
    return p + colour;
  }
  // cs is a multiple of 64, as aligned_alloc requires.
  return static_cast<std::byte*>(std::aligned_alloc(kHostAlignment, static_cast<std::size_t>(cs)));
}

void system_free(std::byte* p, std::uint64_t cs) noexcept {
  if (coloured(cs)) {
    const std::uintptr_t colour = reinterpret_cast<std::uintptr_t>(p) % kColourSpan;
    p -= colour;
    unpoison_colour(p, cs);
  }
  if (cs >= HostAllocator::kHugePageThreshold) {
    ::munmap(p, static_cast<std::size_t>(cs + kColourSpan));
  } else {
    std::free(p);
  }
}

void update_max(std::atomic<std::uint64_t>& target, std::uint64_t value) {
  std::uint64_t cur = target.load(std::memory_order_relaxed);
  while (cur < value && !target.compare_exchange_weak(cur, value, std::memory_order_relaxed)) {
  }
}

void update_min(std::atomic<std::int64_t>& target, std::int64_t value) {
  std::int64_t cur = target.load(std::memory_order_relaxed);
  while (cur > value && !target.compare_exchange_weak(cur, value, std::memory_order_relaxed)) {
  }
}

// Blocks below kHugePageThreshold come from glibc's heap: freeing them puts them on its free
// lists, and only malloc_trim hands the pages back. It walks every arena under its lock, so it
// runs only when a release freed at least this much heap memory: 16 MiB (the default large
// block) is well above the noise of a daemon's baseline and rare enough to make the walk cheap.
constexpr std::uint64_t kTrimBytes = std::uint64_t{16} << 20;

void trim_heap(std::uint64_t heap_bytes_freed) noexcept {
#if defined(__GLIBC__)
  if (heap_bytes_freed >= kTrimBytes) (void)::malloc_trim(0);
#else
  (void)heap_bytes_freed;
#endif
}

bool from_heap(std::uint64_t cs) { return cs < HostAllocator::kHugePageThreshold; }

std::int64_t to_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// The retention in nanoseconds, saturated (milliseconds::max() would overflow the conversion).
std::int64_t retention_ns(std::chrono::milliseconds retention) {
  constexpr std::int64_t kMaxMs = std::numeric_limits<std::int64_t>::max() / 1'000'000;
  if (retention.count() <= 0) return 0;
  if (retention.count() >= kMaxMs) return std::numeric_limits<std::int64_t>::max();
  return retention.count() * 1'000'000;
}

// now - since >= retention, without overflow for any `now` a caller passes (`since` is a real
// steady_clock reading, so not negative).
bool held_at_least(std::int64_t now_ns, std::int64_t since_ns, std::int64_t retention) {
  return now_ns >= since_ns && now_ns - since_ns >= retention;
}

}  // namespace

// The shared state behind a HostAllocator and every buffer it handed out.
//
// Memory orders: every counter is a statistic or a budget; none publishes memory to another
// thread (the blocks themselves travel under the size-class mutex, or inside the HostBuffer that
// the caller hands over with its own synchronisation), so relaxed atomic read-modify-writes
// suffice: they keep each counter exact, which is all the byte limit needs.
class HostPool : public std::enable_shared_from_this<HostPool> {
 public:
  explicit HostPool(HostAllocatorOptions options)
      : options_(options), retention_ns_(retention_ns(options.large_block_retention)) {
    for (std::size_t i = 0; i < kNumClasses; ++i) classes_[i].size = class_size_at(i);
    while (first_large_ < kNumClasses && classes_[first_large_].size < options_.large_block_bytes) ++first_large_;
  }
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;
  ~HostPool() { release_cached(); }

  Result<HostBuffer> allocate(std::uint64_t bytes) {
    const std::optional<std::uint64_t> cs_opt = HostAllocator::size_class(bytes);
    if (!cs_opt) {
      failures_.fetch_add(1, std::memory_order_relaxed);
      return make_error(ErrorCode::ResourceExhausted,
                        fmt::format("HostAllocator: cannot allocate {} bytes: more than the largest allocation "
                                    "({} bytes)",
                                    bytes, HostAllocator::kMaxAllocation));
    }
    const std::uint64_t cs = *cs_opt;
    if (large(cs)) release_due_large_blocks();

    // Reserve the bytes first, so that concurrent requests can never exceed the limit together.
    std::uint64_t in_use = in_use_.load(std::memory_order_relaxed);
    do {
      if (options_.byte_limit && (cs > *options_.byte_limit || in_use > *options_.byte_limit - cs)) {
        failures_.fetch_add(1, std::memory_order_relaxed);
        const std::uint64_t limit = *options_.byte_limit;
        return make_error(ErrorCode::ResourceExhausted,
                          fmt::format("HostAllocator: cannot allocate {} bytes (size class {}): {} bytes in use of "
                                      "the {} byte limit, {} bytes available",
                                      bytes, cs, in_use, limit, in_use >= limit ? 0 : limit - in_use));
      }
    } while (!in_use_.compare_exchange_weak(in_use, in_use + cs, std::memory_order_relaxed));
    update_max(peak_, in_use + cs);

    std::byte* block = pop(cs);
    if (block != nullptr) {
      hits_.fetch_add(1, std::memory_order_relaxed);
    } else {
      misses_.fetch_add(1, std::memory_order_relaxed);
      // Under a limit, cached blocks count against it too: when live plus cached bytes would pass
      // it, give the cache back before asking the system for more.
      if (options_.byte_limit && in_use + cs + cached_.load(std::memory_order_relaxed) > *options_.byte_limit)
        release_cached();
      block =
          system_allocate(cs, coloured(cs) ? colour_offset(next_colour_.fetch_add(1, std::memory_order_relaxed)) : 0);
      if (block == nullptr) {
        in_use_.fetch_sub(cs, std::memory_order_relaxed);
        failures_.fetch_add(1, std::memory_order_relaxed);
        return make_error(ErrorCode::ResourceExhausted,
                          fmt::format("HostAllocator: the system refused {} bytes (size class {}); {} bytes in use",
                                      bytes, cs, in_use));
      }
    }
    allocations_.fetch_add(1, std::memory_order_relaxed);
    return HostBuffer(shared_from_this(), block, bytes, cs);
  }

  // Called by ~HostBuffer, from any thread.
  void release(std::byte* block, std::uint64_t cs) noexcept {
    in_use_.fetch_sub(cs, std::memory_order_relaxed);
    deallocations_.fetch_add(1, std::memory_order_relaxed);
    if (closing_.load(std::memory_order_relaxed) || !push(block, cs)) {
      system_free(block, cs);
      released_.fetch_add(cs, std::memory_order_relaxed);
    }
    if (large(cs)) release_due_large_blocks();
  }

  std::uint64_t release_cached() noexcept {
    std::uint64_t released = 0;
    std::uint64_t heap_freed = 0;
    for (SizeClass& c : classes_) {
      std::vector<FreeBlock> blocks;
      {
        MutexLock lock(c.mu);
        blocks.swap(c.free);
      }
      if (blocks.empty()) continue;
      const std::uint64_t cs = c.size;
      for (const FreeBlock& b : blocks) system_free(b.data, cs);
      released += cs * blocks.size();
      if (from_heap(cs)) heap_freed += cs * blocks.size();
      cached_.fetch_sub(cs * blocks.size(), std::memory_order_relaxed);
    }
    released_.fetch_add(released, std::memory_order_relaxed);
    trim_heap(heap_freed);
    return released;
  }

  // Releases the large blocks cached for at least the retention as of `now_ns`. `wait`: block
  // until another thread's release is done (the owner's timer); otherwise (the lazy calls on the
  // allocation path) leave the work to that thread.
  // The owner's timer, after release_idle: a pool that saw no allocation and no free for the
  // retention (an idle daemon) gives back its small blocks too, so a process's resident memory
  // returns near its baseline after a workload, not only after large transfers. Counting the
  // operations keeps the allocation path free of any clock read for this.
  std::uint64_t release_if_idle(std::int64_t now_ns) noexcept {
    const std::uint64_t ops =
        allocations_.load(std::memory_order_relaxed) + deallocations_.load(std::memory_order_relaxed);
    {
      MutexLock lock(idle_mu_);
      if (ops != idle_ops_ || idle_since_ns_ > now_ns) {
        idle_ops_ = ops;
        idle_since_ns_ = now_ns;
        return 0;
      }
      if (!held_at_least(now_ns, idle_since_ns_, retention_ns_)) return 0;
    }
    if (cached_.load(std::memory_order_relaxed) == 0) return 0;
    return release_cached();
  }

  std::uint64_t release_idle(std::int64_t now_ns, bool wait) noexcept {
    if (!large_block_due(now_ns)) return 0;
    std::unique_lock<std::mutex> releasing(release_mu_, std::defer_lock);
    if (wait) {
      releasing.lock();
    } else if (!releasing.try_lock()) {
      return 0;
    }
    // Forget the hint, then rebuild it from what each class keeps. A block pushed into a class
    // after the scan below passed it lowers the hint after this store (the class mutex orders
    // the two), one pushed before is seen by the scan: either way no cached block is left later
    // than the hint, so none stays resident past its retention for want of a check.
    oldest_large_ns_.store(kNoLargeBlock, std::memory_order_relaxed);
    std::uint64_t released = 0;
    std::uint64_t heap_freed = 0;
    for (std::size_t i = first_large_; i < kNumClasses; ++i) {
      SizeClass& c = classes_[i];
      std::int64_t oldest_kept = kNoLargeBlock;
      std::size_t freed = 0;
      {
        // The blocks are unmapped under the class mutex: the lists are short (a few blocks of a
        // class at most), the release is rare (once per retention at most), and compacting in
        // place keeps this path free of allocation (it runs inside ~HostBuffer).
        MutexLock lock(c.mu);
        std::size_t kept = 0;
        for (const FreeBlock& b : c.free) {
          if (held_at_least(now_ns, b.freed_ns, retention_ns_)) {
            system_free(b.data, c.size);
            ++freed;
          } else {
            oldest_kept = std::min(oldest_kept, b.freed_ns);
            c.free[kept++] = b;
          }
        }
        c.free.resize(kept);
      }
      if (oldest_kept != kNoLargeBlock) update_min(oldest_large_ns_, oldest_kept);
      if (freed == 0) continue;
      released += c.size * freed;
      if (from_heap(c.size)) heap_freed += c.size * freed;
      cached_.fetch_sub(c.size * freed, std::memory_order_relaxed);
    }
    released_.fetch_add(released, std::memory_order_relaxed);
    trim_heap(heap_freed);
    return released;
  }

  // The allocator is gone: from now on freed blocks go straight back to the system.
  void close() noexcept {
    closing_.store(true, std::memory_order_relaxed);
    release_cached();
  }

  HostAllocatorStats stats() const {
    HostAllocatorStats s;
    s.bytes_in_use = in_use_.load(std::memory_order_relaxed);
    s.peak_bytes = peak_.load(std::memory_order_relaxed);
    s.cached_bytes = cached_.load(std::memory_order_relaxed);
    s.pool_hits = hits_.load(std::memory_order_relaxed);
    s.pool_misses = misses_.load(std::memory_order_relaxed);
    s.allocations = allocations_.load(std::memory_order_relaxed);
    s.deallocations = deallocations_.load(std::memory_order_relaxed);
    s.failures = failures_.load(std::memory_order_relaxed);
    s.released_bytes = released_.load(std::memory_order_relaxed);
    return s;
  }

  const HostAllocatorOptions& options() const { return options_; }

 private:
  struct FreeBlock {
    std::byte* data;
    std::int64_t freed_ns;  // steady_clock time it was pooled; large classes only (else 0)
  };
  struct SizeClass {
    Mutex mu;
    std::vector<FreeBlock> free KILN_GUARDED_BY(mu);  // the most recently freed last (reused first)
    std::uint64_t size = 0;                           // the class size; set once at construction, then read-only
  };

  static constexpr std::int64_t kNoLargeBlock = std::numeric_limits<std::int64_t>::max();

  bool large(std::uint64_t cs) const { return cs >= options_.large_block_bytes; }

  // Whether some cached large block may have outlived the retention: reads only the hint.
  bool large_block_due(std::int64_t now_ns) const {
    const std::int64_t oldest = oldest_large_ns_.load(std::memory_order_relaxed);
    return oldest != kNoLargeBlock && held_at_least(now_ns, oldest, retention_ns_);
  }

  // The lazy check on a large block's allocate and free: one relaxed load while no large block is
  // cached, a clock read while one is. Only there: a small block's path (a kernel's temporaries)
  // stays free of clock reads, and the owner's timer (release_idle) covers a pool whose large
  // classes go quiet.
  void release_due_large_blocks() noexcept {
    if (oldest_large_ns_.load(std::memory_order_relaxed) == kNoLargeBlock) return;
    (void)release_idle(to_ns(std::chrono::steady_clock::now()), /*wait=*/false);
  }

  std::byte* pop(std::uint64_t cs) {
    SizeClass& c = classes_[class_index(cs)];
    MutexLock lock(c.mu);
    if (c.free.empty()) return nullptr;
    std::byte* b = c.free.back().data;
    c.free.pop_back();
    cached_.fetch_sub(cs, std::memory_order_relaxed);
    // The hint may now be older than every block left: the next release scan corrects it.
    return b;
  }

  // Keeps the block if the cache has room; false = the caller frees it.
  bool push(std::byte* block, std::uint64_t cs) noexcept {
    const bool is_large = large(cs);
    if (is_large && retention_ns_ == 0) return false;
    if (cached_.fetch_add(cs, std::memory_order_relaxed) + cs > options_.max_cached_bytes) {
      cached_.fetch_sub(cs, std::memory_order_relaxed);
      return false;
    }
    SizeClass& c = classes_[class_index(cs)];
    try {
      MutexLock lock(c.mu);
      const std::int64_t now = is_large ? to_ns(std::chrono::steady_clock::now()) : 0;
      c.free.push_back(FreeBlock{block, now});
      // Under the class mutex, so that release_idle's scan either sees the block or its reset
      // of the hint comes first (see there).
      if (is_large) update_min(oldest_large_ns_, now);
      return true;
    } catch (...) {  // the free list could not grow: give the block back instead
      cached_.fetch_sub(cs, std::memory_order_relaxed);
      return false;
    }
  }

  const HostAllocatorOptions options_;
  const std::int64_t retention_ns_;  // options_.large_block_retention, saturated; 0 = never pool
  std::size_t first_large_ = 0;      // index of the first large class (kNumClasses: none)
  std::array<SizeClass, kNumClasses> classes_;
  std::mutex release_mu_;                                     // one release_idle scan at a time
  Mutex idle_mu_;                                             // release_if_idle's two below
  std::uint64_t idle_ops_ KILN_GUARDED_BY(idle_mu_) = 0;      // allocations + frees at the last idle check
  std::int64_t idle_since_ns_ KILN_GUARDED_BY(idle_mu_) = 0;  // when that count was first seen
  // The steady_clock time (ns) no later than the freeing of every cached large block;
  // kNoLargeBlock when none is cached. A hint: it may be older than the truth (after a pop).
  std::atomic<std::int64_t> oldest_large_ns_{kNoLargeBlock};
  std::atomic<bool> closing_{false};
  std::atomic<std::uint64_t> next_colour_{0};  // coloured blocks handed out by the system so far
  std::atomic<std::uint64_t> in_use_{0};
  std::atomic<std::uint64_t> peak_{0};
  std::atomic<std::uint64_t> cached_{0};
  std::atomic<std::uint64_t> hits_{0};
  std::atomic<std::uint64_t> misses_{0};
  std::atomic<std::uint64_t> allocations_{0};
  std::atomic<std::uint64_t> deallocations_{0};
  std::atomic<std::uint64_t> failures_{0};
  std::atomic<std::uint64_t> released_{0};
};

}  // namespace detail

// ---- HostBuffer

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : pool_(std::move(other.pool_)), data_(other.data_), size_(other.size_), capacity_(other.capacity_) {
  other.data_ = nullptr;
  other.size_ = 0;
  other.capacity_ = 0;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = std::move(other.pool_);
    data_ = other.data_;
    size_ = other.size_;
    capacity_ = other.capacity_;
    other.data_ = nullptr;
    other.size_ = 0;
    other.capacity_ = 0;
  }
  return *this;
}

HostBuffer::~HostBuffer() { reset(); }

void HostBuffer::reset() noexcept {
  if (data_ != nullptr && pool_) pool_->release(data_, capacity_);
  pool_.reset();
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
}

// ---- HostAllocator

HostAllocator::HostAllocator(HostAllocatorOptions options) : pool_(std::make_shared<detail::HostPool>(options)) {}

HostAllocator::~HostAllocator() { pool_->close(); }

Result<HostBuffer> HostAllocator::allocate(std::uint64_t bytes) { return pool_->allocate(bytes); }

Result<std::shared_ptr<HostBuffer>> HostAllocator::allocate_shared(std::uint64_t bytes) {
  KILN_ASSIGN_OR_RETURN(HostBuffer buffer, pool_->allocate(bytes));
  return std::make_shared<HostBuffer>(std::move(buffer));
}

HostAllocatorStats HostAllocator::stats() const { return pool_->stats(); }

const HostAllocatorOptions& HostAllocator::options() const { return pool_->options(); }

std::uint64_t HostAllocator::release_cached() { return pool_->release_cached(); }

std::uint64_t HostAllocator::release_idle(std::chrono::steady_clock::time_point now) {
  const std::int64_t now_ns = detail::to_ns(now);
  const std::uint64_t large = pool_->release_idle(now_ns, /*wait=*/true);
  return large + pool_->release_if_idle(now_ns);
}

std::optional<std::uint64_t> HostAllocator::size_class(std::uint64_t bytes) {
  if (bytes > kMaxAllocation) return std::nullopt;
  return detail::class_of(bytes);
}

}  // namespace kiln::reference

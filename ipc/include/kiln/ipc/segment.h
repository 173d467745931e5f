// The per-client shared-memory segment: a sealed memfd holding a fixed header, the command ring
// (client -> daemon), the completion ring (daemon -> client) and the transfer arena.
//
//   offset 0                     SegmentHeader (128 bytes, all fields little-endian native u32/u64)
//   command_ring_offset          RingControl (256 bytes) then command_ring_capacity data bytes
//   completion_ring_offset       RingControl (256 bytes) then completion_ring_capacity data bytes
//   arena_offset (page aligned)  arena_size bytes
//
// No pointers live in shared memory: every position is an offset from the segment start. The
// daemon creates the segment (Segment::create), fills the header, seals the memfd against
// shrinking and growing (a peer that could shrink it would turn our accesses into SIGBUS), and
// passes the fd to the client, which maps it (Segment::attach) and validates the header before
// trusting any of it. After that, each side uses only its private copy of the layout
// (Segment::layout()), never the header in shared memory, which the peer can rewrite.
//
// Thread-safety: a Segment is a value owned by one connection object; the memory it maps is
// shared with the peer process and accessed only through RingProducer/RingConsumer (ring.h)
// and ArenaView (arena.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kiln/base/result.h"
#include "kiln/ipc/fd.h"

namespace kiln::ipc {

inline constexpr std::uint32_t kSegmentMagic = 0x4D48534B;  // "KSHM" little-endian
inline constexpr std::uint32_t kLayoutVersion = 1;
inline constexpr std::size_t kCacheLine = 64;  // x86-64 and most aarch64 parts

// Ring capacities: powers of two in [kMinRingBytes, kMaxRingBytes]. The minimum keeps room for
// several records of the largest fixed-size messages; the maximum bounds what one client pins.
inline constexpr std::uint64_t kMinRingBytes = 4096;
inline constexpr std::uint64_t kMaxRingBytes = std::uint64_t{1} << 26;   // 64 MiB
inline constexpr std::uint64_t kMaxArenaBytes = std::uint64_t{1} << 36;  // 64 GiB
inline constexpr std::uint64_t kArenaAlignment = 4096;                   // page: the arena can be madvised

struct SegmentConfig {
  // Defaults: commands are small (a registered op encodes to ~100 bytes), so 1 MiB holds
  // thousands of queued ops; completions are smaller still; the arena holds a few typical
  // activations (64 MiB). Larger transfers move through it in parts (see docs/ipc.md).
  std::uint64_t command_ring_bytes = std::uint64_t{1} << 20;
  std::uint64_t completion_ring_bytes = std::uint64_t{1} << 18;
  std::uint64_t arena_bytes = std::uint64_t{64} << 20;
};

// The header at offset 0 of the segment. Plain integers: written once by the daemon before the
// segment is shared, read (copied) once by the client.
struct SegmentHeader {
  std::uint32_t magic;
  std::uint32_t layout_version;
  std::uint64_t total_size;
  std::uint64_t header_size;  // sizeof(SegmentHeader)
  std::uint64_t command_ring_offset;
  std::uint64_t command_ring_capacity;
  std::uint64_t completion_ring_offset;
  std::uint64_t completion_ring_capacity;
  std::uint64_t arena_offset;
  std::uint64_t arena_size;
  std::uint64_t reserved[7];  // zero in version 1
};
static_assert(sizeof(SegmentHeader) == 128);

// Control block at the start of each ring region. Each index on its own cache line so the
// producer's and consumer's writes do not false-share; the two sleep flags likewise.
struct RingControl {
  alignas(kCacheLine) std::atomic<std::uint64_t> head;               // bytes ever published; producer writes
  alignas(kCacheLine) std::atomic<std::uint64_t> tail;               // bytes ever consumed; consumer writes
  alignas(kCacheLine) std::atomic<std::uint32_t> consumer_sleeping;  // consumer writes, producer reads
  alignas(kCacheLine) std::atomic<std::uint32_t> producer_waiting;   // producer writes, consumer reads
};
static_assert(sizeof(RingControl) == 4 * kCacheLine);
// Lock-free atomics are address-free, which is what makes them valid across processes.
static_assert(std::atomic<std::uint64_t>::is_always_lock_free);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free);
static_assert(sizeof(std::atomic<std::uint64_t>) == 8 && alignof(std::atomic<std::uint64_t>) == 8);

// Where everything is, as offsets from the segment start: the private copy each side uses.
struct SegmentLayout {
  std::uint64_t total_size = 0;
  std::uint64_t command_ring_offset = 0;  // of its RingControl; data follows it
  std::uint64_t command_ring_capacity = 0;
  std::uint64_t completion_ring_offset = 0;
  std::uint64_t completion_ring_capacity = 0;
  std::uint64_t arena_offset = 0;
  std::uint64_t arena_size = 0;
  friend bool operator==(const SegmentLayout&, const SegmentLayout&) = default;
};

// Layout for a config; an error (ErrorCode::Invalid) names the bad field ("command_ring_bytes
// 5000 is not a power of two in [4096, 67108864]").
Result<SegmentLayout> compute_layout(const SegmentConfig& config);

// The header bytes for a layout.
SegmentHeader make_header(const SegmentLayout& layout);

// Validates a header copied out of a mapping of `file_size` bytes: magic, version, sizes,
// alignment, that each region lies inside the segment, in order, without overlap, and that the
// reserved words are zero. Errors are ErrorCode::Decode and name the field:
//   "segment header: layout version 2, expected 1"
//   "segment header: arena [69632, +67108864) extends past the segment end (1000000)"
Result<SegmentLayout> validate_header(const SegmentHeader& header, std::uint64_t file_size);

// Owns an mmap'ed range; unmaps on destruction. Copying is deleted; moving keeps the address.
class Mapping {
 public:
  Mapping() = default;
  Mapping(void* addr, std::size_t size) : addr_(addr), size_(size) {}
  ~Mapping() { reset(); }
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  std::uint8_t* data() const { return static_cast<std::uint8_t*>(addr_); }
  std::size_t size() const { return size_; }
  void reset();

 private:
  void* addr_ = nullptr;
  std::size_t size_ = 0;
};

// A region of one ring inside a mapping (non-owning; valid while the Segment lives).
struct RingRegion {
  RingControl* control = nullptr;
  std::uint8_t* data = nullptr;
  std::uint64_t capacity = 0;  // power of two
};

class Segment {
 public:
  // Daemon side: memfd_create(MFD_CLOEXEC | MFD_ALLOW_SEALING), ftruncate, seal shrink, grow
  // and further sealing, map, write the header and construct both ring control blocks.
  // `debug_name` shows in /proc/<pid>/fd (it is not a path: nothing appears in /dev/shm).
  static Result<Segment> create(const SegmentConfig& config, const std::string& debug_name = "kiln-segment");
  // Client side: checks the seals (F_SEAL_SHRINK | F_SEAL_GROW present) and the size, maps the
  // whole file, copies the header out, validates it, and checks that the indices the client
  // owns are fresh (command ring unused, completion ring unconsumed).
  static Result<Segment> attach(UniqueFd memfd);

  Segment(Segment&&) noexcept = default;
  Segment& operator=(Segment&&) noexcept = default;

  int fd() const { return fd_.get(); }
  const SegmentLayout& layout() const { return layout_; }
  RingRegion command_ring() const;
  RingRegion completion_ring() const;
  std::span<std::uint8_t> arena_bytes() const;
  // The whole mapping (tests use it to play a hostile peer).
  std::span<std::uint8_t> bytes() const { return {map_.data(), map_.size()}; }

 private:
  Segment(UniqueFd fd, Mapping map, SegmentLayout layout) : fd_(std::move(fd)), map_(std::move(map)), layout_(layout) {}
  UniqueFd fd_;
  Mapping map_;
  SegmentLayout layout_;
};

}  // namespace kiln::ipc

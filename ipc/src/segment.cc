#include "kiln/ipc/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <new>

namespace kiln::ipc {

namespace {

constexpr std::uint64_t kHeaderBytes = sizeof(SegmentHeader);
constexpr std::uint64_t kControlBytes = sizeof(RingControl);
// The largest segment a valid header can describe: header, two maximal rings, maximal arena,
// alignment slack. Bounds the size a client will map.
constexpr std::uint64_t kMaxSegmentBytes = kArenaAlignment * 2 + 2 * (kControlBytes + kMaxRingBytes) + kMaxArenaBytes;

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) { return (v + a - 1) / a * a; }

bool ring_capacity_ok(std::uint64_t c) { return std::has_single_bit(c) && c >= kMinRingBytes && c <= kMaxRingBytes; }

std::string range_text(std::uint64_t off, std::uint64_t len) {
  return "[" + std::to_string(off) + ", +" + std::to_string(len) + ")";
}

Error header_error(const std::string& what) { return make_error(ErrorCode::Decode, "segment header: " + what); }

RingControl* control_at(std::uint8_t* base, std::uint64_t off) {
  // The control block was constructed by the daemon (std::construct_at in create()); in the
  // client it is the same object seen through another mapping.
  return std::launder(reinterpret_cast<RingControl*>(base + off));
}

}  // namespace

Result<SegmentLayout> compute_layout(const SegmentConfig& c) {
  auto bad_ring = [](const char* field, std::uint64_t v) {
    return make_error(ErrorCode::Invalid, std::string(field) + " " + std::to_string(v) + " is not a power of two in [" +
                                              std::to_string(kMinRingBytes) + ", " + std::to_string(kMaxRingBytes) +
                                              "]");
  };
  if (!ring_capacity_ok(c.command_ring_bytes)) return bad_ring("command_ring_bytes", c.command_ring_bytes);
  if (!ring_capacity_ok(c.completion_ring_bytes)) return bad_ring("completion_ring_bytes", c.completion_ring_bytes);
  if (c.arena_bytes == 0 || c.arena_bytes % kArenaAlignment != 0 || c.arena_bytes > kMaxArenaBytes) {
    return make_error(ErrorCode::Invalid, "arena_bytes " + std::to_string(c.arena_bytes) +
                                              " must be a non-zero multiple of 4096 up to " +
                                              std::to_string(kMaxArenaBytes));
  }
  SegmentLayout l;
  l.command_ring_offset = align_up(kHeaderBytes, kCacheLine);
  l.command_ring_capacity = c.command_ring_bytes;
  l.completion_ring_offset = align_up(l.command_ring_offset + kControlBytes + l.command_ring_capacity, kCacheLine);
  l.completion_ring_capacity = c.completion_ring_bytes;
  l.arena_offset = align_up(l.completion_ring_offset + kControlBytes + l.completion_ring_capacity, kArenaAlignment);
  l.arena_size = c.arena_bytes;
  l.total_size = l.arena_offset + l.arena_size;
  return l;
}

SegmentHeader make_header(const SegmentLayout& l) {
  SegmentHeader h{};
  h.magic = kSegmentMagic;
  h.layout_version = kLayoutVersion;
  h.total_size = l.total_size;
  h.header_size = kHeaderBytes;
  h.command_ring_offset = l.command_ring_offset;
  h.command_ring_capacity = l.command_ring_capacity;
  h.completion_ring_offset = l.completion_ring_offset;
  h.completion_ring_capacity = l.completion_ring_capacity;
  h.arena_offset = l.arena_offset;
  h.arena_size = l.arena_size;
  return h;
}

Result<SegmentLayout> validate_header(const SegmentHeader& h, std::uint64_t file_size) {
  if (h.magic != kSegmentMagic) return header_error("bad magic (not a kiln segment)");
  if (h.layout_version != kLayoutVersion) {
    return header_error("layout version " + std::to_string(h.layout_version) + ", expected " +
                        std::to_string(kLayoutVersion));
  }
  if (h.header_size != kHeaderBytes) {
    return header_error("header_size " + std::to_string(h.header_size) + ", expected " + std::to_string(kHeaderBytes));
  }
  for (std::uint64_t r : h.reserved) {
    if (r != 0) return header_error("reserved word is not zero");
  }
  if (h.total_size != file_size) {
    return header_error("total_size " + std::to_string(h.total_size) + " differs from the file size " +
                        std::to_string(file_size));
  }
  // Regions must follow each other in order: header, command ring, completion ring, arena.
  // Each check bounds the offset before adding to it, so nothing can overflow.
  std::uint64_t cursor = kHeaderBytes;
  auto region = [&](const char* name, std::uint64_t off, std::uint64_t len, std::uint64_t align) -> Status {
    if (off % align != 0) {
      return header_error(std::string(name) + " offset " + std::to_string(off) + " is not " + std::to_string(align) +
                          "-byte aligned");
    }
    if (off < cursor) {
      return header_error(std::string(name) + " " + range_text(off, len) + " overlaps what precedes it (ends at " +
                          std::to_string(cursor) + ")");
    }
    if (off > h.total_size || len > h.total_size - off) {
      return header_error(std::string(name) + " " + range_text(off, len) + " extends past the segment end (" +
                          std::to_string(h.total_size) + ")");
    }
    cursor = off + len;
    return Status::Ok();
  };
  if (!ring_capacity_ok(h.command_ring_capacity)) {
    return header_error("command ring capacity " + std::to_string(h.command_ring_capacity) +
                        " is not a power of two in [4096, 2^26]");
  }
  if (!ring_capacity_ok(h.completion_ring_capacity)) {
    return header_error("completion ring capacity " + std::to_string(h.completion_ring_capacity) +
                        " is not a power of two in [4096, 2^26]");
  }
  if (h.arena_size == 0 || h.arena_size > kMaxArenaBytes) {
    return header_error("arena size " + std::to_string(h.arena_size) + " is out of range");
  }
  KILN_RETURN_IF_ERROR(
      region("command ring", h.command_ring_offset, kControlBytes + h.command_ring_capacity, kCacheLine));
  KILN_RETURN_IF_ERROR(
      region("completion ring", h.completion_ring_offset, kControlBytes + h.completion_ring_capacity, kCacheLine));
  KILN_RETURN_IF_ERROR(region("arena", h.arena_offset, h.arena_size, kArenaAlignment));
  SegmentLayout l;
  l.total_size = h.total_size;
  l.command_ring_offset = h.command_ring_offset;
  l.command_ring_capacity = h.command_ring_capacity;
  l.completion_ring_offset = h.completion_ring_offset;
  l.completion_ring_capacity = h.completion_ring_capacity;
  l.arena_offset = h.arena_offset;
  l.arena_size = h.arena_size;
  return l;
}

Mapping::Mapping(Mapping&& o) noexcept : addr_(std::exchange(o.addr_, nullptr)), size_(std::exchange(o.size_, 0)) {}

Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    reset();
    addr_ = std::exchange(o.addr_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

void Mapping::reset() {
  if (addr_ != nullptr) ::munmap(addr_, size_);
  addr_ = nullptr;
  size_ = 0;
}

namespace {
Result<Mapping> map_shared(int fd, std::uint64_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return sys_error("mmap of segment (" + std::to_string(size) + " bytes)", errno);
  return Mapping(p, size);
}
}  // namespace

Result<Segment> Segment::create(const SegmentConfig& config, const std::string& debug_name) {
  KILN_ASSIGN_OR_RETURN(const SegmentLayout layout, compute_layout(config));
  UniqueFd fd(::memfd_create(debug_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) return sys_error("memfd_create", errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(layout.total_size)) != 0) {
    return sys_error("ftruncate of segment to " + std::to_string(layout.total_size) + " bytes", errno);
  }
  // F_SEAL_SEAL too: the client cannot remove the seals, and it never needs to add any.
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return sys_error("sealing the segment", errno);
  }
  KILN_ASSIGN_OR_RETURN(Mapping map, map_shared(fd.get(), layout.total_size));
  const SegmentHeader header = make_header(layout);
  std::memcpy(map.data(), &header, sizeof header);
  // A fresh memfd is zero-filled; construct_at starts the atomics' lifetime in this process.
  std::construct_at(reinterpret_cast<RingControl*>(map.data() + layout.command_ring_offset));
  std::construct_at(reinterpret_cast<RingControl*>(map.data() + layout.completion_ring_offset));
  return Segment(std::move(fd), std::move(map), layout);
}

Result<Segment> Segment::attach(UniqueFd memfd) {
  if (!memfd) return make_error(ErrorCode::Invalid, "segment: no file descriptor");
  const int seals = ::fcntl(memfd.get(), F_GET_SEALS);
  if (seals < 0) return sys_error("segment: reading the seals (is it a memfd?)", errno);
  if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return make_error(ErrorCode::Decode, "segment: memfd is not sealed against shrinking and growing");
  }
  struct stat st {};
  if (::fstat(memfd.get(), &st) != 0) return sys_error("segment: fstat", errno);
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < kHeaderBytes || size > kMaxSegmentBytes) {
    return make_error(ErrorCode::Decode, "segment: size " + std::to_string(size) + " is out of range");
  }
  KILN_ASSIGN_OR_RETURN(Mapping map, map_shared(memfd.get(), size));
  SegmentHeader header;
  std::memcpy(&header, map.data(), sizeof header);  // copy once, validate the copy
  KILN_ASSIGN_OR_RETURN(const SegmentLayout layout, validate_header(header, size));
  // The client starts its private indices at 0 (command head, completion tail), so those must
  // be fresh; the daemon may already have published completions, so the completion head is not
  // checked here (the consumer validates it on every pop).
  RingControl* cmd = control_at(map.data(), layout.command_ring_offset);
  RingControl* cpl = control_at(map.data(), layout.completion_ring_offset);
  if (cmd->head.load(std::memory_order_acquire) != 0 || cmd->tail.load(std::memory_order_acquire) != 0 ||
      cpl->tail.load(std::memory_order_acquire) != 0) {
    return make_error(ErrorCode::Decode, "segment: rings already in use at attach (segment reused?)");
  }
  return Segment(std::move(memfd), std::move(map), layout);
}

RingRegion Segment::command_ring() const {
  return {control_at(map_.data(), layout_.command_ring_offset),
          map_.data() + layout_.command_ring_offset + kControlBytes, layout_.command_ring_capacity};
}

RingRegion Segment::completion_ring() const {
  return {control_at(map_.data(), layout_.completion_ring_offset),
          map_.data() + layout_.completion_ring_offset + kControlBytes, layout_.completion_ring_capacity};
}

std::span<std::uint8_t> Segment::arena_bytes() const {
  return {map_.data() + layout_.arena_offset, static_cast<std::size_t>(layout_.arena_size)};
}

}  // namespace kiln::ipc

// Tests for the segment (kiln/ipc/segment.h) and the arena (kiln/ipc/arena.h): layout, header
// validation against every kind of inconsistency, memfd seals, bounds-checked arena access and
// the client-side allocator.
#include "kiln/ipc/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <map>
#include <random>

#include "kiln/ipc/arena.h"
#include "kiln/testing/status.h"

namespace kiln::ipc {
namespace {

SegmentConfig small_config() { return SegmentConfig{4096, 8192, 16384}; }

TEST(SegmentLayout, DefaultIsOrderedAndAligned) {
  auto l = compute_layout(SegmentConfig{});
  ASSERT_TRUE(l.ok()) << l.error().message;
  EXPECT_EQ(l->command_ring_offset % kCacheLine, 0u);
  EXPECT_GE(l->command_ring_offset, sizeof(SegmentHeader));
  EXPECT_GE(l->completion_ring_offset, l->command_ring_offset + sizeof(RingControl) + l->command_ring_capacity);
  EXPECT_EQ(l->arena_offset % kArenaAlignment, 0u);
  EXPECT_GE(l->arena_offset, l->completion_ring_offset + sizeof(RingControl) + l->completion_ring_capacity);
  EXPECT_EQ(l->total_size, l->arena_offset + l->arena_size);
  auto v = validate_header(make_header(*l), l->total_size);
  ASSERT_TRUE(v.ok()) << v.error().message;
  EXPECT_EQ(*v, *l);
}

TEST(SegmentLayout, ConfigErrorsNameTheField) {
  auto a = compute_layout(SegmentConfig{5000, 4096, 4096});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().message, "command_ring_bytes 5000 is not a power of two in [4096, 67108864]");
  auto b = compute_layout(SegmentConfig{4096, 2048, 4096});
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("completion_ring_bytes 2048"), std::string::npos);
  auto c = compute_layout(SegmentConfig{4096, 4096, 1000});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("arena_bytes 1000"), std::string::npos);
}

// Each corruption of a valid header, with the error it must produce.
TEST(SegmentLayout, HeaderValidationRejectsInconsistencies) {
  const SegmentLayout l = *compute_layout(small_config());
  struct Case {
    const char* name;
    void (*mutate)(SegmentHeader&);
    const char* expect;
  };
  const Case cases[] = {
      {"magic", [](SegmentHeader& h) { h.magic = 0; }, "bad magic"},
      {"version", [](SegmentHeader& h) { h.layout_version = 2; }, "layout version 2, expected 1"},
      {"header size", [](SegmentHeader& h) { h.header_size = 64; }, "header_size 64"},
      {"reserved", [](SegmentHeader& h) { h.reserved[3] = 1; }, "reserved word"},
      {"total", [](SegmentHeader& h) { h.total_size += 4096; }, "differs from the file size"},
      {"cmd capacity", [](SegmentHeader& h) { h.command_ring_capacity = 4095; }, "command ring capacity 4095"},
      {"cpl capacity", [](SegmentHeader& h) { h.completion_ring_capacity = 0; }, "completion ring capacity 0"},
      {"cmd misaligned", [](SegmentHeader& h) { h.command_ring_offset += 8; }, "command ring offset"},
      {"cmd inside header", [](SegmentHeader& h) { h.command_ring_offset = 64; }, "overlaps"},
      {"overlap", [](SegmentHeader& h) { h.completion_ring_offset = h.command_ring_offset + 64; }, "overlaps"},
      {"arena misaligned", [](SegmentHeader& h) { h.arena_offset += 64; }, "arena offset"},
      {"arena past end", [](SegmentHeader& h) { h.arena_size += 4096; }, "extends past the segment end"},
      {"arena huge", [](SegmentHeader& h) { h.arena_size = std::numeric_limits<std::uint64_t>::max(); }, "arena size"},
      {"offset huge", [](SegmentHeader& h) { h.arena_offset = std::numeric_limits<std::uint64_t>::max() - 4095; },
       "extends past the segment end"},
  };
  for (const Case& c : cases) {
    SegmentHeader h = make_header(l);
    c.mutate(h);
    auto r = validate_header(h, l.total_size);
    ASSERT_FALSE(r.ok()) << c.name;
    EXPECT_EQ(r.error().code, ErrorCode::Decode) << c.name;
    EXPECT_NE(r.error().message.find(c.expect), std::string::npos) << c.name << ": " << r.error().message;
    EXPECT_EQ(r.error().message.rfind("segment header: ", 0), 0u) << r.error().message;
  }
}

TEST(Segment, CreateSealsAndAttachSeesTheSameLayout) {
  auto s = Segment::create(small_config());
  ASSERT_TRUE(s.ok()) << s.error().message;
  const int seals = ::fcntl(s->fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(::ftruncate(s->fd(), 4096), 0);  // nobody can shrink it under a mapping

  UniqueFd dup(::fcntl(s->fd(), F_DUPFD_CLOEXEC, 0));
  auto c = Segment::attach(std::move(dup));
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(c->layout(), s->layout());
  // Two mappings of one memory: a write through one is seen through the other.
  s->arena_bytes()[100] = 42;
  EXPECT_EQ(c->arena_bytes()[100], 42);
  EXPECT_EQ(c->command_ring().capacity, 4096u);
  EXPECT_EQ(c->completion_ring().capacity, 8192u);
}

TEST(Segment, AttachRejectsUnsealedTinyAndUsedSegments) {
  {
    UniqueFd fd(::memfd_create("plain", MFD_CLOEXEC));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(::ftruncate(fd.get(), 65536), 0);
    auto r = Segment::attach(std::move(fd));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("not sealed"), std::string::npos) << r.error().message;
  }
  {
    UniqueFd fd(::memfd_create("tiny", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    ASSERT_EQ(::ftruncate(fd.get(), 16), 0);
    ASSERT_EQ(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    auto r = Segment::attach(std::move(fd));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("size 16 is out of range"), std::string::npos) << r.error().message;
  }
  {
    auto s = Segment::create(small_config());
    KILN_ASSERT_OK(s);
    s->command_ring().control->head.store(8);
    auto r = Segment::attach(UniqueFd(::fcntl(s->fd(), F_DUPFD_CLOEXEC, 0)));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("rings already in use"), std::string::npos) << r.error().message;
  }
  {
    // Completions the daemon published before the client mapped the segment are fine.
    auto s = Segment::create(small_config());
    KILN_ASSERT_OK(s);
    s->completion_ring().control->head.store(64);
    EXPECT_TRUE(Segment::attach(UniqueFd(::fcntl(s->fd(), F_DUPFD_CLOEXEC, 0))).ok());
  }
  {
    auto s = Segment::create(small_config());
    KILN_ASSERT_OK(s);
    SegmentHeader h;
    std::memcpy(&h, s->bytes().data(), sizeof h);
    h.layout_version = 7;
    std::memcpy(s->bytes().data(), &h, sizeof h);
    auto r = Segment::attach(UniqueFd(::fcntl(s->fd(), F_DUPFD_CLOEXEC, 0)));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().message, "segment header: layout version 7, expected 1");
  }
}

TEST(Arena, ViewChecksBoundsWithoutOverflow) {
  std::vector<std::uint8_t> mem(4096);
  ArenaView a(mem);
  KILN_EXPECT_OK(a.slice({0, 4096}));
  KILN_EXPECT_OK(a.slice({4096, 0}));
  auto bad = a.slice({4000, 100});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "arena range [4000, +100) is outside the arena of 4096 bytes");
  EXPECT_FALSE(a.slice({std::numeric_limits<std::uint64_t>::max(), 2}).ok());
  EXPECT_FALSE(a.slice({8, std::numeric_limits<std::uint64_t>::max()}).ok());
  const std::uint8_t src[4] = {1, 2, 3, 4};
  KILN_ASSERT_OK(a.write({10, 4}, src));
  EXPECT_FALSE(a.write({10, 3}, src).ok());  // does not fit the range
  std::uint8_t out[4] = {};
  KILN_ASSERT_OK(a.read({10, 4}, out));
  EXPECT_EQ(std::memcmp(src, out, 4), 0);
}

TEST(Arena, AllocatorAlignsCoalescesAndRejectsForgedFrees) {
  ArenaAllocator a(4096);
  auto r1 = a.allocate(100);
  auto r2 = a.allocate(1);
  auto r3 = a.allocate(64);
  ASSERT_TRUE(r1 && r2 && r3);
  EXPECT_EQ(r1->offset, 0u);
  EXPECT_EQ(r2->offset, 128u);
  EXPECT_EQ(r3->offset, 192u);
  EXPECT_EQ(r1->length, 100u);
  EXPECT_FALSE(a.allocate(4096).has_value());  // not now: ranges are in use
  EXPECT_FALSE(a.allocate(0).has_value());
  KILN_EXPECT_OK(a.free(*r2));
  auto again = a.free(*r2);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("not an allocated range"), std::string::npos);
  EXPECT_FALSE(a.free({1, 10}).ok());
  KILN_EXPECT_OK(a.free(*r1));
  KILN_EXPECT_OK(a.free(*r3));
  EXPECT_EQ(a.bytes_free(), 4096u);
  auto whole = a.allocate(4096);  // everything coalesced back into one run
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(whole->offset, 0u);
}

TEST(Arena, AllocatorRandomisedNeverOverlaps) {
  ArenaAllocator a(1 << 16);
  std::mt19937_64 rng(7);
  std::map<std::uint64_t, ArenaRange> live;
  for (int i = 0; i < 20000; ++i) {
    if (live.empty() || rng() % 2 == 0) {
      auto r = a.allocate(1 + rng() % 3000);
      if (!r) continue;
      ASSERT_EQ(r->offset % 64, 0u);
      ASSERT_LE(r->offset + r->length, a.capacity());
      auto next = live.lower_bound(r->offset);
      if (next != live.end()) {
        ASSERT_LE(r->offset + r->length, next->first);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second.length, r->offset);
      }
      live.emplace(r->offset, *r);
    } else {
      auto it = live.begin();
      std::advance(it, static_cast<long>(rng() % live.size()));
      KILN_ASSERT_OK(a.free(it->second));
      live.erase(it);
    }
  }
  for (auto& [off, r] : live) KILN_ASSERT_OK(a.free(r));
  EXPECT_EQ(a.bytes_free(), a.capacity());
  EXPECT_EQ(a.ranges_in_use(), 0u);
}

}  // namespace
}  // namespace kiln::ipc

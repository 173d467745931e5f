// Tests for the SPSC ring (kiln/ipc/ring.h): round trips, wrap-around with split copies,
// full-ring backpressure, the sleep/wake flags and doorbells, and a hostile peer that writes
// garbage indices and records.
#include "kiln/ipc/ring.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>

#include "kiln/ipc/fd.h"
#include "kiln/testing/status.h"

namespace kiln::ipc {
namespace {

using Bytes = std::vector<std::uint8_t>;

struct RingFixture {
  RingFixture(std::uint64_t capacity = 4096) {
    seg = std::move(Segment::create(SegmentConfig{capacity, 4096, 4096})).value();
    data_bell = std::move(make_doorbell()).value();
    space_bell = std::move(make_doorbell()).value();
  }
  RingProducer producer() { return RingProducer(seg->command_ring(), data_bell.get(), "command ring"); }
  RingConsumer consumer() { return RingConsumer(seg->command_ring(), space_bell.get(), "command ring"); }
  std::optional<Segment> seg;
  UniqueFd data_bell, space_bell;
};

Bytes pattern(std::size_t n, std::uint64_t seed) {
  Bytes b(n);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::uint8_t>(seed * 131 + i * 7);
  return b;
}

bool bell_rung(int fd) { return *drain_doorbell(fd); }

TEST(Ring, RoundTripAndEmpty) {
  RingFixture f;
  auto p = f.producer();
  auto c = f.consumer();
  Bytes buf(c.max_message_bytes());
  auto empty = c.try_pop(buf);
  KILN_ASSERT_OK(empty);
  EXPECT_FALSE(empty->has_value());
  const Bytes m = pattern(13, 1);
  ASSERT_EQ(*p.try_push(m), PushStatus::Pushed);
  auto got = c.try_pop(buf);
  ASSERT_TRUE(got.ok() && got->has_value());
  ASSERT_EQ(**got, 13u);
  EXPECT_TRUE(std::equal(m.begin(), m.end(), buf.begin()));
  EXPECT_TRUE(c.empty());
  EXPECT_EQ(f.seg->command_ring().control->head.load(), record_bytes(13));
}

TEST(Ring, MessageSizeLimits) {
  RingFixture f;
  auto p = f.producer();
  auto c = f.consumer();
  EXPECT_EQ(p.max_message_bytes(), 4088u);
  auto e = p.try_push({});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().message, "command ring: message of 0 bytes is outside [1, 4088]");
  EXPECT_FALSE(p.try_push(pattern(4089, 0)).ok());
  const Bytes big = pattern(4088, 3);  // one record fills the whole ring
  ASSERT_EQ(*p.try_push(big), PushStatus::Pushed);
  EXPECT_EQ(*p.try_push(pattern(1, 0)), PushStatus::Full);
  Bytes small(100);
  auto tiny = c.try_pop(small);  // too small a buffer: error, message stays
  ASSERT_FALSE(tiny.ok());
  EXPECT_EQ(tiny.error().code, ErrorCode::ResourceExhausted);
  Bytes buf(c.max_message_bytes());
  auto got = c.try_pop(buf);
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ(**got, 4088u);
  EXPECT_EQ(buf, big);
}

// Odd sizes walk the record start across every alignment of the wrap point, so payloads split
// at every offset; positions wrap the 4 KiB ring hundreds of times.
TEST(Ring, WrapAroundSplitCopies) {
  RingFixture f;
  auto p = f.producer();
  auto c = f.consumer();
  Bytes buf(c.max_message_bytes());
  std::mt19937_64 rng(1);
  std::uint64_t sent = 0, received = 0;
  std::deque<Bytes> expected;
  for (int round = 0; round < 20000; ++round) {
    const std::size_t n = 1 + rng() % 700;
    Bytes m = pattern(n, sent);
    auto st = p.try_push(m);
    KILN_ASSERT_OK(st);
    if (*st == PushStatus::Pushed) {
      expected.push_back(std::move(m));
      ++sent;
    }
    if (rng() % 3 != 0 || *st == PushStatus::Full) {
      auto got = c.try_pop(buf);
      ASSERT_TRUE(got.ok()) << got.error().message;
      if (got->has_value()) {
        ASSERT_FALSE(expected.empty());
        ASSERT_EQ(**got, expected.front().size());
        ASSERT_TRUE(std::equal(expected.front().begin(), expected.front().end(), buf.begin()));
        expected.pop_front();
        ++received;
      }
    }
  }
  EXPECT_GT(f.seg->command_ring().control->head.load(), 200u * 4096u);
  EXPECT_GT(received, 10000u);
}

TEST(Ring, FullIsBackpressureNeverADrop) {
  RingFixture f;
  auto p = f.producer();
  auto c = f.consumer();
  std::uint64_t pushed = 0;
  for (;;) {
    Bytes m = pattern(40, pushed);
    std::memcpy(m.data(), &pushed, sizeof pushed);
    auto st = p.try_push(m);
    KILN_ASSERT_OK(st);
    if (*st == PushStatus::Full) break;
    ++pushed;
  }
  EXPECT_EQ(pushed, 4096u / record_bytes(40));
  // Repeated pushes stay Full and change nothing.
  for (int i = 0; i < 10; ++i) EXPECT_EQ(*p.try_push(pattern(40, 0)), PushStatus::Full);
  Bytes buf(c.max_message_bytes());
  for (std::uint64_t i = 0; i < pushed; ++i) {
    auto got = c.try_pop(buf);
    ASSERT_TRUE(got.ok() && got->has_value());
    std::uint64_t seq;
    std::memcpy(&seq, buf.data(), sizeof seq);
    ASSERT_EQ(seq, i);
  }
  EXPECT_FALSE(c.try_pop(buf)->has_value());
}

TEST(Ring, WakeFlagsRingTheDoorbellOnlyForASleeper) {
  RingFixture f;
  auto p = f.producer();
  auto c = f.consumer();
  Bytes buf(c.max_message_bytes());
  // Nobody sleeps: no doorbell write.
  ASSERT_EQ(*p.try_push(pattern(8, 0)), PushStatus::Pushed);
  EXPECT_FALSE(bell_rung(f.data_bell.get()));
  EXPECT_EQ(p.wakeups_sent(), 0u);
  // Not empty: prepare_sleep refuses to sleep and clears its flag.
  EXPECT_FALSE(c.prepare_sleep());
  EXPECT_EQ(f.seg->command_ring().control->consumer_sleeping.load(), 0u);
  ASSERT_TRUE(c.try_pop(buf)->has_value());
  // Empty: the consumer may sleep; the next push rings.
  EXPECT_TRUE(c.prepare_sleep());
  ASSERT_EQ(*p.try_push(pattern(8, 1)), PushStatus::Pushed);
  EXPECT_TRUE(bell_rung(f.data_bell.get()));
  EXPECT_EQ(p.wakeups_sent(), 1u);
  c.end_sleep();
  // Space: fill, announce the wait, a pop rings the space bell.
  while (*p.try_push(pattern(200, 2)) == PushStatus::Pushed) {
  }
  EXPECT_TRUE(p.prepare_wait_for_space(200));
  EXPECT_FALSE(bell_rung(f.space_bell.get()));
  ASSERT_TRUE(c.try_pop(buf)->has_value());
  EXPECT_TRUE(bell_rung(f.space_bell.get()));
  p.end_wait_for_space();
  EXPECT_FALSE(p.prepare_wait_for_space(8));  // there is room now
  p.end_wait_for_space();
}

TEST(Ring, HostileProducerIndicesAndRecordsAreErrors) {
  RingFixture f;
  auto c = f.consumer();
  RingControl* ctl = f.seg->command_ring().control;
  std::uint8_t* data = f.seg->command_ring().data;
  Bytes buf(c.max_message_bytes());
  auto expect_corrupt = [&](const char* what) {
    auto r = c.try_pop(buf);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.error().code, ErrorCode::Decode) << what;
    EXPECT_NE(r.error().message.find(what), std::string::npos) << r.error().message;
  };
  ctl->head.store(4096 + 8);  // more than the capacity published
  expect_corrupt("producer head 4104 is inconsistent with tail 0");
  ctl->head.store(12);  // not a multiple of 8
  expect_corrupt("inconsistent");
  ctl->head.store(16);
  std::uint32_t hdr[2] = {8, 0xdeadbeef};
  std::memcpy(data, hdr, 8);
  expect_corrupt("bad record marker");
  hdr[0] = 9;  // 8 + 16 bytes needed, only 16 published
  hdr[1] = kRecordMarker;
  std::memcpy(data, hdr, 8);
  expect_corrupt("record length 9");
  hdr[0] = 0xffffffff;
  std::memcpy(data, hdr, 8);
  expect_corrupt("record length 4294967295");
  hdr[0] = 0;
  std::memcpy(data, hdr, 8);
  expect_corrupt("record length 0");
  // A well-formed record still pops after all that (the errors changed nothing).
  hdr[0] = 8;
  std::memcpy(data, hdr, 8);
  auto ok = c.try_pop(buf);
  ASSERT_TRUE(ok.ok() && ok->has_value());
  EXPECT_EQ(**ok, 8u);
}

TEST(Ring, HostileConsumerTailIsAnError) {
  RingFixture f;
  auto p = f.producer();
  ASSERT_EQ(*p.try_push(pattern(8, 0)), PushStatus::Pushed);
  f.seg->command_ring().control->tail.store(1000);  // beyond what was published
  auto r = p.try_push(pattern(8, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("command ring corrupted by the peer: consumer tail 1000"), std::string::npos)
      << r.error().message;
  EXPECT_FALSE(p.prepare_wait_for_space(8));  // never sleeps on garbage
  p.end_wait_for_space();
}

// Random garbage in the whole ring region: every pop is bounded and either yields a message no
// longer than the capacity or an error; nothing reads outside the ring (ASan would see it).
TEST(Ring, RandomGarbageNeverCrashes) {
  RingFixture f;
  RingControl* ctl = f.seg->command_ring().control;
  std::uint8_t* data = f.seg->command_ring().data;
  std::mt19937_64 rng(99);
  Bytes buf(4088);
  for (int i = 0; i < 10000; ++i) {
    auto c = f.consumer();  // fresh consumer at tail 0
    for (std::size_t j = 0; j < 64; ++j) data[rng() % 4096] = static_cast<std::uint8_t>(rng());
    if (i % 2 == 0) {
      std::uint32_t hdr[2] = {static_cast<std::uint32_t>(rng() % 5000), kRecordMarker};
      std::memcpy(data, hdr, 8);
    }
    ctl->head.store(i % 3 == 0 ? rng() : (rng() % 4200) & ~std::uint64_t{7});
    for (int k = 0; k < 4; ++k) {
      auto r = c.try_pop(buf);
      if (!r.ok() || !r->has_value()) break;
      ASSERT_LE(**r, 4088u);
    }
  }
}

// Two threads on one mapping (so TSan sees every access): the producer pushes 200k messages
// while the consumer pops, sleeping on the doorbell whenever the ring is empty.
TEST(Ring, TwoThreadsWithSleeps) {
  RingFixture f;
  auto p = f.producer();
  auto c = f.consumer();
  constexpr std::uint64_t kCount = 200000;
  std::atomic<bool> failed{false};
  std::thread consumer([&] {
    Bytes buf(c.max_message_bytes());
    std::uint64_t expect = 0;
    while (expect < kCount) {
      auto r = c.try_pop(buf);
      if (!r.ok()) {
        failed = true;
        return;
      }
      if (r->has_value()) {
        std::uint64_t seq;
        std::memcpy(&seq, buf.data(), sizeof seq);
        if (seq != expect++ || **r != 8 + seq % 50) {
          failed = true;
          return;
        }
        continue;
      }
      if (c.prepare_sleep()) {
        auto woke = wait_readable(f.data_bell.get(), std::chrono::seconds(5));
        c.end_sleep();
        if (!woke.ok() || !*woke) {  // a lost wake-up shows up as a 5 s timeout
          failed = true;
          return;
        }
        (void)drain_doorbell(f.data_bell.get());
      } else {
        c.end_sleep();
      }
    }
  });
  for (std::uint64_t i = 0; i < kCount && !failed; ++i) {
    Bytes m(8 + i % 50);
    std::memcpy(m.data(), &i, sizeof i);
    for (;;) {
      auto st = p.try_push(m);
      KILN_ASSERT_OK(st);
      if (*st == PushStatus::Pushed) break;
      std::this_thread::yield();
    }
    if (i % 4096 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  consumer.join();
  EXPECT_FALSE(failed.load());
}

}  // namespace
}  // namespace kiln::ipc

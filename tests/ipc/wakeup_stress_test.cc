// The no-lost-wake-up stress (kiln/ipc/ring.h, endpoint.h): messages flow both ways between a
// daemon-side and a client-side Endpoint, in two threads of one process and in two processes
// (fork), while producers and consumers sleep at random so that every path of the protocol
// runs: consumers going to sleep on an empty ring, producers waiting on a full one, wake-ups
// racing the re-checks. Every blocking wait has a 5 s timeout; a lost wake-up would show up as
// a timeout while the peer is waiting too, so the test asserts that none happens, that every
// message arrives once, in order, intact, and that both kinds of sleep really occurred.
//
// Budget: KILN_IPC_STRESS_MESSAGES per direction (default 1,000,000) or KILN_IPC_STRESS_SECONDS
// (default 3) of sending, whichever ends first.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "kiln/ipc/endpoint.h"

namespace kiln::ipc {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::uint64_t kEndMarker = ~std::uint64_t{0};
constexpr auto kWaitTimeout = std::chrono::seconds(5);

std::uint64_t budget_messages() {
  if (const char* v = std::getenv("KILN_IPC_STRESS_MESSAGES")) return std::strtoull(v, nullptr, 10);
  return 1'000'000;
}
double budget_seconds() {
  if (const char* v = std::getenv("KILN_IPC_STRESS_SECONDS")) return std::atof(v);
  return 3.0;
}

// Small rings so that producers hit "full" often (the space-wait path).
SegmentConfig stress_config() { return SegmentConfig{4096, 4096, 4096}; }

// A random pause now and then: about one message in 512 sleeps 0-100 us, so that wake-ups race
// the re-checks at every distance. Every 4096th message a long pause (2 ms, far beyond the
// receiver's 30 us poll and the time to fill a 4 KiB ring) makes the other side go to sleep
// for sure: random short pauses alone left the receivers polling through a whole run on a
// loaded 2-core machine, and the slow paths untested.
void maybe_pause(std::mt19937_64& rng, std::uint64_t seq) {
  if (seq % 4096 == 4095)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  else if ((rng() & 511) == 0)
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 100));
}

// Message: seq u64, then (len - 8) bytes derived from seq. Lengths 8..263.
std::size_t fill(std::vector<std::uint8_t>& m, std::uint64_t seq) {
  const std::size_t n = seq == kEndMarker ? 8 : 8 + (seq * 2654435761u) % 256;
  m.resize(n);
  std::memcpy(m.data(), &seq, 8);
  for (std::size_t i = 8; i < n; ++i) m[i] = static_cast<std::uint8_t>(seq + i);
  return n;
}

struct SendResult {
  std::string error;
  std::uint64_t sent = 0;
  std::uint64_t sleeps = 0;
};
struct ReceiveResult {
  std::string error;
  std::uint64_t received = 0;
  std::uint64_t sleeps = 0;
};

SendResult run_sender(Endpoint& ep, std::uint64_t seed) {
  SendResult r;
  std::mt19937_64 rng(seed);
  const auto deadline = Clock::now() + std::chrono::duration<double>(budget_seconds());
  const std::uint64_t max = budget_messages();
  std::vector<std::uint8_t> m;
  for (std::uint64_t seq = 0;; ++seq) {
    const bool last = seq >= max || (seq % 1024 == 0 && Clock::now() >= deadline);
    fill(m, last ? kEndMarker : seq);
    if (Status st = ep.send(m, kWaitTimeout); !st.ok()) {
      r.error = "send #" + std::to_string(seq) + ": " + st.error().message;
      break;
    }
    if (last) break;
    ++r.sent;
    maybe_pause(rng, seq);
  }
  r.sleeps = ep.send_sleeps();
  return r;
}

ReceiveResult run_receiver(Endpoint& ep, std::uint64_t seed) {
  ReceiveResult r;
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> buf(ep.max_receive_bytes()), want;
  for (;;) {
    auto got = ep.receive(buf, kWaitTimeout);
    if (!got.ok()) {
      r.error = "receive: " + got.error().message;
      break;
    }
    if (!got->has_value()) {
      r.error = "lost wake-up? no message within 5 s after #" + std::to_string(r.received);
      break;
    }
    std::uint64_t seq;
    std::memcpy(&seq, buf.data(), 8);
    if (seq == kEndMarker) break;
    if (seq != r.received) {
      r.error = "message #" + std::to_string(seq) + " arrived, expected #" + std::to_string(r.received);
      break;
    }
    const std::size_t n = fill(want, seq);
    if (**got != n || std::memcmp(buf.data(), want.data(), n) != 0) {
      r.error = "message #" + std::to_string(seq) + " is corrupted";
      break;
    }
    maybe_pause(rng, r.received);
    ++r.received;
  }
  r.sleeps = ep.receive_sleeps();
  return r;
}

Endpoint attach_peer(const Endpoint& daemon) {
  auto dup = [](int fd) { return UniqueFd(::fcntl(fd, F_DUPFD_CLOEXEC, 0)); };
  Bells bells = {dup(daemon.bell_fd(Bell::CommandData)), dup(daemon.bell_fd(Bell::CommandSpace)),
                 dup(daemon.bell_fd(Bell::CompletionData)), dup(daemon.bell_fd(Bell::CompletionSpace))};
  auto ep = Endpoint::attach_client_side(dup(daemon.memfd()), std::move(bells));
  if (!ep.ok()) {
    std::fprintf(stderr, "attach: %s\n", ep.error().message.c_str());
    std::abort();
  }
  return std::move(ep).value();
}

// An idle receive sleeps through its timeout: found by issue 26's scrape benchmark, where 64 idle
// clients cost the daemon half a core. wait_readable truncated its timeout to whole
// milliseconds, so in the last millisecond before a receive's deadline it polled with a zero
// timeout and returned at once, and the receive went back to sleep again and again: a busy loop
// of a millisecond or more per timeout. Each sleep is counted (receive_sleeps): a receive that
// times out sleeps once or twice, never dozens of times. Timeouts of 3 ms, 10 ms and 100 ms,
// each several times so that the deadline's sub-millisecond remainder varies.
TEST(WakeupStress, AnIdleReceiveSleepsThroughItsTimeout) {
  auto daemon = Endpoint::create_daemon_side(stress_config());
  ASSERT_TRUE(daemon.ok()) << daemon.error().message;
  Endpoint client = attach_peer(*daemon);
  std::vector<std::uint8_t> buf(daemon->max_receive_bytes());
  for (int ms : {3, 10, 100}) {
    for (int i = 0; i < 5; ++i) {
      const std::uint64_t before = daemon->receive_sleeps();
      auto got = daemon->receive(buf, std::chrono::milliseconds(ms));
      ASSERT_TRUE(got.ok()) << got.error().message;
      EXPECT_FALSE(got->has_value());
      EXPECT_LE(daemon->receive_sleeps() - before, 2u) << "a " << ms << " ms receive on an empty ring";
    }
  }
}

// Four threads: client sends commands / daemon receives them; daemon sends completions /
// client receives them. Both directions at once, so senders and receivers of one side block
// concurrently on their own doorbells.
TEST(WakeupStress, TwoThreadsPerSideBothDirections) {
  auto daemon = Endpoint::create_daemon_side(stress_config());
  ASSERT_TRUE(daemon.ok()) << daemon.error().message;
  Endpoint client = attach_peer(*daemon);
  const auto start = Clock::now();
  SendResult cmd_sent, cpl_sent;
  ReceiveResult cmd_got, cpl_got;
  {
    std::jthread a([&] { cmd_sent = run_sender(client, 1); });
    std::jthread b([&] { cmd_got = run_receiver(*daemon, 2); });
    std::jthread c([&] { cpl_sent = run_sender(*daemon, 3); });
    std::jthread d([&] { cpl_got = run_receiver(client, 4); });
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_EQ(cmd_sent.error, "");
  EXPECT_EQ(cmd_got.error, "");
  EXPECT_EQ(cpl_sent.error, "");
  EXPECT_EQ(cpl_got.error, "");
  EXPECT_EQ(cmd_got.received, cmd_sent.sent);
  EXPECT_EQ(cpl_got.received, cpl_sent.sent);
  // The protocol's slow paths really ran: consumers slept on empty rings, producers on full ones.
  EXPECT_GT(cmd_got.sleeps + cpl_got.sleeps, 0u);
  EXPECT_GT(cmd_sent.sleeps + cpl_sent.sleeps, 0u);
  std::printf("threads: %llu + %llu messages in %.2f s; receiver sleeps %llu/%llu, sender sleeps %llu/%llu\n",
              static_cast<unsigned long long>(cmd_got.received), static_cast<unsigned long long>(cpl_got.received),
              secs, static_cast<unsigned long long>(cmd_got.sleeps), static_cast<unsigned long long>(cpl_got.sleeps),
              static_cast<unsigned long long>(cmd_sent.sleeps), static_cast<unsigned long long>(cpl_sent.sleeps));
}

// The same across a fork: the child maps the segment from the memfd (as a real client does) and
// plays the client; the parent plays the daemon.
TEST(WakeupStress, TwoProcesses) {
  auto daemon = Endpoint::create_daemon_side(stress_config());
  ASSERT_TRUE(daemon.ok()) << daemon.error().message;
  std::fflush(nullptr);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Child: no gtest assertions; the exit status reports. The daemon-side Endpoint object
    // inherited from the parent is left untouched.
    Endpoint client = attach_peer(*daemon);
    SendResult sent;
    ReceiveResult got;
    {
      std::jthread a([&] { sent = run_sender(client, 11); });
      got = run_receiver(client, 12);
    }
    if (!sent.error.empty() || !got.error.empty()) {
      std::fprintf(stderr, "child: %s | %s\n", sent.error.c_str(), got.error.c_str());
      ::_exit(1);
    }
    std::printf("child: sent %llu commands (%llu sleeps), received %llu completions (%llu sleeps)\n",
                static_cast<unsigned long long>(sent.sent), static_cast<unsigned long long>(sent.sleeps),
                static_cast<unsigned long long>(got.received), static_cast<unsigned long long>(got.sleeps));
    std::fflush(stdout);
    ::_exit(0);
  }
  SendResult sent;
  ReceiveResult got;
  {
    std::jthread a([&] { sent = run_sender(*daemon, 13); });
    got = run_receiver(*daemon, 14);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(sent.error, "");
  EXPECT_EQ(got.error, "");
  EXPECT_GT(got.received, 0u);
  std::printf("parent: sent %llu completions (%llu sleeps), received %llu commands (%llu sleeps)\n",
              static_cast<unsigned long long>(sent.sent), static_cast<unsigned long long>(sent.sleeps),
              static_cast<unsigned long long>(got.received), static_cast<unsigned long long>(got.sleeps));
}

}  // namespace
}  // namespace kiln::ipc

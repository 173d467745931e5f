#include "kiln/ipc/endpoint.h"

#include <algorithm>

#include <string>
#include <thread>

#include "kiln/base/cpu_relax.h"

namespace kiln::ipc {

namespace {
RingRegion tx_region(Side side, const Segment& s) {
  return side == Side::Daemon ? s.completion_ring() : s.command_ring();
}
RingRegion rx_region(Side side, const Segment& s) {
  return side == Side::Daemon ? s.command_ring() : s.completion_ring();
}
}  // namespace

Endpoint::Endpoint(Side side, Segment segment, Bells bells)
    : side_(side),
      segment_(std::move(segment)),
      bells_(std::move(bells)),
      // tx: rings its ring's data bell for the consumer; rx: rings its ring's space bell.
      tx_(tx_region(side, segment_), bell_fd(side == Side::Daemon ? Bell::CompletionData : Bell::CommandData),
          side == Side::Daemon ? "completion ring" : "command ring"),
      rx_(rx_region(side, segment_), bell_fd(side == Side::Daemon ? Bell::CommandSpace : Bell::CompletionSpace),
          side == Side::Daemon ? "command ring" : "completion ring") {}

Result<Endpoint> Endpoint::create_daemon_side(const SegmentConfig& config) {
  KILN_ASSIGN_OR_RETURN(Segment seg, Segment::create(config, "kiln-client-segment"));
  Bells bells;
  for (auto& b : bells) {
    KILN_ASSIGN_OR_RETURN(b, make_doorbell());
  }
  return Endpoint(Side::Daemon, std::move(seg), std::move(bells));
}

Result<Endpoint> Endpoint::attach_client_side(UniqueFd memfd, Bells bells) {
  for (const auto& b : bells) {
    if (!b) return make_error(ErrorCode::Invalid, "endpoint: missing doorbell fd");
  }
  KILN_ASSIGN_OR_RETURN(Segment seg, Segment::attach(std::move(memfd)));
  return Endpoint(Side::Client, std::move(seg), std::move(bells));
}

Status Endpoint::send(std::span<const std::uint8_t> message, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    KILN_ASSIGN_OR_RETURN(const PushStatus st, tx_.try_push(message));
    if (st == PushStatus::Pushed) return Status::Ok();
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      return make_error(ErrorCode::ResourceExhausted, std::string(side_ == Side::Daemon ? "completion" : "command") +
                                                          " ring still full after " + std::to_string(timeout.count()) +
                                                          " ms");
    }
    if (tx_.prepare_wait_for_space(message.size())) {
      ++send_sleeps_;
      auto woke = wait_readable(send_wake_fd(), left, hangup_fd_);
      tx_.end_wait_for_space();
      if (!woke.ok()) return woke.error();
      if (*woke) KILN_RETURN_IF_ERROR(drain_doorbell(send_wake_fd()).status());
    } else {
      tx_.end_wait_for_space();
    }
  }
}

namespace {
// How long a receiver polls its ring before it sleeps on the doorbell. The peer's next message
// usually follows within a few microseconds (a worker's next op, the daemon's answer to a
// sync), and going to sleep costs a doorbell write plus a futex wake-up on each side — tens of
// microseconds on a loaded VM. Polling a little longer than one wake-up keeps the common case
// off the kernel; an idle connection still sleeps after this.
constexpr std::chrono::microseconds kPollBeforeSleep{30};
constexpr unsigned kPollRoundsPerYield = 4;  // a round is ~0.3-1 µs of pauses
}  // namespace

Result<std::optional<std::size_t>> Endpoint::receive(std::span<std::uint8_t> out, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  const auto poll_until = start + std::min<Clock::duration>(kPollBeforeSleep, timeout);
  unsigned polls = 0;
  bool woken = false;  // the last sleep ended on the doorbell
  for (;;) {
    KILN_ASSIGN_OR_RETURN(auto n, rx_.try_pop(out));
    if (n) return n;
    if (woken) {
      woken = false;
      pace_spurious_wake(deadline);
    }
    if (Clock::now() < poll_until) {
      // Every few rounds, let a runnable thread on this core go first: the peer we wait for is
      // often queued right here (a wake-up lands on the waker's core), and pure spinning would
      // hold it off for the whole poll window. With nothing else runnable this returns at once.
      if (++polls % kPollRoundsPerYield == 0)
        std::this_thread::yield();
      else
        for (int i = 0; i < 32; ++i) cpu_relax();
      continue;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::optional<std::size_t>();
    if (rx_.prepare_sleep()) {
      ++receive_sleeps_;
      auto woke = wait_readable(receive_wake_fd(), left, hangup_fd_);
      rx_.end_sleep();
      if (!woke.ok()) return woke.error();
      // Reset the count so the next sleep really sleeps; a stale ring only causes a re-check.
      if (*woke) {
        KILN_RETURN_IF_ERROR(drain_doorbell(receive_wake_fd()).status());
        woken = true;
      }
    } else {
      rx_.end_sleep();
    }
  }
}

void Endpoint::pace_spurious_wake(std::chrono::steady_clock::time_point deadline) {
  const auto now = std::chrono::steady_clock::now();
  ++spurious_wakes_;
  if (now - spurious_window_start_ >= kSpuriousWindow) {
    spurious_window_start_ = now;
    spurious_in_window_ = 0;
  }
  if (++spurious_in_window_ <= kSpuriousWakesPerWindow) return;
  // Doorbell spam: deaf to the doorbell for the rest of the window (the ring is checked again
  // right after, so nothing waits longer than that).
  std::this_thread::sleep_until(std::min(spurious_window_start_ + kSpuriousWindow, deadline));
}

}  // namespace kiln::ipc

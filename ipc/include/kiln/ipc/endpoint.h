// One side of a client connection's data plane: the mapped segment, the two rings (one to send
// on, one to receive from), the arena, and four doorbell eventfds, one per (ring, direction):
//
//   CommandData      client rings after pushing a command    daemon sleeps on it (ring empty)
//   CommandSpace     daemon rings after popping a command    client sleeps on it (ring full)
//   CompletionData   daemon rings after pushing a completion client sleeps on it (ring empty)
//   CompletionSpace  client rings after popping a completion daemon sleeps on it (ring full)
// Each is rung only when its sleeper announced sleep (ring.h). One eventfd per sleeping role,
// not one per side: a side's sender and receiver may block at the same time on different
// threads, and a shared eventfd drained by one of them would swallow the other's wake-up.
//
// Thread-safety: one thread at a time may send, and one thread at a time may receive (the rings
// are single-producer single-consumer); sending and receiving may run concurrently. The client
// library serialises its senders with a lock; the daemon serves each client from one strand.
//
// Usage (client side, blocking):
//   std::vector<std::uint8_t> msg;  encode_command(cmd, msg);
//   KILN_RETURN_IF_ERROR(ep.send(msg, 10s));              // waits while the ring is full
//   std::vector<std::uint8_t> buf(ep.max_receive_bytes());
//   KILN_ASSIGN_OR_RETURN(auto n, ep.receive(buf, 10s));  // nullopt: nothing within 10 s
// The daemon does not block: it pops with rx().try_pop and, when the ring is empty, arms with
// rx().prepare_sleep() and async_waits on receive_wake_fd() (a dup given to an Asio
// posix::stream_descriptor); a full completion ring likewise with tx().prepare_wait_for_space()
// and send_wake_fd(). After waking: drain_doorbell(fd), end_sleep(), pop again.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>

#include "kiln/base/result.h"
#include "kiln/ipc/arena.h"
#include "kiln/ipc/fd.h"
#include "kiln/ipc/ring.h"
#include "kiln/ipc/segment.h"

namespace kiln::ipc {

enum class Side { Daemon, Client };

enum class Bell : std::uint8_t { CommandData, CommandSpace, CompletionData, CompletionSpace };
inline constexpr std::size_t kNumBells = 4;
using Bells = std::array<UniqueFd, kNumBells>;  // indexed by Bell

class Endpoint {
 public:
  // Daemon side: a fresh segment and four doorbells. Pass memfd() and bell_fd(b) for each Bell
  // in order to the client (SCM_RIGHTS; the control socket does it).
  static Result<Endpoint> create_daemon_side(const SegmentConfig& config);
  // Client side: maps and validates the segment received from the daemon.
  static Result<Endpoint> attach_client_side(UniqueFd memfd, Bells bells);

  Endpoint(Endpoint&&) noexcept = default;
  Endpoint& operator=(Endpoint&&) noexcept = default;

  Side side() const { return side_; }
  const SegmentLayout& layout() const { return segment_.layout(); }
  const Segment& segment() const { return segment_; }
  int memfd() const { return segment_.fd(); }
  int bell_fd(Bell b) const { return bells_[static_cast<std::size_t>(b)].get(); }
  // The doorbell this side's receiver sleeps on (its rx ring's data bell), and the one its
  // sender sleeps on while the tx ring is full (the tx ring's space bell).
  int receive_wake_fd() const { return bell_fd(side_ == Side::Daemon ? Bell::CommandData : Bell::CompletionData); }
  int send_wake_fd() const { return bell_fd(side_ == Side::Daemon ? Bell::CompletionSpace : Bell::CommandSpace); }

  RingProducer& tx() { return tx_; }  // daemon: completion ring; client: command ring
  RingConsumer& rx() { return rx_; }  // daemon: command ring; client: completion ring
  ArenaView arena() const { return ArenaView(segment_.arena_bytes()); }
  std::size_t max_send_bytes() const { return tx_.max_message_bytes(); }
  std::size_t max_receive_bytes() const { return rx_.max_message_bytes(); }

  // A socket to watch while blocking (the control socket): if the peer closes it, a blocked
  // send/receive fails with "peer closed the connection" instead of waiting out its timeout.
  void watch_hangup(int socket_fd) { hangup_fd_ = socket_fd; }

  // Sender thread only. Pushes `message`, waiting on send_wake_fd() while the ring is full
  // (backpressure). ErrorCode::ResourceExhausted if there is still no room after `timeout`.
  Status send(std::span<const std::uint8_t> message, std::chrono::milliseconds timeout);
  // Receiver thread only. Copies the next message into `out` (size it max_receive_bytes()) and
  // returns its length; nullopt if none arrived within `timeout`.
  //
  // Spurious wake-ups are paced: a peer that follows the ring protocol rings the doorbell only when
  // this side sleeps with a message to take, so a wake-up that finds the ring empty is a race
  // (rare) or doorbell spam. Past kSpuriousWakesPerWindow of them in one kSpuriousWindow the
  // receiver stops listening to the doorbell until the window ends (it still returns within its
  // timeout), so a spamming peer costs this thread at most ~900 wake-ups a second instead of
  // a core, and a message that arrives meanwhile waits at most one window.
  static constexpr std::chrono::milliseconds kSpuriousWindow{10};
  static constexpr unsigned kSpuriousWakesPerWindow = 8;
  Result<std::optional<std::size_t>> receive(std::span<std::uint8_t> out, std::chrono::milliseconds timeout);
  // Receiver thread only: whether a message is waiting (receive would return at once).
  bool receive_pending() const { return !rx_.empty(); }

  // Statistics of the blocking calls (their thread only): how often each actually slept.
  std::uint64_t send_sleeps() const { return send_sleeps_; }
  std::uint64_t receive_sleeps() const { return receive_sleeps_; }
  std::uint64_t spurious_wakes() const { return spurious_wakes_; }  // woken with an empty ring

 private:
  Endpoint(Side side, Segment segment, Bells bells);

  Side side_;
  Segment segment_;
  Bells bells_;
  RingProducer tx_;
  RingConsumer rx_;
  int hangup_fd_ = -1;
  std::uint64_t send_sleeps_ = 0;
  std::uint64_t receive_sleeps_ = 0;
  // Spurious wake-up pacing (receive()).
  void pace_spurious_wake(std::chrono::steady_clock::time_point deadline);
  std::uint64_t spurious_wakes_ = 0;
  std::chrono::steady_clock::time_point spurious_window_start_{};
  unsigned spurious_in_window_ = 0;
};

}  // namespace kiln::ipc

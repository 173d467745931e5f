// Single-producer single-consumer ring of variable-length messages in shared memory, with the
// sleep/wake protocol that never loses a wake-up.
//
// Records: an 8-byte header {u32 length, u32 kRecordMarker} then `length` payload bytes, padded
// to a multiple of 8. The header never wraps (capacity and positions are multiples of 8); the
// payload may, and is copied in two pieces (split copy). head and tail count bytes ever
// published / consumed (u64, never wrap in practice); position = count & (capacity - 1).
//
// Hostile peer: each side keeps its own index (head for the producer, tail for the consumer) in
// private memory and only ever stores it to shared memory, never loads it back. The peer's index
// is loaded once per call and checked (0 <= head - tail <= capacity, multiple of 8); a record's
// length is read once, checked against the capacity and against what the producer published,
// and the payload is copied into caller memory before anyone looks at it. Every call does
// bounded work: garbage yields an ErrorCode::Decode error naming the ring, never a loop or a
// read outside the ring. After such an error the ring is unusable; the daemon drops the client.
//
// Sleep/wake (consumer side; the producer's wait for space is the mirror image):
//   consumer: consumer_sleeping = 1 (seq_cst); if head (seq_cst load) != tail: clear, don't sleep;
//             else block on its doorbell eventfd (with a timeout); clear the flag.
//   producer: head = new (seq_cst store); if consumer_sleeping (seq_cst load): ring the doorbell.
// All four accesses are seq_cst, so they are totally ordered: either the consumer's re-check
// sees the new head, or the producer's load sees the flag and rings. An eventfd keeps its count
// until read, so a ring that lands before the consumer blocks still wakes it. (This is the
// fence formulation with the fences folded into the accesses; TSan models seq_cst accesses but
// not fences.) Proof sketch in docs/ipc.md.
//
// Thread-safety: a RingProducer is used by one thread at a time (the producer), a RingConsumer
// by one thread at a time (the consumer); the two may run concurrently, in one process or two.
//
// Usage (blocking consumer; Endpoint::receive does exactly this):
//   for (;;) {
//     KILN_ASSIGN_OR_RETURN(auto n, rx.try_pop(buf));
//     if (n) return *n;
//     if (rx.prepare_sleep()) { auto r = wait_readable(my_doorbell, timeout); rx.end_sleep(); ... }
//   }
// A daemon using Asio instead arms with prepare_sleep() and async_waits on the doorbell.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "kiln/base/result.h"
#include "kiln/ipc/segment.h"

namespace kiln::ipc {

inline constexpr std::uint32_t kRecordMarker = 0x4345524B;  // "KREC"
inline constexpr std::size_t kRecordHeaderBytes = 8;

enum class PushStatus { Pushed, Full };

// Bytes a message of `n` payload bytes takes in the ring.
constexpr std::uint64_t record_bytes(std::uint64_t n) { return kRecordHeaderBytes + ((n + 7) & ~std::uint64_t{7}); }

class RingProducer {
 public:
  // `peer_doorbell`: the eventfd the consumer sleeps on (not owned). `name` names the ring in
  // error messages ("command ring"); it must outlive the producer (a string literal).
  RingProducer(RingRegion region, int peer_doorbell, const char* name);

  // Largest message: capacity - 8 (one record fills the ring).
  std::size_t max_message_bytes() const { return static_cast<std::size_t>(r_.capacity - kRecordHeaderBytes); }

  // Producer thread only. Copies `message` (1..max_message_bytes()) into the ring and publishes
  // it; Full when there is not room now (backpressure: nothing is dropped, retry later). Rings
  // the peer's doorbell if the consumer sleeps. Errors: an empty or oversized message
  // (ErrorCode::Invalid), a consumer tail that is impossible (ErrorCode::Decode), a failed
  // doorbell write (ErrorCode::Execution; the message is published then: do not push it again).
  Result<PushStatus> try_push(std::span<const std::uint8_t> message);

  // Producer thread only: announces a wait for room for a message of `message_bytes`. Returns
  // true if the ring is still too full, so the caller may block on its own doorbell (the
  // consumer rings it after freeing room); false if there is room now (or the tail is garbage:
  // the next try_push reports it). Call end_wait_for_space() after either outcome.
  bool prepare_wait_for_space(std::size_t message_bytes);
  void end_wait_for_space();

  // Statistics, producer thread only.
  std::uint64_t messages_pushed() const { return pushed_; }
  std::uint64_t wakeups_sent() const { return wakeups_; }

 private:
  void write_wrapped(std::uint64_t pos, const std::uint8_t* src, std::uint64_t n);
  void zero_wrapped(std::uint64_t pos, std::uint64_t n);
  Result<std::uint64_t> used_bytes() const;

  RingRegion r_;
  int peer_doorbell_;
  const char* name_;
  std::uint64_t head_ = 0;  // private copy: the only trusted head
  std::uint64_t pushed_ = 0;
  std::uint64_t wakeups_ = 0;
};

class RingConsumer {
 public:
  // `peer_doorbell`: the eventfd the producer sleeps on when the ring is full (not owned).
  RingConsumer(RingRegion region, int peer_doorbell, const char* name);

  // The largest message a well-behaved producer can send; size receive buffers to this.
  std::size_t max_message_bytes() const { return static_cast<std::size_t>(r_.capacity - kRecordHeaderBytes); }

  // Consumer thread only. Copies the next message into `out` and returns its length, or nullopt
  // when the ring is empty. Rings the peer's doorbell if the producer waits for room. Errors:
  // ErrorCode::Decode for a corrupted ring (bad head, marker or length), ErrorCode::ResourceExhausted
  // if `out` is smaller than the message (the message stays in the ring).
  Result<std::optional<std::size_t>> try_pop(std::span<std::uint8_t> out);

  // Consumer thread only: announces sleep. Returns true if the ring is still empty, so the
  // caller may block on its own doorbell; false if a message arrived meanwhile. Call
  // end_sleep() after either outcome (after waking, before popping again is fine too).
  bool prepare_sleep();
  void end_sleep();

  // Consumer thread only: nothing published beyond what was consumed (a hint).
  bool empty() const;

  std::uint64_t messages_popped() const { return popped_; }
  std::uint64_t wakeups_sent() const { return wakeups_; }

 private:
  void read_wrapped(std::uint64_t pos, std::uint8_t* dst, std::uint64_t n) const;

  RingRegion r_;
  int peer_doorbell_;
  const char* name_;
  std::uint64_t tail_ = 0;  // private copy: the only trusted tail
  std::uint64_t popped_ = 0;
  std::uint64_t wakeups_ = 0;
};

}  // namespace kiln::ipc

#include "kiln/ipc/ring.h"

#include <atomic>
#include <cstring>
#include <string>

#include "kiln/ipc/fd.h"

namespace kiln::ipc {

namespace {

struct RecordHeader {
  std::uint32_t length;
  std::uint32_t marker;
};
static_assert(sizeof(RecordHeader) == kRecordHeaderBytes);

Error corrupt(const char* ring, const std::string& what) {
  return make_error(ErrorCode::Decode, std::string(ring) + " corrupted by the peer: " + what);
}

}  // namespace

// ---- producer ---------------------------------------------------------------------------------

RingProducer::RingProducer(RingRegion region, int peer_doorbell, const char* name)
    : r_(region), peer_doorbell_(peer_doorbell), name_(name) {}

void RingProducer::write_wrapped(std::uint64_t pos, const std::uint8_t* src, std::uint64_t n) {
  const std::uint64_t at = pos & (r_.capacity - 1);
  const std::uint64_t first = std::min(n, r_.capacity - at);
  std::memcpy(r_.data + at, src, first);
  if (first < n) std::memcpy(r_.data, src + first, n - first);
}

void RingProducer::zero_wrapped(std::uint64_t pos, std::uint64_t n) {
  const std::uint64_t at = pos & (r_.capacity - 1);
  const std::uint64_t first = std::min(n, r_.capacity - at);
  std::memset(r_.data + at, 0, first);
  if (first < n) std::memset(r_.data, 0, n - first);
}

Result<std::uint64_t> RingProducer::used_bytes() const {
  // acquire: the consumer's copy-out of the bytes it freed happens before we overwrite them.
  const std::uint64_t tail = r_.control->tail.load(std::memory_order_acquire);
  const std::uint64_t used = head_ - tail;  // unsigned: a tail beyond head wraps to a huge value
  if (used > r_.capacity || used % 8 != 0) {
    return corrupt(name_, "consumer tail " + std::to_string(tail) + " is inconsistent with head " +
                              std::to_string(head_) + " (capacity " + std::to_string(r_.capacity) + ")");
  }
  return used;
}

Result<PushStatus> RingProducer::try_push(std::span<const std::uint8_t> message) {
  const std::uint64_t n = message.size();
  if (n == 0 || n > max_message_bytes()) {
    return make_error(ErrorCode::Invalid, std::string(name_) + ": message of " + std::to_string(n) +
                                              " bytes is outside [1, " + std::to_string(max_message_bytes()) + "]");
  }
  KILN_ASSIGN_OR_RETURN(const std::uint64_t used, used_bytes());
  const std::uint64_t rec = record_bytes(n);
  if (r_.capacity - used < rec) return PushStatus::Full;

  const RecordHeader h{static_cast<std::uint32_t>(n), kRecordMarker};
  std::memcpy(r_.data + (head_ & (r_.capacity - 1)), &h, sizeof h);  // never wraps: 8-aligned
  write_wrapped(head_ + kRecordHeaderBytes, message.data(), n);
  zero_wrapped(head_ + kRecordHeaderBytes + n, rec - kRecordHeaderBytes - n);  // no stale bytes
  head_ += rec;
  ++pushed_;
  // seq_cst (not just release): half of the store-load pair that forbids a lost wake-up.
  r_.control->head.store(head_, std::memory_order_seq_cst);
  if (r_.control->consumer_sleeping.load(std::memory_order_seq_cst) != 0) {
    ++wakeups_;
    KILN_RETURN_IF_ERROR(ring_doorbell(peer_doorbell_));
  }
  return PushStatus::Pushed;
}

bool RingProducer::prepare_wait_for_space(std::size_t message_bytes) {
  r_.control->producer_waiting.store(1, std::memory_order_seq_cst);
  const std::uint64_t tail = r_.control->tail.load(std::memory_order_seq_cst);
  const std::uint64_t used = head_ - tail;
  if (used > r_.capacity || used % 8 != 0) return false;  // garbage: let try_push report it
  return r_.capacity - used < record_bytes(message_bytes);
}

void RingProducer::end_wait_for_space() { r_.control->producer_waiting.store(0, std::memory_order_relaxed); }

// ---- consumer ---------------------------------------------------------------------------------

RingConsumer::RingConsumer(RingRegion region, int peer_doorbell, const char* name)
    : r_(region), peer_doorbell_(peer_doorbell), name_(name) {}

void RingConsumer::read_wrapped(std::uint64_t pos, std::uint8_t* dst, std::uint64_t n) const {
  const std::uint64_t at = pos & (r_.capacity - 1);
  const std::uint64_t first = std::min(n, r_.capacity - at);
  std::memcpy(dst, r_.data + at, first);
  if (first < n) std::memcpy(dst + first, r_.data, n - first);
}

Result<std::optional<std::size_t>> RingConsumer::try_pop(std::span<std::uint8_t> out) {
  // acquire: the producer's writes of the record happen before we copy it out.
  const std::uint64_t head = r_.control->head.load(std::memory_order_acquire);
  const std::uint64_t avail = head - tail_;
  if (avail == 0) return std::optional<std::size_t>();
  if (avail > r_.capacity || avail % 8 != 0) {
    return corrupt(name_, "producer head " + std::to_string(head) + " is inconsistent with tail " +
                              std::to_string(tail_) + " (capacity " + std::to_string(r_.capacity) + ")");
  }
  RecordHeader h;
  std::memcpy(&h, r_.data + (tail_ & (r_.capacity - 1)), sizeof h);  // read once; use the copy
  if (h.marker != kRecordMarker) {
    return corrupt(name_, "bad record marker at position " + std::to_string(tail_));
  }
  const std::uint64_t n = h.length;
  if (n == 0 || n > max_message_bytes() || record_bytes(n) > avail) {
    return corrupt(name_, "record length " + std::to_string(n) + " at position " + std::to_string(tail_) +
                              " exceeds the " + std::to_string(avail) + " bytes published");
  }
  if (n > out.size()) {
    return make_error(ErrorCode::ResourceExhausted, std::string(name_) + ": message of " + std::to_string(n) +
                                                        " bytes does not fit the buffer of " +
                                                        std::to_string(out.size()));
  }
  read_wrapped(tail_ + kRecordHeaderBytes, out.data(), n);
  tail_ += record_bytes(n);
  ++popped_;
  // seq_cst: half of the store-load pair that forbids a lost "room available" wake-up.
  r_.control->tail.store(tail_, std::memory_order_seq_cst);
  if (r_.control->producer_waiting.load(std::memory_order_seq_cst) != 0) {
    ++wakeups_;
    KILN_RETURN_IF_ERROR(ring_doorbell(peer_doorbell_));
  }
  return std::optional<std::size_t>(static_cast<std::size_t>(n));
}

bool RingConsumer::prepare_sleep() {
  r_.control->consumer_sleeping.store(1, std::memory_order_seq_cst);
  if (r_.control->head.load(std::memory_order_seq_cst) != tail_) {
    r_.control->consumer_sleeping.store(0, std::memory_order_relaxed);
    return false;
  }
  return true;
}

void RingConsumer::end_sleep() { r_.control->consumer_sleeping.store(0, std::memory_order_relaxed); }

bool RingConsumer::empty() const { return r_.control->head.load(std::memory_order_acquire) == tail_; }

}  // namespace kiln::ipc

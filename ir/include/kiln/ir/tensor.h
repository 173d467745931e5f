// TensorId, TensorStatus and TensorIr: one use of a tensor inside an operation (docs/spec/ir.md §2).
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <string>

#include "kiln/base/hash.h"
#include "kiln/ir/dtype.h"
#include "kiln/ir/shape.h"

namespace kiln::ir {

// Identity of a tensor: allocated by the client from one counter, never reused.
class TensorId {
 public:
  constexpr explicit TensorId(std::uint64_t value) : value_(value) {}
  constexpr std::uint64_t value() const { return value_; }
  friend constexpr auto operator<=>(TensorId, TensorId) = default;
  std::string to_string() const { return "TensorId(" + std::to_string(value_) + ")"; }

 private:
  std::uint64_t value_;
};

// Ids taken in blocks: a producer thread (an in-process Session's thread, a daemon client's
// session) takes kTensorIdBlock consecutive ids at a time, and the runtime's producer table,
// which only producer threads touch, picks a tensor's shard by its block, not by the id itself.
// A producer's live tensors then share a few shards that mostly its own core touches: with ids
// spread one by one, four daemon sessions on two cores bounced every shard line between them.
// (The CPU tensor table, touched by actors and producers alike, kept its per-id spread: by block
// it cost the in-process two-stream loop a few per cent.)
inline constexpr std::uint64_t kTensorIdBlock = 256;
// A well-mixed hash of an id's block (splitmix64's finaliser): its top bits choose a shard.
constexpr std::uint64_t tensor_id_block_hash(TensorId id) {
  return splitmix64_mix(id.value() / kTensorIdBlock + 0x9E3779B97F4A7C15ull);
}

// NotInit: this use creates the tensor. ReadOnly: read, used again later. ReadWrite: last use.
enum class TensorStatus : std::uint8_t { ReadOnly, ReadWrite, NotInit };
const char* status_name(TensorStatus s);

struct TensorIr {
  TensorId id{0};
  Shape shape;
  TensorStatus status = TensorStatus::NotInit;
  DType dtype;

  static TensorIr uninit(TensorId id, Shape shape, DType dtype) {
    return TensorIr{id, std::move(shape), TensorStatus::NotInit, dtype};
  }
  // "t42:f32[2,3,4]" (docs/spec/fusion.md §17.5).
  std::string to_string() const;
  friend bool operator==(const TensorIr&, const TensorIr&) = default;
};

}  // namespace kiln::ir

template <>
struct std::hash<kiln::ir::TensorId> {
  std::size_t operator()(kiln::ir::TensorId id) const noexcept {
    // splitmix64 finaliser: ids are sequential, spread them over buckets.
    return static_cast<std::size_t>(kiln::splitmix64_mix(id.value() + 0x9E3779B97F4A7C15ull));
  }
};

// CollectiveGroup: one distributed job's collectives on this daemon, with the same job's
// groups on the other daemons of its world, over Gloo's TCP transport (CPU devices).
//
// The daemons meet when the job's first collective arrives (not at start: a daemon whose
// workers have not come yet waits for nothing), through the rendezvous store that rank 0's
// group serves; a failed collective drops the communicator, and the next collective meets
// again, so a job whose daemon restarted goes on once every rank is back. Each collective is a
// blocking call on the caller's thread (the daemon's session thread of the client that issued
// it), never on the device's pool: a collective that waits for a peer stalls nothing else.
// Gloo reports failures by throwing; every call catches at this boundary and answers an error
// that names the ranks that left, as the store sees them.
//
// Thread-safety: every method may be called from any thread; collectives are serialized (one
// at a time per group: they must be matched in the same order on every rank). status() never
// waits for a running collective.
//
// Usage:
//   auto group = CollectiveGroup::create(config, "kiln 0.1.0 protocol 6");
//   Status st = (*group)->all_reduce(ir::dtypes::f32, bytes, ir::ReduceOperation::Sum);
//   st = (*group)->all_gather(mine, all);  // all: world_size × mine's bytes, in rank order
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kiln/base/result.h"
#include "kiln/distributed/config.h"
#include "kiln/ir/dtype.h"
#include "kiln/ir/operation.h"

namespace kiln::distributed {

enum class GroupState : std::uint8_t { Idle, Meeting, Ready, Failed };
const char* group_state_name(GroupState state);

struct GroupStatus {
  std::string job;
  std::uint32_t rank = 0;
  std::uint32_t world_size = 0;
  std::string rendezvous;     // tcp:HOST:PORT
  GroupState state = GroupState::Idle;
  std::uint64_t generation = 0;   // the last meeting's (0 before any)
  std::uint64_t meetings = 0;     // meetings completed
  std::uint64_t collectives = 0;  // collectives completed
  std::uint64_t failures = 0;     // collectives and meetings that failed
  std::string last_error;         // the last failure's message ("" if none)
};

class CollectiveGroup {
 public:
  // Checks the configuration; rank 0 binds and starts the rendezvous store here, so that a
  // wrong address fails the daemon's start (port 0: a free port, which config() reports).
  // `version` must be the same on every rank.
  static Result<std::unique_ptr<CollectiveGroup>> create(DistributedConfig config, std::string version);
  ~CollectiveGroup();
  CollectiveGroup(const CollectiveGroup&) = delete;
  CollectiveGroup& operator=(const CollectiveGroup&) = delete;

  const DistributedConfig& config() const;
  // Whether all_reduce takes this dtype (float and integer kinds; not bool or quantized).
  static Status check_dtype(ir::DType dtype);

  // Reduces `data` (elements of `dtype`, the same count on every rank) in place with every rank
  // of the world: Sum, Mean (the sum divided by world_size; integers truncate toward zero), and
  // the kiln extensions Min, Max and Prod. f16 and bf16 reduce in f32 and round once. Blocks
  // until done, or fails within the configured timeout (meeting included).
  [[nodiscard]] Status all_reduce(ir::DType dtype, std::span<std::byte> data, ir::ReduceOperation op);
  // Replaces `data` (the same size on every rank) with the root rank's bytes.
  [[nodiscard]] Status broadcast(std::span<std::byte> data, std::uint32_t root);
  // Every rank's `mine` (the same size on each), in rank order, into `all` (world_size × that).
  [[nodiscard]] Status all_gather(std::span<const std::byte> mine, std::span<std::byte> all);
  // This rank leaves the collective it cannot take part in (its input failed): its peers' call
  // fails at once instead of at the timeout, and the next collective meets again.
  void abandon(const std::string& reason);

  GroupStatus status() const;

  class Impl;

 private:
  explicit CollectiveGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::distributed

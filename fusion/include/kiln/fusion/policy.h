// Policy: incremental matching of a stream's relative segment against the plan store
// (docs/spec/fusion.md §6). One per stream, inside its Processor.
//
// Thread-safety: owned by one stream actor; reads the (concurrent) store. A Policy refers to
// plans of the store given to update(); pass that same store to action() until reset().
//
// Usage (one per stream; see Processor):
//   policy.update(store, segment_ops.back());          // once per newly queued relative op
//   Action a = policy.action(store, segment_ops, ExecutionMode::Lazy);
//   ... after executing a plan: policy.reset(); then update() with every remaining op.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kiln/fusion/plan_store.h"

namespace kiln::fusion {

enum class ExecutionMode : std::uint8_t { Lazy, Sync };
const char* mode_name(ExecutionMode m);  // "lazy" / "sync"

struct Action {
  enum class Kind : std::uint8_t { Explore, Defer, Execute };
  Kind kind = Kind::Explore;
  PlanId plan = 0;  // Execute only
  static Action explore() { return {Kind::Explore, 0}; }
  static Action defer() { return {Kind::Defer, 0}; }
  static Action execute(PlanId id) { return {Kind::Execute, id}; }
  friend bool operator==(const Action&, const Action&) = default;
};

// Tracks whether a growing op sequence matches a reference list (§6.1).
class OperationsValidator {
 public:
  enum class State : std::uint8_t { Validating, Found, Invalidated };
  void update(const ir::Operation& added, std::size_t position, std::span<const ir::Operation> reference);
  State state() const { return state_; }
  std::size_t found_size() const { return size_; }

 private:
  State state_ = State::Validating;
  std::size_t size_ = 0;
};

class Policy {
 public:
  // Called once per queued relative op, in order (§6.3).
  void update(const ExecutionPlanStore& store, const ir::Operation& op);
  // §6.4. `ops` is the relative segment (or a prefix of it in tests). Returns an Internal-style
  // Explore if fewer ops were analysed than asked about (a bug; asserted in debug builds).
  Action action(const ExecutionPlanStore& store, std::span<const ir::Operation> ops, ExecutionMode mode) const;
  void reset();
  std::size_t num_operations() const { return num_operations_; }
  // The plan an Execute action names, pinned by this policy when it matched: a plan the store
  // evicts meanwhile still runs. Null for an id the policy does not hold (a bug).
  PlanPin pinned(PlanId id) const;

 private:
  struct Candidate {
    PlanId id;
    PlanPin plan;  // the store's plan, pinned while it is matched (never copied)
    OperationsValidator validator;
  };
  struct TriggerValidator {
    ExecutionTrigger::Kind kind;
    std::size_t trigger_index = 0;  // index into the snapshot (OnOperations)
    OperationsValidator matching;
    std::optional<std::size_t> num_checked;  // nullopt = NotInit
  };
  struct Available {
    PlanId id;
    PlanPin plan;
    std::size_t size;
    TriggerSnapshot triggers;  // snapshot taken when the plan became available
    std::vector<TriggerValidator> validators;
  };

  void check_candidates(const ExecutionPlanStore& store);
  void make_available(const ExecutionPlanStore& store, Candidate& c);
  void update_availables(const ir::Operation& op);
  void check_availables();

  std::vector<Candidate> candidates_;
  std::vector<Available> availables_;
  std::optional<std::pair<PlanId, std::size_t>> found_;
  std::size_t num_operations_ = 0;
};

}  // namespace kiln::fusion

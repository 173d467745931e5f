// Execution plans and the device-level ExecutionPlanStore (docs/spec/fusion.md §5.3–§5.6), shared by
// every stream (and, through the daemon, every client process) of a device.
//
// Thread-safety: every method may be called from any thread at any time. The store is read far
// more than written: lookups take a read lock on ONE index bucket (oneTBB concurrent_hash_map),
// inserts a write lock on that bucket only, plus a short append mutex taken only when a NEW plan
// is appended (it keeps ids in order); readers take no global lock. A published ExecutionPlan
// (its operations and optimization) is immutable; only its trigger list grows, copy-on-write, so
// readers holding a snapshot never see it change (a short per-plan mutex guards the swap).
//
// Bounded or not: Burn keeps every plan for the store's life, and so does a store built with
// max_plans = 0. With a bound (beyond Burn: a daemon that serves ever new program shapes must not
// grow without limit), publishing a plan past it evicts the coldest eighth of the store: the
// plans least recently published or executed (mark_used). An evicted plan is gone from every
// look-up; whoever pinned it (a PlanPin) keeps it alive and may still run it. Ids are never
// reused, so an id names one plan forever, and a look-up of an evicted id finds nothing.
//
// Retiring (beyond Burn, whose plans are never removed, docs/spec/fusion.md §5.5): an operator may retire
// every plan, or those one tagged stream published (`kilnctl plans clear [--job J]`: a daemon tags
// each stream with its job). A retired plan leaves every look-up like an evicted one, and the
// plan cache's next save leaves it out; a stream that pinned it runs it to the end.
//
// Usage (kilnctl plans): each plan counts its cache hits, stamps its last run, and remembers the
// tags of the first kPlanUserTags streams' tags that ran it, written on the plan's own cache line
// when it runs (one relaxed add, and stores only when a value changes).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/fusion/strategy.h"
#include "kiln/ir/operation.h"

namespace kiln::fusion {

using PlanId = std::size_t;
// Returned by add() only when its precondition is broken (release builds); no plan has it.
inline constexpr PlanId kInvalidPlanId = static_cast<PlanId>(-1);

struct ExecutionTrigger {
  enum class Kind : std::uint8_t { OnOperations, OnSync, Always };
  Kind kind = Kind::Always;
  std::vector<ir::Operation> operations;  // OnOperations only (relative ops)

  static ExecutionTrigger on_operations(std::vector<ir::Operation> ops) {
    return ExecutionTrigger{Kind::OnOperations, std::move(ops)};
  }
  static ExecutionTrigger on_sync() { return ExecutionTrigger{Kind::OnSync, {}}; }
  static ExecutionTrigger always() { return ExecutionTrigger{Kind::Always, {}}; }
  std::string to_string() const;
  friend bool operator==(const ExecutionTrigger&, const ExecutionTrigger&) = default;
};
using TriggerList = std::vector<ExecutionTrigger>;
using TriggerSnapshot = std::shared_ptr<const TriggerList>;

// The immutable part of a plan.
struct ExecutionPlan {
  std::vector<ir::Operation> operations;  // relative ops, non-empty
  BlockOptimization optimization;
};
// A plan held alive (and unchanged) however the store changes meanwhile; null: no such plan.
using PlanPin = std::shared_ptr<const ExecutionPlan>;

// Who ran a plan, and when (kilnctl plans). Tags are the streams' (Processor's tag; 0: untagged).
inline constexpr std::size_t kPlanUserTags = 8;
struct PlanUsage {
  std::uint64_t hits = 0;                // cache hits that ran it, every stream
  std::int64_t last_used_ms = 0;         // Unix time (ms) of its publication or its last run
  std::uint32_t creator_tag = 0;         // the tag of the stream that published it
  std::vector<std::uint32_t> user_tags;  // the tags that ran it (the first kPlanUserTags)
  bool more_users = false;               // more tags than those ran it
};

// Bits of PlanStoreOptions::search_options.
inline constexpr std::uint16_t kSearchRowFuser = 1;  // kiln's row fuser registered

struct PlanStoreOptions {
  // Most plans kept; 0 keeps every plan for the store's life (Burn's behaviour). Past it, the
  // coldest eighth (at least one) is evicted.
  std::size_t max_plans = 0;
  // Most OnOperations triggers one plan keeps; 0 keeps every one (Burn's behaviour). Past it,
  // adding one drops the oldest: a plan matched by ever new tails (random programs, a hostile
  // client) must not grow without limit, nor make every match validate thousands of tails.
  std::size_t max_plan_triggers = 0;
  // The search that finds this store's plans (search_options_of(FuserOptions), fusers.h): the
  // plan cache records it and ignores a file a different search wrote. Default: Burn's fusers.
  std::uint16_t search_options = 0;
};

class ExecutionPlanStore {
 public:
  // Hash used to bucket plans by their first op; replaceable for tests (forced collisions).
  using OpHasher = std::function<std::uint64_t(const ir::Operation&)>;

  ExecutionPlanStore();
  explicit ExecutionPlanStore(PlanStoreOptions options);
  explicit ExecutionPlanStore(OpHasher hasher, PlanStoreOptions options = {});
  ~ExecutionPlanStore();
  ExecutionPlanStore(const ExecutionPlanStore&) = delete;
  ExecutionPlanStore& operator=(const ExecutionPlanStore&) = delete;

  struct AddResult {
    PlanId id;
    bool inserted;  // false: a plan with exactly these operations existed; it gained the trigger
    PlanPin plan;   // the plan under `id`, pinned (null only with kInvalidPlanId)
  };
  // Publishes a plan with one trigger. Atomic per first-op bucket: if a plan with identical
  // operations is already there (another stream explored the same sequence at the same time),
  // no second plan is created; the existing one gains the trigger instead.
  // Precondition: plan.operations is non-empty (an empty plan is an internal error): asserted
  // in debug builds; a release build stores nothing and returns {kInvalidPlanId, false}.
  // `creator_tag`: the publishing stream's tag (PlanUsage::creator_tag).
  AddResult add(ExecutionPlan plan, ExecutionTrigger trigger, std::uint32_t creator_tag = 0);

  // Appends the trigger unless an equal one is already there (nothing when `id` was evicted).
  void add_trigger(PlanId id, const ExecutionTrigger& trigger);

  // The plan under `id`, pinned; null when it was evicted (or never existed).
  PlanPin plan(PlanId id) const;
  // Its trigger list as it is now; null when the plan was evicted (or never existed).
  TriggerSnapshot triggers(PlanId id) const;
  // Records that the plan ran: the eviction keeps recently used plans. No-op without a bound.
  void mark_used(PlanId id);
  // A cache hit ran the plan on a stream tagged `tag`: counts it, stamps the time, notes the
  // tag, and marks it used.
  void record_hit(PlanId id, std::uint32_t tag);
  // Its usage now; nullopt when it was evicted or retired (or never existed).
  std::optional<PlanUsage> usage(PlanId id) const;
  // Retires every plan, or those published by a stream tagged `creator_tag`; how many went.
  std::size_t retire(std::optional<std::uint32_t> creator_tag = std::nullopt);

  // Ids of the plans whose first op equals `op`, in insertion order (§5.6 find). An id may
  // name a plan evicted since: plan(id) is then null.
  std::vector<PlanId> find_starting_with(const ir::Operation& op) const;
  // Plans whose first op has the same kind and family as `op` (for cache-miss explanations).
  std::vector<PlanId> find_same_first_kind(const ir::Operation& op) const;

  // Number of plans kept now. Without a bound (nothing evicted) the ids are 0 .. size()-1.
  std::size_t size() const;
  // The ids of the plans kept now, ascending.
  std::vector<PlanId> ids() const;
  // Plans evicted so far, and the bound (0: none).
  std::uint64_t evicted() const;
  std::uint64_t retired() const;
  std::size_t max_plans() const;
  std::uint16_t search_options() const;

  // Counts the changes a saved copy of the store would miss: +1 for each plan published, each
  // trigger actually added (by add() or add_trigger(); a duplicate changes nothing and counts
  // nothing) and each eviction. Starts at 0, never decreases: equal values mean nothing changed, so the
  // plan cache autosaver compares it instead of walking the plans. A reader that sees value g
  // also sees every change counted in g (release increment, acquire load).
  std::uint64_t generation() const;

 private:
  AddResult publish(ExecutionPlan plan, ExecutionTrigger trigger, std::uint32_t creator_tag);  // add() less eviction

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::fusion

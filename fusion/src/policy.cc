// Policy: incremental cache matching of one stream's segment (docs/spec/fusion.md §6.1–§6.5).
//
// Hot path: update() runs for every op of every stream. When nothing changes it allocates
// nothing: candidates and availables are compacted in place, plan op lists are read through the
// pins the policy holds, trigger op lists through the snapshot each available holds. Only a
// segment's first op (one index look-up) and a plan becoming available (one trigger snapshot and
// its validators) allocate.
#include "kiln/fusion/policy.h"

#include <cassert>

namespace kiln::fusion {

const char* mode_name(ExecutionMode m) {
  switch (m) {
    case ExecutionMode::Lazy: return "lazy";
    case ExecutionMode::Sync: return "sync";
  }
  return "?";
}

void OperationsValidator::update(const ir::Operation& added, std::size_t position,
                                 std::span<const ir::Operation> reference) {
  if (state_ != State::Validating) return;  // Found and Invalidated are sticky
  if (position >= reference.size() || !(reference[position] == added)) {
    state_ = State::Invalidated;
    return;
  }
  if (reference.size() == position + 1) {
    state_ = State::Found;
    size_ = reference.size();
  }
}

void Policy::update(const ExecutionPlanStore& store, const ir::Operation& op) {
  if (num_operations_ == 0) {
    // Plans are only ever matched from the segment's first op (§6.3).
    candidates_.clear();
    for (PlanId id : store.find_starting_with(op)) {
      PlanPin plan = store.plan(id);
      if (plan != nullptr) candidates_.push_back(Candidate{id, std::move(plan), OperationsValidator{}});
    }
  }
  for (Candidate& c : candidates_) c.validator.update(op, num_operations_, c.plan->operations);
  check_candidates(store);
  update_availables(op);
  check_availables();
  ++num_operations_;
}

void Policy::check_candidates(const ExecutionPlanStore& store) {
  // In-place, order-preserving compaction: keep the candidates still Validating.
  std::size_t keep = 0;
  for (std::size_t i = 0; i < candidates_.size(); ++i) {
    Candidate& c = candidates_[i];
    switch (c.validator.state()) {
      case OperationsValidator::State::Validating:
        if (keep != i) candidates_[keep] = std::move(c);
        ++keep;
        break;
      case OperationsValidator::State::Found: make_available(store, c); break;
      case OperationsValidator::State::Invalidated: break;
    }
  }
  candidates_.erase(candidates_.begin() + static_cast<std::ptrdiff_t>(keep), candidates_.end());
}

void Policy::make_available(const ExecutionPlanStore& store, Candidate& c) {
  // The trigger list as it is NOW; triggers added later are not seen by this entry (§6.3).
  TriggerSnapshot snapshot = store.triggers(c.id);
  if (snapshot == nullptr) return;  // evicted while it was matched: as if it had never been cached
  std::vector<TriggerValidator> validators;
  validators.reserve(snapshot->size());
  for (std::size_t i = 0; i < snapshot->size(); ++i) {
    validators.push_back(TriggerValidator{(*snapshot)[i].kind, i, OperationsValidator{}, std::nullopt});
  }
  availables_.push_back(
      Available{c.id, std::move(c.plan), c.validator.found_size(), std::move(snapshot), std::move(validators)});
}

void Policy::update_availables(const ir::Operation& op) {
  for (Available& a : availables_) {
    for (TriggerValidator& tv : a.validators) {
      if (tv.kind != ExecutionTrigger::Kind::OnOperations) continue;
      if (!tv.num_checked) {
        // The op that completed the plan is NOT checked against the trigger (§6.3).
        tv.num_checked = 0;
      } else {
        tv.matching.update(op, *tv.num_checked, (*a.triggers)[tv.trigger_index].operations);
        ++*tv.num_checked;
      }
    }
  }
}

void Policy::check_availables() {
  for (const Available& a : availables_) {
    for (const TriggerValidator& tv : a.validators) {
      switch (tv.kind) {
        case ExecutionTrigger::Kind::OnOperations:
          if (tv.matching.state() == OperationsValidator::State::Found) {
            found_ = std::pair{a.id, a.size};
            return;
          }
          break;
        case ExecutionTrigger::Kind::Always: found_ = std::pair{a.id, a.size}; return;
        case ExecutionTrigger::Kind::OnSync: break;  // never consulted while matching (§5.3)
      }
    }
  }
}

Action Policy::action(const ExecutionPlanStore& /*store*/, std::span<const ir::Operation> ops,
                      ExecutionMode mode) const {
  // Candidates hold their plans (Candidate::plan), so the store is not read.
  assert(num_operations_ >= ops.size() && "policy analysed fewer ops than asked about");
  if (num_operations_ < ops.size()) return Action::explore();  // internal bug; see header

  const std::size_t n = ops.size();
  if (found_ && found_->second <= n) return Action::execute(found_->first);

  if (mode == ExecutionMode::Lazy) {
    if (!candidates_.empty()) return Action::defer();  // a plan is still being matched
    for (const Available& a : availables_) {
      if (a.size == n) return Action::defer();  // matched exactly: OnSync, or a trigger may follow
      for (const TriggerValidator& tv : a.validators) {
        if (tv.kind == ExecutionTrigger::Kind::OnOperations &&
            tv.matching.state() == OperationsValidator::State::Validating) {
          return Action::defer();
        }
      }
    }
    return Action::explore();
  }

  // Sync: any plan whose ops are exactly the segment executes, whatever its triggers.
  for (const Available& a : availables_) {
    if (a.size == n) return Action::execute(a.id);
  }
  for (const Candidate& c : candidates_) {
    if (c.plan->operations.size() == n) return Action::execute(c.id);
  }
  return Action::explore();
}

PlanPin Policy::pinned(PlanId id) const {
  for (const Available& a : availables_)
    if (a.id == id) return a.plan;
  for (const Candidate& c : candidates_)
    if (c.id == id) return c.plan;
  return nullptr;
}

void Policy::reset() {
  candidates_.clear();  // keeps capacity
  availables_.clear();
  found_.reset();
  num_operations_ = 0;
}

}  // namespace kiln::fusion

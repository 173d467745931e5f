// ExecutionPlanStore: the device-level plan cache and its first-op index (fusion.md §5.3–§5.6).
//
// Layout and synchronisation (see also the header's thread-safety contract):
//
//   plans         tbb::concurrent_vector<unique_ptr<Slot>>. A Slot is built completely before it
//                 is appended; slots never move (the vector owns pointers, and concurrent_vector
//                 never relocates elements anyway), so `plan(id)` hands out stable references.
//                 Appends are serialised by `append_mu` (write path only, once per new plan) so
//                 that ids are handed out in order and `published` is always a prefix count.
//   Slot.triggers std::atomic<const TriggerVersion*>: copy-on-write, lock-free. A version holds
//                 an immutable list (a shared_ptr, handed to readers as the snapshot) and points to
//                 the version it replaced. Readers load the head (acquire) and copy its shared_ptr;
//                 add_trigger copies the list, appends, and CASes a new head (acq_rel on success,
//                 acquire on failure), retrying against the newer list if another writer won.
//                 Old versions are never freed while the store lives (a reader may still be
//                 copying their shared_ptr): a plan that gains k triggers keeps k lists. Triggers
//                 per plan are few (OnSync, Always, one OnOperations per distinct tail seen), so
//                 this is cheaper than hazard pointers. Why not std::atomic<std::shared_ptr>:
//                 libstdc++ 12 implements it with a low-bit spinlock whose load() unlocks with a
//                 relaxed RMW, so the reader's plain read of the pointer is not ordered before the
//                 next writer's plain write; ThreadSanitizer reports it (google/sanitizers#1558).
//   first_op      tbb::concurrent_hash_map<hash, Bucket>. A Bucket is the explicit collision
//                 list of §5.6: (first op, plan ids in insertion order) entries, compared with ==.
//                 Readers take a read accessor on ONE bucket; add() takes the write accessor of
//                 ONE bucket, so two streams exploring the same sequence at once are serialised
//                 and only one plan is created. An id is published in a bucket only after its
//                 slot is in plans; the accessor's release/acquire makes the slot visible to
//                 every reader that finds the id.
//   by_kind       tbb::concurrent_hash_map<(kind, family), sorted ids>: only explains cache misses.
//   generation    std::atomic<uint64_t>, incremented (release) after each change is visible: after
//                 `published` for a new plan, after the winning CAS for a new trigger. A reader
//                 that loads it (acquire) and then reads the store sees at least those changes.
//
// Lock order (deadlock freedom): first_op bucket -> append_mu -> by_kind bucket. Nothing ever
// takes them in another order, and no reader holds more than one.
#include "kiln/fusion/plan_store.h"

#include <oneapi/tbb/concurrent_hash_map.h>
#include <oneapi/tbb/concurrent_vector.h>

#include <algorithm>
#include <cassert>
#include <mutex>
#include <utility>

namespace kiln::fusion {

std::string ExecutionTrigger::to_string() const {
  switch (kind) {
    case Kind::OnSync: return "OnSync";
    case Kind::Always: return "Always";
    case Kind::OnOperations: break;
  }
  std::string s = "OnOperations([";
  for (std::size_t i = 0; i < operations.size(); ++i) {
    if (i) s += ", ";
    s += operations[i].kind_name();
  }
  s += "])";
  return s;
}

namespace {

// Spreads the (injectable, possibly poor) op hash over concurrent_hash_map's buckets, which are
// selected by the low bits.
struct MixedHashCompare {
  static std::size_t hash(std::uint64_t x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;  // splitmix64 finaliser
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return static_cast<std::size_t>(x ^ (x >> 31));
  }
  static bool equal(std::uint64_t a, std::uint64_t b) { return a == b; }
};

std::uint64_t kind_key(const ir::Operation& op) {
  return static_cast<std::uint64_t>(op.kind) << 8 | static_cast<std::uint64_t>(op.family);
}

}  // namespace

struct ExecutionPlanStore::Impl {
  // One published trigger list; immutable.
  struct TriggerVersion {
    TriggerSnapshot list;
    const TriggerVersion* previous;  // the version it replaced (kept alive, see above)
  };

  struct Slot {
    Slot(ExecutionPlan p, ExecutionTrigger t)
        : plan(std::move(p)),
          triggers(new TriggerVersion{std::make_shared<const TriggerList>(TriggerList{std::move(t)}), nullptr}) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() {
      // Only the store's destructor gets here: no reader is left.
      const TriggerVersion* v = triggers.load(std::memory_order_relaxed);
      while (v != nullptr) {
        const TriggerVersion* previous = v->previous;
        delete v;
        v = previous;
      }
    }
    const ExecutionPlan plan;                       // immutable once published
    std::atomic<const TriggerVersion*> triggers;    // newest version, never null
  };

  // One first op and the plans that start with it (§5.6 `starters`), ids in insertion order.
  struct Starter {
    ir::Operation op;
    std::vector<PlanId> ids;
  };
  // The explicit collision list of one hash value; almost always one entry.
  using Bucket = std::vector<Starter>;
  using FirstOpMap = tbb::concurrent_hash_map<std::uint64_t, Bucket, MixedHashCompare>;
  using KindMap = tbb::concurrent_hash_map<std::uint64_t, std::vector<PlanId>, MixedHashCompare>;

  explicit Impl(OpHasher h) : hasher(std::move(h)) {}

  const Slot& slot(PlanId id) const {
    assert(id < published.load(std::memory_order_acquire) && "plan id out of range");
    return *plans[id];
  }
  Slot& slot(PlanId id) {
    assert(id < published.load(std::memory_order_acquire) && "plan id out of range");
    return *plans[id];
  }

  static TriggerSnapshot snapshot(const Slot& s) {
    // acquire: pairs with the release of the CAS that published this version.
    return s.triggers.load(std::memory_order_acquire)->list;
  }

  // True when the trigger was added (false: an equal one was already there).
  static bool add_trigger_to(Slot& s, const ExecutionTrigger& trigger) {
    // acquire: the list we copy must be fully visible (pairs with the CAS release below).
    const TriggerVersion* current = s.triggers.load(std::memory_order_acquire);
    for (;;) {
      const TriggerList& list = *current->list;
      if (std::find(list.begin(), list.end(), trigger) != list.end()) return false;  // dedupe
      auto grown = std::make_shared<TriggerList>(list);
      grown->push_back(trigger);
      auto next = std::make_unique<TriggerVersion>(TriggerVersion{std::move(grown), current});
      // Success: release publishes the new version and list (acq_rel: also orders our read of
      // `current`). Failure: `current` is reloaded with acquire; retry against the newer list.
      if (s.triggers.compare_exchange_weak(current, next.get(), std::memory_order_acq_rel,
                                           std::memory_order_acquire)) {
        next.release();  // owned by the chain now
        return true;
      }
    }
  }

  OpHasher hasher;
  tbb::concurrent_vector<std::unique_ptr<Slot>> plans;
  std::mutex append_mu;                     // serialises appends to `plans` (write path only)
  std::atomic<std::size_t> published{0};    // every id < published is fully constructed
  std::atomic<std::uint64_t> generation{0}; // changes so far (see the layout above)

  // release: the change just made (a published slot, a CAS-ed trigger list) is visible to whoever
  // loads the new value with acquire.
  void count_change() { generation.fetch_add(1, std::memory_order_release); }

  FirstOpMap first_op;
  KindMap by_kind;
};

ExecutionPlanStore::ExecutionPlanStore() : ExecutionPlanStore(OpHasher(&ir::hash_operation)) {}

ExecutionPlanStore::ExecutionPlanStore(OpHasher hasher) : impl_(std::make_unique<Impl>(std::move(hasher))) {}

ExecutionPlanStore::~ExecutionPlanStore() = default;

ExecutionPlanStore::AddResult ExecutionPlanStore::add(ExecutionPlan plan, ExecutionTrigger trigger) {
  assert(!plan.operations.empty() && "ExecutionPlanStore::add: a plan must cover at least one op");
  if (plan.operations.empty()) return AddResult{kInvalidPlanId, false};

  Impl& im = *impl_;
  const std::uint64_t h = im.hasher(plan.operations.front());

  // Write accessor: exclusive on this one hash bucket until the end of the scope. Creates the
  // bucket if it is not there yet.
  Impl::FirstOpMap::accessor acc;
  im.first_op.insert(acc, h);
  Impl::Bucket& bucket = acc->second;

  Impl::Starter* starter = nullptr;
  for (Impl::Starter& s : bucket) {
    if (s.op == plan.operations.front()) {
      starter = &s;
      break;
    }
  }
  if (starter != nullptr) {
    // Another stream may have explored the very same sequence: keep one plan, add the trigger.
    for (PlanId existing : starter->ids) {
      Impl::Slot& s = im.slot(existing);
      if (s.plan.operations == plan.operations) {
        if (Impl::add_trigger_to(s, trigger)) im.count_change();
        return AddResult{existing, false};
      }
    }
  }

  const std::uint64_t kk = kind_key(plan.operations.front());
  // Build the slot completely before it becomes reachable.
  auto slot = std::make_unique<Impl::Slot>(std::move(plan), std::move(trigger));
  const Impl::Slot* raw = slot.get();
  PlanId id;
  {
    std::lock_guard<std::mutex> lock(im.append_mu);
    auto it = im.plans.push_back(std::move(slot));
    id = static_cast<PlanId>(it - im.plans.begin());
    // release: size() readers that see id+1 also see the slot. Under the mutex, so the count
    // only ever grows by one, in id order.
    im.published.store(id + 1, std::memory_order_release);
  }
  im.count_change();

  // Publish the id in the bucket (visible to readers once `acc` is released).
  if (starter != nullptr) {
    starter->ids.push_back(id);
  } else {
    bucket.push_back(Impl::Starter{raw->plan.operations.front(), {id}});  // new op or hash collision
  }

  {
    Impl::KindMap::accessor kacc;
    im.by_kind.insert(kacc, kk);
    std::vector<PlanId>& ids = kacc->second;
    // Plans of one kind may come from different first-op buckets in any order: keep ids sorted.
    ids.insert(std::upper_bound(ids.begin(), ids.end(), id), id);
  }
  return AddResult{id, true};
}

void ExecutionPlanStore::add_trigger(PlanId id, const ExecutionTrigger& trigger) {
  if (Impl::add_trigger_to(impl_->slot(id), trigger)) impl_->count_change();
}

const ExecutionPlan& ExecutionPlanStore::plan(PlanId id) const { return impl_->slot(id).plan; }

TriggerSnapshot ExecutionPlanStore::triggers(PlanId id) const { return Impl::snapshot(impl_->slot(id)); }

std::vector<PlanId> ExecutionPlanStore::find_starting_with(const ir::Operation& op) const {
  const Impl& im = *impl_;
  Impl::FirstOpMap::const_accessor acc;  // read lock on one bucket
  if (!im.first_op.find(acc, im.hasher(op))) return {};
  for (const Impl::Starter& s : acc->second) {
    if (s.op == op) return s.ids;
  }
  return {};  // same hash, different op
}

std::vector<PlanId> ExecutionPlanStore::find_same_first_kind(const ir::Operation& op) const {
  Impl::KindMap::const_accessor acc;
  if (!impl_->by_kind.find(acc, kind_key(op))) return {};
  return acc->second;
}

std::size_t ExecutionPlanStore::size() const { return impl_->published.load(std::memory_order_acquire); }

std::uint64_t ExecutionPlanStore::generation() const {
  return impl_->generation.load(std::memory_order_acquire);  // pairs with count_change()
}

}  // namespace kiln::fusion

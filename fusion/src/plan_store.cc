// ExecutionPlanStore: the device-level plan cache and its first-op index (docs/spec/fusion.md §5.3–§5.6).
//
// Layout and synchronisation (see also the header's thread-safety contract):
//
//   by_id         tbb::concurrent_hash_map<id, shared_ptr<Slot>>: the plans kept now. A Slot is
//                 built completely before it is inserted; plan(id) copies its shared_ptr under a
//                 read lock on one bucket and hands out an aliasing pin to the plan, so an
//                 evicted slot lives on while anyone holds a pin or a trigger snapshot of it.
//   kept          every kept slot by id (std::map), guarded by `append_mu`, which also serialises
//                 publishing (ids in order) and eviction: the eviction's walk over the plans and
//                 the size need one consistent list, which the concurrent map cannot give.
//   Slot.triggers the current trigger list, an immutable shared list handed to readers as their
//                 snapshot, guarded by the slot's own mutex: a reader copies the pointer under it,
//                 a writer builds the grown list and swaps it in under it. A replaced list lives
//                 as long as a snapshot of it does, no longer, so a plan's triggers cost memory in
//                 proportion to their number (an earlier lock-free version kept every old list:
//                 quadratic in the triggers, and the soak grew to 16 GiB on a few hot plans). The
//                 mutex is taken once per plan a stream matches and per trigger added, never per op.
//                 Past PlanStoreOptions::max_plan_triggers OnOperations triggers, adding one drops
//                 the oldest (beyond Burn, whose list grows with every new tail seen).
//   Slot.last_used the `clock` value when the plan was published or last marked used. The clock
//                 counts published plans, so a hot plan's stamp is written once per new plan at
//                 most, not once per run (no shared cache line written on the hot path).
//   first_op      tbb::concurrent_hash_map<hash, Bucket>. A Bucket is the explicit collision
//                 list of §5.6: (first op, plan ids in insertion order) entries, compared with ==.
//                 Readers take a read accessor on ONE bucket; add() takes the write accessor of
//                 ONE bucket, so two streams exploring the same sequence at once are serialised
//                 and only one plan is created. An id is published in a bucket only after its
//                 slot is in by_id; the accessor's release/acquire makes the slot visible to every
//                 reader that finds the id.
//   by_kind       tbb::concurrent_hash_map<(kind, family), sorted ids>: only explains cache misses.
//   generation    std::atomic<uint64_t>, incremented (release) after each change is visible: after
//                 a new plan is in by_id, after a new trigger list is swapped in, after an
//                 eviction. A reader that loads it (acquire) and then reads the store sees at least
//                 those changes.
//
// Eviction (bounded stores only) runs in add() after its bucket is released, by one thread at a
// time (`evict_mu`; it runs once per bound/8 new plans, so publishers rarely wait on it). Under
// append_mu it picks the coldest plans and takes them out of `kept` and by_id; then, holding
// nothing else, it takes their ids out of their first_op and by_kind buckets. In
// between, an index may name an evicted id: look-ups of it find no plan, and add() skips it.
//
// Lock order (deadlock freedom): evict_mu -> first_op bucket -> append_mu -> by_id / by_kind
// bucket; a slot's triggers_mu is a leaf (taken last, nothing taken under it). Nothing ever takes
// them in another order, and no reader holds more than one.
#include "kiln/fusion/plan_store.h"

#include <oneapi/tbb/concurrent_hash_map.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

#include "kiln/base/hash.h"
#include "kiln/base/mutex.h"

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
  static std::size_t hash(std::uint64_t x) { return static_cast<std::size_t>(splitmix64_mix(x)); }
  static bool equal(std::uint64_t a, std::uint64_t b) { return a == b; }
};

std::uint64_t kind_key(const ir::Operation& op) {
  return static_cast<std::uint64_t>(op.kind) << 8 | static_cast<std::uint64_t>(op.family);
}

std::int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The same from the kernel's tick-granular clock (a few ms coarse, a fraction of the cost): for
// a plan's last run, stamped every time a cached plan runs.
std::int64_t coarse_unix_ms() {
  timespec ts{};
  if (::clock_gettime(CLOCK_REALTIME_COARSE, &ts) != 0) return unix_ms();
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

}  // namespace

struct ExecutionPlanStore::Impl {
  struct Slot {
    Slot(ExecutionPlan p, ExecutionTrigger t, std::uint64_t now, std::uint32_t creator)
        : plan(std::move(p)),
          triggers(std::make_shared<const TriggerList>(TriggerList{std::move(t)})),
          last_used(now),
          creator_tag(creator),
          last_used_ms(unix_ms()) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    const ExecutionPlan plan;  // immutable once published
    Mutex triggers_mu;
    TriggerSnapshot triggers KILN_GUARDED_BY(triggers_mu);  // never null
    std::atomic<std::uint64_t> last_used;                   // `clock` when published or last used
    // Usage (kilnctl plans), written when the plan runs.
    const std::uint32_t creator_tag;
    std::atomic<std::uint64_t> hits{0};
    std::atomic<std::int64_t> last_used_ms;
    std::array<std::atomic<std::uint32_t>, kPlanUserTags> user_tags{};  // 0: free
    std::atomic<bool> more_users{false};
  };
  using SlotPtr = std::shared_ptr<Slot>;

  // One first op and the plans that start with it (§5.6 `starters`), ids in insertion order.
  struct Starter {
    ir::Operation op;
    std::vector<PlanId> ids;
  };
  // The explicit collision list of one hash value; almost always one entry.
  using Bucket = std::vector<Starter>;
  // Nodes from the C++ allocator (malloc), not TBB's scalable allocator: eviction erases entries
  // while other threads insert, and memory recycled inside libtbbmalloc (not instrumented) makes
  // ThreadSanitizer report a node's construction as racing with the unlock of the node it
  // reuses. Entries are published rarely; lookups allocate nothing.
  template <class V>
  using Map =
      tbb::concurrent_hash_map<std::uint64_t, V, MixedHashCompare, std::allocator<std::pair<const std::uint64_t, V>>>;
  using FirstOpMap = Map<Bucket>;
  using KindMap = Map<std::vector<PlanId>>;
  using IdMap = Map<SlotPtr>;

  Impl(OpHasher h, PlanStoreOptions o) : hasher(std::move(h)), options(o) {}

  SlotPtr find(PlanId id) const {
    IdMap::const_accessor acc;  // read lock on one bucket
    if (!by_id.find(acc, id)) return nullptr;
    return acc->second;
  }

  static TriggerSnapshot snapshot(Slot& s) {
    MutexLock lock(s.triggers_mu);
    return s.triggers;
  }

  // True when the trigger was added (false: an equal one was already there).
  bool add_trigger_to(Slot& s, const ExecutionTrigger& trigger) const {
    MutexLock lock(s.triggers_mu);
    const TriggerList& list = *s.triggers;
    if (std::find(list.begin(), list.end(), trigger) != list.end()) return false;  // dedupe
    auto grown = std::make_shared<TriggerList>(list);
    if (const std::size_t cap = options.max_plan_triggers;
        cap != 0 && trigger.kind == ExecutionTrigger::Kind::OnOperations) {
      const auto on_operations = [](const ExecutionTrigger& t) {
        return t.kind == ExecutionTrigger::Kind::OnOperations;
      };
      if (static_cast<std::size_t>(std::count_if(grown->begin(), grown->end(), on_operations)) >= cap)
        grown->erase(std::find_if(grown->begin(), grown->end(), on_operations));  // the oldest tail
    }
    grown->push_back(trigger);
    s.triggers = std::move(grown);
    return true;
  }

  // A stream tagged `tag` ran the plan: a free user slot takes the tag unless it is there.
  static void note_user(Slot& s, std::uint32_t tag) {
    for (auto& t : s.user_tags) {
      std::uint32_t v = t.load(std::memory_order_relaxed);
      if (v == tag) return;
      if (v == 0 && (t.compare_exchange_strong(v, tag, std::memory_order_relaxed) || v == tag)) return;
    }
    if (!s.more_users.load(std::memory_order_relaxed)) s.more_users.store(true, std::memory_order_relaxed);
  }

  // release: the change just made (a published slot, a new trigger list, an eviction) is
  // visible to whoever loads the new value with acquire.
  void count_change() { generation.fetch_add(1, std::memory_order_release); }

  void evict_if_over_bound();
  // Takes the plans `pick` chooses out of kept and by_id (under append_mu), then out of the
  // indexes; how many went.
  std::size_t remove(const std::function<std::vector<PlanId>(const std::map<PlanId, SlotPtr>&)>& pick);
  void unindex(PlanId id, const ir::Operation& first);

  OpHasher hasher;
  const PlanStoreOptions options;
  IdMap by_id;
  Mutex append_mu KILN_ACQUIRED_AFTER(evict_mu);
  std::map<PlanId, SlotPtr> kept KILN_GUARDED_BY(append_mu);
  PlanId next_id KILN_GUARDED_BY(append_mu) = 0;
  std::atomic<std::size_t> kept_count{0};  // kept.size(), readable without the mutex
  std::atomic<std::uint64_t> clock{0};     // plans published so far (recency)
  std::atomic<std::uint64_t> evictions{0};
  std::atomic<std::uint64_t> retirements{0};
  std::atomic<std::uint64_t> generation{0};  // changes so far (see the layout above)
  Mutex evict_mu;                            // one evicting thread at a time

  FirstOpMap first_op;
  KindMap by_kind;
};

void ExecutionPlanStore::Impl::evict_if_over_bound() {
  const std::size_t bound = options.max_plans;
  if (bound == 0 || kept_count.load(std::memory_order_relaxed) <= bound) return;
  // A second publisher past the bound waits for the first's eviction, then finds the store
  // within it (a try-lock could leave the store over its bound when the last two publish at once).
  MutexLock evicting(evict_mu);
  const std::size_t n = remove([bound](const std::map<PlanId, SlotPtr>& plans) {
    std::vector<PlanId> coldest;
    if (plans.size() <= bound) return coldest;
    // Down to the bound less an eighth, so that eviction runs once per bound/8 new plans; the
    // warmest plan (the one just published, at least) always stays.
    const std::size_t target = std::max<std::size_t>(bound - std::max<std::size_t>(bound / 8, 1), 1);
    const std::size_t excess = plans.size() - target;
    std::vector<std::pair<std::uint64_t, PlanId>> by_age;
    by_age.reserve(plans.size());
    for (const auto& [id, slot] : plans) by_age.emplace_back(slot->last_used.load(std::memory_order_relaxed), id);
    // Coldest first; among equals the older id.
    std::nth_element(by_age.begin(), by_age.begin() + static_cast<std::ptrdiff_t>(excess - 1), by_age.end());
    for (std::size_t i = 0; i < excess; ++i) coldest.push_back(by_age[i].second);
    return coldest;
  });
  evictions.fetch_add(n, std::memory_order_relaxed);
}

std::size_t ExecutionPlanStore::Impl::remove(
    const std::function<std::vector<PlanId>(const std::map<PlanId, SlotPtr>&)>& pick) {
  std::vector<SlotPtr> victims;
  std::vector<PlanId> victim_ids;
  {
    MutexLock lock(append_mu);
    victim_ids = pick(kept);
    for (const PlanId id : victim_ids) {
      auto it = kept.find(id);
      victims.push_back(std::move(it->second));
      kept.erase(it);
      by_id.erase(id);
    }
    kept_count.store(kept.size(), std::memory_order_relaxed);
  }
  if (victims.empty()) return 0;
  count_change();
  for (std::size_t i = 0; i < victims.size(); ++i) unindex(victim_ids[i], victims[i]->plan.operations.front());
  return victims.size();
}

void ExecutionPlanStore::Impl::unindex(PlanId id, const ir::Operation& first) {
  {
    FirstOpMap::accessor acc;
    if (first_op.find(acc, hasher(first))) {
      Bucket& bucket = acc->second;
      for (auto s = bucket.begin(); s != bucket.end(); ++s) {
        if (!(s->op == first)) continue;
        std::erase(s->ids, id);
        if (s->ids.empty()) bucket.erase(s);
        break;
      }
      if (bucket.empty()) first_op.erase(acc);
    }
  }
  KindMap::accessor kacc;
  if (by_kind.find(kacc, kind_key(first))) {
    std::vector<PlanId>& ids = kacc->second;
    auto it = std::lower_bound(ids.begin(), ids.end(), id);
    if (it != ids.end() && *it == id) ids.erase(it);
    if (ids.empty()) by_kind.erase(kacc);
  }
}

ExecutionPlanStore::ExecutionPlanStore() : ExecutionPlanStore(OpHasher(&ir::hash_operation)) {}

ExecutionPlanStore::ExecutionPlanStore(PlanStoreOptions options)
    : ExecutionPlanStore(OpHasher(&ir::hash_operation), options) {}

ExecutionPlanStore::ExecutionPlanStore(OpHasher hasher, PlanStoreOptions options)
    : impl_(std::make_unique<Impl>(std::move(hasher), options)) {}

ExecutionPlanStore::~ExecutionPlanStore() = default;

ExecutionPlanStore::AddResult ExecutionPlanStore::add(ExecutionPlan plan, ExecutionTrigger trigger,
                                                      std::uint32_t creator_tag) {
  assert(!plan.operations.empty() && "ExecutionPlanStore::add: a plan must cover at least one op");
  if (plan.operations.empty()) return AddResult{kInvalidPlanId, false, nullptr};
  AddResult result = publish(std::move(plan), std::move(trigger), creator_tag);
  if (result.inserted) impl_->evict_if_over_bound();  // with no bucket held (lock order)
  return result;
}

ExecutionPlanStore::AddResult ExecutionPlanStore::publish(ExecutionPlan plan, ExecutionTrigger trigger,
                                                          std::uint32_t creator_tag) {
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
      Impl::SlotPtr s = im.find(existing);
      if (s == nullptr) continue;  // evicted; its id leaves this bucket shortly
      if (s->plan.operations == plan.operations) {
        if (im.add_trigger_to(*s, trigger)) im.count_change();
        const ExecutionPlan* p = &s->plan;
        return AddResult{existing, false, PlanPin(std::move(s), p)};
      }
    }
  }

  const std::uint64_t kk = kind_key(plan.operations.front());
  // Build the slot completely before it becomes reachable.
  auto slot = std::make_shared<Impl::Slot>(std::move(plan), std::move(trigger),
                                           im.clock.fetch_add(1, std::memory_order_relaxed) + 1, creator_tag);
  PlanId id;
  {
    MutexLock lock(im.append_mu);
    id = im.next_id++;
    im.kept.emplace(id, slot);
    im.kept_count.store(im.kept.size(), std::memory_order_relaxed);
    // The by_id bucket's lock orders the slot's construction before any reader that finds it.
    im.by_id.insert({id, slot});
  }
  im.count_change();

  // Publish the id in the bucket (visible to readers once `acc` is released).
  if (starter != nullptr) {
    starter->ids.push_back(id);
  } else {
    bucket.push_back(Impl::Starter{slot->plan.operations.front(), {id}});  // new op or hash collision
  }

  {
    Impl::KindMap::accessor kacc;
    im.by_kind.insert(kacc, kk);
    std::vector<PlanId>& ids = kacc->second;
    // Plans of one kind may come from different first-op buckets in any order: keep ids sorted.
    ids.insert(std::upper_bound(ids.begin(), ids.end(), id), id);
  }
  const ExecutionPlan* p = &slot->plan;
  return AddResult{id, true, PlanPin(std::move(slot), p)};
}

void ExecutionPlanStore::add_trigger(PlanId id, const ExecutionTrigger& trigger) {
  if (Impl::SlotPtr s = impl_->find(id); s != nullptr && impl_->add_trigger_to(*s, trigger)) impl_->count_change();
}

PlanPin ExecutionPlanStore::plan(PlanId id) const {
  Impl::SlotPtr s = impl_->find(id);
  if (s == nullptr) return nullptr;
  const ExecutionPlan* p = &s->plan;
  return PlanPin(std::move(s), p);  // aliasing: keeps the slot alive
}

TriggerSnapshot ExecutionPlanStore::triggers(PlanId id) const {
  Impl::SlotPtr s = impl_->find(id);
  return s == nullptr ? nullptr : Impl::snapshot(*s);
}

void ExecutionPlanStore::mark_used(PlanId id) {
  Impl& im = *impl_;
  if (im.options.max_plans == 0) return;  // nothing is ever evicted: recency is not needed
  Impl::IdMap::const_accessor acc;
  if (!im.by_id.find(acc, id)) return;
  const std::uint64_t now = im.clock.load(std::memory_order_relaxed);
  // Written only when it changes: a plan run in a loop writes its stamp once per new plan.
  if (acc->second->last_used.load(std::memory_order_relaxed) != now)
    acc->second->last_used.store(now, std::memory_order_relaxed);
}

void ExecutionPlanStore::record_hit(PlanId id, std::uint32_t tag) {
  Impl& im = *impl_;
  // Under the bucket's read lock, as mark_used: no copy of the slot's shared_ptr (two more atomic
  // read-modify-writes on a line every stream running the plan shares).
  Impl::IdMap::const_accessor acc;
  if (!im.by_id.find(acc, id)) return;
  Impl::Slot& s = *acc->second;
  s.hits.fetch_add(1, std::memory_order_relaxed);
  if (const std::int64_t now = coarse_unix_ms(); s.last_used_ms.load(std::memory_order_relaxed) != now)
    s.last_used_ms.store(now, std::memory_order_relaxed);
  if (tag != 0) Impl::note_user(s, tag);
  if (im.options.max_plans != 0) {
    const std::uint64_t now = im.clock.load(std::memory_order_relaxed);
    if (s.last_used.load(std::memory_order_relaxed) != now) s.last_used.store(now, std::memory_order_relaxed);
  }
}

std::optional<PlanUsage> ExecutionPlanStore::usage(PlanId id) const {
  Impl::SlotPtr s = impl_->find(id);
  if (s == nullptr) return std::nullopt;
  PlanUsage u;
  u.hits = s->hits.load(std::memory_order_relaxed);
  u.last_used_ms = s->last_used_ms.load(std::memory_order_relaxed);
  u.creator_tag = s->creator_tag;
  for (const auto& t : s->user_tags)
    if (const std::uint32_t v = t.load(std::memory_order_relaxed); v != 0) u.user_tags.push_back(v);
  u.more_users = s->more_users.load(std::memory_order_relaxed);
  return u;
}

std::size_t ExecutionPlanStore::retire(std::optional<std::uint32_t> creator_tag) {
  MutexLock evicting(impl_->evict_mu);  // one removal at a time (lock order: evict_mu first)
  const std::size_t n = impl_->remove([&](const std::map<PlanId, Impl::SlotPtr>& plans) {
    std::vector<PlanId> ids;
    for (const auto& [id, slot] : plans)
      if (!creator_tag || slot->creator_tag == *creator_tag) ids.push_back(id);
    return ids;
  });
  impl_->retirements.fetch_add(n, std::memory_order_relaxed);
  return n;
}

std::uint64_t ExecutionPlanStore::retired() const { return impl_->retirements.load(std::memory_order_relaxed); }

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

std::size_t ExecutionPlanStore::size() const { return impl_->kept_count.load(std::memory_order_relaxed); }

std::vector<PlanId> ExecutionPlanStore::ids() const {
  MutexLock lock(impl_->append_mu);
  std::vector<PlanId> out;
  out.reserve(impl_->kept.size());
  for (const auto& entry : impl_->kept) out.push_back(entry.first);
  return out;
}

std::uint64_t ExecutionPlanStore::evicted() const { return impl_->evictions.load(std::memory_order_relaxed); }

std::size_t ExecutionPlanStore::max_plans() const { return impl_->options.max_plans; }
std::uint16_t ExecutionPlanStore::search_options() const { return impl_->options.search_options; }

std::uint64_t ExecutionPlanStore::generation() const {
  return impl_->generation.load(std::memory_order_acquire);  // pairs with count_change()
}

}  // namespace kiln::fusion

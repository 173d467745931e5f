// PlanCacheAutosaver (plan_cache.h): one background thread that saves a store's new plans,
// debounced, so a daemon that dies without a clean stop loses only the last few seconds of them.
//
// The thread polls ExecutionPlanStore::generation() every poll_interval (the store has no change
// notification to wait on) and sleeps on wake_ between polls, so stop() interrupts it at once.
#include <algorithm>
#include <cassert>
#include <exception>
#include <string>
#include <utility>

#include "kiln/fusion/plan_cache.h"

namespace kiln::fusion {
namespace {

using Clock = std::chrono::steady_clock;

// save_plan_cache reports failures as values; only an allocation failure (or a bug) throws, and
// an exception must not leave the thread (it would terminate the daemon).
Result<PlanCacheSaveReport> save_catching(const ExecutionPlanStore& store, const std::filesystem::path& dir) {
  try {
    return save_plan_cache(store, dir);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::Internal, "plan cache " + dir.string() + ": save failed: " + e.what());
  }
}

}  // namespace

PlanCacheAutosaver::PlanCacheAutosaver(const ExecutionPlanStore& store, std::filesystem::path dir,
                                       PlanCacheAutosaverOptions options)
    : store_(store), dir_(std::move(dir)), options_(std::move(options)) {
  stats_.saved_generation = store_.generation();  // what is there now counts as saved
  thread_ = std::thread([this] { run(); });
}

PlanCacheAutosaver::~PlanCacheAutosaver() { stop(); }

void PlanCacheAutosaver::stop() {
  MutexLock join_lock(join_mu_);
  // From on_save this would join the calling thread itself.
  assert(std::this_thread::get_id() != thread_.get_id() && "PlanCacheAutosaver::stop called from on_save");
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

PlanCacheAutosaverStats PlanCacheAutosaver::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

bool PlanCacheAutosaver::save_now(std::uint64_t& saved) {
  // Read before serialising: every change counted in `g` is in the file (acquire load); a change
  // made during the save leaves generation() above `g`, so the next poll saves again.
  const std::uint64_t g = store_.generation();
  const Result<PlanCacheSaveReport> r = save_catching(store_, dir_);
  {
    MutexLock lock(mu_);
    if (r.ok()) {
      ++stats_.saves;
      stats_.saved_generation = g;
      stats_.last_error.clear();
    } else {
      ++stats_.failures;
      stats_.last_error = r.error().to_string();
    }
  }
  if (r.ok()) saved = g;
  if (options_.on_save) options_.on_save(r);  // no lock held: it may call stats()
  return r.ok();
}

void PlanCacheAutosaver::run() {
  // A zero interval would make the wait below a busy loop.
  const Clock::duration poll = std::max<Clock::duration>(options_.poll_interval, std::chrono::milliseconds(1));
  std::uint64_t saved = 0;                                // generation the file holds
  std::uint64_t seen = 0;                                 // generation at the last poll
  bool pending = false;                                   // seen != saved: something waits to be written
  Clock::time_point first_change, last_change;            // when a poll first / last saw the pending changes
  Clock::time_point retry_at = Clock::time_point::min();  // no attempt before (error back-off)
  Clock::duration backoff = options_.error_backoff;

  MutexLock lock(mu_);
  saved = seen = stats_.saved_generation;
  while (!stopping_) {
    Clock::duration wait = poll;
    if (pending) {
      // Quiet for `debounce`, or `max_delay` after the first change, whichever comes first; never
      // inside a back-off.
      const Clock::time_point due =
          std::max(std::min(last_change + options_.debounce, first_change + options_.max_delay), retry_at);
      wait = std::clamp<Clock::duration>(due - Clock::now(), Clock::duration::zero(), poll);
    }
    // A spurious wake-up only makes this poll early.
    wake_.wait_for(lock, wait);
    if (stopping_) break;
    lock.unlock();  // never held while saving: stop() and stats() stay responsive

    const Clock::time_point now = Clock::now();
    if (const std::uint64_t g = store_.generation(); g != seen) {
      if (!pending) first_change = now;
      pending = true;
      last_change = now;
      seen = g;
    }
    const bool quiet = now - last_change >= options_.debounce;
    const bool overdue = now - first_change >= options_.max_delay;
    if (pending && now >= retry_at && (quiet || overdue)) {
      if (save_now(saved)) {
        // Changes made during the save are seen (and timed) by the next poll.
        pending = false;
        seen = saved;
        retry_at = Clock::time_point::min();
        backoff = options_.error_backoff;
      } else {
        retry_at = now + backoff;
        backoff = std::min<Clock::duration>(backoff * 2, options_.max_error_backoff);
      }
    }
    lock.lock();
  }
  lock.unlock();
  // The final save ignores any back-off: it is the last chance.
  if (store_.generation() != saved) (void)save_now(saved);
}

}  // namespace kiln::fusion

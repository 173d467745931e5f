// Execution plans on disk: every plan of an ExecutionPlanStore saved to one file and loaded back
// into a store, so a plan one daemon run found is a cache hit in the next (kilnd --plan-cache).
//
// File `DIR/plans.kpc` (format version 1; integers little-endian, varints as in ir/codec.h):
//
//   header   magic "KPLN" (4 bytes), format version u16, search options u16 (the store's
//            PlanStoreOptions::search_options: bit 0 = the row fuser),
//            op table fingerprint u32 (ir::codec::op_table_fingerprint(): op kinds are stored by
//            index), kiln version (u8 length + bytes), payload length u64,
//            payload checksum u64 (64-bit FNV-1a of the payload bytes)
//   payload  plan count varint, then per plan:
//              operations   an ir::codec OperationList message (varint byte length + message)
//              triggers     count varint; per trigger: kind u8, operations (byte length varint,
//                           0 = none, else an OperationList message)
//              optimization block ordering (count varint + varints), then the strategy tree:
//                           kind u8; Optimization: optimization kind u8 (1 = FusedOptimization),
//                           len varint, the FusedProgram, ordering, score varint;
//                           Operations: ordering; Composed: child count varint + children
//
// A file written by another format version, another kiln version, another op table or another
// search (the row fuser on where this store has it off, or the reverse) is ignored as a whole: plans are the search's
// results, and a different kiln may search (or run a FusedProgram) differently, so stale plans must not bypass the new
// search. Decoding treats the file as untrusted even though its directory is owner-only: every length is bounded by the
// bytes that remain, every enum range-checked, nesting depth capped, and every plan validated (orderings a permutation
// of its operations, program registers / inputs / outputs / scalar placeholders in range) before anything reaches the
// store. Loading is all-or-nothing per file: a problem anywhere ignores the whole file (a warning, never an error that
// stops the daemon).
//
// Plans whose optimization is not a FusedOptimization (an optimization kind this format cannot
// rebuild) are skipped when saving and counted; the rest of the file is still written.
//
// Loading merges into the store through ExecutionPlanStore::add, so the store's own dedupe
// applies: a plan whose operations equal a plan already there is not added again (the existing
// plan, and its optimization, win) and gains the loaded plan's triggers.
//
// Usage (the daemon):
//   PlanCacheLoadReport r = load_plan_cache(store, dir, log);   // at start; never fails
//   ... run ...
//   if (Result<PlanCacheSaveReport> s = save_plan_cache(store, dir); !s.ok()) warn(s.error());
// or, so that a crash loses only the last few seconds, a PlanCacheAutosaver (below) from the load
// to the stop.
//
// Thread-safety: free functions without shared state (PlanCacheAutosaver states its own below).
// Saving reads the store through its concurrent API (a plan published meanwhile may or may not be
// included); loading inserts through ExecutionPlanStore::add, so either may run while streams use
// the store. Two processes saving into the same directory each write a private temporary file
// and rename it: the last one wins, and a reader always sees one whole file.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/base/mutex.h"
#include "kiln/base/result.h"
#include "kiln/fusion/fusion_log.h"
#include "kiln/fusion/plan_store.h"

namespace kiln::fusion {

inline constexpr std::uint16_t kPlanCacheFormatVersion = 2;  // 2: ProgramKind::Row, search options
inline constexpr std::string_view kPlanCacheFileName = "plans.kpc";
// Larger files are refused unread: a store holds thousands of plans of a few KiB at most, and
// the cap bounds what one (corrupt or planted) file can make the daemon read and allocate.
inline constexpr std::size_t kMaxPlanCacheBytes = std::size_t{64} << 20;

// The kiln version this build writes and expects (the project version, "0.1.0").
std::string_view plan_cache_kiln_version();

// Why a file was ignored.
enum class PlanCacheProblem : std::uint8_t {
  None,             // read, and every plan in it considered
  UnsafeDirectory,  // the directory is not ours alone (other owner, group/other writable)
  Unreadable,       // I/O error, or not a regular file
  TooLarge,         // above kMaxPlanCacheBytes
  Truncated,        // shorter than its header (or its header's payload length) says
  BadMagic,         // not a plan cache file
  FormatVersion,    // another format version
  KilnVersion,      // written by another kiln version
  OpTable,          // written by a kiln with another op table
  SearchOptions,    // written by another search (PlanStoreOptions::search_options differ)
  Checksum,         // payload checksum mismatch
  Malformed,        // checksum fine but the content is invalid (bad enum, index out of range, ...)
};
const char* plan_cache_problem_name(PlanCacheProblem p);

struct PlanCacheLoadReport {
  bool found = false;  // DIR/plans.kpc existed (not looked for when the directory was refused)
  // DIR was not used: it is not ours alone (problem UnsafeDirectory), or stat(2) failed other
  // than with ENOENT (Unreadable). Not "nothing saved yet": a file may well be there.
  bool directory_refused = false;
  std::size_t loaded = 0;                             // plans new to the store
  std::size_t merged = 0;                             // plans the store already had (same operations): triggers merged
  PlanCacheProblem problem = PlanCacheProblem::None;  // != None: the whole file was ignored
  std::string reason;                                 // what was wrong (names the field and byte offset); empty if fine
  bool ok() const { return problem == PlanCacheProblem::None; }
  // Nothing to load and nothing wrong: DIR or DIR/plans.kpc does not exist yet (a first run).
  bool nothing_saved() const { return !found && ok(); }
};

struct PlanCacheSaveReport {
  std::size_t saved = 0;    // plans written
  std::size_t skipped = 0;  // plans whose optimization kind cannot be serialized
  std::size_t bytes = 0;    // file size
  std::filesystem::path file;
};

// ---- Bytes (no file system).

struct SerializedPlans {
  std::vector<std::uint8_t> bytes;
  std::size_t saved = 0;
  std::size_t skipped = 0;
};
// Every plan of `store` in id order, with its current triggers. `kiln_version` is what the
// header records (tests pass another one to exercise the version check).
SerializedPlans serialize_plans(const ExecutionPlanStore& store,
                                std::string_view kiln_version = plan_cache_kiln_version());

// A decoded plan and its triggers (at least one), ready for ExecutionPlanStore::add.
struct PlanRecord {
  ExecutionPlan plan;
  TriggerList triggers;
};
struct DecodedPlans {
  std::vector<PlanRecord> plans;
  PlanCacheProblem problem = PlanCacheProblem::None;
  std::string reason;
  bool ok() const { return problem == PlanCacheProblem::None; }
};
// Decodes and validates a whole file; on any problem `plans` is empty.
DecodedPlans decode_plans(std::span<const std::uint8_t> bytes, std::uint16_t expected_search_options,
                          std::string_view expected_kiln_version = plan_cache_kiln_version());

// decode_plans (expecting the store's search options), then every plan into `store` (after the
// whole file validated).
PlanCacheLoadReport load_plans(std::span<const std::uint8_t> bytes, ExecutionPlanStore& store,
                               std::string_view expected_kiln_version = plan_cache_kiln_version());

// Structural check of one plan (what decode_plans runs on each; also usable on a live store):
// non-empty operations, at least one trigger, the block ordering a permutation of the operation
// positions equal to the strategy's leaves in execution order, every optimization leaf a
// FusedOptimization covering exactly its ordering, and its program internally consistent.
Status validate_plan(const ExecutionPlan& plan, const TriggerList& triggers);

// ---- Directory.

// Writes DIR/plans.kpc atomically: a private temporary file in DIR, fsync, rename(2), fsync of
// DIR. Creates DIR (mode 0700, parents as needed) when absent. Errors (ErrorCode::Config): DIR
// is not a directory, is owned by another user, or is writable by group or others; any I/O
// failure (the previous file, if any, is left intact).
Result<PlanCacheSaveReport> save_plan_cache(const ExecutionPlanStore& store, const std::filesystem::path& dir);

// Loads DIR/plans.kpc into `store`. Never fails: a missing directory or file loads nothing
// (nothing_saved()); an unsafe directory (directory_refused) or a file that is unreadable,
// corrupt, truncated or from another version is ignored with a warning (spdlog's default logger,
// and the fusion log at level basic) and the report says why.
PlanCacheLoadReport load_plan_cache(ExecutionPlanStore& store, const std::filesystem::path& dir, const FusionLog& log);

// ---- Saving as plans are learned.

struct PlanCacheAutosaverOptions {
  // Quiet period: a save waits until the store has not changed for this long, so a burst of new
  // plans (a program being explored) is written once rather than once per plan.
  std::chrono::milliseconds debounce{2000};
  // ... but never longer than this after the first unsaved change was seen, so a store that
  // changes constantly is still saved: a SIGKILL loses at most about this much learning.
  std::chrono::milliseconds max_delay{5000};
  // How often the saver reads ExecutionPlanStore::generation(). The store has no change
  // notification (its writers are the streams' hot path), and one atomic load five times a
  // second costs nothing; the deadlines above are met to within one interval.
  std::chrono::milliseconds poll_interval{200};
  // After a failed save no attempt for this long, doubled per consecutive failure up to
  // max_error_backoff (a success resets it): a broken directory costs one attempt and one
  // on_save call per back-off, never a busy loop. Unsaved changes stay pending meanwhile.
  std::chrono::milliseconds error_backoff{10'000};
  std::chrono::milliseconds max_error_backoff{600'000};  // ten minutes: at most six reports an hour
  // Called on the saver thread after every attempt, successful or not, stop()'s final one
  // included. It must not throw, and must not call stop() or destroy the saver. Empty: attempts
  // are only counted (stats()).
  std::function<void(const Result<PlanCacheSaveReport>&)> on_save;
};

struct PlanCacheAutosaverStats {
  std::uint64_t saves = 0;             // successful saves
  std::uint64_t failures = 0;          // failed attempts
  std::uint64_t saved_generation = 0;  // store generation the file holds (at first: at construction)
  std::string last_error;              // the latest attempt's error; empty after a success
};

// Saves a store into DIR with save_plan_cache (atomic: a reader or a crash sees a whole file)
// whenever it changed, debounced, so a daemon killed without a clean stop loses at most the
// last few seconds of learned plans.
//
// What the store holds at construction counts as saved (typically it was just loaded from DIR):
// only later changes are written, and nothing at all if nothing changes.
//
// Usage (the daemon; the store outlives the saver):
//   load_plan_cache(store, dir, log);
//   PlanCacheAutosaver saver(store, dir, {.on_save = [](const Result<PlanCacheSaveReport>& r) {
//                              if (!r.ok()) spdlog::error("{}", r.error().to_string()); }});
//   ... streams run ...
//   saver.stop();  // once the streams have stopped: writes what is still unsaved
//
// Thread-safety: the constructor starts one background thread; it alone saves and calls on_save,
// and holds no lock while saving (it reads the store through its concurrent API, so streams keep
// publishing; a plan published during a save goes into the next one). stop() and stats() may be
// called from any thread except from on_save; stop() is idempotent and concurrent calls are
// serialised (join_mu_). The stop flag and the stats are guarded by mu_ (checked by clang).
class PlanCacheAutosaver {
 public:
  PlanCacheAutosaver(const ExecutionPlanStore& store, std::filesystem::path dir,
                     PlanCacheAutosaverOptions options = {});
  ~PlanCacheAutosaver();  // stop()
  PlanCacheAutosaver(const PlanCacheAutosaver&) = delete;
  PlanCacheAutosaver& operator=(const PlanCacheAutosaver&) = delete;

  // Wakes the saver, which saves once more if anything is unsaved (even during an error
  // back-off), then joins it. Returns after that final attempt and its on_save call.
  void stop();

  PlanCacheAutosaverStats stats() const;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  void run();
  // One save_plan_cache attempt: updates stats_ (and `saved`, the generation the file holds, on
  // success) and calls on_save. Returns whether it succeeded.
  bool save_now(std::uint64_t& saved);

  const ExecutionPlanStore& store_;
  const std::filesystem::path dir_;
  const PlanCacheAutosaverOptions options_;

  mutable Mutex mu_;
  std::condition_variable_any wake_;  // signalled by stop()
  bool stopping_ KILN_GUARDED_BY(mu_) = false;
  PlanCacheAutosaverStats stats_ KILN_GUARDED_BY(mu_);

  Mutex join_mu_ KILN_ACQUIRED_BEFORE(mu_);  // serialises stop()'s join
  std::thread thread_;                       // started by the constructor's body: every member is ready
};

}  // namespace kiln::fusion

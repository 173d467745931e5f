// The daemon's metrics: a snapshot of its counters (DaemonService::metrics()) and its rendering
// in the Prometheus text exposition format (version 0.0.4), which the metrics endpoint
// (metrics_server.h) serves and `kilnctl metrics` prints. docs/operations.md lists every metric
// with its meaning.
//
// Per-job counters are kept off the op path: each client session counts into its own
// single-writer atomics (LatencyHistogram, RequestCounters), and a scrape sums them; a session
// that ends folds its counts into its job's and the device's totals, so counters never go back.
//
// Thread-safety: LatencyHistogram and RequestCounters have one writer thread and any number of
// readers; the snapshot structs are plain values.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/ipc/protocol.h"
#include "kiln/runtime/fallback.h"

namespace kiln::ipc {

// Upper bounds of the latency buckets, in nanoseconds (1 us to 2.5 s; a last bucket is +Inf).
inline constexpr std::array<std::uint64_t, 14> kLatencyBucketsNs = {
    1'000,     2'500,      10'000,     25'000,      100'000,     250'000,       1'000'000,
    2'500'000, 10'000'000, 25'000'000, 100'000'000, 250'000'000, 1'000'000'000, 2'500'000'000};
inline constexpr std::size_t kLatencyBuckets = kLatencyBucketsNs.size() + 1;

struct LatencySnapshot {
  std::array<std::uint64_t, kLatencyBuckets> counts{};  // per bucket (not cumulative)
  std::uint64_t sum_ns = 0;
  std::uint64_t count() const;
  void add(const LatencySnapshot& o);
};

// One writer observes; any thread snapshots (relaxed: a scrape may see one observation's bucket
// before its sum, never a torn value).
class LatencyHistogram {
 public:
  void observe(std::chrono::nanoseconds d);
  LatencySnapshot snapshot() const;

 private:
  std::array<std::atomic<std::uint64_t>, kLatencyBuckets> counts_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

inline constexpr std::size_t kNumCommandKinds = static_cast<std::size_t>(CommandKind::Control);
inline constexpr std::size_t kNumErrorCodes = static_cast<std::size_t>(ErrorCode::Internal) + 1;

// Requests refused with an error completion, by ErrorCode (a session's, single writer).
struct RejectedCounts {
  std::array<std::uint64_t, kNumErrorCodes> by_code{};
  void add(const RejectedCounts& o) {
    for (std::size_t i = 0; i < by_code.size(); ++i) by_code[i] += o.by_code[i];
  }
};

// The backend's counters the metrics show (kilnd reads them from the CPU or CUDA backend).
struct BackendCounters {
  std::uint64_t fused_launches = 0;  // fused programs run as one launch (staged: one per stage)
  std::uint64_t single_ops = 0;      // operations run one by one (not part of a fused launch)
  std::uint64_t fused_replays = 0;   // fused programs replayed op by op
  runtime::FallbackCounts fallbacks_by_reason{};
  std::uint64_t memory_limit_bytes = 0;  // the device memory limit (0: none)
};

// The limits an operator may change while the daemon runs (kilnctl limits set, reload). 0 means
// unlimited, as in kiln.toml, except for the connection limits (at least 1).
struct LiveLimits {
  std::uint64_t job_memory_bytes = 0;
  std::uint64_t job_queued_ops = 0;
  std::uint64_t uid_memory_bytes = 0;
  std::uint64_t uid_queued_ops = 0;
  std::uint64_t uid_jobs = 0;
  std::uint64_t staging_bytes = 0;
  std::uint64_t max_connections = 0;
  std::uint64_t max_connections_per_uid = 0;
  friend bool operator==(const LiveLimits&, const LiveLimits&) = default;
};

// One live limit by its kiln.toml key (job_memory_mib, ..., max_connections_per_uid): its field,
// the unit its key counts in (bytes per unit: 2^20 for the *_mib keys, else 1) and the least value.
struct LiveLimitKey {
  const char* key;
  std::uint64_t LiveLimits::*field;
  std::uint64_t unit;
  std::uint64_t min;
};
const std::vector<LiveLimitKey>& live_limit_keys();
// Applies "key=value key=value ..." to `limits` (all or nothing). Errors name the key: "limits:
// unknown key 'job_memory'; keys: job_memory_mib, ...", "limits: max_connections must be >= 1".
Status apply_limit_assignments(std::string_view assignments, LiveLimits& limits);
// "job_memory_mib = 4096" lines, one per key (units as kiln.toml writes them; 0 = unlimited).
std::string limits_to_text(const LiveLimits& limits);
std::string limits_to_json(const LiveLimits& limits);

struct JobMetrics {
  std::string name;
  std::uint32_t owner_uid = 0;
  std::uint64_t clients = 0;
  std::uint64_t tensor_bytes = 0;
  std::uint64_t queued_ops = 0;
  std::uint64_t ops_registered = 0;
  // Its streams' processor counters (live streams now, plus those its clients closed).
  std::uint64_t ops_executed = 0, cache_hits = 0, explorations = 0, plans_created = 0;
  // What its streams' plans asked the backend for: fused blocks (a launch each), ops one by one.
  std::uint64_t fused_launches = 0, unfused_ops = 0;
  RejectedCounts rejected;
  std::map<std::string, std::uint64_t> fallbacks;  // its live clients' last reports, by op
};

struct DaemonMetrics {
  std::string device;
  bool draining = false;
  std::uint64_t clients = 0, clients_served = 0, streams = 0;
  std::uint64_t plans = 0, max_plans = 0, plans_evicted = 0;
  std::uint64_t cache_hits = 0, explorations = 0;
  std::uint64_t queued_ops = 0;  // every job's
  std::uint64_t memory_bytes = 0, device_tensors = 0, staged_bytes = 0;
  BackendCounters backend;
  LiveLimits limits;
  std::vector<JobMetrics> jobs;
  RejectedCounts rejected;                                   // every client, since start
  std::map<std::string, std::uint64_t> refused;              // connections refused, by reason
  std::array<LatencySnapshot, kNumCommandKinds> requests{};  // answered commands, by kind
  LatencySnapshot op_admission;                              // register_op, sampled (1 in kOpLatencySample)

  // The Prometheus text exposition format (0.0.4).
  std::string to_prometheus() const;
};

// register_op's admission time is measured on 1 op in this many (two clock reads on every op
// would cost the op path a few percent).
inline constexpr std::uint64_t kOpLatencySample = 64;

}  // namespace kiln::ipc

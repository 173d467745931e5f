// The daemon's metrics and live limits (kiln/ipc/daemon_metrics.h).
#include "kiln/ipc/daemon_metrics.h"

#include "words.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <string_view>

namespace kiln::ipc {

// ---- Latency histograms

std::uint64_t LatencySnapshot::count() const {
  std::uint64_t n = 0;
  for (std::uint64_t c : counts) n += c;
  return n;
}

void LatencySnapshot::add(const LatencySnapshot& o) {
  for (std::size_t i = 0; i < counts.size(); ++i) counts[i] += o.counts[i];
  sum_ns += o.sum_ns;
}

void LatencyHistogram::observe(std::chrono::nanoseconds d) {
  const auto ns = static_cast<std::uint64_t>(std::max<std::int64_t>(0, d.count()));
  const std::size_t bucket = static_cast<std::size_t>(
      std::lower_bound(kLatencyBucketsNs.begin(), kLatencyBucketsNs.end(), ns) - kLatencyBucketsNs.begin());
  // One writer: a load and a store, no read-modify-write on the op path.
  counts_[bucket].store(counts_[bucket].load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  sum_ns_.store(sum_ns_.load(std::memory_order_relaxed) + ns, std::memory_order_relaxed);
}

LatencySnapshot LatencyHistogram::snapshot() const {
  LatencySnapshot s;
  for (std::size_t i = 0; i < counts_.size(); ++i) s.counts[i] = counts_[i].load(std::memory_order_relaxed);
  s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
  return s;
}

// ---- Live limits

const std::vector<LiveLimitKey>& live_limit_keys() {
  static const std::vector<LiveLimitKey> keys = {
      {"job_memory_mib", &LiveLimits::job_memory_bytes, std::uint64_t{1} << 20, 0},
      {"job_queued_ops", &LiveLimits::job_queued_ops, 1, 0},
      {"uid_memory_mib", &LiveLimits::uid_memory_bytes, std::uint64_t{1} << 20, 0},
      {"uid_queued_ops", &LiveLimits::uid_queued_ops, 1, 0},
      {"uid_jobs", &LiveLimits::uid_jobs, 1, 0},
      {"staging_mib", &LiveLimits::staging_bytes, std::uint64_t{1} << 20, 0},
      {"max_connections", &LiveLimits::max_connections, 1, 1},
      {"max_connections_per_uid", &LiveLimits::max_connections_per_uid, 1, 1},
  };
  return keys;
}

namespace {

std::string key_list() {
  std::string out;
  for (const LiveLimitKey& k : live_limit_keys()) out += (out.empty() ? "" : ", ") + std::string(k.key);
  return out;
}

}  // namespace

Status apply_limit_assignments(std::string_view assignments, LiveLimits& limits) {
  LiveLimits next = limits;
  const std::vector<std::string_view> words = split_words(assignments);
  for (const std::string_view word : words) {
    const std::size_t eq = word.find('=');
    if (eq == std::string_view::npos)
      return make_error(ErrorCode::Invalid, fmt::format("limits: '{}' is not key=value", word));
    const std::string_view key = word.substr(0, eq), text = word.substr(eq + 1);
    const auto k = std::find_if(live_limit_keys().begin(), live_limit_keys().end(),
                                [&](const LiveLimitKey& l) { return key == l.key; });
    if (k == live_limit_keys().end())
      return make_error(ErrorCode::Invalid,
                        fmt::format("limits: unknown key '{}'; the keys that change live: {}", key, key_list()));
    std::uint64_t value = 0;
    const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || ptr != text.data() + text.size() || text.empty())
      return make_error(ErrorCode::Invalid,
                        fmt::format("limits: {} must be a non-negative integer, not '{}'", key, text));
    if (value < k->min) return make_error(ErrorCode::Invalid, fmt::format("limits: {} must be >= {}", key, k->min));
    if (value > std::numeric_limits<std::uint64_t>::max() / k->unit)
      return make_error(ErrorCode::Invalid, fmt::format("limits: {} = {} is too large", key, value));
    next.*(k->field) = value * k->unit;
  }
  if (words.empty())
    return make_error(ErrorCode::Invalid, "limits: nothing to set; give key=value pairs (" + key_list() + ")");
  limits = next;
  return Status::Ok();
}

std::string limits_to_text(const LiveLimits& limits) {
  std::string out;
  for (const LiveLimitKey& k : live_limit_keys()) {
    const std::uint64_t v = limits.*(k.field) / k.unit;
    out += fmt::format("{} = {}{}\n", k.key, v, v == 0 && k.min == 0 ? " (unlimited)" : "");
  }
  return out;
}

std::string limits_to_json(const LiveLimits& limits) {
  std::string out = "{";
  for (const LiveLimitKey& k : live_limit_keys())
    out += fmt::format("{}\"{}\":{}", out.size() > 1 ? "," : "", k.key, limits.*(k.field) / k.unit);
  return out + "}";
}

// ---- Prometheus exposition

namespace {

// A label value: backslash, double quote and newline escaped (the exposition format's rules).
std::string label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

class Exposition {
 public:
  // A metric's HELP and TYPE lines (once per family).
  void family(std::string_view name, std::string_view type, std::string_view help) {
    fmt::format_to(std::back_inserter(out_), "# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void sample(std::string_view name, std::string_view labels, std::uint64_t v) {
    fmt::format_to(std::back_inserter(out_), "{}{}{}{} {}\n", name, labels.empty() ? "" : "{", labels,
                   labels.empty() ? "" : "}", v);
  }
  void sample(std::string_view name, std::string_view labels, double v) {
    fmt::format_to(std::back_inserter(out_), "{}{}{}{} {}\n", name, labels.empty() ? "" : "{", labels,
                   labels.empty() ? "" : "}", v);
  }
  void one(std::string_view name, std::string_view type, std::string_view help, std::uint64_t v) {
    family(name, type, help);
    sample(name, "", v);
  }
  // A histogram's buckets (cumulative, le in seconds), sum (seconds) and count.
  void histogram(std::string_view name, std::string_view labels, const LatencySnapshot& h) {
    std::uint64_t cumulative = 0;
    const std::string sep = labels.empty() ? "" : ",";
    for (std::size_t i = 0; i < kLatencyBucketsNs.size(); ++i) {
      cumulative += h.counts[i];
      sample(fmt::format("{}_bucket", name),
             fmt::format("{}{}le=\"{}\"", labels, sep, double(kLatencyBucketsNs[i]) / 1e9), cumulative);
    }
    cumulative += h.counts.back();
    sample(fmt::format("{}_bucket", name), fmt::format("{}{}le=\"+Inf\"", labels, sep), cumulative);
    sample(fmt::format("{}_sum", name), labels, double(h.sum_ns) / 1e9);
    sample(fmt::format("{}_count", name), labels, cumulative);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

// ErrorCode's name as a label: "resource_exhausted" for ResourceExhausted.
std::string code_label(std::size_t code) {
  const std::string_view name = error_code_name(static_cast<ErrorCode>(code));
  std::string out;
  for (char c : name) {
    if (c >= 'A' && c <= 'Z') {
      if (!out.empty()) out += '_';
      out += static_cast<char>(c - 'A' + 'a');
    } else {
      out += c;
    }
  }
  return out;
}

void device_gauges(Exposition& e, const DaemonMetrics& m) {
  e.family("kiln_info", "gauge", "The daemon: its device and protocol version (always 1).");
  e.sample("kiln_info", fmt::format("device=\"{}\",protocol=\"{}\"", label(m.device), kProtocolVersion),
           std::uint64_t{1});
  e.one("kiln_draining", "gauge", "1 while the daemon refuses new clients (kilnctl drain).", m.draining ? 1 : 0);
  e.one("kiln_clients", "gauge", "Clients connected now.", m.clients);
  e.one("kiln_clients_served_total", "counter", "Clients admitted since start.", m.clients_served);
  e.one("kiln_jobs", "gauge", "Jobs with a client now.", m.jobs.size());
  e.one("kiln_streams", "gauge", "Device streams open.", m.streams);
  e.one("kiln_plans", "gauge", "Execution plans in the device's plan store.", m.plans);
  e.one("kiln_plans_max", "gauge", "The plan store's bound (0: unbounded).", m.max_plans);
  e.one("kiln_plans_evicted_total", "counter", "Plans evicted by the bound.", m.plans_evicted);
  e.one("kiln_plan_cache_hits_total", "counter", "Cached plans executed (all streams).", m.cache_hits);
  e.one("kiln_plan_cache_misses_total", "counter", "Explorations: op sequences no cached plan covered.",
        m.explorations);
  e.one("kiln_queued_ops", "gauge", "Operations registered and not yet executed (every job).", m.queued_ops);
  e.one("kiln_memory_bytes", "gauge", "Device memory held for live tensors.", m.memory_bytes);
  e.one("kiln_memory_limit_bytes", "gauge", "The device memory limit (0: none).", m.backend.memory_limit_bytes);
  e.one("kiln_device_tensors", "gauge", "Entries in the device's tensor table.", m.device_tensors);
  e.one("kiln_staging_bytes", "gauge", "Host memory staging chunked transfers.", m.staged_bytes);
  e.family("kiln_launches_total", "counter", "Backend launches: fused programs, and operations run one by one.");
  e.sample("kiln_launches_total", "kind=\"fused\"", m.backend.fused_launches);
  e.sample("kiln_launches_total", "kind=\"unfused\"", m.backend.single_ops);
  e.one("kiln_fused_replays_total", "counter", "Fused programs replayed op by op (see kiln_fallbacks_total).",
        m.backend.fused_replays);
  e.family("kiln_fallbacks_total", "counter", "Fused programs replayed op by op, by reason.");
  for (std::size_t r = 0; r < runtime::kFallbackReasonCount; ++r)
    e.sample("kiln_fallbacks_total",
             fmt::format("reason=\"{}\"", runtime::fallback_reason_name(static_cast<runtime::FallbackReason>(r))),
             m.backend.fallbacks_by_reason[r]);
  e.family("kiln_limit", "gauge", "The live limits (kilnctl limits; bytes for *_mib keys; 0: unlimited).");
  for (const LiveLimitKey& k : live_limit_keys()) {
    std::string name = k.key;
    if (k.unit != 1) name = name.substr(0, name.size() - 4) + "_bytes";  // job_memory_mib -> job_memory_bytes
    e.sample("kiln_limit", fmt::format("name=\"{}\"", name), m.limits.*(k.field));
  }
}

void rejections(Exposition& e, const DaemonMetrics& m) {
  e.family("kiln_rejected_requests_total", "counter", "Client commands answered with an error, by error code.");
  for (std::size_t c = 0; c < kNumErrorCodes; ++c)
    if (m.rejected.by_code[c] != 0)
      e.sample("kiln_rejected_requests_total", fmt::format("code=\"{}\"", code_label(c)), m.rejected.by_code[c]);
  e.family("kiln_refused_connections_total", "counter", "Connections refused at the handshake, by reason.");
  for (const auto& [reason, n] : m.refused)
    e.sample("kiln_refused_connections_total", fmt::format("reason=\"{}\"", label(reason)), n);
}

void latencies(Exposition& e, const DaemonMetrics& m) {
  e.family("kiln_request_duration_seconds", "histogram",
           "Answered commands: from the command's arrival in the daemon to its completion on the client's ring.");
  for (std::size_t k = 0; k < kNumCommandKinds; ++k) {
    if (m.requests[k].count() == 0) continue;
    e.histogram("kiln_request_duration_seconds",
                fmt::format("command=\"{}\"", command_kind_name(static_cast<CommandKind>(k + 1))), m.requests[k]);
  }
  e.family("kiln_op_admission_seconds", "histogram",
           "register_op: decode, check against the daemon's records and enqueue on the stream (1 op in 64 timed).");
  e.histogram("kiln_op_admission_seconds", "", m.op_admission);
}

void per_job(Exposition& e, const DaemonMetrics& m) {
  struct Gauge {
    const char* name;
    const char* type;
    const char* help;
    std::uint64_t JobMetrics::*field;
  };
  static constexpr Gauge kJobFamilies[] = {
      {"kiln_job_clients", "gauge", "The job's clients now.", &JobMetrics::clients},
      {"kiln_job_memory_bytes", "gauge", "Bytes of the job's live tensors (its quota's use).",
       &JobMetrics::tensor_bytes},
      {"kiln_job_queued_ops", "gauge", "The job's operations registered and not yet executed.",
       &JobMetrics::queued_ops},
      {"kiln_job_ops_total", "counter", "Operations the job's clients registered.", &JobMetrics::ops_registered},
      {"kiln_job_ops_executed_total", "counter", "Operations of the job's streams the backend executed.",
       &JobMetrics::ops_executed},
      {"kiln_job_plan_cache_hits_total", "counter", "Cached plans the job's streams executed.",
       &JobMetrics::cache_hits},
      {"kiln_job_plan_cache_misses_total", "counter", "Explorations of the job's streams.", &JobMetrics::explorations},
      {"kiln_job_plans_created_total", "counter", "Plans the job's streams added to the store.",
       &JobMetrics::plans_created},
  };
  for (const Gauge& g : kJobFamilies) {
    e.family(g.name, g.type, g.help);
    for (const JobMetrics& j : m.jobs)
      e.sample(g.name, fmt::format("job=\"{}\",owner_uid=\"{}\"", label(j.name), j.owner_uid), j.*(g.field));
  }
  e.family("kiln_job_launches_total", "counter",
           "What the job's plans ran: fused blocks (one launch each) and operations one by one.");
  for (const JobMetrics& j : m.jobs) {
    const std::string labels = fmt::format("job=\"{}\",owner_uid=\"{}\"", label(j.name), j.owner_uid);
    e.sample("kiln_job_launches_total", labels + ",kind=\"fused\"", j.fused_launches);
    e.sample("kiln_job_launches_total", labels + ",kind=\"unfused\"", j.unfused_ops);
  }
  e.family("kiln_job_rejected_requests_total", "counter", "The job's commands answered with an error, by error code.");
  for (const JobMetrics& j : m.jobs)
    for (std::size_t c = 0; c < kNumErrorCodes; ++c)
      if (j.rejected.by_code[c] != 0)
        e.sample("kiln_job_rejected_requests_total",
                 fmt::format("job=\"{}\",code=\"{}\"", label(j.name), code_label(c)), j.rejected.by_code[c]);
  e.family("kiln_job_client_fallback_calls", "gauge",
           "Calls the job's live clients ran on their own CPU instead of kiln (their last reports), by op.");
  for (const JobMetrics& j : m.jobs)
    for (const auto& [op, n] : j.fallbacks)
      e.sample("kiln_job_client_fallback_calls", fmt::format("job=\"{}\",op=\"{}\"", label(j.name), label(op)), n);
}

}  // namespace

std::string DaemonMetrics::to_prometheus() const {
  Exposition e;
  device_gauges(e, *this);
  rejections(e, *this);
  latencies(e, *this);
  per_job(e, *this);
  return e.take();
}

}  // namespace kiln::ipc

// Timing, inputs and output lines of kiln-bench-peers, reimplemented from the peer kit's C++
// harness (../shared/bench-peers/bench_common.hpp) so that kiln's figures are measured and
// printed exactly as the peers' are: same environment knobs, same warm-up and repetition rule,
// same median / min / p90, same line format, same xorshift64* input fill.
//
// Thread-safety: none needed (the benchmark driver is single-threaded; the backend's own
// threads never call into this file).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::bench::peers {

inline double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::atof(v) : fallback;
}

inline bool quick_mode() {
  const char* q = std::getenv("BENCH_QUICK");
  return q != nullptr && std::string_view(q) == "1";
}

// The kit's knobs (README "Method"): BENCH_TARGET_S, BENCH_WARMUP_S, BENCH_MIN_REPS,
// BENCH_MAX_REPS, with the kit's defaults (and its BENCH_QUICK=1 defaults).
struct TimingParams {
  double target_s = 0.4;
  double warmup_s = 0.1;
  long min_reps = 7;
  long max_reps = 3000;

  static TimingParams from_env() {
    const bool quick = quick_mode();
    TimingParams p;
    p.target_s = env_double("BENCH_TARGET_S", quick ? 0.05 : 0.4);
    p.warmup_s = env_double("BENCH_WARMUP_S", quick ? 0.02 : 0.1);
    p.min_reps = static_cast<long>(env_double("BENCH_MIN_REPS", quick ? 3 : 7));
    p.max_reps = static_cast<long>(env_double("BENCH_MAX_REPS", 3000));
    return p;
  }
};

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The kit's rule: warm-up (>= 2 calls and >= warmup_s, at most 1000 calls), then
// reps = clamp(target_s / estimated call time, min_reps, max_reps) individually timed calls.
// kiln addition: `prime` calls run first, outside the warm-up clock. They are the calls that
// explore the fusion search, build the plans and compile the kernels (milliseconds, once), so
// that the estimated call time, and thus the repetition count, is that of a warm call.
// Returns the per-call times in ns, sorted.
template <class F>
std::vector<double> time_calls(const TimingParams& p, F&& call, int prime = 2) {
  for (int i = 0; i < prime; ++i) call();
  const double t0 = now_s();
  long k = 0;
  while (k < 2 || (now_s() - t0 < p.warmup_s && k < 1000)) {
    call();
    ++k;
  }
  const double est = (now_s() - t0) / static_cast<double>(k);
  const long reps = static_cast<long>(
      std::min<double>(static_cast<double>(p.max_reps),
                       std::max<double>(static_cast<double>(p.min_reps), p.target_s / std::max(est, 1e-9))));
  std::vector<double> ts(static_cast<std::size_t>(reps));
  for (auto& t : ts) {
    const auto s = std::chrono::steady_clock::now();
    call();
    const auto e = std::chrono::steady_clock::now();
    t = std::chrono::duration<double, std::nano>(e - s).count();
  }
  std::sort(ts.begin(), ts.end());
  return ts;
}

inline double median(std::span<const double> sorted) {
  const std::size_t r = sorted.size();
  return (r % 2) ? sorted[r / 2] : 0.5 * (sorted[r / 2 - 1] + sorted[r / 2]);
}

// One result line in the kit's format (README "Output format"): the six contract keys, then
// reps / min / p90 like the kit's peers, then `extra` (already formatted " key=value ..."),
// then pass=$BENCH_PASS when set.
inline void emit(std::string_view peer, std::string_view workload, long n, int threads, double bytes_per_elem,
                 std::span<const double> sorted_ns, const std::string& extra = {}) {
  const std::size_t r = sorted_ns.size();
  const double ns = median(sorted_ns) / static_cast<double>(n);
  const std::size_t i90 = std::min(r - 1, static_cast<std::size_t>(std::ceil(0.9 * static_cast<double>(r))) - 1);
  const char* pass = std::getenv("BENCH_PASS");
  const bool has_pass = pass != nullptr && *pass != '\0';
  std::printf(
      "peer=%.*s workload=%.*s n=%ld ns_per_elem=%.4g gbps=%.2f threads=%d reps=%zu "
      "min_ns_per_elem=%.4g p90_ns_per_elem=%.4g%s%s%s\n",
      static_cast<int>(peer.size()), peer.data(), static_cast<int>(workload.size()), workload.data(), n, ns,
      bytes_per_elem / ns, threads, r, sorted_ns[0] / static_cast<double>(n), sorted_ns[i90] / static_cast<double>(n),
      extra.c_str(), has_pass ? " pass=" : "", has_pass ? pass : "");
  std::fflush(stdout);
}

// Deterministic uniform fill in [lo, hi): the kit's xorshift64* generator (bench_common.hpp
// fill_uniform), bit for bit, so that kiln reads the very inputs the Eigen peer reads.
inline void fill_uniform(std::span<float> out, float lo, float hi, std::uint64_t seed) {
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& x : out) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    const double u = static_cast<double>((s * 0x2545F4914F6CDD1Dull) >> 11) * (1.0 / 9007199254740992.0);
    x = static_cast<float>(lo + (hi - lo) * u);
  }
}

inline std::vector<float> uniform(std::size_t n, float lo, float hi, std::uint64_t seed) {
  std::vector<float> v(n);
  fill_uniform(v, lo, hi, seed);
  return v;
}

inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::size_t a = 0;
  while (a <= s.size()) {
    std::size_t b = s.find(',', a);
    if (b == std::string::npos) b = s.size();
    if (b > a) out.push_back(s.substr(a, b - a));
    a = b + 1;
  }
  return out;
}

}  // namespace kiln::bench::peers

// kiln-bench-peers: kiln's CPU backend on the peer kit's workloads W1-W4
// (../shared/bench-peers/README.md), plus a 1024x1024 f32 matmul and, when asked for, the row
// workloads LN and CE (workloads.h; bench/peers/peer_rows.py times PyTorch on them), driven through kiln's own
// path: operations registered on a FusionStream, grouped by the fusion search, executed by the
// CPU executor. Prints the kit's line format so that summarize.py joins kiln with the peers:
//
//   peer=kiln-cpu-fused workload=W1 n=1048576 ns_per_elem=0.31 gbps=51.6 threads=2 reps=... [extra]
//
// Modes: `fused` (the default fuser list) and `unfused` (the same stream with an empty fuser
// list: every operation runs alone; see Client). Plan building (exploration) and kernel
// compilation happen in the untimed priming calls before the warm-up; every timed call hits
// the plan cache. Extra keys per line: fused_kernels / fused_ops / single_ops (what one call
// ran) and, for matmul1024, gflops. Environment: BENCH_QUICK, BENCH_TARGET_S, BENCH_MIN_REPS,
// BENCH_MAX_REPS, BENCH_WARMUP_S, BENCH_PASS (as the kit's peers), KILN_FUSION_LOG (the fusion
// log on stderr). docs/benchmarks.md explains how to run it inside the kit's passes.
//
// usage: kiln-bench-peers [--workloads W1,W2,W3,W4,matmul1024,LN,CE] [--sizes 65536,1048576,16777216]
//                         [--threads 1,2] [--mode fused|unfused|both] [--jit on|off] [--row-fuser on|off] [--dry-run]
// --jit on (the default): fused elementwise programs run as JIT-compiled loops (compiled in the
// untimed priming calls, cached on disk); off: the interpreter (docs/cpu-backend.md, "JIT").
// --row-fuser on (the default, as kiln's): kiln's row fuser joins the search (W4 is one Row
// program); off: Burn's fusers only (docs/fusion.md, "The row fuser").
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends.h"
#include "harness.h"
#include "kiln/fusion/config.h"
#include "kiln_client.h"
#include "workloads.h"
#ifdef KILN_BENCH_HAVE_EIGEN
#include "eigen_sgemm.h"
#endif

namespace kiln::bench::peers {
namespace {

struct Options {
  std::vector<std::string> workloads{"W1", "W2", "W3", "W4", "matmul1024"};
  std::vector<long> sizes{1L << 16, 1L << 20, 1L << 24};
  std::vector<int> threads{1, 2};
  std::vector<bool> fused{true, false};
  bool dry_run = false;
  bool jit = true;
  bool row_fuser = true;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "kiln-bench-peers: %s\n"
               "usage: kiln-bench-peers [--workloads W1,W2,W3,W4,matmul1024,LN,CE] [--sizes 65536,1048576,16777216]\n"
               "                        [--threads 1,2] [--mode fused|unfused|both] [--jit on|off] [--row-fuser "
               "on|off] [--dry-run]\n",
               why);
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--dry-run") {
      o.dry_run = true;
      continue;
    }
    if (k == "-h" || k == "--help") usage("help");
    if (i + 1 >= argc) usage(("missing value for " + k).c_str());
    const std::string v = argv[++i];
    if (k == "--workloads") {
      o.workloads = split_list(v);
      for (const auto& w : o.workloads)
        if (!make_workload(w, kRow)) usage(("unknown workload " + w).c_str());
    } else if (k == "--sizes") {
      o.sizes.clear();
      for (const auto& s : split_list(v)) {
        const long n = std::atol(s.c_str());
        if (n < kRow || n % kRow != 0) usage(("size must be a positive multiple of 1024: " + s).c_str());
        o.sizes.push_back(n);
      }
    } else if (k == "--threads") {
      o.threads.clear();
      for (const auto& s : split_list(v)) {
        const int t = std::atoi(s.c_str());
        if (t < 1) usage(("bad thread count " + s).c_str());
        o.threads.push_back(t);
      }
    } else if (k == "--jit" || k == "--row-fuser") {
      if (v != "on" && v != "off") usage(("bad " + k + " value " + v).c_str());
      (k == "--jit" ? o.jit : o.row_fuser) = v == "on";
    } else if (k == "--mode") {
      if (v == "fused")
        o.fused = {true};
      else if (v == "unfused")
        o.fused = {false};
      else if (v == "both")
        o.fused = {true, false};
      else
        usage(("bad mode " + v).c_str());
    } else {
      usage(("unknown option " + k).c_str());
    }
  }
  if (o.sizes.empty() || o.threads.empty() || o.workloads.empty()) usage("empty list");
  return o;
}

// Minor page faults of the process so far: a call that faults in fresh pages for its outputs
// or temporaries (an allocator handing back unmapped memory) shows here.
long minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

const char* peer_name(bool fused) { return fused ? "kiln-cpu-fused" : "kiln-cpu-unfused"; }

fusion::FusionLog log_from_env() {
  std::string warnings;
  const fusion::FusionConfig cfg = fusion::apply_fusion_env(fusion::FusionConfig{}, fusion::process_env(), &warnings);
  if (!warnings.empty()) std::fprintf(stderr, "kiln-bench-peers: %s\n", warnings.c_str());
  return cfg.log_to_stderr ? fusion::FusionLog::to_stderr(cfg.log_level) : fusion::FusionLog{};
}

std::string counters_keys(const CountingExecutor& k) {
  char buf[160];
  std::snprintf(buf, sizeof buf, " fused_kernels=%llu fused_ops=%llu single_ops=%llu",
                static_cast<unsigned long long>(k.fused_kernels), static_cast<unsigned long long>(k.fused_ops),
                static_cast<unsigned long long>(k.single_ops));
  return buf;
}

// --dry-run: one call per workload and mode on the recording executor; prints what ran.
int dry_run(const Options& o, const fusion::FusionLog& log) {
  const long n = *std::min_element(o.sizes.begin(), o.sizes.end());
  for (const auto& w : o.workloads) {
    for (bool fused : o.fused) {
      RecordingBackend backend;
      Client c(backend, fused, log, fusion::FuserOptions{.row_fuser = o.row_fuser});
      auto wl = make_workload(w, n);
      wl->setup(c);
      for (int call = 0; call < 3; ++call) {
        backend.recorder().clear_records();
        c.counters().clear();
        wl->call(c);
        std::printf("# dry-run peer=%s workload=%s call=%d plans=%zu explorations=%llu cache_hits=%llu%s\n",
                    peer_name(fused), w.c_str(), call, c.num_plans(),
                    static_cast<unsigned long long>(c.stats().explorations),
                    static_cast<unsigned long long>(c.stats().cache_hits), counters_keys(c.counters()).c_str());
        if (call == 0 || call == 2)
          for (const auto& r : backend.recorder().records()) {
            std::string ops;
            for (const auto& op : r.operations) {
              ops += ' ';
              ops += op.kind_name();
            }
            std::printf("#   %s%s:%s\n", r.fused ? "fused " : "single", r.fused ? r.name.c_str() : "", ops.c_str());
          }
      }
      wl->teardown(c);
    }
  }
  return 0;
}

int run(const Options& o, const fusion::FusionLog& log) {
  const TimingParams params = TimingParams::from_env();
  const int tmax = *std::max_element(o.threads.begin(), o.threads.end());
  const long nmin = *std::min_element(o.sizes.begin(), o.sizes.end());

  // One device per thread count, shared by every measurement with that count.
  std::map<int, std::unique_ptr<Backend>> devices;
  for (int t : o.threads) {
    CpuBackendInfo info;
    devices[t] = make_cpu_backend(t, &info, o.jit);
    std::printf("# kiln device threads=%d %s row_fuser=%s\n", t, info.describe.c_str(), o.row_fuser ? "on" : "off");
  }
  if (!devices.count(tmax)) devices[tmax] = make_cpu_backend(tmax, nullptr, o.jit);
#ifdef KILN_BENCH_HAVE_EIGEN
  const EigenGemmInfo eig = eigen_gemm_info();
  std::printf("# eigen (matmul1024 reference, same program) version=%s simd=%s openmp=%d\n", eig.version.c_str(),
              eig.simd.c_str(), eig.max_threads > 1 ? 1 : 0);
#else
  std::printf("# eigen not found at build time: no eigen matmul1024 line\n");
#endif
  std::fflush(stdout);

  bool all_ok = true;
  for (const auto& w : o.workloads) {
    const bool is_matmul = w == "matmul1024";
    const std::vector<long> sizes = is_matmul ? std::vector<long>{kMatmulN * kMatmulN} : o.sizes;
    // The correctness check: one call at the smallest size, every mode, the largest thread count.
    const long ncheck = is_matmul ? kMatmulN * kMatmulN : nmin;
    const auto checked = make_workload(w, ncheck);
    for (bool fused : o.fused) {
      Client c(*devices[tmax], fused, log, fusion::FuserOptions{.row_fuser = o.row_fuser});
      Workload* wl = checked.get();
      wl->setup(c);
      wl->call(c);
      const CheckResult r = wl->check(c);
      wl->teardown(c);
      std::printf("# check peer=%s workload=%s n=%ld threads=%d max_err=%.3g ok=%d\n", peer_name(fused), w.c_str(),
                  ncheck, tmax, r.err, static_cast<int>(r.ok));
      std::fflush(stdout);
      all_ok &= r.ok;
    }
    for (long n : sizes) {
      // Host inputs are generated once per (workload, size); each measurement uploads them to a
      // fresh client (fresh stream and plan store) and releases them afterwards.
      const auto wl = make_workload(w, n);
      for (int t : o.threads) {
        for (bool fused : o.fused) {
          Client c(*devices[t], fused, log, fusion::FuserOptions{.row_fuser = o.row_fuser});
          wl->setup(c);
          const std::vector<double> ts = time_calls(params, [&] { wl->call(c); });
          // One more call, counted: what the search and the device ran for it.
          c.counters().clear();
          c.backend().reset_counters();
          const long faults0 = minor_faults();
          wl->call(c);
          const long faults = minor_faults() - faults0;
          std::string extra =
              counters_keys(c.counters()) + c.backend().counters() + " minor_faults=" + std::to_string(faults);
          if (is_matmul) {
            char buf[64];
            std::snprintf(buf, sizeof buf, " gflops=%.2f", 2.0 * kMatmulN * kMatmulN * kMatmulN / median(ts));
            extra += buf;
          }
          wl->teardown(c);
          emit(peer_name(fused), w, n, t, bytes_per_elem(w), ts, extra);
        }
#ifdef KILN_BENCH_HAVE_EIGEN
        if (is_matmul && t <= eig.max_threads) {
          const Matmul m;
          std::vector<float> cm(static_cast<std::size_t>(kMatmulN * kMatmulN));
          eigen_sgemm(m.a(), m.b(), cm, kMatmulN, t);
          const CheckResult r = Matmul::check_gemm(cm, m.a(), m.b());
          std::printf("# check peer=eigen workload=matmul1024 n=%ld threads=%d max_err=%.3g ok=%d\n", n, t, r.err,
                      static_cast<int>(r.ok));
          all_ok &= r.ok;
          const std::vector<double> ts = time_eigen_sgemm(params, m.a(), m.b(), cm, kMatmulN, t);
          char buf[96];
          std::snprintf(buf, sizeof buf, " gflops=%.2f src=kiln-bench-peers",
                        2.0 * kMatmulN * kMatmulN * kMatmulN / median(ts));
          emit("eigen", w, n, t, bytes_per_elem(w), ts, buf);
        }
#endif
      }
    }
  }
  if (!all_ok) std::fprintf(stderr, "kiln-bench-peers: a correctness check failed (see the # check lines)\n");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace kiln::bench::peers

int main(int argc, char** argv) {
  using namespace kiln::bench::peers;
  const Options o = parse_options(argc, argv);
  const kiln::fusion::FusionLog log = log_from_env();
  return o.dry_run ? dry_run(o, log) : run(o, log);
}

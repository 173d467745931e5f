// kiln-bench-ipc: the daemon path against the in-process one. Starts its own kilnd (the binary
// next to this one in the build tree: <build>/apps/kilnd, or --kilnd PATH) with
// `--device cpu --runtime-dir <private dir> --socket bench.sock --threads 2 --kernel-threads 1`
// (the same pool and kernel threads as the in-process Device here), stops it with SIGTERM at the
// end, and fails if it does not exit 0.
//
//   ipc_sync_rtt_us_median, _p99  one op ([4] f32 MulScalar) registered and synced through the
//                                 daemon, per iteration (latencies collected here)
//   inprocess_sync_rtt_us_median  the same on a Device in this process
//   ops_per_s_procs1, 2, 4        kiln-bench-runtime's BM_ApiCacheHit loop (16 tiny 9-op
//                                 programs, then one read) in 1, 2 and 4 client processes at once
//                                 (this binary exec'd in a worker mode), all started together and
//                                 run for the same window; ops/s summed over the processes
//   ops_per_s_inprocess           that loop on one thread over a Device in this process
//   procs4_over_inprocess         ops_per_s_procs4 / ops_per_s_inprocess
//   upload_gbps, download_gbps    16 MiB f32 tensors through the segment's arena (GB/s, 1e9 B/s):
//                                 from_host (a copy into the arena, the daemon's copy out, the
//                                 device upload) and to_host (the reverse); inprocess_upload_gbps,
//                                 inprocess_download_gbps: the same calls on the in-process Device
//
//   kiln-bench-ipc [--kilnd PATH] [--window SECONDS (5)] [--benchmark_* flags]
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../common/cache_hit_program.h"
#include "../common/metric_reporter.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/ipc/remote_target.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/session.h"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;
using kiln::runtime::Device;
using kiln::runtime::Session;
using kiln::runtime::Tensor;

constexpr const char* kSocket = "bench.sock";
constexpr const char* kWorkerFlag = "--ipc-worker";
using kiln::bench::kOpsPerProgram;
using kiln::bench::kProgramsPerIteration;
using kiln::bench::tiny_programs;
constexpr int kRttIterations = 20'000;
constexpr int kRttWarmup = 500;
constexpr std::uint64_t kTransferElements = std::uint64_t{4} << 20;  // 16 MiB of f32

pid_t g_kilnd_pid = -1;   // the daemon this process started, if any
std::string g_owned_dir;  // the runtime directory this process made (not a worker's)

// Errors end the program; std::exit runs no destructors, so the daemon is told to stop here
// (its client processes then fail their next call and exit too).
[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "kiln-bench-ipc: %s\n", what.c_str());
  if (g_kilnd_pid > 0) kill(g_kilnd_pid, SIGTERM);
  std::error_code ec;
  if (!g_owned_dir.empty()) std::filesystem::remove_all(g_owned_dir, ec);
  std::exit(1);
}

template <class T>
T must(kiln::Result<T> r) {
  if (!r.ok()) die(r.error().to_string());
  return std::move(r).value();
}
void must(const kiln::Status& st) {
  if (!st.ok()) die(st.error().to_string());
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Set in main before any benchmark runs.
std::string g_dir;                            // the daemon's runtime directory
kiln::ipc::RemoteTarget* g_remote = nullptr;  // the main process's connection
double g_window = 5.0;                        // seconds of each ops/s measurement

kiln::ipc::RemoteOptions remote_options(const std::string& job) {
  kiln::ipc::RemoteOptions o;
  o.runtime_dir = g_dir;
  o.socket_name = kSocket;
  o.job = job;
  return o;
}

// The in-process device, configured as kiln-bench-runtime's: 2 pool threads, kernels on one
// worker each.
std::unique_ptr<Device> make_device() {
  kiln::runtime::RuntimeOptions o;
  o.threads = 2;
  o.config_path = "";
  o.fusion = kiln::fusion::FusionConfig{};
  return must(Device::create(std::make_unique<kiln::cpu::CpuBackend>(kiln::cpu::CpuBackendOptions{.threads = 1}),
                             std::move(o)));
}

// ---- The cache-hit loop of kiln-bench-runtime (BM_ApiCacheHit), same ops.

struct LoopResult {
  std::uint64_t ops = 0;
  double seconds = 0;
};

// Whole iterations of the loop until `window` seconds have passed.
LoopResult run_loop(Session& s, const Tensor& a, const Tensor& b, double window) {
  const auto t0 = Clock::now();
  std::uint64_t iterations = 0;
  double elapsed = 0;
  do {
    tiny_programs(s, a, b);
    ++iterations;
    elapsed = seconds_since(t0);
  } while (elapsed < window);
  return {iterations * kOpsPerProgram * kProgramsPerIteration, elapsed};
}

// ---- Child processes

struct Child {
  pid_t pid = -1;
  int in = -1;   // write end of its stdin (-1: none)
  int out = -1;  // read end of its stdout (-1: none)
  std::string buffered;

  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  Child(Child&& o) noexcept
      : pid(std::exchange(o.pid, -1)),
        in(std::exchange(o.in, -1)),
        out(std::exchange(o.out, -1)),
        buffered(std::move(o.buffered)) {}
  Child& operator=(Child&&) = delete;
  ~Child() {
    if (in >= 0) close(in);
    if (out >= 0) close(out);
    if (pid > 0) {  // not waited for yet: something failed; do not leave it behind
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  // Exit status after waiting at most `limit` (SIGKILL after that); -1 if killed.
  int wait_exit(std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) != pid) {
      if (Clock::now() > end) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        pid = -1;
        return -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  // The next line of its stdout, waiting at most `limit`.
  std::optional<std::string> read_line(std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    for (;;) {
      if (const auto nl = buffered.find('\n'); nl != std::string::npos) {
        std::string line = buffered.substr(0, nl);
        buffered.erase(0, nl + 1);
        return line;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
      if (left <= 0) return std::nullopt;
      pollfd p{out, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[512];
      const ssize_t n = read(out, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return std::nullopt;
      buffered.append(buf, static_cast<std::size_t>(n));
    }
  }
};

// posix_spawn (this process has threads: no plain fork). stdin/stdout on pipes when asked;
// otherwise stdout and stderr go to `log` (appended).
Child spawn(std::vector<std::string> args, bool pipes, const std::string& log = "") {
  int to_child[2] = {-1, -1}, from_child[2] = {-1, -1};
  if (pipes && (pipe2(to_child, O_CLOEXEC) != 0 || pipe2(from_child, O_CLOEXEC) != 0))
    die(std::string("pipe2: ") + std::strerror(errno));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (pipes) {
    posix_spawn_file_actions_adddup2(&fa, to_child[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], STDOUT_FILENO);
  } else if (!log.empty()) {
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  }
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  Child c;
  const int rc = posix_spawn(&c.pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (pipes) {
    close(to_child[0]);
    close(from_child[1]);
    c.in = to_child[1];
    c.out = from_child[0];
  }
  if (rc != 0) {
    c.pid = -1;
    die("cannot run " + args[0] + ": " + std::strerror(rc));
  }
  return c;
}

std::string self_exe() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) die("cannot resolve /proc/self/exe: " + ec.message());
  return exe.string();
}

// ---- Worker mode: one client process of the ops/s figure.
// Connects, warms the plans up, prints READY, waits for one byte on stdin (the common start),
// runs the loop for the window and prints "OPS <ops> <seconds>".
int worker_main(const std::string& dir, double window) {
  g_dir = dir;
  auto remote = kiln::ipc::RemoteTarget::connect(remote_options("bench-worker"));
  if (!remote.ok()) {
    std::printf("ERROR %s\n", remote.error().to_string().c_str());
    return 1;
  }
  {
    Session s(**remote);
    Tensor a = must(s.from_host(std::vector<float>{1, 2, 3, 4}, {4}));
    Tensor b = must(s.from_host(std::vector<float>{0.5f, -1, 0.25f, 2}, {4}));
    for (int i = 0; i < 3; ++i) tiny_programs(s, a, b);
    std::printf("READY\n");
    std::fflush(stdout);
    char go = 0;
    if (read(STDIN_FILENO, &go, 1) != 1) return 1;
    const LoopResult r = run_loop(s, a, b, window);
    std::printf("OPS %llu %.6f\n", static_cast<unsigned long long>(r.ops), r.seconds);
    std::fflush(stdout);
  }
  return 0;
}

// ---- Benchmarks

// Per-iteration latency of one op + sync; median and p99 as counters (microseconds).
void sync_rtt(benchmark::State& state, Session& s) {
  Tensor x = must(s.from_host(std::vector<float>{1, 2, 3, 4}, {4}));
  for (int i = 0; i < kRttWarmup; ++i) {
    x = must(s.mul(std::move(x), 1.0));
    must(s.sync());
  }
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(state.max_iterations));
  for (auto _ : state) {
    const auto t0 = Clock::now();
    x = must(s.mul(std::move(x), 1.0));
    must(s.sync());
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    return us.empty() ? 0.0 : us[std::min(us.size() - 1, static_cast<std::size_t>(q * double(us.size())))];
  };
  state.counters["median_us"] = at(0.5);
  state.counters["p99_us"] = at(0.99);
  state.counters["max_us"] = us.empty() ? 0.0 : us.back();
}

void BM_IpcSyncRtt(benchmark::State& state) {
  Session s(*g_remote);
  sync_rtt(state, s);
}
BENCHMARK(BM_IpcSyncRtt)->Iterations(kRttIterations)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_InprocessSyncRtt(benchmark::State& state) {
  auto dev = make_device();
  {
    Session s(*dev);
    sync_rtt(state, s);
  }
}
BENCHMARK(BM_InprocessSyncRtt)->Iterations(kRttIterations)->Unit(benchmark::kMicrosecond)->UseRealTime();

void BM_OpsInprocess(benchmark::State& state) {
  auto dev = make_device();
  {
    Session s(*dev);
    Tensor a = must(s.from_host(std::vector<float>{1, 2, 3, 4}, {4}));
    Tensor b = must(s.from_host(std::vector<float>{0.5f, -1, 0.25f, 2}, {4}));
    for (int i = 0; i < 3; ++i) tiny_programs(s, a, b);
    LoopResult r;
    for (auto _ : state) r = run_loop(s, a, b, g_window);
    state.counters["ops_per_s"] = double(r.ops) / r.seconds;
  }
}
BENCHMARK(BM_OpsInprocess)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// state.range(0) client processes, started together (each waits for its byte on stdin).
void BM_OpsProcs(benchmark::State& state) {
  const int procs = static_cast<int>(state.range(0));
  double total = 0;
  for (auto _ : state) {
    std::vector<Child> kids;
    kids.reserve(static_cast<std::size_t>(procs));
    for (int i = 0; i < procs; ++i)
      kids.push_back(spawn({self_exe(), kWorkerFlag, g_dir, std::to_string(g_window)}, true));
    for (Child& k : kids) {
      std::optional<std::string> line = k.read_line(std::chrono::seconds(60));
      if (!line || *line != "READY") die("worker did not get ready: " + line.value_or("(no output)"));
    }
    for (Child& k : kids)
      if (write(k.in, "G", 1) != 1) die(std::string("cannot start a worker: ") + std::strerror(errno));
    total = 0;
    for (Child& k : kids) {
      std::optional<std::string> line = k.read_line(std::chrono::seconds(static_cast<long>(g_window) + 60));
      unsigned long long ops = 0;
      double secs = 0;
      if (!line || std::sscanf(line->c_str(), "OPS %llu %lf", &ops, &secs) != 2 || secs <= 0)
        die("worker gave no result: " + line.value_or("(no output)"));
      total += double(ops) / secs;
      if (const int rc = k.wait_exit(std::chrono::seconds(30)); rc != 0)
        die("worker exited with " + std::to_string(rc));
    }
  }
  state.counters["ops_per_s"] = total;
}
BENCHMARK(BM_OpsProcs)->Arg(1)->Arg(2)->Arg(4)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

void upload(benchmark::State& state, Session& s) {
  const std::vector<float> values(kTransferElements, 1.5f);
  for (auto _ : state) {
    Tensor t = must(s.from_host(values, {kTransferElements}));
    benchmark::DoNotOptimize(t.id());
  }
  must(s.sync());
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(kTransferElements * sizeof(float)));
}
void download(benchmark::State& state, Session& s) {
  const Tensor t = must(s.from_host(std::vector<float>(kTransferElements, 2.5f), {kTransferElements}));
  for (auto _ : state) {
    std::vector<float> v = must(s.to_host(t));
    benchmark::DoNotOptimize(v.data());
  }
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(kTransferElements * sizeof(float)));
}

void BM_Upload(benchmark::State& state) {
  Session s(*g_remote);
  upload(state, s);
}
BENCHMARK(BM_Upload)->MinTime(2.0)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Download(benchmark::State& state) {
  Session s(*g_remote);
  download(state, s);
}
BENCHMARK(BM_Download)->MinTime(2.0)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same transfers into and out of a Device in this process: what the arena path adds.
void BM_UploadInprocess(benchmark::State& state) {
  auto dev = make_device();
  {
    Session s(*dev);
    upload(state, s);
  }
}
BENCHMARK(BM_UploadInprocess)->MinTime(1.0)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_DownloadInprocess(benchmark::State& state) {
  auto dev = make_device();
  {
    Session s(*dev);
    download(state, s);
  }
}
BENCHMARK(BM_DownloadInprocess)->MinTime(1.0)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---- The daemon

struct Daemon {
  Child process;
  std::string log;

  // SIGTERM, then its exit status (it drains and frees everything first).
  int stop() {
    if (process.pid <= 0) return -1;
    kill(process.pid, SIGTERM);
    return process.wait_exit(std::chrono::seconds(30));
  }
};

std::string default_kilnd() {
  // <build>/bench/kiln-bench-ipc → <build>/apps/kilnd
  return (std::filesystem::path(self_exe()).parent_path().parent_path() / "apps" / "kilnd").string();
}

std::string tail_of(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  std::string all;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) all.append(buf, n);
  std::fclose(f);
  return all.size() > 4000 ? all.substr(all.size() - 4000) : all;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string_view(argv[1]) == kWorkerFlag) {
    if (argc != 4) die("worker mode: --ipc-worker DIR WINDOW_SECONDS");
    return worker_main(argv[2], std::atof(argv[3]));
  }
  // Our own flags, taken out before Google Benchmark sees the rest.
  std::string kilnd = default_kilnd();
  std::vector<char*> rest{argv[0]};
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if ((a == "--kilnd" || a == "--window") && i + 1 < argc) {
      if (a == "--kilnd")
        kilnd = argv[++i];
      else
        g_window = std::max(0.5, std::atof(argv[++i]));
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 1;
  signal(SIGPIPE, SIG_IGN);

  char tmpl[] = "/tmp/kiln-bench-ipc-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) die(std::string("mkdtemp: ") + std::strerror(errno));
  g_dir = g_owned_dir = tmpl;
  const std::string log = g_dir + "/kilnd.log";
  Daemon daemon{spawn({kilnd, "--device", "cpu", "--runtime-dir", g_dir, "--socket", kSocket, "--threads", "2",
                       "--kernel-threads", "1", "--lock-dir", g_dir},
                      false, log),
                log};
  g_kilnd_pid = daemon.process.pid;
  // Ready when it accepts a connection.
  std::unique_ptr<kiln::ipc::RemoteTarget> remote;
  const auto t0 = Clock::now();
  while (!remote) {
    auto r = kiln::ipc::RemoteTarget::connect(remote_options("bench"));
    if (r.ok()) {
      remote = std::move(r).value();
      break;
    }
    int status = 0;
    if (waitpid(daemon.process.pid, &status, WNOHANG) == daemon.process.pid) {
      daemon.process.pid = g_kilnd_pid = -1;
      die("kilnd (" + kilnd + ") exited before accepting:\n" + tail_of(daemon.log));
    }
    if (seconds_since(t0) > 30) die("kilnd did not accept within 30 s: " + r.error().to_string());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  g_remote = remote.get();

  using R = kiln::bench::MetricReporter;
  static double inprocess_ops = 0, procs4_ops = 0;
  auto counter = [](const char* name) {
    return [name](const R::Run& r) {
      auto it = r.counters.find(name);
      return it == r.counters.end() ? 0.0 : static_cast<double>(it->second);
    };
  };
  auto gbps = [](const R::Run& r) {
    auto it = r.counters.find("bytes_per_second");
    return it == r.counters.end() ? 0.0 : static_cast<double>(it->second) / 1e9;
  };
  R reporter({
      {"BM_IpcSyncRtt/iterations:20000/real_time", "ipc_sync_rtt_us_median", "us", counter("median_us")},
      {"BM_IpcSyncRtt/iterations:20000/real_time", "ipc_sync_rtt_us_p99", "us", counter("p99_us")},
      {"BM_InprocessSyncRtt/iterations:20000/real_time", "inprocess_sync_rtt_us_median", "us", counter("median_us")},
      {"BM_OpsInprocess/iterations:1/real_time", "ops_per_s_inprocess", "ops/s",
       [counter](const R::Run& r) { return inprocess_ops = counter("ops_per_s")(r); }},
      {"BM_OpsProcs/1/iterations:1/real_time", "ops_per_s_procs1", "ops/s", counter("ops_per_s")},
      {"BM_OpsProcs/2/iterations:1/real_time", "ops_per_s_procs2", "ops/s", counter("ops_per_s")},
      {"BM_OpsProcs/4/iterations:1/real_time", "ops_per_s_procs4", "ops/s",
       [counter](const R::Run& r) { return procs4_ops = counter("ops_per_s")(r); }},
      {"BM_OpsProcs/4/iterations:1/real_time", "procs4_over_inprocess", "x",
       [](const R::Run&) { return inprocess_ops > 0 ? procs4_ops / inprocess_ops : 0.0; }},
      {"BM_Upload/min_time:2.000/real_time", "upload_gbps", "GB/s", gbps},
      {"BM_Download/min_time:2.000/real_time", "download_gbps", "GB/s", gbps},
      {"BM_UploadInprocess/min_time:1.000/real_time", "inprocess_upload_gbps", "GB/s", gbps},
      {"BM_DownloadInprocess/min_time:1.000/real_time", "inprocess_download_gbps", "GB/s", gbps},
  });
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();

  remote.reset();
  const int rc = daemon.stop();
  g_kilnd_pid = -1;
  std::error_code ec;
  if (rc != 0) {
    std::fprintf(stderr, "kiln-bench-ipc: kilnd did not stop cleanly (exit %d); its log:\n%s\n", rc,
                 tail_of(daemon.log).c_str());
    std::filesystem::remove_all(g_dir, ec);
    return 1;
  }
  std::filesystem::remove_all(g_dir, ec);
  return 0;
}

// kilnd: the per-device daemon. One process per device; clients connect on a Unix socket in
// the runtime directory (kiln/ipc/control_server.h) and send operations over shared memory
// (kiln/ipc/daemon.h). SIGTERM / SIGINT: stop accepting, drain every client's streams, free
// everything, exit 0. SIGHUP: re-read kiln.toml and apply what can change live (as `kilnctl reload`).
//
//   kilnd [--device auto|cpu|cuda|cuda:N] [--runtime-dir DIR] [--socket NAME] [--config FILE]
//         [--allowed-group GROUP] [--job-policy uid|group|any] [--job-memory-mib N]
//         [--job-queued-ops N] [--uid-memory-mib N] [--uid-queued-ops N] [--uid-jobs N]
//         [--device-memory-mib N] [--completion-timeout-ms N] [--large-block-mib N]
//         [--large-block-retention-ms N] [--arena-mib N] [--threads N] [--plan-cache DIR]
//         [--plan-save-ms N] [--staging-mib N] [--lock-dir DIR] [--max-connections N]
//         [--max-connections-per-uid N] [--kernel-threads N] [--log-level info] [--log-format text|json]
//         [--metrics unix|unix:PATH|tcp:HOST:PORT] [--metrics-allow-remote]
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "kiln/cpu/cpu_backend.h"
#include "kiln/distributed/group.h"
#include "kiln/fusion/config.h"
#include "kiln/fusion/plan_cache.h"
#include "kiln/ipc/daemon.h"
#include "kiln/ipc/daemon_config.h"
#include "kiln/ipc/device_lock.h"
#include "kiln/ipc/handshake.h"
#include "kiln/ipc/log_format.h"
#include "kiln/ipc/memory_limit.h"
#include "kiln/ipc/metrics_server.h"
#include "kiln/ipc/unix_socket.h"
#include "kiln/runtime/config.h"
#include "kiln/runtime/device.h"
#if KILN_HAVE_CUDA
#include "kiln/cuda/backend.h"
#include "kiln/cuda/probe.h"
#endif

namespace {

struct Backend {
  std::unique_ptr<kiln::runtime::DeviceBackend> backend;
  std::string name;                                      // "cpu", "cuda:0"
  std::function<kiln::ipc::BackendCounters()> counters;  // for kilnctl status and the metrics
};

// What the backend is built with besides the device: its memory limit and, on the CPU, when
// freed memory goes back to the system.
struct BackendSettings {
  int cpu_threads = 0;
  std::optional<std::uint64_t> device_memory_bytes;  // nullopt: the default; 0: none
  std::uint64_t large_block_bytes = std::uint64_t{16} << 20;
  std::chrono::milliseconds large_block_retention{2000};
};

// The device memory limit (issue 19.6): the configured one, else the default for the device
// (kiln/ipc/memory_limit.h), logged with where it came from. nullopt: no limit.
std::optional<std::uint64_t> device_memory_limit(const BackendSettings& s, std::optional<std::uint64_t> gpu_memory) {
  auto mib = [](std::uint64_t b) { return b >> 20; };
  if (s.device_memory_bytes) {
    if (*s.device_memory_bytes == 0) {
      spdlog::warn("kilnd: no device memory limit (daemon.device_memory_mib = 0): one client can exhaust the device");
      return std::nullopt;
    }
    spdlog::info("kilnd: device memory limit {} MiB (configured)", mib(*s.device_memory_bytes));
    return s.device_memory_bytes;
  }
  if (gpu_memory && *gpu_memory == 0) {
    spdlog::warn("kilnd: no device memory limit: the driver reported no memory size for the GPU");
    return std::nullopt;
  }
  if (gpu_memory) {
    const auto limit = static_cast<std::uint64_t>(static_cast<double>(*gpu_memory) * 0.9);
    spdlog::info("kilnd: device memory limit {} MiB (90% of the GPU's {} MiB)", mib(limit), mib(*gpu_memory));
    return limit;
  }
  const kiln::ipc::HostMemory host = kiln::ipc::read_host_memory();
  const std::optional<std::uint64_t> limit = kiln::ipc::default_host_memory_limit(host);
  if (!limit) {
    spdlog::warn("kilnd: no device memory limit: neither MemTotal nor a memory cgroup limit could be read");
    return std::nullopt;
  }
  if (host.cgroup_limit && *host.cgroup_limit < host.mem_total)
    spdlog::info("kilnd: device memory limit {} MiB (80% of the memory cgroup's {} MiB, {})", mib(*limit),
                 mib(*host.cgroup_limit), host.cgroup_file);
  else
    spdlog::info("kilnd: device memory limit {} MiB (80% of MemTotal {} MiB)", mib(*limit), mib(host.mem_total));
  return limit;
}

kiln::Result<Backend> make_backend(const std::string& request, const BackendSettings& settings) {
  Backend b;
#if KILN_HAVE_CUDA
  const kiln::cuda::ProbeResult probe = kiln::cuda::probe();
  KILN_ASSIGN_OR_RETURN(kiln::cuda::DeviceChoice choice, kiln::cuda::choose_device(request, probe));
  spdlog::info("kilnd: device {} ({})", choice.kind == kiln::cuda::DeviceKind::Cuda ? "cuda" : "cpu", choice.why);
  spdlog::debug("kilnd: {}", probe.describe());
  if (choice.kind == kiln::cuda::DeviceKind::Cuda) {
    const std::uint64_t gpu_memory = probe.devices[static_cast<std::size_t>(choice.ordinal)].total_memory;
    const std::optional<std::uint64_t> limit = device_memory_limit(settings, gpu_memory);
    KILN_ASSIGN_OR_RETURN(auto cuda, kiln::cuda::CudaBackend::create({.device = choice.ordinal, .byte_limit = limit}));
    b.counters = [gpu = cuda.get(), limit] {
      const kiln::cuda::CudaStats st = gpu->stats();
      kiln::ipc::BackendCounters c;
      c.fused_launches = st.fused_launches;
      c.single_ops = st.single_op_kernels + st.host_ops;
      c.fused_replays = st.fused_replays;
      c.fallbacks_by_reason = st.fallbacks_by_reason;
      c.memory_limit_bytes = limit.value_or(0);
      return c;
    };
    b.backend = std::move(cuda);
    b.name = "cuda:" + std::to_string(choice.ordinal);
    return b;
  }
#else
  if (request.rfind("cuda", 0) == 0)
    return kiln::make_error(kiln::ErrorCode::Config,
                            "--device " + request + ": this kilnd was built without the CUDA toolkit; use cpu or auto");
  if (request != "auto" && request != "cpu" && !request.empty())
    return kiln::make_error(kiln::ErrorCode::Config, "--device " + request + ": expected auto, cpu, cuda or cuda:N");
  spdlog::info("kilnd: device cpu ({}; built without CUDA)", request.empty() ? "auto" : request);
#endif
  kiln::cpu::CpuBackendOptions cpu_options{.threads = settings.cpu_threads};
  cpu_options.allocator.byte_limit = device_memory_limit(settings, std::nullopt);
  cpu_options.allocator.large_block_bytes = settings.large_block_bytes;
  cpu_options.allocator.large_block_retention = settings.large_block_retention;
  auto cpu = std::make_unique<kiln::cpu::CpuBackend>(cpu_options);
  b.counters = [cpu_backend = cpu.get(), limit = cpu_options.allocator.byte_limit] {
    const kiln::cpu::CpuDeviceStats st = cpu_backend->stats();
    kiln::ipc::BackendCounters c;
    c.fused_launches = st.fused_launches;
    c.single_ops = st.fast_ops + st.reference_ops;
    c.fused_replays = st.fused_replays;
    c.fallbacks_by_reason = st.fallbacks_by_reason;
    c.memory_limit_bytes = limit.value_or(0);
    return c;
  };
  b.backend = std::move(cpu);
  b.name = "cpu";
  return b;
}

// Raises the soft descriptor limit to the hard one (each client holds 6 descriptors: its socket,
// segment and four doorbells), and returns how many clients fit with room for the daemon's own.
std::uint64_t raise_descriptor_limit() {
  constexpr std::uint64_t kPerClient = 6, kReserve = 64;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) return 0;
  if (lim.rlim_cur < lim.rlim_max) {
    rlimit raised = lim;
    raised.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) lim = raised;
  }
  if (lim.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
  return lim.rlim_cur > kReserve ? (lim.rlim_cur - kReserve) / kPerClient : 1;
}

// Every setting of kilnd: flags > environment (KILN_DEVICE) > kiln.toml's [daemon] > defaults.
struct Settings {
  std::string device = "auto";
  std::string runtime_dir, socket_name, config = "kiln.toml", allowed_group, log_level = "info", plan_cache, lock_dir;
  std::string job_policy = "uid";
  std::uint64_t job_memory_mib = 0, job_queued_ops = 0, arena_mib = 64;
  std::uint64_t uid_memory_mib = 0;
  std::uint64_t uid_queued_ops = kiln::ipc::DaemonOptions{}.uid_queued_ops;
  std::uint64_t uid_jobs = kiln::ipc::DaemonOptions{}.uid_jobs;
  std::uint64_t device_memory_mib = 0;  // used only when set (flag or file); absent: the default
  bool device_memory_set = false;
  std::uint64_t completion_timeout_ms = 5000, large_block_mib = 16, large_block_retention_ms = 2000;
  std::uint64_t plan_save_ms = 2000;
  std::uint64_t staging_mib = 0;  // used only when set; absent: a share of the host's memory
  bool staging_set = false;
  std::uint64_t max_connections = kiln::ipc::ServerOptions{}.max_connections;
  std::uint64_t max_connections_per_uid = kiln::ipc::ServerOptions{}.max_connections_per_uid;
  std::size_t threads = 0;
  int kernel_threads = 0;
  std::optional<bool> row_fuser;  // --row-fuser; absent: [fusion] row_fuser / KILN_FUSION_ROW_FUSER
  std::string log_format = "text";
  std::string metrics;  // empty: no metrics endpoint
  bool metrics_allow_remote = false;
  // [distributed] (docs/distributed.md): flags > KILN_DIST_* > kiln.toml; no job: single-device.
  std::string dist_job, dist_rendezvous, dist_host;
  std::uint64_t dist_rank = 0, dist_world_size = 0, dist_timeout_ms = 30'000;
  std::set<std::string> flags_given;  // "--device", ...: what kiln.toml may not override (reload too)
};

// kiln.toml's [daemon] table fills what neither a flag nor the environment set (at start, and
// again at each reload over the flags-only settings).
void apply_file(Settings& s, const kiln::ipc::DaemonFileConfig& file) {
  auto from_file = [&](const char* flag, auto& target, const auto& value) {
    if (s.flags_given.count(flag) == 0 && value) target = *value;
  };
  if (std::getenv("KILN_DEVICE") == nullptr) from_file("--device", s.device, file.device);
  from_file("--runtime-dir", s.runtime_dir, file.runtime_dir);
  from_file("--socket", s.socket_name, file.socket);
  from_file("--allowed-group", s.allowed_group, file.allowed_group);
  from_file("--plan-cache", s.plan_cache, file.plan_cache);
  from_file("--log-level", s.log_level, file.log_level);
  from_file("--log-format", s.log_format, file.log_format);
  from_file("--metrics", s.metrics, file.metrics);
  from_file("--metrics-allow-remote", s.metrics_allow_remote, file.metrics_allow_remote);
  from_file("--job-policy", s.job_policy, file.job_policy);
  from_file("--job-memory-mib", s.job_memory_mib, file.job_memory_mib);
  from_file("--job-queued-ops", s.job_queued_ops, file.job_queued_ops);
  from_file("--uid-memory-mib", s.uid_memory_mib, file.uid_memory_mib);
  from_file("--uid-queued-ops", s.uid_queued_ops, file.uid_queued_ops);
  from_file("--uid-jobs", s.uid_jobs, file.uid_jobs);
  from_file("--device-memory-mib", s.device_memory_mib, file.device_memory_mib);
  s.device_memory_set = s.flags_given.count("--device-memory-mib") != 0 || file.device_memory_mib.has_value();
  from_file("--completion-timeout-ms", s.completion_timeout_ms, file.completion_timeout_ms);
  from_file("--large-block-mib", s.large_block_mib, file.large_block_mib);
  from_file("--large-block-retention-ms", s.large_block_retention_ms, file.large_block_retention_ms);
  from_file("--plan-save-ms", s.plan_save_ms, file.plan_save_ms);
  from_file("--staging-mib", s.staging_mib, file.staging_mib);
  s.staging_set = s.flags_given.count("--staging-mib") != 0 || file.staging_mib.has_value();
  from_file("--arena-mib", s.arena_mib, file.arena_mib);
  from_file("--lock-dir", s.lock_dir, file.lock_dir);
  from_file("--max-connections", s.max_connections, file.max_connections);
  from_file("--max-connections-per-uid", s.max_connections_per_uid, file.max_connections_per_uid);
  // [distributed]: a key the environment sets is the environment's (read_settings applied it).
  const auto from_dist = [&](const char* flag, const char* env, auto& target, const auto& value) {
    if (std::getenv(env) == nullptr) from_file(flag, target, value);
  };
  const kiln::ipc::DistributedFileConfig& d = file.distributed;
  from_dist("--dist-job", "KILN_DIST_JOB", s.dist_job, d.job);
  from_dist("--dist-rank", "KILN_DIST_RANK", s.dist_rank, d.rank);
  from_dist("--dist-world-size", "KILN_DIST_WORLD_SIZE", s.dist_world_size, d.world_size);
  from_dist("--dist-rendezvous", "KILN_DIST_RENDEZVOUS", s.dist_rendezvous, d.rendezvous);
  from_dist("--dist-host", "KILN_DIST_HOST", s.dist_host, d.host);
  from_dist("--dist-timeout-ms", "KILN_DIST_TIMEOUT_MS", s.dist_timeout_ms, d.timeout_ms);
}

// KILN_DIST_* into the settings, before the flags (which win).
std::optional<std::string> read_distributed_env(Settings& s) {
  const auto text = [](const char* name, std::string& target) {
    if (const char* v = std::getenv(name)) target = v;
  };
  std::optional<std::string> bad;
  const auto number = [&bad](const char* name, std::uint64_t& target) {
    const char* v = std::getenv(name);
    if (v == nullptr) return;
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno != 0 || *v == '-')
      bad = fmt::format("{}='{}' is not a number", name, v);
    else
      target = n;
  };
  text("KILN_DIST_JOB", s.dist_job);
  number("KILN_DIST_RANK", s.dist_rank);
  number("KILN_DIST_WORLD_SIZE", s.dist_world_size);
  text("KILN_DIST_RENDEZVOUS", s.dist_rendezvous);
  text("KILN_DIST_HOST", s.dist_host);
  number("KILN_DIST_TIMEOUT_MS", s.dist_timeout_ms);
  return bad;
}

// The [distributed] flags (docs/distributed.md).
void add_distributed_flags(CLI::App& app, Settings& s) {
  app.add_option("--dist-job", s.dist_job, "the job whose collectives span daemons (env KILN_DIST_JOB)");
  app.add_option("--dist-rank", s.dist_rank, "this daemon's rank in that job (env KILN_DIST_RANK)");
  app.add_option("--dist-world-size", s.dist_world_size, "the job's daemons (env KILN_DIST_WORLD_SIZE)");
  app.add_option("--dist-rendezvous", s.dist_rendezvous,
                 "tcp:HOST:PORT: rank 0 serves the rendezvous there (env KILN_DIST_RENDEZVOUS)");
  app.add_option("--dist-host", s.dist_host,
                 "the address peers reach this daemon at (env KILN_DIST_HOST; default: the one facing rank 0)");
  app.add_option("--dist-timeout-ms", s.dist_timeout_ms, "a meeting or collective fails after this long")
      ->check(CLI::Range(1, 3'600'000));
}

// Parses the flags and kiln.toml into `s` (and the flags alone into `flags_only`, which a reload
// applies the file over again); returns an exit status to stop with, or nullopt.
std::optional<int> read_settings(int argc, char** argv, Settings& s, Settings& flags_only) {
  CLI::App app{"kilnd: the kiln per-device tensor runtime daemon"};
  if (const char* env = std::getenv("KILN_DEVICE")) s.device = env;
  app.add_option("--device", s.device, "auto, cpu, cuda, cuda:N or cudaN (env KILN_DEVICE)");
  app.add_option("--runtime-dir", s.runtime_dir, "directory of the control socket (default $XDG_RUNTIME_DIR/kiln)");
  app.add_option("--socket", s.socket_name, "socket file name (default kilnd-<device>.sock)");
  app.add_option("--config", s.config, "kiln.toml with [daemon], [fusion] and [runtime] settings (flags win)");
  app.add_option("--allowed-group", s.allowed_group, "a group whose members may connect besides this user");
  app.add_option("--job-policy", s.job_policy, "who may join a job: uid (its creator's), group (primary gid), any")
      ->check(CLI::IsMember({"uid", "group", "any"}));
  // MiB bounded so that the bytes cannot overflow (an overflow to 0 would mean "unlimited").
  constexpr std::uint64_t kMaxMib = std::uint64_t{1} << 24;
  app.add_option("--job-memory-mib", s.job_memory_mib, "live tensor memory per job, MiB (0 = unlimited)")
      ->check(CLI::Range(std::uint64_t{0}, kMaxMib));
  app.add_option("--job-queued-ops", s.job_queued_ops, "queued operations per job (0 = unlimited)");
  app.add_option("--uid-memory-mib", s.uid_memory_mib, "live tensor memory per client uid, MiB (0 = unlimited)")
      ->check(CLI::Range(std::uint64_t{0}, kMaxMib));
  app.add_option("--uid-queued-ops", s.uid_queued_ops, "queued operations per client uid (0 = unlimited)");
  app.add_option("--uid-jobs", s.uid_jobs, "jobs one client uid may own at once (0 = unlimited)");
  app.add_option("--device-memory-mib", s.device_memory_mib,
                 "device memory limit, MiB (default: 80% of min(cgroup limit, MemTotal) on the CPU, 90% of a GPU's; "
                 "0 = none)")
      ->check(CLI::Range(std::uint64_t{0}, kMaxMib));
  app.add_option("--staging-mib", s.staging_mib,
                 "host memory for chunked transfers, all clients (default: 15% of min(cgroup limit, MemTotal) "
                 "on the CPU, 50% with a GPU; 0 = unlimited)")
      ->check(CLI::Range(std::uint64_t{0}, kMaxMib));
  app.add_option("--completion-timeout-ms", s.completion_timeout_ms,
                 "a client whose completion ring stays full this long is disconnected")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 32));
  app.add_option("--large-block-mib", s.large_block_mib, "CPU device: freed blocks this large go back to the system...")
      ->check(CLI::Range(std::uint64_t{1}, kMaxMib));
  app.add_option("--large-block-retention-ms", s.large_block_retention_ms, "...after this long unused (0 = at once)")
      ->check(CLI::Range(std::uint64_t{0}, std::uint64_t{1} << 32));
  app.add_option("--plan-save-ms", s.plan_save_ms, "with --plan-cache: new plans are saved this long after they appear")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 32));
  app.add_option("--arena-mib", s.arena_mib, "per-client transfer arena, MiB")->check(CLI::Range(1, 65536));
  app.add_option("--threads", s.threads, "stream-actor threads (default: [runtime] threads or the cores)");
  app.add_option("--kernel-threads", s.kernel_threads, "CPU device: threads one kernel may use (0 = the cores)");
  app.add_option("--plan-cache", s.plan_cache,
                 "directory of the plan store on disk: loaded at start, saved as plans appear and at stop (0700)");
  app.add_option("--lock-dir", s.lock_dir,
                 "directory of the per-device lock (default /run/kiln as root, else the user's own)");
  app.add_option("--max-connections", s.max_connections, "client connections open at once, in all")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 20));
  app.add_option("--max-connections-per-uid", s.max_connections_per_uid, "client connections open at once per uid")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 20));
  app.add_option("--log-level", s.log_level, "trace, debug, info, warn, error");
  app.add_option("--log-format", s.log_format, "text, or json: one object per line with client, job and stream")
      ->check(CLI::IsMember({"text", "json"}));
  app.add_option("--metrics", s.metrics,
                 "serve Prometheus metrics: unix (next to the socket), unix:PATH, tcp:HOST:PORT (loopback unless "
                 "--metrics-allow-remote)");
  app.add_flag("--metrics-allow-remote", s.metrics_allow_remote, "allow the metrics on a non-loopback TCP address");
  if (std::optional<std::string> bad = read_distributed_env(s)) {
    std::fprintf(stderr, "kilnd: %s\n", bad->c_str());
    return 2;
  }
  add_distributed_flags(app, s);
  app.add_option_function<std::string>(
         "--row-fuser", [&s](const std::string& v) { s.row_fuser = kiln::fusion::parse_switch(v); },
         "kiln's row fuser: on or off (default [fusion] row_fuser, env KILN_FUSION_ROW_FUSER, on)")
      ->check(CLI::IsMember({"on", "off", "true", "false", "1", "0"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  for (const CLI::Option* opt : app.get_options())
    if (opt->count() != 0 && !opt->get_lnames().empty()) s.flags_given.insert("--" + opt->get_lnames().front());
  flags_only = s;
  kiln::Result<kiln::ipc::DaemonFileConfig> file = kiln::ipc::load_daemon_config(s.config);
  if (!file.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", file.error().to_string().c_str());
    return 2;
  }
  apply_file(s, *file);
  return std::nullopt;
}

// The distributed job's group from the settings (null without a job). Rank 0 binds the
// rendezvous here, so that a taken or wrong address stops the start.
kiln::Result<std::shared_ptr<kiln::distributed::CollectiveGroup>> collective_group(const Settings& s) {
  if (s.dist_job.empty()) {
    if (s.dist_world_size != 0 || !s.dist_rendezvous.empty())
      return kiln::make_error(kiln::ErrorCode::Config, "distributed: world_size or rendezvous set without a job");
    return std::shared_ptr<kiln::distributed::CollectiveGroup>();
  }
  if (kiln::Status st = kiln::ipc::validate_job_name(s.dist_job); !st.ok())
    return kiln::make_error(kiln::ErrorCode::Config, "distributed.job: " + st.error().message);
  kiln::distributed::DistributedConfig config;
  config.job = s.dist_job;
  config.rank = static_cast<std::uint32_t>(std::min<std::uint64_t>(s.dist_rank, UINT32_MAX));
  config.world_size = static_cast<std::uint32_t>(std::min<std::uint64_t>(s.dist_world_size, UINT32_MAX));
  KILN_ASSIGN_OR_RETURN(config.rendezvous, kiln::distributed::parse_tcp_address(s.dist_rendezvous));
  config.host = s.dist_host;
  config.timeout = std::chrono::milliseconds(s.dist_timeout_ms);
  const std::string version =
      fmt::format("kiln {} (protocol {})", kiln::fusion::plan_cache_kiln_version(), kiln::ipc::kProtocolVersion);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<kiln::distributed::CollectiveGroup> group,
                        kiln::distributed::CollectiveGroup::create(std::move(config), version));
  const kiln::distributed::DistributedConfig& c = group->config();
  spdlog::info("kilnd: job '{}' spans daemons: rank {} of {}, rendezvous {}{}", c.job, c.rank, c.world_size,
               c.rendezvous.to_string(), c.rank == 0 ? " (served here)" : "");
  return std::shared_ptr<kiln::distributed::CollectiveGroup>(std::move(group));
}

// The daemon service's options from the settings; an exit status on a bad group name.
kiln::Result<kiln::ipc::DaemonOptions> daemon_options(const Settings& s, const std::string& device_name) {
  kiln::ipc::DaemonOptions options;
  options.server.runtime_dir = s.runtime_dir;
  options.server.socket_name = s.socket_name.empty() ? kiln::ipc::daemon_socket_name(device_name) : s.socket_name;
  options.server.segment.arena_bytes = s.arena_mib << 20;
  options.server.max_connections = s.max_connections;
  options.server.max_connections_per_uid = s.max_connections_per_uid;
  if (!s.allowed_group.empty()) {
    const group* g = getgrnam(s.allowed_group.c_str());
    if (g == nullptr)
      return kiln::make_error(kiln::ErrorCode::Config, "--allowed-group " + s.allowed_group + ": no such group");
    options.server.allowed_gid = g->gr_gid;
  }
  KILN_ASSIGN_OR_RETURN(options.job_policy, kiln::ipc::parse_job_policy(s.job_policy));
  options.job_memory_bytes = s.job_memory_mib << 20;
  options.job_queued_ops = s.job_queued_ops;
  options.uid_memory_bytes = s.uid_memory_mib << 20;
  options.uid_queued_ops = s.uid_queued_ops;
  options.uid_jobs = s.uid_jobs;
  options.completion_timeout = std::chrono::milliseconds(s.completion_timeout_ms);
  options.device_name = device_name;
  KILN_ASSIGN_OR_RETURN(options.collectives, collective_group(s));
  if (s.staging_set) {
    options.staging_bytes = s.staging_mib << 20;
  } else {
    // Chunked transfers stage in host memory beside the CPU device's 80%: 15% keeps the sum
    // under the host's limit. With a GPU the host memory is the staging's alone.
    const double share = device_name == "cpu" ? 0.15 : 0.5;
    options.staging_bytes = kiln::ipc::default_host_memory_limit(kiln::ipc::read_host_memory(), share).value_or(0);
  }
  return options;
}

// Configuration: the log level and pattern from the settings.
void set_up_logging(const Settings& s) {
  spdlog::set_level(spdlog::level::from_str(s.log_level));
  const kiln::Result<kiln::ipc::LogFormat> format = kiln::ipc::parse_log_format(s.log_format);  // checked by main
  kiln::ipc::set_log_format(format.ok() ? *format : kiln::ipc::LogFormat::Text);
}

// Configuration: blocks SIGTERM, SIGINT and SIGHUP (returned, for sigwait) and ignores SIGPIPE.
sigset_t block_stop_signals() {
  // Signals are taken by sigwait on this thread; every thread created later inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that vanishes mid-send must not kill the daemon
  return stop_signals;
}

// Configuration: the backend's settings from the daemon's.
BackendSettings backend_settings(const Settings& s) {
  BackendSettings settings;
  settings.cpu_threads = s.kernel_threads;
  if (s.device_memory_set) settings.device_memory_bytes = s.device_memory_mib << 20;
  settings.large_block_bytes = s.large_block_mib << 20;
  settings.large_block_retention = std::chrono::milliseconds(s.large_block_retention_ms);
  return settings;
}

// Configuration: lowers max_connections to the clients the (raised) descriptor limit fits.
// Returns the clients the descriptors fit (UINT64_MAX: no bound).
std::uint64_t fit_descriptor_limit(kiln::ipc::DaemonOptions& options) {
  const std::uint64_t fit = raise_descriptor_limit();
  if (fit != 0 && fit < options.server.max_connections) {
    spdlog::warn("kilnd: the descriptor limit fits {} clients: max_connections {} lowered to it", fit,
                 options.server.max_connections);
    options.server.max_connections = fit;
  }
  return fit == 0 ? UINT64_MAX : fit;
}

// Start: the runtime device over the backend, with kiln.toml's [runtime] settings.
kiln::Result<std::unique_ptr<kiln::runtime::Device>> create_device(
    const Settings& s, std::unique_ptr<kiln::runtime::DeviceBackend> backend) {
  kiln::runtime::RuntimeOptions ro;
  ro.threads = s.threads;
  ro.config_path = s.config;
  ro.row_fuser = s.row_fuser;
  // Waiters do not spin here unless kiln.toml or KILN_RUNTIME_SPIN_WAITS asks for it: a session
  // thread's waits mostly run inline, and its client already polls for the answer, so a spinning
  // session thread would take the core the actor needs (measured in docs/decisions.md, ipc).
  // A malformed file is reported by Device::create below.
  if (kiln::Result<kiln::runtime::RuntimeFileConfig> rc =
          kiln::runtime::load_runtime_config(s.config, kiln::fusion::process_env());
      !rc.ok() || !rc->spin_waits)
    ro.spin_waits = false;
  return kiln::runtime::Device::create(std::move(backend), std::move(ro));
}

// Start: loads the plan cache in s.plan_cache into the device's store and starts `plan_saver`,
// which saves new plans there as they appear (counting them in `last_saved`).
void start_plan_cache(const Settings& s, kiln::runtime::Device& device,
                      std::optional<kiln::fusion::PlanCacheAutosaver>& plan_saver,
                      const std::shared_ptr<std::atomic<std::uint64_t>>& last_saved) {
  // A missing, corrupt or foreign file is reported and ignored: the daemon starts either way.
  const kiln::fusion::PlanCacheLoadReport r = kiln::fusion::load_plan_cache(
      device.plan_store(), s.plan_cache, kiln::fusion::FusionLog::to_stderr(kiln::fusion::LogLevel::Disabled));
  if (r.found && r.ok())
    spdlog::info("kilnd: plan cache {}: loaded {} plans ({} merged)", s.plan_cache, r.loaded, r.merged);
  else if (r.nothing_saved())
    spdlog::info("kilnd: plan cache {}: no saved plans yet", s.plan_cache);
  // Otherwise load_plan_cache warned already (a refused directory, or a bad file the next save
  // replaces). New plans are saved as they are learned, so a SIGKILL loses only the last
  // plan_save_ms or so; a refused directory is retried with a back-off (its owner may fix it).
  kiln::fusion::PlanCacheAutosaverOptions saver;
  saver.debounce = std::chrono::milliseconds(s.plan_save_ms);
  saver.max_delay = std::max(saver.debounce, saver.max_delay);
  saver.on_save = [dir = s.plan_cache, last_saved](const kiln::Result<kiln::fusion::PlanCacheSaveReport>& saved) {
    if (saved.ok()) {
      last_saved->store(saved->saved, std::memory_order_relaxed);
      spdlog::debug("kilnd: plan cache {}: saved {} plans ({} bytes, {} not savable)", saved->file.string(),
                    saved->saved, saved->bytes, saved->skipped);
    } else {
      spdlog::error("kilnd: plan cache {}: {}", dir, saved.error().to_string());
    }
  };
  plan_saver.emplace(device.plan_store(), s.plan_cache, std::move(saver));
}

// The service's live limits from the settings (max_connections within what the descriptors fit).
kiln::ipc::LiveLimits live_limits(const Settings& s, const kiln::ipc::LiveLimits& running, std::uint64_t fit) {
  kiln::ipc::LiveLimits l;
  l.job_memory_bytes = s.job_memory_mib << 20;
  l.job_queued_ops = s.job_queued_ops;
  l.uid_memory_bytes = s.uid_memory_mib << 20;
  l.uid_queued_ops = s.uid_queued_ops;
  l.uid_jobs = s.uid_jobs;
  l.staging_bytes = s.staging_set ? s.staging_mib << 20 : running.staging_bytes;  // unset: the default stays
  l.max_connections = std::min(s.max_connections, fit);
  l.max_connections_per_uid = s.max_connections_per_uid;
  return l;
}

// SIGHUP and `kilnctl reload`: re-reads kiln.toml over the flags and applies what can change
// while the daemon runs (the live limits, log_level); what would need a restart is named and
// keeps its running value.
class Reloader {
 public:
  Reloader(Settings flags_only, Settings running, std::uint64_t descriptor_fit)
      : flags_only_(std::move(flags_only)), running_(std::move(running)), fit_(descriptor_fit) {}
  void attach(kiln::ipc::DaemonService* service) { service_ = service; }

  kiln::Result<std::string> reload() {
    std::lock_guard lock(mu_);
    kiln::Result<kiln::ipc::DaemonFileConfig> file = kiln::ipc::load_daemon_config(running_.config);
    if (!file.ok()) return kiln::make_error(kiln::ErrorCode::Config, file.error().message + " (nothing changed)");
    Settings next = flags_only_;
    apply_file(next, *file);
    std::string changed, restart;
    auto note = [](std::string& list, const char* key, const auto& from, const auto& to) {
      if (from != to) list += fmt::format("  {}: {} -> {}\n", key, from, to);
    };
    const kiln::ipc::LiveLimits before = service_->limits();
    const kiln::ipc::LiveLimits after = live_limits(next, before, fit_);
    for (const kiln::ipc::LiveLimitKey& k : kiln::ipc::live_limit_keys())
      note(changed, k.key, before.*(k.field) / k.unit, after.*(k.field) / k.unit);
    note(changed, "log_level", running_.log_level, next.log_level);
    if (spdlog::level::from_str(next.log_level) == spdlog::level::off && next.log_level != "off")
      return kiln::make_error(kiln::ErrorCode::Config,
                              "log_level '" + next.log_level + "' is not a level (nothing changed)");
    note(restart, "device", running_.device, next.device);
    note(restart, "runtime_dir", running_.runtime_dir, next.runtime_dir);
    note(restart, "socket", running_.socket_name, next.socket_name);
    note(restart, "allowed_group", running_.allowed_group, next.allowed_group);
    note(restart, "job_policy", running_.job_policy, next.job_policy);
    note(restart, "plan_cache", running_.plan_cache, next.plan_cache);
    note(restart, "lock_dir", running_.lock_dir, next.lock_dir);
    note(restart, "log_format", running_.log_format, next.log_format);
    note(restart, "metrics", running_.metrics, next.metrics);
    note(restart, "metrics_allow_remote", running_.metrics_allow_remote, next.metrics_allow_remote);
    note(restart, "arena_mib", running_.arena_mib, next.arena_mib);
    note(restart, "device_memory_mib", running_.device_memory_mib, next.device_memory_mib);
    note(restart, "completion_timeout_ms", running_.completion_timeout_ms, next.completion_timeout_ms);
    note(restart, "large_block_mib", running_.large_block_mib, next.large_block_mib);
    note(restart, "large_block_retention_ms", running_.large_block_retention_ms, next.large_block_retention_ms);
    note(restart, "plan_save_ms", running_.plan_save_ms, next.plan_save_ms);
    service_->set_limits(after);
    spdlog::set_level(spdlog::level::from_str(next.log_level));
    // What needs a restart keeps its running value, so the next reload names it again.
    for (auto field :
         {&Settings::job_memory_mib, &Settings::job_queued_ops, &Settings::uid_memory_mib, &Settings::uid_queued_ops,
          &Settings::uid_jobs, &Settings::staging_mib, &Settings::max_connections, &Settings::max_connections_per_uid})
      running_.*field = next.*field;
    running_.staging_set = next.staging_set;
    running_.log_level = next.log_level;
    std::string out =
        fmt::format("reloaded {}: {}\n", running_.config, changed.empty() ? "nothing changed live" : "changed live");
    out += changed;
    if (!restart.empty()) out += "needs a restart (the running value stays):\n" + restart;
    // One log line per change: "kilnd: reload: job_memory_mib: 0 -> 4096 (live)".
    for (const auto& [list, how] : {std::pair{&changed, "live"}, std::pair{&restart, "at the next restart"}})
      for (std::size_t at = 0; at < list->size(); at = list->find('\n', at) + 1)
        spdlog::info("kilnd: reload: {} ({})", list->substr(at + 2, list->find('\n', at) - at - 2), how);
    return out;
  }

 private:
  std::mutex mu_;  // one reload at a time (SIGHUP on the main thread, kilnctl on a session's)
  const Settings flags_only_;
  Settings running_;  // guarded by mu_
  const std::uint64_t fit_;
  kiln::ipc::DaemonService* service_ = nullptr;  // set before any reload can run
};

// Serve: waits for SIGTERM or SIGINT (the service's threads serve the clients meanwhile); a
// SIGHUP reloads the configuration.
void wait_for_stop_signal(const sigset_t& stop_signals, Reloader& reloader) {
  for (;;) {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (sig == SIGHUP) {
      kiln::Result<std::string> r = reloader.reload();
      if (!r.ok()) spdlog::error("kilnd: SIGHUP: reload failed: {}", r.error().message);
      continue;
    }
    spdlog::info("kilnd: {} received: stopping (draining every client's streams)",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT");
    return;
  }
}

// Start: the metrics endpoint, when configured; nullptr otherwise. Errors stop the daemon.
kiln::Result<std::unique_ptr<kiln::ipc::MetricsServer>> start_metrics(const Settings& s,
                                                                      const kiln::ipc::DaemonOptions& options,
                                                                      kiln::ipc::DaemonService& service) {
  if (s.metrics.empty()) return std::unique_ptr<kiln::ipc::MetricsServer>();
  kiln::ipc::MetricsServerOptions m;
  KILN_ASSIGN_OR_RETURN(m.listen, kiln::ipc::parse_metrics_listen(s.metrics, s.metrics_allow_remote));
  std::string path = service.socket_path();
  if (path.size() > 5 && path.substr(path.size() - 5) == ".sock") path.resize(path.size() - 5);
  m.default_unix_path = path + ".metrics";
  m.allowed_gid = options.server.allowed_gid;
  m.body = [&service] { return service.metrics().to_prometheus(); };
  KILN_ASSIGN_OR_RETURN(auto server, kiln::ipc::MetricsServer::start(std::move(m)));
  spdlog::info("kilnd: metrics on {} (GET /metrics)", server->address());
  return server;
}

// Shut down: stops the service, the device and the plan saver, and logs what was left; the exit status.
int shut_down(const Settings& s, kiln::ipc::DaemonService& service, kiln::runtime::Device& device,
              std::optional<kiln::fusion::PlanCacheAutosaver>& plan_saver,
              const std::atomic<std::uint64_t>& last_saved) {
  const kiln::ipc::DaemonStatus last = service.status();
  service.stop();
  kiln::Status down = device.shutdown();
  if (plan_saver) {
    plan_saver->stop();  // the streams are drained: writes what is still unsaved
    const kiln::fusion::PlanCacheAutosaverStats st = plan_saver->stats();
    if (st.saves == 0 && st.failures == 0)
      spdlog::info("kilnd: plan cache {}: no new plans to save", s.plan_cache);
    else if (st.last_error.empty())
      spdlog::info("kilnd: plan cache {}: saved {} plans ({} saves this run)", s.plan_cache,
                   last_saved.load(std::memory_order_relaxed), st.saves);
  }
  const kiln::runtime::MemoryStats mem = device.backend().memory_stats();
  spdlog::info("kilnd: stopped after {} client(s); {} plans; {} tensors and {} bytes left on the device",
               last.clients_served, last.plans, mem.tensors, mem.bytes_in_use);
  if (!down.ok()) {
    spdlog::error("kilnd: {}", down.error().to_string());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings, flags_only;
  if (std::optional<int> exit_status = read_settings(argc, argv, settings, flags_only)) return *exit_status;
  const Settings& s = settings;
  if (!s.metrics.empty()) {
    if (kiln::Result<kiln::ipc::MetricsListen> m = kiln::ipc::parse_metrics_listen(s.metrics, s.metrics_allow_remote);
        !m.ok()) {
      std::fprintf(stderr, "kilnd: %s\n", m.error().message.c_str());
      return 2;
    }
  }
  if (!kiln::ipc::parse_log_format(s.log_format).ok()) {
    std::fprintf(stderr, "kilnd: log format '%s': expected text or json\n", s.log_format.c_str());
    return 2;
  }
  set_up_logging(s);
  const sigset_t stop_signals = block_stop_signals();

  kiln::Result<Backend> backend = make_backend(s.device, backend_settings(s));
  if (!backend.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", backend.error().to_string().c_str());
    return 2;
  }
  const std::string device_name = backend->name;
  // One daemon per device on this machine, whatever its socket is called; held until exit.
  kiln::Result<kiln::ipc::DeviceLock> device_lock = kiln::ipc::DeviceLock::acquire(device_name, s.lock_dir);
  if (!device_lock.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", device_lock.error().to_string().c_str());
    return 1;
  }
  kiln::Result<kiln::ipc::DaemonOptions> options = daemon_options(s, device_name);
  if (!options.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", options.error().message.c_str());
    return 2;
  }
  Reloader reloader(flags_only, s, fit_descriptor_limit(*options));

  kiln::Result<std::unique_ptr<kiln::runtime::Device>> dev = create_device(s, std::move(backend->backend));
  if (!dev.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", dev.error().to_string().c_str());
    return 2;
  }
  // Declared after `dev`: stopped (its final save) before the store it watches goes.
  std::optional<kiln::fusion::PlanCacheAutosaver> plan_saver;
  auto last_saved = std::make_shared<std::atomic<std::uint64_t>>(0);  // plans in the last file written
  if (!s.plan_cache.empty()) start_plan_cache(s, **dev, plan_saver, last_saved);
  kiln::Result<std::unique_ptr<kiln::ipc::DaemonService>> service = kiln::ipc::DaemonService::start(**dev, *options);
  if (!service.ok()) {
    // The usual cause: another daemon on this device ("another daemon is already running at ...").
    std::fprintf(stderr, "kilnd: %s\n", service.error().to_string().c_str());
    return 1;
  }
  // The backend is owned by the device, which outlives the service.
  (*service)->set_backend_counters(backend->counters);
  reloader.attach(service->get());
  kiln::ipc::ControlHooks hooks;
  hooks.reload = [&reloader] { return reloader.reload(); };
  // As SIGTERM: the main thread's sigwait takes it and stops the daemon in order.
  hooks.stop = [] { ::kill(::getpid(), SIGTERM); };
  (*service)->set_control_hooks(std::move(hooks));
  kiln::Result<std::unique_ptr<kiln::ipc::MetricsServer>> metrics = start_metrics(s, *options, **service);
  if (!metrics.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", metrics.error().message.c_str());
    (*service)->stop();
    return 2;
  }
  spdlog::info("kilnd: ready on {} (device {}, {} stream threads)", (*service)->socket_path(), device_name,
               (*dev)->threads());

  wait_for_stop_signal(stop_signals, reloader);
  if (*metrics) (*metrics)->stop();  // before the service it reads
  return shut_down(s, **service, **dev, plan_saver, *last_saved);
}

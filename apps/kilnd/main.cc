// kilnd: the per-device daemon. One process per device; clients connect on a Unix socket in
// the runtime directory (kiln/ipc/control_server.h) and send operations over shared memory
// (kiln/ipc/daemon.h). SIGTERM / SIGINT: stop accepting, drain every client's streams, free
// everything, exit 0.
//
//   kilnd [--device auto|cpu|cuda|cuda:N] [--runtime-dir DIR] [--socket NAME] [--config FILE]
//         [--allowed-group GROUP] [--job-memory-mib N] [--job-queued-ops N] [--arena-mib N]
//         [--threads N] [--plan-cache DIR] [--lock-dir DIR] [--max-connections N]
//         [--max-connections-per-uid N] [--log-level info]
#include <grp.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include "kiln/cpu/cpu_backend.h"
#include "kiln/fusion/plan_cache.h"
#include "kiln/ipc/daemon.h"
#include "kiln/ipc/daemon_config.h"
#include "kiln/ipc/device_lock.h"
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
  std::string name;  // "cpu", "cuda:0"
  std::function<std::uint64_t()> fused_launches;  // for kilnctl status; reads the backend's counter
};

kiln::Result<Backend> make_backend(const std::string& request, int cpu_threads) {
  Backend b;
#if KILN_HAVE_CUDA
  const kiln::cuda::ProbeResult probe = kiln::cuda::probe();
  KILN_ASSIGN_OR_RETURN(kiln::cuda::DeviceChoice choice, kiln::cuda::choose_device(request, probe));
  spdlog::info("kilnd: device {} ({})", choice.kind == kiln::cuda::DeviceKind::Cuda ? "cuda" : "cpu", choice.why);
  spdlog::debug("kilnd: {}", probe.describe());
  if (choice.kind == kiln::cuda::DeviceKind::Cuda) {
    KILN_ASSIGN_OR_RETURN(auto cuda, kiln::cuda::CudaBackend::create({.device = choice.ordinal}));
    b.fused_launches = [gpu = cuda.get()] { return gpu->stats().fused_launches; };
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
  auto cpu = std::make_unique<kiln::cpu::CpuBackend>(kiln::cpu::CpuBackendOptions{.threads = cpu_threads});
  b.fused_launches = [c = cpu.get()] { return c->stats().fused_launches; };
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kilnd: the kiln per-device tensor runtime daemon"};
  std::string device = "auto";
  if (const char* env = std::getenv("KILN_DEVICE")) device = env;
  std::string runtime_dir, socket_name, config = "kiln.toml", allowed_group, log_level = "info", plan_cache;
  std::string lock_dir;
  std::uint64_t job_memory_mib = 0, job_queued_ops = 0, arena_mib = 64;
  std::uint64_t max_connections = kiln::ipc::ServerOptions{}.max_connections;
  std::uint64_t max_connections_per_uid = kiln::ipc::ServerOptions{}.max_connections_per_uid;
  std::size_t threads = 0;
  int kernel_threads = 0;
  app.add_option("--device", device, "auto, cpu, cuda or cuda:N (env KILN_DEVICE)");
  app.add_option("--runtime-dir", runtime_dir, "directory of the control socket (default $XDG_RUNTIME_DIR/kiln)");
  app.add_option("--socket", socket_name, "socket file name (default kilnd-<device>.sock)");
  app.add_option("--config", config, "kiln.toml with [daemon], [fusion] and [runtime] settings (flags win)");
  app.add_option("--allowed-group", allowed_group, "a group whose members may connect besides this user");
  app.add_option("--job-memory-mib", job_memory_mib, "live tensor memory per job, MiB (0 = unlimited)");
  app.add_option("--job-queued-ops", job_queued_ops, "queued operations per job (0 = unlimited)");
  app.add_option("--arena-mib", arena_mib, "per-client transfer arena, MiB")->check(CLI::Range(1, 65536));
  app.add_option("--threads", threads, "stream-actor threads (default: [runtime] threads or the cores)");
  app.add_option("--kernel-threads", kernel_threads, "CPU device: threads one kernel may use (0 = the cores)");
  app.add_option("--plan-cache", plan_cache,
                 "directory of the plan store on disk: loaded at start, saved at stop (owned by this user, 0700)");
  app.add_option("--lock-dir", lock_dir,
                 "directory of the per-device lock (default /run/kiln as root, else the user's own)");
  app.add_option("--max-connections", max_connections, "client connections open at once, in all")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 20));
  app.add_option("--max-connections-per-uid", max_connections_per_uid, "client connections open at once per uid")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 20));
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error");
  CLI11_PARSE(app, argc, argv);

  // kiln.toml's [daemon] table fills what neither a flag nor the environment set.
  kiln::Result<kiln::ipc::DaemonFileConfig> file = kiln::ipc::load_daemon_config(config);
  if (!file.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", file.error().to_string().c_str());
    return 2;
  }
  auto from_file = [&](const char* flag, auto& target, const auto& value) {
    if (app.count(flag) == 0 && value) target = *value;
  };
  if (std::getenv("KILN_DEVICE") == nullptr) from_file("--device", device, file->device);
  from_file("--runtime-dir", runtime_dir, file->runtime_dir);
  from_file("--socket", socket_name, file->socket);
  from_file("--allowed-group", allowed_group, file->allowed_group);
  from_file("--plan-cache", plan_cache, file->plan_cache);
  from_file("--log-level", log_level, file->log_level);
  from_file("--job-memory-mib", job_memory_mib, file->job_memory_mib);
  from_file("--job-queued-ops", job_queued_ops, file->job_queued_ops);
  from_file("--arena-mib", arena_mib, file->arena_mib);
  from_file("--lock-dir", lock_dir, file->lock_dir);
  from_file("--max-connections", max_connections, file->max_connections);
  from_file("--max-connections-per-uid", max_connections_per_uid, file->max_connections_per_uid);
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");

  // Signals are taken by sigwait on this thread; every thread created later inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client that vanishes mid-send must not kill the daemon

  kiln::Result<Backend> backend = make_backend(device, kernel_threads);
  if (!backend.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", backend.error().to_string().c_str());
    return 2;
  }
  const std::string device_name = backend->name;
  // One daemon per device on this machine, whatever its socket is called; held until exit.
  kiln::Result<kiln::ipc::DeviceLock> device_lock = kiln::ipc::DeviceLock::acquire(device_name, lock_dir);
  if (!device_lock.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", device_lock.error().to_string().c_str());
    return 1;
  }
  if (const std::uint64_t fit = raise_descriptor_limit(); fit != 0 && fit < max_connections) {
    spdlog::warn("kilnd: the descriptor limit fits {} clients: max_connections {} lowered to it", fit, max_connections);
    max_connections = fit;
  }

  kiln::ipc::DaemonOptions options;
  options.server.runtime_dir = runtime_dir;
  options.server.socket_name = socket_name.empty() ? kiln::ipc::daemon_socket_name(device_name) : socket_name;
  options.server.segment.arena_bytes = arena_mib << 20;
  options.server.max_connections = max_connections;
  options.server.max_connections_per_uid = max_connections_per_uid;
  if (!allowed_group.empty()) {
    const group* g = getgrnam(allowed_group.c_str());
    if (g == nullptr) {
      std::fprintf(stderr, "kilnd: --allowed-group %s: no such group\n", allowed_group.c_str());
      return 2;
    }
    options.server.allowed_gid = g->gr_gid;
  }
  options.job_memory_bytes = job_memory_mib << 20;
  options.job_queued_ops = job_queued_ops;
  options.device_name = device_name;

  kiln::runtime::RuntimeOptions ro;
  ro.threads = threads;
  ro.config_path = config;
  // Waiters do not spin here unless kiln.toml or KILN_RUNTIME_SPIN_WAITS asks for it: a session
  // thread's waits mostly run inline, and its client already polls for the answer, so a spinning
  // session thread would take the core the actor needs (measured in docs/decisions.md, ipc).
  // A malformed file is reported by Device::create below.
  if (kiln::Result<kiln::runtime::RuntimeFileConfig> rc = kiln::runtime::load_runtime_config(config, kiln::fusion::process_env());
      !rc.ok() || !rc->spin_waits)
    ro.spin_waits = false;
  kiln::Result<std::unique_ptr<kiln::runtime::Device>> dev =
      kiln::runtime::Device::create(std::move(backend->backend), std::move(ro));
  if (!dev.ok()) {
    std::fprintf(stderr, "kilnd: %s\n", dev.error().to_string().c_str());
    return 2;
  }
  if (!plan_cache.empty()) {
    // A missing, corrupt or foreign file is reported and ignored: the daemon starts either way.
    const kiln::fusion::PlanCacheLoadReport r =
        kiln::fusion::load_plan_cache((*dev)->plan_store(), plan_cache, kiln::fusion::FusionLog::to_stderr(kiln::fusion::LogLevel::Disabled));
    if (r.found && r.ok())
      spdlog::info("kilnd: plan cache {}: loaded {} plans ({} merged)", plan_cache, r.loaded, r.merged);
    else if (!r.found)
      spdlog::info("kilnd: plan cache {}: no saved plans yet", plan_cache);
  }
  kiln::Result<std::unique_ptr<kiln::ipc::DaemonService>> service = kiln::ipc::DaemonService::start(**dev, options);
  if (!service.ok()) {
    // The usual cause: another daemon on this device ("another daemon is already running at ...").
    std::fprintf(stderr, "kilnd: %s\n", service.error().to_string().c_str());
    return 1;
  }
  // The backend is owned by the device, which outlives the service.
  (*service)->set_fused_launch_counter(backend->fused_launches);
  spdlog::info("kilnd: ready on {} (device {}, {} stream threads)", (*service)->socket_path(), device_name,
               (*dev)->threads());

  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("kilnd: {} received: stopping (draining every client's streams)", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  const kiln::ipc::DaemonStatus last = (*service)->status();
  (*service)->stop();
  kiln::Status down = (*dev)->shutdown();
  if (!plan_cache.empty()) {
    kiln::Result<kiln::fusion::PlanCacheSaveReport> saved = kiln::fusion::save_plan_cache((*dev)->plan_store(), plan_cache);
    if (saved.ok())
      spdlog::info("kilnd: plan cache {}: saved {} plans ({} bytes, {} not savable)", saved->file.string(), saved->saved,
                   saved->bytes, saved->skipped);
    else
      spdlog::error("kilnd: plan cache {}: {}", plan_cache, saved.error().to_string());
  }
  const kiln::runtime::MemoryStats mem = (*dev)->backend().memory_stats();
  spdlog::info("kilnd: stopped after {} client(s); {} plans; {} tensors and {} bytes left on the device",
               last.clients_served, last.plans, mem.tensors, mem.bytes_in_use);
  if (!down.ok()) {
    spdlog::error("kilnd: {}", down.error().to_string());
    return 1;
  }
  return 0;
}

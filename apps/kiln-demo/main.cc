// kiln-demo: the main job. Starts kilnd on the best available device (or connects to a running
// one with --connect) and N training-worker processes; each trains a small MLP with Adam on a
// synthetic regression task through the daemon (apps/common mlp_trainer.h over the IPC client
// library), printing its progress; the demo prints the daemon's plan-cache figures while they
// run and a summary at the end. Exit 0 only if every worker's loss really fell (and the daemon
// it started stopped cleanly).
//
//   kiln-demo [--workers 2] [--steps 2000] [--device auto] [--connect] [--runtime-dir DIR]
//             [--socket NAME] [--batch 64] [--hidden 64]
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/apps/mlp_trainer.h"
#include "kiln/ipc/daemon.h"
#include "kiln/ipc/remote_target.h"
#include "kiln/ipc/unix_socket.h"
#include "kiln/runtime/session.h"

namespace {

using Clock = std::chrono::steady_clock;
using kiln::runtime::Session;
using kiln::runtime::Tensor;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- Worker process

int run_worker(int index, const std::string& dir, const std::string& socket, int steps, std::uint64_t batch,
               std::uint64_t hidden) {
  kiln::ipc::RemoteOptions o;
  o.runtime_dir = dir;
  o.socket_name = socket;
  o.job = "demo";
  auto remote = kiln::ipc::RemoteTarget::connect(o);
  if (!remote.ok()) {
    std::printf("ERROR connect: %s\n", remote.error().message.c_str());
    return 2;
  }
  kiln::ipc::RemoteTarget& target = **remote;
  int rc = 0;
  {
    Session s(target);
    kiln::apps::MlpTrainer<Session, Tensor> mlp(
        s, kiln::apps::MlpOptions{.batch = batch, .hidden = hidden, .seed = static_cast<std::uint64_t>(11 + index)});
    if (kiln::Status st = mlp.init(); !st.ok()) {
      std::printf("ERROR init: %s\n", st.error().message.c_str());
      return 2;
    }
    const auto t0 = Clock::now();
    double first = 0, last = 0, window_start = 0;
    std::uint64_t commands_at_window = target.requests();
    const int report_every = std::max(1, steps / 8);
    for (int step = 1; step <= steps; ++step) {
      kiln::Result<double> loss = mlp.step();
      if (!loss.ok()) {
        std::printf("ERROR step %d: %s\n", step, loss.error().message.c_str());
        return 2;
      }
      if (step <= 3) first += *loss / 3;
      if (step > steps - 3) last += *loss / std::min(3, steps);
      if (step % report_every == 0 || step == steps) {
        const double now = seconds_since(t0);
        const std::uint64_t commands = target.requests();
        const double rate = now > window_start ? double(commands - commands_at_window) / (now - window_start) : 0;
        std::printf("step %4d/%d  loss %.5f  %.0f ops/s\n", step, steps, *loss, rate);
        std::fflush(stdout);
        window_start = now;
        commands_at_window = commands;
      }
    }
    const double secs = seconds_since(t0);
    const bool fell = std::isfinite(last) && last < 0.5 * first;
    std::printf("RESULT first_loss=%.6f last_loss=%.6f steps=%d commands=%llu seconds=%.3f fell=%d\n", first, last,
                steps, static_cast<unsigned long long>(target.requests()), secs, fell ? 1 : 0);
    std::fflush(stdout);
    rc = fell ? 0 : 3;
  }
  return rc;
}

// ---- Parent

struct Child {
  pid_t pid = -1;
  int out = -1;  // read end of its stdout
  std::string pending;
  std::string result;  // its RESULT line
  std::optional<int> status;
};

std::string self_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : exe.parent_path().string();
}

// fork + exec; with `capture`, its stdout and stderr go to a pipe we read.
Child spawn(const std::vector<std::string>& argv, bool capture) {
  Child c;
  int fds[2] = {-1, -1};
  if (capture && pipe2(fds, O_CLOEXEC) != 0) return c;
  const pid_t pid = fork();
  if (pid == 0) {
    if (capture) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
    }
    std::vector<char*> args;
    args.reserve(argv.size() + 1);
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "kiln-demo: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  c.pid = pid;
  if (capture) {
    close(fds[1]);
    c.out = fds[0];
  }
  return c;
}

// A field of the daemon's JSON status ("plans": 12): enough for the progress line.
double json_number(const std::string& json, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const auto at = json.find(k);
  return at == std::string::npos ? 0.0 : std::atof(json.c_str() + at + k.size());
}

std::string daemon_line(kiln::ipc::RemoteTarget& monitor) {
  kiln::Result<std::string> st = monitor.daemon_status(true);
  if (!st.ok()) return "daemon: " + st.error().message;
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "daemon: %.0f plans, plan-cache hit rate %.1f%%, %.0f explorations, %.0f fused launches, %.1f MiB in use",
      json_number(*st, "plans"), 100 * json_number(*st, "hit_rate"), json_number(*st, "explorations"),
      json_number(*st, "fused_launches"), json_number(*st, "memory_bytes") / (1 << 20));
  return buf;
}

bool stop_daemon(Child& daemon) {
  if (daemon.pid <= 0) return true;
  kill(daemon.pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 300; ++i) {  // 30 s
    if (waitpid(daemon.pid, &status, WNOHANG) == daemon.pid) {
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      std::printf("kiln-demo: kilnd stopped (%s)\n", clean ? "exit 0" : "NOT clean");
      return clean;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("kiln-demo: kilnd did not stop within 30 s; killing it\n");
  kill(daemon.pid, SIGKILL);
  waitpid(daemon.pid, &status, 0);
  return false;
}

// Every option of the demo; a worker process gets its own through --worker-index and the rest.
struct Options {
  int workers = 2, steps = 2000, worker_index = -1;
  std::uint64_t batch = 64, hidden = 64;
  bool connect = false;
  std::string device = "auto", runtime_dir, socket;
};

// Parsing: the flags into `o`; returns an exit status to stop with, or nullopt.
std::optional<int> parse_options(int argc, char** argv, Options& o) {
  CLI::App app{"kiln-demo: kilnd with training workers in separate processes"};
  if (const char* env = std::getenv("KILN_DEVICE")) o.device = env;
  app.add_option("--workers", o.workers, "training-worker processes")->check(CLI::Range(1, 64));
  app.add_option("--steps", o.steps, "training steps per worker")->check(CLI::Range(4, 1000000));
  app.add_option("--device", o.device, "device of the daemon this demo starts: auto, cpu, cuda, cuda:N");
  app.add_flag("--connect", o.connect, "use a running kilnd (see --runtime-dir, --socket) instead of starting one");
  app.add_option("--runtime-dir", o.runtime_dir,
                 "the daemon's runtime directory (default: a private temporary one, removed at exit, or "
                 "the default one with --connect; a directory named here is kept)");
  app.add_option("--socket", o.socket, "the daemon's socket name (default kilnd-<device>.sock)");
  app.add_option("--batch", o.batch, "batch size")->check(CLI::Range(1, 4096));
  app.add_option("--hidden", o.hidden, "hidden units")->check(CLI::Range(1, 4096));
  app.add_option("--worker-index", o.worker_index, "internal: run as worker N")->group("");
  CLI11_PARSE(app, argc, argv);
  return std::nullopt;
}

// Daemon: starts a private kilnd in `dir` (a new temporary one when empty: `made_dir` is then
// set), or with --connect names the running one's; fills in the defaults of `dir` and `socket`.
// False: it could not start.
bool start_or_find_daemon(const Options& o, const std::string& bin, Child& daemon, std::string& dir,
                          std::string& socket, bool& made_dir) {
  if (!o.connect) {
    if (dir.empty()) {
      char tmpl[] = "/tmp/kiln-demo-XXXXXX";
      if (mkdtemp(tmpl) == nullptr) {
        std::fprintf(stderr, "kiln-demo: mkdtemp: %s\n", std::strerror(errno));
        return false;
      }
      dir = tmpl;
      made_dir = true;
    }
    if (socket.empty()) socket = "kilnd-demo.sock";
    std::printf("kiln-demo: starting kilnd (--device %s) in %s\n", o.device.c_str(), dir.c_str());
    std::fflush(stdout);
    // Its own lock directory too: the demo's daemon is private, and runs beside any kilnd that
    // serves this device for real.
    daemon = spawn({bin + "/kilnd", "--device", o.device, "--runtime-dir", dir, "--socket", socket, "--lock-dir", dir},
                   false);
    if (daemon.pid <= 0) {
      std::fprintf(stderr, "kiln-demo: cannot start %s/kilnd\n", bin.c_str());
      return false;
    }
  } else {
    if (dir.empty()) dir = kiln::ipc::default_runtime_dir();
    if (socket.empty()) socket = kiln::ipc::daemon_socket_name(o.device == "auto" ? "cpu" : o.device);
  }
  return true;
}

// The monitor connection: waits for the daemon to listen, then reports its plan cache.
// Null: the daemon is unreachable (one this demo started is stopped).
std::unique_ptr<kiln::ipc::RemoteTarget> connect_monitor(const std::string& dir, const std::string& socket,
                                                         bool connect, Child& daemon) {
  const auto t_wait = Clock::now();
  for (;;) {
    kiln::ipc::RemoteOptions o;
    o.runtime_dir = dir;
    o.socket_name = socket;
    o.job = "demo-monitor";
    o.timeout = std::chrono::milliseconds(2000);
    auto m = kiln::ipc::RemoteTarget::connect(o);
    if (m.ok()) return std::move(m).value();
    int status = 0;
    if (daemon.pid > 0 && waitpid(daemon.pid, &status, WNOHANG) == daemon.pid) {
      std::fprintf(stderr, "kiln-demo: kilnd exited before listening (status %d)\n", status);
      return nullptr;
    }
    if (seconds_since(t_wait) > 20 || connect) {
      std::fprintf(stderr, "kiln-demo: cannot reach kilnd: %s\n", m.error().message.c_str());
      if (daemon.pid > 0) stop_daemon(daemon);
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Workers: the line that says what they will train.
void announce_workers(const Options& o) {
  std::printf("kiln-demo: %d workers x %d steps (MLP %llu-%llu-8, batch %llu, Adam), job 'demo'\n", o.workers, o.steps,
              32ULL, static_cast<unsigned long long>(o.hidden), static_cast<unsigned long long>(o.batch));
  std::fflush(stdout);
}

// Workers: starts them, each a kiln-demo --worker-index process with its output captured.
std::vector<Child> spawn_workers(const Options& o, const std::string& bin, const std::string& dir,
                                 const std::string& socket) {
  std::vector<Child> kids;
  kids.reserve(static_cast<std::size_t>(o.workers));
  for (int i = 0; i < o.workers; ++i)
    kids.push_back(spawn(
        {bin + "/kiln-demo", "--worker-index", std::to_string(i), "--runtime-dir", dir, "--socket", socket, "--steps",
         std::to_string(o.steps), "--batch", std::to_string(o.batch), "--hidden", std::to_string(o.hidden)},
        true));
  return kids;
}

// Workers: relays their output line by line, with the daemon's figures every second, until all exit.
void relay_worker_output(std::vector<Child>& kids, kiln::ipc::RemoteTarget& monitor) {
  auto last_report = Clock::now();
  std::size_t running = kids.size();
  while (running > 0) {
    std::vector<pollfd> fds;
    fds.reserve(kids.size());
    for (const Child& k : kids) fds.push_back(pollfd{k.out, POLLIN, 0});
    (void)poll(fds.data(), fds.size(), 200);
    for (std::size_t i = 0; i < kids.size(); ++i) {
      Child& k = kids[i];
      if (k.out < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      const ssize_t n = read(k.out, buf, sizeof buf);
      if (n <= 0) {
        close(k.out);
        k.out = -1;
        int status = 0;
        waitpid(k.pid, &status, 0);
        k.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --running;
        continue;
      }
      k.pending.append(buf, static_cast<std::size_t>(n));
      for (std::size_t nl; (nl = k.pending.find('\n')) != std::string::npos;) {
        const std::string line = k.pending.substr(0, nl);
        k.pending.erase(0, nl + 1);
        if (line.rfind("RESULT ", 0) == 0) k.result = line;
        std::printf("[worker %zu] %s\n", i, line.c_str());
      }
      std::fflush(stdout);
    }
    if (seconds_since(last_report) > 1.0) {
      std::printf("%s\n", daemon_line(monitor).c_str());
      std::fflush(stdout);
      last_report = Clock::now();
    }
  }
}

// Summary: the daemon's figures and each worker's result; true if every worker's loss fell.
bool print_summary(const std::vector<Child>& kids, kiln::ipc::RemoteTarget& monitor, double wall) {
  std::printf("\n==== kiln-demo summary (%.1f s) ====\n", wall);
  std::printf("%s\n", daemon_line(monitor).c_str());
  bool all_ok = true;
  for (std::size_t i = 0; i < kids.size(); ++i) {
    const Child& k = kids[i];
    double f = 0, l = 0, secs = 0;
    unsigned long long commands = 0;
    int fell = 0;
    if (k.result.empty() ||
        std::sscanf(k.result.c_str(), "RESULT first_loss=%lf last_loss=%lf steps=%*d commands=%llu seconds=%lf fell=%d",
                    &f, &l, &commands, &secs, &fell) != 5) {
      std::printf("worker %zu: FAILED (exit %d, no result)\n", i, k.status.value_or(-1));
      all_ok = false;
      continue;
    }
    const bool ok = fell == 1 && k.status == 0;
    std::printf("worker %zu: loss %.4f -> %.4f (%s), %llu commands in %.1f s (%.0f/s)\n", i, f, l,
                ok ? "fell" : "DID NOT FALL", commands, secs, secs > 0 ? double(commands) / secs : 0.0);
    all_ok = all_ok && ok;
  }
  return all_ok;
}

// Shutdown: stops the daemon this demo started (nothing with --connect) and removes the runtime
// directory only when the demo made it: a directory the user named stays, with what was in it.
// False if the daemon did not stop cleanly.
bool stop_own_daemon(bool connect, Child& daemon, const std::string& dir, bool made_dir) {
  if (connect) return true;
  const bool clean = stop_daemon(daemon);
  if (made_dir) std::filesystem::remove_all(dir);
  return clean;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (std::optional<int> exit_status = parse_options(argc, argv, o)) return *exit_status;
  if (o.worker_index >= 0) return run_worker(o.worker_index, o.runtime_dir, o.socket, o.steps, o.batch, o.hidden);

  signal(SIGPIPE, SIG_IGN);
  const std::string bin = self_dir();
  Child daemon;
  std::string dir = o.runtime_dir, socket = o.socket;
  bool made_dir = false;
  if (!start_or_find_daemon(o, bin, daemon, dir, socket, made_dir)) return 1;
  std::unique_ptr<kiln::ipc::RemoteTarget> monitor = connect_monitor(dir, socket, o.connect, daemon);
  if (!monitor) return 1;

  announce_workers(o);
  const auto t0 = Clock::now();
  std::vector<Child> kids = spawn_workers(o, bin, dir, socket);
  relay_worker_output(kids, *monitor);
  const double wall = seconds_since(t0);

  bool all_ok = print_summary(kids, *monitor, wall);
  monitor.reset();
  if (!stop_own_daemon(o.connect, daemon, dir, made_dir)) all_ok = false;
  std::printf("kiln-demo: %s\n", all_ok ? "OK: every worker's loss fell" : "FAILED");
  return all_ok ? 0 : 1;
}

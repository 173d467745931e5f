// kiln-bench-scrape: what one metrics scrape costs the daemon (issue 26's target: at most 1 ms of
// the daemon's CPU time with 64 clients and 1,000 plans).
//
// Starts the kilnd built next to it (<build>/apps/kilnd, or --kilnd PATH) with the metrics on its
// Unix socket, teaches its plan store --plans distinct plans (elementwise chains of five ops, one
// plan each), connects --clients clients that each hold a tensor, then alternates idle windows
// and scrape windows of equal length: the daemon's CPU time (utime + stime from /proc) in a
// scrape window, less the idle window's, divided by the scrapes, is the cost of one. The
// client's own time, and this machine's noise in throughput, do not enter the figure.
//
//   kiln-bench-scrape [--kilnd PATH] [--clients 64] [--plans 1000] [--rounds 3] [--window 2]
//
// Prints `metric=NAME value=V unit=U` lines (the peer kit's format) at the end.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/ipc/remote_target.h"
#include "kiln/runtime/session.h"

extern char** environ;

namespace {

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "kiln-bench-scrape: %s\n", why.c_str());
  std::exit(1);
}

// The daemon's CPU time so far (user + system), in seconds.
double cpu_seconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::size_t close = text.rfind(')');  // the command may hold spaces
  if (close == std::string::npos) die("cannot read /proc/" + std::to_string(pid) + "/stat");
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  return double(utime + stime) / double(::sysconf(_SC_CLK_TCK));
}

// One GET /metrics on the Unix socket; the body's size (0 on any failure).
std::size_t scrape(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return 0;
  }
  static const char kRequest[] = "GET /metrics HTTP/1.1\r\nHost: kilnd\r\n\r\n";
  if (::send(fd, kRequest, sizeof kRequest - 1, MSG_NOSIGNAL) != ssize_t(sizeof kRequest - 1)) {
    ::close(fd);
    return 0;
  }
  std::string got;
  char buf[65536];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, std::size_t(n));
  ::close(fd);
  if (got.rfind("HTTP/1.1 200", 0) != 0) return 0;
  return got.size() - got.find("\r\n\r\n") - 4;
}

// A distinct elementwise chain per index: six ops chosen by its base-5 digits.
void teach_plan(kiln::runtime::Session& s, int index) {
  using kiln::runtime::Tensor;
  Tensor x = s.from_host(std::vector<float>(64, 0.5f), {64}).value();
  for (int d = 0, v = index; d < 6; ++d, v /= 5) {
    switch (v % 5) {
      case 0: x = s.add(x, 1.0).value(); break;
      case 1: x = s.mul(x, 0.5).value(); break;
      case 2: x = s.exp(x).value(); break;
      case 3: x = s.tanh(x).value(); break;
      default: x = s.neg(x).value(); break;
    }
  }
  (void)s.to_host(std::move(x)).value();
}

struct Args {
  std::string kilnd;
  int clients = 64, plans = 1000, rounds = 3;
  double window = 2.0;
};

Args parse(int argc, char** argv) {
  Args a;
  a.kilnd = (std::filesystem::canonical("/proc/self/exe").parent_path().parent_path() / "apps" / "kilnd").string();
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--kilnd")
      a.kilnd = v;
    else if (k == "--clients")
      a.clients = std::stoi(v);
    else if (k == "--plans")
      a.plans = std::stoi(v);
    else if (k == "--rounds")
      a.rounds = std::stoi(v);
    else if (k == "--window")
      a.window = std::stod(v);
    else
      die("unknown flag " + k + " (--kilnd, --clients, --plans, --rounds, --window)");
  }
  return a;
}

// Starts kilnd with its metrics on its Unix socket and its log in `log`; its pid.
pid_t start_kilnd(const std::string& kilnd, const std::string& dir, const std::string& run, const std::string& log) {
  std::vector<std::string> argv_d = {
      kilnd,        "--device",     "cpu",       "--runtime-dir", run,
      "--lock-dir", dir + "/locks", "--metrics", "unix",          "--max-connections-per-uid",
      "1024"};
  std::vector<char*> cargv;
  for (std::string& s : argv_d) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  // The interpreter, not the CPU JIT: a thousand new programs would otherwise queue a thousand
  // compiles, whose CPU time would land in the measuring windows.
  std::vector<std::string> env_d = {"KILN_CPU_JIT=0"};
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "KILN_CPU_JIT=", 13) != 0) env_d.emplace_back(*e);
  std::vector<char*> cenv;
  for (std::string& e : env_d) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, kilnd.c_str(), &actions, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) die("cannot start " + kilnd);
  return pid;
}

// The first client, once kilnd accepts (30 s at most).
std::unique_ptr<kiln::ipc::RemoteTarget> first_client(kiln::ipc::RemoteOptions o, const std::string& log) {
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    auto r = kiln::ipc::RemoteTarget::connect(o);
    if (r.ok()) return std::move(r).value();
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(30)) die("kilnd did not start: see " + log);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

long plans_in(kiln::ipc::RemoteTarget& client) {
  const std::string status = client.daemon_status(true).value();
  const std::size_t at = status.find("\"plans\":");
  return at == std::string::npos ? -1L : std::strtol(status.c_str() + at + 8, nullptr, 10);
}

// Programs until the store holds `plans` plans (a program may add more than one, or reuse one).
void teach(kiln::ipc::RemoteTarget& client, long plans) {
  kiln::runtime::Session teacher(client);
  for (int i = 0; plans_in(client) < plans; i += 50) {
    if (i >= 15625) die("the store did not reach " + std::to_string(plans) + " plans");
    for (int j = i; j < i + 50; ++j) teach_plan(teacher, j);
  }
}

// Rounds of an idle window then a scrape window: the daemon's CPU per scrape in each.
std::vector<double> measure(pid_t pid, const std::string& metrics, const Args& args, std::size_t& body_bytes) {
  std::vector<double> per_scrape_us;
  for (int round = 0; round < args.rounds; ++round) {
    const double idle_start = cpu_seconds(pid);
    std::this_thread::sleep_for(std::chrono::duration<double>(args.window));
    const double idle = cpu_seconds(pid) - idle_start;
    const double busy_start = cpu_seconds(pid);
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(args.window);
    std::size_t scrapes = 0;
    while (std::chrono::steady_clock::now() < end) {
      body_bytes = scrape(metrics);
      if (body_bytes == 0) die("a scrape failed (is the metrics socket " + metrics + " up?)");
      ++scrapes;
    }
    const double busy = cpu_seconds(pid) - busy_start;
    per_scrape_us.push_back(std::max(0.0, busy - idle) / double(scrapes) * 1e6);
    std::printf("round %d: %zu scrapes, daemon CPU %.3f s (idle window %.3f s): %.1f us per scrape\n", round + 1,
                scrapes, busy, idle, per_scrape_us.back());
  }
  return per_scrape_us;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  char tmpl[] = "/tmp/kiln-scrape-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) die("mkdtemp failed");
  const std::string dir = tmpl, run = dir + "/run", log = dir + "/kilnd.log";
  const pid_t pid = start_kilnd(args.kilnd, dir, run, log);

  kiln::ipc::RemoteOptions o;
  o.runtime_dir = run;
  o.socket_name = "kilnd-cpu.sock";
  o.job = "teacher";
  std::vector<std::unique_ptr<kiln::ipc::RemoteTarget>> clients;
  clients.push_back(first_client(o, log));
  teach(*clients.front(), args.plans);
  // The other clients: each holds a tensor on a stream of its own, in 8 jobs.
  std::vector<std::unique_ptr<kiln::runtime::Session>> sessions;
  std::vector<kiln::runtime::Tensor> held;
  for (int c = 1; c < args.clients; ++c) {
    o.job = "job-" + std::to_string(c % 8);
    auto r = kiln::ipc::RemoteTarget::connect(o);
    if (!r.ok()) die("client " + std::to_string(c) + ": " + r.error().to_string());
    clients.push_back(std::move(r).value());
    sessions.push_back(std::make_unique<kiln::runtime::Session>(*clients.back()));
    held.push_back(sessions.back()->from_host(std::vector<float>(1024, 1.0f), {1024}).value());
    (void)sessions.back()->sync();
  }
  const long plans = plans_in(*clients.front());
  std::printf("kilnd pid %d: %zu clients, %ld plans; %d rounds of %.1f s idle + %.1f s scraping\n", int(pid),
              clients.size(), plans, args.rounds, args.window, args.window);
  std::size_t body_bytes = 0;
  std::vector<double> per_scrape_us = measure(pid, run + "/kilnd-cpu.metrics", args, body_bytes);

  held.clear();
  sessions.clear();
  clients.clear();
  ::kill(pid, SIGTERM);
  int st = 0;
  ::waitpid(pid, &st, 0);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::sort(per_scrape_us.begin(), per_scrape_us.end());
  std::printf("metric=scrape_daemon_cpu value=%.1f unit=us\n", per_scrape_us[per_scrape_us.size() / 2]);
  std::printf("metric=scrape_body value=%zu unit=bytes\n", body_bytes);
  std::printf("metric=scrape_plans value=%ld unit=plans\n", plans);
  std::printf("metric=scrape_clients value=%d unit=clients\n", args.clients);
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

// KilndProcess: a kilnd child process on the CPU device, with its own private runtime and lock
// directories, for the programs that run several daemons on one machine (the distributed tests
// and benchmark). Its output goes to <dir>/kilnd.log; the destructor SIGKILLs it.
//
// Usage:
//   KilndProcess d(KILN_KILND_PATH, dir, {"--dist-job", "train", ...});  // kilnctl beside it for kilnctl()
//   auto target = d.connect("train");   // retries while the daemon starts
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/ipc/remote_target.h"

extern char** environ;

namespace kiln::apps {

class KilndProcess {
 public:
  KilndProcess(const std::string& kilnd, const std::filesystem::path& dir, const std::vector<std::string>& flags)
      : kilnd_(kilnd), dir_(dir) {
    for (const char* sub : {"run", "locks"}) {  // private, as kilnd requires
      std::filesystem::create_directories(dir_ / sub);
      std::filesystem::permissions(dir_ / sub, std::filesystem::perms::owner_all);
    }
    std::vector<std::string> args{
        kilnd, "--device", "cpu", "--runtime-dir", (dir_ / "run").string(), "--lock-dir", (dir_ / "locks").string()};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    const std::string log = (dir_ / "kilnd.log").string();
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~KilndProcess() { kill(SIGKILL); }
  KilndProcess(const KilndProcess&) = delete;
  KilndProcess& operator=(const KilndProcess&) = delete;

  bool started() const { return pid_ > 0; }
  // Sends `signal` and reaps the process.
  void kill(int signal) {
    if (pid_ <= 0) return;
    ::kill(pid_, signal);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // A client of `job`, once the daemon answers (it may still be starting; up to ~10 s).
  Result<std::unique_ptr<ipc::RemoteTarget>> connect(const std::string& job) const {
    ipc::RemoteOptions options;
    options.runtime_dir = (dir_ / "run").string();
    options.job = job;
    options.timeout = std::chrono::seconds(2);
    Result<std::unique_ptr<ipc::RemoteTarget>> target = make_error(ErrorCode::Execution, "kilnd did not start");
    for (int i = 0; i < 200 && started(); ++i) {
      target = ipc::RemoteTarget::connect(options);
      if (target.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return target;
  }

  // The rendezvous port a rank-0 daemon started with port 0 took, from its start-up line
  // "... rendezvous tcp:HOST:PORT (served here)"; nullopt if it did not say within ~10 s.
  std::optional<std::uint16_t> served_rendezvous_port() const {
    for (int i = 0; i < 200 && started(); ++i) {
      const std::string text = log();
      const std::size_t end = text.find(" (served here)");
      if (end != std::string::npos) {
        const std::size_t colon = text.rfind(':', end);
        return static_cast<std::uint16_t>(std::stoi(text.substr(colon + 1, end - colon - 1)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return std::nullopt;
  }

  // `kilnctl ARGS --runtime-dir <this daemon's>`'s output (kilnctl beside kilnd).
  std::string kilnctl(const std::string& args) const {
    const std::string cmd = (std::filesystem::path(kilnd_).parent_path() / "kilnctl").string() + " " + args +
                            " --runtime-dir " + (dir_ / "run").string() + " 2>&1";
    std::string out;
    if (FILE* p = ::popen(cmd.c_str(), "r")) {
      char buf[4096];
      std::size_t n = 0;
      while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
      ::pclose(p);
    }
    return out;
  }

  std::string log() const {
    std::ifstream in(dir_ / "kilnd.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string kilnd_;
  std::filesystem::path dir_;
  pid_t pid_ = -1;
};

}  // namespace kiln::apps

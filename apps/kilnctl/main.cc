// kilnctl: a running kilnd's status, and live control for its operator (docs/operations.md).
//
//   kilnctl status [--json]                         every daemon in the runtime directory
//   kilnctl jobs|clients [--json]                   the daemon's jobs, its clients
//   kilnctl limits [--json]                         the live limits
//   kilnctl limits set KEY=VALUE...                 change them without a restart
//   kilnctl disconnect CLIENT                       end one client (its memory freed)
//   kilnctl drain [--timeout S] [--exit] | --status | --resume
//   kilnctl reload                                  re-read kiln.toml (as SIGHUP)
//   kilnctl metrics                                 the Prometheus exposition
//   kilnctl stop                                    stop the daemon (as SIGTERM)
//   kilnctl plans [--sort hits|recent|id] [--limit N] [--json]   the plan store
//   kilnctl plans show ID [--format text|dot]       one plan (Graphviz DOT: | dot -Tsvg)
//   kilnctl plans clear [--job J]                   retire every plan, or those job J created
// Every command takes [--runtime-dir DIR] [--socket NAME]. Without --socket, status asks every
// daemon whose socket is in the runtime directory (kilnd-<device>.sock); the others need exactly
// one daemon there, or --socket. A member of a daemon's --allowed-group may search that directory
// (0710) but not list it: kilnctl then looks for the devices' default socket names one by one.
// Everything but status is for the daemon's user and root only (the daemon checks).
// Exit status: 0 on success, 1 when a daemon refused or none runs, 2 on a usage error.
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kiln/ipc/remote_target.h"
#include "kiln/ipc/unix_socket.h"

namespace {

struct Where {
  std::string runtime_dir, socket_name;
};

// The daemons' socket names in the runtime directory (or the one asked); an empty list after
// printing why.
std::vector<std::string> find_sockets(const std::string& dir, const std::string& socket_name) {
  std::vector<std::string> sockets;
  if (!socket_name.empty()) return {socket_name};
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("kilnd", 0) == 0 && name.size() > 5 && name.substr(name.size() - 5) == ".sock")
      sockets.push_back(name);
  }
  if (ec == std::errc::permission_denied) {
    // Searchable but not listable (a group member), or not even searchable (another user):
    // try the default socket names; stat() needs only search permission.
    std::vector<std::string> names{kiln::ipc::daemon_socket_name("cpu")};
    for (int gpu = 0; gpu < 16; ++gpu) names.push_back(kiln::ipc::daemon_socket_name("cuda:" + std::to_string(gpu)));
    int err = 0;
    for (const std::string& name : names) {
      struct stat st {};
      if (::stat((std::filesystem::path(dir) / name).c_str(), &st) == 0)
        sockets.push_back(name);
      else if (errno == EACCES)
        err = EACCES;
    }
    if (sockets.empty() && err == EACCES) {
      std::fprintf(stderr,
                   "kilnctl: refused: no permission to reach %s (the daemon accepts only its own user and its "
                   "--allowed-group)\n",
                   dir.c_str());
      return {};
    }
  } else if (ec && ec != std::errc::no_such_file_or_directory) {
    std::fprintf(stderr, "kilnctl: cannot list %s: %s\n", dir.c_str(), ec.message().c_str());
    return {};
  }
  if (sockets.empty()) std::fprintf(stderr, "kilnctl: no kilnd is running (no kilnd-*.sock in %s)\n", dir.c_str());
  return sockets;
}

kiln::Result<std::unique_ptr<kiln::ipc::RemoteTarget>> connect(const std::string& dir, const std::string& name) {
  kiln::ipc::RemoteOptions o;
  o.runtime_dir = dir;
  o.socket_name = name;
  // A job of its own per user: jobs belong to their creator's uid, so a shared name would
  // refuse the second user's kilnctl while the first one's is connected.
  o.job = "kilnctl-" + std::to_string(::getuid());
  o.timeout = std::chrono::milliseconds(5000);
  // A disconnect waits for the client's streams to drain (the daemon gives up after 30 s).
  o.reply_timeout = std::chrono::milliseconds(40'000);
  return kiln::ipc::RemoteTarget::connect(o);
}

int status(const Where& w, bool json) {
  const std::string dir = w.runtime_dir.empty() ? kiln::ipc::default_runtime_dir() : w.runtime_dir;
  const std::vector<std::string> sockets = find_sockets(dir, w.socket_name);
  if (sockets.empty()) return 1;
  int answered = 0;
  for (const std::string& name : sockets) {
    auto remote = connect(dir, name);
    kiln::Result<std::string> text =
        remote.ok() ? (*remote)->daemon_status(json) : kiln::Result<std::string>(remote.error());
    if (!text.ok()) {
      std::fprintf(stderr, "kilnctl: %s: %s\n", name.c_str(), text.error().message.c_str());
      continue;
    }
    std::fputs(text->c_str(), stdout);
    if (json) std::fputc('\n', stdout);
    ++answered;
  }
  return answered == static_cast<int>(sockets.size()) ? 0 : 1;
}

// One daemon for a control command: --socket's, or the only one in the directory.
kiln::Result<std::unique_ptr<kiln::ipc::RemoteTarget>> one_daemon(const Where& w) {
  const std::string dir = w.runtime_dir.empty() ? kiln::ipc::default_runtime_dir() : w.runtime_dir;
  const std::vector<std::string> sockets = find_sockets(dir, w.socket_name);
  if (sockets.empty()) return kiln::make_error(kiln::ErrorCode::Config, "");
  if (sockets.size() > 1) {
    std::string names;
    for (const std::string& n : sockets) names += " " + n;
    return kiln::make_error(kiln::ErrorCode::Config,
                            "several daemons run in " + dir + " (" + names.substr(1) + "): choose one with --socket");
  }
  auto remote = connect(dir, sockets.front());
  if (!remote.ok()) return kiln::make_error(remote.error().code, sockets.front() + ": " + remote.error().message);
  return remote;
}

// Sends one control command and prints the answer; the exit status.
int control(kiln::ipc::RemoteTarget& daemon, kiln::ipc::ControlVerb verb, const std::string& args, bool json) {
  kiln::Result<std::string> text = daemon.control(verb, args, json);
  if (!text.ok()) {
    std::fprintf(stderr, "kilnctl: %s\n", text.error().message.c_str());
    return 1;
  }
  std::fputs(text->c_str(), stdout);
  if (json || (!text->empty() && text->back() != '\n')) std::fputc('\n', stdout);
  return 0;
}

struct DrainOptions {
  bool status = false, resume = false, exit = false;
  double timeout_s = 0;  // 0: wait as long as it takes
};

// drain: refuse new clients, then wait for the connected ones to go (progress every few seconds),
// and with --exit stop the daemon once they have.
int drain(kiln::ipc::RemoteTarget& daemon, const DrainOptions& o) {
  using kiln::ipc::ControlVerb;
  if (o.status || o.resume) return control(daemon, ControlVerb::Drain, o.resume ? "resume" : "status", false);
  kiln::Result<std::string> first = daemon.control(ControlVerb::Drain, "start", true);
  if (!first.ok()) {
    std::fprintf(stderr, "kilnctl: %s\n", first.error().message.c_str());
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  auto last_report = start - std::chrono::seconds(10);
  for (;;) {
    kiln::Result<std::string> st = daemon.control(ControlVerb::Drain, "status", true);
    if (!st.ok()) {
      std::fprintf(stderr, "kilnctl: %s\n", st.error().message.c_str());
      return 1;
    }
    const std::size_t at = st->find("\"clients\":");
    const long left = at == std::string::npos ? -1 : std::strtol(st->c_str() + at + 10, nullptr, 10);
    if (left == 0) break;
    const auto now = std::chrono::steady_clock::now();
    const double waited = std::chrono::duration<double>(now - start).count();
    if (o.timeout_s > 0 && waited >= o.timeout_s) {
      std::fprintf(stderr,
                   "kilnctl: drain: %ld client(s) still connected after %.0f s; the daemon keeps refusing new ones "
                   "(kilnctl drain --resume ends that)\n",
                   left, waited);
      return 1;
    }
    if (now - last_report >= std::chrono::seconds(5)) {
      std::printf("draining: %ld client(s) still connected (%.0f s)\n", left, waited);
      std::fflush(stdout);
      last_report = now;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  std::printf("drained: no client left\n");
  if (o.exit) return control(daemon, ControlVerb::Stop, "", false);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using kiln::ipc::ControlVerb;
  CLI::App app{"kilnctl: status and live control of the kiln daemons"};
  app.require_subcommand(1);
  Where where;
  bool json = false;
  auto common = [&](CLI::App* cmd, bool with_json) {
    cmd->add_option("--runtime-dir", where.runtime_dir,
                    "directory of the daemons' sockets (default $XDG_RUNTIME_DIR/kiln)");
    cmd->add_option("--socket", where.socket_name, "one daemon's socket file name (default: every kilnd-*.sock)");
    if (with_json) cmd->add_flag("--json", json, "print JSON");
    return cmd;
  };
  CLI::App* status_cmd =
      common(app.add_subcommand("status", "clients and jobs, streams, queued operations, plan store, memory"), true);
  CLI::App* jobs = common(app.add_subcommand("jobs", "the jobs: owner, clients, memory, queued operations"), true);
  CLI::App* clients =
      common(app.add_subcommand("clients", "every client: job, pid, uid, streams, tensors, memory"), true);
  CLI::App* limits =
      common(app.add_subcommand("limits", "the live limits; `limits set KEY=VALUE...` changes them"), true);
  std::vector<std::string> assignments;
  CLI::App* limits_set = common(limits->add_subcommand("set", "change limits without a restart"), true);
  limits_set->add_option("assignments", assignments, "KEY=VALUE (job_memory_mib, uid_queued_ops, ...)")->required();
  std::uint64_t client_id = 0;
  CLI::App* disconnect =
      common(app.add_subcommand("disconnect", "end one client: streams drained, memory freed"), false);
  disconnect->add_option("client", client_id, "the client's id (kilnctl clients)")->required();
  DrainOptions drain_options;
  CLI::App* drain_cmd =
      common(app.add_subcommand("drain", "refuse new clients and wait for the connected ones to go"), false);
  drain_cmd->add_option("--timeout", drain_options.timeout_s, "give up waiting after this many seconds (0: never)");
  drain_cmd->add_flag("--exit", drain_options.exit, "stop the daemon once no client is left");
  drain_cmd->add_flag("--status", drain_options.status, "only say whether it drains and how many clients are left");
  drain_cmd->add_flag("--resume", drain_options.resume, "accept new clients again");
  CLI::App* reload = common(app.add_subcommand("reload", "re-read kiln.toml: what can change live changes"), false);
  CLI::App* metrics = common(app.add_subcommand("metrics", "the Prometheus metrics the endpoint serves"), false);
  CLI::App* stop = common(app.add_subcommand("stop", "stop the daemon as SIGTERM does"), false);
  std::string sort = "hits", format = "text", job;
  std::size_t limit = 50;
  std::string plan_id;
  CLI::App* plans = common(app.add_subcommand("plans", "the plan store: id, ops, score, hits, last use, jobs"), true);
  plans->add_option("--sort", sort, "hits (default), recent or id")->check(CLI::IsMember({"hits", "recent", "id"}));
  plans->add_option("--limit", limit, "plans shown (default 50; 0: all)");
  CLI::App* plans_show = common(plans->add_subcommand("show", "one plan as text or Graphviz DOT"), false);
  plans_show->add_option("id", plan_id, "the plan's id (kilnctl plans)")->required();
  plans_show->add_option("--format", format, "text (default) or dot")->check(CLI::IsMember({"text", "dot"}));
  CLI::App* plans_clear = common(
      plans->add_subcommand("clear", "retire every plan, or those one job created (they stop being matched)"), false);
  plans_clear->add_option("--job", job, "only the plans this job created");
  CLI11_PARSE(app, argc, argv);

  if (status_cmd->parsed()) return status(where, json);
  auto daemon = one_daemon(where);
  if (!daemon.ok()) {
    if (!daemon.error().message.empty()) std::fprintf(stderr, "kilnctl: %s\n", daemon.error().message.c_str());
    return 1;
  }
  kiln::ipc::RemoteTarget& d = **daemon;
  if (jobs->parsed()) return control(d, ControlVerb::Jobs, "", json);
  if (clients->parsed()) return control(d, ControlVerb::Clients, "", json);
  if (limits_set->parsed()) {
    std::string args;
    for (const std::string& a : assignments) args += (args.empty() ? "" : " ") + a;
    return control(d, ControlVerb::Limits, args, json);
  }
  if (limits->parsed()) return control(d, ControlVerb::Limits, "", json);
  if (disconnect->parsed()) return control(d, ControlVerb::Disconnect, std::to_string(client_id), false);
  if (drain_cmd->parsed()) return drain(d, drain_options);
  if (reload->parsed()) return control(d, ControlVerb::Reload, "", false);
  if (metrics->parsed()) return control(d, ControlVerb::Metrics, "", false);
  if (stop->parsed()) return control(d, ControlVerb::Stop, "", false);
  if (plans_show->parsed()) return control(d, ControlVerb::Plans, "show " + plan_id + " " + format, false);
  if (plans_clear->parsed()) return control(d, ControlVerb::Plans, job.empty() ? "clear" : "clear " + job, false);
  if (plans->parsed()) return control(d, ControlVerb::Plans, "list " + sort + " " + std::to_string(limit), json);
  return 2;
}

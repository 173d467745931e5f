// kilnctl: asks a running kilnd for its status.
//
//   kilnctl status [--json] [--runtime-dir DIR] [--socket NAME]
//
// Without --socket it asks every daemon whose socket is in the runtime directory
// (kilnd-<device>.sock). A member of a daemon's --allowed-group may search that directory (0710)
// but not list it: kilnctl then looks for the devices' default socket names one by one.
// Exit status: 0 when every daemon answered, 1 when none runs, 2 on a usage error.
#include <unistd.h>

#include <CLI/CLI.hpp>

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/ipc/remote_target.h"
#include "kiln/ipc/unix_socket.h"

int main(int argc, char** argv) {
  CLI::App app{"kilnctl: status of the kiln daemons"};
  app.require_subcommand(1);
  CLI::App* status = app.add_subcommand("status", "clients and jobs, streams, queued operations, plan store, memory");
  bool json = false;
  std::string runtime_dir, socket_name;
  status->add_flag("--json", json, "print JSON (one object per daemon, one per line)");
  status->add_option("--runtime-dir", runtime_dir, "directory of the daemons' sockets (default $XDG_RUNTIME_DIR/kiln)");
  status->add_option("--socket", socket_name, "one daemon's socket file name (default: every kilnd-*.sock)");
  CLI11_PARSE(app, argc, argv);

  const std::string dir = runtime_dir.empty() ? kiln::ipc::default_runtime_dir() : runtime_dir;
  std::vector<std::string> sockets;
  if (!socket_name.empty()) {
    sockets.push_back(socket_name);
  } else {
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
        return 1;
      }
    } else if (ec && ec != std::errc::no_such_file_or_directory) {
      std::fprintf(stderr, "kilnctl: cannot list %s: %s\n", dir.c_str(), ec.message().c_str());
      return 1;
    }
  }
  if (sockets.empty()) {
    std::fprintf(stderr, "kilnctl: no kilnd is running (no kilnd-*.sock in %s)\n", dir.c_str());
    return 1;
  }
  int answered = 0;
  for (const std::string& name : sockets) {
    kiln::ipc::RemoteOptions o;
    o.runtime_dir = dir;
    o.socket_name = name;
    // A job of its own per user: jobs belong to their creator's uid, so a shared name would
    // refuse the second user's kilnctl while the first one's is connected.
    o.job = "kilnctl-" + std::to_string(::getuid());
    o.timeout = std::chrono::milliseconds(5000);
    o.reply_timeout = std::chrono::milliseconds(10'000);
    auto remote = kiln::ipc::RemoteTarget::connect(o);
    if (!remote.ok()) {
      std::fprintf(stderr, "kilnctl: %s: %s\n", name.c_str(), remote.error().message.c_str());
      continue;
    }
    kiln::Result<std::string> text = (*remote)->daemon_status(json);
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

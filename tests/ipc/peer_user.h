// Another uid for the daemon's tests: a system user (and group) created for them, and commands
// run as that user through setpriv. Needs root to create the user and to switch to it; tests
// that use it skip, saying so, when not run as root.
#pragma once

#include <grp.h>
#include <pwd.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

namespace kiln::testing {

inline constexpr const char* kPeerUser = "kiln-test-peer";
inline constexpr const char* kPeerGroup = "kiln-test-grp";

// Creates the test's user and group if they are missing (idempotent). Empty = ready.
inline std::string ensure_peer_user() {
  if (getgrnam(kPeerGroup) == nullptr && std::system((std::string("groupadd --system ") + kPeerGroup).c_str()) != 0)
    return "groupadd failed";
  if (getpwnam(kPeerUser) == nullptr &&
      std::system((std::string("useradd --system --no-create-home --shell /usr/sbin/nologin ") + kPeerUser).c_str()) !=
          0)
    return "useradd failed";
  return "";
}

// Runs `command` as `user` with primary group `group` (setpriv: real and effective ids) and the
// supplementary groups given (none when empty); returns its exit status and output (stdout and
// stderr).
inline std::pair<int, std::string> run_as(const std::string& user, const std::string& group, const std::string& groups,
                                          const std::string& command) {
  const std::string cmd = "setpriv --reuid=" + user + " --regid=" + group +
                          (groups.empty() ? " --clear-groups" : " --groups=" + groups) + " " + command + " 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {-1, "popen failed"};
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// The same as the peer user, in its own group.
inline std::pair<int, std::string> run_as_peer(const std::string& groups, const std::string& command) {
  return run_as(kPeerUser, kPeerUser, groups, command);
}

#ifdef KILN_KILNCTL_PATH
// kilnctl status as the peer user against the daemon in `dir`.
// `socket` empty: no --socket (kilnctl finds the daemons itself).
inline std::pair<int, std::string> kilnctl_as_peer(const std::string& dir, const std::string& groups,
                                                   const std::string& socket = "kilnd-test.sock",
                                                   const std::string& extra = "") {
  return run_as_peer(groups, std::string(KILN_KILNCTL_PATH) + " status --runtime-dir " + dir +
                                 (socket.empty() ? "" : " --socket " + socket) + (extra.empty() ? "" : " " + extra));
}
#endif

}  // namespace kiln::testing

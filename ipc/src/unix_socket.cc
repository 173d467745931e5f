#include "kiln/ipc/unix_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kiln::ipc {

namespace {
std::string mode_text(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0%03o", static_cast<unsigned>(m & 07777));
  return buf;
}
}  // namespace

std::string default_runtime_dir() {
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/kiln";
  }
  return "/tmp/kiln-" + std::to_string(::geteuid());
}

std::string daemon_file_stem(const std::string& device) {
  std::string name = "kilnd-";
  for (char c : device) name += (c == ':' || c == '/') ? '-' : c;
  return name;
}

std::string daemon_socket_name(const std::string& device) { return daemon_file_stem(device) + ".sock"; }

Status ensure_runtime_dir(const std::string& path, std::optional<gid_t> group) {
  const mode_t want = group ? 0710 : 0700;
  bool created = false;
  if (::mkdir(path.c_str(), 0700) == 0) {
    created = true;
  } else if (errno != EEXIST) {
    return sys_error("creating runtime dir " + path, errno);
  }
  // Inspect what is there through an fd opened without following links, so a swapped-in
  // symlink is refused rather than followed.
  UniqueFd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir) {
    if (errno == ELOOP || errno == ENOTDIR) {
      return make_error(ErrorCode::Config, "runtime dir " + path + " is not a directory (or is a symlink)");
    }
    return sys_error("opening runtime dir " + path, errno);
  }
  if (created) {
    if (group && ::fchown(dir.get(), static_cast<uid_t>(-1), *group) != 0) {
      return sys_error("giving runtime dir " + path + " to group " + std::to_string(*group), errno);
    }
    if (::fchmod(dir.get(), want) != 0) return sys_error("chmod of runtime dir " + path, errno);
  }
  struct stat st {};
  if (::fstat(dir.get(), &st) != 0) return sys_error("stat of runtime dir " + path, errno);
  if (st.st_uid != ::geteuid()) {
    return make_error(ErrorCode::Config, "runtime dir " + path + " is owned by uid " + std::to_string(st.st_uid) +
                                             ", not by this process's uid " + std::to_string(::geteuid()));
  }
  if ((st.st_mode & 07777) != want) {
    return make_error(ErrorCode::Config, "runtime dir " + path + " has mode " + mode_text(st.st_mode) + ", expected " +
                                             mode_text(want) + " (fix or remove it)");
  }
  if (group && st.st_gid != *group) {
    return make_error(ErrorCode::Config, "runtime dir " + path + " belongs to group " + std::to_string(st.st_gid) +
                                             ", expected " + std::to_string(*group));
  }
  return Status::Ok();
}

Result<std::string> socket_path(const std::string& dir, const std::string& name) {
  std::string p = dir + "/" + name;
  if (p.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return make_error(ErrorCode::Config, "socket path " + p + " is longer than " +
                                             std::to_string(sizeof(sockaddr_un{}.sun_path) - 1) + " bytes");
  }
  return p;
}

Result<PeerCredentials> peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return sys_error("SO_PEERCRED", errno);
  PeerCredentials p;
  p.pid = cred.pid;
  p.uid = cred.uid;
  p.gid = cred.gid;
#ifdef SO_PEERGROUPS
  // Supplementary groups (Linux >= 4.13). Best effort: without them only the primary gid counts.
  std::vector<gid_t> groups(64);
  socklen_t glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0 && errno == ERANGE) {
    groups.resize(glen / sizeof(gid_t) + 1);
    glen = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &glen) != 0) glen = 0;
  }
  groups.resize(std::min<std::size_t>(groups.size(), glen / sizeof(gid_t)));
  p.groups = std::move(groups);
#endif
  return p;
}

Status send_with_fds(int fd, std::span<const std::uint8_t> bytes, std::span<const int> fds,
                     std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  std::size_t sent = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
  if (fds.size() > 8) return make_error(ErrorCode::Internal, "send_with_fds: at most 8 descriptors");
  while (sent < bytes.size()) {
    iovec iov{const_cast<std::uint8_t*>(bytes.data() + sent), bytes.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (sent == 0 && !fds.empty()) {
      std::memset(control, 0, sizeof control);
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);  // descriptors went with the first byte
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return make_error(ErrorCode::Execution, "sendmsg: peer is not reading (timed out)");
      pollfd p{fd, POLLOUT, 0};
      (void)::poll(&p, 1, static_cast<int>(left.count()));
      continue;
    }
    return sys_error("sendmsg", n < 0 ? errno : EPIPE);
  }
  return Status::Ok();
}

Status recv_exact_with_fds(int fd, std::span<std::uint8_t> out, std::vector<UniqueFd>& fds) {
  std::size_t got = 0;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
  while (got < out.size()) {
    iovec iov{out.data() + got, out.size() - got};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return make_error(ErrorCode::Execution, "timed out");
      return sys_error("recvmsg", errno);
    }
    // Take ownership of every descriptor first, so none leaks whatever happens next.
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (std::size_t i = 0; i < count; ++i) {
        int d;
        std::memcpy(&d, CMSG_DATA(c) + i * sizeof(int), sizeof d);
        fds.emplace_back(d);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC)
      return make_error(ErrorCode::Decode, "too many descriptors (control data truncated)");
    if (n == 0) {
      return make_error(ErrorCode::Execution, "connection closed after " + std::to_string(got) + " of " +
                                                  std::to_string(out.size()) + " bytes");
    }
    got += static_cast<std::size_t>(n);
  }
  return Status::Ok();
}

}  // namespace kiln::ipc

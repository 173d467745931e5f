#include "kiln/ipc/fd.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace kiln::ipc {

Result<UniqueFd> make_doorbell() {
  const int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return sys_error("eventfd", errno);
  return UniqueFd(fd);
}

Status ring_doorbell(int fd) {
  const std::uint64_t one = 1;
  for (;;) {
    const ssize_t n = ::write(fd, &one, sizeof one);
    if (n == static_cast<ssize_t>(sizeof one)) return Status::Ok();
    if (n < 0 && errno == EINTR) continue;
    // EAGAIN: the counter is saturated, so the sleeper will wake anyway.
    if (n < 0 && errno == EAGAIN) return Status::Ok();
    return sys_error("eventfd write (doorbell " + std::to_string(fd) + ")", n < 0 ? errno : EIO);
  }
}

Result<bool> drain_doorbell(int fd) {
  std::uint64_t value = 0;
  for (;;) {
    const ssize_t n = ::read(fd, &value, sizeof value);
    if (n == static_cast<ssize_t>(sizeof value)) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return false;
    return sys_error("eventfd read (doorbell " + std::to_string(fd) + ")", n < 0 ? errno : EIO);
  }
}

Result<bool> wait_readable(int fd, std::chrono::milliseconds timeout, int hangup_fd) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    pollfd fds[2] = {{fd, POLLIN, 0}, {hangup_fd, POLLIN, 0}};
    const nfds_t n = hangup_fd >= 0 ? 2 : 1;
    // Rounded up: a truncated timeout would poll with 0 in the deadline's last millisecond and
    // return at once, and a caller that sleeps again until its own deadline would spin.
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    const int ms = left.count() <= 0 ? 0 : static_cast<int>(std::min<std::int64_t>(left.count(), 1 << 30));
    const int r = ::poll(fds, n, ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return sys_error("poll on fd " + std::to_string(fd), errno);
    }
    if (fds[0].revents & (POLLERR | POLLNVAL)) {
      return make_error(ErrorCode::Execution, "poll on fd " + std::to_string(fd) + ": error condition");
    }
    // A rung doorbell first: what the peer published before it went away is still delivered.
    if (fds[0].revents & POLLIN) return true;
    if (n == 2 && fds[1].revents != 0) {
      // Any readable byte or hangup on the control socket after the handshake means the peer is
      // gone or misbehaving: the protocol sends nothing on it.
      return make_error(ErrorCode::Execution, "peer closed the connection");
    }
    if (r == 0 && (ms == 0 || Clock::now() >= deadline)) return false;
  }
}

}  // namespace kiln::ipc

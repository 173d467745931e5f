#include "kiln/base/posix.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace kiln {

int close_fd(int fd) { return ::close(fd); }

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);  // close() errors are not actionable here (the fd is gone either way)
  fd_ = fd;
}

Result<UniqueFd> UniqueFd::dup() const {
  const int d = ::fcntl(fd_, F_DUPFD_CLOEXEC, 0);
  if (d < 0) return sys_error("dup of fd " + std::to_string(fd_), errno);
  return UniqueFd(d);
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

Error sys_error(const std::string& what, int err, ErrorCode code) {
  return make_error(code, what + ": " + std::strerror(err));
}

Status write_all(int fd, std::span<const std::uint8_t> bytes, const std::string& what, ErrorCode code) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t k = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (k < 0) {
      if (errno == EINTR) continue;
      return sys_error(what, errno, code);
    }
    if (k == 0) return sys_error(what, EIO, code);
    done += static_cast<std::size_t>(k);
  }
  return Status::Ok();
}

}  // namespace kiln

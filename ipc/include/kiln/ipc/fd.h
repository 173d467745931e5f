// File descriptors as RAII values, and the eventfd "doorbell" each side of a connection sleeps on.
//
// Thread-safety: UniqueFd is a value type (like unique_ptr): one owner, moved not shared. The
// doorbell functions are safe from any thread (eventfd is a kernel counter).
//
// Errors from system calls are values: ErrorCode::Execution with the call, the object and
// strerror, e.g. "eventfd write (doorbell 7): Bad file descriptor".
#pragma once

#include <chrono>
#include <span>
#include <string>
#include <utility>

#include "kiln/base/result.h"

namespace kiln::ipc {

// Owns one file descriptor; closes it on destruction. Copying is deleted.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  explicit operator bool() const { return valid(); }
  // Gives up ownership (the caller closes it).
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

  // A CLOEXEC duplicate (e.g. to hand one to Asio while keeping this one).
  Result<UniqueFd> dup() const;

 private:
  int fd_ = -1;
};

// An error value for a failed system call: "<what>: <strerror(err)>".
Error sys_error(const std::string& what, int err);

// A doorbell: a non-blocking, close-on-exec eventfd. ring() adds 1 (never blocks: a saturated
// counter is already "rung"); drain() resets it to 0 and says whether it was rung.
Result<UniqueFd> make_doorbell();
Status ring_doorbell(int fd);
Result<bool> drain_doorbell(int fd);

// Blocks until `fd` is readable or `timeout` passes (poll, EINTR retried with the remaining
// time). Returns true when readable, false on timeout. `hangup_fd` (optional, -1 = none) is a
// socket watched at the same time: if the peer closed it (POLLHUP/POLLIN at EOF, POLLERR), the
// wait fails with "peer closed the connection", so a sleeper notices a dead daemon.
Result<bool> wait_readable(int fd, std::chrono::milliseconds timeout, int hangup_fd = -1);

}  // namespace kiln::ipc

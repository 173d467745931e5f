// POSIX resources as values: an owned file descriptor, and system-call errors as Error values.
//
// Thread-safety: UniqueFd is a value type (like unique_ptr): one owner, moved, not shared.
// Errors from system calls are ErrorCode::Execution unless the caller says otherwise, worded
// "<what>: <strerror>", e.g. "eventfd write (doorbell 7): Bad file descriptor".
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "kiln/base/result.h"

namespace kiln {

// ::close, under a name UniqueFd::close can call.
int close_fd(int fd);

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
  // Closes the one held (errors ignored: the fd is gone either way) and holds `fd`.
  void reset(int fd = -1);
  // Closes now and returns close()'s result, for files whose close may report a deferred
  // write error.
  int close() { return fd_ >= 0 ? close_fd(release()) : 0; }

  // A CLOEXEC duplicate (e.g. to hand one to Asio while keeping this one).
  Result<UniqueFd> dup() const;

 private:
  int fd_ = -1;
};

// strerror(err) as a std::string.
std::string errno_text(int err);
// "<what>: <strerror(err)>" as an Error of `code`.
Error sys_error(const std::string& what, int err, ErrorCode code = ErrorCode::Execution);

// Writes all of `bytes` to `fd` (EINTR retried); sys_error(what, errno, code) otherwise.
Status write_all(int fd, std::span<const std::uint8_t> bytes, const std::string& what,
                 ErrorCode code = ErrorCode::Execution);

}  // namespace kiln

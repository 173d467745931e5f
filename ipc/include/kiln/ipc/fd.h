// The eventfd "doorbell" each side of a connection sleeps on, and waiting for a readable fd.
// (UniqueFd and sys_error live in kiln/base/posix.h.)
//
// Thread-safety: the doorbell functions are safe from any thread (eventfd is a kernel counter).
//
// Errors from system calls are values: ErrorCode::Execution with the call, the object and
// strerror, e.g. "eventfd write (doorbell 7): Bad file descriptor".
#pragma once

#include <chrono>
#include <span>
#include <string>
#include <utility>

#include "kiln/base/posix.h"

namespace kiln::ipc {

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

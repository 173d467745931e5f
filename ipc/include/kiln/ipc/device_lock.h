// DeviceLock: one daemon per device. kilnd holds an exclusive flock(2) on a lock file named after
// its device ("kilnd-cpu.lock", "kilnd-cuda-0.lock") for as long as it runs; a second daemon for
// the same device finds the lock held and refuses to start, naming the running one's pid. The
// kernel drops the lock when the holder exits, however it exits (SIGKILL included): no stale
// lock to clean up.
//
// Where the lock lives decides who can hold it in the daemon's place (docs/daemon.md, "Security
// model"): root's daemons lock in /run/kiln (root-owned, 0700: no other user can create or hold
// the file); another user's daemon locks in its own lock directory (default_runtime_dir() +
// "-locks": $XDG_RUNTIME_DIR/kiln-locks or /tmp/kiln-<uid>-locks, 0700 and owned by that user,
// refused otherwise). So two users may
// each run their own CPU daemon; one GPU is served by one daemon when the service runs as root
// (the systemd unit) or every daemon of it uses one --lock-dir.
//
// Thread-safety: a value type; acquire from any thread.
#pragma once

#include <string>

#include "kiln/base/result.h"
#include "kiln/ipc/fd.h"

namespace kiln::ipc {

// /run/kiln for root (when /run exists), else the user's own lock directory (above).
std::string default_lock_dir();

class DeviceLock {
 public:
  // Takes the lock of `device` ("cpu", "cuda:0") in `dir` (empty: default_lock_dir(), created
  // 0700 if missing; an existing one must be a directory owned by us with mode 0700). Errors:
  // "another kilnd (pid 1234) already serves device cpu (lock /run/kiln/kilnd-cpu.lock)", or
  // the system call that failed.
  static Result<DeviceLock> acquire(const std::string& device, std::string dir = {});

  const std::string& path() const { return path_; }

 private:
  DeviceLock(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  UniqueFd fd_;  // the locked open file description; closing it releases the lock
  std::string path_;
};

// The lock file's name for a device: "kilnd-cpu.lock", "kilnd-cuda-0.lock".
std::string device_lock_name(const std::string& device);

}  // namespace kiln::ipc

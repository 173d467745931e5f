#include "kiln/ipc/device_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "kiln/ipc/unix_socket.h"

namespace kiln::ipc {

std::string default_lock_dir() {
  struct stat st {};
  if (::geteuid() == 0 && ::stat("/run", &st) == 0 && S_ISDIR(st.st_mode)) return "/run/kiln";
  return default_runtime_dir() + "-locks";
}

std::string device_lock_name(const std::string& device) { return daemon_file_stem(device) + ".lock"; }

namespace {

// The pid the holder wrote into the lock file, or "?" when it cannot be read (a holder that has
// not written it yet).
std::string holder_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return "?";
  std::string pid(buf, static_cast<std::size_t>(n));
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid.empty() ? "?" : pid;
}

}  // namespace

Result<DeviceLock> DeviceLock::acquire(const std::string& device, std::string dir) {
  if (dir.empty()) dir = default_lock_dir();
  KILN_RETURN_IF_ERROR(ensure_runtime_dir(dir));  // ours, 0700, not a symlink
  const std::string path = dir + "/" + device_lock_name(device);
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd) return sys_error("opening the device lock " + path, errno);
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      return make_error(ErrorCode::Config, "another kilnd (pid " + holder_pid(fd.get()) + ") already serves device " +
                                               device + " (lock " + path + ")");
    return sys_error("locking " + path, errno);
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0 ||
      ::pwrite(fd.get(), pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size()))
    return sys_error("writing the pid into " + path, errno);
  return DeviceLock(std::move(fd), path);
}

}  // namespace kiln::ipc

// kiln's on-disk caches (plans, CPU JIT libraries, CUDA kernels) share one trust model: a cache
// directory is ours alone (owned by this process's uid, not writable by group or others), since
// another user could otherwise plant content the daemon would run; and a cache file is replaced
// atomically (a private temporary name in the same directory, then rename), so readers see a
// whole file or the previous one, and concurrent writers never share a temporary file.
//
// Errors name the cache: `what` is "plan cache", "kernel cache", ...; e.g.
// "plan cache /x: writable by group or others (mode 775); expected 0700".
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

#include "kiln/base/result.h"

namespace kiln {

// A file removed when the object goes, unless keep() was called (e.g. after the rename that
// committed it).
class TempFile {
 public:
  TempFile() = default;
  explicit TempFile(std::string path) : path_(std::move(path)) {}
  ~TempFile();
  TempFile(TempFile&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  TempFile& operator=(TempFile&&) = delete;
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  const std::string& path() const { return path_; }
  void keep() { path_.clear(); }

 private:
  std::string path_;
};

// Checks that `dir`, whose stat is `st`, is a directory owned by this process's uid and not
// writable by group or others. Errors are ErrorCode::Config.
Status check_private_dir(const std::filesystem::path& dir, const struct stat& st, std::string_view what);

// Creates `dir` (mode 0700; its parents with the usual permissions, since they may be shared,
// like ~/.cache) when missing, then check_private_dir. Symbolic links are followed.
Status ensure_private_dir(const std::filesystem::path& dir, std::string_view what);

// Replaces `dir/name` with `bytes` atomically and durably: a mkstemp file (mode 0600) in `dir`,
// written, fsynced, renamed over `name`, then the directory synced. `dir` must exist (see
// ensure_private_dir). Errors are of `code`.
Status write_file_atomically(const std::filesystem::path& dir, std::string_view name,
                             std::span<const std::uint8_t> bytes, std::string_view what,
                             ErrorCode code = ErrorCode::Config);

}  // namespace kiln

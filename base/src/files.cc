#include "kiln/base/files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "kiln/base/posix.h"

namespace kiln {

TempFile::~TempFile() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

Status check_private_dir(const std::filesystem::path& dir, const struct stat& st, std::string_view what) {
  if (!S_ISDIR(st.st_mode))
    return make_error(ErrorCode::Config, fmt::format("{} {}: not a directory", what, dir.string()));
  if (st.st_uid != ::geteuid())
    return make_error(ErrorCode::Config, fmt::format("{} {}: owned by uid {}, not by this process's uid {}", what,
                                                     dir.string(), st.st_uid, ::geteuid()));
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return make_error(ErrorCode::Config, fmt::format("{} {}: writable by group or others (mode {:o}); expected 0700",
                                                     what, dir.string(), st.st_mode & 07777));
  return Status::Ok();
}

Status ensure_private_dir(const std::filesystem::path& dir, std::string_view what) {
  auto config_error = [&](std::string_view problem, std::string_view detail) -> Error {
    return make_error(ErrorCode::Config, fmt::format("{} {}: {}: {}", what, dir.string(), problem, detail));
  };
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return config_error("cannot stat", errno_text(errno));
    if (dir.has_parent_path()) {
      std::error_code ec;
      std::filesystem::create_directories(dir.parent_path(), ec);
      if (ec) return config_error("cannot create parent", ec.message());
    }
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) return config_error("cannot create", errno_text(errno));
    if (::stat(dir.c_str(), &st) != 0) return config_error("cannot stat", errno_text(errno));
  }
  return check_private_dir(dir, st, what);
}

Status write_file_atomically(const std::filesystem::path& dir, std::string_view name,
                             std::span<const std::uint8_t> bytes, std::string_view what, ErrorCode code) {
  const std::filesystem::path file = dir / name;
  std::string templ = (dir / ("." + std::string(name) + ".XXXXXX")).string();
  UniqueFd fd(::mkstemp(templ.data()));
  if (!fd.valid())
    return sys_error(fmt::format("{} {}: cannot create a temporary file", what, dir.string()), errno, code);
  TempFile tmp(templ);
  KILN_RETURN_IF_ERROR(write_all(fd.get(), bytes, fmt::format("{} {}: write failed", what, tmp.path()), code));
  // fsync before rename: after a crash the name points at the whole new file or the old one.
  if (::fsync(fd.get()) != 0) return sys_error(fmt::format("{} {}: fsync failed", what, tmp.path()), errno, code);
  if (fd.close() != 0) return sys_error(fmt::format("{} {}: close failed", what, tmp.path()), errno, code);
  if (::rename(tmp.path().c_str(), file.c_str()) != 0)
    return sys_error(fmt::format("{} {}: rename failed", what, file.string()), errno, code);
  tmp.keep();
  // The rename itself is durable once the directory is synced; failing that is not worth an
  // error (the file is complete either way).
  if (UniqueFd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); dfd.valid()) (void)::fsync(dfd.get());
  return Status::Ok();
}

}  // namespace kiln

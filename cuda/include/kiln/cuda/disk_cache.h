// On-disk cache of compiled kernels: one file per (source, architecture, options) key, so a
// restarted daemon skips NVRTC (~50 ms to seconds per program). Each file starts with a header
// naming the kiln, NVRTC and driver versions it was built by and a checksum of its payload;
// an entry whose header does not match the running versions, or whose checksum fails, is
// ignored (a warning in the log), removed, and rebuilt by the caller.
//
// The directory belongs to the daemon's user: it is created 0700, and an existing directory
// owned by someone else, or writable by group or others, is refused (another user could plant
// code the daemon would load onto the GPU).
//
// Usage:
//   Result<DiskCache> cache = DiskCache::open(DiskCache::default_dir(), versions);
//   const std::uint64_t key = code_key(source, options);
//   if (auto hit = cache->load(key, options)) ... else { compile; (void)cache->store(key, code); }
//
// Thread-safety: load and store may be called concurrently from any thread and any process
// (writes go to a private temporary file, then rename(2) into place atomically).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/base/result.h"
#include "kiln/cuda/nvrtc.h"

namespace kiln::cuda {

struct CacheVersions {
  std::string kiln;  // kiln's version (KILN_VERSION_STRING)
  int nvrtc = 0;     // nvrtc_version()
  int driver = 0;    // cudaDriverGetVersion (0 without a driver: entries still work for tests)
};
// The running process's versions.
CacheVersions current_versions();

// The key of a compiled program: FNV-1a over the source text and every option that changes
// the code (architecture, CUBIN or PTX, line info). The source already spells the program's
// structure and dtypes, so structurally equal programs share an entry.
std::uint64_t code_key(std::string_view source, const CompileOptions& options);

struct DiskCacheStats {
  std::uint64_t hits = 0, misses = 0, rejected = 0, stores = 0;
};

class DiskCache {
 public:
  // Opens (creating it 0700 when absent) the cache directory. Errors (ErrorCode::Config): the
  // path exists and is not a directory, belongs to another user, is group / world writable,
  // or cannot be created.
  static Result<DiskCache> open(std::filesystem::path dir, CacheVersions versions);
  // $KILN_CUDA_CACHE_DIR, else $XDG_CACHE_HOME/kiln/cuda, else $HOME/.cache/kiln/cuda.
  static std::filesystem::path default_dir();

  // The entry for `key`, or nullopt: absent, or rejected (bad magic, versions, architecture,
  // size, checksum: logged, the file removed).
  std::optional<CompiledCode> load(std::uint64_t key, const CompileOptions& options) const;
  Status store(std::uint64_t key, const CompiledCode& code) const;

  const std::filesystem::path& dir() const { return dir_; }
  std::filesystem::path entry_path(std::uint64_t key, const CompileOptions& options) const;
  DiskCacheStats stats() const;

 private:
  struct Counters {
    std::atomic<std::uint64_t> hits{0}, misses{0}, rejected{0}, stores{0};
  };
  DiskCache(std::filesystem::path dir, CacheVersions versions)
      : dir_(std::move(dir)), versions_(std::move(versions)), counters_(std::make_unique<Counters>()) {}

  std::filesystem::path dir_;
  CacheVersions versions_;
  std::unique_ptr<Counters> counters_;  // movable cache, shared-nothing counters
};

}  // namespace kiln::cuda

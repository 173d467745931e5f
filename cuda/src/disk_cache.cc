// The on-disk kernel cache (disk_cache.h).
#include "kiln/cuda/disk_cache.h"

#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#ifndef KILN_VERSION_STRING
#define KILN_VERSION_STRING "unknown"
#endif

namespace kiln::cuda {
namespace {

// File layout (little-endian host order; the cache is never shared between machines):
//   magic "KILNCUDA" | u32 format | u32 kiln version length | kiln version bytes | u32 nvrtc
//   | u32 driver | u32 arch | u32 cubin | u64 key | u64 payload size | u64 payload FNV-1a | payload
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'U', 'D', 'A'};
// Bumped whenever the layout above or the generator's kernel ABI changes incompatibly.
constexpr std::uint32_t kFormat = 1;
// Larger payloads are refused on load: a corrupt size field must not make us allocate the moon.
constexpr std::uint64_t kMaxPayload = std::uint64_t{256} << 20;

std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = 1469598103934665603ULL) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

template <class T>
void put(std::string& out, T v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

class Reader {
 public:
  explicit Reader(const std::vector<char>& b) : b_(b) {}
  template <class T>
  bool get(T& v) {
    if (b_.size() - at_ < sizeof(T)) return false;
    std::memcpy(&v, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool bytes(std::size_t n, const char** p) {
    if (b_.size() - at_ < n) return false;
    *p = b_.data() + at_;
    at_ += n;
    return true;
  }
  std::size_t remaining() const { return b_.size() - at_; }

 private:
  const std::vector<char>& b_;
  std::size_t at_ = 0;
};

}  // namespace

CacheVersions current_versions() {
  CacheVersions v;
  v.kiln = KILN_VERSION_STRING;
  v.nvrtc = nvrtc_version();
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
  return v;
}

std::uint64_t code_key(std::string_view source, const CompileOptions& options) {
  const std::string opts = fmt::format("arch={};cubin={};lineinfo={};format={}", options.arch, options.cubin,
                                       options.line_info, kFormat);
  return fnv1a(opts.data(), opts.size(), fnv1a(source.data(), source.size()));
}

std::filesystem::path DiskCache::default_dir() {
  if (const char* d = std::getenv("KILN_CUDA_CACHE_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0')
    return std::filesystem::path(x) / "kiln" / "cuda";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    return std::filesystem::path(h) / ".cache" / "kiln" / "cuda";
  return std::filesystem::temp_directory_path() / fmt::format("kiln-cuda-{}", ::geteuid());
}

Result<DiskCache> DiskCache::open(std::filesystem::path dir, CacheVersions versions) {
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) {
    // Parents as the user's umask allows; the cache directory itself private.
    std::filesystem::create_directories(dir.parent_path(), ec);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      return make_error(ErrorCode::Config,
                        fmt::format("kernel cache {}: cannot create it: {}", dir.string(), std::strerror(errno)));
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0)
    return make_error(ErrorCode::Config, fmt::format("kernel cache {}: {}", dir.string(), std::strerror(errno)));
  if (!S_ISDIR(st.st_mode)) return make_error(ErrorCode::Config, fmt::format("kernel cache {}: not a directory", dir.string()));
  if (st.st_uid != ::geteuid())
    return make_error(ErrorCode::Config, fmt::format("kernel cache {}: owned by uid {}, not by this user (uid {})",
                                                     dir.string(), st.st_uid, ::geteuid()));
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return make_error(ErrorCode::Config,
                      fmt::format("kernel cache {}: writable by group or others (mode {:o}); expected 0700", dir.string(),
                                  st.st_mode & 0777));
  return DiskCache(std::move(dir), std::move(versions));
}

std::filesystem::path DiskCache::entry_path(std::uint64_t key, const CompileOptions& options) const {
  return dir_ / fmt::format("{:016x}-sm{}.{}", key, options.arch, options.cubin ? "cubin" : "ptx");
}

DiskCacheStats DiskCache::stats() const {
  return DiskCacheStats{counters_->hits.load(std::memory_order_relaxed), counters_->misses.load(std::memory_order_relaxed),
                        counters_->rejected.load(std::memory_order_relaxed),
                        counters_->stores.load(std::memory_order_relaxed)};
}

std::optional<CompiledCode> DiskCache::load(std::uint64_t key, const CompileOptions& options) const {
  const std::filesystem::path path = entry_path(key, options);
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    counters_->misses.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  const std::vector<char> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  f.close();
  auto reject = [&](std::string_view why) -> std::optional<CompiledCode> {
    spdlog::warn("kiln cuda: ignoring kernel cache entry {}: {}; it will be rebuilt", path.string(), why);
    std::error_code ec;
    std::filesystem::remove(path, ec);
    counters_->rejected.fetch_add(1, std::memory_order_relaxed);
    counters_->misses.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  };
  Reader r(buf);
  const char* magic = nullptr;
  if (!r.bytes(sizeof(kMagic), &magic) || std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) return reject("bad magic");
  std::uint32_t format = 0, kiln_len = 0, nvrtc = 0, driver = 0, arch = 0, cubin = 0;
  if (!r.get(format) || format != kFormat) return reject("format version");
  if (!r.get(kiln_len) || kiln_len > 256) return reject("truncated header");
  const char* kiln = nullptr;
  if (!r.bytes(kiln_len, &kiln)) return reject("truncated header");
  if (std::string_view(kiln, kiln_len) != versions_.kiln)
    return reject(fmt::format("built by kiln {}, this is kiln {}", std::string_view(kiln, kiln_len), versions_.kiln));
  std::uint64_t stored_key = 0, size = 0, sum = 0;
  if (!r.get(nvrtc) || !r.get(driver) || !r.get(arch) || !r.get(cubin) || !r.get(stored_key) || !r.get(size) ||
      !r.get(sum))
    return reject("truncated header");
  if (static_cast<int>(nvrtc) != versions_.nvrtc)
    return reject(fmt::format("built by NVRTC {}, this is NVRTC {}", nvrtc, versions_.nvrtc));
  if (static_cast<int>(driver) != versions_.driver)
    return reject(fmt::format("built under driver {}, this is driver {}", driver, versions_.driver));
  if (static_cast<int>(arch) != options.arch || (cubin != 0) != options.cubin || stored_key != key)
    return reject("key, architecture or code kind mismatch");
  if (size > kMaxPayload || size != r.remaining()) return reject("payload size");
  const char* payload = nullptr;
  if (!r.bytes(static_cast<std::size_t>(size), &payload)) return reject("payload size");
  if (fnv1a(payload, static_cast<std::size_t>(size)) != sum) return reject("checksum mismatch");
  CompiledCode code;
  code.bytes.assign(reinterpret_cast<const std::byte*>(payload), reinterpret_cast<const std::byte*>(payload) + size);
  code.is_cubin = cubin != 0;
  code.arch = static_cast<int>(arch);
  counters_->hits.fetch_add(1, std::memory_order_relaxed);
  return code;
}

Status DiskCache::store(std::uint64_t key, const CompiledCode& code) const {
  CompileOptions o;
  o.arch = code.arch;
  o.cubin = code.is_cubin;
  const std::filesystem::path path = entry_path(key, o);
  std::string out;
  out.append(kMagic, sizeof(kMagic));
  put(out, kFormat);
  put(out, static_cast<std::uint32_t>(versions_.kiln.size()));
  out += versions_.kiln;
  put(out, static_cast<std::uint32_t>(versions_.nvrtc));
  put(out, static_cast<std::uint32_t>(versions_.driver));
  put(out, static_cast<std::uint32_t>(code.arch));
  put(out, static_cast<std::uint32_t>(code.is_cubin ? 1 : 0));
  put(out, key);
  put(out, static_cast<std::uint64_t>(code.bytes.size()));
  put(out, fnv1a(code.bytes.data(), code.bytes.size()));
  if (!code.bytes.empty()) out.append(reinterpret_cast<const char*>(code.bytes.data()), code.bytes.size());
  // A private temporary name (pid + counter), then an atomic rename: readers see a whole entry
  // or none, and two writers of one key both succeed.
  const std::filesystem::path tmp =
      path.string() + fmt::format(".tmp.{}.{}", ::getpid(), counters_->temp.fetch_add(1, std::memory_order_relaxed));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(ErrorCode::Execution, fmt::format("kernel cache: creating {}: {}", tmp.string(), std::strerror(errno)));
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t w = ::write(fd, out.data() + done, out.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return make_error(ErrorCode::Execution, fmt::format("kernel cache: writing {}: {}", tmp.string(), std::strerror(err)));
    }
    done += static_cast<std::size_t>(w);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return make_error(ErrorCode::Execution, fmt::format("kernel cache: renaming to {}: {}", path.string(), std::strerror(err)));
  }
  counters_->stores.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace kiln::cuda

// The on-disk kernel cache (disk_cache.h).
#include "kiln/cuda/disk_cache.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "kiln/base/bytes.h"
#include "kiln/base/files.h"
#include "kiln/base/hash.h"

#ifndef KILN_VERSION_STRING
#define KILN_VERSION_STRING "unknown"
#endif

namespace kiln::cuda {
namespace {

// File layout (little-endian; the cache is never shared between machines):
//   magic "KILNCUDA" | u32 format | u32 kiln version length | kiln version bytes | u32 nvrtc
//   | u32 driver | u32 arch | u32 cubin | u64 key | u64 payload size | u64 payload FNV-1a | payload
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'U', 'D', 'A'};
// Bumped whenever the layout above, the key or the generator's kernel ABI changes
// incompatibly. 2: keys and checksums by base's fnv1a64 (format 1 used a mistyped offset basis).
constexpr std::uint32_t kFormat = 2;
// Larger payloads are refused on load: a corrupt size field must not make us allocate the moon.
constexpr std::uint64_t kMaxPayload = std::uint64_t{256} << 20;

}  // namespace

CacheVersions current_versions() {
  CacheVersions v;
  v.kiln = KILN_VERSION_STRING;
  v.nvrtc = nvrtc_version();
  if (cudaDriverGetVersion(&v.driver) != cudaSuccess) v.driver = 0;
  return v;
}

std::uint64_t code_key(std::string_view source, const CompileOptions& options) {
  const std::string opts =
      fmt::format("arch={};cubin={};lineinfo={};format={}", options.arch, options.cubin, options.line_info, kFormat);
  return fnv1a64(opts, fnv1a64(source));
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
  KILN_RETURN_IF_ERROR(ensure_private_dir(dir, "kernel cache"));
  return DiskCache(std::move(dir), std::move(versions));
}

std::filesystem::path DiskCache::entry_path(std::uint64_t key, const CompileOptions& options) const {
  return dir_ / fmt::format("{:016x}-sm{}.{}", key, options.arch, options.cubin ? "cubin" : "ptx");
}

DiskCacheStats DiskCache::stats() const {
  return DiskCacheStats{
      counters_->hits.load(std::memory_order_relaxed), counters_->misses.load(std::memory_order_relaxed),
      counters_->rejected.load(std::memory_order_relaxed), counters_->stores.load(std::memory_order_relaxed)};
}

std::optional<CompiledCode> DiskCache::load(std::uint64_t key, const CompileOptions& options) const {
  const std::filesystem::path path = entry_path(key, options);
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    counters_->misses.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  const std::vector<std::uint8_t> buf((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  f.close();
  auto reject = [&](std::string_view why) -> std::optional<CompiledCode> {
    spdlog::warn("kiln cuda: ignoring kernel cache entry {}: {}; it will be rebuilt", path.string(), why);
    std::error_code ec;
    std::filesystem::remove(path, ec);
    counters_->rejected.fetch_add(1, std::memory_order_relaxed);
    counters_->misses.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  };
  ByteReader r(buf);
  std::span<const std::uint8_t> magic;
  if (!r.take(sizeof(kMagic), magic, "magic") || std::memcmp(magic.data(), kMagic, sizeof(kMagic)) != 0)
    return reject("bad magic");
  std::uint32_t format = 0, kiln_len = 0, nvrtc = 0, driver = 0, arch = 0, cubin = 0;
  if (!r.fixed(format, "format") || format != kFormat) return reject("format version");
  if (!r.fixed(kiln_len, "kiln version length") || kiln_len > 256) return reject("truncated header");
  std::span<const std::uint8_t> kiln_bytes;
  if (!r.take(kiln_len, kiln_bytes, "kiln version")) return reject("truncated header");
  const std::string_view kiln(reinterpret_cast<const char*>(kiln_bytes.data()), kiln_bytes.size());
  if (kiln != versions_.kiln) return reject(fmt::format("built by kiln {}, this is kiln {}", kiln, versions_.kiln));
  std::uint64_t stored_key = 0, size = 0, sum = 0;
  if (!r.fixed(nvrtc, "nvrtc") || !r.fixed(driver, "driver") || !r.fixed(arch, "arch") || !r.fixed(cubin, "cubin") ||
      !r.fixed(stored_key, "key") || !r.fixed(size, "size") || !r.fixed(sum, "checksum"))
    return reject("truncated header");
  if (static_cast<int>(nvrtc) != versions_.nvrtc)
    return reject(fmt::format("built by NVRTC {}, this is NVRTC {}", nvrtc, versions_.nvrtc));
  if (static_cast<int>(driver) != versions_.driver)
    return reject(fmt::format("built under driver {}, this is driver {}", driver, versions_.driver));
  if (static_cast<int>(arch) != options.arch || (cubin != 0) != options.cubin || stored_key != key)
    return reject("key, architecture or code kind mismatch");
  if (size > kMaxPayload || size != r.remaining()) return reject("payload size");
  std::span<const std::uint8_t> payload;
  if (!r.take(static_cast<std::size_t>(size), payload, "payload")) return reject("payload size");
  if (fnv1a64(payload) != sum) return reject("checksum mismatch");
  CompiledCode code;
  code.bytes.assign(reinterpret_cast<const std::byte*>(payload.data()),
                    reinterpret_cast<const std::byte*>(payload.data()) + payload.size());
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
  const std::span<const std::uint8_t> payload(reinterpret_cast<const std::uint8_t*>(code.bytes.data()),
                                              code.bytes.size());
  std::vector<std::uint8_t> out;
  ByteWriter w(out);
  w.bytes(std::string_view(kMagic, sizeof(kMagic)));
  w.u32(kFormat);
  w.u32(static_cast<std::uint32_t>(versions_.kiln.size()));
  w.bytes(versions_.kiln);
  w.u32(static_cast<std::uint32_t>(versions_.nvrtc));
  w.u32(static_cast<std::uint32_t>(versions_.driver));
  w.u32(static_cast<std::uint32_t>(code.arch));
  w.u32(code.is_cubin ? 1u : 0u);
  w.u64(key);
  w.u64(payload.size());
  w.u64(fnv1a64(payload));
  w.bytes(payload);
  // Atomic replacement: readers see a whole entry or none, and two writers of one key both succeed.
  KILN_RETURN_IF_ERROR(
      write_file_atomically(dir_, path.filename().string(), out, "kernel cache", ErrorCode::Execution));
  counters_->stores.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

}  // namespace kiln::cuda

#include "kiln/cpu/device.h"

#include <spdlog/spdlog.h>
#include <tbb/info.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "fast_program.h"
#include "jit.h"
#include "kiln/runtime/usable_cores.h"

namespace kiln::cpu {

namespace {

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  // TBB's default follows the affinity mask but not a cgroup CPU quota (oneTBB issue 190);
  // usable_cores() sees both.
  const int n = std::min(tbb::info::default_concurrency(), static_cast<int>(runtime::usable_cores()));
  return n > 0 ? n : 1;
}

template <class T>
ir::HandleLookup<T> lookup_error(const CpuDevice::Handles& handles, ir::TensorId id) {
  const auto* entry = handles.entry(id);
  if (entry != nullptr && entry->is_errored()) return ir::HandleLookup<T>::errored(*entry->error());
  return ir::HandleLookup<T>::invalid(
      make_error(ErrorCode::InvalidHandle, "CpuDevice: " + id.to_string() + " has no data (absent or not written)"));
}

jit::Options jit_options(const CpuDeviceOptions& o) {
  jit::Options j;
  j.mode = o.jit == CpuJitMode::On ? jit::Mode::On : o.jit == CpuJitMode::Auto ? jit::Mode::Auto : jit::Mode::Off;
  // The operator's override, e.g. KILN_CPU_JIT=0 to rule the JIT out when diagnosing, or
  // KILN_CPU_JIT=1 to run a test suite through it.
  if (const char* env = std::getenv("KILN_CPU_JIT"); env != nullptr && (env[0] == '0' || env[0] == '1'))
    j.mode = env[0] == '1' ? jit::Mode::On : jit::Mode::Off;
  j.cache_dir = o.jit_cache_dir;
  j.compiler = o.jit_compiler;
  return j;
}

}  // namespace

CpuDevice::CpuDevice(const CpuDeviceOptions& options)
    : allocator_(options.allocator),
      reference_(allocator_, options.seed),
      threads_(resolve_threads(options.threads)),
      arena_(threads_),
      max_kernels_(options.max_kernels),
      jit_(std::make_unique<jit::JitCache>(jit_options(options))) {}

bool CpuDevice::jit_enabled() const { return jit_->enabled(); }

const jit::Kernel* CpuDevice::jit_kernel(const fusion::FusedProgram& program, const fast::CompiledProgram& compiled,
                                         std::size_t min_instructions) {
  if (!jit_->enabled() || !compiled.supported || compiled.blocks.size() != 1 ||
      compiled.blocks[0].instrs.size() < min_instructions)
    return nullptr;
  fast::JitSlot& slot = *compiled.jit;
  std::call_once(slot.once, [&] { slot.kernel = jit_->kernel_for(program, compiled); });
  return slot.kernel.get();
}

CpuDevice::~CpuDevice() = default;

std::shared_ptr<const fast::CompiledProgram> CpuDevice::compiled(const fusion::FusedProgram& program) {
  const std::uint64_t hash = program.structural_hash();
  auto hit = [&](const CacheEntry& e) {
    counters_.kernel_cache_hits.fetch_add(1, std::memory_order_relaxed);
    const std::uint64_t now = cache_clock_.load(std::memory_order_relaxed);
    if (e.last_used->load(std::memory_order_relaxed) != now) e.last_used->store(now, std::memory_order_relaxed);
    return e.compiled;
  };
  {
    ReaderLock lock(cache_mutex_);
    auto it = cache_.find(hash);
    if (it != cache_.end()) {
      for (const CacheEntry& e : it->second)
        if (e.program == program) return hit(e);
    }
  }
  // Compile outside the lock; a concurrent compile of the same structure keeps the first entry.
  auto built = std::make_shared<const fast::CompiledProgram>(fast::compile_program(program));
  WriterLock lock(cache_mutex_);
  std::vector<CacheEntry>& bucket = cache_[hash];
  for (const CacheEntry& e : bucket)
    if (e.program == program) return hit(e);
  counters_.kernel_cache_misses.fetch_add(1, std::memory_order_relaxed);
  const std::uint64_t now = cache_clock_.fetch_add(1, std::memory_order_relaxed) + 1;
  bucket.push_back(CacheEntry{program, built, std::make_unique<std::atomic<std::uint64_t>>(now)});
  ++cache_entries_;
  if (max_kernels_ != 0 && cache_entries_ > max_kernels_) evict_coldest_kernels();
  return built;
}

void CpuDevice::evict_coldest_kernels() {
  // Down to the bound less an eighth, so that this walk runs once per max_kernels/8 builds.
  const std::size_t target = std::max<std::size_t>(max_kernels_ - std::max<std::size_t>(max_kernels_ / 8, 1), 1);
  std::vector<std::uint64_t> stamps;
  stamps.reserve(cache_entries_);
  for (const auto& [hash, bucket] : cache_)
    for (const CacheEntry& e : bucket) stamps.push_back(e.last_used->load(std::memory_order_relaxed));
  const std::size_t excess = cache_entries_ - target;
  std::nth_element(stamps.begin(), stamps.begin() + static_cast<std::ptrdiff_t>(excess - 1), stamps.end());
  const std::uint64_t cutoff = stamps[excess - 1];  // drop entries at or below it, `excess` at most
  std::size_t dropped = 0;
  for (auto it = cache_.begin(); it != cache_.end();) {
    std::erase_if(it->second, [&](const CacheEntry& e) {
      if (dropped == excess || e.last_used->load(std::memory_order_relaxed) > cutoff) return false;
      ++dropped;
      return true;
    });
    it = it->second.empty() ? cache_.erase(it) : std::next(it);
  }
  cache_entries_ -= dropped;
  counters_.kernel_cache_evictions.fetch_add(dropped, std::memory_order_relaxed);
}

std::size_t CpuDevice::kernel_cache_size() const {
  ReaderLock lock(cache_mutex_);
  return cache_entries_;
}

void CpuDevice::clear_kernel_cache() {
  WriterLock lock(cache_mutex_);
  cache_.clear();
  cache_entries_ = 0;
}

CpuDeviceStats CpuDevice::stats() const {
  auto get = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  CpuDeviceStats s{get(counters_.fused_launches), get(counters_.fused_replays),      get(counters_.fast_ops),
                   get(counters_.reference_ops),  get(counters_.kernel_cache_hits),  get(counters_.kernel_cache_misses),
                   get(counters_.inplace_reuses), get(counters_.zero_copy_reshapes), get(counters_.row_interleaved)};
  for (std::size_t k = 0; k < s.launches_by_kind.size(); ++k)
    s.launches_by_kind[k] = get(counters_.launches_by_kind[k]);
  s.jit_launches = get(counters_.jit_launches);
  s.nontemporal_outputs = get(counters_.nontemporal_outputs);
  s.part_by_part = get(counters_.part_by_part);
  s.kernel_cache_evictions = get(counters_.kernel_cache_evictions);
  s.row_window_temporaries = get(counters_.row_window_temporaries);
  s.row_jit_stages = get(counters_.row_jit_stages);
  for (std::size_t r = 0; r < s.fallbacks_by_reason.size(); ++r)
    s.fallbacks_by_reason[r] = get(counters_.fallbacks_by_reason[r]);
  const jit::Stats j = jit_->stats();
  s.jit_compiles = j.compiles;
  s.jit_disk_loads = j.disk_loads;
  s.jit_failures = j.failures;
  s.jit_declined = j.declined;
  s.jit_corrupt = j.corrupt;
  return s;
}

void CpuDevice::reset_stats() {
  for (std::atomic<std::uint64_t>* a :
       {&counters_.fused_launches, &counters_.fused_replays, &counters_.fast_ops, &counters_.reference_ops,
        &counters_.kernel_cache_hits, &counters_.kernel_cache_misses, &counters_.inplace_reuses,
        &counters_.zero_copy_reshapes, &counters_.row_interleaved, &counters_.jit_launches,
        &counters_.nontemporal_outputs, &counters_.part_by_part, &counters_.kernel_cache_evictions,
        &counters_.row_window_temporaries, &counters_.row_jit_stages})
    a->store(0, std::memory_order_relaxed);
  for (auto& a : counters_.launches_by_kind) a.store(0, std::memory_order_relaxed);
  for (auto& a : counters_.fallbacks_by_reason) a.store(0, std::memory_order_relaxed);
}

void CpuDevice::count_fallback(const runtime::Fallback& fallback, const fusion::FusedProgram& program) {
  counters_.fused_replays.fetch_add(1, std::memory_order_relaxed);
  counters_.fallbacks_by_reason[static_cast<std::size_t>(fallback.reason)].fetch_add(1, std::memory_order_relaxed);
  spdlog::debug("kiln cpu: {} program {:016x} ({} ops) replayed op by op: {}: {}",
                fusion::program_kind_name(program.kind), program.structural_hash(), program.len,
                runtime::fallback_reason_name(fallback.reason), fallback.detail);
}

Status CpuDevice::upload_f64(ir::TensorId id, ir::Shape shape, ir::DType dtype, std::span<const double> values) {
  Result<HostTensor> t = HostTensor::from_f64(allocator_, std::move(shape), dtype, values);
  if (!t.ok()) return t.error();
  upload(id, std::move(t).value());
  return Status::Ok();
}

Status CpuDevice::upload_i64(ir::TensorId id, ir::Shape shape, ir::DType dtype, std::span<const std::int64_t> values) {
  Result<HostTensor> t = HostTensor::from_i64(allocator_, std::move(shape), dtype, values);
  if (!t.ok()) return t.error();
  upload(id, std::move(t).value());
  return Status::Ok();
}

Status CpuDevice::upload_bool(ir::TensorId id, ir::Shape shape, ir::DType dtype, const std::vector<bool>& values) {
  Result<HostTensor> t = HostTensor::from_bool(allocator_, std::move(shape), dtype, values);
  if (!t.ok()) return t.error();
  upload(id, std::move(t).value());
  return Status::Ok();
}

ir::HandleLookup<HostTensor> CpuDevice::tensor(ir::TensorId id) const {
  if (const HostTensor* t = handles_.get_handle_ref(id)) return ir::HandleLookup<HostTensor>::found(*t);
  return lookup_error<HostTensor>(handles_, id);
}

ir::HandleLookup<std::vector<double>> CpuDevice::download_f64(ir::TensorId id) const {
  return tensor(id).map([](HostTensor&& t) { return t.to_f64(); });
}

ir::HandleLookup<std::vector<std::int64_t>> CpuDevice::download_i64(ir::TensorId id) const {
  return tensor(id).map([](HostTensor&& t) { return t.to_i64(); });
}

ir::HandleLookup<std::vector<bool>> CpuDevice::download_bool(ir::TensorId id) const {
  return tensor(id).map([](HostTensor&& t) { return t.to_bool(); });
}

}  // namespace kiln::cpu

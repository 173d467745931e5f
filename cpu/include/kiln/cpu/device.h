// CpuDevice: the state a CPU stream executor works against — the allocator, the tensor handle
// container, the reference executor (for what the fast executor does not accelerate), the cache
// of compiled fused programs, the worker threads, statistics, and host upload / download.
//
// Thread-safety:
//   * handles() is NOT synchronised: one CpuDevice's container is used by one stream actor at a
//     time (every executor of this device, upload and download included, must be called from
//     that actor). The runtime will put the device's streams behind its own synchronisation;
//     until then, one thread per device.
//   * The allocator is thread-safe (see memory.h); the kernel cache takes a shared lock to look
//     up and an exclusive one to insert, so executors of several streams may share a device's
//     cache; statistics are atomic counters.
//   * The task arena runs one launch's parallel loops; it is entered by the executor's thread.
//
// Usage:
//   kiln::cpu::CpuDevice device({.threads = 2});
//   (void)device.upload<float>(TensorId{1}, {2, 2}, std::vector<float>{1, 2, 3, 4});
//   kiln::cpu::CpuExecutor exec(device);               // cpu_executor.h
//   exec.execute_operation(op);                         // or through a fusion::FusionStream
//   auto values = device.download_f64(TensorId{2});     // HandleLookup: values, or the TensorError
//   if (values.is_errored()) log(values.tensor_error()->to_string());
//   device.stats().kernel_cache_hits;
#pragma once

#include <tbb/task_arena.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/base/mutex.h"
#include "kiln/cpu/host.h"
#include "kiln/fusion/fused_program.h"
#include "kiln/ir/handle_container.h"
#include "kiln/runtime/fallback.h"

namespace kiln::cpu {

namespace fast {
struct CompiledProgram;
}
namespace jit {
class JitCache;
struct Kernel;
}  // namespace jit

// Whether fused elementwise programs are JIT-compiled to native loops (docs/cpu-backend.md,
// "JIT"): Off = the interpreter only; On / Auto = compile with the system C++ compiler when one
// is found (On warns when none is, Auto logs at debug). Each new program structure costs one
// compiler run (~0.3-1 s, cached on disk), so the default stays Off for short-lived devices
// (tests); CpuBackend (the daemon, kiln-bench-runtime) defaults to Auto. The environment
// variable KILN_CPU_JIT=0 / 1 overrides the option (Off / On).
enum class CpuJitMode : std::uint8_t { Off, On, Auto };

struct CpuDeviceOptions {
  // Worker threads one launch may use (its task arena's concurrency); 0 = runtime::usable_cores().
  int threads = 0;
  HostAllocatorOptions allocator{};
  // Seed of the reference executor's random generator (Random / IntRandom ops).
  std::uint64_t seed = ReferenceExecutor::kDefaultSeed;
  CpuJitMode jit = CpuJitMode::Off;
  // Disk cache of compiled kernels; empty: $XDG_CACHE_HOME/kiln/cpu-jit or ~/.cache/kiln/cpu-jit
  // (created 0700; a directory not private to this user is not used).
  std::string jit_cache_dir;
  // The compiler to run; empty: `c++`, then `g++`, on PATH.
  std::string jit_compiler;
  // Compiled forms kept (one per program structure, with its JIT kernel); past it the coldest
  // eighth (least recently built or used) is dropped and built again when next needed.
  // 0 keeps every one. A client that sends ever new program shapes must not grow the daemon.
  std::size_t max_kernels = 8192;
};

// A snapshot of the device's counters.
struct CpuDeviceStats {
  std::uint64_t fused_launches = 0;          // fused programs (or ReduceBroadcasted stages) run fast
  std::uint64_t fused_replays = 0;           // fused programs replayed op by op (errored input, fault,
                                             // unsupported structure)
  std::uint64_t fast_ops = 0;                // single operations run by the fast kernels
  std::uint64_t reference_ops = 0;           // single operations run by the reference executor
  std::uint64_t kernel_cache_hits = 0;       // compiled forms found in the cache
  std::uint64_t kernel_cache_misses = 0;     // compiled forms built
  std::uint64_t inplace_reuses = 0;          // outputs written into a consumed input's buffer
  std::uint64_t zero_copy_reshapes = 0;      // reshapes that share their input's buffer
  std::uint64_t row_interleaved = 0;         // staged programs (ReduceBroadcasted, Row) run row group by row group
  std::uint64_t row_window_temporaries = 0;  // their values consumed inside the launch, kept in a row window
  std::uint64_t row_jit_stages = 0;          // their elementwise stages run by a JIT kernel, a call per row
  std::uint64_t kernel_cache_evictions = 0;  // compiled forms dropped by max_kernels
  std::uint64_t nontemporal_outputs = 0;     // fresh outputs of memory-bound launches streaming from
                                             // DRAM written with non-temporal stores (no read for
                                             // ownership), as the kernel that wrote them reports
  // fused_launches by fusion::ProgramKind (ReduceBroadcasted counts its stages as their kinds).
  std::array<std::uint64_t, fusion::kNumProgramKinds> launches_by_kind{};
  // JIT (CpuJitMode): launches run by a compiled kernel; compiler runs; kernels loaded from the
  // disk cache; failed compiles / loads; programs it declined; corrupt cache entries rebuilt.
  std::uint64_t jit_launches = 0;
  std::uint64_t jit_compiles = 0;
  std::uint64_t jit_disk_loads = 0;
  std::uint64_t jit_failures = 0;
  std::uint64_t jit_declined = 0;
  std::uint64_t jit_corrupt = 0;
  // fused_replays by reason (runtime::FallbackReason's value; they sum to fused_replays).
  runtime::FallbackCounts fallbacks_by_reason{};
  // Elementwise launches (JIT or interpreter) of a program with independent parts (fused Adam
  // over several parameters) that ran them one after another, a few streams at a time
  // (cpu-backend.md, "Independent parts").
  std::uint64_t part_by_part = 0;
};

class CpuDevice {
 public:
  using Handles = ir::HandleContainer<HostTensor>;

  explicit CpuDevice(const CpuDeviceOptions& options = {});
  ~CpuDevice();
  CpuDevice(const CpuDevice&) = delete;
  CpuDevice& operator=(const CpuDevice&) = delete;

  HostAllocator& allocator() { return allocator_; }
  const HostAllocator& allocator() const { return allocator_; }
  Handles& handles() { return handles_; }
  const Handles& handles() const { return handles_; }
  ReferenceExecutor& reference() { return reference_; }
  tbb::task_arena& arena() { return arena_; }
  int threads() const { return threads_; }

  // ---- Compiled kernels: one compiled form per program structure (FusedProgram::structural_hash,
  // then == on a hash match), reused for every size and scalar value; at most
  // CpuDeviceOptions::max_kernels of them (a launch holds its own, so dropping one is safe).
  std::shared_ptr<const fast::CompiledProgram> compiled(const fusion::FusedProgram& program);
  std::size_t kernel_cache_size() const;
  void clear_kernel_cache();
  // Programs below this many instructions stay on the interpreter by default: one instruction is
  // already a single tight kernel per chunk there (loads alias the inputs, the result goes
  // straight to the output), so a compiled loop gains little and every one-op structure would
  // cost a compile. (A staged launch's row stages ask for less: fast_executor.cc.)
  static constexpr std::size_t kJitMinInstructions = 2;
  // The JIT kernel of an Elementwise program's compiled form, built on first use; null when the
  // JIT is off, declines the program, has fewer than `min_instructions` instructions, or cannot
  // compile (the interpreter runs it).
  const jit::Kernel* jit_kernel(const fusion::FusedProgram& program, const fast::CompiledProgram& compiled,
                                std::size_t min_instructions = kJitMinInstructions);
  bool jit_enabled() const;

  // ---- Statistics
  CpuDeviceStats stats() const;
  void reset_stats();

  // ---- Host data. Uploads register a tensor under `id` (replacing any entry); downloads read
  // a tensor back, or return its TensorError when it is errored (InvalidHandle when absent).
  void upload(ir::TensorId id, HostTensor tensor) { handles_.register_handle(id, std::move(tensor)); }
  template <class T>
  Status upload(ir::TensorId id, ir::Shape shape, std::span<const T> values);
  // Values converted with the element codec (rounded once to `dtype`).
  Status upload_f64(ir::TensorId id, ir::Shape shape, ir::DType dtype, std::span<const double> values);
  Status upload_i64(ir::TensorId id, ir::Shape shape, ir::DType dtype, std::span<const std::int64_t> values);
  Status upload_bool(ir::TensorId id, ir::Shape shape, ir::DType dtype, const std::vector<bool>& values);

  ir::HandleLookup<HostTensor> tensor(ir::TensorId id) const;
  // Raw elements; T must be the dtype's storage type (HostTensor::to_values), else DTypeMismatch.
  template <class T>
  ir::HandleLookup<std::vector<T>> download(ir::TensorId id) const;
  // Every element through the codec (any dtype).
  ir::HandleLookup<std::vector<double>> download_f64(ir::TensorId id) const;
  ir::HandleLookup<std::vector<std::int64_t>> download_i64(ir::TensorId id) const;
  ir::HandleLookup<std::vector<bool>> download_bool(ir::TensorId id) const;

  // Counters the executors bump (relaxed atomics).
  struct Counters {
    std::atomic<std::uint64_t> fused_launches{0}, fused_replays{0}, fast_ops{0}, reference_ops{0}, kernel_cache_hits{0},
        kernel_cache_misses{0}, inplace_reuses{0}, zero_copy_reshapes{0}, row_interleaved{0}, jit_launches{0},
        nontemporal_outputs{0}, part_by_part{0}, kernel_cache_evictions{0}, row_window_temporaries{0},
        row_jit_stages{0};
    std::array<std::atomic<std::uint64_t>, fusion::kNumProgramKinds> launches_by_kind{};
    std::array<std::atomic<std::uint64_t>, runtime::kFallbackReasonCount> fallbacks_by_reason{};
  };
  Counters& counters() { return counters_; }
  // A fused program replayed op by op: counted by its reason, the detail logged (debug).
  void count_fallback(const runtime::Fallback& fallback, const fusion::FusedProgram& program);

 private:
  struct CacheEntry {
    fusion::FusedProgram program;
    std::shared_ptr<const fast::CompiledProgram> compiled;
    // cache_clock_ when built or last used; written on a hit only when it changed, so a hot
    // structure's entry is not a cache line every launch writes.
    std::unique_ptr<std::atomic<std::uint64_t>> last_used;
  };
  void evict_coldest_kernels() KILN_REQUIRES(cache_mutex_);

  HostAllocator allocator_;
  Handles handles_;
  ReferenceExecutor reference_;
  int threads_;
  tbb::task_arena arena_;
  std::size_t max_kernels_;
  mutable SharedMutex cache_mutex_;
  std::unordered_map<std::uint64_t, std::vector<CacheEntry>> cache_ KILN_GUARDED_BY(cache_mutex_);
  std::size_t cache_entries_ KILN_GUARDED_BY(cache_mutex_) = 0;
  std::atomic<std::uint64_t> cache_clock_{0};  // compiled forms built so far
  std::unique_ptr<jit::JitCache> jit_;
  Counters counters_;
};

template <class T>
Status CpuDevice::upload(ir::TensorId id, ir::Shape shape, std::span<const T> values) {
  Result<HostTensor> t = HostTensor::from_values<T>(allocator_, std::move(shape), values);
  if (!t.ok()) return t.error();
  upload(id, std::move(t).value());
  return Status::Ok();
}

template <class T>
ir::HandleLookup<std::vector<T>> CpuDevice::download(ir::TensorId id) const {
  ir::HandleLookup<HostTensor> t = tensor(id);
  if (!t.ok()) return std::move(t).map([](HostTensor&&) { return std::vector<T>(); });
  std::vector<T> values = t->template to_values<T>();
  if (values.empty() && t->num_elements() != 0)
    return ir::HandleLookup<std::vector<T>>::invalid(
        make_error(ErrorCode::DTypeMismatch, "CpuDevice::download: " + t->to_string() + " is not stored as this type"));
  return ir::HandleLookup<std::vector<T>>::found(std::move(values));
}

}  // namespace kiln::cpu

// CudaBackend: the runtime::DeviceBackend of one GPU. Fused programs run as NVRTC-generated
// kernels (codegen.h), single operations as one-op programs of the same generator
// (single_op.h), and everything else on the host reference executor over downloaded copies.
//
//   streams      one CUDA stream per kiln stream (make_executor), plus a transfer stream for
//                upload / download; a tensor remembers the stream that last used it, and a
//                kernel on another stream first waits on an event recorded there
//   memory       the device's stream-ordered pool (cudaMallocFromPoolAsync / cudaFreeAsync),
//                kept warm (release threshold: never), with statistics; pinned staging
//                buffers for host transfers
//   kernels      generated once per program structure (in-memory cache keyed by the structural
//                hash, compared with ==, for this device's architecture), CUBINs cached on disk
//                (disk_cache.h), loaded with cudaLibraryLoadData
//   errors       the ir error model (docs/spec/ir.md §11): an errored input sends a fused program to the
//                op-by-op path; a program that can fault (integer division, indexed reads,
//                reductions without identity) is checked right after its launch and, on a fault,
//                discarded, quarantined (it runs unfused from then on) and replayed op by op,
//                so its outputs carry exactly the error the unfused ops produce; a CUDA error
//                (launch failure, sticky device fault) errors the launch's outputs with the
//                CUDA message as root cause
//
// It uses the CUDA runtime only (cudart, never libcuda): create() on a machine without a driver
// or a device returns an error value naming the reason.
//
// Thread-safety: every DeviceBackend method may be called from any thread (runtime/backend.h);
// an executor is driven by one stream actor at a time.
//
// Usage:
//   Result<std::unique_ptr<CudaBackend>> b = CudaBackend::create({.device = 0});
//   if (!b.ok()) { spdlog::info("kiln: CPU device: {}", b.error().message); ... }
//   auto exec = (*b)->make_executor();      // one per kiln stream
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>

#include "kiln/cuda/probe.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/fallback.h"

namespace kiln::cuda {

struct CudaBackendOptions {
  int device = 0;
  // Most bytes of live device buffers; none = the device's memory. A request past it fails with
  // ErrorCode::ResourceExhausted (kilnd sets a fraction of the device's memory by default).
  std::optional<std::uint64_t> byte_limit;
  // Compiled-kernel cache directory; nullopt: DiskCache::default_dir(). An unusable directory
  // (another owner, group-writable) is logged and the backend runs without a disk cache.
  std::optional<std::filesystem::path> cache_dir;
  bool disk_cache = true;
  // Pinned staging buffer per transfer chunk. 32 MiB: large enough that a copy runs at PCIe /
  // NVLink-C2C speed (the per-copy overhead is ~10 us), small enough to keep pinned memory low.
  std::size_t staging_bytes = std::size_t{32} << 20;
  // Approximate f32 exp/log in generated kernels (CodegenOptions::fast_math). nullopt: the
  // environment decides (KILN_CUDA_FAST_MATH=1), else off.
  std::optional<bool> fast_math;
};

struct CudaStats {
  std::uint64_t fused_launches = 0;                               // fused programs run as generated kernels
  std::uint64_t launches_by_kind[fusion::kNumProgramKinds] = {};  // per fusion::ProgramKind
  std::uint64_t vector_launches = 0;                              // elementwise launches that took the 16-byte path
  std::uint64_t row_vector_launches = 0;                          // ... that took the row-broadcast 16-byte path
  std::uint64_t row_kernel_launches = 0;          // Row programs run as one kernel (each counts once in fused_launches)
  std::uint64_t row_warp_kernel_launches = 0;     // ... of them by a warp per row (rows up to kWarpRowLength)
  std::uint64_t row_window_launches = 0;          // ... with their temporaries in shared memory
  std::uint64_t single_op_kernels = 0;            // single ops run as one-op generated kernels
  std::uint64_t host_ops = 0;                     // single ops run on the host reference executor
  std::uint64_t fused_replays = 0;                // fused programs replayed op by op
  runtime::FallbackCounts fallbacks_by_reason{};  // fused_replays by runtime::FallbackReason
  std::uint64_t faults = 0;                       // kernel faults detected (then replayed)
  std::uint64_t quarantined = 0;                  // programs sent unfused for good
  std::uint64_t cuda_errors = 0;                  // launches failed by a CUDA error
  std::uint64_t kernel_cache_hits = 0, kernel_cache_misses = 0;
  std::uint64_t disk_cache_hits = 0, compile_failures = 0;
  std::uint64_t cross_stream_waits = 0;  // event waits between streams
  std::uint64_t pool_used_bytes = 0, pool_reserved_bytes = 0, pool_used_high = 0;
};

class CudaBackend final : public runtime::DeviceBackend {
 public:
  // Errors (ErrorCode::Unsupported): no driver, no such device, no memory pools; Execution:
  // a CUDA call failed while setting up.
  static Result<std::unique_ptr<CudaBackend>> create(CudaBackendOptions options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }
  std::unique_ptr<fusion::Executor> make_executor() override;
  fusion::FuserList fusers(const fusion::FusionLog& log, const fusion::FuserOptions& options) const override;
  [[nodiscard]] Status claim_error(ir::TensorId id, const ir::TensorError& error) override;
  [[nodiscard]] Status upload(ir::TensorId id, ir::DType dtype, ir::Shape shape,
                              std::span<const std::byte> bytes) override;
  [[nodiscard]] Result<runtime::HostData> download(const ir::TensorIr& t) override;
  bool is_materialized(ir::TensorId id) const override;
  std::optional<ir::TensorError> error_of(ir::TensorId id) const override;
  void free(const ir::TensorIr& t) override;
  [[nodiscard]] Status alias(ir::TensorId src, ir::TensorId dst) override;
  runtime::MemoryStats memory_stats() const override;
  // The CUDA runtime's current device is per thread: kernels stay on the pool threads.
  bool executes_on_any_thread() const override { return false; }

  CudaStats stats() const;
  const DeviceInfo& device_info() const;
  // Waits for every stream of this backend (tests, benchmarks, shutdown).
  [[nodiscard]] Status synchronize();

  struct Impl;  // backend.cc

 private:
  explicit CudaBackend(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::cuda

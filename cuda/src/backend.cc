// The CUDA runtime backend (backend.h).
#include "kiln/cuda/backend.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/base/mutex.h"
#include "kiln/cuda/codegen.h"
#include "kiln/cuda/disk_cache.h"
#include "kiln/cuda/launch.h"
#include "kiln/cuda/nvrtc.h"
#include "kiln/cuda/single_op.h"
#include "kiln/fusion/fusers.h"
#include "kiln/ir/handle_container.h"
#include "kiln/ir/shape.h"
#include "kiln/reference/memory.h"
#include "kiln/reference/reference_executor.h"
#include "kiln/reference/tensor.h"
#include "kiln/runtime/fallback.h"

namespace kiln::cuda {

using fusion::FusedProgram;
using fusion::ProgramKind;
using ir::TensorStatus;
using runtime::Fallback;
using runtime::FallbackReason;
using MaybeFallback = std::optional<Fallback>;

namespace {

std::string cuda_message(cudaError_t e) { return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e)); }

Error cuda_error(std::string_view what, cudaError_t e) {
  return make_error(ErrorCode::Execution, fmt::format("CUDA: {}: {}", what, cuda_message(e)));
}

#define KILN_CUDA_TRY(what, expr)                                 \
  do {                                                            \
    const cudaError_t _kiln_e = (expr);                           \
    if (_kiln_e != cudaSuccess) return cuda_error(what, _kiln_e); \
  } while (0)

// ---- RAII handles (copying deleted; destruction never throws and ignores errors: a device
// that already failed cannot be cleaned up further)

class CudaStream {
 public:
  static Result<std::shared_ptr<CudaStream>> create() {
    cudaStream_t s = nullptr;
    KILN_CUDA_TRY("creating a stream", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return std::shared_ptr<CudaStream>(new CudaStream(s));
  }
  ~CudaStream() {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  explicit CudaStream(cudaStream_t s) : s_(s) {}
  cudaStream_t s_;
};
using StreamPtr = std::shared_ptr<CudaStream>;

class CudaEvent {
 public:
  static Result<CudaEvent> create() {
    cudaEvent_t e = nullptr;
    KILN_CUDA_TRY("creating an event", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return CudaEvent(e);
  }
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&&) = delete;
  CudaEvent(const CudaEvent&) = delete;
  ~CudaEvent() {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
  }
  cudaEvent_t get() const { return e_; }

 private:
  explicit CudaEvent(cudaEvent_t e) : e_(e) {}
  cudaEvent_t e_;
};

class PinnedBuffer {
 public:
  static Result<std::unique_ptr<PinnedBuffer>> create(std::size_t bytes) {
    void* p = nullptr;
    KILN_CUDA_TRY("allocating pinned staging memory", cudaMallocHost(&p, bytes));
    return std::unique_ptr<PinnedBuffer>(new PinnedBuffer(static_cast<std::byte*>(p), bytes));
  }
  ~PinnedBuffer() { (void)cudaFreeHost(p_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  std::byte* data() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  PinnedBuffer(std::byte* p, std::size_t n) : p_(p), n_(n) {}
  std::byte* p_;
  std::size_t n_;
};

class CudaLibrary {
 public:
  static Result<std::unique_ptr<CudaLibrary>> load(const std::vector<std::byte>& code) {
    cudaLibrary_t lib = nullptr;
    KILN_CUDA_TRY("loading a compiled program",
                  cudaLibraryLoadData(&lib, code.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
    return std::unique_ptr<CudaLibrary>(new CudaLibrary(lib));
  }
  ~CudaLibrary() { (void)cudaLibraryUnload(lib_); }
  CudaLibrary(const CudaLibrary&) = delete;
  CudaLibrary& operator=(const CudaLibrary&) = delete;
  Result<cudaKernel_t> kernel(const std::string& name) const {
    cudaKernel_t k = nullptr;
    KILN_CUDA_TRY("finding kernel " + name, cudaLibraryGetKernel(&k, lib_, name.c_str()));
    return k;
  }

 private:
  explicit CudaLibrary(cudaLibrary_t lib) : lib_(lib) {}
  cudaLibrary_t lib_;
};

// The device memory limit (CudaBackendOptions::byte_limit): bytes of live buffers, checked
// before each pool allocation, so that one client's request past it is its own error and not an
// out-of-memory for every stream. Shared by the buffers, which may outlive the backend.
struct MemoryBudget {
  std::optional<std::uint64_t> limit;
  std::atomic<std::uint64_t> used{0};

  Status reserve(std::uint64_t bytes) {
    std::uint64_t cur = used.load(std::memory_order_relaxed);
    do {
      if (limit && (bytes > *limit || cur > *limit - bytes))
        return make_error(ErrorCode::ResourceExhausted,
                          fmt::format("allocating {} MiB: the device memory limit of {} MiB has {} MiB in use "
                                      "(daemon.device_memory_mib)",
                                      bytes >> 20, *limit >> 20, cur >> 20));
    } while (!used.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
    return Status::Ok();
  }
  void release(std::uint64_t bytes) { used.fetch_sub(bytes, std::memory_order_relaxed); }
};
using BudgetPtr = std::shared_ptr<MemoryBudget>;

// A pool allocation, freed stream-ordered on the last stream that used it: the free is ordered
// after every kernel that stream queued on the buffer, and a buffer used by a second stream is
// handed over with an event first (use_on), so the last user is the only one still pending.
// `budget` null: not counted (the backend's own bookkeeping buffers).
class DeviceBuffer {
 public:
  static Result<std::shared_ptr<DeviceBuffer>> allocate(const BudgetPtr& budget, cudaMemPool_t pool, std::size_t bytes,
                                                        const StreamPtr& stream) {
    void* p = nullptr;
    if (budget) KILN_RETURN_IF_ERROR(budget->reserve(bytes));
    // From here the buffer owns the reservation (and the memory): its destructor returns both,
    // whatever fails below.
    std::shared_ptr<DeviceBuffer> buf(new DeviceBuffer(nullptr, bytes, stream, budget));
    if (bytes > 0) {
      KILN_CUDA_TRY(fmt::format("allocating {} bytes", bytes), cudaMallocFromPoolAsync(&p, bytes, pool, stream->get()));
      buf->p_ = p;
    }
    return buf;
  }
  ~DeviceBuffer() {
    if (p_ != nullptr) (void)cudaFreeAsync(p_, last_->get());
    if (budget_) budget_->release(n_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return p_; }
  std::size_t size() const { return n_; }

  // Makes `stream` the buffer's user: when another stream used it last, `stream` first waits
  // for what that stream queued so far. Returns whether a wait was needed.
  Result<bool> use_on(const StreamPtr& stream) {
    MutexLock lock(mu_);
    if (last_ == stream) return false;
    KILN_ASSIGN_OR_RETURN(CudaEvent ev, CudaEvent::create());
    KILN_CUDA_TRY("recording a cross-stream event", cudaEventRecord(ev.get(), last_->get()));
    KILN_CUDA_TRY("waiting on a cross-stream event", cudaStreamWaitEvent(stream->get(), ev.get(), 0));
    last_ = stream;  // the event may be destroyed now: the wait is already enqueued
    return true;
  }

 private:
  DeviceBuffer(void* p, std::size_t n, StreamPtr s, BudgetPtr budget)
      : p_(p), n_(n), budget_(std::move(budget)), last_(std::move(s)) {}
  void* p_;
  std::size_t n_;
  BudgetPtr budget_;
  Mutex mu_;
  StreamPtr last_ KILN_GUARDED_BY(mu_);
};
using BufferPtr = std::shared_ptr<DeviceBuffer>;

// A tensor in device memory: row-major, dtype storage (as the CPU tensors).
struct CudaTensor {
  BufferPtr buffer;
  ir::Shape shape;
  ir::DType dtype;
  std::uint64_t bytes() const { return ir::num_elements(shape) * dtype.size_bytes(); }
};

// The kernels of one program, loaded on this device.
struct LoadedProgram {
  GeneratedProgram generated;
  std::unique_ptr<CudaLibrary> library;
  std::vector<cudaKernel_t> kernels;  // per generated.kernels
  std::string error;                  // non-empty: generation or compilation failed (cached)
};

struct Counters {
  std::atomic<std::uint64_t> fused_launches{0}, vector_launches{0}, row_vector_launches{0}, row_kernel_launches{0},
      row_warp_kernel_launches{0}, row_window_launches{0}, single_op_kernels{0}, host_ops{0}, fused_replays{0},
      faults{0}, quarantined{0}, cuda_errors{0}, kernel_cache_hits{0}, kernel_cache_misses{0}, disk_cache_hits{0},
      compile_failures{0}, cross_stream_waits{0};
  std::array<std::atomic<std::uint64_t>, fusion::kNumProgramKinds> by_kind{};
  std::array<std::atomic<std::uint64_t>, runtime::kFallbackReasonCount> fallbacks_by_reason{};
};

}  // namespace

// ---- The backend's shared state

struct CudaBackend::Impl {
  CudaBackendOptions options;
  DeviceInfo info;
  cudaMemPool_t pool = nullptr;
  BudgetPtr budget = std::make_shared<MemoryBudget>();
  StreamPtr transfer;
  std::optional<DiskCache> disk;
  CompileOptions compile;
  CodegenOptions codegen;
  Counters counters;

  // Tensor table: sharded like the CPU reference backend's (64 mutexes, kernels and copies run
  // outside every lock).
  static constexpr std::size_t kShards = 64;
  using Container = ir::HandleContainer<CudaTensor>;
  struct alignas(64) Shard {
    mutable Mutex mu;
    Container table KILN_GUARDED_BY(mu);
  };
  std::array<Shard, kShards> shards;
  Shard& shard(ir::TensorId id) { return shards[std::hash<ir::TensorId>{}(id) % kShards]; }
  const Shard& shard(ir::TensorId id) const { return shards[std::hash<ir::TensorId>{}(id) % kShards]; }

  // Pinned staging, one buffer, one transfer at a time (uploads and downloads are synchronous
  // and rare next to kernels; a second buffer would only help overlapping transfers).
  Mutex staging_mu;
  std::unique_ptr<PinnedBuffer> staging KILN_GUARDED_BY(staging_mu);

  // Kernel cache: structural hash -> programs with that hash (compared with ==).
  mutable SharedMutex cache_mu;
  std::unordered_map<std::uint64_t, std::vector<std::pair<FusedProgram, std::shared_ptr<const LoadedProgram>>>> cache
      KILN_GUARDED_BY(cache_mu);

  // Programs whose kernel faulted: they run unfused from now on.
  mutable Mutex quarantine_mu;
  std::unordered_set<std::uint64_t> quarantine KILN_GUARDED_BY(quarantine_mu);

  Status set_device() const {
    KILN_CUDA_TRY("selecting the device", cudaSetDevice(options.device));
    return Status::Ok();
  }

  bool is_quarantined(const FusedProgram& p) const {
    MutexLock lock(quarantine_mu);
    return quarantine.count(p.structural_hash()) != 0;
  }
  void quarantine_program(const FusedProgram& p, std::string_view why) {
    MutexLock lock(quarantine_mu);
    if (quarantine.insert(p.structural_hash()).second) {
      counters.quarantined.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("kiln cuda: {} program {:016x} quarantined (runs unfused from now on): {}",
                   fusion::program_kind_name(p.kind), p.structural_hash(), why);
    }
  }

  // A fused program replayed op by op: counted by its reason, the detail logged (debug).
  void count_fallback(const Fallback& f, const FusedProgram& p) {
    counters.fused_replays.fetch_add(1, std::memory_order_relaxed);
    counters.fallbacks_by_reason[static_cast<std::size_t>(f.reason)].fetch_add(1, std::memory_order_relaxed);
    spdlog::debug("kiln cuda: {} program {:016x} ({} ops) replayed op by op: {}: {}", fusion::program_kind_name(p.kind),
                  p.structural_hash(), p.len, runtime::fallback_reason_name(f.reason), f.detail);
  }

  std::shared_ptr<const LoadedProgram> kernels(const FusedProgram& p) {
    const std::uint64_t h = p.structural_hash();
    {
      ReaderLock lock(cache_mu);
      auto it = cache.find(h);
      if (it != cache.end())
        for (const auto& [prog, loaded] : it->second)
          if (prog == p) {
            counters.kernel_cache_hits.fetch_add(1, std::memory_order_relaxed);
            return loaded;
          }
    }
    counters.kernel_cache_misses.fetch_add(1, std::memory_order_relaxed);
    // Built outside the lock: NVRTC takes milliseconds to seconds. Two streams missing on the
    // same program at once both build it; the first insert wins.
    std::shared_ptr<const LoadedProgram> built = build(p);
    WriterLock lock(cache_mu);
    auto& bucket = cache[h];
    for (const auto& [prog, loaded] : bucket)
      if (prog == p) return loaded;
    bucket.emplace_back(p, built);
    return built;
  }

  std::shared_ptr<const LoadedProgram> build(const FusedProgram& p) {
    auto out = std::make_shared<LoadedProgram>();
    Result<GeneratedProgram> g = generate(p, codegen);
    if (!g.ok()) {
      out->error = g.error().message;
      spdlog::info("kiln cuda: {} program runs unfused: {}", fusion::program_kind_name(p.kind), out->error);
      return out;
    }
    out->generated = std::move(g).value();
    const std::string source = out->generated.source();
    const std::uint64_t key = code_key(source, compile);
    std::optional<CompiledCode> code;
    if (disk) code = disk->load(key, compile);
    if (code) {
      counters.disk_cache_hits.fetch_add(1, std::memory_order_relaxed);
    } else {
      Result<CompiledCode> c = nvrtc_compile(source, fmt::format("kiln_{:016x}.cu", p.structural_hash()), compile);
      if (!c.ok()) {
        counters.compile_failures.fetch_add(1, std::memory_order_relaxed);
        out->error = c.error().message;
        spdlog::error("kiln cuda: generated code does not compile (a generator bug; the program runs unfused): {}",
                      out->error);
        return out;
      }
      code = std::move(c).value();
      if (disk) {
        if (Status st = disk->store(key, *code); !st.ok()) spdlog::warn("kiln cuda: {}", st.error().message);
      }
    }
    Result<std::unique_ptr<CudaLibrary>> lib = CudaLibrary::load(code->bytes);
    if (!lib.ok()) {
      out->error = lib.error().message;
      return out;
    }
    out->library = std::move(lib).value();
    for (const KernelSpec& k : out->generated.kernels) {
      Result<cudaKernel_t> kern = out->library->kernel(k.name);
      if (!kern.ok()) {
        out->error = kern.error().message;
        return out;
      }
      out->kernels.push_back(*kern);
    }
    return out;
  }

  // Host <-> device copies through the pinned staging buffer, on the transfer stream.
  Status to_device(void* dst, std::span<const std::byte> src) {
    MutexLock lock(staging_mu);
    for (std::size_t done = 0; done < src.size();) {
      const std::size_t n = std::min(staging->size(), src.size() - done);
      std::memcpy(staging->data(), src.data() + done, n);
      KILN_CUDA_TRY("copying to the device", cudaMemcpyAsync(static_cast<std::byte*>(dst) + done, staging->data(), n,
                                                             cudaMemcpyHostToDevice, transfer->get()));
      KILN_CUDA_TRY("waiting for a copy to the device", cudaStreamSynchronize(transfer->get()));
      done += n;
    }
    return Status::Ok();
  }
  Status to_host(std::span<std::byte> dst, const void* src) {
    MutexLock lock(staging_mu);
    for (std::size_t done = 0; done < dst.size();) {
      const std::size_t n = std::min(staging->size(), dst.size() - done);
      KILN_CUDA_TRY("copying to the host", cudaMemcpyAsync(staging->data(), static_cast<const std::byte*>(src) + done,
                                                           n, cudaMemcpyDeviceToHost, transfer->get()));
      KILN_CUDA_TRY("waiting for a copy to the host", cudaStreamSynchronize(transfer->get()));
      std::memcpy(dst.data() + done, staging->data(), n);
      done += n;
    }
    return Status::Ok();
  }

  Result<CudaTensor> upload_tensor(const ir::Shape& shape, ir::DType dtype, std::span<const std::byte> bytes) {
    if (dtype.is_quantized()) return make_error(ErrorCode::Unsupported, "QFloat tensors are not supported on the GPU");
    const std::uint64_t want = ir::num_elements(shape) * dtype.size_bytes();
    if (bytes.size() != want)
      return make_error(ErrorCode::Invalid, fmt::format("{} bytes for {} {} (expected {})", bytes.size(), dtype.name(),
                                                        ir::shape_to_string(shape), want));
    KILN_ASSIGN_OR_RETURN(BufferPtr buf, DeviceBuffer::allocate(budget, pool, bytes.size(), transfer));
    KILN_RETURN_IF_ERROR(to_device(buf->data(), bytes));
    return CudaTensor{std::move(buf), shape, dtype};
  }

  Result<std::vector<std::byte>> download_tensor(const CudaTensor& t) {
    std::vector<std::byte> out(static_cast<std::size_t>(t.bytes()));
    if (out.empty()) return out;
    KILN_ASSIGN_OR_RETURN(bool waited, t.buffer->use_on(transfer));
    if (waited) counters.cross_stream_waits.fetch_add(1, std::memory_order_relaxed);
    KILN_RETURN_IF_ERROR(to_host(out, t.buffer->data()));
    return out;
  }
};

// ---- One stream's executor

namespace {

class CudaStreamExecutor final : public fusion::Executor {
 public:
  CudaStreamExecutor(CudaBackend::Impl& b, StreamPtr stream, BufferPtr fault, std::unique_ptr<PinnedBuffer> fault_host)
      : b_(b),
        stream_(std::move(stream)),
        fault_(std::move(fault)),
        fault_host_(std::move(fault_host)),
        reference_(allocator_) {}

  void execute_optimization(const fusion::Optimization& opt, const fusion::ExecutionContext& ctx) override {
    (void)b_.set_device();
    const auto* fused = dynamic_cast<const fusion::FusedOptimization*>(&opt);
    if (fused == nullptr) {
      replay(ctx, 0, opt.len());
      return;
    }
    const ir::RelativeConverter& c = ctx.converter();
    const Binding bind{c.tensors_rel2glob(), c.shapes_rel2glob(), c.scalars()};
    run_fused(fused->program(), bind, ctx, 0);
  }

  void execute_operation(const ir::Operation& op) override {
    (void)b_.set_device();
    if (op.kind == ir::OpKind::Drop_Drop) {
      // A drop only releases handles (never a trip through the host fallback).
      for (const ir::TensorIr& t : op.inputs()) free_tensor(t);
      return;
    }
    if (op.kind == ir::OpKind::Base_Reshape && share_reshape(op)) return;
    if (std::optional<SingleOpProgram> s = single_op_program(op); s && !b_.is_quarantined(s->program)) {
      if (!run_program(s->program, s->binding(), s->permute_axes ? &*s->permute_axes : nullptr, /*fused=*/false)) {
        b_.counters.single_op_kernels.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    run_on_host(op);
  }

  std::optional<ir::TensorError> take_failure() override { return failure_.take(); }

  void free_tensor(const ir::TensorIr& t) override {
    if (t.status != TensorStatus::ReadWrite) return;
    auto& s = b_.shard(t.id);
    MutexLock lock(s.mu);
    (void)s.table.free(t);
  }

 private:
  void replay(const fusion::ExecutionContext& ctx, std::size_t offset, std::size_t len) {
    for (std::size_t i = 0; i < len; ++i) execute_operation(ctx.operation_within_optimization(offset + i));
  }

  void run_fused(const FusedProgram& p, const Binding& bind, const fusion::ExecutionContext& ctx, std::size_t offset) {
    if (fusion::is_staged(p.kind)) {
      if (p.kind == ProgramKind::Row && run_row_kernel(p, bind)) {
        b_.counters.fused_launches.fetch_add(1, std::memory_order_relaxed);
        b_.counters.by_kind[static_cast<std::size_t>(p.kind)].fetch_add(1, std::memory_order_relaxed);
        return;
      }
      // Stages in order, one launch each; each commits its outputs before the next binds
      // (values pass through global memory, on this stream, in order).
      for (const FusedProgram& stage : p.stages) {
        run_fused(stage, bind, ctx, offset);
        offset += stage.len;
      }
      return;
    }
    MaybeFallback fallback = b_.is_quarantined(p)
                                 ? Fallback{FallbackReason::Quarantined, "its kernel faulted on an earlier run"}
                                 : run_program(p, bind, nullptr, /*fused=*/true);
    if (fallback) {
      b_.count_fallback(*fallback, p);
      replay(ctx, offset, p.len);
      return;
    }
    b_.counters.fused_launches.fetch_add(1, std::memory_order_relaxed);
    b_.counters.by_kind[static_cast<std::size_t>(p.kind)].fetch_add(1, std::memory_order_relaxed);
    if (p.kind == ProgramKind::NhwcRelayout && p.captured_op_position < p.len) {
      // The module op the relayout feeds runs unfused (on the host reference for now; it reads
      // the tensor row-major, so the NHWC write order is a layout hint only, as on the CPU).
      for (std::size_t i = p.captured_op_position; i < p.len; ++i)
        execute_operation(ctx.operation_within_optimization(offset + i));
    }
  }

  static const ir::TensorIr* global_of(const Binding& b, std::uint64_t rel) {
    return rel < b.tensors.size() ? &b.tensors[rel] : nullptr;
  }

  // Tensors an earlier stage of the same launch writes (global id -> its fresh output).
  using Produced = std::unordered_map<std::uint64_t, CudaTensor>;

  // One program's launch as run_program assembles it, phase by phase.
  struct ProgramLaunch {
    std::vector<std::optional<CudaTensor>> inputs, outputs;  // per program input / output
    StageArgs args;
    ir::Shape ref0;          // block 0's concrete reference shape
    std::size_t kernel = 0;  // index into the generated kernels
    std::uint64_t work = 0;  // units of work of that kernel (elements, vectors, outputs)
  };

  // Runs one (non-ReduceBroadcasted) program as generated kernels (`fused`: a plan's program,
  // quarantined when it faults; otherwise a single op's). Returns the fallback when nothing was
  // changed and the caller must run its operations one by one (an errored or missing input, a
  // program the generator refuses, shapes beyond the kernels, a fault); nullopt when it ran, or
  // when a CUDA error was recorded on its outputs.
  MaybeFallback run_program(const FusedProgram& p, const Binding& bind, const std::vector<std::uint64_t>* permute,
                            bool fused) {
    std::shared_ptr<const LoadedProgram> loaded = b_.kernels(p);
    if (!loaded->error.empty()) return Fallback{FallbackReason::Unsupported, loaded->error};
    const GeneratedProgram& g = loaded->generated;
    if (g.stages.size() != 1)
      return Fallback{FallbackReason::Unsupported, fmt::format("{} stages generated, one expected", g.stages.size())};
    if (fault_ == nullptr || fault_host_ == nullptr)
      return Fallback{FallbackReason::Resources, "the stream has no fault word (a degraded executor: host only)"};
    const StageInfo& stage = g.stages[0];

    // Binding: nothing changes before the first CUDA call, so any of these may still fall back.
    ProgramLaunch l;
    if (MaybeFallback f = bind_inputs(p, bind, l)) return f;
    if (MaybeFallback f = check_outputs(p, bind)) return f;
    if (MaybeFallback f = lay_out_blocks(p, stage, bind, permute, l)) return f;
    if (MaybeFallback f = choose_kernel(p, g, bind, l)) return f;
    if (MaybeFallback f = bind_arguments(g, bind, l)) return f;

    // Device work: a CUDA error from here on is recorded on the outputs.
    if (Status st = hand_over_inputs(p, l); !st.ok()) return fail_with(p, bind, st.error());
    if (Status st = allocate_outputs(p, bind, l); !st.ok()) return fail_with(p, bind, st.error());
    choose_vector_path(p, g, stage, permute, l);
    l.args.fault = reinterpret_cast<std::uintptr_t>(fault_->data());
    if (g.may_fault) {
      const cudaError_t e = cudaMemsetAsync(fault_->data(), 0, sizeof(int), stream_->get());
      if (e != cudaSuccess) return fail_with(p, bind, cuda_error("clearing the fault word", e));
    }
    if (l.work > 0) {
      const KernelSpec& spec = g.kernels[l.kernel];
      Result<ArgPack> pack = pack_args(spec, l.args);
      if (!pack.ok()) return Fallback{FallbackReason::ShapeLimits, pack.error().message};
      const cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(loaded->kernels[l.kernel]),
                                             grid_for(p.kind, spec.role, l.work, l.args.matmul), dim3(spec.threads),
                                             pack->args(), 0, stream_->get());
      if (e != cudaSuccess) return fail_with(p, bind, cuda_error("launching " + spec.name, e));
    }
    if (g.may_fault) {
      // Checked now, before anything is committed: a faulting program leaves the table as it
      // found it and replays op by op, each op then failing or skipping exactly as unfused.
      Result<bool> faulted = read_fault_word();
      if (!faulted.ok()) return fail_with(p, bind, faulted.error());
      if (*faulted) {
        b_.counters.faults.fetch_add(1, std::memory_order_relaxed);
        static constexpr std::string_view kFault =
            "its kernel faulted (integer division by zero or an index out of range)";
        // A fused plan goes unfused for good; a single op only this time (it then runs on the
        // host reference, which reports the error; its next run may well be valid).
        if (fused) b_.quarantine_program(p, kFault);
        return Fallback{FallbackReason::Fault, std::string(kFault)};
      }
    }
    commit(p, bind, l.outputs);
    return std::nullopt;
  }

  // A Row program as one kernel (launch.h, row_space): every stage bound first, a later stage's
  // inputs taken from an earlier stage's fresh outputs, then one launch, then each stage commits
  // in order. false when it cannot run so (the table unchanged; the stages then run one launch
  // each, which also decides what a fault means); true when it ran, or when a CUDA error was
  // recorded on its outputs.
  bool run_row_kernel(const FusedProgram& p, const Binding& bind) {
    if (b_.is_quarantined(p) || fault_ == nullptr || fault_host_ == nullptr) return false;
    std::shared_ptr<const LoadedProgram> loaded = b_.kernels(p);
    if (!loaded->error.empty() || !loaded->generated.row_kernel || !loaded->generated.row_warp_kernel) return false;
    const GeneratedProgram& g = loaded->generated;
    Result<RowSpace> space = row_space(p, bind);
    if (!space.ok()) {
      spdlog::debug("kiln cuda: Row program {:016x} runs stage by stage: {}", p.structural_hash(),
                    space.error().message);
      return false;
    }
    std::vector<ProgramLaunch> stages(p.stages.size());
    if (!bind_row_stages(p, g, bind, stages)) return false;
    std::vector<StageArgs> args;
    for (ProgramLaunch& l : stages) {
      l.args.fault = reinterpret_cast<std::uintptr_t>(fault_->data());
      args.push_back(std::move(l.args));  // the launch reads only these from here on
    }
    args[0].rows = space->rows;
    args[0].row_length = space->n;
    // The temporaries consumed inside the launch stay in shared memory when the block's windows
    // fit kMaxWindowBytes (no opt-in attribute needed); else they go through global memory.
    const RowLaunch shape = row_launch(g.row_windows, space->n, g.kernels[*g.row_kernel].threads, kMaxWindowBytes);
    const bool by_warp = shape.by_warp, windowed = shape.window_bytes > 0;
    args[0].row_window_bytes = shape.window_bytes;
    const std::size_t kernel = by_warp ? *g.row_warp_kernel : *g.row_kernel;
    const KernelSpec& spec = g.kernels[kernel];
    Result<ArgPack> pack = pack_args(spec, args);
    if (!pack.ok() || param_bytes(*pack) > kMaxParamBytes) return false;

    // Device work: a CUDA error from here on is recorded on every stage's outputs.
    const auto fail_all = [&](const Error& err) {
      for (std::size_t k = 0; k < stages.size(); ++k) (void)fail_with(p.stages[k], bind, err);
      return true;
    };
    for (std::size_t k = 0; k < stages.size(); ++k)
      if (Status st = hand_over_inputs(p.stages[k], stages[k]); !st.ok()) return fail_all(st.error());
    if (g.may_fault) {
      const cudaError_t e = cudaMemsetAsync(fault_->data(), 0, sizeof(int), stream_->get());
      if (e != cudaSuccess) return fail_all(cuda_error("clearing the fault word", e));
    }
    const std::uint64_t fill = static_cast<std::uint64_t>(std::max(1, b_.info.multiprocessors)) * 8;
    const std::uint64_t blocks =
        (static_cast<std::uint64_t>(space->rows) + shape.rows_per_block - 1) / shape.rows_per_block;
    const dim3 grid(static_cast<unsigned>(std::clamp<std::uint64_t>(blocks, 1, fill * 4)));
    const cudaError_t e = cudaLaunchKernel(reinterpret_cast<const void*>(loaded->kernels[kernel]), grid,
                                           dim3(shape.threads), pack->args(), shape.shared, stream_->get());
    if (e == cudaErrorLaunchOutOfResources || e == cudaErrorInvalidConfiguration || e == cudaErrorInvalidValue) {
      // Refused for this kernel's own needs (registers, shared memory): nothing ran, so the
      // stages run one launch each from now on. The error is this launch's: clear it.
      (void)cudaGetLastError();
      b_.quarantine_program(p, fmt::format("its row kernel did not launch: {}", cudaGetErrorString(e)));
      return false;
    }
    if (e != cudaSuccess) return fail_all(cuda_error("launching " + spec.name, e));
    if (g.may_fault) {
      Result<bool> faulted = read_fault_word();
      if (!faulted.ok()) return fail_all(faulted.error());
      if (*faulted) {
        // Nothing committed: the stages run one launch each, and fault or replay as they would.
        b_.counters.faults.fetch_add(1, std::memory_order_relaxed);
        b_.quarantine_program(p, "its row kernel faulted (integer division by zero or an index out of range)");
        return false;
      }
    }
    for (std::size_t k = 0; k < stages.size(); ++k) commit(p.stages[k], bind, stages[k].outputs);
    b_.counters.row_kernel_launches.fetch_add(1, std::memory_order_relaxed);
    if (by_warp) b_.counters.row_warp_kernel_launches.fetch_add(1, std::memory_order_relaxed);
    if (windowed) b_.counters.row_window_launches.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  // The binding phases of run_program for every stage of a Row program, with fresh outputs
  // (allocated on this stream: freed on it if the launch does not happen). false: a stage cannot
  // be bound so (nothing in the table changed).
  bool bind_row_stages(const FusedProgram& p, const GeneratedProgram& g, const Binding& bind,
                       std::vector<ProgramLaunch>& stages) {
    Produced produced;
    for (std::size_t k = 0; k < p.stages.size(); ++k) {
      const FusedProgram& st = p.stages[k];
      ProgramLaunch& l = stages[k];
      if (k >= g.stages.size() || bind_inputs(st, bind, l, &produced) || check_outputs(st, bind) ||
          lay_out_blocks(st, g.stages[k], bind, nullptr, l) || choose_kernel(st, g, bind, l) ||
          bind_arguments(g, bind, l))
        return false;
      if (!allocate_outputs(st, bind, l).ok()) return false;
      for (std::size_t o = 0; o < st.outputs.size(); ++o)
        if (l.outputs[o]) produced.insert_or_assign(global_of(bind, st.outputs[o].tensor)->id.value(), *l.outputs[o]);
    }
    return true;
  }

  // The classic limit on a kernel's parameters (larger lists need sm_70+ and CUDA 12.1+ on both
  // sides): a Row kernel beyond it runs stage by stage.
  static constexpr std::size_t kMaxParamBytes = 4096;
  // Dynamic shared memory without the opt-in attribute: 48 KiB less the reductions' own
  // exchange arrays (8 accumulators per reducing stage).
  static constexpr std::uint64_t kMaxWindowBytes = 44 * 1024;
  static std::size_t param_bytes(const ArgPack& pack) {
    std::size_t total = 0;
    for (std::size_t i = 0; i < pack.size(); ++i) total += (pack.bytes(i) + 7) / 8 * 8;
    return total;
  }

  // Inputs from the tensor table (an errored one: the op-by-op path propagates the error
  // exactly); views share their source's tensor.
  MaybeFallback bind_inputs(const FusedProgram& p, const Binding& bind, ProgramLaunch& l,
                            const Produced* produced = nullptr) {
    const std::size_t ni = p.inputs.size();
    l.inputs.assign(ni, std::nullopt);
    for (std::size_t i = 0; i < ni; ++i) {
      const fusion::ProgramInput& in = p.inputs[i];
      if (in.role == fusion::InputRole::View) continue;
      const ir::TensorIr* gt = global_of(bind, in.tensor);
      if (gt == nullptr) return Fallback{FallbackReason::Binding, fmt::format("input {}: no tensor bound", i)};
      if (produced != nullptr) {
        if (auto it = produced->find(gt->id.value()); it != produced->end()) {
          l.inputs[i] = it->second;
          continue;
        }
      }
      auto& s = b_.shard(gt->id);
      MutexLock lock(s.mu);
      const auto* e = s.table.entry(gt->id);
      if (e != nullptr && e->error() != nullptr)
        return Fallback{FallbackReason::InputErrored,
                        fmt::format("input {} (tensor {}) is errored", i, gt->id.value())};
      if (e == nullptr || e->handle() == nullptr)
        return Fallback{FallbackReason::Binding,
                        fmt::format("input {}: tensor {} not on the device", i, gt->id.value())};
      const CudaTensor& t = *e->handle();
      if (!(t.dtype == in.dtype) || t.shape != gt->shape)
        return Fallback{
            FallbackReason::Binding,
            fmt::format("input {}: tensor {} holds {} {}, the program expects {} {}", i, gt->id.value(), t.dtype.name(),
                        ir::shape_to_string(t.shape), in.dtype.name(), ir::shape_to_string(gt->shape))};
      l.inputs[i] = t;
    }
    for (std::size_t i = 0; i < ni; ++i) {
      const fusion::ProgramInput& in = p.inputs[i];
      if (in.role != fusion::InputRole::View) continue;
      if (!in.view || in.view->source >= ni || !l.inputs[in.view->source])
        return Fallback{FallbackReason::Binding, fmt::format("input {}: view without a bound source", i)};
      l.inputs[i] = l.inputs[in.view->source];
    }
    return std::nullopt;
  }

  // Every written output has a tensor of its dtype in the binding.
  static MaybeFallback check_outputs(const FusedProgram& p, const Binding& bind) {
    for (std::size_t o = 0; o < p.outputs.size(); ++o) {
      const fusion::ProgramOutput& out = p.outputs[o];
      if (!out.written) continue;
      const ir::TensorIr* gt = global_of(bind, out.tensor);
      if (gt == nullptr || !(gt->dtype == out.dtype))
        return Fallback{FallbackReason::Binding,
                        fmt::format("output {}: no tensor of dtype {} bound", o, out.dtype.name())};
    }
    return std::nullopt;
  }

  // Each block's layout over its concrete reference shape. A permute copy's program reads input
  // 0 in the output's shape, through the permutation: its layout is computed as if the input had
  // that shape, then its strides are replaced.
  MaybeFallback lay_out_blocks(const FusedProgram& p, const StageInfo& stage, const Binding& bind,
                               const std::vector<std::uint64_t>* permute, ProgramLaunch& l) {
    Result<ir::Shape> ref0 = concrete_shape(p.blocks[0].reference_shape, bind);
    if (!ref0.ok()) return Fallback{FallbackReason::Binding, ref0.error().message};
    l.ref0 = std::move(ref0).value();
    std::vector<ir::TensorIr> permuted;
    Binding layout_bind = bind;
    if (permute != nullptr) {
      permuted.assign(bind.tensors.begin(), bind.tensors.end());
      if (p.inputs.empty() || p.inputs[0].tensor >= permuted.size())
        return Fallback{FallbackReason::Binding, "a permute copy without its input"};
      permuted[p.inputs[0].tensor].shape = l.ref0;
      layout_bind.tensors = permuted;
    }
    for (std::uint32_t blk = 0; blk < p.blocks.size(); ++blk) {
      Result<ir::Shape> ref = concrete_shape(p.blocks[blk].reference_shape, bind);
      if (!ref.ok()) return Fallback{FallbackReason::Binding, ref.error().message};
      Result<BlockLayout> lay =
          block_layout(p, blk, layout_bind, *ref, /*merge=*/!stage.indexed_blocks[blk] && permute == nullptr);
      if (!lay.ok())
        return Fallback{FallbackReason::ShapeLimits, fmt::format("block {}: {}", blk, lay.error().message)};
      if (lay->iter.rank < 0 || static_cast<std::uint32_t>(lay->iter.rank) > stage.max_rank)
        return Fallback{FallbackReason::ShapeLimits,
                        fmt::format("block {}: rank {} above the kernels' {}", blk, lay->iter.rank, stage.max_rank)};
      l.args.blocks.push_back(std::move(lay).value());
    }
    if (permute != nullptr) {
      // The copy reads input 0 through the permutation: output dim d walks input dim axes[d].
      const ir::Shape& src = l.inputs[0]->shape;
      std::vector<std::int64_t> st(src.size(), 1);
      for (std::size_t d = src.size(); d-- > 1;) st[d - 1] = st[d] * static_cast<std::int64_t>(src[d]);
      KilnAccess& a = l.args.blocks[0].loads[0];
      for (std::size_t d = 0; d < permute->size(); ++d) a.strides[d] = st[(*permute)[d]];
      a.contiguous = 0;
      l.args.blocks[0].iter.contiguous = 0;
      l.args.blocks[0].vectorizable = false;
    }
    return std::nullopt;
  }

  // The kernel of the program's kind, and its units of work.
  MaybeFallback choose_kernel(const FusedProgram& p, const GeneratedProgram& g, const Binding& bind, ProgramLaunch& l) {
    l.work = static_cast<std::uint64_t>(l.args.blocks[0].iter.numel);
    l.kernel = g.kernels.size();
    switch (p.kind) {
      case ProgramKind::Elementwise:
      case ProgramKind::NhwcRelayout: l.kernel = find(g, KernelRole::ElementwiseStrided); break;
      case ProgramKind::Reduce: {
        Result<KilnReduceShape> rs = reduce_shape(p, bind);
        if (!rs.ok()) return Fallback{FallbackReason::ShapeLimits, rs.error().message};
        if (std::string why = reduce_refused(p, *rs); !why.empty())  // the reference reports its error
          return Fallback{FallbackReason::ReferenceDecides, std::move(why)};
        l.args.reduce = *rs;
        l.work = static_cast<std::uint64_t>(rs->outputs);
        l.kernel = find(g, rs->inner == 1 ? KernelRole::ReduceRows : KernelRole::ReduceCols);
        break;
      }
      case ProgramKind::Matmul: {
        Result<KilnMatmulShape> ms =
            matmul_shape(l.inputs[p.matmul->lhs]->shape, l.inputs[p.matmul->rhs]->shape, l.ref0);
        if (!ms.ok()) return Fallback{FallbackReason::ShapeLimits, ms.error().message};
        l.args.matmul = *ms;
        l.kernel = find(g, KernelRole::Matmul);
        break;
      }
      case ProgramKind::ReduceBroadcasted:
      case ProgramKind::Row: return Fallback{FallbackReason::Unsupported, "a staged program runs by its stages"};
    }
    if (l.kernel >= g.kernels.size())
      return Fallback{FallbackReason::Unsupported,
                      fmt::format("no kernel generated for a {} program", fusion::program_kind_name(p.kind))};
    return std::nullopt;
  }

  // Input pointers, indexed shapes and scalars, in the kernels' argument order.
  MaybeFallback bind_arguments(const GeneratedProgram& g, const Binding& bind, ProgramLaunch& l) {
    for (const std::optional<CudaTensor>& in : l.inputs) {
      l.args.inputs.push_back(in ? reinterpret_cast<std::uintptr_t>(in->buffer->data()) : 0);
      l.args.indexed.push_back(in ? indexed_of(in->shape) : KilnIndexed{});
    }
    for (const ScalarSlot& s : g.scalars) {
      if (s.placeholder >= bind.scalars.size())
        return Fallback{FallbackReason::Binding,
                        fmt::format("scalar placeholder {} of {} bound", s.placeholder, bind.scalars.size())};
      l.args.scalars.push_back(scalar_arg(bind.scalars[s.placeholder], s));
    }
    return std::nullopt;
  }

  // Cross-stream hand-over of the inputs: this stream waits for their last writer's event.
  Status hand_over_inputs(const FusedProgram& p, const ProgramLaunch& l) {
    for (std::size_t i = 0; i < l.inputs.size(); ++i) {
      if (!l.inputs[i] || p.inputs[i].role == fusion::InputRole::View) continue;
      Result<bool> w = l.inputs[i]->buffer->use_on(stream_);
      if (!w.ok()) return w.error();
      if (*w) b_.counters.cross_stream_waits.fetch_add(1, std::memory_order_relaxed);
    }
    return Status::Ok();
  }

  // Fresh outputs from the pool, ordered on this stream.
  Status allocate_outputs(const FusedProgram& p, const Binding& bind, ProgramLaunch& l) {
    l.outputs.assign(p.outputs.size(), std::nullopt);
    for (std::size_t o = 0; o < p.outputs.size(); ++o) {
      const fusion::ProgramOutput& out = p.outputs[o];
      if (!out.written) {
        l.args.outputs.push_back(0);
        continue;
      }
      const ir::TensorIr* gt = global_of(bind, out.tensor);  // checked by check_outputs
      const std::uint64_t bytes = ir::num_elements(gt->shape) * out.dtype.size_bytes();
      Result<BufferPtr> buf = DeviceBuffer::allocate(b_.budget, b_.pool, static_cast<std::size_t>(bytes), stream_);
      if (!buf.ok()) return buf.error();
      l.outputs[o] = CudaTensor{std::move(buf).value(), gt->shape, out.dtype};
      l.args.outputs.push_back(reinterpret_cast<std::uintptr_t>(l.outputs[o]->buffer->data()));
    }
    return Status::Ok();
  }

  // The 16-byte paths of elementwise programs: every tensor contiguous and aligned, or rows of a
  // whole number of vectors with broadcast rows.
  void choose_vector_path(const FusedProgram& p, const GeneratedProgram& g, const StageInfo& stage,
                          const std::vector<std::uint64_t>* permute, ProgramLaunch& l) {
    if (p.kind != ProgramKind::Elementwise && p.kind != ProgramKind::NhwcRelayout) return;
    if (stage.vector_width > 0 &&
        vector_aligned(p, l.args.blocks[0], stage.vector_width, l.args.inputs, l.args.outputs)) {
      l.kernel = find(g, KernelRole::ElementwiseVector);
      b_.counters.vector_launches.fetch_add(1, std::memory_order_relaxed);
      l.work = (l.work + stage.vector_width - 1) / stage.vector_width;
    } else if (stage.row_vector_width > 0 && permute == nullptr &&  // width > 0: the stage has the kernel
               row_vector_eligible(p, l.args.blocks[0], stage.row_vector_width, l.args.inputs, l.args.outputs)) {
      l.kernel = find(g, KernelRole::ElementwiseRowVector);
      b_.counters.row_vector_launches.fetch_add(1, std::memory_order_relaxed);
      l.work /= stage.row_vector_width;  // a whole number of vectors: the innermost dim is a multiple
    }
  }

  // Waits for the stream and reads the kernels' fault word.
  Result<bool> read_fault_word() {
    cudaError_t e =
        cudaMemcpyAsync(fault_host_->data(), fault_->data(), sizeof(int), cudaMemcpyDeviceToHost, stream_->get());
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_->get());
    if (e != cudaSuccess) return cuda_error("checking a kernel's fault word", e);
    int fault = 0;
    std::memcpy(&fault, fault_host_->data(), sizeof fault);
    return fault != 0;
  }

  static std::size_t find(const GeneratedProgram& g, KernelRole r) {
    for (std::size_t i = 0; i < g.kernels.size(); ++i)
      if (g.kernels[i].role == r) return i;
    return g.kernels.size();
  }

  // The reductions the reference refuses (no identity on an empty axis, an integer mean of
  // nothing, an index dtype too narrow) are left to it: the reason, or an empty string.
  static std::string reduce_refused(const FusedProgram& p, const KilnReduceShape& rs) {
    const fusion::Reduction& red = *p.blocks[1].reduction;
    using ir::OpKind;
    const bool arg = red.op == OpKind::Numeric_ArgMax || red.op == OpKind::Numeric_ArgMin;
    const bool no_identity = red.op == OpKind::Numeric_MaxDim || red.op == OpKind::Numeric_MinDim ||
                             red.op == OpKind::Numeric_MaxAbsDim || arg ||
                             (red.op == OpKind::Numeric_MeanDim && !red.input_dtype.is_float());
    if (rs.outputs > 0 && rs.n == 0 && no_identity)
      return fmt::format("{} over an empty axis has no identity", ir::op_info(red.op).variant);
    if (arg && rs.n > 0) {
      const std::size_t bits = red.out_dtype.size_bytes() * 8 - (red.out_dtype.is_int() ? 1 : 0);
      if (bits < 63 && static_cast<std::uint64_t>(rs.n - 1) > (std::uint64_t{1} << bits) - 1)
        return fmt::format("an axis of {} does not fit the index dtype {}", rs.n, red.out_dtype.name());
    }
    return {};
  }

  // Grid sizes: grid-stride kernels get enough blocks to fill the device several times over
  // (8 blocks of 256 threads per SM reach full occupancy on every architecture since sm_75),
  // never more than the work needs.
  dim3 grid_for(ProgramKind kind, KernelRole role, std::uint64_t work, const KilnMatmulShape& ms) const {
    const std::uint64_t fill = static_cast<std::uint64_t>(std::max(1, b_.info.multiprocessors)) * 8;
    switch (role) {
      case KernelRole::Matmul: {
        const auto tiles = [](std::int64_t v) { return static_cast<std::uint64_t>((v + 63) / 64); };
        return dim3(static_cast<unsigned>(std::clamp<std::uint64_t>(tiles(ms.n), 1, 0x7fffffff)),
                    static_cast<unsigned>(std::clamp<std::uint64_t>(tiles(ms.m), 1, 65535)),
                    static_cast<unsigned>(std::clamp<std::uint64_t>(static_cast<std::uint64_t>(ms.batch), 1, 65535)));
      }
      case KernelRole::ReduceRows: return dim3(static_cast<unsigned>(std::clamp<std::uint64_t>(work, 1, fill * 4)));
      default: {
        (void)kind;
        const std::uint64_t blocks = (work + 255) / 256;
        return dim3(static_cast<unsigned>(std::clamp<std::uint64_t>(blocks, 1, fill * 4)));
      }
    }
  }

  // A CUDA error: the launch's outputs carry it (docs/spec/ir.md §11.3), consumed inputs are
  // released. nullopt: the program is done (no replay).
  MaybeFallback fail_with(const FusedProgram& p, const Binding& bind, const Error& err) {
    b_.counters.cuda_errors.fetch_add(1, std::memory_order_relaxed);
    spdlog::error("kiln cuda: {}", err.message);
    const ir::TensorError te = ir::TensorError::make_root(err);
    failure_.note(te);
    for (const fusion::ProgramInput& in : p.inputs) {
      if (in.role == fusion::InputRole::View || in.status != TensorStatus::ReadWrite) continue;
      const ir::TensorIr* g = global_of(bind, in.tensor);
      if (g == nullptr) continue;
      auto& s = b_.shard(g->id);
      MutexLock lock(s.mu);
      ir::TensorIr rw = *g;
      rw.status = TensorStatus::ReadWrite;
      (void)s.table.free(rw);
    }
    for (const fusion::ProgramOutput& out : p.outputs) {
      if (!out.kept) continue;
      const ir::TensorIr* g = global_of(bind, out.tensor);
      if (g == nullptr) continue;
      auto& s = b_.shard(g->id);
      MutexLock lock(s.mu);
      s.table.claim(g->id, te);
    }
    return std::nullopt;
  }

  void commit(const FusedProgram& p, const Binding& bind, std::vector<std::optional<CudaTensor>>& outputs) {
    for (const fusion::ProgramInput& in : p.inputs) {
      if (in.role == fusion::InputRole::View || in.status != TensorStatus::ReadWrite) continue;
      const ir::TensorIr* g = global_of(bind, in.tensor);
      auto& s = b_.shard(g->id);
      MutexLock lock(s.mu);
      ir::TensorIr rw = *g;
      rw.status = TensorStatus::ReadWrite;
      (void)s.table.free(rw);
    }
    for (std::size_t o = 0; o < p.outputs.size(); ++o) {
      const fusion::ProgramOutput& out = p.outputs[o];
      if (!out.written || !out.kept || !outputs[o]) continue;  // temporaries: freed on this stream
      const ir::TensorIr* g = global_of(bind, out.tensor);
      auto& s = b_.shard(g->id);
      MutexLock lock(s.mu);
      s.table.register_handle(g->id, std::move(*outputs[o]));
    }
  }

  // Row-major data is its own reshape: the output shares the input's buffer.
  bool share_reshape(const ir::Operation& op) {
    if (op.inputs().size() != 1 || op.outputs().size() != 1) return false;
    const ir::TensorIr& in = op.inputs()[0];
    const ir::TensorIr& out = op.outputs()[0];
    if (!(in.dtype == out.dtype) || ir::num_elements(in.shape) != ir::num_elements(out.shape)) return false;
    std::optional<CudaTensor> t;
    {
      auto& s = b_.shard(in.id);
      MutexLock lock(s.mu);
      const auto* e = s.table.entry(in.id);
      if (e == nullptr || e->handle() == nullptr || e->handle()->shape != in.shape) return false;
      t = *e->handle();
      (void)s.table.free(in);
    }
    t->shape = out.shape;
    auto& s = b_.shard(out.id);
    MutexLock lock(s.mu);
    s.table.register_handle(out.id, std::move(*t));
    return true;
  }

  // The host fallback: inputs downloaded into a private container, the reference executor,
  // outputs uploaded. Slow, but every operation of the IR runs, with the reference's errors.
  void run_on_host(const ir::Operation& op) {
    b_.counters.host_ops.fetch_add(1, std::memory_order_relaxed);
    ir::HandleContainer<reference::HostTensor> local;
    for (const ir::TensorIr& t : op.inputs()) {
      if (local.has_handle(t.id)) continue;
      std::optional<CudaTensor> dev;
      {
        auto& s = b_.shard(t.id);
        MutexLock lock(s.mu);
        const auto* e = s.table.entry(t.id);
        if (e == nullptr) continue;
        if (const ir::TensorError* err = e->error()) {
          local.claim(t.id, *err);
          continue;
        }
        if (e->handle() != nullptr) dev = *e->handle();
      }
      if (!dev) continue;
      Result<std::vector<std::byte>> bytes = b_.download_tensor(*dev);
      if (bytes.ok()) {
        Result<reference::HostTensor> h = reference::HostTensor::from_bytes(allocator_, dev->shape, dev->dtype, *bytes);
        if (h.ok()) {
          local.register_handle(t.id, std::move(h).value());
          continue;
        }
        local.claim(t.id, ir::TensorError::make_root(h.error()));
      } else {
        local.claim(t.id, ir::TensorError::make_root(bytes.error()));
      }
    }
    const Status st = reference_.execute(op, local);
    if (!st.ok()) spdlog::debug("kiln cuda: host op failed or skipped: {}", st.error().to_string());
    for (const ir::TensorIr& in : op.inputs()) {
      if (in.status != TensorStatus::ReadWrite) continue;
      auto& s = b_.shard(in.id);
      MutexLock lock(s.mu);
      (void)s.table.free(in);
    }
    for (const ir::TensorIr& out : op.outputs()) {
      std::optional<ir::HandleContainer<reference::HostTensor>::Entry> e = local.remove_handle(out.id);
      if (!e) continue;
      std::optional<CudaTensor> dev;
      std::optional<ir::TensorError> err;
      if (reference::HostTensor* h = e->handle()) {
        Result<CudaTensor> up = b_.upload_tensor(h->shape(), h->dtype(), h->bytes());
        if (up.ok())
          dev = std::move(up).value();
        else
          err = ir::TensorError::make_root(up.error());
      } else if (const ir::TensorError* te = e->error()) {
        err = *te;
      }
      if (err) failure_.note(*err);
      auto& s = b_.shard(out.id);
      MutexLock lock(s.mu);
      if (dev)
        s.table.register_handle(out.id, std::move(*dev));
      else if (err)
        s.table.claim(out.id, *err);
    }
  }

  CudaBackend::Impl& b_;
  StreamPtr stream_;
  BufferPtr fault_;                           // one int on the device
  std::unique_ptr<PinnedBuffer> fault_host_;  // its pinned mirror
  reference::HostAllocator allocator_;        // host fallback buffers
  reference::ReferenceExecutor reference_;    // host fallback (owns this stream's RNG)
  fusion::FirstFailure failure_;              // take_failure()
};

}  // namespace

// ---- CudaBackend

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(CudaBackendOptions options) {
  const ProbeResult p = probe();
  if (!p.available()) return make_error(ErrorCode::Unsupported, "CUDA backend: no GPU: " + p.reason);
  if (options.device < 0 || static_cast<std::size_t>(options.device) >= p.devices.size())
    return make_error(ErrorCode::Unsupported,
                      fmt::format("CUDA backend: no device {} ({} found)", options.device, p.devices.size()));
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->info = p.devices[static_cast<std::size_t>(options.device)];
  impl->budget->limit = options.byte_limit;
  if (!impl->info.memory_pools)
    return make_error(ErrorCode::Unsupported,
                      fmt::format("CUDA backend: {} has no stream-ordered memory pools", impl->info.name));
  KILN_RETURN_IF_ERROR(impl->set_device());
  KILN_CUDA_TRY("getting the memory pool", cudaDeviceGetDefaultMemPool(&impl->pool, options.device));
  // Keep freed memory in the pool (a caching allocator, as PyTorch's): the default threshold 0
  // returns it to the driver at every synchronisation, and re-mapping costs more than a kernel.
  std::uint64_t keep = ~std::uint64_t{0};
  KILN_CUDA_TRY("configuring the memory pool",
                cudaMemPoolSetAttribute(impl->pool, cudaMemPoolAttrReleaseThreshold, &keep));
  KILN_ASSIGN_OR_RETURN(impl->transfer, CudaStream::create());
  {
    KILN_ASSIGN_OR_RETURN(auto staging, PinnedBuffer::create(std::max<std::size_t>(options.staging_bytes, 4096)));
    MutexLock lock(impl->staging_mu);  // not shared yet: the lock only states the rule
    impl->staging = std::move(staging);
  }
  if (options.fast_math) {
    impl->codegen.fast_math = *options.fast_math;
  } else if (const char* env = std::getenv("KILN_CUDA_FAST_MATH"); env != nullptr) {
    impl->codegen.fast_math = std::string_view(env) == "1";
  }
  impl->compile.arch = impl->info.arch();
  // Architectures newer than this NVRTC knows get PTX for the newest it knows (the driver JITs).
  const std::vector<int> archs = nvrtc_supported_archs();
  if (!archs.empty() && std::find(archs.begin(), archs.end(), impl->compile.arch) == archs.end()) {
    impl->compile.arch = archs.back();
    impl->compile.cubin = false;
  }
  if (options.disk_cache) {
    Result<DiskCache> d = DiskCache::open(options.cache_dir.value_or(DiskCache::default_dir()), current_versions());
    if (d.ok())
      impl->disk = std::move(d).value();
    else
      spdlog::warn("kiln cuda: no on-disk kernel cache: {}", d.error().message);
  }
  spdlog::info("kiln cuda: device {}: {} (sm_{}), kernels for {}_{}{}", options.device, impl->info.name,
               impl->info.arch(), impl->compile.cubin ? "sm" : "compute", impl->compile.arch,
               impl->codegen.fast_math ? ", fast f32 exp/log" : "");
  return std::unique_ptr<CudaBackend>(new CudaBackend(std::move(impl)));
}

CudaBackend::CudaBackend(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaBackend::~CudaBackend() {
  if (impl_) {
    (void)impl_->set_device();
    (void)cudaDeviceSynchronize();  // buffers still in flight are freed stream-ordered below
  }
}

std::unique_ptr<fusion::Executor> CudaBackend::make_executor() {
  (void)impl_->set_device();
  Result<StreamPtr> s = CudaStream::create();
  Result<std::unique_ptr<PinnedBuffer>> host = PinnedBuffer::create(sizeof(int));
  Result<BufferPtr> fault =
      s.ok() ? DeviceBuffer::allocate(nullptr, impl_->pool, sizeof(int), *s) : Result<BufferPtr>(s.error());
  if (!s.ok() || !host.ok() || !fault.ok()) {
    // The interface has no error channel here; an executor without a stream would be worse
    // than failing loudly at the first kernel, so the transfer stream serves (correct, serial).
    spdlog::error("kiln cuda: a stream's resources could not be created; it shares the transfer stream");
    Result<std::unique_ptr<PinnedBuffer>> h2 = PinnedBuffer::create(sizeof(int));
    Result<BufferPtr> f2 = DeviceBuffer::allocate(nullptr, impl_->pool, sizeof(int), impl_->transfer);
    return std::make_unique<CudaStreamExecutor>(*impl_, impl_->transfer, f2.ok() ? *f2 : nullptr,
                                                h2.ok() ? std::move(h2).value() : nullptr);
  }
  return std::make_unique<CudaStreamExecutor>(*impl_, *s, std::move(fault).value(), std::move(host).value());
}

fusion::FuserList CudaBackend::fusers(const fusion::FusionLog& log, const fusion::FuserOptions& options) const {
  return fusion::default_fusers(log, options);
}

Status CudaBackend::upload(ir::TensorId id, ir::DType dtype, ir::Shape shape, std::span<const std::byte> bytes) {
  KILN_RETURN_IF_ERROR(impl_->set_device());
  Result<CudaTensor> t = impl_->upload_tensor(shape, dtype, bytes);
  if (!t.ok()) return make_error(t.error().code, "upload of " + id.to_string() + ": " + t.error().message);
  auto& s = impl_->shard(id);
  MutexLock lock(s.mu);
  s.table.register_handle(id, std::move(t).value());
  return Status::Ok();
}

Status CudaBackend::claim_error(ir::TensorId id, const ir::TensorError& error) {
  auto& s = impl_->shard(id);
  MutexLock lock(s.mu);
  if (s.table.has_handle(id))
    return make_error(ErrorCode::InvalidHandle, "claim_error: " + id.to_string() + " has an entry already");
  s.table.claim(id, error);
  return Status::Ok();
}

Result<runtime::HostData> CudaBackend::download(const ir::TensorIr& t) {
  KILN_RETURN_IF_ERROR(impl_->set_device());
  std::optional<CudaTensor> dev;
  {
    auto& s = impl_->shard(t.id);
    MutexLock lock(s.mu);
    const auto* e = s.table.entry(t.id);
    if (e == nullptr || e->is_not_init())
      return make_error(ErrorCode::InvalidHandle,
                        "read of " + t.to_string() + ": the tensor has no value on the device");
    if (const ir::TensorError* err = e->error()) {
      Error out = make_error(ErrorCode::Execution, "read of " + t.id.to_string() + ": " + err->to_string());
      (void)s.table.free(t);
      return out;
    }
    dev = *e->handle();  // shares the buffer past the unlock
    (void)s.table.free(t);
  }
  KILN_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, impl_->download_tensor(*dev));
  return runtime::HostData{dev->dtype, dev->shape, std::move(bytes)};
}

bool CudaBackend::is_materialized(ir::TensorId id) const {
  const auto& s = impl_->shard(id);
  MutexLock lock(s.mu);
  const auto* e = s.table.entry(id);
  return e != nullptr && e->is_existing();
}

std::optional<ir::TensorError> CudaBackend::error_of(ir::TensorId id) const {
  const auto& s = impl_->shard(id);
  MutexLock lock(s.mu);
  const ir::TensorError* e = s.table.error_of(id);
  return e ? std::optional<ir::TensorError>(*e) : std::nullopt;
}

void CudaBackend::free(const ir::TensorIr& t) {
  if (t.status != TensorStatus::ReadWrite) return;
  auto& s = impl_->shard(t.id);
  MutexLock lock(s.mu);
  (void)s.table.free(t);
}

Status CudaBackend::alias(ir::TensorId src, ir::TensorId dst) {
  std::optional<CudaTensor> handle;
  std::optional<ir::TensorError> error;
  {
    auto& s = impl_->shard(src);
    MutexLock lock(s.mu);
    const auto* e = s.table.entry(src);
    if (e != nullptr && e->handle() != nullptr) handle = *e->handle();
    if (e != nullptr && e->error() != nullptr) error = *e->error();
  }
  if (!handle && !error)
    return make_error(ErrorCode::InvalidHandle,
                      "shared view " + dst.to_string() + " of " + src.to_string() + ": the source has no value");
  auto& d = impl_->shard(dst);
  MutexLock lock(d.mu);
  if (handle)
    d.table.register_handle(dst, std::move(*handle));
  else
    d.table.claim(dst, std::move(*error));
  return Status::Ok();
}

runtime::MemoryStats CudaBackend::memory_stats() const {
  runtime::MemoryStats m;
  for (const auto& s : impl_->shards) {
    MutexLock lock(s.mu);
    m.tensors += s.table.num_handles();
    m.errored += s.table.errored();
  }
  std::uint64_t used = 0;
  if (cudaMemPoolGetAttribute(impl_->pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess) m.bytes_in_use = used;
  return m;
}

CudaStats CudaBackend::stats() const {
  const Counters& c = impl_->counters;
  auto ld = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  CudaStats s;
  s.fused_launches = ld(c.fused_launches);
  for (std::size_t i = 0; i < fusion::kNumProgramKinds; ++i) s.launches_by_kind[i] = ld(c.by_kind[i]);
  s.vector_launches = ld(c.vector_launches);
  s.row_vector_launches = ld(c.row_vector_launches);
  s.row_kernel_launches = ld(c.row_kernel_launches);
  s.row_warp_kernel_launches = ld(c.row_warp_kernel_launches);
  s.row_window_launches = ld(c.row_window_launches);
  s.single_op_kernels = ld(c.single_op_kernels);
  s.host_ops = ld(c.host_ops);
  s.fused_replays = ld(c.fused_replays);
  for (std::size_t r = 0; r < s.fallbacks_by_reason.size(); ++r)
    s.fallbacks_by_reason[r] = ld(c.fallbacks_by_reason[r]);
  s.faults = ld(c.faults);
  s.quarantined = ld(c.quarantined);
  s.cuda_errors = ld(c.cuda_errors);
  s.kernel_cache_hits = ld(c.kernel_cache_hits);
  s.kernel_cache_misses = ld(c.kernel_cache_misses);
  s.disk_cache_hits = ld(c.disk_cache_hits);
  s.compile_failures = ld(c.compile_failures);
  s.cross_stream_waits = ld(c.cross_stream_waits);
  std::uint64_t v = 0;
  if (cudaMemPoolGetAttribute(impl_->pool, cudaMemPoolAttrUsedMemCurrent, &v) == cudaSuccess) s.pool_used_bytes = v;
  if (cudaMemPoolGetAttribute(impl_->pool, cudaMemPoolAttrReservedMemCurrent, &v) == cudaSuccess)
    s.pool_reserved_bytes = v;
  if (cudaMemPoolGetAttribute(impl_->pool, cudaMemPoolAttrUsedMemHigh, &v) == cudaSuccess) s.pool_used_high = v;
  return s;
}

const DeviceInfo& CudaBackend::device_info() const { return impl_->info; }

Status CudaBackend::synchronize() {
  KILN_RETURN_IF_ERROR(impl_->set_device());
  KILN_CUDA_TRY("synchronizing the device", cudaDeviceSynchronize());
  return Status::Ok();
}

}  // namespace kiln::cuda

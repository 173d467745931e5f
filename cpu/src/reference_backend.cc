// The reference CPU backend (kiln/cpu/reference_backend.h).
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "kiln/cpu/reference_backend.h"
#include "kiln/fusion/fusers.h"

namespace kiln::cpu {
namespace {

// One stream's executor: its own ReferenceExecutor (random generator), the backend's shared
// table. Called by one stream actor at a time.
class ReferenceStreamExecutor final : public fusion::Executor {
 public:
  ReferenceStreamExecutor(ReferenceCpuBackend& backend, std::uint64_t seed)
      : backend_(backend), exec_(backend.allocator(), seed) {}

  // The reference backend has no fused kernels: a fused optimization replays the operations it
  // covers, in the optimization's order (the fast CPU executor will replace this).
  void execute_optimization(const fusion::Optimization& opt, const fusion::ExecutionContext& ctx) override {
    for (std::size_t i = 0; i < opt.len(); ++i) execute_operation(ctx.operation_within_optimization(i));
  }
  void execute_operation(const ir::Operation& op) override {
    Status st = backend_.run_operation(op, exec_);
    // A failure is recorded on the outputs (Errored) and reported when they are read; the log
    // line helps whoever debugs the stream.
    if (st.ok()) return;
    spdlog::debug("kiln runtime: op failed or skipped: {}", st.error().to_string());
    for (const ir::TensorIr& out : op.outputs())
      if (std::optional<ir::TensorError> e = backend_.error_of(out.id)) failure_.note(*e);
  }
  void free_tensor(const ir::TensorIr& t) override { backend_.free(t); }
  std::optional<ir::TensorError> take_failure() override { return failure_.take(); }

 private:
  ReferenceCpuBackend& backend_;
  ReferenceExecutor exec_;
  fusion::FirstFailure failure_;
};

}  // namespace

ReferenceCpuBackend::ReferenceCpuBackend(HostAllocatorOptions alloc_options) : allocator_(alloc_options) {}

// The tables hold buffers of allocator_; they are declared after it and destroyed first.
ReferenceCpuBackend::~ReferenceCpuBackend() = default;

std::unique_ptr<fusion::Executor> ReferenceCpuBackend::make_executor() {
  return std::make_unique<ReferenceStreamExecutor>(*this, next_seed_.fetch_add(1, std::memory_order_relaxed));
}

fusion::FuserList ReferenceCpuBackend::fusers(const fusion::FusionLog& log, const fusion::FuserOptions& options) const {
  return fusion::default_fusers(log, options);
}

Status ReferenceCpuBackend::upload(ir::TensorId id, ir::DType dtype, ir::Shape shape,
                                   std::span<const std::byte> bytes) {
  return table_.upload(allocator_, id, dtype, std::move(shape), bytes);
}

Status ReferenceCpuBackend::claim_error(ir::TensorId id, const ir::TensorError& error) {
  return table_.claim_error(id, error);
}

Result<HostData> ReferenceCpuBackend::download(const ir::TensorIr& t) { return table_.download(t); }
bool ReferenceCpuBackend::is_materialized(ir::TensorId id) const { return table_.is_materialized(id); }
std::optional<ir::TensorError> ReferenceCpuBackend::error_of(ir::TensorId id) const { return table_.error_of(id); }
void ReferenceCpuBackend::free(const ir::TensorIr& t) { table_.free(t); }
Status ReferenceCpuBackend::alias(ir::TensorId src, ir::TensorId dst) { return table_.alias(src, dst); }

MemoryStats ReferenceCpuBackend::memory_stats() const {
  MemoryStats stats = table_.counts();
  stats.bytes_in_use = allocator_.stats().bytes_in_use;
  return stats;
}

std::uint64_t ReferenceCpuBackend::release_idle_memory() { return allocator_.release_idle(); }

Status ReferenceCpuBackend::run_operation(const ir::Operation& op, ReferenceExecutor& exec) {
  using Container = ShardedTensorTable::Container;
  // 1. Copy the entries the op reads into a private container (handles share their buffers;
  //    errors share their roots). Only this stream names these ids (docs/spec/fusion.md §16.5: no queue
  //    holds another stream's id), so nothing changes them between here and step 3.
  Container local;
  for (const ir::TensorIr& t : op.nodes()) {
    if (local.has_handle(t.id)) continue;
    std::optional<ShardedTensorTable::Entry> e = table_.copy_entry(t.id);
    if (!e) continue;
    if (const HostTensor* h = e->handle())
      local.register_handle(t.id, *h);
    else if (const ir::TensorError* err = e->error())
      local.claim(t.id, *err);
  }
  // 2. Run it outside every lock.
  Status st = exec.execute(op, local);
  // 3. Publish: consumed (ReadWrite) inputs leave the table, outputs (values or claims) enter it.
  for (const ir::TensorIr& in : op.inputs()) table_.free(in);
  for (const ir::TensorIr& out : op.outputs()) {
    std::optional<ShardedTensorTable::Entry> e = local.remove_handle(out.id);
    if (e) table_.put(out.id, std::move(*e));
  }
  return st;
}

}  // namespace kiln::cpu

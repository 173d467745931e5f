// The reference CPU backend (kiln/cpu/reference_backend.h).
#include <cstring>
#include <utility>

#include <spdlog/spdlog.h>

#include "kiln/fusion/fusers.h"
#include "kiln/cpu/reference_backend.h"

namespace kiln::cpu {
namespace {

// One stream's executor: its own ReferenceExecutor (random generator), the backend's shared
// table. Called by one stream actor at a time.
class ReferenceStreamExecutor final : public fusion::Executor {
 public:
  explicit ReferenceStreamExecutor(ReferenceCpuBackend& backend)
      : backend_(backend), exec_(backend.allocator()) {}

  // The reference backend has no fused kernels: a fused optimization replays the operations it
  // covers, in the optimization's order (the fast CPU executor will replace this).
  void execute_optimization(const fusion::Optimization& opt, const fusion::ExecutionContext& ctx) override {
    for (std::size_t i = 0; i < opt.len(); ++i) execute_operation(ctx.operation_within_optimization(i));
  }
  void execute_operation(const ir::Operation& op) override {
    Status st = backend_.run_operation(op, exec_);
    // A failure is recorded on the outputs (Errored) and reported when they are read; the log
    // line helps whoever debugs the stream.
    if (!st.ok()) spdlog::debug("kiln runtime: op failed or skipped: {}", st.error().to_string());
  }
  void free_tensor(const ir::TensorIr& t) override { backend_.free(t); }

 private:
  ReferenceCpuBackend& backend_;
  ReferenceExecutor exec_;
};

}  // namespace

ReferenceCpuBackend::ReferenceCpuBackend(CpuAllocatorOptions alloc_options) : allocator_(alloc_options) {}

// The tables hold buffers of allocator_; they are declared after it and destroyed first.
ReferenceCpuBackend::~ReferenceCpuBackend() = default;

std::unique_ptr<fusion::Executor> ReferenceCpuBackend::make_executor() {
  return std::make_unique<ReferenceStreamExecutor>(*this);
}

fusion::FuserList ReferenceCpuBackend::fusers(const fusion::FusionLog& log) const {
  return fusion::default_fusers(log, fusion::FuserOptions{});
}

Status ReferenceCpuBackend::upload(ir::TensorId id, ir::DType dtype, ir::Shape shape,
                                   std::span<const std::byte> bytes) {
  Result<CpuTensor> t = CpuTensor::from_bytes(allocator_, shape, dtype, bytes);
  if (!t.ok()) return make_error(t.error().code, "upload of " + id.to_string() + ": " + t.error().message);
  Shard& s = shard(id);
  std::lock_guard lock(s.mu);
  s.table.register_handle(id, std::move(t).value());
  return Status::Ok();
}

Result<HostData> ReferenceCpuBackend::download(const ir::TensorIr& t) {
  Shard& s = shard(t.id);
  std::unique_lock lock(s.mu);
  const Container::Entry* e = s.table.entry(t.id);
  if (e == nullptr || e->is_not_init())
    return make_error(ErrorCode::InvalidHandle, "read of " + t.to_string() + ": the tensor has no value on the device");
  if (const ir::TensorError* err = e->error()) {
    Error out = make_error(ErrorCode::Execution, "read of " + t.id.to_string() + ": " + err->to_string());
    s.table.free(t);
    return out;
  }
  // Keep the buffer alive past the unlock: the copy shares it (CpuTensor holds a shared_ptr).
  CpuTensor tensor = *e->handle();
  s.table.free(t);
  lock.unlock();
  HostData data{tensor.dtype(), tensor.shape(), {}};
  std::span<const std::byte> bytes = tensor.bytes();
  data.bytes.assign(bytes.begin(), bytes.end());
  return data;
}

bool ReferenceCpuBackend::is_materialized(ir::TensorId id) const {
  const Shard& s = shard(id);
  std::lock_guard lock(s.mu);
  const Container::Entry* e = s.table.entry(id);
  return e != nullptr && e->is_existing();
}

std::optional<ir::TensorError> ReferenceCpuBackend::error_of(ir::TensorId id) const {
  const Shard& s = shard(id);
  std::lock_guard lock(s.mu);
  const ir::TensorError* e = s.table.error_of(id);
  return e ? std::optional<ir::TensorError>(*e) : std::nullopt;
}

void ReferenceCpuBackend::free(const ir::TensorIr& t) {
  if (t.status != ir::TensorStatus::ReadWrite) return;
  Shard& s = shard(t.id);
  std::lock_guard lock(s.mu);
  (void)s.table.free(t);
}

Status ReferenceCpuBackend::alias(ir::TensorId src, ir::TensorId dst) {
  std::optional<CpuTensor> handle;
  std::optional<ir::TensorError> error;
  {
    Shard& s = shard(src);
    std::lock_guard lock(s.mu);
    const Container::Entry* e = s.table.entry(src);
    if (e != nullptr && e->handle() != nullptr) handle = *e->handle();
    if (e != nullptr && e->error() != nullptr) error = *e->error();
  }
  if (!handle && !error)
    return make_error(ErrorCode::InvalidHandle,
                      "shared view " + dst.to_string() + " of " + src.to_string() + ": the source has no value");
  Shard& d = shard(dst);
  std::lock_guard lock(d.mu);
  if (handle)
    d.table.register_handle(dst, std::move(*handle));
  else
    d.table.claim(dst, std::move(*error));  // same root, same depth (ir.md §11.3)
  return Status::Ok();
}

MemoryStats ReferenceCpuBackend::memory_stats() const {
  MemoryStats stats;
  for (const Shard& s : shards_) {
    std::lock_guard lock(s.mu);
    stats.tensors += s.table.num_handles();
    stats.errored += s.table.errored();
  }
  stats.bytes_in_use = allocator_.stats().bytes_in_use;
  return stats;
}

Status ReferenceCpuBackend::run_operation(const ir::Operation& op, ReferenceExecutor& exec) {
  // 1. Copy the entries the op reads into a private container (handles share their buffers;
  //    errors share their roots). Only this stream names these ids (fusion.md §16.5: no queue
  //    holds another stream's id), so nothing changes them between here and step 3.
  Container local;
  for (const ir::TensorIr& t : op.nodes()) {
    if (local.has_handle(t.id)) continue;
    Shard& s = shard(t.id);
    std::lock_guard lock(s.mu);
    const Container::Entry* e = s.table.entry(t.id);
    if (e == nullptr) continue;
    if (const CpuTensor* h = e->handle())
      local.register_handle(t.id, *h);
    else if (const ir::TensorError* err = e->error())
      local.claim(t.id, *err);
  }
  // 2. Run it outside every lock.
  Status st = exec.execute(op, local);
  // 3. Publish: consumed (ReadWrite) inputs leave the table, outputs (values or claims) enter it.
  for (const ir::TensorIr& in : op.inputs()) {
    if (in.status != ir::TensorStatus::ReadWrite) continue;
    Shard& s = shard(in.id);
    std::lock_guard lock(s.mu);
    (void)s.table.free(in);
  }
  for (const ir::TensorIr& out : op.outputs()) {
    std::optional<Container::Entry> e = local.remove_handle(out.id);
    if (!e) continue;
    Shard& s = shard(out.id);
    std::lock_guard lock(s.mu);
    if (CpuTensor* h = e->handle())
      s.table.register_handle(out.id, std::move(*h));
    else if (const ir::TensorError* err = e->error())
      s.table.claim(out.id, *err);
  }
  return st;
}

}  // namespace kiln::cpu

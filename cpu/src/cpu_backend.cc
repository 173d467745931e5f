// The fast CPU runtime backend (kiln/cpu/cpu_backend.h).
#include "kiln/cpu/cpu_backend.h"

#include <algorithm>

#include "kiln/cpu/cpu_executor.h"
#include "kiln/fusion/fusers.h"

namespace kiln::cpu {
namespace {

using Entry = ShardedTensorTable::Entry;

// One stream's executor: a private container staged around every call, its own reference
// executor (random generator), the backend's shared device (kernels, arena, counters).
class CpuStreamExecutor final : public fusion::Executor {
 public:
  CpuStreamExecutor(CpuDevice& device, ShardedTensorTable& table, std::uint64_t seed)
      : table_(table), reference_(device.allocator(), seed), exec_(device, local_, reference_) {}

  void execute_optimization(const fusion::Optimization& opt, const fusion::ExecutionContext& ctx) override {
    begin();
    for (std::size_t i = 0; i < opt.len(); ++i) stage(ctx.operation_within_optimization(i));
    exec_.execute_optimization(opt, ctx);
    for (std::size_t i = 0; i < opt.len(); ++i) publish_outputs(ctx.operation_within_optimization(i));
    end();
  }

  void execute_operation(const ir::Operation& op) override {
    begin();
    stage(op);
    exec_.execute_operation(op);
    publish_outputs(op);
    end();
  }

  void free_tensor(const ir::TensorIr& t) override { table_.free(t); }
  std::optional<ir::TensorError> take_failure() override { return failure_.take(); }

 private:
  struct Staged {
    ir::TensorId id;
    bool taken;  // moved out of the table (the tensor's last use consumes it)
  };

  void begin() {
    staged_.clear();
    produced_.clear();
  }

  // Copies in (or moves in, for a consuming use) every input not produced earlier in the call.
  void stage(const ir::Operation& op) {
    const auto inputs = op.inputs();
    for (const ir::TensorIr& in : inputs) {
      if (std::find(produced_.begin(), produced_.end(), in.id) != produced_.end()) continue;
      auto it = std::find_if(staged_.begin(), staged_.end(), [&](const Staged& s) { return s.id == in.id; });
      if (it != staged_.end()) {
        // Read before, consumed now: take the table's entry too, so the buffer has one owner.
        if (in.status == ir::TensorStatus::ReadWrite && !it->taken) {
          (void)table_.take(in.id);
          it->taken = true;
        }
        continue;
      }
      const bool consume = in.status == ir::TensorStatus::ReadWrite;
      std::optional<Entry> e = consume ? table_.take(in.id) : table_.copy_entry(in.id);
      staged_.push_back({in.id, consume});
      if (!e) continue;
      if (HostTensor* h = e->handle())
        local_.register_handle(in.id, std::move(*h));
      else if (const ir::TensorError* err = e->error())
        local_.claim(in.id, *err);
    }
    for (const ir::TensorIr& out : op.outputs()) produced_.push_back(out.id);
  }

  void publish_outputs(const ir::Operation& op) {
    for (const ir::TensorIr& out : op.outputs()) {
      std::optional<Entry> e = local_.remove_handle(out.id);
      if (!e) continue;
      if (const ir::TensorError* err = e->error()) failure_.note(*err);
      table_.put(out.id, std::move(*e));
    }
  }

  void end() {
    // A taken entry still here was not consumed after all (cannot happen on the success or the
    // error path, where a ReadWrite use always releases it): give it back rather than lose it.
    for (const Staged& s : staged_) {
      std::optional<Entry> e = local_.remove_handle(s.id);
      if (e && s.taken) table_.put(s.id, std::move(*e));
    }
    // Anything else left (a view the executor registered and did not release) is dropped with
    // the copies; the container is empty for the next call.
    for (ir::TensorId id : local_.handle_ids()) (void)local_.remove_handle(id);
  }

  ShardedTensorTable& table_;
  CpuDevice::Handles local_;
  ReferenceExecutor reference_;
  CpuExecutor exec_;
  std::vector<Staged> staged_;
  std::vector<ir::TensorId> produced_;
  fusion::FirstFailure failure_;
};

}  // namespace

CpuBackend::CpuBackend(const CpuBackendOptions& options)
    : options_(options),
      device_(CpuDeviceOptions{.threads = options.threads,
                               .allocator = options.allocator,
                               .seed = options.seed,
                               .jit = options.jit,
                               .jit_cache_dir = options.jit_cache_dir}),
      next_seed_(options.seed) {}

CpuBackend::~CpuBackend() = default;

std::unique_ptr<fusion::Executor> CpuBackend::make_executor() {
  return std::make_unique<CpuStreamExecutor>(device_, table_, next_seed_.fetch_add(1, std::memory_order_relaxed));
}

fusion::FuserList CpuBackend::fusers(const fusion::FusionLog& log, const fusion::FuserOptions& options) const {
  return fusion::default_fusers(log, options);
}

Status CpuBackend::upload(ir::TensorId id, ir::DType dtype, ir::Shape shape, std::span<const std::byte> bytes) {
  return table_.upload(device_.allocator(), id, dtype, std::move(shape), bytes);
}

Status CpuBackend::claim_error(ir::TensorId id, const ir::TensorError& error) { return table_.claim_error(id, error); }

Result<runtime::HostData> CpuBackend::download(const ir::TensorIr& t) { return table_.download(t); }
bool CpuBackend::is_materialized(ir::TensorId id) const { return table_.is_materialized(id); }
std::optional<ir::TensorError> CpuBackend::error_of(ir::TensorId id) const { return table_.error_of(id); }
void CpuBackend::free(const ir::TensorIr& t) { table_.free(t); }
Status CpuBackend::alias(ir::TensorId src, ir::TensorId dst) { return table_.alias(src, dst); }

runtime::MemoryStats CpuBackend::memory_stats() const {
  runtime::MemoryStats stats = table_.counts();
  stats.bytes_in_use = device_.allocator().stats().bytes_in_use;
  return stats;
}

std::uint64_t CpuBackend::release_idle_memory() { return device_.allocator().release_idle(); }

}  // namespace kiln::cpu

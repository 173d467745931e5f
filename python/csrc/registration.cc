// What makes PrivateUse1 a device PyTorch can use: the device guard, the accelerator hooks, the
// counted boxed CPU fallback for every aten op kiln does not lower, and the extension's own
// Python surface, torch.ops.kiln.* (no Python headers: custom ops are the whole interface).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/add.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <tuple>
#include <vector>

#include "state.h"
#include "tensor_impl.h"

namespace kiln::pytorch {
namespace {

// ---- The device guard: one device, kiln:0, one default stream. PyTorch's autograd engine asks
// it for the device count (and runs kiln's backward ops on a thread of its own for the device).
struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kKilnDevice; }
  c10::Device exchangeDevice(c10::Device) const override { return {kKilnDevice, 0}; }
  c10::Device getDevice() const override { return {kKilnDevice, 0}; }
  void setDevice(c10::Device d) const override { TORCH_CHECK(d.index() <= 0, "kiln has one device, kiln:0"); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// ---- What at::globalContext() asks of an accelerator.
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  at::Device getDeviceFromPtr(void*) const override { return {kKilnDevice, 0}; }
  // Random ops fall back to the CPU, so the CPU generator is the one they draw from:
  // torch.manual_seed + torch.randn(device="kiln") give the CPU's numbers.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
};

[[maybe_unused]] const bool hooks_registered = [] {
  static Hooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();

// ---- The boxed fallback: every aten op kiln does not register runs on the CPU (its kiln
// inputs read back, its outputs sent to kiln), counted by "aten::name.overload" and warned once
// per name. Correct, but each call syncs what its inputs depend on.
void counted_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::OperatorName& n = op.operator_name();
  note_fallback(n.name + (n.overload_name.empty() ? "" : "." + n.overload_name));
  at::native::cpu_fallback(op, stack);
}

// ---- torch.ops.kiln.*
std::tuple<std::vector<std::string>, std::vector<std::int64_t>> fallback_stats() {
  std::tuple<std::vector<std::string>, std::vector<std::int64_t>> out;
  for (const auto& [name, calls] : fallback_counts()) {
    std::get<0>(out).push_back(name);
    std::get<1>(out).push_back(calls);
  }
  return out;
}

// Host cost of one small aten op on kiln called from C++ (queued, not executed): the mean
// nanoseconds per at::add(a, b) over n calls, after one warm-up call, by the wall clock and by the
// calling thread's CPU clock (what the caller itself spent: on a shared core the wall time also
// holds the actor's work on the queued ops). Works on any device, so the same loop times CPU
// eager dispatch.
std::tuple<double, double> bench_add(const at::Tensor& a, const at::Tensor& b, std::int64_t n) {
  auto thread_cpu_ns = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
  };
  at::Tensor r = at::add(a, b);
  const double cpu0 = thread_cpu_ns();
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < n; ++i) r = at::add(a, b);
  const auto t1 = std::chrono::steady_clock::now();
  const double cpu1 = thread_cpu_ns();
  const double calls = static_cast<double>(n);
  return {std::chrono::duration<double, std::nano>(t1 - t0).count() / calls, (cpu1 - cpu0) / calls};
}

// Where the tensors live (kiln.device_info()): (started, the kilnd's socket or "", client id or -1).
std::tuple<bool, std::string, std::int64_t> device_info() {
  const Placement p = placement();
  return {p.started, p.socket, p.client_id};
}

// For the tests of lazy error reporting: queues a Custom op, which kiln accepts (no inference)
// and no backend can run, so the failure shows at the first read or sync that waits on it.
at::Tensor failing_op(const at::Tensor& x) {
  const runtime::Tensor& v = value_of(x, "_failing_op");
  runtime::Tensor out = value_or_throw(session().custom("kiln_test_failure", {v}, v.shape(), v.dtype()), "_failing_op");
  return make_tensor(std::move(out), x.sizes());
}

// kiln.all_reduce: the front end's all_reduce of a kiln tensor (docs/distributed.md): across the
// daemons of the job when this process's daemon spans daemons for its job, the identity
// otherwise. `op`: sum, mean, min, max, prod.
ir::ReduceOperation reduce_operation_named(const std::string& op, const char* what) {
  static constexpr std::pair<const char*, ir::ReduceOperation> kOps[] = {{"sum", ir::ReduceOperation::Sum},
                                                                         {"mean", ir::ReduceOperation::Mean},
                                                                         {"min", ir::ReduceOperation::Min},
                                                                         {"max", ir::ReduceOperation::Max},
                                                                         {"prod", ir::ReduceOperation::Prod}};
  const auto* found = std::find_if(std::begin(kOps), std::end(kOps), [&op](const auto& k) { return op == k.first; });
  TORCH_CHECK(found != std::end(kOps), "kiln.", what, ": op '", op, "' is not one of sum, mean, min, max, prod");
  return found->second;
}

at::Tensor all_reduce(const at::Tensor& x, const std::string& op) {
  const ir::ReduceOperation reduce_op = reduce_operation_named(op, "all_reduce");
  const runtime::Tensor& v = value_of(x, "all_reduce");
  runtime::Tensor out = value_or_throw(session().all_reduce(v, reduce_op, {}), "all_reduce");
  return make_tensor(std::move(out), x.sizes());
}

// The world of `world` ranks, as the device ids kiln's collectives name (the index is the rank).
std::vector<ir::build::DeviceId> ranks_of(std::int64_t world, const char* what) {
  TORCH_CHECK(world >= 1 && world <= 0xffff, "kiln.", what, ": a world of ", world, " ranks");
  std::vector<ir::build::DeviceId> ids;
  for (std::int64_t r = 0; r < world; ++r) ids.push_back({0, static_cast<std::uint16_t>(r)});
  return ids;
}

// kiln.broadcast / all_gather / reduce_scatter (kiln's collectives, docs/distributed.md): the
// torch.distributed "kiln" backend calls them with its world's size.
at::Tensor broadcast(const at::Tensor& x, std::int64_t root, std::int64_t world) {
  TORCH_CHECK(root >= 0 && root < world, "kiln.broadcast: root ", root, " is not a rank of a world of ", world);
  const runtime::Tensor& v = value_of(x, "broadcast");
  runtime::Tensor out = value_or_throw(
      session().broadcast(v, static_cast<std::uint64_t>(root), ranks_of(world, "broadcast")), "broadcast");
  return make_tensor(std::move(out), x.sizes());
}

at::Tensor all_gather(const at::Tensor& x, std::int64_t world) {
  TORCH_CHECK(x.dim() >= 1, "kiln.all_gather: gathers along dim 0, the tensor has none");
  const runtime::Tensor& v = value_of(x, "all_gather");
  runtime::Tensor out = value_or_throw(session().all_gather(v, 0, ranks_of(world, "all_gather")), "all_gather");
  std::vector<std::int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes[0] *= world;
  return make_tensor(std::move(out), sizes);
}

at::Tensor reduce_scatter(const at::Tensor& x, const std::string& op, std::int64_t world) {
  TORCH_CHECK(x.dim() >= 1 && world >= 1 && x.size(0) % world == 0, "kiln.reduce_scatter: dim 0 of ", x.sizes(),
              " does not divide into ", world, " parts");
  const ir::ReduceOperation reduce_op = reduce_operation_named(op, "reduce_scatter");
  const runtime::Tensor& v = value_of(x, "reduce_scatter");
  runtime::Tensor out =
      value_or_throw(session().reduce_scatter(v, reduce_op, 0, ranks_of(world, "reduce_scatter")), "reduce_scatter");
  std::vector<std::int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes[0] /= world;
  return make_tensor(std::move(out), sizes);
}

}  // namespace
}  // namespace kiln::pytorch

TORCH_LIBRARY(kiln, m) {
  m.def("fallback_stats() -> (str[], int[])", &kiln::pytorch::fallback_stats);
  m.def("reset_stats() -> ()", &kiln::pytorch::reset_fallback_counts);
  m.def("synchronize() -> ()", &kiln::pytorch::synchronize);
  m.def("shutdown() -> ()", &kiln::pytorch::shutdown);
  m.def("bench_add(Tensor a, Tensor b, int n) -> (float, float)", &kiln::pytorch::bench_add);
  m.def("connect(str path, str job) -> ()", &kiln::pytorch::connect);
  m.def("device_info() -> (bool, str, int)", &kiln::pytorch::device_info);
  m.def("daemon_status(bool json) -> str", &kiln::pytorch::daemon_status);
  m.def("_failing_op(Tensor x) -> Tensor");
  m.def("all_reduce(Tensor x, str op) -> Tensor");
  m.def("broadcast(Tensor x, int root, int world) -> Tensor");
  m.def("all_gather(Tensor x, int world) -> Tensor");
  m.def("reduce_scatter(Tensor x, str op, int world) -> Tensor");
}

TORCH_LIBRARY_IMPL(kiln, PrivateUse1, m) {
  m.impl("_failing_op", TORCH_FN(kiln::pytorch::failing_op));
  m.impl("all_reduce", TORCH_FN(kiln::pytorch::all_reduce));
  m.impl("broadcast", TORCH_FN(kiln::pytorch::broadcast));
  m.impl("all_gather", TORCH_FN(kiln::pytorch::all_gather));
  m.impl("reduce_scatter", TORCH_FN(kiln::pytorch::reduce_scatter));
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&kiln::pytorch::counted_cpu_fallback>());
}

// The view_copy and scatter ops that functionalization emits have composite kernels that call
// real view ops on the storage-less inner tensor, and a composite kernel outranks the catch-all
// fallback: those kiln does not lower (ops_views.cc lowers the common ones) are pinned to it here.
// (convolution_overrideable, whose default kernel raises instead of falling back: ops_nn.cc.)
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  const auto fallback = [] {
    return torch::CppFunction::makeFromBoxedFunction<&kiln::pytorch::counted_cpu_fallback>();
  };
  for (const char* op : {"diagonal_copy", "unfold_copy", "diagonal_scatter"}) {
    m.impl(op, fallback());
  }
}

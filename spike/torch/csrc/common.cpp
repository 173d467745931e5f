#include "common.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/add.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <c10/core/impl/LocalDispatchKeySet.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

namespace kiln_spike {
namespace {

// ---- fallback counting ---------------------------------------------------------------------
std::mutex g_mu;
std::map<std::string, int64_t> g_fallbacks;  // "aten::name.overload" -> calls

}  // namespace

void counted_cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& n = op.operator_name();
  std::string name = n.name + (n.overload_name.empty() ? "" : "." + n.overload_name);
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    first = g_fallbacks[name]++ == 0;
  }
  if (first) {
    TORCH_WARN("kiln: ", name, " is not lowered; it runs on the CPU (warned once per op)");
  }
  static const bool trace = std::getenv("KILN_SPIKE_TRACE") != nullptr;
  if (trace) {
    const bool in_functionalize =
        c10::impl::tls_local_dispatch_key_set().excluded_.has(c10::DispatchKey::Functionalize);
    std::fprintf(stderr, "kiln-trace: fallback %s (inside functionalization: %d)\n", name.c_str(),
                 int(in_functionalize));
  }
  at::native::cpu_fallback(op, stack);
}

namespace {

std::tuple<std::vector<std::string>, std::vector<int64_t>> fallback_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  std::vector<std::string> names;
  std::vector<int64_t> counts;
  for (const auto& [k, v] : g_fallbacks) {
    names.push_back(k);
    counts.push_back(v);
  }
  return {names, counts};
}

void reset_stats() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_fallbacks.clear();
}

std::string variant() { return kVariant; }

// Host cost of one aten op called from C++ (the "queued op" figure, here with the toy
// kernels, which also compute): mean ns per at::add(a, b) over n calls.
double bench_add(const at::Tensor& a, const at::Tensor& b, int64_t n) {
  at::Tensor r = at::add(a, b);  // warm-up
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
    r = at::add(a, b);
  }
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
}

// ---- device guard: one device, kiln:0, no streams ------------------------------------------
struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  static constexpr c10::DeviceType kType = c10::DeviceType::PrivateUse1;
  c10::DeviceType type() const override { return kType; }
  c10::Device exchangeDevice(c10::Device) const override { return {kType, 0}; }
  c10::Device getDevice() const override { return {kType, 0}; }
  void setDevice(c10::Device d) const override { TORCH_CHECK(d.index() <= 0, "kiln has one device, kiln:0"); }
  void uncheckedSetDevice(c10::Device) const noexcept override {}
  c10::Stream getStream(c10::Device d) const noexcept override { return c10::Stream(c10::Stream::DEFAULT, d); }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override { return s; }
  c10::DeviceIndex deviceCount() const noexcept override { return 1; }
};
C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);

// ---- hooks: what at::globalContext() asks of an accelerator ---------------------------------
struct Hooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override { return 1; }
  c10::DeviceIndex getCurrentDevice() const override { return 0; }
  at::Device getDeviceFromPtr(void*) const override { return {c10::DeviceType::PrivateUse1, 0}; }
  // Random ops fall back to the CPU, so the CPU generator is the one they use.
  const at::Generator& getDefaultGenerator(c10::DeviceIndex) const override {
    return at::detail::getDefaultCPUGenerator();
  }
};

const bool g_hooks_registered = [] {
  static Hooks hooks;
  at::RegisterPrivateUse1HooksInterface(&hooks);
  return true;
}();

}  // namespace
}  // namespace kiln_spike

TORCH_LIBRARY(kiln_spike, m) {
  m.def("fallback_stats() -> (str[], int[])", &kiln_spike::fallback_stats);
  m.def("reset_stats() -> ()", &kiln_spike::reset_stats);
  m.def("variant() -> str", &kiln_spike::variant);
  m.def("bench_add(Tensor a, Tensor b, int n) -> float", &kiln_spike::bench_add);
}

// Everything a variant does not register itself runs on the CPU through the counted fallback.
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&kiln_spike::counted_cpu_fallback>());
}

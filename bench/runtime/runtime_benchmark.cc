// kiln-bench-runtime: the client API over a Device with the reference CPU backend.
//   api_cache_hit_ns_per_op  one 9-op program on [4] tensors + a read, per op, once its plans are
//                            cached (one producer thread, its implicit stream)
//   ops_per_s_t1, _t2        ops/s through the API with 1 and 2 producer threads on distinct
//                            streams (same program; all threads together)
//   adam_fused_speedup       an Adam step (14 ops) on 2^20-element f32 tensors, time with fusion
//                            disabled (max_explorations = 0) / time fused. The reference backend
//                            replays a fused block op by op, so this measures the runtime's
//                            overhead and plan reuse, not kernel fusion (that needs a fusing
//                            backend).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdlib>
#include <optional>
#include <memory>
#include <vector>

#include "../common/metric_reporter.h"
#include "kiln/cpu/reference_backend.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/session.h"

namespace {

using kiln::runtime::Device;
using kiln::runtime::RuntimeOptions;
using kiln::runtime::Session;
using kiln::runtime::Tensor;

std::unique_ptr<Device> make_device(std::optional<std::size_t> max_explorations) {
  RuntimeOptions o;
  o.threads = 2;
  o.config_path = "";
  kiln::fusion::FusionConfig f;
  f.max_explorations = max_explorations;
  o.fusion = f;
  auto d = Device::create(std::make_unique<kiln::cpu::ReferenceCpuBackend>(), std::move(o));
  if (!d.ok()) std::abort();
  return std::move(d).value();
}

// Created in main, before any benchmark thread; destroyed after them.
Device* g_device = nullptr;
Session* g_session = nullptr;

template <class T>
T must(kiln::Result<T> r) {
  if (!r.ok()) std::abort();
  return std::move(r).value();
}

constexpr int kOpsPerProgram = 9;
// relu(tanh((a*b + a*2).exp() - b) * 0.5): 9 ops (relu is 2) on the calling thread's stream,
// then a read.
void tiny_program(Session& s, const Tensor& a, const Tensor& b) {
  Tensor x = must(s.mul(a, b));
  Tensor y = must(s.mul(a, 2.0));
  x = must(s.add(std::move(x), std::move(y)));
  x = must(s.exp(std::move(x)));
  x = must(s.sub(std::move(x), b));
  x = must(s.tanh(std::move(x)));
  x = must(s.mul(std::move(x), 0.5));
  x = must(s.relu(std::move(x)));
  benchmark::DoNotOptimize(must(s.to_host(std::move(x))));
}

void BM_ApiCacheHit(benchmark::State& state) {
  Session& s = *g_session;
  Tensor a = must(s.from_host(std::vector<float>{1, 2, 3, 4}, {4}));
  Tensor b = must(s.from_host(std::vector<float>{0.5f, -1, 0.25f, 2}, {4}));
  tiny_program(s, a, b);  // explores once; later runs hit the cached plans
  for (auto _ : state) tiny_program(s, a, b);
  state.SetItemsProcessed(state.iterations() * kOpsPerProgram);
}
BENCHMARK(BM_ApiCacheHit)->UseRealTime();
BENCHMARK(BM_ApiCacheHit)->Threads(2)->UseRealTime();

struct Adam {
  Tensor p, m, v;
};

void adam_step(Session& s, Adam& st, const Tensor& g, int t) {
  constexpr double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  Tensor m = must(s.add(must(s.mul(std::move(st.m), b1)), must(s.mul(g, 1 - b1))));
  Tensor v = must(s.add(must(s.mul(std::move(st.v), b2)), must(s.mul(must(s.mul(g, g)), 1 - b2))));
  Tensor mhat = must(s.div(m, 1 - std::pow(b1, t)));
  Tensor vhat = must(s.div(v, 1 - std::pow(b2, t)));
  Tensor upd = must(s.div(std::move(mhat), must(s.add(must(s.sqrt(std::move(vhat))), eps))));
  st.p = must(s.sub(std::move(st.p), must(s.mul(std::move(upd), lr))));
  st.m = std::move(m);
  st.v = std::move(v);
}

void run_adam(benchmark::State& state, std::optional<std::size_t> max_explorations) {
  auto dev = make_device(max_explorations);
  {
    Session s(*dev);
    constexpr std::size_t n = std::size_t{1} << 20;
    std::vector<float> ones(n, 1.0f), zeros(n, 0.0f), grad(n, 0.01f);
    Tensor g = must(s.from_host(grad, {n}));
    Adam st{must(s.from_host(ones, {n})), must(s.from_host(zeros, {n})), must(s.from_host(zeros, {n}))};
    int t = 1;
    adam_step(s, st, g, t++);
    if (!s.sync().ok()) std::abort();
    for (auto _ : state) {
      adam_step(s, st, g, t++);
      if (!s.sync().ok()) std::abort();
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n));
  }
}
void BM_AdamFused(benchmark::State& state) { run_adam(state, std::nullopt); }
void BM_AdamUnfused(benchmark::State& state) { run_adam(state, 0); }
BENCHMARK(BM_AdamFused)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AdamUnfused)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  auto dev = make_device(std::nullopt);
  auto session = std::make_unique<Session>(*dev);
  g_device = dev.get();
  g_session = session.get();
  using R = kiln::bench::MetricReporter;
  static double fused_s = 0, unfused_s = 0;
  auto rate = [](const R::Run& r) {
    auto it = r.counters.find("items_per_second");
    return it == r.counters.end() ? 0.0 : static_cast<double>(it->second);
  };
  R reporter({
      {"BM_ApiCacheHit/real_time", "api_cache_hit_ns_per_op", "ns",
       [](const R::Run& r) { return R::seconds_per_iteration(r) * 1e9 / kOpsPerProgram; }},
      {"BM_ApiCacheHit/real_time", "ops_per_s_t1", "ops/s", rate},
      {"BM_ApiCacheHit/real_time/threads:2", "ops_per_s_t2", "ops/s", rate},
      {"BM_AdamFused/real_time", "adam_fused_ms", "ms",
       [](const R::Run& r) { return (fused_s = R::seconds_per_iteration(r)) * 1e3; }},
      {"BM_AdamUnfused/real_time", "adam_unfused_ms", "ms",
       [](const R::Run& r) { return (unfused_s = R::seconds_per_iteration(r)) * 1e3; }},
      {"BM_AdamUnfused/real_time", "adam_fused_speedup", "x",
       [](const R::Run&) { return fused_s > 0 ? unfused_s / fused_s : 0.0; }},
  });
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  session.reset();
  dev.reset();
  return 0;
}

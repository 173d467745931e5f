// kiln-bench-runtime: the client API over a Device with the fast CPU backend (cpu::CpuBackend).
//   api_cache_hit_ns_per_op  16 9-op programs on [4] tensors + one read, per op, once their plans
//                            are cached (one producer thread, its implicit stream)
//   ops_per_s_t1, _t2        ops/s through the API with 1 and 2 producer threads on distinct
//                            streams (same program; all threads together)
//   adam_fused_speedup       an Adam step (14 ops per parameter) over 8 parameter tensors of
//                            2^20 f32 elements, time with fusion disabled (max_explorations = 0)
//                            / time fused: one fused kernel per parameter against 14 passes
//                            over memory; adam_fused_speedup_1param: the same with one tensor,
//                            whose whole working set fits in L3
//   mlp_step_us              one training step of a 32-64-8 MLP with Adam, batch 64
//                            (apps/common mlp_trainer.h): forward, hand-written backward, four
//                            Adam updates and a loss read — matmuls, reductions and fused chains
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <vector>

#include "../common/cache_hit_program.h"
#include "../common/metric_reporter.h"
#include "kiln/apps/mlp_trainer.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/session.h"

namespace {

using kiln::Status;
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
  // Kernels use one worker each: the figures are the runtime's, and the 2-producer run must
  // not compete with a launch's own helper threads for the machine's cores.
  auto d =
      Device::create(std::make_unique<kiln::cpu::CpuBackend>(kiln::cpu::CpuBackendOptions{.threads = 1}), std::move(o));
  if (!d.ok()) {
    std::fprintf(stderr, "kiln-bench-runtime: %s\n", d.error().to_string().c_str());
    std::abort();
  }
  return std::move(d).value();
}

// Created in main, before any benchmark thread; destroyed after them.
Device* g_device = nullptr;
Session* g_session = nullptr;

template <class T>
T must(kiln::Result<T> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "kiln-bench-runtime: %s\n", r.error().to_string().c_str());
    std::abort();
  }
  return std::move(r).value();
}

using kiln::bench::kOpsPerProgram;
using kiln::bench::kProgramsPerIteration;
using kiln::bench::tiny_programs;

void BM_ApiCacheHit(benchmark::State& state) {
  Session& s = *g_session;
  Tensor a = must(s.from_host(std::vector<float>{1, 2, 3, 4}, {4}));
  Tensor b = must(s.from_host(std::vector<float>{0.5f, -1, 0.25f, 2}, {4}));
  tiny_programs(s, a, b);  // explores once; later runs hit the cached plans
  const kiln::runtime::StreamStats before = g_device->totals();
  const std::uint64_t spun_before = g_device->spun_waits();
  for (auto _ : state) tiny_programs(s, a, b);
  state.SetItemsProcessed(state.iterations() * kOpsPerProgram * kProgramsPerIteration);
  // How the actors ran, per iteration (all threads of the run together): strand turns, and
  // waits (the read) served on the caller's thread.
  if (state.thread_index() == 0) {
    const kiln::runtime::StreamStats after = g_device->totals();
    const double it = static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
    state.counters["turns"] = static_cast<double>(after.turns - before.turns) / it;
    state.counters["inline"] = static_cast<double>(after.inline_runs - before.inline_runs) / it;
    state.counters["deferred"] = static_cast<double>(after.deferred - before.deferred) / it;
    // The path measured: every program a cached plan, no exploration.
    state.counters["hits"] = static_cast<double>(after.cache_hits - before.cache_hits) / it;
    state.counters["explored"] = static_cast<double>(after.explorations - before.explorations) / it;
    state.counters["executed"] = static_cast<double>(after.executed - before.executed) / it;
    // Reads answered while their caller spun (RuntimeOptions::spin_waits), per iteration.
    state.counters["spun"] = static_cast<double>(g_device->spun_waits() - spun_before) / it;
  }
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

// The CPU device's counters per iteration: how the work ran (fused kernels, single fast ops,
// reference fallbacks, fused programs replayed op by op).
void per_iteration_stats(benchmark::State& state, Device& dev) {
  const auto st = static_cast<kiln::cpu::CpuBackend&>(dev.backend()).stats();
  const double it = static_cast<double>(std::max<benchmark::IterationCount>(1, state.iterations()));
  state.counters["fused"] = static_cast<double>(st.fused_launches) / it;
  state.counters["fast_ops"] = static_cast<double>(st.fast_ops) / it;
  state.counters["ref_ops"] = static_cast<double>(st.reference_ops) / it;
  state.counters["replays"] = static_cast<double>(st.fused_replays) / it;
  state.counters["inplace"] = static_cast<double>(st.inplace_reuses) / it;
  state.counters["apart"] = static_cast<double>(st.part_by_part) / it;  // launches run part by part
}

// An Adam step over state.range(0) parameter tensors of 2^20 f32 elements each, each with its
// own gradient: 1 tensor (its working set fits this machine's L3, so the unfused passes run
// from cache) and 8 (128 MiB of parameters, gradients and moments: the training case, where
// every unfused pass goes to memory).
void run_adam(benchmark::State& state, std::optional<std::size_t> max_explorations) {
  auto dev = make_device(max_explorations);
  {
    Session s(*dev);
    constexpr std::size_t n = std::size_t{1} << 20;
    const auto count = static_cast<std::size_t>(state.range(0));
    std::vector<float> ones(n, 1.0f), zeros(n, 0.0f), grad(n, 0.01f);
    std::vector<Tensor> grads;
    std::vector<Adam> params;
    for (std::size_t i = 0; i < count; ++i) {
      grads.push_back(must(s.from_host(grad, {n})));
      params.push_back(
          Adam{must(s.from_host(ones, {n})), must(s.from_host(zeros, {n})), must(s.from_host(zeros, {n}))});
    }
    int t = 1;
    auto step = [&] {
      for (std::size_t i = 0; i < count; ++i) adam_step(s, params[i], grads[i], t);
      ++t;
      if (Status synced = s.sync(); !synced.ok()) {
        std::fprintf(stderr, "kiln-bench-runtime: %s\n", synced.error().to_string().c_str());
        std::abort();
      }
    };
    step();  // explorations and compilation
    for (auto _ : state) step();
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(n * count));
    per_iteration_stats(state, *dev);
  }
}
void BM_AdamFused(benchmark::State& state) { run_adam(state, std::nullopt); }
void BM_AdamUnfused(benchmark::State& state) { run_adam(state, 0); }
BENCHMARK(BM_AdamFused)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_AdamUnfused)->Arg(1)->Arg(8)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_MlpStep(benchmark::State& state) {
  auto dev = make_device(std::nullopt);
  {
    Session s(*dev);
    kiln::apps::MlpTrainer<Session, Tensor> mlp(s, kiln::apps::MlpOptions{});
    if (!mlp.init().ok()) std::abort();
    double first = 0, last = 0;
    for (int i = 0; i < 3; ++i) first = must(mlp.step());  // explorations and compilation
    for (auto _ : state) last = must(mlp.step());
    state.counters["loss_first"] = first;
    state.counters["loss_last"] = last;
    per_iteration_stats(state, *dev);
  }
}
BENCHMARK(BM_MlpStep)->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  auto dev = make_device(std::nullopt);
  auto session = std::make_unique<Session>(*dev);
  g_device = dev.get();
  g_session = session.get();
  using R = kiln::bench::MetricReporter;
  static double fused_s = 0, unfused_s = 0, fused1_s = 0, unfused1_s = 0;
  auto rate = [](const R::Run& r) {
    auto it = r.counters.find("items_per_second");
    return it == r.counters.end() ? 0.0 : static_cast<double>(it->second);
  };
  R reporter({
      {"BM_ApiCacheHit/real_time", "api_cache_hit_ns_per_op", "ns",
       [](const R::Run& r) { return R::seconds_per_iteration(r) * 1e9 / (kOpsPerProgram * kProgramsPerIteration); }},
      {"BM_ApiCacheHit/real_time", "ops_per_s_t1", "ops/s", rate},
      {"BM_ApiCacheHit/real_time/threads:2", "ops_per_s_t2", "ops/s", rate},
      {"BM_AdamFused/1/real_time", "adam1_fused_ms", "ms",
       [](const R::Run& r) { return (fused1_s = R::seconds_per_iteration(r)) * 1e3; }},
      {"BM_AdamFused/8/real_time", "adam8_fused_ms", "ms",
       [](const R::Run& r) { return (fused_s = R::seconds_per_iteration(r)) * 1e3; }},
      {"BM_AdamUnfused/1/real_time", "adam1_unfused_ms", "ms",
       [](const R::Run& r) { return (unfused1_s = R::seconds_per_iteration(r)) * 1e3; }},
      {"BM_AdamUnfused/1/real_time", "adam_fused_speedup_1param", "x",
       [](const R::Run&) { return fused1_s > 0 ? unfused1_s / fused1_s : 0.0; }},
      {"BM_AdamUnfused/8/real_time", "adam8_unfused_ms", "ms",
       [](const R::Run& r) { return (unfused_s = R::seconds_per_iteration(r)) * 1e3; }},
      {"BM_AdamUnfused/8/real_time", "adam_fused_speedup", "x",
       [](const R::Run&) { return fused_s > 0 ? unfused_s / fused_s : 0.0; }},
      {"BM_MlpStep/real_time", "mlp_step_us", "us", [](const R::Run& r) { return R::seconds_per_iteration(r) * 1e6; }},
  });
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  session.reset();
  dev.reset();
  return 0;
}

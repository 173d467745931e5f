// kiln-bench-fusion: the cost of the fusion search itself (no kernels run: a recording
// executor stands in for the backend).
//   cache_hit_ns_per_op  registering operations whose segment hits a cached plan, per op
//   explore_4op_us       one exploration of (a*b + c*2).exp() on a fresh store
//   explore_40op_us      one exploration of five independent 8-op chains on a fresh store
#include <benchmark/benchmark.h>

#include "../common/metric_reporter.h"
#include "lab.h"

namespace {

using namespace kiln::lab;  // NOLINT

// One W1 program: 3 inputs, 4 ops, a read (drain), 4 drops.
constexpr int kOpsPerW1 = 8;
void w1(Lab& lab) {
  W1Program w = register_w1(lab, {64, 64}, 2.0);
  lab.read(w.t7);
  for (const TensorIr& t : {w.a, w.b, w.c, w.t7}) lab.drop(t);
}

void BM_CacheHit(benchmark::State& state) {
  kiln::fusion::FusionLog log;
  Lab lab(log, {}, /*keep_records=*/false);
  w1(lab);  // explores once; every later run hits the cached plans
  for (auto _ : state) {
    w1(lab);
  }
  state.SetItemsProcessed(state.iterations() * kOpsPerW1);
}
BENCHMARK(BM_CacheHit);

void BM_Explore4(benchmark::State& state) {
  kiln::fusion::FusionLog log;
  for (auto _ : state) {
    Lab lab(log);  // fresh store and stream: the program explores
    lab.read(register_w1(lab, {64, 64}, 2.0).t7);
    benchmark::DoNotOptimize(lab.store().size());
  }
}
BENCHMARK(BM_Explore4)->Unit(benchmark::kMicrosecond);

void BM_Explore40(benchmark::State& state) {
  kiln::fusion::FusionLog log;
  for (auto _ : state) {
    Lab lab(log);
    register_chains(lab, 5);
    lab.sync();
    benchmark::DoNotOptimize(lab.store().size());
  }
}
BENCHMARK(BM_Explore40)->Unit(benchmark::kMicrosecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  using R = kiln::bench::MetricReporter;
  R reporter({
      {"BM_CacheHit", "cache_hit_ns_per_op", "ns",
       [](const R::Run& r) { return R::seconds_per_iteration(r) * 1e9 / kOpsPerW1; }},
      {"BM_Explore4", "explore_4op_us", "us", [](const R::Run& r) { return R::seconds_per_iteration(r) * 1e6; }},
      {"BM_Explore40", "explore_40op_us", "us", [](const R::Run& r) { return R::seconds_per_iteration(r) * 1e6; }},
  });
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

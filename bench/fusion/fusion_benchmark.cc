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
  TensorIr a = lab.input({64, 64}), b = lab.input({64, 64}), c = lab.input({64, 64});
  TensorIr t4 = lab.binary(OpKind::Numeric_Mul, a, TensorStatus::ReadOnly, b, TensorStatus::ReadOnly);
  TensorIr t5 = lab.scalar(OpKind::Numeric_MulScalar, c, TensorStatus::ReadOnly, 2.0);
  TensorIr t6 = lab.binary(OpKind::Numeric_Add, t4, TensorStatus::ReadWrite, t5, TensorStatus::ReadWrite);
  TensorIr t7 = lab.unary(OpKind::Float_Exp, Family::Float, t6, TensorStatus::ReadWrite);
  lab.read(t7);
  for (const TensorIr& t : {a, b, c, t7}) lab.drop(t);
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
    TensorIr a = lab.input({64, 64}), b = lab.input({64, 64}), c = lab.input({64, 64});
    TensorIr t4 = lab.binary(OpKind::Numeric_Mul, a, TensorStatus::ReadOnly, b, TensorStatus::ReadOnly);
    TensorIr t5 = lab.scalar(OpKind::Numeric_MulScalar, c, TensorStatus::ReadOnly, 2.0);
    TensorIr t6 = lab.binary(OpKind::Numeric_Add, t4, TensorStatus::ReadWrite, t5, TensorStatus::ReadWrite);
    TensorIr t7 = lab.unary(OpKind::Float_Exp, Family::Float, t6, TensorStatus::ReadWrite);
    lab.read(t7);
    benchmark::DoNotOptimize(lab.store().size());
  }
}
BENCHMARK(BM_Explore4)->Unit(benchmark::kMicrosecond);

void BM_Explore40(benchmark::State& state) {
  kiln::fusion::FusionLog log;
  for (auto _ : state) {
    Lab lab(log);
    for (int chain = 0; chain < 5; ++chain) {
      TensorIr t = lab.scalar(OpKind::Numeric_MulScalar, lab.input({256, 256}), TensorStatus::ReadOnly, 1.5);
      t = lab.scalar(OpKind::Numeric_AddScalar, t, TensorStatus::ReadWrite, 0.5);
      t = lab.unary(OpKind::Float_Exp, Family::Float, t, TensorStatus::ReadWrite);
      t = lab.unary(OpKind::Float_Tanh, Family::Float, t, TensorStatus::ReadWrite);
      t = lab.unary(OpKind::Float_Sqrt, Family::Float, t, TensorStatus::ReadWrite);
      t = lab.scalar(OpKind::Numeric_DivScalar, t, TensorStatus::ReadWrite, 3.0);
      t = lab.scalar(OpKind::Numeric_SubScalar, t, TensorStatus::ReadWrite, 0.25);
      lab.unary(OpKind::Numeric_Abs, Family::NumericFloat, t, TensorStatus::ReadWrite);
    }
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

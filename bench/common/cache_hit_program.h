// The cache-hit workload of kiln-bench-runtime (BM_ApiCacheHit) and kiln-bench-ipc: 16 tiny
// 9-op programs on [4] tensors whose results stay alive, then a read of the last one (which
// drains the stream) and the drops of all 16. Once the plans are cached, per op that is the
// registration, the plan match, the dispatch and a kernel on [4] tensors, plus 1/144 of a drain.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kiln/runtime/session.h"

namespace kiln::bench {

inline constexpr int kOpsPerProgram = 9;
inline constexpr int kProgramsPerIteration = 16;

// A benchmark cannot go on without the op: print the error and abort.
template <class T>
T must_succeed(Result<T> r) {
  if (!r.ok()) {
    std::fprintf(stderr, "kiln benchmark: %s\n", r.error().to_string().c_str());
    std::abort();
  }
  return std::move(r).value();
}

// relu(tanh((a*b + a*2).exp() - b) * 0.5): 9 ops (relu is 2) on the calling thread's stream.
inline runtime::Tensor tiny_program(runtime::Session& s, const runtime::Tensor& a, const runtime::Tensor& b) {
  runtime::Tensor x = must_succeed(s.mul(a, b));
  runtime::Tensor y = must_succeed(s.mul(a, 2.0));
  x = must_succeed(s.add(std::move(x), std::move(y)));
  x = must_succeed(s.exp(std::move(x)));
  x = must_succeed(s.sub(std::move(x), b));
  x = must_succeed(s.tanh(std::move(x)));
  x = must_succeed(s.mul(std::move(x), 0.5));
  return must_succeed(s.relu(std::move(x)));
}

inline void tiny_programs(runtime::Session& s, const runtime::Tensor& a, const runtime::Tensor& b) {
  std::vector<runtime::Tensor> results;
  results.reserve(kProgramsPerIteration);
  for (int i = 0; i < kProgramsPerIteration; ++i) results.push_back(tiny_program(s, a, b));
  runtime::Tensor last = std::move(results.back());
  results.pop_back();
  benchmark::DoNotOptimize(must_succeed(s.to_host(std::move(last))));
}

}  // namespace kiln::bench

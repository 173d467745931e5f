// The Eigen reference for the matmul1024 figure: Eigen 3's float GEMM (C = A * B, n x n,
// row-major), timed with the same harness as kiln's matmul in the same process.
//
// eigen_sgemm.cc is compiled only when CMake finds Eigen3 (KILN_BENCH_HAVE_EIGEN is then
// defined); with OpenMP found too, Eigen's GEMM runs with the requested thread count
// (Eigen::setNbThreads), otherwise it is measured with 1 thread only.
//
// Thread-safety: call from the benchmark's main thread only.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "harness.h"

namespace kiln::bench::peers {

struct EigenGemmInfo {
  std::string version;  // "3.4.0"
  std::string simd;     // Eigen::SimdInstructionSetsInUse()
  int max_threads = 1;  // 1 without OpenMP
};

EigenGemmInfo eigen_gemm_info();

// C = A * B for n x n row-major float matrices; `c` must hold n * n floats.
void eigen_sgemm(std::span<const float> a, std::span<const float> b, std::span<float> c, long n, int threads);

// Times eigen_sgemm with the kit's rule (time_calls); sorted ns per call.
std::vector<double> time_eigen_sgemm(const TimingParams& p, std::span<const float> a, std::span<const float> b,
                                     std::span<float> c, long n, int threads);

}  // namespace kiln::bench::peers

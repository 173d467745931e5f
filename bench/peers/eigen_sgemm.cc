// Eigen's float GEMM, the reference of the matmul1024 figure (see eigen_sgemm.h). Built only
// when CMake finds Eigen3; compiled with the project's flags (-O3 -march=native in release),
// as the kit's Eigen peer is.
#include "eigen_sgemm.h"

#include <Eigen/Core>

namespace kiln::bench::peers {

namespace {
using RowMajor = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
}

EigenGemmInfo eigen_gemm_info() {
  EigenGemmInfo info;
  info.version = std::to_string(EIGEN_WORLD_VERSION) + "." + std::to_string(EIGEN_MAJOR_VERSION) + "." +
                 std::to_string(EIGEN_MINOR_VERSION);
  info.simd = Eigen::SimdInstructionSetsInUse();
#ifdef KILN_BENCH_EIGEN_OPENMP
  info.max_threads = 1 << 10;  // whatever is asked: Eigen forwards it to OpenMP
#else
  info.max_threads = 1;
#endif
  return info;
}

void eigen_sgemm(std::span<const float> a, std::span<const float> b, std::span<float> c, long n, int threads) {
  Eigen::setNbThreads(threads);
  Eigen::Map<const RowMajor> A(a.data(), n, n), B(b.data(), n, n);
  Eigen::Map<RowMajor> C(c.data(), n, n);
  C.noalias() = A * B;
}

std::vector<double> time_eigen_sgemm(const TimingParams& p, std::span<const float> a, std::span<const float> b,
                                     std::span<float> c, long n, int threads) {
  Eigen::setNbThreads(threads);
  Eigen::Map<const RowMajor> A(a.data(), n, n), B(b.data(), n, n);
  Eigen::Map<RowMajor> C(c.data(), n, n);
  return time_calls(
      p, [&] { C.noalias() = A * B; }, /*prime=*/0);
}

}  // namespace kiln::bench::peers

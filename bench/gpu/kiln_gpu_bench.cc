// kiln-gpu-bench: kiln's CUDA backend on the peer kit's workloads (../shared/bench-peers),
// fused and unfused, and a device-to-device copy (the bandwidth ceiling the workloads are read
// against), one line per (workload, n) in the kit's format:
//
//   peer=kiln-cuda-fused workload=W1 n=16777216 ns_per_elem=0.0041 gbps=3900 threads=1 ...
//
// Each timed call = register the workload's ops + drain + cudaDeviceSynchronize (the kernel
// time and kiln's host overhead, as a client that waits for its result sees them). Plans and
// kernels are built in the priming calls (time_calls' `prime`), never timed.
//
// Usage: kiln-gpu-bench [--workloads W1,W2,W3,W4 (also LN, CE)] [--sizes 16777216,...] [--modes fused,unfused]
//                       [--fast-math] [--no-copy]
// --fast-math: kernels with approximate f32 exp/log (CudaBackendOptions::fast_math); the
// peers are then named kiln-cuda-fused-fastmath / kiln-cuda-unfused-fastmath.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <map>

#include "harness.h"
#include "kiln/cuda/backend.h"
#include "kiln_client.h"
#include "workloads.h"

namespace kiln::bench::peers {
namespace {

class GpuBackend final : public Backend {
 public:
  explicit GpuBackend(cuda::CudaBackend& b) : b_(b), exec_(b.make_executor()) {}
  fusion::Executor& executor() override { return *exec_; }
  void upload(TensorId id, const Shape& shape, std::span<const float> data) override {
    const Status st = b_.upload(id, ir::dtypes::f32, shape, std::as_bytes(data));
    if (!st.ok()) die("upload: " + st.error().to_string());
  }
  std::vector<float> download(TensorId id, const Shape& shape) override {
    Result<runtime::HostData> h = b_.download(TensorIr{id, shape, TensorStatus::ReadOnly, ir::dtypes::f32});
    if (!h.ok()) die("download: " + h.error().to_string());
    std::vector<float> v(h->bytes.size() / sizeof(float));
    std::memcpy(v.data(), h->bytes.data(), v.size() * sizeof(float));
    return v;
  }
  void reset_counters() override { base_ = b_.stats(); }
  std::string counters() override {
    const cuda::CudaStats s = b_.stats();
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  " dev_fused_launches=%llu dev_vector_launches=%llu dev_row_vector_launches=%llu dev_row_kernels=%llu"
                  " dev_row_windows=%llu"
                  " dev_single_op_kernels=%llu dev_host_ops=%llu"
                  " dev_replays=%llu pool_high_mib=%llu",
                  static_cast<unsigned long long>(s.fused_launches - base_.fused_launches),
                  static_cast<unsigned long long>(s.vector_launches - base_.vector_launches),
                  static_cast<unsigned long long>(s.row_vector_launches - base_.row_vector_launches),
                  static_cast<unsigned long long>(s.row_kernel_launches - base_.row_kernel_launches),
                  static_cast<unsigned long long>(s.row_window_launches - base_.row_window_launches),
                  static_cast<unsigned long long>(s.single_op_kernels - base_.single_op_kernels),
                  static_cast<unsigned long long>(s.host_ops - base_.host_ops),
                  static_cast<unsigned long long>(s.fused_replays - base_.fused_replays),
                  static_cast<unsigned long long>(s.pool_used_high >> 20));
    return buf;
  }

 private:
  cuda::CudaBackend& b_;
  std::unique_ptr<fusion::Executor> exec_;
  cuda::CudaStats base_;
};

std::string peer_name(bool fused, bool fast_math) {
  return std::string(fused ? "kiln-cuda-fused" : "kiln-cuda-unfused") + (fast_math ? "-fastmath" : "");
}

std::vector<std::string> list_arg(int argc, char** argv, const char* name, const char* fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return split_list(argv[i + 1]);
  return split_list(fallback);
}

// Device-to-device copy of n floats: 8 bytes per element moved (read + write).
void time_copy(const TimingParams& params, long n) {
  void* a = nullptr;
  void* b = nullptr;
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) die("cudaMalloc for the copy");
  (void)cudaMemset(a, 0, bytes);
  const std::vector<double> ts = time_calls(params, [&] {
    (void)cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, nullptr);
    (void)cudaDeviceSynchronize();
  });
  emit("cuda-d2d-copy", "copy", n, 1, 8.0, ts);
  (void)cudaFree(a);
  (void)cudaFree(b);
}

int run(int argc, char** argv) {
  const std::vector<std::string> workloads = list_arg(argc, argv, "--workloads", "W1,W2,W3,W4");
  const std::vector<std::string> modes = list_arg(argc, argv, "--modes", "fused,unfused");
  std::vector<long> sizes;
  for (const std::string& s : list_arg(argc, argv, "--sizes", "16777216,33554432,67108864,134217728,268435456"))
    sizes.push_back(std::atol(s.c_str()));
  bool fast_math = false, copy = true;
  for (int i = 1; i < argc; ++i) {
    fast_math |= std::strcmp(argv[i], "--fast-math") == 0;
    copy &= std::strcmp(argv[i], "--no-copy") != 0;
  }
  Result<std::unique_ptr<cuda::CudaBackend>> be = cuda::CudaBackend::create({.fast_math = fast_math});
  if (!be.ok()) {
    std::printf("# kiln-gpu-bench: no CUDA backend: %s\n", be.error().message.c_str());
    return 3;
  }
  cuda::CudaBackend& gpu = **be;
  std::printf("# kiln device=%s sm_%d\n", gpu.device_info().name.c_str(), gpu.device_info().arch());
  const TimingParams params = TimingParams::from_env();
  fusion::FusionLog log;
  GpuBackend backend(gpu);
  bool all_ok = true;
  if (copy)
    for (long n : sizes) time_copy(params, n);
  for (const std::string& w : workloads) {
    for (const std::string& mode : modes) {  // correctness at the smallest size, before timing
      const bool fused = mode == "fused";
      const auto wl = make_workload(w, sizes.front());
      if (!wl) die("unknown workload " + w);
      Client c(backend, fused, log);
      wl->setup(c);
      wl->call(c);
      const CheckResult r = wl->check(c);
      wl->teardown(c);
      std::printf("# check peer=%s workload=%s n=%ld max_err=%.3g ok=%d\n", peer_name(fused, fast_math).c_str(),
                  w.c_str(), sizes.front(), r.err, static_cast<int>(r.ok));
      all_ok &= r.ok;
    }
    for (long n : sizes) {
      // Host inputs are generated once per (workload, size) (seconds at 2^28), then uploaded
      // for each mode.
      const auto wl = make_workload(w, n);
      for (const std::string& mode : modes) {
        const bool fused = mode == "fused";
        Client c(backend, fused, log);
        wl->setup(c);
        const std::vector<double> ts = time_calls(params, [&] {
          wl->call(c);
          (void)gpu.synchronize();
        });
        backend.reset_counters();
        wl->call(c);
        (void)gpu.synchronize();
        const std::string extra = backend.counters();
        wl->teardown(c);
        (void)gpu.synchronize();
        emit(peer_name(fused, fast_math), w, n, 1, bytes_per_elem(w), ts, extra);
      }
    }
  }
  if (!all_ok) std::fprintf(stderr, "kiln-gpu-bench: a correctness check failed (see the # check lines)\n");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace kiln::bench::peers

int main(int argc, char** argv) { return kiln::bench::peers::run(argc, argv); }

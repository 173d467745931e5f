// The backends kiln-bench-peers drives: the CPU device (cpu_backend.cc) and, for --dry-run, a
// recording stand-in that runs no kernel and only shows what the fusion search decides.
//
// Thread-safety: as the device and executor they wrap (one stream, one thread).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/fusion/recording_executor.h"
#include "kiln_client.h"

namespace kiln::bench::peers {

// A CPU device with `threads` threads (its task arena's concurrency) and its executor.
// `describe` is one line for the program's `#` header.
struct CpuBackendInfo {
  std::string describe;
};
// `jit`: compile fused elementwise programs to native loops (CpuJitMode::On) or interpret them.
std::unique_ptr<Backend> make_cpu_backend(int threads, CpuBackendInfo* info = nullptr, bool jit = true);

// No kernels: the recording executor tracks which tensors exist; downloads are zeros.
class RecordingBackend final : public Backend {
 public:
  RecordingBackend() : exec_(/*keep_records=*/true) {}
  fusion::Executor& executor() override { return exec_; }
  void upload(TensorId id, const Shape&, std::span<const float>) override { exec_.materialize(id); }
  std::vector<float> download(TensorId, const Shape& shape) override {
    return std::vector<float>(static_cast<std::size_t>(ir::num_elements(shape)), 0.0f);
  }
  fusion::RecordingExecutor& recorder() { return exec_; }

 private:
  fusion::RecordingExecutor exec_;
};

}  // namespace kiln::bench::peers

// The CPU device behind kiln-bench-peers: a CpuDevice with the requested thread count (its task
// arena's concurrency) and one CpuExecutor. Every client of one thread count shares it; the
// benchmark is single-threaded, so the device's one-actor rule holds.
#include <cstdio>
#include <string>

#include "backends.h"
#include "kiln/cpu/cpu_executor.h"
#include "kiln/cpu/device.h"

namespace kiln::bench::peers {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(int threads, bool jit)
      : device_(cpu::CpuDeviceOptions{.threads = threads, .jit = jit ? cpu::CpuJitMode::On : cpu::CpuJitMode::Off}),
        exec_(device_) {}

  fusion::Executor& executor() override { return exec_; }

  void upload(TensorId id, const Shape& shape, std::span<const float> data) override {
    const Status st = device_.upload<float>(id, shape, data);
    if (!st.ok()) die("upload of " + id.to_string() + ": " + st.error().to_string());
  }

  std::vector<float> download(TensorId id, const Shape&) override {
    auto values = device_.download<float>(id);
    if (!values.ok()) die("download of " + id.to_string() + ": " + values.error().to_string());
    return std::move(values).value();
  }

  void reset_counters() override { device_.reset_stats(); }

  std::string counters() override {
    const cpu::CpuDeviceStats s = device_.stats();
    char buf[384];
    std::snprintf(buf, sizeof buf,
                  " dev_fused_launches=%llu dev_fused_replays=%llu dev_fast_ops=%llu dev_reference_ops=%llu"
                  " dev_inplace_reuses=%llu dev_jit_launches=%llu dev_row_jit_stages=%llu dev_nontemporal_outputs=%llu",
                  static_cast<unsigned long long>(s.fused_launches), static_cast<unsigned long long>(s.fused_replays),
                  static_cast<unsigned long long>(s.fast_ops), static_cast<unsigned long long>(s.reference_ops),
                  static_cast<unsigned long long>(s.inplace_reuses), static_cast<unsigned long long>(s.jit_launches),
                  static_cast<unsigned long long>(s.row_jit_stages),
                  static_cast<unsigned long long>(s.nontemporal_outputs));
    return buf;
  }

  int threads() const { return device_.threads(); }
  bool jit() const { return device_.jit_enabled(); }

 private:
  cpu::CpuDevice device_;
  cpu::CpuExecutor exec_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, CpuBackendInfo* info, bool jit) {
  auto backend = std::make_unique<CpuBackend>(threads, jit);
  if (backend->threads() != threads)
    die("CpuDevice has " + std::to_string(backend->threads()) + " threads, asked for " + std::to_string(threads));
  if (info)
    info->describe = "device=CpuDevice arena_threads=" + std::to_string(backend->threads()) +
                     " jit=" + (backend->jit() ? "on" : "off");
  return backend;
}

}  // namespace kiln::bench::peers

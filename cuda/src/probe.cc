// probe() and choose_device() (probe.h).
#include "kiln/cuda/probe.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>

#include <spdlog/spdlog.h>

namespace kiln::cuda {
namespace {

std::string version_string(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

}  // namespace

std::string ProbeResult::describe() const {
  if (devices.empty())
    return fmt::format("no GPU: {} (runtime {}{})", reason, version_string(runtime_version),
                       driver_version != 0 ? ", driver " + version_string(driver_version) : std::string());
  std::string s = fmt::format("{} CUDA device{}:", devices.size(), devices.size() == 1 ? "" : "s");
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const DeviceInfo& d = devices[i];
    s += fmt::format("{} {} (sm_{}, {} GiB, {} SMs)", i == 0 ? "" : ",", d.name, d.arch(), d.total_memory >> 30,
                     d.multiprocessors);
  }
  s += fmt::format("; driver {}, runtime {}", version_string(driver_version), version_string(runtime_version));
  return s;
}

ProbeResult probe() {
  ProbeResult p;
  (void)cudaRuntimeGetVersion(&p.runtime_version);
  // cudaDriverGetVersion reports 0 (and success) when no driver is installed: it is the one
  // query that tells "no driver" apart from "driver, but no device".
  if (cudaDriverGetVersion(&p.driver_version) != cudaSuccess) p.driver_version = 0;
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count <= 0) {
    if (p.driver_version == 0)
      p.reason = "no CUDA driver found";
    else if (e == cudaErrorNoDevice || (e == cudaSuccess && count <= 0))
      p.reason = "driver present, no device";
    else
      p.reason = fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
    (void)cudaGetLastError();  // clear the (non-sticky) error for later callers
    return p;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    DeviceInfo d;
    d.ordinal = i;
    d.name = prop.name;
    d.major = prop.major;
    d.minor = prop.minor;
    d.total_memory = prop.totalGlobalMem;
    d.multiprocessors = prop.multiProcessorCount;
    int pools = 0;
    if (cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, i) == cudaSuccess) d.memory_pools = pools != 0;
    p.devices.push_back(std::move(d));
  }
  if (p.devices.empty()) p.reason = "driver present, no device could be queried";
  return p;
}

Result<DeviceChoice> choose_device(std::string_view request, const ProbeResult& probe) {
  std::string r(request);
  std::transform(r.begin(), r.end(), r.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (r.empty() || r == "auto") {
    if (probe.available())
      return DeviceChoice{DeviceKind::Cuda, 0,
                          fmt::format("auto: {} (sm_{})", probe.devices[0].name, probe.devices[0].arch())};
    return DeviceChoice{DeviceKind::Cpu, 0, "auto: no GPU: " + probe.reason};
  }
  if (r == "cpu") return DeviceChoice{DeviceKind::Cpu, 0, "requested: cpu"};
  if (r.rfind("cuda", 0) == 0) {
    // cuda, cuda:N, or cudaN (a systemd instance name: kilnd@cuda0).
    int ordinal = 0;
    if (r.size() > 4) {
      const char* b = r.data() + (r[4] == ':' ? 5 : 4);
      const char* e = r.data() + r.size();
      auto [ptr, ec] = std::from_chars(b, e, ordinal);
      if (ec != std::errc() || ptr != e || b == e || ordinal < 0)
        return make_error(ErrorCode::Config,
                          fmt::format("device '{}': expected cuda:N or cudaN with N a device number", request));
    }
    if (!probe.available())
      return make_error(ErrorCode::Config, fmt::format("device '{}' requested, but no GPU: {}", request, probe.reason));
    if (static_cast<std::size_t>(ordinal) >= probe.devices.size())
      return make_error(ErrorCode::Config, fmt::format("device '{}' requested, but only {} CUDA device(s) found",
                                                       request, probe.devices.size()));
    const DeviceInfo& d = probe.devices[static_cast<std::size_t>(ordinal)];
    return DeviceChoice{DeviceKind::Cuda, ordinal, fmt::format("requested: {} (sm_{})", d.name, d.arch())};
  }
  return make_error(ErrorCode::Config, fmt::format("device '{}': expected auto, cpu, cuda, cuda:N or cudaN", request));
}

Result<DeviceChoice> select_device(std::string_view flag) {
  std::string request(flag);
  if (request.empty())
    if (const char* env = std::getenv("KILN_DEVICE"); env != nullptr) request = env;
  Result<DeviceChoice> c = choose_device(request, probe());
  if (!c.ok()) {
    spdlog::error("kiln: device: {}", c.error().message);
    return c;
  }
  spdlog::info("kiln: device: {} ({})",
               c->kind == DeviceKind::Cpu ? std::string("cpu") : fmt::format("cuda:{}", c->ordinal), c->why);
  return c;
}

}  // namespace kiln::cuda

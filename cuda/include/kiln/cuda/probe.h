// What CUDA the machine offers, asked through the CUDA runtime (cudart), which loads the driver
// lazily: on a machine without a driver every query returns an error code, never aborts. And
// the device choice of --device / KILN_DEVICE (auto, cpu, cuda, cuda:N).
//
// Usage:
//   ProbeResult p = probe();
//   if (!p.available()) spdlog::info("kiln: no GPU: {}", p.reason);
//   Result<DeviceChoice> d = choose_device(device_flag_or_env, p);   // logs nothing; the caller does
//
// Thread-safety: probe() may be called from any thread (cudart is thread-safe).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/result.h"

namespace kiln::cuda {

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int major = 0, minor = 0;        // compute capability
  std::uint64_t total_memory = 0;  // bytes
  int multiprocessors = 0;
  bool memory_pools = false;  // cudaMallocAsync supported
  int arch() const { return major * 10 + minor; }
};

struct ProbeResult {
  int driver_version = 0;   // 0: no driver (cudaDriverGetVersion's convention)
  int runtime_version = 0;  // the cudart kiln was built with, e.g. 13000
  std::vector<DeviceInfo> devices;
  // Why there is no usable GPU: "no CUDA driver found", "driver present, no device", or the
  // runtime's own message (a driver too old for this runtime, ...). Empty when devices exist.
  std::string reason;

  bool available() const { return !devices.empty(); }
  // One line for the log: "2 CUDA devices: NVIDIA H200 (sm_90, 139 GiB), ...; driver 13.0,
  // runtime 13.0" or "no GPU: <reason> (runtime 13.0)".
  std::string describe() const;
};

// Never throws, never aborts, never exits: a missing driver or device is a reason string.
ProbeResult probe();

enum class DeviceKind : std::uint8_t { Cpu, Cuda };
struct DeviceChoice {
  DeviceKind kind = DeviceKind::Cpu;
  int ordinal = 0;
  std::string why;  // for the log: "auto: NVIDIA H200 (sm_90)" / "auto: no GPU: <reason>"
};

// Resolves a device request: "auto" (or empty) picks GPU 0 when the probe found one, else the
// CPU; "cpu"; "cuda" (= cuda:0) and "cuda:N" need that GPU (an error value otherwise, naming
// the reason). Matching is case-insensitive. Errors: ErrorCode::Config.
Result<DeviceChoice> choose_device(std::string_view request, const ProbeResult& probe);

// What a main does with --device: the flag, else $KILN_DEVICE, else "auto"; probes, chooses,
// and logs the choice (spdlog info: "kiln: device: cuda:0 (auto: NVIDIA H200 (sm_90))" or
// "kiln: device: cpu (auto: no GPU: no CUDA driver found)").
Result<DeviceChoice> select_device(std::string_view flag);

}  // namespace kiln::cuda

// The device memory limit kilnd sets by default (issue 19.6): without one, a single client's
// request could grow the daemon until the kernel's OOM killer took it, and every other job's
// work with it. For the CPU device the limit is a fraction (80 %) of the smaller of the memory
// cgroup's limit and the machine's memory; for a CUDA device a fraction (90 %) of the GPU's
// memory (kilnd). kiln.toml's daemon.device_memory_mib or --device-memory-mib overrides it.
//
// The cgroup limit: every memory cgroup from this process's up to its hierarchy's root bounds it,
// so the smallest limit on that path counts — cgroup v2 `memory.max` ("max" = none) under the
// unified mount, v1 `memory.limit_in_bytes` (a value near 2^63 = none) under the memory
// controller's mount. A path that /proc/self/cgroup names but the mount does not show (a
// container's namespaced view) falls back to the mount's root.
//
// Thread-safety: pure functions over the files named.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kiln::ipc {

struct HostMemory {
  std::uint64_t mem_total = 0;                // /proc/meminfo MemTotal, bytes (0: unknown)
  std::optional<std::uint64_t> cgroup_limit;  // the smallest memory cgroup limit on the path
  std::string cgroup_file;                    // the file that set it (for the log)
};

// `proc` and `cgroup_root` are /proc and /sys/fs/cgroup outside tests.
HostMemory read_host_memory(const std::string& proc = "/proc", const std::string& cgroup_root = "/sys/fs/cgroup");

// `fraction` of the smaller of the cgroup limit and MemTotal; nullopt when neither is known.
std::optional<std::uint64_t> default_host_memory_limit(const HostMemory& host, double fraction = 0.8);

}  // namespace kiln::ipc

// How many cores this process may use: the default size of a device's pool and what the
// spin-wait rule counts (RuntimeOptions). Two limits apply, the smaller wins:
//   - the affinity mask (taskset, a container's cpuset), not every online CPU, which is what
//     std::thread::hardware_concurrency() counts;
//   - the CPU quota of the process's cgroups (cgroup v2 cpu.max, v1 cpu.cfs_quota_us /
//     cpu.cfs_period_us), rounded up to whole cores: a container limited to 2 CPUs of a 64-core
//     host (a Kubernetes CPU limit, `docker run --cpus`) sees all 64 in its mask, and a pool of
//     64 threads there would be throttled, and its waiters' spinning with it.
#pragma once

#include <filesystem>
#include <optional>

namespace kiln::runtime {

// min(affinity mask, cgroup quota), at least 1.
unsigned usable_cores();

// The cores' worth of CPU time the cgroups of a process allow, ceil(quota / period), at least 1;
// nullopt when no quota applies or none can be read. `proc_cgroup` is the process's
// /proc/<pid>/cgroup, `cgroup_root` where the cgroup filesystems are mounted (/sys/fs/cgroup).
// The quota of the process's own cgroup and of every ancestor counts (the smallest wins). Inside a
// container the listed path may not exist below the root (its cgroup is mounted there as the
// root itself): then the root's own files are read.
std::optional<unsigned> cgroup_cpu_quota_cores(const std::filesystem::path& proc_cgroup,
                                               const std::filesystem::path& cgroup_root);

}  // namespace kiln::runtime

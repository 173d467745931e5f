// How many cores this process may use: the default size of a device's pool, what the spin-wait
// rule counts (RuntimeOptions), and the CPU backend's default kernel arena. Two limits apply, the
// smaller wins:
//   - the affinity mask (taskset, a container's cpuset), not every online CPU, which is what
//     std::thread::hardware_concurrency() counts;
//   - the CPU quota of the process's cgroups (cgroup v2 cpu.max, v1 cpu.cfs_quota_us /
//     cpu.cfs_period_us), rounded up to whole cores: a container limited to 2 CPUs of a 64-core
//     host (a Kubernetes CPU limit, `docker run --cpus`) sees all 64 in its mask, and a pool of
//     64 threads there would be throttled, and its waiters' spinning with it.
#pragma once

#include <optional>
#include <string>

namespace kiln::runtime {

// min(affinity mask, cgroup quota), at least 1.
unsigned usable_cores();

// The cores' worth of CPU time the cgroups of a process allow, ceil(quota / period), at least 1;
// nullopt when no quota applies or none can be read. `proc_cgroup` and `proc_mountinfo` are the
// process's /proc/<pid>/cgroup and /proc/<pid>/mountinfo: each cgroup the first lists (the v2
// one, the v1 one holding the cpu controller) is found below the mount of its hierarchy that the
// second lists, and the quota of that cgroup and of every ancestor up to the mount's root
// counts, the smallest winning. Inside a container the mount's root is the container's own
// cgroup; a cgroup outside every mount (a path with "..", under a cgroup namespace) is skipped.
std::optional<unsigned> cgroup_cpu_quota_cores(const std::string& proc_cgroup, const std::string& proc_mountinfo);

}  // namespace kiln::runtime

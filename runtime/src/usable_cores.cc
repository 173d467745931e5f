#include "kiln/runtime/usable_cores.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace kiln::runtime {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> read_small_file(const fs::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::optional<std::int64_t> parse_int(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// Cores' worth of a quota, or nullopt for no limit / an unreadable or malformed one.
std::optional<double> cores_of(std::optional<std::int64_t> quota, std::optional<std::int64_t> period) {
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;  // -1: unlimited (v1)
  return static_cast<double>(*quota) / static_cast<double>(*period);
}

// cgroup v2: "<quota> <period>" or "max <period>".
std::optional<double> read_cpu_max(const fs::path& dir) {
  const std::optional<std::string> text = read_small_file(dir / "cpu.max");
  if (!text) return std::nullopt;
  const std::string_view t(*text);
  const std::size_t space = t.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  return cores_of(parse_int(t.substr(0, space)), parse_int(t.substr(space + 1)));
}

// cgroup v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
std::optional<double> read_cfs_quota(const fs::path& dir) {
  const std::optional<std::string> quota = read_small_file(dir / "cpu.cfs_quota_us");
  const std::optional<std::string> period = read_small_file(dir / "cpu.cfs_period_us");
  if (!quota || !period) return std::nullopt;
  return cores_of(parse_int(*quota), parse_int(*period));
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

// The smallest quota on the way from `mount / cgroup_path` up to `mount`. When the listed path is
// not below the mount (a container whose own cgroup is mounted as the root), the mount alone.
template <class ReadQuota>
std::optional<double> smallest_quota(const fs::path& mount, std::string_view cgroup_path, ReadQuota read) {
  if (!is_dir(mount)) return std::nullopt;
  std::string rel(cgroup_path);
  rel.erase(0, rel.find_first_not_of('/'));
  fs::path dir = rel.empty() ? mount : mount / rel;
  if (!is_dir(dir)) dir = mount;
  std::optional<double> best;
  for (;;) {
    if (const std::optional<double> q = read(dir); q && (!best || *q < *best)) best = q;
    if (dir == mount || !dir.has_parent_path()) break;
    dir = dir.parent_path();
  }
  return best;
}

bool lists_cpu_controller(std::string_view controllers) {
  while (!controllers.empty()) {
    const std::size_t comma = controllers.find(',');
    if (controllers.substr(0, comma) == "cpu") return true;
    if (comma == std::string_view::npos) break;
    controllers.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

std::optional<unsigned> cgroup_cpu_quota_cores(const fs::path& proc_cgroup, const fs::path& cgroup_root) {
  const std::optional<std::string> text = read_small_file(proc_cgroup);
  if (!text) return std::nullopt;
  std::optional<double> best;
  auto take = [&best](std::optional<double> q) {
    if (q && (!best || *q < *best)) best = q;
  };
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    // "<hierarchy id>:<controllers>:<path>"; the path itself may hold ':'.
    const std::size_t c1 = line.find(':');
    if (c1 == std::string::npos) continue;
    const std::size_t c2 = line.find(':', c1 + 1);
    if (c2 == std::string::npos) continue;
    const std::string_view id = std::string_view(line).substr(0, c1);
    const std::string_view controllers = std::string_view(line).substr(c1 + 1, c2 - c1 - 1);
    const std::string_view path = std::string_view(line).substr(c2 + 1);
    if (id == "0" && controllers.empty()) {
      // v2: the unified hierarchy, at the root (pure v2) or at root/unified (hybrid).
      take(smallest_quota(cgroup_root, path, read_cpu_max));
      take(smallest_quota(cgroup_root / "unified", path, read_cpu_max));
    } else if (lists_cpu_controller(controllers)) {
      // v1: mounted as its controller list ("cpu,cpuacct"), often linked as "cpu" too.
      const fs::path named = cgroup_root / std::string(controllers);
      take(smallest_quota(is_dir(named) ? named : cgroup_root / "cpu", path, read_cfs_quota));
    }
  }
  if (!best) return std::nullopt;
  return std::max(1u, static_cast<unsigned>(std::ceil(*best - 1e-9)));
}

unsigned usable_cores() {
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    if (const int n = CPU_COUNT(&set); n > 0) cores = static_cast<unsigned>(n);
  }
  if (const std::optional<unsigned> quota = cgroup_cpu_quota_cores("/proc/self/cgroup", "/sys/fs/cgroup"))
    cores = std::min(cores, *quota);
  return cores;
}

}  // namespace kiln::runtime

#include "kiln/runtime/usable_cores.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

namespace kiln::runtime {
namespace {

std::optional<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

std::optional<std::int64_t> parse_int(std::string_view s) {
  s = trim(s);
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  for (;;) {
    const std::size_t at = s.find(sep);
    parts.push_back(s.substr(0, at));
    if (at == std::string_view::npos) return parts;
    s.remove_prefix(at + 1);
  }
}

bool lists(std::string_view comma_list, std::string_view item) {
  for (std::string_view e : split(comma_list, ','))
    if (e == item) return true;
  return false;
}

// Whole cores a quota allows, ceil(quota / period) in integers (the kernel takes quotas up to
// ~2^44 µs over periods down to 1 ms); nullopt for no limit (-1 in v1, "max" in v2) or a
// malformed one.
std::optional<unsigned> cores_of(std::optional<std::int64_t> quota, std::optional<std::int64_t> period) {
  if (!quota || !period || *quota <= 0 || *period <= 0) return std::nullopt;
  const std::int64_t cores = *quota / *period + (*quota % *period != 0 ? 1 : 0);
  return static_cast<unsigned>(std::min<std::int64_t>(cores, UINT_MAX));
}

// cgroup v2: "<quota> <period>" or "max <period>".
std::optional<unsigned> read_cpu_max(const std::string& dir) {
  const std::optional<std::string> text = read_small_file(dir + "/cpu.max");
  if (!text) return std::nullopt;
  const std::vector<std::string_view> f = split(trim(*text), ' ');
  if (f.size() != 2) return std::nullopt;
  return cores_of(parse_int(f[0]), parse_int(f[1]));
}

// cgroup v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
std::optional<unsigned> read_cfs_quota(const std::string& dir) {
  const std::optional<std::string> quota = read_small_file(dir + "/cpu.cfs_quota_us");
  const std::optional<std::string> period = read_small_file(dir + "/cpu.cfs_period_us");
  if (!quota || !period) return std::nullopt;
  return cores_of(parse_int(*quota), parse_int(*period));
}

// mountinfo escapes space, tab, newline and backslash in paths as \ooo.
std::string unescape(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' && s[i + 2] <= '7' &&
        s[i + 3] >= '0' && s[i + 3] <= '7') {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

struct CgroupMount {
  std::string root;         // the hierarchy's directory mounted here ("/", or a container's own)
  std::string mount_point;  // where
  bool v2 = false;
  std::string super_options;  // v1: the controllers ("rw,cpu,cpuacct")
};

std::vector<CgroupMount> cgroup_mounts(const std::string& mountinfo) {
  std::vector<CgroupMount> mounts;
  std::istringstream lines(mountinfo);
  std::string line;
  while (std::getline(lines, line)) {
    // "<id> <parent> <major:minor> <root> <mount point> <options> [optional fields] - <type> <source> <super options>"
    const std::vector<std::string_view> f = split(line, ' ');
    const auto dash = std::find(f.begin(), f.end(), std::string_view("-"));
    if (f.size() < 6 || dash == f.end() || dash - f.begin() < 6 || f.end() - dash < 4) continue;
    const std::string_view type = dash[1];
    if (type != "cgroup" && type != "cgroup2") continue;
    mounts.push_back(CgroupMount{unescape(f[3]), unescape(f[4]), type == "cgroup2", std::string(dash[3])});
  }
  return mounts;
}

// The components of `path` below `root`, or nullopt when it is not below it or climbs ("..").
std::optional<std::vector<std::string_view>> relative_components(std::string_view path, std::string_view root) {
  while (root.size() > 1 && root.back() == '/') root.remove_suffix(1);
  if (root != "/") {
    if (path.substr(0, root.size()) != root || (path.size() > root.size() && path[root.size()] != '/'))
      return std::nullopt;
    path.remove_prefix(root.size());
  }
  std::vector<std::string_view> parts;
  for (std::string_view p : split(path, '/')) {
    if (p.empty() || p == ".") continue;
    if (p == "..") return std::nullopt;
    parts.push_back(p);
  }
  return parts;
}

// The smallest quota from the cgroup at mount_point/parts up to mount_point itself.
template <class ReadQuota>
std::optional<unsigned> smallest_quota(const CgroupMount& m, const std::vector<std::string_view>& parts,
                                       ReadQuota read) {
  std::string base = m.mount_point;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  std::optional<unsigned> best;
  for (std::size_t depth = parts.size() + 1; depth-- > 0;) {
    std::string dir = base;
    for (std::size_t i = 0; i < depth; ++i) (dir += '/') += parts[i];
    if (const std::optional<unsigned> q = read(dir); q && (!best || *q < *best)) best = q;
  }
  return best;
}

}  // namespace

std::optional<unsigned> cgroup_cpu_quota_cores(const std::string& proc_cgroup, const std::string& proc_mountinfo) {
  const std::optional<std::string> cgroups = read_small_file(proc_cgroup);
  const std::optional<std::string> mountinfo = read_small_file(proc_mountinfo);
  if (!cgroups || !mountinfo) return std::nullopt;
  const std::vector<CgroupMount> mounts = cgroup_mounts(*mountinfo);
  std::optional<unsigned> best;
  std::istringstream lines(*cgroups);
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
    const bool v2 = id == "0" && controllers.empty();
    if (!v2 && !lists(controllers, "cpu")) continue;
    for (const CgroupMount& m : mounts) {
      if (m.v2 != v2 || (!v2 && !lists(m.super_options, "cpu"))) continue;
      const auto parts = relative_components(path, m.root);
      if (!parts) continue;
      const std::optional<unsigned> q =
          v2 ? smallest_quota(m, *parts, read_cpu_max) : smallest_quota(m, *parts, read_cfs_quota);
      if (q && (!best || *q < *best)) best = q;
    }
  }
  if (!best) return std::nullopt;
  return std::max(1u, *best);
}

unsigned usable_cores() {
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    if (const int n = CPU_COUNT(&set); n > 0) cores = static_cast<unsigned>(n);
  }
  if (const std::optional<unsigned> quota = cgroup_cpu_quota_cores("/proc/self/cgroup", "/proc/self/mountinfo"))
    cores = std::min(cores, *quota);
  return cores;
}

}  // namespace kiln::runtime

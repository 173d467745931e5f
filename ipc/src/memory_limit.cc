// The default device memory limit (kiln/ipc/memory_limit.h).
#include "kiln/ipc/memory_limit.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
#include <vector>

namespace kiln::ipc {

namespace {

// v1 reports "no limit" as the largest page-aligned value below 2^63.
constexpr std::uint64_t kV1Unlimited = std::uint64_t{1} << 62;

std::optional<std::string> read_first_line(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::optional<std::uint64_t> parse_u64(std::string_view s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n')) s.remove_suffix(1);
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// A limit file's value: nullopt for none ("max", or v1's near-2^63) or an unreadable file.
std::optional<std::uint64_t> limit_in(const std::filesystem::path& file) {
  std::optional<std::string> line = read_first_line(file);
  if (!line || *line == "max") return std::nullopt;
  std::optional<std::uint64_t> v = parse_u64(*line);
  if (!v || *v >= kV1Unlimited) return std::nullopt;
  return v;
}

std::string without_leading_slashes(const std::string& path) {
  const std::size_t first = path.find_first_not_of('/');
  return first == std::string::npos ? std::string() : path.substr(first);
}

// The smallest limit in `file_name` from `mount/path` up to `mount`.
void smallest_on_path(const std::filesystem::path& mount, const std::string& path, const char* file_name,
                      HostMemory& out) {
  std::string rel = without_leading_slashes(path);
  std::error_code ec;
  if (!rel.empty() && !std::filesystem::is_directory(mount / rel, ec)) rel.clear();  // a namespaced view: the root
  for (;;) {
    const std::filesystem::path file = rel.empty() ? mount / file_name : mount / rel / file_name;
    if (std::optional<std::uint64_t> v = limit_in(file); v && (!out.cgroup_limit || *v < *out.cgroup_limit)) {
      out.cgroup_limit = v;
      out.cgroup_file = file.string();
    }
    if (rel.empty()) break;
    const std::size_t slash = rel.find_last_of('/');
    rel = slash == std::string::npos ? std::string() : rel.substr(0, slash);
  }
}

}  // namespace

HostMemory read_host_memory(const std::string& proc, const std::string& cgroup_root) {
  HostMemory host;
  {
    std::ifstream meminfo(proc + "/meminfo");
    std::string key;
    std::uint64_t kib = 0;
    while (meminfo >> key >> kib) {
      if (key == "MemTotal:") {
        host.mem_total = kib * 1024;
        break;
      }
      meminfo.ignore(1 << 10, '\n');
    }
  }
  // /proc/self/cgroup: "0::/path" (v2), "N:memory:/path" or "N:cpu,memory:/path" (v1).
  std::ifstream cgroups(proc + "/self/cgroup");
  const std::filesystem::path root(cgroup_root);
  std::string line;
  while (std::getline(cgroups, line)) {
    const std::size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      // v2: the unified hierarchy is the mount itself, or "unified" under it on hybrid systems.
      for (const std::filesystem::path& mount : {root, root / "unified"}) {
        std::error_code ec;
        if (std::filesystem::exists(mount / "cgroup.controllers", ec))
          smallest_on_path(mount, path, "memory.max", host);
      }
      continue;
    }
    std::stringstream list(controllers);
    for (std::string c; std::getline(list, c, ',');)
      if (c == "memory") smallest_on_path(root / "memory", path, "memory.limit_in_bytes", host);
  }
  return host;
}

std::optional<std::uint64_t> default_host_memory_limit(const HostMemory& host, double fraction) {
  std::optional<std::uint64_t> base;
  if (host.mem_total != 0) base = host.mem_total;
  if (host.cgroup_limit) base = base ? std::min(*base, *host.cgroup_limit) : *host.cgroup_limit;
  if (!base) return std::nullopt;
  return static_cast<std::uint64_t>(static_cast<double>(*base) * fraction);
}

}  // namespace kiln::ipc

// kiln.toml's [daemon] table (kiln/ipc/daemon_config.h).
#include "kiln/ipc/daemon_config.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace kiln::ipc {

Result<DaemonFileConfig> parse_daemon_config(std::string_view toml_text, std::string_view source_name) {
  DaemonFileConfig cfg;
  // Debian's toml++ is built with exceptions: a parse error is caught here and becomes a value.
  toml::table t;
  try {
    t = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& err) {
    return make_error(ErrorCode::Config, fmt::format("{}:{}:{}: {}", source_name, err.source().begin.line,
                                                     err.source().begin.column, err.description()));
  }
  const toml::node* node = t.get("daemon");
  if (node == nullptr) return cfg;
  const toml::table* d = node->as_table();
  if (d == nullptr) return make_error(ErrorCode::Config, fmt::format("{}: daemon must be a table", source_name));
  for (const auto& [key, value] : *d) {
    const std::string k(key.str());
    std::optional<std::string>* text = nullptr;
    std::optional<std::uint64_t>* number = nullptr;
    std::int64_t minimum = 0;
    if (k == "device") text = &cfg.device;
    else if (k == "runtime_dir") text = &cfg.runtime_dir;
    else if (k == "socket") text = &cfg.socket;
    else if (k == "allowed_group") text = &cfg.allowed_group;
    else if (k == "plan_cache") text = &cfg.plan_cache;
    else if (k == "log_level") text = &cfg.log_level;
    else if (k == "lock_dir") text = &cfg.lock_dir;
    else if (k == "max_connections") number = &cfg.max_connections, minimum = 1;
    else if (k == "max_connections_per_uid") number = &cfg.max_connections_per_uid, minimum = 1;
    else if (k == "job_memory_mib") number = &cfg.job_memory_mib;
    else if (k == "job_queued_ops") number = &cfg.job_queued_ops;
    else if (k == "arena_mib") number = &cfg.arena_mib, minimum = 1;
    else
      return make_error(ErrorCode::Config,
                        fmt::format("{}: daemon.{}: unknown key (expected device, runtime_dir, socket, allowed_group, "
                                    "job_memory_mib, job_queued_ops, arena_mib, plan_cache, log_level, lock_dir, "
                                    "max_connections or max_connections_per_uid)",
                                    source_name, k));
    if (text != nullptr) {
      std::optional<std::string> v = value.value<std::string>();
      if (!value.is_string() || !v || v->empty())
        return make_error(ErrorCode::Config, fmt::format("{}: daemon.{} must be a non-empty string", source_name, k));
      *text = std::move(*v);
    } else {
      std::optional<std::int64_t> v = value.value<std::int64_t>();
      if (!value.is_integer() || !v || *v < minimum)
        return make_error(ErrorCode::Config,
                          fmt::format("{}: daemon.{} must be an integer >= {}", source_name, k, minimum));
      *number = static_cast<std::uint64_t>(*v);
    }
  }
  return cfg;
}

Result<DaemonFileConfig> load_daemon_config(const std::string& path) {
  if (path.empty() || !std::filesystem::exists(path)) return DaemonFileConfig{};
  std::ifstream in(path);
  if (!in) return make_error(ErrorCode::Config, "cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_daemon_config(text.str(), path);
}

}  // namespace kiln::ipc

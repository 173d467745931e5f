// kiln.toml's [daemon] table (kiln/ipc/daemon_config.h).
#include "kiln/ipc/daemon_config.h"

#include "kiln/ipc/daemon.h"
#include "kiln/ipc/log_format.h"
#include "kiln/ipc/metrics_server.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

namespace kiln::ipc {

namespace {

// The keys whose text has a grammar: their value checked as kilnd would parse it.
Status check_text_value(std::string_view key, const std::string& value) {
  if (key == "job_policy") return parse_job_policy(value).status();
  if (key == "log_format") return parse_log_format(value).status();
  // The form only: whether a remote address is allowed is metrics_allow_remote's, checked by kilnd.
  if (key == "metrics") return parse_metrics_listen(value, true).status();
  return Status::Ok();
}

}  // namespace

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
  // Every key of the table: its field, and an integer's bounds (MiB and ms values are bounded so
  // that their conversion to bytes or a deadline cannot overflow).
  constexpr std::int64_t kMaxMib = std::int64_t{1} << 24, kMaxMs = std::int64_t{1} << 32;
  constexpr std::int64_t kNoMax = std::numeric_limits<std::int64_t>::max();
  struct Key {
    const char* name;
    std::optional<std::string>* text;
    std::optional<std::uint64_t>* number;
    std::int64_t minimum;
    std::int64_t maximum = kNoMax;
    std::optional<bool>* flag = nullptr;
  };
  const Key keys[] = {
      {"device", &cfg.device, nullptr, 0},
      {"runtime_dir", &cfg.runtime_dir, nullptr, 0},
      {"socket", &cfg.socket, nullptr, 0},
      {"allowed_group", &cfg.allowed_group, nullptr, 0},
      {"plan_cache", &cfg.plan_cache, nullptr, 0},
      {"log_level", &cfg.log_level, nullptr, 0},
      {"lock_dir", &cfg.lock_dir, nullptr, 0},
      {"job_policy", &cfg.job_policy, nullptr, 0},
      {"max_connections", nullptr, &cfg.max_connections, 1},
      {"max_connections_per_uid", nullptr, &cfg.max_connections_per_uid, 1},
      {"job_memory_mib", nullptr, &cfg.job_memory_mib, 0, kMaxMib},
      {"job_queued_ops", nullptr, &cfg.job_queued_ops, 0},
      {"uid_memory_mib", nullptr, &cfg.uid_memory_mib, 0, kMaxMib},
      {"uid_queued_ops", nullptr, &cfg.uid_queued_ops, 0},
      {"uid_jobs", nullptr, &cfg.uid_jobs, 0},
      {"device_memory_mib", nullptr, &cfg.device_memory_mib, 0, kMaxMib},
      {"completion_timeout_ms", nullptr, &cfg.completion_timeout_ms, 1, kMaxMs},
      {"large_block_mib", nullptr, &cfg.large_block_mib, 1, kMaxMib},
      {"large_block_retention_ms", nullptr, &cfg.large_block_retention_ms, 0, kMaxMs},
      {"plan_save_ms", nullptr, &cfg.plan_save_ms, 1, kMaxMs},
      {"arena_mib", nullptr, &cfg.arena_mib, 1, 65536},
      {"staging_mib", nullptr, &cfg.staging_mib, 0, kMaxMib},
      {"log_format", &cfg.log_format, nullptr, 0},
      {"metrics", &cfg.metrics, nullptr, 0},
      {"metrics_allow_remote", nullptr, nullptr, 0, kNoMax, &cfg.metrics_allow_remote},
  };
  for (const auto& [key, value] : *d) {
    const std::string k(key.str());
    const Key* found = nullptr;
    for (const Key& candidate : keys)
      if (k == candidate.name) found = &candidate;
    if (found == nullptr) {
      std::string names;
      for (const Key& candidate : keys) names += std::string(names.empty() ? "" : ", ") + candidate.name;
      return make_error(ErrorCode::Config,
                        fmt::format("{}: daemon.{}: unknown key (expected one of {})", source_name, k, names));
    }
    std::optional<std::string>* text = found->text;
    std::optional<std::uint64_t>* number = found->number;
    const std::int64_t minimum = found->minimum, maximum = found->maximum;
    if (found->flag != nullptr) {
      if (!value.is_boolean())
        return make_error(ErrorCode::Config, fmt::format("{}: daemon.{} must be true or false", source_name, k));
      *found->flag = value.value<bool>();
    } else if (text != nullptr) {
      std::optional<std::string> v = value.value<std::string>();
      if (!value.is_string() || !v || v->empty())
        return make_error(ErrorCode::Config, fmt::format("{}: daemon.{} must be a non-empty string", source_name, k));
      *text = std::move(*v);
      if (Status st = check_text_value(k, **text); !st.ok())
        return make_error(ErrorCode::Config, fmt::format("{}: daemon.{}: {}", source_name, k, st.error().message));
    } else {
      std::optional<std::int64_t> v = value.value<std::int64_t>();
      if (!value.is_integer() || !v || *v < minimum || *v > maximum)
        return make_error(
            ErrorCode::Config,
            maximum == kNoMax
                ? fmt::format("{}: daemon.{} must be an integer >= {}", source_name, k, minimum)
                : fmt::format("{}: daemon.{} must be an integer in [{}, {}]", source_name, k, minimum, maximum));
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

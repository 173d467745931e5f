// kiln.toml's [daemon] table (kiln/ipc/daemon_config.h).
#include "kiln/ipc/daemon_config.h"

#include "kiln/distributed/config.h"
#include "kiln/ipc/daemon.h"
#include "kiln/ipc/handshake.h"
#include "kiln/ipc/log_format.h"
#include "kiln/ipc/metrics_server.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <sstream>

namespace kiln::ipc {

namespace {

// The keys whose text has a grammar: their value checked as kilnd would parse it.
Status check_text_value(std::string_view key, const std::string& value) {
  if (key == "job_policy") return parse_job_policy(value).status();
  if (key == "log_format") return parse_log_format(value).status();
  // The form only: whether a remote address is allowed is metrics_allow_remote's, checked by kilnd.
  if (key == "metrics") return parse_metrics_listen(value, true).status();
  if (key == "job") return validate_job_name(value);
  if (key == "rendezvous") return distributed::parse_tcp_address(value).status();
  return Status::Ok();
}

// Every integer is bounded so that its conversion to bytes or a deadline cannot overflow.
constexpr std::int64_t kMaxMib = std::int64_t{1} << 24, kMaxMs = std::int64_t{1} << 32;
constexpr std::int64_t kNoMax = std::numeric_limits<std::int64_t>::max();

// One key of a table: its field, and an integer's bounds.
struct Key {
  const char* name;
  std::optional<std::string>* text;
  std::optional<std::uint64_t>* number;
  std::int64_t minimum;
  std::int64_t maximum = kNoMax;
  std::optional<bool>* flag = nullptr;
};

// Stores one value of table `table` into its key's field, checked.
Status parse_value(std::string_view source_name, std::string_view table, const Key& key, const toml::node& value) {
  const std::string_view k = key.name;
  if (key.flag != nullptr) {
    if (!value.is_boolean())
      return make_error(ErrorCode::Config, fmt::format("{}: {}.{} must be true or false", source_name, table, k));
    *key.flag = value.value<bool>();
  } else if (key.text != nullptr) {
    std::optional<std::string> v = value.value<std::string>();
    if (!value.is_string() || !v || v->empty())
      return make_error(ErrorCode::Config, fmt::format("{}: {}.{} must be a non-empty string", source_name, table, k));
    *key.text = std::move(*v);
    if (Status st = check_text_value(k, **key.text); !st.ok())
      return make_error(ErrorCode::Config, fmt::format("{}: {}.{}: {}", source_name, table, k, st.error().message));
  } else {
    std::optional<std::int64_t> v = value.value<std::int64_t>();
    if (!value.is_integer() || !v || *v < key.minimum || *v > key.maximum)
      return make_error(ErrorCode::Config,
                        key.maximum == kNoMax
                            ? fmt::format("{}: {}.{} must be an integer >= {}", source_name, table, k, key.minimum)
                            : fmt::format("{}: {}.{} must be an integer in [{}, {}]", source_name, table, k,
                                          key.minimum, key.maximum));
    *key.number = static_cast<std::uint64_t>(*v);
  }
  return Status::Ok();
}

// Table `table` of the file, if present: every key must be one of `keys`.
Status parse_table(const toml::table& file, std::string_view source_name, std::string_view table,
                   std::span<const Key> keys) {
  const toml::node* node = file.get(table);
  if (node == nullptr) return Status::Ok();
  const toml::table* d = node->as_table();
  if (d == nullptr) return make_error(ErrorCode::Config, fmt::format("{}: {} must be a table", source_name, table));
  for (const auto& [name, value] : *d) {
    const std::string k(name.str());
    const Key* found = nullptr;
    for (const Key& candidate : keys)
      if (k == candidate.name) found = &candidate;
    if (found == nullptr) {
      std::string names;
      for (const Key& candidate : keys) names += std::string(names.empty() ? "" : ", ") + candidate.name;
      return make_error(ErrorCode::Config,
                        fmt::format("{}: {}.{}: unknown key (expected one of {})", source_name, table, k, names));
    }
    KILN_RETURN_IF_ERROR(parse_value(source_name, table, *found, value));
  }
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
  const Key daemon_keys[] = {
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
  KILN_RETURN_IF_ERROR(parse_table(t, source_name, "daemon", daemon_keys));
  DistributedFileConfig& dist = cfg.distributed;
  const Key distributed_keys[] = {
      {"job", &dist.job, nullptr, 0},
      {"rank", nullptr, &dist.rank, 0, distributed::kMaxWorldSize - 1},
      {"world_size", nullptr, &dist.world_size, 1, distributed::kMaxWorldSize},
      {"rendezvous", &dist.rendezvous, nullptr, 0},
      {"host", &dist.host, nullptr, 0},
      {"timeout_ms", nullptr, &dist.timeout_ms, 1, 3'600'000},
  };
  KILN_RETURN_IF_ERROR(parse_table(t, source_name, "distributed", distributed_keys));
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

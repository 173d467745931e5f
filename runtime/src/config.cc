#include "kiln/runtime/config.h"

#include <charconv>
#include <cstdint>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

namespace kiln::runtime {
namespace {

std::optional<std::size_t> parse_positive(std::string_view s) {
  std::size_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || p != s.data() + s.size() || v == 0) return std::nullopt;
  return v;
}

}  // namespace

Result<RuntimeFileConfig> parse_runtime_config(std::string_view toml_text, std::string_view source_name) {
  RuntimeFileConfig cfg;
  // Debian's toml++ is built with exceptions: a parse error is caught here and becomes a value.
  toml::table t;
  try {
    t = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& err) {
    return make_error(ErrorCode::Config, fmt::format("{}:{}:{}: {}", source_name, err.source().begin.line,
                                                     err.source().begin.column, err.description()));
  }
  const toml::node* node = t.get("runtime");
  if (node == nullptr) return cfg;
  const toml::table* rt = node->as_table();
  if (rt == nullptr) return make_error(ErrorCode::Config, fmt::format("{}: runtime must be a table", source_name));
  for (const auto& [key, value] : *rt) {
    if (key.str() == "inline_waits" || key.str() == "spin_waits") {
      if (!value.is_boolean())
        return make_error(ErrorCode::Config,
                          fmt::format("{}: runtime.{} must be true or false", source_name, key.str()));
      (key.str() == "inline_waits" ? cfg.inline_waits : cfg.spin_waits) = value.value<bool>();
      continue;
    }
    std::optional<std::size_t>* slot = nullptr;
    if (key.str() == "threads")
      slot = &cfg.threads;
    else if (key.str() == "drain_batch")
      slot = &cfg.drain_batch;
    else
      return make_error(
          ErrorCode::Config,
          fmt::format("{}: runtime.{}: unknown key (expected threads, drain_batch, inline_waits or spin_waits)",
                      source_name, key.str()));
    std::optional<std::int64_t> v = value.value<std::int64_t>();
    if (!value.is_integer() || !v || *v <= 0)
      return make_error(ErrorCode::Config,
                        fmt::format("{}: runtime.{} must be a positive integer", source_name, key.str()));
    *slot = static_cast<std::size_t>(*v);
  }
  return cfg;
}

RuntimeFileConfig apply_runtime_env(RuntimeFileConfig cfg, const fusion::EnvLookup& env, std::string* warnings) {
  auto apply = [&](std::string_view name, std::optional<std::size_t>& slot) {
    std::optional<std::string> v = env(name);
    if (!v) return;
    if (std::optional<std::size_t> n = parse_positive(*v))
      slot = n;
    else if (warnings)
      *warnings += fmt::format("{}{}='{}' is not a positive integer; ignored", warnings->empty() ? "" : "; ", name, *v);
  };
  apply("KILN_RUNTIME_THREADS", cfg.threads);
  apply("KILN_RUNTIME_DRAIN_BATCH", cfg.drain_batch);
  auto apply_bool = [&](std::string_view name, std::optional<bool>& slot) {
    std::optional<std::string> v = env(name);
    if (!v) return;
    if (std::optional<bool> on = fusion::parse_switch(*v))
      slot = *on;
    else if (warnings)
      *warnings += fmt::format("{}{}='{}' is not 0, 1, true, false, on or off; ignored", warnings->empty() ? "" : "; ",
                               name, *v);
  };
  apply_bool("KILN_RUNTIME_INLINE_WAITS", cfg.inline_waits);
  apply_bool("KILN_RUNTIME_SPIN_WAITS", cfg.spin_waits);
  return cfg;
}

Result<RuntimeFileConfig> load_runtime_config(const std::string& path, const fusion::EnvLookup& env,
                                              std::string* warnings) {
  RuntimeFileConfig cfg;
  if (!path.empty()) {
    std::ifstream in(path);
    if (in) {
      std::stringstream ss;
      ss << in.rdbuf();
      KILN_ASSIGN_OR_RETURN(cfg, parse_runtime_config(ss.str(), path));
    }
  }
  return apply_runtime_env(cfg, env, warnings);
}

}  // namespace kiln::runtime

#include "kiln/fusion/config.h"

#include <fmt/format.h>

#include <toml++/toml.h>
#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace kiln::fusion {
namespace {

std::optional<std::size_t> parse_unsigned(std::string_view s) {
  std::size_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

Result<std::size_t> read_count(toml::node_view<toml::node> node, std::string_view key, std::string_view source) {
  auto v = node.value<std::int64_t>();
  if (!v || *v < 0)
    return make_error(ErrorCode::Config, fmt::format("{}: {} must be a non-negative integer", source, key));
  return static_cast<std::size_t>(*v);
}

}  // namespace

std::optional<bool> parse_switch(std::string_view text) {
  if (text == "1" || text == "true" || text == "on") return true;
  if (text == "0" || text == "false" || text == "off") return false;
  return std::nullopt;
}

EnvLookup process_env() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

Result<FusionConfig> parse_fusion_config(std::string_view toml_text, std::string_view source_name) {
  FusionConfig cfg;
  // Debian's toml++ is built with exceptions: a parse error is caught here and becomes a value.
  toml::table t;
  try {
    t = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& err) {
    return make_error(ErrorCode::Config, fmt::format("{}:{}:{}: {}", source_name, err.source().begin.line,
                                                     err.source().begin.column, err.description()));
  }
  auto fusion = t["fusion"];
  if (auto n = fusion["beam_search"]["max_blocks"]; n) {
    KILN_ASSIGN_OR_RETURN(cfg.max_blocks, read_count(n, "fusion.beam_search.max_blocks", source_name));
    if (cfg.max_blocks == 0)
      return make_error(ErrorCode::Config, fmt::format("{}: fusion.beam_search.max_blocks must be >= 1", source_name));
  }
  for (auto n : {fusion["max_explorations"], fusion["beam_search"]["max_explorations"]}) {
    if (n) {
      KILN_ASSIGN_OR_RETURN(std::size_t v, read_count(n, "fusion.max_explorations", source_name));
      cfg.max_explorations = v;
    }
  }
  if (auto n = fusion["max_plans"]; n) {
    KILN_ASSIGN_OR_RETURN(cfg.max_plans, read_count(n, "fusion.max_plans", source_name));
  }
  if (auto n = fusion["max_plan_triggers"]; n) {
    KILN_ASSIGN_OR_RETURN(cfg.max_plan_triggers, read_count(n, "fusion.max_plan_triggers", source_name));
  }
  if (auto n = fusion["row_fuser"]; n) {
    const std::optional<bool> v = n.value<bool>();
    if (!v)
      return make_error(ErrorCode::Config, fmt::format("{}: fusion.row_fuser must be true or false", source_name));
    cfg.row_fuser = *v;
  }
  if (auto n = fusion["logger"]["level"]; n) {
    auto s = n.value<std::string>();
    auto level = s ? parse_log_level(*s) : std::nullopt;
    if (!level)
      return make_error(
          ErrorCode::Config,
          fmt::format("{}: fusion.logger.level must be one of disabled, basic, medium, full", source_name));
    cfg.log_level = *level;
    cfg.log_to_stderr = *level != LogLevel::Disabled;
  }
  return cfg;
}

FusionConfig apply_fusion_env(FusionConfig cfg, const EnvLookup& env, std::string* warnings) {
  auto warn = [&](const std::string& msg) {
    if (warnings) *warnings += msg + "\n";
  };
  if (auto v = env("KILN_FUSION_LOG")) {
    if (auto level = parse_log_level(*v))
      cfg.log_level = *level;
    else
      warn(fmt::format("KILN_FUSION_LOG={} is not a level (disabled, basic, medium, full); kept {}", *v,
                       log_level_name(cfg.log_level)));
    cfg.log_to_stderr = cfg.log_level != LogLevel::Disabled;
  }
  if (auto v = env("KILN_FUSION_MAX_PLANS")) {
    if (auto n = parse_unsigned(*v))
      cfg.max_plans = *n;
    else
      warn(fmt::format("KILN_FUSION_MAX_PLANS={} is not an unsigned integer; ignored", *v));
  }
  if (auto v = env("KILN_FUSION_MAX_PLAN_TRIGGERS")) {
    if (auto n = parse_unsigned(*v))
      cfg.max_plan_triggers = *n;
    else
      warn(fmt::format("KILN_FUSION_MAX_PLAN_TRIGGERS={} is not an unsigned integer; ignored", *v));
  }
  if (auto v = env("KILN_FUSION_MAX_EXPLORATIONS")) {
    if (auto n = parse_unsigned(*v))
      cfg.max_explorations = *n;
    else
      warn(fmt::format("KILN_FUSION_MAX_EXPLORATIONS={} is not an unsigned integer; ignored", *v));
  }
  if (auto v = env("KILN_FUSION_ROW_FUSER")) {
    if (std::optional<bool> on = parse_switch(*v))
      cfg.row_fuser = *on;
    else
      warn(fmt::format("KILN_FUSION_ROW_FUSER={} is not 0, 1, true, false, on or off; ignored", *v));
  }
  if (auto v = env("KILN_FUSION_MAX_BLOCKS")) {
    if (auto n = parse_unsigned(*v); n && *n > 0)
      cfg.max_blocks = *n;
    else
      warn(fmt::format("KILN_FUSION_MAX_BLOCKS={} is not a positive integer; ignored", *v));
  }
  return cfg;
}

Result<FusionConfig> load_fusion_config(const std::string& path, const EnvLookup& env) {
  FusionConfig cfg;
  std::ifstream in(path);
  if (in) {
    std::stringstream ss;
    ss << in.rdbuf();
    KILN_ASSIGN_OR_RETURN(cfg, parse_fusion_config(ss.str(), path));
  }
  return apply_fusion_env(cfg, env);
}

}  // namespace kiln::fusion

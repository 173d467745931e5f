// kiln-lab: runs named fusion scenarios through one stream's processor with a recording
// executor and prints the fusion log, so every decision of the search can be read.
#include <fmt/format.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kiln/fusion/config.h"
#include "scenarios.h"

namespace {

// kiln-lab --dot: every plan the scenario ended with, as DIR/<scenario>-plan<id>.dot.
bool write_plan_graphs(const std::string& dir, const std::string& scenario, const kiln::lab::ScenarioResult& result) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  for (const auto& [id, dot] : result.plan_graphs) {
    const std::string path = fmt::format("{}/{}-plan{}.dot", dir, scenario, id);
    std::ofstream f(path);
    f << dot;
    if (!f) {
      fmt::print(stderr, "kiln-lab: cannot write {}\n", path);
      return false;
    }
    fmt::print("wrote {}\n", path);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kiln-lab: run fusion scenarios and print the fusion log"};
  std::vector<std::string> names;
  bool all = false;
  std::string level_text;
  std::string config_path = "kiln.toml";
  std::string help_scenarios = "scenarios:\n";
  for (const auto& s : kiln::lab::scenarios()) help_scenarios += fmt::format("  {:<8} {}\n", s.name, s.help);
  app.footer(help_scenarios);
  app.add_option("scenario", names, "scenario names to run (see below)");
  app.add_flag("--all", all, "run every scenario");
  app.add_option("--log", level_text,
                 "fusion log level: disabled, basic, medium, full (default: kiln.toml [fusion.logger] level or "
                 "KILN_FUSION_LOG when they set one, else full)");
  app.add_option("--config", config_path, "configuration file ([fusion] tables)")->capture_default_str();
  std::optional<bool> row_fuser;
  app.add_option_function<std::string>(
         "--row-fuser", [&row_fuser](const std::string& v) { row_fuser = kiln::fusion::parse_switch(v); },
         "kiln's row fuser: on or off (default [fusion] row_fuser, env KILN_FUSION_ROW_FUSER, on); the softmax and "
         "rows scenarios set their own")
      ->check(CLI::IsMember({"on", "off", "true", "false", "1", "0"}));
  std::string dot_dir;
  app.add_option("--dot", dot_dir,
                 "write every plan a scenario ends with as Graphviz DOT: DIR/<scenario>-plan<id>.dot (as kilnctl plans "
                 "show ID --format dot)");
  CLI11_PARSE(app, argc, argv);

  auto config = kiln::fusion::load_fusion_config(config_path, kiln::fusion::process_env());
  if (!config.ok()) {
    fmt::print(stderr, "kiln-lab: {}\n", config.error().message);
    return 2;
  }
  std::optional<kiln::fusion::LogLevel> level = kiln::fusion::LogLevel::Full;  // the lab exists to show the log
  if (!level_text.empty()) {
    level = kiln::fusion::parse_log_level(level_text);
    if (!level) {
      fmt::print(stderr, "kiln-lab: unknown log level '{}' (disabled, basic, medium, full)\n", level_text);
      return 2;
    }
  } else if (config->log_to_stderr) {
    level = config->log_level;
  }
  kiln::fusion::ProcessorOptions options;
  options.max_blocks = config->max_blocks;
  options.max_explorations = config->max_explorations;
  const kiln::fusion::FuserOptions fusers{.row_fuser = row_fuser.value_or(config->row_fuser)};
  if (all) {
    names.clear();
    for (const auto& s : kiln::lab::scenarios()) names.push_back(s.name);
  }
  if (names.empty()) {
    fmt::print("{}\n{}", app.help(), "");
    return 2;
  }
  auto logger = std::make_shared<spdlog::logger>("kiln::fusion", std::make_shared<spdlog::sinks::stdout_sink_mt>());
  logger->set_pattern("%v");
  const auto log = kiln::fusion::FusionLog::to_logger(*level, logger);

  int failures = 0;
  for (const auto& name : names) {
    const kiln::lab::Scenario* scenario = nullptr;
    for (const auto& s : kiln::lab::scenarios())
      if (s.name == name) scenario = &s;
    if (!scenario) {
      fmt::print(stderr, "kiln-lab: unknown scenario '{}'; run kiln-lab --help for the list\n", name);
      return 2;
    }
    fmt::print("\n======== scenario {} — {}\n", scenario->name, scenario->help);
    std::fflush(stdout);
    auto result = scenario->run(log, options, fusers);
    logger->flush();
    fmt::print("\n{} {}\n", result.ok ? "[ok]" : "[UNEXPECTED]", result.summary);
    if (!result.ok) ++failures;
    if (!dot_dir.empty() && !write_plan_graphs(dot_dir, scenario->name, result)) return 2;
  }
  return failures == 0 ? 0 : 1;
}

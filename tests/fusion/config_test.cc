// Fusion configuration: kiln.toml [fusion] tables and KILN_FUSION_* environment overrides.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "kiln/fusion/config.h"
#include "kiln/testing/status.h"

namespace kiln::fusion {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](std::string_view name) -> std::optional<std::string> {
    auto it = vars.find(std::string(name));
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(FusionConfig, Defaults) {
  auto cfg = parse_fusion_config("");
  KILN_ASSERT_OK(cfg);
  EXPECT_EQ(cfg->max_blocks, 5u);
  EXPECT_FALSE(cfg->max_explorations.has_value());
  EXPECT_EQ(cfg->log_level, LogLevel::Disabled);
  EXPECT_EQ(cfg->max_plans, 8192u) << "the device's store is bounded unless the file says 0";
  EXPECT_EQ(cfg->max_plan_triggers, 64u);
  EXPECT_TRUE(cfg->row_fuser) << "kiln's row fuser after Burn's fusers; `row_fuser = false` is Burn's search";
}

TEST(FusionConfig, RowFuserFromTheFileTheEnvironmentAndItsErrors) {
  auto off = parse_fusion_config("[fusion]\nrow_fuser = false\n");
  KILN_ASSERT_OK(off);
  EXPECT_FALSE(off->row_fuser);
  auto on = parse_fusion_config("[fusion]\nrow_fuser = true\n");
  KILN_ASSERT_OK(on);
  EXPECT_TRUE(on->row_fuser);
  auto bad = parse_fusion_config("[fusion]\nrow_fuser = \"no\"\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.error().message, ::testing::HasSubstr("fusion.row_fuser must be true or false"));

  std::string warnings;
  for (const char* v : {"0", "false", "off"})
    EXPECT_FALSE(apply_fusion_env(*on, env_of({{"KILN_FUSION_ROW_FUSER", v}})).row_fuser) << v;
  for (const char* v : {"1", "true", "on"})
    EXPECT_TRUE(apply_fusion_env(*off, env_of({{"KILN_FUSION_ROW_FUSER", v}})).row_fuser) << v;
  EXPECT_FALSE(apply_fusion_env(*off, env_of({{"KILN_FUSION_ROW_FUSER", "maybe"}}), &warnings).row_fuser)
      << "an unparsable value keeps the file's";
  EXPECT_THAT(warnings, ::testing::HasSubstr("KILN_FUSION_ROW_FUSER=maybe"));
}

TEST(FusionConfig, FileValues) {
  auto cfg = parse_fusion_config(R"(
[fusion]
max_explorations = 7
max_plans = 0
max_plan_triggers = 0
[fusion.beam_search]
max_blocks = 3
[fusion.logger]
level = "medium"
)");
  ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
  EXPECT_EQ(cfg->max_blocks, 3u);
  EXPECT_EQ(cfg->max_explorations, 7u);
  EXPECT_EQ(cfg->max_plans, 0u) << "0: every plan kept, as Burn does";
  EXPECT_EQ(cfg->max_plan_triggers, 0u);
  EXPECT_EQ(cfg->log_level, LogLevel::Medium);
}

TEST(FusionConfig, BadValuesAreErrorsNamingTheKey) {
  auto bad_level = parse_fusion_config("[fusion.logger]\nlevel = \"loud\"\n");
  ASSERT_FALSE(bad_level.ok());
  EXPECT_THAT(bad_level.error().message, ::testing::HasSubstr("fusion.logger.level"));
  auto negative = parse_fusion_config("[fusion.beam_search]\nmax_blocks = -1\n");
  ASSERT_FALSE(negative.ok());
  EXPECT_THAT(negative.error().message, ::testing::HasSubstr("max_blocks"));
  auto bad_plans = parse_fusion_config("[fusion]\nmax_plans = \"many\"\n");
  ASSERT_FALSE(bad_plans.ok());
  EXPECT_THAT(bad_plans.error().message, ::testing::HasSubstr("fusion.max_plans"));
  auto syntax = parse_fusion_config("[fusion\n", "x.toml");
  ASSERT_FALSE(syntax.ok());
  EXPECT_EQ(syntax.error().code, ErrorCode::Config);
  EXPECT_THAT(syntax.error().message, ::testing::HasSubstr("x.toml"));
}

TEST(FusionConfig, EnvironmentOverrides) {
  FusionConfig base;
  base.log_level = LogLevel::Basic;
  std::string warnings;
  auto cfg = apply_fusion_env(base,
                              env_of({{"KILN_FUSION_LOG", "FULL"},
                                      {"KILN_FUSION_MAX_EXPLORATIONS", "12"},
                                      {"KILN_FUSION_MAX_BLOCKS", "2"},
                                      {"KILN_FUSION_MAX_PLANS", "64"},
                                      {"KILN_FUSION_MAX_PLAN_TRIGGERS", "8"}}),
                              &warnings);
  EXPECT_EQ(cfg.log_level, LogLevel::Full);
  EXPECT_TRUE(cfg.log_to_stderr);
  EXPECT_EQ(cfg.max_explorations, 12u);
  EXPECT_EQ(cfg.max_blocks, 2u);
  EXPECT_EQ(cfg.max_plans, 64u);
  EXPECT_EQ(cfg.max_plan_triggers, 8u);
  EXPECT_TRUE(warnings.empty());
}

TEST(FusionConfig, UnparsableEnvironmentIsIgnoredWithAWarning) {
  FusionConfig base;
  base.log_level = LogLevel::Medium;
  std::string warnings;
  auto cfg = apply_fusion_env(
      base,
      env_of({{"KILN_FUSION_LOG", "verbose"}, {"KILN_FUSION_MAX_EXPLORATIONS", "x"}, {"KILN_FUSION_MAX_PLANS", "-3"}}),
      &warnings);
  EXPECT_EQ(cfg.log_level, LogLevel::Medium) << "an unknown level keeps the file value";
  EXPECT_TRUE(cfg.log_to_stderr) << "the variable being set switches stderr on";
  EXPECT_FALSE(cfg.max_explorations.has_value());
  EXPECT_THAT(warnings, ::testing::HasSubstr("KILN_FUSION_LOG"));
  EXPECT_THAT(warnings, ::testing::HasSubstr("KILN_FUSION_MAX_EXPLORATIONS"));
  EXPECT_THAT(warnings, ::testing::HasSubstr("KILN_FUSION_MAX_PLANS"));
  EXPECT_EQ(cfg.max_plans, 8192u);
}

TEST(FusionConfig, LevelNames) {
  EXPECT_EQ(parse_log_level("off"), LogLevel::Disabled);
  EXPECT_EQ(parse_log_level("0"), LogLevel::Disabled);
  EXPECT_EQ(parse_log_level("1"), LogLevel::Full);
  EXPECT_EQ(parse_log_level("Basic"), LogLevel::Basic);
  EXPECT_FALSE(parse_log_level("2").has_value());
}

TEST(FusionLogTest, LazyMessagesAreNotBuiltWhenFiltered) {
  auto capture = std::make_shared<LogCapture>();
  auto log = FusionLog::to_capture(LogLevel::Basic, capture);
  int built = 0;
  log.log(LogLevel::Full, [&] {
    ++built;
    return std::string("full");
  });
  log.log(LogLevel::Basic, [&] {
    ++built;
    return std::string("basic");
  });
  EXPECT_EQ(built, 1);
  EXPECT_EQ(capture->lines(), std::vector<std::string>{"basic"});
  FusionLog disabled;
  disabled.log(LogLevel::Basic, [&] {
    ++built;
    return std::string("x");
  });
  EXPECT_EQ(built, 1);
}

}  // namespace
}  // namespace kiln::fusion

// Fusion configuration: kiln.toml, overridden by the environment (docs/spec/fusion.md §17.1, §18;
// architecture "Configuration").
//
//   [fusion]               max_explorations = 10        (also accepted under [fusion.beam_search])
//   [fusion]               max_plans = 8192             (0: every plan kept, as Burn does)
//   [fusion]               max_plan_triggers = 64       (0: every trigger kept, as Burn does)
//   [fusion]               row_fuser = true             (false: Burn's search alone, without kiln's row fuser)
//   [fusion.beam_search]   max_blocks = 5
//   [fusion.logger]        level = "medium"             (disabled | basic | medium | full)
//   KILN_FUSION_LOG, KILN_FUSION_MAX_EXPLORATIONS, KILN_FUSION_MAX_BLOCKS, KILN_FUSION_MAX_PLANS,
//   KILN_FUSION_MAX_PLAN_TRIGGERS, KILN_FUSION_ROW_FUSER
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/base/result.h"
#include "kiln/fusion/fusion_log.h"

namespace kiln::fusion {

struct FusionConfig {
  std::size_t max_blocks = 5;                   // Burn's default; see docs/spec/fusion.md §9.5
  std::optional<std::size_t> max_explorations;  // none = unlimited
  // The device's plan store keeps at most this many plans, evicting the coldest (beyond Burn,
  // whose store grows without bound: 0 restores that). ~34 KiB each with their kernels.
  std::size_t max_plans = 8192;
  // OnOperations triggers one plan keeps (the oldest is dropped past it); 0 keeps every one.
  std::size_t max_plan_triggers = 64;
  // Registers kiln's row fuser after Burn's (FuserOptions::row_fuser; docs/fusion.md).
  bool row_fuser = true;
  LogLevel log_level = LogLevel::Disabled;
  // Whether the environment asked for the log (then it goes to stderr even when the file set
  // no sink, as Burn does).
  bool log_to_stderr = false;
};

using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;
// An environment switch: "1" / "true" / "on" or "0" / "false" / "off"; none for anything else.
std::optional<bool> parse_switch(std::string_view text);
// The process environment.
EnvLookup process_env();

// Parses the [fusion] tables of a kiln.toml text; a malformed file or a wrong value is an error
// naming the key. Keys absent keep their defaults.
Result<FusionConfig> parse_fusion_config(std::string_view toml_text, std::string_view source_name = "kiln.toml");
// Applies the environment on top (unparsable values are ignored, as Burn does, with the reason
// returned in `warnings` if given).
FusionConfig apply_fusion_env(FusionConfig config, const EnvLookup& env, std::string* warnings = nullptr);
// kiln.toml at `path` (absent file = defaults) + environment.
Result<FusionConfig> load_fusion_config(const std::string& path, const EnvLookup& env);

}  // namespace kiln::fusion

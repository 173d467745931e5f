// kiln-lab scenarios: small programs run through one stream's fusion processor with a
// recording executor, so the fusion log shows every decision (docs/fusion.md uses them as the
// worked examples).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/fusion/fusion_log.h"

namespace kiln::lab {

struct ScenarioResult {
  bool ok = true;              // the scenario's own expectations held
  std::string summary;         // one line: what happened (plans, hits, fused blocks)
};

struct Scenario {
  std::string name;
  std::string help;  // one line for --help
  std::function<ScenarioResult(const fusion::FusionLog& log)> run;
};

const std::vector<Scenario>& scenarios();

}  // namespace kiln::lab

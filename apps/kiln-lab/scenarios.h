// kiln-lab scenarios: small programs run through one stream's fusion processor with a
// recording executor, so the fusion log shows every decision (docs/fusion.md uses them as the
// worked examples).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kiln/fusion/fusers.h"
#include "kiln/fusion/fusion_log.h"
#include "kiln/fusion/processor.h"

namespace kiln::lab {

struct ScenarioResult {
  bool ok = true;       // the scenario's own expectations held
  std::string summary;  // one line: what happened (plans, hits, fused blocks)
  // Every plan its store holds at the end, as Graphviz DOT (fusion/plan_graph.h), by plan id:
  // what `kiln-lab --dot DIR` writes and `kilnctl plans show ID --format dot` prints.
  std::vector<std::pair<std::size_t, std::string>> plan_graphs;
};

struct Scenario {
  std::string name;
  std::string help;  // one line for --help
  // `options` and `fusers` come from kiln.toml / the environment / flags (max_blocks,
  // max_explorations, row_fuser); a scenario about one setting sets it itself.
  std::function<ScenarioResult(const fusion::FusionLog& log, const fusion::ProcessorOptions& options,
                               const fusion::FuserOptions& fusers)>
      run;
};

const std::vector<Scenario>& scenarios();

}  // namespace kiln::lab

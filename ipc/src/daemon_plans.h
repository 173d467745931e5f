// kilnctl plans: the daemon's plan store as the operator sees it (docs/operations.md, "Plans").
// Internal to the daemon (daemon.cc's control verb).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "kiln/base/result.h"
#include "kiln/fusion/plan_store.h"

namespace kiln::ipc {

struct PlanListOptions {
  enum class Sort { Hits, Recent, Id } sort = Sort::Hits;
  std::size_t limit = 50;  // 0: every plan
  bool json = false;
};
// "list [hits|recent|id] [N]" (the words after "list"); errors name the word.
Result<PlanListOptions> parse_plan_list(std::span<const std::string_view> words, bool json);

// One line per plan (id, ops, score, hits, last use, the job that created it, the jobs that ran
// it, its blocks), the `limit` first by `sort`, under a header with the store's totals.
// `job_of` names a tag (a job's).
std::string list_plans(const fusion::ExecutionPlanStore& store, const PlanListOptions& options,
                       const std::function<std::string(std::uint32_t)>& job_of);

// One plan as text or Graphviz DOT (fusion/plan_graph.h). Error: no such plan, unknown format.
Result<std::string> show_plan(const fusion::ExecutionPlanStore& store, std::string_view id, std::string_view format);

}  // namespace kiln::ipc

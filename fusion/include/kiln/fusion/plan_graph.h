// A cached plan for people to look at (kilnctl plans, kilnctl plans show, kiln-lab --dot): its
// summary line, a text listing, and a Graphviz DOT graph in the manner of XLA's and PyTorch's
// graph dumps.
//
// DOT: one node per operation (its position, kind and one-line form), one cluster per block of
// the plan's strategy (an Optimization leaf: the fuser's name and score; an Operations leaf:
// "unfused"), edges along the relative tensor ids from the op that writes a tensor to those that
// read it; the plan's inputs (read before any of its ops writes them) and outputs (written and
// not read by a later op of the plan) are ellipses, outputs bold.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string>

#include "kiln/fusion/plan_store.h"

namespace kiln::fusion {

// "ElementWise(630) + Reduce(12) + unfused(1)": the strategy's leaves in execution order.
std::string plan_fusers(const ExecutionPlan& plan);
// The sum of the strategy's fused leaves' scores (0 for an unfused plan).
std::uint64_t plan_score(const ExecutionPlan& plan);
// One operation per line under a header naming the plan, its blocks and their scores.
std::string plan_to_text(PlanId id, const ExecutionPlan& plan);
// The plan as a DOT digraph named plan_<id>; `usage`, when given, goes in the graph's label.
std::string plan_to_dot(PlanId id, const ExecutionPlan& plan, const PlanUsage* usage = nullptr);

}  // namespace kiln::fusion

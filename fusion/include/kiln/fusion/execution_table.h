// The execution table ("fusion trace") logged at Full level for every plan execution
// (docs/spec/fusion.md §17.3).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/fusion/strategy.h"
#include "kiln/ir/operation.h"

namespace kiln::fusion {

// One block of the table: fused (name, score) or un-fused, with the global ops it shows.
struct TableBlock {
  bool fused = false;
  std::string name;
  std::uint64_t score = 0;
  std::vector<const ir::Operation*> ops;
};

// Leaves of the strategy, in execution order, showing the global ops at their positions.
std::vector<TableBlock> trace_blocks(const ExecutionStrategy& strategy, std::span<const ir::Operation> global);
// The whole record (no trailing newline); "fusion block: <empty>" when there are no rows.
std::string format_execution_table(std::span<const TableBlock> blocks);

}  // namespace kiln::fusion

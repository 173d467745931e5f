#include "kiln/fusion/execution_table.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

namespace kiln::fusion {
namespace {

void collect(const ExecutionStrategy& s, std::span<const ir::Operation> global, std::vector<TableBlock>& out) {
  switch (s.kind()) {
    case ExecutionStrategy::Kind::Composed:
      for (const auto& c : s.children()) collect(c, global, out);
      return;
    case ExecutionStrategy::Kind::Optimization:
    case ExecutionStrategy::Kind::Operations: {
      TableBlock b;
      b.fused = s.kind() == ExecutionStrategy::Kind::Optimization;
      if (b.fused) {
        b.name = std::string(s.opt()->name());
        b.score = s.score();
      }
      for (std::size_t p : s.ordering())
        if (p < global.size()) b.ops.push_back(&global[p]);
      out.push_back(std::move(b));
      return;
    }
  }
}

// Display width in code points: the table contains "▸" (3 bytes, 1 column).
std::size_t display_width(const std::string& s) {
  std::size_t w = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++w;
  return w;
}

std::string pad(const std::string& s, std::size_t width) {
  std::string out = s;
  const std::size_t w = display_width(s);
  if (w < width) out.append(width - w, ' ');
  return out;
}

}  // namespace

std::vector<TableBlock> trace_blocks(const ExecutionStrategy& strategy, std::span<const ir::Operation> global) {
  std::vector<TableBlock> out;
  collect(strategy, global, out);
  return out;
}

std::string format_execution_table(std::span<const TableBlock> blocks) {
  std::size_t total = 0;
  for (const auto& b : blocks) total += b.ops.size();
  if (total == 0) return "fusion block: <empty>";

  std::vector<std::array<std::string, 5>> rows;
  rows.reserve(total);
  std::size_t idx = 0;
  for (const auto& b : blocks) {
    for (std::size_t i = 0; i < b.ops.size(); ++i) {
      std::string block_cell;
      if (i == 0) {
        const std::size_t n = b.ops.size();
        const char* unit = n == 1 ? "op" : "ops";
        block_cell = b.fused ? fmt::format("▸ fused {} (score={}, {} {})", b.name, b.score, n, unit)
                             : fmt::format("▸ un-fused ({} {})", n, unit);
      }
      const ir::Operation& op = *b.ops[i];
      rows.push_back({std::to_string(idx++), std::move(block_cell), op.kind_name(), ir::format_tensors(op.inputs()),
                      ir::format_tensors(op.outputs())});
    }
  }
  const std::array<std::string, 5> header = {"idx", "block", "op", "inputs", "outputs"};
  std::array<std::size_t, 5> width{};
  for (int c = 0; c < 5; ++c) {
    width[c] = display_width(header[c]);
    for (const auto& r : rows) width[c] = std::max(width[c], display_width(r[c]));
  }
  std::size_t sum = 0;
  for (auto w : width) sum += w;

  auto line = [&](const std::array<std::string, 5>& cells) {
    std::string s;
    for (int c = 0; c < 5; ++c) {
      if (c) s += "  ";
      s += pad(cells[c], width[c]);
    }
    return s;
  };
  std::string out;
  for (std::size_t i = 0; i < sum + 2 * 4; ++i) out += "═";
  out += fmt::format("\nfusion trace ({} {}, {} {})\n", total, total == 1 ? "op" : "ops", blocks.size(),
                     blocks.size() == 1 ? "block" : "blocks");
  out += line(header);
  out += '\n';
  std::array<std::string, 5> sep;
  for (int c = 0; c < 5; ++c) sep[c] = std::string(width[c], '-');
  out += line(sep);
  for (const auto& r : rows) {
    out += '\n';  // appended separately: GCC 12 -O3 reports a false -Wrestrict on "\n" + string
    out += line(r);
  }
  return out;
}

}  // namespace kiln::fusion

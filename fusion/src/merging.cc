#include "kiln/fusion/merging.h"

#include <utility>

namespace kiln::fusion {
namespace {

// "apply accumulate to list L" (§11): Full -> L = [m]; Partial -> L = merged, failed += fs;
// Fail -> L unchanged.
void accumulate(std::vector<Block>& list, std::vector<Block>& failed, const Reachability& guard) {
  if (list.empty()) return;
  MergeResult r = merge_accumulator(list[0], std::span<const Block>(list).subspan(1), guard);
  switch (r.kind) {
    case MergeResult::Kind::Full:
    case MergeResult::Kind::Partial:
      list = std::move(r.merged);
      for (Block& b : r.failed) failed.push_back(std::move(b));
      break;
    case MergeResult::Kind::Fail: break;
  }
}

void append(std::vector<Block>& to, std::vector<Block>& from) {
  for (Block& b : from) to.push_back(std::move(b));
  from.clear();
}

}  // namespace

MergeResult MergeResult::full(Block b) {
  MergeResult r;
  r.kind = Kind::Full;
  r.merged.push_back(std::move(b));
  return r;
}

MergeResult MergeResult::partial(std::vector<Block> merged, std::vector<Block> failed) {
  MergeResult r;
  r.kind = Kind::Partial;
  r.merged = std::move(merged);
  r.failed = std::move(failed);
  return r;
}

std::vector<DagNode> block_nodes(std::span<const Block> blocks) {
  std::vector<DagNode> nodes;
  nodes.reserve(blocks.size());
  for (const Block& b : blocks) nodes.push_back(b.dag_node());
  return nodes;
}

std::optional<Block> merge_two(const Block& a, const Block& b, const Reachability& guard) {
  if (!guard.can_contract(a.constituents(), b.constituents())) return std::nullopt;
  // Both directions: the accumulator may depend on the block it absorbs, and then only folding
  // it INTO that block gives a valid op order.
  if (a.can_append(b)) {
    Block m(a);
    if (m.merge(b)) return m;
  }
  if (b.can_append(a)) {
    Block m(b);
    if (m.merge(a)) return m;
  }
  return std::nullopt;
}

MergeResult merge_accumulator(const Block& base, std::span<const Block> rest, const Reachability& guard) {
  Block acc(base);
  bool success = false;
  std::vector<Block> fails;
  for (const Block& b : rest) {
    if (std::optional<Block> m = merge_two(acc, b, guard)) {
      acc = std::move(*m);
      success = true;
    } else {
      fails.push_back(b);
    }
  }
  if (!success) return MergeResult::fail();
  if (fails.empty()) return MergeResult::full(std::move(acc));
  std::vector<Block> merged;
  merged.push_back(std::move(acc));
  return MergeResult::partial(std::move(merged), std::move(fails));
}

MergeResult merge_block_list(std::span<const Block* const> bs, bool sorted, const Reachability& guard) {
  if (bs.empty()) return MergeResult::fail();
  if (bs.size() == 1) return MergeResult::full(*bs[0]);
  if (bs.size() == 2) {
    std::optional<Block> m = merge_two(*bs[0], *bs[1], guard);
    return m ? MergeResult::full(std::move(*m)) : MergeResult::fail();
  }

  // Step 1: consecutive groups, merged recursively.
  const std::size_t step = bs.size() / 2;
  const std::size_t groups = (bs.size() + step - 1) / step;
  std::vector<Block> full, partial, failed;
  for (std::size_t g = 0; g < groups; ++g) {
    const std::size_t begin = g * step;
    const std::size_t end = std::min((g + 1) * step, bs.size());
    MergeResult r = merge_block_list(bs.subspan(begin, end - begin), false, guard);
    switch (r.kind) {
      case MergeResult::Kind::Full: full.push_back(std::move(r.merged[0])); break;
      case MergeResult::Kind::Partial:
        append(partial, r.merged);
        append(failed, r.failed);
        break;
      case MergeResult::Kind::Fail:
        for (std::size_t i = begin; i < end; ++i) failed.push_back(*bs[i]);
        break;
    }
  }
  if (full.size() == 1 && partial.empty() && failed.empty()) return MergeResult::full(std::move(full[0]));
  if (partial.size() == 1 && full.empty() && failed.empty()) return MergeResult::full(std::move(partial[0]));

  // Step 2: accumulate.
  if (partial.size() > 1) accumulate(partial, failed, guard);  // (a)
  if (!failed.empty()) {                                       // (b)
    append(partial, failed);
    accumulate(partial, failed, guard);
  }
  if (full.size() > 1) accumulate(full, failed, guard);  // (c)
  if (!full.empty()) {                                   // (d)
    append(full, failed);
    accumulate(full, failed, guard);
  }
  if (!full.empty() || !partial.empty()) {  // (e)
    append(full, partial);
    accumulate(full, failed, guard);
  }

  MergeResult result;
  if (full.empty()) {
    result = MergeResult::fail();
  } else if (failed.empty() && full.size() == 1) {
    result = MergeResult::full(std::move(full[0]));
  } else {
    result = MergeResult::partial(std::move(full), std::move(failed));
  }
  if (sorted && result.is_partial()) {
    Block::sort_by_start_pos(result.merged);
    Block::sort_by_start_pos(result.failed);
  }
  return result;
}

MergeResult merge_block_list(std::span<const Block> blocks, bool sorted, const Reachability& guard) {
  std::vector<const Block*> ptrs;
  ptrs.reserve(blocks.size());
  for (const Block& b : blocks) ptrs.push_back(&b);
  return merge_block_list(std::span<const Block* const>(ptrs), sorted, guard);
}

}  // namespace kiln::fusion

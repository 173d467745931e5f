// RelativeConverter (docs/spec/fusion.md §3.1–§3.7).
#include "kiln/ir/relative.h"

#include <cassert>

namespace kiln::ir {

RelativeConverter::RelativeConverter() { seed_shapes(); }

void RelativeConverter::seed_shapes() {
  // The dimension value 1 is always relative dim id 0 (docs/spec/fusion.md §3.1).
  shapes_glob2rel_.emplace(1, 0);
  shapes_rel2glob_.push_back(1);
}

void RelativeConverter::clear() {
  // clear() keeps the vectors' capacity and the maps' bucket arrays: the queue clears the
  // converter after every execution (docs/spec/fusion.md §3.9), so storage is reused across segments.
  tensors_rel2glob_.clear();
  tensors_glob2rel_.clear();
  shapes_glob2rel_.clear();
  shapes_rel2glob_.clear();
  scalars_.clear();
  ranges_.clear();
  seed_shapes();
}

std::uint64_t RelativeConverter::relativize_dim(std::uint64_t value) {
  // A new id is size(shapes_glob2rel), which equals size(shapes_rel2glob): the ids are dense.
  auto [it, inserted] = shapes_glob2rel_.try_emplace(value, shapes_rel2glob_.size());
  if (inserted) shapes_rel2glob_.push_back(value);
  return it->second;
}

void RelativeConverter::relativize_tensor_into(const TensorIr& global, TensorIr& out) {
  assert(&global != &out);
  // Ids by first appearance (docs/spec/fusion.md §3.2); rel2glob always holds the latest occurrence.
  auto [it, inserted] = tensors_glob2rel_.try_emplace(global.id, tensors_rel2glob_.size());
  const std::uint64_t rel = it->second;
  if (inserted) {
    tensors_rel2glob_.push_back(global);
  } else {
    tensors_rel2glob_[rel] = global;
  }
  out.id = TensorId(rel);
  out.shape.resize(global.shape.size());
  for (std::size_t i = 0; i < global.shape.size(); ++i) out.shape[i] = relativize_dim(global.shape[i]);
  // Status and dtype are kept verbatim (docs/spec/fusion.md §3.3).
  out.status = global.status;
  out.dtype = global.dtype;
}

TensorIr RelativeConverter::relativize_tensor(const TensorIr& global) {
  TensorIr out;
  relativize_tensor_into(global, out);
  return out;
}

ScalarIr RelativeConverter::relativize_scalar(const ScalarIr& value) {
  // Positional, never deduplicated, whatever the variant (docs/spec/fusion.md §3.4).
  const std::uint64_t k = scalars_.size();
  scalars_.push_back(value);
  return ScalarIr::UInt(k);
}

Slice RelativeConverter::relativize_range(const Slice& value) {
  // docs/spec/fusion.md §3.5: {start = k, end = None, step = 1}.
  const std::uint64_t k = ranges_.size();
  ranges_.push_back(value);
  return Slice{static_cast<std::int64_t>(k), std::nullopt, 1};
}

void RelativeConverter::relativize_into(const Operation& global, Operation& out) {
  assert(&global != &out);
  // Variant, family, carried dtype, attributes and the custom id are kept verbatim (§3.6).
  out.kind = global.kind;
  out.family = global.family;
  out.dtype = global.dtype;
  out.num_inputs = global.num_inputs;
  // The flat layout's tensors are inputs then outputs in field order, so visiting them in
  // sequence is the normative order (§3.7). Tensors, scalars and ranges have independent
  // counters, so visiting the three lists one after the other equals Burn's interleaving.
  out.tensors.resize(global.tensors.size());
  for (std::size_t i = 0; i < global.tensors.size(); ++i) relativize_tensor_into(global.tensors[i], out.tensors[i]);
  out.scalars.resize(global.scalars.size());
  for (std::size_t i = 0; i < global.scalars.size(); ++i) out.scalars[i] = relativize_scalar(global.scalars[i]);
  out.ranges.resize(global.ranges.size());
  for (std::size_t i = 0; i < global.ranges.size(); ++i) out.ranges[i] = relativize_range(global.ranges[i]);
  out.attrs.assign(global.attrs.begin(), global.attrs.end());
  out.custom_id.assign(global.custom_id);  // reuses the string's capacity
}

Operation RelativeConverter::relativize(const Operation& global) {
  Operation out;
  relativize_into(global, out);
  return out;
}

}  // namespace kiln::ir

// RelativeConverter: rewrites operations into the relative form the fusion search and the plan
// cache see (docs/spec/fusion.md §3): tensor ids numbered by first appearance, dimension values numbered
// with the value 1 always id 0, scalars and slice ranges replaced by positional placeholders
// whose concrete values are kept here and bound again at execution.
//
// Thread-safety: none; one converter belongs to one operation queue (one stream actor).
//
// Usage:
//   RelativeConverter conv;
//   Operation rel;
//   for (const Operation& op : segment) conv.relativize_into(op, rel);  // rel's storage reused
//   conv.scalars()[0];            // concrete value of placeholder UInt(0)
//   conv.clear();                 // after execution: renumber the rest of the queue (docs/spec/fusion.md §3.9)
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kiln/ir/operation.h"

namespace kiln::ir {

class RelativeConverter {
 public:
  RelativeConverter();

  // Forget everything; the shape maps are seeded again with 1 <-> 0.
  void clear();

  // Relativizes one operation in the normative visiting order (tensors, then scalars, then
  // ranges; each kind numbered independently, so this equals Burn's field order).
  Operation relativize(const Operation& global);
  // Writes the relative form into `out` (reusing its storage); same as relativize().
  // `out` must not be `global`.
  void relativize_into(const Operation& global, Operation& out);

  TensorIr relativize_tensor(const TensorIr& global);
  ScalarIr relativize_scalar(const ScalarIr& value);
  Slice relativize_range(const Slice& value);
  std::uint64_t relativize_dim(std::uint64_t value);

  // Size of shapes_rel2glob: one past the highest relative dim id handed out (>= 1).
  std::size_t num_relative_shapes() const { return shapes_rel2glob_.size(); }
  std::size_t num_relative_tensors() const { return tensors_rel2glob_.size(); }

  // The execution context (docs/spec/fusion.md §3.10).
  // Latest global occurrence of relative tensor `rel`, or nullptr.
  const TensorIr* global_tensor(std::uint64_t rel) const {
    return rel < tensors_rel2glob_.size() ? &tensors_rel2glob_[rel] : nullptr;
  }
  std::span<const TensorIr> tensors_rel2glob() const { return tensors_rel2glob_; }
  std::span<const std::uint64_t> shapes_rel2glob() const { return shapes_rel2glob_; }
  std::span<const ScalarIr> scalars() const { return scalars_; }
  std::span<const Slice> ranges() const { return ranges_; }

 private:
  void seed_shapes();
  // relativize_tensor writing into `out` (reusing its shape storage).
  void relativize_tensor_into(const TensorIr& global, TensorIr& out);

  std::vector<TensorIr> tensors_rel2glob_;
  std::unordered_map<TensorId, std::uint64_t> tensors_glob2rel_;
  std::unordered_map<std::uint64_t, std::uint64_t> shapes_glob2rel_;
  std::vector<std::uint64_t> shapes_rel2glob_;
  std::vector<ScalarIr> scalars_;
  std::vector<Slice> ranges_;
};

}  // namespace kiln::ir

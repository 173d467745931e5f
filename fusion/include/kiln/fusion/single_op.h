// Single operations as one-op fused programs: an elementwise, scalar, unary, comparison, cast,
// clamp or mask op, ones / zeros / full, gather / select / cat, swap_dims, a dim or whole-tensor
// reduction, or a float matmul becomes a FusedProgram of one op over relative ids, so that a
// backend's compiled form for that structure (cached, size- and scalar-independent) runs the
// unfused op too. Shared by the CPU fast executor and the CUDA backend.
//
// Usage:
//   OneOpTables t;
//   if (single_op_eligible(op, kMaxRank)) if (auto p = synthesize_single_op(op, t)) run(*p, t);
//
// Thread-safety: pure functions and plain values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/fusion/fused_program.h"
#include "kiln/ir/operation.h"

namespace kiln::fusion {

// Relative tables of a one-op program, numbered as the relative converter would number them.
struct OneOpTables {
  std::vector<ir::TensorIr> tensors;
  std::vector<std::uint64_t> dims{1};
  std::vector<ir::ScalarIr> scalars;

  std::uint64_t tensor(const ir::TensorIr& t) {
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].id == t.id) return i;
    tensors.push_back(t);
    return tensors.size() - 1;
  }
  std::uint64_t dim(std::uint64_t v) {
    for (std::size_t i = 0; i < dims.size(); ++i)
      if (dims[i] == v) return i;
    dims.push_back(v);
    return dims.size() - 1;
  }
  ir::Shape shape(const ir::Shape& s) {
    ir::Shape r;
    for (std::uint64_t d : s) r.push_back(dim(d));
    return r;
  }
  std::uint32_t scalar(const ir::ScalarIr& s) {
    scalars.push_back(s);
    return static_cast<std::uint32_t>(scalars.size() - 1);
  }
};

// The checks the reference executor makes before running an op of the signatures above: a
// backend takes only ops the reference would run, so errors always come from the reference.
// `max_rank`: the backend's largest supported rank.
bool single_op_eligible(const ir::Operation& op, std::size_t max_rank);

// The one-op program of an eligible op (tables filled), or nullopt when no program covers it.
std::optional<FusedProgram> synthesize_single_op(const ir::Operation& op, OneOpTables& t);

// The program output for `out`, stored from register `local` of block `block`.
ProgramOutput single_op_output(OneOpTables& t, const ir::TensorIr& out, std::uint32_t block, std::uint32_t local);

}  // namespace kiln::fusion

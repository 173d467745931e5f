// Single operations as one-op programs (single_op.h): fusion/single_op.h's synthesis, shared with
// the CPU fast path, plus permute.
#include "kiln/cuda/single_op.h"

#include "kiln/fusion/single_op.h"
#include "kiln/fusion/trace_fuser.h"
#include "kiln/ir/op_table.h"
#include "kiln/ir/shape.h"

namespace kiln::cuda {

using fusion::FusedProgram;
using fusion::ProgramKind;
using ir::OpKind;
using ir::TensorStatus;

std::optional<SingleOpProgram> single_op_program(const ir::Operation& op) {
  if (op.kind == OpKind::Drop_Drop || op.kind == OpKind::Init_Init) return std::nullopt;
  fusion::OneOpTables t;
  std::optional<FusedProgram> p;
  std::optional<std::vector<std::uint64_t>> axes;
  if (op.kind == OpKind::Base_Permute) {
    // A strided copy: the program reads input 0 as if it had the output's shape; the host
    // replaces that read's strides by the permuted ones.
    if (!op.validate().ok() || op.inputs().size() != 1 || op.outputs().size() != 1) return std::nullopt;
    const ir::TensorIr& in = op.inputs()[0];
    const ir::TensorIr& out = op.outputs()[0];
    if (in.dtype.is_quantized() || in.shape.size() > static_cast<std::size_t>(kMaxRank) || !(out.dtype == in.dtype))
      return std::nullopt;
    std::vector<std::uint64_t> ax;
    for (std::int64_t a : op.attrs) {
      if (a < 0) return std::nullopt;
      ax.push_back(static_cast<std::uint64_t>(a));
    }
    Result<ir::Shape> s = ir::shape::permuted(in.shape, ax);
    if (!s.ok() || *s != out.shape) return std::nullopt;
    FusedProgram fp;
    fp.kind = ProgramKind::Elementwise;
    fp.len = 1;
    fusion::ProgramBlock b;
    b.settings = fusion::FuseSettings::elementwise();
    b.reference_shape = t.shape(out.shape);
    fp.inputs.push_back(fusion::ProgramInput{t.tensor(in), in.dtype, b.reference_shape, in.status,
                                             fusion::InputRole::Plain, std::nullopt});
    b.registers.push_back(in.dtype);
    b.loads.push_back(fusion::Load{fusion::LoadSource::Input, 0, 0, false});
    b.stores.push_back(fusion::Store{0, 0});
    fp.blocks.push_back(std::move(b));
    fp.outputs.push_back(fusion::single_op_output(t, out, 0, 0));
    p = std::move(fp);
    axes = std::move(ax);
  } else {
    if (!fusion::single_op_eligible(op, static_cast<std::size_t>(kMaxRank))) return std::nullopt;
    p = fusion::synthesize_single_op(op, t);
  }
  if (!p) return std::nullopt;
  SingleOpProgram s;
  s.program = std::move(*p);
  s.tensors = std::move(t.tensors);
  s.dims = std::move(t.dims);
  s.scalars = std::move(t.scalars);
  s.permute_axes = std::move(axes);
  return s;
}

}  // namespace kiln::cuda

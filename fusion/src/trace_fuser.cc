#include "kiln/fusion/trace_fuser.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

namespace kiln::fusion {
namespace {

using ir::TensorIr;
using ir::TensorStatus;

// A tensor read in a block whose reference shape has a real size where the tensor has size 1
// (relative dim 0). Different non-zero relative ids are different sizes, never a broadcast.
bool is_broadcast(const ir::Shape& shape, const ir::Shape& reference) {
  if (reference.empty()) return false;
  if (shape.size() != reference.size()) return true;
  for (std::size_t i = 0; i < shape.size(); ++i)
    if (shape[i] == 0 && reference[i] != 0) return true;
  return false;
}

}  // namespace

// ---- TraceBlock

std::optional<std::uint32_t> TraceBlock::local_of(std::uint64_t tensor) const {
  for (const auto& [id, reg] : locals)
    if (id == tensor) return reg;
  return std::nullopt;
}

bool TraceBlock::read_from_input(std::uint64_t tensor) const {
  return std::any_of(reads.begin(), reads.end(),
                     [&](const TraceRead& r) { return r.kind == TraceReadKind::Input && r.tensor == tensor; });
}

// ---- Trace

Trace::Trace(FuseSettings first_block) {
  TraceBlock b;
  b.settings = first_block;
  blocks_.push_back(std::move(b));
}

std::optional<std::uint32_t> Trace::find_input(std::uint64_t tensor) const {
  for (std::size_t i = 0; i < inputs_.size(); ++i)
    if (inputs_[i].tensor.id.value() == tensor) return static_cast<std::uint32_t>(i);
  return std::nullopt;
}

std::optional<std::uint32_t> Trace::find_output(std::uint64_t tensor) const {
  for (std::size_t i = 0; i < outputs_.size(); ++i)
    if (outputs_[i].tensor.id.value() == tensor) return static_cast<std::uint32_t>(i);
  return std::nullopt;
}

std::uint32_t Trace::new_register(ir::DType dtype) {
  TraceBlock& b = current();
  b.registers.push_back(dtype);
  return static_cast<std::uint32_t>(b.registers.size() - 1);
}

void Trace::set_local(std::uint64_t tensor, std::uint32_t reg) {
  TraceBlock& b = current();
  for (auto& [id, r] : b.locals)
    if (id == tensor) {
      r = reg;
      return;
    }
  b.locals.emplace_back(tensor, reg);
}

void Trace::use(const TensorIr& t) {
  const std::uint64_t id = t.id.value();
  for (TraceInput& in : inputs_)
    if (in.tensor.id.value() == id) in.tensor.status = t.status;
  for (TraceOutput& out : outputs_)
    if (out.tensor.id.value() == id) out.tensor.status = t.status;
}

void Trace::use_scalar(std::uint32_t k) {
  auto it = std::lower_bound(scalars_.begin(), scalars_.end(), k);
  if (it == scalars_.end() || *it != k) scalars_.insert(it, k);
}

std::optional<std::uint32_t> Trace::read(const TensorIr& t) {
  if (t.dtype.is_quantized()) return std::nullopt;  // only Dequantize may read those (not supported)
  const std::uint64_t id = t.id.value();
  const std::optional<std::uint32_t> input = find_input(id);
  if (input && inputs_[*input].indexed) return std::nullopt;  // once indexed, never read plainly
  use(t);
  if (auto local = current().local_of(id)) return local;
  const std::uint32_t reg = new_register(t.dtype);
  if (auto output = find_output(id)) {
    // Produced by an earlier block: that block writes it, this one reads it back.
    current().reads.push_back(TraceRead{TraceReadKind::Output, *output, id, reg, std::nullopt});
  } else {
    std::uint32_t index;
    if (input) {
      index = *input;
    } else {
      inputs_.push_back(TraceInput{t, false, false});
      index = static_cast<std::uint32_t>(inputs_.size() - 1);
    }
    current().reads.push_back(TraceRead{TraceReadKind::Input, index, id, reg, std::nullopt});
  }
  set_local(id, reg);
  return reg;
}

std::optional<std::uint32_t> Trace::read_indexed(const TensorIr& t) {
  if (t.dtype.is_quantized()) return std::nullopt;
  const std::uint64_t id = t.id.value();
  if (auto input = find_input(id)) {
    if (!inputs_[*input].indexed) return std::nullopt;  // already a plain input
    use(t);
    return input;
  }
  if (find_output(id)) return std::nullopt;  // produced inside the trace
  inputs_.push_back(TraceInput{t, true, false});
  return static_cast<std::uint32_t>(inputs_.size() - 1);
}

bool Trace::can_view(const TensorIr& source) const {
  const std::uint64_t id = source.id.value();
  const std::optional<std::uint32_t> input = find_input(id);
  if (!input || inputs_[*input].indexed) return false;
  if (find_output(id)) return false;  // an in-trace result
  return blocks_.back().read_from_input(id);
}

std::optional<std::uint32_t> Trace::read_view(const TensorIr& source, const TensorIr& out, ViewSpec spec) {
  if (!can_view(source) || out.dtype.is_quantized()) return std::nullopt;
  const std::optional<std::uint32_t> out_input = find_input(out.id.value());
  if (out_input && inputs_[*out_input].indexed) return std::nullopt;
  use(source);
  const std::uint32_t index = *find_input(source.id.value());
  const std::uint32_t reg = new_register(out.dtype);
  current().reads.push_back(TraceRead{TraceReadKind::View, index, source.id.value(), reg, std::move(spec)});
  set_local(out.id.value(), reg);
  if (auto existing = find_output(out.id.value())) {
    outputs_[*existing] = TraceOutput{out, static_cast<std::uint32_t>(blocks_.size() - 1), reg, std::nullopt};
  } else {
    outputs_.push_back(TraceOutput{out, static_cast<std::uint32_t>(blocks_.size() - 1), reg, std::nullopt});
  }
  return reg;
}

std::optional<std::uint32_t> Trace::write(const TensorIr& t) {
  if (t.dtype.is_quantized()) return std::nullopt;
  const std::uint64_t id = t.id.value();
  const std::optional<std::uint32_t> input = find_input(id);
  if (input && inputs_[*input].indexed) return std::nullopt;  // once indexed, never written
  const std::uint32_t reg = new_register(t.dtype);
  set_local(id, reg);
  const auto block = static_cast<std::uint32_t>(blocks_.size() - 1);
  if (auto existing = find_output(id)) {
    // The same id produced again (an in-place op): the latest value is the output.
    outputs_[*existing] = TraceOutput{t, block, reg, std::nullopt};
  } else {
    outputs_.push_back(TraceOutput{t, block, reg, std::nullopt});
  }
  return reg;
}

std::optional<std::uint32_t> Trace::register_unhandled_input(const TensorIr& t) {
  if (t.dtype.is_quantized()) return std::nullopt;
  if (auto input = find_input(t.id.value())) {
    if (inputs_[*input].indexed) return std::nullopt;
    use(t);
    return input;
  }
  if (find_output(t.id.value())) return std::nullopt;
  inputs_.push_back(TraceInput{t, false, true});
  return static_cast<std::uint32_t>(inputs_.size() - 1);
}

std::optional<std::uint32_t> Trace::next_block(const TensorIr& handover, const ir::Shape& reference,
                                               FuseSettings settings) {
  const std::optional<std::uint32_t> reg = read(handover);
  if (!reg) return std::nullopt;
  current().reference_shape = reference;
  TraceBlock b;
  b.settings = settings;
  blocks_.push_back(std::move(b));
  return reg;
}

bool Trace::set_output_layout(std::uint64_t tensor, Permutation layout) {
  const std::optional<std::uint32_t> out = find_output(tensor);
  if (!out) return false;
  outputs_[*out].layout = std::move(layout);
  return true;
}

bool Trace::is_written(std::size_t output) const {
  if (outputs_[output].tensor.status != TensorStatus::ReadWrite) return true;
  for (const TraceBlock& b : blocks_)
    for (const TraceRead& r : b.reads)
      if (r.kind == TraceReadKind::Output && r.index == output) return true;
  return false;
}

std::uint32_t Trace::estimate_bindings() const {
  std::size_t n = 1 + inputs_.size();
  for (std::size_t i = 0; i < outputs_.size(); ++i) n += is_written(i);
  return static_cast<std::uint32_t>(std::min<std::size_t>(n, std::numeric_limits<std::uint32_t>::max()));
}

FusedIo Trace::fused_io() const {
  FusedIo io;
  for (const TraceBlock& b : blocks_)
    for (const TraceRead& r : b.reads) {
      io.reads += 1;
      if (r.kind == TraceReadKind::View) io.penalty += 1;
    }
  for (std::size_t i = 0; i < outputs_.size(); ++i) io.writes += is_written(i);
  return io;
}

FusedProgram Trace::to_program(ProgramKind kind, const ir::Shape& last_reference) const {
  FusedProgram p;
  p.kind = kind;
  p.scalars = scalars_;
  p.matmul = matmul_;
  p.inputs.reserve(inputs_.size());
  for (const TraceInput& in : inputs_)
    p.inputs.push_back(ProgramInput{in.tensor.id.value(), in.tensor.dtype, in.tensor.shape, in.tensor.status,
                                    in.indexed ? InputRole::Indexed : InputRole::Plain, std::nullopt});
  p.blocks.reserve(blocks_.size());
  for (std::size_t bi = 0; bi < blocks_.size(); ++bi) {
    const TraceBlock& tb = blocks_[bi];
    ProgramBlock pb;
    pb.reference_shape = bi + 1 == blocks_.size() ? last_reference : tb.reference_shape;
    pb.settings = tb.settings;
    pb.registers = tb.registers;
    pb.reduction = tb.reduction;
    pb.instructions = tb.instructions;
    for (const TraceRead& r : tb.reads) {
      switch (r.kind) {
        case TraceReadKind::Input: {
          const bool bc = is_broadcast(inputs_[r.index].tensor.shape, pb.reference_shape);
          if (bc && p.inputs[r.index].role == InputRole::Plain) p.inputs[r.index].role = InputRole::Broadcast;
          pb.loads.push_back(Load{LoadSource::Input, r.index, r.local, bc});
          break;
        }
        case TraceReadKind::Output:
          pb.loads.push_back(Load{LoadSource::Output, r.index, r.local,
                                  is_broadcast(outputs_[r.index].tensor.shape, pb.reference_shape)});
          break;
        case TraceReadKind::View: {
          const TensorIr& src = inputs_[r.index].tensor;
          ViewSpec spec = *r.view;
          spec.source = r.index;
          const bool bc = is_broadcast(spec.shape, pb.reference_shape);
          p.inputs.push_back(ProgramInput{src.id.value(), src.dtype, src.shape, src.status, InputRole::View, spec});
          pb.loads.push_back(Load{LoadSource::Input, static_cast<std::uint32_t>(p.inputs.size() - 1), r.local, bc});
          break;
        }
      }
    }
    p.blocks.push_back(std::move(pb));
  }
  p.outputs.reserve(outputs_.size());
  for (std::size_t oi = 0; oi < outputs_.size(); ++oi) {
    const TraceOutput& o = outputs_[oi];
    const bool written = is_written(oi);
    p.outputs.push_back(ProgramOutput{o.tensor.id.value(), o.tensor.dtype, o.tensor.shape, o.tensor.status, o.block,
                                      o.local, written, o.tensor.status != TensorStatus::ReadWrite, o.layout});
    if (written) p.blocks[o.block].stores.push_back(Store{static_cast<std::uint32_t>(oi), o.local});
  }
  return p;
}

// ---- TraceFuser

TraceFuser::TraceFuser(FuseSettings settings, std::uint32_t max_bindings, FusionLog log)
    : initial_settings_(settings), max_bindings_(max_bindings), log_(std::move(log)), trace_(settings) {}

void TraceFuser::reset() {
  trace_ = Trace(initial_settings_);
  scoring_.reset();
  current_output_shape_.clear();
  status_ = FuserStatus::Open;
  num_ops_ = 0;
  num_views_ = 0;
  first_checked_ = false;
}

FuserProperties TraceFuser::properties() const {
  return FuserProperties{num_ops_ > 0, scoring_.evaluate(trace_.fused_io())};
}

void TraceFuser::close_on(const ir::Operation& op, std::string_view reason) {
  log_.log(LogLevel::Full, [&] {
    return fmt::format("[fuser] closed on {} ({}); had {} ops, est_bindings={}/{}", ir::family_name(op.family), reason,
                       num_ops_, trace_.estimate_bindings(), max_bindings_);
  });
  status_ = FuserStatus::Closed;
}

void TraceFuser::fuse(const ir::Operation& op) {
  if (status_ == FuserStatus::Closed) return;
  if (op.is_drop()) {
    if (num_ops_ == 0) {
      close_on(op, "drop on empty fuser");
      return;
    }
    // A Drop bypasses the trace limits: it only records the tensor's last use.
    for (const TensorIr& t : op.inputs()) trace_.use(t);
  } else {
    std::string_view reason;
    switch (op.family) {
      case ir::Family::BaseFloat:
      case ir::Family::BaseInt:
      case ir::Family::BaseBool: reason = "base fuse rejected"; break;
      case ir::Family::Float: reason = "float fuse rejected"; break;
      case ir::Family::Int: reason = "int fuse rejected"; break;
      case ir::Family::NumericFloat:
      case ir::Family::NumericInt: reason = "numeric fuse rejected"; break;
      default: close_on(op, "unsupported op variant"); return;
    }
    if (!fuse_traced(op)) {
      close_on(op, reason);
      return;
    }
  }
  status_ = FuserStatus::Open;
  scoring_.register_op(op);
  ++num_ops_;
}

FusedProgram TraceFuser::finish(ProgramKind kind) const {
  FusedProgram p = trace_.to_program(kind, current_output_shape_);
  p.len = num_ops_;
  return p;
}

bool TraceFuser::output_is_compatible(const TensorIr& out) {
  if (current_output_shape_.empty()) {
    current_output_shape_ = out.shape;
    return true;
  }
  if (current_output_shape_.size() != out.shape.size()) return false;
  const FuseSettings& s = trace_.settings();
  ir::Shape updated = current_output_shape_;
  bool update = false;
  for (std::size_t i = 0; i < out.shape.size(); ++i) {
    const std::uint64_t cur = current_output_shape_[i];
    const std::uint64_t now = out.shape[i];
    if (cur == now) continue;
    if (!s.broadcast) return false;
    if (now == 0) continue;  // the new output is broadcast on i
    if (cur == 0 && s.output_shape_updates) {
      updated[i] = now;
      update = true;
      continue;
    }
    return false;
  }
  if (update) {
    if (updated != out.shape) return false;
    current_output_shape_ = out.shape;
  }
  return true;
}

template <class Apply>
bool TraceFuser::try_trace(Apply&& apply) {
  if (trace_.num_element_ops() > kMaxFusedOps) return false;
  Trace candidate = trace_;
  const bool ok = apply(candidate);
  const bool check_bindings = first_checked_;
  first_checked_ = true;  // used up whether or not the op could be expressed
  if (!ok) return false;
  if (check_bindings && candidate.estimate_bindings() > max_bindings_) return false;
  trace_ = std::move(candidate);
  return true;
}

bool TraceFuser::fuse_view(const ir::Operation& op, const ViewSpec& spec) {
  const TensorIr& source = op.inputs()[0];
  const TensorIr& out = op.outputs()[0];
  const ir::Shape saved = current_output_shape_;
  bool ok = output_is_compatible(out);
  if (ok) {
    // Single-use views are cheaper to run eagerly: only a view of a tensor this block already
    // reads from an input buffer (and that no op of the trace produces) is fused.
    ok = try_trace([&](Trace& t) { return t.can_view(source) && t.read_view(source, out, spec).has_value(); });
  }
  if (!ok) {
    current_output_shape_ = saved;
    return false;
  }
  ++num_views_;
  return true;
}

bool TraceFuser::fuse_traced(const ir::Operation& op) {
  const ir::OpInfo& info = op.info();
  if (!ir::group_admits(info.group, op.family)) return false;
  if (!info.has(ir::kElementwise) && !info.has(ir::kFusableView)) return false;
  if (op.outputs().size() != 1) return false;
  const TensorIr& out = op.outputs()[0];

  if (op.kind == ir::OpKind::Base_SwapDims) {
    if (op.inputs().size() != 1 || op.attrs.size() != 2) return false;
    return fuse_view(op, ViewSpec{op.kind, 0, op.attrs[0], op.attrs[1], out.shape});
  }
  if (op.kind == ir::OpKind::Base_Reshape) {
    if (op.inputs().size() != 1) return false;
    const TensorIr& in = op.inputs()[0];
    if (in.shape != out.shape) {
      if (in.shape.size() > out.shape.size()) return false;
      return fuse_view(op, ViewSpec{op.kind, 0, 0, 0, out.shape});
    }
    // Same relative shape, hence same concrete shape: a plain element-wise copy (below).
  }

  const ir::Shape saved = current_output_shape_;
  if (!output_is_compatible(out)) {
    current_output_shape_ = saved;
    return false;
  }
  const bool indexed = info.has(ir::kIndexed);
  const bool ok = try_trace([&](Trace& t) {
    Instruction ins;
    ins.op = op.kind;
    ins.family = op.family;
    ins.compute = op.inputs().empty() ? out.dtype : op.inputs()[0].dtype;
    ins.out_dtype = out.dtype;
    ins.attrs = op.attrs;
    for (const TensorIr& in : op.inputs()) {
      if (indexed) {
        const std::optional<std::uint32_t> i = t.read_indexed(in);
        if (!i) return false;
        ins.operands.push_back(Operand::input(*i));
      } else {
        const std::optional<std::uint32_t> r = t.read(in);
        if (!r) return false;
        ins.operands.push_back(Operand::local(*r));
      }
    }
    for (const ir::ScalarIr& s : op.scalars) {
      // Fusers only see relative ops: every scalar is a UInt placeholder.
      if (s.kind() != ir::ScalarIr::Kind::UInt || s.as_uint() > std::numeric_limits<std::uint32_t>::max()) return false;
      const auto k = static_cast<std::uint32_t>(s.as_uint());
      t.use_scalar(k);
      ins.operands.push_back(Operand::scalar(k));
    }
    const std::optional<std::uint32_t> o = t.write(out);
    if (!o) return false;
    ins.out = *o;
    t.add_instruction(std::move(ins));
    t.count_element_op();
    return true;
  });
  if (!ok) current_output_shape_ = saved;
  return ok;
}

bool TraceFuser::register_matmul(const ir::Operation& matmul) {
  if (matmul.inputs().size() != 2 || matmul.outputs().size() != 1) return false;
  const TensorIr& out = matmul.outputs()[0];
  Trace candidate = trace_;
  const std::optional<std::uint32_t> lhs = candidate.register_unhandled_input(matmul.inputs()[0]);
  if (!lhs) return false;
  const std::optional<std::uint32_t> rhs = candidate.register_unhandled_input(matmul.inputs()[1]);
  if (!rhs) return false;
  const std::optional<std::uint32_t> reg = candidate.write(out);
  if (!reg) return false;
  candidate.set_matmul(MatmulSpec{*lhs, *rhs, *reg, matmul.dtype, out.dtype});
  trace_ = std::move(candidate);
  current_output_shape_ = out.shape;
  return true;
}

bool TraceFuser::register_reduce(const ir::Operation& reduce, ir::DType accumulator, FuseSettings settings) {
  if (reduce.inputs().size() != 1 || reduce.outputs().size() != 1 || reduce.attrs.empty()) return false;
  const TensorIr& in = reduce.inputs()[0];
  const TensorIr& out = reduce.outputs()[0];
  Trace candidate = trace_;
  // With no op before it (a leading reduction), the first block only loads the input.
  const ir::Shape& reference = num_ops_ == 0 ? in.shape : current_output_shape_;
  const std::optional<std::uint32_t> handover = candidate.next_block(in, reference, settings);
  if (!handover) return false;
  const std::optional<std::uint32_t> reg = candidate.write(out);
  if (!reg) return false;
  candidate.set_reduction(
      Reduction{reduce.kind, reduce.family, reduce.attrs[0], *handover, *reg, in.dtype, accumulator, out.dtype});
  trace_ = std::move(candidate);
  current_output_shape_ = out.shape;
  return true;
}

bool fuse_both(TraceFuser& a, TraceFuser& b, const ir::Operation& op) {
  const std::size_t na = a.num_ops();
  const std::size_t nb = b.num_ops();
  TraceFuser backup = a;
  a.fuse(op);
  if (a.num_ops() == na) {
    b.close();
    a.close();
    return false;
  }
  b.fuse(op);
  if (b.num_ops() == nb) {
    a = std::move(backup);
    a.close();
    b.close();
    return false;
  }
  return true;
}

ir::DType reduce_accumulator(ir::OpKind kind, ir::DType input) {
  const bool widens =
      kind == ir::OpKind::Numeric_SumDim || kind == ir::OpKind::Numeric_MeanDim || kind == ir::OpKind::Numeric_ProdDim;
  if (!widens) return input;
  switch (input.kind()) {
    case ir::DTypeKind::F16:
    case ir::DTypeKind::BF16: return ir::dtypes::f32;
    case ir::DTypeKind::I8:
    case ir::DTypeKind::I16: return ir::dtypes::i32;
    case ir::DTypeKind::U8:
    case ir::DTypeKind::U16: return ir::dtypes::u32;
    default: return input;
  }
}

}  // namespace kiln::fusion

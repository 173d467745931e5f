#include "kiln/fusion/fused_program.h"

#include <fmt/format.h>

#include "kiln/ir/hash.h"

#include <algorithm>

namespace kiln::fusion {
namespace {

using Hasher = ir::StructuralHasher;

void hash_dtype(Hasher& hs, const ir::DType& d) { hs.add_dtype(d); }

void hash_shape(Hasher& hs, const ir::Shape& s) { hs.add_shape(s); }

void hash_settings(Hasher& hs, const FuseSettings& s) {
  hs.add_bool(s.broadcast);
  hs.add_bool(s.output_shape_updates);
  hs.add_bool(s.inplace);
  hs.add_enum(s.vectorization);
  hs.add_enum(s.ref_layout);
}

void hash_program(Hasher& hs, const FusedProgram& p) {
  hs.add_enum(p.kind);
  hs.add(p.captured_op_position);
  hs.add(p.len);
  hs.add(p.inputs.size());
  for (const ProgramInput& in : p.inputs) {
    hs.add(in.tensor);
    hash_dtype(hs, in.dtype);
    hash_shape(hs, in.shape);
    hs.add_enum(in.status);
    hs.add_enum(in.role);
    hs.add_bool(in.view.has_value());
    if (in.view) {
      hs.add_enum(in.view->op);
      hs.add(in.view->source);
      hs.add(static_cast<std::uint64_t>(in.view->dim1));
      hs.add(static_cast<std::uint64_t>(in.view->dim2));
      hash_shape(hs, in.view->shape);
    }
  }
  hs.add(p.scalars.size());
  for (auto k : p.scalars) hs.add(k);
  hs.add(p.blocks.size());
  for (const ProgramBlock& b : p.blocks) {
    hash_shape(hs, b.reference_shape);
    hash_settings(hs, b.settings);
    hs.add(b.registers.size());
    for (const ir::DType& d : b.registers) hash_dtype(hs, d);
    hs.add_bool(b.reduction.has_value());
    if (b.reduction) {
      const Reduction& r = *b.reduction;
      hs.add_enum(r.op);
      hs.add_enum(r.family);
      hs.add(static_cast<std::uint64_t>(r.axis));
      hs.add(r.input);
      hs.add(r.out);
      hash_dtype(hs, r.input_dtype);
      hash_dtype(hs, r.accumulator);
      hash_dtype(hs, r.out_dtype);
    }
    hs.add(b.loads.size());
    for (const Load& l : b.loads) {
      hs.add_enum(l.source);
      hs.add(l.index);
      hs.add(l.local);
      hs.add_bool(l.broadcast);
    }
    hs.add(b.instructions.size());
    for (const Instruction& ins : b.instructions) {
      hs.add_enum(ins.op);
      hs.add_enum(ins.family);
      hash_dtype(hs, ins.compute);
      hash_dtype(hs, ins.out_dtype);
      hs.add(ins.operands.size());
      for (const Operand& o : ins.operands) {
        hs.add_enum(o.kind);
        hs.add(o.index);
      }
      hs.add(ins.attrs.size());
      for (auto a : ins.attrs) hs.add(static_cast<std::uint64_t>(a));
      hs.add(ins.out);
    }
    hs.add(b.stores.size());
    for (const Store& s : b.stores) {
      hs.add(s.output);
      hs.add(s.local);
    }
  }
  hs.add(p.outputs.size());
  for (const ProgramOutput& o : p.outputs) {
    hs.add(o.tensor);
    hash_dtype(hs, o.dtype);
    hash_shape(hs, o.shape);
    hs.add_enum(o.status);
    hs.add(o.block);
    hs.add(o.local);
    hs.add_bool(o.written);
    hs.add_bool(o.kept);
    hs.add_bool(o.layout.has_value());
    if (o.layout) {
      hs.add(o.layout->size());
      for (auto a : *o.layout) hs.add(a);
    }
  }
  hs.add_bool(p.matmul.has_value());
  if (p.matmul) {
    hs.add(p.matmul->lhs);
    hs.add(p.matmul->rhs);
    hs.add(p.matmul->out);
    hash_dtype(hs, p.matmul->dtype);
    hash_dtype(hs, p.matmul->out_dtype);
  }
  hs.add(p.stages.size());
  for (const FusedProgram& s : p.stages) hash_program(hs, s);
  hs.add(p.fallbacks.size());
  for (const FusedProgram& f : p.fallbacks) hash_program(hs, f);
}

std::string settings_to_string(const FuseSettings& s) {
  const char* vec = s.vectorization == Vectorization::Activated     ? "on"
                    : s.vectorization == Vectorization::Deactivated ? "off"
                                                                    : "<=prev";
  const char* layout = s.ref_layout == RefLayout::Any             ? "any"
                       : s.ref_layout == RefLayout::AnyKeepOutput ? "any-keep-output"
                                                                  : "contiguous";
  return fmt::format("broadcast={} shape_updates={} inplace={} vectorization={} layout={}", s.broadcast ? "on" : "off",
                     s.output_shape_updates ? "on" : "off", s.inplace ? "on" : "off", vec, layout);
}

std::string operand_to_string(const Operand& o) {
  switch (o.kind) {
    case OperandKind::Local: return fmt::format("r{}", o.index);
    case OperandKind::Input: return fmt::format("in{}", o.index);
    case OperandKind::Scalar: return fmt::format("s{}", o.index);
  }
  return "?";
}

std::string op_name(ir::OpKind k, ir::Family f) {
  return fmt::format("{}::{}", ir::family_name(f), ir::op_info(k).variant);
}

void append_program(std::string& s, const FusedProgram& p, const std::string& indent) {
  s += fmt::format("{}{} program ({} ops): {} input(s), {} output(s), {} block(s)", indent, program_kind_name(p.kind),
                   p.len, p.inputs.size(), p.outputs.size(), p.blocks.size());
  if (!p.scalars.empty()) {
    s += ", scalars [";
    for (std::size_t i = 0; i < p.scalars.size(); ++i) s += fmt::format("{}s{}", i ? ", " : "", p.scalars[i]);
    s += "]";
  }
  if (p.kind != ProgramKind::Elementwise && !is_staged(p.kind))
    s += fmt::format(", captured op at {}", p.captured_op_position);
  s += "\n";
  for (std::size_t i = 0; i < p.inputs.size(); ++i) {
    const ProgramInput& in = p.inputs[i];
    s += fmt::format("{}  in{} t{}:{}{} {} {}", indent, i, in.tensor, in.dtype.name(), ir::shape_to_string(in.shape),
                     ir::status_name(in.status), input_role_name(in.role));
    if (in.view) {
      if (in.view->op == ir::OpKind::Base_SwapDims)
        s += fmt::format(" swap_dims({}, {}) of in{}", in.view->dim1, in.view->dim2, in.view->source);
      else
        s += fmt::format(" reshape of in{}", in.view->source);
      s += fmt::format(" -> {}", ir::shape_to_string(in.view->shape));
    }
    s += "\n";
  }
  if (p.matmul)
    s += fmt::format("{}  matmul<{}> in{} x in{} -> b0.r{}:{}\n", indent, p.matmul->dtype.name(), p.matmul->lhs,
                     p.matmul->rhs, p.matmul->out, p.matmul->out_dtype.name());
  for (std::size_t bi = 0; bi < p.blocks.size(); ++bi) {
    const ProgramBlock& b = p.blocks[bi];
    s += fmt::format("{}  block {} ref {} ({})\n", indent, bi, ir::shape_to_string(b.reference_shape),
                     settings_to_string(b.settings));
    if (b.reduction) {
      const Reduction& r = *b.reduction;
      s += fmt::format("{}    r{}:{} = {}(b{}.r{}, axis={}, acc={})\n", indent, r.out, r.out_dtype.name(),
                       op_name(r.op, r.family), bi == 0 ? 0 : bi - 1, r.input, r.axis, r.accumulator.name());
    }
    for (const Load& l : b.loads)
      s += fmt::format("{}    r{}:{} = load {}{}{}\n", indent, l.local,
                       l.local < b.registers.size() ? b.registers[l.local].name() : "?",
                       l.source == LoadSource::Input ? "in" : "out", l.index, l.broadcast ? " (broadcast)" : "");
    for (const Instruction& ins : b.instructions) {
      s += fmt::format("{}    r{}:{} = {}<{}>(", indent, ins.out, ins.out_dtype.name(), op_name(ins.op, ins.family),
                       ins.compute.name());
      for (std::size_t i = 0; i < ins.operands.size(); ++i) s += (i ? ", " : "") + operand_to_string(ins.operands[i]);
      s += ")";
      if (!ins.attrs.empty()) {
        s += " attrs[";
        for (std::size_t i = 0; i < ins.attrs.size(); ++i) s += fmt::format("{}{}", i ? "," : "", ins.attrs[i]);
        s += "]";
      }
      s += "\n";
    }
    for (const Store& st : b.stores) s += fmt::format("{}    store out{} <- r{}\n", indent, st.output, st.local);
  }
  for (std::size_t i = 0; i < p.outputs.size(); ++i) {
    const ProgramOutput& o = p.outputs[i];
    s += fmt::format("{}  out{} t{}:{}{} {} b{}.r{} {}", indent, i, o.tensor, o.dtype.name(),
                     ir::shape_to_string(o.shape), ir::status_name(o.status), o.block, o.local,
                     !o.written ? "local"
                     : o.kept   ? "written"
                                : "written (temporary)");
    if (o.layout) {
      s += " strides[";
      for (std::size_t k = 0; k < o.layout->size(); ++k) s += fmt::format("{}{}", k ? "," : "", (*o.layout)[k]);
      s += "]";
    }
    s += "\n";
  }
  for (std::size_t i = 0; i < p.stages.size(); ++i) {
    s += fmt::format("{}  stage {}:\n", indent, i);
    append_program(s, p.stages[i], indent + "    ");
  }
  for (std::size_t i = 0; i < p.fallbacks.size(); ++i) {
    s += fmt::format("{}  fallback {}:\n", indent, i);
    append_program(s, p.fallbacks[i], indent + "    ");
  }
}

}  // namespace

std::string_view program_kind_name(ProgramKind k) {
  switch (k) {
    case ProgramKind::Elementwise: return "ElementWise";
    case ProgramKind::Matmul: return "Matmul";
    case ProgramKind::Reduce: return "Reduce";
    case ProgramKind::ReduceBroadcasted: return "ReduceBroadcasted";
    case ProgramKind::NhwcRelayout: return "NHWCRelayout";
    case ProgramKind::Row: return "Row";
  }
  return "?";
}

std::string_view input_role_name(InputRole r) {
  switch (r) {
    case InputRole::Plain: return "plain";
    case InputRole::Broadcast: return "broadcast";
    case InputRole::View: return "view";
    case InputRole::Indexed: return "indexed";
  }
  return "?";
}

std::uint64_t FusedProgram::structural_hash() const {
  if (const std::uint64_t h = hash_memo.get(); h != 0) return h;
  Hasher hs;
  hash_program(hs, *this);
  const std::uint64_t h = hs.finish();
  hash_memo.set(h);
  return h;
}

bool operator==(const FusedProgram& a, const FusedProgram& b) {
  return a.kind == b.kind && a.captured_op_position == b.captured_op_position && a.len == b.len &&
         a.inputs == b.inputs && a.scalars == b.scalars && a.blocks == b.blocks && a.outputs == b.outputs &&
         a.matmul == b.matmul && a.stages == b.stages && a.fallbacks == b.fallbacks;
}

std::string FusedProgram::to_string() const {
  std::string s;
  append_program(s, *this, "");
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

std::optional<std::uint64_t> FusedProgram::max_relative_shape_id() const {
  std::optional<std::uint64_t> best;
  auto take = [&best](std::optional<std::uint64_t> v) {
    if (v && (!best || *v > *best)) best = v;
  };
  for (const ProgramBlock& b : blocks)
    if (!b.reference_shape.empty()) take(*std::max_element(b.reference_shape.begin(), b.reference_shape.end()));
  for (const FusedProgram& s : stages) take(s.max_relative_shape_id());
  for (const FusedProgram& f : fallbacks) take(f.max_relative_shape_id());
  return best;
}

std::size_t FusedProgram::num_bindings() const {
  std::size_t n = 0;
  for (const ProgramInput& in : inputs) n += in.role != InputRole::View;
  for (const ProgramOutput& o : outputs) n += o.written;
  return n;
}

}  // namespace kiln::fusion

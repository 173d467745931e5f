// Fused program -> CUDA C++ (codegen.h). Instructions are lowered by the shared lowering
// (fusion/lowering.h), as the CPU fast path's compile step lowers them; the generator mirrors
// that step's register classes, fixups and operation semantics, emitted as straight-line code per
// element instead of kernel calls per chunk.
#include "kiln/cuda/codegen.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include "kiln/cuda/launch_abi.h"
#include "kiln/fusion/lowering.h"
#include "kiln/fusion/trace_fuser.h"
#include "kiln/ir/op_table.h"

namespace kiln::cuda {

using fusion::FusedProgram;
using fusion::Instruction;
using fusion::OperandKind;
using fusion::ProgramBlock;
using fusion::ProgramKind;
using ir::DType;
using ir::DTypeKind;
using ir::OpKind;

std::string_view kernel_role_name(KernelRole r) {
  switch (r) {
    case KernelRole::ElementwiseStrided: return "ew";
    case KernelRole::ElementwiseVector: return "vec";
    case KernelRole::ReduceRows: return "rows";
    case KernelRole::ReduceCols: return "cols";
    case KernelRole::Matmul: return "mm";
    case KernelRole::ElementwiseRowVector: return "rowvec";
    case KernelRole::RowFused: return "row";
    case KernelRole::RowFusedWarp: return "rowwarp";
  }
  return "?";
}

ScalarClass scalar_class_of(DType d) {
  if (d.kind() == DTypeKind::F64) return ScalarClass::F64;
  if (d.is_float()) return ScalarClass::F32;
  if (d.is_int()) return ScalarClass::I64;
  if (d.is_uint()) return ScalarClass::U64;
  return ScalarClass::Bool;
}

std::size_t scalar_class_size(ScalarClass c) {
  switch (c) {
    case ScalarClass::F32:
    case ScalarClass::Bool:  // passed as int: a 1-byte kernel parameter buys nothing
      return 4;
    default: return 8;
  }
}

std::string GeneratedProgram::source() const {
  std::string s(prelude());
  s += body;
  return s;
}

namespace {

// ---- dtypes: storage type, register class, conversions

enum class Cls : std::uint8_t { F32, F64, I64, U64, Bool };

std::optional<Cls> cls_of(DType d) {
  switch (d.kind()) {
    case DTypeKind::F64: return Cls::F64;
    case DTypeKind::F32:
    case DTypeKind::Flex32:
    case DTypeKind::F16:
    case DTypeKind::BF16: return Cls::F32;
    case DTypeKind::I64:
    case DTypeKind::I32:
    case DTypeKind::I16:
    case DTypeKind::I8: return Cls::I64;
    case DTypeKind::U64:
    case DTypeKind::U32:
    case DTypeKind::U16:
    case DTypeKind::U8: return Cls::U64;
    case DTypeKind::Bool: return Cls::Bool;
    case DTypeKind::QFloat: return std::nullopt;
  }
  return std::nullopt;
}

const char* cls_type(Cls c) {
  switch (c) {
    case Cls::F32: return "float";
    case Cls::F64: return "double";
    case Cls::I64: return "long long";
    case Cls::U64: return "unsigned long long";
    case Cls::Bool: return "bool";
  }
  return "?";
}

// The C++ type a tensor of this dtype stores.
std::string storage_type(DType d) {
  switch (d.kind()) {
    case DTypeKind::F64: return "double";
    case DTypeKind::F32:
    case DTypeKind::Flex32: return "float";
    case DTypeKind::F16: return "__half";
    case DTypeKind::BF16: return "__nv_bfloat16";
    case DTypeKind::I64: return "long long";
    case DTypeKind::I32: return "int";
    case DTypeKind::I16: return "short";
    case DTypeKind::I8: return "signed char";
    case DTypeKind::U64: return "unsigned long long";
    case DTypeKind::U32: return "unsigned int";
    case DTypeKind::U16: return "unsigned short";
    case DTypeKind::U8: return "unsigned char";
    case DTypeKind::Bool: return d.bool_store() == ir::BoolStore::U32 ? "unsigned int" : "unsigned char";
    case DTypeKind::QFloat: break;
  }
  return "void";
}

std::size_t storage_size(DType d) {
  if (d.is_bool()) return d.bool_store() == ir::BoolStore::U32 ? 4 : 1;
  return d.size_bytes();
}

// storage element expression -> register class value
std::string load_conv(DType d, const std::string& e) {
  switch (d.kind()) {
    case DTypeKind::F16: return "__half2float(" + e + ")";
    case DTypeKind::BF16: return "__bfloat162float(" + e + ")";
    case DTypeKind::Bool: return "(" + e + " != 0)";
    default: break;
  }
  if (d.is_int()) return "(long long)(" + e + ")";
  if (d.is_uint()) return "(unsigned long long)(" + e + ")";
  return e;
}

// register class value -> storage element
std::string store_conv(DType d, const std::string& v) {
  switch (d.kind()) {
    case DTypeKind::F16: return "__float2half_rn(" + v + ")";
    case DTypeKind::BF16: return "__float2bfloat16_rn(" + v + ")";
    case DTypeKind::Bool: return "(" + storage_type(d) + ")(" + v + " ? 1 : 0)";
    default: break;
  }
  if (d.is_integral()) return "(" + storage_type(d) + ")(" + v + ")";
  return v;
}

// What keeps a register inside its dtype after an instruction computed it in the class.
std::string fixup(DType d, const std::string& v) {
  switch (d.kind()) {
    case DTypeKind::F16: return "kiln_f16(" + v + ")";
    case DTypeKind::BF16: return "kiln_bf16(" + v + ")";
    case DTypeKind::I32: return "(long long)(int)(" + v + ")";
    case DTypeKind::I16: return "(long long)(short)(" + v + ")";
    case DTypeKind::I8: return "(long long)(signed char)(" + v + ")";
    case DTypeKind::U32: return "(unsigned long long)(unsigned int)(" + v + ")";
    case DTypeKind::U16: return "(unsigned long long)(unsigned short)(" + v + ")";
    case DTypeKind::U8: return "(unsigned long long)(unsigned char)(" + v + ")";
    default: return v;
  }
}

int int_bits(DType d) { return d.is_integral() ? static_cast<int>(d.size_bytes() * 8) : 0; }

// ---- operations

using fusion::lowering::Code;
using fusion::lowering::is_binary;
using fusion::lowering::is_comparison;
using fusion::lowering::is_indexed;
using fusion::lowering::is_unary;

enum class Red : std::uint8_t { Sum, Mean, Prod, Max, Min, MaxAbs, ArgMax, ArgMin, Any, All };

std::optional<Red> red_of(OpKind k) {
  switch (k) {
    case OpKind::Numeric_SumDim: return Red::Sum;
    case OpKind::Numeric_MeanDim: return Red::Mean;
    case OpKind::Numeric_ProdDim: return Red::Prod;
    case OpKind::Numeric_MaxDim: return Red::Max;
    case OpKind::Numeric_MinDim: return Red::Min;
    case OpKind::Numeric_MaxAbsDim: return Red::MaxAbs;
    case OpKind::Numeric_ArgMax: return Red::ArgMax;
    case OpKind::Numeric_ArgMin: return Red::ArgMin;
    case OpKind::Base_AnyDim: return Red::Any;
    case OpKind::Base_AllDim: return Red::All;
    default: return std::nullopt;
  }
}

Error unsupported(std::string what) { return make_error(ErrorCode::Unsupported, "cuda codegen: " + std::move(what)); }

// ---- instruction expressions, one function per family (StageGen::value_text dispatches)

// An instruction's operands as text, with the classes it computes in and converts to.
struct OperandText {
  std::vector<std::string> x;  // register operands, then (binary with a scalar) the scalar
  std::vector<std::string> s;  // scalar operands
  Cls c = Cls::F32;            // the compute class
  Cls to = Cls::F32;           // the output class
  bool fl = false;             // the compute class is a float class
  bool f32 = false;            // the compute class is f32
  const char* ct = nullptr;    // the compute class's type
  const char* ot = nullptr;    // the output class's type
};

// An instruction's value in the output class.
struct ValueText {
  std::string e;
  bool exact = false;  // already rounded to the output dtype
};

// Binary arithmetic, bitwise, shift and logical operations, and the one-sided clamps.
std::string binary_text(Code k, const OperandText& o, DType compute) {
  const std::vector<std::string>& x = o.x;
  const bool fl = o.fl;
  switch (k) {
    case Code::Add: return fl ? x[0] + " + " + x[1] : fmt::format("kiln_wadd({}, {})", x[0], x[1]);
    case Code::Sub: return fl ? x[0] + " - " + x[1] : fmt::format("kiln_wsub({}, {})", x[0], x[1]);
    case Code::Mul: return fl ? x[0] + " * " + x[1] : fmt::format("kiln_wmul({}, {})", x[0], x[1]);
    case Code::Div: return fl ? x[0] + " / " + x[1] : fmt::format("kiln_div({}, {}, kiln_fault)", x[0], x[1]);
    case Code::Rem:
      return fmt::format(fmt::runtime(fl ? "kiln_frem({}, {})" : "kiln_rem({}, {}, kiln_fault)"), x[0], x[1]);
    case Code::Pow: return fmt::format("{}({}, {})", o.f32 ? "powf" : "pow", x[0], x[1]);
    case Code::BitAnd: return x[0] + " & " + x[1];
    case Code::BitOr: return x[0] + " | " + x[1];
    case Code::BitXor: return x[0] + " ^ " + x[1];
    case Code::Shl: return fmt::format("kiln_shl({}, {}, {})", x[0], x[1], int_bits(compute));
    case Code::Shr: return fmt::format("kiln_shr({}, {}, {})", x[0], x[1], int_bits(compute));
    case Code::LogicAnd: return x[0] + " && " + x[1];
    case Code::LogicOr: return x[0] + " || " + x[1];
    case Code::LogicXor: return x[0] + " != " + x[1];
    case Code::ClampMin: return fmt::format("({0} < {1} ? {1} : {0})", x[0], x[1]);
    case Code::ClampMax: return fmt::format("({0} > {1} ? {1} : {0})", x[0], x[1]);
    default: return {};
  }
}

// Comparisons: a bool result.
std::string comparison_text(Code k, const OperandText& o) {
  const std::vector<std::string>& x = o.x;
  switch (k) {
    case Code::Eq: return x[0] + " == " + x[1];
    case Code::Ne: return x[0] + " != " + x[1];
    case Code::Gt: return x[0] + " > " + x[1];
    case Code::Ge: return x[0] + " >= " + x[1];
    case Code::Lt: return x[0] + " < " + x[1];
    case Code::Le: return x[0] + " <= " + x[1];
    default: return {};
  }
}

// Unary math: signs, the math library's functions (fast exp / log with `fast_math`), roundings,
// float classification and negations.
std::string unary_text(Code k, const OperandText& o, bool fast_math) {
  const std::vector<std::string>& x = o.x;
  auto fn1 = [&](const char* f32name, const char* f64name) {
    return fmt::format("{}({})", o.f32 ? f32name : f64name, x[0]);
  };
  switch (k) {
    case Code::Abs: return fmt::format("kiln_abs({})", x[0]);
    case Code::Neg: return o.fl ? "-" + x[0] : fmt::format("kiln_wsub(({})0, {})", o.ct, x[0]);
    case Code::Sign: return fmt::format("kiln_sign({})", x[0]);
    case Code::Exp: return fn1(fast_math ? "__expf" : "expf", "exp");
    case Code::Log: return fn1(fast_math ? "__logf" : "logf", "log");
    case Code::Log1p: return fn1("log1pf", "log1p");
    case Code::Erf: return fn1("erff", "erf");
    case Code::Sqrt: return fn1("sqrtf", "sqrt");
    case Code::Cos: return fn1("cosf", "cos");
    case Code::Sin: return fn1("sinf", "sin");
    case Code::Tanh: return fn1("tanhf", "tanh");
    case Code::Recip: return fmt::format("({})1 / {}", o.ct, x[0]);
    case Code::Round: return fn1("rintf", "rint");  // half to even
    case Code::Floor: return fn1("floorf", "floor");
    case Code::Ceil: return fn1("ceilf", "ceil");
    case Code::Trunc: return fn1("truncf", "trunc");
    case Code::IsNan: return fmt::format("({0} != {0})", x[0]);
    case Code::IsInf: return fmt::format("isinf({})", x[0]);
    case Code::BitNot: return "~" + x[0];
    case Code::Not: return "!" + x[0];
    default: return {};
  }
}

// A cast to the output class; from a float to an integer, or rounded to f32 storage, it is
// exact.
ValueText cast_text(const OperandText& o, DType out_dtype) {
  const std::vector<std::string>& x = o.x;
  const Cls c = o.c;
  const Cls to = o.to;
  std::string e;
  bool exact = false;
  if (c == Cls::Bool) {
    e = fmt::format("({})({} ? 1 : 0)", o.ot, x[0]);
  } else if (to == Cls::Bool) {
    e = fmt::format("({} != 0)", x[0]);
  } else if (o.fl && to == Cls::I64) {
    e = fmt::format("kiln_f2i((double){}, {})", x[0], int_bits(out_dtype));
    exact = true;
  } else if (o.fl && to == Cls::U64) {
    e = fmt::format("kiln_f2u((double){}, {})", x[0], int_bits(out_dtype));
    exact = true;
  } else if (to == Cls::F32 && c != Cls::F32) {
    // From f64 or an integer: rounded once, straight to the target (never through f32).
    if (out_dtype.kind() == DTypeKind::F16)
      e = fmt::format("kiln_f16d((double){})", x[0]);
    else if (out_dtype.kind() == DTypeKind::BF16)
      e = fmt::format("kiln_bf16d((double){})", x[0]);
    else
      e = fmt::format("(float){}", x[0]);
    exact = true;
  } else {
    e = fmt::format("({}){}", o.ot, x[0]);
  }
  return {e, exact};
}

// ---- text

class Text {
 public:
  void line(int indent, std::string_view s) {
    out_.append(static_cast<std::size_t>(indent) * 2, ' ');
    out_ += s;
    out_ += '\n';
  }
  std::string& str() { return out_; }

 private:
  std::string out_;
};

// ---- one stage (a program that is not ReduceBroadcasted)

// How a block body reads its positions: `pos` (linear position in the block's reference) and
// `idx` (multi-index, computed when the iteration space is not contiguous or the block has
// indexed reads). The vector kernel replaces loads and stores by lane accesses.
struct BodyMode {
  bool vector = false;         // lane body of the vector kernel
  bool hoisted_bcast = false;  // broadcast loads were read once before the loop (b<l> names)
  bool row = false;            // lane body of the row-vector kernel: every load is v<l>.v[lane]
};

// A temporary of a Row program that the Row kernel may keep in shared memory: written over the
// whole row space by one stage's first block and consumed by later stages' first blocks only.
// Also an input that several stages read over the whole row space (softmax's x, read by the max
// and by the sum's prologue): the first of them copies what it loads into the window, the later
// ones read the window instead of global memory.
struct RowWindow {
  std::uint64_t tensor = 0;  // relative id
  DType dtype;
  std::int64_t filled_by = -1;  // an input's: the stage whose loads fill it; -1: a stage's output
};

// How a row part uses a window: its pointer's name, and whether its loads fill it.
struct WindowUse {
  std::string name;
  bool fill = false;
};

class StageGen {
 public:
  StageGen(const FusedProgram& p, std::uint32_t stage, const CodegenOptions& opt, GeneratedProgram& out)
      : p_(p), stage_(stage), opt_(opt), out_(out) {}

  Status run() {
    KILN_RETURN_IF_ERROR(validate());
    StageInfo info;
    info.kind = p_.kind;
    info.max_rank = max_rank();
    for (const ProgramBlock& b : p_.blocks) info.indexed_blocks.push_back(block_indexed(b));
    switch (p_.kind) {
      case ProgramKind::Elementwise:
      case ProgramKind::NhwcRelayout: {
        KILN_RETURN_IF_ERROR(elementwise_strided());
        if (!info.indexed_blocks[0]) {
          KILN_RETURN_IF_ERROR(elementwise_vector());
          info.vector_width = vector_width_;
          bool broadcast = false;
          for (const fusion::Load& l : p_.blocks[0].loads) broadcast = broadcast || l.broadcast;
          if (broadcast) {
            KILN_RETURN_IF_ERROR(elementwise_row_vector());
            info.row_vector_width = row_vector_width_;
          }
        }
        break;
      }
      case ProgramKind::Reduce:
        KILN_RETURN_IF_ERROR(reduce(KernelRole::ReduceRows));
        KILN_RETURN_IF_ERROR(reduce(KernelRole::ReduceCols));
        break;
      case ProgramKind::Matmul: KILN_RETURN_IF_ERROR(matmul()); break;
      case ProgramKind::ReduceBroadcasted:
      case ProgramKind::Row: return unsupported("a nested staged program");
    }
    out_.stages.push_back(std::move(info));
    return Status::Ok();
  }

 private:
  // ---- validation (what the CPU compile step checks, plus the rank limit)

  Status validate() {
    switch (p_.kind) {
      case ProgramKind::Elementwise:
      case ProgramKind::NhwcRelayout:
        if (p_.blocks.size() != 1) return unsupported("an elementwise program has one block");
        break;
      case ProgramKind::Matmul:
        if (p_.blocks.size() != 1 || !p_.matmul) return unsupported("a matmul program has one block and a matmul");
        if (p_.matmul->lhs >= p_.inputs.size() || p_.matmul->rhs >= p_.inputs.size())
          return unsupported("matmul operands");
        break;
      case ProgramKind::Reduce:
        if (p_.blocks.size() != 2 || !p_.blocks[1].reduction || p_.blocks[0].reduction)
          return unsupported("a reduce program has a prologue and a reduction block");
        break;
      case ProgramKind::ReduceBroadcasted:
      case ProgramKind::Row: return unsupported("a nested staged program");
    }
    for (const fusion::ProgramInput& in : p_.inputs) {
      if (!cls_of(in.dtype)) return unsupported("input dtype " + in.dtype.name());
      if (in.shape.size() > static_cast<std::size_t>(kMaxRank)) return unsupported("rank above 8");
      if (in.role == fusion::InputRole::View) {
        if (!in.view || in.view->source >= p_.inputs.size()) return unsupported("view without a source");
        if (in.view->op != OpKind::Base_SwapDims && in.view->op != OpKind::Base_Reshape)
          return unsupported("view kind");
        if (in.view->shape.size() > static_cast<std::size_t>(kMaxRank)) return unsupported("rank above 8");
      }
    }
    for (const fusion::ProgramOutput& o : p_.outputs) {
      if (!cls_of(o.dtype)) return unsupported("output dtype " + o.dtype.name());
      if (o.shape.size() > static_cast<std::size_t>(kMaxRank)) return unsupported("rank above 8");
    }
    for (std::size_t bi = 0; bi < p_.blocks.size(); ++bi) {
      const ProgramBlock& b = p_.blocks[bi];
      if (b.reference_shape.size() > static_cast<std::size_t>(kMaxRank)) return unsupported("rank above 8");
      for (const DType& d : b.registers)
        if (!cls_of(d)) return unsupported("register dtype " + d.name());
      auto reg_ok = [&](std::uint32_t r) { return r < b.registers.size(); };
      for (const fusion::Load& l : b.loads) {
        if (!reg_ok(l.local)) return unsupported("load register");
        if (l.source == fusion::LoadSource::Input) {
          if (l.index >= p_.inputs.size()) return unsupported("load of an unknown input");
          if (p_.inputs[l.index].role == fusion::InputRole::Indexed)
            return unsupported("plain load of an indexed input");
          if (!(p_.inputs[l.index].dtype == b.registers[l.local])) return unsupported("load dtype");
        } else {
          // A later block reading what an earlier block stored. Within one kernel the rows of
          // the two blocks are not the same threads; the CPU runs blocks apart, we refuse.
          return unsupported("a block loading another block's output");
        }
      }
      for (const Instruction& ins : b.instructions)
        if (!reg_ok(ins.out) || !(b.registers[ins.out] == ins.out_dtype)) return unsupported("instruction output");
      for (const fusion::Store& s : b.stores) {
        if (!reg_ok(s.local) || s.output >= p_.outputs.size()) return unsupported("store");
        if (!(p_.outputs[s.output].dtype == b.registers[s.local])) return unsupported("store dtype");
      }
      if (b.reduction) {
        if (bi != 1 || !reg_ok(b.reduction->out) || b.reduction->input >= p_.blocks[0].registers.size())
          return unsupported("reduction registers");
        if (!red_of(b.reduction->op))
          return unsupported("reduction " + std::string(ir::op_info(b.reduction->op).variant));
        if (!cls_of(b.reduction->input_dtype) || !cls_of(b.reduction->out_dtype)) return unsupported("reduction dtype");
        if (!(p_.blocks[0].registers[b.reduction->input] == b.reduction->input_dtype) ||
            !(b.registers[b.reduction->out] == b.reduction->out_dtype))
          return unsupported("reduction register dtypes");
        if (b.reduction->axis < 0 || static_cast<std::size_t>(b.reduction->axis) >= p_.blocks[0].reference_shape.size())
          return unsupported("reduction axis");
      }
    }
    if (p_.matmul && !(p_.matmul->out < p_.blocks[0].registers.size() &&
                       p_.blocks[0].registers[p_.matmul->out] == p_.matmul->out_dtype))
      return unsupported("matmul register");
    if (p_.matmul && (!p_.inputs[p_.matmul->lhs].dtype.is_float() || !p_.inputs[p_.matmul->rhs].dtype.is_float() ||
                      !p_.matmul->out_dtype.is_float()))
      return unsupported("integer matmul");
    return Status::Ok();
  }

  static bool block_indexed(const ProgramBlock& b) {
    for (const Instruction& ins : b.instructions)
      for (const fusion::Operand& o : ins.operands)
        if (o.kind == OperandKind::Input) return true;
    return false;
  }

  // ---- parameters

  std::string kernel_name(KernelRole r) const {
    return fmt::format("{}_s{}_{}", opt_.name_prefix, stage_, kernel_role_name(r));
  }

  std::uint32_t scalar_slot(std::uint32_t placeholder, DType d) {
    for (std::size_t i = 0; i < out_.scalars.size(); ++i)
      if (out_.scalars[i].placeholder == placeholder && out_.scalars[i].dtype == d)
        return static_cast<std::uint32_t>(i);
    out_.scalars.push_back(ScalarSlot{placeholder, d, scalar_class_of(d)});
    return static_cast<std::uint32_t>(out_.scalars.size() - 1);
  }

  // The parameter list of every kernel of this stage: iterations of each block, the reduction or
  // matmul shape, then per block its loads (pointer + access) and stores, the indexed inputs,
  // the scalars and the fault word. Kernels of one stage share it, so the host builds one
  // argument list whichever kernel it launches.
  void collect_params() {
    params_.clear();
    decls_.clear();
    auto add = [&](KernelParam kp, std::string decl) {
      params_.push_back(kp);
      decls_.push_back(std::move(decl));
    };
    for (std::uint32_t b = 0; b < p_.blocks.size(); ++b)
      add({ParamKind::Iter, b, 0}, fmt::format("const KilnIter it{}", b));
    if (p_.kind == ProgramKind::Reduce) add({ParamKind::ReduceShape, 1, 0}, "const KilnReduceShape rs");
    if (p_.kind == ProgramKind::Matmul) {
      add({ParamKind::MatmulShape, 0, 0}, "const KilnMatmulShape ms");
      for (std::uint32_t i : {p_.matmul->lhs, p_.matmul->rhs})
        if (!has_input_ptr(i))
          add({ParamKind::InputPtr, 0, i},
              fmt::format("const {}* __restrict__ in{}", storage_type(p_.inputs[i].dtype), i));
    }
    for (std::uint32_t b = 0; b < p_.blocks.size(); ++b) {
      const ProgramBlock& blk = p_.blocks[b];
      for (std::uint32_t l = 0; l < blk.loads.size(); ++l) {
        const std::uint32_t i = blk.loads[l].index;
        if (!has_input_ptr(i))
          add({ParamKind::InputPtr, 0, i},
              fmt::format("const {}* __restrict__ in{}", storage_type(p_.inputs[i].dtype), i));
        add({ParamKind::LoadAccess, b, l}, fmt::format("const KilnAccess la{}_{}", b, l));
      }
      for (std::uint32_t s = 0; s < blk.stores.size(); ++s) {
        const std::uint32_t o = blk.stores[s].output;
        bool have = false;
        for (const KernelParam& kp : params_) have = have || (kp.kind == ParamKind::OutputPtr && kp.index == o);
        if (!have)
          add({ParamKind::OutputPtr, 0, o},
              fmt::format("{}* __restrict__ out{}", storage_type(p_.outputs[o].dtype), o));
        add({ParamKind::StoreAccess, b, s}, fmt::format("const KilnAccess sa{}_{}", b, s));
      }
      for (const Instruction& ins : blk.instructions)
        for (const fusion::Operand& op : ins.operands) {
          if (op.kind == OperandKind::Input) {
            const std::uint32_t i = op.index;
            if (!has_input_ptr(i))
              add({ParamKind::InputPtr, 0, i},
                  fmt::format("const {}* __restrict__ in{}", storage_type(p_.inputs[i].dtype), i));
            bool have = false;
            for (const KernelParam& kp : params_) have = have || (kp.kind == ParamKind::Indexed && kp.index == i);
            if (!have) add({ParamKind::Indexed, 0, i}, fmt::format("const KilnIndexed ix{}", i));
          } else if (op.kind == OperandKind::Scalar) {
            const std::uint32_t slot = scalar_slot(op.index, ins.compute);
            bool have = false;
            for (const KernelParam& kp : params_) have = have || (kp.kind == ParamKind::Scalar && kp.index == slot);
            if (!have)
              add({ParamKind::Scalar, 0, slot},
                  fmt::format("const {} s{}", scalar_param_type(out_.scalars[slot].cls), slot));
          }
        }
    }
    add({ParamKind::Fault, 0, 0}, "int* __restrict__ kiln_fault");
  }

  bool has_input_ptr(std::uint32_t i) const {
    for (const KernelParam& kp : params_)
      if (kp.kind == ParamKind::InputPtr && kp.index == i) return true;
    return false;
  }

  static const char* scalar_param_type(ScalarClass c) {
    switch (c) {
      case ScalarClass::F32: return "float";
      case ScalarClass::F64: return "double";
      case ScalarClass::I64: return "long long";
      case ScalarClass::U64: return "unsigned long long";
      case ScalarClass::Bool: return "int";
    }
    return "?";
  }

  std::string scalar_expr(std::uint32_t placeholder, DType d) {
    const std::uint32_t slot = scalar_slot(placeholder, d);
    if (out_.scalars[slot].cls == ScalarClass::Bool) return fmt::format("(s{} != 0)", slot);
    return fmt::format("s{}", slot);
  }

  void open_kernel(Text& t, KernelRole role) {
    KernelSpec k;
    k.name = kernel_name(role);
    k.role = role;
    k.stage = stage_;
    k.threads = opt_.threads;
    k.params = params_;
    if (role == KernelRole::ElementwiseVector) k.vector_width = vector_width_;
    if (role == KernelRole::ElementwiseRowVector) k.vector_width = row_vector_width_;
    t.line(0, fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}(", opt_.threads, k.name));
    for (std::size_t i = 0; i < decls_.size(); ++i) t.line(2, decls_[i] + (i + 1 < decls_.size() ? "," : ") {"));
    t.line(1, fmt::format("[[maybe_unused]] constexpr int KILN_R = {};", max_rank()));
    out_.kernels.push_back(std::move(k));
  }

  // The rank bound of this stage's kernels (KILN_R): its blocks' iteration spaces, at least 1
  // (a launch merges dims, never adds them; a rank-0 space launches as [1]).
  std::uint32_t max_rank() const {
    std::size_t r = 1;
    for (const ProgramBlock& b : p_.blocks) r = std::max(r, b.reference_shape.size());
    return static_cast<std::uint32_t>(r);
  }

  // ---- block bodies

  static std::string reg(std::uint32_t r) { return fmt::format("r{}", r); }

  // Storage element expression of load l of block b at the current position.
  std::string load_elem(std::uint32_t b, std::uint32_t l, const BodyMode& m) const {
    const fusion::Load& ld = p_.blocks[b].loads[l];
    if (m.row) return fmt::format("v{}.v[lane]", l);
    if (m.vector) return ld.broadcast ? fmt::format("in{}[0]", ld.index) : fmt::format("v{}.v[lane]", l);
    const std::string global = fmt::format("in{}[KILN_OFF(la{}_{}, pos, idx, it{})]", ld.index, b, l, b);
    const WindowUse* w = window_of_load(ld);
    if (w != nullptr && !w->fill) return fmt::format("(kiln_window ? {}[pos - kiln_row0] : {})", w->name, global);
    return global;
  }

  // The Row kernel's window (shared memory) of a relative tensor, when it has one.
  const WindowUse* window_of(std::uint64_t tensor) const {
    if (windows_ == nullptr) return nullptr;
    auto it = windows_->find(tensor);
    return it == windows_->end() ? nullptr : &it->second;
  }

  // The window a load reads (or fills): only a Plain, unbroadcast read of the tensor walks the
  // row as the window holds it. A view entry names its source's tensor (a transpose of x is not
  // x), a broadcast one reads other positions: those read global memory.
  const WindowUse* window_of_load(const fusion::Load& ld) const {
    if (ld.source != fusion::LoadSource::Input || ld.broadcast || p_.inputs[ld.index].role != fusion::InputRole::Plain)
      return nullptr;
    return window_of(p_.inputs[ld.index].tensor);
  }

  // Emits the loads, instructions and stores of block b (registers in `preset` are already
  // defined by the caller: a reduction's result, the matmul product).
  Status body(Text& t, int ind, std::uint32_t b, const BodyMode& m) {
    const ProgramBlock& blk = p_.blocks[b];
    for (std::uint32_t l = 0; l < blk.loads.size(); ++l) {
      const fusion::Load& ld = blk.loads[l];
      const DType d = blk.registers[ld.local];
      std::string e = (m.vector && !m.row && ld.broadcast) ? fmt::format("b{}", l) : load_conv(d, load_elem(b, l, m));
      const WindowUse* w = m.vector ? nullptr : window_of_load(ld);
      if (w != nullptr && w->fill) {  // the first reader copies the row into the window
        const std::string raw = fmt::format("raw{}", ld.local);
        t.line(ind, fmt::format("const {} {} = {};", storage_type(p_.inputs[ld.index].dtype), raw, load_elem(b, l, m)));
        t.line(ind, fmt::format("if (kiln_window) {}[pos - kiln_row0] = {};", w->name, raw));
        e = load_conv(d, raw);
      }
      t.line(ind, fmt::format("const {} {} = {};", cls_type(*cls_of(d)), reg(ld.local), e));
    }
    for (const Instruction& ins : blk.instructions) KILN_RETURN_IF_ERROR(instruction(t, ind, b, ins));
    for (std::uint32_t s = 0; s < blk.stores.size(); ++s) {
      const fusion::Store& st = blk.stores[s];
      const DType d = p_.outputs[st.output].dtype;
      const std::string v = store_conv(d, reg(st.local));
      if (m.vector) {
        t.line(ind, fmt::format("w{}.v[lane] = {};", s, v));
      } else if (const WindowUse* w = window_of(p_.outputs[st.output].tensor)) {
        t.line(ind,
               fmt::format("if (kiln_window) {}[pos - kiln_row0] = {}; else out{}[KILN_OFF(sa{}_{}, pos, idx, it{})] = "
                           "{};",
                           w->name, v, st.output, b, s, b, v));
      } else {
        t.line(
            ind,
            fmt::format(
                "if (!sa{0}_{1}.masked || kiln_first<KILN_R>(idx, sa{0}_{1}, it{0}.rank)) out{2}[KILN_OFF(sa{0}_{1}, "
                "pos, idx, it{0})] = {3};",
                b, s, st.output, v));
      }
    }
    return Status::Ok();
  }

  // Emits one instruction of block b: lowered, its operands as text, then its value (or its
  // indexed read).
  Status instruction(Text& t, int ind, std::uint32_t b, const Instruction& ins) {
    const ProgramBlock& blk = p_.blocks[b];
    // The shared lowering (fusion/lowering.h) picks the code and checks the operands.
    fusion::lowering::Lowered lowered;
    if (std::string why = fusion::lowering::lower_instruction(p_, blk, ins, lowered); !why.empty())
      return unsupported(std::move(why));
    const std::optional<Cls> cc = cls_of(ins.compute);
    const std::optional<Cls> oc = cls_of(ins.out_dtype);
    if (!cc || !oc) return unsupported("instruction dtype");
    const Code k = lowered.code;
    if (!fusion::lowering::dtype_supported(k, ins.compute))
      return unsupported(std::string("operands of ") + std::string(ir::op_info(ins.op).variant));
    const OperandText o = operand_text(ins, k, lowered.operands, *cc, *oc);
    const std::vector<std::uint32_t>& inputs = lowered.operands.inputs;  // indexed program inputs
    if (is_indexed(k)) return indexed(t, ind, ins, k, inputs);
    const ValueText value = value_text(t, ind, ins, k, o);
    std::string v = value.exact ? value.e : fixup(ins.out_dtype, "(" + value.e + ")");
    t.line(ind, fmt::format("const {} {} = {};", o.ot, reg(ins.out), v));
    return Status::Ok();
  }

  // An instruction's register and scalar operands as text, with its compute class `c` and
  // output class `to`.
  OperandText operand_text(const Instruction& ins, Code k, const fusion::lowering::Operands& operands, Cls c, Cls to) {
    OperandText o;
    for (std::uint32_t r : operands.locals) o.x.push_back(reg(r));
    for (std::uint32_t slot : operands.scalars) o.s.push_back(scalar_expr(slot, ins.compute));
    o.c = c;
    o.to = to;
    o.fl = c == Cls::F32 || c == Cls::F64;
    o.f32 = c == Cls::F32;
    o.ct = cls_type(c);
    o.ot = cls_type(to);
    if ((is_binary(k) || is_comparison(k)) && o.x.size() == 1) o.x.push_back(o.s[0]);
    return o;
  }

  // The value of a non-indexed instruction, from the function of its family.
  ValueText value_text(Text& t, int ind, const Instruction& ins, Code k, const OperandText& o) const {
    if (is_binary(k)) return {binary_text(k, o, ins.compute)};
    if (is_comparison(k)) return {comparison_text(k, o)};
    if (is_unary(k)) return {unary_text(k, o, opt_.fast_math)};
    if (k == Code::Cast) return cast_text(o, ins.out_dtype);
    return select_fill_text(t, ind, ins, k, o);
  }

  // Copies, the two-sided clamp (its lower bound on a line of its own), masked selects and
  // fills.
  static ValueText select_fill_text(Text& t, int ind, const Instruction& ins, Code k, const OperandText& o) {
    const std::vector<std::string>& x = o.x;
    const std::vector<std::string>& s = o.s;
    std::string e;
    bool exact = false;
    switch (k) {
      case Code::Copy:
        e = x[0];
        exact = true;
        break;
      case Code::Clamp:
        t.line(ind, fmt::format("const {0} {1}_lo = {2} < {3} ? {3} : {2};", o.ct, reg(ins.out), x[0], s[0]));
        e = fmt::format("({0}_lo > {1} ? {1} : {0}_lo)", reg(ins.out), s[1]);
        break;
      case Code::MaskWhere: e = fmt::format("({} ? {} : {})", x[1], x[2], x[0]); break;
      case Code::MaskFill: e = fmt::format("({} ? {} : {})", x[1], s[0], x[0]); break;
      case Code::Fill:
        e = ins.op == OpKind::Numeric_Full ? s[0] : fmt::format("({})({})", o.ot, ins.op == OpKind::Base_Ones ? 1 : 0);
        break;
      default: break;
    }
    return {e, exact};
  }

  // Gather / Select / Cat: the source position from the true multi-index of the block.
  Status indexed(Text& t, int ind, const Instruction& ins, Code k, const std::vector<std::uint32_t>& inputs) {
    if (ins.attrs.size() != 1 || ins.attrs[0] < 0 || ins.attrs[0] >= kMaxRank || !(ins.out_dtype == ins.compute))
      return unsupported("operands of an indexed read");
    const std::int64_t dim = ins.attrs[0];
    const std::string r = reg(ins.out);
    const char* ot = cls_type(*cls_of(ins.out_dtype));
    if (k == Code::Gather || k == Code::Select) {
      if (inputs.size() != 2 || !(p_.inputs[inputs[0]].dtype == ins.compute) ||
          !p_.inputs[inputs[1]].dtype.is_integral())
        return unsupported("operands of gather / select");
      const std::uint32_t xi = inputs[0], ii = inputs[1];
      t.line(ind, fmt::format("{} {};", ot, r));
      t.line(ind, "{");
      t.line(ind + 1, "long long q[KILN_MAX_RANK];");
      if (k == Code::Gather) {
        t.line(ind + 1, "long long at = 0;");
        t.line(ind + 1, "#pragma unroll");
        t.line(ind + 1,
               fmt::format("for (int d = 0; d < KILN_MAX_RANK; ++d) {{ q[d] = (d < ix{0}.rank && ix{0}.dims[d] != 1) ? "
                           "idx[d] : 0; if (d < ix{0}.rank) at += q[d] * ix{0}.strides[d]; }}",
                           ii));
        t.line(ind + 1, fmt::format("long long v = kiln_index(in{}, at);", ii));
      } else {
        t.line(ind + 1, "#pragma unroll");
        t.line(ind + 1, fmt::format("for (int d = 0; d < KILN_MAX_RANK; ++d) q[d] = (d < ix{0}.rank && (d == {1} ? "
                                    "ix{2}.dims[0] : ix{0}.dims[d]) != 1) ? idx[d] : 0;",
                                    xi, dim, ii));
        t.line(ind + 1, fmt::format("long long v = kiln_index(in{0}, q[{1}] * ix{0}.strides[0]);", ii, dim));
      }
      t.line(ind + 1, fmt::format("if (v < 0 || v >= ix{}.dims[{}]) {{ *kiln_fault = 1; v = 0; }}", xi, dim));
      t.line(ind + 1, fmt::format("q[{}] = v;", dim));
      t.line(ind + 1, "long long src = 0;");
      t.line(ind + 1, "#pragma unroll");
      t.line(ind + 1,
             fmt::format("for (int d = 0; d < KILN_MAX_RANK; ++d) if (d < ix{0}.rank) src += q[d] * ix{0}.strides[d];",
                         xi));
      t.line(ind + 1, fmt::format("{} = {};", r, load_conv(ins.compute, fmt::format("in{}[src]", xi))));
      t.line(ind, "}");
      return Status::Ok();
    }
    // Cat
    if (inputs.empty()) return unsupported("cat without inputs");
    for (std::uint32_t i : inputs)
      if (!(p_.inputs[i].dtype == ins.compute)) return unsupported("cat dtypes");
    const std::uint32_t x0 = inputs[0];
    t.line(ind, fmt::format("{} {} = 0;", ot, r));
    t.line(ind, "{");
    std::string total = "0LL";
    for (std::uint32_t i : inputs) total += fmt::format(" + ix{}.dims[{}]", i, dim);
    t.line(ind + 1, fmt::format("const long long total = {};", total));
    t.line(ind + 1, "long long q[KILN_MAX_RANK];");
    t.line(ind + 1, "#pragma unroll");
    t.line(ind + 1, fmt::format("for (int d = 0; d < KILN_MAX_RANK; ++d) q[d] = (d < ix{0}.rank && (d == {1} ? total : "
                                "ix{0}.dims[d]) != 1) ? idx[d] : 0;",
                                x0, dim));
    t.line(ind + 1, fmt::format("long long along = q[{}];", dim));
    for (std::uint32_t i : inputs) {
      t.line(ind + 1, fmt::format("if (along >= 0 && along < ix{}.dims[{}]) {{", i, dim));
      t.line(ind + 2, fmt::format("q[{}] = along; long long src = 0;", dim));
      t.line(ind + 2, "#pragma unroll");
      t.line(ind + 2,
             fmt::format("for (int d = 0; d < KILN_MAX_RANK; ++d) if (d < ix{0}.rank) src += q[d] * ix{0}.strides[d];",
                         i));
      t.line(ind + 2, fmt::format("{} = {}; along = -1;", r, load_conv(ins.compute, fmt::format("in{}[src]", i))));
      t.line(ind + 1, fmt::format("}} else if (along >= 0) {{ along -= ix{}.dims[{}]; }}", i, dim));
    }
    t.line(ind, "}");
    return Status::Ok();
  }

  // ---- Elementwise

  Status elementwise_strided() {
    collect_params();
    Text t;
    open_kernel(t, KernelRole::ElementwiseStrided);
    const bool indexed = block_indexed(p_.blocks[0]);
    t.line(1, "const long long stride = (long long)gridDim.x * blockDim.x;");
    t.line(1,
           "for (long long pos = (long long)blockIdx.x * blockDim.x + threadIdx.x; pos < it0.numel; pos += stride) {");
    t.line(2, "long long idx[KILN_MAX_RANK];");
    t.line(2, indexed ? "kiln_unravel<KILN_R>(pos, it0, idx);"
                      : "if (!it0.contiguous) kiln_unravel<KILN_R>(pos, it0, idx);");
    KILN_RETURN_IF_ERROR(body(t, 2, 0, BodyMode{}));
    t.line(1, "}");
    t.line(0, "}");
    out_.body += t.str();
    return Status::Ok();
  }

  // Elements per 16-byte vector: 16 / the widest stored element among block 0's stores and its
  // loads (the broadcast loads too when they are read as vectors, as in the row-vector kernel).
  std::uint32_t vector_width_of(bool broadcast_loads) const {
    const ProgramBlock& blk = p_.blocks[0];
    std::size_t widest = 1;
    for (const fusion::Load& l : blk.loads)
      if (broadcast_loads || !l.broadcast) widest = std::max(widest, storage_size(p_.inputs[l.index].dtype));
    for (const fusion::Store& s : blk.stores) widest = std::max(widest, storage_size(p_.outputs[s.output].dtype));
    return static_cast<std::uint32_t>(16 / widest);
  }

  // The vector kernels' step body: the stores' vectors w<s>, then block 0 once per lane (the
  // loads' vectors v<l> are the caller's).
  Status vector_lanes(Text& t, std::uint32_t v, const BodyMode& mode) {
    const ProgramBlock& blk = p_.blocks[0];
    for (std::uint32_t s = 0; s < blk.stores.size(); ++s)
      t.line(2, fmt::format("KilnVec<{}, {}> w{};", storage_type(p_.outputs[blk.stores[s].output].dtype), v, s));
    t.line(2, "#pragma unroll");
    t.line(2, fmt::format("for (int lane = 0; lane < {}; ++lane) {{", v));
    KILN_RETURN_IF_ERROR(body(t, 3, 0, mode));
    t.line(2, "}");
    return Status::Ok();
  }

  // Every tensor contiguous (or, for broadcast loads, one element) and aligned to the vector:
  // V elements per step, V = 16 bytes / the widest element.
  Status elementwise_vector() {
    const ProgramBlock& blk = p_.blocks[0];
    vector_width_ = vector_width_of(/*broadcast_loads=*/false);
    const std::uint32_t v = vector_width_;
    collect_params();
    Text t;
    open_kernel(t, KernelRole::ElementwiseVector);
    t.line(1, "const long long stride = (long long)gridDim.x * blockDim.x;");
    t.line(1, fmt::format("const long long nv = it0.numel / {};", v));
    for (std::uint32_t l = 0; l < blk.loads.size(); ++l) {
      const fusion::Load& ld = blk.loads[l];
      if (!ld.broadcast) continue;
      const DType d = blk.registers[ld.local];
      t.line(1, fmt::format("const {} b{} = {};", cls_type(*cls_of(d)), l,
                            load_conv(d, fmt::format("in{}[0]", ld.index))));
    }
    t.line(1, "for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < nv; j += stride) {");
    for (std::uint32_t l = 0; l < blk.loads.size(); ++l) {
      const fusion::Load& ld = blk.loads[l];
      if (ld.broadcast) continue;
      const std::string st = storage_type(p_.inputs[ld.index].dtype);
      t.line(2, fmt::format("const KilnVec<{0}, {1}> v{2} = reinterpret_cast<const KilnVec<{0}, {1}>*>(in{3})[j];", st,
                            v, l, ld.index));
    }
    KILN_RETURN_IF_ERROR(vector_lanes(t, v, BodyMode{.vector = true, .hoisted_bcast = true}));
    for (std::uint32_t s = 0; s < blk.stores.size(); ++s)
      t.line(2, fmt::format("reinterpret_cast<KilnVec<{}, {}>*>(out{})[j] = w{};",
                            storage_type(p_.outputs[blk.stores[s].output].dtype), v, blk.stores[s].output, s));
    t.line(1, "}");
    // The tail: positions past the last whole vector, one element per thread. Every accessor is
    // contiguous (or a one-element broadcast, whose access strides are all 0).
    t.line(1, fmt::format(
                  "for (long long pos = nv * {} + (long long)blockIdx.x * blockDim.x + threadIdx.x; pos < it0.numel; "
                  "pos += stride) {{",
                  v));
    t.line(2, "long long idx[KILN_MAX_RANK];");
    t.line(2, "if (!it0.contiguous) kiln_unravel<KILN_R>(pos, it0, idx);");
    KILN_RETURN_IF_ERROR(body(t, 2, 0, BodyMode{}));
    t.line(1, "}");
    t.line(0, "}");
    out_.body += t.str();
    return Status::Ok();
  }

  // Broadcast inputs along rows ([rows, 1] against [rows, cols], or [1, cols] biases): V
  // consecutive positions of one row per step, one unravel per step; a load whose innermost
  // stride is 0 reads one element and repeats it, one whose stride is 1 reads a vector. The
  // host launches it when the innermost dim is a multiple of V, every store is unmasked with
  // innermost stride 1, and every stride-1 access starts its rows on a vector boundary
  // (row_vector_eligible); the stride test per load is uniform across the launch.
  Status elementwise_row_vector() {
    const ProgramBlock& blk = p_.blocks[0];
    row_vector_width_ = vector_width_of(/*broadcast_loads=*/true);
    const std::uint32_t v = row_vector_width_;
    collect_params();
    Text t;
    open_kernel(t, KernelRole::ElementwiseRowVector);
    t.line(1, "const long long stride = (long long)gridDim.x * blockDim.x;");
    t.line(1, fmt::format("const long long nv = it0.numel / {};", v));
    t.line(1, "const int last = it0.rank - 1;");
    for (std::uint32_t l = 0; l < blk.loads.size(); ++l)
      t.line(1, fmt::format("const bool whole{0} = la0_{0}.strides[last] != 0;  // a vector, else one element repeated",
                            l));
    t.line(1, "for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < nv; j += stride) {");
    t.line(2, fmt::format("const long long pos = j * {};", v));
    t.line(2, "long long idx[KILN_MAX_RANK];");
    t.line(2, "kiln_unravel<KILN_R>(pos, it0, idx);");
    for (std::uint32_t l = 0; l < blk.loads.size(); ++l) {
      const fusion::Load& ld = blk.loads[l];
      const std::string st = storage_type(p_.inputs[ld.index].dtype);
      t.line(2, fmt::format("KilnVec<{}, {}> v{};", st, v, l));
      t.line(2, "{");
      t.line(3, fmt::format("const long long off = kiln_dot<KILN_R>(idx, la0_{}, it0.rank);", l));
      t.line(3, fmt::format("if (whole{0}) {{ v{0} = *reinterpret_cast<const KilnVec<{1}, {2}>*>(in{3} + off); }}", l,
                            st, v, ld.index));
      t.line(3, fmt::format("else {{ const {0} e = in{1}[off];", st, ld.index));
      t.line(3, "#pragma unroll");
      t.line(3, fmt::format("for (int lane = 0; lane < {}; ++lane) v{}.v[lane] = e; }}", v, l));
      t.line(2, "}");
    }
    KILN_RETURN_IF_ERROR(vector_lanes(t, v, BodyMode{.vector = true, .row = true}));
    for (std::uint32_t s = 0; s < blk.stores.size(); ++s)
      t.line(2, fmt::format(
                    "*reinterpret_cast<KilnVec<{0}, {1}>*>(out{2} + kiln_dot<KILN_R>(idx, sa0_{3}, it0.rank)) = w{3};",
                    storage_type(p_.outputs[blk.stores[s].output].dtype), v, blk.stores[s].output, s));
    t.line(1, "}");
    t.line(0, "}");
    out_.body += t.str();
    return Status::Ok();
  }

  // ---- Reduce

  struct RedText {
    std::string acc_type, init, point, combine_a_b, finish;
  };

  Status reduction_text(RedText& rt) {
    const fusion::Reduction& red = *p_.blocks[1].reduction;
    const Red r = *red_of(red.op);
    const Cls ic = *cls_of(red.input_dtype);
    const Cls oc = *cls_of(red.out_dtype);
    const bool fl = ic == Cls::F32 || ic == Cls::F64;
    const char* it = cls_type(ic);
    const char* ot = cls_type(oc);
    const std::string x = reg(red.input);
    switch (r) {
      case Red::Sum:
      case Red::Mean:
      case Red::Prod: {
        if (ic == Cls::Bool) return unsupported("sum of bools");
        // Float sums, means and products accumulate in f64 whatever the input dtype, as the CPU
        // backend and the reference do (more precise than docs/spec/fusion.md §14.7's f32 accumulator).
        rt.acc_type = fl ? "double" : it;
        const bool prod = r == Red::Prod;
        rt.init = prod ? fmt::format("({})1", rt.acc_type) : fmt::format("({})0", rt.acc_type);
        if (fl) {
          rt.point = fmt::format(fmt::runtime(prod ? "acc * (double){}" : "acc + (double){}"), x);
          rt.combine_a_b = prod ? "a * b" : "a + b";
        } else {
          rt.point = fmt::format(fmt::runtime(prod ? "kiln_wmul(acc, {})" : "kiln_wadd(acc, {})"), x);
          rt.combine_a_b = prod ? "kiln_wmul(a, b)" : "kiln_wadd(a, b)";
        }
        std::string v = r == Red::Mean ? fmt::format("acc / ({})n", rt.acc_type) : std::string("acc");
        if (fl) {
          if (red.out_dtype.kind() == DTypeKind::F16)
            rt.finish = fmt::format("kiln_f16d((double)({}))", v);
          else if (red.out_dtype.kind() == DTypeKind::BF16)
            rt.finish = fmt::format("kiln_bf16d((double)({}))", v);
          else
            rt.finish = fmt::format("({})({})", ot, v);
        } else {
          rt.finish = fixup(red.out_dtype, fmt::format("({})({})", ot, v));
        }
        break;
      }
      case Red::Max:
      case Red::Min: {
        if (ic == Cls::Bool) return unsupported("max of bools");
        rt.acc_type = it;
        const bool mx = r == Red::Max;
        if (ic == Cls::F32) rt.init = mx ? "-KILN_INF" : "KILN_INF";
        if (ic == Cls::F64) rt.init = mx ? "-KILN_DINF" : "KILN_DINF";
        if (ic == Cls::I64) rt.init = mx ? "(-0x7fffffffffffffffLL - 1)" : "0x7fffffffffffffffLL";
        if (ic == Cls::U64) rt.init = mx ? "0ULL" : "~0ULL";
        rt.point = fmt::format("{}(acc, {})", mx ? "kiln_max" : "kiln_min", x);
        rt.combine_a_b = mx ? "kiln_max(a, b)" : "kiln_min(a, b)";
        rt.finish = fixup(red.out_dtype, fmt::format("({})acc", ot));
        break;
      }
      case Red::MaxAbs: {
        if (ic == Cls::Bool) return unsupported("max_abs of bools");
        rt.acc_type = fl ? it : "unsigned long long";
        rt.init = fmt::format("({})0", rt.acc_type);
        rt.point = fmt::format(
            fmt::runtime(fl ? "kiln_max(acc, kiln_abs({}))" : "(kiln_mag({0}) > acc ? kiln_mag({0}) : acc)"), x);
        rt.combine_a_b = fl ? "kiln_max(a, b)" : "(b > a ? b : a)";
        rt.finish = fixup(red.out_dtype, fmt::format("({})acc", ot));
        break;
      }
      case Red::ArgMax:
      case Red::ArgMin: {
        if (ic == Cls::Bool || !red.out_dtype.is_integral()) return unsupported("arg reduction dtypes");
        rt.acc_type = fmt::format("KilnArg<{}>", it);
        rt.init = fmt::format("kiln_arg_none<{}>()", it);
        const char* mx = r == Red::ArgMax ? "true" : "false";
        rt.point = fmt::format("kiln_arg<{}>(acc, kiln_arg_of({}, k))", mx, x);
        rt.combine_a_b = fmt::format("kiln_arg<{}>(a, b)", mx);
        rt.finish = fixup(red.out_dtype, fmt::format("({})acc.at", ot));
        break;
      }
      case Red::Any:
      case Red::All: {
        rt.acc_type = "int";
        const bool all = r == Red::All;
        rt.init = all ? "1" : "0";
        rt.point = fmt::format(fmt::runtime(all ? "(acc & ({} != 0))" : "(acc | ({} != 0))"), x);
        rt.combine_a_b = all ? "(a & b)" : "(a | b)";
        rt.finish = oc == Cls::Bool ? "(acc != 0)" : fmt::format("({})(acc != 0)", ot);
        break;
      }
    }
    return Status::Ok();
  }

  Status reduce(KernelRole role) {
    RedText rt;
    KILN_RETURN_IF_ERROR(reduction_text(rt));
    collect_params();
    Text t;
    open_kernel(t, role);
    if (role == KernelRole::ReduceRows) {
      // One thread block per output (a grid-stride loop over the outputs).
      t.line(1, "for (long long o = blockIdx.x; o < rs.outputs; o += gridDim.x) {");
      KILN_RETURN_IF_ERROR(reduce_one_row(t, 2, rt));
      t.line(1, "}");
      t.line(0, "}");
      out_.body += t.str();
      return Status::Ok();
    }
    // One thread per output, serial along the axis: neighbouring threads read neighbouring
    // columns when inner > 1.
    t.line(1, "const long long stride = (long long)gridDim.x * blockDim.x;");
    t.line(1, "for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < rs.outputs; o += stride) {");
    KILN_RETURN_IF_ERROR(reduce_strided(t, 2, rt, "0", "1", /*unrolled=*/false));
    reduce_finish(t, 2, rt);
    KILN_RETURN_IF_ERROR(reduce_epilogue(t, 2));
    t.line(1, "}");
    t.line(0, "}");
    out_.body += t.str();
    return Status::Ok();
  }

  // Output `o` by the whole thread block: its threads stride along the reduced axis (unrolled,
  // so that each thread has several loads in flight), then warp shuffles and one exchange
  // through shared memory (blockDim.x is opt_.threads, a multiple of 32); thread 0 runs the
  // epilogue. Ends on a barrier (sh[] is reused by the next output).
  Status reduce_one_row(Text& t, int ind, const RedText& rt) {
    t.line(ind, fmt::format("__shared__ {} sh[{}];", rt.acc_type, std::max<std::uint32_t>(opt_.threads / 32, 1)));
    t.line(ind, fmt::format("const auto combine = [](const {0}& a, const {0}& b) {{ return {1}; }};", rt.acc_type,
                            rt.combine_a_b));
    KILN_RETURN_IF_ERROR(reduce_strided(t, ind, rt, "threadIdx.x", "blockDim.x"));
    // Every combine is order-independent up to rounding (arg ties go to the lower index).
    warp_combine(t, ind);
    t.line(ind, "if ((threadIdx.x & 31u) == 0) sh[threadIdx.x >> 5] = acc;");
    t.line(ind, "__syncthreads();");
    t.line(ind, "if (threadIdx.x < 32) {");
    t.line(ind + 1, fmt::format("acc = threadIdx.x < (blockDim.x >> 5) ? sh[threadIdx.x] : {};", rt.init));
    warp_combine(t, ind + 1);
    t.line(ind, "}");
    KILN_RETURN_IF_ERROR(leader_finishes(t, ind, rt, "threadIdx.x == 0"));
    t.line(ind, "__syncthreads();");
    return Status::Ok();
  }

  // The warp's accumulators combined by shuffles, the result in its lane 0.
  static void warp_combine(Text& t, int ind) {
    t.line(ind, "#pragma unroll");
    t.line(ind, "for (int off = 16; off > 0; off >>= 1) acc = combine(acc, kiln_shfl_down(acc, off));");
  }

  // The thread holding the reduced value (`leader`) finishes it and runs the epilogue.
  Status leader_finishes(Text& t, int ind, const RedText& rt, std::string_view leader) {
    t.line(ind, fmt::format("if ({}) {{", leader));
    reduce_finish(t, ind + 1, rt);
    KILN_RETURN_IF_ERROR(reduce_epilogue(t, ind + 1));
    t.line(ind, "}");
    return Status::Ok();
  }

  // Output `o` by one warp (the Row kernel's short rows): its lanes stride along the axis, warp
  // shuffles leave the result in lane 0, which runs the epilogue. Ends on a warp barrier.
  Status reduce_one_row_by_warp(Text& t, int ind, const RedText& rt) {
    t.line(ind, fmt::format("const auto combine = [](const {0}& a, const {0}& b) {{ return {1}; }};", rt.acc_type,
                            rt.combine_a_b));
    t.line(ind, "const unsigned lane = threadIdx.x & 31u;");
    KILN_RETURN_IF_ERROR(reduce_strided(t, ind, rt, "lane", "32"));
    warp_combine(t, ind);
    KILN_RETURN_IF_ERROR(leader_finishes(t, ind, rt, "lane == 0"));
    t.line(ind, "__syncwarp();");
    return Status::Ok();
  }

  // Each thread's share of output o: from `first`, every `step`-th element of the axis
  // (unrolled, so that each thread has several loads in flight; not the serial cols loop), into
  // `acc`.
  Status reduce_strided(Text& t, int ind, const RedText& rt, std::string_view first, std::string_view step,
                        bool unrolled = true) {
    t.line(ind, "const long long ob = o / rs.inner, oi = o % rs.inner;");
    t.line(ind, fmt::format("{} acc = {};", rt.acc_type, rt.init));
    if (unrolled) t.line(ind, "#pragma unroll 4");
    t.line(ind, fmt::format("for (long long k = {}; k < rs.n; k += {}) {{", first, step));
    KILN_RETURN_IF_ERROR(reduce_point(t, rt, ind + 1));
    t.line(ind, "}");
    return Status::Ok();
  }

  // One element of the reduced axis (position k of output ob, oi): the prologue, accumulated.
  Status reduce_point(Text& t, const RedText& rt, int ind) {
    t.line(ind, "const long long pos = (ob * rs.n + k) * rs.inner + oi;");
    t.line(ind, "long long idx[KILN_MAX_RANK];");
    t.line(ind, block_indexed(p_.blocks[0]) ? "kiln_unravel<KILN_R>(pos, it0, idx);"
                                            : "if (!it0.contiguous) kiln_unravel<KILN_R>(pos, it0, idx);");
    KILN_RETURN_IF_ERROR(body(t, ind, 0, BodyMode{}));
    t.line(ind, fmt::format("acc = {};", rt.point));
    return Status::Ok();
  }

  // The reduced register of output o (a mean divides by n).
  void reduce_finish(Text& t, int ind, const RedText& rt) {
    const fusion::Reduction& red = *p_.blocks[1].reduction;
    t.line(ind, "const long long n = rs.n; (void)n;");
    t.line(ind, fmt::format("const {} {} = {};", cls_type(*cls_of(red.out_dtype)), reg(red.out), rt.finish));
  }

  // The epilogue of output o (its reduced register defined).
  Status reduce_epilogue(Text& t, int ind) {
    t.line(ind, "const long long pos = o;");
    t.line(ind, "long long idx[KILN_MAX_RANK];");
    t.line(ind, block_indexed(p_.blocks[1]) ? "kiln_unravel<KILN_R>(pos, it1, idx);"
                                            : "if (!it1.contiguous) kiln_unravel<KILN_R>(pos, it1, idx);");
    return body(t, ind, 1, BodyMode{});
  }

 public:
  // ---- The stage as a part of the Row kernel

  // What the Row kernel needs of one stage's part: the __device__ function's name, and its
  // parameters (the stage kernels' list) with their declarations.
  struct RowPart {
    std::string function;
    std::vector<KernelParam> params;
    std::vector<std::string> decls;
  };

  // The stage over one row of the [rows, n] space, as a __device__ function run by the whole
  // thread block (or, `by_warp`, by one warp): an elementwise stage's threads stride along
  // positions [row * n, row * n + n) of its reference; a reduction (over the last axis: the host
  // checks inner == 1) reduces output `row`. The Row kernel puts a barrier between stages.
  // `in_launch`: the relative tensors one stage writes and a later one reads. Their pointers
  // lose __restrict__: they alias inside the kernel, and a const __restrict__ pointer may be
  // read through the non-coherent read-only path, which need not see the kernel's own writes.
  // `windows`: the temporaries the Row kernel may keep in its shared-memory window instead of
  // global memory (RowWindow), in window order; each part finds them at the same offsets.
  Status row_part(RowPart& part, const std::set<std::uint64_t>& in_launch, const std::vector<RowWindow>& windows,
                  bool by_warp) {
    KILN_RETURN_IF_ERROR(validate());
    if (p_.kind != ProgramKind::Elementwise && p_.kind != ProgramKind::Reduce)
      return unsupported("a row stage that is neither Elementwise nor Reduce");
    RedText rt;
    if (p_.kind == ProgramKind::Reduce) KILN_RETURN_IF_ERROR(reduction_text(rt));
    collect_params();
    part.function = fmt::format("{}_s{}_{}", opt_.name_prefix, stage_, by_warp ? "rowwarppart" : "rowpart");
    part.params = params_;
    for (KernelParam& kp : part.params) kp.stage = stage_;
    part.decls = decls_;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const KernelParam& kp = params_[i];
      // The fault word too: every stage's part gets the same one.
      const bool aliased = (kp.kind == ParamKind::InputPtr && in_launch.count(p_.inputs[kp.index].tensor)) ||
                           (kp.kind == ParamKind::OutputPtr && in_launch.count(p_.outputs[kp.index].tensor)) ||
                           kp.kind == ParamKind::Fault;
      if (aliased) {
        const std::size_t at = part.decls[i].find(" __restrict__");
        if (at != std::string::npos) part.decls[i].erase(at, std::string_view(" __restrict__").size());
      }
    }
    Text t;
    t.line(0, fmt::format("__device__ __forceinline__ void {}(", part.function));
    for (const std::string& d : part.decls) t.line(2, d + ",");
    t.line(2, "unsigned char* const kiln_window, const long long row, const long long row_n) {");
    t.line(1, fmt::format("[[maybe_unused]] constexpr int KILN_R = {};", max_rank()));
    std::map<std::uint64_t, WindowUse> uses;
    row_window_pointers(t, windows, stage_, uses);
    windows_ = &uses;
    if (p_.kind == ProgramKind::Elementwise) {
      t.line(1, "(void)kiln_fault;");
      t.line(1, "const long long end = (row + 1) * row_n;");
      t.line(1, by_warp ? "for (long long pos = row * row_n + (threadIdx.x & 31u); pos < end; pos += 32) {"
                        : "for (long long pos = row * row_n + threadIdx.x; pos < end; pos += blockDim.x) {");
      t.line(2, "long long idx[KILN_MAX_RANK];");
      t.line(2, block_indexed(p_.blocks[0]) ? "kiln_unravel<KILN_R>(pos, it0, idx);"
                                            : "if (!it0.contiguous) kiln_unravel<KILN_R>(pos, it0, idx);");
      KILN_RETURN_IF_ERROR(body(t, 2, 0, BodyMode{}));
      t.line(1, "}");
    } else {
      t.line(1, "(void)row_n; (void)kiln_fault;");
      t.line(1, "const long long o = row;");
      KILN_RETURN_IF_ERROR(by_warp ? reduce_one_row_by_warp(t, 1, rt) : reduce_one_row(t, 1, rt));
    }
    windows_ = nullptr;
    t.line(0, "}");
    out_.body += t.str();
    return Status::Ok();
  }

 private:
  // A pointer per window into the row's shared memory (null when the launch keeps them in global
  // memory): window w after the earlier ones, each n elements rounded up to 16 bytes.
  static void row_window_pointers(Text& t, const std::vector<RowWindow>& windows, std::uint32_t stage,
                                  std::map<std::uint64_t, WindowUse>& uses) {
    t.line(1, "[[maybe_unused]] const long long kiln_row0 = row * row_n;");
    std::string offset = "0LL";
    for (std::size_t w = 0; w < windows.size(); ++w) {
      const std::string st = storage_type(windows[w].dtype);
      const std::string name = fmt::format("kiln_w{}", w);
      t.line(1, fmt::format("[[maybe_unused]] {0}* const {1} = kiln_window ? reinterpret_cast<{0}*>(kiln_window + {2}) "
                            ": nullptr;",
                            st, name, offset));
      offset += fmt::format(" + (row_n * {} + 15) / 16 * 16", storage_size(windows[w].dtype));
      uses.emplace(windows[w].tensor, WindowUse{name, windows[w].filled_by == static_cast<std::int64_t>(stage)});
    }
  }

 public:
 private:
  // ---- Matmul

  Status matmul() {
    const fusion::MatmulSpec& mm = *p_.matmul;
    const DType ld = p_.inputs[mm.lhs].dtype, rd = p_.inputs[mm.rhs].dtype;
    // f16 / bf16 / f32 operands compute in f32; an f64 operand or output makes the product f64
    // (the CPU GEMM's rule).
    const bool f64 =
        ld.kind() == DTypeKind::F64 || rd.kind() == DTypeKind::F64 || mm.out_dtype.kind() == DTypeKind::F64;
    const char* ct = f64 ? "double" : "float";
    const bool idx0 = block_indexed(p_.blocks[0]);
    collect_params();
    Text t;
    open_kernel(t, KernelRole::Matmul);
    // 64x64 output tile per block of 256 threads (16x16), 4x4 outputs per thread, K in steps of
    // 16 through shared memory: a plain, portable tiling (every architecture from sm_75); the
    // tile sizes are the textbook ones that keep 2 x 4 KiB (f32) of shared memory per block.
    t.line(1, fmt::format("__shared__ {} As[16][64 + 1];", ct));
    t.line(1, fmt::format("__shared__ {} Bs[16][64];", ct));
    t.line(1, "const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;");
    t.line(1, "for (long long bt = blockIdx.z; bt < ms.batch; bt += gridDim.z) {");
    t.line(2, "long long lb = 0, rb = 0;");
    t.line(2, "{ long long rem = bt;");
    t.line(2, "#pragma unroll");
    t.line(2,
           "for (int d = KILN_MAX_RANK - 1; d >= 0; --d) if (d < ms.batch_rank) { const long long q = rem % "
           "ms.batch_dims[d]; "
           "rem /= ms.batch_dims[d]; lb += q * ms.lhs_batch[d]; rb += q * ms.rhs_batch[d]; } }");
    t.line(2, "for (long long m0 = (long long)blockIdx.y * 64; m0 < ms.m; m0 += (long long)gridDim.y * 64) {");
    t.line(2, "for (long long n0 = (long long)blockIdx.x * 64; n0 < ms.n; n0 += (long long)gridDim.x * 64) {");
    t.line(3, fmt::format("{} acc[4][4];", ct));
    t.line(3, "#pragma unroll");
    t.line(3, "for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) acc[i][j] = 0;");
    t.line(3, "for (long long k0 = 0; k0 < ms.k; k0 += 16) {");
    t.line(4, "for (int e = threadIdx.x; e < 64 * 16; e += blockDim.x) {");
    t.line(5, "const int r = e / 16, c = e % 16; const long long gm = m0 + r, gk = k0 + c;");
    t.line(5, fmt::format("As[c][r] = (gm < ms.m && gk < ms.k) ? ({}){} : ({})0;", ct,
                          load_conv(ld, fmt::format("in{}[lb + gm * ms.k + gk]", mm.lhs)), ct));
    t.line(4, "}");
    t.line(4, "for (int e = threadIdx.x; e < 16 * 64; e += blockDim.x) {");
    t.line(5, "const int r = e / 64, c = e % 64; const long long gk = k0 + r, gn = n0 + c;");
    t.line(5, fmt::format("Bs[r][c] = (gk < ms.k && gn < ms.n) ? ({}){} : ({})0;", ct,
                          load_conv(rd, fmt::format("in{}[rb + gk * ms.n + gn]", mm.rhs)), ct));
    t.line(4, "}");
    t.line(4, "__syncthreads();");
    t.line(4, "#pragma unroll");
    t.line(4, "for (int kk = 0; kk < 16; ++kk) {");
    t.line(5, fmt::format("{} a[4], b[4];", ct));
    t.line(5, "#pragma unroll");
    t.line(5, "for (int i = 0; i < 4; ++i) { a[i] = As[kk][ty + 16 * i]; b[i] = Bs[kk][tx + 16 * i]; }");
    t.line(5, "#pragma unroll");
    t.line(5, "for (int i = 0; i < 4; ++i) for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];");
    t.line(4, "}");
    t.line(4, "__syncthreads();");
    t.line(3, "}");
    // Epilogue: each product element, rounded to the matmul's output dtype, then block 0.
    t.line(3, "#pragma unroll");
    t.line(3, "for (int i = 0; i < 4; ++i) {");
    t.line(3, "#pragma unroll");
    t.line(3, "for (int j = 0; j < 4; ++j) {");
    t.line(4, "const long long gm = m0 + ty + 16 * i, gn = n0 + tx + 16 * j;");
    t.line(4, "if (gm >= ms.m || gn >= ms.n) continue;");
    t.line(4, "const long long pos = (bt * ms.m + gm) * ms.n + gn;");
    t.line(4, "long long idx[KILN_MAX_RANK];");
    t.line(4,
           idx0 ? "kiln_unravel<KILN_R>(pos, it0, idx);" : "if (!it0.contiguous) kiln_unravel<KILN_R>(pos, it0, idx);");
    const DType od = mm.out_dtype;
    std::string prod;
    if (od.kind() == DTypeKind::F16)
      prod = "kiln_f16d((double)acc[i][j])";
    else if (od.kind() == DTypeKind::BF16)
      prod = "kiln_bf16d((double)acc[i][j])";
    else
      prod = fmt::format("({})acc[i][j]", cls_type(*cls_of(od)));
    t.line(4, fmt::format("const {} {} = {};", cls_type(*cls_of(od)), reg(mm.out), prod));
    KILN_RETURN_IF_ERROR(body(t, 4, 0, BodyMode{}));
    t.line(3, "}");
    t.line(3, "}");
    t.line(2, "}");
    t.line(2, "}");
    t.line(1, "}");
    t.line(0, "}");
    out_.body += t.str();
    return Status::Ok();
  }

  const FusedProgram& p_;
  std::uint32_t stage_;
  const CodegenOptions& opt_;
  GeneratedProgram& out_;
  std::vector<KernelParam> params_;
  std::vector<std::string> decls_;
  // Row parts: the temporaries kept in the Row kernel's shared-memory window (relative tensor ->
  // the part's pointer name); null elsewhere.
  const std::map<std::uint64_t, WindowUse>* windows_ = nullptr;
  std::uint32_t vector_width_ = 0;
  std::uint32_t row_vector_width_ = 0;
};

// A reduction itself never faults: the host leaves the ones the reference refuses (no identity
// over an empty axis, an index dtype too narrow) to it before launching.
bool may_fault(const FusedProgram& p) {
  for (const ProgramBlock& b : p.blocks)
    for (const Instruction& ins : b.instructions) {
      const std::optional<Code> c = fusion::lowering::code_of(ins.op);
      if (c && fusion::lowering::may_fault(*c, ins.compute)) return true;
    }
  for (const FusedProgram& s : p.stages)
    if (may_fault(s)) return true;
  return false;
}

// The Row kernels (codegen.h): every stage's part, then one kernel calling them in order for each
// of its rows, with a barrier between stages; `by_warp`: a warp per row instead of a thread
// block. Their parameters are each stage's parameters (renamed k<stage>_<name>, tagged with the
// stage), then the row space.
// The Row program's temporaries that may live in the kernel's shared-memory window: an output of
// stage j stored by its first block over that block's whole reference (the row space), read by
// later stages in their first blocks only, one of which consumes it (ReadWrite: dead after the
// launch). Ordered by relative id.
std::vector<RowWindow> row_windows(const FusedProgram& p) {
  std::vector<RowWindow> out;
  for (std::size_t j = 0; j < p.stages.size(); ++j) {
    const FusedProgram& st = p.stages[j];
    for (std::uint32_t o = 0; o < st.outputs.size(); ++o) {
      const fusion::ProgramOutput& out_o = st.outputs[o];
      bool stored_in_block0 = false, stored_elsewhere = false;
      for (std::size_t b = 0; b < st.blocks.size(); ++b)
        for (const fusion::Store& sto : st.blocks[b].stores)
          if (sto.output == o) (b == 0 ? stored_in_block0 : stored_elsewhere) = true;
      if (!out_o.written || !stored_in_block0 || stored_elsewhere || out_o.shape != st.blocks[0].reference_shape)
        continue;
      bool consumed = false, read_elsewhere = false;
      for (std::size_t k = j + 1; k < p.stages.size(); ++k) {
        const FusedProgram& later = p.stages[k];
        for (std::uint32_t i = 0; i < later.inputs.size(); ++i) {
          const fusion::ProgramInput& in = later.inputs[i];
          const bool names_it = in.tensor == out_o.tensor || (in.role == fusion::InputRole::View && in.view &&
                                                              in.view->source < later.inputs.size() &&
                                                              later.inputs[in.view->source].tensor == out_o.tensor);
          if (!names_it) continue;
          if (in.role != fusion::InputRole::Plain) read_elsewhere = true;
          consumed = consumed || in.status == ir::TensorStatus::ReadWrite;
          for (std::size_t b = 1; b < later.blocks.size(); ++b)
            for (const fusion::Load& l : later.blocks[b].loads)
              read_elsewhere = read_elsewhere || (l.source == fusion::LoadSource::Input && l.index == i);
        }
      }
      if (consumed && !read_elsewhere) out.push_back(RowWindow{out_o.tensor, out_o.dtype});
    }
  }
  // Inputs from outside the launch read whole by the first blocks of two stages or more.
  std::map<std::uint64_t, std::vector<std::size_t>> readers;  // tensor -> stages, in order
  std::map<std::uint64_t, DType> dtypes;
  for (std::size_t k = 0; k < p.stages.size(); ++k) {
    const FusedProgram& st = p.stages[k];
    for (std::uint32_t i = 0; i < st.inputs.size(); ++i) {
      const fusion::ProgramInput& in = st.inputs[i];
      if (written_by_stages(p, p.stages.size(), in.tensor) || in.role != fusion::InputRole::Plain ||
          in.shape != st.blocks[0].reference_shape)
        continue;
      bool in_block0 = false, elsewhere = false;
      for (std::size_t b = 0; b < st.blocks.size(); ++b)
        for (const fusion::Load& l : st.blocks[b].loads)
          if (l.source == fusion::LoadSource::Input && l.index == i) (b == 0 ? in_block0 : elsewhere) = true;
      if (!in_block0 || elsewhere) continue;
      std::vector<std::size_t>& r = readers[in.tensor];
      if (r.empty() || r.back() != k) r.push_back(k);
      dtypes.insert_or_assign(in.tensor, in.dtype);
    }
  }
  for (const auto& [tensor, stages] : readers)
    if (stages.size() >= 2)
      out.push_back(RowWindow{tensor, dtypes.at(tensor), static_cast<std::int64_t>(stages.front())});
  std::sort(out.begin(), out.end(), [](const RowWindow& a, const RowWindow& b) { return a.tensor < b.tensor; });
  return out;
}

Status row_kernel(const FusedProgram& p, const CodegenOptions& opt, bool by_warp, GeneratedProgram& g) {
  std::set<std::uint64_t> in_launch;  // written by one stage, read by a later one
  for (std::size_t k = 1; k < p.stages.size(); ++k)
    for (const fusion::ProgramInput& in : p.stages[k].inputs)
      if (written_by_stages(p, k, in.tensor)) in_launch.insert(in.tensor);
  const std::vector<RowWindow> windows = row_windows(p);
  std::vector<StageGen::RowPart> parts(p.stages.size());
  for (std::size_t s = 0; s < p.stages.size(); ++s)
    KILN_RETURN_IF_ERROR(
        StageGen(p.stages[s], static_cast<std::uint32_t>(s), opt, g).row_part(parts[s], in_launch, windows, by_warp));
  KernelSpec k;
  k.role = by_warp ? KernelRole::RowFusedWarp : KernelRole::RowFused;
  k.name = fmt::format("{}_{}", opt.name_prefix, kernel_role_name(k.role));
  k.threads = opt.threads;
  Text t;
  t.line(0, fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}(", opt.threads, k.name));
  std::vector<std::vector<std::string>> args(parts.size());
  for (std::size_t s = 0; s < parts.size(); ++s)
    for (std::size_t i = 0; i < parts[s].decls.size(); ++i) {
      const std::string& d = parts[s].decls[i];
      const std::size_t name_at = d.find_last_of(' ') + 1;  // "<type> <name>"
      const std::string renamed = fmt::format("k{}_{}", s, d.substr(name_at));
      t.line(2, d.substr(0, name_at) + renamed + ",");
      args[s].push_back(renamed);
      k.params.push_back(parts[s].params[i]);
    }
  t.line(2, "const long long kiln_window_bytes, const long long kiln_rows, const long long kiln_n) {");
  k.params.push_back(KernelParam{.kind = ParamKind::RowWindowBytes});
  k.params.push_back(KernelParam{.kind = ParamKind::Rows});
  k.params.push_back(KernelParam{.kind = ParamKind::RowLength});
  // The row's window (kiln_window_bytes: 0 when the host keeps the temporaries in global memory),
  // one per warp in the warp kernel.
  t.line(1, "extern __shared__ __align__(16) unsigned char kiln_smem[];");
  t.line(1, fmt::format("unsigned char* const kiln_window = kiln_window_bytes == 0 ? nullptr : kiln_smem{};",
                        by_warp ? " + (threadIdx.x >> 5) * kiln_window_bytes" : ""));
  if (by_warp) {
    // Warps of a block take consecutive rows; a warp's rows are uniform across its lanes.
    t.line(1, "const long long warps = (long long)gridDim.x * (blockDim.x >> 5);");
    t.line(1,
           "for (long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < kiln_rows; "
           "row += warps) {");
  } else {
    t.line(1, "for (long long row = blockIdx.x; row < kiln_rows; row += gridDim.x) {");
  }
  for (std::size_t s = 0; s < parts.size(); ++s) {
    std::string call = parts[s].function + "(";
    for (const std::string& a : args[s]) call += a + ", ";
    t.line(2, call + "kiln_window, row, kiln_n);");
    // What this stage wrote for the row is read by the next one, by other threads of the block
    // (of the warp).
    if (s + 1 < parts.size()) t.line(2, by_warp ? "__syncwarp();" : "__syncthreads();");
  }
  // The next row's stages write the window that this row's last stage may still be reading.
  if (!windows.empty()) t.line(2, by_warp ? "if (kiln_window) __syncwarp();" : "if (kiln_window) __syncthreads();");
  t.line(1, "}");
  t.line(0, "}");
  g.body += t.str();
  g.row_windows.clear();
  for (const RowWindow& w : windows) g.row_windows.push_back(w.dtype);
  (by_warp ? g.row_warp_kernel : g.row_kernel) = g.kernels.size();
  g.kernels.push_back(std::move(k));
  return Status::Ok();
}

}  // namespace

bool written_by_stages(const FusedProgram& staged, std::size_t stages, std::uint64_t tensor) {
  for (std::size_t j = 0; j < stages && j < staged.stages.size(); ++j)
    for (const fusion::ProgramOutput& o : staged.stages[j].outputs)
      if (o.written && o.tensor == tensor) return true;
  return false;
}

Result<GeneratedProgram> generate(const FusedProgram& program, const CodegenOptions& options) {
  if (options.threads != 256) return unsupported("threads per block other than 256");
  if (options.name_prefix.empty()) return unsupported("empty kernel name prefix");
  GeneratedProgram g;
  g.body = fmt::format("// program: {}, structural hash {:016x}\n", fusion::program_kind_name(program.kind),
                       program.structural_hash());
  if (fusion::is_staged(program.kind)) {
    if (program.stages.empty()) return unsupported("a staged program without stages");
    for (std::size_t s = 0; s < program.stages.size(); ++s) {
      const FusedProgram& st = program.stages[s];
      if (st.kind != ProgramKind::Elementwise && st.kind != ProgramKind::Reduce)
        return unsupported("a stage that is neither Elementwise nor Reduce");
      KILN_RETURN_IF_ERROR(StageGen(st, static_cast<std::uint32_t>(s), options, g).run());
    }
    if (program.kind == ProgramKind::Row) {
      // The stages' own kernels stay the fallback: a refused row kernel is no error.
      GeneratedProgram with_row = g;
      Status st = row_kernel(program, options, /*by_warp=*/false, with_row);
      if (st.ok()) st = row_kernel(program, options, /*by_warp=*/true, with_row);
      if (st.ok())
        g = std::move(with_row);
      else
        g.row_kernel_refused = st.error().message;
    }
  } else {
    KILN_RETURN_IF_ERROR(StageGen(program, 0, options, g).run());
  }
  g.may_fault = may_fault(program);
  return g;
}

}  // namespace kiln::cuda

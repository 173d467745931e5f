// JIT kernels for fused elementwise programs: source generation, compilation with the system
// compiler, loading, and the in-memory / on-disk caches (see jit.h).
#include "jit.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <span>
#include <sstream>

#include <spdlog/spdlog.h>

#include "fast_program.h"
#include "kiln/base/files.h"
#include "kiln/base/hash.h"
#include "kiln/base/posix.h"
#include "kiln/cpu/host.h"

extern char** environ;

namespace kiln::cpu::jit {

using fast::CBlock;
using fast::CInstr;
using fast::Code;
using fast::Fixup;
using fast::VClass;

// ---- Source generation

namespace {

const char* ctype(VClass c) {
  switch (c) {
    case VClass::F32: return "float";
    case VClass::F64: return "double";
    case VClass::I64: return "std::int64_t";
    case VClass::U64: return "std::uint64_t";
    case VClass::Bool: return "rt::B8";
  }
  return "void";
}

// The C++ type a tensor of `d` stores its elements as.
const char* storage_type(ir::DType d) {
  switch (d.kind()) {
    case ir::DTypeKind::F64: return "double";
    case ir::DTypeKind::F32:
    case ir::DTypeKind::Flex32: return "float";
    case ir::DTypeKind::F16:
    case ir::DTypeKind::BF16: return "std::uint16_t";
    case ir::DTypeKind::I64: return "std::int64_t";
    case ir::DTypeKind::I32: return "std::int32_t";
    case ir::DTypeKind::I16: return "std::int16_t";
    case ir::DTypeKind::I8: return "std::int8_t";
    case ir::DTypeKind::U64: return "std::uint64_t";
    case ir::DTypeKind::U32: return "std::uint32_t";
    case ir::DTypeKind::U16: return "std::uint16_t";
    case ir::DTypeKind::U8: return "std::uint8_t";
    case ir::DTypeKind::Bool: return d.bool_store() == ir::BoolStore::U32 ? "std::uint32_t" : "std::uint8_t";
    case ir::DTypeKind::QFloat: return nullptr;
  }
  return nullptr;
}

// Storage element -> register value (load_elements' conversions).
std::string load_conv(ir::DType d, const std::string& e) {
  switch (d.kind()) {
    case ir::DTypeKind::F16: return "fast::f16_bits_to_f32(" + e + ")";
    case ir::DTypeKind::BF16: return "fast::bf16_bits_to_f32(" + e + ")";
    case ir::DTypeKind::I32:
    case ir::DTypeKind::I16:
    case ir::DTypeKind::I8: return "static_cast<std::int64_t>(" + e + ")";
    case ir::DTypeKind::U32:
    case ir::DTypeKind::U16:
    case ir::DTypeKind::U8: return "static_cast<std::uint64_t>(" + e + ")";
    case ir::DTypeKind::Bool: return "static_cast<rt::B8>((" + e + ") != 0)";
    default: return e;
  }
}

// Register value -> storage element (store_elements' conversions).
std::string store_conv(ir::DType d, const std::string& e) {
  switch (d.kind()) {
    case ir::DTypeKind::F16: return "fast::f32_to_f16_bits(" + e + ")";
    case ir::DTypeKind::BF16: return "fast::f32_to_bf16_bits(" + e + ")";
    case ir::DTypeKind::I32:
    case ir::DTypeKind::I16:
    case ir::DTypeKind::I8:
    case ir::DTypeKind::U32:
    case ir::DTypeKind::U16:
    case ir::DTypeKind::U8:
    case ir::DTypeKind::Bool: return std::string("static_cast<") + storage_type(d) + ">(" + e + ")";
    default: return e;
  }
}

// A double rounded once to a register of class `c` with fixup `f` (the interpreter's round_to).
std::string round_to(VClass c, Fixup f, const std::string& d) {
  if (c == VClass::F64) return d;
  if (f == Fixup::F16) return "rt::round_f16(F, " + d + ")";
  if (f == Fixup::BF16) return "rt::round_bf16(F, " + d + ")";
  return "static_cast<float>(" + d + ")";
}

std::string apply_fixup(VClass c, Fixup f, const std::string& e) {
  switch (f) {
    case Fixup::None: return e;
    case Fixup::F16: return "rt::fix_f16(" + e + ")";
    case Fixup::BF16: return "rt::fix_bf16(" + e + ")";
    case Fixup::Wrap32: return "static_cast<std::int64_t>(static_cast<std::int32_t>(" + e + "))";
    case Fixup::Wrap16: return "static_cast<std::int64_t>(static_cast<std::int16_t>(" + e + "))";
    case Fixup::Wrap8: return "static_cast<std::int64_t>(static_cast<std::int8_t>(" + e + "))";
    case Fixup::WrapU32: return "static_cast<std::uint64_t>(static_cast<std::uint32_t>(" + e + "))";
    case Fixup::WrapU16: return "static_cast<std::uint64_t>(static_cast<std::uint16_t>(" + e + "))";
    case Fixup::WrapU8: return "static_cast<std::uint64_t>(static_cast<std::uint8_t>(" + e + "))";
  }
  (void)c;
  return e;
}

std::string reg(std::int32_t r) { return "r" + std::to_string(r); }
std::string scalar(std::int32_t s) { return "s" + std::to_string(s); }

bool is_float(VClass c) { return c == VClass::F32 || c == VClass::F64; }
bool is_int(VClass c) { return c == VClass::I64 || c == VClass::U64; }

// `e` converted to double, as text.
std::string as_double(const std::string& e) { return "static_cast<double>(" + e + ")"; }

// What an instruction's expression is written from: its operands as text, and its result fixup.
struct ExprOperands {
  // Appended to every register name: "" per element, "[l]" per lane of a block.
  std::string sub;
  std::string a;                // the first register operand
  std::string y;                // the second operand: a register, else the first scalar slot
  Fixup out_fix = Fixup::None;  // the fixup of the result register
  std::string operand(std::int32_t r) const { return "r" + std::to_string(r) + sub; }
};

// The operands of `ins` in block `b`, with `sub` appended to register names.
ExprOperands expr_operands(const CInstr& ins, const CBlock& b, const std::string& sub) {
  ExprOperands o;
  o.sub = sub;
  o.out_fix = b.regs[ins.out].fixup;
  o.a = ins.regs[0] >= 0 ? o.operand(ins.regs[0]) : std::string();
  o.y = ins.regs[1] >= 0 ? o.operand(ins.regs[1]) : (ins.scalars[0] >= 0 ? scalar(ins.scalars[0]) : "");
  return o;
}

// Binary arithmetic, bitwise, logical and shift instructions, and the one-sided clamps.
std::string binary_expression(const CInstr& ins, const ExprOperands& o) {
  const VClass c = ins.cls;
  const std::string T = ctype(c);
  const std::string& a = o.a;
  const std::string& y = o.y;
  switch (ins.code) {
    case Code::Add:
    case Code::Sub:
    case Code::Mul: {
      if (a.empty() || y.empty() || c == VClass::Bool) return {};
      const char* op = ins.code == Code::Add ? " + " : ins.code == Code::Sub ? " - " : " * ";
      const char* w = ins.code == Code::Add ? "rt::wadd" : ins.code == Code::Sub ? "rt::wsub" : "rt::wmul";
      if (is_float(c)) return "(" + a + op + y + ")";
      return std::string(w) + "<" + T + ">(" + a + ", " + y + ")";
    }
    case Code::Div:
      if (is_float(c)) return "(" + a + " / " + y + ")";
      if (is_int(c)) return "rt::idiv<" + T + ">(" + a + ", " + y + ", fault)";
      return {};
    case Code::Rem:
      if (is_float(c)) return round_to(c, o.out_fix, "rt::float_rem(" + as_double(a) + ", " + as_double(y) + ")");
      if (is_int(c)) return "rt::irem<" + T + ">(" + a + ", " + y + ", fault)";
      return {};
    case Code::Pow:
      if (is_float(c)) return round_to(c, o.out_fix, "std::pow(" + as_double(a) + ", " + as_double(y) + ")");
      return {};
    case Code::BitAnd:
    case Code::BitOr:
    case Code::BitXor: {
      if (!is_int(c)) return {};
      const char* op = ins.code == Code::BitAnd ? " & " : ins.code == Code::BitOr ? " | " : " ^ ";
      return "static_cast<" + T + ">(" + a + op + y + ")";
    }
    case Code::LogicAnd:
    case Code::LogicOr:
    case Code::LogicXor: {
      if (c != VClass::Bool) return {};
      const char* op = ins.code == Code::LogicAnd ? " & " : ins.code == Code::LogicOr ? " | " : " ^ ";
      return "static_cast<rt::B8>(" + a + op + y + ")";
    }
    case Code::Shl:
    case Code::Shr:
      if (!is_int(c)) return {};
      return std::string(ins.code == Code::Shl ? "rt::shl<" : "rt::shr<") + T + ">(" + a + ", " + y + ", " +
             std::to_string(ins.bits) + ")";
    case Code::ClampMin:
      if (c == VClass::Bool) return {};
      return "(" + a + " < " + y + " ? " + y + " : " + a + ")";
    case Code::ClampMax:
      if (c == VClass::Bool) return {};
      return "(" + a + " > " + y + " ? " + y + " : " + a + ")";
    default: return {};
  }
}

// Comparisons: a bool result; only equality on bools.
std::string comparison_expression(const CInstr& ins, const ExprOperands& o) {
  static constexpr const char* kOps[] = {" == ", " != ", " > ", " >= ", " < ", " <= "};
  if (ins.cls == VClass::Bool && ins.code != Code::Eq && ins.code != Code::Ne) return {};
  const auto k = static_cast<std::size_t>(ins.code) - static_cast<std::size_t>(Code::Eq);
  return "static_cast<rt::B8>(" + o.a + kOps[k] + o.y + ")";
}

// Unary math: signs, the libm functions (f32 exp / log / log1p / tanh through fast_math.h),
// roundings, float classification and negations.
std::string unary_expression(const CInstr& ins, const ExprOperands& o) {
  const VClass c = ins.cls;
  const std::string T = ctype(c);
  const std::string& a = o.a;
  const bool fast_f32 = c == VClass::F32 && o.out_fix == Fixup::None;
  auto libm = [&](const char* fn) {
    return is_float(c) ? round_to(c, o.out_fix, std::string(fn) + "(" + as_double(a) + ")") : "";
  };
  auto fastf = [&](const char* f32fn, const char* libfn) {
    if (!is_float(c)) return std::string();
    return fast_f32 ? std::string("fast::") + f32fn + "(" + a + ")" : libm(libfn);
  };
  switch (ins.code) {
    case Code::Abs:
      if (is_float(c)) return "std::fabs(" + a + ")";
      if (is_int(c)) return "rt::iabs<" + T + ">(" + a + ")";
      return {};
    case Code::Neg:
      if (is_float(c)) return "(-" + a + ")";
      if (is_int(c)) return "rt::wsub<" + T + ">(" + T + "{0}, " + a + ")";
      return {};
    case Code::Sign:
      if (c == VClass::Bool) return {};
      return "rt::sign<" + T + ">(" + a + ")";
    case Code::Exp: return fastf("exp_f32", "std::exp");
    case Code::Log: return fastf("log_f32", "std::log");
    case Code::Log1p: return fastf("log1p_f32", "std::log1p");
    case Code::Tanh: return fastf("tanh_f32", "std::tanh");
    case Code::Erf: return libm("std::erf");
    case Code::Sin: return libm("std::sin");
    case Code::Cos: return libm("std::cos");
    case Code::Sqrt: return is_float(c) ? "std::sqrt(" + a + ")" : "";
    case Code::Recip: return is_float(c) ? "(" + T + "{1} / " + a + ")" : "";
    case Code::Round:
      if (!is_float(c)) return {};
      return (c == VClass::F32 ? "__builtin_roundevenf(" : "__builtin_roundeven(") + a + ")";
    case Code::Floor: return is_float(c) ? "std::floor(" + a + ")" : "";
    case Code::Ceil: return is_float(c) ? "std::ceil(" + a + ")" : "";
    case Code::Trunc: return is_float(c) ? "std::trunc(" + a + ")" : "";
    case Code::IsNan: return is_float(c) ? "static_cast<rt::B8>(" + a + " != " + a + ")" : "";
    case Code::IsInf: return is_float(c) ? "rt::is_inf<" + T + ">(" + a + ")" : "";
    case Code::BitNot: return is_int(c) ? "static_cast<" + T + ">(~" + a + ")" : "";
    case Code::Not: return c == VClass::Bool ? "static_cast<rt::B8>(" + a + " ^ 1)" : "";
    default: return {};
  }
}

// A cast from the instruction's class to its output class (and dtype, for f32's roundings).
std::string cast_expression(const CInstr& ins, const ExprOperands& o) {
  const VClass c = ins.cls;
  const std::string& a = o.a;
  const VClass to = ins.out_cls;
  const std::string D = ctype(to);
  if (c == VClass::Bool) return "static_cast<" + D + ">(" + a + " != 0 ? 1 : 0)";
  if (to == VClass::Bool) return "static_cast<rt::B8>(" + a + " != 0)";
  if (is_float(c) && is_int(to))
    return "rt::float_to_int<" + D + ">(" + as_double(a) + ", " + std::to_string(ins.out_dtype.size_bytes() * 8) + ")";
  if (to == VClass::F32 && c != VClass::F32) {
    const Fixup f = fast::fixup_of(ins.out_dtype);
    return f == Fixup::None ? "static_cast<float>(" + a + ")" : round_to(VClass::F32, f, as_double(a));
  }
  return "static_cast<" + D + ">(" + a + ")";
}

// Instructions that choose rather than compute: the two-sided clamp, the masked selects, copies
// and fills.
std::string select_fill_expression(const CInstr& ins, const ExprOperands& o) {
  const VClass c = ins.cls;
  const std::string T = ctype(c);
  const std::string& a = o.a;
  switch (ins.code) {
    case Code::Clamp:
      if (c == VClass::Bool || ins.scalars[0] < 0 || ins.scalars[1] < 0) return {};
      return "rt::clamp<" + T + ">(" + a + ", " + scalar(ins.scalars[0]) + ", " + scalar(ins.scalars[1]) + ")";
    case Code::MaskWhere:
      if (ins.regs[1] < 0 || ins.regs[2] < 0) return {};
      return "(" + o.operand(ins.regs[1]) + " ? " + o.operand(ins.regs[2]) + " : " + a + ")";
    case Code::MaskFill:
      if (ins.regs[1] < 0 || ins.scalars[0] < 0) return {};
      return "(" + o.operand(ins.regs[1]) + " ? " + scalar(ins.scalars[0]) + " : " + a + ")";
    case Code::Copy: return a;
    case Code::Fill: {
      if (ins.scalars[0] >= 0) return scalar(ins.scalars[0]);
      // Ones / Zeros: the constant is 0 or 1 in every class.
      const bool one = c == VClass::Bool ? ins.imm.b != 0 : is_float(c) ? ins.imm.f != 0 : ins.imm.i != 0;
      return "static_cast<" + T + ">(" + (one ? "1" : "0") + ")";
    }
    default: return {};
  }
}

// The expression of one instruction, before the register fixup; empty when unsupported.
// Mirrors bind_kernel's choice of kernel (fast_elementwise.cc) case by case.
std::string expression(const CInstr& ins, const CBlock& b, const std::string& sub) {
  const ExprOperands o = expr_operands(ins, b, sub);
  if (fusion::lowering::is_binary(ins.code)) return binary_expression(ins, o);
  if (fusion::lowering::is_comparison(ins.code)) return comparison_expression(ins, o);
  if (fusion::lowering::is_unary(ins.code)) return unary_expression(ins, o);
  if (ins.code == Code::Cast) return cast_expression(ins, o);
  if (fusion::lowering::is_indexed(ins.code)) return {};  // gather / select / cat
  return select_fill_expression(ins, o);
}

std::string scalar_init(VClass c, std::int32_t slot) {
  const std::string s = "F->scalars[" + std::to_string(slot) + "]";
  switch (c) {
    case VClass::F32: return "static_cast<float>(" + s + ".f)";
    case VClass::F64: return s + ".f";
    case VClass::I64: return s + ".i";
    case VClass::U64: return s + ".u";
    case VClass::Bool: return "static_cast<rt::B8>(" + s + ".b)";
  }
  return "0";
}

// Per instruction, its text in each form of the loop: per element (the plain and tail loops:
// one local per register), per block of kLanes elements (one local array per register), and
// in the checked pass of a block (AVX-512 only, see FlatPathWriter::checked_block).
struct InstrText {
  std::string body, block, fblock;
  // The instruction makes its pass run blocks (f32 exp / log / log1p / tanh). Passes without
  // one run one plain vectorised loop: Adam-like programs (many streams, many live values)
  // measured faster that way (W3 0.32 vs 0.50 ns per element), a block's arrays spilling.
  bool blocked = false;
  bool checked = false;  // it has a restricted-domain form for the checked pass
};

// Why the program gets no JIT kernel, from its kind and shape alone; empty when it may get one.
std::string program_declined(const fusion::FusedProgram& p, const fast::CompiledProgram& cp) {
  if (!cp.supported) return "not compiled: " + cp.why_unsupported;
  if (p.kind != fusion::ProgramKind::Elementwise && p.kind != fusion::ProgramKind::NhwcRelayout)
    return "not an elementwise program";
  if (cp.blocks.size() != 1 || p.blocks.size() != 1) return "not one block";
  const CBlock& b = cp.blocks[0];
  if (b.has_indexed) return "indexed reads (gather / select / cat)";
  if (b.reduction) return "a reduction";
  if (b.loads.size() != p.blocks[0].loads.size()) return "load list";
  return {};
}

// One instruction's text in the three forms of the loop, from its expressions per element (`e`)
// and per lane of a block (`eb`), fixup included.
InstrText instruction_text(const CInstr& ins, const fast::RegInfo& out, const std::string& e, const std::string& eb) {
  const std::string o = reg(static_cast<std::int32_t>(ins.out));
  InstrText t;
  std::ostringstream body, block, fblock;
  body << "      const " << ctype(out.cls) << " " << o << " = " << e << ";\n";
  // The f32 fast functions run as the target's vector forms (AVX-512 or AVX2, bit-identical to
  // the scalar ones, fast_math.h; lane by lane where it has neither): the auto-vectorised scalar
  // forms take about twice the instructions, which W2-like chains of exp / log / tanh feel.
  const char* general_block = ins.code == Code::Exp     ? "exp_block"
                              : ins.code == Code::Log   ? "log_block"
                              : ins.code == Code::Log1p ? "log1p_block"
                              : ins.code == Code::Tanh  ? "tanh_block"
                                                        : nullptr;
  // exp, log and tanh also have restricted-domain forms for the checked pass (see
  // FlatPathWriter::checked_block).
  const char* vfast = ins.code == Code::Exp    ? "exp_block_unchecked"
                      : ins.code == Code::Log  ? "log_block_unchecked"
                      : ins.code == Code::Tanh ? "tanh_block_unchecked"
                                               : nullptr;
  const bool fast_f32 = ins.cls == VClass::F32 && out.fixup == Fixup::None;
  const std::string decl = "      " + std::string(ctype(out.cls)) + " " + o + "[kLanes];\n";
  block << decl;
  fblock << decl;
  if (general_block != nullptr && fast_f32) {
    t.blocked = true;
    const std::string general =
        "      fast::" + std::string(general_block) + "<kLanes>(" + reg(ins.regs[0]) + ", " + o + ");\n";
    block << general;
    if (vfast != nullptr) {
      t.checked = true;
      fblock << "      fast::" << vfast << "<kLanes>(" << reg(ins.regs[0]) << ", " << o << ", chk);\n";
    } else {
      fblock << general;
    }
  } else {
    block << "      for (int l = 0; l < kLanes; ++l) " << o << "[l] = " << eb << ";\n";
    fblock << "      for (int l = 0; l < kLanes; ++l) " << o << "[l] = " << eb << ";\n";
  }
  t.body = body.str();
  t.block = block.str();
  t.fblock = fblock.str();
  return t;
}

// Checks block 0's loads, instructions and stores, and builds the instructions' texts into
// `texts`; returns why the program is declined, empty when it is not.
std::string instruction_texts(const fusion::FusedProgram& p, const fast::CompiledProgram& cp,
                              std::vector<InstrText>& texts) {
  const CBlock& b = cp.blocks[0];
  // Definitions in order: every register defined once, before its first use (the interpreter's
  // compiled forms are SSA; anything else is declined rather than guessed at).
  const std::size_t nregs = b.regs.size();
  std::vector<bool> defined(nregs, false);
  auto define = [&](std::uint32_t r) {
    if (r >= nregs || defined[r]) return false;
    defined[r] = true;
    return true;
  };
  for (const fast::CLoad& l : b.loads) {
    if (l.source != fusion::LoadSource::Input) return "a load of an earlier block's output";
    if (!define(l.reg)) return "a register loaded twice";
    const ir::DType d = p.inputs[l.index].dtype;
    if (storage_type(d) == nullptr || !(d == b.regs[l.reg].dtype)) return "load dtype";
  }
  for (const CInstr& ins : b.instrs) {
    if (ins.fn == nullptr) return "an instruction without a kernel";
    for (std::int32_t r : ins.regs)
      if (r >= 0 && (static_cast<std::size_t>(r) >= nregs || !defined[static_cast<std::size_t>(r)]))
        return "an operand read before it is defined";
    for (std::int32_t s : ins.scalars)
      if (s >= 0 && static_cast<std::size_t>(s) >= cp.scalars.size()) return "scalar slot";
    std::string e = expression(ins, b, "");
    std::string eb = expression(ins, b, "[l]");
    if (e.empty() || eb.empty()) return std::string("no JIT form for an instruction on ") + ins.compute.name();
    const fast::RegInfo& out = b.regs[ins.out];
    if (out.cls != ins.out_cls) return "instruction result class";
    if (!ins.exact_out) {
      e = apply_fixup(out.cls, out.fixup, e);
      eb = apply_fixup(out.cls, out.fixup, eb);
    }
    if (!define(ins.out)) return "a register defined twice";
    texts.push_back(instruction_text(ins, out, e, eb));
  }
  for (const fast::CStore& s : b.stores) {
    if (s.reg >= nregs || !defined[s.reg]) return "a store of an undefined register";
    if (storage_type(p.outputs[s.output].dtype) == nullptr) return "store dtype";
  }
  if (b.instrs.empty()) return "no instructions";
  return {};
}

// The prelude, the kernel's signature and its scalars; returns why the program is declined,
// empty when it is not.
std::string write_kernel_head(std::ostringstream& os, const fast::CompiledProgram& cp) {
  for (const char* part : kPreludeParts) os << part << "\n";
  os << "// ---- generated kernel\n"
        "extern \"C\" __attribute__((visibility(\"default\"))) int kiln_jit_run(const kiln::cpu::jit::Frame* F, "
        "std::uint64_t start, std::uint64_t n) {\n"
        "  using namespace kiln::cpu;\n"
        "  namespace rt = kiln::cpu::jit::rt;\n"
        "  int fault = 0;\n";
  for (std::size_t s = 0; s < cp.scalars.size(); ++s) {
    const auto cls = fast::class_of(cp.scalars[s].dtype);
    if (!cls) return "scalar dtype";
    os << "  const " << ctype(*cls) << " " << scalar(static_cast<std::int32_t>(s)) << " = "
       << scalar_init(*cls, static_cast<std::int32_t>(s)) << ";\n";
  }
  return {};
}

// The run-time flag that store k goes out non-temporally.
std::string nt_flag(std::size_t k) { return "nt" + std::to_string(k); }

// What one pass of the flat path runs: its instructions' texts joined in order, and its loads
// and stores.
struct PassSelection {
  std::string body, block, fblock;
  bool blocked = false, checked = false;  // some instruction makes it run blocks / a checked pass
  std::size_t instrs = 0;
  std::vector<std::size_t> loads, stores, nt_stores;
  bool use_nt() const { return !nt_stores.empty(); }
};

// Writes the flat path of block 0's kernel: the loops over contiguous inputs and outputs.
class FlatPathWriter {
 public:
  FlatPathWriter(const fusion::FusedProgram& p, const CBlock& b, const std::vector<InstrText>& texts,
                 const std::vector<bool>& load_broadcast, std::ostringstream& os)
      : p_(p), b_(b), texts_(texts), load_broadcast_(load_broadcast), os_(os) {}

  // Fast path: flat loops; every input contiguous from `start` or one broadcast element,
  // every output contiguous. ivdep: an output may be the buffer of an input consumed in place,
  // but only at the same position, which is read before it is written in the same iteration.
  void write() {
    os_ << "  if (F->flat) {\n";
    pointers();
    nontemporal_flags();
    const std::uint32_t parts = b_.split_into_parts() ? b_.parts : 0;
    if (parts > 1) passes_by_part(parts);
    pass(std::vector<bool>(b_.loads.size(), true), std::vector<bool>(b_.instrs.size(), true),
         std::vector<bool>(b_.stores.size(), true));
    os_ << "    return fault;\n"
           "  }\n";
  }

 private:
  // Load / store k's storage type and dtype, and the register it reads into / stores from.
  std::string load_type(std::size_t k) const { return std::string(storage_type(p_.inputs[b_.loads[k].index].dtype)); }
  ir::DType load_dtype(std::size_t k) const { return p_.inputs[b_.loads[k].index].dtype; }
  std::string store_type(std::size_t k) const {
    return std::string(storage_type(p_.outputs[b_.stores[k].output].dtype));
  }
  ir::DType store_dtype(std::size_t k) const { return p_.outputs[b_.stores[k].output].dtype; }
  std::string load_reg(std::size_t k) const { return reg(static_cast<std::int32_t>(b_.loads[k].reg)); }
  std::string load_cls(std::size_t k) const { return std::string(ctype(b_.regs[b_.loads[k].reg].cls)); }
  std::string store_val(std::size_t k) const { return reg(static_cast<std::int32_t>(b_.stores[k].reg)); }
  // An f32 output, which may go out non-temporally (see nontemporal_flags).
  bool nt_store(std::size_t k) const {
    const ir::DTypeKind d = store_dtype(k).kind();
    return d == ir::DTypeKind::F32 || d == ir::DTypeKind::Flex32;
  }

  // Each input's pointer from `start` (or its broadcast element) and each output's pointer.
  void pointers() {
    for (std::size_t k = 0; k < b_.loads.size(); ++k) {
      const std::string base =
          "reinterpret_cast<const " + load_type(k) + "*>(F->loads[" + std::to_string(k) + "].base)";
      if (load_broadcast_[k])
        os_ << "    const " << load_cls(k) << " b" << k << " = " << load_conv(load_dtype(k), base + "[0]") << ";\n";
      else
        os_ << "    const " << load_type(k) << "* const p" << k << " = " << base << " + start;\n";
    }
    for (std::size_t k = 0; k < b_.stores.size(); ++k)
      os_ << "    " << store_type(k) << "* const q" << k << " = reinterpret_cast<" << store_type(k) << "*>(F->stores["
          << k << "].base) + start;\n";
  }

  // Non-temporal stores for the fresh f32 outputs of a memory-bound launch that streams from
  // DRAM (no read for ownership, no eviction of inputs still to come; W1 at 2^24 -10%), chosen
  // per output at run time (Access::nontemporal: never one written in place), each only when it
  // is 64-byte aligned (a block or chunk is a multiple of 16 floats).
  void nontemporal_flags() {
    bool any = false;
    for (std::size_t k = 0; k < b_.stores.size(); ++k)
      if (nt_store(k)) {
        if (!any) os_ << "#if defined(__AVX512F__)\n";
        any = true;
        os_ << "    const bool " << nt_flag(k) << " = F->stores[" << k
            << "].nontemporal != 0 && (reinterpret_cast<std::uintptr_t>(q" << k << ") & 63) == 0;\n";
      }
    if (any) os_ << "#endif\n";
  }

  // A program made of independent parts (fused Adam: one part per parameter, each reading its
  // own parameter, gradient and moments) can run one part after another over the range rather
  // than all of them in each iteration: 7 streams at a time instead of 35 (a standalone loop of
  // 8 Adam parameters: 6.3 ms interleaved, 4.5 ms part by part). The launch allows it
  // (Frame::by_component, from parts_run_apart) only when no part writes a buffer that another
  // part reads.
  void passes_by_part(std::uint32_t parts) {
    os_ << "    if (F->by_component) {\n";
    for (std::uint32_t c = 0; c < parts; ++c) {
      std::vector<bool> load_in(b_.loads.size()), instr_in(b_.instrs.size()), store_in(b_.stores.size());
      for (std::uint32_t k : b_.loads_of_part(c)) load_in[k] = true;
      for (std::size_t k = 0; k < b_.instrs.size(); ++k) instr_in[k] = b_.instr_part[k] == c;
      for (std::size_t k = 0; k < b_.stores.size(); ++k) store_in[k] = b_.store_part[k] == c;
      pass(load_in, instr_in, store_in);
    }
    os_ << "    return fault;\n"
           "    }\n";
  }

  // One pass of the flat path over [start, start + n): the selected loads, instructions and
  // stores (a connected component of the program, or all of it), in a scope of its own.
  void pass(const std::vector<bool>& load_in, const std::vector<bool>& instr_in, const std::vector<bool>& store_in) {
    const PassSelection s = selection(load_in, instr_in, store_in);
    os_ << "    {\n";
    if (s.use_nt()) any_nt(s);
    blocked_loop(s);
    if (s.use_nt() && !s.blocked) nontemporal_chunks(s);
    if (s.use_nt()) streamed_mask(s);
    tail_loop(s);
    os_ << "    }\n";
  }

  // The texts, loads and stores of a pass.
  PassSelection selection(const std::vector<bool>& load_in, const std::vector<bool>& instr_in,
                          const std::vector<bool>& store_in) const {
    PassSelection s;
    for (std::size_t i = 0; i < texts_.size(); ++i)
      if (instr_in[i]) {
        s.body += texts_[i].body;
        s.block += texts_[i].block;
        s.fblock += texts_[i].fblock;
        s.blocked = s.blocked || texts_[i].blocked;
        s.checked = s.checked || texts_[i].checked;
        ++s.instrs;
      }
    for (std::size_t k = 0; k < b_.loads.size(); ++k)
      if (load_in[k]) s.loads.push_back(k);
    for (std::size_t k = 0; k < b_.stores.size(); ++k)
      if (store_in[k]) {
        s.stores.push_back(k);
        if (nt_store(k)) s.nt_stores.push_back(k);
      }
    return s;
  }

  // Whether any of the pass's outputs goes out non-temporally.
  void any_nt(const PassSelection& s) {
    std::string any;
    for (std::size_t k : s.nt_stores) any += (any.empty() ? "" : " || ") + nt_flag(k);
    os_ << "#if defined(__AVX512F__)\n"
           "    const bool any_nt = "
        << any
        << ";\n"
           "#endif\n";
  }

  // Blocks of kLanes elements first, one short loop per instruction over local arrays: the
  // compiler keeps them in vector registers, and the kLanes / 16 independent vectors per
  // instruction give the core independent work along a long chain of instructions (one
  // 16-lane vector per iteration leaves W2 latency-bound: 2.6 vs 1.6 ns per element).
  // Compute-bound passes (more than ~2 instructions per stream, the interpreter's criterion)
  // take 8 vectors (W2 7% faster than with 4; 12 or 16 spill and are slower), memory-bound
  // ones 4 (W1 at 2^24 streams 20% slower from DRAM with 128-element blocks).
  // Every block's loads happen before its stores, so an in-place output is still safe.
  void blocked_loop(const PassSelection& s) {
    const std::size_t streams = s.loads.size() + s.stores.size();
    const bool compute_bound = s.instrs > 2 * streams;
    os_ << "    constexpr int kLanes = " << (compute_bound ? 128 : 64)
        << ";\n"
           "    std::uint64_t i = 0;\n"
           "    for (; "
        << (s.blocked ? "" : "false && ") << "i + kLanes <= n; i += kLanes) {\n";
    const std::string loads = block_loads(s);
    const std::string stores = block_stores(s);
    if (s.checked) checked_block(s, loads, stores);
    os_ << loads << s.block << stores;
    os_ << "    }\n";
  }

  // A block's loads into local arrays.
  std::string block_loads(const PassSelection& s) const {
    std::ostringstream text;
    for (std::size_t k : s.loads) {
      text << "      " << load_cls(k) << " " << load_reg(k) << "[kLanes];\n"
           << "      for (int l = 0; l < kLanes; ++l) " << load_reg(k) << "[l] = "
           << (load_broadcast_[k] ? "b" + std::to_string(k)
                                  : load_conv(load_dtype(k), "p" + std::to_string(k) + "[i + l]"))
           << ";\n";
    }
    return text.str();
  }

  // A block's stores from local arrays, the f32 ones streamed when flagged.
  std::string block_stores(const PassSelection& s) const {
    std::ostringstream text;
    for (std::size_t k : s.stores) {
      const std::string plain = "for (int l = 0; l < kLanes; ++l) q" + std::to_string(k) +
                                "[i + l] = " + store_conv(store_dtype(k), store_val(k) + "[l]") + ";\n";
      if (nt_store(k))
        text << "#if defined(__AVX512F__)\n"
             << "      if (" << nt_flag(k) << ") {\n"
             << "        for (int v = 0; v < kLanes; v += 16) _mm512_stream_ps(q" << k << " + i + v, _mm512_loadu_ps("
             << store_val(k) << " + v));\n"
             << "      } else {\n"
             << "        " << plain << "      }\n"
             << "#else\n"
             << "      " << plain << "#endif\n";
      else
        text << "      " << plain;
    }
    return text.str();
  }

  // The blocked loop first runs a block through the restricted-domain forms of exp / log /
  // tanh (fast_math.h: no clamps, no vscalefps, no special-value fixups) while collecting their
  // inputs' ranges, and checks once at the end, before any store: a block with a lane outside
  // those domains (NaN, infinities, |x| >= 86 for exp, ...) is recomputed from its inputs with
  // the general forms. Same bits either way; W2 1.55 -> 1.3 ns per element (one check per
  // block instead of one per instruction, with a branch each, saves 3-4%).
  void checked_block(const PassSelection& s, const std::string& loads, const std::string& stores) {
    os_ << "#if defined(KILN_FAST_CHECKED_BLOCKS)\n"
           "    {\n"
           "      fast::BlockCheck chk;\n"
        << loads << s.fblock << "      if (__builtin_expect(chk.ok(), 1)) {\n"
        << stores
        << "        continue;\n"
           "      }\n"
           "    }\n"
           "#endif\n";
  }

  // One position of a plain loop: every load at input position `at`, the instructions, and
  // every store k to `<dest>k[<dest_at>]`.
  std::string element(const PassSelection& s, const std::string& at, const char* dest,
                      const std::string& dest_at) const {
    std::ostringstream e;
    for (std::size_t k : s.loads)
      e << "      const " << load_cls(k) << " " << load_reg(k) << " = "
        << (load_broadcast_[k] ? "b" + std::to_string(k)
                               : load_conv(load_dtype(k), "p" + std::to_string(k) + "[" + at + "]"))
        << ";\n";
    e << s.body;
    for (std::size_t k : s.stores)
      e << "      " << dest << k << "[" << dest_at << "] = " << store_conv(store_dtype(k), store_val(k)) << ";\n";
    return e.str();
  }

  // The plain loop of a pass without blocks, when some output is written non-temporally:
  // chunks of 256 positions through the same vectorised loop, those outputs into L1 scratch
  // arrays (one per f32 output: which are flagged is known only at run time), then streamed
  // out (GCC has no non-temporal form of a plain store). Measured on fused Adam's 35-stream
  // kernel (docs/decisions.md): 8.6 -> 5.6 ms with all 16 outputs fresh, no change with 2 of 16.
  void nontemporal_chunks(const PassSelection& s) {
    os_ << "#if defined(__AVX512F__)\n"
           "    if (any_nt) {\n"
           "      constexpr std::uint64_t kChunk = 256;\n"
           "      for (; i + kChunk <= n; i += kChunk) {\n";
    for (std::size_t k : s.nt_stores)
      os_ << "        alignas(64) float t" << k << "[kChunk];\n"
          << "        float* const d" << k << " = " << nt_flag(k) << " ? t" << k << " : q" << k << " + i;\n";
    for (std::size_t k : s.stores)
      if (!nt_store(k)) os_ << "        " << store_type(k) << "* const d" << k << " = q" << k << " + i;\n";
    os_ << "#pragma GCC ivdep\n"
           "        for (std::uint64_t j = 0; j < kChunk; ++j) {\n"
        << element(s, "i + j", "d", "j") << "        }\n";
    for (std::size_t k : s.nt_stores)
      os_ << "        if (" << nt_flag(k) << ")\n"
          << "          for (std::uint64_t v = 0; v < kChunk; v += 16) _mm512_stream_ps(q" << k
          << " + i + v, _mm512_load_ps(t" << k << " + v));\n";
    os_ << "      }\n"
           "    }\n"
           "#endif\n";
  }

  // Which stores went out non-temporally: the flagged ones, if a block or chunk ran at all.
  void streamed_mask(const PassSelection& s) {
    os_ << "#if defined(__AVX512F__)\n"
           "    if (any_nt && i > 0 && F->streamed != nullptr) {\n"
           "      std::uint64_t mask = 0;\n";
    for (std::size_t k : s.nt_stores)
      if (k < 64) os_ << "      if (" << nt_flag(k) << ") mask |= std::uint64_t{1} << " << k << ";\n";
    os_ << "      __atomic_fetch_or(F->streamed, mask, __ATOMIC_RELAXED);\n"
           "    }\n"
           "#endif\n";
  }

  // The positions left after the blocks or chunks, one at a time (vectorised by the compiler),
  // then the fence after any streamed store.
  void tail_loop(const PassSelection& s) {
    os_ << "#pragma GCC ivdep\n"
           "    for (; i < n; ++i) {\n"
        << element(s, "i", "q", "i") << "    }\n";
    if (s.use_nt())
      os_ << "#if defined(__AVX512F__)\n"
             "    if (any_nt) _mm_sfence();\n"
             "#endif\n";
  }

  const fusion::FusedProgram& p_;
  const CBlock& b_;
  const std::vector<InstrText>& texts_;
  const std::vector<bool>& load_broadcast_;
  std::ostringstream& os_;
};

// Whether the flat path reads load `l` of block 0 as one element: a broadcast constant along the
// space's last dimension ([m, 1] against [m, n]: a row's reduced value). A broadcast that varies
// along it ([1, n] against [m, n]: layer norm's gamma and beta) is read contiguously like any
// other input, which is what each row of it is when the kernel runs row by row (JitRows); over
// the whole space it is not contiguous, so such a launch takes the general path there.
bool reads_one_element(const fusion::FusedProgram& p, const fusion::Load& l) {
  if (!l.broadcast) return false;
  const ir::Shape& reference = p.blocks[0].reference_shape;
  const ir::Shape* shape = nullptr;
  if (l.source == fusion::LoadSource::Output) {
    shape = &p.outputs[l.index].shape;
  } else {
    const fusion::ProgramInput& in = p.inputs[l.index];
    shape = in.view ? &in.view->shape : &in.shape;
  }
  return shape->size() != reference.size() || shape->empty() || shape->back() == 0;
}

}  // namespace

Generated generate_source(const fusion::FusedProgram& p, const fast::CompiledProgram& cp) {
  Generated g;
  auto decline = [&](std::string why) {
    g.declined = std::move(why);
    g.source.clear();
    return g;
  };
  if (std::string why = program_declined(p, cp); !why.empty()) return decline(std::move(why));
  const CBlock& b = cp.blocks[0];
  std::vector<InstrText> texts;
  if (std::string why = instruction_texts(p, cp, texts); !why.empty()) return decline(std::move(why));

  g.load_broadcast.resize(b.loads.size());
  for (std::size_t k = 0; k < b.loads.size(); ++k) g.load_broadcast[k] = reads_one_element(p, p.blocks[0].loads[k]);

  std::ostringstream os;
  if (std::string why = write_kernel_head(os, cp); !why.empty()) return decline(std::move(why));
  FlatPathWriter(p, b, texts, g.load_broadcast, os).write();
  // No strided path: launches that need one (partial broadcasts, views, masked outputs) run on
  // the interpreter, which is faster there (run_elementwise_jit declines them). Reaching this
  // line would be a host bug; the fault flag makes the executor replay the ops, safely.
  os << "  return 1;\n"
        "}\n";
  g.source = os.str();
  return g;
}

const std::vector<std::string>& compile_flags() {
  // -ffp-contract=off: no multiply-add fusion across the program's own roundings (GCC fuses by
  // default in GNU mode); no -ffast-math: NaN / Inf and rounding as the interpreter.
  // -fno-trapping-math: nothing reads the floating-point exception flags, and without it GCC
  // keeps the selects of fast_math.h's functions as branches on AVX2 (no masked vectors), so
  // exp / log / tanh loops stay scalar there (10x slower).
  static const std::vector<std::string> kFlags = {"-std=c++20",
                                                  "-O3",
                                                  "-march=native",
                                                  "-fPIC",
                                                  "-shared",
                                                  "-fno-math-errno",
                                                  "-fno-trapping-math",
                                                  "-ffp-contract=off",
                                                  "-fvisibility=hidden",
                                                  "-fno-semantic-interposition",
                                                  "-w"};
  return kFlags;
}

// ---- Files, processes, libraries

namespace {

// A private directory removed (when empty) when the object goes.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp != nullptr && *tmp == '/' ? tmp : "/tmp") + "/kiln-jit-XXXXXX";
    if (::mkdtemp(templ.data()) != nullptr) path_ = templ;
  }
  ~TempDir() {
    if (!path_.empty()) ::rmdir(path_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Creates a unique file `dir/prefix-XXXXXX.suffix` (mode 0600) holding `text`.
std::optional<TempFile> make_temp(const std::string& dir, const std::string& prefix, const std::string& suffix,
                                  const std::string& text) {
  std::string templ = dir + "/" + prefix + "-XXXXXX" + suffix;
  const int fd = ::mkstemps(templ.data(), static_cast<int>(suffix.size()));
  if (fd < 0) return std::nullopt;
  TempFile f(templ);
  UniqueFd file(fd);
  const auto bytes = std::span(reinterpret_cast<const std::uint8_t*>(text.data()), text.size());
  if (!write_all(file.get(), bytes, templ).ok() || file.close() != 0) return std::nullopt;
  return f;
}

std::string read_head(const std::string& path, std::size_t max) {
  std::ifstream in(path, std::ios::binary);
  std::string s(max, '\0');
  in.read(s.data(), static_cast<std::streamsize>(max));
  s.resize(static_cast<std::size_t>(in.gcount()));
  return s;
}

// Runs `argv` with stdin from /dev/null and stdout / stderr into `log`; the exit status, or
// an error message (empty on a zero exit).
std::string run_process(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  argv.reserve(args.size() + 1);
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  if (posix_spawn_file_actions_init(&fa) != 0) return "posix_spawn_file_actions_init failed";
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return std::string("cannot start ") + args[0] + ": " + std::strerror(rc);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return std::string("waitpid: ") + std::strerror(errno);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return {};
  return "compiler failed (status " + std::to_string(status) + "): " + read_head(log, 2000);
}

// dlopen + the two symbols; the kernel, or the reason it did not load.
std::string load_library(const std::string& path, const std::string& key, const Generated& g,
                         std::shared_ptr<const Kernel>& out) {
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = ::dlerror();
    return std::string("dlopen: ") + (e != nullptr ? e : "?");
  }
  std::shared_ptr<void> lib(h, [](void* p) { ::dlclose(p); });
  const auto* stored_key = static_cast<const char*>(::dlsym(h, "kiln_jit_key"));
  void* fn = ::dlsym(h, "kiln_jit_run");
  if (stored_key == nullptr || fn == nullptr) return "missing symbols";
  if (key != stored_key) return "key mismatch";
  auto k = std::make_shared<Kernel>();
  k->fn = reinterpret_cast<KernelFn>(fn);
  k->load_broadcast = g.load_broadcast;
  k->key = key;
  k->library = std::move(lib);
  out = std::move(k);
  return {};
}

// 128 bits of FNV-1a (two 64-bit lanes with different offsets), as 32 hex digits: a file name.
// (A collision cannot load a wrong kernel: the library's stored key is compared on load.)
std::string hash_hex(const std::string& s) {
  const std::uint64_t h1 = fnv1a64(s), h2 = fnv1a64(s, kFnv64Offset ^ 0x9e3779b97f4a7c15ull);
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h1),
                static_cast<unsigned long long>(h2));
  return buf;
}

std::string find_on_path(const char* name) {
  const char* path = std::getenv("PATH");
  std::string p = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t from = 0;
  while (from <= p.size()) {
    const std::size_t to = std::min(p.find(':', from), p.size());
    const std::string dir = p.substr(from, to - from);
    if (!dir.empty() && dir[0] == '/') {
      std::string cand = dir + "/" + name;
      if (::access(cand.c_str(), X_OK) == 0) return cand;
    }
    from = to + 1;
  }
  return {};
}

// An absolute directory, created when missing, that must be ours and private (base/files.h).
bool private_dir(const std::string& dir) {
  return !dir.empty() && dir[0] == '/' && ensure_private_dir(dir, "cpu jit cache").ok();
}

std::string default_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && *xdg == '/') return std::string(xdg) + "/kiln/cpu-jit";
  const char* home = std::getenv("HOME");
  if (home != nullptr && *home == '/') return std::string(home) + "/.cache/kiln/cpu-jit";
  return {};
}

// What the generated code depends on besides its text: the CPU it was tuned for
// (-march=native) and the compiler binary.
std::string cpu_identity() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, id;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 || line.rfind("flags", 0) == 0) id += line + "\n";
    if (line.empty() && !id.empty()) break;  // the first processor's block
  }
  return id;
}

#ifndef KILN_CPU_JIT_VERSION
#define KILN_CPU_JIT_VERSION "unknown"
#endif

}  // namespace

// ---- JitCache

JitCache::JitCache(Options options) : options_(std::move(options)) {}
JitCache::~JitCache() = default;

Stats JitCache::stats() const {
  MutexLock lock(mutex_);
  return stats_;
}

bool JitCache::ensure_toolchain() {
  if (probed_) return !compiler_.empty();
  probed_ = true;
  if (!options_.compiler.empty()) {
    if (::access(options_.compiler.c_str(), X_OK) == 0) compiler_ = options_.compiler;
  } else {
    compiler_ = find_on_path("c++");
    if (compiler_.empty()) compiler_ = find_on_path("g++");
  }
  if (compiler_.empty()) {
    if (options_.mode == Mode::On)
      spdlog::warn("kiln cpu jit: no C++ compiler found; fused programs run on the interpreter");
    else
      spdlog::debug("kiln cpu jit: no C++ compiler found; fused programs run on the interpreter");
    return false;
  }
  struct stat st {};
  std::string compiler_id = compiler_;
  if (::stat(compiler_.c_str(), &st) == 0)
    compiler_id += " " + std::to_string(st.st_size) + " " + std::to_string(st.st_mtime);
  toolchain_id_ = compiler_id + "\n" + cpu_identity() + "kiln " + KILN_CPU_JIT_VERSION + " abi " +
                  std::to_string(kAbiVersion) + "\n";
  const std::string dir = options_.cache_dir.empty() ? default_cache_dir() : options_.cache_dir;
  if (private_dir(dir))
    disk_dir_ = dir;
  else
    spdlog::debug(
        "kiln cpu jit: cache directory '{}' is not usable (not creatable, or not private to this user); "
        "kernels are compiled for this process only",
        dir);
  return true;
}

std::shared_ptr<const Kernel> JitCache::kernel_for(const fusion::FusedProgram& program,
                                                   const fast::CompiledProgram& compiled) {
  if (!enabled()) return nullptr;
  Generated g = generate_source(program, compiled);
  MutexLock lock(mutex_);
  if (!g.declined.empty()) {
    ++stats_.declined;
    spdlog::debug("kiln cpu jit: declined ({})", g.declined);
    return nullptr;
  }
  if (!ensure_toolchain()) return nullptr;
  std::string keyed = g.source + "\n";
  for (const std::string& f : compile_flags()) keyed += f + " ";
  keyed += "\n" + toolchain_id_;
  const std::string key = hash_hex(keyed);
  if (auto it = loaded_.find(key); it != loaded_.end()) {
    if (it->second.failed) return nullptr;
    if (std::shared_ptr<const Kernel> k = it->second.kernel.lock()) return k;
  }
  std::shared_ptr<const Kernel> k = load_or_build(key, g);
  loaded_[key] = Loaded{k, k == nullptr};
  if (loaded_.size() >= prune_at_) {
    std::erase_if(loaded_, [](const auto& entry) { return !entry.second.failed && entry.second.kernel.expired(); });
    prune_at_ = std::max<std::size_t>(64, 2 * loaded_.size());
  }
  return k;
}

std::shared_ptr<const Kernel> JitCache::load_or_build(const std::string& key, const Generated& g) {
  if (!disk_dir_.empty()) {
    const std::string path = disk_dir_ + "/" + key + ".so";
    if (::access(path.c_str(), F_OK) == 0) {
      std::shared_ptr<const Kernel> k;
      const std::string e = load_library(path, key, g, k);
      if (e.empty()) {
        ++stats_.disk_loads;
        return k;
      }
      // Truncated by a crash, written by another build, or not ours: drop and rebuild.
      ++stats_.corrupt;
      spdlog::debug("kiln cpu jit: ignoring cache entry {}: {}", path, e);
      ::unlink(path.c_str());
    }
    return build_in(disk_dir_, key, g, path);
  }
  TempDir dir;
  if (dir.path().empty()) {
    ++stats_.failures;
    return nullptr;
  }
  return build_in(dir.path(), key, g, dir.path() + "/" + key + ".so");
}

std::shared_ptr<const Kernel> JitCache::failed_build(const std::string& key, const std::string& why) {
  ++stats_.failures;
  spdlog::debug("kiln cpu jit: compiling {} failed, the interpreter runs it: {}", key, why);
  return nullptr;
}

std::shared_ptr<const Kernel> JitCache::build_in(const std::string& dir, const std::string& key, const Generated& g,
                                                 const std::string& final_path) {
  const std::string text =
      g.source + "extern \"C\" __attribute__((visibility(\"default\"))) const char kiln_jit_key[] = \"" + key + "\";\n";
  std::optional<TempFile> src = make_temp(dir, key, ".cc", text);
  std::optional<TempFile> out = make_temp(dir, key, ".so.tmp", "");
  std::optional<TempFile> log = make_temp(dir, key, ".log", "");
  if (!src || !out || !log) return failed_build(key, "cannot write temporary files in " + dir);
  std::vector<std::string> args{compiler_};
  for (const std::string& f : compile_flags()) args.push_back(f);
  args.insert(args.end(), {"-o", out->path(), src->path()});
  if (std::string e = run_process(args, log->path()); !e.empty()) return failed_build(key, e);
  // Publish atomically: a concurrent process sees either no entry or a complete one.
  if (::rename(out->path().c_str(), final_path.c_str()) != 0)
    return failed_build(key, "rename: " + std::string(std::strerror(errno)));
  out->keep();
  // The source stays next to its library in the disk cache: what the JIT generated for a
  // program can be read (and recompiled by hand with compile_flags()) when diagnosing.
  if (dir == disk_dir_) {
    const std::string kept_source = disk_dir_ + "/" + key + ".cc";
    if (::rename(src->path().c_str(), kept_source.c_str()) == 0) src->keep();
  }
  // A library compiled into a private temporary directory is unlinked once loaded (the
  // mapping stays valid); one in the cache directory stays for the next process.
  std::optional<TempFile> transient;
  if (dir != disk_dir_) transient.emplace(final_path);
  std::shared_ptr<const Kernel> k;
  if (std::string e = load_library(final_path, key, g, k); !e.empty()) {
    ::unlink(final_path.c_str());
    return failed_build(key, "the compiled library does not load: " + e);
  }
  ++stats_.compiles;
  return k;
}

}  // namespace kiln::cpu::jit

// ---- Running a JIT kernel

namespace kiln::cpu::fast {

namespace {

// Element offset, through accessor `a`, of flat position q of the runner's iteration space.
std::int64_t offset_of(const BlockRunner& b, const Accessor& a, std::uint64_t q) {
  std::int64_t off = 0;
  for (int d = b.rank() - 1; d >= 0; --d) {
    const std::uint64_t dim = b.dims()[static_cast<std::size_t>(d)];
    off += static_cast<std::int64_t>(q % dim) * a.stride[static_cast<std::size_t>(d)];
    q /= dim;
  }
  return off;
}

bool is_f32(ir::DType d) { return d.kind() == ir::DTypeKind::F32 || d.kind() == ir::DTypeKind::Flex32; }

// A launch's scalars as the kernel's frame carries them.
std::vector<jit::ScalarValue> frame_scalars(std::span<const Scalar> scalars) {
  std::vector<jit::ScalarValue> out;
  out.reserve(scalars.size());
  for (const Scalar& s : scalars) out.push_back(jit::ScalarValue{s.f, s.i, s.u, s.b});
  return out;
}

// A launch the flat path cannot take, row by row when its broadcasts run along the last
// dimension (W4's x - max: 0.67 ns per element on the interpreter, measured against 3.5 on the
// strided path); declined otherwise (the interpreter runs it).
std::string run_elementwise_jit_rows(const Launch& launch, const BlockRunner& runner, bool streams, bool* fault,
                                     bool* declined) {
  const std::uint64_t n = runner.dims()[static_cast<std::size_t>(runner.rank() - 1)];
  std::vector<bool> nontemporal;
  for (std::size_t i = 0; i < runner.store_accessors().size(); ++i)
    nontemporal.push_back(streams && runner.streamable_store(i));
  const std::optional<JitRows> rows = JitRows::make(launch.jit, runner, launch.scalars, n, nontemporal);
  if (!rows) {
    *declined = true;
    return {};
  }
  const std::uint64_t count = runner.numel() / n;
  std::atomic<bool> failed{false};
  std::uint64_t streamed = 0;  // written by the kernel calls (__atomic_fetch_or), read after the join
  parallel_ranges(launch, count, std::max<std::uint64_t>(1, kParallelThreshold / 2 / n),
                  [&](std::uint64_t r0, std::uint64_t r1) {
                    if (!rows->run(runner, r0, r1, &streamed)) failed.store(true, std::memory_order_relaxed);
                  });
  if (failed.load(std::memory_order_relaxed)) {
    *fault = true;  // replayed op by op: nothing of this launch counts
    return {};
  }
  const auto mask = __atomic_load_n(&streamed, __ATOMIC_RELAXED);
  if (mask != 0 && launch.nontemporal_outputs != nullptr)
    launch.nontemporal_outputs->fetch_add(static_cast<std::uint64_t>(std::popcount(mask)), std::memory_order_relaxed);
  return {};
}

}  // namespace

std::optional<JitRows> JitRows::make(const jit::Kernel* kernel, const BlockRunner& b, std::span<const Scalar> scalars,
                                     std::uint64_t n, const std::vector<bool>& nontemporal) {
  if (kernel == nullptr || n < kMinLength || b.rank() < 1) return std::nullopt;
  const std::size_t last = static_cast<std::size_t>(b.rank() - 1);
  if (b.dims()[last] % n != 0) return std::nullopt;  // a row would cross a dimension of the space
  const std::span<const Accessor> la = b.load_accessors(), sa = b.store_accessors();
  if (la.size() != kernel->load_broadcast.size() || nontemporal.size() != sa.size()) return std::nullopt;
  JitRows rows;
  rows.kernel_ = kernel;
  rows.n_ = n;
  for (std::size_t i = 0; i < la.size(); ++i) {
    if (la[i].stride[last] != (kernel->load_broadcast[i] ? 0 : 1)) return std::nullopt;
    rows.loads_.push_back(jit::Access{});
  }
  for (std::size_t i = 0; i < sa.size(); ++i) {
    if (sa[i].stride[last] != 1 || sa[i].masked) return std::nullopt;
    jit::Access x{};
    x.nontemporal = nontemporal[i] && is_f32(sa[i].dtype) ? 1 : 0;
    rows.stores_.push_back(x);
  }
  rows.scalars_ = frame_scalars(scalars);
  return rows;
}

bool JitRows::run(const BlockRunner& b, std::uint64_t r0, std::uint64_t r1, std::uint64_t* streamed) const {
  const std::span<const Accessor> la = b.load_accessors(), sa = b.store_accessors();
  std::vector<jit::Access> loads = loads_, stores = stores_;
  jit::Frame f{};
  f.rank = 1;
  f.dims[0] = n_;
  f.loads = loads.data();
  f.stores = stores.data();
  f.scalars = scalars_.data();
  f.f16_from_f64 = &kiln::reference::f16_from_f64;
  f.bf16_from_f64 = &kiln::reference::bf16_from_f64;
  f.flat = 1;
  f.streamed = streamed;
  auto row_base = [&](const Accessor& a, std::uint64_t q) {
    return reinterpret_cast<char*>(a.base) + offset_of(b, a, q) * static_cast<std::int64_t>(a.esize);
  };
  for (std::uint64_t r = r0; r < r1; ++r) {
    const std::uint64_t q = r * n_;
    for (std::size_t i = 0; i < la.size(); ++i) loads[i].base = row_base(la[i], q);
    for (std::size_t i = 0; i < sa.size(); ++i) stores[i].base = row_base(sa[i], q);
    if (kernel_->fn(&f, 0, n_) != 0) return false;
  }
  return true;
}

std::string run_elementwise_jit(const Launch& launch, bool* fault, bool* declined) {
  const jit::Kernel& k = *launch.jit;
  // The interpreter's binding (coalesced iteration space, accessors, broadcast masks) is reused:
  // the kernel walks the same space, so what the interpreter accepts the kernel accepts.
  BlockRunner runner;
  const CBlock& cb = launch.compiled->blocks[0];
  if (std::string e = runner.prepare(launch, 0, launch.concrete(cb.reference)); !e.empty()) return e;
  const std::uint64_t n = runner.numel();
  if (n == 0) return {};
  // Fresh outputs of a memory-bound launch streaming from DRAM are marked for non-temporal
  // stores (the interpreter's selection; the kernel takes them for f32 outputs that are 64-byte
  // aligned, and reports which it streamed).
  const bool streams = runner.streams_outputs();
  const std::span<const Accessor> la = runner.load_accessors();
  const std::span<const Accessor> sa = runner.store_accessors();
  if (la.size() != k.load_broadcast.size()) return "jit kernel does not match the program";
  auto access = [&](const Accessor& a, bool masked) {
    jit::Access x{};
    x.base = reinterpret_cast<char*>(a.base);
    for (std::size_t d = 0; d < kMaxRank; ++d) x.stride[d] = a.stride[d];
    x.masked = masked ? 1 : 0;
    return x;
  };
  std::vector<jit::Access> loads, stores;
  bool flat = true;
  for (std::size_t i = 0; i < la.size(); ++i) {
    loads.push_back(access(la[i], false));
    flat = flat && (k.load_broadcast[i] ? la[i].zero : la[i].contiguous);
  }
  for (std::size_t i = 0; i < sa.size(); ++i) {
    const Accessor& a = sa[i];
    jit::Access x = access(a, a.masked);
    x.nontemporal = streams && is_f32(a.dtype) && runner.streamable_store(i) ? 1 : 0;
    stores.push_back(x);
    flat = flat && a.contiguous && !a.masked;
  }
  if (!flat) return run_elementwise_jit_rows(launch, runner, streams, fault, declined);
  const std::vector<jit::ScalarValue> scalars = frame_scalars(launch.scalars);
  jit::Frame f{};
  f.rank = static_cast<std::uint64_t>(runner.rank());
  for (int d = 0; d < runner.rank(); ++d) f.dims[d] = runner.dims()[static_cast<std::size_t>(d)];
  f.loads = loads.data();
  f.stores = stores.data();
  f.scalars = scalars.data();
  f.f16_from_f64 = &kiln::reference::f16_from_f64;
  f.bf16_from_f64 = &kiln::reference::bf16_from_f64;
  f.flat = flat ? 1 : 0;
  f.by_component = parts_run_apart(cb, la, sa, n) ? 1 : 0;
  std::uint64_t streamed = 0;  // written by the kernel calls (__atomic_fetch_or), read after the join
  f.streamed = &streamed;
  // Pieces of kBlock positions, split between threads as the interpreter splits its chunks;
  // each task runs its whole contiguous range in one call.
  const std::uint64_t pieces = (n + kBlock - 1) / kBlock;
  std::atomic<bool> failed{false};
  parallel_ranges(launch, pieces, kParallelThreshold / kBlock / 2, [&](std::uint64_t b, std::uint64_t e) {
    const std::uint64_t start = b * kBlock;
    const std::uint64_t end = std::min(n, e * kBlock);
    if (k.fn(&f, start, end - start) != 0) failed.store(true, std::memory_order_relaxed);
  });
  if (failed.load(std::memory_order_relaxed)) {
    *fault = true;  // replayed op by op: nothing of this launch counts
    return {};
  }
  if (f.by_component != 0 && launch.part_by_part != nullptr)
    launch.part_by_part->fetch_add(1, std::memory_order_relaxed);
  const auto mask = __atomic_load_n(&streamed, __ATOMIC_RELAXED);
  if (mask != 0 && launch.nontemporal_outputs != nullptr)
    launch.nontemporal_outputs->fetch_add(static_cast<std::uint64_t>(std::popcount(mask)), std::memory_order_relaxed);
  return {};
}

}  // namespace kiln::cpu::fast

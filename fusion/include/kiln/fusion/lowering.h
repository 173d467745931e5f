// The lowering vocabulary every backend shares: the instruction code an instruction of a fused
// program becomes (one per elementwise computation, whatever the op kind's variant), and the
// checks that its operands have the kinds, counts and dtypes that code needs. The CPU compile
// step (and the JIT, which consumes its compiled form) and the CUDA code generator lower through
// these and only emit; a new backend starts from them.
//
//   Lowered l;
//   if (std::string why = lower_instruction(program, block, ins, l); !why.empty()) fall_back(why);
//   switch (l.code) { case Code::Add: ...; }   // l.operands: registers, indexed inputs, scalars
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/fusion/fused_program.h"
#include "kiln/ir/op_table.h"

namespace kiln::fusion::lowering {

// clang-format off
enum class Code : std::uint8_t {
  // binary arithmetic (tensor-tensor, or tensor-scalar with a scalar slot)
  Add, Sub, Mul, Div, Rem, Pow, BitAnd, BitOr, BitXor, Shl, Shr, LogicAnd, LogicOr, LogicXor, ClampMin, ClampMax,
  // comparisons (bool out)
  Eq, Ne, Gt, Ge, Lt, Le,
  // unary
  Abs, Neg, Sign, Exp, Log, Log1p, Erf, Sqrt, Cos, Sin, Tanh, Recip, Round, Floor, Ceil, Trunc, IsNan, IsInf, BitNot,
  Not,
  // others
  Cast, Clamp, MaskWhere, MaskFill, Copy, Fill,
  // indexed reads (positions computed per element)
  Gather, Select, Cat,
};
// clang-format on

std::optional<Code> code_of(ir::OpKind k);

// Binary arithmetic, comparisons (bool result), unary math: the three ranges of Code.
constexpr bool is_binary(Code c) { return c <= Code::ClampMax; }
constexpr bool is_comparison(Code c) { return c >= Code::Eq && c <= Code::Le; }
constexpr bool is_unary(Code c) { return c >= Code::Abs && c <= Code::Not; }
// Reads positions computed per element (Gather, Select, Cat).
constexpr bool is_indexed(Code c) { return c == Code::Gather || c == Code::Select || c == Code::Cat; }
// May fault at run time: an indexed read out of range, an integer division by zero.
bool may_fault(Code c, const ir::DType& compute);

// An instruction's operands by kind, in order: block registers, indexed program inputs, scalar
// slots.
struct Operands {
  std::vector<std::uint32_t> locals;
  std::vector<std::uint32_t> inputs;
  std::vector<std::uint32_t> scalars;
};

struct Lowered {
  Code code = Code::Copy;
  Operands operands;
};

// Lowers one instruction of `block` (a block of `program`): its code, and its operands checked
// (indices in range, kinds and counts as the code needs, every operand's and the result's dtype
// as the code needs). Returns the reason it cannot be lowered ("operands of Exp", ...), or an
// empty string, with `out` set.
std::string lower_instruction(const FusedProgram& program, const ProgramBlock& block, const Instruction& ins,
                              Lowered& out);

// Whether a backend's arithmetic covers `code` on the value class of `compute` as the IR defines
// it: floats for pow and the transcendental functions, integers for the bitwise ops, bool for
// the logical ones, anything but bool for arithmetic and clamps. (A backend with per-dtype
// kernels may check its own table instead: the CPU binds a kernel or falls back.)
bool dtype_supported(Code code, const ir::DType& compute);

}  // namespace kiln::fusion::lowering

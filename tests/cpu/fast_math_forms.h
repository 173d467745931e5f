// The vector forms of fast_math.h for one instruction set behind plain array functions, for
// fast_math_test.cc: each set lives in its own file (fast_math_avx512.cc, fast_math_avx2.cc),
// compiled with that set's flags when the compiler takes them (the test binary itself keeps the
// build's flags, so that no such code runs before the test has asked the CPU whether it has the
// set). fast_math.h puts each set's forms in an inline namespace of their own, so the files'
// same-named functions stay apart.
#pragma once

#include <cstddef>

namespace kiln::cpu::fastmath_test {

// in[0, n) -> out for n a multiple of the lanes: the restricted-domain form into `fast`, the
// general form into `general` (exp*_normal / exp*, log*_finite / log*, tanh*_normal / tanh*).
using Forms = void (*)(const float* in, float* fast, float* general, std::size_t n);

enum class Function { Exp, Log, Log1p, Tanh };

struct IsaForms {
  const char* name = "";
  bool compiled = false;     // false: the functions below do nothing
  bool (*runs)() = nullptr;  // whether this CPU has the instruction set
  Forms exp_forms = nullptr, log_forms = nullptr, tanh_forms = nullptr;
  // One JIT block of `lanes` (64 or 128) elements: exp_block_unchecked / log_block_unchecked /
  // tanh_block_unchecked<lanes> of the non-null inputs into the matching outputs, all folded
  // into one BlockCheck; returns its ok().
  bool (*checked_block)(int lanes, const float* exp_in, float* exp_out, const float* log_in, float* log_out,
                        const float* tanh_in, float* tanh_out) = nullptr;
  // The general block form of `fn` (exp_block, log_block, log1p_block, tanh_block<64>) over
  // in[0, n), n a multiple of 64.
  void (*general)(Function fn, const float* in, float* out, std::size_t n) = nullptr;
  // The scalar function (exp_f32, log_f32, log1p_f32, tanh_f32) as this file's target compiles
  // it (madd fuses there), element by element.
  void (*scalar)(Function fn, const float* in, float* out, std::size_t n) = nullptr;
};

IsaForms avx512_forms();
IsaForms avx2_forms();

}  // namespace kiln::cpu::fastmath_test

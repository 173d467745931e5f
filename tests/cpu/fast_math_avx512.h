// The AVX-512 forms of fast_math.h behind plain array functions, for fast_math_test.cc: they live
// in fast_math_avx512.cc, compiled with -mavx512f -mavx512dq when the compiler takes them (the
// test binary itself keeps the build's flags, so that no AVX-512 code runs before the test has
// asked the CPU whether it has AVX-512).
#pragma once

#include <cstddef>

namespace kiln::cpu::fastmath_test {

// Whether the functions below were compiled (false: they do nothing).
bool avx512_compiled();
// Whether this CPU runs them (AVX-512 F and DQ).
bool avx512_runs();

// For n a multiple of 16: fast[i] = the restricted-domain form of in[i], general[i] = the
// general form (exp16_normal / exp16, log16_finite / log16, tanh16_normal / tanh16).
void exp_forms(const float* in, float* fast, float* general, std::size_t n);
void log_forms(const float* in, float* fast, float* general, std::size_t n);
void tanh_forms(const float* in, float* fast, float* general, std::size_t n);

// One JIT block of `lanes` (64 or 128) elements: exp_block_unchecked / log_block_unchecked /
// tanh_block_unchecked<lanes> of the non-null inputs into the matching outputs, all folded into
// one BlockCheck; returns its ok().
bool checked_block(int lanes, const float* exp_in, float* exp_out, const float* log_in, float* log_out,
                   const float* tanh_in, float* tanh_out);

}  // namespace kiln::cpu::fastmath_test

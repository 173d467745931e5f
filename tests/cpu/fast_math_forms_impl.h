// The array functions of fast_math_forms.h for the instruction set a file was compiled for,
// written once against fast_math.h's set-independent names (exp_block, exp_block_unchecked, ...):
// included by fast_math_avx512.cc and fast_math_avx2.cc, each after defining
// KILN_FORMS_COMPILED when fast_math.h picked its set. Not a header of its own: each includer
// gets its own copy, in an anonymous namespace.
#pragma once

#include <cstddef>

#include "../../cpu/src/fast_math.h"
#include "fast_math_forms.h"

namespace kiln::cpu::fastmath_test {
namespace {

#if defined(KILN_FORMS_COMPILED)

constexpr int kBlock = 64;

// The restricted-domain form of one block (its BlockCheck ignored) and the general form.
template <void (*Restricted)(const float*, float*, fast::BlockCheck&), void (*General)(const float*, float*)>
void forms(const float* in, float* fast_out, float* general, std::size_t n) {
  for (std::size_t i = 0; i + kBlock <= n; i += kBlock) {
    fast::BlockCheck unused;
    Restricted(in + i, fast_out + i, unused);
    General(in + i, general + i);
  }
}

template <int N>
bool block(const float* ei, float* eo, const float* li, float* lo, const float* ti, float* to) {
  fast::BlockCheck c;
  if (ei != nullptr) fast::exp_block_unchecked<N>(ei, eo, c);
  if (li != nullptr) fast::log_block_unchecked<N>(li, lo, c);
  if (ti != nullptr) fast::tanh_block_unchecked<N>(ti, to, c);
  return c.ok();
}

bool checked_block(int lanes, const float* exp_in, float* exp_out, const float* log_in, float* log_out,
                   const float* tanh_in, float* tanh_out) {
  return lanes == 128 ? block<128>(exp_in, exp_out, log_in, log_out, tanh_in, tanh_out)
                      : block<64>(exp_in, exp_out, log_in, log_out, tanh_in, tanh_out);
}

void general(Function fn, const float* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i + kBlock <= n; i += kBlock) switch (fn) {
      case Function::Exp: fast::exp_block<kBlock>(in + i, out + i); break;
      case Function::Log: fast::log_block<kBlock>(in + i, out + i); break;
      case Function::Log1p: fast::log1p_block<kBlock>(in + i, out + i); break;
      case Function::Tanh: fast::tanh_block<kBlock>(in + i, out + i); break;
    }
}

// The oracle: the scalar function, element by element.
void scalar(Function fn, const float* in, float* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) switch (fn) {
      case Function::Exp: out[i] = fast::exp_f32(in[i]); break;
      case Function::Log: out[i] = fast::log_f32(in[i]); break;
      case Function::Log1p: out[i] = fast::log1p_f32(in[i]); break;
      case Function::Tanh: out[i] = fast::tanh_f32(in[i]); break;
    }
}

#endif

IsaForms isa_forms(const char* name, bool (*runs)()) {
  IsaForms f;
  f.name = name;
  f.runs = runs;
#if defined(KILN_FORMS_COMPILED)
  f.compiled = true;
  f.exp_forms = forms<&fast::exp_block_unchecked<kBlock>, &fast::exp_block<kBlock>>;
  f.log_forms = forms<&fast::log_block_unchecked<kBlock>, &fast::log_block<kBlock>>;
  f.tanh_forms = forms<&fast::tanh_block_unchecked<kBlock>, &fast::tanh_block<kBlock>>;
  f.checked_block = checked_block;
  f.general = general;
  f.scalar = scalar;
#endif
  return f;
}

}  // namespace
}  // namespace kiln::cpu::fastmath_test

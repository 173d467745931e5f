// See fast_math_avx512.h.
#include "fast_math_avx512.h"

#include "../../cpu/src/fast_math.h"

namespace kiln::cpu::fastmath_test {

bool avx512_runs() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)

bool avx512_compiled() { return true; }

void exp_forms(const float* in, float* fast_out, float* general, std::size_t n) {
  for (std::size_t i = 0; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    _mm512_storeu_ps(fast_out + i, fast::exp16_normal(x));
    _mm512_storeu_ps(general + i, fast::exp16(x));
  }
}

void log_forms(const float* in, float* fast_out, float* general, std::size_t n) {
  for (std::size_t i = 0; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    _mm512_storeu_ps(fast_out + i, fast::log16_finite(x));
    _mm512_storeu_ps(general + i, fast::log16(x));
  }
}

void tanh_forms(const float* in, float* fast_out, float* general, std::size_t n) {
  for (std::size_t i = 0; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(in + i);
    // a = |x|, as the JIT's tanh_block_unchecked computes it.
    _mm512_storeu_ps(fast_out + i, fast::tanh16_normal(x, _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x)));
    _mm512_storeu_ps(general + i, fast::tanh16(x));
  }
}

namespace {
template <int N>
bool block(const float* ei, float* eo, const float* li, float* lo, const float* ti, float* to) {
  fast::BlockCheck c;
  if (ei != nullptr) fast::exp_block_unchecked<N>(ei, eo, c);
  if (li != nullptr) fast::log_block_unchecked<N>(li, lo, c);
  if (ti != nullptr) fast::tanh_block_unchecked<N>(ti, to, c);
  return c.ok();
}
}  // namespace

bool checked_block(int lanes, const float* exp_in, float* exp_out, const float* log_in, float* log_out,
                   const float* tanh_in, float* tanh_out) {
  return lanes == 128 ? block<128>(exp_in, exp_out, log_in, log_out, tanh_in, tanh_out)
                      : block<64>(exp_in, exp_out, log_in, log_out, tanh_in, tanh_out);
}

#else

bool avx512_compiled() { return false; }
void exp_forms(const float*, float*, float*, std::size_t) {}
void log_forms(const float*, float*, float*, std::size_t) {}
void tanh_forms(const float*, float*, float*, std::size_t) {}
bool checked_block(int, const float*, float*, const float*, float*, const float*, float*) { return false; }

#endif

}  // namespace kiln::cpu::fastmath_test

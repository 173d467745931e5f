// The AVX2 forms for fast_math_test.cc (see fast_math_forms.h), compiled with -mavx2 -mfma
// -mno-avx512f when the compiler takes them (also on an AVX-512 host).
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define KILN_FORMS_COMPILED 1
#endif
#include "fast_math_forms_impl.h"

namespace kiln::cpu::fastmath_test {

IsaForms avx2_forms() {
  return isa_forms("AVX2", [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  });
}

}  // namespace kiln::cpu::fastmath_test

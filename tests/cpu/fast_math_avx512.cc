// The AVX-512 forms for fast_math_test.cc (see fast_math_forms.h), compiled with -mavx512f
// -mavx512dq when the compiler takes them.
#if defined(__AVX512F__) && defined(__AVX512DQ__)
#define KILN_FORMS_COMPILED 1
#endif
#include "fast_math_forms_impl.h"

namespace kiln::cpu::fastmath_test {

IsaForms avx512_forms() {
  return isa_forms("AVX-512", [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  });
}

}  // namespace kiln::cpu::fastmath_test

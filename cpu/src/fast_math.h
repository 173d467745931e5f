// Vectorisable float32 approximations of exp, log, log1p and tanh for the fast CPU executor, and
// the float <-> f16 / bf16 bit conversions its loads and stores use.
//
// Every function is branch-free straight-line code on one value (selects, not branches), so that
// GCC's loop vectoriser turns a plain `for (i) out[i] = exp_f32(in[i])` into AVX2 / AVX-512 code
// at -O3 -march=native: no per-element call into libm. Only with -fno-trapping-math (the cpu
// module and the JIT's kernels are compiled with it): otherwise GCC keeps the selects as branches
// where it has no masked vectors (AVX2, SSE) and the loop stays scalar. Measured accuracy against the correctly
// rounded result (every finite float32 input, exhaustively; docs/cpu-backend.md):
//
//   exp_f32    1.02 ulp  (Cody-Waite reduction, Cephes degree-6 minimax polynomial, two-step
//                         2^n scaling so that subnormal results round once)
//   log_f32    0.83 ulp  (Cephes logf: mantissa in [sqrt(1/2), sqrt(2)), degree-9 polynomial)
//   log1p_f32  1.44 ulp  (log(u) + (x - (u - 1)) / u with u = 1 + x)
//   tanh_f32   1.34 ulp  (odd minimax polynomial below 0.625, 1 - 2 / (exp(2|x|) + 1) above)
// (largest |fast - exact| / ulp(exact) over all finite inputs, exact = glibc's f64 result; a
// correctly rounded function would reach 0.5.)
//
// Special values follow IEEE / C99 Annex F exactly (the differential tests compare NaN and Inf
// positions): NaN in -> NaN out; exp(+inf) = +inf, exp(-inf) = +0, overflow -> +inf, underflow
// -> subnormal or +0; log(+-0) = -inf, log(x < 0) = NaN, log(+inf) = +inf, subnormal inputs
// exact; log1p(-1) = -inf, log1p(x < -1) = NaN; tanh(+-inf) = +-1, tanh(+-0) = +-0.
//
// Thread-safety: pure functions.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

namespace kiln::cpu::fast {

// Everything here lives in an inline namespace named after the target it was compiled for: the
// same names mean different code in translation units built for different targets (madd fuses
// only with FMA; the tests build one file per instruction set), and distinct mangled names keep
// the linker from merging them.
#if defined(__AVX512F__)
#define KILN_FAST_ISA isa_avx512
#elif defined(__AVX2__) && defined(__FMA__)
#define KILN_FAST_ISA isa_avx2
#elif defined(__FMA__)
#define KILN_FAST_ISA isa_fma
#else
#define KILN_FAST_ISA isa_generic
#endif
inline namespace KILN_FAST_ISA {

// a * b + c, fused where the target has FMA (one rounding); otherwise two roundings, which the
// error bounds above still cover (they were measured on the FMA build; the non-FMA build stays
// within one extra ulp).
inline float madd(float a, float b, float c) {
#ifdef __FMA__
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// exp(x) for float32.
inline float exp_f32(float x) {
  // Clamp into the range where the reduction below is exact. Written as max / min (vmaxps /
  // vminps): a NaN becomes -104 here, is carried harmlessly, and is restored at the end.
  float xc = x > -104.0f ? x : -104.0f;
  xc = xc < 89.0f ? xc : 89.0f;
  // n = round(x / ln 2) with the 1.5 * 2^23 trick (exact for |v| < 2^22).
  const float shifter = 12582912.0f;
  const float n = madd(xc, 1.44269504088896341f, shifter) - shifter;
  // r = x - n ln2, with ln2 split so that n * ln2_hi is exact (ln2_hi has 15 significant bits).
  float r = madd(n, -0.693145751953125f, xc);
  r = madd(n, -1.428606765330187045e-06f, r);
  // e^r on [-ln2/2, ln2/2]: 1 + r + r^2 P(r) (Cephes expf coefficients).
  float p = 1.9875691500e-4f;
  p = madd(p, r, 1.3981999507e-3f);
  p = madd(p, r, 8.3334519073e-3f);
  p = madd(p, r, 4.1665795894e-2f);
  p = madd(p, r, 1.6666665459e-1f);
  p = madd(p, r, 5.0000001201e-1f);
  p = madd(p, r * r, r) + 1.0f;
  // Scale by 2^n in two exact steps (n in [-150, 128]) so that a subnormal result rounds once
  // and 2^128 overflows to +inf exactly when the true result does.
  const std::int32_t ni = static_cast<std::int32_t>(n);
  const std::int32_t n1 = ni >> 1;
  const float s1 = std::bit_cast<float>(static_cast<std::int32_t>((n1 + 127) << 23));
  const float s2 = std::bit_cast<float>(static_cast<std::int32_t>((ni - n1 + 127) << 23));
  const float res = (p * s1) * s2;
  return x != x ? x : res;
}

// log(x) for float32. (Every select picks between values computed unconditionally: GCC does not
// if-convert a select whose arm would compute, so arithmetic inside an arm keeps the loop scalar.)
inline float log_f32(float x) {
  // Subnormal inputs: scale by 2^23 into the normal range first.
  const bool tiny = x < 1.17549435e-38f;
  const float scaled = x * 8388608.0f;
  const float xs = tiny ? scaled : x;
  const std::int32_t bits = std::bit_cast<std::int32_t>(xs);
  // xs = m * 2^e with m in [0.5, 1).
  // (int -> float through the 2^23 magic number: GCC treats a conversion instruction as possibly
  // trapping and would not vectorise the loop around it.)
  const float e0 = std::bit_cast<float>(static_cast<std::int32_t>(0x4B000000 | ((bits >> 23) & 0xff))) - 8388734.0f;
  const float e1 = e0 - 23.0f;
  float e = tiny ? e1 : e0;
  const float m = std::bit_cast<float>(static_cast<std::int32_t>((bits & 0x007fffff) | 0x3f000000));
  // Move m into [sqrt(1/2), sqrt(2)): f = m - 1 (or 2m - 1 with e - 1).
  const bool low = m < 0.707106781186547524f;
  const float em1 = e - 1.0f;
  e = low ? em1 : e;
  const float m2 = m + m;
  const float f = (low ? m2 : m) - 1.0f;
  const float z = f * f;
  float y = 7.0376836292e-2f;
  y = madd(y, f, -1.1514610310e-1f);
  y = madd(y, f, 1.1676998740e-1f);
  y = madd(y, f, -1.2420140846e-1f);
  y = madd(y, f, 1.4249322787e-1f);
  y = madd(y, f, -1.6668057665e-1f);
  y = madd(y, f, 2.0000714765e-1f);
  y = madd(y, f, -2.4999993993e-1f);
  y = madd(y, f, 3.3333331174e-1f);
  y = y * f * z;
  y = madd(e, -2.12194440e-4f, y);
  y = madd(z, -0.5f, y);
  float res = f + y;
  res = madd(e, 0.693359375f, res);
  // Special values.
  res = x == 0.0f ? -INFINITY : res;
  res = x < 0.0f ? NAN : res;
  res = x == INFINITY ? INFINITY : res;
  return x != x ? x : res;
}

// log(1 + x) for float32: log(u) plus the rounding error of u = 1 + x (exact: x - (u - 1)),
// divided by u (the first-order correction, as in fdlibm's log1p).
inline float log1p_f32(float x) {
  const float u = 1.0f + x;
  const float d = u - 1.0f;
  const float q = (x - d) / u;
  const float c = u != 0.0f ? q : 0.0f;  // x = -1: log(0) = -inf, no 0 / 0
  const float l = log_f32(u) + c;
  // u == 1: x is below half an ulp of 1 and log1p(x) rounds to x.
  float res = d == 0.0f ? x : l;
  res = x == INFINITY ? INFINITY : res;
  return x != x ? x : res;
}

// tanh(x) for float32.
inline float tanh_f32(float x) {
  const float a = std::fabs(x);
  // Small |x|: x + x^3 P(x^2) (Cephes tanhf).
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = madd(p, z, 2.06390887954e-2f);
  p = madd(p, z, -5.37397155531e-2f);
  p = madd(p, z, 1.33314422036e-1f);
  p = madd(p, z, -3.33332819422e-1f);
  float small = madd(p * z, x, x);
  small = x == 0.0f ? x : small;  // keeps the sign of a zero
  // Large |x|: 1 - 2 / (e^{2|x|} + 1), with the sign of x; exp overflows to inf -> exactly 1.
  const float big = 1.0f - 2.0f / (exp_f32(a + a) + 1.0f);
  const float signed_big = std::copysign(big, x);
  return a < 0.625f ? small : signed_big;  // NaN: the comparison is false, big is NaN
}

// Each instruction set below defines kVectorLanes, the general block forms exp_block /
// log_block / log1p_block / tanh_block<N>(in, out), and, with KILN_FAST_CHECKED_BLOCKS, the
// restricted-domain *_block_unchecked forms with their BlockCheck.
#if defined(__AVX512F__)
inline constexpr int kVectorLanes = 16;

// ---- 16-lane AVX-512 versions of exp_f32, log_f32, log1p_f32 and tanh_f32, bit-identical to
// the functions above (exhaustively checked over every float32)
// (same reduction, same polynomial, same operation order; 2^n is applied by one vscalefps, which
// rounds once, exactly like the two exact-then-rounding steps above). GCC's auto-vectorised form
// of the scalar functions needs ~33 instructions per vector (the two-step scaling, the NaN
// blends); these need ~17, which matters where exp is on the critical path (W1, W2, softmax).
// Mask-merge intrinsics throughout: the plain ones pass _mm512_undefined_ps(), which trips GCC
// 12's -Wmaybe-uninitialized.

inline __m512 exp16(__m512 x) {
  const __mmask16 all = 0xFFFF;
  // max(lo, x) / min(hi, x) return x when it is NaN: NaN flows through and comes out NaN.
  __m512 xc = _mm512_mask_max_ps(x, all, _mm512_set1_ps(-104.0f), x);
  xc = _mm512_mask_min_ps(xc, all, _mm512_set1_ps(89.0f), xc);
  const __m512 shifter = _mm512_set1_ps(12582912.0f);
  const __m512 n = _mm512_sub_ps(_mm512_fmadd_ps(xc, _mm512_set1_ps(1.44269504088896341f), shifter), shifter);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), xc);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_mask_scalef_ps(p, all, p, n);
}

// log_f32 on 16 lanes: the exponent and mantissa from vgetexpps / vgetmantps (subnormals
// included, without the 2^23 prescale), then the same polynomial in the same order.
inline __m512 log16(__m512 x) {
  const __mmask16 all = 0xFFFF;
  // x = m * 2^e with m in [0.5, 1): getmant normalises to [0.5, 1), getexp gives floor(log2 x)
  // (the exponent for a mantissa in [1, 2)), so e = getexp + 1.
  const __m512 m = _mm512_mask_getmant_ps(x, all, x, _MM_MANT_NORM_p5_1, _MM_MANT_SIGN_src);
  __m512 e = _mm512_add_ps(_mm512_mask_getexp_ps(x, all, x), _mm512_set1_ps(1.0f));
  const __mmask16 low = _mm512_cmp_ps_mask(m, _mm512_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  e = _mm512_mask_sub_ps(e, low, e, _mm512_set1_ps(1.0f));
  const __m512 f = _mm512_sub_ps(_mm512_mask_add_ps(m, low, m, m), _mm512_set1_ps(1.0f));
  const __m512 z = _mm512_mul_ps(f, f);
  __m512 y = _mm512_set1_ps(7.0376836292e-2f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.1514610310e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.1676998740e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.2420140846e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.4249322787e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.6668057665e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.0000714765e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-2.4999993993e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(3.3333331174e-1f));
  y = _mm512_mul_ps(_mm512_mul_ps(y, f), z);
  y = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), y);
  y = _mm512_fmadd_ps(z, _mm512_set1_ps(-0.5f), y);
  __m512 res = _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), _mm512_add_ps(f, y));
  // Special values: 0 -> -inf, x < 0 -> NaN, +inf -> +inf, NaN -> NaN.
  const __m512 zero = _mm512_setzero_ps();
  res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, zero, _CMP_EQ_OQ), _mm512_set1_ps(-INFINITY));
  res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), _mm512_set1_ps(NAN));
  res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ), x);
  return _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

// log1p_f32 on 16 lanes (the same operations, with log16).
inline __m512 log1p16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 u = _mm512_add_ps(one, x);
  const __m512 d = _mm512_sub_ps(u, one);
  const __m512 zero = _mm512_setzero_ps();
  // c = (x - d) / u, or 0 where u == 0 (x = -1: log(0) = -inf, no 0 / 0).
  const __m512 q = _mm512_div_ps(_mm512_sub_ps(x, d), u);
  const __m512 c = _mm512_mask_mov_ps(q, _mm512_cmp_ps_mask(u, zero, _CMP_EQ_OQ), zero);
  __m512 res = _mm512_add_ps(log16(u), c);
  res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(d, zero, _CMP_EQ_OQ), x);
  res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, _mm512_set1_ps(INFINITY), _CMP_EQ_OQ), x);
  return _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

inline __m512 tanh16(__m512 x) {
  const __mmask16 all = 0xFFFF;
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512 a = _mm512_andnot_ps(sign, x);
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x);
  small = _mm512_mask_mov_ps(small, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_EQ_OQ), x);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp16(_mm512_add_ps(a, a));
  const __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  const __m512 signed_big = _mm512_or_ps(big, _mm512_and_ps(x, sign));
  const __mmask16 is_small = _mm512_mask_cmp_ps_mask(all, a, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(signed_big, is_small, small);
}

// ---- Restricted-domain forms for blocks of lanes (the JIT's blocks): the same values, bit for
// bit, as exp16 / log16 / tanh16 on their domain, without the work that only the rest of the
// domain needs (clamps, vscalefps, special-value fixups). A JIT block runs them on every lane,
// folding its inputs into a BlockCheck with integer max operations (off the FMA pipes these
// chains saturate), and checks once, at the end of the block, before storing anything: when a
// lane was outside a domain, the block is recomputed from its inputs with the general forms.
// (Compared exhaustively with the general forms over every float of each domain.)

// exp16 for |x| < 86 (no NaN): the clamps are identities, n = round(x / ln 2) is in [-124, 124]
// and p in [0.70, 1.42], so p * 2^n is a normal number and the scaling is exact: vscalefps's
// result is the exponent add bits(p) + (n << 23). n << 23 comes straight from the shifted sum
// t = x / ln 2 + 1.5 * 2^23, whose low mantissa bits hold n (the offset's bits shift out).
inline __m512 exp16_normal(__m512 x) {
  const __m512 shifter = _mm512_set1_ps(12582912.0f);
  const __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shifter);
  const __m512 n = _mm512_sub_ps(t, shifter);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693145751953125f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(-1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i ti = _mm512_castps_si512(t);
  return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), _mm512_mask_slli_epi32(ti, 0xFFFF, ti, 23)));
}

// log16 for 0 < x < +inf (subnormals included): none of the special-value fixups applies.
inline __m512 log16_finite(__m512 x) {
  const __mmask16 all = 0xFFFF;
  const __m512 m = _mm512_mask_getmant_ps(x, all, x, _MM_MANT_NORM_p5_1, _MM_MANT_SIGN_src);
  __m512 e = _mm512_add_ps(_mm512_mask_getexp_ps(x, all, x), _mm512_set1_ps(1.0f));
  const __mmask16 low = _mm512_cmp_ps_mask(m, _mm512_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  e = _mm512_mask_sub_ps(e, low, e, _mm512_set1_ps(1.0f));
  const __m512 f = _mm512_sub_ps(_mm512_mask_add_ps(m, low, m, m), _mm512_set1_ps(1.0f));
  const __m512 z = _mm512_mul_ps(f, f);
  __m512 y = _mm512_set1_ps(7.0376836292e-2f);
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.1514610310e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.1676998740e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.2420140846e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.4249322787e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-1.6668057665e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(2.0000714765e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(-2.4999993993e-1f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(3.3333331174e-1f));
  y = _mm512_mul_ps(_mm512_mul_ps(y, f), z);
  y = _mm512_fmadd_ps(e, _mm512_set1_ps(-2.12194440e-4f), y);
  y = _mm512_fmadd_ps(z, _mm512_set1_ps(-0.5f), y);
  return _mm512_fmadd_ps(e, _mm512_set1_ps(0.693359375f), _mm512_add_ps(f, y));
}

// tanh16 for |x| < 43 (no NaN; exp16_normal's domain for 2|x|), given a = |x|. The sign of a
// zero result is restored with an OR of x's sign instead of a compare (compares run on the FMA
// pipes): on the lanes that keep the polynomial (|x| < 0.625) x + x^3 P(x^2) has the sign of x,
// and for x = -0 it is +0, which the OR turns into -0 as tanh16's fixup does.
inline __m512 tanh16_normal(__m512 x, __m512 a) {
  const __m512 xs = _mm512_and_ps(x, _mm512_set1_ps(-0.0f));
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(-5.70498872745e-3f);
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(2.06390887954e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-5.37397155531e-2f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(1.33314422036e-1f));
  p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(-3.33332819422e-1f));
  const __m512 small = _mm512_or_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, z), x, x), xs);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 e = exp16_normal(_mm512_add_ps(a, a));
  const __m512 big = _mm512_sub_ps(one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  const __m512 signed_big = _mm512_or_ps(big, xs);
  const __mmask16 is_small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.625f), _CMP_LT_OQ);
  return _mm512_mask_mov_ps(signed_big, is_small, small);
}

// What a block's restricted-domain forms were given (lane-wise unsigned maxima of the inputs'
// bits), checked once at its end.
struct BlockCheck {
  __m512i exp_abs = _mm512_setzero_si512();   // |x| bits of exp inputs: must stay below 86
  __m512i tanh_abs = _mm512_setzero_si512();  // |x| bits of tanh inputs: below 43
  __m512i log_m1 = _mm512_setzero_si512();    // bits - 1 of log inputs: below 0x7f7fffff (0 < x < inf)
  bool ok() const {
    return (_mm512_cmp_epu32_mask(exp_abs, _mm512_set1_epi32(0x42AC0000), _MM_CMPINT_LT) &
            _mm512_cmp_epu32_mask(tanh_abs, _mm512_set1_epi32(0x422C0000), _MM_CMPINT_LT) &
            _mm512_cmp_epu32_mask(log_m1, _mm512_set1_epi32(0x7f7fffff), _MM_CMPINT_LT)) == 0xFFFF;
  }
};

// out[0, N) = exp16 / log16 / tanh16 of in[0, N) when c.ok() at the end of the block (out may be in).
template <int N>
inline void exp_block_unchecked(const float* in, float* out, BlockCheck& c) {
  static_assert(N % 16 == 0);
  for (int v = 0; v < N; v += 16) {
    const __m512 x = _mm512_loadu_ps(in + v);
    c.exp_abs = _mm512_mask_max_epu32(c.exp_abs, 0xFFFF, c.exp_abs,
                                      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fffffff)));
    _mm512_storeu_ps(out + v, exp16_normal(x));
  }
}

template <int N>
inline void log_block_unchecked(const float* in, float* out, BlockCheck& c) {
  static_assert(N % 16 == 0);
  for (int v = 0; v < N; v += 16) {
    const __m512 x = _mm512_loadu_ps(in + v);
    c.log_m1 = _mm512_mask_max_epu32(c.log_m1, 0xFFFF, c.log_m1,
                                     _mm512_sub_epi32(_mm512_castps_si512(x), _mm512_set1_epi32(1)));
    _mm512_storeu_ps(out + v, log16_finite(x));
  }
}

template <int N>
inline void tanh_block_unchecked(const float* in, float* out, BlockCheck& c) {
  static_assert(N % 16 == 0);
  for (int v = 0; v < N; v += 16) {
    const __m512 x = _mm512_loadu_ps(in + v);
    const __m512 a = _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x);
    c.tanh_abs = _mm512_mask_max_epu32(c.tanh_abs, 0xFFFF, c.tanh_abs, _mm512_castps_si512(a));
    _mm512_storeu_ps(out + v, tanh16_normal(x, a));
  }
}

// The general forms over a block of N lanes (N a multiple of 16; out may be in).
#define KILN_FAST_GENERAL_BLOCK(name, vec)                                                   \
  template <int N>                                                                           \
  inline void name(const float* in, float* out) {                                            \
    static_assert(N % 16 == 0);                                                              \
    for (int v = 0; v < N; v += 16) _mm512_storeu_ps(out + v, vec(_mm512_loadu_ps(in + v))); \
  }
KILN_FAST_GENERAL_BLOCK(exp_block, exp16)
KILN_FAST_GENERAL_BLOCK(log_block, log16)
KILN_FAST_GENERAL_BLOCK(log1p_block, log1p16)
KILN_FAST_GENERAL_BLOCK(tanh_block, tanh16)
#undef KILN_FAST_GENERAL_BLOCK

#define KILN_FAST_CHECKED_BLOCKS 1
#elif defined(__AVX2__) && defined(__FMA__)
// ---- 8-lane AVX2 versions, for hosts without AVX-512: the same functions, bit for bit, as the
// scalar ones above (same operations in the same order; every select a blend on the same
// comparison; checked over every float32, where only log1p(-inf)'s NaN came out with the other
// sign), and restricted-domain forms and a BlockCheck like the AVX-512 ones above. AVX2 has no vscalefps / vgetexpps /
// vgetmantps: exp scales by 2^n in the scalar function's two exact steps, log takes the exponent and mantissa from the
// bits. GCC's auto-vectorised scalar exp needs ~33 instructions per vector; exp8 ~27, exp8_normal ~17.
inline constexpr int kVectorLanes = 8;

inline __m256 select8(__m256 mask, __m256 if_true, __m256 if_false) {
  return _mm256_blendv_ps(if_false, if_true, mask);
}

// 2^n * p for p in [0.70, 1.42] and n in [-150, 128], in the scalar function's two steps.
inline __m256 scale_by_two_steps8(__m256 p, __m256i n) {
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256i n1 = _mm256_srai_epi32(n, 1);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(n, n1), bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// e^r on [-ln2/2, ln2/2] and the reduction x = n ln2 + r, shared by exp8 and exp8_normal.
inline __m256 exp8_poly(__m256 n, __m256 x) {
  __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693145751953125f), x);
  r = _mm256_fmadd_ps(n, _mm256_set1_ps(-1.428606765330187045e-06f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  return _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
}

inline __m256 exp8(__m256 x) {
  // vmaxps / vminps return the second operand for a NaN: x > lo ? x : lo, as exp_f32.
  __m256 xc = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
  xc = _mm256_min_ps(xc, _mm256_set1_ps(89.0f));
  const __m256 shifter = _mm256_set1_ps(12582912.0f);
  const __m256 t = _mm256_fmadd_ps(xc, _mm256_set1_ps(1.44269504088896341f), shifter);
  const __m256 n = _mm256_sub_ps(t, shifter);
  // t is an integer in [2^23, 2^24): its bits minus the shifter's are n.
  const __m256i ni = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_castps_si256(shifter));
  const __m256 res = scale_by_two_steps8(exp8_poly(n, xc), ni);
  return select8(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), x, res);
}

// log_f32's steps up to its special values, for log8 and log8_finite.
inline __m256 log8_core(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
  const __m256 xs = select8(tiny, _mm256_mul_ps(x, _mm256_set1_ps(8388608.0f)), x);
  const __m256i bits = _mm256_castps_si256(xs);
  const __m256i biased = _mm256_and_si256(_mm256_srli_epi32(bits, 23), _mm256_set1_epi32(0xff));
  const __m256 e0 = _mm256_sub_ps(_mm256_castsi256_ps(_mm256_or_si256(biased, _mm256_set1_epi32(0x4B000000))),
                                  _mm256_set1_ps(8388734.0f));
  __m256 e = select8(tiny, _mm256_sub_ps(e0, _mm256_set1_ps(23.0f)), e0);
  const __m256 m = _mm256_castsi256_ps(
      _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(0x007fffff)), _mm256_set1_epi32(0x3f000000)));
  const __m256 low = _mm256_cmp_ps(m, _mm256_set1_ps(0.707106781186547524f), _CMP_LT_OQ);
  e = select8(low, _mm256_sub_ps(e, _mm256_set1_ps(1.0f)), e);
  const __m256 f = _mm256_sub_ps(select8(low, _mm256_add_ps(m, m), m), _mm256_set1_ps(1.0f));
  const __m256 z = _mm256_mul_ps(f, f);
  __m256 y = _mm256_set1_ps(7.0376836292e-2f);
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.1514610310e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.1676998740e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.2420140846e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(1.4249322787e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-1.6668057665e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(2.0000714765e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(-2.4999993993e-1f));
  y = _mm256_fmadd_ps(y, f, _mm256_set1_ps(3.3333331174e-1f));
  y = _mm256_mul_ps(_mm256_mul_ps(y, f), z);
  y = _mm256_fmadd_ps(e, _mm256_set1_ps(-2.12194440e-4f), y);
  y = _mm256_fmadd_ps(z, _mm256_set1_ps(-0.5f), y);
  return _mm256_fmadd_ps(e, _mm256_set1_ps(0.693359375f), _mm256_add_ps(f, y));
}

inline __m256 log8(__m256 x) {
  __m256 res = log8_core(x);
  const __m256 zero = _mm256_setzero_ps();
  const __m256 inf = _mm256_set1_ps(INFINITY);
  res = select8(_mm256_cmp_ps(x, zero, _CMP_EQ_OQ), _mm256_set1_ps(-INFINITY), res);
  res = select8(_mm256_cmp_ps(x, zero, _CMP_LT_OQ), _mm256_set1_ps(NAN), res);
  res = select8(_mm256_cmp_ps(x, inf, _CMP_EQ_OQ), inf, res);
  return select8(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), x, res);
}

inline __m256 log1p8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 zero = _mm256_setzero_ps();
  const __m256 u = _mm256_add_ps(one, x);
  const __m256 d = _mm256_sub_ps(u, one);
  const __m256 q = _mm256_div_ps(_mm256_sub_ps(x, d), u);
  const __m256 c = select8(_mm256_cmp_ps(u, zero, _CMP_NEQ_UQ), q, zero);
  __m256 res = select8(_mm256_cmp_ps(d, zero, _CMP_EQ_OQ), x, _mm256_add_ps(log8(u), c));
  res = select8(_mm256_cmp_ps(x, _mm256_set1_ps(INFINITY), _CMP_EQ_OQ), _mm256_set1_ps(INFINITY), res);
  return select8(_mm256_cmp_ps(x, x, _CMP_UNORD_Q), x, res);
}

// x + x^3 P(x^2), tanh_f32's small-|x| branch before its zero fixup.
inline __m256 tanh8_small(__m256 x) {
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-5.70498872745e-3f);
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(2.06390887954e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-5.37397155531e-2f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(1.33314422036e-1f));
  p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(-3.33332819422e-1f));
  return _mm256_fmadd_ps(_mm256_mul_ps(p, z), x, x);
}

inline __m256 tanh8(__m256 x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256 a = _mm256_andnot_ps(sign, x);
  const __m256 small = select8(_mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_EQ_OQ), x, tanh8_small(x));
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 big =
      _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(exp8(_mm256_add_ps(a, a)), one)));
  const __m256 signed_big = _mm256_or_ps(_mm256_andnot_ps(sign, big), _mm256_and_ps(sign, x));
  return select8(_mm256_cmp_ps(a, _mm256_set1_ps(0.625f), _CMP_LT_OQ), small, signed_big);
}

// Restricted-domain forms (see the AVX-512 ones above for the argument): exp for |x| < 86, log
// for 0 < x < inf, tanh for |x| < 43 given a = |x|; bit for bit the general forms there.
inline __m256 exp8_normal(__m256 x) {
  const __m256 shifter = _mm256_set1_ps(12582912.0f);
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), shifter);
  const __m256 p = exp8_poly(_mm256_sub_ps(t, shifter), x);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(_mm256_castps_si256(t), 23)));
}

inline __m256 log8_finite(__m256 x) { return log8_core(x); }

inline __m256 tanh8_normal(__m256 x, __m256 a) {
  const __m256 xs = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
  const __m256 small = _mm256_or_ps(tanh8_small(x), xs);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 e = exp8_normal(_mm256_add_ps(a, a));
  const __m256 big = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
  return select8(_mm256_cmp_ps(a, _mm256_set1_ps(0.625f), _CMP_LT_OQ), small, _mm256_or_ps(big, xs));
}

// What a block's restricted-domain forms were given (lane-wise unsigned maxima of the inputs'
// bits), checked once at its end.
struct BlockCheck {
  __m256i exp_abs = _mm256_setzero_si256();   // |x| bits of exp inputs: must stay below 86
  __m256i tanh_abs = _mm256_setzero_si256();  // |x| bits of tanh inputs: below 43
  __m256i log_m1 = _mm256_setzero_si256();    // bits - 1 of log inputs: below 0x7f7fffff (0 < x < inf)
  static bool below(__m256i v, std::uint32_t limit) {
    const __m256i top = _mm256_set1_epi32(static_cast<std::int32_t>(limit - 1));
    return _mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_max_epu32(v, top), top)) == -1;
  }
  bool ok() const { return below(exp_abs, 0x42AC0000u) && below(tanh_abs, 0x422C0000u) && below(log_m1, 0x7f7fffffu); }
};

template <int N>
inline void exp_block_unchecked(const float* in, float* out, BlockCheck& c) {
  static_assert(N % 8 == 0);
  for (int v = 0; v < N; v += 8) {
    const __m256 x = _mm256_loadu_ps(in + v);
    c.exp_abs = _mm256_max_epu32(c.exp_abs, _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fffffff)));
    _mm256_storeu_ps(out + v, exp8_normal(x));
  }
}

template <int N>
inline void log_block_unchecked(const float* in, float* out, BlockCheck& c) {
  static_assert(N % 8 == 0);
  for (int v = 0; v < N; v += 8) {
    const __m256 x = _mm256_loadu_ps(in + v);
    c.log_m1 = _mm256_max_epu32(c.log_m1, _mm256_sub_epi32(_mm256_castps_si256(x), _mm256_set1_epi32(1)));
    _mm256_storeu_ps(out + v, log8_finite(x));
  }
}

template <int N>
inline void tanh_block_unchecked(const float* in, float* out, BlockCheck& c) {
  static_assert(N % 8 == 0);
  for (int v = 0; v < N; v += 8) {
    const __m256 x = _mm256_loadu_ps(in + v);
    const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
    c.tanh_abs = _mm256_max_epu32(c.tanh_abs, _mm256_castps_si256(a));
    _mm256_storeu_ps(out + v, tanh8_normal(x, a));
  }
}

// The general forms over a block of N lanes (N a multiple of 8; out may be in).
#define KILN_FAST_GENERAL_BLOCK(name, vec)                                                  \
  template <int N>                                                                          \
  inline void name(const float* in, float* out) {                                           \
    static_assert(N % 8 == 0);                                                              \
    for (int v = 0; v < N; v += 8) _mm256_storeu_ps(out + v, vec(_mm256_loadu_ps(in + v))); \
  }
KILN_FAST_GENERAL_BLOCK(exp_block, exp8)
KILN_FAST_GENERAL_BLOCK(log_block, log8)
KILN_FAST_GENERAL_BLOCK(log1p_block, log1p8)
KILN_FAST_GENERAL_BLOCK(tanh_block, tanh8)
#undef KILN_FAST_GENERAL_BLOCK

#define KILN_FAST_CHECKED_BLOCKS 1
#else
// ---- No vector forms: the general block functions run the scalar functions lane by lane
// (GCC vectorises those loops), and there is no checked pass.
inline constexpr int kVectorLanes = 1;

#define KILN_FAST_GENERAL_BLOCK(name, fn)           \
  template <int N>                                  \
  inline void name(const float* in, float* out) {   \
    for (int l = 0; l < N; ++l) out[l] = fn(in[l]); \
  }
KILN_FAST_GENERAL_BLOCK(exp_block, exp_f32)
KILN_FAST_GENERAL_BLOCK(log_block, log_f32)
KILN_FAST_GENERAL_BLOCK(log1p_block, log1p_f32)
KILN_FAST_GENERAL_BLOCK(tanh_block, tanh_f32)
#undef KILN_FAST_GENERAL_BLOCK
#endif

// ---- f16 / bf16 <-> f32 bit conversions, branch-free (vectorisable); exact widening and
// round-to-nearest-even narrowing, NaN stays a quiet NaN, overflow gives infinity.

inline float f16_bits_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t rest = h & 0x7fffu;
  // Normal and subnormal numbers: shift the exponent and mantissa into place and rescale by
  // 2^112 (the exponent bias difference), which also normalises subnormals exactly.
  const float scaled = std::bit_cast<float>(rest << 13) * 5.192296858534828e+33f;  // 2^112
  // Inf / NaN: exponent all ones.
  const std::uint32_t special = (rest << 13) | 0x7f800000u;
  const std::uint32_t mag = rest >= 0x7c00u ? special : std::bit_cast<std::uint32_t>(scaled);
  return std::bit_cast<float>(sign | mag);
}

inline std::uint16_t f32_to_f16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  // NaN: a quiet NaN with the sign (payload's top bits kept).
  const std::uint32_t nan = 0x7e00u | ((ax >> 13) & 0x3ffu);
  // Overflow: >= 65520 rounds to infinity.
  const std::uint32_t inf = 0x7c00u;
  // Normal range (f16 exponent >= 1, i.e. |f| >= 2^-14): round the mantissa to 10 bits, ties
  // to even; a carry into the exponent is correct rounding (up to infinity).
  const std::uint32_t rebias = ax - 0x38000000u;  // exponent - 112
  const std::uint32_t normal = (rebias + 0x0fffu + ((rebias >> 13) & 1u)) >> 13;
  // Subnormal range (|f| < 2^-14): add 0.5 (in float arithmetic, which rounds to nearest even at
  // the right bit because the f16 subnormal spacing 2^-24 is the float's ulp at 0.5).
  const float sub_f = std::bit_cast<float>(ax) + 0.5f;
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(sub_f) - 0x3f000000u;
  std::uint32_t mag = ax < 0x38800000u ? subnormal : normal;
  mag = ax >= 0x477ff000u ? inf : mag;
  mag = ax > 0x7f800000u ? nan : mag;
  return static_cast<std::uint16_t>(sign | mag);
}

inline float bf16_bits_to_f32(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t f32_to_bf16_bits(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;  // ties to even
  const std::uint32_t nan = (x >> 16) | 0x0040u;                         // quiet, sign kept
  const bool is_nan = (x & 0x7fffffffu) > 0x7f800000u;
  return static_cast<std::uint16_t>(is_nan ? nan : rounded);
}

}  // namespace KILN_FAST_ISA
}  // namespace kiln::cpu::fast

// The device prelude every generated translation unit starts with (codegen.h). Kept in its own
// file because it is CUDA C++, not host code: a raw string that NVRTC compiles.
#include "kiln/cuda/codegen.h"

namespace kiln::cuda {

// Data, not logic: one string of CUDA source (function_sizes_allow.txt lists it too).
std::string_view prelude() {  // NOLINT(readability-function-size)
  // The parameter structs must match launch_abi.h member for member (codegen_test checks the
  // spelled layouts; NVRTC and GCC lay out these integer-only structs identically).
  static constexpr std::string_view kPrelude = R"KILN(// kiln generated CUDA source
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define KILN_MAX_RANK 8
#define KILN_INF __int_as_float(0x7f800000)
#define KILN_DINF __longlong_as_double(0x7ff0000000000000LL)
struct KilnIter { long long numel; long long dims[KILN_MAX_RANK]; int rank; int contiguous; };
struct KilnAccess { long long strides[KILN_MAX_RANK]; int contiguous; int masked; };
struct KilnReduceShape { long long outer; long long n; long long inner; long long outputs; };
struct KilnMatmulShape { long long m; long long n; long long k; long long batch; long long batch_dims[KILN_MAX_RANK];
  long long lhs_batch[KILN_MAX_RANK]; long long rhs_batch[KILN_MAX_RANK]; int batch_rank; int pad; };
struct KilnIndexed { long long dims[KILN_MAX_RANK]; long long strides[KILN_MAX_RANK]; int rank; int pad; };
template <class T, int V> struct alignas(sizeof(T) * V) KilnVec { T v[V]; };
template <class T> struct KilnArg { T best; long long at; int has; };

// Position -> multi-index over the iteration space (dims beyond rank are 0). Fixed trip counts
// with a rank test keep idx[] in registers. R is the kernel's rank bound (KILN_R: the largest
// rank of the program's iteration spaces, a structural fact; the host refuses a launch whose
// rank exceeds it): the unrolled loops cost R steps, not KILN_MAX_RANK predicated ones, which
// was most of a broadcast kernel's instructions.
// 64-bit division is a ~40-instruction software routine on the GPU; below 2^32 positions the
// 32-bit hardware-assisted one is used (every launch of fewer than 4G elements).
template <int R>
__device__ __forceinline__ void kiln_unravel(long long pos, const KilnIter& it, long long* idx) {
  if (it.numel <= 0xffffffffLL) {
    unsigned int p = (unsigned int)pos;
#pragma unroll
    for (int d = R - 1; d >= 0; --d) {
      if (d < it.rank) { const unsigned int s = (unsigned int)it.dims[d]; idx[d] = p % s; p /= s; } else { idx[d] = 0; }
    }
  } else {
#pragma unroll
    for (int d = R - 1; d >= 0; --d) {
      if (d < it.rank) { const long long s = it.dims[d]; idx[d] = pos % s; pos /= s; } else { idx[d] = 0; }
    }
  }
#pragma unroll
  for (int d = R; d < KILN_MAX_RANK; ++d) idx[d] = 0;
}
template <int R>
__device__ __forceinline__ long long kiln_dot(const long long* idx, const KilnAccess& a, int rank) {
  long long off = 0;
#pragma unroll
  for (int d = 0; d < R; ++d) if (d < rank) off += idx[d] * a.strides[d];
  return off;
}
// A broadcast output is written once: by the position whose broadcast indices are all 0.
template <int R>
__device__ __forceinline__ bool kiln_first(const long long* idx, const KilnAccess& a, int rank) {
  bool w = true;
#pragma unroll
  for (int d = 0; d < R; ++d) if (d < rank && a.strides[d] == 0 && idx[d] != 0) w = false;
  return w;
}
#define KILN_OFF(acc, pos, idx, it) ((acc).contiguous ? (pos) : kiln_dot<KILN_R>((idx), (acc), (it).rank))

// Rounding to a narrower float dtype held in an f32 register.
__device__ __forceinline__ float kiln_f16(float v) { return __half2float(__float2half_rn(v)); }
__device__ __forceinline__ float kiln_bf16(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
__device__ __forceinline__ float kiln_f16d(double v) { return __half2float(__double2half(v)); }
__device__ __forceinline__ float kiln_bf16d(double v) { return __bfloat162float(__double2bfloat16(v)); }

// Wrapping integer arithmetic (two's complement; signed overflow is not UB this way).
__device__ __forceinline__ long long kiln_wadd(long long a, long long b) { return (long long)((unsigned long long)a + (unsigned long long)b); }
__device__ __forceinline__ long long kiln_wsub(long long a, long long b) { return (long long)((unsigned long long)a - (unsigned long long)b); }
__device__ __forceinline__ long long kiln_wmul(long long a, long long b) { return (long long)((unsigned long long)a * (unsigned long long)b); }
__device__ __forceinline__ unsigned long long kiln_wadd(unsigned long long a, unsigned long long b) { return a + b; }
__device__ __forceinline__ unsigned long long kiln_wsub(unsigned long long a, unsigned long long b) { return a - b; }
__device__ __forceinline__ unsigned long long kiln_wmul(unsigned long long a, unsigned long long b) { return a * b; }

// Integer division truncates, remainder is floored (sign of the divisor); a zero divisor faults.
__device__ __forceinline__ long long kiln_div(long long a, long long b, int* f) {
  if (b == 0) { *f = 1; return 0; }
  if (b == -1) return kiln_wsub(0LL, a);
  return a / b;
}
__device__ __forceinline__ long long kiln_rem(long long a, long long b, int* f) {
  if (b == 0) { *f = 1; return 0; }
  if (b == -1) return 0;
  long long r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
__device__ __forceinline__ unsigned long long kiln_div(unsigned long long a, unsigned long long b, int* f) {
  if (b == 0) { *f = 1; return 0; }
  return a / b;
}
__device__ __forceinline__ unsigned long long kiln_rem(unsigned long long a, unsigned long long b, int* f) {
  if (b == 0) { *f = 1; return 0; }
  return a % b;
}
__device__ __forceinline__ float kiln_frem(float a, float b) {
  float r = fmodf(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}
__device__ __forceinline__ double kiln_frem(double a, double b) {
  double r = fmod(a, b);
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// Shifts by the compute dtype's width `bits`: out-of-range (or negative) amounts give 0, or the
// sign fill for an arithmetic right shift.
__device__ __forceinline__ long long kiln_shl(long long a, long long b, int bits) {
  return ((unsigned long long)b >= (unsigned long long)bits || b < 0) ? 0LL : (long long)((unsigned long long)a << (b & 63));
}
__device__ __forceinline__ long long kiln_shr(long long a, long long b, int bits) {
  return ((unsigned long long)b >= (unsigned long long)bits || b < 0) ? (a < 0 ? -1LL : 0LL) : (a >> (b & 63));
}
__device__ __forceinline__ unsigned long long kiln_shl(unsigned long long a, unsigned long long b, int bits) {
  return b >= (unsigned long long)bits ? 0ULL : (a << (b & 63));
}
__device__ __forceinline__ unsigned long long kiln_shr(unsigned long long a, unsigned long long b, int bits) {
  return b >= (unsigned long long)bits ? 0ULL : (a >> (b & 63));
}

// Float -> integer: truncation toward zero, saturated to the target's range, NaN -> 0.
__device__ __forceinline__ long long kiln_f2i(double v, int bits) {
  if (v != v) return 0;
  const unsigned long long top = 1ULL << (bits - 1);
  const double hi = (double)top;
  if (v >= hi) return (long long)(top - 1);
  if (v <= -hi - 1.0) return -(long long)(top - 1) - 1;
  return (long long)v;
}
__device__ __forceinline__ unsigned long long kiln_f2u(double v, int bits) {
  if (v != v) return 0;
  const double hi = bits == 64 ? 18446744073709551616.0 : (double)(1ULL << bits);
  if (v >= hi) return bits == 64 ? ~0ULL : (1ULL << bits) - 1;
  if (v <= -1.0) return 0;
  return (unsigned long long)v;
}

template <class T> __device__ __forceinline__ T kiln_sign(T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : T(0)); }
__device__ __forceinline__ unsigned long long kiln_sign(unsigned long long x) { return x != 0 ? 1ULL : 0ULL; }
__device__ __forceinline__ long long kiln_abs(long long x) { return x < 0 ? kiln_wsub(0LL, x) : x; }
__device__ __forceinline__ unsigned long long kiln_abs(unsigned long long x) { return x; }
__device__ __forceinline__ float kiln_abs(float x) { return fabsf(x); }
__device__ __forceinline__ double kiln_abs(double x) { return fabs(x); }
__device__ __forceinline__ unsigned long long kiln_mag(long long x) { return x < 0 ? 0ULL - (unsigned long long)x : (unsigned long long)x; }
__device__ __forceinline__ unsigned long long kiln_mag(unsigned long long x) { return x; }
template <class T> __device__ __forceinline__ bool kiln_isnan(T x) { return x != x; }
__device__ __forceinline__ bool kiln_isnan(long long) { return false; }
__device__ __forceinline__ bool kiln_isnan(unsigned long long) { return false; }

// NaN-propagating max / min (PyTorch, the reference): a NaN, once taken, stays.
template <class T> __device__ __forceinline__ T kiln_max(T s, T v) { return ((v > s) | kiln_isnan(v)) ? v : s; }
template <class T> __device__ __forceinline__ T kiln_min(T s, T v) { return ((v < s) | kiln_isnan(v)) ? v : s; }
// Arg reductions: the first maximum (minimum) wins, the first NaN beats everything. Ties and
// NaNs are broken by index, so any combination order gives the sequential result.
template <bool Max, class T> __device__ __forceinline__ KilnArg<T> kiln_arg(KilnArg<T> a, KilnArg<T> b) {
  if (!a.has) return b;
  if (!b.has) return a;
  const bool an = kiln_isnan(a.best), bn = kiln_isnan(b.best);
  if (an || bn) {
    if (an && bn) return a.at < b.at ? a : b;
    return an ? a : b;
  }
  const bool better = Max ? (b.best > a.best) : (b.best < a.best);
  if (better || (b.best == a.best && b.at < a.at)) return b;
  return a;
}
// Warp shuffles of reduction accumulators (a KilnArg member by member).
template <class T> __device__ __forceinline__ T kiln_shfl_down(T v, int off) { return __shfl_down_sync(0xffffffffu, v, off); }
template <class T> __device__ __forceinline__ KilnArg<T> kiln_shfl_down(KilnArg<T> v, int off) {
  v.best = kiln_shfl_down(v.best, off);
  v.at = __shfl_down_sync(0xffffffffu, v.at, off);
  v.has = __shfl_down_sync(0xffffffffu, v.has, off);
  return v;
}
template <class T> __device__ __forceinline__ KilnArg<T> kiln_arg_of(T v, long long j) { KilnArg<T> r; r.best = v; r.at = j; r.has = 1; return r; }
template <class T> __device__ __forceinline__ KilnArg<T> kiln_arg_none() { KilnArg<T> r; r.best = T(0); r.at = 0; r.has = 0; return r; }
// Index reads of Gather / Select (any integer dtype; a negative index is out of range).
template <class T> __device__ __forceinline__ long long kiln_index(const T* p, long long i) { return (long long)p[i]; }
__device__ __forceinline__ long long kiln_index(const unsigned long long* p, long long i) {
  const unsigned long long v = p[i];
  return v > 0x7fffffffffffffffULL ? -1LL : (long long)v;
}
)KILN";
  return kPrelude;
}

}  // namespace kiln::cuda

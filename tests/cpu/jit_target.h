// Whether a JIT kernel and the interpreter of this build agree bit for bit.
//
// They do when both were compiled for the same target: the JIT always compiles with
// -march=native, so this build (whose flags the library shares) must have FMA too. fast_math.h's
// madd rounds once with FMA and twice without, so a build without -march=native (the dev and
// tsan presets) differs in the last bits of exp / log / tanh (1-2 ulp, amplified by a program's
// cancellations).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace kiln::cpu::testing {

#if defined(__FMA__)
inline constexpr bool kSameTargetAsTheJit = true;
#else
inline constexpr bool kSameTargetAsTheJit = false;
#endif

// A kernel's f32 result against the interpreter's: the same bits (any NaN for a NaN) in a build
// for the JIT's target; elsewhere the same NaN / infinity / zero, and finite values within
// `rel` of each other.
inline bool agrees_with_the_interpreter(float jit, float interpreter, double rel = 1e-5) {
  if (std::bit_cast<std::uint32_t>(jit) == std::bit_cast<std::uint32_t>(interpreter)) return true;
  if (std::isnan(jit) && std::isnan(interpreter)) return true;
  if (kSameTargetAsTheJit || !std::isfinite(jit) || !std::isfinite(interpreter) || jit == 0.0f || interpreter == 0.0f)
    return false;
  return std::fabs(static_cast<double>(jit) - static_cast<double>(interpreter)) <=
         rel * std::fabs(static_cast<double>(interpreter));
}

}  // namespace kiln::cpu::testing

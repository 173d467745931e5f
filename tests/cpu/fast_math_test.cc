// The vector forms of fast_math.h for each instruction set that has them (AVX-512: exp16 ...,
// AVX2: exp8 ...). The general forms against the scalar functions (exp_f32, log_f32, log1p_f32,
// tanh_f32), which they replace in the interpreter and the JIT: the same value for every 61st
// float bit pattern and every special value (NaN for NaN, whatever its payload). The JIT's
// restricted-domain forms (exp*_normal for |x| < 86, log*_finite for 0 < x < inf, tanh*_normal
// for |x| < 43) against the general forms, bit for bit, on their domains: millions of random
// inputs and every float near the domains' edges; and BlockCheck, the per-block range check that
// sends a block back to the general forms: false for a block with one lane outside a domain (NaN
// with any payload, infinities, the edges themselves, zero and negatives for log) at every lane
// position, true for blocks inside them.
//
// Each set's code is in its own file (fast_math_avx512.cc, fast_math_avx2.cc, compiled with the
// set's flags whatever the build's); a set's tests skip on a CPU without it.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "fast_math_forms.h"

namespace kiln::cpu {
namespace {

namespace fm = fastmath_test;

using Forms = void (*)(const float*, float*, float*, std::size_t);

std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

// The domains, on the bits (as BlockCheck tests them, but written independently: |x| < 86 and
// |x| < 43 with NaN outside, 0 < x < inf).
bool exp_domain(std::uint32_t b) { return (b & 0x7fffffffu) < bits_of(86.0f); }
bool tanh_domain(std::uint32_t b) { return (b & 0x7fffffffu) < bits_of(43.0f); }
bool log_domain(std::uint32_t b) { return b >= 1u && b <= bits_of(FLT_MAX); }

struct Fn {
  const char* name;
  Forms forms;
  bool (*domain)(std::uint32_t);
};

class FastMathDomains : public ::testing::TestWithParam<fm::IsaForms (*)()> {
 protected:
  void SetUp() override {
    isa_ = GetParam()();
    if (!isa_.compiled) GTEST_SKIP() << "the compiler did not build the " << isa_.name << " forms";
    if (!isa_.runs()) GTEST_SKIP() << "this CPU has no " << isa_.name << ": the executors never run these forms here";
  }
  std::vector<Fn> fns() const {
    return {{"exp", isa_.exp_forms, exp_domain},
            {"log", isa_.log_forms, log_domain},
            {"tanh", isa_.tanh_forms, tanh_domain}};
  }
  bool checked_block(int lanes, const float* ei, float* eo, const float* li, float* lo, const float* ti,
                     float* to) const {
    return isa_.checked_block(lanes, ei, eo, li, lo, ti, to);
  }
  fm::IsaForms isa_;
};

INSTANTIATE_TEST_SUITE_P(Isa, FastMathDomains, ::testing::Values(&fm::avx512_forms, &fm::avx2_forms),
                         [](const ::testing::TestParamInfo<fm::IsaForms (*)()>& param_info) {
                           return param_info.param == &fm::avx512_forms ? std::string("Avx512") : std::string("Avx2");
                         });

// The general forms give the scalar functions' values: every 61st bit pattern (both signs, every
// binade, NaNs and infinities among them) and the special values.
TEST_P(FastMathDomains, GeneralFormsMatchTheScalarFunctions) {
  std::vector<float> in;
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 61)
    in.push_back(from_bits(static_cast<std::uint32_t>(b)));
  for (std::uint32_t b : {0u,
                          0x80000000u,
                          0x7f800000u,
                          0xff800000u,
                          0x7fc00000u,
                          0xffc00000u,
                          0x7f800001u,
                          1u,
                          0x80000001u,
                          0x00800000u,
                          bits_of(1.0f),
                          bits_of(-1.0f),
                          bits_of(0.625f),
                          bits_of(-0.625f),
                          bits_of(86.0f),
                          bits_of(89.0f),
                          bits_of(-104.0f),
                          bits_of(88.72283f),
                          bits_of(-87.33655f),
                          bits_of(FLT_MAX),
                          bits_of(-FLT_MAX)})
    in.push_back(from_bits(b));
  while (in.size() % 64 != 0) in.push_back(1.0f);
  std::vector<float> got(in.size()), want(in.size());
  const std::pair<fm::Function, const char*> functions[] = {{fm::Function::Exp, "exp"},
                                                            {fm::Function::Log, "log"},
                                                            {fm::Function::Log1p, "log1p"},
                                                            {fm::Function::Tanh, "tanh"}};
  for (const auto& [fn, name] : functions) {
    isa_.general(fn, in.data(), got.data(), in.size());
    isa_.scalar(fn, in.data(), want.data(), in.size());
    std::size_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (bits_of(got[i]) == bits_of(want[i]) || (std::isnan(got[i]) && std::isnan(want[i]))) continue;
      if (++bad <= 5) {
        char line[160];
        std::snprintf(line, sizeof line, "  %s(0x%08x): vector 0x%08x, scalar 0x%08x\n", name, bits_of(in[i]),
                      bits_of(got[i]), bits_of(want[i]));
        first += line;
      }
    }
    EXPECT_EQ(bad, 0u) << isa_.name << " " << name << ", " << in.size() << " inputs\n" << first;
  }
}

// Both forms on every input (padded to 64 lanes); returns how many differ in any bit, and
// describes the first few.
std::size_t mismatches(const Fn& f, std::vector<float> in, std::string* first) {
  while (in.size() % 64 != 0) in.push_back(1.0f);
  std::vector<float> fast(in.size()), general(in.size());
  f.forms(in.data(), fast.data(), general.data(), in.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (bits_of(fast[i]) == bits_of(general[i])) continue;
    if (++bad <= 5) {
      char line[160];
      std::snprintf(line, sizeof line, "  %s(%a = 0x%08x): restricted 0x%08x, general 0x%08x\n", f.name,
                    static_cast<double>(in[i]), bits_of(in[i]), bits_of(fast[i]), bits_of(general[i]));
      *first += line;
    }
  }
  return bad;
}

// Random inputs of each domain: bit patterns uniform below the edge (log-uniform magnitudes over
// every binade, subnormals and zeros included), both signs where the domain has them, and
// values uniform over the domain's central range (where exp / tanh are not trivially 1, x, ...).
TEST_P(FastMathDomains, RestrictedFormsMatchTheGeneralFormsOnRandomInputs) {
  std::mt19937_64 rng(20240611);
  constexpr std::size_t kBits = 2'000'000, kLinear = 1'000'000;
  for (const Fn& f : fns()) {
    std::vector<float> in;
    in.reserve(kBits + kLinear);
    const bool is_log = f.domain == log_domain;
    const std::uint32_t hi = f.domain == exp_domain    ? bits_of(86.0f)
                             : f.domain == tanh_domain ? bits_of(43.0f)
                                                       : bits_of(FLT_MAX) + 1;
    std::uniform_int_distribution<std::uint32_t> mag(is_log ? 1u : 0u, hi - 1);
    for (std::size_t i = 0; i < kBits; ++i) {
      const std::uint32_t sign = !is_log && (rng() & 1) != 0 ? 0x80000000u : 0u;
      in.push_back(from_bits(mag(rng) | sign));
    }
    const float lim = f.domain == exp_domain ? 86.0f : f.domain == tanh_domain ? 43.0f : 4.0f;
    std::uniform_real_distribution<float> lin(is_log ? 0.0f : -lim, lim);
    while (in.size() < kBits + kLinear) {
      const float x = lin(rng);
      if (f.domain(bits_of(x))) in.push_back(x);
    }
    for (float x : in) ASSERT_TRUE(f.domain(bits_of(x))) << f.name << " generator left its domain: " << x;
    std::string first;
    EXPECT_EQ(mismatches(f, in, &first), 0u) << f.name << ", " << in.size() << " random inputs\n" << first;
  }
}

// Every float within kRadius bit patterns of each edge (86, 43, 0.625, 1, the smallest normal and
// subnormal, FLT_MAX, 0), both signs: the ones inside a function's domain give the same bits in
// both forms; each one outside makes BlockCheck fail (one bad lane in a block of good ones, at
// a lane that moves through the block).
TEST_P(FastMathDomains, EveryFloatNearTheDomainEdges) {
  constexpr std::uint32_t kRadius = 1u << 14;
  const std::uint32_t edges[] = {
      bits_of(86.0f), bits_of(43.0f), bits_of(0.625f), bits_of(1.0f), bits_of(FLT_MIN), 1u, bits_of(FLT_MAX), 0u};
  std::mt19937_64 rng(7);
  for (const Fn& f : fns()) {
    std::vector<float> inside;
    std::vector<std::uint32_t> outside;
    for (std::uint32_t e : edges)
      for (std::uint32_t sign : {0u, 0x80000000u})
        for (std::uint32_t b = e > kRadius ? e - kRadius : 0u; b <= e + kRadius; ++b) {
          if (f.domain(b | sign))
            inside.push_back(from_bits(b | sign));
          else
            outside.push_back(b | sign);
        }
    std::string first;
    EXPECT_EQ(mismatches(f, inside, &first), 0u) << f.name << ", " << inside.size() << " inputs near the edges\n"
                                                 << first;
    // A good block (1.5: inside every domain) with one lane replaced.
    constexpr int kLanes = 128;
    std::vector<float> blk(kLanes, 1.5f), out(kLanes);
    std::size_t passed = 0;
    std::uint32_t example = 0;
    for (std::size_t k = 0; k < outside.size(); ++k) {
      const int lane = static_cast<int>(k % kLanes);
      blk[static_cast<std::size_t>(lane)] = from_bits(outside[k]);
      const bool ok =
          f.domain == exp_domain   ? checked_block(kLanes, blk.data(), out.data(), nullptr, nullptr, nullptr, nullptr)
          : f.domain == log_domain ? checked_block(kLanes, nullptr, nullptr, blk.data(), out.data(), nullptr, nullptr)
                                   : checked_block(kLanes, nullptr, nullptr, nullptr, nullptr, blk.data(), out.data());
      if (ok && passed++ == 0) example = outside[k];
      blk[static_cast<std::size_t>(lane)] = 1.5f;
    }
    EXPECT_EQ(passed, 0u) << f.name << ": " << passed << " of " << outside.size()
                          << " out-of-domain inputs passed BlockCheck, e.g. bits 0x" << std::hex << example;
    EXPECT_GT(outside.size(), 0u);
    std::printf("[fast_math] %s: %zu floats near the edges inside the domain, %zu outside\n", f.name, inside.size(),
                outside.size());
  }
}

// BlockCheck on 64- and 128-lane blocks of the three kinds folded into one check (as a JIT block
// with exp, log and tanh does): true, with the general forms' bits in every output, for blocks
// inside the domains (random values and the largest / smallest values inside); false when one
// lane of one kind is outside, at every lane position, whatever the other kinds hold.
TEST_P(FastMathDomains, BlockCheckFailsForAnyOutOfDomainLane) {
  std::mt19937_64 rng(99);
  const std::uint32_t nans[] = {0x7fc00000u, 0x7fc00001u, 0x7f800001u, 0x7fa5a5a5u, 0x7fffffffu,
                                0xffc00000u, 0xff800001u, 0xffd23456u, 0xffffffffu};
  const float inf = from_bits(0x7f800000u);
  // Values outside each domain (NaNs added below).
  const std::vector<float> bad_exp = {inf,    -inf,    86.0f,   -86.0f,  std::nextafter(86.0f, 100.0f),
                                      88.7f,  89.0f,   104.0f,  -104.0f, 1e30f,
                                      -1e30f, FLT_MAX, -FLT_MAX};
  const std::vector<float> bad_tanh = {inf,   -inf,   43.0f,   -43.0f,  std::nextafter(43.0f, 50.0f), 50.0f, -85.9f,
                                       1e30f, -1e30f, FLT_MAX, -FLT_MAX};
  const std::vector<float> bad_log = {0.0f,     -0.0f,  inf,  -inf, -1.0f, -FLT_MIN, from_bits(0x80000001u),
                                      -FLT_MAX, -1e30f, -0.5f};
  for (int lanes : {64, 128}) {
    const auto n = static_cast<std::size_t>(lanes);
    std::vector<float> ei(n), li(n), ti(n), eo(n), lo(n), to(n), fast(n), want(n);
    auto fill = [&] {
      std::uniform_real_distribution<float> e(-85.99f, 85.99f), l(1e-30f, 1e30f), t(-42.99f, 42.99f);
      for (std::size_t k = 0; k < n; ++k) ei[k] = e(rng), li[k] = l(rng), ti[k] = t(rng);
      // The extremes inside the domains, at a few lanes.
      ei[3] = std::nextafter(86.0f, 0.0f), ei[n - 1] = -std::nextafter(86.0f, 0.0f), ei[7] = -0.0f,
      ei[8] = from_bits(1);
      ti[5] = std::nextafter(43.0f, 0.0f), ti[n - 2] = -std::nextafter(43.0f, 0.0f), ti[9] = -0.0f, ti[10] = 0.0f;
      ti[11] = from_bits(0x80000001u), ti[12] = 0.625f, ti[13] = -std::nextafter(0.625f, 0.0f);
      li[2] = from_bits(1), li[n - 3] = FLT_MAX, li[6] = FLT_MIN, li[14] = 1.0f;
    };
    auto run = [&] { return checked_block(lanes, ei.data(), eo.data(), li.data(), lo.data(), ti.data(), to.data()); };
    for (int round = 0; round < 4; ++round) {
      fill();
      ASSERT_TRUE(run()) << lanes << " lanes, in-domain block " << round;
      const std::pair<const std::vector<float>*, const std::vector<float>*> outs[] = {
          {&ei, &eo}, {&li, &lo}, {&ti, &to}};
      for (std::size_t k = 0; k < 3; ++k) {
        fns()[k].forms(outs[k].first->data(), fast.data(), want.data(), n);
        for (std::size_t v = 0; v < n; ++v)
          ASSERT_EQ(bits_of((*outs[k].second)[v]), bits_of(want[v]))
              << fns()[k].name << "_block_unchecked<" << lanes << "> lane " << v << " x=" << (*outs[k].first)[v];
      }
    }
    // A value between the tanh and exp edges is fine for exp, not for tanh.
    fill();
    ei[17] = 60.0f;
    EXPECT_TRUE(run());
    ti[17] = 60.0f;
    EXPECT_FALSE(run());
    // One bad lane of one kind, at every position.
    fill();
    struct Kind {
      const char* name;
      std::vector<float>* in;
      std::vector<float> bad;
    };
    Kind kinds[] = {{"exp", &ei, bad_exp}, {"log", &li, bad_log}, {"tanh", &ti, bad_tanh}};
    for (Kind& k : kinds) {
      for (std::uint32_t b : nans) k.bad.push_back(from_bits(b));
      for (float x : k.bad)
        for (std::size_t lane = 0; lane < n; ++lane) {
          const float keep = (*k.in)[lane];
          (*k.in)[lane] = x;
          const bool ok = run();
          (*k.in)[lane] = keep;
          ASSERT_FALSE(ok) << lanes << " lanes: " << k.name << " input 0x" << std::hex << bits_of(x) << std::dec
                           << " at lane " << lane << " passed the check";
        }
      ASSERT_TRUE(run()) << k.name;  // restored
    }
  }
}

}  // namespace
}  // namespace kiln::cpu

// Reference executor: Attention (docs/spec/ir.md §5.8, Burn's attention_fallback). By hand (the
// default scale, a given one, the mask convention, the bottom-right causal diagonal, softcap,
// fully masked rows and no keys); against attention by its definition for random inputs with every
// combination of mask, bias, softcap and causality; broadcast masks and biases; large scores;
// forced bad ops (presence bits, options, shapes).
#include <cmath>
#include <cstddef>
#include <optional>
#include <random>
#include <vector>

#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

std::vector<double> attend(Device& d, const TensorIr& q, const TensorIr& k, const TensorIr& v,
                           std::optional<TensorIr> mask = std::nullopt, std::optional<TensorIr> bias = std::nullopt,
                           const b::AttentionOptions& o = {}) {
  return d.f64_of(d.ok(b::attention(q, k, v, mask, bias, o, d.fresh())));
}

// Shapes of a case: [B, H, Lq, D], [B, H, Lk, D], [B, H, Lk, Dv].
struct Dims {
  std::size_t b, h, lq, lk, d, dv;
};

// Attention by its definition for full-shape mask and bias (empty: none): every score, then
// exp(s − max) / Σ over the unmasked keys, directly; a second implementation.
std::vector<double> by_definition(const Dims& n, const std::vector<double>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, const std::vector<bool>& mask,
                                  const std::vector<double>& bias, double scale, std::optional<double> softcap,
                                  bool causal) {
  std::vector<double> out(n.b * n.h * n.lq * n.dv, 0.0);
  for (std::size_t p = 0; p < n.b * n.h; ++p)
    for (std::size_t i = 0; i < n.lq; ++i) {
      std::vector<double> s(n.lk);
      std::vector<bool> keep(n.lk, true);
      for (std::size_t j = 0; j < n.lk; ++j) {
        double dot = 0;
        for (std::size_t e = 0; e < n.d; ++e) dot += q[(p * n.lq + i) * n.d + e] * k[(p * n.lk + j) * n.d + e];
        s[j] = softcap ? *softcap * std::tanh(dot * scale / *softcap) : dot * scale;
        const std::size_t at = (p * n.lq + i) * n.lk + j;
        if (!bias.empty()) s[j] += bias[at];
        if ((!mask.empty() && mask[at]) || (causal && j + n.lq > i + n.lk)) keep[j] = false;
      }
      double max = -kInf, sum = 0;
      for (std::size_t j = 0; j < n.lk; ++j)
        if (keep[j]) max = std::max(max, s[j]);
      for (std::size_t j = 0; j < n.lk; ++j) sum += keep[j] ? std::exp(s[j] - max) : 0.0;
      for (std::size_t j = 0; j < n.lk; ++j)
        for (std::size_t e = 0; e < n.dv && keep[j]; ++e)
          out[(p * n.lq + i) * n.dv + e] += std::exp(s[j] - max) / sum * v[(p * n.lk + j) * n.dv + e];
    }
  return out;
}

// ---- By hand

TEST(ReferenceAttentionTest, ByHand) {
  Device d;
  // Scores 0 and ln 3 (scale 1): weights ¼, ¾ of values 4 and 8.
  const TensorIr q = d.f64({1, 1, 1, 1}, dtypes::f64, {1});
  const TensorIr k = d.f64({1, 1, 2, 1}, dtypes::f64, {0, std::log(3.0)});
  const TensorIr v = d.f64({1, 1, 2, 1}, dtypes::f64, {4, 8});
  EXPECT_THAT(attend(d, q, k, v, std::nullopt, std::nullopt, {1.0, std::nullopt, false}),
              Near(std::vector<double>{7}, 1e-15));
  // The default scale is 1 / sqrt(D): D = 4, q·k = 2 ln 3 per key 1, so the scores are 0 and ln 3.
  const TensorIr q4 = d.f64({1, 1, 1, 4}, dtypes::f64, {1, 1, 1, 1});
  const double l = std::log(3.0) / 2;
  const TensorIr k4 = d.f64({1, 1, 2, 4}, dtypes::f64, {0, 0, 0, 0, l, l, l, l});
  EXPECT_THAT(attend(d, q4, k4, v), Near(std::vector<double>{7}, 1e-15));
  // Burn's mask: true masks the key out (PyTorch's SDPA keeps where true).
  EXPECT_THAT(attend(d, q, k, v, d.boolean({1, 1, 1, 2}, {false, true}), std::nullopt, {1.0, std::nullopt, false}),
              Near(std::vector<double>{4}, 1e-15));
  // Every key masked: 0, not NaN (Burn's clamped softmax); no keys at all: 0 as well.
  EXPECT_EQ(attend(d, q, k, v, d.boolean({1, 1, 1, 2}, {true, true})), (std::vector<double>{0}));
  EXPECT_EQ(attend(d, q, d.f64({1, 1, 0, 1}, dtypes::f64, {}), d.f64({1, 1, 0, 2}, dtypes::f64, {})),
            (std::vector<double>{0, 0}));
  // attn_bias adds to the scores: + ln 3 on key 0 makes them equal.
  EXPECT_THAT(attend(d, q, k, v, std::nullopt, d.f64({1, 1, 1, 2}, dtypes::f64, {std::log(3.0), 0}),
                     {1.0, std::nullopt, false}),
              Near(std::vector<double>{6}, 1e-15));
}

// Causal masking aligns the diagonal at the bottom right (Burn 0.22): with Lq = 2 and Lk = 3,
// query 0 sees keys 0 and 1, query 1 all three; equal scores average what is seen.
TEST(ReferenceAttentionTest, CausalDiagonalIsBottomRight) {
  Device d;
  const TensorIr q = d.f64({1, 1, 2, 1}, dtypes::f64, {0, 0});
  const TensorIr k = d.f64({1, 1, 3, 1}, dtypes::f64, {0, 0, 0});
  const TensorIr v = d.f64({1, 1, 3, 1}, dtypes::f64, {3, 6, 12});
  EXPECT_THAT(attend(d, q, k, v, std::nullopt, std::nullopt, {std::nullopt, std::nullopt, true}),
              Near(std::vector<double>{4.5, 7}, 1e-15));
  // Lq = Lk: the usual lower triangle.
  const TensorIr q3 = d.f64({1, 1, 3, 1}, dtypes::f64, {0, 0, 0});
  EXPECT_THAT(attend(d, q3, k, v, std::nullopt, std::nullopt, {std::nullopt, std::nullopt, true}),
              Near(std::vector<double>{3, 4.5, 7}, 1e-15));
  // More queries than keys: the first Lq − Lk rows see nothing and give 0.
  const TensorIr q4 = d.f64({1, 1, 4, 1}, dtypes::f64, {0, 0, 0, 0});
  const TensorIr k2 = d.f64({1, 1, 2, 1}, dtypes::f64, {0, 0});
  const TensorIr v2 = d.f64({1, 1, 2, 1}, dtypes::f64, {2, 4});
  EXPECT_THAT(attend(d, q4, k2, v2, std::nullopt, std::nullopt, {std::nullopt, std::nullopt, true}),
              Near(std::vector<double>{0, 0, 2, 3}, 1e-15));
}

// softcap · tanh(s / softcap) before the mask: scores 100 and 0 with softcap 1 become tanh(100)
// and 0; the scores are f64, so large ones lose nothing to the subtracted maximum.
TEST(ReferenceAttentionTest, SoftcapAndLargeScores) {
  Device d;
  const TensorIr q = d.f64({1, 1, 1, 1}, dtypes::f64, {1});
  const TensorIr k = d.f64({1, 1, 2, 1}, dtypes::f64, {100, 0});
  const TensorIr v = d.f64({1, 1, 2, 1}, dtypes::f64, {1, 0});
  const double w = std::exp(std::tanh(100.0)) / (std::exp(std::tanh(100.0)) + 1);
  EXPECT_THAT(attend(d, q, k, v, std::nullopt, std::nullopt, {1.0, 1.0, false}), Near(std::vector<double>{w}, 1e-15));
  const TensorIr big = d.f64({1, 1, 2, 1}, dtypes::f64, {1000, 999});
  const double e = std::exp(1.0);
  EXPECT_THAT(attend(d, q, big, v, std::nullopt, std::nullopt, {1.0, std::nullopt, false}),
              Near(std::vector<double>{e / (e + 1)}, 1e-15));
}

// Random [2, 3, 4, 5] queries against 6 keys of values of width 3, with and without each option.
TEST(ReferenceAttentionTest, AgainstTheDefinition) {
  const Dims n{2, 3, 4, 6, 5, 3};
  const std::vector<double> q = random_values(n.b * n.h * n.lq * n.d, 1), k = random_values(n.b * n.h * n.lk * n.d, 2),
                            v = random_values(n.b * n.h * n.lk * n.dv, 3),
                            bias = random_values(n.b * n.h * n.lq * n.lk, 4);
  std::vector<bool> mask(n.b * n.h * n.lq * n.lk);
  for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = i % 5 == 2;
  const Shape scores{n.b, n.h, n.lq, n.lk};
  for (int options = 0; options < 16; ++options) {
    const bool with_mask = options & 1, with_bias = options & 2, causal = options & 4;
    const std::optional<double> softcap = options & 8 ? std::optional<double>(0.7) : std::nullopt;
    Device d;
    const std::vector<double> got =
        attend(d, d.f64({n.b, n.h, n.lq, n.d}, dtypes::f64, q), d.f64({n.b, n.h, n.lk, n.d}, dtypes::f64, k),
               d.f64({n.b, n.h, n.lk, n.dv}, dtypes::f64, v),
               with_mask ? std::optional<TensorIr>(d.boolean(scores, mask)) : std::nullopt,
               with_bias ? std::optional<TensorIr>(d.f64(scores, dtypes::f64, bias)) : std::nullopt,
               {std::nullopt, softcap, causal});
    const std::vector<double> want =
        by_definition(n, q, k, v, with_mask ? mask : std::vector<bool>{}, with_bias ? bias : std::vector<double>{},
                      1 / std::sqrt(5.0), softcap, causal);
    EXPECT_THAT(got, Near(want, 1e-13)) << "options " << options;
  }
}

// A mask [1, 1, Lq, Lk] and a bias [1, H, 1, Lk] broadcast like their full-shape copies.
TEST(ReferenceAttentionTest, MaskAndBiasBroadcast) {
  const std::vector<double> q = random_values(2 * 2 * 3 * 4, 5), k = random_values(2 * 2 * 5 * 4, 6),
                            v = random_values(2 * 2 * 5 * 2, 7), bias = random_values(2 * 5, 8);
  const std::vector<bool> mask{false, true,  false, false, true,  false, false, true,
                               false, false, true,  false, false, false, false};
  std::vector<bool> full_mask;
  std::vector<double> full_bias;
  for (std::size_t p = 0; p < 4; ++p)
    for (std::size_t i = 0; i < 3; ++i)
      for (std::size_t j = 0; j < 5; ++j) {
        full_mask.push_back(mask[i * 5 + j]);
        full_bias.push_back(bias[(p % 2) * 5 + j]);
      }
  Device d;
  const TensorIr qt = d.f64({2, 2, 3, 4}, dtypes::f32, q), kt = d.f64({2, 2, 5, 4}, dtypes::f32, k),
                 vt = d.f64({2, 2, 5, 2}, dtypes::f32, v);
  const std::vector<double> small =
      attend(d, qt, kt, vt, d.boolean({1, 1, 3, 5}, mask), d.f64({1, 2, 1, 5}, dtypes::f32, bias));
  const std::vector<double> full =
      attend(d, qt, kt, vt, d.boolean({2, 2, 3, 5}, full_mask), d.f64({2, 2, 3, 5}, dtypes::f32, full_bias));
  EXPECT_EQ(small, full);
}

// ---- Forced bad ops (hand-made: every builder check is made again)

TEST(ReferenceAttentionTest, HandMadeOpsAreCheckedAgain) {
  Device d;
  const TensorIr q = d.f64({1, 1, 2, 3}, dtypes::f32, {1, 2, 3, 4, 5, 6});
  const TensorIr kv = d.f64({1, 1, 2, 3}, dtypes::f32, {1, 0, 1, 0, 1, 0});
  const TensorIr mask = d.boolean({1, 1, 2, 2}, {false, true, false, false});
  const Operation base = *b::attention(q, kv, kv, mask, std::nullopt, {0.5, 2.0, false}, d.fresh());
  auto expect_error = [&](Operation op, const char* what) {
    op.outputs()[0].id = d.fresh();
    const Status st = d.exec.execute(op, d.handles);
    ASSERT_FALSE(st.ok()) << op.to_string();
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
  };
  Operation bad = base;
  bad.attrs[0] |= 16;
  expect_error(bad, "unknown presence bits 29");
  bad = base;
  bad.attrs[0] |= ir::kPresentBias;  // announces a fifth input
  expect_error(bad, "4 inputs, the presence bits 15 announce 5");
  bad = base;
  bad.attrs[0] &= ~ir::kPresentScale;  // the scale's bits without its presence bit
  expect_error(bad, "attribute 2 holds a scale");
  bad = base;
  bad.attrs[3] = b::attention(q, kv, kv, std::nullopt, std::nullopt, {std::nullopt, 1.0, false}, d.fresh())->attrs[3] |
                 std::int64_t{1} << 63;  // −1
  expect_error(bad, "softcap must be finite and positive, got -1");
  bad = base;
  bad.attrs[1] = 2;
  expect_error(bad, "is_causal must be 0 or 1");
  bad = base;
  bad.outputs()[0].shape = {1, 1, 3, 3};
  expect_error(bad, "does not have the shape");
  bad = base;
  bad.tensors[3] = d.f64({1, 1, 2, 2}, dtypes::f32, {0, 1, 0, 0});
  expect_error(bad, "must have a bool dtype");
  bad = base;
  bad.tensors[3] = d.boolean({1, 1, 3, 2}, {false, false, false, false, false, false});
  expect_error(bad, "does not broadcast");
  bad = base;
  bad.tensors[1] = d.f64({1, 1, 2, 4}, dtypes::f32, {0, 0, 0, 0, 0, 0, 0, 0});
  expect_error(bad, "must be [B, H, Lq, D]");
}

}  // namespace
}  // namespace kiln::reference::testing

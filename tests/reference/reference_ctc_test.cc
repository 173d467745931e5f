// Reference executor: the CTC loss and its gradient (docs/spec/ir.md §5.8, Burn's ctc_loss). Losses
// by hand (one and two steps, empty targets, repeated labels that need a blank, infeasible
// alignments, empty inputs, a blank other than 0, padded targets, batches of mixed lengths);
// central differences in f64 showing CtcLossBackward is the gradient of CtcLoss through
// log_softmax (Burn's and PyTorch's convention) and, less exp(log_probs), with respect to
// log_probs themselves; zeros past each input length; NaN for an infeasible sample; forced bad ops.
#include <cmath>
#include <cstddef>
#include <random>
#include <vector>

#include "kiln/testing/status.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

// A CTC problem: log_probs [T, N, C] (values given per call), targets [N, S], lengths.
struct Problem {
  std::uint64_t steps, batch, classes, max_target;
  std::vector<std::int64_t> targets, input_lengths, target_lengths;
  std::uint64_t blank = 0;
};

struct Operands {
  TensorIr lp, targets, input_lengths, target_lengths;
};

Operands operands(Device& d, const Problem& p, const std::vector<double>& lp) {
  return {d.f64({p.steps, p.batch, p.classes}, dtypes::f64, lp), d.i64({p.batch, p.max_target}, dtypes::i64, p.targets),
          d.i64({p.batch}, dtypes::i32, p.input_lengths), d.i64({p.batch}, dtypes::i64, p.target_lengths)};
}

std::vector<double> losses(const Problem& p, const std::vector<double>& lp) {
  Device d;
  const Operands o = operands(d, p, lp);
  return d.f64_of(d.ok(b::ctc_loss(o.lp, o.targets, o.input_lengths, o.target_lengths, p.blank, d.fresh())));
}

std::vector<double> gradient(const Problem& p, const std::vector<double>& lp, const std::vector<double>& grad_loss) {
  Device d;
  const Operands o = operands(d, p, lp);
  const TensorIr g = d.f64({p.batch}, dtypes::f64, grad_loss);
  return d.f64_of(
      d.ok(b::ctc_loss_backward(o.lp, o.targets, o.input_lengths, o.target_lengths, g, p.blank, d.fresh())));
}

// Per-step probabilities [T][C] of one sample as log_probs [T, 1, C].
std::vector<double> logs(const std::vector<std::vector<double>>& probs) {
  std::vector<double> v;
  for (const auto& row : probs)
    for (double x : row) v.push_back(std::log(x));
  return v;
}

// log_softmax over the classes of [T, N, C] logits.
std::vector<double> log_softmax(const std::vector<double>& z, std::size_t classes) {
  std::vector<double> out(z.size());
  for (std::size_t r = 0; r < z.size(); r += classes) {
    double max = -kInf, sum = 0;
    for (std::size_t k = 0; k < classes; ++k) max = std::max(max, z[r + k]);
    for (std::size_t k = 0; k < classes; ++k) sum += std::exp(z[r + k] - max);
    for (std::size_t k = 0; k < classes; ++k) out[r + k] = z[r + k] - max - std::log(sum);
  }
  return out;
}

double weighted(const std::vector<double>& l, const std::vector<double>& g) {
  double s = 0;
  for (std::size_t i = 0; i < l.size(); ++i) s += l[i] * g[i];
  return s;
}

// ---- The loss by hand

TEST(ReferenceCtcLossTest, ByHand) {
  const std::vector<double> y{0.4, 0.6};  // p(blank), p(label 1) at every step
  // One step, target [1]: −ln 0.6 (Burn's test).
  EXPECT_THAT(losses({1, 1, 2, 1, {1}, {1}, {1}}, logs({y})), Near(std::vector<double>{-std::log(0.6)}, 1e-14));
  // Two steps, target [1]: paths 11, b1, 1b: 0.36 + 0.24 + 0.24.
  EXPECT_THAT(losses({2, 1, 2, 1, {1}, {2}, {1}}, logs({y, y})), Near(std::vector<double>{-std::log(0.84)}, 1e-14));
  // Empty target: blank at every step.
  EXPECT_THAT(losses({3, 1, 2, 1, {1}, {3}, {0}}, logs({y, y, y})),
              Near(std::vector<double>{-3 * std::log(0.4)}, 1e-14));
  // [1, 1] needs a blank between its labels: infeasible in 2 steps, one path (1 b 1) in 3.
  EXPECT_EQ(losses({2, 1, 2, 2, {1, 1}, {2}, {2}}, logs({y, y})), (std::vector<double>{kInf}));
  EXPECT_THAT(losses({3, 1, 2, 2, {1, 1}, {3}, {2}}, logs({y, y, y})),
              Near(std::vector<double>{-std::log(0.6 * 0.4 * 0.6)}, 1e-14));
  // [1, 2] in 2 steps: the one path 1 2.
  const std::vector<double> z{0.2, 0.3, 0.5};
  EXPECT_THAT(losses({2, 1, 3, 2, {1, 2}, {2}, {2}}, logs({z, z})),
              Near(std::vector<double>{-std::log(0.3 * 0.5)}, 1e-14));
  // An empty input: 0 for an empty target, +inf otherwise (PyTorch).
  EXPECT_EQ(losses({2, 2, 2, 1, {1, 1}, {0, 0}, {0, 1}}, logs({y, y, y, y})), (std::vector<double>{0, kInf}));
}

// Blank 2; targets padded with labels past the target length (never read); two samples with
// different input and target lengths, steps past an input length unused.
TEST(ReferenceCtcLossTest, BlankPaddingAndMixedLengths) {
  const std::vector<double> y{0.5, 0.2, 0.3};  // p(label 0), p(label 1), p(blank 2)
  // Sample 0: target [0] in 2 steps: 0 0, 0 b, b 0 = 0.25 + 0.15 + 0.15. Sample 1: [1, 0] in 3
  // steps of 4: 1 0 b, 1 b 0, b 1 0, 1 1 0, 1 0 0 → 0.2·0.5·0.3 + 0.2·0.3·0.5 + 0.3·0.2·0.5 +
  // 0.2·0.2·0.5 + 0.2·0.5·0.5.
  const Problem p{4, 2, 3, 3, {0, 2, 2, 1, 0, 7}, {2, 3}, {1, 2}, 2};
  std::vector<double> lp;
  for (int t = 0; t < 4; ++t)
    for (int n = 0; n < 2; ++n)
      for (double x : y) lp.push_back(std::log(x));
  const double p1 = 0.03 + 0.03 + 0.03 + 0.02 + 0.05;
  EXPECT_THAT(losses(p, lp), Near(std::vector<double>{-std::log(0.55), -std::log(p1)}, 1e-14));
}

// ---- The gradient

// A batch of two with padded targets and a shorter second input, random logits.
Problem gradient_problem() { return {5, 2, 4, 3, {1, 3, 2, 2, 2, 1}, {5, 4}, {3, 2}, 0}; }

// Burn's gradient is the gradient of Σ_n g_n · loss_n(log_softmax(z)) with respect to z.
TEST(ReferenceCtcLossBackwardTest, IsTheGradientThroughLogSoftmax) {
  const Problem p = gradient_problem();
  std::vector<double> z = random_values(5 * 2 * 4, 11, -1.5, 1.5);
  const std::vector<double> g{1.5, -0.5};
  const std::vector<double> grad = gradient(p, log_softmax(z, 4), g);
  ASSERT_EQ(grad.size(), z.size());
  constexpr double h = 1e-5;
  for (std::size_t i = 0; i < z.size(); ++i) {
    const double keep = z[i];
    z[i] = keep + h;
    const double up = weighted(losses(p, log_softmax(z, 4)), g);
    z[i] = keep - h;
    const double down = weighted(losses(p, log_softmax(z, 4)), g);
    z[i] = keep;
    EXPECT_NEAR(grad[i], (up - down) / (2 * h), 1e-7) << "element " << i;
  }
}

// With respect to log_probs themselves (not normalised) the gradient is Burn's less
// grad_loss · exp(log_probs) before each input length, and 0 from it on.
TEST(ReferenceCtcLossBackwardTest, LessExpLogProbsIsTheGradientWithRespectToLogProbs) {
  const Problem p = gradient_problem();
  std::vector<double> lp = random_values(5 * 2 * 4, 12, -1.5, 1.5);
  const std::vector<double> g{0.75, 2};
  const std::vector<double> grad = gradient(p, lp, g);
  constexpr double h = 1e-5;
  for (std::size_t i = 0; i < lp.size(); ++i) {
    const std::size_t t = i / 8, n = i / 4 % 2;
    const double keep = lp[i];
    lp[i] = keep + h;
    const double up = weighted(losses(p, lp), g);
    lp[i] = keep - h;
    const double down = weighted(losses(p, lp), g);
    lp[i] = keep;
    const bool inside = static_cast<std::int64_t>(t) < p.input_lengths[n];
    EXPECT_NEAR(inside ? grad[i] - g[n] * std::exp(keep) : grad[i], (up - down) / (2 * h), 1e-7) << "element " << i;
    if (!inside) {
      EXPECT_EQ(grad[i], 0) << "element " << i;
    }
  }
}

// An infeasible sample (+inf loss): NaN at its labels' classes, g · exp(lp) at the others (Burn,
// PyTorch with zero_infinity false); an empty input: zeros.
TEST(ReferenceCtcLossBackwardTest, InfeasibleAndEmptyInputs) {
  const std::vector<double> y{0.2, 0.3, 0.5};
  const std::vector<double> grad = gradient({1, 2, 3, 2, {1, 1, 2, 2}, {1, 0}, {2, 1}}, logs({y, y}), {2, 1});
  ASSERT_EQ(grad.size(), 6u);
  EXPECT_TRUE(std::isnan(grad[0]));
  EXPECT_TRUE(std::isnan(grad[1]));
  EXPECT_NEAR(grad[2], 2 * 0.5, 1e-15);
  EXPECT_EQ((std::vector<double>{grad[3], grad[4], grad[5]}), (std::vector<double>{0, 0, 0}));
}

// ---- Forced bad ops (hand-made values and attributes)

TEST(ReferenceCtcTest, BadLengthsLabelsAndAttributesAreErrors) {
  const std::vector<double> y{0.4, 0.6};
  const std::vector<double> lp = logs({y, y});
  auto expect_error = [&](const Problem& p, const char* what) {
    Device d;
    const Operands o = operands(d, p, lp);
    const Status st = d.run(b::ctc_loss(o.lp, o.targets, o.input_lengths, o.target_lengths, p.blank, d.fresh()));
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.error().message.find(what), std::string::npos) << st.error().message;
  };
  expect_error({2, 1, 2, 1, {1}, {3}, {1}}, "the input length of sample 0 is 3, not in [0, 2]");
  expect_error({2, 1, 2, 1, {1}, {-1}, {1}}, "the input length of sample 0 is -1");
  expect_error({2, 1, 2, 1, {1}, {2}, {2}}, "the target length of sample 0 is 2, not in [0, 1]");
  expect_error({2, 1, 2, 1, {5}, {2}, {1}}, "target index 5");
  expect_error({2, 1, 2, 1, {0}, {2}, {1}}, "is the blank label 0");
  Device d;
  const Operands o = operands(d, {2, 1, 2, 1, {1}, {2}, {1}}, lp);
  Operation op = *b::ctc_loss(o.lp, o.targets, o.input_lengths, o.target_lengths, 0, d.fresh());
  op.attrs[0] = 2;
  EXPECT_NE(d.exec.execute(op, d.handles).error().message.find("blank 2 out of range"), std::string::npos);
  op.attrs[0] = 0;
  op.outputs()[0].id = d.fresh();
  op.outputs()[0].shape = {2};
  EXPECT_NE(d.exec.execute(op, d.handles).error().message.find("does not have the shape"), std::string::npos);
  Operation back = *b::ctc_loss_backward(o.lp, o.targets, o.input_lengths, o.target_lengths,
                                         d.f64({1}, dtypes::f32, {1}), 0, d.fresh());
  back.tensors[4] = d.f64({2}, dtypes::f32, {1, 1});
  EXPECT_NE(d.exec.execute(back, d.handles).error().message.find("grad_loss"), std::string::npos);
  back.tensors[4] = d.f64({1}, dtypes::f32, {1});
  back.tensors[2] = d.f64({1}, dtypes::f32, {2});
  back.outputs()[0].id = d.fresh();
  EXPECT_NE(d.exec.execute(back, d.handles).error().message.find("must be integer"), std::string::npos);
}

}  // namespace
}  // namespace kiln::reference::testing

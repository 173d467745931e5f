// Reference kernels of the CTC loss and its gradient (docs/spec/ir.md §5.8): the forward (alpha) and
// backward (beta) recursions of Graves et al. in log space, in f64, per sample over its extended
// label sequence l' = blank, l1, blank, l2, …, blank. The loss is −log P, +inf when no alignment
// exists (PyTorch's zero_infinity = false); an empty input gives 0 for an empty target, else +inf
// (PyTorch). The gradient is Burn's and PyTorch's: grad_loss · (exp(lp[t, k]) − Σ_{s: l'_s = k}
// exp(α_t(s) + β_t(s) − lp[t, k] + nll)), which is the gradient of loss(log_softmax(z)) with
// respect to z when log_probs are normalised; 0 from the sample's input length on.
#include <cmath>
#include <limits>
#include <vector>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// log(exp(a) + exp(b)) without overflow; −inf is the identity.
double log_add(double a, double b) {
  if (a == kNegInf) return b;
  if (b == kNegInf) return a;
  const double m = std::max(a, b);
  return m + std::log1p(std::exp(-std::fabs(a - b)));
}

// log_probs [T, N, C], targets [N, S], input_lengths [N], target_lengths [N]; blank < C.
struct Ctc {
  std::uint64_t steps = 0, batch = 0, classes = 0, max_target = 0, blank = 0;
};

Result<Ctc> ctc_of(const Ctx& c) {
  const HostTensor &lp = c.in[0], &targets = c.in[1], &input_lengths = c.in[2], &target_lengths = c.in[3];
  if (!lp.dtype().is_float() || lp.shape().size() != 3)
    return c.error(ErrorCode::DTypeMismatch, fmt::format("log_probs {} must be a float [T, N, C]", lp.to_string()));
  const std::uint64_t n = lp.shape()[1];
  const bool ints =
      targets.dtype().is_integral() && input_lengths.dtype().is_integral() && target_lengths.dtype().is_integral();
  if (!ints || targets.shape().size() != 2 || targets.shape()[0] != n || input_lengths.shape() != ir::Shape{n} ||
      target_lengths.shape() != ir::Shape{n})
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("targets {}, input_lengths {} and target_lengths {} must be integer [{}, S], [{}], [{}]",
                               targets.to_string(), input_lengths.to_string(), target_lengths.to_string(), n, n, n));
  KILN_ASSIGN_OR_RETURN(std::uint64_t blank, count_attr(c, 0, "blank"));
  if (blank >= lp.shape()[2])
    return c.error(ErrorCode::OutOfBounds,
                   fmt::format("blank {} out of range for the {} classes of {}", blank, lp.shape()[2], lp.to_string()));
  return Ctc{lp.shape()[0], n, lp.shape()[2], targets.shape()[1], blank};
}

// One sample: its input length and extended label sequence, checked against the tensors' extents.
struct Sample {
  std::uint64_t steps = 0;
  std::vector<std::uint64_t> labels;  // l', 2·target_length + 1 entries
};

// Element n of a lengths tensor, in [0, max].
Result<std::uint64_t> length_at(const Ctx& c, const HostTensor& t, std::uint64_t n, std::uint64_t max,
                                const char* what) {
  std::uint64_t v = 0;
  if (!read_index(t, n, v) || v > max)
    return c.error(ErrorCode::OutOfBounds,
                   fmt::format("{} of sample {} is {}, not in [0, {}]", what, n, t.get_i64(n), max));
  return v;
}

Result<Sample> sample_of(const Ctx& c, const Ctc& a, std::uint64_t n) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t steps, length_at(c, c.in[2], n, a.steps, "the input length"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t length, length_at(c, c.in[3], n, a.max_target, "the target length"));
  Sample s{steps, {a.blank}};
  for (std::uint64_t i = 0; i < length; ++i) {
    KILN_ASSIGN_OR_RETURN(std::uint64_t label, checked_index(c, c.in[1], n * a.max_target + i, a.classes, "target"));
    if (label == a.blank)
      return c.error(ErrorCode::Invalid,
                     fmt::format("target {} of sample {} is the blank label {}: targets cannot be blank", i, n, label));
    s.labels.push_back(label);
    s.labels.push_back(a.blank);
  }
  return s;
}

double log_prob(const Ctx& c, const Ctc& a, std::uint64_t t, std::uint64_t n, std::uint64_t k) {
  return c.in[0].get_f64((t * a.batch + n) * a.classes + k);
}

// May l'_s be reached from l'_(s−2) (skipping the blank between two different labels)?
bool may_skip(const std::vector<std::uint64_t>& l, std::size_t s, std::uint64_t blank) {
  return s >= 2 && l[s] != blank && l[s] != l[s - 2];
}

// α_t(s), flattened [steps][l'], each including the emission at t.
std::vector<double> alphas(const Ctx& c, const Ctc& a, std::uint64_t n, const Sample& smp) {
  const std::size_t m = smp.labels.size();
  std::vector<double> al(static_cast<std::size_t>(smp.steps) * m, kNegInf);
  al[0] = log_prob(c, a, 0, n, smp.labels[0]);
  if (m > 1) al[1] = log_prob(c, a, 0, n, smp.labels[1]);
  for (std::uint64_t t = 1; t < smp.steps; ++t) {
    const double* prev = &al[(t - 1) * m];
    double* cur = &al[t * m];
    for (std::size_t s = 0; s < m; ++s) {
      double x = prev[s];
      if (s >= 1) x = log_add(x, prev[s - 1]);
      if (may_skip(smp.labels, s, a.blank)) x = log_add(x, prev[s - 2]);
      cur[s] = x == kNegInf ? kNegInf : x + log_prob(c, a, t, n, smp.labels[s]);
    }
  }
  return al;
}

// β_t(s), flattened [steps][l'], each including the emission at t.
std::vector<double> betas(const Ctx& c, const Ctc& a, std::uint64_t n, const Sample& smp) {
  const std::size_t m = smp.labels.size();
  const std::uint64_t last = smp.steps - 1;
  std::vector<double> be(static_cast<std::size_t>(smp.steps) * m, kNegInf);
  be[last * m + m - 1] = log_prob(c, a, last, n, smp.labels[m - 1]);
  if (m > 1) be[last * m + m - 2] = log_prob(c, a, last, n, smp.labels[m - 2]);
  for (std::uint64_t t = last; t-- > 0;) {
    const double* next = &be[(t + 1) * m];
    double* cur = &be[t * m];
    for (std::size_t s = 0; s < m; ++s) {
      double x = next[s];
      if (s + 1 < m) x = log_add(x, next[s + 1]);
      if (s + 2 < m && may_skip(smp.labels, s + 2, a.blank)) x = log_add(x, next[s + 2]);
      cur[s] = x == kNegInf ? kNegInf : x + log_prob(c, a, t, n, smp.labels[s]);
    }
  }
  return be;
}

// −log P of one sample: the paths ending on the last label or the final blank.
double nll_of(const std::vector<double>& al, const Sample& smp) {
  const std::size_t m = smp.labels.size();
  if (smp.steps == 0) return m == 1 ? 0.0 : std::numeric_limits<double>::infinity();
  const double* last = &al[(smp.steps - 1) * m];
  return -log_add(last[m - 1], m > 1 ? last[m - 2] : kNegInf);
}

// The gradient of one sample at its steps t < input length, scaled by g, into acc [T][C].
void sample_gradient(const Ctx& c, const Ctc& a, std::uint64_t n, const Sample& smp, double g,
                     std::vector<double>& acc) {
  const std::vector<double> al = alphas(c, a, n, smp), be = betas(c, a, n, smp);
  const double nll = nll_of(al, smp);
  const std::size_t m = smp.labels.size();
  for (std::uint64_t t = 0; t < smp.steps; ++t) {
    double* row = &acc[static_cast<std::size_t>((t * a.batch + n) * a.classes)];
    for (std::uint64_t k = 0; k < a.classes; ++k) row[k] = std::exp(log_prob(c, a, t, n, k));
    for (std::size_t s = 0; s < m; ++s) {
      const std::uint64_t k = smp.labels[s];
      row[k] -= std::exp(al[t * m + s] + be[t * m + s] - log_prob(c, a, t, n, k) + nll);
    }
    for (std::uint64_t k = 0; k < a.classes; ++k) row[k] *= g;
  }
}

}  // namespace

// CtcLoss{log_probs, targets, input_lengths, target_lengths; blank} → [N], log_probs' dtype.
Result<Outputs> run_ctc_loss(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(Ctc a, ctc_of(c));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::Shape{a.batch}));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, c.in[0].dtype()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  for (std::uint64_t n = 0; n < a.batch; ++n) {
    KILN_ASSIGN_OR_RETURN(Sample smp, sample_of(c, a, n));
    const double nll = smp.steps == 0 ? nll_of({}, smp) : nll_of(alphas(c, a, n, smp), smp);
    element::store_f64(out.mutable_data(), out.dtype(), n, nll);
  }
  return single(std::move(out));
}

// CtcLossBackward{log_probs, targets, input_lengths, target_lengths, grad_loss; blank} →
// log_probs' shape and dtype.
Result<Outputs> run_ctc_loss_backward(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(Ctc a, ctc_of(c));
  const HostTensor& grad_loss = c.in[4];
  if (!grad_loss.dtype().is_float() || grad_loss.shape() != ir::Shape{a.batch})
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("grad_loss {} must be a float [{}]", grad_loss.to_string(), a.batch));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, c.in[0].shape()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, c.in[0].dtype()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  std::vector<double> acc(static_cast<std::size_t>(out.num_elements()), 0.0);
  for (std::uint64_t n = 0; n < a.batch; ++n) {
    KILN_ASSIGN_OR_RETURN(Sample smp, sample_of(c, a, n));
    if (smp.steps > 0) sample_gradient(c, a, n, smp, grad_loss.get_f64(n), acc);
  }
  for (std::size_t i = 0; i < acc.size(); ++i) element::store_f64(out.mutable_data(), out.dtype(), i, acc[i]);
  return single(std::move(out));
}

}  // namespace kiln::reference::kernels

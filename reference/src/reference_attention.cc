// Reference kernel of Attention (docs/spec/ir.md §5.8): scaled dot-product attention row by row in
// f64, in Burn's order (attention_fallback): scores q·kᵀ·scale, softcap · tanh(s / softcap), −inf
// where the bool mask is true, −inf above the causal diagonal (bottom-right aligned: key j is
// masked for query i when j > i + Lk − Lq), plus attn_bias, then a softmax with the maximum
// subtracted whose maximum is clamped to the lowest finite value and whose sum to the smallest
// normal one, so a row with every key masked gives 0 (Burn's NaN-safe softmax). Each output is
// rounded once.
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

using ir::kPresentBias;
using ir::kPresentMask;
using ir::kPresentScale;
using ir::kPresentSoftcap;

constexpr std::int64_t kAllPresenceBits = kPresentMask | kPresentBias | kPresentScale | kPresentSoftcap;

struct Attention {
  std::uint64_t batch = 0, heads = 0, lq = 0, lk = 0, d = 0, dv = 0;
  bool causal = false;
  double scale = 1;
  std::optional<double> softcap;
  const HostTensor* mask = nullptr;
  const HostTensor* bias = nullptr;
};

double from_bits(std::int64_t bits) {
  double v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// An optional f64 option: attribute i when the presence bit is set, else the attribute is 0.
Result<std::optional<double>> optional_f64(const Ctx& c, std::int64_t present, std::int64_t bit, std::size_t i,
                                           const char* what) {
  if ((present & bit) == 0) {
    if (c.op.attrs[i] != 0)
      return c.error(ErrorCode::Invalid,
                     fmt::format("attribute {} holds a {} the presence bits {} do not announce", i, what, present));
    return std::optional<double>{};
  }
  return std::optional<double>{from_bits(c.op.attrs[i])};
}

// The presence bits, the optional inputs they announce, is_causal, scale and softcap.
Status read_options(const Ctx& c, Attention& a) {
  const std::int64_t present = c.op.attrs[0];
  if (present < 0 || (present & ~kAllPresenceBits) != 0)
    return c.error(ErrorCode::Invalid, fmt::format("unknown presence bits {}", present));
  const std::size_t wanted = 3 + ((present & kPresentMask) ? 1 : 0) + ((present & kPresentBias) ? 1 : 0);
  if (c.in.size() != wanted)
    return c.error(ErrorCode::Invalid,
                   fmt::format("{} inputs, the presence bits {} announce {}", c.in.size(), present, wanted));
  if (present & kPresentMask) a.mask = &c.in[3];
  if (present & kPresentBias) a.bias = &c.in[a.mask ? 4 : 3];
  KILN_ASSIGN_OR_RETURN(a.causal, flag_attr(c, 1, "is_causal"));
  KILN_ASSIGN_OR_RETURN(std::optional<double> scale, optional_f64(c, present, kPresentScale, 2, "scale"));
  KILN_ASSIGN_OR_RETURN(a.softcap, optional_f64(c, present, kPresentSoftcap, 3, "softcap"));
  if (scale && !std::isfinite(*scale))
    return c.error(ErrorCode::Invalid, fmt::format("scale must be finite, got {}", *scale));
  if (a.softcap && !(std::isfinite(*a.softcap) && *a.softcap > 0))
    return c.error(ErrorCode::Invalid, fmt::format("softcap must be finite and positive, got {}", *a.softcap));
  a.scale = scale.value_or(1.0 / std::sqrt(static_cast<double>(a.d)));
  return Status::Ok();
}

// mask? / attn_bias?: rank 4, each dim the scores' or 1.
Status check_scores_operand(const Ctx& c, const HostTensor* t, const char* what, const ir::Shape& scores) {
  if (t == nullptr) return Status::Ok();
  bool fits = t->shape().size() == 4;
  for (std::size_t i = 0; fits && i < 4; ++i) fits = t->shape()[i] == scores[i] || t->shape()[i] == 1;
  if (!fits)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("{} {} does not broadcast to the scores' shape {}", what,
                                                              t->to_string(), ir::shape_to_string(scores)));
  return Status::Ok();
}

// query [B, H, Lq, D], key [B, H, Lk, D], value [B, H, Lk, Dv] of one float dtype; the optional
// operands; the output.
Result<Attention> attention_of(const Ctx& c) {
  const HostTensor &q = c.in[0], &k = c.in[1], &v = c.in[2];
  if (!q.dtype().is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("query {} must have a float dtype", q.to_string()));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 2));
  const ir::Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  if (qs.size() != 4 || ks.size() != 4 || vs.size() != 4 || ks[0] != qs[0] || ks[1] != qs[1] || ks[3] != qs[3] ||
      vs[0] != qs[0] || vs[1] != qs[1] || vs[2] != ks[2])
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("query {}, key {} and value {} must be [B, H, Lq, D], [B, H, Lk, D], [B, H, Lk, Dv]",
                               q.to_string(), k.to_string(), v.to_string()));
  Attention a{qs[0], qs[1], qs[2], ks[2], qs[3], vs[3]};
  KILN_RETURN_IF_ERROR(read_options(c, a));
  const ir::Shape scores{a.batch, a.heads, a.lq, a.lk};
  KILN_RETURN_IF_ERROR(check_scores_operand(c, a.mask, "mask", scores));
  KILN_RETURN_IF_ERROR(check_scores_operand(c, a.bias, "attn_bias", scores));
  if (a.mask && !a.mask->dtype().is_bool())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("mask {} must have a bool dtype", a.mask->to_string()));
  if (a.bias && !(a.bias->dtype() == q.dtype()))
    return c.error(ErrorCode::DTypeMismatch,
                   fmt::format("dtypes differ: query {} vs attn_bias {}", q.to_string(), a.bias->to_string()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::Shape{a.batch, a.heads, a.lq, a.dv}));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, q.dtype()));
  return a;
}

// Element (b, h, i, j) of a [B, H, Lq, Lk] operand broadcast over its dims of size 1.
std::uint64_t scores_index(const HostTensor& t, std::uint64_t b, std::uint64_t h, std::uint64_t i, std::uint64_t j) {
  const ir::Shape& s = t.shape();
  auto at = [&s](std::size_t d, std::uint64_t x) { return s[d] == 1 ? 0 : x; };
  return ((at(0, b) * s[1] + at(1, h)) * s[2] + at(2, i)) * s[3] + at(3, j);
}

// The scores of query row i of (b, h) against every key, masked and biased (Burn's order).
void score_row(const Ctx& c, const Attention& a, std::uint64_t b, std::uint64_t h, std::uint64_t i,
               std::vector<double>& s) {
  const HostTensor &q = c.in[0], &k = c.in[1];
  const std::uint64_t plane = b * a.heads + h;
  for (std::uint64_t j = 0; j < a.lk; ++j) {
    double dot = 0;
    for (std::uint64_t e = 0; e < a.d; ++e)
      dot += q.get_f64((plane * a.lq + i) * a.d + e) * k.get_f64((plane * a.lk + j) * a.d + e);
    double x = dot * a.scale;
    if (a.softcap) x = std::tanh(x / *a.softcap) * *a.softcap;
    if (a.mask && a.mask->get_bool(scores_index(*a.mask, b, h, i, j))) x = -std::numeric_limits<double>::infinity();
    if (a.causal && j + a.lq > i + a.lk) x = -std::numeric_limits<double>::infinity();
    if (a.bias) x += a.bias->get_f64(scores_index(*a.bias, b, h, i, j));
    s[static_cast<std::size_t>(j)] = x;
  }
}

// Softmax of the scores in place, the maximum clamped to the lowest finite value and the sum to
// the smallest normal one: a row of −inf becomes zeros.
void softmax_row(std::vector<double>& s) {
  double max = -std::numeric_limits<double>::infinity();
  for (double x : s)
    if (x > max) max = x;
  max = std::max(max, std::numeric_limits<double>::lowest());
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - max));
  sum = std::max(sum, std::numeric_limits<double>::min());
  for (double& x : s) x /= sum;
}

}  // namespace

// Attention{query, key, value, mask?, attn_bias?; present, is_causal, scale, softcap} →
// [B, H, Lq, Dv], query's dtype.
Result<Outputs> run_attention(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(Attention a, attention_of(c));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const HostTensor& v = c.in[2];
  std::vector<double> w(static_cast<std::size_t>(a.lk));
  for (std::uint64_t b = 0; b < a.batch; ++b)
    for (std::uint64_t h = 0; h < a.heads; ++h)
      for (std::uint64_t i = 0; i < a.lq; ++i) {
        score_row(c, a, b, h, i, w);
        softmax_row(w);
        const std::uint64_t plane = b * a.heads + h;
        for (std::uint64_t e = 0; e < a.dv; ++e) {
          double acc = 0;
          for (std::uint64_t j = 0; j < a.lk; ++j)
            acc += w[static_cast<std::size_t>(j)] * v.get_f64((plane * a.lk + j) * a.dv + e);
          element::store_f64(out.mutable_data(), out.dtype(), (plane * a.lq + i) * a.dv + e, acc);
        }
      }
  return single(std::move(out));
}

}  // namespace kiln::reference::kernels

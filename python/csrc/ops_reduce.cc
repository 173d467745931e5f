// Reductions, matrix products (mm, bmm, addmm, dot, mv), softmax and the MSE and NLL losses (also
// over spatial inputs), with their backward kernels where autograd calls a kernel of its own
// (_softmax_backward_data, mse_loss_backward, ...).
#include <ATen/WrapDimUtils.h>
#include <ATen/core/Reduction.h>
#include <ATen/ops/nll_loss2d_backward.h>
#include <ATen/ops/nll_loss2d_forward.h>
#include <ATen/ops/nll_loss_backward.h>
#include <ATen/ops/nll_loss_forward.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "state.h"
#include "tensor_impl.h"

namespace kiln::pytorch {
namespace {

using runtime::Session;
using Value = runtime::Tensor;
using DimFn = Result<Value> (Session::*)(Value, std::uint64_t, bool);

bool integral_or_bool(c10::ScalarType t) { return c10::isIntegralType(t, /*includeBool=*/true); }

// The dims a reduction names (none or empty: all), wrapped and sorted; a 0-dim tensor accepts 0 and −1.
std::vector<std::uint64_t> reduced_dims(const at::Tensor& self, at::OptionalIntArrayRef dims) {
  std::vector<std::uint64_t> out;
  const std::int64_t rank = self.dim();
  if (!dims || dims->empty()) {
    for (std::int64_t d = 0; d < rank; ++d) out.push_back(static_cast<std::uint64_t>(d));
    return out;
  }
  for (const std::int64_t d : *dims) out.push_back(static_cast<std::uint64_t>(at::maybe_wrap_dim(d, rank)));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::int64_t> reduced_sizes(const at::Tensor& self, const std::vector<std::uint64_t>& dims, bool keepdim) {
  std::vector<std::int64_t> sizes;
  for (std::int64_t d = 0; d < self.dim(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), static_cast<std::uint64_t>(d)) != dims.end();
    if (!reduced) {
      sizes.push_back(self.size(d));
    } else if (keepdim) {
      sizes.push_back(1);
    }
  }
  return sizes;
}

using WholeFn = Result<Value> (Session::*)(Value, bool);

// sum / mean over `dims` (all when none): every dim of a tensor with elements in one kiln
// whole-tensor reduction (one pass), otherwise one *_dim reduction per dim, each keeping its axis;
// then one reshape to the result's sizes. `type` is the dtype the reduction runs in.
at::Tensor reduce(std::string_view what, const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                  c10::ScalarType type, DimFn fn, WholeFn whole) {
  const std::vector<std::uint64_t> rdims = reduced_dims(self, dims);
  const std::vector<std::int64_t> sizes = reduced_sizes(self, rdims, keepdim);
  Value v = cast_to(value_of(self, what), to_kiln_dtype(type, what), what);
  if (self.dim() == 0) return make_tensor(std::move(v), sizes);  // one element: the sum and the mean are itself
  if (rdims.size() == static_cast<std::size_t>(self.dim()) && self.dim() > 1 && self.numel() > 0) {
    v = value_or_throw((session().*whole)(std::move(v), /*keepdim=*/false), what);
  } else {
    for (const std::uint64_t d : rdims) v = value_or_throw((session().*fn)(std::move(v), d, /*keepdim=*/true), what);
  }
  return make_tensor(reshaped(v, sizes, what), sizes);
}

// sum: integers and bool accumulate in int64, as PyTorch's.
c10::ScalarType sum_type(const at::Tensor& self, std::optional<c10::ScalarType> dtype) {
  if (dtype) return *dtype;
  return integral_or_bool(self.scalar_type()) ? c10::ScalarType::Long : self.scalar_type();
}

c10::ScalarType mean_type(const at::Tensor& self, std::optional<c10::ScalarType> dtype) {
  const c10::ScalarType t = dtype.value_or(self.scalar_type());
  TORCH_CHECK(c10::isFloatingType(t),
              "mean(): could not infer output dtype. Input dtype must be either a floating "
              "point or complex dtype. Got: ",
              t);
  return t;
}

at::Tensor sum_kernel(const at::Tensor& self, std::optional<c10::ScalarType> dtype) {
  return reduce("sum", self, std::nullopt, false, sum_type(self, dtype), &Session::sum_dim, &Session::sum);
}
at::Tensor sum_dim_kernel(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                          std::optional<c10::ScalarType> dtype) {
  return reduce("sum", self, dims, keepdim, sum_type(self, dtype), &Session::sum_dim, &Session::sum);
}
at::Tensor mean_kernel(const at::Tensor& self, std::optional<c10::ScalarType> dtype) {
  return reduce("mean", self, std::nullopt, false, mean_type(self, dtype), &Session::mean_dim, &Session::mean);
}
at::Tensor mean_dim_kernel(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
                           std::optional<c10::ScalarType> dtype) {
  return reduce("mean", self, dims, keepdim, mean_type(self, dtype), &Session::mean_dim, &Session::mean);
}

// kiln's reductions exclude bool; PyTorch's max is defined on bool: a bool input reduces as u8
// and its values are cast back.
Value bool_as_u8(const at::Tensor& t, std::string_view what) {
  const Value& v = value_of(t, what);
  return t.scalar_type() == c10::ScalarType::Bool ? cast_to(v, ir::dtypes::u8, what) : v;
}
Value restore_bool(const Value& v, const at::Tensor& input, std::string_view what) {
  return input.scalar_type() == c10::ScalarType::Bool ? cast_to(v, ir::dtypes::boolean, what) : v;
}

// (values, indices) of the maximum along `dim`; the index of the first maximum.
std::tuple<at::Tensor, at::Tensor> max_dim_kernel(const at::Tensor& self, std::int64_t dim, bool keepdim) {
  const std::vector<std::uint64_t> rdims = reduced_dims(self, at::IntArrayRef(dim));
  const std::vector<std::int64_t> sizes = reduced_sizes(self, rdims, keepdim);
  if (self.dim() == 0) {
    Value zero = value_or_throw(session().zeros(ir::Shape{1}, ir::dtypes::i64), "max");
    return {make_tensor(value_of(self, "max"), sizes), make_tensor(std::move(zero), sizes)};
  }
  auto [values, indices] =
      value_or_throw(session().max_dim_with_indices(bool_as_u8(self, "max"), rdims[0], true), "max");
  values = restore_bool(values, self, "max");
  return {make_tensor(reshaped(values, sizes, "max"), sizes), make_tensor(reshaped(indices, sizes, "max"), sizes)};
}

at::Tensor max_all_kernel(const at::Tensor& self) {
  TORCH_CHECK(self.numel() > 0, "max(): Expected reduction dim to be specified for input.numel() == 0.");
  return make_tensor(restore_bool(value_or_throw(session().max(bool_as_u8(self, "max")), "max"), self, "max"), {});
}

// ---- matrix products

void check_same_dtype(std::string_view what, const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), what,
              ": expected m1 and m2 to have the same dtype, but got: ", a.scalar_type(), " != ", b.scalar_type());
}

at::Tensor matmul_of(std::string_view what, const at::Tensor& a, const at::Tensor& b, std::int64_t rank) {
  TORCH_CHECK(a.dim() == rank && b.dim() == rank, what, ": expected ", rank, "-D tensors, got ", a.dim(), "-D and ",
              b.dim(), "-D");
  check_same_dtype(what, a, b);
  // Shapes are kiln's builder's to check: its error (a KilnError) names them.
  Value out = value_or_throw(session().matmul(value_of(a, what), value_of(b, what)), what);
  const ir::Shape& shape = out.shape();
  const std::vector<std::int64_t> sizes(shape.begin(), shape.end());
  return make_tensor(std::move(out), sizes);
}

at::Tensor mm_kernel(const at::Tensor& a, const at::Tensor& b) { return matmul_of("mm", a, b, 2); }
at::Tensor bmm_kernel(const at::Tensor& a, const at::Tensor& b) { return matmul_of("bmm", a, b, 3); }

// dot (1-d · 1-d) and mv (2-d @ 1-d), which matmul with a vector operand and mv's own backward
// reach: kiln's Matmul of [1, n] @ [n, 1] and [m, n] @ [n, 1]. Without a summed element the
// result is zeros, as PyTorch's.
at::Tensor dot_kernel(const at::Tensor& a, const at::Tensor& b) {
  constexpr std::string_view what = "dot";
  TORCH_CHECK(a.dim() == 1 && b.dim() == 1, "1D tensors expected, but got ", a.dim(), "D and ", b.dim(), "D tensors");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), "dot : expected both vectors to have same dtype, but found ",
              a.scalar_type(), " and ", b.scalar_type());
  const std::int64_t n = a.numel();
  TORCH_CHECK(n == b.numel(), "inconsistent tensor size, expected tensor [", n, "] and src [", b.numel(),
              "] to have the same number of elements, but got ", n, " and ", b.numel(), " elements respectively");
  Session& s = session();
  if (n == 0) {
    return make_tensor(value_or_throw(s.zeros(ir::Shape{1}, to_kiln_dtype(a.scalar_type(), what)), what), {});
  }
  Value row = reshaped(value_of(a, what), {1, n}, what);
  Value column = reshaped(value_of(b, what), {n, 1}, what);
  Value out = value_or_throw(s.matmul(std::move(row), std::move(column)), what);
  return make_tensor(reshaped(out, {}, what), {});
}

at::Tensor mv_kernel(const at::Tensor& m, const at::Tensor& v) {
  constexpr std::string_view what = "mv";
  TORCH_CHECK(m.dim() == 2 && v.dim() == 1, "vector + matrix @ vector expected, got 1, ", m.dim(), ", ", v.dim());
  TORCH_CHECK(m.size(1) == v.size(0), "size mismatch, got input (", m.size(0), "), mat (", m.size(0), "x", m.size(1),
              "), vec (", v.size(0), ")");
  check_same_dtype(what, m, v);
  Session& s = session();
  const std::int64_t rows = m.size(0), n = v.size(0);
  if (rows == 0 || n == 0) {
    const ir::DType d = to_kiln_dtype(m.scalar_type(), what);
    const ir::Shape shape{static_cast<std::uint64_t>(rows)};
    return make_tensor(value_or_throw(rows == 0 ? s.empty(shape, d) : s.zeros(shape, d), what), {rows});
  }
  Value out = value_or_throw(s.matmul(value_of(m, what), reshaped(value_of(v, what), {n, 1}, what)), what);
  return make_tensor(reshaped(out, {rows}, what), {rows});
}

// beta·self + alpha·(m1 @ m2); beta = 0 ignores self (NaN included), as PyTorch's.
at::Tensor addmm_kernel(const at::Tensor& self, const at::Tensor& m1, const at::Tensor& m2, const at::Scalar& beta,
                        const at::Scalar& alpha) {
  check_same_dtype("addmm", self, m1);
  at::Tensor prod = matmul_of("addmm", m1, m2, 2);
  Session& s = session();
  Value p = value_of(prod, "addmm");
  if (alpha.toDouble() != 1.0) p = value_or_throw(s.mul(std::move(p), alpha.toDouble()), "addmm");
  if (beta.toDouble() == 0.0) return make_tensor(std::move(p), prod.sizes());
  Value bias = operand(self, p.dtype(), 2, "addmm");
  if (beta.toDouble() != 1.0) bias = value_or_throw(s.mul(std::move(bias), beta.toDouble()), "addmm");
  return make_tensor(value_or_throw(s.add(std::move(p), std::move(bias)), "addmm"), prod.sizes());
}

// ---- softmax

std::uint64_t softmax_dim(const at::Tensor& self, std::int64_t dim, bool half_to_float, std::string_view what) {
  TORCH_CHECK(!half_to_float, "kiln: ", what, ": half_to_float is not supported");
  return static_cast<std::uint64_t>(at::maybe_wrap_dim(dim, self.dim()));
}

at::Tensor log_softmax_kernel(const at::Tensor& self, std::int64_t dim, bool half_to_float) {
  const std::uint64_t d = softmax_dim(self, dim, half_to_float, "log_softmax");
  return make_tensor(value_or_throw(session().log_softmax(value_of(self, "log_softmax"), d), "log_softmax"),
                     self.sizes());
}

at::Tensor softmax_kernel(const at::Tensor& self, std::int64_t dim, bool half_to_float) {
  const std::uint64_t d = softmax_dim(self, dim, half_to_float, "softmax");
  return make_tensor(value_or_throw(session().softmax(value_of(self, "softmax"), d), "softmax"), self.sizes());
}

// grad − exp(y) · Σ_dim grad, y = log_softmax(x)
at::Tensor log_softmax_backward_kernel(const at::Tensor& grad, const at::Tensor& y, std::int64_t dim, c10::ScalarType) {
  Session& s = session();
  const auto d = static_cast<std::uint64_t>(at::maybe_wrap_dim(dim, y.dim()));
  const std::string_view what = "log_softmax_backward";
  Value g = value_of(grad, what);
  Value total = value_or_throw(s.sum_dim(g, d, true), what);
  Value scaled = value_or_throw(s.mul(value_or_throw(s.exp(value_of(y, what)), what), std::move(total)), what);
  return make_tensor(value_or_throw(s.sub(std::move(g), std::move(scaled)), what), y.sizes());
}

// y · (grad − Σ_dim grad·y), y = softmax(x)
at::Tensor softmax_backward_kernel(const at::Tensor& grad, const at::Tensor& y, std::int64_t dim, c10::ScalarType) {
  Session& s = session();
  const auto d = static_cast<std::uint64_t>(at::maybe_wrap_dim(dim, y.dim()));
  const std::string_view what = "softmax_backward";
  const Value& vy = value_of(y, what);
  Value gy = value_or_throw(s.mul(value_of(grad, what), vy), what);
  Value total = value_or_throw(s.sum_dim(gy, d, true), what);
  Value diff = value_or_throw(s.sub(value_of(grad, what), std::move(total)), what);
  return make_tensor(value_or_throw(s.mul(vy, std::move(diff)), what), y.sizes());
}

// ---- MSE loss: (x − t)², reduced by `reduction` (none, mean, sum).

at::Tensor mse_loss_kernel(const at::Tensor& self, const at::Tensor& target, std::int64_t reduction) {
  TORCH_CHECK(self.sizes().equals(target.sizes()), "kiln: mse_loss: input ", self.sizes(), " and target ",
              target.sizes(), " differ (broadcasting them is not lowered)");
  Session& s = session();
  const ir::DType d = to_kiln_dtype(self.scalar_type(), "mse_loss");
  Value diff = value_or_throw(s.sub(value_of(self, "mse_loss"), cast_to(value_of(target, "mse_loss"), d, "mse_loss")),
                              "mse_loss");
  Value sq = value_or_throw(s.mul(diff, diff), "mse_loss");
  if (reduction == at::Reduction::None) return make_tensor(std::move(sq), self.sizes());
  const bool mean = reduction == at::Reduction::Mean;
  return make_tensor(value_or_throw(mean ? s.mean(std::move(sq)) : s.sum(std::move(sq)), "mse_loss"), {});
}

// grad · 2(x − t), divided by the element count for the mean.
at::Tensor mse_loss_backward_kernel(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                    std::int64_t reduction) {
  Session& s = session();
  const std::string_view what = "mse_loss_backward";
  const ir::DType d = to_kiln_dtype(self.scalar_type(), what);
  Value diff = value_or_throw(s.sub(value_of(self, what), cast_to(value_of(target, what), d, what)), what);
  double k = 2.0;
  if (reduction == at::Reduction::Mean) k /= static_cast<double>(std::max<std::int64_t>(self.numel(), 1));
  Value scaled = value_or_throw(s.mul(std::move(diff), k), what);
  Value g = operand(grad, d, static_cast<std::size_t>(self.dim()), what);
  return make_tensor(value_or_throw(s.mul(std::move(scaled), std::move(g)), what), self.sizes());
}

// ---- NLL loss (cross-entropy's second half) over log-probabilities [N, C] or [C] and class
// indices [N] or []; a target equal to ignore_index counts for nothing. With class weights it
// runs on the CPU (counted as a fallback) until kiln lowers the weighted form.

struct NllRows {
  Value logp;    // [N, C]
  Value target;  // [N, 1], i64, ignored entries replaced by 0 (a valid gather index)
  Value valid;   // [N, 1], bool
};

NllRows nll_rows(const at::Tensor& self, const at::Tensor& target, std::int64_t ignore_index, std::string_view what) {
  TORCH_CHECK(self.dim() == 1 || self.dim() == 2, what, ": input must be 1-D or 2-D, got ", self.dim(), "-D");
  TORCH_CHECK(!c10::isFloatingType(target.scalar_type()), what, ": expected an integer target, got ",
              target.scalar_type());
  Session& s = session();
  const std::int64_t n = self.dim() == 2 ? self.size(0) : 1;
  Value t = reshaped(cast_to(value_of(target, what), ir::dtypes::i64, what), {n, 1}, what);
  Value ignored = value_or_throw(s.eq(t, static_cast<double>(ignore_index)), what);
  Value logp = reshaped(value_of(self, what), {n, self.size(-1)}, what);
  Value safe = value_or_throw(s.mask_fill(std::move(t), ignored, 0.0), what);
  Value valid = value_or_throw(s.not_(std::move(ignored)), what);
  return NllRows{std::move(logp), std::move(safe), std::move(valid)};
}

std::tuple<at::Tensor, at::Tensor> nll_loss_forward_kernel(const at::Tensor& self, const at::Tensor& target,
                                                           const std::optional<at::Tensor>& weight,
                                                           std::int64_t reduction, std::int64_t ignore_index) {
  if (weight && weight->defined()) {
    note_fallback("aten::nll_loss_forward (with weight)");
    auto [out, total] = at::nll_loss_forward(self.cpu(), target.cpu(), weight->cpu(), reduction, ignore_index);
    return {out.to(self.device()), total.to(self.device())};
  }
  const std::string_view what = "nll_loss";
  Session& s = session();
  NllRows rows = nll_rows(self, target, ignore_index, what);
  Value picked = value_or_throw(s.gather(std::move(rows.logp), 1, std::move(rows.target)), what);
  Value invalid = value_or_throw(s.not_(rows.valid), what);
  Value loss =
      value_or_throw(s.mask_fill(value_or_throw(s.neg(std::move(picked)), what), std::move(invalid), 0.0), what);
  Value count = value_or_throw(s.sum(cast_to(rows.valid, loss.dtype(), what)), what);
  if (reduction == at::Reduction::None) {
    const std::vector<std::int64_t> sizes(target.sizes().begin(), target.sizes().end());
    return {make_tensor(reshaped(loss, sizes, what), sizes), make_tensor(std::move(count), {})};
  }
  Value total = value_or_throw(s.sum(std::move(loss)), what);
  if (reduction == at::Reduction::Mean) total = value_or_throw(s.div(std::move(total), count), what);
  return {make_tensor(std::move(total), {}), make_tensor(std::move(count), {})};
}

// grad_input[n, c] = −grad_n · [c = target_n] · valid_n (/ total_weight for the mean).
at::Tensor nll_loss_backward_kernel(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                    const std::optional<at::Tensor>& weight, std::int64_t reduction,
                                    std::int64_t ignore_index, const at::Tensor& total_weight) {
  if (weight && weight->defined()) {
    note_fallback("aten::nll_loss_backward (with weight)");
    return at::nll_loss_backward(grad.cpu(), self.cpu(), target.cpu(), weight->cpu(), reduction, ignore_index,
                                 total_weight.cpu())
        .to(self.device());
  }
  const std::string_view what = "nll_loss_backward";
  Session& s = session();
  NllRows rows = nll_rows(self, target, ignore_index, what);
  std::vector<std::int64_t> ids(static_cast<std::size_t>(self.size(-1)));
  std::iota(ids.begin(), ids.end(), 0);
  Value classes = value_or_throw(s.from_host(std::span<const std::int64_t>(ids), {1, ids.size()}), what);
  const ir::DType d = rows.logp.dtype();
  Value hot = cast_to(value_or_throw(s.eq(std::move(rows.target), std::move(classes)), what), d, what);  // [N, C]
  // The gradient per row: [N] (no reduction) as [N, 1], a scalar as [1, 1].
  Value g = reduction == at::Reduction::None ? reshaped(cast_to(value_of(grad, what), d, what), {grad.numel(), 1}, what)
                                             : operand(grad, d, 2, what);
  Value coef = value_or_throw(s.mul(std::move(g), cast_to(rows.valid, d, what)), what);
  coef = value_or_throw(s.neg(std::move(coef)), what);
  if (reduction == at::Reduction::Mean) {
    coef = value_or_throw(s.div(std::move(coef), operand(total_weight, d, 2, what)), what);
  }
  Value out = value_or_throw(s.mul(std::move(hot), std::move(coef)), what);
  return make_tensor(reshaped(out, self.sizes(), what), self.sizes());
}

// ---- NLL loss over spatial inputs (cross-entropy with targets [N, d1, ...]; PyTorch views every
// such input as [N, C, H, W]): the class dim moved last and the rest flattened, [N·H·W, C], then
// the kernels above. Class weights and inputs without elements run on the CPU, counted.

// input [N, C, H, W] as rows [N·H·W, C]; target [N, H, W] as [N·H·W].
std::pair<at::Tensor, at::Tensor> nll2d_rows(const at::Tensor& self, const at::Tensor& target, std::string_view what) {
  TORCH_CHECK(self.dim() == 4,
              "only batches of spatial inputs supported (4D tensors), but got input of size: ", self.sizes());
  TORCH_CHECK(target.dim() == 3,
              "only batches of spatial targets supported (3D tensors) but got targets of dimension: ", target.dim());
  TORCH_CHECK(self.size(0) == target.size(0) && self.size(2) == target.size(1) && self.size(3) == target.size(2),
              "input and target batch or spatial sizes don't match: target ", target.sizes(), ", input ", self.sizes());
  const std::int64_t rows = target.numel(), c = self.size(1);
  Value v = value_or_throw(session().permute(value_of(self, what), {0, 2, 3, 1}), what);
  return {make_tensor(reshaped(v, {rows, c}, what), {rows, c}),
          make_tensor(reshaped(value_of(target, what), {rows}, what), {rows})};
}

bool nll2d_on_cpu(const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight) {
  return (weight && weight->defined()) || self.numel() == 0 || target.numel() == 0;
}

std::tuple<at::Tensor, at::Tensor> nll_loss2d_forward_kernel(const at::Tensor& self, const at::Tensor& target,
                                                             const std::optional<at::Tensor>& weight,
                                                             std::int64_t reduction, std::int64_t ignore_index) {
  constexpr std::string_view what = "nll_loss2d";
  if (nll2d_on_cpu(self, target, weight)) {
    const bool weighted = weight && weight->defined();
    note_fallback(weighted ? "aten::nll_loss2d_forward (with weight)" : "aten::nll_loss2d_forward");
    const std::optional<at::Tensor> w = weighted ? std::optional<at::Tensor>(weight->cpu()) : std::nullopt;
    auto [out, total] = at::nll_loss2d_forward(self.cpu(), target.cpu(), w, reduction, ignore_index);
    return {out.to(self.device()), total.to(self.device())};
  }
  auto [rows, targets] = nll2d_rows(self, target, what);
  auto [out, total] = nll_loss_forward_kernel(rows, targets, std::nullopt, reduction, ignore_index);
  if (reduction != at::Reduction::None) return {out, total};
  const std::vector<std::int64_t> sizes(target.sizes().begin(), target.sizes().end());  // [N, H, W]
  return {make_tensor(reshaped(value_of(out, what), sizes, what), sizes), total};
}

// The [N·H·W, C] gradient of the rows, back to [N, C, H, W].
at::Tensor nll_loss2d_backward_kernel(const at::Tensor& grad, const at::Tensor& self, const at::Tensor& target,
                                      const std::optional<at::Tensor>& weight, std::int64_t reduction,
                                      std::int64_t ignore_index, const at::Tensor& total_weight) {
  constexpr std::string_view what = "nll_loss2d_backward";
  if (nll2d_on_cpu(self, target, weight)) {
    const bool weighted = weight && weight->defined();
    note_fallback(weighted ? "aten::nll_loss2d_backward (with weight)" : "aten::nll_loss2d_backward");
    const std::optional<at::Tensor> w = weighted ? std::optional<at::Tensor>(weight->cpu()) : std::nullopt;
    return at::nll_loss2d_backward(grad.cpu(), self.cpu(), target.cpu(), w, reduction, ignore_index, total_weight.cpu())
        .to(self.device());
  }
  auto [rows, targets] = nll2d_rows(self, target, what);
  // grad: a scalar, or (no reduction) one per target, [N, H, W], which the kernel reads as [N·H·W]
  const at::Tensor gi =
      nll_loss_backward_kernel(grad, rows, targets, std::nullopt, reduction, ignore_index, total_weight);
  const std::int64_t n = self.size(0), c = self.size(1), h = self.size(2), w = self.size(3);
  Value v = reshaped(value_of(gi, what), {n, h, w, c}, what);
  return make_tensor(value_or_throw(session().permute(std::move(v), {0, 3, 1, 2}), what), self.sizes());
}

// Inside the namespace so that these names hide the C library's (exp, log, abs, ...).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("sum", TORCH_FN(sum_kernel));
  m.impl("sum.dim_IntList", TORCH_FN(sum_dim_kernel));
  m.impl("mean", TORCH_FN(mean_kernel));
  m.impl("mean.dim", TORCH_FN(mean_dim_kernel));
  m.impl("max.dim", TORCH_FN(max_dim_kernel));
  m.impl("max", TORCH_FN(max_all_kernel));
  m.impl("mm", TORCH_FN(mm_kernel));
  m.impl("bmm", TORCH_FN(bmm_kernel));
  m.impl("addmm", TORCH_FN(addmm_kernel));
  m.impl("dot", TORCH_FN(dot_kernel));
  m.impl("mv", TORCH_FN(mv_kernel));
  m.impl("_log_softmax", TORCH_FN(log_softmax_kernel));
  m.impl("_softmax", TORCH_FN(softmax_kernel));
  m.impl("_log_softmax_backward_data", TORCH_FN(log_softmax_backward_kernel));
  m.impl("_softmax_backward_data", TORCH_FN(softmax_backward_kernel));
  m.impl("mse_loss", TORCH_FN(mse_loss_kernel));
  m.impl("mse_loss_backward", TORCH_FN(mse_loss_backward_kernel));
  m.impl("nll_loss_forward", TORCH_FN(nll_loss_forward_kernel));
  m.impl("nll_loss_backward", TORCH_FN(nll_loss_backward_kernel));
  m.impl("nll_loss2d_forward", TORCH_FN(nll_loss2d_forward_kernel));
  m.impl("nll_loss2d_backward", TORCH_FN(nll_loss2d_backward_kernel));
}

}  // namespace
}  // namespace kiln::pytorch

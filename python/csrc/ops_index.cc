// Indexing, joining, scans, sorting and ranges: index_select, index_add, gather, scatter (and its
// add and reduce forms), flip, nn.Embedding's forward and backward, cat, cumsum, sort and arange.
// Arguments kiln cannot express (scale_grad_by_freq, sorting bools, empty operands) run on the CPU
// instead, counted as fallbacks under the op's name.
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/embedding_dense_backward.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/scatter.h>
#include <ATen/ops/scatter_add.h>
#include <ATen/ops/sort.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <tuple>
#include <vector>

#include "state.h"
#include "tensor_impl.h"

namespace kiln::pytorch {
namespace {

using runtime::Session;
using Value = runtime::Tensor;

bool integral_or_bool(c10::ScalarType t) { return c10::isIntegralType(t, /*includeBool=*/true); }
bool index_type(c10::ScalarType t) { return t == c10::ScalarType::Long || t == c10::ScalarType::Int; }

std::uint64_t wrap_dim(std::int64_t dim, const at::Tensor& t) {
  return static_cast<std::uint64_t>(at::maybe_wrap_dim(dim, t.dim()));
}

// ---- index_select: kiln's Select (indices of rank 1). A 0-dim input with one index is that
// element (kiln holds it as [1]), as PyTorch's.
at::Tensor index_select_kernel(const at::Tensor& self, std::int64_t dim, const at::Tensor& index) {
  constexpr std::string_view what = "index_select";
  TORCH_CHECK(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  TORCH_CHECK(index_type(index.scalar_type()), "index_select(): Expected dtype int32 or int64 for index");
  if (is_kiln(self) && is_kiln(index) && self.dim() == 0 && index.numel() == 1) {
    (void)wrap_dim(dim, self);  // 0 or -1: PyTorch's check
    Value idx = reshaped(value_of(index, what), {1}, what);
    return make_tensor(value_or_throw(session().select(value_of(self, what), 0, std::move(idx)), what), {});
  }
  if (!is_kiln(self) || !is_kiln(index) || self.dim() == 0 || index.numel() == 0 || self.numel() == 0) {
    note_fallback("aten::index_select");
    return at::index_select(self.cpu(), dim, index.cpu()).to(self.device());
  }
  const std::uint64_t d = wrap_dim(dim, self);
  Value idx = reshaped(value_of(index, what), {index.numel()}, what);
  std::vector<std::int64_t> sizes(self.sizes().begin(), self.sizes().end());
  sizes[d] = index.numel();
  return make_tensor(value_or_throw(session().select(value_of(self, what), d, std::move(idx)), what), sizes);
}

// ---- index_add (index_select's backward; index_add_ reaches it through functionalization):
// kiln's SelectAssign with the Add update, which applies the indices in order, so that a repeated
// index accumulates as on PyTorch's CPU. source·alpha is added; a 0-dim tensor counts as [1].

// The sizes PyTorch's indexing ops check a tensor by: a 0-dim tensor counts as [1]
// (ensure_nonempty_dim), which is also how kiln holds it.
std::vector<std::int64_t> ranked_sizes(const at::Tensor& t) {
  if (t.dim() == 0) return {1};
  return std::vector<std::int64_t>(t.sizes().begin(), t.sizes().end());
}

// A Scalar as a value of dtype `type`, as PyTorch converts a fill value: integers truncate, bool
// is "nonzero".
double scalar_as(const at::Scalar& k, c10::ScalarType type) {
  if (type == c10::ScalarType::Bool) return k.toBool() ? 1.0 : 0.0;
  if (c10::isIntegralType(type, /*includeBool=*/false)) return static_cast<double>(k.toLong());
  return k.toDouble();
}

at::Tensor index_add_kernel(const at::Tensor& self, std::int64_t dim, const at::Tensor& index, const at::Tensor& source,
                            const at::Scalar& alpha) {
  constexpr std::string_view what = "index_add";
  TORCH_CHECK(index.dim() <= 1, "index_add_(): Index is supposed to be a vector");
  TORCH_CHECK(index_type(index.scalar_type()), "index_add_(): Expected dtype int32/int64 for index");
  TORCH_CHECK(self.scalar_type() == source.scalar_type(), "index_add_(): self (", self.scalar_type(), ") and source (",
              source.scalar_type(), ") must have the same scalar type");
  const std::uint64_t d = wrap_dim(dim, self);
  const std::vector<std::int64_t> ss = ranked_sizes(self), vs = ranked_sizes(source);
  bool fits = vs.size() == ss.size();
  for (std::size_t i = 0; fits && i < ss.size(); ++i) fits = vs[i] == (i == d ? index.numel() : ss[i]);
  // Shapes PyTorch rejects, and indices into an empty tensor: the CPU raises its own error.
  if (!fits || !is_kiln(self) || !is_kiln(index) || !is_kiln(source) || (self.numel() == 0 && index.numel() > 0)) {
    note_fallback("aten::index_add");
    return at::index_add(self.cpu(), dim, index.cpu(), source.cpu(), alpha).to(self.device());
  }
  if (index.numel() == 0) return make_tensor(value_of(self, what), self.sizes());  // nothing added
  Session& s = session();
  Value src = value_of(source, what);
  if (self.scalar_type() == c10::ScalarType::Bool) {
    // bool: self |= source where alpha is true (kiln's Add on bool is "or"), nothing where it is false
    if (!alpha.toBool()) return make_tensor(value_of(self, what), self.sizes());
  } else if (alpha.toDouble() != 1.0) {
    src = value_or_throw(s.mul(std::move(src), scalar_as(alpha, self.scalar_type())), what);
  }
  Value idx = reshaped(value_of(index, what), {index.numel()}, what);
  Value out = value_or_throw(
      s.select_assign(value_of(self, what), d, std::move(idx), std::move(src), ir::IndexingUpdate::Add), what);
  return make_tensor(std::move(out), self.sizes());
}

// ---- gather and scatter: kiln's Gather and Scatter, whose shape rules are PyTorch's (index no
// larger than src in any dim, nor than self outside dim: only index's extent of src is read).
// Scatter applies the index's elements in order: a repeated index keeps the last write (Assign)
// or accumulates (Add, Mul), as PyTorch's CPU kernels. A 0-dim tensor counts as [1].

at::Tensor gather_kernel(const at::Tensor& self, std::int64_t dim, const at::Tensor& index, bool /*sparse_grad*/) {
  constexpr std::string_view what = "gather";
  const std::uint64_t d = wrap_dim(dim, self);
  const ir::DType dtype = to_kiln_dtype(self.scalar_type(), what);
  if (index.numel() == 0)  // index's sizes, no element (any index dtype, as PyTorch's)
    return make_tensor(value_or_throw(session().empty(kiln_shape(index.sizes()), dtype), what), index.sizes());
  TORCH_CHECK(index_type(index.scalar_type()), "gather(): Expected dtype int32/int64 for index");
  const std::vector<std::int64_t> ss = ranked_sizes(self), is = ranked_sizes(index);
  TORCH_CHECK(is.size() == ss.size(), "Index tensor must have the same number of dimensions as input tensor");
  for (std::size_t i = 0; i < ss.size(); ++i) {
    TORCH_CHECK(i == d || is[i] <= ss[i], "Size does not match at dimension ", i, " expected index ", index.sizes(),
                " to be no larger than self ", self.sizes(), " apart from dimension ", d);
  }
  if (!is_kiln(self) || !is_kiln(index) || self.numel() == 0) {  // indices into nothing: the CPU's error
    note_fallback("aten::gather");
    return at::gather(self.cpu(), dim, index.cpu()).to(self.device());
  }
  Value out = value_or_throw(session().gather(value_of(self, what), d, value_of(index, what)), what);
  return make_tensor(std::move(out), index.sizes());
}

// self with src's elements (or `value` everywhere) written where index points along dim, under
// `update`; nullopt where the CPU runs it (indices into an empty tensor: its error).
std::optional<at::Tensor> scatter_on_kiln(std::string_view method, const at::Tensor& self, std::int64_t dim,
                                          const at::Tensor& index, const at::Tensor* src, double value,
                                          ir::IndexingUpdate update) {
  if (index.numel() != 0) {
    TORCH_CHECK(index_type(index.scalar_type()), method, "(): Expected dtype int32/int64 for index");
  }
  if (src != nullptr) {
    TORCH_CHECK(self.scalar_type() == src->scalar_type(), method, "(): Expected self.dtype to be equal to src.dtype");
  }
  const std::uint64_t d = wrap_dim(dim, self);
  if (index.numel() == 0) return make_tensor(value_of(self, method), self.sizes());  // nothing written
  const std::vector<std::int64_t> ss = ranked_sizes(self), is = ranked_sizes(index);
  const std::vector<std::int64_t> vs = src != nullptr ? ranked_sizes(*src) : is;
  TORCH_CHECK(is.size() == ss.size(), "Index tensor must have the same number of dimensions as self tensor");
  TORCH_CHECK(vs.size() == is.size(), "Index tensor must have the same number of dimensions as src tensor");
  for (std::size_t i = 0; i < ss.size(); ++i) {
    if (src != nullptr) {
      TORCH_CHECK(is[i] <= vs[i] && (i == d || is[i] <= ss[i]), "Expected index ", index.sizes(),
                  " to be smaller than self ", self.sizes(), " apart from dimension ", d,
                  " and to be smaller size than src ", src->sizes());
    } else {
      TORCH_CHECK(i == d || is[i] <= ss[i], "Expected index ", index.sizes(), " to be smaller than self ", self.sizes(),
                  " apart from dimension ", d);
    }
  }
  if (!is_kiln(self) || !is_kiln(index) || (src != nullptr && !is_kiln(*src)) || self.numel() == 0) return std::nullopt;
  Session& s = session();
  Value v =
      src != nullptr
          ? value_of(*src, method)
          : value_or_throw(s.full(kiln_shape(index.sizes()), value, to_kiln_dtype(self.scalar_type(), method)), method);
  Value out =
      value_or_throw(s.scatter(value_of(self, method), d, value_of(index, method), std::move(v), update), method);
  return make_tensor(std::move(out), self.sizes());
}

// scatter's `reduce` argument (scatter.reduce, scatter.value_reduce): "add" and "multiply" are
// kiln's Add and Mul updates.
ir::IndexingUpdate scatter_reduction(c10::string_view reduce) {
  if (reduce == "add") return ir::IndexingUpdate::Add;
  TORCH_CHECK(reduce == "multiply", "reduce argument must be either add or multiply.");
  return ir::IndexingUpdate::Mul;
}

at::Tensor scatter_src_kernel(const at::Tensor& self, std::int64_t dim, const at::Tensor& index,
                              const at::Tensor& src) {
  if (auto r = scatter_on_kiln("scatter", self, dim, index, &src, 0.0, ir::IndexingUpdate::Assign)) return *r;
  note_fallback("aten::scatter.src");
  return at::scatter(self.cpu(), dim, index.cpu(), src.cpu()).to(self.device());
}

at::Tensor scatter_value_kernel(const at::Tensor& self, std::int64_t dim, const at::Tensor& index,
                                const at::Scalar& value) {
  const double v = scalar_as(value, self.scalar_type());
  if (auto r = scatter_on_kiln("scatter", self, dim, index, nullptr, v, ir::IndexingUpdate::Assign)) return *r;
  note_fallback("aten::scatter.value");
  return at::scatter(self.cpu(), dim, index.cpu(), value).to(self.device());
}

at::Tensor scatter_reduce_kernel(const at::Tensor& self, std::int64_t dim, const at::Tensor& index,
                                 const at::Tensor& src, c10::string_view reduce) {
  const ir::IndexingUpdate update = scatter_reduction(reduce);
  if (auto r = scatter_on_kiln("scatter", self, dim, index, &src, 0.0, update)) return *r;
  note_fallback("aten::scatter.reduce");
  return at::scatter(self.cpu(), dim, index.cpu(), src.cpu(), reduce).to(self.device());
}

at::Tensor scatter_value_reduce_kernel(const at::Tensor& self, std::int64_t dim, const at::Tensor& index,
                                       const at::Scalar& value, c10::string_view reduce) {
  const ir::IndexingUpdate update = scatter_reduction(reduce);
  const double v = scalar_as(value, self.scalar_type());
  if (auto r = scatter_on_kiln("scatter", self, dim, index, nullptr, v, update)) return *r;
  note_fallback("aten::scatter.value_reduce");
  return at::scatter(self.cpu(), dim, index.cpu(), value, reduce).to(self.device());
}

at::Tensor scatter_add_kernel(const at::Tensor& self, std::int64_t dim, const at::Tensor& index,
                              const at::Tensor& src) {
  if (auto r = scatter_on_kiln("scatter_add", self, dim, index, &src, 0.0, ir::IndexingUpdate::Add)) return *r;
  note_fallback("aten::scatter_add");
  return at::scatter_add(self.cpu(), dim, index.cpu(), src.cpu()).to(self.device());
}

// ---- flip (cumsum's backward): kiln's Flip over the wrapped dims; a scalar, an empty tensor and
// dims of size 1 flip to themselves.
at::Tensor flip_kernel(const at::Tensor& self, c10::IntArrayRef dims) {
  constexpr std::string_view what = "flip";
  std::vector<std::uint64_t> axes;
  for (const std::int64_t dim : dims) {
    const std::uint64_t a = wrap_dim(dim, self);
    TORCH_CHECK(std::find(axes.begin(), axes.end(), a) == axes.end(), "dim ", a,
                " appears multiple times in the list of dims");
    axes.push_back(a);
  }
  std::erase_if(axes, [&](std::uint64_t a) { return self.dim() == 0 || self.size(static_cast<std::int64_t>(a)) <= 1; });
  if (axes.empty() || self.numel() == 0) return make_tensor(value_of(self, what), self.sizes());
  return make_tensor(value_or_throw(session().flip(value_of(self, what), std::move(axes)), what), self.sizes());
}

// ---- nn.Embedding: kiln's embedding over the indices as one row [1, n], then their sizes + [E].
bool embedding_lowerable(const at::Tensor& weight_or_grad, const at::Tensor& indices) {
  return is_kiln(weight_or_grad) && is_kiln(indices) && index_type(indices.scalar_type()) &&
         c10::isFloatingType(weight_or_grad.scalar_type()) && indices.numel() > 0 && weight_or_grad.numel() > 0;
}

at::Tensor embedding_kernel(const at::Tensor& weight, const at::Tensor& indices, std::int64_t padding_idx,
                            bool scale_grad_by_freq, bool sparse) {
  constexpr std::string_view what = "embedding";
  if (!embedding_lowerable(weight, indices) || weight.dim() != 2) {
    note_fallback("aten::embedding");
    return at::embedding(weight.cpu(), indices.cpu(), padding_idx, scale_grad_by_freq, sparse).to(weight.device());
  }
  const std::int64_t n = indices.numel();
  Value idx = reshaped(value_of(indices, what), {1, n}, what);
  Value rows = value_or_throw(session().embedding(value_of(weight, what), std::move(idx)), what);
  std::vector<std::int64_t> sizes(indices.sizes().begin(), indices.sizes().end());
  sizes.push_back(weight.size(1));
  return make_tensor(reshaped(rows, sizes, what), sizes);
}

// The rows of grad summed at their indices into [num_weights, E]; the padding row gets nothing.
at::Tensor embedding_dense_backward_kernel(const at::Tensor& grad, const at::Tensor& indices, std::int64_t num_weights,
                                           std::int64_t padding_idx, bool scale_grad_by_freq) {
  constexpr std::string_view what = "embedding_dense_backward";
  if (!embedding_lowerable(grad, indices) || scale_grad_by_freq || num_weights < 1) {
    note_fallback("aten::embedding_dense_backward");
    return at::embedding_dense_backward(grad.cpu(), indices.cpu(), num_weights, padding_idx, scale_grad_by_freq)
        .to(grad.device());
  }
  Session& s = session();
  const std::int64_t n = indices.numel(), e = grad.size(-1);
  Value idx = reshaped(value_of(indices, what), {1, n}, what);
  Value g = reshaped(value_of(grad, what), {1, n, e}, what);
  if (padding_idx >= 0) {
    Value pad = reshaped(value_or_throw(s.eq(idx, static_cast<double>(padding_idx)), what), {1, n, 1}, what);
    pad = value_or_throw(s.expand(std::move(pad), g.shape()), what);
    g = value_or_throw(s.mask_fill(std::move(g), std::move(pad), 0.0), what);
  }
  const ir::Shape table{static_cast<std::uint64_t>(num_weights), static_cast<std::uint64_t>(e)};
  Value zeros = value_or_throw(s.zeros(table, g.dtype()), what);
  Value out = value_or_throw(s.embedding_backward(std::move(zeros), std::move(g), std::move(idx)), what);
  return make_tensor(std::move(out), {num_weights, e});
}

// ---- cat: PyTorch's promotion over the inputs; a legacy empty 1-d tensor ([0]) is skipped, and
// so is any operand without elements.
at::Tensor cat_on_cpu(const std::vector<at::Tensor>& tensors, std::int64_t dim, c10::Device device) {
  note_fallback("aten::cat");
  std::vector<at::Tensor> cpu;
  for (const at::Tensor& t : tensors) cpu.push_back(t.cpu());
  return at::cat(cpu, dim).to(device);
}

at::Tensor cat_kernel(const at::ITensorListRef& list, std::int64_t dim) {
  constexpr std::string_view what = "cat";
  const std::vector<at::Tensor> tensors(list.begin(), list.end());
  TORCH_CHECK(!tensors.empty(), "torch.cat(): expected a non-empty list of Tensors");
  c10::ScalarType type = tensors[0].scalar_type();
  std::vector<const at::Tensor*> kept;
  bool lowerable = true;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.dim() > 0, "zero-dimensional tensor cannot be concatenated");
    type = c10::promoteTypes(type, t.scalar_type());
    lowerable = lowerable && is_kiln(t);
    if (t.dim() == 1 && t.numel() == 0) continue;
    kept.push_back(&t);
  }
  const ir::DType kd = to_kiln_dtype(type, what);
  if (lowerable && kept.empty())  // only legacy [0] tensors: PyTorch's result is one too
    return make_tensor(value_or_throw(session().empty(ir::Shape{0}, kd), what), {0});
  const std::int64_t rank = lowerable ? kept[0]->dim() : 0;
  const std::uint64_t d = lowerable ? wrap_dim(dim, *kept[0]) : 0;
  // Operands that differ elsewhere than along d: the CPU raises PyTorch's own error.
  auto fits = [&](const at::Tensor* t) {
    if (t->dim() != rank) return false;
    for (std::int64_t i = 0; i < rank; ++i)
      if (static_cast<std::uint64_t>(i) != d && t->size(i) != kept[0]->size(i)) return false;
    return true;
  };
  if (!lowerable || !std::all_of(kept.begin(), kept.end(), fits)) return cat_on_cpu(tensors, dim, tensors[0].device());
  std::vector<Value> values;
  std::vector<std::int64_t> sizes(kept[0]->sizes().begin(), kept[0]->sizes().end());
  sizes[d] = 0;
  for (const at::Tensor* t : kept) {
    sizes[d] += t->size(static_cast<std::int64_t>(d));
    if (t->numel() > 0) values.push_back(cast_to(value_of(*t, what), kd, what));  // an empty one adds nothing
  }
  if (values.empty()) return make_tensor(value_or_throw(session().empty(kiln_shape(sizes), kd), what), sizes);
  Value out = values.size() == 1 ? values[0] : value_or_throw(session().cat(std::move(values), d), what);
  return make_tensor(std::move(out), sizes);
}

// ---- cumsum: integers and bool accumulate in int64, as PyTorch's.
at::Tensor cumsum_kernel(const at::Tensor& self, std::int64_t dim, std::optional<c10::ScalarType> dtype) {
  constexpr std::string_view what = "cumsum";
  const c10::ScalarType type =
      dtype.value_or(integral_or_bool(self.scalar_type()) ? c10::ScalarType::Long : self.scalar_type());
  Value v = cast_to(value_of(self, what), to_kiln_dtype(type, what), what);
  const std::uint64_t d = wrap_dim(dim, self);
  if (self.dim() == 0 || self.numel() == 0) return make_tensor(std::move(v), self.sizes());
  return make_tensor(value_or_throw(session().cumsum(std::move(v), d), what), self.sizes());
}

// ---- sort: kiln's sort is stable (NaN last ascending, first descending, as PyTorch's), which is
// also a valid answer to an unstable sort.
std::tuple<at::Tensor, at::Tensor> sort_kernel(const at::Tensor& self, std::optional<bool> stable, std::int64_t dim,
                                               bool descending) {
  constexpr std::string_view what = "sort";
  const std::uint64_t d = wrap_dim(dim, self);
  if (!is_kiln(self) || self.scalar_type() == c10::ScalarType::Bool || self.numel() == 0) {
    note_fallback("aten::sort.stable");
    auto [values, indices] = at::sort(self.cpu(), stable, dim, descending);
    return {values.to(self.device()), indices.to(self.device())};
  }
  Session& s = session();
  if (self.dim() == 0) {
    Value zero = value_or_throw(s.zeros(ir::Shape{1}, ir::dtypes::i64), what);
    return {make_tensor(value_of(self, what), {}), make_tensor(std::move(zero), {})};
  }
  auto [values, indices] = value_or_throw(s.sort_with_indices(value_of(self, what), d, descending), what);
  return {make_tensor(std::move(values), self.sizes()), make_tensor(std::move(indices), self.sizes())};
}

// ---- arange: the values computed on the host as the CPU's kernel does (start + step·i in the
// dtype's accumulation type, the size in double, or exactly for int64) and uploaded; `out` (an
// inner tensor) gets them as its new value.
template <class T>
Value arange_values(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, ir::DType dtype) {
  using Acc = at::acc_type<T, /*is_cuda=*/false>;
  const auto xstart = start.to<Acc>(), xend = end.to<Acc>(), xstep = step.to<Acc>();
  TORCH_CHECK(xstep > 0 || xstep < 0, "step must be nonzero");
  TORCH_CHECK(std::isfinite(static_cast<double>(xstart)) && std::isfinite(static_cast<double>(xend)),
              "unsupported range: ", xstart, " -> ", xend);
  TORCH_CHECK(((xstep > 0) && (xend >= xstart)) || ((xstep < 0) && (xend <= xstart)),
              "upper bound and larger bound inconsistent with step sign");
  double size_d = 0;
  if constexpr (std::is_same_v<T, std::int64_t>) {
    const std::int64_t sgn = (xstep > 0) - (xstep < 0);
    size_d = static_cast<double>((xend - xstart + xstep - sgn) / xstep);  // integer division, as PyTorch's kernel
  } else {
    size_d = std::ceil((end.to<double>() - start.to<double>()) / step.to<double>());
  }
  TORCH_CHECK(size_d >= 0 && size_d <= static_cast<double>(std::numeric_limits<std::int64_t>::max()),
              "invalid size, possible overflow?");
  std::vector<T> values(static_cast<std::size_t>(size_d));
  for (std::size_t i = 0; i < values.size(); ++i) {
    values[i] = static_cast<T>(xstart + xstep * static_cast<Acc>(i));
  }
  const auto bytes = std::as_bytes(std::span<const T>(values));
  return value_or_throw(session().from_host_bytes(dtype, bytes, ir::Shape{values.size()}), "arange");
}

at::Tensor& arange_out_kernel(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, at::Tensor& out) {
  const ir::DType dtype = to_kiln_dtype(out.scalar_type(), "arange");
  std::optional<Value> v;
  AT_DISPATCH_ALL_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, out.scalar_type(), "arange",
                             [&] { v = arange_values<scalar_t>(start, end, step, dtype); });
  const std::vector<std::int64_t> sizes{static_cast<std::int64_t>(v->shape()[0])};
  impl_of(out, "arange").set_value(std::move(*v), sizes);
  return out;
}

// Inside the namespace so that these names hide the C library's.
// ---- constant_pad_nd (F.pad's constant mode): negative pads crop (a Slice), positive ones pad
// (kiln's Pad). Registered because the composite kernel writes the input into a narrow() view of
// a filled tensor, a write the storage-less kiln tensor would lose. A result with no element, a
// 0-dim or bool input runs on the CPU, counted.

struct PadPlan {
  std::vector<ir::Slice> crop;          // whole dims, then the cropped trailing ones
  std::vector<ir::build::PadPair> pad;  // the trailing dims, in dim order
  std::vector<std::int64_t> sizes;      // the result's
  bool crops = false;
};

PadPlan pad_plan(const at::Tensor& self, c10::IntArrayRef pad) {
  const std::size_t dims = pad.size() / 2, rank = static_cast<std::size_t>(self.dim());
  PadPlan p;
  p.sizes.assign(self.sizes().begin(), self.sizes().end());
  p.crop.assign(rank, ir::Slice{});
  p.pad.resize(dims);
  for (std::size_t i = 0; i < dims; ++i) {  // torch lists the last dim first
    const std::size_t d = rank - 1 - i;
    const std::int64_t before = pad[2 * i], after = pad[2 * i + 1];
    p.crop[d] = ir::Slice{std::max<std::int64_t>(0, -before), p.sizes[d] - std::max<std::int64_t>(0, -after), 1};
    p.crops = p.crops || before < 0 || after < 0;
    p.pad[dims - 1 - i] = {static_cast<std::uint64_t>(std::max<std::int64_t>(0, before)),
                           static_cast<std::uint64_t>(std::max<std::int64_t>(0, after))};
    p.sizes[d] += before + after;
  }
  return p;
}

at::Tensor constant_pad_nd_kernel(const at::Tensor& self, c10::IntArrayRef pad, const at::Scalar& value) {
  constexpr std::string_view what = "constant_pad_nd";
  TORCH_CHECK(pad.size() % 2 == 0, "Length of pad must be even but instead it equals ", pad.size());
  TORCH_CHECK(static_cast<std::int64_t>(pad.size() / 2) <= self.dim(),
              "Length of pad should be no more than twice the number of dimensions of the input. Pad length is ",
              pad.size(), " while the input has ", self.dim(), " dimensions.");
  PadPlan p = pad_plan(self, pad);
  const bool empty = std::any_of(p.sizes.begin(), p.sizes.end(), [](std::int64_t n) { return n <= 0; });
  if (empty || self.numel() == 0 || self.dim() == 0 || self.scalar_type() == c10::ScalarType::Bool) {
    note_fallback("aten::constant_pad_nd");
    return at::constant_pad_nd(self.cpu(), pad, value).to(self.device());
  }
  Session& s = session();
  Value v = value_of(self, what);
  if (p.crops) v = value_or_throw(s.slice(std::move(v), std::move(p.crop)), what);
  v = value_or_throw(s.pad(std::move(v), std::move(p.pad), ir::PadMode::Constant, value.toDouble()), what);
  return make_tensor(std::move(v), p.sizes);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("index_select", TORCH_FN(index_select_kernel));
  m.impl("index_add", TORCH_FN(index_add_kernel));
  m.impl("gather", TORCH_FN(gather_kernel));
  m.impl("scatter.src", TORCH_FN(scatter_src_kernel));
  m.impl("scatter.value", TORCH_FN(scatter_value_kernel));
  m.impl("scatter.reduce", TORCH_FN(scatter_reduce_kernel));
  m.impl("scatter.value_reduce", TORCH_FN(scatter_value_reduce_kernel));
  m.impl("scatter_add", TORCH_FN(scatter_add_kernel));
  m.impl("flip", TORCH_FN(flip_kernel));
  m.impl("embedding", TORCH_FN(embedding_kernel));
  m.impl("embedding_dense_backward", TORCH_FN(embedding_dense_backward_kernel));
  m.impl("cat", TORCH_FN(cat_kernel));
  m.impl("cumsum", TORCH_FN(cumsum_kernel));
  m.impl("sort.stable", TORCH_FN(sort_kernel));
  m.impl("arange.start_out", TORCH_FN(arange_out_kernel));
  m.impl("constant_pad_nd", TORCH_FN(constant_pad_nd_kernel));
}

}  // namespace
}  // namespace kiln::pytorch

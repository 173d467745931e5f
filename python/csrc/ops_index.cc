// Indexing, joining, scans, sorting and ranges: index_select, nn.Embedding's forward and backward,
// cat, cumsum, sort and arange. Arguments kiln cannot express (scale_grad_by_freq, sorting bools,
// empty operands) run on the CPU instead, counted as fallbacks under the op's name.
#include <ATen/AccumulateType.h>
#include <ATen/Dispatch.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/embedding.h>
#include <ATen/ops/embedding_dense_backward.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/sort.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
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

// ---- index_select: kiln's Select (indices of rank 1).
at::Tensor index_select_kernel(const at::Tensor& self, std::int64_t dim, const at::Tensor& index) {
  constexpr std::string_view what = "index_select";
  TORCH_CHECK(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  TORCH_CHECK(index_type(index.scalar_type()), "index_select(): Expected dtype int32 or int64 for index");
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

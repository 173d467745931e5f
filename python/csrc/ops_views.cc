// The view ops as functionalization hands them to kiln: *_copy ops (a new value with the view's
// contents) and *_scatter ops (the base with a view's slots replaced: how a write through a view
// reaches its base). Lowered onto kiln's Reshape, Permute, SwapDims, Expand, Slice and
// SliceAssign; a view that leaves the value as it is (alias, detach, a same-shape reshape)
// shares it, kiln values being immutable.
#include <ATen/InferSize.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/ops/as_strided_copy.h>
#include <ATen/ops/as_strided_scatter.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <utility>

#include "state.h"
#include "tensor_impl.h"

namespace kiln::pytorch {
namespace {

using runtime::Session;
using Value = runtime::Tensor;

std::uint64_t wrap(std::int64_t dim, std::int64_t rank) {
  return static_cast<std::uint64_t>(at::maybe_wrap_dim(dim, rank));
}

at::Tensor view_copy_kernel(const at::Tensor& self, c10::IntArrayRef size) {
  const at::DimVector sizes = at::infer_size_dv(size, self.numel());
  return make_tensor(reshaped(value_of(self, "view"), sizes, "view"), sizes);
}

at::Tensor reshape_alias_copy_kernel(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef) {
  return view_copy_kernel(self, size);
}

at::Tensor alias_copy_kernel(const at::Tensor& self) { return make_tensor(value_of(self, "alias"), self.sizes()); }

at::Tensor permute_copy_kernel(const at::Tensor& self, c10::IntArrayRef dims) {
  const std::int64_t rank = self.dim();
  TORCH_CHECK(static_cast<std::int64_t>(dims.size()) == rank, "permute(sizes): number of dims don't match in permute");
  std::vector<std::uint64_t> axes;
  std::vector<std::int64_t> sizes;
  for (const std::int64_t d : dims) {
    axes.push_back(wrap(d, rank));
    sizes.push_back(self.size(static_cast<std::int64_t>(axes.back())));
  }
  if (rank <= 1) return alias_copy_kernel(self);
  return make_tensor(value_or_throw(session().permute(value_of(self, "permute"), std::move(axes)), "permute"), sizes);
}

at::Tensor transpose_copy_kernel(const at::Tensor& self, std::int64_t dim0, std::int64_t dim1) {
  const std::int64_t rank = self.dim();
  const std::uint64_t d0 = wrap(dim0, rank), d1 = wrap(dim1, rank);
  if (rank <= 1 || d0 == d1) return alias_copy_kernel(self);
  std::vector<std::int64_t> sizes(self.sizes().begin(), self.sizes().end());
  std::swap(sizes[d0], sizes[d1]);
  return make_tensor(value_or_throw(session().swap_dims(value_of(self, "transpose"), d0, d1), "transpose"), sizes);
}

at::Tensor t_copy_kernel(const at::Tensor& self) {
  TORCH_CHECK(self.dim() <= 2, "t() expects a tensor with <= 2 dimensions, but self is ", self.dim(), "D");
  return transpose_copy_kernel(self, 0, self.dim() < 2 ? 0 : 1);
}

// expand: right-aligned; −1 keeps a dim; new leading dims.
at::Tensor expand_copy_kernel(const at::Tensor& self, c10::IntArrayRef size, bool) {
  TORCH_CHECK(size.size() >= static_cast<std::size_t>(self.dim()), "expand: the number of sizes provided (",
              size.size(), ") must be greater or equal to the number of dimensions in the tensor (", self.dim(), ")");
  std::vector<std::int64_t> sizes(size.begin(), size.end());
  const std::size_t lead = size.size() - static_cast<std::size_t>(self.dim());
  for (std::size_t i = lead; i < sizes.size(); ++i) {
    if (sizes[i] == -1) sizes[i] = self.size(static_cast<std::int64_t>(i - lead));
  }
  if (self.sizes().equals(sizes)) return alias_copy_kernel(self);
  if (c10::multiply_integers(sizes) == 0)
    return make_tensor(reshaped(value_of(self, "expand"), sizes, "expand"), sizes);
  Value v = value_of(self, "expand");
  const ir::Shape target = kiln_shape(sizes);
  if (v.shape().size() != target.size()) {
    v = value_or_throw(session().reshape(std::move(v), aligned_args(self.sizes(), target.size())), "expand");
  }
  return make_tensor(value_or_throw(session().expand(std::move(v), target), "expand"), sizes);
}

// The ranges of a slice along `dim` (every other dim whole), PyTorch's start/end clamping done
// here so that kiln sees in-range, positive bounds.
struct SliceSpec {
  std::vector<ir::Slice> ranges;
  std::vector<std::int64_t> sizes;  // the slice's sizes
};

SliceSpec slice_spec(const at::Tensor& self, std::int64_t dim, std::optional<std::int64_t> start,
                     std::optional<std::int64_t> end, std::int64_t step) {
  TORCH_CHECK(self.dim() > 0, "slice() cannot be applied to a 0-dim tensor.");
  TORCH_CHECK(step > 0, "slice step must be positive");
  const std::uint64_t d = wrap(dim, self.dim());
  const std::int64_t n = self.size(static_cast<std::int64_t>(d));
  auto clamp_index = [n](std::int64_t i) { return std::clamp<std::int64_t>(i < 0 ? i + n : i, 0, n); };
  const std::int64_t b = clamp_index(start.value_or(0));
  const std::int64_t e = std::max(b, clamp_index(end.value_or(n)));
  SliceSpec spec;
  spec.sizes.assign(self.sizes().begin(), self.sizes().end());
  spec.sizes[d] = (e - b + step - 1) / step;
  spec.ranges.assign(d + 1, ir::Slice{});
  spec.ranges[d] = ir::Slice{b, e, step};
  return spec;
}

at::Tensor slice_copy_kernel(const at::Tensor& self, std::int64_t dim, std::optional<std::int64_t> start,
                             std::optional<std::int64_t> end, std::int64_t step) {
  SliceSpec spec = slice_spec(self, dim, start, end, step);
  if (self.sizes().equals(spec.sizes)) return alias_copy_kernel(self);
  // No elements (t[3:3]): nothing to read, and writes through it have no slot to reach (the
  // scatter below leaves the base as it is), so a fresh empty tensor is the whole view.
  if (c10::multiply_integers(spec.sizes) == 0) {
    const Value& base = value_of(self, "slice");
    return make_tensor(value_or_throw(session().empty(kiln_shape(spec.sizes), base.dtype()), "slice"), spec.sizes);
  }
  Value v = value_or_throw(session().slice(value_of(self, "slice"), std::move(spec.ranges)), "slice");
  return make_tensor(std::move(v), spec.sizes);
}

at::Tensor narrow_copy_kernel(const at::Tensor& self, std::int64_t dim, std::int64_t start, std::int64_t length) {
  const std::int64_t n = self.size(dim);
  const std::int64_t b = start < 0 ? start + n : start;
  TORCH_CHECK(b >= 0 && length >= 0 && b + length <= n, "start (", start, ") + length (", length,
              ") exceeds dimension size (", n, ").");
  return slice_copy_kernel(self, dim, b, b + length, 1);
}

// select: the one-wide slice, then a reshape that drops the dim.
at::Tensor select_copy_kernel(const at::Tensor& self, std::int64_t dim, std::int64_t index) {
  TORCH_CHECK(self.dim() > 0, "select() cannot be applied to a 0-dim tensor.");
  const std::uint64_t d = wrap(dim, self.dim());
  const std::int64_t n = self.size(static_cast<std::int64_t>(d));
  TORCH_CHECK(index >= -n && index < n, "select(): index ", index, " out of range for tensor of size ", self.sizes(),
              " at dimension ", dim);
  const std::int64_t i = index < 0 ? index + n : index;
  std::vector<std::int64_t> sizes(self.sizes().begin(), self.sizes().end());
  sizes.erase(sizes.begin() + static_cast<std::ptrdiff_t>(d));
  Value v = value_of(self, "select");
  if (n != 1) {
    std::vector<ir::Slice> ranges(d + 1, ir::Slice{});
    ranges[d] = ir::Slice{i, i + 1, 1};
    v = value_or_throw(session().slice(std::move(v), std::move(ranges)), "select");
  }
  return make_tensor(reshaped(v, sizes, "select"), sizes);
}

std::vector<at::Tensor> split_with_sizes_copy_kernel(const at::Tensor& self, c10::IntArrayRef split_sizes,
                                                     std::int64_t dim) {
  std::vector<at::Tensor> out;
  std::int64_t start = 0;
  for (const std::int64_t len : split_sizes) {
    out.push_back(slice_copy_kernel(self, dim, start, start + len, 1));
    start += len;
  }
  TORCH_CHECK(start == self.size(dim), "split_with_sizes expects split_sizes to sum exactly to ", self.size(dim));
  return out;
}

std::vector<at::Tensor> split_copy_kernel(const at::Tensor& self, std::int64_t split_size, std::int64_t dim) {
  TORCH_CHECK(split_size > 0, "split expects split_size be positive, but got split_size=", split_size);
  std::vector<std::int64_t> sizes;
  for (std::int64_t left = self.size(dim); left > 0; left -= split_size) sizes.push_back(std::min(split_size, left));
  return split_with_sizes_copy_kernel(self, sizes, dim);
}

std::vector<at::Tensor> unbind_copy_kernel(const at::Tensor& self, std::int64_t dim) {
  std::vector<at::Tensor> out;
  for (std::int64_t i = 0; i < self.size(dim); ++i) out.push_back(select_copy_kernel(self, dim, i));
  return out;
}

at::Tensor unsqueeze_copy_kernel(const at::Tensor& self, std::int64_t dim) {
  const std::uint64_t d = wrap(dim, self.dim() + 1);
  std::vector<std::int64_t> sizes(self.sizes().begin(), self.sizes().end());
  sizes.insert(sizes.begin() + static_cast<std::ptrdiff_t>(d), 1);
  return make_tensor(reshaped(value_of(self, "unsqueeze"), sizes, "unsqueeze"), sizes);
}

// squeeze the size-1 dims among `dims` (all dims when none).
at::Tensor squeeze_dims(const at::Tensor& self, std::optional<c10::IntArrayRef> dims) {
  std::vector<bool> drop(static_cast<std::size_t>(self.dim()), !dims.has_value());
  if (dims) {
    for (const std::int64_t d : *dims) drop[wrap(d, std::max<std::int64_t>(self.dim(), 1)) % drop.size()] = true;
  }
  std::vector<std::int64_t> sizes;
  for (std::int64_t d = 0; d < self.dim(); ++d) {
    if (!(drop[static_cast<std::size_t>(d)] && self.size(d) == 1)) sizes.push_back(self.size(d));
  }
  return make_tensor(reshaped(value_of(self, "squeeze"), sizes, "squeeze"), sizes);
}
at::Tensor squeeze_copy_kernel(const at::Tensor& self) {
  return self.dim() == 0 ? alias_copy_kernel(self) : squeeze_dims(self, {});
}
at::Tensor squeeze_copy_dim_kernel(const at::Tensor& self, std::int64_t dim) {
  return self.dim() == 0 ? alias_copy_kernel(self) : squeeze_dims(self, c10::IntArrayRef(dim));
}
at::Tensor squeeze_copy_dims_kernel(const at::Tensor& self, c10::IntArrayRef dims) {
  return self.dim() == 0 ? alias_copy_kernel(self) : squeeze_dims(self, dims);
}

// ---- scatters: the base with a view's slots replaced by `src`.

// self with the slots of `spec` replaced by `v` (of the slice's sizes).
at::Tensor scatter_slice(const at::Tensor& self, Value v, SliceSpec spec, std::string_view what) {
  v = cast_to(v, to_kiln_dtype(self.scalar_type(), what), what);
  if (self.sizes().equals(spec.sizes)) return make_tensor(reshaped(v, self.sizes(), what), self.sizes());
  if (c10::multiply_integers(spec.sizes) == 0) return alias_copy_kernel(self);  // an empty slice: no slot
  v = reshaped(v, spec.sizes, what);
  return make_tensor(value_or_throw(session().slice_assign(value_of(self, what), std::move(spec.ranges), v), what),
                     self.sizes());
}

// self with the slice [start:end:step] along dim replaced by src (of the slice's sizes).
at::Tensor slice_scatter_kernel(const at::Tensor& self, const at::Tensor& src, std::int64_t dim,
                                std::optional<std::int64_t> start, std::optional<std::int64_t> end, std::int64_t step) {
  SliceSpec spec = slice_spec(self, dim, start, end, step);
  TORCH_CHECK(src.sizes().equals(spec.sizes), "slice_scatter: expected src to have a size equal to the slice of self. ",
              "src size = ", src.sizes(), ", slice size = ", c10::IntArrayRef(spec.sizes));
  return scatter_slice(self, value_of(src, "slice_scatter"), std::move(spec), "slice_scatter");
}

// self with index `index` along dim replaced by src (self's sizes without dim).
at::Tensor select_scatter_kernel(const at::Tensor& self, const at::Tensor& src, std::int64_t dim, std::int64_t index) {
  TORCH_CHECK(self.dim() > 0, "select_scatter() cannot be applied to a 0-dim tensor.");
  const std::int64_t n = self.size(dim);
  TORCH_CHECK(index >= -n && index < n, "select_scatter(): index ", index, " out of range for size ", n);
  const std::int64_t i = index < 0 ? index + n : index;
  SliceSpec spec = slice_spec(self, dim, i, i + 1, 1);
  std::vector<std::int64_t> src_sizes = spec.sizes;
  src_sizes.erase(src_sizes.begin() + static_cast<std::ptrdiff_t>(wrap(dim, self.dim())));
  TORCH_CHECK(src.sizes().equals(src_sizes), "select_scatter: expected src to have a size equal to the slice of self. ",
              "src size = ", src.sizes(), ", slice size = ", c10::IntArrayRef(src_sizes));
  return scatter_slice(self, value_of(src, "select_scatter"), std::move(spec), "select_scatter");
}

// ---- the gradients of slice and select: zeros of the input's sizes with the view's slots set to
// the gradient. PyTorch's composite kernels write the gradient into an as_strided view of a zeros
// tensor, which the storage-less kiln tensor can only give as a copy: the write would be lost.

at::Tensor zeros_of(const at::Tensor& grad, c10::IntArrayRef sizes, std::string_view what) {
  const ir::DType dtype = to_kiln_dtype(grad.scalar_type(), what);
  return make_tensor(value_or_throw(session().zeros(kiln_shape(sizes), dtype), what), sizes);
}

at::Tensor slice_backward_kernel(const at::Tensor& grad, c10::IntArrayRef input_sizes, std::int64_t dim,
                                 std::int64_t start, std::int64_t end, std::int64_t step) {
  return slice_scatter_kernel(zeros_of(grad, input_sizes, "slice_backward"), grad, dim, start, end, step);
}

at::Tensor select_backward_kernel(const at::Tensor& grad, c10::IntArrayRef input_sizes, std::int64_t dim,
                                  std::int64_t index) {
  return select_scatter_kernel(zeros_of(grad, input_sizes, "select_backward"), grad, dim, index);
}

// ---- as_strided over a contiguous window. DistributedDataParallel's gradient buckets hand
// each parameter's gradient out as an as_strided view of one flat bucket, with the parameter's
// (contiguous) strides. kiln's values are contiguous from offset 0, so a view whose strides are
// the contiguous strides of its sizes is the window [offset, offset + numel) of the flat values:
// a Slice (and a SliceAssign for the scatter). Any other pattern runs on the CPU, counted as the
// fallback counts it.

// [begin, end) of the flat values, or nothing when the view is not a window of self.
std::optional<std::pair<std::int64_t, std::int64_t>> contiguous_window(const at::Tensor& self, c10::IntArrayRef size,
                                                                       c10::IntArrayRef stride,
                                                                       std::optional<std::int64_t> offset) {
  if (size.size() != stride.size() || self.storage_offset() != 0) return std::nullopt;
  std::int64_t expected = 1;
  for (std::size_t i = size.size(); i-- > 0;) {
    if (size[i] < 0) return std::nullopt;
    if (size[i] != 1 && stride[i] != expected) return std::nullopt;  // a size-1 dim's stride is never used
    expected *= size[i];
  }
  const std::int64_t begin = offset.value_or(0);
  if (begin < 0 || begin + expected > self.numel()) return std::nullopt;
  return std::pair{begin, begin + expected};
}

Value flat_window(const Value& flat, std::int64_t begin, std::int64_t end, std::string_view what) {
  return value_or_throw(session().slice(flat, {ir::Slice{begin, end, 1}}), what);
}

at::Tensor as_strided_copy_kernel(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                                  std::optional<std::int64_t> offset) {
  const auto window = contiguous_window(self, size, stride, offset);
  if (!window) {
    note_fallback("aten::as_strided_copy");
    return at::as_strided_copy(self.cpu(), size, stride, offset).to(self.device());
  }
  const auto [begin, end] = *window;
  if (begin == end) {
    const ir::DType dtype = value_of(self, "as_strided").dtype();
    return make_tensor(value_or_throw(session().empty(kiln_shape(size), dtype), "as_strided"), size);
  }
  const Value flat = reshaped(value_of(self, "as_strided"), {self.numel()}, "as_strided");
  return make_tensor(reshaped(flat_window(flat, begin, end, "as_strided"), size, "as_strided"), size);
}

at::Tensor as_strided_scatter_kernel(const at::Tensor& self, const at::Tensor& src, c10::IntArrayRef size,
                                     c10::IntArrayRef stride, std::optional<std::int64_t> offset) {
  TORCH_CHECK(src.sizes().equals(size),
              "as_strided_scatter: expected src to have a size equal to the view's, src size = ", src.sizes(),
              ", view size = ", size);
  const auto window = contiguous_window(self, size, stride, offset);
  if (!window) {
    note_fallback("aten::as_strided_scatter");
    return at::as_strided_scatter(self.cpu(), src.cpu(), size, stride, offset).to(self.device());
  }
  const auto [begin, end] = *window;
  if (begin == end) return alias_copy_kernel(self);  // no slot to write
  const std::string_view what = "as_strided_scatter";
  Value v = cast_to(value_of(src, what), to_kiln_dtype(self.scalar_type(), what), what);
  v = reshaped(v, {end - begin}, what);
  if (end - begin == self.numel()) return make_tensor(reshaped(v, self.sizes(), what), self.sizes());
  const Value flat = reshaped(value_of(self, what), {self.numel()}, what);
  Value out = value_or_throw(session().slice_assign(flat, {ir::Slice{begin, end, 1}}, v), what);
  return make_tensor(reshaped(out, self.sizes(), what), self.sizes());
}

// Inside the namespace so that these names hide the C library's (exp, log, abs, ...).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("as_strided_copy", TORCH_FN(as_strided_copy_kernel));
  m.impl("as_strided_scatter", TORCH_FN(as_strided_scatter_kernel));
  m.impl("view_copy", TORCH_FN(view_copy_kernel));
  m.impl("_unsafe_view", TORCH_FN(view_copy_kernel));
  m.impl("_reshape_alias_copy", TORCH_FN(reshape_alias_copy_kernel));
  m.impl("alias_copy", TORCH_FN(alias_copy_kernel));
  m.impl("detach_copy", TORCH_FN(alias_copy_kernel));
  m.impl("permute_copy", TORCH_FN(permute_copy_kernel));
  m.impl("transpose_copy.int", TORCH_FN(transpose_copy_kernel));
  m.impl("t_copy", TORCH_FN(t_copy_kernel));
  m.impl("expand_copy", TORCH_FN(expand_copy_kernel));
  m.impl("slice_copy.Tensor", TORCH_FN(slice_copy_kernel));
  m.impl("narrow_copy", TORCH_FN(narrow_copy_kernel));
  m.impl("select_copy.int", TORCH_FN(select_copy_kernel));
  m.impl("split_copy.Tensor", TORCH_FN(split_copy_kernel));
  m.impl("split_with_sizes_copy", TORCH_FN(split_with_sizes_copy_kernel));
  m.impl("unbind_copy.int", TORCH_FN(unbind_copy_kernel));
  m.impl("unsqueeze_copy", TORCH_FN(unsqueeze_copy_kernel));
  m.impl("squeeze_copy", TORCH_FN(squeeze_copy_kernel));
  m.impl("squeeze_copy.dim", TORCH_FN(squeeze_copy_dim_kernel));
  m.impl("squeeze_copy.dims", TORCH_FN(squeeze_copy_dims_kernel));
  m.impl("slice_scatter", TORCH_FN(slice_scatter_kernel));
  m.impl("slice_backward", TORCH_FN(slice_backward_kernel));
  m.impl("select_backward", TORCH_FN(select_backward_kernel));
  m.impl("select_scatter", TORCH_FN(select_scatter_kernel));
}

}  // namespace
}  // namespace kiln::pytorch

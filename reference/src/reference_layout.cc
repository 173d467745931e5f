// Reference kernels: layout (reshape, expand, swap_dims, permute, flip, slice, slice_assign,
// repeat_dim, cat, pad, unfold), indexing (select, select_assign, gather, scatter, gather_nd,
// scatter_nd) and creation (empty, zeros, ones, full, random).
//
// Layout and indexing kernels move elements bit for bit (any dtype, NaN payloads kept): each
// output element is computed from its multi-index, which says which input element it copies.
// Index tensors may have any integer dtype; a negative or too large index is an error (no
// wrap-around from the end, as in PyTorch's index_select / gather).
#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

using ir::OpKind;

Status expect_index_tensor(const Ctx& c, const HostTensor& t, const char* what) {
  if (!t.dtype().is_integral())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("{} {} must have an integer dtype", what, t.to_string()));
  return Status::Ok();
}

// Builds the output by copying, for each output element (by multi-index), the input element
// `source(out_index, in_index)` names in `in_index`.
template <class F>
Result<Outputs> gather_elements(const Ctx& c, const HostTensor& in, F&& source) {
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::vector<std::uint64_t> in_strides = strides_of(in.shape());
  Index oi;
  Index ii(in.shape().size());
  for (std::uint64_t i = 0; i < out.num_elements(); ++i) {
    unravel(i, out.shape(), oi);
    source(oi, ii);
    copy_element(in, ravel(ii, in_strides), out, i);
  }
  return single(std::move(out));
}

// A copy of `t` (same shape and dtype) as the output to update in place.
Result<HostTensor> copy_of(const Ctx& c, const HostTensor& t) {
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  if (t.size_bytes() != 0) std::memcpy(out.mutable_data(), t.data(), static_cast<std::size_t>(t.size_bytes()));
  return out;
}

// GatherNd / ScatterNd: indices [.., k] (an integer tensor of rank >= 1, k <= the rank of data)
// hold `tuples` k-tuples, each addressing the sub-tensor data[i0, .., ik-1, ...] of `inner`
// elements; `part` = indices[..-1] ++ data[k..] is the shape of all of them together.
struct NdIndexing {
  std::size_t k = 0;
  std::uint64_t tuples = 0;
  std::uint64_t inner = 0;
  ir::Shape part;
};

Result<NdIndexing> nd_indexing(const Ctx& c, const HostTensor& data, const HostTensor& idx) {
  KILN_RETURN_IF_ERROR(expect_index_tensor(c, idx, "indices"));
  const ir::Shape& is = idx.shape();
  if (is.empty())
    return c.error(ErrorCode::RankMismatch, fmt::format("indices {} must have rank >= 1", idx.to_string()));
  if (is.back() > data.shape().size())
    return c.error(ErrorCode::OutOfBounds,
                   fmt::format("indices {} address {} dims of {}", idx.to_string(), is.back(), data.to_string()));
  NdIndexing nd;
  nd.k = static_cast<std::size_t>(is.back());
  nd.tuples = dims_product(is, 0, is.size() - 1);
  nd.inner = dims_product(data.shape(), nd.k, data.shape().size());
  nd.part.assign(is.begin(), is.end() - 1);
  nd.part.insert(nd.part.end(), data.shape().begin() + static_cast<std::ptrdiff_t>(nd.k), data.shape().end());
  return nd;
}

// The linear offset in data of the sub-tensor tuple t addresses, each index checked against its dim.
Result<std::uint64_t> nd_offset(const Ctx& c, const HostTensor& data, const HostTensor& idx, const NdIndexing& nd,
                                const std::vector<std::uint64_t>& data_strides, std::uint64_t t, const char* what) {
  std::uint64_t base = 0;
  for (std::size_t j = 0; j < nd.k; ++j) {
    KILN_ASSIGN_OR_RETURN(std::uint64_t at, checked_index(c, idx, t * nd.k + j, data.shape()[j], what));
    base += at * data_strides[j];
  }
  return base;
}

// Applies an IndexingUpdate to output element `dst` with element `src` of `value` (same dtype).
void update_element(ir::IndexingUpdate u, const HostTensor& value, std::uint64_t src, const HostTensor& out,
                    std::uint64_t dst) {
  if (u == ir::IndexingUpdate::Assign) {
    copy_element(value, src, out, dst);  // bit for bit
    return;
  }
  dispatch(domain_of(out.dtype()),
           [&]<class T>() { store<T>(out, dst, apply_update<T>(u, load<T>(out, dst), load<T>(value, src))); });
}

}  // namespace

// ---- Reshape: the same elements in the same order under a new shape.

Result<Outputs> run_reshape(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_ASSIGN_OR_RETURN(std::uint64_t n, checked_num_elements(c.out_ir().shape));
  if (n != x.num_elements())
    return c.error(ErrorCode::Invalid, fmt::format("cannot reshape {} ({} elements) to {} ({} elements)", x.to_string(),
                                                   x.num_elements(), ir::shape_to_string(c.out_ir().shape), n));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  if (out.size_bytes() != 0) std::memcpy(out.mutable_data(), x.data(), static_cast<std::size_t>(out.size_bytes()));
  return single(std::move(out));
}

// ---- Expand: right-aligned broadcast to the output shape (docs/spec/ir.md §4 expand).

Result<Outputs> run_expand(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::expand(x.shape(), c.out_ir().shape)));
  const std::size_t offset = c.out_ir().shape.size() - x.shape().size();
  return gather_elements(c, x, [&](const Index& o, Index& in) {
    for (std::size_t d = 0; d < in.size(); ++d) in[d] = x.shape()[d] == 1 ? 0 : o[offset + d];
  });
}

// ---- SwapDims / Permute / Flip

Result<Outputs> run_swap_dims(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const std::size_t rank = x.shape().size();
  KILN_ASSIGN_OR_RETURN(std::size_t d1, axis_attr(c, 0, rank, "dim1"));
  KILN_ASSIGN_OR_RETURN(std::size_t d2, axis_attr(c, 1, rank, "dim2"));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::swapped(x.shape(), d1, d2)));
  return gather_elements(c, x, [&](const Index& o, Index& in) {
    in.assign(o.begin(), o.end());
    std::swap(in[d1], in[d2]);
  });
}

Result<Outputs> run_permute(const Ctx& c) {
  const HostTensor& x = c.in[0];
  Index axes;
  for (std::int64_t a : c.op.attrs) {
    if (a < 0) return c.error(ErrorCode::Invalid, fmt::format("negative axis {}", a));
    axes.push_back(static_cast<std::uint64_t>(a));
  }
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  // shape::permuted checks that the axes are a permutation of 0..rank-1.
  KILN_RETURN_IF_ERROR(
      expect_out_shape(c, 0, ir::shape::permuted(x.shape(), std::span<const std::uint64_t>(axes.data(), axes.size()))));
  return gather_elements(c, x, [&](const Index& o, Index& in) {
    for (std::size_t i = 0; i < axes.size(); ++i) in[axes[i]] = o[i];  // out dim i is in dim axes[i]
  });
}

Result<Outputs> run_flip(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const std::size_t rank = x.shape().size();
  std::vector<bool> flipped(rank, false);
  for (std::size_t i = 0; i < c.op.attrs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(std::size_t a, axis_attr(c, i, rank, "axis"));
    if (flipped[a]) return c.error(ErrorCode::Invalid, fmt::format("axis {} repeated", a));
    flipped[a] = true;
  }
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  return gather_elements(c, x, [&](const Index& o, Index& in) {
    for (std::size_t d = 0; d < rank; ++d) in[d] = flipped[d] ? x.shape()[d] - 1 - o[d] : o[d];
  });
}

// ---- Slice / SliceAssign (ranges apply to the leading dims; the others are kept whole)

Result<Outputs> run_slice(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const auto ranges = std::span<const ir::Slice>(c.op.ranges.data(), c.op.ranges.size());
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::slice(x.shape(), ranges)));
  return gather_elements(c, x, [&](const Index& o, Index& in) {
    for (std::size_t d = 0; d < in.size(); ++d)
      in[d] = d < ranges.size() ? ranges[d].position(x.shape()[d], o[d]) : o[d];
  });
}

Result<Outputs> run_slice_assign(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const HostTensor& value = c.in[1];
  const auto ranges = std::span<const ir::Slice>(c.op.ranges.data(), c.op.ranges.size());
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  KILN_ASSIGN_OR_RETURN(ir::Shape region, ir::shape::slice(x.shape(), ranges));
  if (value.shape() != region)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("value {} does not fit the sliced region {} of {}", value.to_string(),
                               ir::shape_to_string(region), x.to_string()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, copy_of(c, x));
  const std::vector<std::uint64_t> out_strides = strides_of(x.shape());
  Index vi;
  Index oi(x.shape().size());
  for (std::uint64_t i = 0; i < value.num_elements(); ++i) {
    unravel(i, value.shape(), vi);
    for (std::size_t d = 0; d < oi.size(); ++d)
      oi[d] = d < ranges.size() ? ranges[d].position(x.shape()[d], vi[d]) : vi[d];
    copy_element(value, i, out, ravel(oi, out_strides));
  }
  return single(std::move(out));
}

// ---- Select{tensor, dim, indices}: out[.., j, ..] = tensor[.., indices[j], ..].

Result<Outputs> run_select(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const HostTensor& idx = c.in[1];
  KILN_ASSIGN_OR_RETURN(std::size_t dim, axis_attr(c, 0, x.shape().size(), "dim"));
  KILN_RETURN_IF_ERROR(expect_index_tensor(c, idx, "indices"));
  if (idx.shape().size() != 1)
    return c.error(ErrorCode::RankMismatch, fmt::format("indices {} must have rank 1", idx.to_string()));
  ir::Shape expected = x.shape();
  expected[dim] = idx.shape()[0];
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, expected));
  std::vector<std::uint64_t> at(static_cast<std::size_t>(idx.num_elements()));
  for (std::uint64_t j = 0; j < idx.num_elements(); ++j) {
    KILN_ASSIGN_OR_RETURN(at[j], checked_index(c, idx, j, x.shape()[dim], "select"));
  }
  return gather_elements(c, x, [&](const Index& o, Index& in) {
    in.assign(o.begin(), o.end());
    in[dim] = at[o[dim]];
  });
}

// ---- SelectAssign{tensor, dim, indices, value, update}: for each j (in order),
// out[.., indices[j], ..] = update(out[.., indices[j], ..], value[.., j, ..]). With Assign and a
// repeated index, the last write wins.

Result<Outputs> run_select_assign(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const HostTensor& idx = c.in[1];
  const HostTensor& value = c.in[2];
  KILN_ASSIGN_OR_RETURN(std::size_t dim, axis_attr(c, 0, x.shape().size(), "dim"));
  KILN_ASSIGN_OR_RETURN(ir::IndexingUpdate update, update_attr(c, 1));
  KILN_RETURN_IF_ERROR(expect_index_tensor(c, idx, "indices"));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 2));
  if (idx.shape().size() != 1)
    return c.error(ErrorCode::RankMismatch, fmt::format("indices {} must have rank 1", idx.to_string()));
  ir::Shape value_shape = x.shape();
  value_shape[dim] = idx.shape()[0];
  if (value.shape() != value_shape)
    return c.error(ErrorCode::IncompatibleShapes,
                   fmt::format("value {} must have shape {}", value.to_string(), ir::shape_to_string(value_shape)));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  std::vector<std::uint64_t> at(static_cast<std::size_t>(idx.num_elements()));
  for (std::uint64_t j = 0; j < idx.num_elements(); ++j) {
    KILN_ASSIGN_OR_RETURN(at[j], checked_index(c, idx, j, x.shape()[dim], "select_assign"));
  }
  KILN_ASSIGN_OR_RETURN(HostTensor out, copy_of(c, x));
  // value viewed as [outer, J, inner], out as [outer, N, inner]; j outermost, so that updates at a
  // repeated index apply in index order.
  const std::uint64_t outer = dims_product(x.shape(), 0, dim);
  const std::uint64_t inner = dims_product(x.shape(), dim + 1, x.shape().size());
  const std::uint64_t J = idx.num_elements();
  const std::uint64_t N = x.shape()[dim];
  for (std::uint64_t j = 0; j < J; ++j)
    for (std::uint64_t o = 0; o < outer; ++o)
      for (std::uint64_t e = 0; e < inner; ++e)
        update_element(update, value, (o * J + j) * inner + e, out, (o * N + at[j]) * inner + e);
  return single(std::move(out));
}

// ---- Gather{tensor, dim, indices}: out[p] = tensor[p with [dim] = indices[p]]. As in PyTorch,
// indices has the tensor's rank and is no larger than it in the other dims.

Result<Outputs> run_gather(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const HostTensor& idx = c.in[1];
  const std::size_t rank = x.shape().size();
  KILN_ASSIGN_OR_RETURN(std::size_t dim, axis_attr(c, 0, rank, "dim"));
  KILN_RETURN_IF_ERROR(expect_index_tensor(c, idx, "indices"));
  if (idx.shape().size() != rank)
    return c.error(ErrorCode::RankMismatch,
                   fmt::format("indices {} must have the rank of {}", idx.to_string(), x.to_string()));
  for (std::size_t d = 0; d < rank; ++d)
    if (d != dim && idx.shape()[d] > x.shape()[d])
      return c.error(ErrorCode::IncompatibleShapes,
                     fmt::format("indices {} exceed {} in dim {}", idx.to_string(), x.to_string(), d));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, idx.shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::vector<std::uint64_t> in_strides = strides_of(x.shape());
  Index p;
  for (std::uint64_t i = 0; i < idx.num_elements(); ++i) {
    KILN_ASSIGN_OR_RETURN(std::uint64_t at, checked_index(c, idx, i, x.shape()[dim], "gather"));
    unravel(i, idx.shape(), p);
    p[dim] = at;
    copy_element(x, ravel(p, in_strides), out, i);
  }
  return single(std::move(out));
}

// ---- Scatter{tensor, dim, indices, value, update}: for each p of indices in order,
// out[p with [dim] = indices[p]] = update(that, value[p]). As in PyTorch, indices has the rank of
// both tensors, is no larger than value in any dim and no larger than tensor outside `dim`.

Result<Outputs> run_scatter(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const HostTensor& idx = c.in[1];
  const HostTensor& value = c.in[2];
  const std::size_t rank = x.shape().size();
  KILN_ASSIGN_OR_RETURN(std::size_t dim, axis_attr(c, 0, rank, "dim"));
  KILN_ASSIGN_OR_RETURN(ir::IndexingUpdate update, update_attr(c, 1));
  KILN_RETURN_IF_ERROR(expect_index_tensor(c, idx, "indices"));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 2));
  if (idx.shape().size() != rank || value.shape().size() != rank)
    return c.error(ErrorCode::RankMismatch, fmt::format("indices {} and value {} must have the rank of {}",
                                                        idx.to_string(), value.to_string(), x.to_string()));
  for (std::size_t d = 0; d < rank; ++d)
    if (idx.shape()[d] > value.shape()[d] || (d != dim && idx.shape()[d] > x.shape()[d]))
      return c.error(ErrorCode::IncompatibleShapes, fmt::format("indices {} exceed value {} or tensor {} in dim {}",
                                                                idx.to_string(), value.to_string(), x.to_string(), d));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, copy_of(c, x));
  const std::vector<std::uint64_t> out_strides = strides_of(x.shape());
  const std::vector<std::uint64_t> value_strides = strides_of(value.shape());
  Index p;
  for (std::uint64_t i = 0; i < idx.num_elements(); ++i) {
    KILN_ASSIGN_OR_RETURN(std::uint64_t at, checked_index(c, idx, i, x.shape()[dim], "scatter"));
    unravel(i, idx.shape(), p);
    const std::uint64_t src = ravel(p, value_strides);
    p[dim] = at;
    update_element(update, value, src, out, ravel(p, out_strides));
  }
  return single(std::move(out));
}

// ---- GatherNd{data, indices}: indices [.., k] addresses the first k dims of data; each index
// tuple copies the sub-tensor data[i0, .., ik-1, ...].

Result<Outputs> run_gather_nd(const Ctx& c) {
  const HostTensor& data = c.in[0];
  const HostTensor& idx = c.in[1];
  KILN_ASSIGN_OR_RETURN(NdIndexing nd, nd_indexing(c, data, idx));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, data.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, nd.part));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  if (nd.inner == 0) return single(std::move(out));  // nothing to copy (and nothing to check)
  const std::vector<std::uint64_t> data_strides = strides_of(data.shape());
  for (std::uint64_t t = 0; t < nd.tuples; ++t) {
    KILN_ASSIGN_OR_RETURN(std::uint64_t base, nd_offset(c, data, idx, nd, data_strides, t, "gather_nd"));
    for (std::uint64_t e = 0; e < nd.inner; ++e) copy_element(data, base + e, out, t * nd.inner + e);
  }
  return single(std::move(out));
}

// ---- ScatterNd{data, indices, values, reduction}: a copy of data in which, for each k-tuple t of
// indices in index order, the sub-tensor data[t] is updated with values[t] under the reduction
// (Assign: a repeated tuple's last write wins). values must be indices[..-1] ++ data[k..] (ONNX
// ScatterND, Burn's scatter_nd). Every index is checked, even when the sub-tensors are empty.

Result<Outputs> run_scatter_nd(const Ctx& c) {
  const HostTensor& data = c.in[0];
  const HostTensor& idx = c.in[1];
  const HostTensor& values = c.in[2];
  KILN_ASSIGN_OR_RETURN(ir::IndexingUpdate update, update_attr(c, 0));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 2));
  KILN_ASSIGN_OR_RETURN(NdIndexing nd, nd_indexing(c, data, idx));
  if (values.shape() != nd.part)
    return c.error(
        ErrorCode::IncompatibleShapes,
        fmt::format("values {} must have shape {} (indices {} address {} dims of data {})", values.to_string(),
                    ir::shape_to_string(nd.part), idx.to_string(), nd.k, data.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, data.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, data.shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, copy_of(c, data));
  const std::vector<std::uint64_t> data_strides = strides_of(data.shape());
  for (std::uint64_t t = 0; t < nd.tuples; ++t) {
    KILN_ASSIGN_OR_RETURN(std::uint64_t base, nd_offset(c, data, idx, nd, data_strides, t, "scatter_nd"));
    for (std::uint64_t e = 0; e < nd.inner; ++e) update_element(update, values, t * nd.inner + e, out, base + e);
  }
  return single(std::move(out));
}

// ---- Unfold{dim, size, step}: out[p, w, q, j] = in[p, w * step + j, q], the windows of `size`
// elements every `step` along dim with the window axis appended last (torch.Tensor.unfold,
// Burn's unfold); docs/spec/ir.md §4 counts the windows (none when size > the dim).

Result<Outputs> run_unfold(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const std::size_t rank = x.shape().size();
  KILN_ASSIGN_OR_RETURN(std::size_t dim, axis_attr(c, 0, rank, "dim"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t size, count_attr(c, 1, "size"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t step, count_attr(c, 2, "step"));
  if (step == 0) return c.error(ErrorCode::Invalid, "step must be at least 1");
  ir::Shape expected = x.shape();
  expected[dim] = ir::shape::unfold_windows(x.shape()[dim], size, step);  // no overflow: step < 2^63
  expected.push_back(size);
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, expected));
  // Window w's last element, w * step + size - 1, is at most the dim's last (unfold_windows).
  return gather_elements(c, x, [&](const Index& o, Index& in) {
    for (std::size_t d = 0; d < rank; ++d) in[d] = o[d];
    in[dim] = o[dim] * step + o[rank];
  });
}

// ---- Cat{tensors, dim}

Result<Outputs> run_cat(const Ctx& c) {
  const HostTensor& first = c.in[0];
  const std::size_t rank = first.shape().size();
  KILN_ASSIGN_OR_RETURN(std::size_t dim, axis_attr(c, 0, rank, "dim"));
  std::vector<ir::Shape> shapes;
  for (std::size_t i = 0; i < c.in.size(); ++i) {
    KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, i));
    shapes.push_back(c.in[i].shape());
  }
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, first.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::cat(shapes, dim)));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t outer = dims_product(out.shape(), 0, dim);
  const std::uint64_t inner = dims_product(out.shape(), dim + 1, rank);
  const std::uint64_t out_block = out.shape()[dim] * inner;
  std::uint64_t offset = 0;  // start of the current input's block inside an output block
  for (const HostTensor& t : c.in) {
    const std::uint64_t block = t.shape()[dim] * inner;
    for (std::uint64_t o = 0; o < outer; ++o)
      for (std::uint64_t e = 0; e < block; ++e) copy_element(t, o * block + e, out, o * out_block + offset + e);
    offset += block;
  }
  return single(std::move(out));
}

// ---- RepeatDim{dim, times}: the whole dim tiled `times` times ([a, b] -> [a, b, a, b]).

Result<Outputs> run_repeat_dim(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_ASSIGN_OR_RETURN(std::size_t dim, axis_attr(c, 0, x.shape().size(), "dim"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t times, count_attr(c, 1, "times"));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::repeat(x.shape(), dim, times)));
  return gather_elements(c, x, [&](const Index& o, Index& in) {
    in.assign(o.begin(), o.end());
    in[dim] = o[dim] % x.shape()[dim];  // the output has elements only if x.shape()[dim] > 0
  });
}

// ---- Pad{mode, (before, after) for the last m dims, constant?} (docs/spec/ir.md §6.4). Reflect mirrors
// without repeating the edge (PyTorch's "reflect"), Edge repeats the edge ("replicate").

Result<Outputs> run_pad(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const ir::Shape& in = x.shape();
  const std::int64_t mode_attr = c.op.attrs[0];
  if (mode_attr < 0 || mode_attr > static_cast<std::int64_t>(ir::PadMode::Edge))
    return c.error(ErrorCode::Invalid, fmt::format("unknown pad mode {}", mode_attr));
  const auto mode = static_cast<ir::PadMode>(mode_attr);
  if ((c.op.attrs.size() - 1) % 2 != 0)
    return c.error(ErrorCode::Invalid, "padding attributes must come in (before, after) pairs");
  const std::size_t m = (c.op.attrs.size() - 1) / 2;
  if (m > in.size()) return c.error(ErrorCode::RankMismatch, fmt::format("{} padding pairs for {}", m, x.to_string()));
  if ((mode == ir::PadMode::Constant) != (c.op.scalars.size() == 1))
    return c.error(ErrorCode::Invalid, "constant padding carries exactly one value, the other modes none");
  std::vector<std::uint64_t> before(in.size(), 0);
  ir::Shape expected = in;
  for (std::size_t i = 0; i < m; ++i) {
    const std::size_t d = in.size() - m + i;
    KILN_ASSIGN_OR_RETURN(std::uint64_t b, count_attr(c, 1 + 2 * i, "padding"));
    KILN_ASSIGN_OR_RETURN(std::uint64_t a, count_attr(c, 2 + 2 * i, "padding"));
    if (b != 0 || a != 0) {
      if (mode == ir::PadMode::Reflect && (in[d] == 0 || b > in[d] - 1 || a > in[d] - 1))
        return c.error(ErrorCode::Invalid,
                       fmt::format("reflect padding ({}, {}) of dim {} needs both at most {} - 1", b, a, d, in[d]));
      if (mode == ir::PadMode::Edge && in[d] == 0)
        return c.error(ErrorCode::Invalid, fmt::format("edge padding of dim {} of size 0", d));
    }
    if (__builtin_add_overflow(in[d], b, &expected[d]) || __builtin_add_overflow(expected[d], a, &expected[d]))
      return c.error(ErrorCode::Invalid, "padded size overflows 64 bits");
    before[d] = b;
  }
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, expected));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const ElementBytes fill = mode == ir::PadMode::Constant ? scalar_element(c.op.scalars[0], x.dtype()) : ElementBytes{};
  const std::size_t width = static_cast<std::size_t>(x.dtype().size_bytes());
  const std::vector<std::uint64_t> in_strides = strides_of(in);
  Index oi;
  Index ii(in.size());
  for (std::uint64_t i = 0; i < out.num_elements(); ++i) {
    unravel(i, out.shape(), oi);
    bool inside = true;
    for (std::size_t d = 0; d < in.size(); ++d) {
      // Position in the input's coordinates, possibly outside [0, n): o - before.
      const std::uint64_t n = in[d];
      if (oi[d] >= before[d] && oi[d] - before[d] < n) {
        ii[d] = oi[d] - before[d];
      } else if (mode == ir::PadMode::Constant) {
        inside = false;
        break;
      } else if (oi[d] < before[d]) {  // left of the input by `back` positions
        const std::uint64_t back = before[d] - oi[d];
        ii[d] = mode == ir::PadMode::Reflect ? back : 0;
      } else {  // right of the input by `ahead` positions (1 = just past the end)
        const std::uint64_t ahead = oi[d] - before[d] - n + 1;
        ii[d] = mode == ir::PadMode::Reflect ? n - 1 - ahead : n - 1;
      }
    }
    if (inside) {
      copy_element(x, ravel(ii, in_strides), out, i);
    } else {
      std::memcpy(out.mutable_data() + i * width, fill.bytes.data(), width);
    }
  }
  return single(std::move(out));
}

// ---- Creation: Empty (zero-filled, so the oracle is deterministic), Zeros, Ones, Full.

Result<Outputs> run_creation(const Ctx& c) {
  const ir::DType dtype = c.out_ir().dtype;
  KILN_ASSIGN_OR_RETURN(HostTensor out, HostTensor::zeros(c.alloc, c.out_ir().shape, dtype));
  ElementBytes value;
  switch (c.op.kind) {
    case OpKind::Base_Empty:
    case OpKind::Base_Zeros: return single(std::move(out));
    case OpKind::Base_Ones: value = scalar_element(ir::ScalarIr::Int(1), dtype); break;
    case OpKind::Numeric_Full: value = scalar_element(c.op.scalars[0], dtype); break;
    default: return c.error(ErrorCode::Internal, "creation: unknown kind");
  }
  const std::size_t width = static_cast<std::size_t>(dtype.size_bytes());
  for (std::uint64_t i = 0; i < out.num_elements(); ++i)
    std::memcpy(out.mutable_data() + i * width, value.bytes.data(), width);
  return single(std::move(out));
}

// ---- Random (float) and IntRandom, from the executor's SplitMix64 stream, one draw per element
// in index order (Normal: two draws).
//
//   Default          float: k / 2^p, k uniform, p = the dtype's significand bits: uniform on
//                    [0, 1), exactly representable, never 1.  integer: uniform on [0, 255)
//                    (Burn's int_random maps Default to Uniform(0, 255)), [0, 128) for i8.
//   Bernoulli(p)     1 with probability p (0 <= p <= 1), else 0.
//   Uniform(lo, hi)  float: lo + u (hi - lo), u uniform on [0, 1) with 53 bits, then rounded to
//                    the dtype (a narrow dtype may round up to hi, as PyTorch's uniform_ does).
//                    integer: uniform on the integers [trunc(lo), trunc(hi)), which must be
//                    non-empty and representable in the dtype.
//   Normal(m, s)     m + s z, z standard normal by Box-Muller (cosine branch); integers round to
//                    nearest (ties away from zero) and saturate.

Result<Outputs> run_random(const Ctx& c) {
  const ir::DType dtype = c.out_ir().dtype;
  const std::int64_t kind_attr = c.op.attrs[0];
  if (kind_attr < 0 || kind_attr > static_cast<std::int64_t>(ir::Distribution::Normal))
    return c.error(ErrorCode::Invalid, fmt::format("unknown distribution {}", kind_attr));
  const auto kind = static_cast<ir::Distribution>(kind_attr);
  const double p0 = std::bit_cast<double>(c.op.attrs[1]);
  const double p1 = std::bit_cast<double>(c.op.attrs[2]);
  const bool integral = dtype.is_integral();
  if (c.op.kind == OpKind::Float_Random && !dtype.is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("output {} must be float", c.out_ir().to_string()));
  if (!dtype.is_float() && !integral)
    return c.error(ErrorCode::DTypeMismatch, fmt::format("output {} must be numeric", c.out_ir().to_string()));

  switch (kind) {
    case ir::Distribution::Default: break;
    case ir::Distribution::Bernoulli:
      if (!(p0 >= 0 && p0 <= 1))
        return c.error(ErrorCode::Invalid, fmt::format("Bernoulli probability {} is not in [0, 1]", p0));
      break;
    case ir::Distribution::Uniform:
      if (!std::isfinite(p0) || !std::isfinite(p1) || p0 > p1)
        return c.error(ErrorCode::Invalid, fmt::format("Uniform({}, {}) needs finite bounds, low <= high", p0, p1));
      break;
    case ir::Distribution::Normal:
      if (!std::isfinite(p0) || !std::isfinite(p1) || p1 < 0)
        return c.error(ErrorCode::Invalid, fmt::format("Normal({}, {}) needs a finite mean and std >= 0", p0, p1));
      break;
  }

  // Integer uniform range [lo, hi).
  std::int64_t lo = 0, hi = 255;
  if (integral && kind == ir::Distribution::Uniform) {
    constexpr double kLimit = 9223372036854775808.0;  // 2^63
    if (p0 < -kLimit || p0 >= kLimit || p1 > kLimit)
      return c.error(ErrorCode::Invalid, fmt::format("Uniform({}, {}) exceeds the 64-bit integers", p0, p1));
    lo = static_cast<std::int64_t>(std::trunc(p0));
    hi = p1 >= kLimit ? std::numeric_limits<std::int64_t>::max() : static_cast<std::int64_t>(std::trunc(p1));
  }
  if (integral && kind == ir::Distribution::Default && integral_max(dtype) < 255)
    hi = static_cast<std::int64_t>(integral_max(dtype)) + 1;  // i8: [0, 128)
  if (integral && (kind == ir::Distribution::Uniform || kind == ir::Distribution::Default)) {
    if (hi <= lo) return c.error(ErrorCode::Invalid, fmt::format("integer range [{}, {}) is empty", lo, hi));
    // Both ends must survive the trip through the dtype (no wrap-around).
    std::array<std::byte, 8> probe{};
    for (std::int64_t v : {lo, hi - 1}) {
      element::store_i64(probe.data(), dtype, 0, v);
      if (element::load_i64(probe.data(), dtype, 0) != v)
        return c.error(ErrorCode::Invalid, fmt::format("integer range [{}, {}) does not fit {}", lo, hi, dtype.name()));
    }
  }

  int bits = 53;
  switch (dtype.kind()) {
    case ir::DTypeKind::F32:
    case ir::DTypeKind::Flex32: bits = 24; break;
    case ir::DTypeKind::F16: bits = 11; break;
    case ir::DTypeKind::BF16: bits = 8; break;
    default: break;
  }

  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (std::uint64_t i = 0; i < out.num_elements(); ++i) {
    switch (kind) {
      case ir::Distribution::Default:
        if (integral) {
          store<std::int64_t>(out, i, lo + static_cast<std::int64_t>(c.rng.below(static_cast<std::uint64_t>(hi - lo))));
        } else {
          store<double>(out, i, c.rng.uniform(bits));
        }
        break;
      case ir::Distribution::Bernoulli: store<double>(out, i, c.rng.uniform(53) < p0 ? 1.0 : 0.0); break;
      case ir::Distribution::Uniform:
        if (integral) {
          const std::uint64_t range = static_cast<std::uint64_t>(hi) - static_cast<std::uint64_t>(lo);
          store<std::int64_t>(out, i, wrap_add(lo, static_cast<std::int64_t>(c.rng.below(range))));
        } else {
          store<double>(out, i, p0 + c.rng.uniform(53) * (p1 - p0));
        }
        break;
      case ir::Distribution::Normal: {
        const double u1 = 1.0 - c.rng.uniform(53);  // (0, 1]: log is finite
        const double u2 = c.rng.uniform(53);
        const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
        const double v = p0 + p1 * z;
        store<double>(out, i, integral ? std::round(v) : v);
        break;
      }
    }
  }
  return single(std::move(out));
}

}  // namespace kiln::reference::kernels

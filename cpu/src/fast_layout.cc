// Layout ops on the fast path: Slice, SliceAssign, Permute, Expand and Flip (docs/spec/ir.md §4,
// §5.4) as strided copies.
//
// Each of them reads (or, for SliceAssign, writes) its input through an affine map of the output
// index: position = offset + Σ_d o_d · stride_d in elements of the input, with a zero stride for an
// expanded dim, a negative one for a flipped dim or a negative slice step, the input's strides
// reordered for a permutation. One copy loop serves them all: the output's rows in order, a row
// whose input stride is 1 as one memcpy. The reference (reference/src/reference_layout.cc) moves
// the same elements one at a time; copies are exact, so the results are its bits. A quantized
// tensor, or an op the shape rules refuse, is declined: the reference runs it and reports.
#include "fast_layout.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "fast_single_op.h"
#include "kiln/ir/shape.h"

namespace kiln::cpu::fast {
namespace {

// The input position of every output element: offset + Σ_d o_d · strides[d] (elements).
struct AffineMap {
  std::int64_t offset = 0;
  std::vector<std::int64_t> strides;  // one per output dim
};

std::vector<std::int64_t> row_major_strides(const ir::Shape& s) {
  std::vector<std::int64_t> strides(s.size(), 1);
  for (std::size_t d = s.size(); d-- > 1;) strides[d - 1] = strides[d] * static_cast<std::int64_t>(s[d]);
  return strides;
}

// Calls row(dense_start, mapped_start, inner_stride, inner_size) for every row (last dim) of
// `shape`, in order; dense_start counts elements of the dense side.
template <class F>
void for_each_row(const ir::Shape& shape, const AffineMap& map, F&& row) {
  const std::size_t rank = shape.size();
  std::uint64_t total = 1;
  for (std::uint64_t n : shape) total *= n;
  if (total == 0) return;
  if (rank == 0) return row(std::uint64_t{0}, map.offset, std::int64_t{1}, std::uint64_t{1});
  const std::uint64_t inner = shape[rank - 1];
  std::vector<std::uint64_t> index(rank, 0);
  std::int64_t mapped = map.offset;
  for (std::uint64_t dense = 0; dense < total; dense += inner) {
    row(dense, mapped, map.strides[rank - 1], inner);
    // Advance the outer index (dims 0 .. rank − 2) like an odometer.
    for (std::size_t d = rank - 1; d-- > 0;) {
      mapped += map.strides[d];
      if (++index[d] < shape[d]) break;
      mapped -= map.strides[d] * static_cast<std::int64_t>(shape[d]);
      index[d] = 0;
    }
  }
}

// Copies one row of `n` elements of `bytes` each between a dense pointer and a strided one.
template <std::size_t kBytes>
void copy_row(std::byte* dst, std::int64_t dst_stride, const std::byte* src, std::int64_t src_stride, std::uint64_t n) {
  for (std::uint64_t i = 0; i < n; ++i)
    std::memcpy(dst + static_cast<std::int64_t>(i) * dst_stride * static_cast<std::int64_t>(kBytes),
                src + static_cast<std::int64_t>(i) * src_stride * static_cast<std::int64_t>(kBytes), kBytes);
}

void copy_strided(std::byte* dst, std::int64_t dst_stride, const std::byte* src, std::int64_t src_stride,
                  std::uint64_t n, std::size_t bytes) {
  if (dst_stride == 1 && src_stride == 1) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * bytes);
    return;
  }
  switch (bytes) {
    case 1: return copy_row<1>(dst, dst_stride, src, src_stride, n);
    case 2: return copy_row<2>(dst, dst_stride, src, src_stride, n);
    case 4: return copy_row<4>(dst, dst_stride, src, src_stride, n);
    case 8: return copy_row<8>(dst, dst_stride, src, src_stride, n);
    default:
      for (std::uint64_t i = 0; i < n; ++i)
        std::memcpy(dst + static_cast<std::int64_t>(i) * dst_stride * static_cast<std::int64_t>(bytes),
                    src + static_cast<std::int64_t>(i) * src_stride * static_cast<std::int64_t>(bytes), bytes);
  }
}

// out (dense, `shape`) ← in through `map`.
void gather(const HostTensor& in, HostTensor& out, const AffineMap& map) {
  const std::size_t bytes = in.dtype().size_bytes();
  const std::byte* src = in.data();
  std::byte* dst = out.mutable_data();
  for_each_row(out.shape(), map, [&](std::uint64_t dense, std::int64_t mapped, std::int64_t stride, std::uint64_t n) {
    copy_strided(dst + dense * bytes, 1, src + mapped * static_cast<std::int64_t>(bytes), stride, n, bytes);
  });
}

// out (strided through `map`) ← value (dense, its shape).
void scatter(const HostTensor& value, HostTensor& out, const AffineMap& map) {
  const std::size_t bytes = value.dtype().size_bytes();
  const std::byte* src = value.data();
  std::byte* dst = out.mutable_data();
  for_each_row(value.shape(), map, [&](std::uint64_t dense, std::int64_t mapped, std::int64_t stride, std::uint64_t n) {
    copy_strided(dst + mapped * static_cast<std::int64_t>(bytes), stride, src + dense * bytes, 1, n, bytes);
  });
}

// ---- Each op's map (over the region's index for a slice), or nullopt when the rules refuse it.

std::optional<AffineMap> slice_map(const ir::Operation& op, const ir::Shape& x, const ir::Shape& region) {
  Result<ir::Shape> sliced = ir::shape::slice(x, std::span<const ir::Slice>(op.ranges.data(), op.ranges.size()));
  if (!sliced.ok() || *sliced != region) return std::nullopt;
  const std::vector<std::int64_t> in_strides = row_major_strides(x);
  AffineMap map{0, in_strides};
  for (std::size_t d = 0; d < op.ranges.size(); ++d) {
    const ir::Slice& s = op.ranges[d];
    if (region[d] == 0) return map;  // nothing is copied
    map.offset += static_cast<std::int64_t>(s.position(x[d], 0)) * in_strides[d];
    if (region[d] > 1)
      map.strides[d] =
          (static_cast<std::int64_t>(s.position(x[d], 1)) - static_cast<std::int64_t>(s.position(x[d], 0))) *
          in_strides[d];
  }
  return map;
}

std::optional<AffineMap> permute_map(const ir::Operation& op, const ir::Shape& x, const ir::Shape& out) {
  std::vector<std::uint64_t> axes;
  for (std::int64_t a : op.attrs) {
    if (a < 0) return std::nullopt;
    axes.push_back(static_cast<std::uint64_t>(a));
  }
  Result<ir::Shape> permuted = ir::shape::permuted(x, axes);
  if (!permuted.ok() || *permuted != out) return std::nullopt;
  const std::vector<std::int64_t> in_strides = row_major_strides(x);
  AffineMap map{0, std::vector<std::int64_t>(axes.size())};
  for (std::size_t i = 0; i < axes.size(); ++i) map.strides[i] = in_strides[axes[i]];  // out dim i is in dim axes[i]
  return map;
}

std::optional<AffineMap> expand_map(const ir::Shape& x, const ir::Shape& out) {
  Result<ir::Shape> expanded = ir::shape::expand(x, out);
  if (!expanded.ok() || *expanded != out || out.size() < x.size()) return std::nullopt;
  const std::vector<std::int64_t> in_strides = row_major_strides(x);
  const std::size_t lead = out.size() - x.size();
  AffineMap map{0, std::vector<std::int64_t>(out.size(), 0)};
  for (std::size_t d = 0; d < x.size(); ++d) map.strides[lead + d] = x[d] == 1 ? 0 : in_strides[d];
  return map;
}

std::optional<AffineMap> flip_map(const ir::Operation& op, const ir::Shape& x) {
  const std::vector<std::int64_t> in_strides = row_major_strides(x);
  AffineMap map{0, in_strides};
  std::vector<bool> flipped(x.size(), false);
  for (std::int64_t a : op.attrs) {
    if (a < 0 || static_cast<std::uint64_t>(a) >= x.size() || flipped[static_cast<std::size_t>(a)]) return std::nullopt;
    const auto d = static_cast<std::size_t>(a);
    flipped[d] = true;
    if (x[d] == 0) continue;
    map.offset += static_cast<std::int64_t>(x[d] - 1) * in_strides[d];
    map.strides[d] = -in_strides[d];
  }
  return map;
}

}  // namespace

bool run_layout(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles) {
  using ir::OpKind;
  const bool assign = op.kind == OpKind::Base_SliceAssign;
  if (op.kind != OpKind::Base_Slice && !assign && op.kind != OpKind::Base_Permute && op.kind != OpKind::Base_Expand &&
      op.kind != OpKind::Base_Flip)
    return false;
  if (op.inputs().size() != (assign ? 2u : 1u) || op.outputs().size() != 1) return false;
  // Every input is held with the dtype and shape the IR says, of the output's dtype.
  const ir::TensorIr& out_ir = op.outputs()[0];
  if (out_ir.dtype.is_quantized()) return false;
  const std::optional<std::vector<const HostTensor*>> held = held_inputs(op, handles);
  if (!held) return false;
  const std::vector<const HostTensor*>& in = *held;
  for (const ir::TensorIr& t : op.inputs())
    if (!(t.dtype == out_ir.dtype)) return false;
  const ir::Shape& x = in[0]->shape();
  std::optional<AffineMap> map;
  switch (op.kind) {
    case OpKind::Base_Slice: map = slice_map(op, x, out_ir.shape); break;
    case OpKind::Base_SliceAssign:
      if (out_ir.shape == x) map = slice_map(op, x, in[1]->shape());
      break;
    case OpKind::Base_Permute: map = permute_map(op, x, out_ir.shape); break;
    case OpKind::Base_Expand: map = expand_map(x, out_ir.shape); break;
    default:
      if (out_ir.shape == x) map = flip_map(op, x);
      break;
  }
  if (!map) return false;
  Result<HostTensor> out = HostTensor::allocate(device.allocator(), out_ir.shape, out_ir.dtype);
  if (!out.ok()) return false;
  if (assign) {
    if (in[0]->size_bytes() != 0)
      std::memcpy(out->mutable_data(), in[0]->data(), static_cast<std::size_t>(in[0]->size_bytes()));
    scatter(*in[1], *out, *map);
  } else {
    gather(*in[0], *out, *map);
  }
  commit(op, handles, std::span<HostTensor>(&*out, 1));
  return true;
}

}  // namespace kiln::cpu::fast

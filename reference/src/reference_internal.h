// Private to the reference executor: the kernel context, checks shared by every kernel, compute
// domains, index arithmetic, and the kernel entry points (one per operation family).
#pragma once

#include <fmt/format.h>
#include <boost/container/small_vector.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/ir/operation.h"
#include "kiln/reference/memory.h"
#include "kiln/reference/tensor.h"

namespace kiln::reference::kernels {

using Outputs = boost::container::small_vector<HostTensor, 2>;
using Index = boost::container::small_vector<std::uint64_t, 6>;

// SplitMix64 (Steele, Lea, Flood 2014): a tiny generator whose output sequence is fully specified,
// so every platform draws the same values; the state lives in the executor (no global state).
class Rng {
 public:
  explicit Rng(std::uint64_t& state) : state_(state) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // k / 2^bits with k uniform in [0, 2^bits): exactly representable in a float dtype with at
  // least `bits` significand bits, and never 1.
  double uniform(int bits) { return std::ldexp(static_cast<double>(next() >> (64 - bits)), -bits); }
  // Uniform in [0, range) without modulo bias (rejection sampling); range > 0.
  std::uint64_t below(std::uint64_t range) {
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % range);  // a multiple of range
    std::uint64_t x = next();
    while (x >= limit) x = next();
    return x % range;
  }

 private:
  std::uint64_t& state_;
};

// What a kernel sees: the op, its inputs (handles already checked against the IR occurrences),
// the allocator and the stream's generator.
struct Ctx {
  const ir::Operation& op;
  std::span<const HostTensor> in;
  HostAllocator& alloc;
  Rng& rng;

  const ir::TensorIr& out_ir(std::size_t i = 0) const { return op.outputs()[i]; }
  // "<kind name>: <what>".
  Error error(ErrorCode code, std::string_view what) const {
    return make_error(code, fmt::format("{}: {}", op.kind_name(), what));
  }
  // A fresh output with the IR occurrence's shape and dtype (contents unspecified).
  Result<HostTensor> new_output(std::size_t i = 0) const {
    return HostTensor::allocate(alloc, out_ir(i).shape, out_ir(i).dtype);
  }
};

// ---- Checks (each returns an error naming the op and the offending values)

Status expect_out_shape(const Ctx& c, std::size_t out, const ir::Shape& expected);
// A shape rule's result (ir::shape::*) must equal the output's shape.
Status expect_out_shape(const Ctx& c, std::size_t out, const Result<ir::Shape>& expected);
Status expect_out_dtype(const Ctx& c, std::size_t out, ir::DType expected);
Status expect_out_bool(const Ctx& c, std::size_t out);
Status expect_out_integral(const Ctx& c, std::size_t out);
// Output `out` may hold indices up to `max_index` (an integer dtype wide enough).
Status expect_index_fits(const Ctx& c, std::size_t out, std::uint64_t max_index);
Status expect_same_dtype(const Ctx& c, std::size_t a, std::size_t b);  // inputs a and b
// Attribute i as a dimension index < rank.
Result<std::size_t> axis_attr(const Ctx& c, std::size_t i, std::size_t rank, const char* what);
// Attribute i as a non-negative value.
Result<std::uint64_t> count_attr(const Ctx& c, std::size_t i, const char* what);
// Attribute i as a flag (0 or 1).
Result<bool> flag_attr(const Ctx& c, std::size_t i, const char* what);

// ---- Compute domains: every dtype is computed as one of four C++ types.

enum class Domain { Float, Int, UInt, Bool };  // double, std::int64_t, std::uint64_t, bool
inline Domain domain_of(ir::DType d) {
  if (d.is_bool()) return Domain::Bool;
  if (d.is_int()) return Domain::Int;
  if (d.is_uint()) return Domain::UInt;
  return Domain::Float;
}

// Calls f.template operator()<T>() with the domain's C++ type.
template <class F>
decltype(auto) dispatch(Domain d, F&& f) {
  switch (d) {
    case Domain::Int: return f.template operator()<std::int64_t>();
    case Domain::UInt: return f.template operator()<std::uint64_t>();
    case Domain::Bool: return f.template operator()<bool>();
    case Domain::Float: break;
  }
  return f.template operator()<double>();
}

template <class T>
T load(const HostTensor& t, std::uint64_t i) {
  if constexpr (std::is_same_v<T, double>)
    return t.get_f64(i);
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return t.get_i64(i);
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return t.get_u64(i);
  else
    return t.get_bool(i);
}

template <class T>
void store(const HostTensor& t, std::uint64_t i, T v) {
  if constexpr (std::is_same_v<T, double>)
    element::store_f64(t.mutable_data(), t.dtype(), i, v);
  else if constexpr (std::is_same_v<T, std::int64_t>)
    element::store_i64(t.mutable_data(), t.dtype(), i, v);
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    element::store_u64(t.mutable_data(), t.dtype(), i, v);
  else
    element::store_bool(t.mutable_data(), t.dtype(), i, v);
}

// A scalar converted to one element of `dtype` (the cast rules of the element codec, from the
// scalar's own kind), as that element's bytes.
struct ElementBytes {
  std::array<std::byte, 8> bytes{};
};
ElementBytes scalar_element(const ir::ScalarIr& s, ir::DType dtype);

// A scalar converted to an element of `dtype`, then read in the domain T.
template <class T>
T scalar_as(const ir::ScalarIr& s, ir::DType dtype) {
  const ElementBytes e = scalar_element(s, dtype);
  if constexpr (std::is_same_v<T, double>)
    return element::load_f64(e.bytes.data(), dtype, 0);
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return element::load_i64(e.bytes.data(), dtype, 0);
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return element::load_u64(e.bytes.data(), dtype, 0);
  else
    return element::load_bool(e.bytes.data(), dtype, 0);
}

// Bits of an integer dtype (8 for i8 / u8 ...).
inline int int_bits(ir::DType d) { return static_cast<int>(d.size_bytes() * 8); }
// Largest value of an integer dtype.
std::uint64_t integral_max(ir::DType d);

// ---- Integer arithmetic that wraps (no signed overflow, hence no undefined behaviour).

inline std::int64_t wrap_add(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}
inline std::int64_t wrap_sub(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) - static_cast<std::uint64_t>(b));
}
inline std::int64_t wrap_mul(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
}
inline std::uint64_t wrap_add(std::uint64_t a, std::uint64_t b) { return a + b; }
inline std::uint64_t wrap_sub(std::uint64_t a, std::uint64_t b) { return a - b; }
inline std::uint64_t wrap_mul(std::uint64_t a, std::uint64_t b) { return a * b; }

// ---- NaN-propagating max / min (PyTorch): a NaN operand wins.

template <class T>
bool is_nan(T v) {
  if constexpr (std::is_same_v<T, double>)
    return v != v;
  else
    return false;
}
template <class T>
T max_nan(T a, T b) {
  if (is_nan(a)) return a;
  if (is_nan(b)) return b;
  return b > a ? b : a;
}
template <class T>
T min_nan(T a, T b) {
  if (is_nan(a)) return a;
  if (is_nan(b)) return b;
  return b < a ? b : a;
}

// ---- Index arithmetic (row-major, contiguous)

std::vector<std::uint64_t> strides_of(const ir::Shape& s);
// Multi-index of a linear index.
void unravel(std::uint64_t linear, const ir::Shape& s, Index& idx);
std::uint64_t ravel(const Index& idx, const std::vector<std::uint64_t>& strides);
// For each element of `out`, the linear index of the element of `in` it reads under docs/spec/ir.md §4
// broadcasting (equal ranks; each dim of `in` equal to out's or 1).
std::vector<std::uint64_t> broadcast_map(const ir::Shape& in, const ir::Shape& out);
// Product of the dims in [from, to).
std::uint64_t dims_product(const ir::Shape& s, std::size_t from, std::size_t to);

// Copies element si of src into element di of dst (same dtype).
inline void copy_element(const HostTensor& src, std::uint64_t si, const HostTensor& dst, std::uint64_t di) {
  const std::size_t n = static_cast<std::size_t>(src.dtype().size_bytes());
  std::memcpy(dst.mutable_data() + di * n, src.data() + si * n, n);
}

// Reads element i of an integer tensor as an index; false when the value is negative.
bool read_index(const HostTensor& t, std::uint64_t i, std::uint64_t& out);
// An index read from `indices` (element i) checked against a dimension of size `size`.
Result<std::uint64_t> checked_index(const Ctx& c, const HostTensor& indices, std::uint64_t i, std::uint64_t size,
                                    const char* what);

// A sliding window's kernel taps inside the input (ir/shape.h).
using ir::shape::window_taps;

// Applies Scatter / SelectAssign's update rule (attribute) to old and new values.
template <class T>
T apply_update(ir::IndexingUpdate u, T old, T v) {
  switch (u) {
    case ir::IndexingUpdate::Assign: return v;
    case ir::IndexingUpdate::Add:
      if constexpr (std::is_same_v<T, bool>)
        return old || v;  // bool: add saturates to or
      else if constexpr (std::is_same_v<T, double>)
        return old + v;
      else
        return wrap_add(old, v);
    case ir::IndexingUpdate::Mul:
      if constexpr (std::is_same_v<T, bool>)
        return old && v;
      else if constexpr (std::is_same_v<T, double>)
        return old * v;
      else
        return wrap_mul(old, v);
    case ir::IndexingUpdate::Min: return min_nan(old, v);
    case ir::IndexingUpdate::Max: return max_nan(old, v);
  }
  return v;
}
// Attribute i as an IndexingUpdate.
Result<ir::IndexingUpdate> update_attr(const Ctx& c, std::size_t i);

// ---- Kernels, one per family of operations. Each validates what it relies on and returns the
// outputs in IR order, or an error.

// reference_elementwise.cc
Result<Outputs> run_unary(const Ctx& c);
Result<Outputs> run_binary(const Ctx& c);
Result<Outputs> run_scalar(const Ctx& c);
Result<Outputs> run_cast(const Ctx& c);
Result<Outputs> run_clamp(const Ctx& c);
Result<Outputs> run_mask_where(const Ctx& c);
Result<Outputs> run_mask_fill(const Ctx& c);
Result<Outputs> run_cross(const Ctx& c);  // Float Cross: 3-vectors along a dim, broadcasting

// reference_reduce.cc
Result<Outputs> run_reduce(const Ctx& c);      // whole tensor
Result<Outputs> run_reduce_dim(const Ctx& c);  // along an axis, incl. ArgMax / ArgMin
Result<Outputs> run_reduce_dim_with_indices(const Ctx& c);
Result<Outputs> run_topk_with_indices(const Ctx& c);
Result<Outputs> run_topk(const Ctx& c);  // TopK, ArgTopK (ReduceDim signature)
Result<Outputs> run_sort(const Ctx& c);  // Sort, ArgSort, SortWithIndices
Result<Outputs> run_cumulative(const Ctx& c);

// reference_layout.cc
Result<Outputs> run_reshape(const Ctx& c);
Result<Outputs> run_expand(const Ctx& c);
Result<Outputs> run_swap_dims(const Ctx& c);
Result<Outputs> run_permute(const Ctx& c);
Result<Outputs> run_flip(const Ctx& c);
Result<Outputs> run_slice(const Ctx& c);
Result<Outputs> run_slice_assign(const Ctx& c);
Result<Outputs> run_select(const Ctx& c);
Result<Outputs> run_select_assign(const Ctx& c);
Result<Outputs> run_gather(const Ctx& c);
Result<Outputs> run_scatter(const Ctx& c);
Result<Outputs> run_gather_nd(const Ctx& c);
Result<Outputs> run_scatter_nd(const Ctx& c);
Result<Outputs> run_unfold(const Ctx& c);
Result<Outputs> run_cat(const Ctx& c);
Result<Outputs> run_repeat_dim(const Ctx& c);
Result<Outputs> run_pad(const Ctx& c);
Result<Outputs> run_creation(const Ctx& c);  // Empty, Zeros, Ones, Full
Result<Outputs> run_random(const Ctx& c);    // Random, IntRandom

// reference_activation.cc: every Activation kind (docs/spec/ir.md §5.9), whatever its signature
// (Unary, Binary, Scalar, HardSigmoid, Dim).
Result<Outputs> run_activation(const Ctx& c);

// reference_module.cc
Result<Outputs> run_matmul(const Ctx& c);
Result<Outputs> run_embedding(const Ctx& c);
Result<Outputs> run_linear(const Ctx& c);
Result<Outputs> run_linear_backward(const Ctx& c);  // LinearXBackward, LinearWeightBackward
Result<Outputs> run_linear_bias_backward(const Ctx& c);
Result<Outputs> run_layer_norm(const Ctx& c);
Result<Outputs> run_batch_norm(const Ctx& c);
Result<Outputs> run_embedding_backward(const Ctx& c);

// reference_conv.cc: Conv1d/2d/3d and ConvTranspose1d/2d/3d (signatures Conv, ConvTranspose), the
// X and Weight gradients (ConvBackward, ConvTransposeBackward) and the bias gradients.
Result<Outputs> run_conv(const Ctx& c);
Result<Outputs> run_conv_backward(const Ctx& c);
Result<Outputs> run_conv_bias_backward(const Ctx& c);
// reference_pool.cc: every pool (docs/spec/ir.md §5.8), rank-generic (the kind gives 1, 2 or 3
// spatial dims).
Result<Outputs> run_max_pool(const Ctx& c);  // MaxPool1d/2d, MaxPool1d/2dWithIndices
Result<Outputs> run_max_pool_backward(const Ctx& c);
Result<Outputs> run_avg_pool(const Ctx& c);  // AvgPool1d/2d
Result<Outputs> run_avg_pool_backward(const Ctx& c);
Result<Outputs> run_adaptive_avg_pool(const Ctx& c);
Result<Outputs> run_adaptive_avg_pool_backward(const Ctx& c);
// reference_resample.cc
Result<Outputs> run_interpolate(const Ctx& c);
Result<Outputs> run_interpolate_backward(const Ctx& c);
Result<Outputs> run_grid_sample_2d(const Ctx& c);
Result<Outputs> run_unfold4d(const Ctx& c);
// reference_fft.cc: the real DFT along one dim and its inverse (O(n²) in f64)
Result<Outputs> run_rfft(const Ctx& c);  // two outputs: re, im
Result<Outputs> run_irfft(const Ctx& c);
// reference_attention.cc: scaled dot-product attention (Burn's order and NaN-safe softmax)
Result<Outputs> run_attention(const Ctx& c);
// reference_ctc.cc: the CTC loss per sample and its gradient (log-space alpha / beta in f64)
Result<Outputs> run_ctc_loss(const Ctx& c);
Result<Outputs> run_ctc_loss_backward(const Ctx& c);
// reference_deformable.cc: torchvision's deformable convolution and its gradients (three to five
// outputs: input, offset, weight, mask?, bias?)
Result<Outputs> run_deformable_conv2d(const Ctx& c);
Result<Outputs> run_deformable_conv2d_backward(const Ctx& c);
// reference_quantize.cc: Quantize and Dequantize, the only kernels that read or write QFloat
// tensors (HostTensor's QuantLayout)
Result<Outputs> run_quantize(const Ctx& c);
Result<Outputs> run_dequantize(const Ctx& c);  // Float Dequantize (Cast signature)

// One output as the kernels' result.
inline Result<Outputs> single(HostTensor t) {
  Outputs o;
  o.push_back(std::move(t));
  return o;
}

}  // namespace kiln::reference::kernels

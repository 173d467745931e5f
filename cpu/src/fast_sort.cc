// Sorting along an axis on the fast path, with the reference's order (reference/src/reference_reduce.cc,
// docs/spec/ir.md §5.5): one stable sort per line, equal values in index order, ±0 equal, NaN
// larger than every number (first when descending, last when ascending).
//
// Each value becomes an unsigned key whose integer order is that order (complemented when
// descending), and key and index are sorted together as one pair: the index breaks ties, so an
// unstable sort of the pairs gives the stable order and a partial sort the first k of a top-k,
// without the reference's comparator (NaN tests per comparison) or its element codec. The
// results are the reference's exactly (values are copied, never computed). Lines over the
// device's arena.
#include "fast_sort.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "fast_program.h"
#include "fast_single_op.h"

namespace kiln::cpu::fast {
namespace {

using ir::OpKind;

// What a sorting op asks for: the first k of each line's order along `axis`.
struct SortSpec {
  std::uint64_t axis = 0, k = 0;
  bool descending = true;
  std::optional<std::size_t> values_out, indices_out;  // which output holds what
};

std::optional<SortSpec> read_spec(const ir::Operation& op) {
  if (op.attrs.size() != 2 || op.inputs().size() != 1) return std::nullopt;
  const ir::Shape& xs = op.inputs()[0].shape;
  const auto attr = [&](std::size_t i) { return static_cast<std::uint64_t>(op.attrs[i]); };
  if (op.attrs[0] < 0 || attr(0) >= xs.size() || op.attrs[1] < 0) return std::nullopt;
  SortSpec s;
  s.axis = attr(0);
  switch (op.kind) {
    case OpKind::Numeric_Sort:
    case OpKind::Numeric_ArgSort:
    case OpKind::Numeric_SortWithIndices:
      if (attr(1) > 1) return std::nullopt;
      s.descending = attr(1) == 1;
      s.k = xs[s.axis];
      break;
    default:  // TopK, ArgTopK, TopKWithIndices: [axis, k], the largest first
      s.k = attr(1);
      if (s.k > xs[s.axis]) return std::nullopt;
  }
  switch (op.kind) {
    case OpKind::Numeric_Sort:
    case OpKind::Numeric_TopK: s.values_out = 0; break;
    case OpKind::Numeric_ArgSort:
    case OpKind::Numeric_ArgTopK: s.indices_out = 0; break;
    default: s.values_out = 0, s.indices_out = 1;
  }
  return s;
}

template <class T>
using Key = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;

// The key whose unsigned order is the sort order of v.
template <class T>
Key<T> sort_key(T v, bool descending) {
  using K = Key<T>;
  constexpr K sign = K{1} << (sizeof(K) * 8 - 1);
  K key;
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(v)) {
      key = std::numeric_limits<K>::max();
    } else {
      const K bits = std::bit_cast<K>(v == T{0} ? T{0} : v);  // -0 sorts as +0
      key = (bits & sign) != 0 ? ~bits : (bits | sign);
    }
  } else {
    key = static_cast<K>(v) ^ sign;
  }
  return descending ? ~key : key;
}

// Key and index as one sortable value: a 32-bit key and a 32-bit index in one word, else a pair.
template <class T>
using Entry = std::conditional_t<sizeof(T) == 4, std::uint64_t, std::pair<std::uint64_t, std::uint64_t>>;

template <class T>
Entry<T> entry(Key<T> key, std::uint64_t j) {
  if constexpr (sizeof(T) == 4)
    return (static_cast<std::uint64_t>(key) << 32) | j;
  else
    return {key, j};
}
template <class T>
std::uint64_t index_of(const Entry<T>& e) {
  if constexpr (sizeof(T) == 4)
    return e & 0xffffffffu;
  else
    return e.second;
}

// Lines [begin, end) of x viewed as [outer, n, inner] (line = o · inner + i): the first k of each
// line's order into values and / or indices (null: not wanted), viewed as [outer, k, inner].
template <class T, class I>
void sort_lines(const T* x, T* values, I* indices, std::uint64_t n, std::uint64_t inner, std::uint64_t k,
                bool descending, std::uint64_t begin, std::uint64_t end) {
  std::vector<Entry<T>> order(static_cast<std::size_t>(n));
  for (std::uint64_t line = begin; line < end; ++line) {
    const std::uint64_t o = line / inner, i = line % inner;
    const T* in = x + o * n * inner + i;
    for (std::uint64_t j = 0; j < n; ++j) order[j] = entry<T>(sort_key(in[j * inner], descending), j);
    if (k < n)
      std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end());
    else
      std::sort(order.begin(), order.end());
    const std::uint64_t out = o * k * inner + i;
    for (std::uint64_t j = 0; j < k; ++j) {
      const std::uint64_t from = index_of<T>(order[j]);
      if (values != nullptr) values[out + j * inner] = in[from * inner];
      if (indices != nullptr) indices[out + j * inner] = static_cast<I>(from);
    }
  }
}

bool sortable(ir::DType d) {
  return d == ir::dtypes::f32 || d == ir::dtypes::f64 || d == ir::dtypes::i32 || d == ir::dtypes::i64;
}

// The outputs' shapes and dtypes as the builders make them (x with [axis] = k; values of x's dtype;
// indices i32 or i64 holding n - 1).
bool outputs_fit(const ir::Operation& op, const SortSpec& s) {
  const ir::TensorIr& x = op.inputs()[0];
  ir::Shape expected = x.shape;
  expected[s.axis] = s.k;
  const std::size_t count = (s.values_out ? 1 : 0) + (s.indices_out ? 1 : 0);
  if (op.outputs().size() != count) return false;
  for (const ir::TensorIr& out : op.outputs())
    if (out.shape != expected) return false;
  if (s.values_out && !(op.outputs()[*s.values_out].dtype == x.dtype)) return false;
  if (s.indices_out) {
    const ir::DType d = op.outputs()[*s.indices_out].dtype;
    const std::uint64_t n = x.shape[s.axis];
    if (d == ir::dtypes::i32) return n <= std::uint64_t{1} << 31;
    return d == ir::dtypes::i64 && n <= std::uint64_t{1} << 32;
  }
  return true;
}

}  // namespace

bool is_sort_kind(OpKind kind) {
  return kind == OpKind::Numeric_Sort || kind == OpKind::Numeric_ArgSort || kind == OpKind::Numeric_SortWithIndices ||
         kind == OpKind::Numeric_TopK || kind == OpKind::Numeric_ArgTopK || kind == OpKind::Numeric_TopKWithIndices;
}

bool run_sort(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles) {
  const std::optional<SortSpec> spec = read_spec(op);
  if (!spec || !sortable(op.inputs()[0].dtype) || !outputs_fit(op, *spec)) return false;
  const std::optional<std::vector<const HostTensor*>> held = held_inputs(op, handles);
  if (!held) return false;
  std::vector<HostTensor> outs;
  for (const ir::TensorIr& out : op.outputs()) {
    Result<HostTensor> t = HostTensor::allocate(device.allocator(), out.shape, out.dtype);
    if (!t.ok()) return false;
    outs.push_back(std::move(t).value());
  }
  const HostTensor& x = *(*held)[0];
  const ir::Shape& xs = x.shape();
  std::uint64_t outer = 1, inner = 1;
  for (std::size_t d = 0; d < spec->axis; ++d) outer *= xs[d];
  for (std::size_t d = spec->axis + 1; d < xs.size(); ++d) inner *= xs[d];
  const std::uint64_t n = xs[spec->axis];
  const Launch launch = launch_on(device);
  const std::uint64_t grain = std::max<std::uint64_t>(1, kParallelThreshold / std::max<std::uint64_t>(1, 8 * n));
  auto run = [&]<class T, class I>(T*, I*) {
    T* values = spec->values_out ? reinterpret_cast<T*>(outs[*spec->values_out].mutable_data()) : nullptr;
    I* indices = spec->indices_out ? reinterpret_cast<I*>(outs[*spec->indices_out].mutable_data()) : nullptr;
    const T* in = reinterpret_cast<const T*>(x.data());
    parallel_ranges(launch, outer * inner, grain, [&](std::uint64_t begin, std::uint64_t end) {
      sort_lines<T, I>(in, values, indices, n, inner, spec->k, spec->descending, begin, end);
    });
  };
  auto with_index = [&]<class T>(T* t) {
    if (spec->indices_out && op.outputs()[*spec->indices_out].dtype == ir::dtypes::i32)
      run(t, static_cast<std::int32_t*>(nullptr));
    else
      run(t, static_cast<std::int64_t*>(nullptr));
  };
  const ir::DType d = x.dtype();
  if (d == ir::dtypes::f32) with_index(static_cast<float*>(nullptr));
  if (d == ir::dtypes::f64) with_index(static_cast<double*>(nullptr));
  if (d == ir::dtypes::i32) with_index(static_cast<std::int32_t*>(nullptr));
  if (d == ir::dtypes::i64) with_index(static_cast<std::int64_t*>(nullptr));
  commit(op, handles, outs);
  return true;
}

}  // namespace kiln::cpu::fast

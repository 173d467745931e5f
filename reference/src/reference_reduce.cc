// Reference kernels: whole-tensor and per-axis reductions, arg reductions, max/min with indices,
// top-k, sorting and cumulative scans.
//
// A reduction along `axis` views the input as [outer, n, inner] (outer = product of the dims
// before the axis, inner = product after): element (o, j, i) is at (o * n + j) * inner + i and
// output element (o, i) at o * inner + i. A whole-tensor reduction is the case outer = inner = 1.
// Floats accumulate in f64 and integers in i64 / u64 (wrapping), always in index order, so the
// result is deterministic.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <utility>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

using ir::OpKind;

enum class Red { Sum, Mean, Prod, Max, Min, MaxAbs, All, Any, ArgMax, ArgMin };

std::optional<Red> red_of(OpKind k) {
  switch (k) {
    case OpKind::Numeric_Sum:
    case OpKind::Numeric_SumDim: return Red::Sum;
    case OpKind::Numeric_Mean:
    case OpKind::Numeric_MeanDim: return Red::Mean;
    case OpKind::Numeric_Prod:
    case OpKind::Numeric_ProdDim: return Red::Prod;
    case OpKind::Numeric_Max:
    case OpKind::Numeric_MaxDim: return Red::Max;
    case OpKind::Numeric_Min:
    case OpKind::Numeric_MinDim: return Red::Min;
    case OpKind::Numeric_MaxAbs:
    case OpKind::Numeric_MaxAbsDim: return Red::MaxAbs;
    case OpKind::Base_All:
    case OpKind::Base_AllDim: return Red::All;
    case OpKind::Base_Any:
    case OpKind::Base_AnyDim: return Red::Any;
    case OpKind::Numeric_ArgMax: return Red::ArgMax;
    case OpKind::Numeric_ArgMin: return Red::ArgMin;
    default: return std::nullopt;
  }
}

// The [outer, n, inner] view of a reduction along `axis` of `shape`.
struct AxisView {
  std::uint64_t outer = 1, n = 1, inner = 1;
  std::uint64_t at(std::uint64_t o, std::uint64_t j, std::uint64_t i) const { return (o * n + j) * inner + i; }
};
AxisView axis_view(const ir::Shape& s, std::size_t axis) {
  return AxisView{dims_product(s, 0, axis), s[axis], dims_product(s, axis + 1, s.size())};
}
AxisView whole_view(const HostTensor& t) { return AxisView{1, t.num_elements(), 1}; }

// Does `a` beat the current best `b` for ArgMax / ArgMin? Strict, so the first occurrence wins;
// NaN beats everything (PyTorch: the index of the first NaN).
template <class T>
bool beats(bool is_max, T a, T b) {
  if (is_nan(b)) return false;
  if (is_nan(a)) return true;
  return is_max ? a > b : a < b;
}

// |v| as a magnitude that never overflows (u64 for integers).
template <class T>
auto magnitude(T v) {
  if constexpr (std::is_same_v<T, double>)
    return std::fabs(v);
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return v < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(v) : static_cast<std::uint64_t>(v);
  else
    return v;
}

// All / Any of every line, any dtype: truthiness (x != 0; NaN is true).
void reduce_truthiness(Red r, const HostTensor& x, const AxisView& v, HostTensor& out) {
  for (std::uint64_t o = 0; o < v.outer; ++o)
    for (std::uint64_t i = 0; i < v.inner; ++i) {
      bool acc = r == Red::All;
      for (std::uint64_t j = 0; j < v.n; ++j) {
        const bool b = x.get_bool(v.at(o, j, i));
        acc = r == Red::All ? (acc && b) : (acc || b);
      }
      element::store_bool(out.mutable_data(), out.dtype(), o * v.inner + i, acc);
    }
}

// The numeric reductions' refusals: no identity over an empty dim, an integer mean of nothing,
// an arg index the output cannot hold.
Status check_numeric_reduction(const Ctx& c, Red r, const HostTensor& x, const AxisView& v) {
  if (v.n == 0 && (r == Red::Max || r == Red::Min || r == Red::MaxAbs || r == Red::ArgMax || r == Red::ArgMin))
    return c.error(ErrorCode::Invalid, "cannot reduce an empty dimension: the reduction has no identity");
  if (v.n == 0 && r == Red::Mean && !x.dtype().is_float())
    return c.error(ErrorCode::Invalid, "integer mean of an empty dimension divides by zero");
  if (r == Red::ArgMax || r == Red::ArgMin) KILN_RETURN_IF_ERROR(expect_index_fits(c, 0, v.n - 1));
  return Status::Ok();
}

// Sum or Mean of line (o, i).
template <class T>
T sum_or_mean_line(Red r, const HostTensor& x, const AxisView& v, std::uint64_t o, std::uint64_t i) {
  T acc = 0;
  for (std::uint64_t j = 0; j < v.n; ++j) {
    if constexpr (std::is_same_v<T, double>)
      acc += load<T>(x, v.at(o, j, i));
    else
      acc = wrap_add(acc, load<T>(x, v.at(o, j, i)));
  }
  if (r == Red::Mean) {
    if constexpr (std::is_same_v<T, double>)
      acc = acc / static_cast<double>(v.n);  // 0/0 = NaN if empty
    else if constexpr (std::is_signed_v<T>)
      acc = acc / static_cast<std::int64_t>(v.n);  // truncates
    else
      acc = acc / v.n;
  }
  return acc;
}

// Prod of line (o, i).
template <class T>
T prod_line(const HostTensor& x, const AxisView& v, std::uint64_t o, std::uint64_t i) {
  T acc = 1;
  for (std::uint64_t j = 0; j < v.n; ++j) {
    if constexpr (std::is_same_v<T, double>)
      acc *= load<T>(x, v.at(o, j, i));
    else
      acc = wrap_mul(acc, load<T>(x, v.at(o, j, i)));
  }
  return acc;
}

// Max or Min of line (o, i), which is not empty.
template <class T>
T extremum_line(Red r, const HostTensor& x, const AxisView& v, std::uint64_t o, std::uint64_t i) {
  T acc = load<T>(x, v.at(o, 0, i));
  for (std::uint64_t j = 1; j < v.n; ++j) {
    const T e = load<T>(x, v.at(o, j, i));
    acc = r == Red::Max ? max_nan(acc, e) : min_nan(acc, e);
  }
  return acc;
}

// MaxAbs of line (o, i), which is not empty, as a magnitude.
template <class T>
auto max_abs_line(const HostTensor& x, const AxisView& v, std::uint64_t o, std::uint64_t i) {
  auto acc = magnitude(load<T>(x, v.at(o, 0, i)));
  for (std::uint64_t j = 1; j < v.n; ++j) acc = max_nan(acc, magnitude(load<T>(x, v.at(o, j, i))));
  return acc;
}

// The extreme of one line along the axis and the index of its first occurrence.
template <class T>
std::pair<T, std::uint64_t> best_of_line(const HostTensor& x, const AxisView& v, std::uint64_t o, std::uint64_t i,
                                         bool is_max) {
  T best = load<T>(x, v.at(o, 0, i));
  std::uint64_t at = 0;
  for (std::uint64_t j = 1; j < v.n; ++j) {
    const T e = load<T>(x, v.at(o, j, i));
    if (beats(is_max, e, best)) {
      best = e;
      at = j;
    }
  }
  return {best, at};
}

// ArgMax or ArgMin of line (o, i), which is not empty: the index j of the best element.
template <class T>
std::uint64_t arg_line(Red r, const HostTensor& x, const AxisView& v, std::uint64_t o, std::uint64_t i) {
  return best_of_line<T>(x, v, o, i, r == Red::ArgMax).second;
}

// Every line of a numeric reduction, in domain T, into its output element.
template <class T>
void reduce_numeric(Red r, const HostTensor& x, const AxisView& v, HostTensor& out) {
  for (std::uint64_t o = 0; o < v.outer; ++o) {
    for (std::uint64_t i = 0; i < v.inner; ++i) {
      const std::uint64_t dst = o * v.inner + i;
      switch (r) {
        case Red::Sum:
        case Red::Mean: store<T>(out, dst, sum_or_mean_line<T>(r, x, v, o, i)); break;
        case Red::Prod: store<T>(out, dst, prod_line<T>(x, v, o, i)); break;
        case Red::Max:
        case Red::Min: store<T>(out, dst, extremum_line<T>(r, x, v, o, i)); break;
        case Red::MaxAbs: {
          const auto acc = max_abs_line<T>(x, v, o, i);
          if constexpr (std::is_same_v<T, double>)
            store<double>(out, dst, acc);
          else
            store<std::uint64_t>(out, dst, acc);  // wraps like abs: |i8 -128| stays -128
          break;
        }
        case Red::ArgMax:
        case Red::ArgMin: element::store_u64(out.mutable_data(), out.dtype(), dst, arg_line<T>(r, x, v, o, i)); break;
        case Red::All:
        case Red::Any: break;  // handled by reduce_truthiness
      }
    }
  }
}

// Reduces every (o, i) line of the view into output element o * inner + i.
Result<Outputs> reduce_lines(const Ctx& c, Red r, const HostTensor& x, const AxisView& v) {
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t lines = v.outer * v.inner;
  if (lines == 0) return single(std::move(out));

  if (r == Red::All || r == Red::Any) {
    reduce_truthiness(r, x, v, out);
    return single(std::move(out));
  }

  KILN_RETURN_IF_ERROR(check_numeric_reduction(c, r, x, v));
  return dispatch(domain_of(x.dtype()), [&]<class T>() -> Result<Outputs> {
    if constexpr (std::is_same_v<T, bool>) {
      return c.error(ErrorCode::DTypeMismatch, "numeric reduction of a bool tensor");
    } else {
      reduce_numeric<T>(r, x, v, out);
      return single(std::move(out));
    }
  });
}

}  // namespace

// ---- Whole-tensor reductions: output shape [1] (rank 1, docs/spec/ir.md §5.11).

Result<Outputs> run_reduce(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const std::optional<Red> r = red_of(c.op.kind);
  if (!r) return c.error(ErrorCode::Internal, "reduce: unknown kind");
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::Shape{1}));
  if (*r == Red::All || *r == Red::Any) {
    KILN_RETURN_IF_ERROR(expect_out_bool(c, 0));
  } else {
    KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  }
  return reduce_lines(c, *r, x, whole_view(x));
}

// ---- Reductions along an axis: the axis is kept with size accumulator_len, which is 1 for
// every kind of the table but TopK / ArgTopK (k, run_topk below).

Result<Outputs> run_reduce_dim(const Ctx& c) {
  if (c.op.kind == OpKind::Numeric_TopK || c.op.kind == OpKind::Numeric_ArgTopK) return run_topk(c);
  const HostTensor& x = c.in[0];
  const std::optional<Red> r = red_of(c.op.kind);
  if (!r) return c.error(ErrorCode::Internal, "reduce_dim: unknown kind");
  KILN_ASSIGN_OR_RETURN(std::size_t axis, axis_attr(c, 0, x.shape().size(), "axis"));
  if (c.op.attrs[1] != 1)
    return c.error(ErrorCode::Invalid, fmt::format("accumulator_len must be 1, got {}", c.op.attrs[1]));
  ir::Shape expected = x.shape();
  expected[axis] = 1;
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, expected));
  if (*r == Red::All || *r == Red::Any) {
    KILN_RETURN_IF_ERROR(expect_out_bool(c, 0));
  } else if (*r == Red::ArgMax || *r == Red::ArgMin) {
    KILN_RETURN_IF_ERROR(expect_out_integral(c, 0));
  } else {
    KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  }
  return reduce_lines(c, *r, x, axis_view(x.shape(), axis));
}

// ---- MaxDimWithIndices / MinDimWithIndices: the value (NaN propagates) and the index of its
// first occurrence (the first NaN if any), both with the axis kept at size 1.

Result<Outputs> run_reduce_dim_with_indices(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const bool is_max = c.op.kind == OpKind::Numeric_MaxDimWithIndices;
  if (!is_max && c.op.kind != OpKind::Numeric_MinDimWithIndices)
    return c.error(ErrorCode::Internal, "reduce_dim_with_indices: unknown kind");
  KILN_ASSIGN_OR_RETURN(std::size_t axis, axis_attr(c, 0, x.shape().size(), "dim"));
  ir::Shape expected = x.shape();
  expected[axis] = 1;
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, expected));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 1, expected));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  const AxisView v = axis_view(x.shape(), axis);
  KILN_ASSIGN_OR_RETURN(HostTensor values, c.new_output(0));
  KILN_ASSIGN_OR_RETURN(HostTensor indices, c.new_output(1));
  Outputs outs;
  if (v.outer * v.inner != 0) {
    if (v.n == 0) return c.error(ErrorCode::Invalid, "cannot reduce an empty dimension: the reduction has no identity");
    KILN_RETURN_IF_ERROR(expect_index_fits(c, 1, v.n - 1));
    Status st = dispatch(domain_of(x.dtype()), [&]<class T>() -> Status {
      if constexpr (std::is_same_v<T, bool>) {
        return c.error(ErrorCode::DTypeMismatch, "numeric reduction of a bool tensor");
      } else {
        for (std::uint64_t o = 0; o < v.outer; ++o)
          for (std::uint64_t i = 0; i < v.inner; ++i) {
            const auto [best, at] = best_of_line<T>(x, v, o, i, is_max);
            store<T>(values, o * v.inner + i, best);
            element::store_u64(indices.mutable_data(), indices.dtype(), o * v.inner + i, at);
          }
        return Status::Ok();
      }
    });
    KILN_RETURN_IF_ERROR(st);
  } else {
    KILN_RETURN_IF_ERROR(expect_out_integral(c, 1));
  }
  outs.push_back(std::move(values));
  outs.push_back(std::move(indices));
  return outs;
}

// ---- Sorting along an axis: TopKWithIndices, TopK / ArgTopK (ReduceDim, k = accumulator_len),
// Sort / ArgSort / SortWithIndices (docs/spec/ir.md §5.5). One stable sort per line: equal values
// keep their index order (torch.sort(stable=True); ±0 are equal); NaN sorts as larger than every
// number, so it comes first when descending and last when ascending (PyTorch's sort order).

namespace {

template <class T>
bool sorts_before(T a, T b, bool descending) {
  if (is_nan(a) || is_nan(b)) return descending ? is_nan(a) && !is_nan(b) : !is_nan(a) && is_nan(b);
  return descending ? a > b : a < b;
}

// Writes the first k entries of every line's stable sort order as [outer, k, inner] into
// `values` and / or `indices` (null: not wanted). `k` <= v.n.
Status sort_lines(const Ctx& c, const HostTensor& x, const AxisView& v, std::uint64_t k, bool descending,
                  HostTensor* values, HostTensor* indices) {
  return dispatch(domain_of(x.dtype()), [&]<class T>() -> Status {
    if constexpr (std::is_same_v<T, bool>) {
      return c.error(ErrorCode::DTypeMismatch, "sorting a bool tensor");
    } else {
      std::vector<std::uint64_t> order(static_cast<std::size_t>(v.n));
      std::vector<T> line(static_cast<std::size_t>(v.n));
      const AxisView ov{v.outer, k, v.inner};
      for (std::uint64_t o = 0; o < v.outer; ++o)
        for (std::uint64_t i = 0; i < v.inner; ++i) {
          for (std::uint64_t j = 0; j < v.n; ++j) line[j] = load<T>(x, v.at(o, j, i));
          std::iota(order.begin(), order.end(), std::uint64_t{0});
          std::stable_sort(order.begin(), order.end(), [&](std::uint64_t a, std::uint64_t b) {
            return sorts_before(line[a], line[b], descending);
          });
          for (std::uint64_t j = 0; j < k; ++j) {
            if (values != nullptr) store<T>(*values, ov.at(o, j, i), line[order[j]]);
            if (indices != nullptr)
              element::store_u64(indices->mutable_data(), indices->dtype(), ov.at(o, j, i), order[j]);
          }
        }
      return Status::Ok();
    }
  });
}

// The outputs of a sort-like op, x with [axis] = k: values (output `values_out`, x's dtype) and / or
// indices (output `indices_out`, an integer dtype that holds n - 1), in that order.
Result<Outputs> sorted(const Ctx& c, const HostTensor& x, std::size_t axis, std::uint64_t k, bool descending,
                       std::optional<std::size_t> values_out, std::optional<std::size_t> indices_out) {
  ir::Shape expected = x.shape();
  expected[axis] = k;
  const AxisView v = axis_view(x.shape(), axis);
  std::optional<HostTensor> values, indices;
  if (values_out) {
    KILN_RETURN_IF_ERROR(expect_out_shape(c, *values_out, expected));
    KILN_RETURN_IF_ERROR(expect_out_dtype(c, *values_out, x.dtype()));
    KILN_ASSIGN_OR_RETURN(values, c.new_output(*values_out));
  }
  if (indices_out) {
    KILN_RETURN_IF_ERROR(expect_out_shape(c, *indices_out, expected));
    KILN_RETURN_IF_ERROR(expect_index_fits(c, *indices_out, v.n == 0 ? 0 : v.n - 1));
    KILN_ASSIGN_OR_RETURN(indices, c.new_output(*indices_out));
  }
  KILN_RETURN_IF_ERROR(sort_lines(c, x, v, k, descending, values ? &*values : nullptr, indices ? &*indices : nullptr));
  Outputs outs;
  if (values) outs.push_back(std::move(*values));
  if (indices) outs.push_back(std::move(*indices));
  return outs;
}

}  // namespace

// TopKWithIndices: the k largest values along the axis, in descending order, and their indices.
Result<Outputs> run_topk_with_indices(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_ASSIGN_OR_RETURN(std::size_t axis, axis_attr(c, 0, x.shape().size(), "dim"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t k, count_attr(c, 1, "k"));
  if (k > x.shape()[axis])
    return c.error(ErrorCode::Invalid, fmt::format("k {} exceeds dim {} of size {}", k, axis, x.shape()[axis]));
  return sorted(c, x, axis, k, /*descending=*/true, 0, 1);
}

// TopK / ArgTopK: the k largest values along the axis in descending order, or their indices.
Result<Outputs> run_topk(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_ASSIGN_OR_RETURN(std::size_t axis, axis_attr(c, 0, x.shape().size(), "axis"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t k, count_attr(c, 1, "k"));
  if (k > x.shape()[axis])
    return c.error(ErrorCode::Invalid, fmt::format("k {} exceeds axis {} of size {}", k, axis, x.shape()[axis]));
  const bool arg = c.op.kind == OpKind::Numeric_ArgTopK;
  if (arg) return sorted(c, x, axis, k, /*descending=*/true, std::nullopt, 0);
  return sorted(c, x, axis, k, /*descending=*/true, 0, std::nullopt);
}

// Sort / ArgSort / SortWithIndices: attrs [dim, descending].
Result<Outputs> run_sort(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const OpKind k = c.op.kind;
  if (k != OpKind::Numeric_Sort && k != OpKind::Numeric_ArgSort && k != OpKind::Numeric_SortWithIndices)
    return c.error(ErrorCode::Internal, "sort: unknown kind");
  KILN_ASSIGN_OR_RETURN(std::size_t axis, axis_attr(c, 0, x.shape().size(), "dim"));
  KILN_ASSIGN_OR_RETURN(bool descending, flag_attr(c, 1, "descending"));
  const std::uint64_t n = x.shape()[axis];
  if (k == OpKind::Numeric_Sort) return sorted(c, x, axis, n, descending, 0, std::nullopt);
  if (k == OpKind::Numeric_ArgSort) return sorted(c, x, axis, n, descending, std::nullopt, 0);
  return sorted(c, x, axis, n, descending, 0, 1);
}

// ---- Cumulative scans along an axis. Floats accumulate in f64 and each output is the rounded
// running value; CumMax / CumMin propagate NaN (once seen, every later output is NaN).

Result<Outputs> run_cumulative(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const OpKind k = c.op.kind;
  if (k != OpKind::Numeric_CumSum && k != OpKind::Numeric_CumProd && k != OpKind::Numeric_CumMin &&
      k != OpKind::Numeric_CumMax)
    return c.error(ErrorCode::Internal, "cumulative: unknown kind");
  KILN_ASSIGN_OR_RETURN(std::size_t axis, axis_attr(c, 0, x.shape().size(), "axis"));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const AxisView v = axis_view(x.shape(), axis);
  return dispatch(domain_of(x.dtype()), [&]<class T>() -> Result<Outputs> {
    if constexpr (std::is_same_v<T, bool>) {
      return c.error(ErrorCode::DTypeMismatch, "cumulative op on a bool tensor");
    } else {
      for (std::uint64_t o = 0; o < v.outer; ++o)
        for (std::uint64_t i = 0; i < v.inner; ++i) {
          T acc = 0;
          for (std::uint64_t j = 0; j < v.n; ++j) {
            const T e = load<T>(x, v.at(o, j, i));
            if (j == 0) {
              acc = e;
            } else if (k == OpKind::Numeric_CumSum) {
              if constexpr (std::is_same_v<T, double>)
                acc += e;
              else
                acc = wrap_add(acc, e);
            } else if (k == OpKind::Numeric_CumProd) {
              if constexpr (std::is_same_v<T, double>)
                acc *= e;
              else
                acc = wrap_mul(acc, e);
            } else if (k == OpKind::Numeric_CumMax) {
              acc = max_nan(acc, e);
            } else {
              acc = min_nan(acc, e);
            }
            store<T>(out, v.at(o, j, i), acc);
          }
        }
      return single(std::move(out));
    }
  });
}

}  // namespace kiln::reference::kernels

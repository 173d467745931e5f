// Reference kernels: matmul (float and int), embedding, and (at the end) linear with its
// backwards, layer_norm, batch_norm and embedding_backward (the convolutions are in
// reference_conv.cc, the pools in reference_pool.cc). Direct loops straight from the definitions,
// accumulating floats in f64 (integers in wrapping i64 / u64) in index order.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "reference_internal.h"

namespace kiln::reference::kernels {
namespace {

using ir::OpKind;

Status expect_rank(const Ctx& c, const HostTensor& t, std::size_t rank, const char* what) {
  if (t.shape().size() != rank)
    return c.error(ErrorCode::RankMismatch, fmt::format("{} {} must have rank {}", what, t.to_string(), rank));
  return Status::Ok();
}

}  // namespace

// ---- Matmul: [..., m, k] x [..., k, n] -> [..., m, n], batch dims broadcast (docs/spec/ir.md §4
// matmul_output). Float: any two float dtypes (mixed), f64 accumulation, output rounded once.
// Int: equal integer dtypes, wrapping accumulation.

Result<Outputs> run_matmul(const Ctx& c) {
  const HostTensor& a = c.in[0];
  const HostTensor& b = c.in[1];
  const bool is_float = c.op.kind == OpKind::Float_Matmul;
  if (is_float) {
    if (!a.dtype().is_float() || !b.dtype().is_float() || !c.out_ir().dtype.is_float())
      return c.error(ErrorCode::DTypeMismatch, fmt::format("operands {} x {} -> {} must all be float", a.to_string(),
                                                           b.to_string(), c.out_ir().to_string()));
  } else {
    KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
    KILN_RETURN_IF_ERROR(expect_out_integral(c, 0));
  }
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::shape::matmul_output(a.shape(), b.shape())));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::size_t r = out.shape().size();
  const std::uint64_t m = a.shape()[r - 2];
  const std::uint64_t k = a.shape()[r - 1];
  const std::uint64_t n = b.shape()[r - 1];
  ir::Shape batch(out.shape().begin(), out.shape().end() - 2);
  ir::Shape a_batch(a.shape().begin(), a.shape().end() - 2);
  ir::Shape b_batch(b.shape().begin(), b.shape().end() - 2);
  const std::vector<std::uint64_t> amap = broadcast_map(a_batch, batch);
  const std::vector<std::uint64_t> bmap = broadcast_map(b_batch, batch);
  const Domain d = is_float ? Domain::Float : domain_of(a.dtype());
  return dispatch(d, [&]<class T>() -> Result<Outputs> {
    if constexpr (std::is_same_v<T, bool>) {
      return c.error(ErrorCode::DTypeMismatch, "matmul of bool tensors");
    } else {
      for (std::size_t bi = 0; bi < amap.size(); ++bi) {
        const std::uint64_t a0 = amap[bi] * m * k;
        const std::uint64_t b0 = bmap[bi] * k * n;
        const std::uint64_t o0 = bi * m * n;
        for (std::uint64_t i = 0; i < m; ++i)
          for (std::uint64_t j = 0; j < n; ++j) {
            T acc = 0;
            for (std::uint64_t p = 0; p < k; ++p) {
              const T x = load<T>(a, a0 + i * k + p);
              const T y = load<T>(b, b0 + p * n + j);
              if constexpr (std::is_same_v<T, double>)
                acc += x * y;
              else
                acc = wrap_add(acc, wrap_mul(x, y));
            }
            store<T>(out, o0 + i * n + j, acc);
          }
      }
      return single(std::move(out));
    }
  });
}

// ---- Embedding{weights [V, E], indices [B, S]}: out[b, s, :] = weights[indices[b, s], :].

Result<Outputs> run_embedding(const Ctx& c) {
  const HostTensor& weights = c.in[0];
  const HostTensor& idx = c.in[1];
  KILN_RETURN_IF_ERROR(expect_rank(c, weights, 2, "weights"));
  KILN_RETURN_IF_ERROR(expect_rank(c, idx, 2, "indices"));
  if (!idx.dtype().is_integral())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("indices {} must have an integer dtype", idx.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, weights.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::Shape{idx.shape()[0], idx.shape()[1], weights.shape()[1]}));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t E = weights.shape()[1];
  for (std::uint64_t t = 0; t < idx.num_elements(); ++t) {
    KILN_ASSIGN_OR_RETURN(std::uint64_t row, checked_index(c, idx, t, weights.shape()[0], "embedding"));
    for (std::uint64_t e = 0; e < E; ++e) copy_element(weights, row * E + e, out, t * E + e);
  }
  return single(std::move(out));
}

}  // namespace kiln::reference::kernels

// ---- Dense layers, norms and the embedding's gradient (docs/spec/ir.md §5.8, §6.3). The weight of
// Linear is [d_in, d_out] (Burn's layout: out = x · weight + bias); every leading dim of x is a
// row. Sums run in f64 in index order and each output is rounded once.

namespace kiln::reference::kernels {
namespace {

Status expect_float(const Ctx& c, const HostTensor& t, const char* what) {
  if (!t.dtype().is_float())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("{} {} must have a float dtype", what, t.to_string()));
  return Status::Ok();
}

// The last dim of a tensor of rank >= 1 (its features).
Result<std::uint64_t> features(const Ctx& c, const HostTensor& t, const char* what) {
  if (t.shape().empty())
    return c.error(ErrorCode::RankMismatch, fmt::format("{} {} must have rank at least 1", what, t.to_string()));
  return t.shape().back();
}

// The number of rows of a tensor of rank >= 1: the product of its leading dims.
std::uint64_t rows_of(const HostTensor& t) { return dims_product(t.shape(), 0, t.shape().size() - 1); }

// A per-feature or per-channel vector: rank 1, n elements.
Status expect_vector(const Ctx& c, const HostTensor& t, std::uint64_t n, const char* what) {
  if (t.shape() != ir::Shape{n})
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("{} {} must have shape [{}]", what, t.to_string(), n));
  return Status::Ok();
}

ir::Shape with_last(ir::Shape s, std::uint64_t last) {
  s.back() = last;
  return s;
}

// The builders keep epsilon finite and non-negative; a hand-made op gets an error, not NaNs.
Result<double> epsilon_value(const Ctx& c, double epsilon) {
  if (!std::isfinite(epsilon) || epsilon < 0)
    return c.error(ErrorCode::Invalid, fmt::format("epsilon must be finite and non-negative, got {}", epsilon));
  return epsilon;
}

// Linear's checks: x [..., d_in], weight [d_in, d_out], bias? [d_out], one float dtype; d_out.
Result<std::uint64_t> linear_shapes(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const HostTensor& w = c.in[1];
  KILN_RETURN_IF_ERROR(expect_float(c, x, "x"));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
  if (c.in.size() > 2) KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 2));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_in, features(c, x, "x"));
  KILN_RETURN_IF_ERROR(expect_rank(c, w, 2, "weight"));
  if (w.shape()[0] != d_in)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("x {} has {} features, weight {} takes {}", x.to_string(),
                                                              d_in, w.to_string(), w.shape()[0]));
  const std::uint64_t d_out = w.shape()[1];
  if (c.in.size() > 2) KILN_RETURN_IF_ERROR(expect_vector(c, c.in[2], d_out, "bias"));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, with_last(x.shape(), d_out)));
  return d_out;
}

// LinearXBackward{weight [d_in, d_out], output_grad [..., d_out]}: out[r, i] = Σ_j g[r, j] · w[i, j].
Result<Outputs> run_linear_x_backward(const Ctx& c) {
  const HostTensor& w = c.in[0];
  const HostTensor& g = c.in[1];
  KILN_RETURN_IF_ERROR(expect_float(c, w, "weight"));
  KILN_RETURN_IF_ERROR(expect_float(c, g, "output_grad"));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, g.dtype()));
  KILN_RETURN_IF_ERROR(expect_rank(c, w, 2, "weight"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_out, features(c, g, "output_grad"));
  if (w.shape()[1] != d_out)
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("output_grad {} has {} features, weight {} gives {}",
                                                              g.to_string(), d_out, w.to_string(), w.shape()[1]));
  const std::uint64_t d_in = w.shape()[0];
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, with_last(g.shape(), d_in)));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  for (std::uint64_t r = 0, rows = rows_of(g); r < rows; ++r)
    for (std::uint64_t i = 0; i < d_in; ++i) {
      double acc = 0.0;
      for (std::uint64_t j = 0; j < d_out; ++j) acc += g.get_f64(r * d_out + j) * w.get_f64(i * d_out + j);
      element::store_f64(out.mutable_data(), out.dtype(), r * d_in + i, acc);
    }
  return single(std::move(out));
}

// LinearWeightBackward{x [..., d_in], output_grad [..., d_out]} (the same leading dims):
// out[i, j] = Σ_r x[r, i] · g[r, j].
Result<Outputs> run_linear_weight_backward(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const HostTensor& g = c.in[1];
  KILN_RETURN_IF_ERROR(expect_float(c, x, "x"));
  KILN_RETURN_IF_ERROR(expect_float(c, g, "output_grad"));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, g.dtype()));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_in, features(c, x, "x"));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_out, features(c, g, "output_grad"));
  if (x.shape().size() != g.shape().size() || !std::equal(x.shape().begin(), x.shape().end() - 1, g.shape().begin()))
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("x {} and output_grad {} must have the same leading dims",
                                                              x.to_string(), g.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::Shape{d_in, d_out}));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  std::vector<double> acc(static_cast<std::size_t>(d_in * d_out), 0.0);
  for (std::uint64_t r = 0, rows = rows_of(x); r < rows; ++r)
    for (std::uint64_t i = 0; i < d_in; ++i) {
      const double xv = x.get_f64(r * d_in + i);
      for (std::uint64_t j = 0; j < d_out; ++j) acc[i * d_out + j] += xv * g.get_f64(r * d_out + j);
    }
  for (std::uint64_t k = 0; k < acc.size(); ++k) element::store_f64(out.mutable_data(), out.dtype(), k, acc[k]);
  return single(std::move(out));
}

}  // namespace

// Linear: out[r, j] = Σ_i x[r, i] · w[i, j], then + bias[j] (matmul, then the bias, as Burn).
Result<Outputs> run_linear(const Ctx& c) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_out, linear_shapes(c));
  const HostTensor& x = c.in[0];
  const HostTensor& w = c.in[1];
  const HostTensor* bias = c.in.size() > 2 ? &c.in[2] : nullptr;
  const std::uint64_t d_in = x.shape().back();
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  for (std::uint64_t r = 0, rows = rows_of(x); r < rows; ++r)
    for (std::uint64_t j = 0; j < d_out; ++j) {
      double acc = 0.0;
      for (std::uint64_t i = 0; i < d_in; ++i) acc += x.get_f64(r * d_in + i) * w.get_f64(i * d_out + j);
      if (bias) acc += bias->get_f64(j);
      element::store_f64(out.mutable_data(), out.dtype(), r * d_out + j, acc);
    }
  return single(std::move(out));
}

Result<Outputs> run_linear_backward(const Ctx& c) {
  if (c.op.kind == OpKind::Module_LinearXBackward) return run_linear_x_backward(c);
  if (c.op.kind == OpKind::Module_LinearWeightBackward) return run_linear_weight_backward(c);
  return c.error(ErrorCode::Internal, "linear backward: unknown kind");
}

// LinearBiasBackward{output_grad [..., d_out]}: out[j] = Σ_r g[r, j].
Result<Outputs> run_linear_bias_backward(const Ctx& c) {
  const HostTensor& g = c.in[0];
  KILN_RETURN_IF_ERROR(expect_float(c, g, "output_grad"));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, g.dtype()));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d_out, features(c, g, "output_grad"));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, ir::Shape{d_out}));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t rows = rows_of(g);
  for (std::uint64_t j = 0; j < d_out; ++j) {
    double acc = 0.0;
    for (std::uint64_t r = 0; r < rows; ++r) acc += g.get_f64(r * d_out + j);
    element::store_f64(out.mutable_data(), out.dtype(), j, acc);
  }
  return single(std::move(out));
}

// LayerNorm{input [..., d], gamma [d], beta? [d]; attrs [bits(epsilon)]}: per row,
// (x − mean) · rstd · gamma + beta, rstd = 1 / sqrt(var + epsilon) with the biased variance
// Σ(x − mean)² / d (Burn, PyTorch; a product by rstd, as PyTorch computes it, not a quotient: the
// fast path's vectors divide slowly); with three outputs (K) also the row's mean and rstd, [..., 1].
Result<Outputs> run_layer_norm(const Ctx& c) {
  const HostTensor& x = c.in[0];
  const HostTensor& gamma = c.in[1];
  const HostTensor* beta = c.in.size() > 2 ? &c.in[2] : nullptr;
  KILN_RETURN_IF_ERROR(expect_float(c, x, "input"));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
  if (beta) KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 2));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  KILN_ASSIGN_OR_RETURN(std::uint64_t d, features(c, x, "input"));
  KILN_RETURN_IF_ERROR(expect_vector(c, gamma, d, "gamma"));
  if (beta) KILN_RETURN_IF_ERROR(expect_vector(c, *beta, d, "beta"));
  double bits_value = 0;
  std::memcpy(&bits_value, &c.op.attrs[0], sizeof bits_value);
  KILN_ASSIGN_OR_RETURN(double epsilon, epsilon_value(c, bits_value));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  const std::size_t outputs = c.op.outputs().size();
  if (outputs != 1 && outputs != 3)
    return c.error(ErrorCode::Invalid, fmt::format("takes 1 or 3 outputs (out, mean, rstd), got {}", outputs));
  ir::Shape stats_shape = x.shape();
  stats_shape.back() = 1;
  for (std::size_t o = 1; o < outputs; ++o) {
    KILN_RETURN_IF_ERROR(expect_out_shape(c, o, stats_shape));
    KILN_RETURN_IF_ERROR(expect_out_dtype(c, o, x.dtype()));
  }
  Outputs out;
  for (std::size_t o = 0; o < outputs; ++o) {
    KILN_ASSIGN_OR_RETURN(HostTensor t, c.new_output(o));
    out.push_back(std::move(t));
  }
  for (std::uint64_t r = 0, rows = rows_of(x); r < rows; ++r) {
    const std::uint64_t row = r * d;
    double sum = 0.0;
    for (std::uint64_t i = 0; i < d; ++i) sum += x.get_f64(row + i);
    const double mean = sum / static_cast<double>(d);
    double squares = 0.0;
    for (std::uint64_t i = 0; i < d; ++i) squares += (x.get_f64(row + i) - mean) * (x.get_f64(row + i) - mean);
    const double rstd = 1.0 / std::sqrt(squares / static_cast<double>(d) + epsilon);
    for (std::uint64_t i = 0; i < d; ++i) {
      const double y = (x.get_f64(row + i) - mean) * rstd * gamma.get_f64(i) + (beta ? beta->get_f64(i) : 0.0);
      element::store_f64(out[0].mutable_data(), out[0].dtype(), row + i, y);
    }
    if (outputs == 3) {
      element::store_f64(out[1].mutable_data(), out[1].dtype(), r, mean);
      element::store_f64(out[2].mutable_data(), out[2].dtype(), r, rstd);
    }
  }
  return out;
}

// BatchNorm{x [N, C, ...], gamma, beta, mean, variance [C]; scalar epsilon}, the inference form:
// (x − mean[c]) / sqrt(variance[c] + epsilon) · gamma[c] + beta[c] for x's channel c (dim 1).
Result<Outputs> run_batch_norm(const Ctx& c) {
  const HostTensor& x = c.in[0];
  KILN_RETURN_IF_ERROR(expect_float(c, x, "x"));
  for (std::size_t i = 1; i < 5; ++i) KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, i));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, x.dtype()));
  if (x.shape().size() < 2)
    return c.error(ErrorCode::RankMismatch, fmt::format("x {} must have rank at least 2", x.to_string()));
  const std::uint64_t channels = x.shape()[1];
  static constexpr const char* kStats[] = {"gamma", "beta", "mean", "variance"};
  for (std::size_t i = 1; i < 5; ++i) KILN_RETURN_IF_ERROR(expect_vector(c, c.in[i], channels, kStats[i - 1]));
  KILN_ASSIGN_OR_RETURN(double epsilon, epsilon_value(c, c.op.scalars[0].to_f64()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, x.shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  const std::uint64_t inner = dims_product(x.shape(), 2, x.shape().size());
  for (std::uint64_t k = 0, n = x.num_elements(); k < n; ++k) {
    const std::uint64_t ch = (k / inner) % channels;  // n > 0: inner and channels are too
    const double y =
        (x.get_f64(k) - c.in[3].get_f64(ch)) / std::sqrt(c.in[4].get_f64(ch) + epsilon) * c.in[1].get_f64(ch) +
        c.in[2].get_f64(ch);
    element::store_f64(out.mutable_data(), out.dtype(), k, y);
  }
  return single(std::move(out));
}

// EmbeddingBackward{weights [V, E], out_grad [B, S, E], indices [B, S]}: zeros of weights' shape,
// out[indices[b, s], :] += out_grad[b, s, :] in index order (duplicate indices accumulate); an index
// outside [0, V) is an error.
Result<Outputs> run_embedding_backward(const Ctx& c) {
  const HostTensor& weights = c.in[0];
  const HostTensor& grad = c.in[1];
  const HostTensor& idx = c.in[2];
  KILN_RETURN_IF_ERROR(expect_float(c, weights, "weights"));
  KILN_RETURN_IF_ERROR(expect_same_dtype(c, 0, 1));
  KILN_RETURN_IF_ERROR(expect_rank(c, weights, 2, "weights"));
  KILN_RETURN_IF_ERROR(expect_rank(c, idx, 2, "indices"));
  if (!idx.dtype().is_integral())
    return c.error(ErrorCode::DTypeMismatch, fmt::format("indices {} must have an integer dtype", idx.to_string()));
  const std::uint64_t V = weights.shape()[0], E = weights.shape()[1];
  if (grad.shape() != ir::Shape{idx.shape()[0], idx.shape()[1], E})
    return c.error(ErrorCode::IncompatibleShapes, fmt::format("out_grad {} does not fit indices {} and weights {}",
                                                              grad.to_string(), idx.to_string(), weights.to_string()));
  KILN_RETURN_IF_ERROR(expect_out_dtype(c, 0, weights.dtype()));
  KILN_RETURN_IF_ERROR(expect_out_shape(c, 0, weights.shape()));
  KILN_ASSIGN_OR_RETURN(HostTensor out, c.new_output());
  std::vector<double> acc(static_cast<std::size_t>(V * E), 0.0);
  for (std::uint64_t t = 0; t < idx.num_elements(); ++t) {
    KILN_ASSIGN_OR_RETURN(std::uint64_t row, checked_index(c, idx, t, V, "embedding"));
    for (std::uint64_t e = 0; e < E; ++e) acc[row * E + e] += grad.get_f64(t * E + e);
  }
  for (std::uint64_t k = 0; k < acc.size(); ++k) element::store_f64(out.mutable_data(), out.dtype(), k, acc[k]);
  return single(std::move(out));
}

}  // namespace kiln::reference::kernels

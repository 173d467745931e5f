// Row-wise module ops on the fast path: LayerNorm, BatchNorm (the inference form), Embedding and
// EmbeddingBackward (docs/spec/ir.md §5.8), with the reference executor's numbers bit for bit but
// for layer norm's row sums.
//
// The reference (reference/src/reference_module.cc) reads and writes every element through the
// dtype-generic codec. These kernels keep its f64 arithmetic on typed pointers: layer norm per
// row (mean, biased variance, then each output from one expression, rounded once; the sums over
// eight lanes, another order than the reference's sequential one, so a result may differ from it
// in the last bit; rows over the device's arena), batch norm
// per (image, channel) row from per-channel f64 statistics, the
// embedding as row copies, its gradient as f64 sums in token order per weight element (the tokens
// grouped by weight row first; rows over the arena). Neither file contracts a·b + c into an FMA
// (cpu/CMakeLists.txt, reference/CMakeLists.txt), so the two compute the same bits. Anything else
// (f16/bf16 norms: fast_widen.h runs those on these kernels; mixed dtypes, a shape the builders
// would refuse, an index out of range) is declined: the reference runs the op and reports the error.
#include "fast_module.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <vector>

#include "fast_program.h"
#include "fast_single_op.h"

namespace kiln::cpu::fast {
namespace {

bool is_f32_or_f64(ir::DType d) { return d == ir::dtypes::f32 || d == ir::dtypes::f64; }
bool is_index_dtype(ir::DType d) { return d == ir::dtypes::i64 || d == ir::dtypes::i32; }

// Element i of an i32 or i64 index tensor.
std::int64_t index_at(const HostTensor& t, std::uint64_t i) {
  if (t.dtype() == ir::dtypes::i32) return reinterpret_cast<const std::int32_t*>(t.data())[i];
  return reinterpret_cast<const std::int64_t*>(t.data())[i];
}

// Every index inside [0, rows).
bool indices_in_range(const HostTensor& idx, std::uint64_t rows) {
  for (std::uint64_t t = 0, n = idx.num_elements(); t < n; ++t) {
    const std::int64_t v = index_at(idx, t);
    if (v < 0 || static_cast<std::uint64_t>(v) >= rows) return false;
  }
  return true;
}

// ---- LayerNorm{input [..., d], gamma [d], beta? [d]; attrs [bits(epsilon)]}

// Row r's output from its statistics: each element from one expression, rounded once (the
// missing beta adds +0.0, as the reference's, so that −0 comes out +0).
template <class T>
void layer_norm_output(const T* xr, const T* gamma, const T* beta, T* yr, std::uint64_t d, double mean, double rstd) {
  if (beta != nullptr) {
    for (std::uint64_t i = 0; i < d; ++i)
      yr[i] = static_cast<T>((static_cast<double>(xr[i]) - mean) * rstd * static_cast<double>(gamma[i]) +
                             static_cast<double>(beta[i]));
  } else {
    for (std::uint64_t i = 0; i < d; ++i)
      yr[i] = static_cast<T>((static_cast<double>(xr[i]) - mean) * rstd * static_cast<double>(gamma[i]) + 0.0);
  }
}

// The row statistics of a three-output LayerNorm (nullptr for one output): the mean and
// 1 / sqrt(var + epsilon) of each row, as the reference rounds them.
template <class T>
struct RowStats {
  T* mean = nullptr;
  T* rstd = nullptr;
  void store(std::uint64_t row, double m, double r) const {
    if (mean == nullptr) return;
    mean[row] = static_cast<T>(m);
    rstd[row] = static_cast<T>(r);
  }
};

// A row's mean and biased variance in f64, each sum over kSumLanes lanes of consecutive elements
// (lane k takes elements k, k + kSumLanes, ...) added up pairwise at the end: GCC turns the lanes
// into vectors, where the reference's one sequential chain per row waits on every add. Another
// order than the reference's, in the same precision: the f32 results agree with it but for a
// rare last-bit rounding (docs/decisions.md).
constexpr std::uint64_t kSumLanes = 8;

// The sum of term(x[i]) over a row, in f64, in that lane order.
template <class T, class Term>
double lanes_sum(const T* xr, std::uint64_t d, Term term) {
  double acc[kSumLanes] = {};
  std::uint64_t i = 0;
  for (; i + kSumLanes <= d; i += kSumLanes)
    for (std::uint64_t k = 0; k < kSumLanes; ++k) acc[k] += term(static_cast<double>(xr[i + k]));
  for (std::uint64_t k = 0; i < d; ++i, ++k) acc[k] += term(static_cast<double>(xr[i]));
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <class T>
void layer_norm_rows(const T* x, const T* gamma, const T* beta, T* out, RowStats<T> stats, std::uint64_t d,
                     double epsilon, std::uint64_t begin, std::uint64_t end) {
  for (std::uint64_t r = begin; r < end; ++r) {
    const T* xr = x + r * d;
    const double n = static_cast<double>(d);
    const double mean = lanes_sum(xr, d, [](double v) { return v; }) / n;
    const double variance = lanes_sum(xr, d, [mean](double v) { return (v - mean) * (v - mean); }) / n;
    const double rstd = 1.0 / std::sqrt(variance + epsilon);
    layer_norm_output(xr, gamma, beta, out + r * d, d, mean, rstd);
    stats.store(r, mean, rstd);
  }
}

std::optional<double> layer_norm_epsilon(const ir::Operation& op) {
  if (op.attrs.size() != 1) return std::nullopt;
  double epsilon = 0;
  std::memcpy(&epsilon, &op.attrs[0], sizeof epsilon);
  if (!std::isfinite(epsilon) || epsilon < 0) return std::nullopt;
  return epsilon;
}

// `outs`: the output, or the output, the rows' means and their 1 / sqrt(var + epsilon).
bool layer_norm(const ir::Operation& op, const std::vector<const HostTensor*>& in, std::span<HostTensor> outs,
                const Launch& launch) {
  HostTensor& out = outs[0];
  const ir::Shape& xs = in[0]->shape();
  const std::optional<double> epsilon = layer_norm_epsilon(op);
  if (!epsilon || xs.empty() || in.size() > 3 || !is_f32_or_f64(in[0]->dtype())) return false;
  const std::uint64_t d = xs.back();
  for (std::size_t i = 1; i < in.size(); ++i)
    if (in[i]->shape() != ir::Shape{d} || !(in[i]->dtype() == in[0]->dtype())) return false;
  if (out.shape() != xs || !(out.dtype() == in[0]->dtype())) return false;
  ir::Shape stats_shape = xs;
  stats_shape.back() = 1;
  for (std::size_t o = 1; o < outs.size(); ++o)
    if (outs[o].shape() != stats_shape || !(outs[o].dtype() == in[0]->dtype())) return false;
  const std::uint64_t rows = d == 0 ? 0 : in[0]->num_elements() / d;
  const std::uint64_t grain = std::max<std::uint64_t>(1, kParallelThreshold / std::max<std::uint64_t>(1, 3 * d));
  auto run = [&]<class T>(T*) {
    const auto data = [&](std::size_t i) { return reinterpret_cast<const T*>(in[i]->data()); };
    const T* beta = in.size() > 2 ? data(2) : nullptr;
    T* y = reinterpret_cast<T*>(out.mutable_data());
    RowStats<T> stats;
    if (outs.size() == 3)
      stats = {reinterpret_cast<T*>(outs[1].mutable_data()), reinterpret_cast<T*>(outs[2].mutable_data())};
    parallel_ranges(launch, rows, grain, [&](std::uint64_t begin, std::uint64_t end) {
      layer_norm_rows<T>(data(0), data(1), beta, y, stats, d, *epsilon, begin, end);
    });
  };
  if (in[0]->dtype() == ir::dtypes::f32)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<double*>(nullptr));
  return true;
}

// ---- BatchNorm{x [N, C, ...], gamma, beta, mean, variance [C]; scalar epsilon}, the inference
// form: per channel sqrt(variance + epsilon) in f64, then each element
// ((x − mean) / that) · gamma + beta in f64, rounded once: the reference's expression.

template <class T>
void batch_norm_rows(const T* x, const double* stats, T* out, std::uint64_t channels, std::uint64_t inner,
                     std::uint64_t begin, std::uint64_t end) {
  for (std::uint64_t row = begin; row < end; ++row) {
    const double* st = stats + 4 * (row % channels);  // mean, sqrt(variance + epsilon), gamma, beta
    const double mean = st[0], den = st[1], gamma = st[2], beta = st[3];
    const T* xr = x + row * inner;
    T* yr = out + row * inner;
    for (std::uint64_t k = 0; k < inner; ++k)
      yr[k] = static_cast<T>((static_cast<double>(xr[k]) - mean) / den * gamma + beta);
  }
}

bool batch_norm(const ir::Operation& op, const std::vector<const HostTensor*>& in, HostTensor& out,
                const Launch& launch) {
  const HostTensor& x = *in[0];
  const ir::DType d = x.dtype();
  if (!is_f32_or_f64(d) || x.shape().size() < 2 || op.scalars.size() != 1) return false;
  const std::uint64_t channels = x.shape()[1];
  for (std::size_t i = 1; i < 5; ++i)
    if (in[i]->shape() != ir::Shape{channels} || !(in[i]->dtype() == d)) return false;
  if (out.shape() != x.shape() || !(out.dtype() == d)) return false;
  const double epsilon = op.scalars[0].to_f64();
  if (!std::isfinite(epsilon) || epsilon < 0) return false;
  const std::uint64_t rows = x.shape()[0] * channels;
  const std::uint64_t inner = rows == 0 ? 0 : x.num_elements() / rows;
  auto run = [&]<class T>(T*) {
    const auto data = [&](std::size_t i) { return reinterpret_cast<const T*>(in[i]->data()); };
    std::vector<double> stats(4 * channels);
    for (std::uint64_t c = 0; c < channels; ++c) {
      stats[4 * c] = static_cast<double>(data(3)[c]);
      stats[4 * c + 1] = std::sqrt(static_cast<double>(data(4)[c]) + epsilon);
      stats[4 * c + 2] = static_cast<double>(data(1)[c]);
      stats[4 * c + 3] = static_cast<double>(data(2)[c]);
    }
    T* y = reinterpret_cast<T*>(out.mutable_data());
    const std::uint64_t grain = std::max<std::uint64_t>(1, kParallelThreshold / std::max<std::uint64_t>(1, inner));
    parallel_ranges(launch, rows, grain, [&](std::uint64_t begin, std::uint64_t end) {
      batch_norm_rows<T>(data(0), stats.data(), y, channels, inner, begin, end);
    });
  };
  if (d == ir::dtypes::f32)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<double*>(nullptr));
  return true;
}

// ---- Embedding{weights [V, E], indices [B, S]} → [B, S, E]: row copies.

bool embedding(const std::vector<const HostTensor*>& in, HostTensor& out) {
  const HostTensor& weights = *in[0];
  const HostTensor& idx = *in[1];
  const ir::DType d = weights.dtype();
  if (!d.is_float() || weights.shape().size() != 2 || idx.shape().size() != 2 || !is_index_dtype(idx.dtype()))
    return false;
  const std::uint64_t V = weights.shape()[0], E = weights.shape()[1];
  if (out.shape() != ir::Shape{idx.shape()[0], idx.shape()[1], E} || !(out.dtype() == d)) return false;
  if (!indices_in_range(idx, V)) return false;
  const std::size_t row_bytes = static_cast<std::size_t>(E * d.size_bytes());
  for (std::uint64_t t = 0, n = idx.num_elements(); t < n; ++t)
    std::memcpy(out.mutable_data() + t * row_bytes,
                weights.data() + static_cast<std::uint64_t>(index_at(idx, t)) * row_bytes, row_bytes);
  return true;
}

// ---- EmbeddingBackward{weights [V, E], out_grad [B, S, E], indices [B, S]} → [V, E]: zeros, then
// out[indices[t], :] += out_grad[t, :] in token order (f64 sums, rounded once).

// The tokens of each weight row, in token order: row v's are tokens[start[v] .. start[v + 1]).
struct TokensByRow {
  std::vector<std::uint64_t> start, tokens;
};
TokensByRow tokens_by_row(const HostTensor& idx, std::uint64_t V) {
  const std::uint64_t n = idx.num_elements();
  TokensByRow by{std::vector<std::uint64_t>(V + 1, 0), std::vector<std::uint64_t>(n)};
  for (std::uint64_t t = 0; t < n; ++t) ++by.start[static_cast<std::uint64_t>(index_at(idx, t)) + 1];
  for (std::uint64_t v = 0; v < V; ++v) by.start[v + 1] += by.start[v];
  std::vector<std::uint64_t> next(by.start.begin(), by.start.end() - 1);
  for (std::uint64_t t = 0; t < n; ++t) by.tokens[next[static_cast<std::uint64_t>(index_at(idx, t))]++] = t;
  return by;
}

// Rows [begin, end) of the gradient: each row a token-order f64 sum of its tokens' gradient rows
// (zeros for a row no token reads), written once.
template <class T>
void embedding_backward_rows(const T* grad, const TokensByRow& by, T* out, std::uint64_t E, std::uint64_t begin,
                             std::uint64_t end) {
  std::vector<double> acc(static_cast<std::size_t>(E));
  for (std::uint64_t v = begin; v < end; ++v) {
    T* o = out + v * E;
    if (by.start[v] == by.start[v + 1]) {
      std::fill_n(o, E, T{0});
      continue;
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    for (std::uint64_t i = by.start[v]; i < by.start[v + 1]; ++i) {
      const T* g = grad + by.tokens[i] * E;
      for (std::uint64_t e = 0; e < E; ++e) acc[e] += static_cast<double>(g[e]);
    }
    for (std::uint64_t e = 0; e < E; ++e) o[e] = static_cast<T>(acc[e]);
  }
}

bool embedding_backward(const std::vector<const HostTensor*>& in, HostTensor& out, const Launch& launch) {
  const HostTensor& weights = *in[0];
  const HostTensor& grad = *in[1];
  const HostTensor& idx = *in[2];
  const ir::DType d = weights.dtype();
  if (!is_f32_or_f64(d) || !(grad.dtype() == d) || weights.shape().size() != 2 || idx.shape().size() != 2 ||
      !is_index_dtype(idx.dtype()))
    return false;
  const std::uint64_t V = weights.shape()[0], E = weights.shape()[1];
  if (grad.shape() != ir::Shape{idx.shape()[0], idx.shape()[1], E}) return false;
  if (out.shape() != weights.shape() || !(out.dtype() == d)) return false;
  if (!indices_in_range(idx, V)) return false;
  // Rows are independent: each keeps the token order of its own sums. (Summing by columns over
  // all tokens needed an f64 accumulator as large as the gradient, V x E.)
  const TokensByRow by = tokens_by_row(idx, V);
  const std::uint64_t grain = std::max<std::uint64_t>(1, kParallelThreshold / std::max<std::uint64_t>(1, E));
  auto run = [&]<class T>(T*) {
    const T* g = reinterpret_cast<const T*>(grad.data());
    T* o = reinterpret_cast<T*>(out.mutable_data());
    parallel_ranges(launch, V, grain, [&](std::uint64_t begin, std::uint64_t end) {
      embedding_backward_rows<T>(g, by, o, E, begin, end);
    });
  };
  if (d == ir::dtypes::f32)
    run(static_cast<float*>(nullptr));
  else
    run(static_cast<double*>(nullptr));
  return true;
}

}  // namespace

bool run_module(const ir::Operation& op, CpuDevice& device, CpuDevice::Handles& handles) {
  std::size_t min_inputs = 0, max_inputs = 0, max_outputs = 1;
  switch (op.kind) {
    case ir::OpKind::Module_LayerNorm: min_inputs = 2, max_inputs = 3, max_outputs = 3; break;
    case ir::OpKind::Module_BatchNorm: min_inputs = max_inputs = 5; break;
    case ir::OpKind::Module_Embedding: min_inputs = max_inputs = 2; break;
    case ir::OpKind::Module_EmbeddingBackward: min_inputs = max_inputs = 3; break;
    default: return false;
  }
  const std::size_t outputs = op.outputs().size();
  if (op.inputs().size() < min_inputs || op.inputs().size() > max_inputs || (outputs != 1 && outputs != max_outputs))
    return false;
  const std::optional<std::vector<const HostTensor*>> held = held_inputs(op, handles);
  if (!held) return false;
  const std::vector<const HostTensor*>& in = *held;
  std::vector<HostTensor> outs;
  for (const ir::TensorIr& o : op.outputs()) {
    Result<HostTensor> t = HostTensor::allocate(device.allocator(), o.shape, o.dtype);
    if (!t.ok()) return false;
    outs.push_back(std::move(t).value());
  }
  const Launch launch = launch_on(device);
  bool ran = false;
  switch (op.kind) {
    case ir::OpKind::Module_LayerNorm: ran = layer_norm(op, in, outs, launch); break;
    case ir::OpKind::Module_BatchNorm: ran = batch_norm(op, in, outs[0], launch); break;
    case ir::OpKind::Module_Embedding: ran = embedding(in, outs[0]); break;
    default: ran = embedding_backward(in, outs[0], launch); break;
  }
  if (!ran) return false;  // the outputs are dropped unregistered

  commit(op, handles, outs);
  return true;
}

}  // namespace kiln::cpu::fast

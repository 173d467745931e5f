// The peer kit's workloads W1-W4 (../shared/bench-peers/README.md "Workloads") and the
// matmul1024 figure, written as a kiln client writes them: operations lowered as the fusion
// client lowers them (docs/spec/ir.md §5.11), statuses as a client derives them (docs/spec/fusion.md §16.7).
//
// One call of a workload = (drop the previous call's outputs, as a client reassigning `y`
// would) + register its operations with fresh output ids + drain (the read of the outputs).
// Inputs are uploaded once and kept (every use ReadOnly). W3's state p, m, v is consumed by
// each call (last use ReadWrite) and replaced by the p', m', v' it produces, so buffers can be
// reused in place. Inputs are filled exactly as the kit's Eigen peer fills them (same ranges,
// same xorshift seeds), and check() compares one call with a float64 reference using the Eigen
// peer's tolerances.
//
// Thread-safety: a workload belongs to the benchmark's main thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness.h"
#include "kiln_client.h"

namespace kiln::bench::peers {

// Adam, the kit's constants (common.py / peer_eigen.cpp).
inline constexpr double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
inline constexpr int kStep = 10;
inline const double kBc1 = 1.0 - std::pow(kBeta1, kStep);
inline const double kBc2 = 1.0 - std::pow(kBeta2, kStep);
inline const double kStepSize = kLr / kBc1;
inline const double kInvBc2Sqrt = 1.0 / std::sqrt(kBc2);
// W4 row length (the kit's ROW) and the matmul size.
inline constexpr long kRow = 1024;
inline constexpr long kMatmulN = 1024;

struct CheckResult {
  double err = 0;
  bool ok = false;
};

class Workload {
 protected:
  static void release(Client& c, std::initializer_list<TensorIr> held, std::optional<TensorIr>& out) {
    for (const TensorIr& t : held) c.drop(t);
    if (out) c.drop(*out);
    out.reset();
    c.drain();
  }
  static void release(Client& c, std::initializer_list<TensorIr> held, std::nullopt_t) {
    std::optional<TensorIr> none;
    release(c, held, none);
  }

 public:
  virtual ~Workload() = default;
  // Uploads the inputs (once).
  virtual void setup(Client& c) = 0;
  // One call: drops the previous outputs, registers the ops, drains.
  virtual void call(Client& c) = 0;
  // Compares the outputs of the call just made with a float64 reference computed from the
  // inputs as they were before it. Only valid right after the first call.
  virtual CheckResult check(Client& c) = 0;
  // Drops every tensor the workload still holds (inputs, state, outputs) and drains, so the
  // device's memory goes back to its pool before the next measurement.
  virtual void teardown(Client& c) = 0;
};

// ---- W1: y = exp(a*b + c*2.0)
class W1 final : public Workload {
 public:
  explicit W1(long n) : n_(n), a_(uniform(n, -1, 1, 11)), b_(uniform(n, -1, 1, 12)), c_(uniform(n, -1, 1, 13)) {}
  void setup(Client& c) override {
    const Shape s{static_cast<std::uint64_t>(n_)};
    a_t_ = c.upload(s, a_);
    b_t_ = c.upload(s, b_);
    c_t_ = c.upload(s, c_);
  }
  void call(Client& c) override {
    if (y_) c.drop(*y_);
    constexpr auto RO = TensorStatus::ReadOnly, RW = TensorStatus::ReadWrite;
    TensorIr ab = c.binary(OpKind::Numeric_Mul, a_t_, RO, b_t_, RO);
    TensorIr c2 = c.scalar(OpKind::Numeric_MulScalar, c_t_, RO, 2.0);
    TensorIr sum = c.binary(OpKind::Numeric_Add, ab, RW, c2, RW);
    y_ = c.fl(OpKind::Float_Exp, sum, RW);
    c.drain();
  }
  CheckResult check(Client& c) override {
    const std::vector<float> y = c.download(*y_);
    double err = 0;
    for (long i = 0; i < n_; ++i) {
      const double r = std::exp(static_cast<double>(a_[i]) * b_[i] + static_cast<double>(c_[i]) * 2.0);
      err = std::max(err, std::fabs(y[i] - r) / std::fabs(r));
    }
    return {err, err < 1e-5};
  }
  void teardown(Client& c) override { release(c, {a_t_, b_t_, c_t_}, y_); }

 private:
  long n_;
  std::vector<float> a_, b_, c_;
  TensorIr a_t_, b_t_, c_t_;
  std::optional<TensorIr> y_;
};

// ---- W2: y = sqrt(abs(tanh(sigmoid(x*1.5 + 0.5)*x - 0.25))), sigmoid lowered to 8 ops: 15 ops.
class W2 final : public Workload {
 public:
  explicit W2(long n) : n_(n), x_(uniform(n, -3, 3, 21)) {}
  void setup(Client& c) override { x_t_ = c.upload(Shape{static_cast<std::uint64_t>(n_)}, x_); }
  void call(Client& c) override {
    if (y_) c.drop(*y_);
    constexpr auto RO = TensorStatus::ReadOnly, RW = TensorStatus::ReadWrite;
    TensorIr t = c.scalar(OpKind::Numeric_MulScalar, x_t_, RO, 1.5);
    t = c.scalar(OpKind::Numeric_AddScalar, t, RW, 0.5);
    t = c.sigmoid(t, RW);
    t = c.binary(OpKind::Numeric_Mul, t, RW, x_t_, RO);
    t = c.scalar(OpKind::Numeric_SubScalar, t, RW, 0.25);
    t = c.fl(OpKind::Float_Tanh, t, RW);
    t = c.abs(t, RW);
    y_ = c.fl(OpKind::Float_Sqrt, t, RW);
    c.drain();
  }
  CheckResult check(Client& c) override {
    const std::vector<float> y = c.download(*y_);
    double err = 0;
    for (long i = 0; i < n_; ++i) {
      const double x = x_[i], s = 1.0 / (1.0 + std::exp(-(x * 1.5 + 0.5)));
      const double r = std::sqrt(std::fabs(std::tanh(s * x - 0.25)));
      err = std::max(err, std::fabs(y[i] - r));
    }
    return {err, err < 2e-3};
  }
  void teardown(Client& c) override { release(c, {x_t_}, y_); }

 private:
  long n_;
  std::vector<float> x_;
  TensorIr x_t_;
  std::optional<TensorIr> y_;
};

// ---- W3: Adam step, 13 ops; p, m, v replaced by p', m', v' (in place for the backend).
class W3 final : public Workload {
 public:
  explicit W3(long n)
      : n_(n),
        p_(uniform(n, -2, 2, 31)),
        g_(uniform(n, -2e-2f, 2e-2f, 32)),
        m_(uniform(n, -2e-3f, 2e-3f, 33)),
        v_(uniform(n, 1e-6f, 1e-4f, 34)) {}
  void setup(Client& c) override {
    const Shape s{static_cast<std::uint64_t>(n_)};
    p_t_ = c.upload(s, p_);
    g_t_ = c.upload(s, g_);
    m_t_ = c.upload(s, m_);
    v_t_ = c.upload(s, v_);
  }
  void call(Client& c) override {
    constexpr auto RO = TensorStatus::ReadOnly, RW = TensorStatus::ReadWrite;
    using K = OpKind;
    // m' = beta1*m + (1-beta1)*g
    TensorIr m1 = c.scalar(K::Numeric_MulScalar, m_t_, RW, kBeta1);
    TensorIr g1 = c.scalar(K::Numeric_MulScalar, g_t_, RO, 1 - kBeta1);
    TensorIr m2 = c.binary(K::Numeric_Add, m1, RW, g1, RW);
    // v' = beta2*v + (1-beta2)*g*g
    TensorIr v1 = c.scalar(K::Numeric_MulScalar, v_t_, RW, kBeta2);
    TensorIr gg = c.binary(K::Numeric_Mul, g_t_, RO, g_t_, RO);
    TensorIr g2 = c.scalar(K::Numeric_MulScalar, gg, RW, 1 - kBeta2);
    TensorIr v2 = c.binary(K::Numeric_Add, v1, RW, g2, RW);
    // p' = p - step_size * m' / (sqrt(v') / sqrt(bc2) + eps)   (times 1/sqrt(bc2), as the kit allows)
    TensorIr sq = c.fl(K::Float_Sqrt, v2, RO);
    TensorIr den = c.scalar(K::Numeric_MulScalar, sq, RW, kInvBc2Sqrt);
    den = c.scalar(K::Numeric_AddScalar, den, RW, kEps);
    TensorIr num = c.scalar(K::Numeric_MulScalar, m2, RO, kStepSize);
    TensorIr q = c.binary(K::Numeric_Div, num, RW, den, RW);
    TensorIr p2 = c.binary(K::Numeric_Sub, p_t_, RW, q, RW);
    c.drain();
    p_t_ = p2;
    m_t_ = m2;
    v_t_ = v2;
  }
  CheckResult check(Client& c) override {
    const std::vector<float> p = c.download(p_t_), m = c.download(m_t_), v = c.download(v_t_);
    double em = 0, mmax = 0, ev = 0, ed = 0, dmax = 0, pmax = 0;
    for (long i = 0; i < n_; ++i) {
      const double m2 = kBeta1 * m_[i] + (1 - kBeta1) * g_[i];
      const double v2 = kBeta2 * v_[i] + (1 - kBeta2) * static_cast<double>(g_[i]) * g_[i];
      const double d = -kStepSize * m2 / (std::sqrt(v2) * kInvBc2Sqrt + kEps);
      em = std::max(em, std::fabs(m[i] - m2));
      mmax = std::max(mmax, std::fabs(m2));
      ev = std::max(ev, std::fabs(v[i] - v2) / v2);
      ed = std::max(ed, std::fabs((static_cast<double>(p[i]) - p_[i]) - d));
      dmax = std::max(dmax, std::fabs(d));
      pmax = std::max(pmax, std::fabs(static_cast<double>(p_[i])));
    }
    em /= mmax;
    const double ulp =
        std::nextafter(static_cast<float>(pmax), std::numeric_limits<float>::infinity()) - static_cast<float>(pmax);
    return {std::max(std::max(em, ev), ed / dmax), em < 1e-5 && ev < 1e-5 && ed <= 2 * ulp + 1e-3 * dmax};
  }
  void teardown(Client& c) override { release(c, {p_t_, g_t_, m_t_, v_t_}, std::nullopt); }

 private:
  long n_;
  std::vector<float> p_, g_, m_, v_;  // initial host values (the check's reference inputs)
  TensorIr p_t_, g_t_, m_t_, v_t_;    // current state
};

// A row of kRow values in float64: its max m and sum_j exp(x_j - m) (softmax's and
// log-softmax's references).
struct RowMaxSumExp {
  double max = 0, sum_exp = 0;
};
inline RowMaxSumExp row_max_and_sum_exp(const float* x) {
  RowMaxSumExp r{-std::numeric_limits<double>::infinity(), 0};
  for (long j = 0; j < kRow; ++j) r.max = std::max(r.max, static_cast<double>(x[j]));
  for (long j = 0; j < kRow; ++j) r.sum_exp += std::exp(x[j] - r.max);
  return r;
}

// ---- W4: softmax over the last dim of x [n/1024, 1024]:
// MaxDim -> [r,1], Sub (broadcast), Exp, SumDim -> [r,1], Div (broadcast).
class W4 final : public Workload {
 public:
  explicit W4(long n) : n_(n), x_(uniform(n, -4, 4, 41)) {}
  void setup(Client& c) override {
    x_t_ = c.upload(Shape{static_cast<std::uint64_t>(n_ / kRow), static_cast<std::uint64_t>(kRow)}, x_);
  }
  void call(Client& c) override {
    if (y_) c.drop(*y_);
    constexpr auto RO = TensorStatus::ReadOnly, RW = TensorStatus::ReadWrite;
    TensorIr mx = c.reduce_dim(OpKind::Numeric_MaxDim, x_t_, RO, 1);
    TensorIr d = c.binary(OpKind::Numeric_Sub, x_t_, RO, mx, RW);
    TensorIr e = c.fl(OpKind::Float_Exp, d, RW);
    TensorIr s = c.reduce_dim(OpKind::Numeric_SumDim, e, RO, 1);
    y_ = c.binary(OpKind::Numeric_Div, e, RW, s, RW);
    c.drain();
  }
  CheckResult check(Client& c) override {
    const std::vector<float> y = c.download(*y_);
    double err = 0;
    for (long r = 0; r < n_ / kRow; ++r) {
      const float* x = x_.data() + r * kRow;
      const auto [mx, s] = row_max_and_sum_exp(x);
      for (long j = 0; j < kRow; ++j) {
        const double ref = std::exp(x[j] - mx) / s;
        err = std::max(err, std::fabs(y[r * kRow + j] - ref) / ref);
      }
    }
    return {err, err < 1e-4};
  }
  void teardown(Client& c) override { release(c, {x_t_}, y_); }

 private:
  long n_;
  std::vector<float> x_;
  TensorIr x_t_;
  std::optional<TensorIr> y_;
};

// ---- matmul1024: C = A @ B, f32 [1024,1024] x [1024,1024]; a lone matmul (no epilogue).
class Matmul final : public Workload {
 public:
  // Entries uniform in [-1, 1); seeds 51 and 52 continue the kit's numbering (W1 11-13 ... W4 41).
  Matmul() : a_(uniform(kMatmulN * kMatmulN, -1, 1, 51)), b_(uniform(kMatmulN * kMatmulN, -1, 1, 52)) {}
  void setup(Client& c) override {
    const Shape s{static_cast<std::uint64_t>(kMatmulN), static_cast<std::uint64_t>(kMatmulN)};
    a_t_ = c.upload(s, a_);
    b_t_ = c.upload(s, b_);
  }
  void call(Client& c) override {
    if (y_) c.drop(*y_);
    y_ = c.matmul(a_t_, TensorStatus::ReadOnly, b_t_, TensorStatus::ReadOnly);
    c.drain();
  }
  CheckResult check(Client& c) override { return check_gemm(c.download(*y_), a_, b_); }
  void teardown(Client& c) override { release(c, {a_t_, b_t_}, y_); }

  // Every 16th row of C (64 rows) against a float64 product: |C - ref| / sum_k |a_ik b_kj|,
  // which float32 accumulation over 1024 terms keeps well below 1e-4.
  static CheckResult check_gemm(const std::vector<float>& cm, const std::vector<float>& a,
                                const std::vector<float>& b) {
    const long n = kMatmulN;
    double err = 0;
    std::vector<double> acc(n), mag(n);
    for (long i = 0; i < n; i += 16) {
      std::fill(acc.begin(), acc.end(), 0.0);
      std::fill(mag.begin(), mag.end(), 0.0);
      for (long k = 0; k < n; ++k) {
        const double aik = a[i * n + k];
        const float* brow = b.data() + k * n;
        for (long j = 0; j < n; ++j) {
          acc[j] += aik * brow[j];
          mag[j] += std::fabs(aik * brow[j]);
        }
      }
      for (long j = 0; j < n; ++j) err = std::max(err, std::fabs(cm[i * n + j] - acc[j]) / mag[j]);
    }
    return {err, err < 1e-4};
  }
  const std::vector<float>& a() const { return a_; }
  const std::vector<float>& b() const { return b_; }

 private:
  std::vector<float> a_, b_;
  TensorIr a_t_, b_t_;
  std::optional<TensorIr> y_;
};

// ---- Row workloads beyond the kit (issue "rows in one pass"; bench/peers/peer_rows.py times
// PyTorch on the same computation): rows of kRow, x in [-4, 4).
//   LN: y = (x - mean) / sqrt(var + 1e-5) * g + b, written out op by op (mean, centre, square,
//       mean, + eps, sqrt, divide, scale, shift); g in [0.5, 1.5), b in [-0.5, 0.5) of [1, kRow].
//   CE: loss_r = -sum_j t_rj * log_softmax(x)_rj with one-hot probability targets t (class
//       r * 7919 mod kRow): max, sub, exp, sum, log, sub, mul, sum, neg -> [rows, 1].
inline constexpr double kLnEps = 1e-5;
inline std::size_t ce_class(long r) { return static_cast<std::size_t>((r * 7919) % kRow); }

class LN final : public Workload {
 public:
  explicit LN(long n)
      : n_(n), x_(uniform(n, -4, 4, 51)), g_(uniform(kRow, 0.5f, 1.5f, 52)), b_(uniform(kRow, -0.5f, 0.5f, 53)) {}
  void setup(Client& c) override {
    x_t_ = c.upload(Shape{static_cast<std::uint64_t>(n_ / kRow), static_cast<std::uint64_t>(kRow)}, x_);
    g_t_ = c.upload(Shape{1, static_cast<std::uint64_t>(kRow)}, g_);
    b_t_ = c.upload(Shape{1, static_cast<std::uint64_t>(kRow)}, b_);
  }
  void call(Client& c) override {
    if (y_) c.drop(*y_);
    constexpr auto RO = TensorStatus::ReadOnly, RW = TensorStatus::ReadWrite;
    TensorIr mean = c.reduce_dim(OpKind::Numeric_MeanDim, x_t_, RO, 1);
    TensorIr d = c.binary(OpKind::Numeric_Sub, x_t_, RO, mean, RW);
    TensorIr sq = c.binary(OpKind::Numeric_Mul, d, RO, d, RO);
    TensorIr var = c.reduce_dim(OpKind::Numeric_MeanDim, sq, RW, 1);
    TensorIr ve = c.scalar(OpKind::Numeric_AddScalar, var, RW, kLnEps);
    TensorIr sd = c.fl(OpKind::Float_Sqrt, ve, RW);
    TensorIr nrm = c.binary(OpKind::Numeric_Div, d, RW, sd, RW);
    TensorIr scaled = c.binary(OpKind::Numeric_Mul, nrm, RW, g_t_, RO);
    y_ = c.binary(OpKind::Numeric_Add, scaled, RW, b_t_, RO);
    c.drain();
  }
  CheckResult check(Client& c) override {
    const std::vector<float> y = c.download(*y_);
    double err = 0;
    for (long r = 0; r < n_ / kRow; ++r) {
      const float* x = x_.data() + r * kRow;
      double mean = 0, var = 0;
      for (long j = 0; j < kRow; ++j) mean += x[j];
      mean /= kRow;
      for (long j = 0; j < kRow; ++j) var += (x[j] - mean) * (x[j] - mean);
      var /= kRow;
      for (long j = 0; j < kRow; ++j) {
        const double ref = (x[j] - mean) / std::sqrt(var + kLnEps) * g_[j] + b_[j];
        err = std::max(err, std::fabs(y[r * kRow + j] - ref) / std::max(1.0, std::fabs(ref)));
      }
    }
    return {err, err < 1e-4};
  }
  void teardown(Client& c) override { release(c, {x_t_, g_t_, b_t_}, y_); }

 private:
  long n_;
  std::vector<float> x_, g_, b_;
  TensorIr x_t_, g_t_, b_t_;
  std::optional<TensorIr> y_;
};

class CE final : public Workload {
 public:
  explicit CE(long n) : n_(n), x_(uniform(n, -4, 4, 61)), t_(static_cast<std::size_t>(n), 0.0f) {
    for (long r = 0; r < n / kRow; ++r) t_[static_cast<std::size_t>(r * kRow) + ce_class(r)] = 1.0f;
  }
  void setup(Client& c) override {
    const Shape s{static_cast<std::uint64_t>(n_ / kRow), static_cast<std::uint64_t>(kRow)};
    x_t_ = c.upload(s, x_);
    t_t_ = c.upload(s, t_);
  }
  void call(Client& c) override {
    if (y_) c.drop(*y_);
    constexpr auto RO = TensorStatus::ReadOnly, RW = TensorStatus::ReadWrite;
    TensorIr mx = c.reduce_dim(OpKind::Numeric_MaxDim, x_t_, RO, 1);
    TensorIr d = c.binary(OpKind::Numeric_Sub, x_t_, RO, mx, RW);
    TensorIr e = c.fl(OpKind::Float_Exp, d, RO);
    TensorIr s = c.reduce_dim(OpKind::Numeric_SumDim, e, RW, 1);
    TensorIr ls = c.fl(OpKind::Float_Log, s, RW);
    TensorIr lsm = c.binary(OpKind::Numeric_Sub, d, RW, ls, RW);
    TensorIr p = c.binary(OpKind::Numeric_Mul, t_t_, RO, lsm, RW);
    TensorIr l = c.reduce_dim(OpKind::Numeric_SumDim, p, RW, 1);
    y_ = c.scalar(OpKind::Numeric_MulScalar, l, RW, -1.0);
    c.drain();
  }
  CheckResult check(Client& c) override {
    const std::vector<float> y = c.download(*y_);
    double err = 0;
    for (long r = 0; r < n_ / kRow; ++r) {
      const float* x = x_.data() + r * kRow;
      const auto [mx, s] = row_max_and_sum_exp(x);
      const double ref = -(x[ce_class(r)] - mx - std::log(s));
      err = std::max(err, std::fabs(y[static_cast<std::size_t>(r)] - ref) / std::max(1.0, std::fabs(ref)));
    }
    return {err, err < 1e-4};
  }
  void teardown(Client& c) override { release(c, {x_t_, t_t_}, y_); }

 private:
  long n_;
  std::vector<float> x_, t_;
  TensorIr x_t_, t_t_;
  std::optional<TensorIr> y_;
};

// Useful bytes per element (README): W1 16, W2 8, W3 28, W4 8; LN 8 (x, y), CE 8 (x, t). matmul1024: 12 B per output
// element (A, B and C once each), a nominal figure only there to fill the gbps column; the
// meaningful one is the extra key gflops = 2 n^3 / t.
inline double bytes_per_elem(const std::string& w) {
  if (w == "W1") return 16;
  if (w == "W2") return 8;
  if (w == "W3") return 28;
  if (w == "W4" || w == "LN" || w == "CE") return 8;
  return 12;
}

inline std::unique_ptr<Workload> make_workload(const std::string& w, long n) {
  if (w == "W1") return std::make_unique<W1>(n);
  if (w == "W2") return std::make_unique<W2>(n);
  if (w == "W3") return std::make_unique<W3>(n);
  if (w == "W4") return std::make_unique<W4>(n);
  if (w == "LN") return std::make_unique<LN>(n);
  if (w == "CE") return std::make_unique<CE>(n);
  if (w == "matmul1024") return std::make_unique<Matmul>();
  return nullptr;
}

}  // namespace kiln::bench::peers

// MlpTrainer: a two-layer perceptron trained with Adam on a synthetic regression task, written
// against the client API (a session with from_host / matmul / relu / ... and its tensor type),
// so that the same code drives the in-process runtime (runtime::Session) and, through the IPC
// client library, the daemon. Used by kiln-bench-runtime (the MLP step figure) and the demo.
//
//   forward   z1 = x·W1 + b1, h = relu(z1), y = h·W2 + b2, loss = mean((y − t)²)
//   backward  written out by hand (kiln has no autodiff): dy = 2(y − t)/n, dW2 = hᵀ·dy,
//             db2 = Σ_rows dy, dh = dy·W2ᵀ, dz1 = dh masked where z1 ≤ 0, dW1 = xᵀ·dz1, db1 = Σ dz1
//   update    Adam (β1 0.9, β2 0.999, ε 1e-8) on W1, b1, W2, b2: each an elementwise chain that
//             the fusion search turns into one kernel per parameter
//
// The task: targets t = tanh(x·A) for a fixed random A, inputs drawn fresh each step from a
// seeded generator, so the loss falls steadily from ~0.3 and a broken kernel shows as a loss
// that does not.
//
// Data parallel (world_size > 1, one trainer per rank, each on the daemon of its rank): every
// rank draws the same batch of `batch` rows and trains on its 1/world_size share of them; the
// gradients and the loss are averaged over the ranks with all_reduce(Mean), so each rank takes
// the step one trainer takes on the whole batch (the same values up to rounding).
//
// Usage:
//   runtime::Session s(device);
//   kiln::apps::MlpTrainer<runtime::Session, runtime::Tensor> mlp(s, {.batch = 64});
//   for (int i = 0; i < 100; ++i) { Result<double> loss = mlp.step(); ... }
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/ir/operation.h"

namespace kiln::apps {

struct MlpOptions {
  std::uint64_t batch = 64;
  std::uint64_t inputs = 32;
  std::uint64_t hidden = 64;
  std::uint64_t outputs = 8;
  double learning_rate = 1e-2;
  std::uint64_t seed = 1;
  std::uint32_t rank = 0;  // data parallel: this trainer's share of each batch
  std::uint32_t world_size = 1;
};

template <class Session, class Tensor>
class MlpTrainer {
 public:
  MlpTrainer(Session& s, MlpOptions o) : s_(s), o_(o), rng_(o.seed) {}

  // Uploads the parameters (He-style init) and the task's fixed projection; call once.
  Status init() {
    if (o_.world_size == 0 || o_.rank >= o_.world_size || o_.batch % o_.world_size != 0)
      return make_error(ErrorCode::Invalid, "mlp: rank " + std::to_string(o_.rank) + " of " +
                                                std::to_string(o_.world_size) + " with a batch of " +
                                                std::to_string(o_.batch) + " (a whole share per rank)");
    std::vector<float> a = random(o_.inputs * o_.outputs, 1.0 / std::sqrt(double(o_.inputs)));
    projection_ = a;
    auto w1 = s_.from_host(random(o_.inputs * o_.hidden, std::sqrt(2.0 / double(o_.inputs))), {o_.inputs, o_.hidden});
    auto b1 = s_.from_host(std::vector<float>(o_.hidden, 0.0f), {1, o_.hidden});
    auto w2 = s_.from_host(random(o_.hidden * o_.outputs, std::sqrt(1.0 / double(o_.hidden))), {o_.hidden, o_.outputs});
    auto b2 = s_.from_host(std::vector<float>(o_.outputs, 0.0f), {1, o_.outputs});
    for (auto* r : {&w1, &b1, &w2, &b2})
      if (!r->ok()) return r->error();
    params_.clear();
    for (auto* r : {&w1, &b1, &w2, &b2}) {
      Param p{std::move(*r).value(), std::nullopt, std::nullopt};
      const std::uint64_t n = count(p.value.shape());
      auto m = s_.from_host(std::vector<float>(n, 0.0f), p.value.shape());
      auto v = s_.from_host(std::vector<float>(n, 0.0f), p.value.shape());
      if (!m.ok()) return m.error();
      if (!v.ok()) return v.error();
      p.m.emplace(std::move(m).value());
      p.v.emplace(std::move(v).value());
      params_.push_back(std::move(p));
    }
    return Status::Ok();
  }

  // One training step on a fresh batch; returns the batch's loss (read back, so the step is
  // complete when this returns).
  Result<double> step() {
    std::vector<float> x = random(o_.batch * o_.inputs, 1.0);
    std::vector<float> t(o_.batch * o_.outputs);
    for (std::uint64_t r = 0; r < o_.batch; ++r)
      for (std::uint64_t c = 0; c < o_.outputs; ++c) {
        double acc = 0;
        for (std::uint64_t k = 0; k < o_.inputs; ++k)
          acc += double(x[r * o_.inputs + k]) * projection_[k * o_.outputs + c];
        t[r * o_.outputs + c] = static_cast<float>(std::tanh(acc));
      }
    const std::uint64_t rows = o_.batch / o_.world_size, first = rows * o_.rank;
    auto xs = s_.from_host(std::span<const float>(x).subspan(first * o_.inputs, rows * o_.inputs), {rows, o_.inputs});
    auto ts =
        s_.from_host(std::span<const float>(t).subspan(first * o_.outputs, rows * o_.outputs), {rows, o_.outputs});
    if (!xs.ok()) return xs.error();
    if (!ts.ok()) return ts.error();
    ++t_;
    return train(std::move(xs).value(), std::move(ts).value());
  }

  std::uint64_t steps() const { return t_; }

 private:
  struct Param {
    Tensor value;
    std::optional<Tensor> m, v;
  };

#define KILN_MLP_TRY(var, expr)              \
  auto var##_r = (expr);                     \
  if (!var##_r.ok()) return var##_r.error(); \
  Tensor var = std::move(var##_r).value()

  Result<double> train(Tensor x, Tensor t) {
    Tensor& w1 = params_[0].value;
    Tensor& b1 = params_[1].value;
    Tensor& w2 = params_[2].value;
    Tensor& b2 = params_[3].value;
    // Forward.
    KILN_MLP_TRY(xw, s_.matmul(x, w1));
    KILN_MLP_TRY(z1, s_.add(std::move(xw), b1));
    KILN_MLP_TRY(h, s_.relu(z1));
    KILN_MLP_TRY(hw, s_.matmul(h, w2));
    KILN_MLP_TRY(y, s_.add(std::move(hw), b2));
    KILN_MLP_TRY(diff, s_.sub(std::move(y), std::move(t)));
    KILN_MLP_TRY(sq, s_.mul(diff, diff));
    KILN_MLP_TRY(local_loss, s_.mean(std::move(sq)));
    KILN_MLP_TRY(loss, average(std::move(local_loss)));
    // Backward.
    const double n = double(o_.batch / o_.world_size * o_.outputs);
    KILN_MLP_TRY(dy, s_.mul(std::move(diff), 2.0 / n));
    KILN_MLP_TRY(ht, s_.swap_dims(std::move(h), 0, 1));
    KILN_MLP_TRY(dw2, s_.matmul(std::move(ht), dy));
    KILN_MLP_TRY(db2, s_.sum_dim(dy, 0, true));
    KILN_MLP_TRY(w2t, s_.swap_dims(w2, 0, 1));
    KILN_MLP_TRY(dh, s_.matmul(std::move(dy), std::move(w2t)));
    KILN_MLP_TRY(inactive, s_.le(std::move(z1), 0.0));
    KILN_MLP_TRY(dz1, s_.mask_fill(std::move(dh), std::move(inactive), 0.0));
    KILN_MLP_TRY(xt, s_.swap_dims(std::move(x), 0, 1));
    KILN_MLP_TRY(dw1, s_.matmul(std::move(xt), dz1));
    KILN_MLP_TRY(db1, s_.sum_dim(std::move(dz1), 0, true));
    // Update.
    Tensor grads[4] = {std::move(dw1), std::move(db1), std::move(dw2), std::move(db2)};
    for (std::size_t i = 0; i < 4; ++i) {
      KILN_MLP_TRY(g, average(std::move(grads[i])));
      if (Status st = adam(params_[i], std::move(g)); !st.ok()) return st.error();
    }
    auto host = s_.to_host(std::move(loss));
    if (!host.ok()) return host.error();
    return double(host.value().at(0));
  }

  // The mean over the ranks (data parallel); the value itself on one.
  Result<Tensor> average(Tensor local) {
    if (o_.world_size == 1) return local;
    return s_.all_reduce(std::move(local), ir::ReduceOperation::Mean, {});
  }

  Status adam(Param& p, Tensor g) {
    constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    const double c1 = 1 - std::pow(b1, double(t_)), c2 = 1 - std::pow(b2, double(t_));
    KILN_MLP_TRY(m0, s_.mul(std::move(*p.m), b1));
    KILN_MLP_TRY(gm, s_.mul(g, 1 - b1));
    KILN_MLP_TRY(m, s_.add(std::move(m0), std::move(gm)));
    KILN_MLP_TRY(v0, s_.mul(std::move(*p.v), b2));
    KILN_MLP_TRY(g2, s_.mul(g, g));
    KILN_MLP_TRY(g2s, s_.mul(std::move(g2), 1 - b2));
    KILN_MLP_TRY(v, s_.add(std::move(v0), std::move(g2s)));
    KILN_MLP_TRY(mhat, s_.div(m, c1));
    KILN_MLP_TRY(vhat, s_.div(v, c2));
    KILN_MLP_TRY(root, s_.sqrt(std::move(vhat)));
    KILN_MLP_TRY(den, s_.add(std::move(root), eps));
    KILN_MLP_TRY(upd, s_.div(std::move(mhat), std::move(den)));
    KILN_MLP_TRY(step, s_.mul(std::move(upd), o_.learning_rate));
    KILN_MLP_TRY(next, s_.sub(std::move(p.value), std::move(step)));
    p.value = std::move(next);
    p.m.emplace(std::move(m));
    p.v.emplace(std::move(v));
    return Status::Ok();
  }
#undef KILN_MLP_TRY

  static std::uint64_t count(const auto& shape) {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }

  std::vector<float> random(std::uint64_t n, double scale) {
    std::normal_distribution<double> dist(0.0, scale);
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(dist(rng_));
    return v;
  }

  Session& s_;
  MlpOptions o_;
  std::mt19937_64 rng_;
  std::vector<float> projection_;
  std::vector<Param> params_;
  std::uint64_t t_ = 0;
};

}  // namespace kiln::apps

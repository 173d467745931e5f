// What the runtime and IPC stress programs share: [4, 4] f32 values with their double-precision
// references, the checker that collects failures from many threads, the hand-over slot between
// threads, and the random program both run (in process over a Device, or through the daemon).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln/runtime/session.h"

namespace kiln::stress {

using Values = std::vector<double>;  // a [4, 4] tensor, row-major
inline constexpr int kDim = 4;

inline std::vector<float> to_f32(const Values& v) { return std::vector<float>(v.begin(), v.end()); }

// Each result is stored in f32; the reference rounds the same way after every op.
inline Values round_f32(Values v) {
  for (double& x : v) x = static_cast<float>(x);
  return v;
}

inline bool close_to(const std::vector<float>& got, const Values& want, std::string* why) {
  if (got.size() != want.size()) {
    *why = "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
    return false;
  }
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= 1e-4 * std::max(1.0, std::abs(want[i])))) {
      *why = "at " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " + std::to_string(want[i]);
      return false;
    }
  return true;
}

// A tensor one thread hands to another (maybe still pending on the giver's stream).
struct Handoff {
  std::mutex mu;
  std::optional<runtime::Tensor> tensor;  // guarded by mu
  Values ref;                             // guarded by mu
};

// One value under computation: the runtime's tensor and the reference values.
struct Value {
  runtime::Tensor t;
  Values ref;
};

// Failures from any thread: the first 20 kept for the report, all counted.
class Checker {
 public:
  void fail(const std::string& what) {
    std::lock_guard lock(mu_);
    if (failures_.size() < 20) failures_.push_back(what);
    ++count_;
  }
  template <class T>
  std::optional<T> get(Result<T> r, const char* what) {
    if (!r.ok()) {
      fail(std::string(what) + ": " + r.error().to_string());
      return std::nullopt;
    }
    return std::move(r).value();
  }
  std::vector<std::string> failures() const {
    std::lock_guard lock(mu_);
    return failures_;
  }
  int count() const {
    std::lock_guard lock(mu_);
    return count_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::string> failures_;
  int count_ = 0;
};

// One random program on the calling thread: 3–10 ops on [4, 4] f32 tensors (elementwise, a
// matmul, row sums and column maxima broadcast back), switching streams now and then, reading
// mid-way, consuming `shared` tensors and tensors another thread handed over in `slots`; every
// read checked against `shared_ref`-based double-precision values. Returns the ops run.
inline std::uint64_t run_program(runtime::Session& s, std::mt19937_64& rng,
                                 const std::vector<runtime::StreamId>& streams,
                                 const std::vector<runtime::Tensor>& shared, const std::vector<Values>& shared_ref,
                                 std::vector<Handoff>& slots, Checker& check) {
  using runtime::StreamId;
  using runtime::Tensor;
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
  StreamId stream = streams[pick(static_cast<int>(streams.size()))];
  std::uint64_t ops = 0;
  return s.executes(stream, [&]() -> std::uint64_t {
    const int k0 = pick(static_cast<int>(shared.size()));
    std::optional<Tensor> start = check.get(s.mul(shared[k0], 1.0), "start");
    if (!start) return ops;
    Value x{std::move(*start), shared_ref[k0]};
    const int len = 3 + pick(8);
    for (int i = 0; i < len; ++i) {
      const int k = pick(static_cast<int>(shared.size()));
      const Values& sk = shared_ref[k];
      std::optional<Tensor> n;
      Values r = x.ref;
      switch (pick(12)) {
        case 0:
          n = check.get(s.add(std::move(x.t), shared[k]), "add");
          for (int j = 0; j < 16; ++j) r[j] += sk[j];
          break;
        case 1:
          n = check.get(s.mul(std::move(x.t), 0.5), "mul_scalar");
          for (double& v : r) v *= 0.5;
          break;
        case 2:
          n = check.get(s.tanh(std::move(x.t)), "tanh");
          for (double& v : r) v = std::tanh(v);
          break;
        case 3:
          n = check.get(s.sigmoid(std::move(x.t)), "sigmoid");
          for (double& v : r) v = 1 / (1 + std::exp(-v));
          break;
        case 4:
          n = check.get(s.sub(std::move(x.t), shared[k]), "sub");
          for (int j = 0; j < 16; ++j) r[j] -= sk[j];
          break;
        case 5:
          n = check.get(s.relu(std::move(x.t)), "relu");
          for (double& v : r) v = std::max(v, 0.0);
          break;
        case 6: {
          std::optional<Tensor> m = check.get(s.matmul(std::move(x.t), shared[k]), "matmul");
          if (m) n = check.get(s.mul(std::move(*m), 0.25), "matmul scale");
          for (int a = 0; a < kDim; ++a)
            for (int b = 0; b < kDim; ++b) {
              double acc = 0;
              for (int c = 0; c < kDim; ++c) acc += x.ref[a * kDim + c] * sk[c * kDim + b];
              r[a * kDim + b] = static_cast<float>(acc) * 0.25;
            }
          break;
        }
        case 7: {  // row sums, broadcast back: x + sum_dim(x, 1) / 8
          Tensor copy = x.t;
          std::optional<Tensor> rs = check.get(s.sum_dim(std::move(copy), 1), "sum_dim");
          if (rs) rs = check.get(s.mul(std::move(*rs), 0.125), "sum_dim scale");
          if (rs) n = check.get(s.add(std::move(x.t), std::move(*rs)), "sum_dim add");
          for (int a = 0; a < kDim; ++a) {
            double acc = 0;
            for (int c = 0; c < kDim; ++c) acc += x.ref[a * kDim + c];
            for (int c = 0; c < kDim; ++c) r[a * kDim + c] = x.ref[a * kDim + c] + static_cast<float>(acc) * 0.125;
          }
          break;
        }
        case 8: {  // column maxima, broadcast back: x - max_dim(x, 0) / 2
          Tensor copy = x.t;
          std::optional<Tensor> mx = check.get(s.max_dim(std::move(copy), 0), "max_dim");
          if (mx) mx = check.get(s.mul(std::move(*mx), 0.5), "max_dim scale");
          if (mx) n = check.get(s.sub(std::move(x.t), std::move(*mx)), "max_dim sub");
          for (int c = 0; c < kDim; ++c) {
            double m = x.ref[c];
            for (int a = 1; a < kDim; ++a) m = std::max(m, x.ref[a * kDim + c]);
            for (int a = 0; a < kDim; ++a) r[a * kDim + c] = x.ref[a * kDim + c] - static_cast<float>(m * 0.5);
          }
          break;
        }
        case 9: {  // a mid-program read through a second handle
          std::optional<std::vector<float>> v = check.get(s.to_host(x.t), "mid read");
          std::string why;
          if (v && !close_to(*v, x.ref, &why)) check.fail("mid read: " + why);
          n = std::move(x.t);
          break;
        }
        case 10:  // continue on the other stream: the next op uses a shared view
          stream = streams[pick(static_cast<int>(streams.size()))];
          n = std::move(x.t);
          s.executes(stream, [&] {
            std::optional<Tensor> y = check.get(s.mul(std::move(*n), 1.0), "stream switch");
            n = std::move(y);
          });
          break;
        case 11: {  // a tensor the other stream's thread handed over (maybe still pending there)
          Handoff& h = slots[pick(static_cast<int>(slots.size()))];
          std::optional<Tensor> other;
          Values other_ref;
          {
            std::lock_guard lock(h.mu);
            if (h.tensor) other = *h.tensor, other_ref = h.ref;
          }
          if (!other) {
            n = std::move(x.t);
            break;
          }
          n = check.get(s.add(std::move(x.t), std::move(*other)), "handoff add");
          for (int j = 0; j < 16; ++j) r[j] += other_ref[j];
          break;
        }
      }
      if (!n) return ops;
      ++ops;
      x = Value{std::move(*n), round_f32(std::move(r))};
    }
    switch (pick(4)) {
      case 0: {  // hand the result over (the slot's old tensor dies here or later)
        Handoff& h = slots[pick(static_cast<int>(slots.size()))];
        std::lock_guard lock(h.mu);
        h.tensor = x.t;
        h.ref = x.ref;
        break;
      }
      case 1:  // dropped without a read, sometimes after a sync
        if (pick(2) == 0) {
          kiln::Status st = s.sync();
          if (!st.ok()) check.fail("sync: " + st.error().to_string());
        }
        return ops;
      default: break;
    }
    std::optional<std::vector<float>> v = check.get(s.to_host(std::move(x.t)), "final read");
    std::string why;
    if (v && !close_to(*v, x.ref, &why)) check.fail("final read: " + why);
    return ops;
  });
}

}  // namespace kiln::stress

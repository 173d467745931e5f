// Session: the minimal in-process client API over a Device (fusion.md §16.1, §16.7): per-thread
// implicit streams and explicit streams, RAII tensors with shared-counter statuses, f32 host
// transfers and a handful of ops. (The full client API comes with the next part.)
//
// Thread-safety: a Session may be used from any number of threads at once; each thread works on
// its current stream. A Tensor may be copied, moved and destroyed on any thread (its counter is
// atomic); a copy is a clone on the tensor's home stream, and a use on another stream creates a
// shared view. Tensors must die before their Session, and the Session before its Device.
//
// Usage:
//   Session s(device);
//   Tensor a = *s.from_host(std::vector<float>{1, 2}, {2});
//   Tensor b = *s.exp(*s.mul_scalar(a, 2.0));        // Lazy: queued on this thread's stream
//   std::vector<float> v = *s.to_host(std::move(b)); // drains this stream (b not produced yet)
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/ir/builders.h"
#include "kiln/runtime/device.h"

namespace kiln::runtime {

// Stream identities (fusion.md §16.1) without global state: each thread's current stream, assigned
// lazily from this allocator's counter (first thread 0, next 1, ...), fresh ids, and scoped
// overrides. Any thread.
class StreamIdAllocator {
 public:
  // The calling thread's current stream; the first call on a thread assigns the next id.
  // `assigned` (optional) is set to true when this call assigned it.
  StreamId current(bool* assigned = nullptr);
  // A new id from the same counter; the ambient stream is unchanged.
  StreamId fresh() { return StreamId(next_.fetch_add(1, std::memory_order_relaxed)); }
  // Sets the calling thread's current stream; returns the previous one (assigning it if needed).
  StreamId set_current(StreamId id);

 private:
  // Identifies this allocator in the per-thread slots (session.cc): a thread's slot for an
  // allocator that died expires with the token, so a new allocator at the same address never
  // inherits it. Each thread only touches its own slots: no shared mutable state.
  std::shared_ptr<const int> token_ = std::make_shared<const int>(0);
  std::atomic<std::uint64_t> next_{0};
};

class Session;

// A client tensor: (id, shape, dtype, home stream, shared counter). Copy = clone on the home
// stream (counter + 1); the last copy to die drops the tensor (queued Drop from the home
// stream's owner thread, foreign drop otherwise). status() is ReadWrite iff the counter is 1.
// Passing a tensor by value to an op or to_host: a copy reads it (ReadOnly), a std::move'd last
// handle consumes it (ReadWrite: freed as soon as its last use has run).
class Tensor {
 public:
  Tensor(const Tensor& other);
  Tensor(Tensor&& other) noexcept = default;
  Tensor& operator=(const Tensor& other);
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor();

  ir::TensorId id() const { return state_->id; }
  const ir::Shape& shape() const { return state_->shape; }
  ir::DType dtype() const { return state_->dtype; }
  StreamId home() const { return state_->home; }
  // ReadWrite when this is the only handle (counter 1), else ReadOnly (fusion.md §16.7).
  ir::TensorStatus status() const;
  bool valid() const { return state_ != nullptr; }

 private:
  friend class Session;
  struct State {
    State(Session* s, ir::TensorId i, ir::Shape sh, ir::DType dt, StreamId h)
        : session(s), id(i), shape(std::move(sh)), dtype(dt), home(h) {}
    Session* session;
    ir::TensorId id;
    ir::Shape shape;
    ir::DType dtype;
    StreamId home;
    // Live handles. fetch_add(relaxed) on clone (like shared_ptr: the cloner already holds one),
    // fetch_sub(acq_rel) on release so that the last releaser sees every use made through the
    // other handles before it registers the drop.
    std::atomic<std::uint32_t> counter{1};
  };
  explicit Tensor(std::shared_ptr<State> s) : state_(std::move(s)) {}
  void release();
  // The IR occurrence for a use now; ReadWrite when the counter is 1.
  ir::TensorIr use() const;

  std::shared_ptr<State> state_;
};

class Session {
 public:
  explicit Session(Device& device) : device_(device) {}
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Device& device() { return device_; }
  StreamIdAllocator& stream_ids() { return ids_; }
  // The calling thread's current stream (its implicit stream unless inside executes()).
  StreamId current_stream();
  // Runs f with the calling thread's current stream set to `id` (an explicit stream, e.g.
  // StreamId::from_number(n) or stream_ids().fresh()), restoring the previous one afterwards.
  template <class F>
  decltype(auto) executes(StreamId id, F&& f) {
    struct Restore {
      StreamIdAllocator& ids;
      StreamId prev;
      ~Restore() { ids.set_current(prev); }
    } restore{ids_, ids_.set_current(id)};
    return std::forward<F>(f)();
  }

  Result<Tensor> from_host(std::span<const float> values, ir::Shape shape);
  Result<std::vector<float>> to_host(Tensor t);
  // Drains the current stream.
  Status sync();

  Result<Tensor> add(Tensor a, Tensor b);
  Result<Tensor> mul(Tensor a, Tensor b);
  Result<Tensor> mul_scalar(Tensor a, double k);
  Result<Tensor> exp(Tensor a);
  Result<Tensor> sum_dim(Tensor a, std::uint64_t axis);
  Result<Tensor> matmul(Tensor a, Tensor b);
  // A custom operation (no inference: the output shape and dtype are given). The reference
  // backend knows none, so executing one fails: the failure path of the tests.
  Result<Tensor> custom(std::string name, std::vector<Tensor> inputs, ir::Shape out_shape, ir::DType out_dtype);

 private:
  friend class Tensor;
  using Builder = std::function<Result<ir::Operation>(std::span<const ir::TensorIr> inputs, ir::TensorId out)>;
  // Shared views for inputs homed elsewhere, the op built (builder errors returned as is),
  // consumed inputs marked, the op queued on the current stream.
  Result<Tensor> run_op(std::span<Tensor> inputs, const Builder& build);
  void drop(const Tensor::State& s);

  Device& device_;
  StreamIdAllocator ids_;
};

}  // namespace kiln::runtime

#include "kiln/runtime/session.h"

#include <cstring>

#include <spdlog/spdlog.h>

namespace kiln::runtime {

// ---- StreamIdAllocator -------------------------------------------------------------------------

namespace {

// The calling thread's current stream per live allocator. thread_local, so a thread's streams
// die with it (a later thread, even one reusing its std::thread::id, gets a fresh id).
struct StreamSlot {
  std::weak_ptr<const int> owner;
  std::uint64_t stream;
};
thread_local std::vector<StreamSlot> t_stream_slots;

StreamSlot* find_slot(const std::shared_ptr<const int>& token) {
  std::erase_if(t_stream_slots, [](const StreamSlot& s) { return s.owner.expired(); });
  for (StreamSlot& s : t_stream_slots)
    if (!s.owner.owner_before(token) && !token.owner_before(s.owner)) return &s;
  return nullptr;
}

}  // namespace

StreamId StreamIdAllocator::current(bool* assigned) {
  if (StreamSlot* s = find_slot(token_)) return StreamId(s->stream);
  const std::uint64_t id = next_.fetch_add(1, std::memory_order_relaxed);
  t_stream_slots.push_back(StreamSlot{token_, id});
  if (assigned) *assigned = true;
  return StreamId(id);
}

StreamId StreamIdAllocator::set_current(StreamId id) {
  const StreamId prev = current();
  find_slot(token_)->stream = id.value();
  return prev;
}

// ---- Tensor ------------------------------------------------------------------------------------

Tensor::Tensor(const Tensor& other) : state_(other.state_) {
  if (state_) state_->counter.fetch_add(1, std::memory_order_relaxed);
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this == &other) return *this;
  Tensor copy(other);
  return *this = std::move(copy);
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this == &other) return *this;
  release();
  state_ = std::move(other.state_);
  return *this;
}

Tensor::~Tensor() { release(); }

void Tensor::release() {
  if (!state_) return;
  // acq_rel: the last releaser acquires every other handle's uses (they released theirs).
  if (state_->counter.fetch_sub(1, std::memory_order_acq_rel) == 1) state_->session->drop(*state_);
  state_.reset();
}

ir::TensorStatus Tensor::status() const {
  return state_->counter.load(std::memory_order_acquire) <= 1 ? ir::TensorStatus::ReadWrite
                                                              : ir::TensorStatus::ReadOnly;
}

ir::TensorIr Tensor::use() const { return ir::TensorIr{state_->id, state_->shape, status(), state_->dtype}; }

// ---- Session -----------------------------------------------------------------------------------

StreamId Session::current_stream() {
  bool assigned = false;
  StreamId id = ids_.current(&assigned);
  // A thread's implicit stream has that thread as its intake producer.
  if (assigned) device_.claim_stream(id);
  return id;
}

void Session::drop(const Tensor::State& s) {
  Status st = device_.drop(s.home, ir::TensorIr{s.id, s.shape, ir::TensorStatus::ReadWrite, s.dtype});
  if (!st.ok()) spdlog::debug("kiln runtime: drop of {}: {}", s.id.to_string(), st.error().to_string());
}

Result<Tensor> Session::from_host(std::span<const float> values, ir::Shape shape) {
  if (ir::num_elements(shape) != values.size())
    return make_error(ErrorCode::IncompatibleShapes, "from_host: " + std::to_string(values.size()) +
                                                         " values for shape " + ir::shape_to_string(shape));
  const StreamId home = current_stream();
  const ir::TensorId id = device_.new_tensor_id();
  KILN_RETURN_IF_ERROR(device_.upload(id, ir::dtypes::f32, shape, std::as_bytes(values)));
  return Tensor(std::make_shared<Tensor::State>(this, id, std::move(shape), ir::dtypes::f32, home));
}

Result<std::vector<float>> Session::to_host(Tensor t) {
  if (!t.valid()) return make_error(ErrorCode::InvalidHandle, "to_host: moved-from tensor");
  if (t.dtype() != ir::dtypes::f32)
    return make_error(ErrorCode::DTypeMismatch, "to_host: " + t.use().to_string() + " is not f32");
  ir::TensorIr ir = t.use();
  // A consuming read (last handle): the read releases the entry, so the handle must not drop it.
  if (ir.status == ir::TensorStatus::ReadWrite) t.state_->counter.fetch_add(1, std::memory_order_relaxed);
  Result<HostData> data = device_.read(t.home(), ir);
  if (!data.ok()) return data.error();
  std::vector<float> out(data->bytes.size() / sizeof(float));
  std::memcpy(out.data(), data->bytes.data(), out.size() * sizeof(float));
  return out;
}

Status Session::sync() { return device_.drain(current_stream()); }

Result<Tensor> Session::run_op(std::span<Tensor> inputs, const Builder& build) {
  const StreamId cur = current_stream();
  // Shared views (fusion.md §16.5): an input homed on another stream is aliased onto this one,
  // so no queue ever names another stream's tensor.
  std::vector<Tensor> views;
  views.reserve(inputs.size());
  std::vector<Tensor*> used;
  used.reserve(inputs.size());
  for (Tensor& t : inputs) {
    if (!t.valid()) return make_error(ErrorCode::InvalidHandle, "op input: moved-from tensor");
    if (t.home() == cur) {
      used.push_back(&t);
      continue;
    }
    const ir::TensorId dst = device_.new_tensor_id();
    KILN_RETURN_IF_ERROR(device_.share(t.home(), t.id(), dst));
    views.push_back(Tensor(std::make_shared<Tensor::State>(this, dst, t.shape(), t.dtype(), cur)));
    used.push_back(&views.back());
  }
  std::vector<ir::TensorIr> irs;
  irs.reserve(used.size());
  for (Tensor* t : used) irs.push_back(t->use());
  const ir::TensorId out = device_.new_tensor_id();
  Result<ir::Operation> op = build(irs, out);
  if (!op.ok()) return op.error();
  // Consumed inputs (counter 1): their handle must not register a Drop after this last use.
  for (std::size_t i = 0; i < used.size(); ++i)
    if (irs[i].status == ir::TensorStatus::ReadWrite) used[i]->state_->counter.fetch_add(1, std::memory_order_relaxed);
  const ir::TensorIr result = op->outputs()[0];
  KILN_RETURN_IF_ERROR(device_.register_op(cur, std::move(op).value()));
  return Tensor(std::make_shared<Tensor::State>(this, out, result.shape, result.dtype, cur));
}

Result<Tensor> Session::add(Tensor a, Tensor b) {
  Tensor in[] = {std::move(a), std::move(b)};
  return run_op(in, [](std::span<const ir::TensorIr> t, ir::TensorId out) {
    return ir::build::binary(ir::Family::NumericFloat, ir::OpKind::Numeric_Add, t[0], t[1], out);
  });
}

Result<Tensor> Session::mul(Tensor a, Tensor b) {
  Tensor in[] = {std::move(a), std::move(b)};
  return run_op(in, [](std::span<const ir::TensorIr> t, ir::TensorId out) {
    return ir::build::binary(ir::Family::NumericFloat, ir::OpKind::Numeric_Mul, t[0], t[1], out);
  });
}

Result<Tensor> Session::mul_scalar(Tensor a, double k) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [k](std::span<const ir::TensorIr> t, ir::TensorId out) -> Result<ir::Operation> {
    KILN_ASSIGN_OR_RETURN(ir::ScalarIr s, ir::ScalarIr::from_f64(k, t[0].dtype));
    return ir::build::scalar(ir::Family::NumericFloat, ir::OpKind::Numeric_MulScalar, t[0], s, out);
  });
}

Result<Tensor> Session::exp(Tensor a) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [](std::span<const ir::TensorIr> t, ir::TensorId out) {
    return ir::build::unary(ir::Family::Float, ir::OpKind::Float_Exp, t[0], out);
  });
}

Result<Tensor> Session::sum_dim(Tensor a, std::uint64_t axis) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [axis](std::span<const ir::TensorIr> t, ir::TensorId out) {
    return ir::build::reduce_dim(ir::Family::NumericFloat, ir::OpKind::Numeric_SumDim, t[0], axis, 1, out);
  });
}

Result<Tensor> Session::matmul(Tensor a, Tensor b) {
  Tensor in[] = {std::move(a), std::move(b)};
  return run_op(in, [](std::span<const ir::TensorIr> t, ir::TensorId out) {
    return ir::build::matmul(ir::Family::Float, ir::OpKind::Float_Matmul, t[0], t[1], out);
  });
}

Result<Tensor> Session::custom(std::string name, std::vector<Tensor> inputs, ir::Shape out_shape,
                               ir::DType out_dtype) {
  return run_op(inputs, [&](std::span<const ir::TensorIr> t, ir::TensorId out) {
    const ir::TensorIr o = ir::TensorIr::uninit(out, out_shape, out_dtype);
    return ir::build::custom(name, t, std::span<const ir::TensorIr>(&o, 1), {});
  });
}

}  // namespace kiln::runtime

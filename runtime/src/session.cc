#include "kiln/runtime/session.h"

#include <boost/container/small_vector.hpp>

#include <cmath>
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
  std::uint64_t next_id = 0, end_id = 0;  // the thread's block of tensor ids (next_tensor_id)
};
thread_local std::vector<StreamSlot> t_stream_slots;

StreamSlot* lookup_slot(const std::shared_ptr<const int>& token) {
  for (StreamSlot& s : t_stream_slots)
    if (!s.owner.owner_before(token) && !token.owner_before(s.owner)) return &s;
  return nullptr;
}

// lookup_slot after sweeping the slots of dead allocators (once per call of current(), which
// every op makes first).
StreamSlot* find_slot(const std::shared_ptr<const int>& token) {
  std::erase_if(t_stream_slots, [](const StreamSlot& s) { return s.owner.expired(); });
  return lookup_slot(token);
}

}  // namespace

StreamId StreamIdAllocator::current(bool* assigned) {
  if (StreamSlot* s = find_slot(token_)) return StreamId(s->stream);
  const std::uint64_t id = next_.fetch_add(1, std::memory_order_relaxed);
  t_stream_slots.push_back(StreamSlot{token_, id});
  if (assigned) *assigned = true;
  return StreamId(id);
}

ir::TensorId StreamIdAllocator::next_tensor_id(SessionTarget& target) {
  StreamSlot* s = lookup_slot(token_);  // current() swept the slots on this op already
  if (s == nullptr) return target.new_tensor_id();
  if (s->next_id == s->end_id) {
    s->next_id = target.new_tensor_ids(ir::kTensorIdBlock).value();
    s->end_id = s->next_id + ir::kTensorIdBlock;
  }
  return ir::TensorId(s->next_id++);
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

Result<Tensor> Session::upload(ir::DType dtype, std::span<const std::byte> bytes, std::size_t count, ir::Shape shape) {
  if (ir::num_elements(shape) != count)
    return make_error(ErrorCode::IncompatibleShapes,
                      "from_host: " + std::to_string(count) + " values for shape " + ir::shape_to_string(shape));
  const StreamId home = current_stream();
  const ir::TensorId id = ids_.next_tensor_id(device_);
  KILN_RETURN_IF_ERROR(device_.upload(home, id, dtype, shape, bytes));
  return Tensor(std::make_shared<Tensor::State>(this, id, std::move(shape), dtype, home));
}

Result<Tensor> Session::from_host(std::span<const float> values, ir::Shape shape) {
  return upload(ir::dtypes::f32, std::as_bytes(values), values.size(), std::move(shape));
}
Result<Tensor> Session::from_host(std::span<const double> values, ir::Shape shape) {
  return upload(ir::dtypes::f64, std::as_bytes(values), values.size(), std::move(shape));
}
Result<Tensor> Session::from_host(std::span<const std::int32_t> values, ir::Shape shape) {
  return upload(ir::dtypes::i32, std::as_bytes(values), values.size(), std::move(shape));
}
Result<Tensor> Session::from_host(std::span<const std::int64_t> values, ir::Shape shape) {
  return upload(ir::dtypes::i64, std::as_bytes(values), values.size(), std::move(shape));
}
Result<Tensor> Session::from_host(const std::vector<bool>& values, ir::Shape shape) {
  // Bool(Native) stores one byte per element, 0 or 1.
  std::vector<std::byte> bytes(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) bytes[i] = values[i] ? std::byte{1} : std::byte{0};
  return upload(kBoolDType, bytes, values.size(), std::move(shape));
}

Result<ir::TensorIr> Session::begin_read(Tensor& t, ir::DType want) {
  if (!t.valid()) return make_error(ErrorCode::InvalidHandle, "to_host: moved-from tensor");
  if (t.dtype() != want)
    return make_error(ErrorCode::DTypeMismatch,
                      "to_host: " + t.use().to_string() + " is not " + want.name() + " (use to_host<T> with its type)");
  ir::TensorIr ir = t.use();
  // A consuming read (last handle): the read releases the entry, so the handle must not drop it.
  if (ir.status == ir::TensorStatus::ReadWrite) t.state_->counter.fetch_add(1, std::memory_order_relaxed);
  return ir;
}

Result<HostData> Session::read(Tensor t, ir::DType want) {
  KILN_ASSIGN_OR_RETURN(ir::TensorIr ir, begin_read(t, want));
  return device_.read(t.home(), ir);
}

Status Session::sync() { return device_.drain(current_stream()); }

Result<Tensor> Session::run_op(std::span<Tensor> inputs, const Builder& build) {
  const StreamId cur = current_stream();
  // Shared views (docs/spec/fusion.md §16.5): an input homed on another stream is aliased onto this one,
  // so no queue ever names another stream's tensor.
  // Inline storage: most ops have one to three inputs, and this is the op path (no heap).
  boost::container::small_vector<Tensor, 3> views;
  views.reserve(inputs.size());  // `used` points into it: no reallocation after this
  boost::container::small_vector<Tensor*, 3> used;
  for (Tensor& t : inputs) {
    if (!t.valid()) return make_error(ErrorCode::InvalidHandle, "op input: moved-from tensor");
    if (t.home() == cur) {
      used.push_back(&t);
      continue;
    }
    const ir::TensorId dst = ids_.next_tensor_id(device_);
    KILN_RETURN_IF_ERROR(device_.share(t.home(), t.id(), cur, dst));
    views.push_back(Tensor(std::make_shared<Tensor::State>(this, dst, t.shape(), t.dtype(), cur)));
    used.push_back(&views.back());
  }
  boost::container::small_vector<ir::TensorIr, 3> irs;
  for (Tensor* t : used) irs.push_back(t->use());
  const ir::TensorId out = ids_.next_tensor_id(device_);
  Result<ir::Operation> op = build(std::span<const ir::TensorIr>(irs.data(), irs.size()), out);
  if (!op.ok()) return op.error();
  // Consumed inputs (counter 1): their handle must not register a Drop after this last use.
  for (std::size_t i = 0; i < used.size(); ++i)
    if (irs[i].status == ir::TensorStatus::ReadWrite) used[i]->state_->counter.fetch_add(1, std::memory_order_relaxed);
  ir::Shape shape = op->outputs()[0].shape;  // the op moves into the queue; its output's shape and dtype stay here
  const ir::DType dtype = op->outputs()[0].dtype;
  KILN_RETURN_IF_ERROR(device_.register_op(cur, std::move(op).value()));
  return Tensor(std::make_shared<Tensor::State>(this, out, std::move(shape), dtype, cur));
}

namespace {

using ir::Family;
using ir::OpKind;
using ir::TensorIr;
namespace build = ir::build;

bool is_floatish(ir::DType d) { return d.is_float() || d.is_quantized(); }
// F/I of docs/spec/ir.md §5.11: the operand's numeric family (a bool operand gets NumericInt, which the
// builder rejects with its own message).
Family numeric_family(const TensorIr& t) { return is_floatish(t.dtype) ? Family::NumericFloat : Family::NumericInt; }
// Base* of docs/spec/ir.md §5.11.
Family base_family(const TensorIr& t) {
  if (is_floatish(t.dtype)) return Family::BaseFloat;
  return t.dtype.is_bool() ? Family::BaseBool : Family::BaseInt;
}
// The family a kind's group implies for an operand.
Family family_for(OpKind kind, const TensorIr& t) {
  switch (ir::op_info(kind).group) {
    case ir::OpGroup::Float: return Family::Float;
    case ir::OpGroup::Int: return Family::Int;
    case ir::OpGroup::Bool: return Family::Bool;
    case ir::OpGroup::Base: return base_family(t);
    default: return numeric_family(t);
  }
}

// An integral exponent's value, if `e` is one.
std::optional<std::int64_t> integral(double e) {
  if (e != std::floor(e) || std::abs(e) > 1e15) return std::nullopt;
  return static_cast<std::int64_t>(e);
}

}  // namespace

Result<Tensor> Session::unary_op(Tensor a, OpKind kind) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [kind](std::span<const TensorIr> t, ir::TensorId out) {
    return build::unary(family_for(kind, t[0]), kind, t[0], out);
  });
}

Result<Tensor> Session::binary_op(Tensor a, Tensor b, OpKind kind) {
  Tensor in[] = {std::move(a), std::move(b)};
  return run_op(in, [kind](std::span<const TensorIr> t, ir::TensorId out) {
    return build::binary(family_for(kind, t[0]), kind, t[0], t[1], out);
  });
}

Result<Tensor> Session::scalar_op(Tensor a, double s, OpKind kind) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [kind, s](std::span<const TensorIr> t, ir::TensorId out) -> Result<ir::Operation> {
    KILN_ASSIGN_OR_RETURN(ir::ScalarIr v, ir::ScalarIr::from_f64(s, t[0].dtype));
    return build::scalar(family_for(kind, t[0]), kind, t[0], v, out);
  });
}

Result<Tensor> Session::compare_op(Tensor a, Tensor b, OpKind kind) {
  Tensor in[] = {std::move(a), std::move(b)};
  return run_op(in, [kind](std::span<const TensorIr> t, ir::TensorId out) {
    // eq of bool operands keeps D(lhs) (docs/spec/ir.md §5.11).
    const ir::DType bd = t[0].dtype.is_bool() ? t[0].dtype : kBoolDType;
    return build::binary_comparison(family_for(kind, t[0]), kind, t[0], t[1], bd, out);
  });
}

Result<Tensor> Session::compare_scalar_op(Tensor a, double s, OpKind kind) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [kind, s](std::span<const TensorIr> t, ir::TensorId out) -> Result<ir::Operation> {
    KILN_ASSIGN_OR_RETURN(ir::ScalarIr v, ir::ScalarIr::from_f64(s, t[0].dtype));
    const ir::DType bd = t[0].dtype.is_bool() ? t[0].dtype : kBoolDType;
    return build::scalar_comparison(family_for(kind, t[0]), kind, t[0], v, bd, out);
  });
}

// ---- Arithmetic

Result<Tensor> Session::add(Tensor a, Tensor b) { return binary_op(std::move(a), std::move(b), OpKind::Numeric_Add); }
Result<Tensor> Session::sub(Tensor a, Tensor b) { return binary_op(std::move(a), std::move(b), OpKind::Numeric_Sub); }
Result<Tensor> Session::mul(Tensor a, Tensor b) { return binary_op(std::move(a), std::move(b), OpKind::Numeric_Mul); }
Result<Tensor> Session::div(Tensor a, Tensor b) { return binary_op(std::move(a), std::move(b), OpKind::Numeric_Div); }
Result<Tensor> Session::rem(Tensor a, Tensor b) { return binary_op(std::move(a), std::move(b), OpKind::Numeric_Rem); }
Result<Tensor> Session::add(Tensor a, double s) { return scalar_op(std::move(a), s, OpKind::Numeric_AddScalar); }
Result<Tensor> Session::sub(Tensor a, double s) { return scalar_op(std::move(a), s, OpKind::Numeric_SubScalar); }
Result<Tensor> Session::mul(Tensor a, double s) { return scalar_op(std::move(a), s, OpKind::Numeric_MulScalar); }
Result<Tensor> Session::div(Tensor a, double s) { return scalar_op(std::move(a), s, OpKind::Numeric_DivScalar); }
Result<Tensor> Session::rem(Tensor a, double s) { return scalar_op(std::move(a), s, OpKind::Numeric_RemScalar); }

Result<Tensor> Session::pow(Tensor a, Tensor b) {
  if (a.valid() && !is_floatish(a.dtype()) && !a.dtype().is_bool())
    return binary_op(std::move(a), std::move(b), OpKind::Numeric_Powi);
  return binary_op(std::move(a), std::move(b), OpKind::Float_Powf);
}

Result<Tensor> Session::pow(Tensor a, double e) {
  if (!a.valid()) return make_error(ErrorCode::InvalidHandle, "pow: moved-from tensor");
  const bool is_float = is_floatish(a.dtype());
  if (std::optional<std::int64_t> k = integral(e)) {
    switch (*k) {
      case 0: {
        // Ones(S(x), D(x)); x itself is only dropped.
        const ir::Shape shape = a.shape();
        const ir::DType dtype = a.dtype();
        { Tensor consumed = std::move(a); }
        return run_op({}, [shape, dtype](std::span<const TensorIr>, ir::TensorId out) {
          return build::creation(is_floatish(dtype) ? Family::BaseFloat : Family::BaseInt, OpKind::Base_Ones, shape,
                                 dtype, out);
        });
      }
      case 1: return a;
      case 2: {
        Tensor x = a;
        return mul(std::move(x), std::move(a));
      }
      case -1:
        if (is_float) return recip(std::move(a));
        break;
      case -2:
        if (is_float) {
          Tensor x = a;
          KILN_ASSIGN_OR_RETURN(Tensor sq, mul(std::move(x), std::move(a)));
          return recip(std::move(sq));
        }
        break;
      default: break;
    }
  }
  return scalar_op(std::move(a), e, is_float ? OpKind::Float_PowfScalar : OpKind::Numeric_PowiScalar);
}

// ---- Unary

Result<Tensor> Session::neg(Tensor a) { return scalar_op(std::move(a), -1.0, OpKind::Numeric_MulScalar); }
Result<Tensor> Session::abs(Tensor a) { return unary_op(std::move(a), OpKind::Numeric_Abs); }
Result<Tensor> Session::exp(Tensor a) { return unary_op(std::move(a), OpKind::Float_Exp); }
Result<Tensor> Session::log(Tensor a) { return unary_op(std::move(a), OpKind::Float_Log); }
Result<Tensor> Session::log1p(Tensor a) { return unary_op(std::move(a), OpKind::Float_Log1p); }
Result<Tensor> Session::sqrt(Tensor a) { return unary_op(std::move(a), OpKind::Float_Sqrt); }
Result<Tensor> Session::sin(Tensor a) { return unary_op(std::move(a), OpKind::Float_Sin); }
Result<Tensor> Session::cos(Tensor a) { return unary_op(std::move(a), OpKind::Float_Cos); }
Result<Tensor> Session::tanh(Tensor a) { return unary_op(std::move(a), OpKind::Float_Tanh); }
Result<Tensor> Session::erf(Tensor a) { return unary_op(std::move(a), OpKind::Float_Erf); }
Result<Tensor> Session::recip(Tensor a) { return unary_op(std::move(a), OpKind::Float_Recip); }

Result<Tensor> Session::rsqrt(Tensor a) {
  KILN_ASSIGN_OR_RETURN(Tensor r, sqrt(std::move(a)));
  return recip(std::move(r));
}

Result<Tensor> Session::sigmoid(Tensor a) {
  if (!a.valid()) return make_error(ErrorCode::InvalidHandle, "sigmoid: moved-from tensor");
  const ir::DType dtype = a.dtype();
  // exp(−log(1 + exp(−x))) computed in f32; both casts are emitted even for f32 (docs/spec/ir.md §5.11).
  KILN_ASSIGN_OR_RETURN(Tensor t, cast(std::move(a), ir::dtypes::f32));
  KILN_ASSIGN_OR_RETURN(t, mul(std::move(t), -1.0));
  KILN_ASSIGN_OR_RETURN(t, exp(std::move(t)));
  KILN_ASSIGN_OR_RETURN(t, add(std::move(t), 1.0));
  KILN_ASSIGN_OR_RETURN(t, log(std::move(t)));
  KILN_ASSIGN_OR_RETURN(t, mul(std::move(t), -1.0));
  KILN_ASSIGN_OR_RETURN(t, exp(std::move(t)));
  return cast(std::move(t), dtype);
}

Result<Tensor> Session::relu(Tensor a) {
  Tensor x = a;
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_scalar_op(std::move(x), 0.0, OpKind::Numeric_LowerEqualElem));
  return mask_fill(std::move(a), std::move(m), 0.0);
}

Result<Tensor> Session::gelu(Tensor a) {
  Tensor x = a;
  KILN_ASSIGN_OR_RETURN(Tensor t, div(std::move(x), std::sqrt(2.0)));
  KILN_ASSIGN_OR_RETURN(t, erf(std::move(t)));
  KILN_ASSIGN_OR_RETURN(t, add(std::move(t), 1.0));
  KILN_ASSIGN_OR_RETURN(t, mul(std::move(a), std::move(t)));
  return div(std::move(t), 2.0);
}

Result<Tensor> Session::silu(Tensor a) {
  Tensor x = a;
  KILN_ASSIGN_OR_RETURN(Tensor s, sigmoid(std::move(x)));
  return mul(std::move(a), std::move(s));
}

// ---- Comparisons

Result<Tensor> Session::eq(Tensor a, Tensor b) { return compare_op(std::move(a), std::move(b), OpKind::Base_Equal); }
Result<Tensor> Session::lt(Tensor a, Tensor b) { return compare_op(std::move(a), std::move(b), OpKind::Numeric_Lower); }
Result<Tensor> Session::le(Tensor a, Tensor b) {
  return compare_op(std::move(a), std::move(b), OpKind::Numeric_LowerEqual);
}
Result<Tensor> Session::gt(Tensor a, Tensor b) {
  return compare_op(std::move(a), std::move(b), OpKind::Numeric_Greater);
}
Result<Tensor> Session::ge(Tensor a, Tensor b) {
  return compare_op(std::move(a), std::move(b), OpKind::Numeric_GreaterEqual);
}
Result<Tensor> Session::eq(Tensor a, double s) { return compare_scalar_op(std::move(a), s, OpKind::Base_EqualElem); }
Result<Tensor> Session::lt(Tensor a, double s) { return compare_scalar_op(std::move(a), s, OpKind::Numeric_LowerElem); }
Result<Tensor> Session::le(Tensor a, double s) {
  return compare_scalar_op(std::move(a), s, OpKind::Numeric_LowerEqualElem);
}
Result<Tensor> Session::gt(Tensor a, double s) {
  return compare_scalar_op(std::move(a), s, OpKind::Numeric_GreaterElem);
}
Result<Tensor> Session::ge(Tensor a, double s) {
  return compare_scalar_op(std::move(a), s, OpKind::Numeric_GreaterEqualElem);
}
Result<Tensor> Session::ne(Tensor a, Tensor b) {
  KILN_ASSIGN_OR_RETURN(Tensor m, eq(std::move(a), std::move(b)));
  return unary_op(std::move(m), OpKind::Bool_Not);
}
Result<Tensor> Session::ne(Tensor a, double s) {
  KILN_ASSIGN_OR_RETURN(Tensor m, eq(std::move(a), s));
  return unary_op(std::move(m), OpKind::Bool_Not);
}

// ---- Selection and conversion

Result<Tensor> Session::mask_where(Tensor tensor, Tensor mask, Tensor value) {
  Tensor in[] = {std::move(tensor), std::move(mask), std::move(value)};
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    return build::mask_where(base_family(t[0]), OpKind::Base_MaskWhere, t[0], t[1], t[2], out);
  });
}

Result<Tensor> Session::mask_fill(Tensor tensor, Tensor mask, double value) {
  Tensor in[] = {std::move(tensor), std::move(mask)};
  return run_op(in, [value](std::span<const TensorIr> t, ir::TensorId out) -> Result<ir::Operation> {
    KILN_ASSIGN_OR_RETURN(ir::ScalarIr v, ir::ScalarIr::from_f64(value, t[0].dtype));
    return build::mask_fill(base_family(t[0]), OpKind::Base_MaskFill, t[0], t[1], v, out);
  });
}

Result<Tensor> Session::clamp(Tensor a, double min, double max) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [min, max](std::span<const TensorIr> t, ir::TensorId out) -> Result<ir::Operation> {
    KILN_ASSIGN_OR_RETURN(ir::ScalarIr lo, ir::ScalarIr::from_f64(min, t[0].dtype));
    KILN_ASSIGN_OR_RETURN(ir::ScalarIr hi, ir::ScalarIr::from_f64(max, t[0].dtype));
    return build::clamp(numeric_family(t[0]), OpKind::Numeric_Clamp, t[0], lo, hi, out);
  });
}

Result<Tensor> Session::cast(Tensor a, ir::DType target) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [target](std::span<const TensorIr> t, ir::TensorId out) -> Result<ir::Operation> {
    const ir::DType from = t[0].dtype;
    const bool to_float = is_floatish(target), to_int = target.is_integral();
    if (!to_float && !to_int)
      return make_error(ErrorCode::DTypeMismatch, "cast: " + t[0].to_string() + " to " + target.name() +
                                                      ": only float and integer targets (use ne(x, 0) for bool)");
    if (from.is_bool())
      return build::cast(Family::Bool, to_float ? OpKind::Bool_IntoFloat : OpKind::Bool_IntoInt, t[0], target, out);
    if (is_floatish(from))
      return to_float ? build::cast(Family::BaseFloat, OpKind::Base_Cast, t[0], target, out)
                      : build::cast(Family::Float, OpKind::Float_IntoInt, t[0], target, out);
    return to_float ? build::cast(Family::Int, OpKind::Int_IntoFloat, t[0], target, out)
                    : build::cast(Family::BaseInt, OpKind::Base_Cast, t[0], target, out);
  });
}

// ---- Reductions

Result<Tensor> Session::squeeze(Tensor a, std::uint64_t dim) {
  std::vector<std::int64_t> args;
  for (std::size_t i = 0; i < a.shape().size(); ++i)
    if (i != dim) args.push_back(static_cast<std::int64_t>(a.shape()[i]));
  return reshape(std::move(a), std::move(args));
}

Result<Tensor> Session::reduce_dim_op(Tensor a, std::uint64_t dim, bool keepdim, OpKind kind) {
  if (!keepdim && a.valid() && a.shape().size() <= 1)
    return make_error(ErrorCode::Invalid, std::string(ir::op_info(kind).variant) + ": keepdim = false on " +
                                              a.use().to_string() + " would give a rank-0 tensor");
  Tensor in[] = {std::move(a)};
  KILN_ASSIGN_OR_RETURN(Tensor r, run_op(in, [kind, dim](std::span<const TensorIr> t, ir::TensorId out) {
                          if (kind == OpKind::Numeric_ArgMax)
                            return build::reduce_dim_arg(numeric_family(t[0]), kind, t[0], dim, 1, kIndexDType, out);
                          return build::reduce_dim(numeric_family(t[0]), kind, t[0], dim, 1, out);
                        }));
  if (keepdim) return r;
  return squeeze(std::move(r), dim);
}

Result<Tensor> Session::sum_dim(Tensor a, std::uint64_t dim, bool keepdim) {
  return reduce_dim_op(std::move(a), dim, keepdim, OpKind::Numeric_SumDim);
}
Result<Tensor> Session::mean_dim(Tensor a, std::uint64_t dim, bool keepdim) {
  return reduce_dim_op(std::move(a), dim, keepdim, OpKind::Numeric_MeanDim);
}
Result<Tensor> Session::max_dim(Tensor a, std::uint64_t dim, bool keepdim) {
  return reduce_dim_op(std::move(a), dim, keepdim, OpKind::Numeric_MaxDim);
}
Result<Tensor> Session::min_dim(Tensor a, std::uint64_t dim, bool keepdim) {
  return reduce_dim_op(std::move(a), dim, keepdim, OpKind::Numeric_MinDim);
}
Result<Tensor> Session::argmax(Tensor a, std::uint64_t dim, bool keepdim) {
  return reduce_dim_op(std::move(a), dim, keepdim, OpKind::Numeric_ArgMax);
}

Result<Tensor> Session::reduce_op(Tensor a, bool keepdim, OpKind kind) {
  const std::size_t rank = a.valid() ? a.shape().size() : 0;
  Tensor in[] = {std::move(a)};
  KILN_ASSIGN_OR_RETURN(Tensor r, run_op(in, [kind](std::span<const TensorIr> t, ir::TensorId out) {
                          return build::reduce(numeric_family(t[0]), kind, t[0], out);
                        }));
  if (!keepdim || rank <= 1) return r;
  return reshape(std::move(r), std::vector<std::int64_t>(rank, 1));
}

Result<Tensor> Session::sum(Tensor a, bool keepdim) { return reduce_op(std::move(a), keepdim, OpKind::Numeric_Sum); }
Result<Tensor> Session::mean(Tensor a, bool keepdim) { return reduce_op(std::move(a), keepdim, OpKind::Numeric_Mean); }

// ---- Compute and layout

Result<Tensor> Session::matmul(Tensor a, Tensor b) {
  Tensor in[] = {std::move(a), std::move(b)};
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    if (is_floatish(t[0].dtype)) return build::matmul(Family::Float, OpKind::Float_Matmul, t[0], t[1], out);
    return build::matmul(Family::Int, OpKind::Int_Matmul, t[0], t[1], out);
  });
}

Result<Tensor> Session::reshape(Tensor a, std::vector<std::int64_t> args) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [&args](std::span<const TensorIr> t, ir::TensorId out) {
    return build::shape_op(base_family(t[0]), OpKind::Base_Reshape, t[0], args, out);
  });
}

Result<Tensor> Session::swap_dims(Tensor a, std::uint64_t dim1, std::uint64_t dim2) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [dim1, dim2](std::span<const TensorIr> t, ir::TensorId out) {
    return build::swap_dims(base_family(t[0]), OpKind::Base_SwapDims, t[0], dim1, dim2, out);
  });
}

Result<Tensor> Session::permute(Tensor a, std::vector<std::uint64_t> axes) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [&axes](std::span<const TensorIr> t, ir::TensorId out) {
    return build::permute(base_family(t[0]), OpKind::Base_Permute, t[0], axes, out);
  });
}

Result<Tensor> Session::expand(Tensor a, ir::Shape shape) {
  std::vector<std::int64_t> args(shape.begin(), shape.end());
  Tensor in[] = {std::move(a)};
  return run_op(in, [&args](std::span<const TensorIr> t, ir::TensorId out) {
    return build::shape_op(base_family(t[0]), OpKind::Base_Expand, t[0], args, out);
  });
}

Result<Tensor> Session::slice(Tensor a, std::vector<ir::Slice> ranges) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [&ranges](std::span<const TensorIr> t, ir::TensorId out) {
    return build::slice(base_family(t[0]), OpKind::Base_Slice, t[0], ranges, out);
  });
}

Result<Tensor> Session::cat(std::vector<Tensor> tensors, std::uint64_t dim) {
  if (tensors.empty()) return make_error(ErrorCode::Invalid, "cat: no tensors");
  return run_op(tensors, [dim](std::span<const TensorIr> t, ir::TensorId out) {
    return build::cat(base_family(t[0]), OpKind::Base_Cat, t, dim, out);
  });
}

Result<Tensor> Session::gather(Tensor a, std::uint64_t dim, Tensor indices) {
  Tensor in[] = {std::move(a), std::move(indices)};
  return run_op(in, [dim](std::span<const TensorIr> t, ir::TensorId out) {
    return build::gather(base_family(t[0]), OpKind::Base_Gather, t[0], dim, t[1], out);
  });
}

// ---- Composites

Result<Tensor> Session::softmax(Tensor x, std::uint64_t dim) {
  Tensor x2 = x;
  KILN_ASSIGN_OR_RETURN(Tensor m, max_dim(std::move(x2), dim));
  KILN_ASSIGN_OR_RETURN(Tensor e, sub(std::move(x), std::move(m)));
  KILN_ASSIGN_OR_RETURN(e, exp(std::move(e)));
  Tensor e2 = e;
  KILN_ASSIGN_OR_RETURN(Tensor s, sum_dim(std::move(e2), dim));
  return div(std::move(e), std::move(s));
}

Result<Tensor> Session::log_softmax(Tensor x, std::uint64_t dim) {
  Tensor x2 = x;
  KILN_ASSIGN_OR_RETURN(Tensor m, max_dim(std::move(x2), dim));
  KILN_ASSIGN_OR_RETURN(Tensor y, sub(std::move(x), std::move(m)));
  Tensor y2 = y;
  KILN_ASSIGN_OR_RETURN(Tensor l, exp(std::move(y2)));
  KILN_ASSIGN_OR_RETURN(l, sum_dim(std::move(l), dim));
  KILN_ASSIGN_OR_RETURN(l, log(std::move(l)));
  return sub(std::move(y), std::move(l));
}

Result<Tensor> Session::mse_loss(Tensor pred, Tensor target) {
  KILN_ASSIGN_OR_RETURN(Tensor d, sub(std::move(pred), std::move(target)));
  KILN_ASSIGN_OR_RETURN(d, pow(std::move(d), 2.0));
  return mean(std::move(d));
}

Result<Tensor> Session::cross_entropy(Tensor logits, Tensor target_probs) {
  if (logits.valid() && logits.shape().size() != 2)
    return make_error(ErrorCode::IncompatibleShapes,
                      "cross_entropy: logits " + logits.use().to_string() + " must be [N, C]");
  KILN_ASSIGN_OR_RETURN(Tensor l, log_softmax(std::move(logits), 1));
  KILN_ASSIGN_OR_RETURN(l, mul(std::move(l), std::move(target_probs)));
  KILN_ASSIGN_OR_RETURN(l, sum_dim(std::move(l), 1));
  KILN_ASSIGN_OR_RETURN(l, mean(std::move(l)));
  return neg(std::move(l));
}

Result<Tensor> Session::cross_entropy_indices(Tensor logits, Tensor classes) {
  if (logits.valid() && logits.shape().size() != 2)
    return make_error(ErrorCode::IncompatibleShapes,
                      "cross_entropy_indices: logits " + logits.use().to_string() + " must be [N, C]");
  if (classes.valid() && (classes.shape().size() != 1 || (logits.valid() && classes.shape()[0] != logits.shape()[0])))
    return make_error(ErrorCode::IncompatibleShapes, "cross_entropy_indices: classes " + classes.use().to_string() +
                                                         " must be [N] for logits " + logits.use().to_string());
  KILN_ASSIGN_OR_RETURN(Tensor l, log_softmax(std::move(logits), 1));
  KILN_ASSIGN_OR_RETURN(Tensor idx, reshape(std::move(classes), {-1, 1}));
  KILN_ASSIGN_OR_RETURN(l, gather(std::move(l), 1, std::move(idx)));
  KILN_ASSIGN_OR_RETURN(l, mean(std::move(l)));
  return neg(std::move(l));
}

Result<Tensor> Session::custom(std::string name, std::vector<Tensor> inputs, ir::Shape out_shape, ir::DType out_dtype) {
  return run_op(inputs, [&](std::span<const ir::TensorIr> t, ir::TensorId out) {
    const ir::TensorIr o = ir::TensorIr::uninit(out, out_shape, out_dtype);
    return ir::build::custom(name, t, std::span<const ir::TensorIr>(&o, 1), {});
  });
}

}  // namespace kiln::runtime

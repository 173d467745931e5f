#include "kiln/runtime/session.h"

#include <boost/container/small_vector.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

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

Result<Tensor> Session::from_host_bytes(ir::DType dtype, std::span<const std::byte> bytes, ir::Shape shape) {
  if (dtype.is_quantized()) {  // kiln's QFloat layout, as to_host_bytes gives it
    Result<ir::shape::QuantGeometry> g = ir::shape::quant_geometry(shape, dtype.scheme());
    if (!g.ok()) return make_error(g.error().code, "from_host_bytes: " + g.error().message);
    if (bytes.size() != g->total_bytes)
      return make_error(ErrorCode::IncompatibleShapes, "from_host_bytes: " + std::to_string(bytes.size()) +
                                                           " bytes for a " + dtype.name() + ir::shape_to_string(shape) +
                                                           " tensor, which holds " + std::to_string(g->total_bytes));
    const std::size_t count = ir::num_elements(shape);
    return upload(dtype, bytes, count, std::move(shape));
  }
  const std::size_t width = dtype.size_bytes();
  if (width == 0) return make_error(ErrorCode::Unsupported, "from_host_bytes: " + dtype.name() + " has no fixed size");
  if (bytes.size() % width != 0)
    return make_error(ErrorCode::IncompatibleShapes, "from_host_bytes: " + std::to_string(bytes.size()) +
                                                         " bytes is not a whole number of " + dtype.name());
  return upload(dtype, bytes, bytes.size() / width, std::move(shape));
}

Status Session::to_host_bytes(Tensor t, std::span<std::byte> dst) {
  if (!t.valid()) return make_error(ErrorCode::InvalidHandle, "to_host_bytes: moved-from tensor");
  const ir::DType dtype = t.dtype();
  KILN_ASSIGN_OR_RETURN(ir::TensorIr read_ir, begin_read(t, dtype));
  return device_.read_into(t.home(), read_ir, dst);
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

Result<Tensor> Session::run_op(std::span<Tensor> inputs, Builder build) {
  std::optional<Tensor> out[1];
  auto one_output = [build](std::span<const ir::TensorIr> t, std::span<const ir::TensorId> ids) {
    return build(t, ids[0]);
  };
  KILN_RETURN_IF_ERROR(run_op_outputs(inputs, out, one_output));
  return std::move(*out[0]);
}

Status Session::run_op_outputs(std::span<Tensor> inputs, std::span<std::optional<Tensor>> outs, MultiBuilder build) {
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
  boost::container::small_vector<ir::TensorId, 2> out_ids;
  for (std::size_t i = 0; i < outs.size(); ++i) out_ids.push_back(ids_.next_tensor_id(device_));
  Result<ir::Operation> op = build(std::span<const ir::TensorIr>(irs.data(), irs.size()),
                                   std::span<const ir::TensorId>(out_ids.data(), out_ids.size()));
  if (!op.ok()) return op.error();
  if (op->outputs().size() != outs.size())
    return make_error(ErrorCode::Internal, op->kind_name() + ": built with " + std::to_string(op->outputs().size()) +
                                               " outputs, " + std::to_string(outs.size()) + " expected");
  // Consumed inputs (counter 1): their handle must not register a Drop after this last use.
  for (std::size_t i = 0; i < used.size(); ++i)
    if (irs[i].status == ir::TensorStatus::ReadWrite) used[i]->state_->counter.fetch_add(1, std::memory_order_relaxed);
  // The op moves into the queue; its outputs' ids, shapes and dtypes stay here.
  boost::container::small_vector<ir::TensorIr, 2> produced(op->outputs().begin(), op->outputs().end());
  KILN_RETURN_IF_ERROR(device_.register_op(cur, std::move(op).value()));
  for (std::size_t i = 0; i < outs.size(); ++i)
    outs[i].emplace(Tensor(
        std::make_shared<Tensor::State>(this, produced[i].id, std::move(produced[i].shape), produced[i].dtype, cur)));
  return Status::Ok();
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
    case ir::OpGroup::Activation: return Family::Activation;
    case ir::OpGroup::Base: return base_family(t);
    default: return numeric_family(t);
  }
}

// Base* of a created tensor of dtype `d` (Zeros, Ones, Empty).
Family creation_family(ir::DType d) {
  if (is_floatish(d)) return Family::BaseFloat;
  return d.is_bool() ? Family::BaseBool : Family::BaseInt;
}

bool is_bool(const Tensor& t) { return t.valid() && t.dtype().is_bool(); }

// A module op's optional input (bias?), present when the op got more than `i` inputs.
std::optional<TensorIr> optional_input(std::span<const TensorIr> t, std::size_t i) {
  if (i < t.size()) return t[i];
  return std::nullopt;
}

Error moved_from(const char* op) {
  return make_error(ErrorCode::InvalidHandle, std::string(op) + ": moved-from tensor");
}

// The activations' decompositions would run on integers too; Burn's ActivationOps take floats
// only, as the Activation kinds of the router form do (checked first, before any IR).
Status require_float(const Tensor& x, const char* call) {
  if (!x.valid()) return moved_from(call);
  if (is_floatish(x.dtype())) return Status::Ok();
  return make_error(ErrorCode::DTypeMismatch, std::string(call) + ": the input is " + std::string(x.dtype().name()) +
                                                  "; activations take float tensors");
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

// max_pair / min_pair (docs/spec/ir.md §5.11): a mask from one comparison, then a select.
Result<Tensor> Session::maximum(Tensor a, Tensor b) {
  Tensor a2 = a, b2 = b;
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_op(std::move(a2), std::move(b2), OpKind::Numeric_Lower));
  return mask_where(std::move(a), std::move(m), std::move(b));
}

Result<Tensor> Session::minimum(Tensor a, Tensor b) {
  Tensor a2 = a, b2 = b;
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_op(std::move(b2), std::move(a2), OpKind::Numeric_Lower));
  return mask_where(std::move(a), std::move(m), std::move(b));
}

Result<Tensor> Session::maximum(Tensor a, double s) {
  Tensor x = a;
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_scalar_op(std::move(x), s, OpKind::Numeric_LowerElem));
  return mask_fill(std::move(a), std::move(m), s);
}

Result<Tensor> Session::minimum(Tensor a, double s) {
  Tensor x = a;
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_scalar_op(std::move(x), s, OpKind::Numeric_GreaterElem));
  return mask_fill(std::move(a), std::move(m), s);
}

// ---- Logic and bitwise

Result<Tensor> Session::logic_op(Tensor a, Tensor b, OpKind bool_kind, OpKind int_kind) {
  if (!is_bool(a)) return binary_op(std::move(a), std::move(b), int_kind);
  // Bool Xor is never emitted by the fusion client (docs/spec/ir.md §5.3): xor = not(equal).
  if (bool_kind == OpKind::Bool_Xor && !router()) return ne(std::move(a), std::move(b));
  return binary_op(std::move(a), std::move(b), bool_kind);
}

Result<Tensor> Session::logic_scalar_op(Tensor a, double s, OpKind bool_kind, OpKind int_kind) {
  if (!is_bool(a)) return scalar_op(std::move(a), s, int_kind);
  // (K) docs/spec/ir.md §5.11: the bool scalar becomes a tensor of S(a) and D(a), then the tensor form.
  KILN_ASSIGN_OR_RETURN(Tensor rhs, creation_op(a.shape(), a.dtype(), s != 0 ? OpKind::Base_Ones : OpKind::Base_Zeros));
  return logic_op(std::move(a), std::move(rhs), bool_kind, bool_kind);
}

Result<Tensor> Session::and_(Tensor a, Tensor b) {
  return logic_op(std::move(a), std::move(b), OpKind::Bool_And, OpKind::Int_BitwiseAnd);
}
Result<Tensor> Session::or_(Tensor a, Tensor b) {
  return logic_op(std::move(a), std::move(b), OpKind::Bool_Or, OpKind::Int_BitwiseOr);
}
Result<Tensor> Session::xor_(Tensor a, Tensor b) {
  return logic_op(std::move(a), std::move(b), OpKind::Bool_Xor, OpKind::Int_BitwiseXor);
}
Result<Tensor> Session::and_(Tensor a, double s) {
  return logic_scalar_op(std::move(a), s, OpKind::Bool_And, OpKind::Int_BitwiseAndScalar);
}
Result<Tensor> Session::or_(Tensor a, double s) {
  return logic_scalar_op(std::move(a), s, OpKind::Bool_Or, OpKind::Int_BitwiseOrScalar);
}
Result<Tensor> Session::xor_(Tensor a, double s) {
  return logic_scalar_op(std::move(a), s, OpKind::Bool_Xor, OpKind::Int_BitwiseXorScalar);
}
Result<Tensor> Session::not_(Tensor a) {
  const OpKind kind = is_bool(a) ? OpKind::Bool_Not : OpKind::Int_BitwiseNot;
  return unary_op(std::move(a), kind);
}
Result<Tensor> Session::bitwise_left_shift(Tensor a, Tensor b) {
  return binary_op(std::move(a), std::move(b), OpKind::Int_BitwiseLeftShift);
}
Result<Tensor> Session::bitwise_left_shift(Tensor a, double s) {
  return scalar_op(std::move(a), s, OpKind::Int_BitwiseLeftShiftScalar);
}
Result<Tensor> Session::bitwise_right_shift(Tensor a, Tensor b) {
  return binary_op(std::move(a), std::move(b), OpKind::Int_BitwiseRightShift);
}
Result<Tensor> Session::bitwise_right_shift(Tensor a, double s) {
  return scalar_op(std::move(a), s, OpKind::Int_BitwiseRightShiftScalar);
}

// ---- Unary

Result<Tensor> Session::neg(Tensor a) {
  if (router()) return unary_op(std::move(a), OpKind::Numeric_Neg);
  return scalar_op(std::move(a), -1.0, OpKind::Numeric_MulScalar);
}
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
  if (router()) return unary_op(std::move(a), OpKind::Activation_Sigmoid);
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
  if (router()) return unary_op(std::move(a), OpKind::Activation_Relu);
  Tensor x = a;
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_scalar_op(std::move(x), 0.0, OpKind::Numeric_LowerEqualElem));
  return mask_fill(std::move(a), std::move(m), 0.0);
}

Result<Tensor> Session::gelu(Tensor a) {
  if (router()) return unary_op(std::move(a), OpKind::Activation_Gelu);
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

Result<Tensor> Session::floor(Tensor a) { return unary_op(std::move(a), OpKind::Float_Floor); }
Result<Tensor> Session::ceil(Tensor a) { return unary_op(std::move(a), OpKind::Float_Ceil); }
Result<Tensor> Session::round(Tensor a) { return unary_op(std::move(a), OpKind::Float_Round); }
Result<Tensor> Session::trunc(Tensor a) { return unary_op(std::move(a), OpKind::Float_Trunc); }

Result<Tensor> Session::sign(Tensor a) {
  if (!a.valid()) return moved_from("sign");
  if (a.dtype().is_bool())
    return make_error(ErrorCode::DTypeMismatch, "sign: " + a.use().to_string() + " is bool; sign takes float or int");
  if (router()) return unary_op(std::move(a), OpKind::Numeric_Sign);
  // docs/spec/ir.md §5.11, in this order: Zeros, LowerElem, GreaterElem, MaskFill(−1), MaskFill(1).
  KILN_ASSIGN_OR_RETURN(Tensor z, zeros(a.shape(), a.dtype()));
  Tensor x = a;
  KILN_ASSIGN_OR_RETURN(Tensor below, compare_scalar_op(std::move(x), 0.0, OpKind::Numeric_LowerElem));
  KILN_ASSIGN_OR_RETURN(Tensor above, compare_scalar_op(std::move(a), 0.0, OpKind::Numeric_GreaterElem));
  KILN_ASSIGN_OR_RETURN(z, mask_fill(std::move(z), std::move(below), -1.0));
  return mask_fill(std::move(z), std::move(above), 1.0);
}

// ---- Activations without a §5.11 row (docs/spec/ir.md §5.9). The fusion-client form is the
// sequence of Burn's default ActivationOps (burn-fusion keeps the defaults), op for op in Rust's
// evaluation order; the router form is the one Activation kind.

Result<Tensor> Session::leaky_relu(Tensor x, double negative_slope) {
  KILN_RETURN_IF_ERROR(require_float(x, "leaky_relu"));
  if (router()) return scalar_op(std::move(x), negative_slope, OpKind::Activation_LeakyRelu);
  // mask_where(x, lower_elem(x, 0), mul_scalar(x, slope))
  Tensor x1 = x, x2 = x;
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_scalar_op(std::move(x1), 0.0, OpKind::Numeric_LowerElem));
  KILN_ASSIGN_OR_RETURN(Tensor scaled, mul(std::move(x2), negative_slope));
  return mask_where(std::move(x), std::move(m), std::move(scaled));
}

Result<Tensor> Session::prelu(Tensor x, Tensor alpha) {
  KILN_RETURN_IF_ERROR(require_float(x, "prelu"));
  if (router()) return binary_op(std::move(x), std::move(alpha), OpKind::Activation_PRelu);
  // mask_where(x, lower_elem(x, 0), mul(x, alpha))
  Tensor x1 = x, x2 = x;
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_scalar_op(std::move(x1), 0.0, OpKind::Numeric_LowerElem));
  KILN_ASSIGN_OR_RETURN(Tensor scaled, mul(std::move(x2), std::move(alpha)));
  return mask_where(std::move(x), std::move(m), std::move(scaled));
}

Result<Tensor> Session::hard_sigmoid(Tensor x, double alpha, double beta) {
  KILN_RETURN_IF_ERROR(require_float(x, "hard_sigmoid"));
  if (router()) {
    Tensor in[] = {std::move(x)};
    return run_op(in, [alpha, beta](std::span<const TensorIr> t, ir::TensorId out) -> Result<ir::Operation> {
      KILN_ASSIGN_OR_RETURN(ir::ScalarIr a, ir::ScalarIr::from_f64(alpha, t[0].dtype));
      KILN_ASSIGN_OR_RETURN(ir::ScalarIr b, ir::ScalarIr::from_f64(beta, t[0].dtype));
      return build::hard_sigmoid(t[0], a, b, out);
    });
  }
  // cast(clamp(alpha · cast(x, f32) + beta, 0, 1), D(x)); both casts even for f32, as sigmoid's.
  const ir::DType dtype = x.dtype();
  KILN_ASSIGN_OR_RETURN(Tensor t, cast(std::move(x), ir::dtypes::f32));
  KILN_ASSIGN_OR_RETURN(t, mul(std::move(t), alpha));
  KILN_ASSIGN_OR_RETURN(t, add(std::move(t), beta));
  KILN_ASSIGN_OR_RETURN(t, clamp(std::move(t), 0.0, 1.0));
  return cast(std::move(t), dtype);
}

// −max(−x, 0) − log(exp(−max(−x, 0)) + exp(−x − max(−x, 0))): the log-sum-exp form.
Result<Tensor> Session::log_sigmoid(Tensor x) {
  KILN_RETURN_IF_ERROR(require_float(x, "log_sigmoid"));
  if (router()) return unary_op(std::move(x), OpKind::Activation_LogSigmoid);
  KILN_ASSIGN_OR_RETURN(Tensor x_neg, neg(std::move(x)));
  Tensor x_neg1 = x_neg, x_neg2 = x_neg;
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_scalar_op(std::move(x_neg1), 0.0, OpKind::Numeric_LowerElem));
  KILN_ASSIGN_OR_RETURN(Tensor max_elem, mask_fill(std::move(x_neg2), std::move(m), 0.0));
  Tensor max_elem1 = max_elem;
  KILN_ASSIGN_OR_RETURN(Tensor max_neg, neg(std::move(max_elem1)));
  Tensor max_neg1 = max_neg;
  KILN_ASSIGN_OR_RETURN(Tensor e1, exp(std::move(max_neg1)));
  KILN_ASSIGN_OR_RETURN(Tensor e2, sub(std::move(x_neg), std::move(max_elem)));
  KILN_ASSIGN_OR_RETURN(e2, exp(std::move(e2)));
  KILN_ASSIGN_OR_RETURN(Tensor z, add(std::move(e1), std::move(e2)));
  KILN_ASSIGN_OR_RETURN(z, log(std::move(z)));
  return sub(std::move(max_neg), std::move(z));
}

// Burn's activation::softmin: softmax(neg(x), dim).
Result<Tensor> Session::softmin(Tensor x, std::uint64_t dim) {
  KILN_RETURN_IF_ERROR(require_float(x, "softmin"));
  if (router()) return activation_dim_op(std::move(x), dim, OpKind::Activation_Softmin);
  KILN_ASSIGN_OR_RETURN(Tensor n, neg(std::move(x)));
  return softmax(std::move(n), dim);
}

// mask_fill(grad, lower_equal_elem(output, 0), 0)
Result<Tensor> Session::relu_backward(Tensor output, Tensor grad) {
  KILN_RETURN_IF_ERROR(require_float(output, "relu_backward"));
  if (router()) return binary_op(std::move(output), std::move(grad), OpKind::Activation_ReluBackward);
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_scalar_op(std::move(output), 0.0, OpKind::Numeric_LowerEqualElem));
  return mask_fill(std::move(grad), std::move(m), 0.0);
}

// The derivative of the tanh approximation, with Burn's six-digit constants:
// y = 0.5 tanh(u) + (0.0535161 x³ + 0.398942 x)(1 − tanh²(u)) + 0.5, u = 0.0356774 x³ + 0.797885 x.
Result<Tensor> Session::gelu_backward(Tensor x, Tensor grad) {
  KILN_RETURN_IF_ERROR(require_float(x, "gelu_backward"));
  if (router()) return binary_op(std::move(x), std::move(grad), OpKind::Activation_GeluBackward);
  Tensor x1 = x, x2 = x;
  KILN_ASSIGN_OR_RETURN(Tensor x3, pow(std::move(x1), 3.0));
  Tensor x3b = x3;
  KILN_ASSIGN_OR_RETURN(Tensor c1, mul(std::move(x3), 0.0356774));
  KILN_ASSIGN_OR_RETURN(Tensor c2, mul(std::move(x2), 0.797885));
  KILN_ASSIGN_OR_RETURN(Tensor c3, mul(std::move(x3b), 0.0535161));
  KILN_ASSIGN_OR_RETURN(Tensor c4, mul(std::move(x), 0.398942));
  KILN_ASSIGN_OR_RETURN(Tensor inner1, add(std::move(c1), std::move(c2)));
  KILN_ASSIGN_OR_RETURN(Tensor inner2, add(std::move(c3), std::move(c4)));
  KILN_ASSIGN_OR_RETURN(Tensor th, tanh(std::move(inner1)));
  Tensor th1 = th;
  KILN_ASSIGN_OR_RETURN(Tensor sech, pow(std::move(th1), 2.0));
  KILN_ASSIGN_OR_RETURN(sech, neg(std::move(sech)));
  KILN_ASSIGN_OR_RETURN(sech, add(std::move(sech), 1.0));
  KILN_ASSIGN_OR_RETURN(Tensor y1, mul(std::move(th), 0.5));
  KILN_ASSIGN_OR_RETURN(Tensor y2, mul(std::move(inner2), std::move(sech)));
  KILN_ASSIGN_OR_RETURN(y2, add(std::move(y2), 0.5));
  KILN_ASSIGN_OR_RETURN(Tensor y, add(std::move(y1), std::move(y2)));
  return mul(std::move(y), std::move(grad));
}

// mul(mul(output, add_scalar(neg(output), 1)), grad)
Result<Tensor> Session::sigmoid_backward(Tensor output, Tensor grad) {
  KILN_RETURN_IF_ERROR(require_float(output, "sigmoid_backward"));
  if (router()) return binary_op(std::move(output), std::move(grad), OpKind::Activation_SigmoidBackward);
  Tensor out1 = output;
  KILN_ASSIGN_OR_RETURN(Tensor t, neg(std::move(out1)));
  KILN_ASSIGN_OR_RETURN(t, add(std::move(t), 1.0));
  KILN_ASSIGN_OR_RETURN(t, mul(std::move(output), std::move(t)));
  return mul(std::move(t), std::move(grad));
}

// grad · (max_derive − sign · (1 − 1 / z)), z as in log_sigmoid; where x > 0 (the mask −x < 0)
// max_derive = 0 and sign = −1, elsewhere both 1 (Burn's form).
Result<Tensor> Session::log_sigmoid_backward(Tensor x, Tensor grad) {
  KILN_RETURN_IF_ERROR(require_float(x, "log_sigmoid_backward"));
  if (router()) return binary_op(std::move(x), std::move(grad), OpKind::Activation_LogSigmoidBackward);
  const ir::Shape shape = x.shape();
  const ir::DType dtype = x.dtype();
  KILN_ASSIGN_OR_RETURN(Tensor x_neg, neg(std::move(x)));
  Tensor x_neg1 = x_neg, x_neg2 = x_neg;
  KILN_ASSIGN_OR_RETURN(Tensor m, compare_scalar_op(std::move(x_neg1), 0.0, OpKind::Numeric_LowerElem));
  Tensor m1 = m, m2 = m;
  KILN_ASSIGN_OR_RETURN(Tensor max_elem, mask_fill(std::move(x_neg2), std::move(m1), 0.0));
  Tensor max_elem1 = max_elem;
  KILN_ASSIGN_OR_RETURN(Tensor e1, neg(std::move(max_elem1)));
  KILN_ASSIGN_OR_RETURN(e1, exp(std::move(e1)));
  KILN_ASSIGN_OR_RETURN(Tensor e2, sub(std::move(x_neg), std::move(max_elem)));
  KILN_ASSIGN_OR_RETURN(e2, exp(std::move(e2)));
  KILN_ASSIGN_OR_RETURN(Tensor z, add(std::move(e1), std::move(e2)));
  KILN_ASSIGN_OR_RETURN(Tensor ones_t, ones(shape, dtype));
  Tensor ones1 = ones_t, ones2 = ones_t;
  KILN_ASSIGN_OR_RETURN(Tensor max_derive, mask_fill(std::move(ones1), std::move(m2), 0.0));
  KILN_ASSIGN_OR_RETURN(Tensor sign_t, mask_fill(std::move(ones2), std::move(m), -1.0));
  KILN_ASSIGN_OR_RETURN(z, recip(std::move(z)));
  KILN_ASSIGN_OR_RETURN(Tensor t, sub(std::move(ones_t), std::move(z)));
  KILN_ASSIGN_OR_RETURN(t, mul(std::move(sign_t), std::move(t)));
  KILN_ASSIGN_OR_RETURN(t, sub(std::move(max_derive), std::move(t)));
  return mul(std::move(grad), std::move(t));
}

Result<Tensor> Session::activation_dim_op(Tensor a, std::uint64_t dim, OpKind kind) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [kind, dim](std::span<const TensorIr> t, ir::TensorId out) {
    return build::dim(Family::Activation, kind, t[0], dim, out);
  });
}

Result<Tensor> Session::is_nan(Tensor a) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    return build::unary_comparison(Family::Float, OpKind::Float_IsNan, t[0], kBoolDType, out);
  });
}

Result<Tensor> Session::is_inf(Tensor a) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    return build::unary_comparison(Family::Float, OpKind::Float_IsInf, t[0], kBoolDType, out);
  });
}

// ---- Trigonometric and hyperbolic (docs/spec/ir.md §5.6)

Result<Tensor> Session::cosh(Tensor a) { return unary_op(std::move(a), OpKind::Float_Cosh); }
Result<Tensor> Session::sinh(Tensor a) { return unary_op(std::move(a), OpKind::Float_Sinh); }
Result<Tensor> Session::tan(Tensor a) { return unary_op(std::move(a), OpKind::Float_Tan); }
Result<Tensor> Session::acos(Tensor a) { return unary_op(std::move(a), OpKind::Float_ArcCos); }
Result<Tensor> Session::acosh(Tensor a) { return unary_op(std::move(a), OpKind::Float_ArcCosh); }
Result<Tensor> Session::asin(Tensor a) { return unary_op(std::move(a), OpKind::Float_ArcSin); }
Result<Tensor> Session::asinh(Tensor a) { return unary_op(std::move(a), OpKind::Float_ArcSinh); }
Result<Tensor> Session::atan(Tensor a) { return unary_op(std::move(a), OpKind::Float_ArcTan); }
Result<Tensor> Session::atanh(Tensor a) { return unary_op(std::move(a), OpKind::Float_ArcTanh); }
Result<Tensor> Session::atan2(Tensor y, Tensor x) {
  return binary_op(std::move(y), std::move(x), OpKind::Float_ArcTan2);
}
Result<Tensor> Session::hypot(Tensor a, Tensor b) { return binary_op(std::move(a), std::move(b), OpKind::Float_Hypot); }

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
  if (router()) return compare_op(std::move(a), std::move(b), OpKind::Base_NotEqual);
  KILN_ASSIGN_OR_RETURN(Tensor m, eq(std::move(a), std::move(b)));
  return unary_op(std::move(m), OpKind::Bool_Not);
}
Result<Tensor> Session::ne(Tensor a, double s) {
  if (router()) return compare_scalar_op(std::move(a), s, OpKind::Base_NotEqualElem);
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

// Burn's default float_clamp_min / clamp_max are the max / min scalar sequences.
Result<Tensor> Session::clamp_min(Tensor a, double min) {
  if (router()) return scalar_op(std::move(a), min, OpKind::Numeric_ClampMin);
  return maximum(std::move(a), min);
}
Result<Tensor> Session::clamp_max(Tensor a, double max) {
  if (router()) return scalar_op(std::move(a), max, OpKind::Numeric_ClampMax);
  return minimum(std::move(a), max);
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

// ---- Creation

Result<Tensor> Session::creation_op(ir::Shape shape, ir::DType dtype, OpKind kind) {
  return run_op({}, [&shape, dtype, kind](std::span<const TensorIr>, ir::TensorId out) {
    return build::creation(creation_family(dtype), kind, shape, dtype, out);
  });
}

Result<Tensor> Session::zeros(ir::Shape shape, ir::DType dtype) {
  return creation_op(std::move(shape), dtype, OpKind::Base_Zeros);
}
Result<Tensor> Session::ones(ir::Shape shape, ir::DType dtype) {
  return creation_op(std::move(shape), dtype, OpKind::Base_Ones);
}
Result<Tensor> Session::empty(ir::Shape shape, ir::DType dtype) {
  return creation_op(std::move(shape), dtype, OpKind::Base_Empty);
}

Result<Tensor> Session::full(ir::Shape shape, double value, ir::DType dtype) {
  if (dtype.is_bool()) return creation_op(std::move(shape), dtype, value != 0 ? OpKind::Base_Ones : OpKind::Base_Zeros);
  return run_op({}, [&shape, value, dtype](std::span<const TensorIr>, ir::TensorId out) -> Result<ir::Operation> {
    KILN_ASSIGN_OR_RETURN(ir::ScalarIr v, ir::ScalarIr::from_f64(value, dtype));
    const Family family = is_floatish(dtype) ? Family::NumericFloat : Family::NumericInt;
    return build::full(family, OpKind::Numeric_Full, shape, dtype, v, out);
  });
}

// ---- Random creation and arange

namespace {

std::string num(double v) { return fmt::format("{}", v); }

// The parameter ranges of session.h's random() (the reference executor's, with Burn's lo < hi).
Status check_distribution(const char* op, const build::DistributionIr& d, bool integral) {
  const double a = d.param0, b = d.param1;
  const std::string name = std::string(op) + ": ";
  switch (d.kind) {
    case ir::Distribution::Default: return Status::Ok();
    case ir::Distribution::Bernoulli:
      if (a >= 0 && a <= 1) return Status::Ok();  // NaN fails both
      return make_error(ErrorCode::Invalid, name + "Bernoulli probability " + num(a) + " is not in [0, 1]");
    case ir::Distribution::Uniform:
      if (!std::isfinite(a) || !std::isfinite(b) || !(a < b))
        return make_error(ErrorCode::Invalid,
                          name + "Uniform(" + num(a) + ", " + num(b) + ") needs finite bounds with low < high");
      if (integral && !(std::trunc(a) < std::trunc(b)))
        return make_error(ErrorCode::Invalid, name + "Uniform(" + num(a) + ", " + num(b) + "): the integer range [" +
                                                  num(std::trunc(a)) + ", " + num(std::trunc(b)) + ") is empty");
      return Status::Ok();
    case ir::Distribution::Normal:
      if (std::isfinite(a) && std::isfinite(b) && b >= 0) return Status::Ok();
      return make_error(ErrorCode::Invalid,
                        name + "Normal(" + num(a) + ", " + num(b) + ") needs a finite mean and a finite std >= 0");
  }
  return make_error(ErrorCode::Invalid,
                    name + "unknown distribution " + std::to_string(static_cast<std::int64_t>(d.kind)));
}

// start + i·step in two's complement: exact whenever the true value is an int64, as every element
// of an arange is (it lies between start and end).
std::int64_t arange_at(std::int64_t start, std::int64_t step, std::uint64_t i) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(start) + i * static_cast<std::uint64_t>(step));
}

// The element count of [start, end) by step, PyTorch's ceil((end − start) / step), or its errors.
Result<std::uint64_t> arange_count(std::int64_t start, std::int64_t end, std::int64_t step) {
  const std::string call =
      "arange(" + std::to_string(start) + ", " + std::to_string(end) + ", " + std::to_string(step) + "): ";
  if (step == 0) return make_error(ErrorCode::Invalid, call + "step must be nonzero");
  if ((step > 0 && end < start) || (step < 0 && end > start))
    return make_error(ErrorCode::Invalid, call + "upper bound and lower bound inconsistent with step sign");
  if (start == end) return std::uint64_t{0};
  const auto s = static_cast<std::uint64_t>(start), e = static_cast<std::uint64_t>(end);
  const std::uint64_t span = step > 0 ? e - s : s - e;  // < 2^64: exact in unsigned arithmetic
  const std::uint64_t stride = step > 0 ? static_cast<std::uint64_t>(step) : 0 - static_cast<std::uint64_t>(step);
  return (span - 1) / stride + 1;
}

// The arange's count values as T's bytes. Integers: the first and last value (the extremes) must fit T.
template <class T>
Result<std::vector<std::byte>> arange_bytes(std::int64_t start, std::int64_t step, std::uint64_t count,
                                            ir::DType dtype) {
  if constexpr (std::is_integral_v<T>) {
    if (count > 0)
      for (std::int64_t v : {start, arange_at(start, step, count - 1)})
        if (!std::in_range<T>(v))
          return make_error(ErrorCode::Invalid, "arange: " + std::to_string(v) + " does not fit " + dtype.name());
  }
  std::vector<std::byte> bytes;
  if (count > bytes.max_size() / sizeof(T))
    return make_error(ErrorCode::ResourceExhausted, "arange: " + std::to_string(count) + " elements of " +
                                                        dtype.name() + " exceed the host's address space");
  try {
    bytes.resize(count * sizeof(T));
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::ResourceExhausted,
                      "arange: out of host memory for " + std::to_string(count) + " elements of " + dtype.name());
  }
  for (std::uint64_t i = 0; i < count; ++i) {
    const T v = static_cast<T>(arange_at(start, step, i));
    std::memcpy(bytes.data() + i * sizeof(T), &v, sizeof(T));
  }
  return bytes;
}

Result<std::vector<std::byte>> arange_host(std::int64_t start, std::int64_t step, std::uint64_t count,
                                           ir::DType dtype) {
  using K = ir::DTypeKind;
  switch (dtype.kind()) {
    case K::I64: return arange_bytes<std::int64_t>(start, step, count, dtype);
    case K::I32: return arange_bytes<std::int32_t>(start, step, count, dtype);
    case K::I16: return arange_bytes<std::int16_t>(start, step, count, dtype);
    case K::I8: return arange_bytes<std::int8_t>(start, step, count, dtype);
    case K::U64: return arange_bytes<std::uint64_t>(start, step, count, dtype);
    case K::U32: return arange_bytes<std::uint32_t>(start, step, count, dtype);
    case K::U16: return arange_bytes<std::uint16_t>(start, step, count, dtype);
    case K::U8: return arange_bytes<std::uint8_t>(start, step, count, dtype);
    case K::F64: return arange_bytes<double>(start, step, count, dtype);
    case K::F32: return arange_bytes<float>(start, step, count, dtype);
    case K::Bool: return make_error(ErrorCode::DTypeMismatch, "arange: " + dtype.name() + " is not a numeric dtype");
    default:
      return make_error(ErrorCode::Unsupported,
                        "arange: " + dtype.name() + " is not supported (integer dtypes, f32 and f64 are)");
  }
}

}  // namespace

Result<Tensor> Session::random(ir::Shape shape, build::DistributionIr distribution, ir::DType dtype) {
  const bool integral = dtype.is_integral();
  if (!dtype.is_float() && !integral)
    return make_error(ErrorCode::DTypeMismatch,
                      "random: " + dtype.name() +
                          " has no random draw (float dtypes emit Float::Random, integer ones "
                          "NumericInt::IntRandom; for bool, compare a Bernoulli draw with ne(x, 0))");
  const Family family = integral ? Family::NumericInt : Family::Float;
  const OpKind kind = integral ? OpKind::Numeric_IntRandom : OpKind::Float_Random;
  KILN_RETURN_IF_ERROR(
      check_distribution(integral ? "NumericInt::IntRandom" : "Float::Random", distribution, integral));
  return run_op({}, [&](std::span<const TensorIr>, ir::TensorId out) {
    return build::random(family, kind, shape, dtype, distribution, out);
  });
}

Result<Tensor> Session::arange(std::int64_t start, std::int64_t end, std::int64_t step, ir::DType dtype) {
  KILN_ASSIGN_OR_RETURN(const std::uint64_t count, arange_count(start, end, step));
  KILN_ASSIGN_OR_RETURN(std::vector<std::byte> bytes, arange_host(start, step, count, dtype));
  return upload(dtype, bytes, static_cast<std::size_t>(count), ir::Shape{count});
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
                          // The output dtype by the kind's tag: index (ArgMax, ArgMin), bool (AnyDim,
                          // AllDim) or the operand's.
                          const Family family = family_for(kind, t[0]);
                          if (ir::op_info(kind).has(ir::kIndexOutput))
                            return build::reduce_dim_arg(family, kind, t[0], dim, 1, kIndexDType, out);
                          if (ir::op_info(kind).has(ir::kComparison))
                            return build::reduce_dim_bool(family, kind, t[0], dim, 1, kBoolDType, out);
                          return build::reduce_dim(family, kind, t[0], dim, 1, out);
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
                          if (ir::op_info(kind).has(ir::kComparison))  // Any, All
                            return build::reduce_bool(family_for(kind, t[0]), kind, t[0], kBoolDType, out);
                          return build::reduce(family_for(kind, t[0]), kind, t[0], out);
                        }));
  if (!keepdim || rank <= 1) return r;
  return reshape(std::move(r), std::vector<std::int64_t>(rank, 1));
}

Result<Tensor> Session::sum(Tensor a, bool keepdim) { return reduce_op(std::move(a), keepdim, OpKind::Numeric_Sum); }
Result<Tensor> Session::mean(Tensor a, bool keepdim) { return reduce_op(std::move(a), keepdim, OpKind::Numeric_Mean); }
Result<Tensor> Session::prod(Tensor a, bool keepdim) { return reduce_op(std::move(a), keepdim, OpKind::Numeric_Prod); }
Result<Tensor> Session::max(Tensor a, bool keepdim) { return reduce_op(std::move(a), keepdim, OpKind::Numeric_Max); }
Result<Tensor> Session::min(Tensor a, bool keepdim) { return reduce_op(std::move(a), keepdim, OpKind::Numeric_Min); }
Result<Tensor> Session::max_abs(Tensor a, bool keepdim) {
  return reduce_op(std::move(a), keepdim, OpKind::Numeric_MaxAbs);
}
Result<Tensor> Session::any(Tensor a, bool keepdim) { return reduce_op(std::move(a), keepdim, OpKind::Base_Any); }
Result<Tensor> Session::all(Tensor a, bool keepdim) { return reduce_op(std::move(a), keepdim, OpKind::Base_All); }

Result<Tensor> Session::prod_dim(Tensor a, std::uint64_t dim, bool keepdim) {
  return reduce_dim_op(std::move(a), dim, keepdim, OpKind::Numeric_ProdDim);
}
Result<Tensor> Session::max_abs_dim(Tensor a, std::uint64_t dim, bool keepdim) {
  return reduce_dim_op(std::move(a), dim, keepdim, OpKind::Numeric_MaxAbsDim);
}
Result<Tensor> Session::argmin(Tensor a, std::uint64_t dim, bool keepdim) {
  return reduce_dim_op(std::move(a), dim, keepdim, OpKind::Numeric_ArgMin);
}
Result<Tensor> Session::any_dim(Tensor a, std::uint64_t dim, bool keepdim) {
  return reduce_dim_op(std::move(a), dim, keepdim, OpKind::Base_AnyDim);
}
Result<Tensor> Session::all_dim(Tensor a, std::uint64_t dim, bool keepdim) {
  return reduce_dim_op(std::move(a), dim, keepdim, OpKind::Base_AllDim);
}

// (K) docs/spec/ir.md §5.11: flatten, then the arg reduction along axis 0 (the Reshape is emitted
// even for a rank-1 input).
Result<Tensor> Session::arg_all_op(Tensor a, OpKind kind) {
  if (!a.valid()) return moved_from(kind == OpKind::Numeric_ArgMax ? "argmax" : "argmin");
  const auto numel = static_cast<std::int64_t>(ir::num_elements(a.shape()));
  KILN_ASSIGN_OR_RETURN(Tensor flat, reshape(std::move(a), {numel}));
  return reduce_dim_op(std::move(flat), 0, true, kind);
}
Result<Tensor> Session::argmax(Tensor a) { return arg_all_op(std::move(a), OpKind::Numeric_ArgMax); }
Result<Tensor> Session::argmin(Tensor a) { return arg_all_op(std::move(a), OpKind::Numeric_ArgMin); }

Result<std::pair<Tensor, Tensor>> Session::with_indices_op(Tensor a, std::uint64_t dim, bool keepdim, OpKind kind) {
  if (!keepdim && a.valid() && a.shape().size() <= 1)
    return make_error(ErrorCode::Invalid, std::string(ir::op_info(kind).variant) + ": keepdim = false on " +
                                              a.use().to_string() + " would give a rank-0 tensor");
  Tensor in[] = {std::move(a)};
  std::optional<Tensor> out[2];
  KILN_RETURN_IF_ERROR(
      run_op_outputs(in, out, [kind, dim](std::span<const TensorIr> t, std::span<const ir::TensorId> ids) {
        return build::reduce_dim_with_indices(numeric_family(t[0]), kind, t[0], dim, kIndexDType, ids[0], ids[1]);
      }));
  Tensor values = std::move(*out[0]), indices = std::move(*out[1]);
  if (!keepdim) {
    KILN_ASSIGN_OR_RETURN(values, squeeze(std::move(values), dim));
    KILN_ASSIGN_OR_RETURN(indices, squeeze(std::move(indices), dim));
  }
  return std::make_pair(std::move(values), std::move(indices));
}
Result<std::pair<Tensor, Tensor>> Session::max_dim_with_indices(Tensor a, std::uint64_t dim, bool keepdim) {
  return with_indices_op(std::move(a), dim, keepdim, OpKind::Numeric_MaxDimWithIndices);
}
Result<std::pair<Tensor, Tensor>> Session::min_dim_with_indices(Tensor a, std::uint64_t dim, bool keepdim) {
  return with_indices_op(std::move(a), dim, keepdim, OpKind::Numeric_MinDimWithIndices);
}

Result<Tensor> Session::dim_op(Tensor a, std::uint64_t dim, OpKind kind) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [kind, dim](std::span<const TensorIr> t, ir::TensorId out) {
    return build::dim(numeric_family(t[0]), kind, t[0], dim, out);
  });
}
Result<Tensor> Session::cumsum(Tensor a, std::uint64_t dim) {
  return dim_op(std::move(a), dim, OpKind::Numeric_CumSum);
}
Result<Tensor> Session::cumprod(Tensor a, std::uint64_t dim) {
  return dim_op(std::move(a), dim, OpKind::Numeric_CumProd);
}
Result<Tensor> Session::cummin(Tensor a, std::uint64_t dim) {
  return dim_op(std::move(a), dim, OpKind::Numeric_CumMin);
}
Result<Tensor> Session::cummax(Tensor a, std::uint64_t dim) {
  return dim_op(std::move(a), dim, OpKind::Numeric_CumMax);
}

// ---- Sorting and top-k (docs/spec/ir.md §5.5)

Result<Tensor> Session::sort(Tensor a, std::uint64_t dim, bool descending) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [dim, descending](std::span<const TensorIr> t, ir::TensorId out) {
    return build::sort(numeric_family(t[0]), OpKind::Numeric_Sort, t[0], dim, descending, out);
  });
}

Result<Tensor> Session::argsort(Tensor a, std::uint64_t dim, bool descending) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [dim, descending](std::span<const TensorIr> t, ir::TensorId out) {
    return build::sort_arg(numeric_family(t[0]), OpKind::Numeric_ArgSort, t[0], dim, descending, kIndexDType, out);
  });
}

Result<std::pair<Tensor, Tensor>> Session::sort_with_indices(Tensor a, std::uint64_t dim, bool descending) {
  Tensor in[] = {std::move(a)};
  std::optional<Tensor> out[2];
  KILN_RETURN_IF_ERROR(
      run_op_outputs(in, out, [dim, descending](std::span<const TensorIr> t, std::span<const ir::TensorId> ids) {
        return build::sort_with_indices(numeric_family(t[0]), OpKind::Numeric_SortWithIndices, t[0], dim, descending,
                                        kIndexDType, ids[0], ids[1]);
      }));
  return std::make_pair(std::move(*out[0]), std::move(*out[1]));
}

Result<Tensor> Session::topk(Tensor a, std::uint64_t k, std::uint64_t dim) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [k, dim](std::span<const TensorIr> t, ir::TensorId out) {
    return build::reduce_dim(numeric_family(t[0]), OpKind::Numeric_TopK, t[0], dim, k, out);
  });
}

Result<std::pair<Tensor, Tensor>> Session::topk_with_indices(Tensor a, std::uint64_t k, std::uint64_t dim) {
  Tensor in[] = {std::move(a)};
  std::optional<Tensor> out[2];
  KILN_RETURN_IF_ERROR(
      run_op_outputs(in, out, [k, dim](std::span<const TensorIr> t, std::span<const ir::TensorId> ids) {
        return build::topk_with_indices(numeric_family(t[0]), OpKind::Numeric_TopKWithIndices, t[0], dim, k,
                                        kIndexDType, ids[0], ids[1]);
      }));
  return std::make_pair(std::move(*out[0]), std::move(*out[1]));
}

Result<Tensor> Session::argtopk(Tensor a, std::uint64_t k, std::uint64_t dim) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [k, dim](std::span<const TensorIr> t, ir::TensorId out) {
    return build::reduce_dim_arg(numeric_family(t[0]), OpKind::Numeric_ArgTopK, t[0], dim, k, kIndexDType, out);
  });
}

// ---- Compute and layout

Result<Tensor> Session::matmul(Tensor a, Tensor b) {
  Tensor in[] = {std::move(a), std::move(b)};
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    if (is_floatish(t[0].dtype)) return build::matmul(Family::Float, OpKind::Float_Matmul, t[0], t[1], out);
    return build::matmul(Family::Int, OpKind::Int_Matmul, t[0], t[1], out);
  });
}

Result<Tensor> Session::cross(Tensor a, Tensor b, std::uint64_t dim) {
  Tensor in[] = {std::move(a), std::move(b)};
  return run_op(in, [dim](std::span<const TensorIr> t, ir::TensorId out) {
    return build::cross(Family::Float, OpKind::Float_Cross, t[0], t[1], dim, out);
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

Result<Tensor> Session::flip(Tensor a, std::vector<std::uint64_t> axes) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [&axes](std::span<const TensorIr> t, ir::TensorId out) {
    return build::flip(base_family(t[0]), OpKind::Base_Flip, t[0], axes, out);
  });
}

Result<Tensor> Session::repeat_dim(Tensor a, std::uint64_t dim, std::uint64_t times) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [dim, times](std::span<const TensorIr> t, ir::TensorId out) {
    return build::repeat_dim(base_family(t[0]), OpKind::Base_RepeatDim, t[0], dim, times, out);
  });
}

Result<Tensor> Session::select(Tensor a, std::uint64_t dim, Tensor indices) {
  Tensor in[] = {std::move(a), std::move(indices)};
  return run_op(in, [dim](std::span<const TensorIr> t, ir::TensorId out) {
    return build::select(base_family(t[0]), OpKind::Base_Select, t[0], dim, t[1], out);
  });
}

Result<Tensor> Session::select_assign(Tensor a, std::uint64_t dim, Tensor indices, Tensor value,
                                      ir::IndexingUpdate update) {
  // The builder checks dim, ranks and dtypes; the value's shape only the kernel would.
  if (a.valid() && indices.valid() && value.valid() && dim < a.shape().size() && indices.shape().size() == 1) {
    ir::Shape want = a.shape();
    want[dim] = indices.shape()[0];
    if (value.shape() != want)
      return make_error(ErrorCode::IncompatibleShapes, "select_assign: value " + value.use().to_string() +
                                                           " must have shape " + ir::shape_to_string(want) + " (" +
                                                           a.use().to_string() + ", dim " + std::to_string(dim) +
                                                           ", indices " + indices.use().to_string() + ")");
  }
  Tensor in[] = {std::move(a), std::move(indices), std::move(value)};
  return run_op(in, [dim, update](std::span<const TensorIr> t, ir::TensorId out) {
    return build::select_assign(base_family(t[0]), OpKind::Base_SelectAssign, t[0], dim, t[1], t[2], update, out);
  });
}

Result<Tensor> Session::slice_assign(Tensor a, std::vector<ir::Slice> ranges, Tensor value) {
  // The builder checks the ranges and dtypes; the value's shape only the kernel would.
  if (a.valid() && value.valid()) {
    Result<ir::Shape> region = ir::shape::slice(a.shape(), ranges);
    if (region.ok() && *region != value.shape())
      return make_error(ErrorCode::IncompatibleShapes, "slice_assign: value " + value.use().to_string() +
                                                           " does not fit the slice " + ir::shape_to_string(*region) +
                                                           " of " + a.use().to_string());
  }
  Tensor in[] = {std::move(a), std::move(value)};
  return run_op(in, [&ranges](std::span<const TensorIr> t, ir::TensorId out) {
    return build::slice_assign(base_family(t[0]), OpKind::Base_SliceAssign, t[0], ranges, t[1], out);
  });
}

namespace {
// Scatter's shape rule (the kernel's, PyTorch's): indices and value of the tensor's rank, indices
// no larger than value in any dim nor than the tensor outside `dim`.
Status check_scatter_shapes(const Tensor& a, std::uint64_t dim, const Tensor& indices, const Tensor& value) {
  const std::size_t rank = a.shape().size();
  bool fits = indices.shape().size() == rank && value.shape().size() == rank;
  for (std::size_t d = 0; fits && d < rank; ++d)
    fits = indices.shape()[d] <= value.shape()[d] && (d == dim || indices.shape()[d] <= a.shape()[d]);
  if (fits) return Status::Ok();
  return make_error(ErrorCode::IncompatibleShapes,
                    "scatter: indices " + ir::shape_to_string(indices.shape()) + " and value " +
                        ir::shape_to_string(value.shape()) + " must have the rank of the tensor " +
                        ir::shape_to_string(a.shape()) + ", indices no larger than value, nor than the tensor " +
                        "outside dim " + std::to_string(dim));
}
}  // namespace

Result<Tensor> Session::scatter(Tensor a, std::uint64_t dim, Tensor indices, Tensor value, ir::IndexingUpdate update) {
  if (a.valid() && indices.valid() && value.valid()) KILN_RETURN_IF_ERROR(check_scatter_shapes(a, dim, indices, value));
  Tensor in[] = {std::move(a), std::move(indices), std::move(value)};
  return run_op(in, [dim, update](std::span<const TensorIr> t, ir::TensorId out) {
    return build::scatter(base_family(t[0]), OpKind::Base_Scatter, t[0], dim, t[1], t[2], update, out);
  });
}

Result<Tensor> Session::gather_nd(Tensor data, Tensor indices) {
  Tensor in[] = {std::move(data), std::move(indices)};
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    return build::gather_nd(base_family(t[0]), OpKind::Base_GatherNd, t[0], t[1], out);
  });
}

namespace {
// ScatterNd's values shape (the kernel's rule, ONNX's): indices[..-1] ++ data[k..], k = indices[-1];
// a rank or k the builder refuses is left to its error.
Status check_scatter_nd_shapes(const Tensor& data, const Tensor& indices, const Tensor& values) {
  const ir::Shape& is = indices.shape();
  if (is.empty() || is.back() > data.shape().size()) return Status::Ok();
  ir::Shape want(is.begin(), is.end() - 1);
  want.insert(want.end(), data.shape().begin() + static_cast<std::ptrdiff_t>(is.back()), data.shape().end());
  if (values.shape() == want) return Status::Ok();
  return make_error(ErrorCode::IncompatibleShapes, "scatter_nd: values " + ir::shape_to_string(values.shape()) +
                                                       " must have shape " + ir::shape_to_string(want) + " (indices " +
                                                       ir::shape_to_string(is) + ", data " +
                                                       ir::shape_to_string(data.shape()) + ")");
}
}  // namespace

Result<Tensor> Session::scatter_nd(Tensor data, Tensor indices, Tensor values, ir::IndexingUpdate reduction) {
  if (data.valid() && indices.valid() && values.valid())
    KILN_RETURN_IF_ERROR(check_scatter_nd_shapes(data, indices, values));
  Tensor in[] = {std::move(data), std::move(indices), std::move(values)};
  return run_op(in, [reduction](std::span<const TensorIr> t, ir::TensorId out) {
    return build::scatter_nd(base_family(t[0]), OpKind::Base_ScatterNd, t[0], t[1], t[2], reduction, out);
  });
}

Result<Tensor> Session::unfold(Tensor a, std::uint64_t dim, std::uint64_t size, std::uint64_t step) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [dim, size, step](std::span<const TensorIr> t, ir::TensorId out) {
    return build::unfold(base_family(t[0]), OpKind::Base_Unfold, t[0], dim, size, step, out);
  });
}

Result<Tensor> Session::pad(Tensor a, std::vector<ir::build::PadPair> padding, ir::PadMode mode, double value) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [&padding, mode, value](std::span<const TensorIr> t, ir::TensorId out) -> Result<ir::Operation> {
    std::optional<ir::ScalarIr> constant;
    if (mode == ir::PadMode::Constant) {
      KILN_ASSIGN_OR_RETURN(constant, ir::ScalarIr::from_f64(value, t[0].dtype));
    }
    return build::pad(numeric_family(t[0]), OpKind::Numeric_Pad, t[0], padding, mode, constant, out);
  });
}

// ---- Module ops

Result<Tensor> Session::conv2d(Tensor x, Tensor weight, std::optional<Tensor> bias,
                               const ir::build::Conv2dOptions& options) {
  std::vector<Tensor> in;
  in.push_back(std::move(x));
  in.push_back(std::move(weight));
  if (bias) in.push_back(std::move(*bias));
  return run_op(in, [&options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::conv2d(t[0], t[1], optional_input(t, 2), options, out);
  });
}

Result<Tensor> Session::conv_transpose1d(Tensor x, Tensor weight, std::optional<Tensor> bias,
                                         const ir::build::ConvTranspose1dOptions& options) {
  std::vector<Tensor> in;
  in.push_back(std::move(x));
  in.push_back(std::move(weight));
  if (bias) in.push_back(std::move(*bias));
  return run_op(in, [&options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::conv_transpose1d(t[0], t[1], optional_input(t, 2), options, out);
  });
}

Result<Tensor> Session::max_pool2d(Tensor x, const ir::build::MaxPool2dOptions& options) {
  Tensor in[] = {std::move(x)};
  return run_op(
      in, [&options](std::span<const TensorIr> t, ir::TensorId out) { return build::max_pool2d(t[0], options, out); });
}

Result<Tensor> Session::avg_pool2d(Tensor x, const ir::build::AvgPool2dOptions& options) {
  Tensor in[] = {std::move(x)};
  return run_op(
      in, [&options](std::span<const TensorIr> t, ir::TensorId out) { return build::avg_pool2d(t[0], options, out); });
}

// docs/spec/ir.md §5.11: Reshape + Select + Reshape (Module Embedding comes from router clients only).
Result<Tensor> Session::embedding(Tensor weights, Tensor indices) {
  if (!weights.valid() || !indices.valid()) return moved_from("embedding");
  const bool weights_ok = weights.shape().size() == 2 && is_floatish(weights.dtype());
  if (!weights_ok || indices.shape().size() != 2 || !indices.dtype().is_integral())
    return make_error(
        weights.shape().size() != 2 || indices.shape().size() != 2 ? ErrorCode::RankMismatch : ErrorCode::DTypeMismatch,
        "embedding: weights " + weights.use().to_string() + " must be a float [V, E] tensor and indices " +
            indices.use().to_string() + " an integer [B, S] one");
  if (router()) {
    Tensor in[] = {std::move(weights), std::move(indices)};
    return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) { return build::embedding(t[0], t[1], out); });
  }
  const auto b = static_cast<std::int64_t>(indices.shape()[0]);
  const auto seq = static_cast<std::int64_t>(indices.shape()[1]);
  const auto e = static_cast<std::int64_t>(weights.shape()[1]);
  KILN_ASSIGN_OR_RETURN(Tensor flat, reshape(std::move(indices), {b * seq}));
  KILN_ASSIGN_OR_RETURN(Tensor rows, select(std::move(weights), 0, std::move(flat)));
  return reshape(std::move(rows), {b, seq, e});
}

// ---- Dense layers, norms, the embedding's gradient (docs/spec/ir.md §5.8; no §5.11 row: the
// Module kind of the call's name)

Result<Tensor> Session::linear(Tensor x, Tensor weight, std::optional<Tensor> bias) {
  std::vector<Tensor> in;
  in.push_back(std::move(x));
  in.push_back(std::move(weight));
  if (bias) in.push_back(std::move(*bias));
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    return build::linear(t[0], t[1], optional_input(t, 2), out);
  });
}

Result<Tensor> Session::linear_x_backward(Tensor weight, Tensor output_grad) {
  Tensor in[] = {std::move(weight), std::move(output_grad)};
  return run_op(
      in, [](std::span<const TensorIr> t, ir::TensorId out) { return build::linear_x_backward(t[0], t[1], out); });
}

Result<Tensor> Session::linear_weight_backward(Tensor x, Tensor output_grad) {
  Tensor in[] = {std::move(x), std::move(output_grad)};
  return run_op(
      in, [](std::span<const TensorIr> t, ir::TensorId out) { return build::linear_weight_backward(t[0], t[1], out); });
}

Result<Tensor> Session::linear_bias_backward(Tensor output_grad) {
  Tensor in[] = {std::move(output_grad)};
  return run_op(in,
                [](std::span<const TensorIr> t, ir::TensorId out) { return build::linear_bias_backward(t[0], out); });
}

Result<Tensor> Session::layer_norm(Tensor input, Tensor gamma, std::optional<Tensor> beta, double epsilon) {
  std::vector<Tensor> in;
  in.push_back(std::move(input));
  in.push_back(std::move(gamma));
  if (beta) in.push_back(std::move(*beta));
  return run_op(in, [epsilon](std::span<const TensorIr> t, ir::TensorId out) {
    return build::layer_norm(t[0], t[1], optional_input(t, 2), epsilon, out);
  });
}

Result<LayerNormWithStats> Session::layer_norm_with_stats(Tensor input, Tensor gamma, std::optional<Tensor> beta,
                                                          double epsilon) {
  std::vector<Tensor> in;
  in.push_back(std::move(input));
  in.push_back(std::move(gamma));
  if (beta) in.push_back(std::move(*beta));
  std::optional<Tensor> out[3];
  KILN_RETURN_IF_ERROR(
      run_op_outputs(in, out, [epsilon](std::span<const TensorIr> t, std::span<const ir::TensorId> ids) {
        return build::layer_norm_with_stats(t[0], t[1], optional_input(t, 2), epsilon, ids[0], ids[1], ids[2]);
      }));
  return LayerNormWithStats{std::move(*out[0]), std::move(*out[1]), std::move(*out[2])};
}

Result<Tensor> Session::batch_norm(Tensor x, Tensor gamma, Tensor beta, Tensor mean, Tensor variance, double epsilon) {
  Tensor in[] = {std::move(x), std::move(gamma), std::move(beta), std::move(mean), std::move(variance)};
  return run_op(in, [epsilon](std::span<const TensorIr> t, ir::TensorId out) {
    return build::batch_norm(t[0], t[1], t[2], t[3], t[4], epsilon, out);
  });
}

Result<Tensor> Session::embedding_backward(Tensor weights, Tensor output_grad, Tensor indices) {
  Tensor in[] = {std::move(weights), std::move(output_grad), std::move(indices)};
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    return build::embedding_backward(t[0], t[1], t[2], out);
  });
}

// ---- Convolutions of 1..3 spatial dims and their gradients (docs/spec/ir.md §5.8; no §5.11 row
// but conv2d's: the Module kind of the call's name)

Result<Tensor> Session::conv_op(OpKind kind, Tensor x, Tensor weight, std::optional<Tensor> bias,
                                const build::ConvOptions& options) {
  std::vector<Tensor> in;
  in.push_back(std::move(x));
  in.push_back(std::move(weight));
  if (bias) in.push_back(std::move(*bias));
  const bool transposed = ir::op_info(kind).signature == ir::Signature::ConvTranspose;
  return run_op(in, [kind, transposed, &options](std::span<const TensorIr> t, ir::TensorId out) {
    return transposed ? build::conv_transpose(kind, t[0], t[1], optional_input(t, 2), options, out)
                      : build::conv(kind, t[0], t[1], optional_input(t, 2), options, out);
  });
}

Result<Tensor> Session::conv_grad_op(OpKind kind, Tensor x, Tensor second, Tensor output_grad,
                                     const build::ConvOptions& options) {
  Tensor in[] = {std::move(x), std::move(second), std::move(output_grad)};
  return run_op(in, [kind, &options](std::span<const TensorIr> t, ir::TensorId out) {
    switch (ir::op_info(kind).signature) {
      case ir::Signature::ConvBackward: return build::conv_backward(kind, t[0], t[1], t[2], options, out);
      case ir::Signature::ConvTransposeBackward:
        return build::conv_transpose_backward(kind, t[0], t[1], t[2], options, out);
      default: return build::conv_bias_backward(kind, t[0], t[1], t[2], out);
    }
  });
}

Result<Tensor> Session::conv1d(Tensor x, Tensor weight, std::optional<Tensor> bias,
                               const ir::build::Conv1dOptions& options) {
  return conv_op(OpKind::Module_Conv1d, std::move(x), std::move(weight), std::move(bias), build::conv_options(options));
}

Result<Tensor> Session::conv3d(Tensor x, Tensor weight, std::optional<Tensor> bias,
                               const ir::build::Conv3dOptions& options) {
  return conv_op(OpKind::Module_Conv3d, std::move(x), std::move(weight), std::move(bias), build::conv_options(options));
}

Result<Tensor> Session::conv_transpose2d(Tensor x, Tensor weight, std::optional<Tensor> bias,
                                         const ir::build::ConvTranspose2dOptions& options) {
  return conv_op(OpKind::Module_ConvTranspose2d, std::move(x), std::move(weight), std::move(bias),
                 build::conv_options(options));
}

Result<Tensor> Session::conv_transpose3d(Tensor x, Tensor weight, std::optional<Tensor> bias,
                                         const ir::build::ConvTranspose3dOptions& options) {
  return conv_op(OpKind::Module_ConvTranspose3d, std::move(x), std::move(weight), std::move(bias),
                 build::conv_options(options));
}

Result<Tensor> Session::conv1d_x_backward(Tensor x, Tensor weight, Tensor output_grad,
                                          const ir::build::Conv1dOptions& options) {
  return conv_grad_op(OpKind::Module_Conv1dXBackward, std::move(x), std::move(weight), std::move(output_grad),
                      build::conv_options(options));
}

Result<Tensor> Session::conv2d_x_backward(Tensor x, Tensor weight, Tensor output_grad,
                                          const ir::build::Conv2dOptions& options) {
  return conv_grad_op(OpKind::Module_Conv2dXBackward, std::move(x), std::move(weight), std::move(output_grad),
                      build::conv_options(options));
}

Result<Tensor> Session::conv3d_x_backward(Tensor x, Tensor weight, Tensor output_grad,
                                          const ir::build::Conv3dOptions& options) {
  return conv_grad_op(OpKind::Module_Conv3dXBackward, std::move(x), std::move(weight), std::move(output_grad),
                      build::conv_options(options));
}

Result<Tensor> Session::conv1d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                               const ir::build::Conv1dOptions& options) {
  return conv_grad_op(OpKind::Module_Conv1dWeightBackward, std::move(x), std::move(weight), std::move(output_grad),
                      build::conv_options(options));
}

Result<Tensor> Session::conv2d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                               const ir::build::Conv2dOptions& options) {
  return conv_grad_op(OpKind::Module_Conv2dWeightBackward, std::move(x), std::move(weight), std::move(output_grad),
                      build::conv_options(options));
}

Result<Tensor> Session::conv3d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                               const ir::build::Conv3dOptions& options) {
  return conv_grad_op(OpKind::Module_Conv3dWeightBackward, std::move(x), std::move(weight), std::move(output_grad),
                      build::conv_options(options));
}

Result<Tensor> Session::conv1d_bias_backward(Tensor x, Tensor bias, Tensor output_grad) {
  return conv_grad_op(OpKind::Module_Conv1dBiasBackward, std::move(x), std::move(bias), std::move(output_grad), {});
}

Result<Tensor> Session::conv2d_bias_backward(Tensor x, Tensor bias, Tensor output_grad) {
  return conv_grad_op(OpKind::Module_Conv2dBiasBackward, std::move(x), std::move(bias), std::move(output_grad), {});
}

Result<Tensor> Session::conv3d_bias_backward(Tensor x, Tensor bias, Tensor output_grad) {
  return conv_grad_op(OpKind::Module_Conv3dBiasBackward, std::move(x), std::move(bias), std::move(output_grad), {});
}

Result<Tensor> Session::conv_transpose1d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                                         const ir::build::ConvTranspose1dOptions& options) {
  return conv_grad_op(OpKind::Module_ConvTranspose1dWeightBackward, std::move(x), std::move(weight),
                      std::move(output_grad), build::conv_options(options));
}

Result<Tensor> Session::conv_transpose2d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                                         const ir::build::ConvTranspose2dOptions& options) {
  return conv_grad_op(OpKind::Module_ConvTranspose2dWeightBackward, std::move(x), std::move(weight),
                      std::move(output_grad), build::conv_options(options));
}

Result<Tensor> Session::conv_transpose3d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                                         const ir::build::ConvTranspose3dOptions& options) {
  return conv_grad_op(OpKind::Module_ConvTranspose3dWeightBackward, std::move(x), std::move(weight),
                      std::move(output_grad), build::conv_options(options));
}

Result<Tensor> Session::conv_transpose1d_bias_backward(Tensor x, Tensor bias, Tensor output_grad) {
  return conv_grad_op(OpKind::Module_ConvTranspose1dBiasBackward, std::move(x), std::move(bias), std::move(output_grad),
                      {});
}

Result<Tensor> Session::conv_transpose2d_bias_backward(Tensor x, Tensor bias, Tensor output_grad) {
  return conv_grad_op(OpKind::Module_ConvTranspose2dBiasBackward, std::move(x), std::move(bias), std::move(output_grad),
                      {});
}

Result<Tensor> Session::conv_transpose3d_bias_backward(Tensor x, Tensor bias, Tensor output_grad) {
  return conv_grad_op(OpKind::Module_ConvTranspose3dBiasBackward, std::move(x), std::move(bias), std::move(output_grad),
                      {});
}

// ---- The deformable convolution (docs/spec/ir.md §5.8; no §5.11 row: the Module kind of the
// call's name)

namespace {
// x, offset, weight, then the optional mask and bias as given (the presence bits say which).
std::vector<Tensor> deformable_inputs(Tensor x, Tensor offset, Tensor weight, std::optional<Tensor> mask,
                                      std::optional<Tensor> bias) {
  std::vector<Tensor> in;
  in.push_back(std::move(x));
  in.push_back(std::move(offset));
  in.push_back(std::move(weight));
  if (mask) in.push_back(std::move(*mask));
  if (bias) in.push_back(std::move(*bias));
  return in;
}

std::optional<TensorIr> input_if(bool present, std::span<const TensorIr> t, std::size_t i) {
  return present ? std::optional<TensorIr>(t[i]) : std::nullopt;
}
}  // namespace

Result<Tensor> Session::deformable_conv2d(Tensor x, Tensor offset, Tensor weight, std::optional<Tensor> mask,
                                          std::optional<Tensor> bias, const build::DeformableConv2dOptions& options) {
  const bool has_mask = mask.has_value(), has_bias = bias.has_value();
  std::vector<Tensor> in =
      deformable_inputs(std::move(x), std::move(offset), std::move(weight), std::move(mask), std::move(bias));
  return run_op(in, [has_mask, has_bias, &options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::deformable_conv2d(t[0], t[1], t[2], input_if(has_mask, t, 3), input_if(has_bias, t, has_mask ? 4 : 3),
                                    options, out);
  });
}

Result<DeformableConv2dGrads> Session::deformable_conv2d_backward(Tensor x, Tensor offset, Tensor weight,
                                                                  std::optional<Tensor> mask,
                                                                  std::optional<Tensor> bias, Tensor out_grad,
                                                                  const build::DeformableConv2dOptions& options) {
  const bool has_mask = mask.has_value(), has_bias = bias.has_value();
  std::vector<Tensor> in =
      deformable_inputs(std::move(x), std::move(offset), std::move(weight), std::move(mask), std::move(bias));
  in.push_back(std::move(out_grad));
  std::vector<std::optional<Tensor>> out(3 + (has_mask ? 1 : 0) + (has_bias ? 1 : 0));
  KILN_RETURN_IF_ERROR(run_op_outputs(
      in, out, [has_mask, has_bias, &options](std::span<const TensorIr> t, std::span<const ir::TensorId> ids) {
        build::DeformableConv2dGradIds grads{ids[0], ids[1], ids[2], std::nullopt, std::nullopt};
        if (has_mask) grads.mask_grad = ids[3];
        if (has_bias) grads.bias_grad = ids[has_mask ? 4 : 3];
        return build::deformable_conv2d_backward(t[0], t[1], t[2], input_if(has_mask, t, 3),
                                                 input_if(has_bias, t, has_mask ? 4 : 3), t.back(), options, grads);
      }));
  DeformableConv2dGrads g{std::move(*out[0]), std::move(*out[1]), std::move(*out[2]), std::nullopt, std::nullopt};
  if (has_mask) g.mask_grad = std::move(out[3]);
  if (has_bias) g.bias_grad = std::move(out[has_mask ? 4 : 3]);
  return g;
}

// ---- Pools beyond max_pool2d / avg_pool2d, and their gradients (docs/spec/ir.md §5.8; no §5.11
// row: the Module kind of the call's name)

Result<Tensor> Session::max_pool1d(Tensor x, const ir::build::MaxPool1dOptions& options) {
  Tensor in[] = {std::move(x)};
  return run_op(
      in, [&options](std::span<const TensorIr> t, ir::TensorId out) { return build::max_pool1d(t[0], options, out); });
}

Result<std::pair<Tensor, Tensor>> Session::max_pool1d_with_indices(Tensor x,
                                                                   const ir::build::MaxPool1dOptions& options) {
  Tensor in[] = {std::move(x)};
  std::optional<Tensor> out[2];
  KILN_RETURN_IF_ERROR(
      run_op_outputs(in, out, [&options](std::span<const TensorIr> t, std::span<const ir::TensorId> ids) {
        return build::max_pool1d_with_indices(t[0], options, kIndexDType, ids[0], ids[1]);
      }));
  return std::make_pair(std::move(*out[0]), std::move(*out[1]));
}

Result<std::pair<Tensor, Tensor>> Session::max_pool2d_with_indices(Tensor x,
                                                                   const ir::build::MaxPool2dOptions& options) {
  Tensor in[] = {std::move(x)};
  std::optional<Tensor> out[2];
  KILN_RETURN_IF_ERROR(
      run_op_outputs(in, out, [&options](std::span<const TensorIr> t, std::span<const ir::TensorId> ids) {
        return build::max_pool2d_with_indices(t[0], options, kIndexDType, ids[0], ids[1]);
      }));
  return std::make_pair(std::move(*out[0]), std::move(*out[1]));
}

Result<Tensor> Session::max_pool1d_with_indices_backward(Tensor x, Tensor grad, Tensor indices,
                                                         const ir::build::MaxPool1dOptions& options) {
  Tensor in[] = {std::move(x), std::move(grad), std::move(indices)};
  return run_op(in, [&options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::max_pool1d_with_indices_backward(t[0], t[1], t[2], options, out);
  });
}

Result<Tensor> Session::max_pool2d_with_indices_backward(Tensor x, Tensor grad, Tensor indices,
                                                         const ir::build::MaxPool2dOptions& options) {
  Tensor in[] = {std::move(x), std::move(grad), std::move(indices)};
  return run_op(in, [&options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::max_pool2d_with_indices_backward(t[0], t[1], t[2], options, out);
  });
}

Result<Tensor> Session::avg_pool1d(Tensor x, const ir::build::AvgPool1dOptions& options) {
  Tensor in[] = {std::move(x)};
  return run_op(
      in, [&options](std::span<const TensorIr> t, ir::TensorId out) { return build::avg_pool1d(t[0], options, out); });
}

Result<Tensor> Session::avg_pool1d_backward(Tensor x, Tensor grad, const ir::build::AvgPool1dOptions& options) {
  Tensor in[] = {std::move(x), std::move(grad)};
  return run_op(in, [&options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::avg_pool1d_backward(t[0], t[1], options, out);
  });
}

Result<Tensor> Session::avg_pool2d_backward(Tensor x, Tensor grad, const ir::build::AvgPool2dOptions& options) {
  Tensor in[] = {std::move(x), std::move(grad)};
  return run_op(in, [&options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::avg_pool2d_backward(t[0], t[1], options, out);
  });
}

Result<Tensor> Session::adaptive_avg_pool1d(Tensor x, std::uint64_t output_size) {
  Tensor in[] = {std::move(x)};
  return run_op(in, [output_size](std::span<const TensorIr> t, ir::TensorId out) {
    return build::adaptive_avg_pool1d(t[0], output_size, out);
  });
}

Result<Tensor> Session::adaptive_avg_pool2d(Tensor x, std::array<std::uint64_t, 2> output_size) {
  Tensor in[] = {std::move(x)};
  return run_op(in, [output_size](std::span<const TensorIr> t, ir::TensorId out) {
    return build::adaptive_avg_pool2d(t[0], output_size, out);
  });
}

Result<Tensor> Session::adaptive_avg_pool3d(Tensor x, std::array<std::uint64_t, 3> output_size) {
  Tensor in[] = {std::move(x)};
  return run_op(in, [output_size](std::span<const TensorIr> t, ir::TensorId out) {
    return build::adaptive_avg_pool3d(t[0], output_size, out);
  });
}

Result<Tensor> Session::adaptive_avg_pool1d_backward(Tensor x, Tensor grad) {
  Tensor in[] = {std::move(x), std::move(grad)};
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    return build::adaptive_avg_pool1d_backward(t[0], t[1], out);
  });
}

Result<Tensor> Session::adaptive_avg_pool2d_backward(Tensor x, Tensor grad) {
  Tensor in[] = {std::move(x), std::move(grad)};
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    return build::adaptive_avg_pool2d_backward(t[0], t[1], out);
  });
}

Result<Tensor> Session::adaptive_avg_pool3d_backward(Tensor x, Tensor grad) {
  Tensor in[] = {std::move(x), std::move(grad)};
  return run_op(in, [](std::span<const TensorIr> t, ir::TensorId out) {
    return build::adaptive_avg_pool3d_backward(t[0], t[1], out);
  });
}

// ---- Resampling (docs/spec/ir.md §5.6, §5.8; no §5.11 row: the kind of the call's name)

Result<Tensor> Session::interpolate(Tensor x, std::array<std::uint64_t, 2> output_size,
                                    const ir::build::InterpolateOptions& options) {
  Tensor in[] = {std::move(x)};
  return run_op(in, [output_size, &options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::interpolate(t[0], output_size, options, out);
  });
}

Result<Tensor> Session::interpolate_backward(Tensor x, Tensor grad, std::array<std::uint64_t, 2> output_size,
                                             const ir::build::InterpolateOptions& options) {
  Tensor in[] = {std::move(x), std::move(grad)};
  return run_op(in, [output_size, &options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::interpolate_backward(t[0], t[1], output_size, options, out);
  });
}

Result<Tensor> Session::grid_sample_2d(Tensor tensor, Tensor grid, const ir::build::GridSampleOptions& options) {
  Tensor in[] = {std::move(tensor), std::move(grid)};
  return run_op(in, [&options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::grid_sample_2d(t[0], t[1], options, out);
  });
}

Result<Tensor> Session::unfold4d(Tensor x, std::array<std::uint64_t, 2> kernel_size,
                                 const ir::build::Unfold4dOptions& options) {
  Tensor in[] = {std::move(x)};
  return run_op(in, [kernel_size, &options](std::span<const TensorIr> t, ir::TensorId out) {
    return build::unfold4d(t[0], kernel_size, options, out);
  });
}

// ---- Signals (docs/spec/ir.md §5.8; no §5.11 row: the Module kind of the call's name)

Result<std::pair<Tensor, Tensor>> Session::rfft(Tensor signal, std::uint64_t dim, std::optional<std::uint64_t> n) {
  Tensor in[] = {std::move(signal)};
  std::optional<Tensor> out[2];
  KILN_RETURN_IF_ERROR(
      run_op_outputs(in, out, [dim, n](std::span<const TensorIr> t, std::span<const ir::TensorId> ids) {
        return build::rfft(t[0], dim, n, ids[0], ids[1]);
      }));
  return std::make_pair(std::move(*out[0]), std::move(*out[1]));
}

Result<Tensor> Session::irfft(Tensor input_re, Tensor input_im, std::uint64_t dim, std::optional<std::uint64_t> n) {
  Tensor in[] = {std::move(input_re), std::move(input_im)};
  return run_op(
      in, [dim, n](std::span<const TensorIr> t, ir::TensorId out) { return build::irfft(t[0], t[1], dim, n, out); });
}

// ---- Attention and the CTC loss (docs/spec/ir.md §5.8; no §5.11 row: the Module kind of the
// call's name)

Result<Tensor> Session::attention(Tensor query, Tensor key, Tensor value, std::optional<Tensor> mask,
                                  std::optional<Tensor> attn_bias, const ir::build::AttentionOptions& options) {
  const bool has_mask = mask.has_value(), has_bias = attn_bias.has_value();
  std::vector<Tensor> in;
  in.push_back(std::move(query));
  in.push_back(std::move(key));
  in.push_back(std::move(value));
  if (mask) in.push_back(std::move(*mask));
  if (attn_bias) in.push_back(std::move(*attn_bias));
  return run_op(in, [has_mask, has_bias, &options](std::span<const TensorIr> t, ir::TensorId out) {
    const std::optional<TensorIr> m = has_mask ? std::optional<TensorIr>(t[3]) : std::nullopt;
    const std::optional<TensorIr> b = has_bias ? std::optional<TensorIr>(t[has_mask ? 4 : 3]) : std::nullopt;
    return build::attention(t[0], t[1], t[2], m, b, options, out);
  });
}

Result<Tensor> Session::ctc_loss(Tensor log_probs, Tensor targets, Tensor input_lengths, Tensor target_lengths,
                                 std::uint64_t blank) {
  Tensor in[] = {std::move(log_probs), std::move(targets), std::move(input_lengths), std::move(target_lengths)};
  return run_op(in, [blank](std::span<const TensorIr> t, ir::TensorId out) {
    return build::ctc_loss(t[0], t[1], t[2], t[3], blank, out);
  });
}

Result<Tensor> Session::ctc_loss_backward(Tensor log_probs, Tensor targets, Tensor input_lengths, Tensor target_lengths,
                                          Tensor grad_loss, std::uint64_t blank) {
  Tensor in[] = {std::move(log_probs), std::move(targets), std::move(input_lengths), std::move(target_lengths),
                 std::move(grad_loss)};
  return run_op(in, [blank](std::span<const TensorIr> t, ir::TensorId out) {
    return build::ctc_loss_backward(t[0], t[1], t[2], t[3], t[4], blank, out);
  });
}

// ---- Quantization (docs/spec/ir.md §5.6; no §5.11 row: the Float kind of the call's name)

Result<Tensor> Session::quantize(Tensor tensor, Tensor scales, const ir::QuantScheme& scheme,
                                 std::optional<Tensor> global) {
  std::vector<Tensor> in;
  in.push_back(std::move(tensor));
  in.push_back(std::move(scales));
  if (global) in.push_back(std::move(*global));
  return run_op(in, [&scheme](std::span<const TensorIr> t, ir::TensorId out) {
    return build::quantize(t[0], t[1], optional_input(t, 2), scheme, out);
  });
}

Result<Tensor> Session::dequantize(Tensor tensor, ir::DType dtype) {
  Tensor in[] = {std::move(tensor)};
  return run_op(in,
                [dtype](std::span<const TensorIr> t, ir::TensorId out) { return build::dequantize(t[0], dtype, out); });
}

// ---- Collectives

Result<Tensor> Session::all_reduce(Tensor a, ir::ReduceOperation op, std::vector<ir::build::DeviceId> device_ids) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [op, &device_ids](std::span<const TensorIr> t, ir::TensorId out) {
    return build::all_reduce(t[0], op, device_ids, out);
  });
}

Result<Tensor> Session::broadcast(Tensor a, std::uint64_t root, std::vector<ir::build::DeviceId> device_ids) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [root, &device_ids](std::span<const TensorIr> t, ir::TensorId out) {
    return build::broadcast(t[0], root, device_ids, out);
  });
}

Result<Tensor> Session::all_gather(Tensor a, std::uint64_t dim, std::vector<ir::build::DeviceId> device_ids) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [dim, &device_ids](std::span<const TensorIr> t, ir::TensorId out) {
    return build::all_gather(t[0], dim, device_ids, out);
  });
}

Result<Tensor> Session::reduce_scatter(Tensor a, ir::ReduceOperation op, std::uint64_t dim,
                                       std::vector<ir::build::DeviceId> device_ids) {
  Tensor in[] = {std::move(a)};
  return run_op(in, [op, dim, &device_ids](std::span<const TensorIr> t, ir::TensorId out) {
    return build::reduce_scatter(t[0], op, dim, device_ids, out);
  });
}

Status Session::sync_collective() {
  if (router()) {
    std::span<Tensor> none;
    std::span<std::optional<Tensor>> no_outputs;
    KILN_RETURN_IF_ERROR(run_op_outputs(none, no_outputs, [](std::span<const TensorIr>, std::span<const ir::TensorId>) {
      return build::sync_collective();
    }));
  }
  return sync();
}

// ---- Composites

Result<Tensor> Session::softmax(Tensor x, std::uint64_t dim) {
  if (router()) return activation_dim_op(std::move(x), dim, OpKind::Activation_Softmax);
  Tensor x2 = x;
  KILN_ASSIGN_OR_RETURN(Tensor m, max_dim(std::move(x2), dim));
  KILN_ASSIGN_OR_RETURN(Tensor e, sub(std::move(x), std::move(m)));
  KILN_ASSIGN_OR_RETURN(e, exp(std::move(e)));
  Tensor e2 = e;
  KILN_ASSIGN_OR_RETURN(Tensor s, sum_dim(std::move(e2), dim));
  return div(std::move(e), std::move(s));
}

Result<Tensor> Session::log_softmax(Tensor x, std::uint64_t dim) {
  if (router()) return activation_dim_op(std::move(x), dim, OpKind::Activation_LogSoftmax);
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

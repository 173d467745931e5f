// Session: the client API (docs/spec/fusion.md §16.1, §16.7) over a Device in process, or over a daemon
// connection (ipc/remote_target.h): per-thread implicit streams and explicit streams, RAII
// tensors with shared-counter statuses, typed host transfers (f32, f64, i32, i64, bool) and the
// front-end ops, each lowered to exactly the IR of docs/spec/ir.md §5.11
// through the ir builders (a builder's error reaches the caller as the Result's error, message
// unchanged).
//
// Dtypes: the family of an op follows its operand (float → NumericFloat / BaseFloat, integer →
// NumericInt / BaseInt, bool → BaseBool). Comparisons produce the device bool dtype
// (kBoolDType, Bool(Native)), and so do any / all and is_nan / is_inf; argmax, argmin and the
// indices of max_dim_with_indices / min_dim_with_indices are kIndexDType (i64). Scalars are passed
// as double and converted to the operand's dtype (ScalarIr::from_f64): integers beyond 2^53 lose
// precision.
//
// Thread-safety: a Session may be used from any number of threads at once; each thread works on
// its current stream. A Tensor may be copied, moved and destroyed on any thread (its counter is
// atomic); a copy is a clone on the tensor's home stream, and a use on another stream creates a
// shared view. Tensors must die before their Session, and the Session before its Device.
//
// Usage:
//   Session s(device);
//   Tensor a = *s.from_host(std::vector<float>{1, 2}, {2});
//   Tensor b = *s.exp(*s.mul(a, 2.0));               // Lazy: queued on this thread's stream
//   std::vector<float> v = *s.to_host(std::move(b)); // drains this stream (b not produced yet)
//   Result<Tensor> bad = s.add(a, *s.from_host(std::vector<float>{1, 2, 3}, {3}));
//   // !bad.ok(): "NumericFloat::Add: broadcast: incompatible dims ..."
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/base/function_ref.h"
#include "kiln/ir/builders.h"
#include "kiln/runtime/session_target.h"

namespace kiln::runtime {

// Stream identities (docs/spec/fusion.md §16.1) without global state: each thread's current stream, assigned
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
  // A fresh id of `target`'s, from the calling thread's block of ir::kTensorIdBlock ids (taken
  // from `target` when spent), so that a thread's tensors share a shard of the producer table.
  // `target` must be the same on every call (the Session's own): the block is cached per thread
  // and allocator, not per target. A thread with no current stream yet gets a single id.
  ir::TensorId next_tensor_id(SessionTarget& target);

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
  // ReadWrite when this is the only handle (counter 1), else ReadOnly (docs/spec/fusion.md §16.7).
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

// Session::layer_norm_with_stats's outputs, in the op's output order.
struct LayerNormWithStats {
  Tensor out, mean, rstd;
};

// The gradients Session::deformable_conv2d_backward returns, in the op's output order: mask_grad
// and bias_grad are there iff the mask and bias inputs were.
struct DeformableConv2dGrads {
  Tensor input_grad, offset_grad, weight_grad;
  std::optional<Tensor> mask_grad, bias_grad;
};

// Which of Burn's clients a Session speaks as, for the calls whose IR depends on it
// (docs/session-ops.md "Router form"). FusionClient, the default, emits the decompositions of
// docs/spec/ir.md §5.11, which the fusers see. Router emits, for neg, sign, ne, bool xor_,
// clamp_min / clamp_max, relu, gelu, sigmoid, softmax, log_softmax, embedding and
// sync_collective, the one kind that only router / remote clients send (§5.3, §5.9): Neg, Sign,
// NotEqual(Elem), Bool Xor, ClampMin / ClampMax, the Activation kinds, Module Embedding,
// Distributed SyncCollective. Every other call emits the same IR in both forms.
enum class Lowering : std::uint8_t { FusionClient, Router };

class Session {
 public:
  // Over a Device (in process) or any other SessionTarget (the IPC client's connection).
  explicit Session(SessionTarget& target, Lowering lowering = Lowering::FusionClient)
      : device_(target), lowering_(lowering) {}
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  SessionTarget& target() { return device_; }
  Lowering lowering() const { return lowering_; }
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

  // The device bool dtype (docs/spec/ir.md §5.11 `Bd`) and index dtype (`Id`).
  static constexpr ir::DType kBoolDType = ir::dtypes::boolean;
  static constexpr ir::DType kIndexDType = ir::dtypes::i64;

  // ---- Host transfers. from_host: values.size() must equal the shape's element count (error
  // IncompatibleShapes otherwise). to_host<T>: T must match the tensor's dtype exactly (float =
  // f32, double = f64, int32_t, int64_t, bool; error DTypeMismatch otherwise). A moved last
  // handle is consumed by the read.
  Result<Tensor> from_host(std::span<const float> values, ir::Shape shape);
  Result<Tensor> from_host(std::span<const double> values, ir::Shape shape);
  Result<Tensor> from_host(std::span<const std::int32_t> values, ir::Shape shape);
  Result<Tensor> from_host(std::span<const std::int64_t> values, ir::Shape shape);
  Result<Tensor> from_host(const std::vector<bool>& values, ir::Shape shape);
  template <class T = float>
  Result<std::vector<T>> to_host(Tensor t);
  // Any dtype as raw bytes, row-major, D.size_bytes() per element (bool(Native): one byte, 0 or
  // 1), for a client that holds typed buffers of its own (the PyTorch device: f16, i8, ...); a
  // QFloat tensor in kiln's layout (ir::shape::quant_geometry: the values' words, the block
  // scales, the f32 global scale), which to_host_bytes gives and from_host_bytes takes back.
  // from_host_bytes: bytes.size() must be the shape's element count times dtype.size_bytes(), or
  // the QFloat layout's total (IncompatibleShapes otherwise).
  // to_host_bytes: reads t into `dst`, which must hold exactly its bytes (Invalid otherwise).
  Result<Tensor> from_host_bytes(ir::DType dtype, std::span<const std::byte> bytes, ir::Shape shape);
  Status to_host_bytes(Tensor t, std::span<std::byte> dst);
  // Drains the current stream.
  Status sync();

  // ---- Arithmetic (float or int; tensor rhs broadcasts, scalar rhs is converted to D(lhs)).
  Result<Tensor> add(Tensor a, Tensor b);
  Result<Tensor> sub(Tensor a, Tensor b);
  Result<Tensor> mul(Tensor a, Tensor b);
  Result<Tensor> div(Tensor a, Tensor b);
  Result<Tensor> rem(Tensor a, Tensor b);
  Result<Tensor> add(Tensor a, double s);
  Result<Tensor> sub(Tensor a, double s);
  Result<Tensor> mul(Tensor a, double s);
  Result<Tensor> div(Tensor a, double s);
  Result<Tensor> rem(Tensor a, double s);
  Result<Tensor> mul_scalar(Tensor a, double k) { return mul(std::move(a), k); }
  // pow: tensor exponent → Float Powf / NumericInt Powi; scalar exponent per docs/spec/ir.md §5.11 (0 →
  // Ones, 1 → the input itself, 2 → Mul(x, x), −1 → Recip, −2 → Mul then Recip (float), else
  // PowfScalar / PowiScalar).
  Result<Tensor> pow(Tensor a, Tensor b);
  Result<Tensor> pow(Tensor a, double e);
  // Elementwise max / min (float or int; Burn's max_pair / min_pair), docs/spec/ir.md §5.11.
  Result<Tensor> maximum(Tensor a, Tensor b);  // F/I Lower(a, b) → m (Bd), Base* MaskWhere{a, m, b}
  Result<Tensor> minimum(Tensor a, Tensor b);  // F/I Lower(b, a) → m (Bd), Base* MaskWhere{a, m, b}
  Result<Tensor> maximum(Tensor a, double s);  // F/I LowerElem(a, s) → m, Base* MaskFill{a, m, s}
  Result<Tensor> minimum(Tensor a, double s);  // F/I GreaterElem(a, s) → m, Base* MaskFill{a, m, s}

  // ---- Logic (bool) and bitwise (integer) ops, docs/spec/ir.md §5.11. The trailing underscore
  // avoids the alternative tokens `and`, `or`, `xor`, `not`. A scalar with a bool tensor is a
  // bool (nonzero = true), materialized (K) as BaseBool Ones (true) or Zeros (false) of S(a) and
  // D(a) before the tensor form; with an integer tensor it is converted to D(a). Float operands
  // are an error (the Int builders' message).
  Result<Tensor> and_(Tensor a, Tensor b);  // bool: Bool And; int: Int BitwiseAnd
  Result<Tensor> or_(Tensor a, Tensor b);   // bool: Bool Or; int: Int BitwiseOr
  // bool: BaseBool Equal (D(a)), then Bool Not (Router: Bool Xor); int: Int BitwiseXor
  Result<Tensor> xor_(Tensor a, Tensor b);
  Result<Tensor> and_(Tensor a, double s);  // bool: Ones/Zeros, then Bool And; int: Int BitwiseAndScalar
  Result<Tensor> or_(Tensor a, double s);   // bool: Ones/Zeros, then Bool Or; int: Int BitwiseOrScalar
  Result<Tensor> xor_(Tensor a, double s);  // bool: Ones/Zeros, Equal, Bool Not; int: Int BitwiseXorScalar
  Result<Tensor> not_(Tensor a);            // bool: Bool Not (D(a)); int: Int BitwiseNot
  // Shifts (integer only; the right shift is arithmetic for signed dtypes).
  Result<Tensor> bitwise_left_shift(Tensor a, Tensor b);   // Int BitwiseLeftShift
  Result<Tensor> bitwise_left_shift(Tensor a, double s);   // Int BitwiseLeftShiftScalar
  Result<Tensor> bitwise_right_shift(Tensor a, Tensor b);  // Int BitwiseRightShift (arithmetic)
  Result<Tensor> bitwise_right_shift(Tensor a, double s);  // Int BitwiseRightShiftScalar

  // ---- Unary. neg = MulScalar(−1) (Router: F/I Neg); abs float or int; the rest float only.
  Result<Tensor> neg(Tensor a);
  Result<Tensor> abs(Tensor a);
  Result<Tensor> exp(Tensor a);
  Result<Tensor> log(Tensor a);
  Result<Tensor> log1p(Tensor a);
  Result<Tensor> sqrt(Tensor a);
  Result<Tensor> rsqrt(Tensor a);  // Sqrt, then Recip (K)
  Result<Tensor> sin(Tensor a);
  Result<Tensor> cos(Tensor a);
  Result<Tensor> tanh(Tensor a);
  Result<Tensor> erf(Tensor a);
  Result<Tensor> recip(Tensor a);
  // sigmoid, relu, gelu: Router emits Activation Sigmoid / Relu / Gelu instead.
  Result<Tensor> sigmoid(Tensor a);  // the 8-op sequence (casts through f32)
  Result<Tensor> relu(Tensor a);     // LowerEqualElem(x, 0), MaskFill(x, m, 0)
  Result<Tensor> gelu(Tensor a);     // exact: x * (1 + erf(x / √2)) / 2
  Result<Tensor> silu(Tensor a);     // x * sigmoid(x)
  Result<Tensor> floor(Tensor a);    // Float Floor
  Result<Tensor> ceil(Tensor a);     // Float Ceil
  Result<Tensor> round(Tensor a);    // Float Round (half to even)
  Result<Tensor> trunc(Tensor a);    // Float Trunc
  // sign (float or int): Zeros(S, D) → z, LowerElem(a, 0) → m1, GreaterElem(a, 0) → m2,
  // MaskFill(z, m1, −1) → r, MaskFill(r, m2, 1) (docs/spec/ir.md §5.11); Router: F/I Sign.
  Result<Tensor> sign(Tensor a);
  Result<Tensor> is_nan(Tensor a);  // Float IsNan → kBoolDType
  Result<Tensor> is_inf(Tensor a);  // Float IsInf → kBoolDType
  // Trigonometric and hyperbolic functions (float only, docs/spec/ir.md §5.6; no §5.11 row):
  // one kind each, S(a), D(a). Outside a function's domain the value is NaN (acos(2)), at a pole
  // ±inf (atanh(±1)), as C's libm and PyTorch.
  Result<Tensor> cosh(Tensor a);   // Float Cosh
  Result<Tensor> sinh(Tensor a);   // Float Sinh
  Result<Tensor> tan(Tensor a);    // Float Tan
  Result<Tensor> acos(Tensor a);   // Float ArcCos
  Result<Tensor> acosh(Tensor a);  // Float ArcCosh
  Result<Tensor> asin(Tensor a);   // Float ArcSin
  Result<Tensor> asinh(Tensor a);  // Float ArcSinh
  Result<Tensor> atan(Tensor a);   // Float ArcTan
  Result<Tensor> atanh(Tensor a);  // Float ArcTanh
  // Float ArcTan2{lhs = y, rhs = x}: atan2(y, x) in [−π, π], broadcasting, same dtypes; C's
  // quadrant and signed-zero rules (atan2(+0, −0) = π).
  Result<Tensor> atan2(Tensor y, Tensor x);
  // Float Hypot: √(a² + b²) without intermediate overflow, broadcasting; hypot(±inf, NaN) = inf.
  Result<Tensor> hypot(Tensor a, Tensor b);

  // ---- Activations of docs/spec/ir.md §5.9 without a §5.11 row (float only), S(x), D(x). The
  // fusion-client form emits the sequence of Burn's default ActivationOps (which burn-fusion
  // keeps; docs/session-ops.md lists each), so the fusers see it; Router emits the one Activation
  // kind of the call's name.
  Result<Tensor> leaky_relu(Tensor x, double negative_slope);        // LeakyRelu: x < 0 ? x · slope : x
  Result<Tensor> prelu(Tensor x, Tensor alpha);                      // PRelu: x < 0 ? x · alpha : x, alpha broadcast
  Result<Tensor> hard_sigmoid(Tensor x, double alpha, double beta);  // HardSigmoid: clamp(αx + β, 0, 1)
  Result<Tensor> log_sigmoid(Tensor x);                              // LogSigmoid: −softplus(−x)
  Result<Tensor> softmin(Tensor x, std::uint64_t dim);               // Softmin: softmax(−x) along dim
  // The gradients (Burn's *_backward): relu's and sigmoid's from the forward's output, gelu's
  // (the tanh approximation's derivative, as Burn) and log_sigmoid's from its input.
  Result<Tensor> relu_backward(Tensor output, Tensor grad);     // ReluBackward: output <= 0 ? 0 : grad
  Result<Tensor> gelu_backward(Tensor x, Tensor grad);          // GeluBackward
  Result<Tensor> sigmoid_backward(Tensor output, Tensor grad);  // SigmoidBackward: grad · out (1 − out)
  Result<Tensor> log_sigmoid_backward(Tensor x, Tensor grad);   // LogSigmoidBackward: grad · sigmoid(−x)

  // ---- Comparisons → kBoolDType tensors (eq of bool operands keeps D(lhs)). ne: Router emits
  // Base* NotEqual / NotEqualElem.
  Result<Tensor> eq(Tensor a, Tensor b);
  Result<Tensor> ne(Tensor a, Tensor b);  // Equal, then Bool Not
  Result<Tensor> lt(Tensor a, Tensor b);
  Result<Tensor> le(Tensor a, Tensor b);
  Result<Tensor> gt(Tensor a, Tensor b);
  Result<Tensor> ge(Tensor a, Tensor b);
  Result<Tensor> eq(Tensor a, double s);
  Result<Tensor> ne(Tensor a, double s);
  Result<Tensor> lt(Tensor a, double s);
  Result<Tensor> le(Tensor a, double s);
  Result<Tensor> gt(Tensor a, double s);
  Result<Tensor> ge(Tensor a, double s);

  // ---- Selection and conversion.
  // out[i] = mask[i] ? value[i] : tensor[i] (Burn's tensor.mask_where(mask, value)).
  Result<Tensor> mask_where(Tensor tensor, Tensor mask, Tensor value);
  // out[i] = mask[i] ? value : tensor[i].
  Result<Tensor> mask_fill(Tensor tensor, Tensor mask, double value);
  Result<Tensor> clamp(Tensor a, double min, double max);
  // Burn's clamp_min / clamp_max: the maximum(a, s) / minimum(a, s) sequences (Burn's default
  // implementations); Router: F/I ClampMin / ClampMax.
  Result<Tensor> clamp_min(Tensor a, double min);
  Result<Tensor> clamp_max(Tensor a, double max);
  // Per docs/spec/ir.md §5.11 (float↔float Cast, int↔int Cast, IntoFloat, IntoInt, Bool IntoFloat/IntoInt);
  // a cast to bool is an error (compare with ne(x, 0) instead).
  Result<Tensor> cast(Tensor a, ir::DType target);

  // ---- Creation (no inputs). The family follows `dtype`: BaseFloat, BaseInt or BaseBool for
  // Zeros / Ones / Empty, NumericFloat or NumericInt for Full.
  Result<Tensor> zeros(ir::Shape shape, ir::DType dtype = ir::dtypes::f32);  // Base* Zeros
  Result<Tensor> ones(ir::Shape shape, ir::DType dtype = ir::dtypes::f32);   // Base* Ones
  // Base* Empty: the contents are unspecified (the reference backend zero-fills).
  Result<Tensor> empty(ir::Shape shape, ir::DType dtype = ir::dtypes::f32);
  // F/I Full{value} (value converted to dtype); a bool dtype gives BaseBool Ones (value != 0) or
  // Zeros, as the bool-scalar rule of docs/spec/ir.md §5.11 materializes a bool.
  Result<Tensor> full(ir::Shape shape, double value, ir::DType dtype = ir::dtypes::f32);
  // Random creation (docs/spec/ir.md §5.5, §5.6; Burn's Tensor::random): a float dtype emits Float
  // Random, an integer dtype NumericInt IntRandom, each {distribution} of `shape` and `dtype`. Bool
  // and QFloat dtypes are an error (Burn has no bool random: compare a Bernoulli draw with
  // ne(x, 0)). Values, per the reference executor (every backend runs its kernel):
  //   Default          float: uniform on [0, 1); integer: uniform on [0, 255) ([0, 128) for i8).
  //   Bernoulli(p)     1 with probability p, else 0; 0 <= p <= 1.
  //   Uniform(lo, hi)  float: uniform on [lo, hi); integer: on the integers [trunc(lo), trunc(hi)),
  //                    which must be non-empty (and fit the dtype: checked at execution). Finite
  //                    bounds, lo < hi (Burn's rand::Uniform; PyTorch's uniform_ admits lo == hi).
  //   Normal(m, s)     m + s·z, z standard normal; integers round to nearest and saturate. A
  //                    finite mean, 0 <= s < inf.
  // A parameter outside these ranges is this call's Invalid error, before any IR is emitted.
  // Draws come from the generator of the stream that runs the op (seeded per backend stream,
  // docs/decisions.md): successive draws differ, and a fresh device replays the same values.
  Result<Tensor> random(ir::Shape shape, ir::build::DistributionIr distribution = {},
                        ir::DType dtype = ir::dtypes::f32);
  // [start, end) by step, as PyTorch's torch.arange: a rank-1 tensor of ceil((end − start) / step)
  // elements start + i·step (start == end gives shape [0]). Built on the host and uploaded, as
  // Burn's int_arange_step (no IR op: docs/spec/ir.md §5.11 has no arange row). Errors, as
  // PyTorch: step 0 ("step must be nonzero"); a step whose sign points away from end ("upper bound
  // and lower bound inconsistent with step sign"). dtype: an integer dtype (a value it cannot hold
  // is an error), f32 or f64 (rounded to nearest); other dtypes are Unsupported, bool DTypeMismatch.
  Result<Tensor> arange(std::int64_t start, std::int64_t end, std::int64_t step = 1, ir::DType dtype = kIndexDType);

  // ---- Reductions. Along `dim`: the IR keeps the axis (size 1); keepdim = false adds a Reshape
  // that removes it (an error on a rank-1 input: kiln has no rank-0 tensors). Whole tensor: [1],
  // or the rank-r all-ones shape with keepdim = true.
  Result<Tensor> sum_dim(Tensor a, std::uint64_t dim, bool keepdim = true);
  Result<Tensor> mean_dim(Tensor a, std::uint64_t dim, bool keepdim = true);
  Result<Tensor> max_dim(Tensor a, std::uint64_t dim, bool keepdim = true);
  Result<Tensor> min_dim(Tensor a, std::uint64_t dim, bool keepdim = true);
  Result<Tensor> argmax(Tensor a, std::uint64_t dim, bool keepdim = true);  // kIndexDType
  Result<Tensor> sum(Tensor a, bool keepdim = false);
  Result<Tensor> mean(Tensor a, bool keepdim = false);
  Result<Tensor> prod_dim(Tensor a, std::uint64_t dim, bool keepdim = true);     // F/I ProdDim
  Result<Tensor> max_abs_dim(Tensor a, std::uint64_t dim, bool keepdim = true);  // F/I MaxAbsDim
  Result<Tensor> argmin(Tensor a, std::uint64_t dim, bool keepdim = true);       // F/I ArgMin → kIndexDType
  Result<Tensor> any_dim(Tensor a, std::uint64_t dim, bool keepdim = true);      // Base* AnyDim → kBoolDType
  Result<Tensor> all_dim(Tensor a, std::uint64_t dim, bool keepdim = true);      // Base* AllDim → kBoolDType
  Result<Tensor> prod(Tensor a, bool keepdim = false);                           // F/I Prod
  Result<Tensor> max(Tensor a, bool keepdim = false);                            // F/I Max
  Result<Tensor> min(Tensor a, bool keepdim = false);                            // F/I Min
  Result<Tensor> max_abs(Tensor a, bool keepdim = false);                        // F/I MaxAbs
  Result<Tensor> any(Tensor a, bool keepdim = false);  // Base* Any → kBoolDType (x != 0; NaN is true)
  Result<Tensor> all(Tensor a, bool keepdim = false);  // Base* All → kBoolDType
  // Whole tensor (K): Base* Reshape(a → [numel]), then F/I ArgMax / ArgMin on axis 0 → [1], kIndexDType.
  Result<Tensor> argmax(Tensor a);
  Result<Tensor> argmin(Tensor a);
  // (values, indices) along `dim`: F/I MaxDimWithIndices / MinDimWithIndices, both outputs S(a)
  // with [dim] = 1, indices kIndexDType (the first occurrence); keepdim = false adds a Reshape
  // per output.
  Result<std::pair<Tensor, Tensor>> max_dim_with_indices(Tensor a, std::uint64_t dim, bool keepdim = true);
  Result<std::pair<Tensor, Tensor>> min_dim_with_indices(Tensor a, std::uint64_t dim, bool keepdim = true);
  // Inclusive scans along `dim`: F/I CumSum / CumProd / CumMin / CumMax (DimOp), S(a), D(a).
  Result<Tensor> cumsum(Tensor a, std::uint64_t dim);
  Result<Tensor> cumprod(Tensor a, std::uint64_t dim);
  Result<Tensor> cummin(Tensor a, std::uint64_t dim);
  Result<Tensor> cummax(Tensor a, std::uint64_t dim);
  // Sorting along `dim` (float or int; docs/spec/ir.md §5.5, no §5.11 row). Stable: equal values
  // keep their index order; NaN sorts as larger than every number (first when descending, last
  // when ascending), as PyTorch's sort(stable = true). Every output is S(a).
  Result<Tensor> sort(Tensor a, std::uint64_t dim, bool descending = false);     // F/I Sort{dim, descending}, D(a)
  Result<Tensor> argsort(Tensor a, std::uint64_t dim, bool descending = false);  // F/I ArgSort → kIndexDType
  // (values D(a), indices kIndexDType): F/I SortWithIndices{dim, descending}.
  Result<std::pair<Tensor, Tensor>> sort_with_indices(Tensor a, std::uint64_t dim, bool descending = false);
  // The k largest values along `dim` in descending order (stable, NaN first), S(a) with [dim] = k;
  // 1 <= k <= S(a)[dim], else the builder's error. F/I TopK{axis = dim, accumulator_len = k}, D(a).
  Result<Tensor> topk(Tensor a, std::uint64_t k, std::uint64_t dim);
  // Their indices: F/I ArgTopK{axis = dim, accumulator_len = k} → kIndexDType.
  Result<Tensor> argtopk(Tensor a, std::uint64_t k, std::uint64_t dim);
  // F/I TopKWithIndices: topk's values and argtopk's indices (kIndexDType) from one op.
  Result<std::pair<Tensor, Tensor>> topk_with_indices(Tensor a, std::uint64_t k, std::uint64_t dim);

  // ---- Compute and layout.
  Result<Tensor> matmul(Tensor a, Tensor b);
  // Float Cross{a, b, dim} (docs/spec/ir.md §5.6; no §5.11 row): the cross product of the 3-vectors
  // along dim (size 3 in both), the other dims broadcast; D(a).
  Result<Tensor> cross(Tensor a, Tensor b, std::uint64_t dim);
  // `args` per ir shape::reshape (> 0 literal, 0 copies, −1 inferred once).
  Result<Tensor> reshape(Tensor a, std::vector<std::int64_t> args);
  Result<Tensor> swap_dims(Tensor a, std::uint64_t dim1, std::uint64_t dim2);
  Result<Tensor> permute(Tensor a, std::vector<std::uint64_t> axes);
  Result<Tensor> expand(Tensor a, ir::Shape shape);
  Result<Tensor> slice(Tensor a, std::vector<ir::Slice> ranges);
  Result<Tensor> cat(std::vector<Tensor> tensors, std::uint64_t dim);
  // Base Gather{tensor, dim, indices} (indices integer, same rank as tensor).
  Result<Tensor> gather(Tensor a, std::uint64_t dim, Tensor indices);
  Result<Tensor> flip(Tensor a, std::vector<std::uint64_t> axes);               // Base* Flip
  Result<Tensor> repeat_dim(Tensor a, std::uint64_t dim, std::uint64_t times);  // Base* RepeatDim
  // Base* Select{tensor, dim, indices}: indices integer of rank 1; S(a) with [dim] = indices[0].
  Result<Tensor> select(Tensor a, std::uint64_t dim, Tensor indices);
  // Base* SelectAssign{tensor, dim, indices, value, update}: value must be S(a) with [dim] =
  // indices[0] (checked here: the builder leaves it to the kernel).
  Result<Tensor> select_assign(Tensor a, std::uint64_t dim, Tensor indices, Tensor value, ir::IndexingUpdate update);
  // Base* SliceAssign{tensor, ranges, value}: value must have the slice's shape (checked here).
  Result<Tensor> slice_assign(Tensor a, std::vector<ir::Slice> ranges, Tensor value);
  // Base* Scatter{tensor, dim, indices, value, update}: indices and value of a's rank, indices no
  // larger than value, nor than a outside `dim` (checked here).
  Result<Tensor> scatter(Tensor a, std::uint64_t dim, Tensor indices, Tensor value, ir::IndexingUpdate update);
  // Base* GatherNd{data, indices}: indices [..., k] address the first k dims of data.
  Result<Tensor> gather_nd(Tensor data, Tensor indices);
  // Base* ScatterNd{data, indices, values, reduction} (docs/spec/ir.md §5.4; no §5.11 row): a
  // copy of data where each k-tuple of indices [..., k] (integer) updates the sub-tensor it
  // addresses with its slice of values, in index order (Assign: a repeated tuple's last write
  // wins). values must be indices[..-1] ++ data[k..] (checked here); S(data), D(data).
  Result<Tensor> scatter_nd(Tensor data, Tensor indices, Tensor values, ir::IndexingUpdate reduction);
  // Base* Unfold{a, dim, size, step} (no §5.11 row): the windows of `size` elements every `step`
  // along dim, as a new last axis (torch.Tensor.unfold): S(a) with [dim] = the window count
  // ((S(a)[dim] − size) / step + 1, none when size > S(a)[dim]) and `size` appended; D(a).
  // step >= 1.
  Result<Tensor> unfold(Tensor a, std::uint64_t dim, std::uint64_t size, std::uint64_t step);
  // F/I Pad (docs/spec/ir.md §6.4): `padding` applies to the last padding.size() dims, in dim
  // order; `value` is the constant of PadMode::Constant (unused by Reflect and Edge).
  Result<Tensor> pad(Tensor a, std::vector<ir::build::PadPair> padding, ir::PadMode mode = ir::PadMode::Constant,
                     double value = 0);

  // ---- Module ops (float; docs/spec/ir.md §5.8, shapes §6.3).
  // Module Conv2d{x [N, C, H, W], weight [C_out, C / groups, kh, kw], bias? [C_out], options}.
  Result<Tensor> conv2d(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt,
                        const ir::build::Conv2dOptions& options = {});
  // Module ConvTranspose1d{x [N, C, L], weight [C, C_out / groups, k], bias? [C_out], options}.
  Result<Tensor> conv_transpose1d(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt,
                                  const ir::build::ConvTranspose1dOptions& options = {});
  Result<Tensor> max_pool2d(Tensor x, const ir::build::MaxPool2dOptions& options);  // Module MaxPool2d
  Result<Tensor> avg_pool2d(Tensor x, const ir::build::AvgPool2dOptions& options);  // Module AvgPool2d
  // weights [V, E] (float), indices [B, S] (integer) → [B, S, E]: BaseInt Reshape(indices →
  // [B·S]), BaseFloat Select(weights, 0, ·) → [B·S, E], BaseFloat Reshape(→ [B, S, E])
  // (docs/spec/ir.md §5.11); Router: Module Embedding.
  Result<Tensor> embedding(Tensor weights, Tensor indices);
  // Dense layers, norms and the embedding's gradient (float; docs/spec/ir.md §5.8, §6.3). No §5.11
  // row: each call emits the one Module kind of its name, built by the builder of that name (its
  // error values: ranks, dims, dtypes; the forwards take one dtype).
  // x [..., d_in], weight [d_in, d_out] (Burn's layout), bias? [d_out] → x with the last dim d_out,
  // x · weight + bias: Module Linear{x, weight, bias?}.
  Result<Tensor> linear(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt);
  // linear's gradients, D(output_grad): Module LinearXBackward{weight, output_grad} →
  // output_grad · weightᵀ (S(x)); LinearWeightBackward{x, output_grad} → [d_in, d_out], xᵀ ·
  // output_grad over the leading dims; LinearBiasBackward{output_grad} → [d_out], summed likewise.
  Result<Tensor> linear_x_backward(Tensor weight, Tensor output_grad);
  Result<Tensor> linear_weight_backward(Tensor x, Tensor output_grad);
  Result<Tensor> linear_bias_backward(Tensor output_grad);
  // Module LayerNorm{input [..., d], gamma [d], beta? [d], epsilon}: per row of the last dim,
  // (x − mean) · rstd · gamma + beta, rstd = 1 / sqrt(var + epsilon) with the biased variance
  // (Burn's, PyTorch's).
  // epsilon finite and >= 0.
  Result<Tensor> layer_norm(Tensor input, Tensor gamma, std::optional<Tensor> beta = std::nullopt,
                            double epsilon = 1e-5);
  // The same LayerNorm with its row statistics as two more outputs (K, beyond docs/spec/ir.md
  // §5.8): mean and rstd = 1 / sqrt(var + epsilon), input's shape with the last dim 1; what a
  // training front end saves for the backward pass, from the one pass over the rows.
  Result<LayerNormWithStats> layer_norm_with_stats(Tensor input, Tensor gamma,
                                                   std::optional<Tensor> beta = std::nullopt, double epsilon = 1e-5);
  // Module BatchNorm{x [N, C, ...], gamma, beta, mean, variance [C], epsilon}, the inference form:
  // (x − mean[c]) / sqrt(variance[c] + epsilon) · gamma[c] + beta[c] for the channel c (dim 1).
  Result<Tensor> batch_norm(Tensor x, Tensor gamma, Tensor beta, Tensor mean, Tensor variance, double epsilon = 1e-5);
  // Module EmbeddingBackward{weights [V, E], output_grad [B, S, E], indices [B, S] (integer)} →
  // [V, E], D(weights): the rows of output_grad summed at their indices (duplicates accumulate).
  // An index outside [0, V) fails at execution (the tensor's read reports it).
  Result<Tensor> embedding_backward(Tensor weights, Tensor output_grad, Tensor indices);
  // Convolutions of 1 to 3 spatial dims and their gradients (float; docs/spec/ir.md §5.8, §6.3):
  // x [N, C_in, in...]; weight [C_out, C_in / groups, k...] (conv) or [C_in, C_out / groups, k...]
  // (transposed, as Burn and PyTorch); bias? [C_out]. No §5.11 row but conv2d's: each call emits
  // the one Module kind of its name, built by conv / conv_transpose / conv_backward /
  // conv_transpose_backward / conv_bias_backward (their error values: ranks, channels and groups,
  // options, output sizes, dtypes). The forwards take one dtype.
  // Module Conv1d / Conv3d{x, weight, bias?, options} → [N, C_out, out...] by the conv formula.
  Result<Tensor> conv1d(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt,
                        const ir::build::Conv1dOptions& options = {});
  Result<Tensor> conv3d(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt,
                        const ir::build::Conv3dOptions& options = {});
  // Module ConvTranspose2d / ConvTranspose3d{x, weight, bias?, options} → [N, weight[1] · groups,
  // out...] by the transposed formula; padding_out < max(stride, dilation).
  Result<Tensor> conv_transpose2d(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt,
                                  const ir::build::ConvTranspose2dOptions& options = {});
  Result<Tensor> conv_transpose3d(Tensor x, Tensor weight, std::optional<Tensor> bias = std::nullopt,
                                  const ir::build::ConvTranspose3dOptions& options = {});
  // The gradients of conv{n}d(x, weight, bias, options) for output_grad (the forward's output
  // shape), D(output_grad): Module Conv{n}dXBackward{x, weight, output_grad, options} → S(x);
  // Conv{n}dWeightBackward → S(weight); Conv{n}dBiasBackward{x, bias, output_grad} → S(bias).
  Result<Tensor> conv1d_x_backward(Tensor x, Tensor weight, Tensor output_grad,
                                   const ir::build::Conv1dOptions& options = {});
  Result<Tensor> conv2d_x_backward(Tensor x, Tensor weight, Tensor output_grad,
                                   const ir::build::Conv2dOptions& options = {});
  Result<Tensor> conv3d_x_backward(Tensor x, Tensor weight, Tensor output_grad,
                                   const ir::build::Conv3dOptions& options = {});
  Result<Tensor> conv1d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                        const ir::build::Conv1dOptions& options = {});
  Result<Tensor> conv2d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                        const ir::build::Conv2dOptions& options = {});
  Result<Tensor> conv3d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                        const ir::build::Conv3dOptions& options = {});
  Result<Tensor> conv1d_bias_backward(Tensor x, Tensor bias, Tensor output_grad);
  Result<Tensor> conv2d_bias_backward(Tensor x, Tensor bias, Tensor output_grad);
  Result<Tensor> conv3d_bias_backward(Tensor x, Tensor bias, Tensor output_grad);
  // The gradients of conv_transpose{n}d: Module ConvTranspose{n}dWeightBackward{x, weight,
  // output_grad, options} → S(weight); ConvTranspose{n}dBiasBackward{x, bias, output_grad} →
  // S(bias). The spec has no transposed X gradient: it is conv{n}d(output_grad, weight) with the
  // same stride, padding, dilation and groups.
  Result<Tensor> conv_transpose1d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                                  const ir::build::ConvTranspose1dOptions& options = {});
  Result<Tensor> conv_transpose2d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                                  const ir::build::ConvTranspose2dOptions& options = {});
  Result<Tensor> conv_transpose3d_weight_backward(Tensor x, Tensor weight, Tensor output_grad,
                                                  const ir::build::ConvTranspose3dOptions& options = {});
  Result<Tensor> conv_transpose1d_bias_backward(Tensor x, Tensor bias, Tensor output_grad);
  Result<Tensor> conv_transpose2d_bias_backward(Tensor x, Tensor bias, Tensor output_grad);
  Result<Tensor> conv_transpose3d_bias_backward(Tensor x, Tensor bias, Tensor output_grad);
  // The deformable convolution (float; docs/spec/ir.md §5.8, §6.3; torchvision's deform_conv2d).
  // No §5.11 row: each call emits the one Module kind of its name (the builder's error values).
  // Module DeformableConv2d{x [N, C_in, H, W], offset [N, 2·og·kh·kw, H', W'], weight [C_out, C_in /
  // wg, kh, kw], mask? [N, og·kh·kw, H', W'], bias? [C_out], options} → [N, C_out, H', W'], D(x):
  // each tap reads its input channel bilinearly (zeros outside) at the kernel position moved by its
  // offset group's offset, scaled by the mask.
  Result<Tensor> deformable_conv2d(Tensor x, Tensor offset, Tensor weight, std::optional<Tensor> mask = std::nullopt,
                                   std::optional<Tensor> bias = std::nullopt,
                                   const ir::build::DeformableConv2dOptions& options = {});
  // Module DeformableConv2dBackward{x, offset, weight, mask?, bias?, out_grad, options} → the
  // gradients of deformable_conv2d for out_grad (the forward's output shape), each shaped like its
  // variable, D(x); mask_grad and bias_grad iff mask and bias are given.
  Result<DeformableConv2dGrads> deformable_conv2d_backward(Tensor x, Tensor offset, Tensor weight,
                                                           std::optional<Tensor> mask, std::optional<Tensor> bias,
                                                           Tensor out_grad,
                                                           const ir::build::DeformableConv2dOptions& options = {});
  // Pools beyond max_pool2d / avg_pool2d and the pools' gradients (float x [N, C, spatial...];
  // docs/spec/ir.md §5.8, §6.3). No §5.11 row: each call emits the one Module kind of its name,
  // built by the builder of that name (its error values: ranks, windows, shapes, dtypes). Windows:
  // kernel, stride, dilation >= 1, padding <= kernel / 2; output sizes by the pool formula.
  // Module MaxPool1d{x [N, C, L], options} → [N, C, L'], D(x).
  Result<Tensor> max_pool1d(Tensor x, const ir::build::MaxPool1dOptions& options);
  // Module MaxPool{1,2}dWithIndices → (values D(x), indices kIndexDType), both of the pooled shape:
  // an index is flat within x's spatial plane (PyTorch's h · W + w); ties keep the first tap, a NaN
  // wins (the last NaN's index); a window with no element of x gives −inf and −1.
  Result<std::pair<Tensor, Tensor>> max_pool1d_with_indices(Tensor x, const ir::build::MaxPool1dOptions& options);
  Result<std::pair<Tensor, Tensor>> max_pool2d_with_indices(Tensor x, const ir::build::MaxPool2dOptions& options);
  // Module MaxPool{1,2}dWithIndicesBackward{x, grad, indices} → S(x), D(x): grad (float) and indices
  // (integer) of the pooled shape; each grad element added at its index (duplicates accumulate, −1
  // adds nowhere). An index outside the plane fails at execution.
  Result<Tensor> max_pool1d_with_indices_backward(Tensor x, Tensor grad, Tensor indices,
                                                  const ir::build::MaxPool1dOptions& options);
  Result<Tensor> max_pool2d_with_indices_backward(Tensor x, Tensor grad, Tensor indices,
                                                  const ir::build::MaxPool2dOptions& options);
  // Module AvgPool1d{x [N, C, L], options} → [N, C, L'], D(x): PyTorch's divisor (the window within
  // the padded input when count_include_pad, else within x).
  Result<Tensor> avg_pool1d(Tensor x, const ir::build::AvgPool1dOptions& options);
  // Module AvgPool{1,2}dBackward{x, grad} → S(x), D(x): each grad element divided by its window's
  // divisor and added to the window's elements of x.
  Result<Tensor> avg_pool1d_backward(Tensor x, Tensor grad, const ir::build::AvgPool1dOptions& options);
  Result<Tensor> avg_pool2d_backward(Tensor x, Tensor grad, const ir::build::AvgPool2dOptions& options);
  // Module AdaptiveAvgPool{1,2,3}d{x, output_size} → [N, C, output_size...], D(x): the mean over
  // PyTorch's windows [⌊o · in / out⌋, ⌈(o + 1) · in / out⌉) per spatial dim (sizes >= 1).
  Result<Tensor> adaptive_avg_pool1d(Tensor x, std::uint64_t output_size);
  Result<Tensor> adaptive_avg_pool2d(Tensor x, std::array<std::uint64_t, 2> output_size);
  Result<Tensor> adaptive_avg_pool3d(Tensor x, std::array<std::uint64_t, 3> output_size);
  // Module AdaptiveAvgPool{1,2,3}dBackward{x, grad [N, C, output_size...]} → S(x), D(x): each grad
  // element spread evenly over its window.
  Result<Tensor> adaptive_avg_pool1d_backward(Tensor x, Tensor grad);
  Result<Tensor> adaptive_avg_pool2d_backward(Tensor x, Tensor grad);
  Result<Tensor> adaptive_avg_pool3d_backward(Tensor x, Tensor grad);
  // Resampling (float; docs/spec/ir.md §5.6, §5.8, §6.3). No §5.11 row: each call emits the one
  // kind of its name, built by the builder of that name (its error values: ranks, empty images,
  // zero sizes, modes, the grid's shape).
  // Module Interpolate{x [N, C, H, W], output_size [out_h, out_w], options} → [N, C, out_h,
  // out_w], D(x): Nearest / NearestExact / Bilinear / Bicubic / Lanczos3, align_corners as Burn's
  // InterpolateOptions (docs/decisions.md).
  Result<Tensor> interpolate(Tensor x, std::array<std::uint64_t, 2> output_size,
                             const ir::build::InterpolateOptions& options);
  // Module InterpolateBackward{x, grad [N, C, out_h, out_w], output_size, options} → S(x), D(x):
  // the gradient of interpolate with respect to x (grad summed into the positions each output read).
  Result<Tensor> interpolate_backward(Tensor x, Tensor grad, std::array<std::uint64_t, 2> output_size,
                                      const ir::build::InterpolateOptions& options);
  // Float GridSample2d{tensor [N, C, H, W], grid [N, Ho, Wo, 2], options} → [N, C, Ho, Wo],
  // D(tensor): grid (x, y) in [-1, 1] samples column x, row y (PyTorch's F.grid_sample).
  Result<Tensor> grid_sample_2d(Tensor tensor, Tensor grid, const ir::build::GridSampleOptions& options = {});
  // Module Unfold4d{x [N, C, H, W], kernel_size [kh, kw], options} → [N, C·kh·kw, L], D(x):
  // im2col (PyTorch's F.unfold), L the conv formula's blocks. Not Base Unfold (unfold above).
  Result<Tensor> unfold4d(Tensor x, std::array<std::uint64_t, 2> kernel_size,
                          const ir::build::Unfold4dOptions& options = {});
  // Signals (float; docs/spec/ir.md §5.8, §6.3; torch.fft.rfft / irfft). No §5.11 row: each call
  // emits the one Module kind of its name, built by rfft / irfft (their error values: dim, n, dtypes).
  // Module Rfft{signal, dim, n?} → (re, im), each the signal with [dim] = n / 2 + 1, D(signal): the
  // one-sided DFT of the signal zero-padded or trimmed to n points (n: the dim's length when absent).
  Result<std::pair<Tensor, Tensor>> rfft(Tensor signal, std::uint64_t dim,
                                         std::optional<std::uint64_t> n = std::nullopt);
  // Module IRfft{input_re, input_im, dim, n?} → input_re with [dim] = n (2·(len − 1) when absent),
  // D(input_re): the real signal whose one-sided DFT the bins are (scaled by 1 / n).
  Result<Tensor> irfft(Tensor input_re, Tensor input_im, std::uint64_t dim,
                       std::optional<std::uint64_t> n = std::nullopt);
  // Attention and the CTC loss (float; docs/spec/ir.md §5.8, §6.3; Burn's attention and ctc_loss).
  // No §5.11 row: each call emits the one Module kind of its name (the builder's error values).
  // Module Attention{query [B, H, Lq, D], key [B, H, Lk, D], value [B, H, Lk, Dv], mask?, attn_bias?,
  // options} → [B, H, Lq, Dv], D(query): softmax(q·kᵀ·scale softcapped, −inf where mask is true
  // (Burn: true masks out) and above the bottom-right causal diagonal, + attn_bias) · v; a row with
  // every key masked gives 0. scale defaults to 1 / sqrt(D).
  Result<Tensor> attention(Tensor query, Tensor key, Tensor value, std::optional<Tensor> mask = std::nullopt,
                           std::optional<Tensor> attn_bias = std::nullopt,
                           const ir::build::AttentionOptions& options = {});
  // Module CtcLoss{log_probs [T, N, C], targets [N, S], input_lengths [N], target_lengths [N]
  // (integers), blank} → [N], D(log_probs): −log P per sample, +inf when no alignment exists. A
  // length or label out of range (or a blank label) fails at execution.
  Result<Tensor> ctc_loss(Tensor log_probs, Tensor targets, Tensor input_lengths, Tensor target_lengths,
                          std::uint64_t blank = 0);
  // Module CtcLossBackward{…, grad_loss [N], blank} → S(log_probs), D(log_probs): Burn's gradient
  // grad_loss · (exp(log_probs) − the alignment posteriors), 0 past each input length.
  Result<Tensor> ctc_loss_backward(Tensor log_probs, Tensor targets, Tensor input_lengths, Tensor target_lengths,
                                   Tensor grad_loss, std::uint64_t blank = 0);

  // ---- Quantization (docs/spec/ir.md §5.6, §6.3). No §5.11 row: each call emits the one Float kind
  // of its name (the builder's error values). QFloat tensors live on the CPU backends only (their
  // reference executor; the GPU refuses them), and cannot be read back or dropped over IPC
  // (qfloat is not transferable): consume one with std::move into dequantize.
  // Float Quantize{tensor (float), scales, global?, scheme} → QFloat(scheme) of S(tensor): q =
  // clamp(round(x / s), the value type's range), s the element's block scale (stored in the
  // scheme's precision) times global (1 when absent); scales of the scheme's block-scale shape
  // (ir::shape::quant_geometry), finite and positive (checked at execution), global [1].
  Result<Tensor> quantize(Tensor tensor, Tensor scales, const ir::QuantScheme& scheme,
                          std::optional<Tensor> global = std::nullopt);
  // Float Dequantize{tensor (QFloat)} → S(tensor), `dtype` (float): q · s.
  Result<Tensor> dequantize(Tensor tensor, ir::DType dtype = ir::dtypes::f32);

  // ---- Collectives (docs/spec/ir.md §5.11).
  // Distributed AllReduce{tensor, op, device_ids}: S(a), D(a). The CPU backends reduce over
  // themselves only: naming another device fails at execution (Unsupported).
  Result<Tensor> all_reduce(Tensor a, ir::ReduceOperation op, std::vector<ir::build::DeviceId> device_ids);
  // kiln extensions (docs/distributed.md), in a job spanning daemons; a device alone is a world
  // of one (device_ids naming one device: the tensor itself; more fail at execution).
  // Distributed Broadcast{tensor, root, device_ids}: the root rank's tensor on every rank.
  Result<Tensor> broadcast(Tensor a, std::uint64_t root, std::vector<ir::build::DeviceId> device_ids);
  // Distributed AllGather{tensor, dim, device_ids}: every rank's `a`, concatenated along dim in
  // rank order (dim's size × the number of ids).
  Result<Tensor> all_gather(Tensor a, std::uint64_t dim, std::vector<ir::build::DeviceId> device_ids);
  // Distributed ReduceScatter{tensor, op, dim, device_ids}: the ranks' `a` reduced, cut along
  // dim into one part per rank; this rank's part.
  Result<Tensor> reduce_scatter(Tensor a, ir::ReduceOperation op, std::uint64_t dim,
                                std::vector<ir::build::DeviceId> device_ids);
  // No IR (the fusion client's form): drains the current stream, as sync() does. kiln's backends
  // are single-device, so nothing else is pending (the reference's SyncCollective is a no-op).
  // Router: Distributed SyncCollective (no tensors) on the current stream, then the drain.
  Status sync_collective();

  // ---- Composites (built from the ops above, as Burn's default implementations do). softmax
  // and log_softmax: Router emits Activation Softmax / LogSoftmax{x, dim}.
  // softmax: e = exp(x − max_dim(x, dim)); e / sum_dim(e, dim).
  Result<Tensor> softmax(Tensor x, std::uint64_t dim);
  // log_softmax: y = x − max_dim(x, dim); y − log(sum_dim(exp(y), dim)).
  Result<Tensor> log_softmax(Tensor x, std::uint64_t dim);
  // mean((pred − target)²) → [1] (the square as Mul(d, d)).
  Result<Tensor> mse_loss(Tensor pred, Tensor target);
  // Cross-entropy of logits [N, C] with target probabilities [N, C] (one-hot or smoothed):
  // −mean_n(sum_c(target · log_softmax(logits, 1))) → [1] (Burn's cross_entropy_with_logits).
  Result<Tensor> cross_entropy(Tensor logits, Tensor target_probs);
  // The same with class indices [N] (integer dtype): −mean_n(log_softmax(logits, 1)[n, class_n])
  // through Reshape(indices → [N, 1]) and Gather (Burn's CrossEntropyLoss without weights).
  Result<Tensor> cross_entropy_indices(Tensor logits, Tensor classes);

  // A custom operation (no inference: the output shape and dtype are given). The reference
  // backend knows none, so executing one fails: the failure path of the tests.
  Result<Tensor> custom(std::string name, std::vector<Tensor> inputs, ir::Shape out_shape, ir::DType out_dtype);

 private:
  friend class Tensor;
  // Called during run_op, never kept: a reference, not a std::function (no allocation, one indirect call).
  using Builder = FunctionRef<Result<ir::Operation>(std::span<const ir::TensorIr> inputs, ir::TensorId out)>;
  using MultiBuilder =
      FunctionRef<Result<ir::Operation>(std::span<const ir::TensorIr> inputs, std::span<const ir::TensorId> outs)>;
  // Shared views for inputs homed elsewhere, the op built (builder errors returned as is),
  // consumed inputs marked, the op queued on the current stream.
  Result<Tensor> run_op(std::span<Tensor> inputs, Builder build);
  // run_op for an op with outs.size() outputs (fresh ids in field order), set on success.
  Status run_op_outputs(std::span<Tensor> inputs, std::span<std::optional<Tensor>> outs, MultiBuilder build);
  Result<Tensor> unary_op(Tensor a, ir::OpKind kind);
  Result<Tensor> binary_op(Tensor a, Tensor b, ir::OpKind kind);
  Result<Tensor> scalar_op(Tensor a, double s, ir::OpKind kind);
  Result<Tensor> compare_op(Tensor a, Tensor b, ir::OpKind kind);
  Result<Tensor> compare_scalar_op(Tensor a, double s, ir::OpKind kind);
  Result<Tensor> reduce_dim_op(Tensor a, std::uint64_t dim, bool keepdim, ir::OpKind kind);
  Result<Tensor> reduce_op(Tensor a, bool keepdim, ir::OpKind kind);
  Result<Tensor> arg_all_op(Tensor a, ir::OpKind kind);
  Result<std::pair<Tensor, Tensor>> with_indices_op(Tensor a, std::uint64_t dim, bool keepdim, ir::OpKind kind);
  Result<Tensor> dim_op(Tensor a, std::uint64_t dim, ir::OpKind kind);
  Result<Tensor> creation_op(ir::Shape shape, ir::DType dtype, ir::OpKind kind);
  // and_ / or_ / xor_: the Bool kind for bool operands, else the Int kind.
  Result<Tensor> logic_op(Tensor a, Tensor b, ir::OpKind bool_kind, ir::OpKind int_kind);
  Result<Tensor> logic_scalar_op(Tensor a, double s, ir::OpKind bool_kind, ir::OpKind int_kind);
  Result<Tensor> squeeze(Tensor a, std::uint64_t dim);
  Result<Tensor> upload(ir::DType dtype, std::span<const std::byte> bytes, std::size_t count, ir::Shape shape);
  Result<HostData> read(Tensor t, ir::DType want);
  // The checks and handle bookkeeping of a read; the tensor to read (its home is t.home()).
  Result<ir::TensorIr> begin_read(Tensor& t, ir::DType want);
  void drop(const Tensor::State& s);
  // The convolutions: the forward of `kind` (Conv or ConvTranspose signature), or its gradient from
  // (x, weight or bias, output_grad); the bias gradients take no options.
  Result<Tensor> conv_op(ir::OpKind kind, Tensor x, Tensor weight, std::optional<Tensor> bias,
                         const ir::build::ConvOptions& options);
  Result<Tensor> conv_grad_op(ir::OpKind kind, Tensor x, Tensor second, Tensor output_grad,
                              const ir::build::ConvOptions& options);

  Result<Tensor> activation_dim_op(Tensor a, std::uint64_t dim, ir::OpKind kind);
  bool router() const { return lowering_ == Lowering::Router; }

  SessionTarget& device_;
  const Lowering lowering_;
  StreamIdAllocator ids_;
};

template <class T>
Result<std::vector<T>> Session::to_host(Tensor t) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, std::int32_t> ||
                    std::is_same_v<T, std::int64_t> || std::is_same_v<T, bool>,
                "to_host<T>: T is one of float, double, int32_t, int64_t, bool");
  ir::DType want = std::is_same_v<T, float>          ? ir::dtypes::f32
                   : std::is_same_v<T, double>       ? ir::dtypes::f64
                   : std::is_same_v<T, std::int32_t> ? ir::dtypes::i32
                   : std::is_same_v<T, std::int64_t> ? ir::dtypes::i64
                                                     : kBoolDType;
  if constexpr (std::is_same_v<T, bool>) {
    Result<HostData> data = read(std::move(t), want);
    if (!data.ok()) return data.error();
    std::vector<bool> out(data->bytes.size());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = data->bytes[i] != std::byte{0};
    return out;
  } else {
    // Straight into the result: one buffer, one copy (from the IPC arena, say).
    Result<ir::TensorIr> read_ir = begin_read(t, want);
    if (!read_ir.ok()) return read_ir.error();
    std::vector<T> out(ir::num_elements(read_ir->shape));
    Status st = device_.read_into(t.home(), *read_ir, std::as_writable_bytes(std::span<T>(out)));
    if (!st.ok()) return st.error();
    return out;
  }
}

}  // namespace kiln::runtime

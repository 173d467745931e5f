// Reference executor: the error model (skips, claims, recovery of the daemon), handle traffic
// (ReadWrite consumption), lifecycle and collective ops, every op kind on every dtype it admits,
// and a mutation fuzz: no op that passes Operation::validate() crashes the executor.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <thread>

#include "kiln/testing/status.h"
#include "op_samples.h"
#include "reference_test_util.h"

namespace kiln::reference::testing {
namespace {

using F = Family;
using K = OpKind;
// A valid sample of every op kind for an operand dtype: op_samples.h.
using samples::kAllDtypes;
using samples::sample;

TEST(ReferenceExecutorTest, EveryOpKindRunsOnEveryDtypeItAdmits) {
  std::set<int> covered;
  int runs = 0;
  for (int i = 0; i < kNumOpKinds; ++i) {
    const auto k = static_cast<K>(i);
    for (DType t : kAllDtypes) {
      Device d;
      std::optional<Result<Operation>> op = sample(d, k, t);
      if (!op) continue;
      ASSERT_TRUE(op->ok()) << op_info(k).variant << " " << t.name() << ": " << op->error().to_string();
      Status st = d.exec.execute(op->value(), d.handles);
      ++runs;
      if (k == K::Custom_Custom) {
        EXPECT_EQ(st.error().code, ErrorCode::Unsupported);
        continue;
      }
      EXPECT_TRUE(st.ok()) << op->value().to_string() << ": " << st.error().to_string();
      EXPECT_FALSE(d.handles.has_errors()) << op->value().to_string();
      for (const TensorIr& out : op->value().outputs()) {
        const HostTensor* h = d.handles.get_handle_ref(out.id);
        ASSERT_NE(h, nullptr) << op->value().to_string();
        EXPECT_EQ(h->shape(), out.shape);
        EXPECT_EQ(h->dtype(), out.dtype);
      }
      covered.insert(i);
    }
  }
  EXPECT_EQ(covered.size(), static_cast<std::size_t>(kNumOpKinds - 1)) << "every kind but Custom succeeds";
  EXPECT_GT(runs, 700);
}

// ---- Handle traffic

TEST(ReferenceExecutorTest, ReadWriteInputsAreConsumedReadOnlyKept) {
  Device d;
  const TensorIr a = d.f64({2}, dtypes::f32, {1, 2}, TensorStatus::ReadWrite);
  const TensorIr c = d.f64({2}, dtypes::f32, {3, 4}, TensorStatus::ReadOnly);
  const TensorId out = d.ok(b::binary(F::NumericFloat, K::Numeric_Add, a, c, d.fresh()));
  EXPECT_FALSE(d.handles.has_handle(a.id));
  EXPECT_TRUE(d.handles.has_handle(c.id));
  EXPECT_EQ(d.f64_of(out), (std::vector<double>{4, 6}));
  EXPECT_EQ(d.handles.num_handles(), 2u);
}

TEST(ReferenceExecutorTest, OneTensorUsedTwiceInEitherStatusOrder) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f64, {3, 4});
  TensorIr ro = x;
  TensorIr rwv = rw(x);
  const TensorId p = d.ok(b::binary(F::NumericFloat, K::Numeric_Mul, rwv, ro, d.fresh()));  // ReadWrite first
  EXPECT_EQ(d.f64_of(p), (std::vector<double>{9, 16}));
  EXPECT_FALSE(d.handles.has_handle(x.id));
}

TEST(ReferenceExecutorTest, InputsAreNeverModifiedAndOutputsNeverAlias) {
  Device d;
  const TensorIr x = d.f64({3}, dtypes::f32, {1, 2, 3});
  const HostTensor before = d.tensor(x.id);
  const TensorId y = d.ok(b::scalar(F::NumericFloat, K::Numeric_MulScalar, x, ScalarIr::Float(2), d.fresh()));
  EXPECT_EQ(d.f64_of(x.id), (std::vector<double>{1, 2, 3}));
  EXPECT_FALSE(d.tensor(y).shares_buffer_with(before));
}

// ---- Error model (docs/spec/ir.md §11)

TEST(ReferenceExecutorTest, FailureClaimsSkipsPropagateAndTheStreamKeepsRunning) {
  Device d;
  const TensorIr a = d.i64({2}, dtypes::i32, {1, 2});
  const TensorIr z = d.i64({2}, dtypes::i32, {0, 0});
  auto div = b::binary(F::NumericInt, K::Numeric_Div, a, z, d.fresh());
  ASSERT_FALSE(d.run(div).ok());
  const TensorIr bad{div->outputs()[0].id, {2}, TensorStatus::ReadWrite, dtypes::i32};
  const ir::TensorError* root = d.handles.error_of(bad.id);
  ASSERT_NE(root, nullptr);
  EXPECT_EQ(root->depth, 0u);
  const ir::TensorError root_copy = *root;

  // Downstream op: skipped, its output carries the same root one level deeper, its ReadWrite
  // input is released.
  auto next = b::scalar(F::NumericInt, K::Numeric_AddScalar, bad, ScalarIr::Int(1), d.fresh());
  Status st = d.run(next);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("1 operation skipped"), std::string::npos) << st.error().message;
  EXPECT_FALSE(d.handles.has_handle(bad.id));
  const ir::TensorError* e1 = d.handles.error_of(next->outputs()[0].id);
  ASSERT_NE(e1, nullptr);
  EXPECT_TRUE(e1->same_root(root_copy));
  EXPECT_EQ(e1->depth, 1u);
  EXPECT_EQ(d.handles.errored(), 1u);

  // An unrelated op still runs.
  const TensorId ok = d.ok(b::scalar(F::NumericInt, K::Numeric_AddScalar, a, ScalarIr::Int(1), d.fresh()));
  EXPECT_EQ(d.i64_of(ok), (std::vector<std::int64_t>{2, 3}));
  // Dropping the errored tensor clears the error count.
  const TensorIr e1_ir{next->outputs()[0].id, {2}, TensorStatus::ReadWrite, dtypes::i32};
  KILN_EXPECT_OK(d.run(b::drop(e1_ir)));
  EXPECT_FALSE(d.handles.has_errors());
}

TEST(ReferenceExecutorTest, MissingOrMismatchedInputHandlesAreErrors) {
  Device d;
  const TensorIr ghost{d.fresh(), {2}, TensorStatus::ReadOnly, dtypes::f32};
  auto op = b::unary(F::Float, K::Float_Exp, ghost, d.fresh());
  Status st = d.run(op);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::InvalidHandle);
  EXPECT_TRUE(d.handles.entry(op->outputs()[0].id)->is_errored());

  const TensorIr real = d.f64({2}, dtypes::f32, {1, 2}, TensorStatus::ReadWrite);
  TensorIr lying = real;
  lying.shape = {3};
  auto op2 = b::unary(F::Float, K::Float_Exp, lying, d.fresh());
  st = d.run(op2);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::IncompatibleShapes);
  EXPECT_TRUE(d.handles.entry(op2->outputs()[0].id)->is_errored());
  EXPECT_FALSE(d.handles.has_handle(real.id));  // a failed op still consumes its ReadWrite inputs

  const TensorIr other = d.f64({2}, dtypes::f32, {1, 2});
  TensorIr wrong_dtype = other;
  wrong_dtype.dtype = dtypes::f64;
  EXPECT_FALSE(d.run(b::unary(F::Float, K::Float_Exp, wrong_dtype, d.fresh())).ok());
}

TEST(ReferenceExecutorTest, QuantizedTensorsAreRejected) {
  Device d;
  const TensorIr q{d.fresh(), {2}, TensorStatus::ReadOnly, DType::qfloat({})};
  auto op = b::unary(F::NumericFloat, K::Numeric_Abs, q, d.fresh());
  KILN_ASSERT_OK(op);
  Status st = d.run(op);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::Unsupported);
  EXPECT_TRUE(d.handles.entry(op->outputs()[0].id)->is_errored());
}

TEST(ReferenceExecutorTest, FamilyAndCarriedDtypeMustFitTheOperand) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f32, {1, 2});
  auto op = b::unary(F::NumericFloat, K::Numeric_Abs, x, d.fresh());
  KILN_ASSERT_OK(op);
  Operation bad = *op;
  bad.family = F::NumericInt;
  bad.dtype = dtypes::i32;
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::DTypeMismatch);
  bad = *op;
  bad.dtype = dtypes::f64;  // carried dtype differs from the operand's
  bad.tensors.back().id = d.fresh();
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::DTypeMismatch);
  bad = *op;
  bad.tensors.back().dtype = dtypes::f16;  // output dtype the op does not produce
  bad.tensors.back().id = d.fresh();
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::DTypeMismatch);
}

TEST(ReferenceExecutorTest, InvalidOperationsAreErrors) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f32, {1, 2});
  auto op = b::unary(F::Float, K::Float_Exp, x, d.fresh());
  KILN_ASSERT_OK(op);
  Operation bad = *op;
  bad.scalars.push_back(ScalarIr::Float(1));  // Unary carries no scalar: validate() fails
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::Invalid);
  EXPECT_TRUE(d.handles.entry(bad.outputs()[0].id)->is_errored());
  // Structurally broken ops (as a decoder might hand over): errors, the container untouched.
  const std::size_t before = d.handles.num_handles();
  bad = *op;
  bad.num_inputs = 5;
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::Invalid);
  bad = *op;
  bad.kind = static_cast<K>(kNumOpKinds + 3);
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::Invalid);
  bad = *op;
  bad.family = static_cast<F>(200);
  EXPECT_EQ(d.exec.execute(bad, d.handles).error().code, ErrorCode::Invalid);
  EXPECT_EQ(d.handles.num_handles(), before);
  // An output id that is also an input: rejected, and the input survives.
  bad = *op;
  bad.tensors.back().id = x.id;
  EXPECT_FALSE(d.exec.execute(bad, d.handles).ok());
  ASSERT_NE(d.handles.get_handle_ref(x.id), nullptr);
  EXPECT_EQ(d.f64_of(x.id), (std::vector<double>{1, 2}));
}

TEST(ReferenceExecutorTest, ExhaustionIsAnErrorAndTheNextOpRuns) {
  HostAllocator small({.byte_limit = 4096});
  ReferenceExecutor exec(small);
  ReferenceExecutor::Handles handles;
  auto big = b::creation(F::BaseFloat, K::Base_Zeros, {2048}, dtypes::f32, TensorId{1});
  Status st = exec.execute(*big, handles);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::ResourceExhausted);
  EXPECT_NE(st.error().message.find("8192 bytes"), std::string::npos) << st.error().message;
  EXPECT_TRUE(handles.entry(TensorId{1})->is_errored());
  auto small_op = b::creation(F::BaseFloat, K::Base_Ones, {16}, dtypes::f32, TensorId{2});
  KILN_EXPECT_OK(exec.execute(*small_op, handles));
  EXPECT_EQ(handles.get_handle_ref(TensorId{2})->to_f64()[15], 1.0);
}

// ---- Lifecycle and collectives

TEST(ReferenceExecutorTest, InitChecksTheOutOfBandHandle) {
  Device d;
  const TensorId id = d.fresh();
  d.handles.register_handle(id, *HostTensor::from_f64(d.alloc, {2}, dtypes::f32, std::vector<double>{1, 2}));
  KILN_EXPECT_OK(d.run(b::init({2}, dtypes::f32, id)));
  EXPECT_EQ(d.f64_of(id), (std::vector<double>{1, 2}));
  // Missing: error, claimed.
  const TensorId missing = d.fresh();
  EXPECT_EQ(d.run(b::init({2}, dtypes::f32, missing)).error().code, ErrorCode::InvalidHandle);
  EXPECT_TRUE(d.handles.entry(missing)->is_errored());
  // Registered with another shape: error, and the entry becomes Errored (readers see why).
  const TensorId wrong = d.fresh();
  d.handles.register_handle(wrong, *HostTensor::zeros(d.alloc, {3}, dtypes::f32));
  EXPECT_FALSE(d.run(b::init({2}, dtypes::f32, wrong)).ok());
  EXPECT_TRUE(d.handles.entry(wrong)->is_errored());
  // Already claimed out of band (a failed upload): nothing more to say.
  const TensorId claimed = d.fresh();
  d.handles.claim(claimed, ir::TensorError::make_root(ErrorCode::Execution, "upload failed"));
  KILN_EXPECT_OK(d.run(b::init({2}, dtypes::f32, claimed)));
}

TEST(ReferenceExecutorTest, DropFreesAndReportsMissingHandles) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f32, {1, 2}, TensorStatus::ReadWrite);
  KILN_EXPECT_OK(d.run(b::drop(x)));
  EXPECT_FALSE(d.handles.has_handle(x.id));
  EXPECT_EQ(d.alloc.stats().bytes_in_use, 0u);  // the buffer went back to the pool
  EXPECT_EQ(d.run(b::drop(x)).error().code, ErrorCode::InvalidHandle);
}

TEST(ReferenceExecutorTest, CustomOpsAreUnknownAndClaimTheirOutputs) {
  Device d;
  const TensorIr x = d.f64({2}, dtypes::f32, {1, 2}, TensorStatus::ReadWrite);
  const TensorIr outs[] = {TensorIr::uninit(d.fresh(), {2}, dtypes::f32),
                           TensorIr::uninit(d.fresh(), {1}, dtypes::i64)};
  const TensorIr ins[] = {x};
  auto op = b::custom("flash_attention", ins, outs, {});
  Status st = d.run(op);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::Unsupported);
  EXPECT_NE(st.error().message.find("flash_attention"), std::string::npos);
  EXPECT_TRUE(d.handles.entry(outs[0].id)->is_errored());
  EXPECT_TRUE(d.handles.entry(outs[1].id)->is_errored());
  EXPECT_FALSE(d.handles.has_handle(x.id));
}

TEST(ReferenceExecutorTest, AllReduceOnOneDeviceIsTheIdentity) {
  Device d;
  const TensorIr x = d.f64({3}, dtypes::f32, {1, 2, 3});
  EXPECT_EQ(d.f64_of(d.ok(b::all_reduce(x, ReduceOperation::Sum, {}, d.fresh()))), (std::vector<double>{1, 2, 3}));
  const b::DeviceId self[] = {{0, 0}};
  EXPECT_EQ(d.f64_of(d.ok(b::all_reduce(x, ReduceOperation::Mean, self, d.fresh()))), (std::vector<double>{1, 2, 3}));
  const TensorIr xi = d.i64({2}, dtypes::i32, {5, 7});
  EXPECT_EQ(d.i64_of(d.ok(b::all_reduce(xi, ReduceOperation::Mean, {}, d.fresh()))), (std::vector<std::int64_t>{5, 7}));
  for (ReduceOperation op : {ReduceOperation::Min, ReduceOperation::Max, ReduceOperation::Prod})
    EXPECT_EQ(d.f64_of(d.ok(b::all_reduce(x, op, {}, d.fresh()))), (std::vector<double>{1, 2, 3}));
  const b::DeviceId two[] = {{0, 0}, {0, 1}};
  EXPECT_EQ(d.run(b::all_reduce(x, ReduceOperation::Sum, two, d.fresh())).error().code, ErrorCode::Unsupported);
  KILN_EXPECT_OK(d.run(b::sync_collective()));
}

// Streams of one device: one executor and container each, one shared allocator.
TEST(ReferenceExecutorTest, StreamsShareOneAllocator) {
  HostAllocator alloc;
  std::vector<std::thread> streams;
  std::atomic<int> failures{0};
  for (int s = 0; s < 4; ++s) {
    streams.emplace_back([&, s] {
      ReferenceExecutor exec(alloc, static_cast<std::uint64_t>(s));
      ReferenceExecutor::Handles handles;
      std::uint64_t next = 1;
      auto t = [&](std::uint64_t id) { return TensorIr{TensorId{id}, {64}, TensorStatus::ReadWrite, dtypes::f32}; };
      TensorId prev{next};
      if (!exec.execute(*b::creation(F::BaseFloat, K::Base_Ones, {64}, dtypes::f32, TensorId{next++}), handles).ok())
        failures.fetch_add(1);
      for (int i = 0; i < 500; ++i) {
        const TensorId out{next++};
        if (!exec.execute(*b::scalar(F::NumericFloat, K::Numeric_AddScalar, t(prev.value()), ScalarIr::Float(1), out),
                          handles)
                 .ok())
          failures.fetch_add(1);
        prev = out;
      }
      const HostTensor* last = handles.get_handle_ref(prev);
      if (last == nullptr || last->get_f64(63) != 501 || handles.num_handles() != 1) failures.fetch_add(1);
    });
  }
  for (auto& th : streams) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(alloc.stats().bytes_in_use, 0u);
  EXPECT_GT(alloc.stats().pool_hits, 1000u);
}

// ---- Mutation fuzz: take every valid sample, break one thing at a time so that validate() still
// passes (attributes, output shapes and dtypes, input shapes and dtypes with matching handles,
// scalars, slice ranges), and execute. The executor must return (ASan / UBSan watch), and leave
// every output either registered or claimed.

std::int64_t wild_int(std::mt19937_64& rng) {
  static const std::int64_t kValues[] = {-1,
                                         0,
                                         1,
                                         2,
                                         3,
                                         4,
                                         5,
                                         7,
                                         64,
                                         1 << 20,
                                         std::int64_t{1} << 40,
                                         std::numeric_limits<std::int64_t>::max(),
                                         std::numeric_limits<std::int64_t>::min()};
  return kValues[rng() % std::size(kValues)];
}

Shape wild_shape(std::mt19937_64& rng, const Shape& like) {
  Shape s = like;
  switch (rng() % 4) {
    case 0:
      if (!s.empty()) s[rng() % s.size()] = rng() % 5;
      break;
    case 1: s.push_back(1 + rng() % 3); break;
    case 2:
      if (!s.empty()) s.pop_back();
      break;
    default:
      s.clear();
      for (std::uint64_t i = 0, r = rng() % 5; i < r; ++i) s.push_back(rng() % 5);
      break;
  }
  return s;
}

// KILN_REFERENCE_FUZZ_TRIALS=N (default 60 per kind and dtype) runs a longer campaign by hand.
TEST(ReferenceExecutorFuzzTest, MutatedOperationsNeverCrash) {
  const char* env = std::getenv("KILN_REFERENCE_FUZZ_TRIALS");
  const int trials = env != nullptr ? std::max(1, std::atoi(env)) : 60;
  const char* seed_env = std::getenv("KILN_REFERENCE_FUZZ_SEED");
  std::mt19937_64 rng(seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10) : 20240611);
  const DType fuzz_dtypes[] = {dtypes::f32, dtypes::f16, dtypes::i32, dtypes::u8, dtypes::boolean};
  int executed = 0, failed = 0;
  for (int i = 0; i < kNumOpKinds; ++i) {
    const auto k = static_cast<K>(i);
    for (DType t : fuzz_dtypes) {
      Device d;
      std::optional<Result<Operation>> base = sample(d, k, t);
      if (!base || !base->ok()) continue;
      for (int trial = 0; trial < trials; ++trial) {
        Operation op = base->value();
        for (TensorIr& in : op.inputs()) in.status = TensorStatus::ReadOnly;  // keep inputs for the next trial
        if (op.kind == K::Drop_Drop) continue;
        const int mutations = 1 + static_cast<int>(rng() % 2);
        for (int m = 0; m < mutations; ++m) {
          switch (rng() % 8) {
            case 7:
              if (op.num_inputs > 0) {  // same shape and dtype, extreme values (indices out of range...)
                TensorIr& in = op.inputs()[rng() % op.num_inputs];
                if (in.dtype.is_quantized()) break;  // no element codec: only Quantize makes one
                std::vector<std::int64_t> vals(static_cast<std::size_t>(num_elements(in.shape)));
                for (auto& v : vals) v = rng() % 4 == 0 ? wild_int(rng) : static_cast<std::int64_t>(rng() % 5);
                in = d.i64(in.shape, in.dtype, vals);
              }
              break;
            case 0:
              if (!op.attrs.empty()) op.attrs[rng() % op.attrs.size()] = wild_int(rng);
              break;
            case 1:
              if (!op.outputs().empty()) {
                TensorIr& out = op.outputs()[rng() % op.outputs().size()];
                out.shape = wild_shape(rng, out.shape);
              }
              break;
            case 2:
              if (!op.outputs().empty()) op.outputs()[rng() % op.outputs().size()].dtype = kAllDtypes[rng() % 15];
              break;
            case 3:
            case 4:
              if (op.num_inputs > 0) {  // a new input tensor with a consistent handle
                TensorIr& in = op.inputs()[rng() % op.num_inputs];
                if (in.dtype.is_quantized()) break;
                const DType nt = rng() % 3 == 0 ? kAllDtypes[rng() % 15] : in.dtype;
                const Shape ns = wild_shape(rng, in.shape);
                std::vector<std::int64_t> vals(static_cast<std::size_t>(num_elements(ns)));
                for (auto& v : vals) v = static_cast<std::int64_t>(rng() % 7) - 2;
                in = d.i64(ns, nt, vals);
              }
              break;
            case 5:
              if (!op.scalars.empty()) {
                ScalarIr& s = op.scalars[rng() % op.scalars.size()];
                switch (rng() % 4) {
                  case 0: s = ScalarIr::Float(rng() % 2 ? kNaN : -kInf); break;
                  case 1: s = ScalarIr::Int(wild_int(rng)); break;
                  case 2: s = ScalarIr::UInt(~std::uint64_t{0}); break;
                  default: s = ScalarIr::Bool(true); break;
                }
              }
              break;
            default:
              if (!op.ranges.empty()) {
                Slice& r = op.ranges[rng() % op.ranges.size()];
                r.start = wild_int(rng);
                r.end = rng() % 3 == 0 ? std::nullopt : std::optional<std::int64_t>(wild_int(rng));
                r.step = wild_int(rng);
              }
              break;
          }
        }
        for (TensorIr& out : op.outputs()) out.id = d.fresh();
        if (!op.validate().ok()) continue;
        Status st = d.exec.execute(op, d.handles);
        ++executed;
        if (!st.ok()) ++failed;
        for (const TensorIr& out : op.outputs()) {
          const auto* e = d.handles.entry(out.id);
          ASSERT_NE(e, nullptr) << op.to_string();
          EXPECT_EQ(e->is_errored(), !st.ok()) << op.to_string();
          if (st.ok()) {
            EXPECT_EQ(d.handles.get_handle_ref(out.id)->shape(), out.shape);
            EXPECT_EQ(d.handles.get_handle_ref(out.id)->dtype(), out.dtype);
          }
        }
      }
    }
  }
  std::printf("fuzz: %d executed, %d failed cleanly\n", executed, failed);
  EXPECT_GT(executed, 5000);
  EXPECT_GT(failed, 1000);
  EXPECT_LT(failed, executed);
}

}  // namespace
}  // namespace kiln::reference::testing

// The CUDA backend on a GPU: transfers, fused programs of every kind against the reference
// executor (random elementwise programs with broadcasting, reductions, softmax, matmul), kernel
// faults (error model, quarantine), streams and caches. Every test but the first skips, with the
// probe's reason, on a machine without a GPU.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <random>

#include "kiln/cuda/backend.h"
#include "kiln/fusion/fusers.h"
#include "kiln/fusion/plan_store.h"
#include "kiln/fusion/stream.h"
#include "kiln/ir/builders.h"
#include "kiln/reference/memory.h"
#include "kiln/reference/reference_executor.h"
#include "kiln/reference/tensor.h"
#include "kiln/testing/status.h"

namespace kiln::cuda {
namespace {

using ir::DType;
using ir::Family;
using ir::Operation;
using ir::OpKind;
using ir::ScalarIr;
using ir::Shape;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;
namespace dt = ir::dtypes;
namespace b = ir::build;

#define KILN_REQUIRE_GPU()                                                             \
  do {                                                                                 \
    const ProbeResult kiln_probe = probe();                                            \
    if (!kiln_probe.available()) GTEST_SKIP() << "needs a GPU: " << kiln_probe.reason; \
  } while (0)

TEST(CudaBackend, CreateReportsWhyThereIsNoGpu) {
  const ProbeResult p = probe();
  Result<std::unique_ptr<CudaBackend>> be = CudaBackend::create();
  if (p.available()) {
    ASSERT_TRUE(be.ok()) << be.error().message;
    EXPECT_EQ((*be)->name(), "cuda");
  } else {
    ASSERT_FALSE(be.ok());
    EXPECT_EQ(be.error().code, ErrorCode::Unsupported);
    EXPECT_NE(be.error().message.find(p.reason), std::string::npos) << be.error().message;
  }
}

TensorIr use(TensorIr t, TensorStatus s) {
  t.status = s;
  return t;
}

// Both sides of a differential run: the GPU (fusion stream + CudaBackend executor) and the
// reference executor op by op on the host.
struct Sides {
  std::filesystem::path cache =
      std::filesystem::temp_directory_path() / ("kiln-gpu-test-" + std::to_string(::getpid()));
  std::unique_ptr<CudaBackend> owned;
  CudaBackend* gpu = nullptr;
  std::unique_ptr<fusion::Executor> exec;
  fusion::FusionLog log;
  fusion::ExecutionPlanStore store;
  std::unique_ptr<fusion::FusionStream> stream;
  reference::HostAllocator alloc;
  reference::ReferenceExecutor ref{alloc};
  ir::HandleContainer<reference::HostTensor> host;
  std::vector<Operation> ops;
  std::uint64_t next = 1;
  const std::uint64_t first = next;

  // A fresh backend, or (shared != nullptr) a stream of an existing one: ids start at
  // `first_id` so that programs sharing a backend never collide.
  explicit Sides(CudaBackend* shared = nullptr, std::uint64_t first_id = 1) : next(first_id) {
    if (shared == nullptr) {
      Result<std::unique_ptr<CudaBackend>> be = CudaBackend::create({.cache_dir = cache});
      EXPECT_TRUE(be.ok()) << (be.ok() ? "" : be.error().message);
      if (!be.ok()) return;
      owned = std::move(be).value();
      gpu = owned.get();
    } else {
      gpu = shared;
    }
    exec = gpu->make_executor();
    stream = std::make_unique<fusion::FusionStream>(gpu->fusers(log, fusion::FuserOptions{}),
                                                    fusion::ProcessorOptions{}, log);
  }
  ~Sides() {
    if (gpu != nullptr && owned == nullptr) {
      // Release this program's tensors from the shared backend.
      for (std::uint64_t i = first; i < next; ++i)
        gpu->free(TensorIr{TensorId{i}, {}, TensorStatus::ReadWrite, dt::f32});
    }
    exec.reset();
    owned.reset();
    std::error_code ec;
    std::filesystem::remove_all(cache, ec);
  }
  TensorId id() { return TensorId{next++}; }
  TensorIr input(const Shape& s, DType d, std::mt19937_64& rng, double lo = -2, double hi = 2) {
    const TensorIr t{id(), s, TensorStatus::ReadOnly, d};
    std::uniform_real_distribution<double> u(lo, hi);
    std::vector<double> v(ir::num_elements(s));
    for (double& x : v) x = d.is_float() ? u(rng) : std::floor(u(rng));
    Result<reference::HostTensor> h = reference::HostTensor::from_f64(alloc, s, d, v);
    KILN_EXPECT_OK(h);
    KILN_EXPECT_OK(gpu->upload(t.id, d, s, h->bytes()));
    host.register_handle(t.id, std::move(h).value());
    return t;
  }
  TensorIr add(Result<Operation> r) {
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    Operation op = std::move(r).value();
    TensorIr o = op.outputs()[0];
    o.status = TensorStatus::ReadOnly;
    ops.push_back(op);
    (void)ref.execute(op, host);
    stream->register_op(std::move(op), store, *exec);
    return o;
  }
  void sync() { stream->drain(store, *exec); }
  // Compares one tensor: values within rel * |ref| + abs, NaN and infinities at the same places,
  // or the same error.
  void expect_close(const TensorIr& t, double rel, double abs) {
    sync();
    const reference::HostTensor* want = host.get_handle_ref(t.id);
    Result<runtime::HostData> got = gpu->download(t);
    if (want == nullptr) {
      EXPECT_FALSE(got.ok()) << t.to_string() << ": the reference errored, the GPU did not";
      return;
    }
    ASSERT_TRUE(got.ok()) << t.to_string() << ": " << got.error().message;
    ASSERT_EQ(got->bytes.size(), want->bytes().size());
    for (std::uint64_t i = 0; i < want->num_elements(); ++i) {
      const double w = want->get_f64(i);
      const double g = reference::element::load_f64(got->bytes.data(), got->dtype, i);
      if (std::isnan(w) || std::isinf(w)) {
        ASSERT_EQ(std::isnan(g), std::isnan(w)) << t.to_string() << " element " << i;
        if (std::isinf(w)) {
          ASSERT_EQ(g, w) << t.to_string() << " element " << i;
        }
        continue;
      }
      ASSERT_LE(std::fabs(g - w), abs + rel * std::fabs(w))
          << t.to_string() << " element " << i << ": " << g << " vs " << w;
    }
  }
};

TEST(CudaBackend, UploadDownloadRoundTrip) {
  KILN_REQUIRE_GPU();
  Sides s;
  ASSERT_TRUE(s.gpu);
  std::mt19937_64 rng(1);
  for (DType d : {dt::f32, dt::f64, dt::f16, dt::bf16, dt::i64, dt::i32, dt::u8, dt::boolean}) {
    const TensorIr t = s.input({3, 1000}, d, rng);
    Result<runtime::HostData> h = s.gpu->download(t);
    ASSERT_TRUE(h.ok()) << h.error().message;
    const reference::HostTensor* want = s.host.get_handle_ref(t.id);
    ASSERT_EQ(h->bytes.size(), want->bytes().size());
    EXPECT_EQ(0, std::memcmp(h->bytes.data(), want->bytes().data(), h->bytes.size())) << d.name();
  }
  // 80 MiB: several staging chunks.
  const TensorIr big = s.input({20u << 20}, dt::f32, rng);
  Result<runtime::HostData> h = s.gpu->download(big);
  KILN_ASSERT_OK(h);
  EXPECT_EQ(0, std::memcmp(h->bytes.data(), s.host.get_handle_ref(big.id)->bytes().data(), h->bytes.size()));
  EXPECT_GT(s.gpu->memory_stats().bytes_in_use, 80u << 20);
}

// Random elementwise programs with broadcasting, scalars, comparisons, masks, exp and log.
// check.sh runs them again with KILN_CUDA_FAST_MATH=1 (approximate f32 exp/log).
TEST(CudaBackend, RandomElementwiseProgramsMatchTheReference) {
  KILN_REQUIRE_GPU();
  // Every program is a new structure, so a new NVRTC compilation (~0.1-0.3 s): 100 by default,
  // bench/gpu/check.sh runs more.
  const char* env = std::getenv("KILN_DIFF_PROGRAMS");
  const int programs = env ? std::atoi(env) : 100;
  Result<std::unique_ptr<CudaBackend>> shared = CudaBackend::create({.disk_cache = false});
  ASSERT_TRUE(shared.ok()) << shared.error().message;
  for (int prog = 0; prog < programs; ++prog) {
    Sides s(shared->get(), static_cast<std::uint64_t>(prog) * 1000000 + 1);
    ASSERT_TRUE(s.gpu);
    std::mt19937_64 rng(static_cast<std::uint64_t>(prog) * 7919 + 1);
    const DType d = (prog % 4 == 3) ? dt::f16 : (prog % 5 == 4 ? dt::f64 : dt::f32);
    const std::uint64_t rows = 1 + rng() % 300, cols = 1 + rng() % 257;
    const Shape full{rows, cols};
    const Shape shapes[] = {full, {rows, 1}, {1, cols}, {1, 1}};
    std::vector<TensorIr> live;
    for (int i = 0; i < 3; ++i) live.push_back(s.input(shapes[rng() % 4], d, rng));
    live.push_back(s.input(full, d, rng));
    const Family nf = Family::NumericFloat;
    const int len = 2 + static_cast<int>(rng() % 10);
    for (int k = 0; k < len; ++k) {
      const TensorIr x = live[rng() % live.size()], y = live[rng() % live.size()];
      TensorIr out;
      switch (rng() % 10) {
        case 0: out = s.add(b::binary(nf, OpKind::Numeric_Add, x, y, s.id())); break;
        case 1: out = s.add(b::binary(nf, OpKind::Numeric_Mul, x, y, s.id())); break;
        case 2: out = s.add(b::binary(nf, OpKind::Numeric_Sub, x, y, s.id())); break;
        case 3: out = s.add(b::scalar(nf, OpKind::Numeric_MulScalar, x, ScalarIr::Float(0.75), s.id())); break;
        case 4: out = s.add(b::unary(Family::Float, OpKind::Float_Tanh, x, s.id())); break;
        case 5: {
          const TensorIr a = s.add(b::unary(nf, OpKind::Numeric_Abs, x, s.id()));
          out = s.add(b::unary(Family::Float, OpKind::Float_Sqrt, a, s.id()));
          break;
        }
        case 6: {
          const TensorIr m = s.add(b::binary_comparison(nf, OpKind::Numeric_Greater, x, y, dt::boolean, s.id()));
          out = s.add(b::mask_where(Family::BaseFloat, OpKind::Base_MaskWhere, x, m, y, s.id()));
          break;
        }
        case 7:
          out = s.add(b::clamp(nf, OpKind::Numeric_Clamp, x, ScalarIr::Float(-1), ScalarIr::Float(1.5), s.id()));
          break;
        case 8: {
          const TensorIr a = s.add(b::unary(nf, OpKind::Numeric_Abs, x, s.id()));
          const TensorIr a1 = s.add(b::scalar(nf, OpKind::Numeric_AddScalar, a, ScalarIr::Float(0.5), s.id()));
          out = s.add(b::unary(Family::Float, OpKind::Float_Log, a1, s.id()));
          break;
        }
        default: {
          const TensorIr e =
              s.add(b::clamp(nf, OpKind::Numeric_Clamp, x, ScalarIr::Float(-4), ScalarIr::Float(4), s.id()));
          out = s.add(b::unary(Family::Float, OpKind::Float_Exp, e, s.id()));
          break;
        }
      }
      live.push_back(out);
    }
    // f32: CUDA's expf / tanhf are within 2 ulp, a dozen ops compound to ~1e-5; f16: f32 compute
    // rounded per op can differ from the reference's f64 by an f16 ulp (1e-3) per op.
    const double rel = d == dt::f16 ? 2e-2 : (d == dt::f64 ? 1e-12 : 2e-5);
    for (std::size_t i = 4; i < live.size(); ++i) {
      s.expect_close(live[i], rel, rel);
      if (::testing::Test::HasFailure()) {
        for (const Operation& op : s.ops) std::printf("  %s\n", op.to_string().c_str());
        FAIL() << "program " << prog << " (KILN_DIFF_PROGRAMS=" << prog + 1 << " replays up to it)";
      }
    }
  }
}

TEST(CudaBackend, FusedW1UsesTheVectorKernelAndTheCacheAcrossSizes) {
  KILN_REQUIRE_GPU();
  Sides s;
  ASSERT_TRUE(s.gpu);
  std::mt19937_64 rng(3);
  const Family nf = Family::NumericFloat;
  for (std::uint64_t n : {std::uint64_t{4096}, std::uint64_t{1} << 20, std::uint64_t{1000003}}) {
    const TensorIr a = s.input({n}, dt::f32, rng), bb = s.input({n}, dt::f32, rng), c = s.input({n}, dt::f32, rng);
    const TensorIr t1 = s.add(b::binary(nf, OpKind::Numeric_Mul, a, bb, s.id()));
    const TensorIr t2 = s.add(b::scalar(nf, OpKind::Numeric_MulScalar, c, ScalarIr::Float(2), s.id()));
    const TensorIr t3 = s.add(
        b::binary(nf, OpKind::Numeric_Add, use(t1, TensorStatus::ReadWrite), use(t2, TensorStatus::ReadWrite), s.id()));
    const TensorIr y = s.add(b::unary(Family::Float, OpKind::Float_Exp, use(t3, TensorStatus::ReadWrite), s.id()));
    // NVRTC contracts a * b + t into one FMA (rounded once, where the reference rounds twice):
    // the exponent's argument (|a b + 2c| <= 8) may differ by an ulp, 5e-7 relative after exp.
    s.expect_close(y, 2e-6, 0);
  }
  const CudaStats st = s.gpu->stats();
  EXPECT_GE(st.fused_launches, 3u);
  EXPECT_GE(st.vector_launches, 2u);
  EXPECT_GE(st.kernel_cache_hits, 2u);
  EXPECT_EQ(st.fused_replays, 0u);
}

// [rows, 1] and [1, cols] broadcasts along rows of a multiple of the vector width take the
// row-vector kernel; a row length that is not a multiple takes the strided one; both match.
TEST(CudaBackend, RowBroadcastsTakeTheRowVectorPath) {
  KILN_REQUIRE_GPU();
  Sides s;
  ASSERT_TRUE(s.gpu);
  std::mt19937_64 rng(11);
  const Family nf = Family::NumericFloat;
  for (DType d : {dt::f32, dt::f16}) {
    for (std::uint64_t cols : {std::uint64_t{1024}, std::uint64_t{1022}}) {
      const CudaStats before = s.gpu->stats();
      const TensorIr x = s.input({48, cols}, d, rng), m = s.input({48, 1}, d, rng), bias = s.input({1, cols}, d, rng);
      const TensorIr t = s.add(b::binary(nf, OpKind::Numeric_Sub, x, m, s.id()));
      const TensorIr e = s.add(b::unary(Family::Float, OpKind::Float_Exp, use(t, TensorStatus::ReadWrite), s.id()));
      const TensorIr y = s.add(b::binary(nf, OpKind::Numeric_Add, use(e, TensorStatus::ReadWrite), bias, s.id()));
      const double tol = d == dt::f16 ? 4e-3 : 2e-6;
      s.expect_close(y, tol, tol);
      const CudaStats after = s.gpu->stats();
      // V = 4 floats or 8 halves: 1022 is a multiple of neither.
      if (cols == 1024) {
        EXPECT_GE(after.row_vector_launches - before.row_vector_launches, 1u) << d.name();
      } else {
        EXPECT_EQ(after.row_vector_launches, before.row_vector_launches) << d.name();
      }
      EXPECT_EQ(after.fused_replays, before.fused_replays);
    }
  }
}

// Softmax over the last axis of a [rows, n] tensor, op by op (the row fuser's Row program).
TensorIr softmax_rows(Sides& s, const TensorIr& x) {
  const Family nf = Family::NumericFloat;
  const TensorIr mx = s.add(b::reduce_dim(nf, OpKind::Numeric_MaxDim, x, 1, 1, s.id()));
  const TensorIr sh = s.add(
      b::binary(nf, OpKind::Numeric_Sub, use(x, TensorStatus::ReadWrite), use(mx, TensorStatus::ReadWrite), s.id()));
  const TensorIr ex = s.add(b::unary(Family::Float, OpKind::Float_Exp, use(sh, TensorStatus::ReadWrite), s.id()));
  const TensorIr sm = s.add(b::reduce_dim(nf, OpKind::Numeric_SumDim, ex, 1, 1, s.id()));
  return s.add(
      b::binary(nf, OpKind::Numeric_Div, use(ex, TensorStatus::ReadWrite), use(sm, TensorStatus::ReadWrite), s.id()));
}

// Layer norm over the last axis of a [rows, n] tensor with a [1, n] weight, op by op.
TensorIr layer_norm_rows(Sides& s, const TensorIr& x, const TensorIr& w) {
  const Family nf = Family::NumericFloat;
  const TensorIr mean = s.add(b::reduce_dim(nf, OpKind::Numeric_MeanDim, x, 1, 1, s.id()));
  const TensorIr xc = s.add(
      b::binary(nf, OpKind::Numeric_Sub, use(x, TensorStatus::ReadWrite), use(mean, TensorStatus::ReadWrite), s.id()));
  const TensorIr sq = s.add(b::binary(nf, OpKind::Numeric_Mul, xc, xc, s.id()));
  const TensorIr var =
      s.add(b::reduce_dim(nf, OpKind::Numeric_MeanDim, use(sq, TensorStatus::ReadWrite), 1, 1, s.id()));
  const TensorIr ve =
      s.add(b::scalar(nf, OpKind::Numeric_AddScalar, use(var, TensorStatus::ReadWrite), ScalarIr::Float(1e-5), s.id()));
  const TensorIr sd = s.add(b::unary(Family::Float, OpKind::Float_Sqrt, use(ve, TensorStatus::ReadWrite), s.id()));
  const TensorIr y = s.add(
      b::binary(nf, OpKind::Numeric_Div, use(xc, TensorStatus::ReadWrite), use(sd, TensorStatus::ReadWrite), s.id()));
  return s.add(b::binary(nf, OpKind::Numeric_Mul, use(y, TensorStatus::ReadWrite), w, s.id()));
}

TEST(CudaBackend, ReductionsSoftmaxAndMatmulMatchTheReference) {
  KILN_REQUIRE_GPU();
  Sides s;
  ASSERT_TRUE(s.gpu);
  std::mt19937_64 rng(5);
  const Family nf = Family::NumericFloat;
  // softmax over the last axis
  s.expect_close(softmax_rows(s, s.input({64, 1024}, dt::f32, rng)), 1e-5, 1e-9);
  // reductions over a middle axis (the cols kernel), every kind
  const TensorIr z = s.input({8, 100, 33}, dt::f32, rng);
  for (OpKind k : {OpKind::Numeric_SumDim, OpKind::Numeric_MeanDim, OpKind::Numeric_MaxDim, OpKind::Numeric_MinDim,
                   OpKind::Numeric_MaxAbsDim})
    s.expect_close(s.add(b::reduce_dim(nf, k, z, 1, 1, s.id())), 1e-5, 1e-6);
  s.expect_close(s.add(b::reduce_dim_arg(nf, OpKind::Numeric_ArgMax, z, 2, 1, dt::i64, s.id())), 0, 0);
  s.expect_close(s.add(b::reduce(nf, OpKind::Numeric_Sum, z, s.id())), 1e-5, 1e-4);
  // matmul with a bias epilogue, batch broadcast
  const TensorIr a = s.input({3, 70, 130}, dt::f32, rng), w = s.input({1, 130, 90}, dt::f32, rng),
                 bias = s.input({1, 1, 90}, dt::f32, rng);
  const TensorIr mm = s.add(b::matmul(Family::Float, OpKind::Float_Matmul, a, w, s.id()));
  const TensorIr out = s.add(b::binary(nf, OpKind::Numeric_Add, use(mm, TensorStatus::ReadWrite), bias, s.id()));
  s.expect_close(out, 1e-4, 1e-4);
  EXPECT_EQ(s.gpu->stats().compile_failures, 0u);
}

// Row reductions (warp shuffles): rows shorter than a warp, more rows than the grid has blocks
// (each block then reduces several rows, reusing its shared exchange), and arg ties (integer
// values in [-2, 2): the first index of the best value wins, whatever the combination order).
TEST(CudaBackend, RowReductionsOfShortRowsAndMoreRowsThanBlocks) {
  KILN_REQUIRE_GPU();
  Sides s;
  ASSERT_TRUE(s.gpu);
  std::mt19937_64 rng(13);
  const Family nf = Family::NumericFloat;
  for (std::uint64_t n : {std::uint64_t{1}, std::uint64_t{7}, std::uint64_t{33}, std::uint64_t{300}}) {
    const TensorIr x = s.input({20000, n}, dt::f32, rng);
    const TensorIr ties = s.input({20000, n}, dt::i32, rng);
    s.expect_close(s.add(b::reduce_dim(nf, OpKind::Numeric_SumDim, x, 1, 1, s.id())), 1e-5, 1e-5);
    s.expect_close(s.add(b::reduce_dim(nf, OpKind::Numeric_MaxDim, x, 1, 1, s.id())), 0, 0);
    s.expect_close(s.add(b::reduce_dim_arg(Family::NumericInt, OpKind::Numeric_ArgMax, ties, 1, 1, dt::i64, s.id())), 0,
                   0);
    s.expect_close(s.add(b::reduce_dim_arg(Family::NumericInt, OpKind::Numeric_ArgMin, ties, 1, 1, dt::i64, s.id())), 0,
                   0);
  }
  EXPECT_EQ(s.gpu->stats().host_ops, 0u);
}

// Row programs (the row fuser's softmax, layer norm) run as one kernel, a warp per row up to
// kWarpRowLength and a thread block per row beyond: rows of one element, rows longer than a
// block, more rows than the grid has blocks (or warps), every float dtype, and the extreme rows of online softmax's
// numerics (+-inf, NaN, -1e38) against the reference.
TEST(CudaBackend, RowProgramsRunAsOneKernel) {
  KILN_REQUIRE_GPU();
  Sides s;
  ASSERT_TRUE(s.gpu);
  std::mt19937_64 rng(17);
  const Family nf = Family::NumericFloat;
  for (DType d : {dt::f32, dt::f16, dt::bf16, dt::f64}) {
    const double rel = d == dt::f16 ? 2e-3 : d == dt::bf16 ? 1.6e-2 : 1e-5;
    for (std::uint64_t n :
         {std::uint64_t{1}, std::uint64_t{37}, std::uint64_t{1000}, std::uint64_t{1025}, std::uint64_t{5000}}) {
      const std::uint64_t rows = n >= 1000 ? 300 : 20000;
      const CudaStats before = s.gpu->stats();
      s.expect_close(softmax_rows(s, s.input({rows, n}, d, rng)), rel, 1e-6);
      const TensorIr w = s.input({1, n}, d, rng);
      s.expect_close(layer_norm_rows(s, s.input({rows, n}, d, rng), w), rel * 4, rel);
      if (n > 1) {  // rows of one element: whatever the search makes of them, the values above
        const CudaStats after = s.gpu->stats();
        EXPECT_EQ(after.row_kernel_launches - before.row_kernel_launches, 2u) << d.name() << " n=" << n;
        EXPECT_EQ(after.row_warp_kernel_launches - before.row_warp_kernel_launches, n <= 1024 ? 2u : 0u)
            << "a warp per row up to kWarpRowLength";
      }
    }
  }
  // Softmax's exp(x - max) lives in the row's shared memory when it fits (f32 rows of 1000: 8
  // warps' windows of 4000 bytes), and in global memory when it does not (f64 rows of 1000).
  EXPECT_GT(s.gpu->stats().row_window_launches, 0u);
  EXPECT_LT(s.gpu->stats().row_window_launches, s.gpu->stats().row_kernel_launches);
  {  // x read whole by several stages (a window) and through its transpose (never the window)
    const TensorIr x = s.input({6, 40, 40}, dt::f32, rng);
    const TensorIr mx = s.add(b::reduce_dim(nf, OpKind::Numeric_MaxDim, x, 2, 1, s.id()));
    const TensorIr sh = s.add(b::binary(nf, OpKind::Numeric_Sub, x, use(mx, TensorStatus::ReadWrite), s.id()));
    const TensorIr ex = s.add(b::unary(Family::Float, OpKind::Float_Exp, sh, s.id()));
    const TensorIr sm =
        s.add(b::reduce_dim(nf, OpKind::Numeric_SumDim, use(ex, TensorStatus::ReadWrite), 2, 1, s.id()));
    const TensorIr ls = s.add(b::unary(Family::Float, OpKind::Float_Log, use(sm, TensorStatus::ReadWrite), s.id()));
    const TensorIr lp = s.add(
        b::binary(nf, OpKind::Numeric_Sub, use(sh, TensorStatus::ReadWrite), use(ls, TensorStatus::ReadWrite), s.id()));
    const TensorIr z = s.add(b::binary(nf, OpKind::Numeric_Add, use(lp, TensorStatus::ReadWrite), x, s.id()));
    const TensorIr xt =
        s.add(b::swap_dims(Family::BaseFloat, OpKind::Base_SwapDims, use(x, TensorStatus::ReadWrite), 1, 2, s.id()));
    s.expect_close(s.add(b::binary(nf, OpKind::Numeric_Add, use(z, TensorStatus::ReadWrite),
                                   use(xt, TensorStatus::ReadWrite), s.id())),
                   1e-5, 1e-6);
  }
  // Extreme rows (f32): one +inf, all -inf, a NaN, -1e38 everywhere, and an ordinary row.
  const std::uint64_t n = 300;
  std::vector<double> v(5 * n, 0.5);
  v[3] = INFINITY;
  for (std::uint64_t j = 0; j < n; ++j) v[n + j] = -INFINITY;
  v[2 * n + 7] = NAN;
  for (std::uint64_t j = 0; j < n; ++j) v[3 * n + j] = -1e38;
  for (std::uint64_t j = 0; j < n; ++j) v[4 * n + j] = static_cast<double>(j % 17) - 8;
  const TensorIr x{s.id(), {5, n}, TensorStatus::ReadOnly, dt::f32};
  Result<reference::HostTensor> h = reference::HostTensor::from_f64(s.alloc, x.shape, x.dtype, v);
  KILN_ASSERT_OK(h);
  KILN_ASSERT_OK(s.gpu->upload(x.id, x.dtype, x.shape, h->bytes()));
  s.host.register_handle(x.id, std::move(h).value());
  s.expect_close(softmax_rows(s, x), 1e-5, 1e-9);
  EXPECT_EQ(s.gpu->stats().compile_failures, 0u);
  EXPECT_EQ(s.gpu->stats().host_ops, 0u);
}

// Integer division by zero inside a fused program: the outputs carry exactly the reference's
// error, the program is quarantined, and its next run goes unfused without faulting again.
TEST(CudaBackend, KernelFaultsFollowTheErrorModelAndQuarantine) {
  KILN_REQUIRE_GPU();
  Sides s;
  ASSERT_TRUE(s.gpu);
  std::mt19937_64 rng(7);
  for (int run = 0; run < 2; ++run) {
    const TensorIr a = s.input({64, 8}, dt::i32, rng, 1, 100);
    const TensorIr z = s.input({1, 8}, dt::i32, rng, 0, 1);  // zeros: floor(U[0,1))
    const TensorIr q = s.add(b::binary(Family::NumericInt, OpKind::Numeric_Div, a, z, s.id()));
    const TensorIr r = s.add(b::scalar(Family::NumericInt, OpKind::Numeric_AddScalar, use(q, TensorStatus::ReadWrite),
                                       ScalarIr::Int(1), s.id()));
    s.sync();
    EXPECT_FALSE(s.gpu->is_materialized(r.id));
    ASSERT_TRUE(s.gpu->error_of(r.id).has_value());
    EXPECT_EQ(s.gpu->error_of(r.id)->depth, 1u) << "one op skipped after the division";
    EXPECT_EQ(s.host.error_of(r.id)->depth, 1u);
  }
  // Run 1: the fused program faults (quarantined), then its lone division faults too and runs
  // on the host reference. Run 2: the plan goes unfused at once; the division faults again.
  const CudaStats st = s.gpu->stats();
  EXPECT_EQ(st.faults, 3u);
  EXPECT_EQ(st.quarantined, 1u);
  EXPECT_EQ(st.fused_replays, 2u);
  EXPECT_EQ(st.fallbacks_by_reason[static_cast<std::size_t>(runtime::FallbackReason::Fault)], 1u);
  EXPECT_EQ(st.fallbacks_by_reason[static_cast<std::size_t>(runtime::FallbackReason::Quarantined)], 1u);
}

TEST(CudaBackend, TwoStreamsShareTensorsThroughEvents) {
  KILN_REQUIRE_GPU();
  Sides s;
  ASSERT_TRUE(s.gpu);
  std::mt19937_64 rng(9);
  std::unique_ptr<fusion::Executor> other = s.gpu->make_executor();
  fusion::FusionStream second(s.gpu->fusers(s.log, fusion::FuserOptions{}), fusion::ProcessorOptions{}, s.log);
  const TensorIr x = s.input({1 << 20}, dt::f32, rng);
  const TensorIr y = s.add(b::unary(Family::Float, OpKind::Float_Exp, x, s.id()));
  s.sync();  // y is produced (queued) on the first stream
  Operation op = b::scalar(Family::NumericFloat, OpKind::Numeric_MulScalar, y, ScalarIr::Float(3), s.id()).value();
  const TensorIr z = op.outputs()[0];
  (void)s.ref.execute(op, s.host);
  second.register_op(std::move(op), s.store, *other);
  second.drain(s.store, *other);
  s.expect_close(use(z, TensorStatus::ReadOnly), 3e-7, 0);
  EXPECT_GE(s.gpu->stats().cross_stream_waits, 1u);
}

TEST(CudaBackend, CompiledKernelsComeBackFromTheDiskCache) {
  KILN_REQUIRE_GPU();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kiln-disk-" + std::to_string(::getpid()));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  for (int round = 0; round < 2; ++round) {
    Result<std::unique_ptr<CudaBackend>> be = CudaBackend::create({.cache_dir = dir});
    KILN_ASSERT_OK(be);
    std::unique_ptr<fusion::Executor> exec = (*be)->make_executor();
    const std::vector<float> v(1000, 1.5f);
    ASSERT_TRUE((*be)->upload(TensorId{1}, dt::f32, {1000}, std::as_bytes(std::span(v))).ok());
    exec->execute_operation(b::unary(Family::Float, OpKind::Float_Exp,
                                     TensorIr{TensorId{1}, {1000}, TensorStatus::ReadOnly, dt::f32}, TensorId{2})
                                .value());
    Result<runtime::HostData> h = (*be)->download(TensorIr{TensorId{2}, {1000}, TensorStatus::ReadOnly, dt::f32});
    KILN_ASSERT_OK(h);
    float f;
    std::memcpy(&f, h->bytes.data(), 4);
    EXPECT_NEAR(f, std::exp(1.5f), 1e-6);
    EXPECT_EQ((*be)->stats().disk_cache_hits, round == 0 ? 0u : 1u);
  }
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace kiln::cuda

// The CPU backend's executor runs every op kind of the table (ir/include/kiln/ir/op_table.def) on
// every dtype the kind admits: the samples the reference executor's every-kind test runs
// (tests/reference/op_samples.h), each run once by the reference executor and once by a
// CpuExecutor (its fast kernels, or the stream's reference executor it falls back to), with the
// same inputs and the same random seed; the outputs must agree in shape, dtype and values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <set>
#include <string>

#include "../reference/op_samples.h"
#include "kiln/cpu/cpu_executor.h"
#include "kiln/cpu/device.h"
#include "kiln/testing/status.h"

namespace kiln::cpu {
namespace {

namespace rt = reference::testing;

std::string what(const ir::Operation& op) { return op.to_string(); }

// The CpuExecutor's output `out` against the reference's: float dtypes within 1e-2 relative (the
// fast kernels' approximations, one ulp of f16 / bf16), other dtypes exactly. Empty's contents
// are unspecified and a QFloat tensor has no element codec: shape and dtype only.
void expect_output(const ir::Operation& op, const ir::TensorIr& out, rt::Device& want, rt::Device& got) {
  const HostTensor* h = got.handles.get_handle_ref(out.id);
  ASSERT_NE(h, nullptr) << what(op);
  EXPECT_EQ(h->shape(), out.shape) << what(op);
  EXPECT_EQ(h->dtype(), out.dtype) << what(op);
  if (op.kind == ir::OpKind::Base_Empty || out.dtype.is_quantized()) return;
  const std::vector<double> ref = want.f64_of(out.id), fast = h->to_f64();
  if (out.dtype.is_float())
    EXPECT_THAT(fast, rt::Near(ref, 1e-2)) << what(op);
  else
    EXPECT_THAT(fast, rt::NanEq(ref)) << what(op);
}

TEST(CpuEveryKind, EveryOpKindRunsOnEveryDtypeItAdmitsAndAgreesWithTheReference) {
  CpuDevice cpu(CpuDeviceOptions{.threads = 2});
  std::set<int> covered;
  for (int i = 0; i < ir::kNumOpKinds; ++i) {
    const auto k = static_cast<ir::OpKind>(i);
    if (k == ir::OpKind::Custom_Custom) continue;  // no backend knows a custom op (reference test)
    for (ir::DType t : rt::samples::kAllDtypes) {
      // Declared after `cpu`: the outputs the CpuExecutor allocates die before its allocator.
      rt::Device want, got;  // the same inputs under the same ids (the samples are deterministic)
      std::optional<Result<ir::Operation>> ref_op = rt::samples::sample(want, k, t);
      if (!ref_op) continue;
      std::optional<Result<ir::Operation>> op = rt::samples::sample(got, k, t);
      ASSERT_TRUE(op && op->ok() && ref_op->ok()) << ir::op_info(k).variant << " " << t.name();
      KILN_ASSERT_OK(want.exec.execute(ref_op->value(), want.handles)) << what(ref_op->value());
      CpuExecutor exec(cpu, got.handles, got.exec);
      exec.execute_operation(op->value());
      EXPECT_FALSE(got.handles.has_errors()) << what(op->value());
      for (const ir::TensorIr& out : op->value().outputs()) expect_output(op->value(), out, want, got);
      covered.insert(i);
    }
  }
  EXPECT_EQ(covered.size(), static_cast<std::size_t>(ir::kNumOpKinds - 1)) << "every kind but Custom runs";
  const CpuDeviceStats stats = cpu.stats();
  EXPECT_GT(stats.fast_ops, 0u);       // some kinds ran on the fast kernels,
  EXPECT_GT(stats.reference_ops, 0u);  // the rest on the reference executor
}

}  // namespace
}  // namespace kiln::cpu

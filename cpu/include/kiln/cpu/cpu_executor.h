// CpuExecutor: the CPU backend's fast executor, the fusion::Executor the runtime calls for one
// stream of a CpuDevice.
//
//   execute_optimization  runs a fused program (Elementwise, Reduce, ReduceBroadcasted, Matmul,
//                         NhwcRelayout) as one compiled form, cached per structure in the
//                         device: a flat list of typed block operations over kBlock-element
//                         register arrays, vectorised loops, parallel over chunks on the
//                         device's task arena. Inputs are fetched with the program's statuses,
//                         outputs the program keeps are registered under their global ids, a
//                         consumed input's buffer is reused for an output of the same shape and
//                         dtype when nothing else holds it.
//   execute_operation     runs one operation: elementwise / scalar / unary / cast / clamp /
//                         mask / indexed ops, dim and whole-tensor reductions, float matmul and
//                         swap_dims through the same compiled forms (a one-op program), reshape
//                         without a copy; everything else on the device's ReferenceExecutor.
//   free_tensor           releases a ReadWrite occurrence's handle.
//
// Error model (docs/spec/ir.md §11.3): a fused program with an errored input, or whose kernel faults
// (integer division by zero, an index out of range, an empty reduction without identity), or
// that the fast path cannot run (an unexpected dtype, a shape that does not fit), is replayed
// op by op (ctx.operation_within_optimization) — each op then skips or fails exactly as it would
// unfused. Nothing is consumed or registered before a fused kernel succeeded, so a replay
// always starts from the state the program found.
//
// Thread-safety: one executor per stream, called by that stream's actor only; the handle
// container it works on is that caller's (the device's own one, or a private one).
//
// Usage:
//   CpuDevice device({.threads = 2});
//   CpuExecutor exec(device);
//   fusion::FusionStream stream(fusion::default_fusers(log), {}, log);
//   stream.register_op(op, plan_store, exec);   // fused or not, as the search decides
//   stream.drain(plan_store, exec);
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kiln/cpu/device.h"
#include "kiln/fusion/executor.h"
#include "kiln/fusion/fused_program.h"
#include "kiln/runtime/fallback.h"

namespace kiln::cpu {

class CpuExecutor final : public fusion::Executor {
 public:
  // An executor over the device's own handle container (one thread per device).
  explicit CpuExecutor(CpuDevice& device)
      : device_(device), handles_(device.handles()), reference_(device.reference()) {}
  // An executor over a container of the caller's (CpuBackend stages a stream's tensors in a
  // private container around every call); the device lends its allocator, compiled-kernel
  // cache, task arena and counters; `reference` runs what the fast path does not (one per
  // stream: it owns the stream's random generator).
  CpuExecutor(CpuDevice& device, CpuDevice::Handles& handles, ReferenceExecutor& reference)
      : device_(device), handles_(handles), reference_(reference) {}

  void execute_optimization(const fusion::Optimization& opt, const fusion::ExecutionContext& ctx) override;
  void execute_operation(const ir::Operation& op) override;
  void free_tensor(const ir::TensorIr& t) override;

  CpuDevice& device() { return device_; }

  // How relative ids of a program map to concrete values (the converter's maps for a fused
  // program; the executor's own tables for a one-op program).
  struct Binding {
    std::span<const ir::TensorIr> tensors;  // relative tensor id -> latest global occurrence
    std::span<const std::uint64_t> dims;    // relative dim id -> size
    std::span<const ir::ScalarIr> scalars;  // placeholder -> value
  };
  // Runs one program; the fallback (its reason and the values involved) when nothing ran and
  // the caller must replay its operations.
  std::optional<runtime::Fallback> run_program(const fusion::FusedProgram& program, const Binding& binding);

 private:
  // A fused program (or a stage), falling back to its ops [offset, offset + len).
  void execute_program(const fusion::FusedProgram& program, const fusion::ExecutionContext& ctx, std::size_t offset);
  void replay(const fusion::ExecutionContext& ctx, std::size_t offset, std::size_t len);
  // A staged program's (ReduceBroadcasted, Row) stages interleaved per group of rows; false:
  // run them apart.
  bool run_staged_rows(const fusion::FusedProgram& program, const Binding& binding);
  // The fast path of one op; false when it must run on the reference executor.
  bool execute_fast(const ir::Operation& op);
  void execute_reference(const ir::Operation& op);

  CpuDevice& device_;
  CpuDevice::Handles& handles_;
  ReferenceExecutor& reference_;
};

}  // namespace kiln::cpu

// CpuExecutor: binds fused programs to tensors, sizes and scalars, runs their compiled forms,
// and turns single operations into one-op programs for the same kernels (see cpu_executor.h).
#include <algorithm>
#include <atomic>
#include <memory>
#include <unordered_map>

#include <fmt/format.h>

#include "fast_conv.h"
#include "fast_layout.h"
#include "fast_module.h"
#include "fast_pool.h"
#include "fast_program.h"
#include "kiln/cpu/cpu_executor.h"
#include "kiln/fusion/single_op.h"
#include "kiln/fusion/trace_fuser.h"
#include "kiln/ir/builders.h"

namespace kiln::cpu {

using fusion::FusedProgram;
using fusion::ProgramKind;
using ir::OpKind;
using ir::TensorStatus;

namespace {

// A scalar converted to one element of `d` (the element codec's cast rules, from the scalar's own
// kind), read back through the class of `d`: exactly the reference executor's scalar_as.
fast::Scalar convert_scalar(const ir::ScalarIr& s, ir::DType d) {
  std::array<std::byte, 8> bytes{};
  switch (s.kind()) {
    case ir::ScalarIr::Kind::Float: element::store_f64(bytes.data(), d, 0, s.as_float()); break;
    case ir::ScalarIr::Kind::Int: element::store_i64(bytes.data(), d, 0, s.as_int()); break;
    case ir::ScalarIr::Kind::UInt: element::store_u64(bytes.data(), d, 0, s.as_uint()); break;
    case ir::ScalarIr::Kind::Bool: element::store_bool(bytes.data(), d, 0, s.as_bool()); break;
  }
  fast::Scalar out;
  if (d.is_float())
    out.f = element::load_f64(bytes.data(), d, 0);
  else if (d.is_int())
    out.i = element::load_i64(bytes.data(), d, 0);
  else if (d.is_uint())
    out.u = element::load_u64(bytes.data(), d, 0);
  else
    out.b = element::load_bool(bytes.data(), d, 0) ? 1 : 0;
  return out;
}

ir::TensorIr with_status(const ir::TensorIr& t, TensorStatus s) {
  ir::TensorIr c = t;
  c.status = s;
  return c;
}

}  // namespace

// ---- Binding, running and committing one program

namespace {

using Binding = CpuExecutor::Binding;
using Produced = std::unordered_map<std::uint64_t, HostTensor>;

struct Bound {
  const FusedProgram* program = nullptr;
  std::shared_ptr<const fast::CompiledProgram> compiled;
  fast::Launch launch;
};

const ir::TensorIr* global_of(const Binding& bind, std::uint64_t rel) {
  return rel < bind.tensors.size() ? &bind.tensors[rel] : nullptr;
}

using runtime::Fallback;
using runtime::FallbackReason;
using MaybeFallback = std::optional<Fallback>;

// Inputs from `produced` (an earlier stage of the same launch) or the handle container; views
// share their source's tensor. An errored input sends the program to the op-by-op path (each op
// skips as it would).
MaybeFallback bind_inputs(CpuDevice::Handles& handles, const FusedProgram& p, const Binding& bind,
                          const Produced* produced, fast::Launch& launch) {
  const std::size_t ni = p.inputs.size();
  launch.inputs.resize(ni);
  for (std::size_t i = 0; i < ni; ++i) {
    const fusion::ProgramInput& in = p.inputs[i];
    if (in.role == fusion::InputRole::View) continue;
    const ir::TensorIr* g = global_of(bind, in.tensor);
    if (g == nullptr) return Fallback{FallbackReason::Binding, fmt::format("input {}: no tensor bound", i)};
    const HostTensor* t = nullptr;
    if (produced != nullptr) {
      auto it = produced->find(g->id.value());
      if (it != produced->end()) t = &it->second;
    }
    if (t == nullptr) {
      if (handles.has_errors() && handles.error_of(g->id) != nullptr)
        return Fallback{FallbackReason::InputErrored, fmt::format("input {} (tensor {}) is errored", i, g->id.value())};
      t = handles.get_handle_ref(g->id);
    }
    if (t == nullptr)
      return Fallback{FallbackReason::Binding,
                      fmt::format("input {}: tensor {} not in the container", i, g->id.value())};
    if (!(t->dtype() == in.dtype) || t->shape() != g->shape)
      return Fallback{
          FallbackReason::Binding,
          fmt::format("input {}: tensor {} holds {} {}, the program expects {} {}", i, g->id.value(), t->dtype().name(),
                      ir::shape_to_string(t->shape()), in.dtype.name(), ir::shape_to_string(g->shape))};
    launch.inputs[i] = *t;
  }
  for (std::size_t i = 0; i < ni; ++i) {
    const fusion::ProgramInput& in = p.inputs[i];
    if (in.role != fusion::InputRole::View) continue;
    if (!in.view || in.view->source >= ni || !launch.inputs[in.view->source])
      return Fallback{FallbackReason::Binding, fmt::format("input {}: view without a bound source", i)};
    launch.inputs[i] = launch.inputs[in.view->source];
  }
  return std::nullopt;
}

// Scalars, converted to their instructions' dtypes.
MaybeFallback bind_scalars(const fast::CompiledProgram& compiled, const Binding& bind, fast::Launch& launch) {
  for (const fast::ScalarBind& s : compiled.scalars) {
    if (s.placeholder >= bind.scalars.size())
      return Fallback{FallbackReason::Binding,
                      fmt::format("scalar placeholder {} of {} bound", s.placeholder, bind.scalars.size())};
    launch.scalars.push_back(convert_scalar(bind.scalars[s.placeholder], s.dtype));
  }
  return std::nullopt;
}

// The part (CBlock::parts) of each input and output of a launch that runs its parts apart.
struct PartMap {
  std::vector<std::uint32_t> input, output;
};

PartMap part_map(const fast::CBlock& block0, std::size_t ni, std::size_t no) {
  PartMap m{std::vector<std::uint32_t>(ni, fast::kNoPart), std::vector<std::uint32_t>(no, fast::kNoPart)};
  for (std::size_t k = 0; k < block0.loads.size(); ++k) {
    const fast::CLoad& l = block0.loads[k];
    if (l.source == fusion::LoadSource::Input && l.index < ni && m.input[l.index] == fast::kNoPart)
      m.input[l.index] = block0.load_part[k];
  }
  for (std::size_t k = 0; k < block0.stores.size(); ++k)
    if (block0.stores[k].output < no) m.output[block0.stores[k].output] = block0.store_part[k];
  return m;
}

// Whether input i (a consumed Plain input) may lend its buffer to an output: no other entry (a
// view, a second read) names the same tensor, no store copies it straight to an output (an
// elided copy, read after the instructions), and nothing else holds the buffer.
bool input_buffer_free(const FusedProgram& p, const fast::CBlock& block0, const fast::Launch& launch, std::size_t i) {
  const std::size_t ni = p.inputs.size();
  for (std::size_t j = 0; j < ni; ++j)
    if (j != i && (p.inputs[j].tensor == p.inputs[i].tensor || (p.inputs[j].view && p.inputs[j].view->source == i)))
      return false;
  for (const fast::CLoad& l : block0.loads)
    if (l.source == fusion::LoadSource::Input && l.index == i)
      for (const fast::CStore& st : block0.stores)
        if (st.reg == l.reg) return false;
  // Exactly two owners: the container's entry and our copy.
  return launch.inputs[i]->buffer().use_count() == 2;
}

// Output o written over a consumed input that fits (of its own part only, when `parts` is set).
void take_over_input(const FusedProgram& p, const Binding& bind, const fast::CBlock& block0, const PartMap* parts,
                     std::size_t o, std::vector<bool>& claimed, fast::Launch& launch) {
  const fusion::ProgramOutput& out = p.outputs[o];
  const ir::TensorIr* g = global_of(bind, out.tensor);  // checked by place_outputs
  for (std::size_t i = 0; i < p.inputs.size(); ++i) {
    const fusion::ProgramInput& in = p.inputs[i];
    if (claimed[i] || in.status != TensorStatus::ReadWrite || in.role != fusion::InputRole::Plain ||
        !(in.dtype == out.dtype) || launch.inputs[i]->shape() != g->shape)
      continue;
    if (parts != nullptr && parts->input[i] != parts->output[o]) continue;
    if (!input_buffer_free(p, block0, launch, i)) continue;
    Result<HostTensor> w = HostTensor::wrap(launch.inputs[i]->buffer(), g->shape, out.dtype);
    if (!w.ok()) continue;
    launch.outputs[o] = std::move(w).value();
    launch.output_inplace[o] = true;
    claimed[i] = true;
    return;
  }
}

// Outputs: a consumed input's buffer when the program cannot fault (a fault replays the ops,
// which must find their inputs intact) and nothing else holds that buffer; else a new buffer.
// With independent parts (CBlock::parts), every output first takes over a consumed input of its
// own part, and only then may one take another part's: a launch runs its parts one after another
// only when no part writes what another reads (parts_run_apart). Fused Adam's second kernel
// crossed parts with first fit, and ran in one pass. Small launches never split
// (kMinPartPositions): first fit, as before.
MaybeFallback place_outputs(CpuDevice& device, const FusedProgram& p, const Binding& bind, bool allow_inplace,
                            Bound& b) {
  fast::Launch& launch = b.launch;
  const std::size_t ni = p.inputs.size(), no = p.outputs.size();
  launch.outputs.resize(no);
  launch.output_inplace.assign(no, false);
  bool large = false;
  for (std::size_t o = 0; o < no; ++o) {
    const fusion::ProgramOutput& out = p.outputs[o];
    if (!out.written) continue;
    const ir::TensorIr* g = global_of(bind, out.tensor);
    if (g == nullptr || !(g->dtype == out.dtype))
      return Fallback{FallbackReason::Binding,
                      fmt::format("output {}: no tensor of dtype {} bound", o, out.dtype.name())};
    large = large || ir::num_elements(g->shape) >= fast::kMinPartPositions;
  }
  const fast::CBlock* block0 = b.compiled->blocks.empty() ? nullptr : &b.compiled->blocks[0];
  const bool inplace_ok = allow_inplace && p.kind == ProgramKind::Elementwise && !b.compiled->may_fail;
  if (inplace_ok && block0 != nullptr) {
    std::vector<bool> claimed(ni, false);
    if (large && block0->split_into_parts()) {
      const PartMap parts = part_map(*block0, ni, no);
      for (std::size_t o = 0; o < no; ++o)
        if (p.outputs[o].written && parts.output[o] != fast::kNoPart)
          take_over_input(p, bind, *block0, &parts, o, claimed, launch);
    }
    for (std::size_t o = 0; o < no; ++o)
      if (p.outputs[o].written && !launch.outputs[o]) take_over_input(p, bind, *block0, nullptr, o, claimed, launch);
  }
  for (std::size_t o = 0; o < no; ++o) {
    if (!p.outputs[o].written || launch.outputs[o]) continue;
    const ir::Shape& shape = global_of(bind, p.outputs[o].tensor)->shape;
    Result<HostTensor> t = HostTensor::allocate(device.allocator(), shape, p.outputs[o].dtype);
    if (!t.ok())  // the ops, replayed, report the allocation failure
      return Fallback{FallbackReason::Resources, fmt::format("output {}: {}", o, t.error().message)};
    launch.outputs[o] = std::move(t).value();
  }
  return std::nullopt;
}

// Binds a program to tensors (from the handle container, or `produced` by an earlier stage of
// the same launch), scalars and fresh (or reused) outputs. Changes nothing in the container;
// a fallback when the program cannot run here (the caller replays its ops).
MaybeFallback bind_program(CpuDevice& device, CpuDevice::Handles& handles, const FusedProgram& p, const Binding& bind,
                           bool allow_inplace, const Produced* produced, Bound& b) {
  b.program = &p;
  b.compiled = device.compiled(p);
  if (!b.compiled->supported) return Fallback{FallbackReason::Unsupported, b.compiled->why_unsupported};
  fast::Launch& launch = b.launch;
  launch.program = &p;
  launch.compiled = b.compiled.get();
  launch.dims = bind.dims;
  launch.allocator = &device.allocator();
  launch.arena = &device.arena();
  launch.threads = device.threads();
  launch.nontemporal_outputs = &device.counters().nontemporal_outputs;
  launch.part_by_part = &device.counters().part_by_part;
  if (MaybeFallback f = bind_inputs(handles, p, bind, produced, launch)) return f;
  if (MaybeFallback f = bind_scalars(*b.compiled, bind, launch)) return f;
  return place_outputs(device, p, bind, allow_inplace, b);
}

// After a successful run: consume ReadWrite inputs, register what the program keeps.
void commit(CpuDevice& device, CpuDevice::Handles& handles, Bound& b, const Binding& bind) {
  const FusedProgram& p = *b.program;
  for (const fusion::ProgramInput& in : p.inputs) {
    if (in.role == fusion::InputRole::View || in.status != TensorStatus::ReadWrite) continue;
    (void)handles.free(with_status(*global_of(bind, in.tensor), TensorStatus::ReadWrite));
  }
  for (std::size_t o = 0; o < p.outputs.size(); ++o) {
    const fusion::ProgramOutput& out = p.outputs[o];
    if (!out.written || !out.kept) continue;
    handles.register_handle(global_of(bind, out.tensor)->id, std::move(*b.launch.outputs[o]));
    if (b.launch.output_inplace[o]) device.counters().inplace_reuses.fetch_add(1, std::memory_order_relaxed);
  }
}

void count_launch(CpuDevice& device, ProgramKind kind) {
  device.counters().fused_launches.fetch_add(1, std::memory_order_relaxed);
  device.counters().launches_by_kind[static_cast<std::size_t>(kind)].fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::optional<runtime::Fallback> CpuExecutor::run_program(const FusedProgram& p, const Binding& bind) {
  Bound b;
  if (MaybeFallback f = bind_program(device_, handles_, p, bind, /*allow_inplace=*/true, nullptr, b)) return f;
  bool fault = false;
  std::string why;
  switch (p.kind) {
    case ProgramKind::Elementwise:
    case ProgramKind::NhwcRelayout:
      b.launch.jit = device_.jit_kernel(p, *b.compiled);
      why = fast::run_elementwise(b.launch, &fault);
      break;
    case ProgramKind::Reduce: why = fast::run_reduce(b.launch, &fault); break;
    case ProgramKind::Matmul: why = fast::run_matmul(b.launch, &fault); break;
    case ProgramKind::ReduceBroadcasted:
      return Fallback{FallbackReason::Unsupported, "a ReduceBroadcasted program runs by its stages"};
  }
  // The kernels' reasons are about the concrete shapes (the compiled form accepted the structure).
  if (!why.empty()) return Fallback{FallbackReason::ShapeLimits, std::move(why)};
  if (fault)
    return Fallback{FallbackReason::Fault, "a kernel faulted (integer division by zero or an index out of range)"};
  if (b.launch.jit != nullptr) device_.counters().jit_launches.fetch_add(1, std::memory_order_relaxed);
  commit(device_, handles_, b, bind);
  return std::nullopt;
}

// A ReduceBroadcasted program whose stages all iterate the same [rows, n] space (reductions over
// the last axis, elementwise stages over the full shape): every stage runs on one group of rows
// after the other, so what a stage writes for a later one is still in cache when it is read
// (softmax: the exp(x - max) rows are summed, then divided, without a trip to memory).
bool CpuExecutor::run_reduce_broadcasted(const FusedProgram& p, const Binding& bind) {
  const std::size_t ns = p.stages.size();
  if (ns == 0) return false;
  std::vector<Bound> stages(ns);
  Produced produced;
  for (std::size_t k = 0; k < ns; ++k) {
    const FusedProgram& st = p.stages[k];
    if (st.kind != ProgramKind::Elementwise && st.kind != ProgramKind::Reduce) return false;
    if (bind_program(device_, handles_, st, bind, /*allow_inplace=*/false, &produced, stages[k])) return false;
    for (std::size_t o = 0; o < st.outputs.size(); ++o)
      if (st.outputs[o].written)
        produced.emplace(global_of(bind, st.outputs[o].tensor)->id.value(), *stages[k].launch.outputs[o]);
  }
  // The common row space.
  const ir::Shape full = stages[0].launch.concrete(stages[0].compiled->blocks[0].reference);
  if (full.empty() || full.size() > fast::kMaxRank) return false;
  const std::uint64_t n = full.back();
  const std::uint64_t total = ir::num_elements(full);
  if (n == 0 || total == 0) return false;
  const std::uint64_t rows = total / n;
  std::vector<fast::BlockRunner> blocks(ns);
  std::vector<std::unique_ptr<fast::ReduceRunner>> reductions(ns);
  for (std::size_t k = 0; k < ns; ++k) {
    const fast::Launch& l = stages[k].launch;
    if (l.concrete(stages[k].compiled->blocks[0].reference) != full) return false;
    if (p.stages[k].kind == ProgramKind::Elementwise) {
      if (!blocks[k].prepare(l, 0, full).empty()) return false;
    } else {
      reductions[k] = std::make_unique<fast::ReduceRunner>();
      if (!reductions[k]->prepare(l).empty() || !reductions[k]->rowwise() || reductions[k]->rows() != rows ||
          reductions[k]->row_length() != n)
        return false;
    }
  }
  // Row groups of ~16K elements: a few stages' rows stay within L2.
  const std::uint64_t group = std::max<std::uint64_t>(1, 16384 / n);
  const std::uint64_t groups = (rows + group - 1) / group;
  const std::uint64_t grain = std::max<std::uint64_t>(1, fast::kParallelThreshold / 2 / (group * n));
  std::atomic<bool> failed{false};
  fast::parallel_ranges(stages[0].launch, groups, grain, [&](std::uint64_t g0, std::uint64_t g1) {
    std::vector<std::unique_ptr<fast::Scratch>> scratch(ns);
    std::vector<std::vector<void*>> ptrs(ns);
    for (std::size_t k = 0; k < ns; ++k)
      if (!reductions[k]) {
        scratch[k] = std::make_unique<fast::Scratch>(blocks[k].scratch_bytes());
        ptrs[k].resize(blocks[k].num_regs());
      }
    for (std::uint64_t g = g0; g < g1; ++g) {
      const std::uint64_t r0 = g * group, r1 = std::min(rows, r0 + group);
      for (std::size_t k = 0; k < ns; ++k) {
        if (reductions[k]) {
          if (!reductions[k]->run_rows(r0, r1)) {
            failed.store(true, std::memory_order_relaxed);
            return;
          }
          continue;
        }
        for (std::uint64_t s = r0 * n; s < r1 * n; s += fast::kBlock) {
          const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(fast::kBlock, r1 * n - s));
          if (!blocks[k].run(s, len, scratch[k]->data(), ptrs[k].data())) {
            failed.store(true, std::memory_order_relaxed);
            return;
          }
        }
      }
    }
  });
  if (failed.load(std::memory_order_relaxed)) return false;
  for (std::size_t k = 0; k < ns; ++k) {
    commit(device_, handles_, stages[k], bind);
    count_launch(device_, p.stages[k].kind);
  }
  device_.counters().row_interleaved.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// ---- Fused optimizations

void CpuExecutor::execute_optimization(const fusion::Optimization& opt, const fusion::ExecutionContext& ctx) {
  const auto* fused = dynamic_cast<const fusion::FusedOptimization*>(&opt);
  if (fused == nullptr) {
    replay(ctx, 0, opt.len());
    return;
  }
  execute_program(fused->program(), ctx, 0);
}

void CpuExecutor::execute_program(const FusedProgram& p, const fusion::ExecutionContext& ctx, std::size_t offset) {
  if (p.kind == ProgramKind::ReduceBroadcasted) {
    device_.counters().launches_by_kind[static_cast<std::size_t>(p.kind)].fetch_add(1, std::memory_order_relaxed);
    const ir::RelativeConverter& c = ctx.converter();
    if (run_reduce_broadcasted(p, Binding{c.tensors_rel2glob(), c.shapes_rel2glob(), c.scalars()})) return;
    for (const FusedProgram& stage : p.stages) {
      execute_program(stage, ctx, offset);
      offset += stage.len;
    }
    return;
  }
  const ir::RelativeConverter& conv = ctx.converter();
  const Binding bind{conv.tensors_rel2glob(), conv.shapes_rel2glob(), conv.scalars()};
  if (std::optional<runtime::Fallback> f = run_program(p, bind)) {
    device_.count_fallback(*f, p);
    replay(ctx, offset, p.len);
    return;
  }
  count_launch(device_, p.kind);
  if (p.kind == ProgramKind::NhwcRelayout && p.captured_op_position < p.len) {
    // The module op the relayout feeds runs unfused; kiln's CPU kernels read row-major, so the
    // NHWC stride order is not applied (ProgramOutput::layout is a hint for GPU backends).
    for (std::size_t i = p.captured_op_position; i < p.len; ++i)
      execute_operation(ctx.operation_within_optimization(offset + i));
  }
}

void CpuExecutor::replay(const fusion::ExecutionContext& ctx, std::size_t offset, std::size_t len) {
  for (std::size_t i = 0; i < len; ++i) execute_operation(ctx.operation_within_optimization(offset + i));
}

void CpuExecutor::free_tensor(const ir::TensorIr& t) { (void)handles_.free(t); }

// ---- Single operations

void CpuExecutor::execute_operation(const ir::Operation& op) {
  if (execute_fast(op)) {
    device_.counters().fast_ops.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  execute_reference(op);
}

void CpuExecutor::execute_reference(const ir::Operation& op) {
  device_.counters().reference_ops.fetch_add(1, std::memory_order_relaxed);
  // Errors are recorded in the handle container (outputs claimed); nothing else to do here.
  (void)reference_.execute(op, handles_);
}

bool CpuExecutor::execute_fast(const ir::Operation& op) {
  if (op.kind == OpKind::Drop_Drop || op.kind == OpKind::Init_Init) return false;
  CpuDevice::Handles& handles = handles_;
  if (handles.has_errors())
    for (const ir::TensorIr& t : op.inputs())
      if (handles.error_of(t.id) != nullptr) return false;  // the reference skips it
  if (ir::build::conv_kind_info(op.kind)) return fast::run_conv(op, device_, handles);
  if (ir::build::pool_spatial_dims(op.kind) != 0) return fast::run_pool(op, device_, handles);
  if (op.kind == OpKind::Module_LayerNorm || op.kind == OpKind::Module_Embedding ||
      op.kind == OpKind::Module_EmbeddingBackward)
    return fast::run_module(op, device_, handles);
  if (op.kind == OpKind::Base_Slice || op.kind == OpKind::Base_SliceAssign || op.kind == OpKind::Base_Permute ||
      op.kind == OpKind::Base_Expand || op.kind == OpKind::Base_Flip)
    return fast::run_layout(op, device_, handles);
  if (!fusion::single_op_eligible(op, fast::kMaxRank)) return false;

  if (op.kind == OpKind::Base_Reshape) {
    // Row-major data is its own reshape: share the buffer.
    const ir::TensorIr& in = op.inputs()[0];
    const ir::TensorIr& out = op.outputs()[0];
    const HostTensor* t = handles.get_handle_ref(in.id);
    if (t == nullptr || !(t->dtype() == in.dtype) || t->shape() != in.shape) return false;
    Result<HostTensor> view = HostTensor::wrap(t->buffer(), out.shape, out.dtype);
    if (!view.ok()) return false;
    (void)handles.free(in);
    handles.register_handle(out.id, std::move(view).value());
    device_.counters().zero_copy_reshapes.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  fusion::OneOpTables tables;
  std::optional<FusedProgram> p = fusion::synthesize_single_op(op, tables);
  if (!p) return false;
  const Binding bind{tables.tensors, tables.dims, tables.scalars};
  return !run_program(*p, bind).has_value();
}

}  // namespace kiln::cpu

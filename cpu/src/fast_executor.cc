// CpuExecutor: binds fused programs to tensors, sizes and scalars, runs their compiled forms,
// and turns single operations into one-op programs for the same kernels (see cpu_executor.h).
#include <algorithm>
#include <atomic>
#include <memory>
#include <unordered_map>

#include "fast_program.h"
#include "kiln/cpu/cpu_executor.h"
#include "kiln/fusion/trace_fuser.h"

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
    case ir::ScalarIr::Kind::Float:
      element::store_f64(bytes.data(), d, 0, s.as_float());
      break;
    case ir::ScalarIr::Kind::Int:
      element::store_i64(bytes.data(), d, 0, s.as_int());
      break;
    case ir::ScalarIr::Kind::UInt:
      element::store_u64(bytes.data(), d, 0, s.as_uint());
      break;
    case ir::ScalarIr::Kind::Bool:
      element::store_bool(bytes.data(), d, 0, s.as_bool());
      break;
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
using Produced = std::unordered_map<std::uint64_t, CpuTensor>;

struct Bound {
  const FusedProgram* program = nullptr;
  std::shared_ptr<const fast::CompiledProgram> compiled;
  fast::Launch launch;
};

const ir::TensorIr* global_of(const Binding& bind, std::uint64_t rel) {
  return rel < bind.tensors.size() ? &bind.tensors[rel] : nullptr;
}

// Binds a program to tensors (from the handle container, or `produced` by an earlier stage of
// the same launch), scalars and fresh (or reused) outputs. Changes nothing in the container;
// false when the program cannot run here (the caller replays its ops).
bool bind_program(CpuDevice& device, CpuDevice::Handles& handles, const FusedProgram& p, const Binding& bind,
                  bool allow_inplace, const Produced* produced, Bound& b) {
  b.program = &p;
  b.compiled = device.compiled(p);
  if (!b.compiled->supported) return false;
  fast::Launch& launch = b.launch;
  launch.program = &p;
  launch.compiled = b.compiled.get();
  launch.dims = bind.dims;
  launch.allocator = &device.allocator();
  launch.arena = &device.arena();
  launch.threads = device.threads();

  // Inputs: an errored one sends the program to the op-by-op path (each op skips as it would).
  const std::size_t ni = p.inputs.size();
  launch.inputs.resize(ni);
  for (std::size_t i = 0; i < ni; ++i) {
    const fusion::ProgramInput& in = p.inputs[i];
    if (in.role == fusion::InputRole::View) continue;
    const ir::TensorIr* g = global_of(bind, in.tensor);
    if (g == nullptr) return false;
    const CpuTensor* t = nullptr;
    if (produced != nullptr) {
      auto it = produced->find(g->id.value());
      if (it != produced->end()) t = &it->second;
    }
    if (t == nullptr) {
      if (handles.has_errors() && handles.error_of(g->id) != nullptr) return false;
      t = handles.get_handle_ref(g->id);
    }
    if (t == nullptr || !(t->dtype() == in.dtype) || t->shape() != g->shape) return false;
    launch.inputs[i] = *t;
  }
  for (std::size_t i = 0; i < ni; ++i) {
    const fusion::ProgramInput& in = p.inputs[i];
    if (in.role != fusion::InputRole::View) continue;
    if (!in.view || in.view->source >= ni || !launch.inputs[in.view->source]) return false;
    launch.inputs[i] = launch.inputs[in.view->source];
  }

  // Scalars, converted to their instructions' dtypes.
  for (const fast::ScalarBind& s : b.compiled->scalars) {
    if (s.placeholder >= bind.scalars.size()) return false;
    launch.scalars.push_back(convert_scalar(bind.scalars[s.placeholder], s.dtype));
  }

  // Outputs: a consumed input's buffer when the program cannot fault (a fault replays the ops,
  // which must find their inputs intact) and nothing else holds that buffer; else a new buffer.
  const std::size_t no = p.outputs.size();
  launch.outputs.resize(no);
  launch.output_inplace.assign(no, false);
  std::vector<bool> claimed(ni, false);
  const bool inplace_ok = allow_inplace && p.kind == ProgramKind::Elementwise && !b.compiled->may_fail;
  for (std::size_t o = 0; o < no; ++o) {
    const fusion::ProgramOutput& out = p.outputs[o];
    if (!out.written) continue;
    const ir::TensorIr* g = global_of(bind, out.tensor);
    if (g == nullptr || !(g->dtype == out.dtype)) return false;
    if (inplace_ok) {
      for (std::size_t i = 0; i < ni; ++i) {
        const fusion::ProgramInput& in = p.inputs[i];
        if (claimed[i] || in.status != TensorStatus::ReadWrite || in.role != fusion::InputRole::Plain ||
            !(in.dtype == out.dtype) || launch.inputs[i]->shape() != g->shape)
          continue;
        bool shared = false;  // another entry (a view, a second read) names the same tensor
        for (std::size_t j = 0; j < ni; ++j)
          if (j != i && (p.inputs[j].tensor == in.tensor || (p.inputs[j].view && p.inputs[j].view->source == i)))
            shared = true;
        // An input a store copies straight to an output (an elided copy) is read after the
        // instructions, when an in-place output may already have overwritten it.
        const fast::CBlock& cb = b.compiled->blocks[0];
        for (const fast::CLoad& l : cb.loads)
          if (l.source == fusion::LoadSource::Input && l.index == i)
            for (const fast::CStore& st : cb.stores)
              if (st.reg == l.reg) shared = true;
        // Exactly two owners: the container's entry and our copy.
        if (shared || launch.inputs[i]->buffer().use_count() != 2) continue;
        Result<CpuTensor> w = CpuTensor::wrap(launch.inputs[i]->buffer(), g->shape, out.dtype);
        if (!w.ok()) continue;
        launch.outputs[o] = std::move(w).value();
        launch.output_inplace[o] = true;
        claimed[i] = true;
        break;
      }
    }
    if (!launch.outputs[o]) {
      Result<CpuTensor> t = CpuTensor::allocate(device.allocator(), g->shape, out.dtype);
      if (!t.ok()) return false;  // the ops, replayed, report the allocation failure
      launch.outputs[o] = std::move(t).value();
    }
  }
  return true;
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

bool CpuExecutor::run_program(const FusedProgram& p, const Binding& bind) {
  Bound b;
  if (!bind_program(device_, handles_, p, bind, /*allow_inplace=*/true, nullptr, b)) return false;
  bool fault = false;
  std::string why;
  switch (p.kind) {
    case ProgramKind::Elementwise:
    case ProgramKind::NhwcRelayout:
      b.launch.jit = device_.jit_kernel(p, *b.compiled);
      why = fast::run_elementwise(b.launch, &fault);
      break;
    case ProgramKind::Reduce:
      why = fast::run_reduce(b.launch, &fault);
      break;
    case ProgramKind::Matmul:
      why = fast::run_matmul(b.launch, &fault);
      break;
    case ProgramKind::ReduceBroadcasted:
      return false;
  }
  if (!why.empty() || fault) return false;
  if (b.launch.jit != nullptr) device_.counters().jit_launches.fetch_add(1, std::memory_order_relaxed);
  commit(device_, handles_, b, bind);
  return true;
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
    if (!bind_program(device_, handles_, st, bind, /*allow_inplace=*/false, &produced, stages[k])) return false;
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
  if (!run_program(p, bind)) {
    device_.counters().fused_replays.fetch_add(1, std::memory_order_relaxed);
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

namespace {

// Relative tables of a one-op program, numbered as the relative converter would.
struct OneOp {
  std::vector<ir::TensorIr> tensors;
  std::vector<std::uint64_t> dims{1};
  std::vector<ir::ScalarIr> scalars;

  std::uint64_t tensor(const ir::TensorIr& t) {
    for (std::size_t i = 0; i < tensors.size(); ++i)
      if (tensors[i].id == t.id) return i;
    tensors.push_back(t);
    return tensors.size() - 1;
  }
  std::uint64_t dim(std::uint64_t v) {
    for (std::size_t i = 0; i < dims.size(); ++i)
      if (dims[i] == v) return i;
    dims.push_back(v);
    return dims.size() - 1;
  }
  ir::Shape shape(const ir::Shape& s) {
    ir::Shape r;
    for (std::uint64_t d : s) r.push_back(dim(d));
    return r;
  }
  std::uint32_t scalar(const ir::ScalarIr& s) {
    scalars.push_back(s);
    return static_cast<std::uint32_t>(scalars.size() - 1);
  }
};

bool family_fits(const ir::Operation& op, ir::DType d) {
  bool ok = false;
  switch (op.family) {
    case ir::Family::BaseFloat:
    case ir::Family::NumericFloat:
    case ir::Family::Float:
      ok = d.is_float();
      break;
    case ir::Family::BaseInt:
    case ir::Family::NumericInt:
    case ir::Family::Int:
      ok = d.is_integral();
      break;
    case ir::Family::BaseBool:
    case ir::Family::Bool:
      ok = d.is_bool();
      break;
    default:
      return false;
  }
  if (ir::family_carries_dtype(op.family)) ok = ok && op.dtype == d;
  return ok;
}

bool same_dtype_shape(const ir::TensorIr& a, const ir::Shape& shape, ir::DType d) {
  return a.shape == shape && a.dtype == d;
}

// The checks the reference executor makes before running an op of these signatures: the fast
// path only runs ops the reference would run, so errors always come from the reference.
bool eligible(const ir::Operation& op) {
  if (!op.validate().ok()) return false;
  for (const ir::TensorIr& t : op.nodes())
    if (t.dtype.is_quantized() || t.shape.size() > fast::kMaxRank) return false;
  if (op.outputs().size() != 1) return false;
  const ir::OpInfo& info = op.info();
  const auto in = op.inputs();
  const ir::TensorIr& out = op.outputs()[0];
  const bool cmp = info.has(ir::kComparison);
  auto out_dtype_ok = [&](ir::DType operand) { return cmp ? out.dtype.is_bool() : out.dtype == operand; };
  switch (info.signature) {
    case ir::Signature::Unary:
      return in.size() == 1 && family_fits(op, in[0].dtype) && out.shape == in[0].shape && out_dtype_ok(in[0].dtype);
    case ir::Signature::Binary: {
      if (in.size() != 2 || !(in[0].dtype == in[1].dtype) || !family_fits(op, in[0].dtype)) return false;
      Result<ir::Shape> s = ir::shape::broadcast(in[0].shape, in[1].shape);
      return s.ok() && *s == out.shape && out_dtype_ok(in[0].dtype);
    }
    case ir::Signature::Scalar:
      return in.size() == 1 && op.scalars.size() == 1 && family_fits(op, in[0].dtype) && out.shape == in[0].shape &&
             out_dtype_ok(in[0].dtype);
    case ir::Signature::Cast: {
      if (in.size() != 1 || out.shape != in[0].shape) return false;
      const ir::DType from = in[0].dtype, to = out.dtype;
      switch (op.kind) {
        case OpKind::Base_Cast:
          return family_fits(op, from) && (from.is_float()      ? to.is_float()
                                           : from.is_integral() ? to.is_integral()
                                                                : to.is_bool());
        case OpKind::Float_IntoInt:
          return family_fits(op, from) && to.is_integral();
        case OpKind::Int_IntoFloat:
          return family_fits(op, from) && to.is_float();
        case OpKind::Bool_IntoFloat:
          return from.is_bool() && to.is_float();
        case OpKind::Bool_IntoInt:
          return from.is_bool() && to.is_integral();
        default:
          return false;
      }
    }
    case ir::Signature::Clamp:
      return in.size() == 1 && op.scalars.size() == 2 && !in[0].dtype.is_bool() && family_fits(op, in[0].dtype) &&
             same_dtype_shape(out, in[0].shape, in[0].dtype);
    case ir::Signature::MaskWhere: {
      if (in.size() != 3 || !in[1].dtype.is_bool() || !(in[0].dtype == in[2].dtype) || !family_fits(op, in[0].dtype))
        return false;
      const ir::Shape shapes[] = {in[0].shape, in[1].shape, in[2].shape};
      Result<ir::Shape> s = ir::shape::broadcast_many(shapes);
      return s.ok() && same_dtype_shape(out, *s, in[0].dtype);
    }
    case ir::Signature::MaskFill: {
      if (in.size() != 2 || op.scalars.size() != 1 || !in[1].dtype.is_bool() || !family_fits(op, in[0].dtype))
        return false;
      Result<ir::Shape> s = ir::shape::broadcast(in[0].shape, in[1].shape);
      return s.ok() && same_dtype_shape(out, *s, in[0].dtype);
    }
    case ir::Signature::Full:
      return op.kind == OpKind::Numeric_Full && in.empty() && op.scalars.size() == 1 && family_fits(op, out.dtype);
    case ir::Signature::Creation:
      return (op.kind == OpKind::Base_Ones || op.kind == OpKind::Base_Zeros) && in.empty() &&
             family_fits(op, out.dtype);
    case ir::Signature::Gather: {
      if (in.size() != 2 || op.attrs.size() != 1 || !in[1].dtype.is_integral() || !family_fits(op, in[0].dtype))
        return false;
      const std::size_t r = in[0].shape.size();
      if (op.attrs[0] < 0 || static_cast<std::size_t>(op.attrs[0]) >= r || in[1].shape.size() != r) return false;
      for (std::size_t d = 0; d < r; ++d)
        if (d != static_cast<std::size_t>(op.attrs[0]) && in[1].shape[d] > in[0].shape[d]) return false;
      return same_dtype_shape(out, in[1].shape, in[0].dtype);
    }
    case ir::Signature::Select: {
      if (in.size() != 2 || op.attrs.size() != 1 || !in[1].dtype.is_integral() || in[1].shape.size() != 1 ||
          !family_fits(op, in[0].dtype))
        return false;
      const std::size_t r = in[0].shape.size();
      if (op.attrs[0] < 0 || static_cast<std::size_t>(op.attrs[0]) >= r) return false;
      ir::Shape expected = in[0].shape;
      expected[static_cast<std::size_t>(op.attrs[0])] = in[1].shape[0];
      return same_dtype_shape(out, expected, in[0].dtype);
    }
    case ir::Signature::Cat: {
      if (in.empty() || op.attrs.size() != 1 || op.attrs[0] < 0 || !family_fits(op, in[0].dtype)) return false;
      std::vector<ir::Shape> shapes;
      for (const ir::TensorIr& t : in) {
        if (!(t.dtype == in[0].dtype)) return false;
        shapes.push_back(t.shape);
      }
      Result<ir::Shape> s = ir::shape::cat(shapes, static_cast<std::uint64_t>(op.attrs[0]));
      return s.ok() && same_dtype_shape(out, *s, in[0].dtype);
    }
    case ir::Signature::SwapDims: {
      if (in.size() != 1 || op.attrs.size() != 2 || op.attrs[0] < 0 || op.attrs[1] < 0) return false;
      Result<ir::Shape> s = ir::shape::swapped(in[0].shape, static_cast<std::uint64_t>(op.attrs[0]),
                                               static_cast<std::uint64_t>(op.attrs[1]));
      return s.ok() && same_dtype_shape(out, *s, in[0].dtype);
    }
    case ir::Signature::ShapeOp:
      return op.kind == OpKind::Base_Reshape && in.size() == 1 && out.dtype == in[0].dtype &&
             ir::num_elements(out.shape) == ir::num_elements(in[0].shape);
    case ir::Signature::ReduceDim: {
      if (in.size() != 1 || op.attrs.size() != 2 || op.attrs[1] != 1 || !family_fits(op, in[0].dtype)) return false;
      const std::size_t r = in[0].shape.size();
      if (op.attrs[0] < 0 || static_cast<std::size_t>(op.attrs[0]) >= r) return false;
      ir::Shape expected = in[0].shape;
      expected[static_cast<std::size_t>(op.attrs[0])] = 1;
      if (out.shape != expected) return false;
      if (info.has(ir::kIndexOutput)) return out.dtype.is_integral();
      return out_dtype_ok(in[0].dtype);
    }
    case ir::Signature::Reduce:
      return in.size() == 1 && family_fits(op, in[0].dtype) && out.shape == ir::Shape{1} && out_dtype_ok(in[0].dtype);
    case ir::Signature::Matmul: {
      if (op.kind != OpKind::Float_Matmul || in.size() != 2 || !in[0].dtype.is_float() || !in[1].dtype.is_float() ||
          !out.dtype.is_float())
        return false;
      Result<ir::Shape> s = ir::shape::matmul_output(in[0].shape, in[1].shape);
      return s.ok() && *s == out.shape;
    }
    default:
      return false;
  }
}

// The dim reduction a whole-tensor reduction is (over a [n] view of the input).
std::optional<OpKind> dim_kind_of(OpKind k) {
  switch (k) {
    case OpKind::Numeric_Sum:
      return OpKind::Numeric_SumDim;
    case OpKind::Numeric_Mean:
      return OpKind::Numeric_MeanDim;
    case OpKind::Numeric_Prod:
      return OpKind::Numeric_ProdDim;
    case OpKind::Numeric_Max:
      return OpKind::Numeric_MaxDim;
    case OpKind::Numeric_Min:
      return OpKind::Numeric_MinDim;
    case OpKind::Numeric_MaxAbs:
      return OpKind::Numeric_MaxAbsDim;
    case OpKind::Base_All:
      return OpKind::Base_AllDim;
    case OpKind::Base_Any:
      return OpKind::Base_AnyDim;
    default:
      return std::nullopt;
  }
}

fusion::ProgramOutput program_output(OneOp& t, const ir::TensorIr& out, std::uint32_t block, std::uint32_t local) {
  return fusion::ProgramOutput{t.tensor(out), out.dtype, t.shape(out.shape), TensorStatus::NotInit, block, local,
                               true,          true,      std::nullopt};
}

// Builds the one-op program of an eligible op; nullopt when no compiled form applies.
std::optional<FusedProgram> synthesize(const ir::Operation& op, OneOp& t) {
  const ir::OpInfo& info = op.info();
  const auto in = op.inputs();
  const ir::TensorIr& out = op.outputs()[0];
  FusedProgram p;
  p.len = 1;
  fusion::ProgramBlock b;
  b.settings = fusion::FuseSettings::elementwise();

  if (info.has(ir::kElementwise) || info.signature == ir::Signature::Unary || info.signature == ir::Signature::Binary ||
      info.signature == ir::Signature::Scalar || info.signature == ir::Signature::Cast ||
      op.kind == OpKind::Numeric_ClampMin || op.kind == OpKind::Numeric_ClampMax) {
    p.kind = ProgramKind::Elementwise;
    b.reference_shape = t.shape(out.shape);
    const bool indexed = info.has(ir::kIndexed);
    fusion::Instruction ins;
    ins.op = op.kind;
    ins.family = op.family;
    ins.compute = in.empty() ? out.dtype : in[0].dtype;
    ins.out_dtype = out.dtype;
    ins.attrs = op.attrs;
    for (std::size_t i = 0; i < in.size(); ++i) {
      fusion::ProgramInput pi{t.tensor(in[i]),          in[i].dtype, t.shape(in[i].shape), in[i].status,
                              fusion::InputRole::Plain, std::nullopt};
      if (indexed) {
        pi.role = fusion::InputRole::Indexed;
        ins.operands.push_back(fusion::Operand::input(static_cast<std::uint32_t>(i)));
      } else {
        const bool bc = in[i].shape != out.shape;
        if (bc) pi.role = fusion::InputRole::Broadcast;
        const auto reg = static_cast<std::uint32_t>(b.registers.size());
        b.registers.push_back(in[i].dtype);
        b.loads.push_back(fusion::Load{fusion::LoadSource::Input, static_cast<std::uint32_t>(i), reg, bc});
        ins.operands.push_back(fusion::Operand::local(reg));
      }
      p.inputs.push_back(std::move(pi));
    }
    for (const ir::ScalarIr& s : op.scalars) {
      const std::uint32_t k = t.scalar(s);
      ins.operands.push_back(fusion::Operand::scalar(k));
      p.scalars.push_back(k);
    }
    ins.out = static_cast<std::uint32_t>(b.registers.size());
    b.registers.push_back(out.dtype);
    b.stores.push_back(fusion::Store{0, ins.out});
    const std::uint32_t local = ins.out;
    b.instructions.push_back(std::move(ins));
    p.blocks.push_back(std::move(b));
    p.outputs.push_back(program_output(t, out, 0, local));
    return p;
  }

  if (op.kind == OpKind::Base_SwapDims) {
    p.kind = ProgramKind::Elementwise;
    b.reference_shape = t.shape(out.shape);
    p.inputs.push_back(fusion::ProgramInput{t.tensor(in[0]), in[0].dtype, t.shape(in[0].shape), in[0].status,
                                            fusion::InputRole::Plain, std::nullopt});
    fusion::ViewSpec v{OpKind::Base_SwapDims, 0, op.attrs[0], op.attrs[1], b.reference_shape};
    p.inputs.push_back(fusion::ProgramInput{p.inputs[0].tensor, in[0].dtype, p.inputs[0].shape, in[0].status,
                                            fusion::InputRole::View, v});
    b.registers.push_back(out.dtype);
    b.loads.push_back(fusion::Load{fusion::LoadSource::Input, 1, 0, false});
    b.stores.push_back(fusion::Store{0, 0});
    p.blocks.push_back(std::move(b));
    p.outputs.push_back(program_output(t, out, 0, 0));
    return p;
  }

  if (info.has(ir::kReduceDim) || info.has(ir::kFullReduce)) {
    const bool full = info.has(ir::kFullReduce);
    const std::optional<OpKind> kind = full ? dim_kind_of(op.kind) : std::optional<OpKind>(op.kind);
    if (!kind) return std::nullopt;
    p.kind = ProgramKind::Reduce;
    p.captured_op_position = 0;
    p.inputs.push_back(fusion::ProgramInput{t.tensor(in[0]), in[0].dtype, t.shape(in[0].shape), in[0].status,
                                            fusion::InputRole::Plain, std::nullopt});
    ir::Shape reduce_in = p.inputs[0].shape;
    std::uint32_t load_input = 0;
    std::int64_t axis = full ? 0 : op.attrs[0];
    if (full) {
      // Read the input as a [n] view.
      reduce_in = ir::Shape{t.dim(ir::num_elements(in[0].shape))};
      fusion::ViewSpec v{OpKind::Base_Reshape, 0, 0, 0, reduce_in};
      p.inputs.push_back(fusion::ProgramInput{p.inputs[0].tensor, in[0].dtype, p.inputs[0].shape, in[0].status,
                                              fusion::InputRole::View, v});
      load_input = 1;
    }
    b.reference_shape = reduce_in;
    b.registers.push_back(in[0].dtype);
    b.loads.push_back(fusion::Load{fusion::LoadSource::Input, load_input, 0, false});
    p.blocks.push_back(std::move(b));
    fusion::ProgramBlock e;
    e.settings = fusion::FuseSettings::reduce_write();
    e.reference_shape = t.shape(out.shape);
    e.registers.push_back(out.dtype);
    e.reduction = fusion::Reduction{
        *kind, op.family, axis, 0, 0, in[0].dtype, fusion::reduce_accumulator(*kind, in[0].dtype), out.dtype};
    e.stores.push_back(fusion::Store{0, 0});
    p.blocks.push_back(std::move(e));
    p.outputs.push_back(program_output(t, out, 1, 0));
    return p;
  }

  if (op.kind == OpKind::Float_Matmul) {
    p.kind = ProgramKind::Matmul;
    for (std::size_t i = 0; i < 2; ++i)
      p.inputs.push_back(fusion::ProgramInput{t.tensor(in[i]), in[i].dtype, t.shape(in[i].shape), in[i].status,
                                              fusion::InputRole::Plain, std::nullopt});
    b.settings = fusion::FuseSettings::matmul_epilogue();
    b.reference_shape = t.shape(out.shape);
    b.registers.push_back(out.dtype);
    b.stores.push_back(fusion::Store{0, 0});
    p.blocks.push_back(std::move(b));
    p.matmul = fusion::MatmulSpec{0, 1, 0, op.dtype, out.dtype};
    p.outputs.push_back(program_output(t, out, 0, 0));
    return p;
  }
  return std::nullopt;
}

}  // namespace

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
  if (!eligible(op)) return false;
  CpuDevice::Handles& handles = handles_;
  if (handles.has_errors())
    for (const ir::TensorIr& t : op.inputs())
      if (handles.error_of(t.id) != nullptr) return false;  // the reference skips it

  if (op.kind == OpKind::Base_Reshape) {
    // Row-major data is its own reshape: share the buffer.
    const ir::TensorIr& in = op.inputs()[0];
    const ir::TensorIr& out = op.outputs()[0];
    const CpuTensor* t = handles.get_handle_ref(in.id);
    if (t == nullptr || !(t->dtype() == in.dtype) || t->shape() != in.shape) return false;
    Result<CpuTensor> view = CpuTensor::wrap(t->buffer(), out.shape, out.dtype);
    if (!view.ok()) return false;
    (void)handles.free(in);
    handles.register_handle(out.id, std::move(view).value());
    device_.counters().zero_copy_reshapes.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  OneOp tables;
  std::optional<FusedProgram> p = synthesize(op, tables);
  if (!p) return false;
  const Binding bind{tables.tensors, tables.dims, tables.scalars};
  return run_program(*p, bind);
}

}  // namespace kiln::cpu

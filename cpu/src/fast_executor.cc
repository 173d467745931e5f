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
#include "fast_sort.h"
#include "fast_widen.h"
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
  return launch.inputs[i]->buffer_owned_by_only(2);
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
  launch.jit_launches = &device.counters().jit_launches;
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
    case ProgramKind::Row: return Fallback{FallbackReason::Unsupported, "a staged program runs by its stages"};
  }
  // The kernels' reasons are about the concrete shapes (the compiled form accepted the structure).
  if (!why.empty()) return Fallback{FallbackReason::ShapeLimits, std::move(why)};
  if (fault)
    return Fallback{FallbackReason::Fault, "a kernel faulted (integer division by zero or an index out of range)"};
  commit(device_, handles_, b, bind);
  return std::nullopt;
}

// ---- Staged programs (ReduceBroadcasted, Row) run row group by row group

namespace {

// The common [rows, n] space of a staged program's bound stages: every stage iterates the same
// shape, reductions over its last axis. Fills the runners; nullopt when the stages cannot be
// interleaved (they then run one after another).
struct RowSpace {
  ir::Shape full;
  std::uint64_t n = 0, rows = 0;
};
std::optional<RowSpace> prepare_row_stages(const FusedProgram& p, const std::vector<Bound>& stages,
                                           std::vector<fast::BlockRunner>& blocks,
                                           std::vector<std::unique_ptr<fast::ReduceRunner>>& reductions) {
  RowSpace space;
  space.full = stages[0].launch.concrete(stages[0].compiled->blocks[0].reference);
  if (space.full.empty() || space.full.size() > fast::kMaxRank) return std::nullopt;
  space.n = space.full.back();
  const std::uint64_t total = ir::num_elements(space.full);
  if (space.n == 0 || total == 0) return std::nullopt;
  space.rows = total / space.n;
  const std::size_t ns = stages.size();
  blocks.resize(ns);
  reductions.resize(ns);
  for (std::size_t k = 0; k < ns; ++k) {
    const fast::Launch& l = stages[k].launch;
    if (l.concrete(stages[k].compiled->blocks[0].reference) != space.full) return std::nullopt;
    if (p.stages[k].kind == ProgramKind::Elementwise) {
      if (!blocks[k].prepare(l, 0, space.full).empty()) return std::nullopt;
    } else {
      reductions[k] = std::make_unique<fast::ReduceRunner>();
      if (!reductions[k]->prepare(l).empty() || !reductions[k]->rowwise() || reductions[k]->rows() != space.rows ||
          reductions[k]->row_length() != space.n)
        return std::nullopt;
    }
  }
  return space;
}

// Where a task finds one accessor of a windowed temporary: stage, which runner of it (the
// elementwise block, or a reduction's prologue / epilogue), load or store, index.
enum class RunnerPart : std::uint8_t { Block, Prologue, Epilogue };
struct WindowedAccess {
  std::size_t stage = 0;
  RunnerPart part = RunnerPart::Block;
  bool load = true;
  std::uint32_t index = 0;
  std::size_t temp = 0;
};

// A value one stage writes over the whole row space and only later stages of the same launch
// read, consuming it: each task keeps it in a window of its current row group instead of
// memory, so it never leaves the cache (softmax's exp(x - max): read by the sum, then the
// division, then dead).
struct RowTemporary {
  const std::byte* buffer = nullptr;
  std::size_t esize = 0;
};

std::vector<RowTemporary> row_temporaries(const FusedProgram& p, const std::vector<Bound>& stages,
                                          const CpuExecutor::Binding& bind, const ir::Shape& full) {
  std::vector<RowTemporary> temps;
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const FusedProgram& st = p.stages[k];
    for (std::size_t o = 0; o < st.outputs.size(); ++o) {
      if (!st.outputs[o].written || !stages[k].launch.outputs[o]) continue;
      const ir::TensorIr* g = global_of(bind, st.outputs[o].tensor);
      if (g == nullptr || g->shape != full) continue;
      bool consumed_later = false;
      for (std::size_t j = k + 1; j < stages.size() && !consumed_later; ++j)
        for (const fusion::ProgramInput& in : p.stages[j].inputs)
          consumed_later =
              consumed_later || (in.tensor == st.outputs[o].tensor && in.status == TensorStatus::ReadWrite);
      if (consumed_later) temps.push_back({stages[k].launch.outputs[o]->data(), st.outputs[o].dtype.size_bytes()});
    }
  }
  return temps;
}

fast::BlockRunner& runner_part(std::vector<fast::BlockRunner>& blocks,
                               std::vector<std::unique_ptr<fast::ReduceRunner>>& reductions, std::size_t k,
                               RunnerPart part) {
  switch (part) {
    case RunnerPart::Prologue: return reductions[k]->prologue();
    case RunnerPart::Epilogue: return reductions[k]->epilogue();
    case RunnerPart::Block: break;
  }
  return blocks[k];
}

// Every accessor of every temporary that can live in a window (all of its accessors walk it
// row-major); the others stay in memory.
std::vector<WindowedAccess> windowed_accesses(std::vector<RowTemporary>& temps, std::vector<fast::BlockRunner>& blocks,
                                              std::vector<std::unique_ptr<fast::ReduceRunner>>& reductions) {
  std::vector<WindowedAccess> all;
  std::vector<RowTemporary> kept;
  for (const RowTemporary& t : temps) {
    std::vector<WindowedAccess> found;
    bool contiguous = true;
    for (std::size_t k = 0; k < blocks.size(); ++k)
      for (RunnerPart part : {RunnerPart::Block, RunnerPart::Prologue, RunnerPart::Epilogue}) {
        if ((part == RunnerPart::Block) == (reductions[k] != nullptr)) continue;
        const fast::BlockRunner::BufferAccessors a = runner_part(blocks, reductions, k, part).accessors_of(t.buffer);
        contiguous = contiguous && a.contiguous;
        for (std::uint32_t i : a.loads) found.push_back({k, part, true, i, kept.size()});
        for (std::uint32_t i : a.stores) found.push_back({k, part, false, i, kept.size()});
      }
    if (!contiguous || found.empty()) continue;
    all.insert(all.end(), found.begin(), found.end());
    kept.push_back(t);
  }
  temps = std::move(kept);
  return all;
}

// The full-size outputs the elementwise stages write for after the launch go out with
// non-temporal stores when the launch streams from DRAM (as one elementwise launch does): the
// row groups never read them back, and the stores skip the read for ownership of each line. Not
// the windowed temporaries (read back at once) nor a reduction's outputs (one value per row).
// Returns how many stores stream.
std::size_t stream_row_outputs(std::vector<fast::BlockRunner>& blocks, const std::vector<WindowedAccess>& windowed,
                               std::uint64_t positions) {
  std::uint64_t bytes = 0;
  for (const fast::BlockRunner& b : blocks)
    if (b.numel() != 0)
      for (const fast::Accessor& a : b.store_accessors()) bytes += positions * a.esize;
  if (bytes <= fast::kStreamingBytes) return 0;
  std::size_t streams = 0;
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    if (blocks[k].numel() == 0) continue;  // a reduction stage
    for (std::size_t s = 0; s < blocks[k].store_accessors().size(); ++s) {
      const bool window = std::any_of(windowed.begin(), windowed.end(), [&](const WindowedAccess& a) {
        return a.stage == k && a.part == RunnerPart::Block && !a.load && a.index == s;
      });
      if (!window && blocks[k].stream_store(s)) ++streams;
    }
  }
  return streams;
}

// Row groups of ~16K elements: a few stages' rows stay within L2.
constexpr std::uint64_t kRowGroupElements = 16384;

// What every task of a staged launch shares: the prepared runners, the row space and its groups,
// the temporaries kept in row windows, and the elementwise stages run by JIT kernels.
struct StagedRows {
  std::vector<fast::BlockRunner> blocks;
  std::vector<std::unique_ptr<fast::ReduceRunner>> reductions;
  std::vector<RowTemporary> temps;
  std::vector<WindowedAccess> windowed;
  std::vector<std::optional<fast::JitRows>> jit;  // per stage
  std::uint64_t n = 0, rows = 0, group = 1;       // row length, rows, rows per group
};

// One task's share of a staged launch: its own copies of the runners (their windowed accessors
// are pointed at its windows group by group), its scratch and its windows.
class RowTask {
 public:
  explicit RowTask(const StagedRows& shared) : s_(shared), blocks_(shared.blocks) {
    const std::size_t ns = blocks_.size();
    reductions_.resize(ns);
    scratch_.resize(ns);
    ptrs_.resize(ns);
    for (std::size_t k = 0; k < ns; ++k) {
      if (shared.reductions[k]) {
        reductions_[k] = shared.reductions[k]->task_copy();
        continue;
      }
      scratch_[k] = std::make_unique<fast::Scratch>(blocks_[k].scratch_bytes());
      ptrs_[k].resize(blocks_[k].num_regs());
    }
    for (const RowTemporary& t : shared.temps)
      windows_.push_back(std::make_unique<fast::Scratch>(shared.group * shared.n * t.esize));
  }

  // Groups [g0, g1), every stage on one group after the other; false on a fault.
  bool run_groups(std::uint64_t g0, std::uint64_t g1) {
    for (std::uint64_t g = g0; g < g1; ++g) {
      const std::uint64_t r0 = g * s_.group, r1 = std::min(s_.rows, r0 + s_.group);
      point_windows_at(r0);
      for (std::size_t k = 0; k < blocks_.size(); ++k)
        if (!run_stage(k, r0, r1)) return false;
    }
    return true;
  }

 private:
  // Position r0 * n of a temporary is the first element of its window. The accessors only
  // address positions [r0 * n, r1 * n) of the group, which land inside the window.
  void point_windows_at(std::uint64_t r0) {
    for (const WindowedAccess& a : s_.windowed) {
      const auto origin =
          reinterpret_cast<std::uintptr_t>(windows_[a.temp]->data()) - r0 * s_.n * s_.temps[a.temp].esize;
      auto* base = reinterpret_cast<std::byte*>(origin);
      fast::BlockRunner& r = runner_part(blocks_, reductions_, a.stage, a.part);
      if (a.load)
        r.set_load_base(a.index, base);
      else
        r.set_store_base(a.index, base);
    }
  }

  bool run_stage(std::size_t k, std::uint64_t r0, std::uint64_t r1) {
    if (reductions_[k]) return reductions_[k]->run_rows(r0, r1);
    if (s_.jit[k]) return s_.jit[k]->run(blocks_[k], r0, r1);
    const std::uint64_t end = r1 * s_.n;
    for (std::uint64_t p = r0 * s_.n; p < end; p += fast::kBlock) {
      const std::size_t len = static_cast<std::size_t>(std::min<std::uint64_t>(fast::kBlock, end - p));
      if (!blocks_[k].run(p, len, scratch_[k]->data(), ptrs_[k].data())) return false;
    }
    return true;
  }

  const StagedRows& s_;
  std::vector<fast::BlockRunner> blocks_;
  std::vector<std::unique_ptr<fast::ReduceRunner>> reductions_;
  std::vector<std::unique_ptr<fast::Scratch>> scratch_;
  std::vector<std::vector<void*>> ptrs_;
  std::vector<std::unique_ptr<fast::Scratch>> windows_;
};

}  // namespace

// A staged program whose stages all iterate the same [rows, n] space: every stage runs on one
// group of rows after the other, so what a stage writes for a later one is still in cache when
// it is read; values consumed inside the launch live in a per-task window of the group and
// never reach memory.
bool CpuExecutor::run_staged_rows(const FusedProgram& p, const Binding& bind) {
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
  StagedRows rows;
  const std::optional<RowSpace> space = prepare_row_stages(p, stages, rows.blocks, rows.reductions);
  if (!space) return false;
  rows.n = space->n;
  rows.rows = space->rows;
  rows.group = std::max<std::uint64_t>(1, kRowGroupElements / rows.n);
  rows.temps = row_temporaries(p, stages, bind, space->full);
  rows.windowed = windowed_accesses(rows.temps, rows.blocks, rows.reductions);
  const std::size_t streamed = stream_row_outputs(rows.blocks, rows.windowed, rows.rows * rows.n);
  rows.jit.resize(ns);
  std::uint64_t jit_stages = 0;
  for (std::size_t k = 0; k < ns; ++k)
    if (!rows.reductions[k]) {
      std::vector<bool> nontemporal;
      for (const fast::Accessor& a : rows.blocks[k].store_accessors()) nontemporal.push_back(a.stream);
      rows.jit[k] = fast::JitRows::make(device_.jit_kernel(p.stages[k], *stages[k].compiled, 1), rows.blocks[k],
                                        stages[k].launch.scalars, rows.n, nontemporal);
      jit_stages += rows.jit[k] ? 1 : 0;
    }

  const std::uint64_t groups = (rows.rows + rows.group - 1) / rows.group;
  const std::uint64_t grain = std::max<std::uint64_t>(1, fast::kParallelThreshold / 2 / (rows.group * rows.n));
  std::atomic<bool> failed{false};
  fast::parallel_ranges(stages[0].launch, groups, grain, [&](std::uint64_t g0, std::uint64_t g1) {
    if (!RowTask(rows).run_groups(g0, g1)) failed.store(true, std::memory_order_relaxed);
    if (streamed != 0) fast::stream_fence();
  });
  if (failed.load(std::memory_order_relaxed)) return false;
  for (std::size_t k = 0; k < ns; ++k) {
    commit(device_, handles_, stages[k], bind);
    count_launch(device_, p.stages[k].kind);
  }
  device_.counters().row_interleaved.fetch_add(1, std::memory_order_relaxed);
  device_.counters().row_window_temporaries.fetch_add(rows.temps.size(), std::memory_order_relaxed);
  device_.counters().row_jit_stages.fetch_add(jit_stages, std::memory_order_relaxed);
  device_.counters().nontemporal_outputs.fetch_add(streamed, std::memory_order_relaxed);
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
  if (fusion::is_staged(p.kind)) {
    device_.counters().launches_by_kind[static_cast<std::size_t>(p.kind)].fetch_add(1, std::memory_order_relaxed);
    const ir::RelativeConverter& c = ctx.converter();
    if (run_staged_rows(p, Binding{c.tensors_rel2glob(), c.shapes_rel2glob(), c.scalars()})) return;
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

namespace {

// An AllReduce over this device alone is the identity. When it consumes its input and nothing
// else holds the input's buffer, the output takes that buffer instead of a copy: a daemon of a
// distributed job then reduces across daemons in place on it (ClientSession::in_place_across_
// daemons, which also runs Broadcast this way), which is what Gloo's in-place all-reduce costs. Anything else (an
// attribute or an operand the reference would refuse, a shared buffer) goes to the reference, which copies.
bool hand_over_all_reduce(const ir::Operation& op, CpuDevice::Handles& handles) {
  const ir::TensorIr& in = op.inputs()[0];
  const ir::TensorIr& out = op.outputs()[0];
  if (op.attrs.empty() || op.attrs.size() > 2 || !ir::reduce_operation_of(op.attrs[0]) ||
      in.status != TensorStatus::ReadWrite || in.shape != out.shape || !(in.dtype == out.dtype) ||
      in.dtype.is_quantized())
    return false;
  const HostTensor* t = handles.get_handle_ref(in.id);
  if (t == nullptr || !(t->dtype() == in.dtype) || t->shape() != in.shape || !t->buffer_owned_by_only(1)) return false;
  HostTensor moved = *t;
  (void)handles.free(in);
  handles.register_handle(out.id, std::move(moved));
  return true;
}

}  // namespace

bool CpuExecutor::execute_fast(const ir::Operation& op) {
  if (op.kind == OpKind::Drop_Drop || op.kind == OpKind::Init_Init) return false;
  CpuDevice::Handles& handles = handles_;
  if (handles.has_errors())
    for (const ir::TensorIr& t : op.inputs())
      if (handles.error_of(t.id) != nullptr) return false;  // the reference skips it
  // The layer kernels take f32 and f64; f16 and bf16 run on their f32 form (fast_widen.h).
  auto layer = [&](fast::SingleOpKernel kernel) {
    return kernel(op, device_, handles) || fast::run_through_f32(op, device_, handles, kernel);
  };
  if (ir::build::conv_kind_info(op.kind)) return layer(&fast::run_conv);
  if (ir::build::pool_spatial_dims(op.kind) != 0) return layer(&fast::run_pool);
  if (fast::is_sort_kind(op.kind)) return fast::run_sort(op, device_, handles);
  if (op.kind == OpKind::Module_LayerNorm || op.kind == OpKind::Module_BatchNorm ||
      op.kind == OpKind::Module_Embedding || op.kind == OpKind::Module_EmbeddingBackward)
    return layer(&fast::run_module);
  if (op.kind == OpKind::Base_Slice || op.kind == OpKind::Base_SliceAssign || op.kind == OpKind::Base_Permute ||
      op.kind == OpKind::Base_Expand || op.kind == OpKind::Base_Flip)
    return fast::run_layout(op, device_, handles);
  if (op.kind == OpKind::Distributed_AllReduce) return hand_over_all_reduce(op, handles);
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

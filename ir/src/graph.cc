// GraphIr boundary classification (docs/spec/ir.md §7) and cached-graph bindings (docs/spec/ir.md §8).
#include "kiln/ir/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace kiln::ir {
namespace {

// The outputs of `op`, clamped so that a malformed op (num_inputs > tensors) never reads out of
// bounds: classify and bind see ops from remote clients.
std::span<const TensorIr> outputs_of(const Operation& op) {
  const std::size_t n = std::min<std::size_t>(op.num_inputs, op.tensors.size());
  return {op.tensors.data() + n, op.tensors.size() - n};
}

// Relative id -> concrete id for one binding; intermediates are added as they are met.
using IdMap = std::unordered_map<TensorId, TensorId>;

Status check_operations(const GraphIr& graph) {
  for (std::size_t i = 0; i < graph.operations.size(); ++i) {
    const Operation& op = graph.operations[i];
    const auto kind = static_cast<std::size_t>(op.kind);
    if (kind >= static_cast<std::size_t>(kNumOpKinds))
      return make_error(ErrorCode::Invalid, fmt::format("bind: operation {} has unknown kind {}", i, kind));
    if (op.num_inputs > op.tensors.size())
      return make_error(ErrorCode::Invalid, fmt::format("bind: operation {} ({}) declares {} inputs but has {} tensors",
                                                        i, op.kind_name(), op.num_inputs, op.tensors.size()));
  }
  return Status::Ok();
}

Result<IdMap> boundary_ids(const GraphBindings& bindings) {
  IdMap ids;
  ids.reserve(bindings.tensors.size());
  std::unordered_set<TensorId> concrete;
  concrete.reserve(bindings.tensors.size());
  for (const TensorBinding& b : bindings.tensors) {
    if (IntermediateIdSource::is_intermediate(b.concrete))
      return make_error(ErrorCode::Invalid,
                        fmt::format("bind: relative tensor {} bound to {}, an id reserved for intermediates (bit 63)",
                                    b.relative.value(), b.concrete.value()));
    if (!ids.emplace(b.relative, b.concrete).second)
      return make_error(ErrorCode::Invalid,
                        fmt::format("bind: relative tensor {} bound twice (to {} and {})", b.relative.value(),
                                    ids.at(b.relative).value(), b.concrete.value()));
    if (!concrete.insert(b.concrete).second)
      return make_error(ErrorCode::Invalid,
                        fmt::format("bind: concrete tensor {} bound to two relative tensors", b.concrete.value()));
  }
  return ids;
}

// Writes the bound copy of `rel` into `out` (visit_mut of docs/spec/ir.md §5.1 with the rules of §8).
void bind_operation(const Operation& rel, const GraphBindings& bindings, IdMap& ids, IntermediateIdSource& source,
                    Operation& out) {
  out = rel;
  for (TensorIr& t : out.tensors) {
    auto it = ids.find(t.id);
    if (it == ids.end()) it = ids.emplace(t.id, source.next()).first;
    t.id = it->second;
    for (std::uint64_t& d : t.shape)
      if (d < bindings.shapes.size()) d = bindings.shapes[d];
  }
  for (ScalarIr& s : out.scalars)
    if (s.kind() == ScalarIr::Kind::UInt && s.as_uint() < bindings.scalars.size()) s = bindings.scalars[s.as_uint()];
  for (Slice& r : out.ranges)
    if (r.start >= 0 && static_cast<std::uint64_t>(r.start) < bindings.ranges.size())
      r = bindings.ranges[static_cast<std::size_t>(r.start)];
}

}  // namespace

GraphBoundary classify(std::span<const Operation> ops) {
  std::vector<TensorId> referenced;  // first-use order
  std::vector<TensorId> produced;    // production order
  std::unordered_set<TensorId> referenced_set, produced_set, consumed;
  for (const Operation& op : ops) {
    if (op.is_drop())
      for (const TensorIr& t : op.tensors) consumed.insert(t.id);
    // Init registers a buffer provided out of band: its output stays a graph input.
    if (!op.is_init())
      for (const TensorIr& t : outputs_of(op))
        if (produced_set.insert(t.id).second) produced.push_back(t.id);
    for (const TensorIr& t : op.tensors) {
      if (referenced_set.insert(t.id).second) referenced.push_back(t.id);
      if (t.status == TensorStatus::ReadWrite) consumed.insert(t.id);
    }
  }
  GraphBoundary b;
  for (TensorId id : referenced)
    if (!produced_set.contains(id)) b.inputs.push_back(id);
  for (TensorId id : produced)
    if (!consumed.contains(id)) b.outputs.push_back(id);
  return b;
}

GraphIr::GraphIr(std::vector<Operation> ops) : operations(std::move(ops)) {
  GraphBoundary b = classify(operations);
  inputs = std::move(b.inputs);
  outputs = std::move(b.outputs);
}

ClientBindings make_bindings(const GraphIr& relative_graph, const RelativeConverter& context,
                             const InputResolver& resolve_input, const ConcreteIdSource& new_concrete_id) {
  ClientBindings cb;
  GraphBindings& b = cb.bindings;
  for (TensorId r : relative_graph.inputs) {
    const TensorIr* global = context.global_tensor(r.value());
    if (global == nullptr) continue;
    if (std::optional<TensorId> c = resolve_input(*global)) b.tensors.push_back({r, *c});
  }
  for (TensorId r : relative_graph.outputs) {
    const TensorIr* global = context.global_tensor(r.value());
    if (global == nullptr) continue;
    const TensorId c = new_concrete_id();
    b.tensors.push_back({r, c});
    cb.outputs.push_back({r, *global, c});
  }
  // The converter's tables are already dense (ids 0..n), so they are copied as they are.
  const auto shapes = context.shapes_rel2glob();
  b.shapes.assign(shapes.begin(), shapes.end());
  const auto scalars = context.scalars();
  b.scalars.assign(scalars.begin(), scalars.end());
  const auto ranges = context.ranges();
  b.ranges.assign(ranges.begin(), ranges.end());
  return cb;
}

Result<GraphIr> bind(const GraphIr& graph, const GraphBindings& bindings, IntermediateIdSource& ids) {
  KILN_RETURN_IF_ERROR(check_operations(graph));
  KILN_ASSIGN_OR_RETURN(IdMap map, boundary_ids(bindings));
  std::vector<Operation> bound(graph.operations.size());
  for (std::size_t i = 0; i < graph.operations.size(); ++i)
    bind_operation(graph.operations[i], bindings, map, ids, bound[i]);
  return GraphIr(std::move(bound));
}

Status replay(const GraphIr& graph, const GraphBindings& bindings, IntermediateIdSource& ids,
              const OperationVisitor& visitor) {
  KILN_RETURN_IF_ERROR(check_operations(graph));
  KILN_ASSIGN_OR_RETURN(IdMap map, boundary_ids(bindings));
  Operation scratch;  // reused for every op: copy-assignment keeps its storage
  for (const Operation& op : graph.operations) {
    bind_operation(op, bindings, map, ids, scratch);
    KILN_RETURN_IF_ERROR(visitor(scratch));
  }
  return Status::Ok();
}

}  // namespace kiln::ir

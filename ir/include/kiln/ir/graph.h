// GraphIr with boundary classification (docs/spec/ir.md §7), and cached graphs: GraphId, GraphBindings,
// bind and replay (docs/spec/ir.md §8).
//
// Thread-safety: every function here is pure apart from IntermediateIdSource, whose next() may be
// called from any thread. A GraphIr is plain data.
//
// Usage (client side, executing a fusion segment as one cached graph):
//   GraphIr graph(relative_ops);                               // registered once under a GraphId
//   ClientBindings cb = make_bindings(graph, converter, resolve_input, new_concrete_id);
//   for (const OutputRegistration& o : cb.outputs) register_handle(o.global.id, o.concrete, ...);
//   send(graph_id, cb.bindings);
// Server side:
//   IntermediateIdSource& ids = device.intermediate_ids();     // owned by the device
//   KILN_RETURN_IF_ERROR(replay(graph, bindings, ids, [&](const Operation& op) { return run(op); }));
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/ir/operation.h"
#include "kiln/ir/relative.h"

namespace kiln::ir {

struct GraphBoundary {
  std::vector<TensorId> inputs;   // referenced but not produced by a compute op (first-use order)
  std::vector<TensorId> outputs;  // produced and neither consumed (ReadWrite) nor dropped (production order)
  friend bool operator==(const GraphBoundary&, const GraphBoundary&) = default;
};

// classify(ops) (docs/spec/ir.md §7). Init does not produce; Drop and every ReadWrite use consume.
// Never reads out of bounds, even for an op whose num_inputs exceeds its tensor count.
GraphBoundary classify(std::span<const Operation> ops);

struct GraphIr {
  std::vector<Operation> operations;  // execution order
  std::vector<TensorId> inputs;
  std::vector<TensorId> outputs;

  GraphIr() = default;
  // Builds the graph and classifies its boundary.
  explicit GraphIr(std::vector<Operation> ops);
  std::size_t size() const { return operations.size(); }
  bool empty() const { return operations.empty(); }
  friend bool operator==(const GraphIr&, const GraphIr&) = default;
};

// Id under which a relative graph is registered once (docs/spec/ir.md §8).
class GraphId {
 public:
  constexpr explicit GraphId(std::uint64_t v) : value_(v) {}
  constexpr std::uint64_t value() const { return value_; }
  friend constexpr auto operator<=>(GraphId, GraphId) = default;

 private:
  std::uint64_t value_;
};

// One boundary tensor of a binding: the relative id in the graph and the concrete id it stands for.
struct TensorBinding {
  TensorId relative;
  TensorId concrete;
  friend bool operator==(const TensorBinding&, const TensorBinding&) = default;
};

// What each invocation of a cached graph sends (docs/spec/ir.md §8). Every table is dense and indexed by
// the placeholder: shapes by relative dim id, scalars by UInt(k), ranges by a relative slice's start.
struct GraphBindings {
  std::vector<TensorBinding> tensors;  // boundary tensors only (inputs, surviving outputs)
  std::vector<std::uint64_t> shapes;
  std::vector<ScalarIr> scalars;
  std::vector<Slice> ranges;
  friend bool operator==(const GraphBindings&, const GraphBindings&) = default;
};

// Fresh ids for the intermediates of bound graphs: a counter with bit 63 set, so they never
// collide with client ids (docs/spec/ir.md §8). Kiln has no process-wide counter: the device owns one
// source and passes it to bind/replay, so tests start fresh.
// Thread-safety: next() may be called from any thread concurrently.
class IntermediateIdSource {
 public:
  static constexpr std::uint64_t kIntermediateBit = std::uint64_t{1} << 63;

  IntermediateIdSource() = default;
  IntermediateIdSource(const IntermediateIdSource&) = delete;
  IntermediateIdSource& operator=(const IntermediateIdSource&) = delete;

  TensorId next() {
    // relaxed: only the uniqueness of the values matters; no other memory is published with them.
    const std::uint64_t n = counter_.fetch_add(1, std::memory_order_relaxed);
    return TensorId(kIntermediateBit | (n & ~kIntermediateBit));
  }
  // How many ids were handed out so far.
  std::uint64_t issued() const { return counter_.load(std::memory_order_relaxed); }

  static constexpr bool is_intermediate(TensorId id) { return (id.value() & kIntermediateBit) != 0; }

 private:
  std::atomic<std::uint64_t> counter_{0};
};

// ---- Client side (docs/spec/ir.md §8, "Relativize")

// A surviving output the client must register a handle for: the client's global tensor
// (latest occurrence: id, shape, dtype) now lives under `concrete` on the server.
struct OutputRegistration {
  TensorId relative;
  TensorIr global;
  TensorId concrete;
  friend bool operator==(const OutputRegistration&, const OutputRegistration&) = default;
};

struct ClientBindings {
  GraphBindings bindings;
  std::vector<OutputRegistration> outputs;  // in the order of graph.outputs
};

// The concrete id of the handle that holds `global`, or nullopt when it has none (the input is
// then not listed, as in docs/spec/ir.md §8).
using InputResolver = std::function<std::optional<TensorId>(const TensorIr& global)>;
// A new concrete id for an output (the client's own id source).
using ConcreteIdSource = std::function<TensorId()>;

// Builds the bindings of `relative_graph` (the relative ops of a segment, boundary classified on
// relative ids) from the converter that relativized it (its execution context, docs/spec/fusion.md §3.10).
// Relative ids the context does not know are skipped. Copies shapes, scalars and ranges.
ClientBindings make_bindings(const GraphIr& relative_graph, const RelativeConverter& context,
                             const InputResolver& resolve_input, const ConcreteIdSource& new_concrete_id);

// ---- Server side (docs/spec/ir.md §8, "Bind / replay")
//
// The bindings come from remote clients and are checked before anything is bound:
//   * a relative id bound twice, two relative ids bound to one concrete id, or a concrete id with
//     bit 63 set (reserved for intermediates) is an Invalid error;
//   * an operation with an unknown kind or more inputs than tensors is an Invalid error;
//   * out-of-range placeholders follow the spec: a dim >= len(shapes) stays as it is, a scalar
//     UInt(k) with k >= len(scalars) or a range whose start is not an index of ranges stays a
//     placeholder.
// Unbound tensor ids (intermediates) get fresh ids from `ids`, one per relative id per call.

// The concrete graph, its boundary re-classified on concrete ids.
Result<GraphIr> bind(const GraphIr& graph, const GraphBindings& bindings, IntermediateIdSource& ids);

// Hands each bound op, in order, to `visitor`. Nothing is visited when the bindings are rejected;
// the first error the visitor returns stops the replay and is returned. The op reference is valid
// only during the call (its storage is reused for the next op).
using OperationVisitor = std::function<Status(const Operation& bound)>;
Status replay(const GraphIr& graph, const GraphBindings& bindings, IntermediateIdSource& ids,
              const OperationVisitor& visitor);

}  // namespace kiln::ir

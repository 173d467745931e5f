#include "kiln/ir/operation.h"

#include "kiln/ir/hash.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln::ir {
namespace {

using Hasher = StructuralHasher;

void hash_tensor_into(Hasher& hs, const TensorIr& t) {
  hs.add(t.id.value());
  hs.add_shape(t.shape);
  hs.add(static_cast<std::uint64_t>(t.status));
  hs.add_dtype(t.dtype);
}

std::string attrs_to_string(const AttrList& a) {
  std::string s;
  for (std::size_t i = 0; i < a.size(); ++i) s += fmt::format("{}{}", i ? "," : "", a[i]);
  return s;
}

// Does `n` fit [lo, hi] where hi may be kVariadic?
bool in_range(std::size_t n, int lo, int hi) {
  return n >= static_cast<std::size_t>(lo) && (hi == kVariadic || n <= static_cast<std::size_t>(hi));
}

}  // namespace

std::string Operation::kind_name() const {
  switch (kind) {
    case OpKind::Custom_Custom: return "Custom";
    case OpKind::Drop_Drop: return "Drop";
    case OpKind::Init_Init: return "Init::InitOperationIr";
    default: break;
  }
  return fmt::format("{}::{}", family_name(family), info().variant);
}

std::string format_tensors(std::span<const TensorIr> ts) {
  std::string s;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    if (i) s += ", ";
    s += ts[i].to_string();
  }
  return s;
}

std::string Operation::to_string() const {
  std::string s = kind_name();
  if (family_carries_dtype(family)) s += fmt::format("<{}>", dtype.name());
  if (kind == OpKind::Custom_Custom) s += fmt::format("[{}]", custom_id);
  s += fmt::format("({}) -> ({})", format_tensors(inputs()), format_tensors(outputs()));
  if (!scalars.empty()) {
    s += " scalars[";
    for (std::size_t i = 0; i < scalars.size(); ++i) s += (i ? ", " : "") + scalars[i].to_string();
    s += "]";
  }
  if (!ranges.empty()) {
    s += " ranges[";
    for (std::size_t i = 0; i < ranges.size(); ++i) s += (i ? ", " : "") + ranges[i].to_string();
    s += "]";
  }
  if (!attrs.empty()) s += " attrs[" + attrs_to_string(attrs) + "]";
  return s;
}

Status Operation::validate() const {
  // Range checks first: an Operation decoded or built from untrusted input may carry any value.
  const std::size_t kind_index = static_cast<std::size_t>(kind);
  if (kind_index >= static_cast<std::size_t>(kNumOpKinds))
    return make_error(ErrorCode::Invalid, fmt::format("unknown operation kind {}", kind_index));
  if (static_cast<std::size_t>(family) >= static_cast<std::size_t>(kNumFamilies))
    return make_error(ErrorCode::Invalid, fmt::format("unknown operation family {}", static_cast<int>(family)));
  const OpInfo& in = info();
  if (!group_admits(in.group, family))
    return make_error(ErrorCode::Invalid,
                      fmt::format("operation {} cannot belong to family {}", in.variant, family_name(family)));
  // The name is formatted only for an error: validate runs on every op a client sends.
  auto name = [this] { return kind_name(); };
  if (family == Family::NumericFloat || family == Family::Float) {
    if (!dtype.is_float() && !dtype.is_quantized())
      return make_error(ErrorCode::DTypeMismatch, fmt::format("{}: family {} carries non-float dtype {}", name(),
                                                              family_name(family), dtype.name()));
  } else if (family == Family::NumericInt) {
    if (!dtype.is_integral())
      return make_error(ErrorCode::DTypeMismatch,
                        fmt::format("{}: family NumericInt carries non-integer dtype {}", name(), dtype.name()));
  }
  const SignatureInfo& sig = signature_info(in.signature);
  if (num_inputs > tensors.size())
    return make_error(ErrorCode::Invalid,
                      fmt::format("{}: {} inputs declared but only {} tensors", name(), num_inputs, tensors.size()));
  const std::size_t outs = tensors.size() - num_inputs;
  if (!in_range(num_inputs, sig.min_inputs, sig.max_inputs))
    return make_error(ErrorCode::Invalid, fmt::format("{}: takes {}..{} inputs, got {}", name(), sig.min_inputs,
                                                      sig.max_inputs, num_inputs));
  if (!in_range(outs, sig.min_outputs, sig.max_outputs))
    return make_error(ErrorCode::Invalid, fmt::format("{}: produces {}..{} outputs, got {}", name(), sig.min_outputs,
                                                      sig.max_outputs, outs));
  if (!in_range(scalars.size(), sig.min_scalars, sig.max_scalars))
    return make_error(ErrorCode::Invalid, fmt::format("{}: takes {}..{} scalars, got {}", name(), sig.min_scalars,
                                                      sig.max_scalars, scalars.size()));
  if (!in_range(attrs.size(), sig.min_attrs, sig.max_attrs))
    return make_error(ErrorCode::Invalid, fmt::format("{}: takes {}..{} attributes, got {}", name(), sig.min_attrs,
                                                      sig.max_attrs, attrs.size()));
  if (!sig.ranges && !ranges.empty())
    return make_error(ErrorCode::Invalid, fmt::format("{}: carries no slice ranges", name()));
  if (sig.ranges && !tensors.empty() && ranges.size() > tensors[0].shape.size())
    return make_error(ErrorCode::RankMismatch, fmt::format("{}: {} ranges for a rank-{} tensor", name(), ranges.size(),
                                                           tensors[0].shape.size()));
  for (const Slice& r : ranges)
    if (r.step == 0) return make_error(ErrorCode::Invalid, fmt::format("{}: slice step must not be 0", name()));
  if (kind != OpKind::Custom_Custom && !custom_id.empty())
    return make_error(ErrorCode::Invalid, fmt::format("{}: only Custom carries an id", name()));
  for (std::size_t i = num_inputs; i < tensors.size(); ++i)
    if (tensors[i].status != TensorStatus::NotInit)
      return make_error(ErrorCode::Invalid, fmt::format("{}: output {} must have status NotInit, has {}", name(),
                                                        tensors[i].to_string(), status_name(tensors[i].status)));
  for (std::size_t i = 0; i < num_inputs; ++i)
    if (tensors[i].status == TensorStatus::NotInit)
      return make_error(ErrorCode::Invalid,
                        fmt::format("{}: input {} has status NotInit", name(), tensors[i].to_string()));
  if (kind == OpKind::Drop_Drop && tensors[0].status != TensorStatus::ReadWrite)
    return make_error(ErrorCode::Invalid, fmt::format("Drop: {} must have status ReadWrite", tensors[0].to_string()));
  return Status::Ok();
}

std::vector<TensorIr> Operation::mark_read_only(std::span<const TensorId> ids) {
  std::vector<TensorIr> changed;
  if (kind == OpKind::Init_Init) return changed;
  for (TensorIr& t : inputs()) {
    if (t.status == TensorStatus::ReadWrite && std::find(ids.begin(), ids.end(), t.id) != ids.end()) {
      changed.push_back(t);
      t.status = TensorStatus::ReadOnly;
    }
  }
  return changed;
}

bool operator==(const Operation& a, const Operation& b) {
  if (a.kind != b.kind || a.family != b.family || a.num_inputs != b.num_inputs) return false;
  if (family_carries_dtype(a.family) && !(a.dtype == b.dtype)) return false;
  return a.tensors == b.tensors && a.scalars == b.scalars && a.ranges == b.ranges && a.attrs == b.attrs &&
         a.custom_id == b.custom_id;
}

std::uint64_t hash_tensor(const TensorIr& t) {
  Hasher hs;
  hash_tensor_into(hs, t);
  return hs.finish();
}

std::uint64_t hash_operation(const Operation& op) {
  Hasher hs;
  hs.add(static_cast<std::uint64_t>(op.kind) << 8 | static_cast<std::uint64_t>(op.family));
  if (family_carries_dtype(op.family)) hs.add_dtype(op.dtype);
  if (op.info().signature == Signature::Random) {
    // Only the output and the kind of distribution (docs/spec/fusion.md §3.8).
    for (const TensorIr& t : op.outputs()) hash_tensor_into(hs, t);
    if (!op.attrs.empty()) hs.add(static_cast<std::uint64_t>(op.attrs[0]));
    return hs.finish();
  }
  hs.add(op.num_inputs);
  for (const TensorIr& t : op.tensors) hash_tensor_into(hs, t);
  for (const ScalarIr& s : op.scalars) {
    hs.add(static_cast<std::uint64_t>(s.kind()));
    hs.add(s.hash_bits());
  }
  for (const Slice& r : op.ranges) {
    hs.add(static_cast<std::uint64_t>(r.start));
    hs.add(r.end ? static_cast<std::uint64_t>(*r.end) : 0x8000000000000000ull);
    hs.add(static_cast<std::uint64_t>(r.step));
  }
  for (std::int64_t a : op.attrs) hs.add(static_cast<std::uint64_t>(a));
  for (char c : op.custom_id) hs.add(static_cast<unsigned char>(c));
  return hs.finish();
}

}  // namespace kiln::ir

namespace kiln::ir {

std::optional<ReduceOperation> reduce_operation_of(std::int64_t attr) {
  if (attr < static_cast<std::int64_t>(ReduceOperation::Sum) || attr > static_cast<std::int64_t>(ReduceOperation::Prod))
    return std::nullopt;
  return static_cast<ReduceOperation>(attr);
}

const char* reduce_operation_name(ReduceOperation op) {
  switch (op) {
    case ReduceOperation::Sum: return "sum";
    case ReduceOperation::Mean: return "mean";
    case ReduceOperation::Min: return "min";
    case ReduceOperation::Max: return "max";
    case ReduceOperation::Prod: return "prod";
  }
  return "unknown";
}

}  // namespace kiln::ir

// Host side of launches (launch.h).
#include "kiln/cuda/launch.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "kiln/ir/shape.h"
#include "kiln/reference/tensor.h"

namespace kiln::cuda {

using fusion::FusedProgram;
using fusion::InputRole;

namespace {

// Bytes of one stored element (the kernels' storage types: bools as u8 or u32).
std::uintptr_t element_bytes(ir::DType d) {
  if (d.is_bool()) return d.bool_store() == ir::BoolStore::U32 ? 4 : 1;
  return d.size_bytes();
}

using Strides = std::vector<std::int64_t>;

Strides row_major(const ir::Shape& s) {
  Strides st(s.size(), 1);
  std::int64_t acc = 1;
  for (std::size_t d = s.size(); d-- > 0;) {
    st[d] = acc;
    acc *= static_cast<std::int64_t>(s[d]);
  }
  return st;
}

// `shape` with element strides `st`, read over `reference` (aligned right, numpy style):
// broadcast dims (size 1 where the reference is not) get stride 0.
Result<Strides> broadcast_to(const ir::Shape& shape, const Strides& st, const ir::Shape& reference, bool* broadcast,
                             std::string_view what) {
  if (shape.size() > reference.size())
    return make_error(ErrorCode::IncompatibleShapes,
                      fmt::format("{} {} does not broadcast to {}", what, ir::shape_to_string(shape),
                                  ir::shape_to_string(reference)));
  Strides out(reference.size(), 0);
  const std::size_t lead = reference.size() - shape.size();
  for (std::size_t d = lead; d < reference.size(); ++d) {
    const std::size_t e = d - lead;
    if (shape[e] == reference[d]) {
      out[d] = reference[d] == 1 ? 0 : st[e];
    } else if (shape[e] == 1) {
      out[d] = 0;
      if (broadcast) *broadcast = true;
    } else {
      return make_error(ErrorCode::IncompatibleShapes,
                        fmt::format("{} {} does not broadcast to {}", what, ir::shape_to_string(shape),
                                    ir::shape_to_string(reference)));
    }
  }
  for (std::size_t d = 0; d < lead; ++d)
    if (reference[d] != 1 && broadcast) *broadcast = true;
  return out;
}

const ir::TensorIr* global_of(const Binding& b, std::uint64_t rel) {
  return rel < b.tensors.size() ? &b.tensors[rel] : nullptr;
}

// Strides of program input i (a view: through its view) over the reference.
Result<Strides> input_strides(const FusedProgram& p, std::uint32_t i, const Binding& binding,
                              const ir::Shape& reference) {
  const fusion::ProgramInput& in = p.inputs[i];
  std::uint32_t src = i;
  if (in.role == InputRole::View) {
    if (!in.view || in.view->source >= p.inputs.size()) return make_error(ErrorCode::Internal, "view without a source");
    src = in.view->source;
  }
  const ir::TensorIr* g = global_of(binding, p.inputs[src].tensor);
  if (g == nullptr) return make_error(ErrorCode::Internal, fmt::format("input {}: unknown relative tensor", i));
  if (g->shape.size() > static_cast<std::size_t>(kMaxRank)) return make_error(ErrorCode::Unsupported, "rank above 8");
  ir::Shape shape = g->shape;
  Strides st = row_major(shape);
  if (in.role == InputRole::View) {
    if (in.view->op == ir::OpKind::Base_SwapDims) {
      const auto d1 = static_cast<std::size_t>(in.view->dim1), d2 = static_cast<std::size_t>(in.view->dim2);
      if (in.view->dim1 < 0 || in.view->dim2 < 0 || d1 >= shape.size() || d2 >= shape.size())
        return make_error(ErrorCode::Invalid, "swap_dims view: dims out of range");
      std::swap(shape[d1], shape[d2]);
      std::swap(st[d1], st[d2]);
    } else {
      KILN_ASSIGN_OR_RETURN(ir::Shape vs, concrete_shape(in.view->shape, binding));
      if (ir::num_elements(vs) != ir::num_elements(shape))
        return make_error(ErrorCode::Invalid, "reshape view: element count");
      shape = vs;
      st = row_major(shape);  // a reshape of a row-major buffer is row-major in its own shape
    }
  }
  return broadcast_to(shape, st, reference, nullptr, fmt::format("input {}", i));
}

// Strides of program output o over the reference; `masked` when it is a broadcast output.
Result<Strides> output_strides(const FusedProgram& p, std::uint32_t o, const Binding& binding,
                               const ir::Shape& reference, bool* masked) {
  const fusion::ProgramOutput& out = p.outputs[o];
  const ir::TensorIr* g = global_of(binding, out.tensor);
  if (g == nullptr) return make_error(ErrorCode::Internal, fmt::format("output {}: unknown relative tensor", o));
  const ir::Shape& shape = g->shape;
  Strides st = row_major(shape);
  if (out.layout && out.layout->size() == shape.size()) {
    // layout[d] = place of dim d in memory order (0 outermost): innermost place has stride 1.
    std::vector<std::size_t> by_place(shape.size());
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if ((*out.layout)[d] >= shape.size()) return make_error(ErrorCode::Invalid, "output layout is not a permutation");
      by_place[(*out.layout)[d]] = d;
    }
    std::int64_t acc = 1;
    for (std::size_t k = shape.size(); k-- > 0;) {
      st[by_place[k]] = acc;
      acc *= static_cast<std::int64_t>(shape[by_place[k]]);
    }
  }
  return broadcast_to(shape, st, reference, masked, fmt::format("output {}", o));
}

bool is_contiguous(const Strides& st, const ir::Shape& ref) {
  const Strides rm = row_major(ref);
  for (std::size_t d = 0; d < ref.size(); ++d)
    if (ref[d] != 1 && st[d] != rm[d]) return false;
  return true;
}

bool is_zero(const Strides& st, const ir::Shape& ref) {
  for (std::size_t d = 0; d < ref.size(); ++d)
    if (ref[d] != 1 && st[d] != 0) return false;
  return true;
}

KilnAccess to_access(const Strides& st, bool contiguous, bool masked) {
  KilnAccess a;
  for (std::size_t d = 0; d < st.size(); ++d) a.strides[d] = st[d];
  a.contiguous = contiguous ? 1 : 0;
  a.masked = masked ? 1 : 0;
  return a;
}

}  // namespace

Result<ir::Shape> concrete_shape(const ir::Shape& relative, const Binding& binding) {
  ir::Shape out;
  for (std::uint64_t id : relative) {
    if (id >= binding.dims.size())
      return make_error(ErrorCode::Internal, fmt::format("relative dim {} is unbound", id));
    out.push_back(binding.dims[id]);
  }
  return out;
}

Result<BlockLayout> block_layout(const FusedProgram& p, std::uint32_t block, const Binding& binding,
                                 const ir::Shape& reference, bool merge) {
  if (block >= p.blocks.size()) return make_error(ErrorCode::Internal, "block index");
  if (reference.size() > static_cast<std::size_t>(kMaxRank)) return make_error(ErrorCode::Unsupported, "rank above 8");
  const fusion::ProgramBlock& b = p.blocks[block];
  std::vector<Strides> acc;
  std::vector<bool> masked;
  for (const fusion::Load& l : b.loads) {
    if (l.source != fusion::LoadSource::Input || l.index >= p.inputs.size())
      return make_error(ErrorCode::Unsupported, "load of an output");
    KILN_ASSIGN_OR_RETURN(Strides st, input_strides(p, l.index, binding, reference));
    acc.push_back(std::move(st));
    masked.push_back(false);
  }
  for (const fusion::Store& s : b.stores) {
    if (s.output >= p.outputs.size()) return make_error(ErrorCode::Internal, "store of an unknown output");
    bool m = false;
    KILN_ASSIGN_OR_RETURN(Strides st, output_strides(p, s.output, binding, reference, &m));
    acc.push_back(std::move(st));
    masked.push_back(m);
  }
  ir::Shape dims = reference;
  if (merge) {
    // Drop size-1 dims, then merge d into d+1 wherever every accessor has
    // stride[d] == stride[d+1] * size[d+1] (the pair walks memory as one dim).
    ir::Shape kept;
    std::vector<Strides> kacc(acc.size());
    for (std::size_t d = 0; d < dims.size(); ++d) {
      if (dims[d] == 1) continue;
      kept.push_back(dims[d]);
      for (std::size_t a = 0; a < acc.size(); ++a) kacc[a].push_back(acc[a][d]);
    }
    ir::Shape md;
    std::vector<Strides> macc(acc.size());
    for (std::size_t d = 0; d < kept.size(); ++d) {
      bool fold = !md.empty();
      for (std::size_t a = 0; fold && a < acc.size(); ++a)
        fold = macc[a].back() == kacc[a][d] * static_cast<std::int64_t>(kept[d]);
      if (fold) {
        md.back() *= kept[d];
        for (std::size_t a = 0; a < acc.size(); ++a) macc[a].back() = kacc[a][d];
      } else {
        md.push_back(kept[d]);
        for (std::size_t a = 0; a < acc.size(); ++a) macc[a].push_back(kacc[a][d]);
      }
    }
    if (md.empty()) {
      md.push_back(1);
      for (Strides& s : macc) s.push_back(0);
    }
    dims = md;
    acc = std::move(macc);
  }
  BlockLayout out;
  out.iter.numel = static_cast<std::int64_t>(ir::num_elements(dims));
  out.iter.rank = static_cast<std::int32_t>(dims.size());
  for (std::size_t d = 0; d < dims.size(); ++d) out.iter.dims[d] = static_cast<std::int64_t>(dims[d]);
  bool all_contiguous = true;
  bool vectorizable = true;
  for (std::size_t a = 0; a < acc.size(); ++a) {
    const bool contiguous = is_contiguous(acc[a], dims) && !masked[a];
    all_contiguous = all_contiguous && contiguous;
    const KilnAccess k = to_access(acc[a], contiguous, masked[a]);
    if (a < b.loads.size()) {
      out.loads.push_back(k);
      vectorizable = vectorizable && (b.loads[a].broadcast ? is_zero(acc[a], dims) : contiguous);
    } else {
      out.stores.push_back(k);
      vectorizable = vectorizable && contiguous;
    }
  }
  out.iter.contiguous = all_contiguous ? 1 : 0;
  out.vectorizable = vectorizable;
  return out;
}

Result<KilnReduceShape> reduce_shape(const FusedProgram& p, const Binding& binding) {
  if (p.kind != fusion::ProgramKind::Reduce || p.blocks.size() != 2 || !p.blocks[1].reduction)
    return make_error(ErrorCode::Internal, "not a reduce program");
  KILN_ASSIGN_OR_RETURN(ir::Shape in, concrete_shape(p.blocks[0].reference_shape, binding));
  KILN_ASSIGN_OR_RETURN(ir::Shape out, concrete_shape(p.blocks[1].reference_shape, binding));
  const std::int64_t axis = p.blocks[1].reduction->axis;
  if (axis < 0 || static_cast<std::size_t>(axis) >= in.size() || out.size() != in.size())
    return make_error(ErrorCode::Invalid, "reduction axis or ranks");
  for (std::size_t d = 0; d < in.size(); ++d)
    if (d != static_cast<std::size_t>(axis) ? out[d] != in[d] : out[d] != 1)
      return make_error(ErrorCode::IncompatibleShapes,
                        fmt::format("reduction {} -> {}", ir::shape_to_string(in), ir::shape_to_string(out)));
  KilnReduceShape r;
  r.outer = r.inner = 1;
  for (std::size_t d = 0; d < static_cast<std::size_t>(axis); ++d) r.outer *= static_cast<std::int64_t>(in[d]);
  r.n = static_cast<std::int64_t>(in[static_cast<std::size_t>(axis)]);
  for (std::size_t d = static_cast<std::size_t>(axis) + 1; d < in.size(); ++d)
    r.inner *= static_cast<std::int64_t>(in[d]);
  r.outputs = r.outer * r.inner;
  return r;
}

std::int64_t row_window_bytes(std::span<const ir::DType> windows, std::int64_t n) {
  std::int64_t bytes = 0;
  for (const ir::DType& d : windows) bytes += (n * static_cast<std::int64_t>(d.size_bytes()) + 15) / 16 * 16;
  return bytes;
}

RowLaunch row_launch(std::span<const ir::DType> windows, std::int64_t n, std::uint32_t threads,
                     std::uint64_t max_shared) {
  RowLaunch l;
  l.by_warp = n <= kWarpRowLength;
  l.threads = threads;
  const std::int64_t window = row_window_bytes(windows, n);
  const auto fits = [&](std::uint32_t t) {
    const std::uint64_t rows = l.by_warp ? t / 32 : 1;
    return static_cast<std::uint64_t>(window) * rows <= max_shared;
  };
  if (window > 0) {
    std::uint32_t t = threads;
    while (l.by_warp && t > 32 && !fits(t)) t /= 2;
    if (fits(t)) {
      l.threads = t;
      l.window_bytes = window;
    }
  }
  l.rows_per_block = l.by_warp ? l.threads / 32 : 1;
  l.shared = static_cast<std::size_t>(l.window_bytes) * l.rows_per_block;
  return l;
}

namespace {

// Whether stage k reads a tensor an earlier stage writes other than element by element in the
// row's own positions (a view, an indexed read, or a shape that is neither `full` nor the rows'
// reduced shape).
Status check_row_reads(const FusedProgram& row, std::size_t k, const Binding& binding, const ir::Shape& full) {
  ir::Shape reduced = full;
  reduced.back() = 1;
  const FusedProgram& st = row.stages[k];
  for (std::size_t i = 0; i < st.inputs.size(); ++i) {
    const fusion::ProgramInput& in = st.inputs[i];
    const std::uint64_t rel = in.role == fusion::InputRole::View && in.view && in.view->source < st.inputs.size()
                                  ? st.inputs[in.view->source].tensor
                                  : in.tensor;
    if (!written_by_stages(row, k, rel)) continue;
    if (in.role != fusion::InputRole::Plain && in.role != fusion::InputRole::Broadcast)
      return make_error(ErrorCode::Unsupported, fmt::format("stage {} reads an earlier stage's output as {}", k,
                                                            fusion::input_role_name(in.role)));
    if (rel >= binding.tensors.size()) return make_error(ErrorCode::Internal, "an unbound input");
    const ir::Shape& shape = binding.tensors[rel].shape;
    if (shape != full && shape != reduced)
      return make_error(ErrorCode::Unsupported, fmt::format("stage {} reads an earlier stage's {} across rows of {}", k,
                                                            ir::shape_to_string(shape), ir::shape_to_string(full)));
  }
  return Status::Ok();
}

}  // namespace

Result<RowSpace> row_space(const FusedProgram& row, const Binding& binding) {
  if (row.kind != fusion::ProgramKind::Row || row.stages.empty())
    return make_error(ErrorCode::Internal, "not a Row program");
  ir::Shape full;
  for (std::size_t k = 0; k < row.stages.size(); ++k) {
    const FusedProgram& st = row.stages[k];
    if (st.blocks.empty()) return make_error(ErrorCode::Internal, "a stage without blocks");
    KILN_ASSIGN_OR_RETURN(ir::Shape ref, concrete_shape(st.blocks[0].reference_shape, binding));
    if (k == 0) full = ref;
    if (ref != full || full.empty())
      return make_error(ErrorCode::Unsupported, fmt::format("stage {} iterates {}, stage 0 {}", k,
                                                            ir::shape_to_string(ref), ir::shape_to_string(full)));
    if (st.kind == fusion::ProgramKind::Reduce) {
      KILN_ASSIGN_OR_RETURN(KilnReduceShape rs, reduce_shape(st, binding));
      // The kernel reduces output `row` over the row's n positions: the last axis, exactly.
      const std::int64_t n = static_cast<std::int64_t>(full.back());
      if (static_cast<std::size_t>(st.blocks[1].reduction->axis) + 1 != full.size() || rs.inner != 1 || rs.n != n ||
          rs.outputs * n != static_cast<std::int64_t>(ir::num_elements(full)))
        return make_error(ErrorCode::Unsupported, fmt::format("stage {} does not reduce the last axis", k));
    } else if (st.kind != fusion::ProgramKind::Elementwise) {
      return make_error(ErrorCode::Unsupported,
                        fmt::format("stage {} is a {} program", k, fusion::program_kind_name(st.kind)));
    }
    KILN_RETURN_IF_ERROR(check_row_reads(row, k, binding, full));
  }
  RowSpace space;
  space.n = static_cast<std::int64_t>(full.back());
  const std::uint64_t total = ir::num_elements(full);
  if (space.n == 0 || total == 0) return make_error(ErrorCode::Unsupported, "an empty row space");
  space.rows = static_cast<std::int64_t>(total / full.back());
  return space;
}

Result<KilnMatmulShape> matmul_shape(const ir::Shape& lhs, const ir::Shape& rhs, const ir::Shape& out) {
  if (lhs.size() < 2 || rhs.size() < 2 || out.size() < 2 || out.size() > static_cast<std::size_t>(kMaxRank))
    return make_error(ErrorCode::Unsupported, "matmul ranks");
  KilnMatmulShape s;
  s.m = static_cast<std::int64_t>(lhs[lhs.size() - 2]);
  s.k = static_cast<std::int64_t>(lhs.back());
  s.n = static_cast<std::int64_t>(rhs.back());
  if (static_cast<std::int64_t>(rhs[rhs.size() - 2]) != s.k || static_cast<std::int64_t>(out[out.size() - 2]) != s.m ||
      static_cast<std::int64_t>(out.back()) != s.n)
    return make_error(ErrorCode::IncompatibleShapes, fmt::format("matmul {} x {} -> {}", ir::shape_to_string(lhs),
                                                                 ir::shape_to_string(rhs), ir::shape_to_string(out)));
  const ir::Shape ob(out.begin(), out.end() - 2);
  const ir::Shape lb(lhs.begin(), lhs.end() - 2);
  const ir::Shape rb(rhs.begin(), rhs.end() - 2);
  Strides lst = row_major(lb), rst = row_major(rb);
  for (std::int64_t& v : lst) v *= s.m * s.k;
  for (std::int64_t& v : rst) v *= s.k * s.n;
  KILN_ASSIGN_OR_RETURN(Strides l, broadcast_to(lb, lst, ob, nullptr, "matmul lhs batch"));
  KILN_ASSIGN_OR_RETURN(Strides r, broadcast_to(rb, rst, ob, nullptr, "matmul rhs batch"));
  s.batch = static_cast<std::int64_t>(ir::num_elements(ob));
  s.batch_rank = static_cast<std::int32_t>(ob.size());
  for (std::size_t d = 0; d < ob.size(); ++d) {
    s.batch_dims[d] = static_cast<std::int64_t>(ob[d]);
    s.lhs_batch[d] = l[d];
    s.rhs_batch[d] = r[d];
  }
  return s;
}

KilnIndexed indexed_of(const ir::Shape& shape) {
  KilnIndexed x;
  const Strides st = row_major(shape);
  x.rank = static_cast<std::int32_t>(std::min<std::size_t>(shape.size(), kMaxRank));
  for (std::size_t d = 0; d < static_cast<std::size_t>(x.rank); ++d) {
    x.dims[d] = static_cast<std::int64_t>(shape[d]);
    x.strides[d] = st[d];
  }
  return x;
}

ScalarArg scalar_arg(const ir::ScalarIr& s, const ScalarSlot& slot) {
  // Round-trip through one element of the slot's dtype: the codec's cast rules, from the
  // scalar's own kind (the reference executor's scalar_as; cpu/src/fast_executor.cc does the
  // same for the CPU kernels).
  std::array<std::byte, 8> e{};
  const ir::DType d = slot.dtype;
  switch (s.kind()) {
    case ir::ScalarIr::Kind::Float: reference::element::store_f64(e.data(), d, 0, s.as_float()); break;
    case ir::ScalarIr::Kind::Int: reference::element::store_i64(e.data(), d, 0, s.as_int()); break;
    case ir::ScalarIr::Kind::UInt: reference::element::store_u64(e.data(), d, 0, s.as_uint()); break;
    case ir::ScalarIr::Kind::Bool: reference::element::store_bool(e.data(), d, 0, s.as_bool()); break;
  }
  ScalarArg out;
  out.size = scalar_class_size(slot.cls);
  switch (slot.cls) {
    case ScalarClass::F32: {
      const float v = static_cast<float>(reference::element::load_f64(e.data(), d, 0));
      std::memcpy(out.bytes.data(), &v, sizeof v);
      break;
    }
    case ScalarClass::F64: {
      const double v = reference::element::load_f64(e.data(), d, 0);
      std::memcpy(out.bytes.data(), &v, sizeof v);
      break;
    }
    case ScalarClass::I64: {
      const std::int64_t v = reference::element::load_i64(e.data(), d, 0);
      std::memcpy(out.bytes.data(), &v, sizeof v);
      break;
    }
    case ScalarClass::U64: {
      const std::uint64_t v = reference::element::load_u64(e.data(), d, 0);
      std::memcpy(out.bytes.data(), &v, sizeof v);
      break;
    }
    case ScalarClass::Bool: {
      const std::int32_t v = reference::element::load_bool(e.data(), d, 0) ? 1 : 0;
      std::memcpy(out.bytes.data(), &v, sizeof v);
      break;
    }
  }
  return out;
}

bool vector_aligned(const FusedProgram& p, const BlockLayout& layout, std::uint32_t vector_width,
                    std::span<const std::uintptr_t> input_ptrs, std::span<const std::uintptr_t> output_ptrs) {
  if (!layout.vectorizable || vector_width == 0 || p.blocks.empty()) return false;
  const fusion::ProgramBlock& b = p.blocks[0];
  for (const fusion::Load& l : b.loads) {
    if (l.broadcast) continue;
    if (l.index >= input_ptrs.size()) return false;
    const std::uintptr_t bytes = vector_width * element_bytes(p.inputs[l.index].dtype);
    if (input_ptrs[l.index] % bytes != 0) return false;
  }
  for (const fusion::Store& s : b.stores) {
    if (s.output >= output_ptrs.size()) return false;
    const std::uintptr_t bytes = vector_width * element_bytes(p.outputs[s.output].dtype);
    if (output_ptrs[s.output] % bytes != 0) return false;
  }
  return true;
}

bool row_vector_eligible(const FusedProgram& p, const BlockLayout& layout, std::uint32_t vector_width,
                         std::span<const std::uintptr_t> input_ptrs, std::span<const std::uintptr_t> output_ptrs) {
  if (vector_width == 0 || p.blocks.empty()) return false;
  const fusion::ProgramBlock& b = p.blocks[0];
  const int rank = layout.iter.rank;
  if (rank < 1 || rank > kMaxRank || layout.loads.size() != b.loads.size() || layout.stores.size() != b.stores.size())
    return false;
  const auto width = static_cast<std::int64_t>(vector_width);
  if (layout.iter.dims[rank - 1] % width != 0) return false;
  // One access: innermost stride 0 (loads only) or 1, rows on vector boundaries.
  auto fits = [&](const KilnAccess& a, std::uintptr_t ptr, ir::DType d, bool store) {
    const std::int64_t inner = a.strides[rank - 1];
    if (store ? (inner != 1 || a.masked != 0) : (inner != 0 && inner != 1)) return false;
    if (inner == 0) return true;
    for (int dim = 0; dim + 1 < rank; ++dim)
      if (a.strides[dim] % width != 0) return false;
    return ptr % (vector_width * element_bytes(d)) == 0;
  };
  for (std::size_t l = 0; l < b.loads.size(); ++l) {
    const fusion::Load& ld = b.loads[l];
    if (ld.index >= input_ptrs.size() || !fits(layout.loads[l], input_ptrs[ld.index], p.inputs[ld.index].dtype, false))
      return false;
  }
  for (std::size_t s = 0; s < b.stores.size(); ++s) {
    const fusion::Store& st = b.stores[s];
    if (st.output >= output_ptrs.size() ||
        !fits(layout.stores[s], output_ptrs[st.output], p.outputs[st.output].dtype, true))
      return false;
  }
  return true;
}

void ArgPack::add(const void* data, std::size_t size) {
  std::vector<std::byte> v(size);
  std::memcpy(v.data(), data, size);
  storage_.push_back(std::move(v));  // the element's heap buffer does not move with the vector
  ptrs_.clear();
  for (std::vector<std::byte>& s : storage_) ptrs_.push_back(s.data());
}

Result<ArgPack> pack_args(const KernelSpec& kernel, const StageArgs& args) {
  return pack_args(kernel, std::span<const StageArgs>(&args, 1));
}

Result<ArgPack> pack_args(const KernelSpec& kernel, std::span<const StageArgs> stages) {
  ArgPack pack;
  for (const KernelParam& kp : kernel.params) {
    if (kp.stage >= stages.size()) return make_error(ErrorCode::Internal, "pack: a parameter of an unbound stage");
    const StageArgs& a = stages[kp.stage];
    switch (kp.kind) {
      case ParamKind::Iter:
        if (kp.block >= a.blocks.size()) return make_error(ErrorCode::Internal, "pack: iteration of an unbound block");
        pack.add(&a.blocks[kp.block].iter, sizeof(KilnIter));
        break;
      case ParamKind::LoadAccess:
        if (kp.block >= a.blocks.size() || kp.index >= a.blocks[kp.block].loads.size())
          return make_error(ErrorCode::Internal, "pack: unbound load");
        pack.add(&a.blocks[kp.block].loads[kp.index], sizeof(KilnAccess));
        break;
      case ParamKind::StoreAccess:
        if (kp.block >= a.blocks.size() || kp.index >= a.blocks[kp.block].stores.size())
          return make_error(ErrorCode::Internal, "pack: unbound store");
        pack.add(&a.blocks[kp.block].stores[kp.index], sizeof(KilnAccess));
        break;
      case ParamKind::InputPtr:
        if (kp.index >= a.inputs.size()) return make_error(ErrorCode::Internal, "pack: unbound input");
        pack.add(&a.inputs[kp.index], sizeof(std::uintptr_t));
        break;
      case ParamKind::OutputPtr:
        if (kp.index >= a.outputs.size()) return make_error(ErrorCode::Internal, "pack: unbound output");
        pack.add(&a.outputs[kp.index], sizeof(std::uintptr_t));
        break;
      case ParamKind::Indexed:
        if (kp.index >= a.indexed.size()) return make_error(ErrorCode::Internal, "pack: unbound indexed input");
        pack.add(&a.indexed[kp.index], sizeof(KilnIndexed));
        break;
      case ParamKind::Scalar:
        if (kp.index >= a.scalars.size()) return make_error(ErrorCode::Internal, "pack: unbound scalar");
        pack.add(a.scalars[kp.index].bytes.data(), a.scalars[kp.index].size);
        break;
      case ParamKind::ReduceShape: pack.add(&a.reduce, sizeof(KilnReduceShape)); break;
      case ParamKind::MatmulShape: pack.add(&a.matmul, sizeof(KilnMatmulShape)); break;
      case ParamKind::Fault: pack.add(&a.fault, sizeof(std::uintptr_t)); break;
      case ParamKind::RowWindowBytes: pack.add(&a.row_window_bytes, sizeof(std::int64_t)); break;
      case ParamKind::Rows: pack.add(&a.rows, sizeof(std::int64_t)); break;
      case ParamKind::RowLength: pack.add(&a.row_length, sizeof(std::int64_t)); break;
    }
  }
  return pack;
}

}  // namespace kiln::cuda

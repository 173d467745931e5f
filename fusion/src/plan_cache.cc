// Plans on disk: the plans.kpc codec, plan validation, and the directory handling (format and
// trust model in plan_cache.h).
#include "kiln/fusion/plan_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <system_error>
#include <utility>

#include "kiln/base/bytes.h"
#include "kiln/base/files.h"
#include "kiln/base/hash.h"
#include "kiln/base/posix.h"
#include "kiln/fusion/fused_program.h"
#include "kiln/ir/codec.h"

#ifndef KILN_VERSION_STRING
#define KILN_VERSION_STRING "unknown"
#endif

namespace kiln::fusion {
namespace {

// ---- Enum ranges the format relies on. Changing one of these enums changes the file format:
// bump kPlanCacheFormatVersion and update the bounds.
static_assert(static_cast<int>(ProgramKind::Row) == 5);
static_assert(static_cast<int>(InputRole::Indexed) == 3);
static_assert(static_cast<int>(OperandKind::Scalar) == 2);
static_assert(static_cast<int>(LoadSource::Output) == 1);
static_assert(static_cast<int>(Vectorization::SmallerOrEqualThanPreviousBlock) == 2);
static_assert(static_cast<int>(RefLayout::OnlyContiguous) == 2);
static_assert(static_cast<int>(ir::TensorStatus::NotInit) == 2);
static_assert(static_cast<int>(ir::DTypeKind::QFloat) == 14);
static_assert(static_cast<int>(ir::BoolStore::U32) == 2);
static_assert(static_cast<int>(ir::QuantValue::Q2S) == 5);
static_assert(static_cast<int>(ir::QuantStoreKind::PackedNative) == 2);
static_assert(static_cast<int>(ir::QuantParam::BF16) == 2);
static_assert(static_cast<int>(ExecutionTrigger::Kind::Always) == 2);
static_assert(static_cast<int>(ExecutionStrategy::Kind::Composed) == 2);
static_assert(sizeof(std::size_t) == sizeof(std::uint64_t), "orderings and lengths are stored as 64-bit varints");

constexpr std::array<std::uint8_t, 4> kMagic = {'K', 'P', 'L', 'N'};
// magic, format version, reserved, op table fingerprint, kiln version length.
constexpr std::size_t kFixedHeaderBytes = 4 + 2 + 2 + 4 + 1;
constexpr std::size_t kTrailerHeaderBytes = 8 + 8;  // payload length, checksum
constexpr std::size_t kMaxVersionBytes = 255;       // a u8 length

// Optimization kinds in the strategy tree. 0 is never written, so a zeroed region is refused.
constexpr std::uint8_t kOptFused = 1;

// Nesting caps: each recursion level costs decoder stack, so hostile input must not choose it.
// Real programs nest two levels (a ReduceBroadcasted stage's Reduce fallbacks) and real strategies
// a handful (composed merges of composed blocks).
constexpr int kMaxProgramDepth = 4;
constexpr int kMaxStrategyDepth = 64;

// Minimum encoded size of each element, to reject counts the remaining bytes cannot hold before
// anything is reserved (so a decoded value costs at most a small multiple of its bytes).
constexpr std::size_t kMinPlanBytes = 20;     // ops (len + 13-byte empty list), trigger, ordering, leaf
constexpr std::size_t kMinTriggerBytes = 2;   // kind, ops length
constexpr std::size_t kMinStrategyBytes = 2;  // kind, count
constexpr std::size_t kMinProgramBytes = 10;  // kind, 2 sizes, 5 counts, 2 flags
constexpr std::size_t kMinInputBytes = 6;     // tensor, dtype, rank, status, role, has_view
constexpr std::size_t kMinBlockBytes = 11;    // rank, 5 settings, 5 counts/flags
constexpr std::size_t kMinLoadBytes = 4;
constexpr std::size_t kMinInstructionBytes = 7;
constexpr std::size_t kMinOperandBytes = 2;
constexpr std::size_t kMinStoreBytes = 2;
constexpr std::size_t kMinOutputBytes = 9;

// =============================================================================================
// Encoding (total: every in-memory value has an encoding; validation is the decoder's job).

using Writer = ByteWriter;
using ir::codec::put_dtype;
using ir::codec::read_dtype;

void put_shape(Writer& w, const ir::Shape& s) {
  w.varint(s.size());
  for (std::uint64_t d : s) w.varint(d);
}

void put_operations(Writer& w, std::span<const ir::Operation> ops) {
  w.varint(ir::codec::encoded_size(ops));
  ir::codec::encode_operations(ops, w.out());
}

void put_ordering(Writer& w, const Ordering& o) {
  w.varint(o.size());
  for (std::size_t p : o) w.varint(p);
}

// Program header: kind, captured op position and len.
void put_program_header(Writer& w, const FusedProgram& p) {
  w.enumeration(p.kind);
  w.varint(p.captured_op_position);
  w.varint(p.len);
}

// An input's view read (role View).
void put_view(Writer& w, const ViewSpec& v) {
  w.varint(static_cast<std::uint64_t>(v.op));
  w.varint(v.source);
  w.svarint(v.dim1);
  w.svarint(v.dim2);
  put_shape(w, v.shape);
}

// Program inputs: count, then each input with its optional view.
void put_inputs(Writer& w, std::span<const ProgramInput> inputs) {
  w.varint(inputs.size());
  for (const ProgramInput& in : inputs) {
    w.varint(in.tensor);
    put_dtype(w, in.dtype);
    put_shape(w, in.shape);
    w.enumeration(in.status);
    w.enumeration(in.role);
    w.boolean(in.view.has_value());
    if (in.view) put_view(w, *in.view);
  }
}

// Scalar placeholders: count, then each index.
void put_scalars(Writer& w, std::span<const std::uint32_t> scalars) {
  w.varint(scalars.size());
  for (std::uint32_t k : scalars) w.varint(k);
}

// A block's settings.
void put_settings(Writer& w, const FuseSettings& s) {
  w.boolean(s.broadcast);
  w.boolean(s.output_shape_updates);
  w.boolean(s.inplace);
  w.enumeration(s.vectorization);
  w.enumeration(s.ref_layout);
}

// A block's optional reduction: presence flag, then its fields.
void put_reduction(Writer& w, const std::optional<Reduction>& reduction) {
  w.boolean(reduction.has_value());
  if (reduction) {
    const Reduction& r = *reduction;
    w.varint(static_cast<std::uint64_t>(r.op));
    w.enumeration(r.family);
    w.svarint(r.axis);
    w.varint(r.input);
    w.varint(r.out);
    put_dtype(w, r.input_dtype);
    put_dtype(w, r.accumulator);
    put_dtype(w, r.out_dtype);
  }
}

// A block's loads: count, then each load.
void put_loads(Writer& w, std::span<const Load> loads) {
  w.varint(loads.size());
  for (const Load& l : loads) {
    w.enumeration(l.source);
    w.varint(l.index);
    w.varint(l.local);
    w.boolean(l.broadcast);
  }
}

// One instruction: op, family, dtypes, operands, attributes, output register.
void put_instruction(Writer& w, const Instruction& ins) {
  w.varint(static_cast<std::uint64_t>(ins.op));
  w.enumeration(ins.family);
  put_dtype(w, ins.compute);
  put_dtype(w, ins.out_dtype);
  w.varint(ins.operands.size());
  for (const Operand& o : ins.operands) {
    w.enumeration(o.kind);
    w.varint(o.index);
  }
  w.varint(ins.attrs.size());
  for (std::int64_t a : ins.attrs) w.svarint(a);
  w.varint(ins.out);
}

// A block's stores: count, then each store.
void put_stores(Writer& w, std::span<const Store> stores) {
  w.varint(stores.size());
  for (const Store& s : stores) {
    w.varint(s.output);
    w.varint(s.local);
  }
}

// One block: reference shape, settings, registers, reduction, loads, instructions, stores.
void put_block(Writer& w, const ProgramBlock& b) {
  put_shape(w, b.reference_shape);
  put_settings(w, b.settings);
  w.varint(b.registers.size());
  for (const ir::DType& d : b.registers) put_dtype(w, d);
  put_reduction(w, b.reduction);
  put_loads(w, b.loads);
  w.varint(b.instructions.size());
  for (const Instruction& ins : b.instructions) put_instruction(w, ins);
  put_stores(w, b.stores);
}

// Program outputs: count, then each output with its optional layout.
void put_outputs(Writer& w, std::span<const ProgramOutput> outputs) {
  w.varint(outputs.size());
  for (const ProgramOutput& o : outputs) {
    w.varint(o.tensor);
    put_dtype(w, o.dtype);
    put_shape(w, o.shape);
    w.enumeration(o.status);
    w.varint(o.block);
    w.varint(o.local);
    w.boolean(o.written);
    w.boolean(o.kept);
    w.boolean(o.layout.has_value());
    if (o.layout) {
      w.varint(o.layout->size());
      for (std::uint32_t a : *o.layout) w.varint(a);
    }
  }
}

// The program's optional matmul: presence flag, then its fields.
void put_matmul(Writer& w, const std::optional<MatmulSpec>& matmul) {
  w.boolean(matmul.has_value());
  if (matmul) {
    w.varint(matmul->lhs);
    w.varint(matmul->rhs);
    w.varint(matmul->out);
    put_dtype(w, matmul->dtype);
    put_dtype(w, matmul->out_dtype);
  }
}

void put_program(Writer& w, const FusedProgram& p) {
  put_program_header(w, p);
  put_inputs(w, p.inputs);
  put_scalars(w, p.scalars);
  w.varint(p.blocks.size());
  for (const ProgramBlock& b : p.blocks) put_block(w, b);
  put_outputs(w, p.outputs);
  put_matmul(w, p.matmul);
  w.varint(p.stages.size());
  for (const FusedProgram& s : p.stages) put_program(w, s);
  w.varint(p.fallbacks.size());
  for (const FusedProgram& f : p.fallbacks) put_program(w, f);
}

// False when the strategy holds an optimization this format cannot rebuild.
bool serializable(const ExecutionStrategy& s) {
  switch (s.kind()) {
    case ExecutionStrategy::Kind::Optimization: return dynamic_cast<const FusedOptimization*>(s.opt().get()) != nullptr;
    case ExecutionStrategy::Kind::Operations: return true;
    case ExecutionStrategy::Kind::Composed:
      return std::all_of(s.children().begin(), s.children().end(), [](const auto& c) { return serializable(c); });
  }
  return false;
}

void put_strategy(Writer& w, const ExecutionStrategy& s) {
  w.enumeration(s.kind());
  switch (s.kind()) {
    case ExecutionStrategy::Kind::Optimization: {
      const auto& fused = dynamic_cast<const FusedOptimization&>(*s.opt());  // serializable() checked
      w.u8(kOptFused);
      w.varint(fused.len());
      put_program(w, fused.program());
      put_ordering(w, s.ordering());
      w.varint(s.score());
      break;
    }
    case ExecutionStrategy::Kind::Operations: put_ordering(w, s.ordering()); break;
    case ExecutionStrategy::Kind::Composed:
      w.varint(s.children().size());
      for (const ExecutionStrategy& c : s.children()) put_strategy(w, c);
      break;
  }
}

void put_plan(Writer& w, const ExecutionPlan& plan, const TriggerList& triggers) {
  put_operations(w, plan.operations);
  w.varint(triggers.size());
  for (const ExecutionTrigger& t : triggers) {
    w.enumeration(t.kind);
    // Written for every kind (0 = none), so an aggregate-built trigger round-trips exactly.
    if (t.operations.empty()) {
      w.varint(0);
    } else {
      put_operations(w, t.operations);
    }
  }
  put_ordering(w, plan.optimization.ordering);
  put_strategy(w, plan.optimization.strategy);
}

// =============================================================================================
// Decoding. Every read is bounds-checked; the first failure records a message naming the field
// and its byte offset in the file, and every caller unwinds with `false`.

// base's ByteReader, plus the plan format's own fields.
class Reader : public ByteReader {
 public:
  using ByteReader::ByteReader;
  using ByteReader::take;

  bool u16(std::uint16_t& v, const char* what) { return fixed(v, what); }
  // A varint that must fit 32 bits.
  bool u32(std::uint32_t& v, const char* what) {
    const std::size_t at = offset();
    std::uint64_t x = 0;
    if (!varint(x, what)) return false;
    if (x > std::numeric_limits<std::uint32_t>::max()) return fail(at, fmt::format("{} {} exceeds 32 bits", what, x));
    v = static_cast<std::uint32_t>(x);
    return true;
  }
  bool size(std::size_t& v, const char* what) {
    std::uint64_t x = 0;
    if (!varint(x, what)) return false;
    v = static_cast<std::size_t>(x);
    return true;
  }
  bool op_kind(ir::OpKind& out, const char* what) {
    const std::size_t at = offset();
    std::uint64_t v = 0;
    if (!varint(v, what)) return false;
    if (v >= static_cast<std::uint64_t>(ir::kNumOpKinds))
      return fail(at, fmt::format("unknown {} {} (the op table has {})", what, v, ir::kNumOpKinds));
    out = static_cast<ir::OpKind>(v);
    return true;
  }
  bool family(ir::Family& out, const char* what) {
    return enumeration(out, static_cast<std::uint8_t>(ir::kNumFamilies - 1), what);
  }
  // The next `n` bytes, already checked to exist by the caller through count().
  std::span<const std::uint8_t> take(std::size_t n) {
    std::span<const std::uint8_t> out;
    (void)take(n, out, "bytes");
    return out;
  }
};

// The reader's error as this format words it: "byte <n>: <message>".
std::string located(const Reader& r) { return fmt::format("byte {}: {}", r.error_offset(), r.error()); }

bool read_shape(Reader& r, ir::Shape& out, const char* what) {
  const std::size_t at = r.offset();
  std::size_t rank = 0;
  if (!r.count(rank, 1, what)) return false;
  if (rank > ir::codec::kMaxRank)
    return r.fail(at, fmt::format("{} rank {} exceeds {}", what, rank, ir::codec::kMaxRank));
  out.clear();
  for (std::size_t i = 0; i < rank; ++i) {
    std::uint64_t d = 0;
    if (!r.varint(d, what)) return false;
    out.push_back(d);
  }
  return true;
}

bool read_operations(Reader& r, std::vector<ir::Operation>& out, const char* what) {
  const std::size_t at = r.offset();
  std::size_t n = 0;
  if (!r.count(n, 1, what)) return false;
  auto decoded = ir::codec::decode_operations(r.take(n));
  if (!decoded.ok()) return r.fail(at, fmt::format("{}: {}", what, decoded.error().message));
  out = std::move(decoded).value();
  return true;
}

bool read_ordering(Reader& r, Ordering& out, const char* what) {
  std::size_t n = 0;
  if (!r.count(n, 1, what)) return false;
  out.clear();
  out.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t p = 0;
    if (!r.size(p, what)) return false;
    out.push_back(p);
  }
  return true;
}

// Program header: kind, captured op position and len.
bool read_program_header(Reader& r, FusedProgram& p) {
  if (!r.enumeration(p.kind, static_cast<std::uint8_t>(ProgramKind::Row), "program kind")) return false;
  if (!r.size(p.captured_op_position, "captured op position")) return false;
  return r.size(p.len, "program len");
}

// An input's view read (role View).
bool read_view(Reader& r, ViewSpec& v) {
  if (!r.op_kind(v.op, "view op")) return false;
  if (!r.u32(v.source, "view source")) return false;
  if (!r.svarint(v.dim1, "view dim1")) return false;
  if (!r.svarint(v.dim2, "view dim2")) return false;
  return read_shape(r, v.shape, "view shape");
}

// Program inputs: count, then each input with its optional view.
bool read_inputs(Reader& r, std::vector<ProgramInput>& inputs) {
  std::size_t n = 0;
  if (!r.count(n, kMinInputBytes, "program input count")) return false;
  inputs.resize(n);
  for (ProgramInput& in : inputs) {
    if (!r.varint(in.tensor, "input tensor")) return false;
    if (!read_dtype(r, in.dtype, "input dtype")) return false;
    if (!read_shape(r, in.shape, "input shape")) return false;
    if (!r.enumeration(in.status, static_cast<std::uint8_t>(ir::TensorStatus::NotInit), "input status")) return false;
    if (!r.enumeration(in.role, static_cast<std::uint8_t>(InputRole::Indexed), "input role")) return false;
    bool has_view = false;
    if (!r.boolean(has_view, "input has-view flag")) return false;
    if (has_view) {
      ViewSpec v;
      if (!read_view(r, v)) return false;
      in.view = std::move(v);
    }
  }
  return true;
}

// Scalar placeholders: count, then each index.
bool read_scalars(Reader& r, std::vector<std::uint32_t>& scalars) {
  std::size_t n = 0;
  if (!r.count(n, 1, "scalar count")) return false;
  scalars.resize(n);
  for (std::uint32_t& k : scalars)
    if (!r.u32(k, "scalar placeholder")) return false;
  return true;
}

// A block's settings.
bool read_settings(Reader& r, FuseSettings& s) {
  if (!r.boolean(s.broadcast, "settings.broadcast")) return false;
  if (!r.boolean(s.output_shape_updates, "settings.output_shape_updates")) return false;
  if (!r.boolean(s.inplace, "settings.inplace")) return false;
  if (!r.enumeration(s.vectorization, static_cast<std::uint8_t>(Vectorization::SmallerOrEqualThanPreviousBlock),
                     "settings.vectorization"))
    return false;
  return r.enumeration(s.ref_layout, static_cast<std::uint8_t>(RefLayout::OnlyContiguous), "settings.ref_layout");
}

// A block's registers: count, then each dtype.
bool read_registers(Reader& r, std::vector<ir::DType>& registers) {
  std::size_t n = 0;
  if (!r.count(n, 1, "register count")) return false;
  registers.resize(n);
  for (ir::DType& d : registers)
    if (!read_dtype(r, d, "register dtype")) return false;
  return true;
}

// A block's optional reduction: presence flag, then its fields.
bool read_reduction(Reader& r, std::optional<Reduction>& reduction) {
  bool has_reduction = false;
  if (!r.boolean(has_reduction, "block has-reduction flag")) return false;
  if (has_reduction) {
    Reduction red;
    if (!r.op_kind(red.op, "reduction op")) return false;
    if (!r.family(red.family, "reduction family")) return false;
    if (!r.svarint(red.axis, "reduction axis")) return false;
    if (!r.u32(red.input, "reduction input register")) return false;
    if (!r.u32(red.out, "reduction output register")) return false;
    if (!read_dtype(r, red.input_dtype, "reduction input dtype")) return false;
    if (!read_dtype(r, red.accumulator, "reduction accumulator dtype")) return false;
    if (!read_dtype(r, red.out_dtype, "reduction output dtype")) return false;
    reduction = red;
  }
  return true;
}

// A block's loads: count, then each load.
bool read_loads(Reader& r, std::vector<Load>& loads) {
  std::size_t n = 0;
  if (!r.count(n, kMinLoadBytes, "load count")) return false;
  loads.resize(n);
  for (Load& l : loads) {
    if (!r.enumeration(l.source, static_cast<std::uint8_t>(LoadSource::Output), "load source")) return false;
    if (!r.u32(l.index, "load index")) return false;
    if (!r.u32(l.local, "load register")) return false;
    if (!r.boolean(l.broadcast, "load broadcast flag")) return false;
  }
  return true;
}

// One instruction: op, family, dtypes, operands, attributes, output register.
bool read_instruction(Reader& r, Instruction& ins) {
  if (!r.op_kind(ins.op, "instruction op")) return false;
  if (!r.family(ins.family, "instruction family")) return false;
  if (!read_dtype(r, ins.compute, "instruction compute dtype")) return false;
  if (!read_dtype(r, ins.out_dtype, "instruction output dtype")) return false;
  std::size_t n = 0;
  if (!r.count(n, kMinOperandBytes, "operand count")) return false;
  ins.operands.resize(n);
  for (Operand& o : ins.operands) {
    if (!r.enumeration(o.kind, static_cast<std::uint8_t>(OperandKind::Scalar), "operand kind")) return false;
    if (!r.u32(o.index, "operand index")) return false;
  }
  if (!r.count(n, 1, "attribute count")) return false;
  ins.attrs.resize(n);
  for (std::int64_t& a : ins.attrs)
    if (!r.svarint(a, "attribute")) return false;
  return r.u32(ins.out, "instruction output register");
}

// A block's stores: count, then each store.
bool read_stores(Reader& r, std::vector<Store>& stores) {
  std::size_t n = 0;
  if (!r.count(n, kMinStoreBytes, "store count")) return false;
  stores.resize(n);
  for (Store& s : stores) {
    if (!r.u32(s.output, "store output")) return false;
    if (!r.u32(s.local, "store register")) return false;
  }
  return true;
}

// One block: reference shape, settings, registers, reduction, loads, instructions, stores.
bool read_block(Reader& r, ProgramBlock& b) {
  if (!read_shape(r, b.reference_shape, "reference shape")) return false;
  if (!read_settings(r, b.settings)) return false;
  if (!read_registers(r, b.registers)) return false;
  if (!read_reduction(r, b.reduction)) return false;
  if (!read_loads(r, b.loads)) return false;
  std::size_t n = 0;
  if (!r.count(n, kMinInstructionBytes, "instruction count")) return false;
  b.instructions.resize(n);
  for (Instruction& ins : b.instructions)
    if (!read_instruction(r, ins)) return false;
  return read_stores(r, b.stores);
}

// Program outputs: count, then each output with its optional layout.
bool read_outputs(Reader& r, std::vector<ProgramOutput>& outputs) {
  std::size_t n = 0;
  if (!r.count(n, kMinOutputBytes, "program output count")) return false;
  outputs.resize(n);
  for (ProgramOutput& o : outputs) {
    if (!r.varint(o.tensor, "output tensor")) return false;
    if (!read_dtype(r, o.dtype, "output dtype")) return false;
    if (!read_shape(r, o.shape, "output shape")) return false;
    if (!r.enumeration(o.status, static_cast<std::uint8_t>(ir::TensorStatus::NotInit), "output status")) return false;
    if (!r.u32(o.block, "output block")) return false;
    if (!r.u32(o.local, "output register")) return false;
    if (!r.boolean(o.written, "output written flag")) return false;
    if (!r.boolean(o.kept, "output kept flag")) return false;
    bool has_layout = false;
    if (!r.boolean(has_layout, "output has-layout flag")) return false;
    if (has_layout) {
      if (!r.count(n, 1, "layout rank")) return false;
      Permutation layout(n);
      for (std::uint32_t& a : layout)
        if (!r.u32(a, "layout entry")) return false;
      o.layout = std::move(layout);
    }
  }
  return true;
}

// The program's optional matmul: presence flag, then its fields.
bool read_matmul(Reader& r, std::optional<MatmulSpec>& matmul) {
  bool has_matmul = false;
  if (!r.boolean(has_matmul, "program has-matmul flag")) return false;
  if (has_matmul) {
    MatmulSpec m;
    if (!r.u32(m.lhs, "matmul lhs")) return false;
    if (!r.u32(m.rhs, "matmul rhs")) return false;
    if (!r.u32(m.out, "matmul output register")) return false;
    if (!read_dtype(r, m.dtype, "matmul dtype")) return false;
    if (!read_dtype(r, m.out_dtype, "matmul output dtype")) return false;
    matmul = m;
  }
  return true;
}

bool read_program(Reader& r, FusedProgram& p, int depth) {
  if (depth > kMaxProgramDepth)
    return r.fail(fmt::format("fused programs nested deeper than {} (stages / fallbacks)", kMaxProgramDepth));
  if (!read_program_header(r, p)) return false;
  if (!read_inputs(r, p.inputs)) return false;
  if (!read_scalars(r, p.scalars)) return false;
  std::size_t n = 0;
  if (!r.count(n, kMinBlockBytes, "block count")) return false;
  p.blocks.resize(n);
  for (ProgramBlock& b : p.blocks)
    if (!read_block(r, b)) return false;
  if (!read_outputs(r, p.outputs)) return false;
  if (!read_matmul(r, p.matmul)) return false;
  if (!r.count(n, kMinProgramBytes, "stage count")) return false;
  p.stages.resize(n);
  for (FusedProgram& s : p.stages)
    if (!read_program(r, s, depth + 1)) return false;
  if (!r.count(n, kMinProgramBytes, "fallback count")) return false;
  p.fallbacks.resize(n);
  for (FusedProgram& f : p.fallbacks)
    if (!read_program(r, f, depth + 1)) return false;
  return true;
}

bool read_strategy(Reader& r, ExecutionStrategy& out, int depth) {
  if (depth > kMaxStrategyDepth) return r.fail(fmt::format("strategy nested deeper than {}", kMaxStrategyDepth));
  ExecutionStrategy::Kind kind{};
  if (!r.enumeration(kind, static_cast<std::uint8_t>(ExecutionStrategy::Kind::Composed), "strategy kind")) return false;
  switch (kind) {
    case ExecutionStrategy::Kind::Optimization: {
      const std::size_t at = r.offset();
      std::uint8_t opt_kind = 0;
      if (!r.u8(opt_kind, "optimization kind")) return false;
      if (opt_kind != kOptFused) return r.fail(at, fmt::format("unknown optimization kind {}", opt_kind));
      std::size_t len = 0;
      if (!r.size(len, "optimization len")) return false;
      FusedProgram program;
      if (!read_program(r, program, 0)) return false;
      Ordering ordering;
      if (!read_ordering(r, ordering, "optimization ordering")) return false;
      std::uint64_t score = 0;
      if (!r.varint(score, "score")) return false;
      out = ExecutionStrategy::optimization(std::make_shared<FusedOptimization>(std::move(program), len),
                                            std::move(ordering), score);
      return true;
    }
    case ExecutionStrategy::Kind::Operations: {
      Ordering ordering;
      if (!read_ordering(r, ordering, "operations ordering")) return false;
      out = ExecutionStrategy::operations(std::move(ordering));
      return true;
    }
    case ExecutionStrategy::Kind::Composed: {
      std::size_t n = 0;
      if (!r.count(n, kMinStrategyBytes, "child strategy count")) return false;
      std::vector<ExecutionStrategy> children(n);
      for (ExecutionStrategy& c : children)
        if (!read_strategy(r, c, depth + 1)) return false;
      out = ExecutionStrategy::composed(std::move(children));
      return true;
    }
  }
  return r.fail("unreachable strategy kind");
}

bool read_plan(Reader& r, PlanRecord& rec) {
  if (!read_operations(r, rec.plan.operations, "plan operations")) return false;
  std::size_t n = 0;
  if (!r.count(n, kMinTriggerBytes, "trigger count")) return false;
  rec.triggers.resize(n);
  for (ExecutionTrigger& t : rec.triggers) {
    if (!r.enumeration(t.kind, static_cast<std::uint8_t>(ExecutionTrigger::Kind::Always), "trigger kind")) return false;
    // A zero length means no operations (an empty list is never written as a message).
    const std::size_t at = r.offset();
    std::uint64_t len = 0;
    if (!r.varint(len, "trigger operations length")) return false;
    if (len != 0) {
      if (len > r.remaining())
        return r.fail(
            at, fmt::format("trigger operations length {} exceeds the {} byte(s) that remain", len, r.remaining()));
      auto decoded = ir::codec::decode_operations(r.take(static_cast<std::size_t>(len)));
      if (!decoded.ok()) return r.fail(at, "trigger operations: " + decoded.error().message);
      if (decoded->empty()) return r.fail(at, "trigger operations: an empty list written as a message");
      t.operations = std::move(decoded).value();
    }
  }
  if (!read_ordering(r, rec.plan.optimization.ordering, "block ordering")) return false;
  return read_strategy(r, rec.plan.optimization.strategy, 0);
}

// =============================================================================================
// Validation.

std::size_t count_scalars(std::span<const ir::Operation> ops) {
  std::size_t n = 0;
  for (const ir::Operation& op : ops) n += op.scalars.size();
  return n;
}

// Every index a backend follows stays inside the program: registers, inputs, outputs, blocks,
// scalar placeholders (which index the stream's scalar values, positional over the plan's ops).
// Returns an empty string when fine.
std::string check_program(const FusedProgram& p, std::size_t plan_scalars, int depth) {
  if (depth > kMaxProgramDepth) return fmt::format("nested deeper than {}", kMaxProgramDepth);
  const std::size_t n_in = p.inputs.size(), n_out = p.outputs.size(), n_blocks = p.blocks.size();
  for (std::size_t i = 0; i < n_in; ++i) {
    const ProgramInput& in = p.inputs[i];
    if ((in.role == InputRole::View) != in.view.has_value())
      return fmt::format("input {}: role {} but {} view", i, input_role_name(in.role), in.view ? "a" : "no");
    if (in.view) {
      if (in.view->op != ir::OpKind::Base_SwapDims && in.view->op != ir::OpKind::Base_Reshape)
        return fmt::format("input {}: view op {} is neither SwapDims nor Reshape", i, static_cast<int>(in.view->op));
      if (in.view->source >= n_in || in.view->source == i)
        return fmt::format("input {}: view source {} out of range ({} inputs)", i, in.view->source, n_in);
    }
  }
  for (std::size_t i = 0; i < p.scalars.size(); ++i) {
    if (p.scalars[i] >= plan_scalars)
      return fmt::format("scalar placeholder {} but the plan's operations carry {} scalar(s)", p.scalars[i],
                         plan_scalars);
    if (i > 0 && p.scalars[i] <= p.scalars[i - 1]) return "scalar placeholders not strictly ascending";
  }
  for (std::size_t bi = 0; bi < n_blocks; ++bi) {
    const ProgramBlock& b = p.blocks[bi];
    const std::size_t regs = b.registers.size();
    if (b.reduction) {
      if (bi == 0) return "block 0 carries a reduction (it reduces the previous block's register)";
      if (b.reduction->input >= p.blocks[bi - 1].registers.size() || b.reduction->out >= regs)
        return fmt::format("block {}: reduction registers r{} -> r{} out of range", bi, b.reduction->input,
                           b.reduction->out);
    }
    for (std::size_t li = 0; li < b.loads.size(); ++li) {
      const Load& l = b.loads[li];
      const std::size_t limit = l.source == LoadSource::Input ? n_in : n_out;
      if (l.index >= limit || l.local >= regs)
        return fmt::format("block {} load {}: {} {} -> r{} out of range", bi, li,
                           l.source == LoadSource::Input ? "input" : "output", l.index, l.local);
    }
    for (std::size_t ii = 0; ii < b.instructions.size(); ++ii) {
      const Instruction& ins = b.instructions[ii];
      if (ins.out >= regs) return fmt::format("block {} instruction {}: output r{} out of range", bi, ii, ins.out);
      for (const Operand& o : ins.operands) {
        const bool fine = o.kind == OperandKind::Local ? o.index < regs
                          : o.kind == OperandKind::Input
                              ? o.index < n_in
                              : std::binary_search(p.scalars.begin(), p.scalars.end(), o.index);
        if (!fine) return fmt::format("block {} instruction {}: operand index {} out of range", bi, ii, o.index);
      }
    }
    for (std::size_t si = 0; si < b.stores.size(); ++si)
      if (b.stores[si].output >= n_out || b.stores[si].local >= regs)
        return fmt::format("block {} store {}: out{} <- r{} out of range", bi, si, b.stores[si].output,
                           b.stores[si].local);
  }
  for (std::size_t oi = 0; oi < n_out; ++oi) {
    const ProgramOutput& o = p.outputs[oi];
    if (o.block >= n_blocks || o.local >= p.blocks[o.block].registers.size())
      return fmt::format("output {}: b{}.r{} out of range", oi, o.block, o.local);
    if (o.layout) {
      // A stride order is a permutation of the output's dims.
      if (o.layout->size() != o.shape.size()) return fmt::format("output {}: layout rank differs from shape rank", oi);
      std::vector<bool> seen(o.layout->size(), false);
      for (std::uint32_t a : *o.layout) {
        if (a >= seen.size() || seen[a]) return fmt::format("output {}: layout is not a permutation", oi);
        seen[a] = true;
      }
    }
  }
  if (p.matmul.has_value() != (p.kind == ProgramKind::Matmul))
    return fmt::format("{} program {} a matmul", program_kind_name(p.kind), p.matmul ? "carries" : "lacks");
  if (p.matmul) {
    if (p.matmul->lhs >= n_in || p.matmul->rhs >= n_in || n_blocks == 0 ||
        p.matmul->out >= p.blocks[0].registers.size())
      return "matmul operands or output register out of range";
  }
  for (std::size_t i = 0; i < p.stages.size(); ++i)
    if (auto e = check_program(p.stages[i], plan_scalars, depth + 1); !e.empty())
      return fmt::format("stage {}: {}", i, e);
  for (std::size_t i = 0; i < p.fallbacks.size(); ++i)
    if (auto e = check_program(p.fallbacks[i], plan_scalars, depth + 1); !e.empty())
      return fmt::format("fallback {}: {}", i, e);
  return {};
}

std::string check_strategy(const ExecutionStrategy& s, std::size_t plan_scalars, int depth) {
  if (depth > kMaxStrategyDepth) return fmt::format("strategy nested deeper than {}", kMaxStrategyDepth);
  switch (s.kind()) {
    case ExecutionStrategy::Kind::Optimization: {
      const auto* fused = dynamic_cast<const FusedOptimization*>(s.opt().get());
      if (fused == nullptr) return "an optimization leaf is not a FusedOptimization";
      // The executor reads len() covered operations through the leaf's ordering.
      if (fused->len() == 0 || fused->len() != s.ordering().size())
        return fmt::format("optimization covers {} operation(s) but its ordering has {}", fused->len(),
                           s.ordering().size());
      if (auto e = check_program(fused->program(), plan_scalars, 0); !e.empty()) return "fused program: " + e;
      return {};
    }
    case ExecutionStrategy::Kind::Operations: return {};
    case ExecutionStrategy::Kind::Composed:
      for (const ExecutionStrategy& c : s.children())
        if (auto e = check_strategy(c, plan_scalars, depth + 1); !e.empty()) return e;
      return {};
  }
  return "unknown strategy kind";
}

std::string check_plan(const ExecutionPlan& plan, const TriggerList& triggers) {
  const std::size_t n = plan.operations.size();
  if (n == 0) return "no operations";
  if (triggers.empty()) return "no trigger";
  for (const ExecutionTrigger& t : triggers)
    if (static_cast<int>(t.kind) > static_cast<int>(ExecutionTrigger::Kind::Always)) return "unknown trigger kind";
  const Ordering& o = plan.optimization.ordering;
  // A plan stores exactly the prefix its ordering covers (Processor::on_exploration_completed).
  if (o.size() != n) return fmt::format("ordering covers {} position(s) but the plan has {} operation(s)", o.size(), n);
  std::vector<bool> seen(n, false);
  for (std::size_t p : o) {
    if (p >= n) return fmt::format("ordering names position {} of {} operation(s)", p, n);
    if (seen[p]) return fmt::format("ordering names position {} twice", p);
    seen[p] = true;
  }
  if (plan.optimization.strategy.flatten() != o) return "the strategy's leaves differ from the block ordering";
  return check_strategy(plan.optimization.strategy, count_scalars(plan.operations), 0);
}

void put_header(Writer& w, std::uint16_t search_options, std::string_view kiln_version,
                std::span<const std::uint8_t> payload) {
  w.bytes(kMagic);
  w.u16(kPlanCacheFormatVersion);
  w.u16(search_options);
  w.u32(ir::codec::op_table_fingerprint());
  const std::size_t vlen = std::min(kiln_version.size(), kMaxVersionBytes);
  w.u8(static_cast<std::uint8_t>(vlen));
  w.bytes({reinterpret_cast<const std::uint8_t*>(kiln_version.data()), vlen});
  w.u64(payload.size());
  w.u64(fnv1a64(payload));
}

DecodedPlans failed(PlanCacheProblem problem, std::string reason) {
  DecodedPlans d;
  d.problem = problem;
  d.reason = std::move(reason);
  return d;
}

void warn(const FusionLog& log, const std::string& message) {
  spdlog::warn("{}", message);
  log.log(LogLevel::Basic, [&] { return message; });
}

}  // namespace

// =============================================================================================
// Public API.

std::string_view plan_cache_kiln_version() { return KILN_VERSION_STRING; }

const char* plan_cache_problem_name(PlanCacheProblem p) {
  switch (p) {
    case PlanCacheProblem::None: return "none";
    case PlanCacheProblem::UnsafeDirectory: return "unsafe directory";
    case PlanCacheProblem::Unreadable: return "unreadable";
    case PlanCacheProblem::TooLarge: return "too large";
    case PlanCacheProblem::Truncated: return "truncated";
    case PlanCacheProblem::BadMagic: return "bad magic";
    case PlanCacheProblem::FormatVersion: return "format version";
    case PlanCacheProblem::KilnVersion: return "kiln version";
    case PlanCacheProblem::OpTable: return "op table";
    case PlanCacheProblem::SearchOptions: return "search options";
    case PlanCacheProblem::Checksum: return "checksum";
    case PlanCacheProblem::Malformed: return "malformed";
  }
  return "?";
}

SerializedPlans serialize_plans(const ExecutionPlanStore& store, std::string_view kiln_version) {
  SerializedPlans out;
  std::vector<std::uint8_t> payload;
  Writer pw(payload);
  // The plan count is only known after skipping: encode the plans first, then prefix the count.
  std::vector<std::uint8_t> plans;
  Writer w(plans);
  for (PlanId id : store.ids()) {  // plans published later are not included
    const PlanPin plan = store.plan(id);
    const TriggerSnapshot triggers = store.triggers(id);
    if (plan == nullptr || triggers == nullptr) continue;  // evicted meanwhile
    if (!serializable(plan->optimization.strategy)) {
      ++out.skipped;
      continue;
    }
    put_plan(w, *plan, *triggers);
    ++out.saved;
  }
  pw.varint(out.saved);
  pw.bytes(plans);
  Writer hw(out.bytes);
  put_header(hw, store.search_options(), kiln_version, payload);
  hw.bytes(payload);
  return out;
}

Status validate_plan(const ExecutionPlan& plan, const TriggerList& triggers) {
  std::string e = check_plan(plan, triggers);
  if (e.empty()) return Status::Ok();
  return make_error(ErrorCode::Invalid, "execution plan: " + e);
}

DecodedPlans decode_plans(std::span<const std::uint8_t> bytes, std::uint16_t expected_search_options,
                          std::string_view expected_kiln_version) {
  if (bytes.empty()) return failed(PlanCacheProblem::Truncated, "empty file");
  // Magic first, on whatever prefix is there: a short file that is not ours is "bad magic".
  const std::size_t magic_len = std::min(bytes.size(), kMagic.size());
  if (!std::equal(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(magic_len), kMagic.begin()))
    return failed(PlanCacheProblem::BadMagic, "not a plan cache file (bad magic)");
  if (bytes.size() < kFixedHeaderBytes)
    return failed(PlanCacheProblem::Truncated, fmt::format("truncated header: {} byte(s)", bytes.size()));

  Reader h(bytes.first(kFixedHeaderBytes), 0);
  (void)h.take(kMagic.size());
  std::uint16_t version = 0, search_options = 0;
  std::uint64_t fingerprint = 0;
  std::uint8_t vlen = 0;
  (void)h.u16(version, "format version");
  (void)h.u16(search_options, "search options");
  {
    std::uint16_t lo = 0, hi = 0;
    (void)h.u16(lo, "op table fingerprint");
    (void)h.u16(hi, "op table fingerprint");
    fingerprint = static_cast<std::uint64_t>(lo) | static_cast<std::uint64_t>(hi) << 16;
  }
  (void)h.u8(vlen, "kiln version length");
  if (version != kPlanCacheFormatVersion)
    return failed(PlanCacheProblem::FormatVersion,
                  fmt::format("format version {}, this kiln reads version {}", version, kPlanCacheFormatVersion));
  if (search_options != expected_search_options) {
    auto row = [](std::uint16_t o) { return (o & kSearchRowFuser) != 0 ? "on" : "off"; };
    return failed(
        PlanCacheProblem::SearchOptions,
        fmt::format("written by a search with options {:#x} (row fuser {}), this store's are {:#x} (row fuser {})",
                    search_options, row(search_options), expected_search_options, row(expected_search_options)));
  }

  const std::size_t header_size = kFixedHeaderBytes + vlen + kTrailerHeaderBytes;
  if (bytes.size() < header_size)
    return failed(PlanCacheProblem::Truncated,
                  fmt::format("truncated header: {} byte(s) of {}", bytes.size(), header_size));
  const std::string_view file_version(reinterpret_cast<const char*>(bytes.data() + kFixedHeaderBytes), vlen);
  Reader t(bytes.subspan(kFixedHeaderBytes + vlen, kTrailerHeaderBytes), kFixedHeaderBytes + vlen);
  std::uint16_t parts[8] = {};
  for (std::uint16_t& part : parts) (void)t.u16(part, "header");
  const std::uint64_t payload_len =
      parts[0] | std::uint64_t{parts[1]} << 16 | std::uint64_t{parts[2]} << 32 | std::uint64_t{parts[3]} << 48;
  const std::uint64_t checksum =
      parts[4] | std::uint64_t{parts[5]} << 16 | std::uint64_t{parts[6]} << 32 | std::uint64_t{parts[7]} << 48;

  if (file_version != expected_kiln_version)
    return failed(PlanCacheProblem::KilnVersion,
                  fmt::format("written by kiln \"{}\", this is kiln \"{}\"", file_version, expected_kiln_version));
  if (fingerprint != ir::codec::op_table_fingerprint())
    return failed(PlanCacheProblem::OpTable, fmt::format("op table fingerprint {:08x}, this kiln's is {:08x}",
                                                         fingerprint, ir::codec::op_table_fingerprint()));
  const std::size_t available = bytes.size() - header_size;
  if (payload_len > available)
    return failed(PlanCacheProblem::Truncated,
                  fmt::format("payload of {} byte(s) announced, {} present", payload_len, available));
  if (payload_len < available)
    return failed(PlanCacheProblem::Malformed,
                  fmt::format("{} trailing byte(s) after the payload", available - payload_len));
  const auto payload = bytes.subspan(header_size);
  if (const std::uint64_t actual = fnv1a64(payload); actual != checksum)
    return failed(PlanCacheProblem::Checksum,
                  fmt::format("payload checksum {:016x}, header says {:016x}", actual, checksum));

  Reader r(payload, header_size);
  DecodedPlans out;
  std::size_t n = 0;
  if (!r.count(n, kMinPlanBytes, "plan count")) return failed(PlanCacheProblem::Malformed, located(r));
  out.plans.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t at = r.offset();
    if (!read_plan(r, out.plans[i]))
      return failed(PlanCacheProblem::Malformed, fmt::format("plan {}: {}", i, located(r)));
    if (std::string e = check_plan(out.plans[i].plan, out.plans[i].triggers); !e.empty())
      return failed(PlanCacheProblem::Malformed, fmt::format("plan {} (byte {}): {}", i, at, e));
  }
  if (!r.at_end())
    return failed(PlanCacheProblem::Malformed,
                  fmt::format("byte {}: {} byte(s) after the last plan", r.offset(), r.remaining()));
  return out;
}

PlanCacheLoadReport load_plans(std::span<const std::uint8_t> bytes, ExecutionPlanStore& store,
                               std::string_view expected_kiln_version) {
  PlanCacheLoadReport report;
  report.found = true;
  DecodedPlans decoded = decode_plans(bytes, store.search_options(), expected_kiln_version);
  if (!decoded.ok()) {
    report.problem = decoded.problem;
    report.reason = std::move(decoded.reason);
    return report;
  }
  // Only after the whole file validated: a bad file never leaves half its plans in the store.
  for (PlanRecord& rec : decoded.plans) {
    TriggerList triggers = std::move(rec.triggers);
    const auto added = store.add(std::move(rec.plan), triggers.front());
    for (std::size_t i = 1; i < triggers.size(); ++i) store.add_trigger(added.id, triggers[i]);
    ++(added.inserted ? report.loaded : report.merged);
  }
  return report;
}

Result<PlanCacheSaveReport> save_plan_cache(const ExecutionPlanStore& store, const std::filesystem::path& dir) {
  KILN_RETURN_IF_ERROR(ensure_private_dir(dir, "plan cache"));
  SerializedPlans s = serialize_plans(store);
  const std::filesystem::path file = dir / kPlanCacheFileName;
  KILN_RETURN_IF_ERROR(write_file_atomically(dir, kPlanCacheFileName, s.bytes, "plan cache"));

  PlanCacheSaveReport report;
  report.saved = s.saved;
  report.skipped = s.skipped;
  report.bytes = s.bytes.size();
  report.file = file;
  return report;
}

PlanCacheLoadReport load_plan_cache(ExecutionPlanStore& store, const std::filesystem::path& dir, const FusionLog& log) {
  PlanCacheLoadReport report;
  const std::filesystem::path file = dir / kPlanCacheFileName;
  auto ignore = [&](PlanCacheProblem problem, std::string reason) {
    report.problem = problem;
    report.reason = std::move(reason);
    warn(log, fmt::format("[plan-cache] ignoring {}: {}: {}", file.string(), plan_cache_problem_name(problem),
                          report.reason));
    return report;
  };

  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return report;  // first run: nothing saved yet
    report.directory_refused = true;
    return ignore(PlanCacheProblem::Unreadable, fmt::format("cannot stat the directory: {}", errno_text(errno)));
  }
  if (Status safe = check_private_dir(dir, st, "plan cache"); !safe.ok()) {
    report.directory_refused = true;
    return ignore(PlanCacheProblem::UnsafeDirectory, safe.error().message);
  }

  // O_NOFOLLOW: the file is ours to read, not whatever a link points at.
  UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    if (errno == ENOENT) return report;
    report.found = true;
    return ignore(PlanCacheProblem::Unreadable, fmt::format("cannot open: {}", errno_text(errno)));
  }
  report.found = true;
  if (::fstat(fd.get(), &st) != 0)
    return ignore(PlanCacheProblem::Unreadable, fmt::format("cannot stat: {}", errno_text(errno)));
  if (!S_ISREG(st.st_mode)) return ignore(PlanCacheProblem::Unreadable, "not a regular file");
  if (st.st_uid != ::geteuid())
    return ignore(PlanCacheProblem::UnsafeDirectory, fmt::format("file owned by uid {}", st.st_uid));
  if (static_cast<std::uint64_t>(st.st_size) > kMaxPlanCacheBytes)
    return ignore(PlanCacheProblem::TooLarge,
                  fmt::format("{} bytes, the limit is {}", static_cast<std::uint64_t>(st.st_size), kMaxPlanCacheBytes));

  // Read to EOF (bounded: the size may change under us if another process saves meanwhile).
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  for (;;) {
    if (got == bytes.size()) {
      if (bytes.size() > kMaxPlanCacheBytes)
        return ignore(PlanCacheProblem::TooLarge, fmt::format("more than {} bytes", kMaxPlanCacheBytes));
      bytes.resize(std::min(kMaxPlanCacheBytes + 1, bytes.size() + 4096));
    }
    const ssize_t k = ::read(fd.get(), bytes.data() + got, bytes.size() - got);
    if (k < 0) {
      if (errno == EINTR) continue;
      return ignore(PlanCacheProblem::Unreadable, fmt::format("read failed: {}", errno_text(errno)));
    }
    if (k == 0) break;
    got += static_cast<std::size_t>(k);
  }
  bytes.resize(got);

  PlanCacheLoadReport loaded = load_plans(bytes, store);
  if (!loaded.ok()) return ignore(loaded.problem, std::move(loaded.reason));
  log.log(LogLevel::Basic, [&] {
    return fmt::format("[plan-cache] loaded {} plan(s) from {} ({} already cached)", loaded.loaded, file.string(),
                       loaded.merged);
  });
  return loaded;
}

}  // namespace kiln::fusion

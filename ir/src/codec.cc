// Binary codec for operations, operation lists and graphs (format in codec.h).
#include "kiln/ir/codec.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>

#include "kiln/base/hash.h"

namespace kiln::ir::codec {
namespace {

// ---- Enum ranges the format relies on. Changing one of these enums changes the wire format:
// bump kFormatVersion and update the bounds below.
static_assert(static_cast<int>(Family::Activation) == kNumFamilies - 1);
static_assert(static_cast<int>(DTypeKind::QFloat) == 14);
static_assert(static_cast<int>(BoolStore::U32) == 2);
static_assert(static_cast<int>(QuantValue::Q2S) == 5);
static_assert(static_cast<int>(QuantStoreKind::PackedNative) == 2);
static_assert(static_cast<int>(QuantParam::BF16) == 2);
static_assert(static_cast<int>(TensorStatus::NotInit) == 2);
static_assert(static_cast<int>(ScalarIr::Kind::Bool) == 3);
static_assert(std::tuple_size_v<decltype(QuantScheme{}.block)> == 4);
static_assert(sizeof(double) == sizeof(std::uint64_t));

constexpr std::uint8_t kMaxDTypeKind = static_cast<std::uint8_t>(DTypeKind::QFloat);
constexpr std::uint8_t kMaxBoolStore = static_cast<std::uint8_t>(BoolStore::U32);
constexpr std::uint8_t kMaxQuantValue = static_cast<std::uint8_t>(QuantValue::Q2S);
constexpr std::uint8_t kMaxQuantStore = static_cast<std::uint8_t>(QuantStoreKind::PackedNative);
constexpr std::uint8_t kMaxQuantParam = static_cast<std::uint8_t>(QuantParam::BF16);
constexpr std::uint8_t kMaxStatus = static_cast<std::uint8_t>(TensorStatus::NotInit);
constexpr std::uint8_t kMaxScalarKind = static_cast<std::uint8_t>(ScalarIr::Kind::Bool);

// Minimum encoded size of each element, used to reject counts the remaining bytes cannot hold
// before anything is reserved.
constexpr std::size_t kMinTensorBytes = 4;  // id, status, dtype kind, rank
constexpr std::size_t kMinScalarBytes = 2;  // kind, 1-byte value
constexpr std::size_t kMinRangeBytes = 3;   // start, has_end, step
constexpr std::size_t kMinAttrBytes = 1;
constexpr std::size_t kMinOperationBytes = 9;  // kind, family, dtype, num_inputs, 5 counts
constexpr std::size_t kMinIdBytes = 1;

// ---- Op table fingerprint (FNV-1a over "Group/Variant/Signature;" of every row, in order).
constexpr std::uint32_t kTableFingerprint = [] {
  std::uint32_t h = kFnv32Offset;
#define KILN_OP(group, variant, sig, tags) h = fnv1a32(#group "/" #variant "/" #sig ";", h);
#include "kiln/ir/op_table.def"
#undef KILN_OP
  return h;
}();

// =============================================================================================
// Encoding. The same templated writers run twice: once with SizeCounter to get the exact size,
// once with PtrWriter into memory already sized for it (no per-byte bounds checks, one resize).

class SizeCounter {
 public:
  void byte(std::uint8_t) { ++n_; }
  void bytes(const std::uint8_t*, std::size_t k) { n_ += k; }
  std::size_t size() const { return n_; }

 private:
  std::size_t n_ = 0;
};

class PtrWriter {
 public:
  explicit PtrWriter(std::uint8_t* p) : p_(p) {}
  void byte(std::uint8_t b) { *p_++ = b; }
  void bytes(const std::uint8_t* s, std::size_t k) {
    if (k != 0) std::memcpy(p_, s, k);
    p_ += k;
  }
  std::uint8_t* pos() const { return p_; }

 private:
  std::uint8_t* p_;
};

template <class W>
void put_header(W& w, MessageType type) {
  w.bytes(kMagic.data(), kMagic.size());
  put_u16(w, kFormatVersion);
  put_u8(w, static_cast<std::uint8_t>(type));
  put_u8(w, 0);
  put_u32(w, kTableFingerprint);
}

template <class W>
void put_tensor(W& w, const TensorIr& t) {
  put_varint(w, t.id.value());
  put_u8(w, static_cast<std::uint8_t>(t.status));
  put_dtype(w, t.dtype);
  put_varint(w, t.shape.size());
  for (std::uint64_t d : t.shape) put_varint(w, d);
}

template <class W>
void put_scalar(W& w, const ScalarIr& s) {
  put_u8(w, static_cast<std::uint8_t>(s.kind()));
  switch (s.kind()) {
    case ScalarIr::Kind::Float: {
      const double f = s.as_float();
      std::uint64_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      put_u64(w, bits);
      break;
    }
    case ScalarIr::Kind::Int: put_svarint(w, s.as_int()); break;
    case ScalarIr::Kind::UInt: put_varint(w, s.as_uint()); break;
    case ScalarIr::Kind::Bool: put_u8(w, s.as_bool() ? 1 : 0); break;
  }
}

template <class W>
void put_operation(W& w, const Operation& op) {
  put_varint(w, static_cast<std::uint64_t>(op.kind));
  put_u8(w, static_cast<std::uint8_t>(op.family));
  put_dtype(w, op.dtype);
  put_u8(w, op.num_inputs);
  put_varint(w, op.tensors.size());
  for (const TensorIr& t : op.tensors) put_tensor(w, t);
  put_varint(w, op.scalars.size());
  for (const ScalarIr& s : op.scalars) put_scalar(w, s);
  put_varint(w, op.ranges.size());
  for (const Slice& r : op.ranges) {
    put_svarint(w, r.start);
    put_u8(w, r.end ? 1 : 0);
    if (r.end) put_svarint(w, *r.end);
    put_svarint(w, r.step);
  }
  put_varint(w, op.attrs.size());
  for (std::int64_t a : op.attrs) put_svarint(w, a);
  put_varint(w, op.custom_id.size());
  w.bytes(reinterpret_cast<const std::uint8_t*>(op.custom_id.data()), op.custom_id.size());
}

template <class W>
void put_operations(W& w, std::span<const Operation> ops) {
  put_varint(w, ops.size());
  for (const Operation& op : ops) put_operation(w, op);
}

template <class W>
void put_ids(W& w, const std::vector<TensorId>& ids) {
  put_varint(w, ids.size());
  for (TensorId id : ids) put_varint(w, id.value());
}

// A message: its type and a body writer.
template <class Body>
std::size_t message_size(MessageType type, const Body& body) {
  SizeCounter c;
  put_header(c, type);
  body(c);
  return c.size();
}

template <class Body>
void append_message(std::vector<std::uint8_t>& out, MessageType type, const Body& body) {
  const std::size_t n = message_size(type, body);
  const std::size_t old = out.size();
  // Geometric growth: an exact reserve per message would make repeated appends quadratic.
  if (out.capacity() - old < n) out.reserve(std::max(old + n, 2 * out.capacity()));
  out.resize(old + n);
  PtrWriter w(out.data() + old);
  put_header(w, type);
  body(w);
  assert(w.pos() == out.data() + old + n);
}

template <class Body>
Result<std::size_t> write_message(std::span<std::uint8_t> buf, MessageType type, const Body& body, const char* what) {
  const std::size_t n = message_size(type, body);
  if (buf.size() < n)
    return make_error(ErrorCode::ResourceExhausted,
                      fmt::format("codec: encode {}: message needs {} bytes, buffer holds {}", what, n, buf.size()));
  PtrWriter w(buf.data());
  put_header(w, type);
  body(w);
  assert(w.pos() == buf.data() + n);
  return n;
}

// =============================================================================================
// Decoding. Reader methods return false on failure after recording the first error with its
// byte offset; callers add context on the way out (wrap) and the entry point turns it into an
// Error. Nothing on the success path builds strings.

using Reader = ByteReader;

// The reader's error as this codec words it: "<message> at byte offset <n>".
std::string located(const Reader& r) { return fmt::format("{} at byte offset {}", r.error(), r.error_offset()); }

bool read_header(Reader& r, MessageHeader& h) {
  std::span<const std::uint8_t> magic_bytes;
  if (!r.take(kMagic.size(), magic_bytes, "magic")) return false;
  const std::uint8_t* magic = magic_bytes.data();
  if (std::memcmp(magic, kMagic.data(), kMagic.size()) != 0)
    return r.fail(0, fmt::format("wrong magic {:02x} {:02x} {:02x} {:02x} (expected \"KIRC\")", magic[0], magic[1],
                                 magic[2], magic[3]));
  std::size_t at = r.offset();
  if (!r.fixed(h.version, "format version")) return false;
  if (h.version != kFormatVersion)
    return r.fail(at, fmt::format("unsupported format version {} (this build reads {})", h.version, kFormatVersion));
  at = r.offset();
  std::uint8_t type = 0;
  if (!r.u8(type, "message type")) return false;
  if (type < static_cast<std::uint8_t>(MessageType::Operation) || type > static_cast<std::uint8_t>(MessageType::Graph))
    return r.fail(at, fmt::format("unknown message type {}", type));
  h.type = static_cast<MessageType>(type);
  at = r.offset();
  std::uint8_t reserved = 0;
  if (!r.u8(reserved, "reserved header byte")) return false;
  if (reserved != 0) return r.fail(at, fmt::format("reserved header byte is {} (must be 0)", reserved));
  at = r.offset();
  if (!r.fixed(h.table_fingerprint, "op table fingerprint")) return false;
  if (h.table_fingerprint != kTableFingerprint)
    return r.fail(at, fmt::format("op table fingerprint {:08x} differs from this build's {:08x} (peer built from "
                                  "another op_table.def)",
                                  h.table_fingerprint, kTableFingerprint));
  return true;
}

bool read_tensor(Reader& r, TensorIr& t) {
  std::uint64_t id = 0;
  if (!r.varint(id, "tensor id")) return false;
  t.id = TensorId(id);
  if (!r.enumeration(t.status, kMaxStatus, "tensor status")) return false;
  if (!read_dtype(r, t.dtype, "dtype kind")) return false;
  std::size_t rank = 0;
  if (!r.count(rank, 1, "tensor rank", kMaxRank)) return false;
  t.shape.resize(rank);
  for (std::uint64_t& d : t.shape)
    if (!r.varint(d, "shape dim")) return false;
  return true;
}

bool read_scalar(Reader& r, ScalarIr& s) {
  ScalarIr::Kind kind{};
  if (!r.enumeration(kind, kMaxScalarKind, "scalar kind")) return false;
  switch (kind) {
    case ScalarIr::Kind::Float: {
      std::uint64_t bits = 0;
      if (!r.fixed(bits, "f64 scalar")) return false;
      double f;
      std::memcpy(&f, &bits, sizeof f);
      s = ScalarIr::Float(f);
      return true;
    }
    case ScalarIr::Kind::Int: {
      std::int64_t v = 0;
      if (!r.svarint(v, "i64 scalar")) return false;
      s = ScalarIr::Int(v);
      return true;
    }
    case ScalarIr::Kind::UInt: {
      std::uint64_t v = 0;
      if (!r.varint(v, "u64 scalar")) return false;
      s = ScalarIr::UInt(v);
      return true;
    }
    case ScalarIr::Kind::Bool: {
      const std::size_t at = r.offset();
      std::uint8_t v = 0;
      if (!r.u8(v, "bool scalar")) return false;
      if (v > 1) return r.fail(at, fmt::format("bool scalar byte is {} (must be 0 or 1)", v));
      s = ScalarIr::Bool(v != 0);
      return true;
    }
  }
  return false;  // unreachable: enumeration() bounds the kind
}

bool read_range(Reader& r, Slice& s) {
  if (!r.svarint(s.start, "slice start")) return false;
  const std::size_t at = r.offset();
  std::uint8_t has_end = 0;
  if (!r.u8(has_end, "slice has_end flag")) return false;
  if (has_end > 1) return r.fail(at, fmt::format("slice has_end flag is {} (must be 0 or 1)", has_end));
  if (has_end) {
    std::int64_t end = 0;
    if (!r.svarint(end, "slice end")) return false;
    s.end = end;
  } else {
    s.end.reset();
  }
  return r.svarint(s.step, "slice step");
}

// Offset (within `s`) of the first byte that makes `s` an unacceptable custom id: not UTF-8, or
// a C0/C1 control character or DEL (ids end up in logs). Returns s.size() when all is well.
std::size_t bad_custom_id_byte(const std::uint8_t* s, std::size_t n) {
  std::size_t i = 0;
  while (i < n) {
    const std::uint8_t c = s[i];
    if (c < 0x80) {
      if (c < 0x20 || c == 0x7f) return i;
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint8_t lo = 0x80, hi = 0xbf;  // bounds of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      if (c == 0xc2) lo = 0xa0;  // U+0080..U+009F are C1 controls
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0)
        lo = 0xa0;  // overlong
      else if (c == 0xed)
        hi = 0x9f;  // surrogates
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0)
        lo = 0x90;  // overlong
      else if (c == 0xf4)
        hi = 0x8f;  // above U+10FFFF
    } else {
      return i;
    }
    if (n - i < len) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (std::size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xbf) return i;
    i += len;
  }
  return n;
}

bool read_operation(Reader& r, Operation& op) {
  const std::size_t start = r.offset();
  std::uint64_t kind = 0;
  if (!r.varint(kind, "operation kind")) return false;
  if (kind >= static_cast<std::uint64_t>(kNumOpKinds))
    return r.fail(start, fmt::format("unknown operation kind {} (the op table has {})", kind, kNumOpKinds));
  op.kind = static_cast<OpKind>(kind);
  if (!r.enumeration(op.family, static_cast<std::uint8_t>(kNumFamilies - 1), "family")) return false;
  if (!read_dtype(r, op.dtype, "dtype kind")) return r.wrap("carried dtype");
  if (!r.u8(op.num_inputs, "num_inputs")) return false;

  std::size_t n = 0;
  if (!r.count(n, kMinTensorBytes, "tensor count", kMaxTensorsPerOp)) return false;
  op.tensors.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!read_tensor(r, op.tensors.emplace_back())) return r.wrap(fmt::format("tensor {}", i));
  }
  if (!r.count(n, kMinScalarBytes, "scalar count", kMaxScalarsPerOp)) return false;
  op.scalars.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!read_scalar(r, op.scalars.emplace_back())) return r.wrap(fmt::format("scalar {}", i));
  }
  if (!r.count(n, kMinRangeBytes, "range count", kMaxRangesPerOp)) return false;
  op.ranges.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!read_range(r, op.ranges.emplace_back())) return r.wrap(fmt::format("range {}", i));
  }
  if (!r.count(n, kMinAttrBytes, "attribute count", kMaxAttrsPerOp)) return false;
  op.attrs.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (!r.svarint(op.attrs.emplace_back(), "attribute")) return r.wrap(fmt::format("attribute {}", i));
  }
  const std::size_t id_at = r.offset();
  if (!r.count(n, 1, "custom id length", kMaxCustomIdBytes)) return false;
  std::span<const std::uint8_t> id_bytes;
  if (!r.take(n, id_bytes, "custom id")) return false;
  const std::uint8_t* id = id_bytes.data();
  if (const std::size_t bad = bad_custom_id_byte(id, n); bad != n)
    return r.fail(id_at, fmt::format("custom id is not printable UTF-8 (byte {} of {})", bad, n));
  op.custom_id.assign(reinterpret_cast<const char*>(id), n);

  if (Status st = op.validate(); !st.ok())
    return r.fail(start, fmt::format("invalid operation: {}", st.error().message));
  return true;
}

bool read_operations(Reader& r, std::vector<Operation>& ops) {
  std::size_t n = 0;
  if (!r.count(n, kMinOperationBytes, "operation count", kMaxOperations)) return false;
  ops.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t at = r.offset();
    if (!read_operation(r, ops.emplace_back())) return r.wrap(fmt::format("operation #{} (at byte {})", i, at));
  }
  return true;
}

bool read_ids(Reader& r, std::vector<TensorId>& ids, const char* what) {
  std::size_t n = 0;
  if (!r.count(n, kMinIdBytes, what, kMaxGraphBoundary)) return false;
  ids.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t v = 0;
    if (!r.varint(v, "tensor id")) return r.wrap(fmt::format("{} #{}", what, i));
    ids.emplace_back(v);
  }
  return true;
}

const char* type_name(MessageType t) {
  switch (t) {
    case MessageType::Operation: return "Operation";
    case MessageType::OperationList: return "OperationList";
    case MessageType::Graph: return "Graph";
  }
  return "?";
}

// Runs a whole-message decode into `value`: header of the expected type, body, no trailing bytes.
template <class T, class Body>
Status decode_message_into(std::span<const std::uint8_t> bytes, MessageType type, const Body& body, T& value) {
  Reader r(bytes);
  MessageHeader h;
  bool ok = read_header(r, h);
  if (ok && h.type != type)
    ok = r.fail(6, fmt::format("message type is {} (expected {})", type_name(h.type), type_name(type)));
  ok = ok && body(r, value);
  if (ok && r.remaining() != 0)
    ok = r.fail(r.offset(), fmt::format("{} trailing byte(s) after the message", r.remaining()));
  if (!ok)
    return make_error(ErrorCode::Decode, fmt::format("codec: cannot decode {} message ({} bytes): {}", type_name(type),
                                                     bytes.size(), located(r)));
  return Status::Ok();
}

template <class T, class Body>
Result<T> decode_message(std::span<const std::uint8_t> bytes, MessageType type, const Body& body) {
  T value{};
  KILN_RETURN_IF_ERROR(decode_message_into(bytes, type, body, value));
  return value;
}

}  // namespace

std::uint32_t op_table_fingerprint() { return kTableFingerprint; }

std::size_t encoded_size(const Operation& op) {
  return message_size(MessageType::Operation, [&](auto& w) { put_operation(w, op); });
}
std::size_t encoded_size(std::span<const Operation> ops) {
  return message_size(MessageType::OperationList, [&](auto& w) { put_operations(w, ops); });
}
std::size_t encoded_size(const GraphIr& graph) {
  return message_size(MessageType::Graph, [&](auto& w) {
    put_operations(w, std::span<const Operation>(graph.operations));
    put_ids(w, graph.inputs);
    put_ids(w, graph.outputs);
  });
}

void encode_operation(const Operation& op, std::vector<std::uint8_t>& out) {
  append_message(out, MessageType::Operation, [&](auto& w) { put_operation(w, op); });
}
void encode_operations(std::span<const Operation> ops, std::vector<std::uint8_t>& out) {
  append_message(out, MessageType::OperationList, [&](auto& w) { put_operations(w, ops); });
}
void encode_graph(const GraphIr& graph, std::vector<std::uint8_t>& out) {
  append_message(out, MessageType::Graph, [&](auto& w) {
    put_operations(w, std::span<const Operation>(graph.operations));
    put_ids(w, graph.inputs);
    put_ids(w, graph.outputs);
  });
}

Result<std::size_t> encode_operation_into(const Operation& op, std::span<std::uint8_t> buf) {
  return write_message(
      buf, MessageType::Operation, [&](auto& w) { put_operation(w, op); }, "operation");
}
Result<std::size_t> encode_operations_into(std::span<const Operation> ops, std::span<std::uint8_t> buf) {
  return write_message(
      buf, MessageType::OperationList, [&](auto& w) { put_operations(w, ops); }, "operation list");
}
Result<std::size_t> encode_graph_into(const GraphIr& graph, std::span<std::uint8_t> buf) {
  return write_message(
      buf, MessageType::Graph,
      [&](auto& w) {
        put_operations(w, std::span<const Operation>(graph.operations));
        put_ids(w, graph.inputs);
        put_ids(w, graph.outputs);
      },
      "graph");
}

Result<MessageHeader> decode_header(std::span<const std::uint8_t> bytes) {
  Reader r(bytes);
  MessageHeader h;
  if (!read_header(r, h))
    return make_error(ErrorCode::Decode, fmt::format("codec: cannot decode message header: {}", located(r)));
  return h;
}

Result<Operation> decode_operation(std::span<const std::uint8_t> bytes) {
  return decode_message<Operation>(bytes, MessageType::Operation,
                                   [](Reader& r, Operation& op) { return read_operation(r, op); });
}

Status decode_operation_into(std::span<const std::uint8_t> bytes, Operation& op) {
  // Reuse op's storage; read_operation sets every scalar field and appends to the lists.
  op.tensors.clear();
  op.scalars.clear();
  op.ranges.clear();
  op.attrs.clear();
  op.custom_id.clear();
  return decode_message_into(
      bytes, MessageType::Operation, [](Reader& r, Operation& o) { return read_operation(r, o); }, op);
}

Result<std::vector<Operation>> decode_operations(std::span<const std::uint8_t> bytes) {
  return decode_message<std::vector<Operation>>(
      bytes, MessageType::OperationList,
      [](Reader& r, std::vector<Operation>& ops) { return read_operations(r, ops); });
}

Result<GraphIr> decode_graph(std::span<const std::uint8_t> bytes) {
  return decode_message<GraphIr>(bytes, MessageType::Graph, [](Reader& r, GraphIr& g) {
    if (!read_operations(r, g.operations)) return false;
    if (!read_ids(r, g.inputs, "graph input")) return false;
    return read_ids(r, g.outputs, "graph output");
  });
}

bool read_dtype(ByteReader& r, DType& out, const char* what) {
  DTypeKind kind{};
  if (!r.enumeration(kind, kMaxDTypeKind, what)) return false;
  if (kind == DTypeKind::Bool) {
    BoolStore store{};
    if (!r.enumeration(store, kMaxBoolStore, "bool store")) return false;
    out = DType::boolean(store);
    return true;
  }
  if (kind == DTypeKind::QFloat) {
    QuantScheme s;
    if (!read_quant_scheme(r, s)) return false;
    out = DType::qfloat(s);
    return true;
  }
  out = DType(kind);
  return true;
}

bool read_quant_scheme(ByteReader& r, QuantScheme& s) {
  if (!r.enumeration(s.value, kMaxQuantValue, "quantization value type")) return false;
  if (!r.enumeration(s.store, kMaxQuantStore, "quantization store")) return false;
  if (!r.u8(s.packed_dim, "quantization packed dim")) return false;
  const std::size_t at = r.offset();
  if (!r.u8(s.block_rank, "quantization block rank")) return false;
  if (s.block_rank > s.block.size())
    return r.fail(at, fmt::format("quantization block rank {} exceeds {}", s.block_rank, s.block.size()));
  for (std::uint16_t& b : s.block)
    if (!r.fixed(b, "quantization block dim")) return false;
  return r.enumeration(s.param, kMaxQuantParam, "quantization parameter precision");
}

}  // namespace kiln::ir::codec

#include "kiln/ipc/protocol.h"

#include <algorithm>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "kiln/base/bytes.h"
#include "kiln/ir/codec.h"

namespace kiln::ipc {

namespace {

using ir::DType;
using ir::DTypeKind;
using ir::Shape;

constexpr std::size_t kMaxRank = ir::codec::kMaxRank;

// ---- writer -----------------------------------------------------------------------------------

using Writer = ByteWriter;

Status check_shape_encodable(const Shape& s) {
  if (s.size() > kMaxRank) {
    return make_error(ErrorCode::Invalid,
                      "rank " + std::to_string(s.size()) + " exceeds the limit " + std::to_string(kMaxRank));
  }
  return Status::Ok();
}

// A byte a fallback name may not hold, and where.
std::string fmt_byte_problem(unsigned char c, std::size_t at) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex = "0x";
  hex += kHex[c >> 4];
  hex += kHex[c & 0xf];
  return "byte " + hex + " at " + std::to_string(at) + " is not printable ASCII without spaces";
}

// What the format can carry of a report_fallbacks: the entry count and every name.
Status check_fallbacks_encodable(const ReportFallbacksCmd& c) {
  if (c.counts.size() > kMaxFallbackEntries) {
    return make_error(ErrorCode::Invalid, "report_fallbacks: " + std::to_string(c.counts.size()) +
                                              " entries exceed the limit " + std::to_string(kMaxFallbackEntries));
  }
  for (std::size_t i = 0; i < c.counts.size(); ++i) {
    const std::optional<std::string_view> previous =
        i == 0 ? std::nullopt : std::optional<std::string_view>(c.counts[i - 1].name);
    if (std::optional<std::string> problem = fallback_name_problem(c.counts[i].name, previous))
      return make_error(ErrorCode::Invalid, "report_fallbacks: entry " + std::to_string(i) + ": " + *problem);
  }
  return Status::Ok();
}

void put_dtype(Writer& w, DType d) {
  w.u8(static_cast<std::uint8_t>(d.kind()));
  w.u8(d.is_bool() ? static_cast<std::uint8_t>(d.bool_store()) : 0);
  if (d.is_quantized()) ir::codec::put_quant_scheme(w, d.scheme());
}
void put_shape(Writer& w, const Shape& s) {
  w.u8(static_cast<std::uint8_t>(s.size()));
  for (std::uint64_t d : s) w.u64(d);
}
void put_tensor(Writer& w, const ir::TensorIr& t) {
  w.u64(t.id.value());
  w.u8(static_cast<std::uint8_t>(t.status));
  put_dtype(w, t.dtype);
  put_shape(w, t.shape);
}
void put_token(Writer& w, const ExportToken& t) {
  for (std::uint8_t b : t.bytes) w.u8(b);
}
void put_range(Writer& w, ArenaRange r) {
  w.u64(r.offset);
  w.u64(r.length);
}

// Writes the header with a body_len placeholder; returns the message start.
std::size_t begin_message(Writer& w, std::uint8_t kind, std::uint64_t request_id) {
  const std::size_t start = w.size();
  w.u8(kind);
  w.u8(0);
  w.u16(0);
  w.u32(0);  // body_len, patched by end_message
  w.u64(request_id);
  return start;
}
Status end_message(Writer& w, std::size_t start) {
  const std::size_t total = w.size() - start;
  if (total > kMaxMessageBytes) {
    w.out().resize(start);
    return make_error(ErrorCode::Invalid, "message of " + std::to_string(total) + " bytes exceeds the limit " +
                                              std::to_string(kMaxMessageBytes));
  }
  w.patch_u32(start + 4, static_cast<std::uint32_t>(total - kMessageHeaderBytes));
  return Status::Ok();
}

// ---- reader -----------------------------------------------------------------------------------

// Reads fields in order; every error names the message kind and the field ("upload.shape").
class Reader {
 public:
  Reader(std::span<const std::uint8_t> b, const char* what) : b_(b), what_(what), kind_(what) {}

  void set_kind(const char* kind) { kind_ = kind; }
  std::size_t remaining() const { return b_.size() - pos_; }
  std::size_t pos() const { return pos_; }

  Error fail(const char* field, const std::string& msg) const {
    return make_error(ErrorCode::Decode, std::string(kind_) + "." + field + ": " + msg);
  }

  // An error naming the field when fewer than n bytes remain.
  Status need(const char* field, std::size_t n) const {
    if (remaining() >= n) return Status::Ok();
    return make_error(ErrorCode::Decode, std::string(what_) + " truncated: " + kind_ + "." + field + " needs " +
                                             std::to_string(n) + " bytes at offset " + std::to_string(pos_) +
                                             ", message has " + std::to_string(b_.size()));
  }
  Result<std::uint64_t> uint(const char* field, int n) {
    KILN_RETURN_IF_ERROR(need(field, static_cast<std::size_t>(n)));
    const std::uint64_t v = load_le(b_.data() + pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return v;
  }
  Result<std::uint8_t> u8(const char* f) {
    KILN_ASSIGN_OR_RETURN(auto v, uint(f, 1));
    return static_cast<std::uint8_t>(v);
  }
  Result<std::uint16_t> u16(const char* f) {
    KILN_ASSIGN_OR_RETURN(auto v, uint(f, 2));
    return static_cast<std::uint16_t>(v);
  }
  Result<std::uint32_t> u32(const char* f) {
    KILN_ASSIGN_OR_RETURN(auto v, uint(f, 4));
    return static_cast<std::uint32_t>(v);
  }
  Result<std::uint64_t> u64(const char* f) { return uint(f, 8); }
  Status zero_u8(const char* f) {
    KILN_ASSIGN_OR_RETURN(auto v, u8(f));
    if (v != 0) return fail(f, "reserved byte is " + std::to_string(v) + ", must be 0");
    return Status::Ok();
  }
  std::span<const std::uint8_t> take(std::size_t n) {  // caller checked remaining()
    auto s = b_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  Status finish() const {
    if (remaining() != 0) {
      return make_error(ErrorCode::Decode, std::string(kind_) + ": " + std::to_string(remaining()) +
                                               " trailing bytes after the last field");
    }
    return Status::Ok();
  }

 private:
  std::span<const std::uint8_t> b_;
  const char* what_;
  const char* kind_;
  std::size_t pos_ = 0;
};

Result<DType> get_dtype(Reader& r, const char* field) {
  KILN_ASSIGN_OR_RETURN(const std::uint8_t kind, r.u8(field));
  KILN_ASSIGN_OR_RETURN(const std::uint8_t store, r.u8(field));
  if (kind > static_cast<std::uint8_t>(DTypeKind::QFloat))
    return r.fail(field, "unknown dtype kind " + std::to_string(kind));
  if (kind == static_cast<std::uint8_t>(DTypeKind::Bool)) {
    if (store > static_cast<std::uint8_t>(ir::BoolStore::U32)) {
      return r.fail(field, "unknown bool store " + std::to_string(store));
    }
    return DType::boolean(static_cast<ir::BoolStore>(store));
  }
  if (store != 0) return r.fail(field, "store byte is " + std::to_string(store) + " for a non-bool dtype, must be 0");
  if (kind == static_cast<std::uint8_t>(DTypeKind::QFloat)) {
    // The scheme, as the IR codec writes it (its enums checked there; the geometry against the
    // shape where the tensor's bytes are counted, tensor_bytes).
    KILN_RETURN_IF_ERROR(r.need(field, ir::codec::kQuantSchemeBytes));
    ByteReader scheme_bytes(r.take(ir::codec::kQuantSchemeBytes));
    ir::QuantScheme q;
    if (!ir::codec::read_quant_scheme(scheme_bytes, q)) return r.fail(field, scheme_bytes.error());
    return DType::qfloat(q);
  }
  return DType(static_cast<DTypeKind>(kind));
}

Result<Shape> get_shape(Reader& r, const char* field) {
  KILN_ASSIGN_OR_RETURN(const std::uint8_t rank, r.u8(field));
  if (rank > kMaxRank) {
    return r.fail(field, "rank " + std::to_string(rank) + " exceeds the limit " + std::to_string(kMaxRank));
  }
  Shape s;
  s.reserve(rank);  // <= 16 entries: bounded whatever the input
  for (std::uint8_t i = 0; i < rank; ++i) {
    KILN_ASSIGN_OR_RETURN(const std::uint64_t d, r.u64(field));
    s.push_back(d);
  }
  return s;
}

Result<ir::TensorStatus> get_status(Reader& r, const char* field) {
  KILN_ASSIGN_OR_RETURN(const std::uint8_t st, r.u8(field));
  if (st == static_cast<std::uint8_t>(ir::TensorStatus::ReadOnly)) return ir::TensorStatus::ReadOnly;
  if (st == static_cast<std::uint8_t>(ir::TensorStatus::ReadWrite)) return ir::TensorStatus::ReadWrite;
  if (st == static_cast<std::uint8_t>(ir::TensorStatus::NotInit)) {
    return r.fail(field, "status NotInit is not allowed (the tensor must exist)");
  }
  return r.fail(field, "unknown tensor status " + std::to_string(st));
}

Result<ir::TensorIr> get_tensor(Reader& r) {
  ir::TensorIr t;
  KILN_ASSIGN_OR_RETURN(const std::uint64_t id, r.u64("tensor.id"));
  t.id = ir::TensorId(id);
  KILN_ASSIGN_OR_RETURN(t.status, get_status(r, "tensor.status"));
  KILN_ASSIGN_OR_RETURN(t.dtype, get_dtype(r, "tensor.dtype"));
  KILN_ASSIGN_OR_RETURN(t.shape, get_shape(r, "tensor.shape"));
  return t;
}

Result<ArenaRange> get_range(Reader& r, const char* field, const char* off_field, const char* len_field,
                             std::uint64_t arena_size) {
  ArenaRange a;
  KILN_ASSIGN_OR_RETURN(a.offset, r.u64(off_field));
  KILN_ASSIGN_OR_RETURN(a.length, r.u64(len_field));
  if (!range_fits(a, arena_size)) {
    return r.fail(field, "range [" + std::to_string(a.offset) + ", +" + std::to_string(a.length) +
                             ") is outside the arena of " + std::to_string(arena_size) + " bytes");
  }
  return a;
}

// A part or window of a tensor's bytes: at least 1 byte, [offset, offset + length) inside the
// tensor's `size` bytes (overflow-safe).
Status check_window(const Reader& r, const char* off_field, const char* data_field, std::uint64_t offset,
                    std::uint64_t length, DType dtype, const Shape& shape, std::uint64_t size) {
  const auto tensor = [&] {
    return dtype.name() + ir::shape_to_string(shape) + " (" + std::to_string(size) + " bytes)";
  };
  if (length == 0) return r.fail(data_field, "length 0: a part carries at least 1 byte");
  if (offset >= size) return r.fail(off_field, std::to_string(offset) + " is not inside " + tensor());
  if (length > size - offset) {
    return r.fail(data_field, "length " + std::to_string(length) + " at offset " + std::to_string(offset) +
                                  " runs past the end of " + tensor());
  }
  return Status::Ok();
}

// The body of a part (upload_part, read_part_done): dtype, shape, offset, data range, the range
// a window inside the tensor. `Part` has dtype, shape, offset and data members.
Result<ExportToken> get_token(Reader& r, const char* field) {
  KILN_RETURN_IF_ERROR(r.need(field, ExportToken::kBytes));
  ExportToken t;
  std::span<const std::uint8_t> b = r.take(ExportToken::kBytes);
  std::copy(b.begin(), b.end(), t.bytes.begin());
  return t;
}

template <class Part>
Status get_part(Reader& r, Part& c, std::uint64_t arena_size) {
  KILN_ASSIGN_OR_RETURN(c.dtype, get_dtype(r, "dtype"));
  KILN_ASSIGN_OR_RETURN(c.shape, get_shape(r, "shape"));
  KILN_ASSIGN_OR_RETURN(c.offset, r.u64("offset"));
  KILN_ASSIGN_OR_RETURN(c.data, get_range(r, "data", "data.offset", "data.length", arena_size));
  auto n = tensor_bytes(c.dtype, c.shape);
  if (!n.ok()) return r.fail("shape", n.error().message);
  return check_window(r, "offset", "data", c.offset, c.data.length, c.dtype, c.shape, *n);
}

// The fixed header; leaves the reader at the body. `kind_count` bounds the kind byte.
struct Header {
  std::uint8_t kind;
  std::uint64_t request_id;
};
Result<Header> get_header(Reader& r, std::span<const std::uint8_t> bytes, const char* what, std::uint8_t kind_count) {
  if (bytes.size() > kMaxMessageBytes) {
    return make_error(ErrorCode::Decode, std::string(what) + " of " + std::to_string(bytes.size()) +
                                             " bytes exceeds the limit " + std::to_string(kMaxMessageBytes));
  }
  Header h{};
  KILN_ASSIGN_OR_RETURN(h.kind, r.u8("kind"));
  KILN_RETURN_IF_ERROR(r.zero_u8("reserved"));
  KILN_ASSIGN_OR_RETURN(const std::uint16_t res16, r.u16("reserved"));
  if (res16 != 0) return r.fail("reserved", "reserved bytes are not 0");
  KILN_ASSIGN_OR_RETURN(const std::uint32_t body_len, r.u32("body_len"));
  KILN_ASSIGN_OR_RETURN(h.request_id, r.u64("request_id"));
  if (body_len != r.remaining()) {
    return r.fail("body_len", std::to_string(body_len) + " but the message has " + std::to_string(r.remaining()) +
                                  " bytes after the header");
  }
  if (h.kind == 0 || h.kind > kind_count) {
    return r.fail("kind", std::string(what) + " kind " + std::to_string(h.kind) + " is unknown");
  }
  return h;
}

// A control command's words: bounded, printable ASCII (spaces included).
std::optional<std::string> control_args_problem(std::string_view args) {
  if (args.size() > kMaxControlArgBytes)
    return std::to_string(args.size()) + " bytes exceed the limit " + std::to_string(kMaxControlArgBytes);
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto c = static_cast<unsigned char>(args[i]);
    if (c < 0x20 || c > 0x7e)
      return "byte " + std::to_string(c) + " at " + std::to_string(i) + " is not printable ASCII";
  }
  return std::nullopt;
}

}  // namespace

const char* control_verb_name(ControlVerb v) {
  switch (v) {
    case ControlVerb::Jobs: return "jobs";
    case ControlVerb::Clients: return "clients";
    case ControlVerb::Limits: return "limits";
    case ControlVerb::Disconnect: return "disconnect";
    case ControlVerb::Drain: return "drain";
    case ControlVerb::Reload: return "reload";
    case ControlVerb::Metrics: return "metrics";
    case ControlVerb::Stop: return "stop";
    case ControlVerb::Plans: return "plans";
  }
  return "unknown";
}

const char* command_kind_name(CommandKind k) {
  switch (k) {
    case CommandKind::AttachStream: return "attach_stream";
    case CommandKind::RegisterOp: return "register_op";
    case CommandKind::Upload: return "upload";
    case CommandKind::Read: return "read";
    case CommandKind::Sync: return "sync";
    case CommandKind::Drop: return "drop";
    case CommandKind::Export: return "export";
    case CommandKind::Import: return "import";
    case CommandKind::CloseStream: return "close_stream";
    case CommandKind::Status: return "status";
    case CommandKind::UploadPart: return "upload_part";
    case CommandKind::ReadPart: return "read_part";
    case CommandKind::ReportFallbacks: return "report_fallbacks";
    case CommandKind::Control: return "control";
  }
  return "unknown";
}

const char* completion_kind_name(CompletionKind k) {
  switch (k) {
    case CompletionKind::Ok: return "ok";
    case CompletionKind::Error: return "error";
    case CompletionKind::ReadDone: return "read_done";
    case CompletionKind::Exported: return "exported";
    case CompletionKind::StatusText: return "status_text";
    case CompletionKind::ReadPartDone: return "read_part_done";
  }
  return "unknown";
}

std::optional<std::string> fallback_name_problem(std::string_view name, std::optional<std::string_view> previous) {
  if (name.empty()) return "empty name";
  if (name.size() > kMaxFallbackNameBytes)
    return "name of " + std::to_string(name.size()) + " bytes exceeds the limit " +
           std::to_string(kMaxFallbackNameBytes);
  for (std::size_t i = 0; i < name.size(); ++i) {
    // Printable ASCII without spaces: a name can neither break the status text's lines nor
    // reach a terminal as a control sequence.
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x21 || c > 0x7e) return fmt_byte_problem(c, i);
  }
  if (previous && !(*previous < name))
    return "'" + std::string(name) + "' after '" + std::string(*previous) + "': names must be sorted and unique";
  return std::nullopt;
}

Result<std::uint64_t> tensor_bytes(ir::DType dtype, const ir::Shape& shape) {
  if (dtype.is_quantized()) {  // kiln's QFloat layout: the values' words, the scales, the global scale
    KILN_ASSIGN_OR_RETURN(ir::shape::QuantGeometry g, ir::shape::quant_geometry(shape, dtype.scheme()));
    return g.total_bytes;
  }
  std::uint64_t n = dtype.size_bytes();
  for (std::uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) {
      return make_error(ErrorCode::OutOfBounds,
                        "tensor " + dtype.name() + ir::shape_to_string(shape) + " has more than 2^64 bytes");
    }
  }
  return n;
}

std::uint64_t ExportToken::index() const {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < 8; ++i) v |= std::uint64_t{bytes[i]} << (8 * i);
  return v;
}

bool token_equal(const ExportToken& a, const ExportToken& b) {
  // Every byte is looked at whatever differs; the volatile keeps the compiler from turning the
  // fold into an early-exit comparison.
  volatile std::uint8_t diff = 0;
  for (std::size_t i = 0; i < ExportToken::kBytes; ++i)
    diff = static_cast<std::uint8_t>(diff | (a.bytes[i] ^ b.bytes[i]));
  return diff == 0;
}

Completion error_completion(std::uint64_t request_id, const Error& e) {
  std::string msg = e.message;
  if (msg.size() > kMaxErrorMessageBytes) {
    std::size_t cut = kMaxErrorMessageBytes;
    // Back up over UTF-8 continuation bytes so the text stays valid.
    while (cut > 0 && (static_cast<unsigned char>(msg[cut]) & 0xC0) == 0x80) --cut;
    msg.resize(cut);
  }
  return Completion{request_id, ErrorCpl{e.code, std::move(msg)}};
}

namespace {

// Whether every field of `body` can be written (dtype, shape, fallback names), before anything is.
Status check_command_encodable(const CommandBody& body) {
  return std::visit(
      [](const auto& b) -> Status {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, UploadCmd> || std::is_same_v<T, UploadPartCmd>) {
          return check_shape_encodable(b.shape);
        } else if constexpr (std::is_same_v<T, ReadCmd> || std::is_same_v<T, DropCmd> ||
                             std::is_same_v<T, ReadPartCmd>) {
          return check_shape_encodable(b.tensor.shape);
        } else if constexpr (std::is_same_v<T, ReportFallbacksCmd>) {
          return check_fallbacks_encodable(b);
        } else if constexpr (std::is_same_v<T, ControlCmd>) {
          if (std::optional<std::string> problem = control_args_problem(b.args))
            return make_error(ErrorCode::Invalid, "control.args: " + *problem);
          return Status::Ok();
        } else {
          return Status::Ok();
        }
      },
      body);
}

// The fields of `body` after the message header.
void put_command_body(Writer& w, const CommandBody& body) {
  std::visit(
      [&w](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, AttachStreamCmd> || std::is_same_v<T, SyncCmd> ||
                      std::is_same_v<T, CloseStreamCmd>) {
          w.u64(b.stream);
        } else if constexpr (std::is_same_v<T, RegisterOpCmd>) {
          w.u64(b.stream);
          const std::size_t len_at = w.size();
          w.u32(0);
          ir::codec::encode_operation(b.op, w.out());
          // An oversized op makes the whole message oversized; end_message refuses it.
          const std::size_t op_len = w.size() - len_at - 4;
          w.patch_u32(len_at, static_cast<std::uint32_t>(std::min<std::size_t>(op_len, UINT32_MAX)));
        } else if constexpr (std::is_same_v<T, UploadCmd>) {
          w.u64(b.stream);
          w.u64(b.tensor.value());
          put_dtype(w, b.dtype);
          put_shape(w, b.shape);
          put_range(w, b.data);
        } else if constexpr (std::is_same_v<T, ReadCmd>) {
          w.u64(b.stream);
          put_tensor(w, b.tensor);
          put_range(w, b.dest);
        } else if constexpr (std::is_same_v<T, DropCmd>) {
          w.u64(b.stream);
          put_tensor(w, b.tensor);
        } else if constexpr (std::is_same_v<T, ExportCmd>) {
          w.u64(b.stream);
          w.u64(b.tensor.value());
        } else if constexpr (std::is_same_v<T, ImportCmd>) {
          w.u64(b.stream);
          put_token(w, b.token);
          w.u64(b.tensor.value());
        } else if constexpr (std::is_same_v<T, StatusCmd>) {
          w.u8(b.json ? 1 : 0);
        } else if constexpr (std::is_same_v<T, UploadPartCmd>) {
          w.u64(b.stream);
          w.u64(b.tensor.value());
          put_dtype(w, b.dtype);
          put_shape(w, b.shape);
          w.u64(b.offset);
          put_range(w, b.data);
        } else if constexpr (std::is_same_v<T, ReadPartCmd>) {
          w.u64(b.stream);
          put_tensor(w, b.tensor);
          w.u64(b.offset);
          put_range(w, b.dest);
        } else if constexpr (std::is_same_v<T, ReportFallbacksCmd>) {
          // check_fallbacks_encodable bounded the count (<= 256) and every name (1..128 bytes).
          w.u16(static_cast<std::uint16_t>(b.counts.size()));
          for (const FallbackCount& f : b.counts) {
            w.u8(static_cast<std::uint8_t>(f.name.size()));
            w.bytes(std::string_view(f.name));
            w.u64(f.calls);
          }
        } else if constexpr (std::is_same_v<T, ControlCmd>) {
          // check_command_encodable bounded the args (<= kMaxControlArgBytes).
          w.u8(static_cast<std::uint8_t>(b.verb));
          w.u8(b.json ? 1 : 0);
          w.u16(static_cast<std::uint16_t>(b.args.size()));
          w.bytes(std::string_view(b.args));
        }
      },
      body);
}

}  // namespace

Status encode_command(const Command& cmd, std::vector<std::uint8_t>& out) {
  // Check representability first, so that nothing is appended on error.
  KILN_RETURN_IF_ERROR(check_command_encodable(cmd.body));
  Writer w(out);
  const std::size_t start = begin_message(w, static_cast<std::uint8_t>(cmd.kind()), cmd.request_id);
  put_command_body(w, cmd.body);
  return end_message(w, start);
}

Status encode_completion(const Completion& cpl, std::vector<std::uint8_t>& out) {
  if (const auto* rd = std::get_if<ReadDoneCpl>(&cpl.body)) {
    KILN_RETURN_IF_ERROR(check_shape_encodable(rd->shape));
  }
  if (const auto* rp = std::get_if<ReadPartDoneCpl>(&cpl.body)) {
    KILN_RETURN_IF_ERROR(check_shape_encodable(rp->shape));
  }
  Writer w(out);
  const std::size_t start = begin_message(w, static_cast<std::uint8_t>(cpl.kind()), cpl.request_id);
  std::visit(
      [&w](const auto& b) {
        using T = std::decay_t<decltype(b)>;
        if constexpr (std::is_same_v<T, ErrorCpl>) {
          const Completion c = error_completion(0, Error{b.code, b.message});  // truncates
          const auto& msg = std::get<ErrorCpl>(c.body).message;
          w.u8(static_cast<std::uint8_t>(b.code));
          w.u8(0);
          w.u16(static_cast<std::uint16_t>(msg.size()));
          w.bytes(msg);
        } else if constexpr (std::is_same_v<T, ReadDoneCpl>) {
          put_dtype(w, b.dtype);
          put_shape(w, b.shape);
          put_range(w, b.data);
        } else if constexpr (std::is_same_v<T, ReadPartDoneCpl>) {
          put_dtype(w, b.dtype);
          put_shape(w, b.shape);
          w.u64(b.offset);
          put_range(w, b.data);
        } else if constexpr (std::is_same_v<T, ExportedCpl>) {
          put_token(w, b.token);
        } else if constexpr (std::is_same_v<T, StatusTextCpl>) {
          std::size_t cut = std::min(b.text.size(), kMaxStatusBytes);
          // Back up over UTF-8 continuation bytes so the text stays valid.
          while (cut > 0 && cut < b.text.size() && (static_cast<unsigned char>(b.text[cut]) & 0xC0) == 0x80) --cut;
          w.u32(static_cast<std::uint32_t>(cut));
          w.bytes(std::string_view(b.text).substr(0, cut));
        }
      },
      cpl.body);
  return end_message(w, start);
}

std::optional<std::uint64_t> peek_request_id(std::span<const std::uint8_t> bytes) {
  if (bytes.size() < kMessageHeaderBytes) return std::nullopt;
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{bytes[8 + static_cast<std::size_t>(i)]} << (8 * i);
  return v;
}

namespace {

// attach_stream, sync, close_stream: the stream alone.
template <class Body>
Status decode_stream_command(Reader& r, Command& cmd) {
  KILN_ASSIGN_OR_RETURN(const std::uint64_t s, r.u64("stream"));
  cmd.body = Body{s};
  return Status::Ok();
}

// register_op: the stream, then the op, length-prefixed, to the end of the message.
Status decode_register_op(Reader& r, Command& cmd) {
  // Decoded in place: an Operation is ~600 bytes of inline lists, and this is the op path.
  RegisterOpCmd& c = cmd.body.emplace<RegisterOpCmd>();
  KILN_ASSIGN_OR_RETURN(c.stream, r.u64("stream"));
  KILN_ASSIGN_OR_RETURN(const std::uint32_t op_len, r.u32("op_len"));
  if (op_len != r.remaining()) {
    return r.fail("op_len",
                  std::to_string(op_len) + " but " + std::to_string(r.remaining()) + " bytes remain in the message");
  }
  if (Status st = ir::codec::decode_operation_into(r.take(op_len), c.op); !st.ok())
    return r.fail("op", st.error().message);
  return Status::Ok();
}

// upload: a whole tensor's bytes, whose range must hold exactly its dtype and shape.
Status decode_upload(Reader& r, std::uint64_t arena_size, Command& cmd) {
  UploadCmd c;
  KILN_ASSIGN_OR_RETURN(c.stream, r.u64("stream"));
  KILN_ASSIGN_OR_RETURN(const std::uint64_t id, r.u64("tensor_id"));
  c.tensor = ir::TensorId(id);
  KILN_ASSIGN_OR_RETURN(c.dtype, get_dtype(r, "dtype"));
  KILN_ASSIGN_OR_RETURN(c.shape, get_shape(r, "shape"));
  KILN_ASSIGN_OR_RETURN(c.data, get_range(r, "data", "data.offset", "data.length", arena_size));
  auto n = tensor_bytes(c.dtype, c.shape);
  if (!n.ok()) return r.fail("shape", n.error().message);
  if (*n != c.data.length) {
    return r.fail("data", "length " + std::to_string(c.data.length) + " does not match " + c.dtype.name() +
                              ir::shape_to_string(c.shape) + " (" + std::to_string(*n) + " bytes)");
  }
  cmd.body = std::move(c);
  return Status::Ok();
}

// read: a tensor and a destination range that must hold all of its bytes.
Status decode_read(Reader& r, std::uint64_t arena_size, Command& cmd) {
  ReadCmd c;
  KILN_ASSIGN_OR_RETURN(c.stream, r.u64("stream"));
  KILN_ASSIGN_OR_RETURN(c.tensor, get_tensor(r));
  KILN_ASSIGN_OR_RETURN(c.dest, get_range(r, "dest", "dest.offset", "dest.length", arena_size));
  auto n = tensor_bytes(c.tensor.dtype, c.tensor.shape);
  if (!n.ok()) return r.fail("tensor.shape", n.error().message);
  if (*n > c.dest.length) {
    return r.fail("dest", "capacity " + std::to_string(c.dest.length) + " is smaller than " + c.tensor.dtype.name() +
                              ir::shape_to_string(c.tensor.shape) + " (" + std::to_string(*n) + " bytes)");
  }
  cmd.body = std::move(c);
  return Status::Ok();
}

// drop: the stream and the tensor.
Status decode_drop(Reader& r, Command& cmd) {
  DropCmd c;
  KILN_ASSIGN_OR_RETURN(c.stream, r.u64("stream"));
  KILN_ASSIGN_OR_RETURN(c.tensor, get_tensor(r));
  cmd.body = std::move(c);
  return Status::Ok();
}

// export: the stream and the tensor id.
Status decode_export(Reader& r, Command& cmd) {
  ExportCmd c;
  KILN_ASSIGN_OR_RETURN(c.stream, r.u64("stream"));
  KILN_ASSIGN_OR_RETURN(const std::uint64_t id, r.u64("tensor_id"));
  c.tensor = ir::TensorId(id);
  cmd.body = c;
  return Status::Ok();
}

// import: the stream, the export token and the id the tensor takes.
Status decode_import(Reader& r, Command& cmd) {
  ImportCmd c;
  KILN_ASSIGN_OR_RETURN(c.stream, r.u64("stream"));
  KILN_ASSIGN_OR_RETURN(c.token, get_token(r, "token"));
  KILN_ASSIGN_OR_RETURN(const std::uint64_t id, r.u64("tensor_id"));
  c.tensor = ir::TensorId(id);
  cmd.body = c;
  return Status::Ok();
}

// status: the format byte (0 text, 1 json).
Status decode_status(Reader& r, Command& cmd) {
  KILN_ASSIGN_OR_RETURN(const std::uint8_t format, r.u8("format"));
  if (format > 1) return r.fail("format", "unknown status format " + std::to_string(format));
  cmd.body = StatusCmd{format == 1};
  return Status::Ok();
}

// upload_part: the stream, the tensor id and a part of its bytes.
Status decode_upload_part(Reader& r, std::uint64_t arena_size, Command& cmd) {
  UploadPartCmd c;
  KILN_ASSIGN_OR_RETURN(c.stream, r.u64("stream"));
  KILN_ASSIGN_OR_RETURN(const std::uint64_t id, r.u64("tensor_id"));
  c.tensor = ir::TensorId(id);
  KILN_RETURN_IF_ERROR(get_part(r, c, arena_size));
  cmd.body = std::move(c);
  return Status::Ok();
}

// read_part: a tensor, an offset inside it and a destination window.
Status decode_read_part(Reader& r, std::uint64_t arena_size, Command& cmd) {
  ReadPartCmd c;
  KILN_ASSIGN_OR_RETURN(c.stream, r.u64("stream"));
  KILN_ASSIGN_OR_RETURN(c.tensor, get_tensor(r));
  KILN_ASSIGN_OR_RETURN(c.offset, r.u64("offset"));
  KILN_ASSIGN_OR_RETURN(c.dest, get_range(r, "dest", "dest.offset", "dest.length", arena_size));
  auto n = tensor_bytes(c.tensor.dtype, c.tensor.shape);
  if (!n.ok()) return r.fail("tensor.shape", n.error().message);
  // The window must start inside the tensor; the daemon fills min(capacity, size - offset).
  if (c.dest.length == 0) return r.fail("dest", "capacity 0: a window holds at least 1 byte");
  if (c.offset >= *n) {
    return r.fail("offset", std::to_string(c.offset) + " is not inside " + c.tensor.dtype.name() +
                                ir::shape_to_string(c.tensor.shape) + " (" + std::to_string(*n) + " bytes)");
  }
  cmd.body = std::move(c);
  return Status::Ok();
}

// report_fallbacks: the count, then each entry (name_len, name, calls), names valid and ascending.
Status decode_report_fallbacks(Reader& r, Command& cmd) {
  KILN_ASSIGN_OR_RETURN(const std::uint16_t count, r.u16("count"));
  if (count > kMaxFallbackEntries) {
    return r.fail("count", std::to_string(count) + " exceeds the limit " + std::to_string(kMaxFallbackEntries));
  }
  // No reserve(count): a short message claiming 256 entries allocates only what it carries.
  ReportFallbacksCmd c;
  for (std::uint16_t i = 0; i < count; ++i) {
    KILN_ASSIGN_OR_RETURN(const std::uint8_t len, r.u8("name_len"));
    if (len == 0 || len > kMaxFallbackNameBytes) {
      return r.fail("name_len", "entry " + std::to_string(i) + ": " + std::to_string(len) + " is not in 1.." +
                                    std::to_string(kMaxFallbackNameBytes));
    }
    KILN_RETURN_IF_ERROR(r.need("name", len));
    const std::span<const std::uint8_t> bytes = r.take(len);
    const std::string_view name(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    const std::optional<std::string_view> previous =
        i == 0 ? std::nullopt : std::optional<std::string_view>(c.counts.back().name);
    if (std::optional<std::string> problem = fallback_name_problem(name, previous))
      return r.fail("name", "entry " + std::to_string(i) + ": " + *problem);
    KILN_ASSIGN_OR_RETURN(const std::uint64_t calls, r.u64("calls"));
    c.counts.push_back(FallbackCount{std::string(name), calls});
  }
  cmd.body = std::move(c);
  return Status::Ok();
}

// control: the verb, the format and the words.
Status decode_control(Reader& r, Command& cmd) {
  ControlCmd c;
  KILN_ASSIGN_OR_RETURN(const std::uint8_t verb, r.u8("verb"));
  if (verb == 0 || verb > kMaxControlVerb) return r.fail("verb", "unknown control verb " + std::to_string(verb));
  c.verb = static_cast<ControlVerb>(verb);
  KILN_ASSIGN_OR_RETURN(const std::uint8_t format, r.u8("format"));
  if (format > 1) return r.fail("format", "unknown format " + std::to_string(format));
  c.json = format == 1;
  KILN_ASSIGN_OR_RETURN(const std::uint16_t len, r.u16("args_len"));
  if (len > kMaxControlArgBytes)
    return r.fail("args_len", std::to_string(len) + " exceeds the limit " + std::to_string(kMaxControlArgBytes));
  KILN_RETURN_IF_ERROR(r.need("args", len));
  const std::span<const std::uint8_t> bytes = r.take(len);
  c.args.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (std::optional<std::string> problem = control_args_problem(c.args)) return r.fail("args", *problem);
  cmd.body = std::move(c);
  return Status::Ok();
}

// The body of a command of `kind` (get_header bounded it), into cmd.body.
Status decode_command_body(Reader& r, CommandKind kind, std::uint64_t arena_size, Command& cmd) {
  switch (kind) {
    case CommandKind::AttachStream: return decode_stream_command<AttachStreamCmd>(r, cmd);
    case CommandKind::Sync: return decode_stream_command<SyncCmd>(r, cmd);
    case CommandKind::CloseStream: return decode_stream_command<CloseStreamCmd>(r, cmd);
    case CommandKind::RegisterOp: return decode_register_op(r, cmd);
    case CommandKind::Upload: return decode_upload(r, arena_size, cmd);
    case CommandKind::Read: return decode_read(r, arena_size, cmd);
    case CommandKind::Drop: return decode_drop(r, cmd);
    case CommandKind::Export: return decode_export(r, cmd);
    case CommandKind::Import: return decode_import(r, cmd);
    case CommandKind::Status: return decode_status(r, cmd);
    case CommandKind::UploadPart: return decode_upload_part(r, arena_size, cmd);
    case CommandKind::ReadPart: return decode_read_part(r, arena_size, cmd);
    case CommandKind::ReportFallbacks: return decode_report_fallbacks(r, cmd);
    case CommandKind::Control: return decode_control(r, cmd);
  }
  return Status::Ok();
}

}  // namespace

Result<Command> decode_command(std::span<const std::uint8_t> bytes, std::uint64_t arena_size) {
  Reader r(bytes, "command");
  KILN_ASSIGN_OR_RETURN(const Header h,
                        get_header(r, bytes, "command", static_cast<std::uint8_t>(CommandKind::Control)));
  const auto kind = static_cast<CommandKind>(h.kind);
  r.set_kind(command_kind_name(kind));
  Command cmd;
  cmd.request_id = h.request_id;
  KILN_RETURN_IF_ERROR(decode_command_body(r, kind, arena_size, cmd));
  KILN_RETURN_IF_ERROR(r.finish());
  return cmd;
}

Result<Completion> decode_completion(std::span<const std::uint8_t> bytes, std::uint64_t arena_size) {
  Reader r(bytes, "completion");
  KILN_ASSIGN_OR_RETURN(const Header h,
                        get_header(r, bytes, "completion", static_cast<std::uint8_t>(CompletionKind::ReadPartDone)));
  const auto kind = static_cast<CompletionKind>(h.kind);
  r.set_kind(completion_kind_name(kind));
  Completion cpl;
  cpl.request_id = h.request_id;
  switch (kind) {
    case CompletionKind::Ok: cpl.body = OkCpl{}; break;
    case CompletionKind::Error: {
      ErrorCpl c;
      KILN_ASSIGN_OR_RETURN(const std::uint8_t code, r.u8("code"));
      if (code > static_cast<std::uint8_t>(ErrorCode::Internal)) {
        return r.fail("code", "unknown error code " + std::to_string(code));
      }
      c.code = static_cast<ErrorCode>(code);
      KILN_RETURN_IF_ERROR(r.zero_u8("reserved"));
      KILN_ASSIGN_OR_RETURN(const std::uint16_t len, r.u16("msg_len"));
      if (len > kMaxErrorMessageBytes) {
        return r.fail("msg_len", std::to_string(len) + " exceeds the limit " + std::to_string(kMaxErrorMessageBytes));
      }
      if (len != r.remaining()) {
        return r.fail("msg_len", std::to_string(len) + " but " + std::to_string(r.remaining()) + " bytes remain");
      }
      auto text = r.take(len);
      c.message.assign(text.begin(), text.end());
      cpl.body = std::move(c);
      break;
    }
    case CompletionKind::ReadDone: {
      ReadDoneCpl c;
      KILN_ASSIGN_OR_RETURN(c.dtype, get_dtype(r, "dtype"));
      KILN_ASSIGN_OR_RETURN(c.shape, get_shape(r, "shape"));
      KILN_ASSIGN_OR_RETURN(c.data, get_range(r, "data", "data.offset", "data.length", arena_size));
      auto n = tensor_bytes(c.dtype, c.shape);
      if (!n.ok()) return r.fail("shape", n.error().message);
      if (*n != c.data.length) {
        return r.fail("data", "length " + std::to_string(c.data.length) + " does not match " + c.dtype.name() +
                                  ir::shape_to_string(c.shape) + " (" + std::to_string(*n) + " bytes)");
      }
      cpl.body = std::move(c);
      break;
    }
    case CompletionKind::Exported: {
      KILN_ASSIGN_OR_RETURN(ExportToken token, get_token(r, "token"));
      cpl.body = ExportedCpl{token};
      break;
    }
    case CompletionKind::StatusText: {
      KILN_ASSIGN_OR_RETURN(const std::uint32_t len, r.u32("text_len"));
      if (len > kMaxStatusBytes) {
        return r.fail("text_len", std::to_string(len) + " exceeds the limit " + std::to_string(kMaxStatusBytes));
      }
      if (len != r.remaining()) {
        return r.fail("text_len", std::to_string(len) + " but " + std::to_string(r.remaining()) + " bytes remain");
      }
      auto text = r.take(len);
      cpl.body = StatusTextCpl{std::string(text.begin(), text.end())};
      break;
    }
    case CompletionKind::ReadPartDone: {
      ReadPartDoneCpl c;
      KILN_RETURN_IF_ERROR(get_part(r, c, arena_size));
      cpl.body = std::move(c);
      break;
    }
  }
  KILN_RETURN_IF_ERROR(r.finish());
  return cpl;
}

}  // namespace kiln::ipc

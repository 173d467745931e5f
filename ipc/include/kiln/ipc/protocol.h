// Wire protocol of the data plane: commands (client -> daemon, command ring) and completions
// (daemon -> client, completion ring), one message per ring record.
//
// Thread-safety: pure functions; call from any thread.
//
// ---------------------------------------------------------------------------------------------
// Format (protocol version kProtocolVersion = 6, agreed in the socket handshake; version 2 added
// upload_part, read_part and read_part_done; version 3 gave upload and upload_part the tensor's
// home stream and widened export tokens to 32 random bytes; version 4 added report_fallbacks;
// version 5 added control; version 6 carries QFloat dtypes, with their scheme).
// All integers little-endian, fixed width; no padding; reserved bytes must be zero; no trailing
// bytes.
//
//   message   = kind u8, reserved u8 (0), reserved u16 (0), body_len u32, request_id u64, body
//               (16-byte header; body_len = message size - 16; request_id chosen by the client,
//               echoed in the completion)
//   dtype     = kind u8 (ir::DTypeKind, F64..QFloat), store u8 (BoolStore for Bool, else 0),
//               [QFloat] scheme: value u8, store u8, packed_dim u8, block_rank u8 (<= 4),
//               block u16 * 4, param u8 (ir::codec::put_quant_scheme; a QFloat tensor's bytes
//               are kiln's layout: the values' words, the block scales, the f32 global scale)
//   shape     = rank u8 (<= ir::codec::kMaxRank), dim u64 * rank
//   tensor    = id u64, status u8 (ReadOnly or ReadWrite), dtype, shape      (an ir::TensorIr)
//   range     = offset u64, length u64                       (ArenaRange, relative to the arena)
//   token     = 32 bytes                                      (ExportToken)
//   fallback  = name_len u8, name bytes, calls u64             (FallbackCount: name_len 1..
//               kMaxFallbackNameBytes, the name printable ASCII without spaces, 0x21..0x7e)
//
//   Commands                            body
//   1 attach_stream                     stream u64
//   2 register_op                       stream u64, op_len u32, op: an ir::codec Operation
//                                       message (header included) of exactly op_len bytes, which
//                                       ends the body
//   3 upload                            stream u64 (the tensor's home), tensor_id u64, dtype, shape,
//                                       data range (length must be exactly the tensor's byte size)
//   4 read                              stream u64, tensor, dest range (length = capacity, at
//                                       least the tensor's byte size)
//   5 sync                              stream u64
//   6 drop                              stream u64, tensor
//   7 export                            stream u64, tensor_id u64
//   8 import                            stream u64, token, tensor_id u64 (the new id)
//   9 close_stream                      stream u64
//  10 status                            format u8 (0 text, 1 JSON)
//  11 upload_part                       stream u64 (the tensor's home), tensor_id u64, dtype, shape,
//                                       offset u64, data range
//                                       (one part of a tensor larger than the arena: offset =
//                                       bytes received so far, length >= 1, offset + length <=
//                                       the tensor's byte size; the tensor exists once the part
//                                       reaching its end has arrived)
//  12 read_part                         stream u64, tensor, offset u64, dest range (a window of
//                                       the tensor's bytes: offset = bytes read so far and
//                                       inside the tensor, length = capacity >= 1)
//  13 report_fallbacks                  count u16 (<= kMaxFallbackEntries), fallback * count
//                                       (names strictly ascending, byte-wise: sorted, unique)
//                                       (the client's ops that ran on its CPU instead of kiln,
//                                       with their calls: a full snapshot that replaces the
//                                       client's previous one; the PyTorch device sends it)
//  14 control                           verb u8 (ControlVerb), format u8 (0 text, 1 JSON),
//                                       args_len u16 (<= kMaxControlArgBytes), args bytes
//                                       (printable ASCII, 0x20..0x7e: the verb's words, e.g.
//                                       "job_memory_mib=4096"); kilnctl's live control, answered
//                                       with status_text or an error; the daemon serves it to
//                                       its own uid and root only
//
//   Completions
//   1 ok                                (empty)
//   2 error                             code u8 (kiln::ErrorCode), reserved u8 (0),
//                                       msg_len u16 (<= kMaxErrorMessageBytes), msg bytes
//   3 read_done                         dtype, shape, data range (length = the byte size)
//   4 exported                          token
//   5 status_text                       text_len u32 (<= kMaxStatusBytes), text bytes (UTF-8)
//   6 read_part_done                    dtype, shape, offset u64, data range (the window's
//                                       bytes: length >= 1, offset + length <= the byte size)
//
// Chunked transfers (the daemon's rules; the decoder checks only the bounds above). Parts of an
// upload arrive in order, each offset equal to the bytes received so far; the daemon stages them
// in private memory, charged in full (the tensor's size) to the job's memory quota from the
// first part, and creates the tensor when the last byte has arrived. A part that does not
// follow (offset, dtype, shape), or names an id in use, is an error completion and discards
// that staging; so does the client's disconnect. One upload per connection is staged at a
// time: a new one (offset 0) discards an unfinished one, which its client abandoned.
// A read_part at offset 0 snapshots the tensor (one read of the device; at most one chunked read
// per connection, a new one replaces an abandoned one); later windows follow in order. A
// ReadWrite (last-use) read consumes the tensor at that first window (the snapshot takes over
// its quota charge until the transfer ends); a read-only snapshot goes when its tensor does.
//
// Decoding treats input as hostile (shared memory): every length, count, enum, rank, size and
// arena range is checked before use, sizes with overflow checks; nothing allocates beyond the
// input. Errors are ErrorCode::Decode with a message naming the field:
//   "upload.shape: rank 17 exceeds the limit 16"
//   "read.dest: range [4096, +64) is outside the arena of 4096 bytes"
//   "command truncated: upload.data.length needs 8 bytes at offset 52, message has 56"
// Every decodable message is the unique encoding of what it decodes to (the fuzzer checks it).
//
// Answers: every command is answered by one completion (ok, or what its table row says, or an
// error; status and control by status_text), except register_op, drop and report_fallbacks, which are answered only
// when they fail (one ring record each; the client library reports such an error at its next sync or read).
//
// What the decoder cannot check (the daemon must): that stream and tensor ids exist and belong
// to the client, that tokens are valid, that a register_op's tensors have the shapes the
// daemon has on record.
//
// Usage (daemon side):
//   auto cmd = decode_command(msg, layout.arena_size);
//   if (!cmd.ok()) {
//     encode_completion(error_completion(peek_request_id(msg).value_or(0), cmd.error()), out);
//     ...
//   }
// ---------------------------------------------------------------------------------------------
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/ipc/arena.h"
#include "kiln/ir/dtype.h"
#include "kiln/ir/operation.h"
#include "kiln/ir/shape.h"
#include "kiln/ir/tensor.h"

namespace kiln::ipc {

inline constexpr std::uint16_t kProtocolVersion = 6;
inline constexpr std::size_t kMessageHeaderBytes = 16;
// Bounds one message. A registered op encodes to ~100 bytes and the codec's own caps keep any
// op far below this; it also caps what a hostile message can make the decoder look at.
inline constexpr std::size_t kMaxMessageBytes = std::size_t{1} << 20;
// Error texts are for humans; longer ones are truncated by the encoder (at a UTF-8 boundary).
inline constexpr std::size_t kMaxErrorMessageBytes = 1024;
// The daemon's status report (kilnctl status); longer reports are truncated by the encoder.
inline constexpr std::size_t kMaxStatusBytes = 64 * 1024;
// Bounds of a report_fallbacks snapshot. A training step's fallbacks are a handful of aten ops
// (docs/pytorch.md, "What falls back"), and the longest aten name with its overload is under 80
// bytes: these leave room for any model and keep the largest snapshot (about 35 KiB) far below
// kMaxMessageBytes and the default command ring.
inline constexpr std::size_t kMaxFallbackEntries = 256;
inline constexpr std::size_t kMaxFallbackNameBytes = 128;
// A control command's words (kilnctl's arguments: a few key=value pairs or a client id).
inline constexpr std::size_t kMaxControlArgBytes = 1024;

enum class CommandKind : std::uint8_t {
  AttachStream = 1,
  RegisterOp,
  Upload,
  Read,
  Sync,
  Drop,
  Export,
  Import,
  CloseStream,
  Status,
  UploadPart,
  ReadPart,
  ReportFallbacks,
  Control,
};
enum class CompletionKind : std::uint8_t { Ok = 1, Error, ReadDone, Exported, StatusText, ReadPartDone };

const char* command_kind_name(CommandKind k);        // "attach_stream", "register_op", ...
const char* completion_kind_name(CompletionKind k);  // "ok", "error", ...

// What a control command asks (kilnctl's live control; docs/operations.md). The args each takes
// are the daemon's to check (daemon.h, "Live control").
enum class ControlVerb : std::uint8_t {
  Jobs = 1,    // the jobs, their owners, clients and usage
  Clients,     // every client
  Limits,      // no args: the live limits; "key=value ...": set them
  Disconnect,  // args: a client id
  Drain,       // args: "start" (refuse new clients), "status" (clients left), "resume"
  Reload,      // re-read kiln.toml: what can change live changes, the rest is named
  Metrics,     // the metrics' exposition text (as the metrics endpoint serves it)
  Stop,        // stop the daemon as SIGTERM does
  Plans,       // "list [hits|recent|id] [N]", "show ID text|dot", "clear [JOB]"
};
inline constexpr std::uint8_t kMaxControlVerb = static_cast<std::uint8_t>(ControlVerb::Plans);
const char* control_verb_name(ControlVerb v);  // "jobs", "clients", ...

// What an export hands out and an import presents: 32 bytes from the OS's secure random source
// (the daemon's export_token(); never from a seeded generator, whose state a client could rebuild
// from the tokens it was given). The first 8 bytes index the daemon's export table; all 32 are
// compared in constant time (token_equal), so at least 192 bits stay secret from a timing probe.
struct ExportToken {
  static constexpr std::size_t kBytes = 32;
  std::array<std::uint8_t, kBytes> bytes{};
  // The table index: the first 8 bytes, little-endian.
  std::uint64_t index() const;
  friend bool operator==(const ExportToken&, const ExportToken&) = default;
};
// Constant-time equality (no early exit on the first differing byte).
bool token_equal(const ExportToken& a, const ExportToken& b);

// ---- commands ---------------------------------------------------------------------------------
struct AttachStreamCmd {
  std::uint64_t stream = 0;
  friend bool operator==(const AttachStreamCmd&, const AttachStreamCmd&) = default;
};
struct RegisterOpCmd {
  std::uint64_t stream = 0;
  ir::Operation op;
  friend bool operator==(const RegisterOpCmd& a, const RegisterOpCmd& b) {
    return a.stream == b.stream && a.op == b.op;
  }
};
struct UploadCmd {
  std::uint64_t stream = 0;  // the tensor's home: the stream whose ops use it and that drops it
  ir::TensorId tensor{0};
  ir::DType dtype;
  ir::Shape shape;
  ArenaRange data;  // the tensor's bytes, row-major, exactly tensor_bytes(dtype, shape) long
  friend bool operator==(const UploadCmd&, const UploadCmd&) = default;
};
struct ReadCmd {
  std::uint64_t stream = 0;  // the tensor's home stream
  ir::TensorIr tensor;       // status ReadWrite when this read is the tensor's last use
  ArenaRange dest;           // where the daemon writes; length is the capacity
  friend bool operator==(const ReadCmd&, const ReadCmd&) = default;
};
struct SyncCmd {
  std::uint64_t stream = 0;
  friend bool operator==(const SyncCmd&, const SyncCmd&) = default;
};
struct DropCmd {
  std::uint64_t stream = 0;
  ir::TensorIr tensor;
  friend bool operator==(const DropCmd&, const DropCmd&) = default;
};
struct ExportCmd {
  std::uint64_t stream = 0;
  ir::TensorId tensor{0};
  friend bool operator==(const ExportCmd&, const ExportCmd&) = default;
};
struct ImportCmd {
  std::uint64_t stream = 0;  // the shared tensor's home on the importing side
  ExportToken token;
  ir::TensorId tensor{0};  // the id the importing client gives the shared tensor
  friend bool operator==(const ImportCmd&, const ImportCmd&) = default;
};
struct CloseStreamCmd {
  std::uint64_t stream = 0;
  friend bool operator==(const CloseStreamCmd&, const CloseStreamCmd&) = default;
};
struct StatusCmd {
  bool json = false;
  friend bool operator==(const StatusCmd&, const StatusCmd&) = default;
};
// One part of an upload larger than the arena (see "Chunked transfers" above).
struct UploadPartCmd {
  std::uint64_t stream = 0;  // the tensor's home, as for UploadCmd (the same in every part)
  ir::TensorId tensor{0};
  ir::DType dtype;
  ir::Shape shape;
  std::uint64_t offset = 0;  // where the part goes in the tensor's bytes: the bytes sent before it
  ArenaRange data;           // the part's bytes: at least 1, offset + length <= the tensor's size
  friend bool operator==(const UploadPartCmd&, const UploadPartCmd&) = default;
};
// One window of a read larger than the arena (see "Chunked transfers" above).
struct ReadPartCmd {
  std::uint64_t stream = 0;  // the tensor's home stream
  ir::TensorIr tensor;       // status ReadWrite when this read is the tensor's last use
  std::uint64_t offset = 0;  // the window's first byte in the tensor: the bytes read before it
  ArenaRange dest;           // where the daemon writes; length (>= 1) is the capacity
  friend bool operator==(const ReadPartCmd&, const ReadPartCmd&) = default;
};
// One op that ran on the client's CPU instead of kiln, and how often ("aten::flip", 12).
struct FallbackCount {
  std::string name;
  std::uint64_t calls = 0;
  friend bool operator==(const FallbackCount&, const FallbackCount&) = default;
};
// The client's fallback counts: a full snapshot (an empty one clears the previous). At most
// kMaxFallbackEntries, names valid (fallback_name_problem) and strictly ascending.
struct ReportFallbacksCmd {
  std::vector<FallbackCount> counts;
  friend bool operator==(const ReportFallbacksCmd&, const ReportFallbacksCmd&) = default;
};

// kilnctl's live control: a verb and its words.
struct ControlCmd {
  ControlVerb verb = ControlVerb::Jobs;
  bool json = false;
  std::string args;  // at most kMaxControlArgBytes of printable ASCII
  friend bool operator==(const ControlCmd&, const ControlCmd&) = default;
};

// Alternatives in CommandKind order (index + 1 == kind).
using CommandBody =
    std::variant<AttachStreamCmd, RegisterOpCmd, UploadCmd, ReadCmd, SyncCmd, DropCmd, ExportCmd, ImportCmd,
                 CloseStreamCmd, StatusCmd, UploadPartCmd, ReadPartCmd, ReportFallbacksCmd, ControlCmd>;
struct Command {
  std::uint64_t request_id = 0;
  CommandBody body;
  CommandKind kind() const { return static_cast<CommandKind>(body.index() + 1); }
  friend bool operator==(const Command&, const Command&) = default;
};

// ---- completions ------------------------------------------------------------------------------
struct OkCpl {
  friend bool operator==(const OkCpl&, const OkCpl&) = default;
};
struct ErrorCpl {
  ErrorCode code = ErrorCode::Internal;
  std::string message;  // at most kMaxErrorMessageBytes
  friend bool operator==(const ErrorCpl&, const ErrorCpl&) = default;
};
struct ReadDoneCpl {
  ir::DType dtype;
  ir::Shape shape;
  ArenaRange data;  // inside the read's dest range; length = tensor_bytes(dtype, shape)
  friend bool operator==(const ReadDoneCpl&, const ReadDoneCpl&) = default;
};
struct ExportedCpl {
  ExportToken token;
  friend bool operator==(const ExportedCpl&, const ExportedCpl&) = default;
};
struct StatusTextCpl {
  std::string text;  // at most kMaxStatusBytes
  friend bool operator==(const StatusTextCpl&, const StatusTextCpl&) = default;
};

struct ReadPartDoneCpl {
  ir::DType dtype;
  ir::Shape shape;
  std::uint64_t offset = 0;  // the window's first byte in the tensor
  ArenaRange data;           // inside the read_part's dest range: min(capacity, size - offset) bytes
  friend bool operator==(const ReadPartDoneCpl&, const ReadPartDoneCpl&) = default;
};

using CompletionBody = std::variant<OkCpl, ErrorCpl, ReadDoneCpl, ExportedCpl, StatusTextCpl, ReadPartDoneCpl>;
struct Completion {
  std::uint64_t request_id = 0;
  CompletionBody body;
  CompletionKind kind() const { return static_cast<CompletionKind>(body.index() + 1); }
  friend bool operator==(const Completion&, const Completion&) = default;
};

// An error completion carrying `e` (code and message; the message is truncated to fit).
Completion error_completion(std::uint64_t request_id, const Error& e);

// ---- encode / decode --------------------------------------------------------------------------
// Append one message to `out`. Errors (ErrorCode::Invalid, nothing appended) for values the
// format cannot carry: rank > kMaxRank, a message over kMaxMessageBytes. An
// error completion's message is truncated to kMaxErrorMessageBytes, never refused.
Status encode_command(const Command& cmd, std::vector<std::uint8_t>& out);
Status encode_completion(const Completion& cpl, std::vector<std::uint8_t>& out);

// Decode exactly one message; `arena_size` bounds every arena range (use the private layout's
// arena_size, never a value read from shared memory).
Result<Command> decode_command(std::span<const std::uint8_t> bytes, std::uint64_t arena_size);
Result<Completion> decode_completion(std::span<const std::uint8_t> bytes, std::uint64_t arena_size);

// The request id of a message whose header is present (>= 16 bytes), whatever its body; lets
// the daemon address an error completion to a message it could not decode.
std::optional<std::uint64_t> peek_request_id(std::span<const std::uint8_t> bytes);

// Why `name` cannot be a report_fallbacks entry after `previous` (the entry before it, if any), or
// nullopt when it can: 1..kMaxFallbackNameBytes bytes of printable ASCII without spaces, after
// `previous` in byte order. The one rule the encoder, the decoder and the client library apply.
std::optional<std::string> fallback_name_problem(std::string_view name,
                                                 std::optional<std::string_view> previous = std::nullopt);

// Bytes of a tensor: elements * dtype size, or a QFloat tensor's layout
// (ir::shape::quant_geometry's total); an error names the overflow or a scheme the shape cannot
// take.
Result<std::uint64_t> tensor_bytes(ir::DType dtype, const ir::Shape& shape);

}  // namespace kiln::ipc

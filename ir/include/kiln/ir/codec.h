// Versioned binary codec for operations, operation lists and graphs: the wire format of the
// shared-memory IPC path and of the remote/replay path (docs/spec/ir.md §0, §8).
//
// Thread-safety: every function is pure (no shared state); call from any thread.
//
// Decoding treats its input as hostile: arbitrary bytes never crash, hang, hit UB or allocate
// more than the input justifies. Every count is checked against the bytes that remain (each
// element has a known minimum encoded size) and against a hard cap before anything is reserved,
// and every decoded Operation is checked with Operation::validate(). Every error is
// ErrorCode::Decode with a message that names what was wrong and the byte offset.
//
// ---------------------------------------------------------------------------------------------
// Format (version 1). All fixed-width integers are little-endian.
//
//   varint   unsigned LEB128, 1..10 bytes, canonical: the shortest form only (a final byte of
//            0x00 after the first is rejected, as is a value above 2^64 - 1).
//   svarint  zigzag-encoded signed 64-bit value ((v << 1) ^ (v >> 63)) as a varint.
//
//   message     = header body                  (no trailing bytes allowed)
//   header      = magic "KIRC" (4 bytes)
//                 version     u16              kFormatVersion
//                 type        u8               MessageType: 1 Operation, 2 OperationList, 3 Graph
//                 reserved    u8               must be 0
//                 table       u32              op_table_fingerprint(): op kinds are encoded by
//                                              their index in op_table.def, so a message is only
//                                              understood by a peer built from the same table
//   body(Operation)     = operation
//   body(OperationList) = count varint, operation * count
//   body(Graph)         = count varint, operation * count,
//                         n_inputs varint,  id varint * n_inputs,
//                         n_outputs varint, id varint * n_outputs
//
//   operation   = kind        varint           index of the OpKind in op_table.def
//                 family      u8               Family
//                 dtype                        Operation::dtype, always present (lossless even
//                                              for families that do not carry one)
//                 num_inputs  u8
//                 n_tensors   varint, tensor * n_tensors      (inputs then outputs)
//                 n_scalars   varint, scalar * n_scalars
//                 n_ranges    varint, range  * n_ranges
//                 n_attrs     varint, svarint * n_attrs
//                 id_len      varint, id_len bytes            custom_id: UTF-8, no control chars
//   tensor      = id varint, status u8 (TensorStatus), dtype, rank u8, dim varint * rank
//   dtype       = kind u8 (DTypeKind)
//                 [Bool]   store u8 (BoolStore)
//                 [QFloat] value u8, store u8, packed_dim u8, block_rank u8 (<= 4),
//                          block u16 * 4 (all four, unused ones included), param u8
//   scalar      = kind u8 (ScalarIr::Kind: 0 Float, 1 Int, 2 UInt, 3 Bool), then
//                 Float: IEEE-754 binary64 bit pattern, u64 (NaN payloads and -0.0 kept)
//                 Int: svarint   UInt: varint   Bool: u8 0 or 1
//   range       = start svarint, has_end u8 (0 or 1), [end svarint], step svarint
//
// Every decodable message is the unique encoding of what it decodes to: encoding the decoded
// value gives back the same bytes (the fuzzer checks this).
//
// Encoding is total and does not validate: every in-memory value has an encoding (rank and
// enums included), and what the decoder would refuse (validate() failing, rank > kMaxRank, an
// out-of-range enum, a control character in a custom id, ...) fails at decode, never silently
// changes on the way.
//
// Usage:
//   std::vector<std::uint8_t> buf;             // reuse across calls: no allocation once warm
//   codec::encode_operations(ops, buf);
//   KILN_ASSIGN_OR_RETURN(auto decoded, codec::decode_operations(buf));
// ---------------------------------------------------------------------------------------------
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/base/bytes.h"
#include "kiln/base/result.h"
#include "kiln/ir/graph.h"
#include "kiln/ir/operation.h"

namespace kiln::ir::codec {

inline constexpr std::array<std::uint8_t, 4> kMagic = {'K', 'I', 'R', 'C'};
inline constexpr std::uint16_t kFormatVersion = 1;
inline constexpr std::size_t kHeaderSize = 12;

enum class MessageType : std::uint8_t { Operation = 1, OperationList = 2, Graph = 3 };

// Decoder caps. Each bounds what one hostile message can make the daemon allocate; all sit far
// above what a well-formed program uses.
inline constexpr std::size_t kMaxRank = 16;               // Burn tensors are rank <= 8 in practice
inline constexpr std::size_t kMaxTensorsPerOp = 1024;     // num_inputs is a u8; Custom outputs
inline constexpr std::size_t kMaxScalarsPerOp = 1024;     // Custom scalars are the only variadic ones
inline constexpr std::size_t kMaxRangesPerOp = kMaxRank;  // validate(): ranges <= rank of tensor 0
inline constexpr std::size_t kMaxAttrsPerOp = 4096;       // AllReduce device ids are the longest list
inline constexpr std::size_t kMaxCustomIdBytes = 1024;    // Burn custom ids are short type names
// A decoded Operation takes a few hundred bytes for as little as 9 encoded ones; 2^16 operations
// keeps one message under ~50 MiB of decoded memory while fusion segments and client batches
// hold hundreds at most.
inline constexpr std::size_t kMaxOperations = std::size_t{1} << 16;
inline constexpr std::size_t kMaxGraphBoundary = std::size_t{1} << 20;  // ids in inputs / outputs

// Fingerprint of op_table.def (group, variant and signature of every row, in order), written in
// every header: a peer built from a different table is refused instead of misreading kinds.
std::uint32_t op_table_fingerprint();

// Exact encoded sizes, header included.
std::size_t encoded_size(const Operation& op);
std::size_t encoded_size(std::span<const Operation> ops);
std::size_t encoded_size(const GraphIr& graph);

// Append one message to `out`. Growth is geometric, so appending many messages to one reused
// vector is amortised O(1) and a warm vector does not allocate.
void encode_operation(const Operation& op, std::vector<std::uint8_t>& out);
void encode_operations(std::span<const Operation> ops, std::vector<std::uint8_t>& out);
void encode_graph(const GraphIr& graph, std::vector<std::uint8_t>& out);

// Write one message at the start of a caller buffer (e.g. a shared-memory ring slot); returns
// the bytes written, or an error (nothing meaningful written) when the buffer is too small.
Result<std::size_t> encode_operation_into(const Operation& op, std::span<std::uint8_t> buf);
Result<std::size_t> encode_operations_into(std::span<const Operation> ops, std::span<std::uint8_t> buf);
Result<std::size_t> encode_graph_into(const GraphIr& graph, std::span<std::uint8_t> buf);

struct MessageHeader {
  std::uint16_t version = 0;
  MessageType type = MessageType::Operation;
  std::uint32_t table_fingerprint = 0;
};
// Reads and checks the header only (magic, version, known type, reserved byte, table
// fingerprint): lets a receiver dispatch on the message type.
Result<MessageHeader> decode_header(std::span<const std::uint8_t> bytes);

// Decode a whole message of the given type; the input must hold exactly one message.
Result<Operation> decode_operation(std::span<const std::uint8_t> bytes);
// The same into an existing operation (its storage reused; on error `op` holds a partial decode).
// The hot path of a receiver that decodes one op per message.
Status decode_operation_into(std::span<const std::uint8_t> bytes, Operation& op);
Result<std::vector<Operation>> decode_operations(std::span<const std::uint8_t> bytes);
// The graph's inputs and outputs are carried as sent, not re-derived: a receiver that relies on
// them should check them against classify(graph.operations) (docs/spec/ir.md §7).
Result<GraphIr> decode_graph(std::span<const std::uint8_t> bytes);

// ---- The dtype's encoding, shared by every format that stores dtypes (these messages, the plan
// cache, the IPC protocol's transfers): kind; then the bool store, or the quantization scheme
// (value, store, packed dim, block rank, four u16 block dims, parameter precision: always
// kQuantSchemeBytes).
inline constexpr std::size_t kQuantSchemeBytes = 13;
template <class Sink>
void put_quant_scheme(Sink& s, const QuantScheme& q) {
  put_u8(s, static_cast<std::uint8_t>(q.value));
  put_u8(s, static_cast<std::uint8_t>(q.store));
  put_u8(s, q.packed_dim);
  put_u8(s, q.block_rank);
  for (std::uint16_t b : q.block) put_u16(s, b);
  put_u8(s, static_cast<std::uint8_t>(q.param));
}
template <class Sink>
void put_dtype(Sink& s, const DType& d) {
  put_u8(s, static_cast<std::uint8_t>(d.kind()));
  if (d.is_bool()) {
    put_u8(s, static_cast<std::uint8_t>(d.bool_store()));
  } else if (d.is_quantized()) {
    put_quant_scheme(s, d.scheme());
  }
}
// Reads what put_quant_scheme / put_dtype wrote; `what` names the value in an error ("input dtype").
bool read_quant_scheme(ByteReader& r, QuantScheme& out);
bool read_dtype(ByteReader& r, DType& out, const char* what);

}  // namespace kiln::ir::codec

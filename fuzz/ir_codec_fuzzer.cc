// libFuzzer target for the IR codec (kiln/ir/codec.h): arbitrary bytes, as a client could put
// them in shared memory, decoded as every message type. Decoding must never crash, hang or
// allocate beyond the input; whatever decodes must re-encode to exactly the same bytes (the
// format admits one encoding per value), and the size functions must agree.
//
//   build/h-fuzz/fuzz/ir_codec_fuzzer -max_total_time=60 fuzz/seeds/ir_codec_fuzzer
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "kiln/ir/codec.h"

namespace {

using kiln::ErrorCode;
namespace codec = kiln::ir::codec;

void check(bool cond) {
  if (!cond) __builtin_trap();
}

void check_same(std::span<const std::uint8_t> in, const std::vector<std::uint8_t>& out) {
  check(out.size() == in.size());
  check(std::memcmp(out.data(), in.data(), in.size()) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> in(data, size);
  const bool header_ok = codec::decode_header(in).ok();
  std::vector<std::uint8_t> out;

  if (auto ops = codec::decode_operations(in); ops.ok()) {
    check(header_ok);
    codec::encode_operations(*ops, out);
    check_same(in, out);
    check(codec::encoded_size(std::span<const kiln::ir::Operation>(*ops)) == size);
  } else {
    check(ops.error().code == ErrorCode::Decode);
  }

  if (auto graph = codec::decode_graph(in); graph.ok()) {
    check(header_ok);
    out.clear();
    codec::encode_graph(*graph, out);
    check_same(in, out);
    check(codec::encoded_size(*graph) == size);
  } else {
    check(graph.error().code == ErrorCode::Decode);
  }

  if (auto op = codec::decode_operation(in); op.ok()) {
    check(header_ok);
    check(op->validate().ok());
    out.clear();
    codec::encode_operation(*op, out);
    check_same(in, out);
    // The caller-buffer path writes the same bytes.
    std::vector<std::uint8_t> buf(size);
    auto written = codec::encode_operation_into(*op, buf);
    check(written.ok() && *written == size && buf == out);
  } else {
    check(op.error().code == ErrorCode::Decode);
  }
  return 0;
}

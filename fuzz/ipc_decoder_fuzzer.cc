// libFuzzer target for the ipc message decoders (kiln/ipc/protocol.h): arbitrary bytes, as a
// hostile client could leave them in its command ring, decoded as a command (and as a
// completion). Decoding must never crash, hang or allocate beyond the input; whatever decodes
// must re-encode to exactly the same bytes (one encoding per value); peek_request_id must agree
// with the decoded request id.
//
//   build/fuzz-clang/fuzz/ipc_decoder_fuzzer -max_total_time=60 fuzz/seeds/ipc_decoder_fuzzer
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/ipc/protocol.h"

namespace {

namespace ipc = kiln::ipc;

void check(bool cond) {
  if (!cond) __builtin_trap();
}

// A small arena, so that range checks reject many inputs and accept some.
constexpr std::uint64_t kArena = 1 << 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> in(data, size);
  std::vector<std::uint8_t> out;
  if (auto cmd = ipc::decode_command(in, kArena); cmd.ok()) {
    check(ipc::encode_command(*cmd, out).ok());
    check(out.size() == size && std::equal(out.begin(), out.end(), in.begin()));
    check(ipc::peek_request_id(in) == cmd->request_id);
  } else {
    check(cmd.error().code == kiln::ErrorCode::Decode && !cmd.error().message.empty());
  }
  out.clear();
  if (auto cpl = ipc::decode_completion(in, kArena); cpl.ok()) {
    check(ipc::encode_completion(*cpl, out).ok());
    check(out.size() == size && std::equal(out.begin(), out.end(), in.begin()));
  } else {
    check(cpl.error().code == kiln::ErrorCode::Decode);
  }
  return 0;
}

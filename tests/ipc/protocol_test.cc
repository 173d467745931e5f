// Tests for the wire protocol (kiln/ipc/protocol.h): exact round trips of every command and
// completion kind; the decoder's refusal of truncated, oversized, out-of-range and malformed
// input with a message naming the field; 10k random mutations that never crash.
//
// Set KILN_WRITE_IPC_SEEDS=<dir> to (re)write the fuzzer seed corpus
// (fuzz/seeds/ipc_decoder_fuzzer) from the SeedCorpus test.
#include "kiln/ipc/protocol.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "kiln/ir/builders.h"
#include "kiln/ir/codec.h"
#include "kiln/testing/quant.h"
#include "kiln/testing/status.h"

namespace kiln::ipc {
namespace {

using Bytes = std::vector<std::uint8_t>;
using ir::DType;
using ir::Shape;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;
namespace dtypes = ir::dtypes;

constexpr std::uint64_t kArena = 1 << 20;

ir::Operation add_op() {
  const TensorIr a{TensorId(1), {2, 3}, TensorStatus::ReadOnly, dtypes::f32};
  const TensorIr b{TensorId(2), {2, 3}, TensorStatus::ReadWrite, dtypes::f32};
  return std::move(ir::build::binary(ir::Family::NumericFloat, ir::OpKind::Numeric_Add, a, b, TensorId(3))).value();
}

// A token whose every byte differs (a field read at the wrong offset or width shows).
ExportToken sample_token() {
  ExportToken t;
  for (std::size_t i = 0; i < t.bytes.size(); ++i) t.bytes[i] = static_cast<std::uint8_t>(0xa0 + i);
  return t;
}

ir::QuantScheme packed_blocks() { return ::kiln::testing::packed_q4_blocks(); }

std::vector<Command> every_command() {
  return {
      {1, AttachStreamCmd{7}},
      {2, RegisterOpCmd{7, add_op()}},
      {3, UploadCmd{7, TensorId(1), dtypes::f32, Shape{2, 3}, ArenaRange{64, 24}}},
      {4, ReadCmd{7, TensorIr{TensorId(3), {2, 3}, TensorStatus::ReadWrite, dtypes::f32}, ArenaRange{128, 4096}}},
      {5, SyncCmd{7}},
      {6, DropCmd{7, TensorIr{TensorId(3), {4}, TensorStatus::ReadWrite, DType::boolean(ir::BoolStore::U8)}}},
      {7, ExportCmd{7, TensorId(3)}},
      {8, ImportCmd{9, sample_token(), TensorId(44)}},
      {std::numeric_limits<std::uint64_t>::max(), CloseStreamCmd{7}},
      {13, StatusCmd{false}},
      {14, StatusCmd{true}},
      // Edge values: rank 0, max rank, bool u32 store, zero-size dims.
      {10, UploadCmd{0, TensorId(5), dtypes::i64, Shape{}, ArenaRange{0, 8}}},
      {11, UploadCmd{std::numeric_limits<std::uint64_t>::max(), TensorId(6), DType::boolean(ir::BoolStore::U32),
                     Shape(16, 1), ArenaRange{kArena - 4, 4}}},
      {12, UploadCmd{3, TensorId(7), dtypes::u8, Shape{0, 5}, ArenaRange{kArena, 0}}},
      // Chunked transfers: a middle part, and a last-use window of the final byte.
      {15, UploadPartCmd{7, TensorId(8), dtypes::f32, Shape{1000, 1000}, 524288, ArenaRange{64, 4096}}},
      {16, ReadPartCmd{7, TensorIr{TensorId(8), {1000, 1000}, TensorStatus::ReadWrite, dtypes::f32}, 3999999,
                       ArenaRange{0, kArena}}},
      // Fallback reports: the empty snapshot (a reset), and edge entries: byte order (uppercase
      // before lowercase), zero and the largest count, the longest name of the last printable byte.
      {17, ReportFallbacksCmd{}},
      {18, ReportFallbacksCmd{std::vector<FallbackCount>{
               {"Z", 1},
               {"aten::flip", 12},
               {"aten::index_add_", 0},
               {std::string(kMaxFallbackNameBytes, '~'), std::numeric_limits<std::uint64_t>::max()}}}},
      // Live control: no words, words with spaces, the longest args.
      {19, ControlCmd{ControlVerb::Jobs, false, ""}},
      {20, ControlCmd{ControlVerb::Limits, true, "job_memory_mib=4096 uid_jobs=0"}},
      {21, ControlCmd{ControlVerb::Stop, false, std::string(kMaxControlArgBytes, '~')}},
      // QFloat (version 6): the default scheme, and packed blocks with f16 scales.
      {22, UploadCmd{7, TensorId(9), DType::qfloat(ir::QuantScheme{}), Shape{4}, ArenaRange{0, 12}}},
      {23, DropCmd{7, TensorIr{TensorId(9), {2, 8}, TensorStatus::ReadWrite, DType::qfloat(packed_blocks())}}},
      {24, ReadCmd{7, TensorIr{TensorId(9), {2, 8}, TensorStatus::ReadOnly, DType::qfloat(packed_blocks())},
                   ArenaRange{0, 64}}},
  };
}

// The first command of `kind` in every_command().
Command command_of(CommandKind kind) {
  for (Command& c : every_command())
    if (c.kind() == kind) return c;
  ADD_FAILURE() << "no " << command_kind_name(kind) << " in every_command()";
  return Command{};
}

std::vector<Completion> every_completion() {
  return {
      {1, OkCpl{}},
      {2, ErrorCpl{ErrorCode::InvalidHandle, "read of TensorId(3): unknown tensor"}},
      {3, ErrorCpl{ErrorCode::Internal, ""}},
      {4, ReadDoneCpl{dtypes::bf16, Shape{3, 5}, ArenaRange{256, 30}}},
      {5, ExportedCpl{sample_token()}},
      {6, StatusTextCpl{"{\"device\":\"cpu\"}"}},
      {7, StatusTextCpl{""}},
      {9, ReadDoneCpl{DType::qfloat(packed_blocks()), Shape{2, 8}, ArenaRange{0, 20}}},
      {8, ReadPartDoneCpl{dtypes::u8, Shape{3000000}, 2999000, ArenaRange{4096, 1000}}},
  };
}

Bytes encode(const Command& c) {
  Bytes b;
  Status st = encode_command(c, b);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return b;
}
Bytes encode(const Completion& c) {
  Bytes b;
  Status st = encode_completion(c, b);
  EXPECT_TRUE(st.ok()) << st.error().message;
  return b;
}

void put_u32(Bytes& b, std::size_t at, std::uint32_t v) { std::memcpy(b.data() + at, &v, 4); }
void put_u64(Bytes& b, std::size_t at, std::uint64_t v) { std::memcpy(b.data() + at, &v, 8); }

std::string command_error(const Bytes& b) {
  auto r = decode_command(b, kArena);
  if (r.ok()) return "(decoded)";
  EXPECT_EQ(r.error().code, ErrorCode::Decode);
  return r.error().message;
}

TEST(Protocol, EveryCommandRoundTrips) {
  for (const Command& c : every_command()) {
    const Bytes b = encode(c);
    EXPECT_EQ(b[0], static_cast<std::uint8_t>(c.kind()));
    auto d = decode_command(b, kArena);
    ASSERT_TRUE(d.ok()) << command_kind_name(c.kind()) << ": " << d.error().message;
    EXPECT_TRUE(*d == c) << command_kind_name(c.kind());
    EXPECT_EQ(encode(*d), b);
    EXPECT_EQ(peek_request_id(b), c.request_id);
  }
}

TEST(Protocol, EveryCompletionRoundTrips) {
  for (const Completion& c : every_completion()) {
    const Bytes b = encode(c);
    auto d = decode_completion(b, kArena);
    ASSERT_TRUE(d.ok()) << completion_kind_name(c.kind()) << ": " << d.error().message;
    EXPECT_TRUE(*d == c) << completion_kind_name(c.kind());
    EXPECT_EQ(encode(*d), b);
  }
}

TEST(Protocol, FixedLayoutOfASyncCommand) {
  const Bytes b = encode(Command{0x0102030405060708ull, SyncCmd{0x1122334455667788ull}});
  const Bytes want = {5, 0, 0, 0, 8, 0, 0, 0, 8, 7, 6, 5, 4, 3, 2, 1, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11};
  EXPECT_EQ(b, want);
}

TEST(Protocol, TruncationNamesTheField) {
  const Bytes up = encode(every_command()[2]);  // upload
  // Header cut short.
  EXPECT_EQ(command_error(Bytes(up.begin(), up.begin() + 10)),
            "command truncated: command.request_id needs 8 bytes at offset 8, message has 10");
  EXPECT_EQ(command_error(Bytes{}), "command truncated: command.kind needs 1 bytes at offset 0, message has 0");
  // Body cut short but body_len consistent: the first missing field is named.
  Bytes cut(up.begin(), up.end() - 4);
  put_u32(cut, 4, static_cast<std::uint32_t>(cut.size() - kMessageHeaderBytes));
  EXPECT_EQ(command_error(cut), "command truncated: upload.data.length needs 8 bytes at offset " +
                                    std::to_string(up.size() - 8) + ", message has " + std::to_string(cut.size()));
  // Body cut short, body_len stale.
  EXPECT_EQ(command_error(Bytes(up.begin(), up.end() - 4)),
            "command.body_len: " + std::to_string(up.size() - 16) + " but the message has " +
                std::to_string(up.size() - 20) + " bytes after the header");
  // Every prefix of every message fails cleanly.
  for (const Command& c : every_command()) {
    const Bytes b = encode(c);
    for (std::size_t n = 0; n < b.size(); ++n) EXPECT_FALSE(decode_command({b.data(), n}, kArena).ok());
  }
  for (const Completion& c : every_completion()) {
    const Bytes b = encode(c);
    for (std::size_t n = 0; n < b.size(); ++n) EXPECT_FALSE(decode_completion({b.data(), n}, kArena).ok());
  }
}

TEST(Protocol, RejectsOversizedAndOutOfRange) {
  // Whole message too large.
  Bytes big(kMaxMessageBytes + 1, 0);
  EXPECT_EQ(command_error(big), "command of 1048577 bytes exceeds the limit 1048576");
  // Unknown kinds, reserved bytes, trailing bytes.
  Bytes sync = encode(Command{1, SyncCmd{2}});
  Bytes k = sync;
  k[0] = 15;
  EXPECT_EQ(command_error(k), "command.kind: command kind 15 is unknown");
  k[0] = 0;
  EXPECT_EQ(command_error(k), "command.kind: command kind 0 is unknown");
  Bytes res = sync;
  res[1] = 1;
  EXPECT_EQ(command_error(res), "command.reserved: reserved byte is 1, must be 0");
  Bytes trail = sync;
  trail.push_back(0);
  put_u32(trail, 4, 9);
  EXPECT_EQ(command_error(trail), "sync: 1 trailing bytes after the last field");

  // Upload: rank, dtype, store, arena range, length mismatch, overflow.
  const std::size_t dtype_at = kMessageHeaderBytes + 8 + 8;  // after stream and tensor_id
  const std::size_t rank_at = dtype_at + 2;
  Bytes up = encode(every_command()[2]);
  Bytes r17 = up;
  r17[rank_at] = 17;
  EXPECT_EQ(command_error(r17), "upload.shape: rank 17 exceeds the limit 16");
  Bytes dt = up;
  dt[dtype_at] = 20;
  EXPECT_EQ(command_error(dt), "upload.dtype: unknown dtype kind 20");
  Bytes st = up;
  st[dtype_at + 1] = 1;
  EXPECT_EQ(command_error(st), "upload.dtype: store byte is 1 for a non-bool dtype, must be 0");
  const std::size_t range_at = rank_at + 1 + 2 * 8;
  Bytes out = up;
  put_u64(out, range_at, kArena - 8);
  EXPECT_EQ(command_error(out), "upload.data: range [1048568, +24) is outside the arena of 1048576 bytes");
  Bytes wrap = up;
  put_u64(wrap, range_at, std::numeric_limits<std::uint64_t>::max() - 4);
  EXPECT_NE(command_error(wrap).find("is outside the arena"), std::string::npos);
  Bytes len = up;
  put_u64(len, range_at + 8, 20);
  EXPECT_EQ(command_error(len), "upload.data: length 20 does not match f32[2,3] (24 bytes)");
  Bytes ovf = up;
  put_u64(ovf, rank_at + 1, std::uint64_t{1} << 40);
  put_u64(ovf, rank_at + 9, std::uint64_t{1} << 40);
  EXPECT_EQ(command_error(ovf), "upload.shape: tensor f32[1099511627776,1099511627776] has more than 2^64 bytes");

  // Read: status, capacity.
  Bytes rd = encode(every_command()[3]);
  const std::size_t status_at = kMessageHeaderBytes + 16;
  Bytes ni = rd;
  ni[status_at] = static_cast<std::uint8_t>(TensorStatus::NotInit);
  EXPECT_EQ(command_error(ni), "read.tensor.status: status NotInit is not allowed (the tensor must exist)");
  ni[status_at] = 9;
  EXPECT_EQ(command_error(ni), "read.tensor.status: unknown tensor status 9");
  Bytes cap = rd;
  put_u64(cap, rd.size() - 8, 23);
  EXPECT_EQ(command_error(cap), "read.dest: capacity 23 is smaller than f32[2,3] (24 bytes)");
  // Drop: bool store out of range.
  Bytes dr = encode(every_command()[5]);
  dr[status_at + 2] = 7;
  EXPECT_EQ(command_error(dr), "drop.tensor.dtype: unknown bool store 7");

  // Register op: length mismatch and a corrupted embedded op.
  Bytes reg = encode(every_command()[1]);
  Bytes badlen = reg;
  put_u32(badlen, kMessageHeaderBytes + 8, 3);
  EXPECT_NE(command_error(badlen).find("register_op.op_len: 3 but"), std::string::npos);
  Bytes badop = reg;
  badop[kMessageHeaderBytes + 12] = 'X';  // the codec's magic
  EXPECT_EQ(command_error(badop).rfind("register_op.op: ", 0), 0u) << command_error(badop);
}

// upload_part, read_part, read_part_done: a part or window is non-empty and inside the tensor,
// checked without overflow, each error naming the field.
TEST(Protocol, ChunkedTransfersStayInsideTheTensor) {
  const Command part = command_of(CommandKind::UploadPart);
  const Command window = command_of(CommandKind::ReadPart);
  ASSERT_EQ(part.kind(), CommandKind::UploadPart);
  ASSERT_EQ(window.kind(), CommandKind::ReadPart);
  // upload_part: stream 8, tensor_id 8, dtype 2, shape 1 + 2 * 8, then offset, data.offset,
  // data.length.
  const std::size_t offset_at = kMessageHeaderBytes + 8 + 8 + 2 + 1 + 16;
  const Bytes up = encode(part);
  ASSERT_EQ(up.size(), offset_at + 24);
  Bytes b = up;
  put_u64(b, offset_at + 16, 0);
  EXPECT_EQ(command_error(b), "upload_part.data: length 0: a part carries at least 1 byte");
  b = up;
  put_u64(b, offset_at, 4'000'000);
  EXPECT_EQ(command_error(b), "upload_part.offset: 4000000 is not inside f32[1000,1000] (4000000 bytes)");
  b = up;
  put_u64(b, offset_at, 4'000'000 - 4095);
  EXPECT_EQ(command_error(b),
            "upload_part.data: length 4096 at offset 3995905 runs past the end of f32[1000,1000] (4000000 bytes)");
  b = up;
  put_u64(b, offset_at, std::numeric_limits<std::uint64_t>::max() - 100);  // offset + length wraps
  EXPECT_NE(command_error(b).find("upload_part.offset: "), std::string::npos);
  b = up;
  put_u64(b, offset_at + 8, kArena - 100);
  EXPECT_EQ(command_error(b), "upload_part.data: range [1048476, +4096) is outside the arena of 1048576 bytes");
  b = up;
  put_u64(b, kMessageHeaderBytes + 16 + 2 + 1, std::uint64_t{1} << 62);  // dim 0: 2^62 * 1000 * 4 overflows
  EXPECT_NE(command_error(b).find("upload_part.shape: tensor f32[4611686018427387904,1000] has more than 2^64 bytes"),
            std::string::npos);
  // read_part: stream, tensor (id, status, dtype, shape), then offset, dest.offset, dest.length.
  const Bytes rd = encode(window);
  const std::size_t roff_at = rd.size() - 24;
  b = rd;
  put_u64(b, roff_at, 4'000'000);
  EXPECT_EQ(command_error(b), "read_part.offset: 4000000 is not inside f32[1000,1000] (4000000 bytes)");
  b = rd;
  put_u64(b, roff_at + 16, 0);
  EXPECT_EQ(command_error(b), "read_part.dest: capacity 0: a window holds at least 1 byte");
  b = rd;
  b[kMessageHeaderBytes + 16] = static_cast<std::uint8_t>(TensorStatus::NotInit);
  EXPECT_EQ(command_error(b), "read_part.tensor.status: status NotInit is not allowed (the tensor must exist)");
  // read_part_done: the window must lie inside the tensor too.
  const Bytes done = encode(every_completion().back());
  const std::size_t doff_at = done.size() - 24;
  b = done;
  put_u64(b, doff_at, 2'999'001);
  auto r = decode_completion(b, kArena);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "read_part_done.data: length 1000 at offset 2999001 runs past the end of u8[3000000] (3000000 bytes)");
  b = done;
  put_u64(b, doff_at + 16, 0);
  r = decode_completion(b, kArena);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "read_part_done.data: length 0: a part carries at least 1 byte");
  // The encoder refuses what the format cannot carry, as for the whole-tensor commands.
  Bytes out;
  EXPECT_FALSE(
      encode_command(Command{1, UploadPartCmd{0, TensorId(1), dtypes::f32, Shape(17, 1), 0, ArenaRange{0, 4}}}, out)
          .ok());
  EXPECT_TRUE(out.empty());
}

TEST(Protocol, FixedLayoutOfAFallbackReport) {
  const Bytes b = encode(Command{9, ReportFallbacksCmd{std::vector<FallbackCount>{{"a::b", 0x0102}, {"c", 3}}}});
  Bytes want = {13, 0, 0, 0, 25, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0};  // header: kind 13, body_len 25, request 9
  // count 2; name_len 4, "a::b", calls 0x0102; name_len 1, "c", calls 3
  const Bytes body = {2, 0, 4, 'a', ':', ':', 'b', 0x02, 0x01, 0, 0, 0, 0, 0, 0, 1, 'c', 3, 0, 0, 0, 0, 0, 0, 0};
  want.insert(want.end(), body.begin(), body.end());
  EXPECT_EQ(b, want);
}

TEST(Protocol, FixedLayoutOfAControl) {
  const Bytes b = encode(Command{5, ControlCmd{ControlVerb::Disconnect, true, "17"}});
  // header: kind 14, body_len 6, request 5; verb 4, format 1, args_len 2, "17"
  const Bytes want = {14, 0, 0, 0, 6, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 4, 1, 2, 0, '1', '7'};
  EXPECT_EQ(b, want);
}

// control: a known verb and format, bounded printable words; the encoder refuses what the decoder would.
TEST(Protocol, ControlIsChecked) {
  const Bytes good = encode(Command{1, ControlCmd{ControlVerb::Limits, false, "a=1"}});
  auto with = [&](std::size_t at, std::uint8_t v) {
    Bytes b = good;
    b[at] = v;
    return b;
  };
  EXPECT_EQ(command_error(with(16, 0)), "control.verb: unknown control verb 0");
  EXPECT_EQ(command_error(with(16, kMaxControlVerb + 1)),
            "control.verb: unknown control verb " + std::to_string(kMaxControlVerb + 1));
  EXPECT_EQ(command_error(with(17, 2)), "control.format: unknown format 2");
  EXPECT_EQ(command_error(with(21, 0x0a)), "control.args: byte 10 at 1 is not printable ASCII");
  Bytes long_args = good;
  long_args[18] = 0x01;  // args_len 1025
  long_args[19] = 0x04;
  EXPECT_EQ(command_error(long_args), "control.args_len: 1025 exceeds the limit 1024");
  Bytes out;
  Status st =
      encode_command(Command{1, ControlCmd{ControlVerb::Jobs, false, std::string(kMaxControlArgBytes + 1, 'a')}}, out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message, "control.args: 1025 bytes exceed the limit 1024");
  EXPECT_FALSE(encode_command(Command{1, ControlCmd{ControlVerb::Jobs, false, "a\tb"}}, out).ok());
  EXPECT_TRUE(out.empty());
}

// report_fallbacks: at most kMaxFallbackEntries entries, each name 1..kMaxFallbackNameBytes bytes
// of printable ASCII without spaces, names strictly ascending; each refusal names the field and
// the entry.
TEST(Protocol, FallbackReportsAreBoundedAndCanonical) {
  const auto report = [](std::vector<FallbackCount> counts) {
    Bytes b;
    KILN_EXPECT_OK(encode_command(Command{1, ReportFallbacksCmd{std::move(counts)}}, b));
    return b;
  };
  const std::size_t count_at = kMessageHeaderBytes;
  const std::size_t first_len_at = count_at + 2;
  const Bytes two = report({{"aten::a", 1}, {"aten::b", 2}});  // entries of 1 + 7 + 8 bytes
  const std::size_t second_len_at = first_len_at + 16;
  // The count.
  Bytes b = two;
  b[count_at] = 1;
  b[count_at + 1] = 1;  // 257
  EXPECT_EQ(command_error(b), "report_fallbacks.count: 257 exceeds the limit 256");
  b = two;
  b[count_at] = 3;  // one entry more than the message holds
  EXPECT_EQ(command_error(b), "command truncated: report_fallbacks.name_len needs 1 bytes at offset " +
                                  std::to_string(two.size()) + ", message has " + std::to_string(two.size()));
  b = two;
  b[count_at] = 1;  // one entry fewer: the second is left over
  EXPECT_EQ(command_error(b), "report_fallbacks: 16 trailing bytes after the last field");
  // A name's length.
  b = two;
  b[first_len_at] = 0;
  EXPECT_EQ(command_error(b), "report_fallbacks.name_len: entry 0: 0 is not in 1..128");
  b = two;
  b[second_len_at] = 129;
  EXPECT_EQ(command_error(b), "report_fallbacks.name_len: entry 1: 129 is not in 1..128");
  b = two;
  b[second_len_at] = 100;  // longer than what is left
  EXPECT_EQ(command_error(b), "command truncated: report_fallbacks.name needs 100 bytes at offset " +
                                  std::to_string(second_len_at + 1) + ", message has " + std::to_string(two.size()));
  // A name's bytes: no spaces, controls, DEL or non-ASCII bytes.
  for (const std::uint8_t bad :
       {std::uint8_t{' '}, std::uint8_t{'\n'}, std::uint8_t{0}, std::uint8_t{0x7f}, std::uint8_t{0xc3}}) {
    b = two;
    b[second_len_at + 1 + 4] = bad;
    char hex[5];
    std::snprintf(hex, sizeof hex, "0x%02x", bad);
    EXPECT_EQ(command_error(b), "report_fallbacks.name: entry 1: byte " + std::string(hex) +
                                    " at 4 is not printable ASCII without spaces");
  }
  // Order: sorted and unique, so that each snapshot has one encoding.
  b = two;
  b[second_len_at + 1 + 6] = 'a';  // aten::a twice
  EXPECT_EQ(command_error(b),
            "report_fallbacks.name: entry 1: 'aten::a' after 'aten::a': names must be sorted "
            "and unique");
  b = report({{"aten::a", 1}, {"aten::c", 2}});
  b[first_len_at + 1 + 6] = 'd';  // aten::d before aten::c
  EXPECT_EQ(command_error(b),
            "report_fallbacks.name: entry 1: 'aten::c' after 'aten::d': names must be sorted "
            "and unique");
  // The largest snapshot decodes.
  std::vector<FallbackCount> most;
  for (std::size_t i = 0; i < kMaxFallbackEntries; ++i) {
    std::string name = std::to_string(1000 + i);  // 4 digits: sorted as numbers
    name += std::string(kMaxFallbackNameBytes - name.size(), '_');
    most.push_back(FallbackCount{name, i});
  }
  const Bytes full = report(most);
  EXPECT_EQ(full.size(), kMessageHeaderBytes + 2 + kMaxFallbackEntries * (1 + kMaxFallbackNameBytes + 8));
  auto decoded = decode_command(full, kArena);
  KILN_ASSERT_OK(decoded);
  EXPECT_EQ(std::get<ReportFallbacksCmd>(decoded->body).counts, most);

  // The encoder refuses what the format cannot carry, naming it, and appends nothing.
  const auto refusal = [](std::vector<FallbackCount> counts) {
    Bytes out;
    Status st = encode_command(Command{1, ReportFallbacksCmd{std::move(counts)}}, out);
    EXPECT_TRUE(out.empty());
    return st.ok() ? std::string("(encoded)") : st.error().message;
  };
  most.push_back(FallbackCount{"zzz", 1});
  EXPECT_EQ(refusal(most), "report_fallbacks: 257 entries exceed the limit 256");
  EXPECT_EQ(refusal({{"b", 1}, {"a", 1}}), "report_fallbacks: entry 1: 'a' after 'b': names must be sorted and unique");
  EXPECT_EQ(refusal({{"", 1}}), "report_fallbacks: entry 0: empty name");
  EXPECT_EQ(refusal({{std::string(kMaxFallbackNameBytes + 1, 'a'), 1}}),
            "report_fallbacks: entry 0: name of 129 bytes exceeds the limit 128");
  EXPECT_EQ(refusal({{"aten::index add", 1}}),
            "report_fallbacks: entry 0: byte 0x20 at 11 is not printable ASCII without spaces");

  // The rule itself, which the client library fits its reports to.
  EXPECT_FALSE(fallback_name_problem("aten::_foreach_add.List").has_value());
  EXPECT_FALSE(fallback_name_problem("aten::b", std::string_view("aten::a")).has_value());
  EXPECT_TRUE(fallback_name_problem("aten::a", std::string_view("aten::a")).has_value());
  EXPECT_TRUE(fallback_name_problem("caf\xc3\xa9").has_value());
}

TEST(Protocol, CompletionDecoderChecksCodesAndLengths) {
  Bytes err = encode(every_completion()[1]);
  Bytes code = err;
  code[kMessageHeaderBytes] = 200;
  auto r = decode_completion(code, kArena);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "error.code: unknown error code 200");
  Bytes ml = err;
  ml[kMessageHeaderBytes + 2] = 0xff;
  ml[kMessageHeaderBytes + 3] = 0xff;
  r = decode_completion(ml, kArena);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "error.msg_len: 65535 exceeds the limit 1024");
  Bytes rd = encode(every_completion()[3]);
  r = decode_completion(rd, 16);  // a tiny arena
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "read_done.data: range [256, +30) is outside the arena of 16 bytes");
}

TEST(Protocol, ErrorCompletionTruncatesLongMessagesAtACharacterBoundary) {
  std::string msg(kMaxErrorMessageBytes - 1, 'a');
  msg += "\xc3\xa9";  // 'é' straddles the limit
  msg += std::string(100, 'b');
  const Completion c = error_completion(5, make_error(ErrorCode::Execution, msg));
  EXPECT_EQ(std::get<ErrorCpl>(c.body).message, std::string(kMaxErrorMessageBytes - 1, 'a'));
  Bytes b;
  KILN_ASSERT_OK(encode_completion(Completion{6, ErrorCpl{ErrorCode::Execution, msg}}, b));
  auto d = decode_completion(b, kArena);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(std::get<ErrorCpl>(d->body).message.size(), kMaxErrorMessageBytes - 1);
}

// A QFloat dtype carries its scheme after the store byte (13 bytes, the IR codec's encoding); a
// scheme cut short, an unknown enum, a block rank over 4 or a store byte are refused by name, and
// tensor_bytes counts kiln's layout (values, scales, global scale) or names a scheme the shape
// cannot take.
TEST(Protocol, QFloatDtypesCarryTheirScheme) {
  Bytes q = encode(Command{22, UploadCmd{7, TensorId(9), DType::qfloat(packed_blocks()), Shape{2, 8}, {0, 20}}});
  auto d = decode_command(q, kArena);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(std::get<UploadCmd>(d->body).dtype, DType::qfloat(packed_blocks()));
  const std::size_t dtype_at = kMessageHeaderBytes + 8 + 8, scheme_at = dtype_at + 2;
  Bytes store = q;
  store[dtype_at + 1] = 1;
  EXPECT_EQ(command_error(store), "upload.dtype: store byte is 1 for a non-bool dtype, must be 0");
  Bytes value = q;
  value[scheme_at] = 9;
  EXPECT_NE(command_error(value).find("upload.dtype: "), std::string::npos) << command_error(value);
  EXPECT_NE(command_error(value).find("quantization value type"), std::string::npos) << command_error(value);
  Bytes rank = q;
  rank[scheme_at + 3] = 5;
  EXPECT_NE(command_error(rank).find("block rank 5 exceeds 4"), std::string::npos) << command_error(rank);
  Bytes cut(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(scheme_at + 5));
  put_u32(cut, 4, static_cast<std::uint32_t>(cut.size() - kMessageHeaderBytes));
  EXPECT_NE(command_error(cut).find("upload.dtype"), std::string::npos) << command_error(cut);
  // [2, 8] in Q4S words of 8 values: 2 · 1 words of 4 bytes, 4 f16 scales, the f32 global scale.
  EXPECT_EQ(tensor_bytes(DType::qfloat(packed_blocks()), Shape{2, 8}).value(), 2 * 4 + 4 * 2 + 4);
  EXPECT_EQ(tensor_bytes(DType::qfloat(ir::QuantScheme{}), Shape{4}).value(), 4 + 4 + 4);
  EXPECT_FALSE(tensor_bytes(DType::qfloat(packed_blocks()), Shape{2, 6}).ok());  // 6 is no multiple of 4
}

TEST(Protocol, EncoderRefusesWhatTheFormatCannotCarry) {
  Bytes b;
  Status s = encode_command(Command{1, UploadCmd{0, TensorId(1), dtypes::f32, Shape(17, 1), ArenaRange{0, 4}}}, b);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().message, "rank 17 exceeds the limit 16");
  EXPECT_TRUE(b.empty());  // nothing appended on error
  EXPECT_FALSE(peek_request_id(Bytes(15, 0)).has_value());
}

// Random byte mutations (flips, overwrites, truncations, insertions) of valid messages: the
// decoders never crash (ASan/UBSan would abort), and whatever decodes re-encodes to the same
// bytes (one encoding per value).
TEST(Protocol, TenThousandRandomMutationsNeverCrash) {
  std::vector<Bytes> seeds;
  for (const Command& c : every_command()) seeds.push_back(encode(c));
  for (const Completion& c : every_completion()) seeds.push_back(encode(c));
  std::mt19937_64 rng(2024);
  int decoded = 0;
  for (int i = 0; i < 10000; ++i) {
    Bytes b = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (rng() % 5) {
        case 0: b[rng() % b.size()] ^= static_cast<std::uint8_t>(1u << (rng() % 8)); break;
        case 1: b[rng() % b.size()] = static_cast<std::uint8_t>(rng()); break;
        case 2: b.resize(rng() % (b.size() + 1)); break;
        case 3:
          b.insert(b.begin() + static_cast<long>(rng() % (b.size() + 1)), static_cast<std::uint8_t>(rng()));
          break;
        case 4:
          if (b.size() >= 8) put_u32(b, 4, static_cast<std::uint32_t>(b.size() - std::min<std::size_t>(b.size(), 16)));
          break;
      }
      if (b.empty()) b.push_back(static_cast<std::uint8_t>(rng()));
    }
    if (auto c = decode_command(b, kArena); c.ok()) {
      ++decoded;
      EXPECT_EQ(encode(*c), b);
    }
    if (auto c = decode_completion(b, kArena); c.ok()) {
      ++decoded;
      EXPECT_EQ(encode(*c), b);
    }
  }
  EXPECT_GT(decoded, 100);  // the mutations do reach the field checks
}

TEST(Protocol, TokensCompareEveryByteAndIndexByTheFirstEight) {
  const ExportToken a = sample_token();
  EXPECT_TRUE(token_equal(a, a));
  EXPECT_EQ(a.index(), 0xa7a6a5a4a3a2a1a0ull);
  for (std::size_t i = 0; i < ExportToken::kBytes; ++i) {
    ExportToken b = a;
    b.bytes[i] ^= 0x01;
    EXPECT_FALSE(token_equal(a, b)) << "byte " << i;
  }
}

TEST(Protocol, ATruncatedTokenIsNamed) {
  Bytes b = encode(Command{8, ImportCmd{9, sample_token(), TensorId(44)}});
  b.resize(16 + 8 + 20);  // header, stream, 20 of the token's 32 bytes
  b[4] = static_cast<std::uint8_t>(b.size() - 16);
  auto c = decode_command(b, kArena);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("import.token needs 32 bytes"), std::string::npos) << c.error().message;
}

// The fuzzer's checked-in seeds are decodable messages of every kind, each the unique encoding of
// what it decodes to. KILN_WRITE_IPC_SEEDS=<dir> rewrites them from the lists above.
TEST(Protocol, SeedCorpus) {
  if (const char* dir = std::getenv("KILN_WRITE_IPC_SEEDS")) {
    int i = 0;
    auto write = [&](const Bytes& b, const std::string& name) {
      std::ofstream f(std::string(dir) + "/" + std::to_string(i++) + "_" + name, std::ios::binary);
      f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    };
    for (const Command& c : every_command()) write(encode(c), command_kind_name(c.kind()));
    for (const Completion& c : every_completion()) write(encode(c), completion_kind_name(c.kind()));
  }
  const std::filesystem::path seeds = std::filesystem::path(KILN_SOURCE_DIR) / "fuzz/seeds/ipc_decoder_fuzzer";
  std::size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(seeds)) {
    std::ifstream f(entry.path(), std::ios::binary);
    const Bytes b((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    auto c = decode_command(b, kArena);
    auto p = decode_completion(b, kArena);
    ASSERT_TRUE(c.ok() || p.ok()) << entry.path() << " decodes as neither: " << c.error().to_string();
    EXPECT_EQ(c.ok() ? encode(*c) : encode(*p), b) << entry.path();
    ++n;
  }
  EXPECT_GE(n, every_command().size());
}

}  // namespace
}  // namespace kiln::ipc

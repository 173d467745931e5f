// Tests for the binary codec (ir/include/kiln/ir/codec.h): exact round trips of every op kind,
// graphs and edge values; clean rejection of truncated, corrupted and hostile input.
//
// Set KILN_WRITE_CODEC_SEEDS=<dir> to (re)write the fuzzer seed corpus
// (fuzz/seeds/ir_codec_fuzzer) from the SeedCorpus test.
#include "kiln/ir/codec.h"
#include "kiln/testing/status.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

// ---- Allocation accounting: the hostile-count tests check that decoding allocates next to
// nothing. Replacing the global operator new is legal and affects only this test binary.
namespace {
std::atomic<std::size_t> g_allocated_bytes{0};
}  // namespace

// GCC's -Wmismatched-new-delete sees free() on memory from (the replaced) operator new once
// both are inlined into library code; they do match here, since both sides are replaced.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
  g_allocated_bytes.fetch_add(n, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

namespace kiln::ir {
namespace {

using Bytes = std::vector<std::uint8_t>;
using codec::decode_graph;
using codec::decode_operation;
using codec::decode_operations;

TensorIr tensor(std::uint64_t id, Shape shape, TensorStatus status, DType dtype = dtypes::f32) {
  return TensorIr{TensorId(id), std::move(shape), status, dtype};
}

std::uint64_t bits_of(double d) {
  std::uint64_t b;
  std::memcpy(&b, &d, sizeof b);
  return b;
}
double from_bits(std::uint64_t b) {
  double d;
  std::memcpy(&d, &b, sizeof d);
  return d;
}

// Field-by-field equality, stricter than operator==: dtype compared for every family and Float
// scalars compared by bit pattern (NaN payloads, -0.0).
void expect_identical(const Operation& a, const Operation& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.family, b.family);
  EXPECT_TRUE(a.dtype == b.dtype) << a.dtype.name() << " vs " << b.dtype.name();
  EXPECT_EQ(a.num_inputs, b.num_inputs);
  EXPECT_TRUE(a.tensors == b.tensors);
  ASSERT_EQ(a.scalars.size(), b.scalars.size());
  for (std::size_t i = 0; i < a.scalars.size(); ++i) {
    EXPECT_EQ(a.scalars[i].kind(), b.scalars[i].kind());
    EXPECT_EQ(a.scalars[i].hash_bits(), b.scalars[i].hash_bits()) << i;
  }
  EXPECT_TRUE(a.ranges == b.ranges);
  EXPECT_TRUE(a.attrs == b.attrs);
  EXPECT_EQ(a.custom_id, b.custom_id);
}

// Builds a structurally valid op of `kind` in `family`, with argument counts from the table.
Operation make_op(OpKind kind, Family family, std::uint64_t first_id = 1) {
  const OpInfo& info = op_info(kind);
  const SignatureInfo& sig = signature_info(info.signature);
  Operation op;
  op.kind = kind;
  op.family = family;
  if (family == Family::NumericInt)
    op.dtype = dtypes::i32;
  else if (family == Family::NumericFloat || family == Family::Float)
    op.dtype = dtypes::f16;
  const DType tdt = family == Family::BaseBool || family == Family::Bool ? dtypes::boolean
                    : family == Family::BaseInt || family == Family::NumericInt || family == Family::Int ? dtypes::i64
                                                                                                         : dtypes::f32;
  const int ins = sig.max_inputs == kVariadic ? sig.min_inputs + 2 : sig.max_inputs;
  const int outs = sig.max_outputs == kVariadic ? 2 : sig.max_outputs;
  std::uint64_t id = first_id;
  for (int i = 0; i < ins; ++i) {
    const TensorStatus st = kind == OpKind::Drop_Drop || i % 2 == 1 ? TensorStatus::ReadWrite : TensorStatus::ReadOnly;
    op.tensors.push_back(tensor(id++, Shape{2, 3, static_cast<std::uint64_t>(4 + i)}, st, tdt));
  }
  for (int i = 0; i < outs; ++i) op.tensors.push_back(tensor(id++, Shape{2, 3, 4}, TensorStatus::NotInit, tdt));
  op.num_inputs = static_cast<std::uint8_t>(ins);
  const int nscalars = sig.max_scalars == kVariadic ? 3 : sig.max_scalars;
  for (int i = 0; i < nscalars; ++i) {
    switch (i % 4) {
      case 0: op.scalars.push_back(ScalarIr::Float(-1.5 + i)); break;
      case 1: op.scalars.push_back(ScalarIr::Int(-7 * i)); break;
      case 2: op.scalars.push_back(ScalarIr::UInt(1000u + i)); break;
      default: op.scalars.push_back(ScalarIr::Bool(true)); break;
    }
  }
  const int nattrs = sig.max_attrs == kVariadic ? sig.min_attrs + 3 : sig.max_attrs;
  for (int i = 0; i < nattrs; ++i) op.attrs.push_back(i % 2 ? -i : i * 300);
  if (sig.ranges) {
    op.ranges.push_back(Slice{0, std::nullopt, 1});
    op.ranges.push_back(Slice{-2, 5, -3});
  }
  if (kind == OpKind::Custom_Custom) op.custom_id = "my_custom_op";
  return op;
}

std::vector<Family> admitted_families(OpKind kind) {
  std::vector<Family> fs;
  for (int f = 0; f < kNumFamilies; ++f)
    if (group_admits(op_info(kind).group, static_cast<Family>(f))) fs.push_back(static_cast<Family>(f));
  return fs;
}

// One valid op of every kind, first admitted family.
std::vector<Operation> all_kinds_program() {
  std::vector<Operation> ops;
  std::uint64_t id = 1;
  for (int k = 0; k < kNumOpKinds; ++k) {
    const OpKind kind = static_cast<OpKind>(k);
    ops.push_back(make_op(kind, admitted_families(kind).front(), id));
    id += 10;
  }
  return ops;
}

Operation custom_with_edge_scalars() {
  Operation op = make_op(OpKind::Custom_Custom, Family::Custom);
  op.scalars.clear();
  for (double d : {0.0, -0.0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::denorm_min(), std::numeric_limits<double>::max(),
                   std::numeric_limits<double>::lowest(), from_bits(0x7ff8000000000123ull) /* quiet NaN payload */,
                   from_bits(0xfff0000000000001ull) /* negative signalling NaN */})
    op.scalars.push_back(ScalarIr::Float(d));
  op.scalars.push_back(ScalarIr::Int(std::numeric_limits<std::int64_t>::min()));
  op.scalars.push_back(ScalarIr::Int(std::numeric_limits<std::int64_t>::max()));
  op.scalars.push_back(ScalarIr::Int(-1));
  op.scalars.push_back(ScalarIr::Int(0));
  op.scalars.push_back(ScalarIr::UInt(std::numeric_limits<std::uint64_t>::max()));
  op.scalars.push_back(ScalarIr::UInt(0));
  op.scalars.push_back(ScalarIr::Bool(false));
  op.scalars.push_back(ScalarIr::Bool(true));
  op.custom_id = "op\xc3\xa9_\xe2\x98\x83_\xf0\x9f\x94\xa5";  // "opé_☃_🔥"
  return op;
}

// A program touching every encoding feature: edge ids/dims, every dtype, ranges, attrs.
std::vector<Operation> feature_program() {
  std::vector<Operation> ops;
  Operation init = make_op(OpKind::Init_Init, Family::Init);
  init.tensors[0] = tensor(std::numeric_limits<std::uint64_t>::max(), Shape{}, TensorStatus::NotInit, dtypes::f64);
  ops.push_back(init);

  Operation slice = make_op(OpKind::Base_Slice, Family::BaseFloat);
  slice.tensors[0] = tensor(std::uint64_t{1} << 63, Shape(codec::kMaxRank, 1), TensorStatus::ReadWrite);
  slice.tensors[1].shape = Shape{0, std::numeric_limits<std::uint64_t>::max()};
  slice.ranges.clear();
  slice.ranges.push_back(Slice{std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max(),
                               std::numeric_limits<std::int64_t>::min()});
  slice.ranges.push_back(Slice{-1, std::nullopt, std::numeric_limits<std::int64_t>::max()});
  slice.ranges.push_back(Slice{5, -5, -1});
  ops.push_back(slice);

  Operation perm = make_op(OpKind::Base_Permute, Family::BaseInt);
  perm.attrs = {std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max(), 0, -1, 63, 64};
  ops.push_back(perm);

  std::uint64_t id = 500;
  for (int k = 0; k <= static_cast<int>(DTypeKind::QFloat); ++k) {
    const DTypeKind dk = static_cast<DTypeKind>(k);
    std::vector<DType> dts;
    if (dk == DTypeKind::Bool) {
      dts = {DType::boolean(BoolStore::Native), DType::boolean(BoolStore::U8), DType::boolean(BoolStore::U32)};
    } else if (dk == DTypeKind::QFloat) {
      QuantScheme a;
      QuantScheme b{QuantValue::Q2S, QuantStoreKind::PackedNative, 255, 4, {1, 65535, 32, 7}, QuantParam::BF16};
      QuantScheme c{QuantValue::Q4F, QuantStoreKind::PackedU32, 1, 1, {32, 9, 9, 9}, QuantParam::F16};  // unused set
      dts = {DType::qfloat(a), DType::qfloat(b), DType::qfloat(c)};
    } else {
      dts = {DType(dk)};
    }
    for (const DType& d : dts) {
      Operation drop = make_op(OpKind::Drop_Drop, Family::Drop);
      drop.tensors[0] = tensor(id++, Shape{3}, TensorStatus::ReadWrite, d);
      drop.dtype = d;  // a dtype on a family that carries none is still kept
      ops.push_back(drop);
      if (d.is_float() || d.is_quantized()) {
        Operation add = make_op(OpKind::Numeric_Add, Family::NumericFloat, id);
        id += 3;
        add.dtype = d;
        ops.push_back(add);
      }
    }
  }
  ops.push_back(custom_with_edge_scalars());
  Operation sync = make_op(OpKind::Distributed_SyncCollective, Family::Distributed);
  ops.push_back(sync);
  return ops;
}

GraphIr small_graph() {
  GraphIr g;
  Operation init = make_op(OpKind::Init_Init, Family::Init, 1);
  Operation add = make_op(OpKind::Numeric_Add, Family::NumericFloat, 2);
  add.tensors[0].id = TensorId(1);
  Operation exp = make_op(OpKind::Float_Exp, Family::Float, 10);
  exp.tensors[0] = add.tensors[2];
  exp.tensors[0].status = TensorStatus::ReadWrite;
  g.operations = {init, add, exp};
  g.inputs = {TensorId(1), TensorId(3)};
  g.outputs = {TensorId(11)};
  return g;
}

Bytes encode_ops(std::span<const Operation> ops) {
  Bytes b;
  codec::encode_operations(ops, b);
  return b;
}

void expect_decode_error(const Result<std::vector<Operation>>& r, const std::string& needle) {
  ASSERT_FALSE(r.ok()) << "decoded although it should not";
  EXPECT_EQ(r.error().code, ErrorCode::Decode);
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("byte offset"), std::string::npos) << r.error().message;
}

// Header + a body written by hand.
Bytes message(codec::MessageType type, std::initializer_list<std::uint8_t> body) {
  Bytes b(codec::kMagic.begin(), codec::kMagic.end());
  b.push_back(codec::kFormatVersion & 0xff);
  b.push_back(codec::kFormatVersion >> 8);
  b.push_back(static_cast<std::uint8_t>(type));
  b.push_back(0);
  const std::uint32_t fp = codec::op_table_fingerprint();
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<std::uint8_t>(fp >> (8 * i)));
  b.insert(b.end(), body);
  return b;
}
void append_varint(Bytes& b, std::uint64_t v) {
  while (v >= 0x80) {
    b.push_back(static_cast<std::uint8_t>(v | 0x80));
    v >>= 7;
  }
  b.push_back(static_cast<std::uint8_t>(v));
}

// ---------------------------------------------------------------------------------------------

TEST(Codec, HeaderLayout) {
  Bytes b;
  codec::encode_operations({}, b);
  ASSERT_EQ(b.size(), codec::kHeaderSize + 1);
  EXPECT_EQ(Bytes(b.begin(), b.begin() + 4), Bytes({'K', 'I', 'R', 'C'}));
  auto h = codec::decode_header(b);
  ASSERT_TRUE(h.ok()) << h.error().to_string();
  EXPECT_EQ(h->version, codec::kFormatVersion);
  EXPECT_EQ(h->type, codec::MessageType::OperationList);
  EXPECT_EQ(h->table_fingerprint, codec::op_table_fingerprint());
  auto ops = decode_operations(b);
  ASSERT_TRUE(ops.ok()) << ops.error().to_string();
  EXPECT_TRUE(ops->empty());
}

TEST(Codec, EveryOpKindInEveryAdmittedFamilyRoundTrips) {
  int checked = 0;
  for (int k = 0; k < kNumOpKinds; ++k) {
    const OpKind kind = static_cast<OpKind>(k);
    const auto families = admitted_families(kind);
    ASSERT_FALSE(families.empty()) << op_info(kind).variant;
    for (Family f : families) {
      const Operation op = make_op(kind, f);
      SCOPED_TRACE(op.to_string());
      ASSERT_TRUE(op.validate().ok()) << op.validate().error().to_string();
      Bytes b;
      codec::encode_operation(op, b);
      EXPECT_EQ(b.size(), codec::encoded_size(op));
      auto back = decode_operation(b);
      ASSERT_TRUE(back.ok()) << back.error().to_string();
      EXPECT_TRUE(*back == op);
      EXPECT_EQ(hash_operation(*back), hash_operation(op));
      expect_identical(op, *back);
      Bytes again;
      codec::encode_operation(*back, again);
      EXPECT_EQ(again, b);
      ++checked;
    }
  }
  EXPECT_GE(checked, kNumOpKinds);
}

TEST(Codec, EdgeValuesRoundTripExactly) {
  const std::vector<Operation> ops = feature_program();
  for (const Operation& op : ops) ASSERT_TRUE(op.validate().ok()) << op.validate().error().to_string();
  const Bytes b = encode_ops(ops);
  EXPECT_EQ(b.size(), codec::encoded_size(std::span<const Operation>(ops)));
  auto back = decode_operations(b);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  ASSERT_EQ(back->size(), ops.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    SCOPED_TRACE(i);
    expect_identical(ops[i], (*back)[i]);
  }
  // The NaN payloads and the sign of zero survive (checked by bits above; spelled out here).
  const Operation& custom = (*back)[ops.size() - 2];
  EXPECT_EQ(bits_of(custom.scalars[1].as_float()), 0x8000000000000000ull);
  EXPECT_EQ(bits_of(custom.scalars[7].as_float()), 0x7ff8000000000123ull);
  EXPECT_EQ(bits_of(custom.scalars[8].as_float()), 0xfff0000000000001ull);
  EXPECT_EQ(encode_ops(*back), b);
}

TEST(Codec, GraphRoundTrips) {
  const GraphIr g = small_graph();
  Bytes b;
  codec::encode_graph(g, b);
  EXPECT_EQ(b.size(), codec::encoded_size(g));
  auto back = decode_graph(b);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_TRUE(*back == g);
  Bytes again;
  codec::encode_graph(*back, again);
  EXPECT_EQ(again, b);

  GraphIr empty;
  Bytes e;
  codec::encode_graph(empty, e);
  EXPECT_EQ(e.size(), codec::kHeaderSize + 3);
  auto eback = decode_graph(e);
  ASSERT_TRUE(eback.ok()) << eback.error().to_string();
  EXPECT_TRUE(*eback == empty);

  // Boundary ids are carried as sent, even extreme ones.
  GraphIr big = small_graph();
  big.inputs.push_back(TensorId(std::numeric_limits<std::uint64_t>::max()));
  big.outputs.push_back(TensorId(0));
  Bytes bb;
  codec::encode_graph(big, bb);
  auto bback = decode_graph(bb);
  ASSERT_TRUE(bback.ok()) << bback.error().to_string();
  EXPECT_TRUE(*bback == big);
}

TEST(Codec, MessagesAppendToOneBuffer) {
  const std::vector<Operation> ops = all_kinds_program();
  Bytes b;
  std::vector<std::size_t> starts;
  for (const Operation& op : ops) {
    starts.push_back(b.size());
    codec::encode_operation(op, b);
  }
  starts.push_back(b.size());
  for (std::size_t i = 0; i < ops.size(); ++i) {
    auto one = decode_operation(std::span<const std::uint8_t>(b).subspan(starts[i], starts[i + 1] - starts[i]));
    ASSERT_TRUE(one.ok()) << one.error().to_string();
    EXPECT_TRUE(*one == ops[i]);
  }
  // A warm vector does not allocate.
  b.clear();
  codec::encode_operations(ops, b);
  b.clear();
  const std::size_t before = g_allocated_bytes.load();
  codec::encode_operations(ops, b);
  EXPECT_EQ(g_allocated_bytes.load(), before);
}

TEST(Codec, EncodeIntoCallerBuffer) {
  const std::vector<Operation> ops = all_kinds_program();
  const std::size_t n = codec::encoded_size(std::span<const Operation>(ops));
  Bytes buf(n + 7, 0xee);
  auto written = codec::encode_operations_into(ops, buf);
  ASSERT_TRUE(written.ok()) << written.error().to_string();
  EXPECT_EQ(*written, n);
  EXPECT_EQ(Bytes(buf.begin(), buf.begin() + static_cast<std::ptrdiff_t>(n)), encode_ops(ops));
  EXPECT_EQ(buf[n], 0xee);
  auto small = codec::encode_operations_into(ops, std::span<std::uint8_t>(buf.data(), n - 1));
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.error().code, ErrorCode::ResourceExhausted);

  const Operation op = custom_with_edge_scalars();
  Bytes one(codec::encoded_size(op));
  auto w1 = codec::encode_operation_into(op, one);
  KILN_ASSERT_OK(w1);
  auto back = decode_operation(one);
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  expect_identical(op, *back);

  const GraphIr g = small_graph();
  Bytes gb(codec::encoded_size(g));
  KILN_ASSERT_OK(codec::encode_graph_into(g, gb));
  auto gback = decode_graph(gb);
  KILN_ASSERT_OK(gback);
  EXPECT_TRUE(*gback == g);
  EXPECT_FALSE(codec::encode_graph_into(g, std::span<std::uint8_t>(gb.data(), 3)).ok());
}

TEST(Codec, HeaderErrors) {
  const Bytes good = encode_ops(all_kinds_program());
  {
    Bytes b = good;
    b[0] = 'X';
    expect_decode_error(decode_operations(b), "wrong magic");
  }
  {
    Bytes b = good;
    b[4] = 2;
    expect_decode_error(decode_operations(b), "unsupported format version 2");
  }
  {
    Bytes b = good;
    b[6] = 9;
    expect_decode_error(decode_operations(b), "unknown message type 9");
  }
  {
    Bytes b = good;
    b[7] = 1;
    expect_decode_error(decode_operations(b), "reserved header byte");
  }
  {
    Bytes b = good;
    b[8] ^= 1;
    expect_decode_error(decode_operations(b), "op table fingerprint");
  }
  // Right format, wrong message type for the call.
  expect_decode_error(decode_operations(message(codec::MessageType::Graph, {0, 0, 0})), "expected OperationList");
  auto as_graph = decode_graph(good);
  ASSERT_FALSE(as_graph.ok());
  EXPECT_NE(as_graph.error().message.find("expected Graph"), std::string::npos);
  auto as_op = decode_operation(good);
  ASSERT_FALSE(as_op.ok());
  EXPECT_EQ(as_op.error().code, ErrorCode::Decode);
  // Empty input.
  expect_decode_error(decode_operations({}), "truncated input: magic");
}

TEST(Codec, TrailingBytesAreRejected) {
  Bytes b = encode_ops(all_kinds_program());
  const std::size_t n = b.size();
  b.push_back(0);
  expect_decode_error(decode_operations(b), "1 trailing byte(s)");
  auto r = decode_operations(b);
  EXPECT_NE(r.error().message.find("byte offset " + std::to_string(n)), std::string::npos) << r.error().message;
}

TEST(Codec, NonCanonicalVarintsAreRejected) {
  // Count 0 written as 0x80 0x00.
  expect_decode_error(decode_operations(message(codec::MessageType::OperationList, {0x80, 0x00})),
                      "not in its shortest form");
  // 11-byte and >64-bit varints.
  expect_decode_error(decode_operations(message(codec::MessageType::OperationList,
                                                {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02})),
                      "exceeds 64 bits");
  expect_decode_error(decode_operations(message(codec::MessageType::OperationList, {0xff, 0xff})), "truncated input");
}

TEST(Codec, UnknownEnumValuesAreRejected) {
  // The drop op's bytes: kind varint, family, dtype kind, num_inputs, 1 tensor: id, status,
  // dtype, rank 1, dim; then 4 zero counts and id length 0.
  const Operation drop = make_op(OpKind::Drop_Drop, Family::Drop, 5);
  Bytes good;
  codec::encode_operation(drop, good);
  const std::size_t h = codec::kHeaderSize;
  const std::size_t kind_len = static_cast<std::size_t>(drop.kind) >= 0x80 ? 2 : 1;
  const std::size_t family_at = h + kind_len, dtype_at = family_at + 1, tensor_at = dtype_at + 3;
  KILN_ASSERT_OK(decode_operation(good));
  auto check = [&](std::size_t at, std::uint8_t value, const std::string& needle) {
    Bytes b = good;
    b[at] = value;
    auto r = decode_operation(b);
    ASSERT_FALSE(r.ok()) << needle;
    EXPECT_EQ(r.error().code, ErrorCode::Decode);
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("byte offset " + std::to_string(at)), std::string::npos) << r.error().message;
  };
  check(family_at, kNumFamilies, "unknown family 14");
  check(dtype_at, 15, "unknown dtype kind 15");
  check(tensor_at + 1, 3, "unknown tensor status 3");
  check(tensor_at + 2, 200, "unknown dtype kind 200");
  {
    Bytes b = message(codec::MessageType::Operation, {});
    append_varint(b, kNumOpKinds);
    auto r = decode_operation(b);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("unknown operation kind"), std::string::npos) << r.error().message;
  }
  // Scalar and range enums, through a hand-built MulScalar op.
  Operation mul = make_op(OpKind::Numeric_MulScalar, Family::NumericFloat);
  mul.scalars = {ScalarIr::Bool(true)};
  Bytes mb;
  codec::encode_operation(mul, mb);
  // The scalar is the last 2 bytes before the 3 trailing counts (ranges, attrs, id length).
  const std::size_t bool_at = mb.size() - 4, kind_at = mb.size() - 5;
  {
    Bytes b = mb;
    b[bool_at] = 2;
    auto r = decode_operation(b);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("bool scalar byte is 2"), std::string::npos) << r.error().message;
  }
  {
    Bytes b = mb;
    b[kind_at] = 4;
    auto r = decode_operation(b);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("unknown scalar kind 4"), std::string::npos) << r.error().message;
  }
  Operation sl = make_op(OpKind::Base_Slice, Family::BaseFloat);
  sl.ranges = {Slice{1, 2, 1}};
  Bytes sb;
  codec::encode_operation(sl, sb);
  // range = start(1) has_end(1) end(1) step(1), then attrs count and id length.
  Bytes b = sb;
  b[sb.size() - 5] = 7;
  auto r = decode_operation(b);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("has_end flag is 7"), std::string::npos) << r.error().message;
}

TEST(Codec, InvalidOperationsAreRejectedAfterDecoding) {
  Operation add = make_op(OpKind::Numeric_Add, Family::NumericFloat);
  add.tensors.pop_back();  // no output
  Bytes b;
  codec::encode_operation(add, b);  // encoding is total; decoding validates
  auto r = decode_operation(b);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Decode);
  EXPECT_NE(r.error().message.find("invalid operation"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("outputs"), std::string::npos) << r.error().message;

  Operation fam = make_op(OpKind::Numeric_Add, Family::NumericFloat);
  fam.family = Family::Activation;  // the Numeric group does not admit it
  Bytes fb;
  codec::encode_operation(fam, fb);
  EXPECT_FALSE(decode_operation(fb).ok());

  Operation rank = make_op(OpKind::Numeric_Add, Family::NumericFloat);
  rank.tensors[0].shape.assign(codec::kMaxRank + 1, 1);
  Bytes rb;
  codec::encode_operation(rank, rb);
  auto rr = decode_operation(rb);
  ASSERT_FALSE(rr.ok());
  EXPECT_NE(rr.error().message.find("tensor rank 17 exceeds the limit of 16"), std::string::npos) << rr.error().message;

  for (const char* bad : {"a\nb", "\x7f", "\xc2\x85", "\xc3", "\xed\xa0\x80", "\xff", "\xe0\x80\xaf"}) {
    Operation c = make_op(OpKind::Custom_Custom, Family::Custom);
    c.custom_id = bad;
    Bytes cb;
    codec::encode_operation(c, cb);
    auto cr = decode_operation(cb);
    ASSERT_FALSE(cr.ok()) << bad;
    EXPECT_NE(cr.error().message.find("custom id is not printable UTF-8"), std::string::npos) << cr.error().message;
  }
  Operation longid = make_op(OpKind::Custom_Custom, Family::Custom);
  longid.custom_id.assign(codec::kMaxCustomIdBytes + 1, 'x');
  Bytes lb;
  codec::encode_operation(longid, lb);
  auto lr = decode_operation(lb);
  ASSERT_FALSE(lr.ok());
  EXPECT_NE(lr.error().message.find("custom id length 1025 exceeds"), std::string::npos) << lr.error().message;
}

TEST(Codec, ErrorsNameTheOperation) {
  std::vector<Operation> ops = all_kinds_program();
  ops[3].tensors.back().status = TensorStatus::ReadOnly;  // an output that is not NotInit
  auto r = decode_operations(encode_ops(ops));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("operation #3"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("NotInit"), std::string::npos) << r.error().message;
}

TEST(Codec, EveryTruncationFailsCleanly) {
  const Bytes list = encode_ops(feature_program());
  for (std::size_t n = 0; n < list.size(); ++n) {
    auto r = decode_operations(std::span<const std::uint8_t>(list.data(), n));
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes decoded";
    ASSERT_EQ(r.error().code, ErrorCode::Decode);
  }
  Bytes gb;
  codec::encode_graph(small_graph(), gb);
  for (std::size_t n = 0; n < gb.size(); ++n) {
    auto r = decode_graph(std::span<const std::uint8_t>(gb.data(), n));
    ASSERT_FALSE(r.ok()) << "graph prefix of " << n << " bytes decoded";
  }
  Bytes ob;
  codec::encode_operation(custom_with_edge_scalars(), ob);
  for (std::size_t n = 0; n < ob.size(); ++n)
    ASSERT_FALSE(decode_operation(std::span<const std::uint8_t>(ob.data(), n)).ok());
}

TEST(Codec, RandomByteFlipsNeverCrashAndStayCanonical) {
  const std::uint32_t seed = 0x6b696c6e;  // fixed: failures reproduce
  std::printf("codec byte-flip seed: %u\n", seed);
  std::mt19937 rng(seed);
  std::vector<Bytes> corpus;
  corpus.push_back(encode_ops(feature_program()));
  corpus.push_back(encode_ops(all_kinds_program()));
  corpus.emplace_back();
  codec::encode_graph(small_graph(), corpus.back());
  corpus.emplace_back();
  codec::encode_operation(custom_with_edge_scalars(), corpus.back());

  int decoded = 0;
  const int iterations = 20000;
  for (int it = 0; it < iterations; ++it) {
    Bytes b = corpus[static_cast<std::size_t>(it) % corpus.size()];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      const std::size_t at = rng() % b.size();
      if (rng() % 2)
        b[at] ^= static_cast<std::uint8_t>(1u << (rng() % 8));
      else
        b[at] = static_cast<std::uint8_t>(rng());
    }
    if (rng() % 8 == 0) b.resize(rng() % (b.size() + 1));
    // Anything that decodes re-encodes to the same bytes.
    if (auto r = decode_operations(b); r.ok()) {
      ++decoded;
      ASSERT_EQ(encode_ops(*r), b) << "iteration " << it;
    } else {
      ASSERT_EQ(r.error().code, ErrorCode::Decode);
    }
    if (auto g = decode_graph(b); g.ok()) {
      ++decoded;
      Bytes again;
      codec::encode_graph(*g, again);
      ASSERT_EQ(again, b) << "iteration " << it;
    }
    if (auto o = decode_operation(b); o.ok()) {
      ++decoded;
      Bytes again;
      codec::encode_operation(*o, again);
      ASSERT_EQ(again, b) << "iteration " << it;
    }
  }
  std::printf("codec byte-flip: %d iterations, %d mutated messages still decoded\n", iterations, decoded);
}

TEST(Codec, HugeClaimedCountsAreRejectedWithoutAllocating) {
  const std::uint64_t huge = std::uint64_t{1} << 60;
  auto no_alloc_error = [&](const Bytes& b, const std::string& needle) {
    const std::size_t before = g_allocated_bytes.load();
    auto r = decode_operations(b);
    const std::size_t used = g_allocated_bytes.load() - before;
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
    EXPECT_LT(used, 4096u) << "decoding a " << b.size() << "-byte message allocated " << used << " bytes";
  };
  {  // 2^60 operations.
    Bytes b = message(codec::MessageType::OperationList, {});
    append_varint(b, huge);
    b.resize(30, 0);
    no_alloc_error(b, "exceeds the limit");
  }
  {  // Within the cap but more than the bytes can hold.
    Bytes b = message(codec::MessageType::OperationList, {});
    append_varint(b, codec::kMaxOperations);
    b.resize(64, 0);
    no_alloc_error(b, "cannot fit in the");
  }
  {  // One op claiming 2^60 tensors, in a 30-byte message.
    Bytes b = message(codec::MessageType::OperationList, {1});
    append_varint(b, static_cast<std::uint64_t>(OpKind::Drop_Drop));
    b.insert(b.end(), {static_cast<std::uint8_t>(Family::Drop), 1 /* f32 */, 1 /* num_inputs */});
    append_varint(b, huge);
    b.resize(30, 0);
    no_alloc_error(b, "tensor count");
  }
  {  // Each other count in turn.
    for (const char* what : {"scalar count", "range count", "attribute count", "custom id length"}) {
      Bytes b = message(codec::MessageType::OperationList, {1});
      append_varint(b, static_cast<std::uint64_t>(OpKind::Custom_Custom));
      b.insert(b.end(), {static_cast<std::uint8_t>(Family::Custom), 1, 0, 0 /* tensors */});
      const std::string w = what;
      if (w != "scalar count") b.push_back(0);
      if (w == "attribute count" || w == "custom id length") b.push_back(0);
      if (w == "custom id length") b.push_back(0);
      append_varint(b, huge);
      b.resize(30, 0);
      no_alloc_error(b, what);
    }
  }
  {  // Graph boundary lists.
    Bytes b = message(codec::MessageType::Graph, {0});
    append_varint(b, huge);
    b.resize(30, 0);
    auto r = decode_graph(b);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("graph input"), std::string::npos) << r.error().message;
    Bytes c = message(codec::MessageType::Graph, {0});
    append_varint(c, 1000);
    c.resize(30, 0);
    auto rc = decode_graph(c);
    ASSERT_FALSE(rc.ok());
    EXPECT_NE(rc.error().message.find("cannot fit"), std::string::npos) << rc.error().message;
  }
}

TEST(Codec, DecodedMemoryIsProportionalToInput) {
  // Many minimal valid ops: what one hostile message can make the daemon hold.
  std::vector<Operation> ops(2000, make_op(OpKind::Distributed_SyncCollective, Family::Distributed));
  const Bytes b = encode_ops(ops);
  const std::size_t before = g_allocated_bytes.load();
  auto r = decode_operations(b);
  const std::size_t used = g_allocated_bytes.load() - before;
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  const double ratio = static_cast<double>(used) / static_cast<double>(b.size());
  std::printf("codec: %zu-byte message -> %zu bytes decoded (x%.0f, sizeof(Operation) = %zu)\n", b.size(), used, ratio,
              sizeof(Operation));
  EXPECT_LT(ratio, 200.0);
}

// Builds the fuzzer seed corpus; writes it when KILN_WRITE_CODEC_SEEDS names a directory.
TEST(Codec, SeedCorpus) {
  std::vector<std::pair<std::string, Bytes>> seeds;
  auto add_list = [&](const std::string& name, const std::vector<Operation>& ops) {
    seeds.emplace_back(name, encode_ops(ops));
  };
  {
    std::vector<Operation> prog;
    Operation init = make_op(OpKind::Init_Init, Family::Init, 1);
    Operation add = make_op(OpKind::Numeric_Add, Family::NumericFloat, 2);
    add.tensors[0].id = TensorId(1);
    Operation mul = make_op(OpKind::Numeric_MulScalar, Family::NumericFloat, 3);
    mul.tensors[0] = add.tensors[2];
    mul.tensors[0].status = TensorStatus::ReadWrite;
    mul.scalars = {ScalarIr::Float(-1.0)};
    Operation drop = make_op(OpKind::Drop_Drop, Family::Drop);
    drop.tensors[0] = mul.tensors[1];
    drop.tensors[0].status = TensorStatus::ReadWrite;
    prog = {init, add, mul, drop};
    add_list("list_small_program", prog);
  }
  add_list("list_every_kind", all_kinds_program());
  add_list("list_edge_values", feature_program());
  add_list("list_empty", {});
  {
    Bytes g;
    codec::encode_graph(small_graph(), g);
    seeds.emplace_back("graph_small", g);
    Bytes e;
    codec::encode_graph(GraphIr{}, e);
    seeds.emplace_back("graph_empty", e);
  }
  {
    Bytes o;
    codec::encode_operation(custom_with_edge_scalars(), o);
    seeds.emplace_back("op_custom_edge_scalars", o);
    Bytes s;
    codec::encode_operation(make_op(OpKind::Base_SliceAssign, Family::BaseInt), s);
    seeds.emplace_back("op_slice_assign", s);
  }
  for (const auto& [name, bytes] : seeds) {
    auto h = codec::decode_header(bytes);
    ASSERT_TRUE(h.ok()) << name;
    const bool ok = h->type == codec::MessageType::Graph       ? decode_graph(bytes).ok()
                    : h->type == codec::MessageType::Operation ? decode_operation(bytes).ok()
                                                               : decode_operations(bytes).ok();
    EXPECT_TRUE(ok) << name;
  }
  const char* dir = std::getenv("KILN_WRITE_CODEC_SEEDS");
  if (dir == nullptr) return;
  for (const auto& [name, bytes] : seeds) {
    const std::string path = std::string(dir) + "/" + name;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(f.good()) << path;
    std::printf("wrote %s (%zu bytes)\n", path.c_str(), bytes.size());
  }
}

}  // namespace
}  // namespace kiln::ir

// Transfers larger than the arena (protocol.h, "Chunked transfers"): a daemon whose clients get
// a 1 MiB arena, tensors of ~2.5 MiB of odd sizes moved through it in parts and read back bit
// for bit; a last-use read that consumes its tensor only after the final window; parts that are
// malformed, out of order or mismatched get error completions and the daemon stays up; staged
// bytes count against the job's memory quota and are released when the client goes.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "kiln/cpu/cpu_backend.h"
#include "kiln/ipc/control_client.h"
#include "kiln/ipc/daemon.h"
#include "kiln/ipc/protocol.h"
#include "kiln/ipc/remote_target.h"
#include "kiln/runtime/session.h"
#include "kiln/testing/status.h"

namespace kiln::ipc {
namespace {

using ir::DType;
using ir::Shape;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;
using runtime::Session;
using runtime::StreamId;
using runtime::Tensor;
namespace dtypes = ir::dtypes;
using namespace std::chrono_literals;

constexpr std::uint64_t kArena = std::uint64_t{1} << 20;
constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

using ::kiln::testing::ok;

bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 20s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return done();
}

std::vector<std::uint8_t> random_bytes(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(rng());
  return b;
}

// A daemon on the CPU backend whose clients get a 1 MiB arena.
struct SmallArenaDaemon {
  std::unique_ptr<runtime::Device> device;
  std::string dir;
  std::unique_ptr<DaemonService> service;

  explicit SmallArenaDaemon(std::uint64_t job_memory_bytes = 0,
                            std::function<void(const Command&)> before_command = {}) {
    runtime::RuntimeOptions o;
    o.threads = 2;
    o.fusion = fusion::FusionConfig{};
    o.config_path = "";
    device = ok(runtime::Device::create(
        std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{.threads = 1, .jit = cpu::CpuJitMode::Off}),
        std::move(o)));
    char tmpl[] = "/tmp/kiln-chunk-test-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    dir = tmpl;
    DaemonOptions d;
    d.server.runtime_dir = dir;
    d.server.socket_name = "kilnd-test.sock";
    d.server.segment.arena_bytes = kArena;
    d.job_memory_bytes = job_memory_bytes;
    d.before_command = std::move(before_command);
    service = ok(DaemonService::start(*device, d));
  }
  ~SmallArenaDaemon() {
    if (service) service->stop();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  std::unique_ptr<RemoteTarget> connect(const std::string& job = "test") {
    RemoteOptions r;
    r.runtime_dir = dir;
    r.socket_name = "kilnd-test.sock";
    r.job = job;
    r.reply_timeout = 30s;  // a lost completion fails the test instead of hanging it
    return ok(RemoteTarget::connect(r));
  }
  std::uint64_t job_bytes(const std::string& job) const {
    for (const JobStatus& j : service->status().jobs)
      if (j.name == job) return j.tensor_bytes;
    return 0;
  }
  std::uint64_t device_tensors() const { return device->backend().memory_stats().tensors; }
};

// A raw connection: hand-made commands, completions read one by one.
struct RawClient {
  ClientConnection conn;
  std::vector<std::uint8_t> buf;
  ArenaView arena;

  explicit RawClient(ClientConnection c)
      : conn(std::move(c)), buf(conn.endpoint().max_receive_bytes()), arena(conn.endpoint().arena()) {}

  void send(const Command& c) {
    std::vector<std::uint8_t> msg;
    KILN_ASSERT_OK(encode_command(c, msg));
    KILN_ASSERT_OK(conn.endpoint().send(msg, 10s));
  }
  void send_bytes(const std::vector<std::uint8_t>& msg) { KILN_ASSERT_OK(conn.endpoint().send(msg, 10s)); }
  Completion receive() {
    auto got = conn.endpoint().receive(buf, 20s);
    EXPECT_TRUE(got.ok() && got->has_value());
    if (!got.ok() || !got->has_value()) return Completion{};
    return ok(decode_completion(std::span<const std::uint8_t>(buf.data(), **got), conn.endpoint().layout().arena_size));
  }
  void expect_ok(std::uint64_t request) {
    Completion c = receive();
    EXPECT_EQ(c.request_id, request);
    const auto* e = std::get_if<ErrorCpl>(&c.body);
    EXPECT_TRUE(std::holds_alternative<OkCpl>(c.body)) << "request " << request << ": " << (e ? e->message : "not ok");
  }
  std::string expect_error(std::uint64_t request) {
    Completion c = receive();
    EXPECT_EQ(c.request_id, request);
    const auto* e = std::get_if<ErrorCpl>(&c.body);
    EXPECT_NE(e, nullptr) << "request " << request << ": expected an error completion, got "
                          << completion_kind_name(c.kind());
    return e ? e->message : "";
  }
  // Writes `bytes` at arena offset `at` and sends them as the part at `offset` of tensor `id`.
  void part(std::uint64_t rid, std::uint64_t id, DType dtype, const Shape& shape, std::uint64_t offset,
            std::span<const std::uint8_t> bytes, std::uint64_t at = 0) {
    KILN_ASSERT_OK(arena.write(ArenaRange{at, bytes.size()}, bytes));
    send(Command{rid, UploadPartCmd{0, TensorId(id), dtype, shape, offset, ArenaRange{at, bytes.size()}}});
  }
};

RawClient raw_client(SmallArenaDaemon& d, const std::string& job = "test") {
  ClientOptions o;
  o.runtime_dir = d.dir;
  o.socket_name = "kilnd-test.sock";
  o.job = job;
  return RawClient(ok(connect_to_daemon(o)));
}

TEST(ChunkedTransfer, TensorsLargerThanTheArenaRoundTripBitForBit) {
  SmallArenaDaemon d;
  auto client = d.connect();
  Session s(*client);
  // f32: 655,363 elements (2.5 MiB + 12 bytes), every bit pattern kept (NaN payloads included).
  const std::vector<std::uint8_t> fbits = random_bytes(655'363 * 4, 1);
  std::vector<float> f(655'363);
  std::memcpy(f.data(), fbits.data(), fbits.size());
  Tensor tf = ok(s.from_host(f, {655'363}));
  std::vector<float> fback = ok(s.to_host(tf));  // read-only: tf stays usable
  ASSERT_EQ(fback.size(), f.size());
  EXPECT_EQ(std::memcmp(fback.data(), f.data(), fbits.size()), 0);
  // Again, as the tensor's last use.
  fback = ok(s.to_host(std::move(tf)));
  EXPECT_EQ(std::memcmp(fback.data(), f.data(), fbits.size()), 0);

  // f64 in 2-D, 327,681 elements (2.5 MiB + 8 bytes), through an op so that the read waits.
  std::vector<double> g(3 * 109'227);
  std::mt19937_64 rng(2);
  for (double& x : g) x = std::ldexp(static_cast<double>(rng() >> 11), -40) - 4096.0;
  Tensor tg = ok(s.from_host(g, {3, 109'227}));
  std::vector<double> gback = ok(s.to_host<double>(ok(s.mul(std::move(tg), 2.0))));
  ASSERT_EQ(gback.size(), g.size());
  for (std::size_t i = 0; i < g.size(); ++i) ASSERT_EQ(gback[i], g[i] * 2.0) << i;

  // u8 through the target itself: 2.5 MiB + 7 bytes, a size no part divides.
  const std::vector<std::uint8_t> u = random_bytes(2 * kMiB + kMiB / 2 + 7, 3);
  const TensorId id = client->new_tensor_id();
  const std::uint64_t requests = client->requests();
  ASSERT_TRUE(
      client->upload(StreamId(0), id, dtypes::u8, {u.size()}, std::as_bytes(std::span<const std::uint8_t>(u))).ok());
  EXPECT_EQ(client->requests() - requests, 11u);  // parts of a quarter of the arena: 10 full ones and 7 bytes
  runtime::HostData back = ok(client->read(StreamId(0), TensorIr{id, {u.size()}, TensorStatus::ReadWrite, dtypes::u8}));
  EXPECT_EQ(client->requests() - requests, 22u);
  ASSERT_EQ(back.bytes.size(), u.size());
  EXPECT_EQ(std::memcmp(back.bytes.data(), u.data(), u.size()), 0);
  EXPECT_TRUE(back.dtype == dtypes::u8);
  EXPECT_EQ(back.shape, (Shape{u.size()}));

  // read_into: straight into the caller's buffer, which must have exactly the tensor's bytes;
  // the same contract for the daemon's client and for a Device (the default implementation).
  for (runtime::SessionTarget* target :
       {static_cast<runtime::SessionTarget*>(client.get()), static_cast<runtime::SessionTarget*>(d.device.get())}) {
    for (std::uint64_t n : {std::uint64_t{1000}, kArena + 3}) {  // one piece, and chunked over IPC
      const std::vector<std::uint8_t> v = random_bytes(n, n + 1);
      const TensorId t = target->new_tensor_id();
      ASSERT_TRUE(
          target->upload(StreamId(0), t, dtypes::u8, {n}, std::as_bytes(std::span<const std::uint8_t>(v))).ok());
      // Refused before anything is read: even a last-use read leaves the tensor in place.
      const TensorIr last{t, {n}, TensorStatus::ReadWrite, dtypes::u8};
      std::vector<std::byte> wrong(n - 1), right(n);
      const Status refused = target->read_into(StreamId(0), last, wrong);
      ASSERT_FALSE(refused.ok());
      EXPECT_EQ(refused.error().code, ErrorCode::Invalid);
      EXPECT_NE(refused.error().message.find("into a buffer of " + std::to_string(n - 1)), std::string::npos)
          << refused.error().message;
      KILN_ASSERT_OK(target->read_into(StreamId(0), last, right));
      EXPECT_EQ(std::memcmp(right.data(), v.data(), n), 0) << n;
    }
  }

  // An upload that exactly fills the arena still goes in one piece; one byte more is chunked.
  for (std::uint64_t n : {kArena, kArena + 1}) {
    const std::vector<std::uint8_t> v = random_bytes(n, n);
    const TensorId t = client->new_tensor_id();
    ASSERT_TRUE(client->upload(StreamId(0), t, dtypes::u8, {n}, std::as_bytes(std::span<const std::uint8_t>(v))).ok())
        << n;
    runtime::HostData r = ok(client->read(StreamId(0), TensorIr{t, {n}, TensorStatus::ReadWrite, dtypes::u8}));
    EXPECT_EQ(r.bytes.size(), n);
    EXPECT_EQ(std::memcmp(r.bytes.data(), v.data(), n), 0) << n;
  }
  // Nothing staged is left behind: the job holds no bytes once its tensors are consumed.
  KILN_ASSERT_OK(client->drain(StreamId(0)));
  EXPECT_EQ(d.job_bytes("test"), 0u);
}

TEST(ChunkedTransfer, ThreadsShareOneConnectionAndItsArena) {
  SmallArenaDaemon d;
  auto client = d.connect();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < 3; ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 4 && failures.load() == 0; ++k) {
        // Big (chunked) and small (one piece) transfers interleaved across threads.
        const std::size_t n =
            (k % 2 == 0) ? 2 * kMiB + 333 * static_cast<std::size_t>(i + 1) : 4096 + static_cast<std::size_t>(i);
        const std::vector<std::uint8_t> v =
            random_bytes(n, 100 * static_cast<std::uint64_t>(i) + static_cast<std::uint64_t>(k));
        const TensorId id = client->new_tensor_id();
        Status up = client->upload(StreamId(0), id, dtypes::u8, {n}, std::as_bytes(std::span<const std::uint8_t>(v)));
        Result<runtime::HostData> r =
            up.ok() ? client->read(StreamId(0), TensorIr{id, {n}, TensorStatus::ReadWrite, dtypes::u8})
                    : Result<runtime::HostData>(up.error());
        if (!r.ok() || r->bytes.size() != n || std::memcmp(r->bytes.data(), v.data(), n) != 0) {
          ADD_FAILURE() << "thread " << i << " transfer " << k << ": "
                        << (r.ok() ? "bytes differ" : r.error().to_string());
          failures.fetch_add(1);
        }
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// A last use read in windows: the tensor stays live (on the device and in the client's table)
// until the final window has been copied out, then it is consumed.
TEST(ChunkedTransfer, LastUseReadConsumesTheTensorAtItsFirstWindow) {
  SmallArenaDaemon d;
  RawClient c = raw_client(d);
  const std::uint64_t baseline = d.device_tensors();
  const std::uint64_t n = kArena + kArena / 2 + 5;  // 3 windows of 600,000 bytes, the last one short
  const std::vector<std::uint8_t> v = random_bytes(n, 7);
  const Shape shape{n};
  const std::uint64_t part = 600'000;
  std::uint64_t rid = 1;
  for (std::uint64_t off = 0; off < n; off += part) {
    const std::uint64_t len = std::min(part, n - off);
    c.part(rid, 5, dtypes::u8, shape, off, std::span(v).subspan(off, len));
    c.expect_ok(rid++);
  }
  EXPECT_EQ(d.device_tensors(), baseline + 1);
  EXPECT_EQ(d.job_bytes("test"), n);
  const TensorIr last_use{TensorId(5), shape, TensorStatus::ReadWrite, dtypes::u8};
  std::vector<std::uint8_t> back(n);
  for (std::uint64_t off = 0; off < n; off += part) {
    const std::uint64_t len = std::min(part, n - off);
    c.send(Command{rid, ReadPartCmd{0, last_use, off, ArenaRange{64, part}}});
    Completion done = c.receive();
    ASSERT_EQ(done.request_id, rid++);
    const auto* w = std::get_if<ReadPartDoneCpl>(&done.body);
    ASSERT_NE(w, nullptr) << (std::holds_alternative<ErrorCpl>(done.body) ? std::get<ErrorCpl>(done.body).message : "");
    EXPECT_EQ(w->offset, off);
    EXPECT_EQ(w->data, (ArenaRange{64, len}));
    KILN_ASSERT_OK(c.arena.read(w->data, std::span(back).subspan(off, len)));
    if (off + len < n) {
      // Consumed at the first window: gone from the client's table (the session publishes its
      // counts after sending the completion, hence the wait); the snapshot holds the bytes and
      // the charge until the transfer ends.
      EXPECT_TRUE(wait_until([&] {
        const DaemonStatus st = d.service->status();
        return st.clients.size() == 1 && st.clients[0].tensors == 0;
      })) << "after the window at "
          << off;
      EXPECT_EQ(d.job_bytes("test"), n);
    }
  }
  EXPECT_EQ(back, v);
  // Transfer over: the snapshot's charge released, the tensor dropped on the device.
  EXPECT_EQ(d.job_bytes("test"), 0u);
  c.send(Command{rid, ReadPartCmd{0, last_use, 0, ArenaRange{64, part}}});
  EXPECT_NE(c.expect_error(rid++).find("not one of this client's live tensors"), std::string::npos);
  c.send(Command{rid, SyncCmd{0}});
  c.expect_ok(rid++);
  EXPECT_TRUE(wait_until([&] { return d.device_tensors() == baseline; }));

  // A read-only chunked read leaves the tensor; a restarted read (offset 0 again) is allowed.
  c.part(rid, 6, dtypes::u8, Shape{1000}, 0, std::span(v).first(1000));
  c.expect_ok(rid++);
  const TensorIr ro{TensorId(6), Shape{1000}, TensorStatus::ReadOnly, dtypes::u8};
  for (int round = 0; round < 2; ++round) {
    c.send(Command{rid, ReadPartCmd{0, ro, 0, ArenaRange{0, 400}}});
    ASSERT_TRUE(std::holds_alternative<ReadPartDoneCpl>(c.receive().body));
    ++rid;
  }
  c.send(Command{rid, ReadPartCmd{0, ro, 400, ArenaRange{0, 4096}}});  // a window larger than the rest
  Completion rest = c.receive();
  ASSERT_TRUE(std::holds_alternative<ReadPartDoneCpl>(rest.body));
  EXPECT_EQ(std::get<ReadPartDoneCpl>(rest.body).data, (ArenaRange{0, 600}));
  ++rid;
  EXPECT_EQ(d.service->status().clients[0].tensors, 1u);

  // Abandoned transfers leave nothing charged behind. A last-use read given up after one window
  // (its tensor is consumed, its snapshot charged) ends when the next chunked read starts.
  c.part(rid, 7, dtypes::u8, Shape{2000}, 0, std::span(v).first(2000));
  c.expect_ok(rid++);
  EXPECT_EQ(d.job_bytes("test"), 3000u);
  c.send(Command{rid++, ReadPartCmd{0, TensorIr{TensorId(7), Shape{2000}, TensorStatus::ReadWrite, dtypes::u8}, 0,
                                    ArenaRange{0, 500}}});
  ASSERT_TRUE(std::holds_alternative<ReadPartDoneCpl>(c.receive().body));
  EXPECT_EQ(d.job_bytes("test"), 3000u);  // tensor 7's charge moved to the snapshot
  c.send(Command{rid++, ReadPartCmd{0, ro, 0, ArenaRange{0, 400}}});
  ASSERT_TRUE(std::holds_alternative<ReadPartDoneCpl>(c.receive().body));
  EXPECT_EQ(d.job_bytes("test"), 1000u);  // only tensor 6 (its read-only snapshot is not charged)
  // A read-only snapshot goes with its tensor: after the drop, the transfer cannot go on.
  c.send(Command{rid++, DropCmd{0, TensorIr{TensorId(6), Shape{1000}, TensorStatus::ReadWrite, dtypes::u8}}});
  c.send(Command{rid, ReadPartCmd{0, ro, 400, ArenaRange{0, 600}}});
  EXPECT_NE(c.expect_error(rid++).find("no read of tensor 6 is in progress"), std::string::npos);
  EXPECT_EQ(d.job_bytes("test"), 0u);
}

TEST(ChunkedTransfer, MalformedOutOfOrderAndMismatchedPartsAreErrors) {
  SmallArenaDaemon d;
  RawClient c = raw_client(d);
  const std::vector<std::uint8_t> v = random_bytes(4000, 9);
  const Shape shape{1000};  // f32: 4000 bytes
  const auto bytes = [&](std::uint64_t off, std::uint64_t len) { return std::span(v).subspan(off, len); };

  // 1. A part that does not start an upload.
  c.part(1, 1, dtypes::f32, shape, 1000, bytes(1000, 1000));
  std::string e = c.expect_error(1);
  EXPECT_NE(e.find("upload_part: offset: 1000, but no upload of tensor 1 is in progress"), std::string::npos) << e;
  // 2. Out of order: a gap, then the staging is gone (the right offset is refused as well).
  c.part(2, 1, dtypes::f32, shape, 0, bytes(0, 1000));
  c.expect_ok(2);
  EXPECT_EQ(d.job_bytes("test"), 4000u);  // the whole tensor is charged from the first part
  c.part(3, 1, dtypes::f32, shape, 2000, bytes(2000, 1000));
  e = c.expect_error(3);
  EXPECT_NE(e.find("offset: 2000, expected 1000"), std::string::npos) << e;
  EXPECT_NE(e.find("discarded"), std::string::npos) << e;
  EXPECT_EQ(d.job_bytes("test"), 0u);
  c.part(4, 1, dtypes::f32, shape, 1000, bytes(1000, 1000));
  EXPECT_NE(c.expect_error(4).find("no upload of tensor 1 is in progress"), std::string::npos);
  // A repeated part (offset behind) is out of order too.
  c.part(5, 1, dtypes::f32, shape, 0, bytes(0, 1000));
  c.expect_ok(5);
  c.part(6, 1, dtypes::f32, shape, 0, bytes(0, 1000));
  EXPECT_NE(c.expect_error(6).find("offset: 0, expected 1000"), std::string::npos);
  // 3. A part whose dtype or shape differs from the first part's.
  c.part(7, 1, dtypes::f32, shape, 0, bytes(0, 1000));
  c.expect_ok(7);
  c.part(8, 1, dtypes::i32, shape, 1000, bytes(1000, 1000));
  e = c.expect_error(8);
  EXPECT_NE(e.find("shape: tensor 1 is being uploaded as f32[1000], this part says i32[1000]"), std::string::npos) << e;
  EXPECT_EQ(d.job_bytes("test"), 0u);
  // 4. Decoder-level: an empty part, a part past the end, a range outside the arena.
  c.part(9, 1, dtypes::f32, shape, 0, bytes(0, 0));
  EXPECT_NE(c.expect_error(9).find("upload_part.data: length 0"), std::string::npos);
  c.part(10, 1, dtypes::f32, shape, 3500, bytes(0, 1000));
  EXPECT_NE(c.expect_error(10).find(
                "upload_part.data: length 1000 at offset 3500 runs past the end of f32[1000] (4000 bytes)"),
            std::string::npos);
  c.part(11, 1, dtypes::f32, shape, 4000, bytes(0, 1));
  EXPECT_NE(c.expect_error(11).find("upload_part.offset: 4000 is not inside f32[1000]"), std::string::npos);
  c.send(Command{12, UploadPartCmd{0, TensorId(1), dtypes::f32, shape, 0, ArenaRange{kArena - 10, 20}}});
  EXPECT_NE(c.expect_error(12).find("outside the arena"), std::string::npos);
  // A truncated part: answered by its request id.
  std::vector<std::uint8_t> cut;
  KILN_ASSERT_OK(
      encode_command(Command{13, UploadPartCmd{0, TensorId(1), dtypes::f32, shape, 0, ArenaRange{0, 8}}}, cut));
  cut.resize(cut.size() - 3);
  c.send_bytes(cut);
  EXPECT_NE(c.expect_error(13).find("body_len"), std::string::npos);
  // 5. An id in use, and one taken while its parts were on the way.
  c.send(Command{14, UploadCmd{0, TensorId(2), dtypes::f32, Shape{2}, ArenaRange{0, 8}}});
  c.expect_ok(14);
  c.part(15, 2, dtypes::f32, shape, 0, bytes(0, 1000));
  EXPECT_NE(c.expect_error(15).find("tensor id 2 is already in use"), std::string::npos);
  c.part(16, 3, dtypes::f32, shape, 0, bytes(0, 3000));
  c.expect_ok(16);
  c.send(Command{17, UploadCmd{0, TensorId(3), dtypes::f32, Shape{2}, ArenaRange{0, 8}}});
  c.expect_ok(17);
  c.part(18, 3, dtypes::f32, shape, 3000, bytes(3000, 1000));
  EXPECT_NE(c.expect_error(18).find("tensor id 3 is already in use"), std::string::npos);
  EXPECT_EQ(d.job_bytes("test"), 16u);  // the two 8-byte tensors, nothing staged
  // 6. One chunked upload at a time per connection: a new one discards an unfinished one (the
  //    client library never interleaves them, so that one was abandoned), and its charge.
  const std::uint64_t before = d.job_bytes("test");
  c.part(20, 100, dtypes::f32, shape, 0, bytes(0, 4));
  c.expect_ok(20);
  EXPECT_EQ(d.job_bytes("test"), before + 4000);
  c.part(21, 101, dtypes::f32, shape, 0, bytes(0, 4));
  c.expect_ok(21);
  EXPECT_EQ(d.job_bytes("test"), before + 4000);  // 100's staging released
  c.part(22, 100, dtypes::f32, shape, 4, bytes(4, 4));
  EXPECT_NE(c.expect_error(22).find("no upload of tensor 100 is in progress"), std::string::npos);
  // 7. Windows: none in progress, of an unknown tensor, out of order, a status flip, and
  // decoder-level bounds.
  const TensorIr t2{TensorId(2), Shape{2}, TensorStatus::ReadOnly, dtypes::f32};
  c.send(Command{31, ReadPartCmd{0, t2, 4, ArenaRange{0, 64}}});
  EXPECT_NE(c.expect_error(31).find("read_part: offset: 4, but no read of tensor 2 is in progress"), std::string::npos);
  c.send(Command{
      32, ReadPartCmd{0, TensorIr{TensorId(99), Shape{2}, TensorStatus::ReadOnly, dtypes::f32}, 0, ArenaRange{0, 64}}});
  EXPECT_NE(c.expect_error(32).find("not one of this client's live tensors"), std::string::npos);
  c.send(Command{33, ReadPartCmd{0, t2, 0, ArenaRange{0, 4}}});
  ASSERT_TRUE(std::holds_alternative<ReadPartDoneCpl>(c.receive().body));
  c.send(Command{34, ReadPartCmd{0, t2, 0 + 2, ArenaRange{0, 4}}});
  EXPECT_NE(c.expect_error(34).find("offset: 2, expected 4"), std::string::npos);
  c.send(Command{35, ReadPartCmd{0, t2, 0, ArenaRange{0, 4}}});
  ASSERT_TRUE(std::holds_alternative<ReadPartDoneCpl>(c.receive().body));
  c.send(Command{
      36, ReadPartCmd{0, TensorIr{TensorId(2), Shape{2}, TensorStatus::ReadWrite, dtypes::f32}, 4, ArenaRange{0, 4}}});
  EXPECT_NE(c.expect_error(36).find("tensor.status: the read of tensor 2 began as ReadOnly"), std::string::npos);
  c.send(Command{
      37, ReadPartCmd{0, TensorIr{TensorId(3), Shape{3}, TensorStatus::ReadOnly, dtypes::f32}, 0, ArenaRange{0, 64}}});
  EXPECT_NE(c.expect_error(37).find("on record"), std::string::npos);
  c.send(Command{
      38, ReadPartCmd{0, TensorIr{TensorId(3), Shape{2}, TensorStatus::ReadOnly, dtypes::f32}, 8, ArenaRange{0, 64}}});
  EXPECT_NE(c.expect_error(38).find("read_part.offset: 8 is not inside f32[2] (8 bytes)"), std::string::npos);
  c.send(Command{
      39, ReadPartCmd{0, TensorIr{TensorId(3), Shape{2}, TensorStatus::ReadOnly, dtypes::f32}, 0, ArenaRange{0, 0}}});
  EXPECT_NE(c.expect_error(39).find("read_part.dest: capacity 0"), std::string::npos);

  c.part(60, 101, dtypes::f32, shape, 0, bytes(0, 4));  // discarded by an out-of-order part
  EXPECT_NE(c.expect_error(60).find("discarded"), std::string::npos);
  EXPECT_EQ(d.job_bytes("test"), before);
  // The daemon is still up and serves this client: a whole chunked upload and read work.
  c.send(Command{40, SyncCmd{0}});
  c.expect_ok(40);
  for (std::uint64_t off = 0; off < 4000; off += 1500) {
    c.part(41 + off, 50, dtypes::f32, shape, off, bytes(off, std::min<std::uint64_t>(1500, 4000 - off)));
    c.expect_ok(41 + off);
  }
  std::vector<std::uint8_t> back(4000);
  const TensorIr t50{TensorId(50), shape, TensorStatus::ReadOnly, dtypes::f32};
  for (std::uint64_t off = 0; off < 4000; off += 2500) {
    c.send(Command{9000 + off, ReadPartCmd{0, t50, off, ArenaRange{128, 2500}}});
    Completion w = c.receive();
    ASSERT_TRUE(std::holds_alternative<ReadPartDoneCpl>(w.body));
    const auto& done = std::get<ReadPartDoneCpl>(w.body);
    KILN_ASSERT_OK(c.arena.read(done.data, std::span(back).subspan(off, done.data.length)));
  }
  EXPECT_EQ(back, v);
}

// Without a quota, a staging larger than this machine's memory (1 TiB, or 2^38 bytes: more than
// any CI or development machine here has) is refused before anything is allocated (under a
// sanitizer the allocator used to abort the daemon first); the session goes on.
TEST(ChunkedTransfer, AStagingLargerThanTheMachineIsRefusedBeforeAllocating) {
  SmallArenaDaemon d(0);
  const std::vector<std::uint8_t> chunk = random_bytes(4096, 13);
  RawClient c = raw_client(d, "huge");
  std::uint64_t rid = 1, id = 1;
  for (std::uint64_t bytes : {std::uint64_t{1} << 40, std::uint64_t{1} << 38}) {
    c.part(rid, id++, dtypes::u8, Shape{bytes}, 0, chunk);
    const std::string e = c.expect_error(rid++);
    EXPECT_NE(e.find("exceeds the largest chunked upload this machine can stage"), std::string::npos) << e;
    EXPECT_EQ(d.job_bytes("huge"), 0u);
  }
  c.part(rid, id, dtypes::u8, Shape{2 * kMiB}, 0, chunk);
  c.expect_ok(rid);
  EXPECT_EQ(d.job_bytes("huge"), 2 * kMiB);
}

// A read whose answer comes after the client gave up: the daemon still writes the result into
// the read's arena range, so the client keeps that range allocated (nothing else is placed in
// it) until the late answer arrives, then frees it.
TEST(ChunkedTransfer, ATimedOutReadKeepsItsArenaRangeUntilTheLateAnswer) {
  // The daemon holds every read until the test opens the gate: the client's 1 ms timeout passes
  // for sure, in a fast build as in a slow one (the answer used to race the clock).
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  bool gate_open = false;
  auto open_gate = [&] {
    if (!gate_open) gate.set_value();
    gate_open = true;
  };
  SmallArenaDaemon d(0, [opened](const Command& c) {
    if (std::holds_alternative<ReadCmd>(c.body)) opened.wait();
  });
  struct OpenAtExit {  // a failed assertion must not leave the daemon's session thread held
    std::function<void()> open;
    ~OpenAtExit() { open(); }
  } open_at_exit{open_gate};
  auto client = d.connect("slow");
  runtime::Session s(*client);
  const std::uint64_t n = 64;
  const std::vector<float> v(n * n, 0.5f);
  runtime::Tensor a = ok(s.from_host(std::span<const float>(v), {n, n}));
  runtime::Tensor b = ok(s.from_host(std::span<const float>(v), {n, n}));
  runtime::Tensor total = ok(s.sum(ok(s.matmul(a, b))));
  client->set_reply_timeout(1ms);
  Result<std::vector<float>> early = s.to_host(total);  // a copy: the tensor stays
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.error().message.find("no answer from the daemon within 1 ms"), std::string::npos)
      << early.error().message;
  EXPECT_GT(client->quarantined_bytes(), 0u);
  open_gate();
  client->set_reply_timeout(30s);
  // Any later answered request pops the late one, which frees the range.
  KILN_ASSERT_OK(client->daemon_status(false));
  EXPECT_TRUE(wait_until([&] { return client->quarantined_bytes() == 0 || !client->daemon_status(false).ok(); }));
  EXPECT_EQ(client->quarantined_bytes(), 0u);
  const std::vector<float> got = ok(s.to_host(std::move(total)));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NEAR(got[0], 0.25 * n * n * n, 1e-3 * 0.25 * n * n * n);
}

TEST(ChunkedTransfer, StagedBytesCountAgainstTheJobQuota) {
  SmallArenaDaemon d(3 * kMiB);
  const Shape two_mib{2 * kMiB};
  const std::vector<std::uint8_t> chunk = random_bytes(4096, 11);
  {
    RawClient c = raw_client(d, "q");
    RawClient other = raw_client(d, "q");  // keeps the job alive while `c` comes and goes
    c.part(1, 1, dtypes::u8, two_mib, 0, chunk);
    c.expect_ok(1);
    EXPECT_EQ(d.job_bytes("q"), 2 * kMiB);  // charged in full at the first part
    // A second staging (another connection of the job: one connection stages one upload at a
    // time) would pass the quota: refused before anything is allocated.
    other.part(1, 2, dtypes::u8, two_mib, 0, chunk);
    std::string e = other.expect_error(1);
    EXPECT_NE(e.find("staging tensor 2: job 'q' memory quota of 3.0 MiB exceeded"), std::string::npos) << e;
    // A mismatching part discards the staging and releases its charge.
    c.part(3, 1, dtypes::u8, two_mib, 1, chunk);
    EXPECT_NE(c.expect_error(3).find("expected 4096"), std::string::npos);
    EXPECT_EQ(d.job_bytes("q"), 0u);
    // Staged again, then the client goes in the middle: released when it disconnects.
    c.part(4, 1, dtypes::u8, two_mib, 0, chunk);
    c.expect_ok(4);
    EXPECT_EQ(d.job_bytes("q"), 2 * kMiB);
    { RawClient gone = std::move(c); }
    EXPECT_TRUE(wait_until([&] { return d.job_bytes("q") == 0; })) << d.job_bytes("q");
    other.part(2, 1, dtypes::u8, two_mib, 0, chunk);
    other.expect_ok(2);
  }
  // Through the client library: over the quota is a clear error, under it works.
  auto client = d.connect("lib");
  const std::vector<std::uint8_t> big = random_bytes(3 * kMiB + 1, 12);
  Status refused = client->upload(StreamId(0), client->new_tensor_id(), dtypes::u8, {big.size()},
                                  std::as_bytes(std::span<const std::uint8_t>(big)));
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::ResourceExhausted);
  EXPECT_NE(refused.error().message.find("upload_part: staging tensor"), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find("memory quota"), std::string::npos) << refused.error().message;
  EXPECT_EQ(d.job_bytes("lib"), 0u);
  const TensorId id = client->new_tensor_id();
  const std::span<const std::uint8_t> fits(big.data(), 2 * kMiB + 3);
  KILN_ASSERT_OK(client->upload(StreamId(0), id, dtypes::u8, {fits.size()}, std::as_bytes(fits)));
  EXPECT_EQ(d.job_bytes("lib"), fits.size());
  runtime::HostData r = ok(client->read(StreamId(0), TensorIr{id, {fits.size()}, TensorStatus::ReadWrite, dtypes::u8}));
  EXPECT_EQ(std::memcmp(r.bytes.data(), fits.data(), fits.size()), 0);
  EXPECT_EQ(d.job_bytes("lib"), 0u);
}

}  // namespace
}  // namespace kiln::ipc

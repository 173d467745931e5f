// The daemon service end to end, in one process: clients over real sockets and segments, a
// Device on the fast CPU backend. Plans shared between clients, namespaces, hostile messages,
// export/import, quotas, cleanup when a client goes, status.
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "../runtime/ipc_harness.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/ipc/control_client.h"
#include "kiln/ipc/protocol.h"
#include "kiln/ipc/unix_socket.h"
#include "kiln/ir/builders.h"
#include "kiln/runtime/session.h"
#include "kiln/testing/status.h"
#include "peer_user.h"

namespace kiln::ipc {
namespace {

using kiln::testing::ok;
using kiln::testing::wait_until;

using ir::DType;
using ir::Shape;
using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;
using runtime::Session;
using runtime::StreamId;
using runtime::Tensor;
namespace dtypes = ir::dtypes;

std::unique_ptr<runtime::Device> make_device() {
  runtime::RuntimeOptions o;
  o.threads = 2;
  o.fusion = fusion::FusionConfig{};
  o.config_path = "";
  auto d = runtime::Device::create(
      std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{.threads = 1, .jit = cpu::CpuJitMode::Off}),
      std::move(o));
  KILN_EXPECT_OK(d);
  return std::move(d).value();
}

// A chain of six elementwise ops and a read: one fused plan.
std::vector<float> program(Session& s, const std::vector<float>& x) {
  Tensor a = ok(s.from_host(x, {static_cast<std::uint64_t>(x.size())}));
  Tensor y = ok(s.exp(ok(s.mul(ok(s.add(ok(s.mul(a, 0.5)), 1.0)), a))));
  y = ok(s.sub(ok(s.tanh(std::move(y))), 0.25));
  return ok(s.to_host(std::move(y)));
}

// A raw connection: sends hand-made messages and reads the completions.
struct RawClient {
  ClientConnection conn;
  std::vector<std::uint8_t> buf;

  explicit RawClient(ClientConnection c) : conn(std::move(c)), buf(conn.endpoint().max_receive_bytes()) {}

  void send_bytes(const std::vector<std::uint8_t>& msg) {
    KILN_ASSERT_OK(conn.endpoint().send(msg, std::chrono::seconds(10)));
  }
  void send(const Command& c) {
    std::vector<std::uint8_t> msg;
    KILN_ASSERT_OK(encode_command(c, msg));
    send_bytes(msg);
  }
  Completion receive() {
    auto got = conn.endpoint().receive(buf, std::chrono::seconds(20));
    EXPECT_TRUE(got.ok() && got->has_value());
    if (!got.ok() || !got->has_value()) return Completion{};
    return ok(decode_completion(std::span<const std::uint8_t>(buf.data(), **got), conn.endpoint().layout().arena_size));
  }
  std::string expect_error(std::uint64_t request) {
    Completion c = receive();
    EXPECT_EQ(c.request_id, request);
    const auto* e = std::get_if<ErrorCpl>(&c.body);
    EXPECT_NE(e, nullptr) << "expected an error completion, got " << completion_kind_name(c.kind());
    return e ? e->message : "";
  }
};

RawClient raw_client(kiln::testing::IpcHarness& h, const std::string& job = "test") {
  ClientOptions o;
  o.runtime_dir = h.dir();
  o.socket_name = "kilnd-test.sock";
  o.job = job;
  return RawClient(ok(connect_to_daemon(o)));
}

TEST(Daemon, PlansFoundByOneClientAreCacheHitsForTheNext) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev);
  const std::vector<float> x{0.5f, -1, 2, 0.25f};
  const std::size_t baseline_streams = dev->num_streams();
  // Each client runs the program and leaves; its drops are drained when it goes.
  auto run_client = [&](const std::string& job) {
    auto client = h.connect(job);
    std::vector<float> out;
    {
      Session s(*client);
      out = program(s, x);
    }
    client.reset();
    EXPECT_TRUE(wait_until([&] { return dev->num_streams() == baseline_streams; }));
    return out;
  };
  const std::vector<float> first = run_client("one-job");
  const runtime::StreamStats after_first = dev->totals();
  EXPECT_GE(after_first.explorations, 1u);
  const std::vector<float> second = run_client("another-job");
  const runtime::StreamStats after_second = dev->totals();
  EXPECT_EQ(after_second.explorations, after_first.explorations) << "the second client found every plan in the store";
  EXPECT_GT(after_second.cache_hits, after_first.cache_hits);
  ASSERT_EQ(first.size(), x.size());
  EXPECT_EQ(first, second);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double a = x[i];
    EXPECT_NEAR(first[i], std::tanh(std::exp((a * 0.5 + 1) * a)) - 0.25, 1e-5);
  }
}

// Issue 19.1: a drop overtook the ops that read its tensor. The daemon homed an upload on the
// client's stream 0 and an imported view on its source's stream, where the client's Session homes
// both on the stream that uses them; the drop went to the daemon's home, which ran it at once,
// while the reads still waited in the other stream's lazy queue. Here the reads wait there for
// sure (nothing triggers them before the final read), and a sync of stream 0 stands for a pool
// thread that runs stream 0 first.
TEST(DaemonOrdering, ADropNeverOvertakesTheOpsThatReadItsTensor) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev);
  Session s(h.target());
  const std::vector<float> x{0.5f, -1, 2, 0.25f};
  const std::vector<float> got = s.executes(StreamId::from_number(5), [&] {
    Tensor in = ok(s.from_host(x, {4}));
    Tensor y = ok(s.mul(ok(s.exp(in)), in));  // two reads of `in`, queued on stream 5
    { Tensor last = std::move(in); }          // its last handle goes: the Drop
    KILN_EXPECT_OK(h.target().drain(StreamId(0)));
    return ok(s.to_host(std::move(y)));
  });
  ASSERT_EQ(got.size(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(got[i], std::exp(x[i]) * x[i]);
}

// The same through a shared view: a tensor of stream 5 used on stream 6 is exported and imported
// there (RemoteTarget::share); the view must live on stream 6, where its reads are queued.
TEST(DaemonOrdering, ASharedViewLivesOnTheStreamThatUsesIt) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev);
  Session s(h.target());
  const std::vector<float> x{1, 2, 3};
  Tensor a = s.executes(StreamId::from_number(5), [&] { return ok(s.from_host(x, {3})); });
  const std::vector<float> got = s.executes(StreamId::from_number(6), [&] {
    Tensor y = ok(s.add(ok(s.exp(a)), 1.0));  // a view of `a` on stream 6, read there
    // The view's last handle went with the op's temporaries: its Drop is queued by now.
    KILN_EXPECT_OK(h.target().drain(StreamId::from_number(5)));
    return ok(s.to_host(std::move(y)));
  });
  ASSERT_EQ(got.size(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(got[i], std::exp(x[i]) + 1);
}

// A client that uses a tensor on another of its streams without a view (the raw protocol allows
// it) gets it moved to that stream first: the old home is drained, and the drop, now sent to the
// new home, comes after the reads there.
TEST(DaemonOrdering, ATensorUsedOnAnotherStreamMovesThere) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev);
  ipc::RemoteTarget& t = h.target();
  const std::vector<float> x{1, 2, 3};
  const TensorId in = t.new_tensor_id(), e = t.new_tensor_id();
  ASSERT_TRUE(t.upload(StreamId(0), in, dtypes::f32, {3}, std::as_bytes(std::span<const float>(x))).ok());
  const TensorIr read_only{in, {3}, TensorStatus::ReadOnly, dtypes::f32};
  ASSERT_TRUE(
      t.register_op(StreamId(1), ok(ir::build::unary(ir::Family::Float, ir::OpKind::Float_Exp, read_only, e))).ok());
  KILN_ASSERT_OK(t.drop(StreamId(0), TensorIr{in, {3}, TensorStatus::ReadWrite, dtypes::f32}));
  KILN_ASSERT_OK(t.drain(StreamId(0)));
  std::vector<float> got(3);
  ASSERT_TRUE(t.read_into(StreamId(1), TensorIr{e, {3}, TensorStatus::ReadWrite, dtypes::f32},
                          std::as_writable_bytes(std::span<float>(got)))
                  .ok());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(got[i], std::exp(x[i]));
}

// Issue 19.2: a sync reports the first execution failure of its stream since the last sync,
// naming the op; the failed tensors keep their errors (docs/spec/ir.md §11), and the next sync is clean.
TEST(DaemonErrors, ASyncReportsTheFirstFailureSinceTheLastSync) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev);
  ipc::RemoteTarget& t = h.target();
  const ir::Shape huge{std::uint64_t{1} << 20, std::uint64_t{1} << 20};  // 4 TiB of f32
  const TensorId zeros = t.new_tensor_id(), sum = t.new_tensor_id();
  ASSERT_TRUE(t.register_op(StreamId(0), ok(ir::build::creation(ir::Family::BaseFloat, ir::OpKind::Base_Zeros, huge,
                                                                dtypes::f32, zeros)))
                  .ok());
  const TensorIr z{zeros, huge, TensorStatus::ReadWrite, dtypes::f32};
  ASSERT_TRUE(t.register_op(StreamId(0), ok(ir::build::scalar(ir::Family::NumericFloat, ir::OpKind::Numeric_AddScalar,
                                                              z, ok(ir::ScalarIr::from_f64(1.0, dtypes::f32)), sum)))
                  .ok());
  Status synced = t.drain(StreamId(0));
  ASSERT_FALSE(synced.ok()) << "a sync answered ok for work that failed";
  EXPECT_EQ(synced.error().code, ErrorCode::ResourceExhausted) << synced.error().to_string();
  EXPECT_NE(synced.error().message.find("Zeros"), std::string::npos) << synced.error().message;
  // It names the stream as the client knows it, not the daemon's own number for it.
  EXPECT_EQ(synced.error().message.rfind("sync: stream 0: execution failed", 0), 0u) << synced.error().message;
  // The failure was reported once (the tensor keeps its error: docs/spec/ir.md §11, tested in runtime_test).
  KILN_EXPECT_OK(t.drain(StreamId(0)));
  KILN_ASSERT_OK(t.drop(StreamId(0), TensorIr{sum, huge, TensorStatus::ReadWrite, dtypes::f32}));
}

TEST(Daemon, ClientsCannotNameEachOthersTensors) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev);
  Session a(h.target());
  Tensor secret = ok(a.from_host(std::vector<float>{42, 43}, {2}));
  auto intruder = h.connect("test");
  // The intruder names the owner's id (1: the first id of every client): in its namespace
  // there is no such tensor.
  Result<runtime::HostData> stolen =
      intruder->read(StreamId(0), TensorIr{secret.id(), {2}, TensorStatus::ReadOnly, dtypes::f32});
  ASSERT_FALSE(stolen.ok());
  EXPECT_NE(stolen.error().message.find("not one of this client's live tensors"), std::string::npos)
      << stolen.error().message;
  // A drop of that id is refused too (reported at the intruder's next sync).
  KILN_ASSERT_OK(intruder->drop(StreamId(0), TensorIr{secret.id(), {2}, TensorStatus::ReadWrite, dtypes::f32}));
  Status synced = intruder->drain(StreamId(0));
  ASSERT_FALSE(synced.ok());
  EXPECT_NE(synced.error().message.find("not one of this client's live tensors"), std::string::npos);
  // The owner's tensor is untouched.
  EXPECT_EQ(ok(a.to_host(secret)), (std::vector<float>{42, 43}));
}

TEST(Daemon, MalformedAndLyingMessagesGetErrorCompletions) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev);
  RawClient c = raw_client(h);
  // 1. Garbage: a header with an unknown kind (request id 77 is still answered).
  std::vector<std::uint8_t> junk(24, 0xAB);
  std::memset(junk.data() + 1, 0, 3);
  for (int i = 0; i < 8; ++i) junk[8 + i] = i == 0 ? 77 : 0;
  junk[4] = 8;  // body_len
  junk[5] = junk[6] = junk[7] = 0;
  c.send_bytes(junk);
  EXPECT_NE(c.expect_error(77).find("kind"), std::string::npos);
  // 2. Truncated: a valid upload cut short.
  std::vector<std::uint8_t> upload;
  KILN_ASSERT_OK(
      encode_command(Command{78, UploadCmd{0, TensorId(1), dtypes::f32, Shape{2}, ArenaRange{0, 8}}}, upload));
  upload.resize(upload.size() - 5);
  c.send_bytes(upload);
  const std::string truncated = c.expect_error(78);  // the header survived: answered by its id
  EXPECT_NE(truncated.find("body_len"), std::string::npos) << truncated;
  // 3. An op whose output shape is a lie: [2] + [2] claimed to be [1000].
  c.send(Command{79, UploadCmd{0, TensorId(1), dtypes::f32, Shape{2}, ArenaRange{0, 8}}});
  EXPECT_TRUE(std::holds_alternative<OkCpl>(c.receive().body));
  ir::Operation add =
      ok(ir::build::binary(ir::Family::NumericFloat, ir::OpKind::Numeric_Add,
                           TensorIr{TensorId(1), {2}, TensorStatus::ReadOnly, dtypes::f32},
                           TensorIr{TensorId(1), {2}, TensorStatus::ReadOnly, dtypes::f32}, TensorId(2)));
  add.tensors[2].shape = Shape{1000};
  c.send(Command{80, RegisterOpCmd{0, add}});
  const std::string why = c.expect_error(80);
  EXPECT_NE(why.find("builder infers"), std::string::npos) << why;
  // 4. An input whose shape differs from the record.
  ir::Operation add2 =
      ok(ir::build::binary(ir::Family::NumericFloat, ir::OpKind::Numeric_Add,
                           TensorIr{TensorId(1), {3}, TensorStatus::ReadOnly, dtypes::f32},
                           TensorIr{TensorId(1), {3}, TensorStatus::ReadOnly, dtypes::f32}, TensorId(2)));
  c.send(Command{81, RegisterOpCmd{0, add2}});
  EXPECT_NE(c.expect_error(81).find("on record"), std::string::npos);
  // 5. A read into a range outside the arena is refused by the decoder.
  const std::uint64_t arena = c.conn.endpoint().layout().arena_size;
  std::vector<std::uint8_t> read;
  KILN_ASSERT_OK(encode_command(
      Command{82, ReadCmd{0, TensorIr{TensorId(1), {2}, TensorStatus::ReadOnly, dtypes::f32}, ArenaRange{0, 8}}},
      read));
  // Patch dest.offset (the 8 bytes before dest.length at the end) to arena - 4.
  const std::uint64_t bad = arena - 4;
  std::memcpy(read.data() + read.size() - 16, &bad, 8);
  c.send_bytes(read);
  EXPECT_NE(c.expect_error(82).find("outside the arena"), std::string::npos);
  // 6. Chunked transfers out of order: a part that continues no upload, a window of no read.
  c.send(Command{85, UploadPartCmd{0, TensorId(9), dtypes::f32, Shape{4}, 8, ArenaRange{0, 8}}});
  EXPECT_NE(c.expect_error(85).find("no upload of tensor 9 is in progress"), std::string::npos);
  c.send(Command{86,
                 ReadPartCmd{0, TensorIr{TensorId(1), {2}, TensorStatus::ReadOnly, dtypes::f32}, 4, ArenaRange{0, 4}}});
  EXPECT_NE(c.expect_error(86).find("no read of tensor 1 is in progress"), std::string::npos);
  // The daemon is still up and serves this client correctly.
  c.send(Command{83, SyncCmd{0}});
  EXPECT_TRUE(std::holds_alternative<OkCpl>(c.receive().body));
  c.send(Command{84, ReadCmd{0, TensorIr{TensorId(1), {2}, TensorStatus::ReadOnly, dtypes::f32}, ArenaRange{64, 8}}});
  Completion done = c.receive();
  EXPECT_TRUE(std::holds_alternative<ReadDoneCpl>(done.body));
}

// Imports `token` under a fresh id of `client`'s and reads the 3 floats it names (empty on error).
std::vector<float> import_and_read3(RemoteTarget& client, const ExportToken& token) {
  const TensorId mine = client.new_tensor_id();
  if (Status st = client.import_tensor(StreamId(0), token, mine); !st.ok()) {
    ADD_FAILURE() << st.error().to_string();
    return {};
  }
  Result<runtime::HostData> d = client.read(StreamId(0), TensorIr{mine, {3}, TensorStatus::ReadOnly, dtypes::f32});
  if (!d.ok()) {
    ADD_FAILURE() << d.error().to_string();
    return {};
  }
  std::vector<float> got(3);
  std::memcpy(got.data(), d->bytes.data(), 12);
  return got;
}

TEST(Daemon, ExportImportWithinAJobOnly) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev, "trainer");
  Session a(h.target());
  Tensor weights = ok(a.from_host(std::vector<float>{1, 2, 3}, {3}));
  const ExportToken token = ok(h.target().export_tensor(weights.home(), weights.id()));
  auto same_job = h.connect("trainer");
  EXPECT_EQ(import_and_read3(*same_job, token), (std::vector<float>{1, 2, 3}));
  auto other_job = h.connect("other");
  Status refused = other_job->import_tensor(StreamId(0), token, other_job->new_tensor_id());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("no tensor exported under this token"), std::string::npos);
}

// A tensor's exports go when it leaves the client's namespace (its drop here), and only its own:
// the session withdraws them from its own index, not by scanning every export.
TEST(Daemon, ADroppedTensorsExportsAreWithdrawnAndOnlyThose) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev, "trainer");
  Session a(h.target());
  Tensor kept = ok(a.from_host(std::vector<float>{1, 2, 3}, {3}));
  ExportToken dropped_tokens[2];
  ExportToken kept_token;
  {
    Tensor gone = ok(a.from_host(std::vector<float>{4, 5, 6}, {3}));
    dropped_tokens[0] = ok(h.target().export_tensor(gone.home(), gone.id()));
    dropped_tokens[1] = ok(h.target().export_tensor(gone.home(), gone.id()));  // twice: two tokens
    kept_token = ok(h.target().export_tensor(kept.home(), kept.id()));
  }  // `gone` dropped here
  KILN_ASSERT_OK(a.sync());
  auto other = h.connect("trainer");
  for (const ExportToken& token : dropped_tokens) {
    Status refused = other->import_tensor(StreamId(0), token, other->new_tensor_id());
    ASSERT_FALSE(refused.ok()) << "a token outlived its tensor";
    EXPECT_NE(refused.error().message.find("no tensor exported under this token"), std::string::npos);
  }
  EXPECT_EQ(import_and_read3(*other, kept_token), (std::vector<float>{1, 2, 3}));
}

DaemonOptions with_job_memory(std::uint64_t bytes) {
  DaemonOptions o;
  o.job_memory_bytes = bytes;
  return o;
}

// The job's byte count is shared by its sessions and follows charges and releases exactly: what
// one client frees, another of the same job can use; the status reports the sum, and a client
// that goes takes its share with it.
TEST(Daemon, AJobsSessionsShareItsMemoryQuota) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev, "shared", with_job_memory(1040));
  auto second = h.connect("shared");
  auto job_bytes = [&] {
    for (const JobStatus& j : h.service().status().jobs)
      if (j.name == "shared") return j.tensor_bytes;
    return std::uint64_t{0};
  };
  Session s1(h.target());
  std::optional<Tensor> big = ok(s1.from_host(std::vector<float>(192, 1.0f), {192}));  // 768 bytes
  Tensor kept = ok(s1.from_host(std::vector<float>(4, 1.0f), {4}));                    // 784
  {
    Session s2(*second);
    Tensor small = ok(s2.from_host(std::vector<float>(32, 1.0f), {32}));  // 912
    KILN_ASSERT_OK(s2.sync());
    EXPECT_EQ(job_bytes(), 912u);
    Result<Tensor> refused = s2.from_host(std::vector<float>(33, 1.0f), {33});  // 1044
    ASSERT_FALSE(refused.ok());
    EXPECT_NE(refused.error().message.find("memory quota"), std::string::npos) << refused.error().message;
    // An op's output is charged before its consumed input is released: 912 + 128 fits exactly.
    Tensor doubled = ok(s2.mul(std::move(small), 2.0));
    KILN_ASSERT_OK(s2.sync());
    EXPECT_EQ(job_bytes(), 912u);
    big.reset();  // the first client's drop frees room for the second
    KILN_ASSERT_OK(s1.sync());
    EXPECT_EQ(job_bytes(), 144u);
    Tensor now_fits = ok(s2.from_host(std::vector<float>(192, 1.0f), {192}));
    EXPECT_EQ(ok(s2.to_host(std::move(doubled))), std::vector<float>(32, 2.0f));  // consumed
    KILN_ASSERT_OK(s2.sync());
    EXPECT_EQ(job_bytes(), 16u + 768u);
  }  // the second Session's tensors are dropped
  KILN_ASSERT_OK(second->drain(StreamId(0)));
  EXPECT_EQ(job_bytes(), 16u);
  // A tensor no Session will drop, then the client goes: the daemon frees it and releases its
  // bytes from the job's count.
  const std::vector<float> raw(16, 1.0f);
  ASSERT_TRUE(
      second
          ->upload(StreamId(0), second->new_tensor_id(), dtypes::f32, {16}, std::as_bytes(std::span<const float>(raw)))
          .ok());
  KILN_ASSERT_OK(second->drain(StreamId(0)));
  EXPECT_EQ(job_bytes(), 16u + 64u);
  second.reset();
  EXPECT_TRUE(wait_until([&] { return job_bytes() == 16u; })) << job_bytes();
  EXPECT_EQ(ok(s1.to_host(std::move(kept))), std::vector<float>(4, 1.0f));
}

// Two clients of one job race to its quota: the check and the charge are one step, so exactly
// as many equal uploads are accepted as fit, and while both hold theirs the job's count is the sum.
TEST(Daemon, ClientsRacingToTheirJobsQuotaNeverExceedIt) {
  auto dev = make_device();
  constexpr std::uint64_t kTensor = 256 * sizeof(float), kFit = 48;
  kiln::testing::IpcHarness h(*dev, "race", with_job_memory(kFit * kTensor));
  auto second = h.connect("race");
  auto job_bytes = [&] {
    for (const JobStatus& j : h.service().status().jobs)
      if (j.name == "race") return j.tensor_bytes;
    return std::uint64_t{0};
  };
  std::atomic<std::uint64_t> accepted{0};
  std::atomic<int> refused{0};
  std::atomic<bool> checked{false};
  auto fill = [&](RemoteTarget& client, bool checks) {
    Session s(client);
    std::vector<Tensor> held;
    for (;;) {
      Result<Tensor> t = s.from_host(std::vector<float>(256, 1.0f), {256});
      if (!t.ok()) {
        EXPECT_NE(t.error().message.find("memory quota"), std::string::npos) << t.error().message;
        break;
      }
      held.push_back(std::move(t).value());
    }
    accepted.fetch_add(held.size());
    refused.fetch_add(1);
    auto wait_for = [](const auto& done) {
      for (int i = 0; i < 20000 && !done(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return done();
    };
    EXPECT_TRUE(wait_for([&] { return refused.load() == 2; }));
    if (checks) {
      EXPECT_EQ(accepted.load(), kFit);
      EXPECT_EQ(job_bytes(), accepted.load() * kTensor);
      checked.store(true);
    } else {
      EXPECT_TRUE(wait_for([&] { return checked.load(); }));  // hold ours until the count is read
    }
  };
  std::thread other(fill, std::ref(*second), false);
  fill(h.target(), true);
  other.join();
}

TEST(Daemon, JobMemoryQuota) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev, "small", with_job_memory(1024));
  Session s(h.target());
  Tensor a = ok(s.from_host(std::vector<float>(128, 1.0f), {128}));  // 512 bytes
  Tensor b = ok(s.from_host(std::vector<float>(64, 1.0f), {64}));    // 768
  Result<Tensor> c = s.from_host(std::vector<float>(128, 1.0f), {128});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("memory quota"), std::string::npos) << c.error().message;
}

TEST(Daemon, AClientThatGoesIsCleanedUp) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev);
  const std::uint64_t baseline_tensors = dev->backend().memory_stats().tensors;
  const std::uint64_t baseline_bytes = dev->backend().memory_stats().bytes_in_use;
  const std::size_t baseline_streams = dev->num_streams();
  {
    // Uploads and ops through the target itself (no Session: nothing will drop them), then
    // the connection closes, as when the process is killed.
    auto doomed = h.connect("test");
    for (std::uint64_t i = 0; i < 10; ++i) {
      const TensorId in = doomed->new_tensor_id(), out = doomed->new_tensor_id();
      std::vector<float> v(1000, float(i));
      ASSERT_TRUE(doomed->upload(StreamId(0), in, dtypes::f32, {1000}, std::as_bytes(std::span<const float>(v))).ok());
      ir::Operation op = ok(ir::build::unary(ir::Family::Float, ir::OpKind::Float_Exp,
                                             TensorIr{in, {1000}, TensorStatus::ReadOnly, dtypes::f32}, out));
      KILN_ASSERT_OK(doomed->register_op(StreamId(i % 3), std::move(op)));
    }
    KILN_ASSERT_OK(doomed->drain(StreamId(0)));
    EXPECT_GT(dev->backend().memory_stats().tensors, baseline_tensors);
    EXPECT_GT(dev->num_streams(), baseline_streams);
  }
  EXPECT_TRUE(wait_until([&] {
    return dev->backend().memory_stats().tensors == baseline_tensors && dev->num_streams() == baseline_streams;
  })) << dev->backend().memory_stats().tensors
      << " tensors, " << dev->num_streams() << " streams";
  EXPECT_EQ(dev->backend().memory_stats().bytes_in_use, baseline_bytes);
  // The service still serves the others.
  Session s(h.target());
  EXPECT_EQ(program(s, {1}).size(), 1u);
}

TEST(Daemon, StatusReportsClientsJobsAndPlans) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev, "status-job");
  Session s(h.target());
  (void)program(s, {1, 2});
  const std::string json = ok(h.target().daemon_status(true));
  EXPECT_NE(json.find("\"name\":\"status-job\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"plans\":"), std::string::npos);
  const std::string text = ok(h.target().daemon_status(false));
  EXPECT_NE(text.find("plan store"), std::string::npos) << text;
  const DaemonStatus st = h.service().status();
  EXPECT_EQ(st.clients.size(), 1u);
  EXPECT_GE(st.plans, 1u);
}

// Beyond Burn: the device's plan store is bounded ([fusion] max_plans). A client that sends
// ever new program structures makes the daemon evict cold plans; every answer stays right, and
// status shows the bound and the evictions.
TEST(Daemon, ABoundedPlanStoreEvictsColdPlansAndStatusShowsIt) {
  runtime::RuntimeOptions o;
  o.threads = 2;
  fusion::FusionConfig fusion_config;
  fusion_config.max_plans = 4;
  o.fusion = fusion_config;
  o.config_path = "";
  auto created = runtime::Device::create(
      std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{.threads = 1, .jit = cpu::CpuJitMode::Off}),
      std::move(o));
  KILN_ASSERT_OK(created);
  auto dev = std::move(created).value();
  kiln::testing::IpcHarness h(*dev, "bounded");
  Session s(h.target());
  for (int round = 0; round < 2; ++round) {
    for (int k = 1; k <= 12; ++k) {
      // k additions of 1: a structure of its own for each k (relative shapes make sizes alike).
      Tensor y = ok(s.from_host(std::vector<float>{1, 2, 3}, {3}));
      for (int i = 0; i < k; ++i) y = ok(s.add(std::move(y), 1.0));
      EXPECT_EQ(ok(s.to_host(std::move(y))), (std::vector<float>{1.0f + k, 2.0f + k, 3.0f + k})) << "k " << k;
    }
  }
  KILN_ASSERT_OK(s.sync());
  const DaemonStatus st = h.service().status();
  EXPECT_EQ(st.max_plans, 4u);
  EXPECT_LE(st.plans, 4u);
  EXPECT_GT(st.plans_evicted, 0u);
  const std::string json = ok(h.target().daemon_status(true));
  EXPECT_NE(json.find("\"max_plans\":4,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"plans_evicted\":"), std::string::npos) << json;
  const std::string text = ok(h.target().daemon_status(false));
  EXPECT_NE(text.find("(at most 4, "), std::string::npos) << text;
}

// The client of `id` in a status.
const ClientStatus* client_in(const DaemonStatus& st, std::uint64_t id) {
  for (const ClientStatus& c : st.clients)
    if (c.client_id == id) return &c;
  return nullptr;
}
// A pointer into a temporary status would dangle: keep the status in a variable.
const ClientStatus* client_in(DaemonStatus&& st, std::uint64_t id) = delete;

// The line after client `id`'s line in a text status ("" if none).
std::string line_after_client(const std::string& text, std::uint64_t id) {
  const std::size_t at = text.find("    client " + std::to_string(id) + " (pid ");
  if (at == std::string::npos) return "";
  const std::size_t next = text.find('\n', at);
  if (next == std::string::npos || next + 1 >= text.size()) return "";
  return text.substr(next + 1, text.find('\n', next + 1) - next);
}

// Issue 23: a worker's fallback report (the PyTorch device's ops that ran on its CPU) shows with
// its client in the status, text and JSON, most-called first; a new report replaces it, an empty
// one clears it, and it goes with the client.
TEST(Daemon, StatusShowsEachClientsFallbacksUntilItGoes) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev, "watcher");
  auto worker = h.connect("workers");
  ASSERT_NE(worker, nullptr);
  const std::uint64_t id = worker->client_id();
  // One-way: the daemon serves a client's commands in order, so once the worker's next sync is
  // answered its report is in.
  KILN_ASSERT_OK(worker->report_fallbacks({{"aten::index_add_", 3}, {"aten::flip", 12}}));
  KILN_ASSERT_OK(worker->drain(StreamId(0)));
  const DaemonStatus status = h.service().status();
  const ClientStatus* mine = client_in(status, id);
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(mine->fallbacks, (std::vector<FallbackCount>{{"aten::flip", 12}, {"aten::index_add_", 3}}));
  EXPECT_EQ(mine->fallbacks_omitted, 0u);
  std::string text = ok(h.target().daemon_status(false));
  EXPECT_EQ(line_after_client(text, id), "      fallbacks: aten::flip 12, aten::index_add_ 3\n") << text;
  EXPECT_EQ(line_after_client(text, h.target().client_id()).find("fallbacks"), std::string::npos) << text;
  std::string json = ok(h.target().daemon_status(true));
  EXPECT_NE(
      json.find("\"rejected\":0,\"fallbacks\":{\"aten::flip\":12,\"aten::index_add_\":3},\"fallbacks_omitted\":0}"),
      std::string::npos)
      << json;
  EXPECT_NE(json.find("\"fallbacks\":{},\"fallbacks_omitted\":0}"), std::string::npos) << json;  // the watcher's

  // A snapshot replaces the last one; names the protocol cannot carry are left out by the client.
  KILN_ASSERT_OK(worker->report_fallbacks({{"aten::flip", 13}, {"not a name", 5}, {"", 1}}));
  KILN_ASSERT_OK(worker->drain(StreamId(0)));
  text = ok(h.target().daemon_status(false));
  EXPECT_EQ(line_after_client(text, id), "      fallbacks: aten::flip 13\n") << text;
  EXPECT_EQ(text.find("index_add_"), std::string::npos) << text;

  // The status shows the kStatusFallbacks most-called and counts the others.
  std::map<std::string, std::uint64_t> many;
  for (std::uint64_t i = 0; i < 20; ++i) many[fmt::format("aten::op{:02}", i)] = i + 1;
  KILN_ASSERT_OK(worker->report_fallbacks(many));
  KILN_ASSERT_OK(worker->drain(StreamId(0)));
  std::string shown = "      fallbacks: ";
  for (std::uint64_t i = 19; i >= 4; --i) shown += fmt::format("aten::op{:02} {}{}", i, i + 1, i > 4 ? ", " : "");
  shown += " (and 4 more)\n";
  text = ok(h.target().daemon_status(false));
  EXPECT_EQ(line_after_client(text, id), shown) << text;
  json = ok(h.target().daemon_status(true));
  EXPECT_NE(json.find("\"aten::op04\":5},\"fallbacks_omitted\":4}"), std::string::npos) << json;
  EXPECT_EQ(json.find("aten::op03"), std::string::npos) << json;

  // An empty snapshot (kiln.reset_stats()) clears the line.
  KILN_ASSERT_OK(worker->report_fallbacks({}));
  KILN_ASSERT_OK(worker->drain(StreamId(0)));
  text = ok(h.target().daemon_status(false));
  EXPECT_EQ(text.find("fallbacks:"), std::string::npos) << text;

  // The report goes with its client.
  KILN_ASSERT_OK(worker->report_fallbacks({{"aten::flip", 1}}));
  KILN_ASSERT_OK(worker->drain(StreamId(0)));
  EXPECT_NE(ok(h.target().daemon_status(false)).find("fallbacks: aten::flip 1\n"), std::string::npos);
  worker.reset();
  EXPECT_TRUE(wait_until([&] { return h.service().status().clients.size() == 1; }));
  text = ok(h.target().daemon_status(false));
  EXPECT_EQ(text.find("fallbacks:"), std::string::npos) << text;
  json = ok(h.target().daemon_status(true));
  EXPECT_EQ(json.find("aten::"), std::string::npos) << json;
}

// The client library fits a report to the command ring: with a 4 KiB ring, the most-called entries
// that fit one message go (37 of 100-byte names: 18 + 37 * 109 bytes <= 4088), the rest are left out.
TEST(Daemon, AFallbackReportIsFittedToTheCommandRing) {
  auto dev = make_device();
  DaemonOptions o;
  o.server.segment = SegmentConfig{4096, 4096, 65536};
  kiln::testing::IpcHarness h(*dev, "small-ring", o);
  std::map<std::string, std::uint64_t> calls;
  for (std::uint64_t i = 0; i < 100; ++i) calls[fmt::format("aten::op{:03}", i) + std::string(89, 'x')] = i + 1;
  ASSERT_EQ(calls.begin()->first.size(), 100u);
  KILN_ASSERT_OK(h.target().report_fallbacks(calls));
  KILN_ASSERT_OK(h.target().drain(StreamId(0)));
  const DaemonStatus status = h.service().status();
  const ClientStatus* mine = client_in(status, h.target().client_id());
  ASSERT_NE(mine, nullptr);
  ASSERT_EQ(mine->fallbacks.size(), kStatusFallbacks);
  EXPECT_EQ(mine->fallbacks_omitted, 37u - kStatusFallbacks);
  EXPECT_EQ(mine->fallbacks.front().calls, 100u);  // the most-called first
  EXPECT_EQ(mine->fallbacks.back().calls, 100u - kStatusFallbacks + 1);
}

// A report the decoder refuses (a name that would break the status's lines) is an error
// completion naming the entry; the client's last good report stays, and the session goes on.
TEST(Daemon, AMalformedFallbackReportIsRefusedAndTheLastOneKept) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev);
  RawClient c = raw_client(h);
  c.send(Command{1, ReportFallbacksCmd{std::vector<FallbackCount>{{"aten::flip", 7}}}});  // no answer
  std::vector<std::uint8_t> bad;
  KILN_ASSERT_OK(encode_command(Command{2, ReportFallbacksCmd{std::vector<FallbackCount>{{"aten::flop", 9}}}}, bad));
  bad[kMessageHeaderBytes + 2 + 1 + 6] = '\n';  // count, name_len, "aten::" then the newline
  c.send_bytes(bad);
  const std::string why = c.expect_error(2);
  EXPECT_NE(why.find("report_fallbacks.name: entry 0: byte 0x0a at 6 is not printable ASCII"), std::string::npos)
      << why;
  c.send(Command{3, StatusCmd{true}});
  const Completion st = c.receive();
  EXPECT_EQ(st.request_id, 3u);
  const auto* json = std::get_if<StatusTextCpl>(&st.body);
  ASSERT_NE(json, nullptr) << completion_kind_name(st.kind());
  EXPECT_NE(json->text.find("\"fallbacks\":{\"aten::flip\":7},\"fallbacks_omitted\":0}"), std::string::npos)
      << json->text;
  EXPECT_EQ(json->text.find("flop"), std::string::npos) << json->text;
}

TEST(Daemon, ClientSeesAClearErrorWhenTheDaemonGoes) {
  auto dev = make_device();
  auto h = std::make_unique<kiln::testing::IpcHarness>(*dev);
  auto client = h->connect("test");
  h->service().stop();
  Status st = client->drain(StreamId(0));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("daemon went away"), std::string::npos) << st.error().message;
  // Reconnecting finds no daemon, with a clear message.
  RemoteOptions r;
  r.runtime_dir = h->dir();
  r.socket_name = "kilnd-test.sock";
  auto again = RemoteTarget::connect(r);
  ASSERT_FALSE(again.ok());
  EXPECT_NE(again.error().message.find("daemon not running"), std::string::npos) << again.error().message;
}

// Regression (found by stress/ipc_stress.cc): with several threads on one connection, the
// thread popping the completion ring could take the answer to another thread's request before
// that thread had registered as its waiter; the answer was dropped and the requester waited
// out reply_timeout. Threads here make request/reply calls back to back, so answers often
// arrive while their requester is between its send and its wait.
TEST(Daemon, AnswersThatArriveBeforeTheirWaiterAreKept) {
  auto dev = make_device();
  kiln::testing::IpcHarness h(*dev);
  RemoteOptions r;
  r.runtime_dir = h.dir();
  r.socket_name = "kilnd-test.sock";
  r.reply_timeout = std::chrono::seconds(10);  // a lost answer fails the call instead of hanging
  auto client = ok(RemoteTarget::connect(r));
  Session s(*client);
  const Tensor t = ok(s.from_host(std::vector<float>{1, 2}, {2}));
  constexpr int kThreads = 4, kCalls = 400;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < kCalls && failures.load() == 0; ++k) {
        const Status st = k % 2 == 0 ? client->export_tensor(t.home(), t.id()).status()
                                     : client->drain(StreamId(static_cast<std::uint64_t>(i)));
        if (!st.ok()) {
          ADD_FAILURE() << "thread " << i << " call " << k << ": " << st.error().to_string();
          failures.fetch_add(1);
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

// ---- Another uid (peer_user.h).

using kiln::testing::ensure_peer_user;
using kiln::testing::kilnctl_as_peer;
using kiln::testing::kPeerGroup;
using kiln::testing::kPeerUser;

TEST(DaemonSecurity, AnotherUidIsRefusedUnlessInTheAllowedGroup) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: it creates the user " << kPeerUser << " and runs kilnctl as it";
  const std::string setup = ensure_peer_user();
  ASSERT_EQ(setup, "") << "could not create the test user";
  auto dev = make_device();
  {
    // Default policy: only the daemon's own uid. The peer cannot even reach the socket.
    kiln::testing::IpcHarness h(*dev);
    auto [rc, out] = kilnctl_as_peer(h.dir(), "");
    EXPECT_NE(rc, 0) << out;
    EXPECT_NE(out.find("refused"), std::string::npos) << out;
    // Without --socket too (issue 19.14: it said "no kilnd is running").
    auto [rc_any, out_any] = kilnctl_as_peer(h.dir(), "", "");
    EXPECT_NE(rc_any, 0) << out_any;
    EXPECT_NE(out_any.find("refused: no permission to reach"), std::string::npos) << out_any;
    // The daemon still serves its own user.
    Session s(h.target());
    EXPECT_EQ(program(s, {1}).size(), 1u);
  }
  {
    // With an allowed group, the same user is let in when it is a member (positive control:
    // the refusal above is the policy, not a broken setup)...
    const group* g = getgrnam(kPeerGroup);
    ASSERT_NE(g, nullptr);
    char tmpl[] = "/tmp/kiln-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    ASSERT_EQ(chmod(tmpl, 0755), 0);  // the parent must be traversable; the daemon's dir is inside
    const std::string dir = std::string(tmpl) + "/run";
    DaemonOptions o;
    o.server.runtime_dir = dir;
    o.server.socket_name = daemon_socket_name("cpu");
    o.server.allowed_gid = g->gr_gid;
    auto service = ok(DaemonService::start(*dev, o));
    auto [rc_in, out_in] = kilnctl_as_peer(dir, kPeerGroup, daemon_socket_name("cpu"));
    EXPECT_EQ(rc_in, 0) << out_in;
    EXPECT_NE(out_in.find("plan store"), std::string::npos) << out_in;
    // A member cannot list the 0710 directory; kilnctl finds the default socket name anyway.
    auto [rc_found, out_found] = kilnctl_as_peer(dir, kPeerGroup, "");
    EXPECT_EQ(rc_found, 0) << out_found;
    EXPECT_NE(out_found.find("plan store"), std::string::npos) << out_found;
    // ...and refused when it is not.
    auto [rc_out, out_out] = kilnctl_as_peer(dir, "", daemon_socket_name("cpu"));
    EXPECT_NE(rc_out, 0) << out_out;
    EXPECT_NE(out_out.find("refused"), std::string::npos) << out_out;
    service->stop();
    std::filesystem::remove_all(tmpl);
  }
}

}  // namespace
}  // namespace kiln::ipc

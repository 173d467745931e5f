// The device runtime: values through the reference CPU backend, plan reuse across streams,
// cross-stream dependencies, reads, foreign drops, execution failures, shutdown, and a small
// multi-thread stress. Run under TSan in the tsan build.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <set>
#include <thread>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include <boost/asio/thread_pool.hpp>

#include "kiln/apps/mlp_trainer.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/cpu/reference_backend.h"
#include "kiln/ir/builders.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/session.h"
#include "kiln/runtime/stream_actor.h"
#include "kiln/testing/status.h"

namespace kiln::runtime {
namespace {

using ir::TensorId;
using ir::TensorIr;
using ir::TensorStatus;

// The suite runs twice (tests/runtime/CMakeLists.txt): over the reference backend and over the
// fast one, which stages each stream's tensors around its fused kernels.
std::unique_ptr<DeviceBackend> make_backend() {
#if KILN_TEST_FAST_BACKEND
  return std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{.threads = 2, .jit = cpu::CpuJitMode::Off});
#else
  return std::make_unique<cpu::ReferenceCpuBackend>();
#endif
}

std::unique_ptr<Device> make_device(std::size_t threads = 4) {
  RuntimeOptions o;
  o.threads = threads;
  o.fusion = fusion::FusionConfig{};  // never read a kiln.toml from the test's directory
  o.wait_timeout = std::chrono::seconds(60);
  Result<std::unique_ptr<Device>> d = Device::create(make_backend(), std::move(o));
  KILN_EXPECT_OK(d);
  return std::move(d).value();
}

using ::kiln::testing::ok;

// A [2] f32 tensor uploaded under a fresh id, as a ReadOnly occurrence.
TensorIr upload_f32x2(Device& dev, float a, float b) {
  const TensorId id = dev.new_tensor_id();
  const std::vector<float> v{a, b};
  EXPECT_TRUE(dev.upload(StreamId(0), id, ir::dtypes::f32, {2}, std::as_bytes(std::span<const float>(v))).ok());
  return TensorIr{id, {2}, TensorStatus::ReadOnly, ir::dtypes::f32};
}

void expect_near_all(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i]))) << i;
}

TEST(Runtime, FusedElementwiseValues) {
  auto dev = make_device();
  {
    Session s(*dev);
    const std::vector<float> av{1, 2, 3, 4}, bv{0.5f, -1, 0.25f, 0}, cv{-1, 0.5f, 0, 0.125f};
    Tensor a = ok(s.from_host(av, {2, 2}));
    Tensor b = ok(s.from_host(bv, {2, 2}));
    Tensor c = ok(s.from_host(cv, {2, 2}));
    Tensor r = ok(s.exp(ok(s.add(ok(s.mul(a, b)), ok(s.mul_scalar(c, 2.0))))));
    std::vector<double> want;
    for (int i = 0; i < 4; ++i) want.push_back(std::exp(double(av[i]) * bv[i] + double(cv[i]) * 2.0));
    expect_near_all(ok(s.to_host(std::move(r))), want);
    StreamStats st = *dev->stream_stats(s.current_stream());
    EXPECT_GE(st.executed, 4u);
    EXPECT_EQ(st.pending_ops, 0u);
    EXPECT_GE(dev->plan_store().size(), 1u);
#if KILN_TEST_FAST_BACKEND
    // The four ops ran as one fused elementwise kernel, not replayed op by op.
    const cpu::CpuDeviceStats cs = static_cast<cpu::CpuBackend&>(dev->backend()).stats();
    EXPECT_GE(cs.fused_launches, 1u);
    EXPECT_EQ(cs.fused_replays, 0u);
#endif
  }
  KILN_ASSERT_OK(dev->shutdown());
  EXPECT_EQ(dev->backend().memory_stats().tensors, 0u);       // every tensor dropped
  EXPECT_EQ(dev->backend().memory_stats().bytes_in_use, 0u);  // and every buffer released
}

TEST(Runtime, MatmulSumDimValuesAndBuilderErrors) {
  auto dev = make_device();
  Session s(*dev);
  Tensor x = ok(s.from_host(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}));
  Tensor w = ok(s.from_host(std::vector<float>{1, 0, 0, 1, 1, 1}, {3, 2}));
  Tensor m = ok(s.matmul(x, w));  // [[1+3, 2+3], [4+6, 5+6]]
  expect_near_all(ok(s.to_host(m)), {4, 5, 10, 11});
  expect_near_all(ok(s.to_host(ok(s.sum_dim(m, 1)))), {9, 21});
  Tensor bad = ok(s.from_host(std::vector<float>{1, 2, 3}, {3}));
  Result<Tensor> r = s.add(m, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("Add"), std::string::npos) << r.error().message;
  Result<Tensor> mm = s.matmul(x, x);
  ASSERT_FALSE(mm.ok());
  // Nothing was queued for the failed builds: the stream still works.
  expect_near_all(ok(s.to_host(ok(s.mul_scalar(bad, 2.0)))), {2, 4, 6});
}

// The same program on two threads (two implicit streams): the second finds the first's plans.
TEST(Runtime, PlansAreSharedAcrossStreams) {
  auto dev = make_device();
  Session s(*dev);
  auto program = [&s](StreamId* id) {
    Tensor a = ok(s.from_host(std::vector<float>(64, 1.0f), {8, 8}));
    Tensor b = ok(s.from_host(std::vector<float>(64, 2.0f), {8, 8}));
    Tensor c = ok(s.from_host(std::vector<float>(64, 3.0f), {8, 8}));
    Tensor r = ok(s.exp(ok(s.add(ok(s.mul(a, b)), ok(s.mul_scalar(c, 2.0))))));
    std::vector<float> v = ok(s.to_host(std::move(r)));
    EXPECT_NEAR(v[0], std::exp(8.0), 1e-2);
    *id = s.current_stream();
  };
  StreamId s1(0), s2(0);
  std::thread(program, &s1).join();
  // The thread's last drops were queued at its exit: a drain (foreign, so ordered after them)
  // lets the stream finish planning them before we count.
  KILN_ASSERT_OK(dev->drain(s1));
  const std::size_t plans = dev->plan_store().size();
  EXPECT_GE(plans, 1u);
  std::thread(program, &s2).join();
  ASSERT_NE(s1, s2);
  KILN_ASSERT_OK(dev->drain(s2));
  EXPECT_EQ(dev->plan_store().size(), plans);
  StreamStats st2 = *dev->stream_stats(s2);
  EXPECT_GE(st2.cache_hits, 1u);
  EXPECT_EQ(st2.explorations, 0u);
  EXPECT_EQ(dev->stream_stats(s1)->plans_created, plans);
}

// A thread's tensors take ids from its own block (ir::kTensorIdBlock consecutive ids taken from
// the device at a time), so that they share shards of the device's tables: another thread's
// tensors in between do not interrupt the sequence, never come from the same block, and ids stay
// unique across refills.
TEST(Runtime, EachThreadTakesItsTensorIdsFromItsOwnBlock) {
  auto dev = make_device(2);
  Session s(*dev);
  auto chain = [&s](Tensor x, std::size_t n, std::vector<std::uint64_t>* ids) {
    for (std::size_t i = 0; i < n; ++i) {
      x = ok(s.add(std::move(x), 1.0));
      ids->push_back(x.id().value());
    }
    return x;
  };
  std::vector<std::uint64_t> mine, other;
  (void)dev->new_tensor_id();  // a single id first: blocks are still aligned to their size
  Tensor x = ok(s.from_host(std::vector<float>{1, 2}, {2}));
  mine.push_back(x.id().value());
  x = chain(std::move(x), 10, &mine);
  std::thread([&] {
    Tensor y = ok(s.from_host(std::vector<float>{5}, {1}));
    other.push_back(y.id().value());
    y = chain(std::move(y), 10, &other);
    EXPECT_EQ(ok(s.to_host(std::move(y))), (std::vector<float>{15}));
  }).join();
  x = chain(std::move(x), ir::kTensorIdBlock + 20, &mine);  // spans a refill
  EXPECT_EQ(ok(s.to_host(std::move(x))),
            (std::vector<float>{float(1 + ir::kTensorIdBlock + 30), float(2 + ir::kTensorIdBlock + 30)}));
  EXPECT_EQ(mine[0] % ir::kTensorIdBlock, 0u);
  EXPECT_EQ(other[0] % ir::kTensorIdBlock, 0u);
  // This thread's first block: consecutive ids, the other thread's ops in between.
  for (std::size_t i = 1; i < ir::kTensorIdBlock; ++i) ASSERT_EQ(mine[i], mine[i - 1] + 1) << "at " << i;
  for (std::size_t i = 1; i < other.size(); ++i) EXPECT_EQ(other[i], other[i - 1] + 1);
  // The other thread's block is not this one's.
  for (std::uint64_t id : other) EXPECT_FALSE(id >= mine[0] && id < mine[0] + ir::kTensorIdBlock) << id;
  std::set<std::uint64_t> all(mine.begin(), mine.end());
  all.insert(other.begin(), other.end());
  EXPECT_EQ(all.size(), mine.size() + other.size()) << "an id was handed out twice";
  // The device's single ids (uploads through the Device itself) come from outside every block.
  EXPECT_EQ(all.count(dev->new_tensor_id().value()), 0u);
}

// Stream B consumes a tensor still pending on stream A: A is drained first (shared view).
TEST(Runtime, CrossStreamDependencyDrainsProducer) {
  auto dev = make_device();
  Session s(*dev);
  const StreamId a_stream = s.current_stream();
  Tensor x = ok(s.from_host(std::vector<float>{0, 1, 2}, {3}));
  Tensor y = ok(s.exp(x));  // Lazy: pending on A
  std::vector<float> got;
  std::thread([&] {
    Tensor z = ok(s.mul_scalar(y, 2.0));  // on B: shares y, which drains A
    got = ok(s.to_host(std::move(z)));
  }).join();
  expect_near_all(got, {2 * std::exp(0.0), 2 * std::exp(1.0), 2 * std::exp(2.0)});
  StreamStats a = *dev->stream_stats(a_stream);
  EXPECT_GE(a.drains, 1u);
  EXPECT_EQ(a.pending_ops, 0u);
  EXPECT_TRUE(dev->backend().is_materialized(y.id()));
  // Explicit streams on one thread: the same rule.
  Tensor w = ok(s.mul_scalar(x, 3.0));  // pending on A
  Tensor v = s.executes(StreamId::from_number(7), [&] { return ok(s.add(w, x)); });
  EXPECT_EQ(v.home(), StreamId::from_number(7));
  expect_near_all(ok(s.to_host(v)), {0, 4, 8});
}

// The device-level rule (producer table): an op naming a tensor pending on another stream.
TEST(Runtime, ProducerTableDrainsOtherStream) {
  auto dev = make_device();
  const StreamId A(100), B(101);
  const TensorId x = dev->new_tensor_id(), y = dev->new_tensor_id(), z = dev->new_tensor_id();
  std::vector<float> xv{1, 2};
  ASSERT_TRUE(dev->upload(StreamId(0), x, ir::dtypes::f32, {2}, std::as_bytes(std::span<const float>(xv))).ok());
  const TensorIr xr{x, {2}, TensorStatus::ReadOnly, ir::dtypes::f32};
  ASSERT_TRUE(dev->register_op(A, ok(ir::build::unary(ir::Family::Float, ir::OpKind::Float_Exp, xr, y))).ok());
  EXPECT_EQ(dev->producer_of(y), A);
  const TensorIr yr{y, {2}, TensorStatus::ReadOnly, ir::dtypes::f32};
  ASSERT_TRUE(dev->register_op(B, ok(ir::build::unary(ir::Family::Float, ir::OpKind::Float_Exp, yr, z))).ok());
  EXPECT_TRUE(dev->backend().is_materialized(y));  // A was drained before B queued its op
  Result<HostData> d = dev->read(B, TensorIr{z, {2}, TensorStatus::ReadWrite, ir::dtypes::f32});
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  float out[2];
  std::memcpy(out, d->bytes.data(), sizeof out);
  EXPECT_NEAR(out[0], std::exp(std::exp(1.0)), 1e-4);
  EXPECT_NEAR(out[1], std::exp(std::exp(2.0)), 1e-3);
}

// register_op_deferred queues without waking the actor: nothing runs until wake_stream (or a
// wait on the stream); then the ops run in order with the usual results.
TEST(Runtime, DeferredRegistrationsRunOnWakeOrWait) {
  auto dev = make_device();
  const StreamId A(200), B(201);
  const TensorIr xr = upload_f32x2(*dev, 0.5f, 1.0f);
  auto exp_into = [&](StreamId s, const TensorIr& in, TensorId out) {
    return dev->register_op_deferred(s, ok(ir::build::unary(ir::Family::Float, ir::OpKind::Float_Exp, in, out)));
  };
  // Stream A: two deferred ops, then nothing for a while: the actor stays asleep.
  const TensorId a1 = dev->new_tensor_id(), a2 = dev->new_tensor_id();
  KILN_ASSERT_OK(exp_into(A, xr, a1));
  KILN_ASSERT_OK(exp_into(A, TensorIr{a1, {2}, TensorStatus::ReadWrite, ir::dtypes::f32}, a2));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(dev->stream_stats(A)->commands, 0u);
  EXPECT_EQ(dev->stream_stats(A)->turns, 0u);
  dev->wake_stream(A);
  for (int i = 0; i < 2000 && dev->stream_stats(A)->commands < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(dev->stream_stats(A)->commands, 2u);
  // Stream B: a deferred op followed directly by a read (which runs or wakes the stream).
  const TensorId b1 = dev->new_tensor_id();
  KILN_ASSERT_OK(exp_into(B, xr, b1));
  for (auto [stream, id, want] : {std::tuple{A, a2, std::exp(std::exp(0.5))}, std::tuple{B, b1, std::exp(0.5)}}) {
    Result<HostData> d = dev->read(stream, TensorIr{id, {2}, TensorStatus::ReadWrite, ir::dtypes::f32});
    ASSERT_TRUE(d.ok()) << d.error().to_string();
    float out[2];
    std::memcpy(out, d->bytes.data(), sizeof out);
    EXPECT_NEAR(out[0], want, 1e-4 * want);
  }
  dev->wake_stream(StreamId(999));  // a stream that does not exist: nothing happens
}

// A wait on a stream whose backlog was all registered without a wake-up runs the whole backlog
// on the waiting thread, however long (no turn was coming for it); results as usual.
TEST(Runtime, AWaitRunsAnUnwokenBacklogOfAnyLengthInline) {
  auto dev = make_device();
  const StreamId D(400);
  TensorIr cur = upload_f32x2(*dev, 1.0f, 2.0f);
  constexpr int kOps = 40;  // well above StreamActor::kInlineBacklog
  for (int i = 0; i < kOps; ++i) {
    const TensorId next = dev->new_tensor_id();
    ASSERT_TRUE(
        dev->register_op_deferred(D, ok(ir::build::scalar(ir::Family::NumericFloat, ir::OpKind::Numeric_AddScalar, cur,
                                                          ir::ScalarIr::Float(0.5), next)))
            .ok());
    cur = TensorIr{next, {2}, TensorStatus::ReadWrite, ir::dtypes::f32};
  }
  // The first op read x (ReadOnly); every later one consumed its predecessor.
  Result<HostData> d = dev->read(D, cur);
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  float out[2];
  std::memcpy(out, d->bytes.data(), sizeof out);
  EXPECT_FLOAT_EQ(out[0], 1.0f + 0.5f * kOps);
  EXPECT_FLOAT_EQ(out[1], 2.0f + 0.5f * kOps);
  const StreamStats st = *dev->stream_stats(D);
  EXPECT_EQ(st.turns, 0u);
  EXPECT_EQ(st.inline_runs, 1u);
  EXPECT_EQ(st.commands, static_cast<std::uint64_t>(kOps) + 1);
}

// A device with these runtime options (threads, drain_batch, inline and spin waits), no kiln.toml.
std::unique_ptr<Device> make_tuned_device(std::size_t threads, std::size_t drain_batch, bool spin_waits) {
  RuntimeOptions o;
  o.threads = threads;
  o.drain_batch = drain_batch;
  o.inline_waits = false;  // every wait goes through a turn
  o.spin_waits = spin_waits;
  // A spinning waiter gives up only on its answer: no wake-up, however slow (a loaded machine,
  // a sanitizer), can make a spin give up.
  o.spin_wait_limit = std::chrono::seconds(30);
  o.spin_wait_stall = std::chrono::seconds(30);
  o.config_path = "";
  o.fusion = fusion::FusionConfig{};
  Result<std::unique_ptr<Device>> d = Device::create(make_backend(), std::move(o));
  KILN_EXPECT_OK(d);
  return std::move(d).value();
}

// `n` deferred AddScalar(+0.5) ops on `s` from `start`; returns the last result (ReadWrite).
TensorIr add_halves_deferred(Device& dev, StreamId s, TensorIr cur, int n) {
  for (int i = 0; i < n; ++i) {
    const TensorId next = dev.new_tensor_id();
    EXPECT_TRUE(
        dev.register_op_deferred(s, ok(ir::build::scalar(ir::Family::NumericFloat, ir::OpKind::Numeric_AddScalar, cur,
                                                         ir::ScalarIr::Float(0.5), next)))
            .ok());
    cur = TensorIr{next, {2}, TensorStatus::ReadWrite, ir::dtypes::f32};
  }
  return cur;
}

float first_f32(const Result<HostData>& d) {
  float v = 0;
  if (d.ok() && d->bytes.size() >= sizeof v) std::memcpy(&v, d->bytes.data(), sizeof v);
  return v;
}

// The only busy stream of its device runs one batch after another in the same turn: a spent
// batch is a turn boundary (counted), never a re-post, since no other turn waits for the thread.
TEST(Runtime, AStreamAloneStartsItsNextTurnInPlace) {
  auto dev = make_tuned_device(2, 4, false);
  const StreamId E(500);
  constexpr int kOps = 40;
  const TensorIr last = add_halves_deferred(*dev, E, upload_f32x2(*dev, 1.0f, 2.0f), kOps);
  Result<HostData> d = dev->read(E, last);  // wakes the stream: one turn runs the 41 commands
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_FLOAT_EQ(first_f32(d), 1.0f + 0.5f * kOps);
  const StreamStats st = *dev->stream_stats(E);
  EXPECT_EQ(st.commands, static_cast<std::uint64_t>(kOps) + 1);
  EXPECT_EQ(st.deferred, 0u);
  EXPECT_GE(st.turns, static_cast<std::uint64_t>(kOps / 4));  // a turn per batch of 4
}

// A batch restarted in place has run nothing yet; when the intake is empty right then, the
// turn still polls for the producer's next op like any turn that ran something, instead of
// ending (its next op then cost a post and a pool-thread wake-up: ~0.8 per cache-hit iteration
// of kiln-bench-runtime, 23 % of its time). The poll is stretched to seconds here, so the op
// pushed 50 ms after the batch runs in the same turn: 2 turns, the in-place restart included.
TEST(Runtime, ATurnRestartedInPlacePollsForTheNextOp) {
  RuntimeOptions o;
  o.threads = 2;
  o.drain_batch = 4;
  o.inline_waits = false;
  o.spin_waits = false;
  o.turn_idle_polls = 200'000'000;  // tens of seconds at most; answering the read ends it
  o.config_path = "";
  o.fusion = fusion::FusionConfig{};
  auto dev = ok(Device::create(make_backend(), std::move(o)));
  const StreamId P(550);
  TensorIr cur = add_halves_deferred(*dev, P, upload_f32x2(*dev, 1.0f, 2.0f), 4);
  dev->wake_stream(P);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (dev->stream_stats(P)->commands < 4 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  ASSERT_EQ(dev->stream_stats(P)->commands, 4u);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the intake stays empty meanwhile
  cur = add_halves_deferred(*dev, P, cur, 1);
  dev->wake_stream(P);  // posts nothing while the turn still runs (its flag is set)
  Result<HostData> d = dev->read(P, cur);
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_FLOAT_EQ(first_f32(d), 1.0f + 0.5f * 5);
  const StreamStats st = *dev->stream_stats(P);
  EXPECT_EQ(st.commands, 6u);
  EXPECT_EQ(st.turns, 2u) << "the turn ended at its in-place restart and a new one was posted";
  EXPECT_EQ(st.deferred, 0u);
}

TensorIr add_halves_waking(Device& dev, StreamId s, TensorIr cur, int n) {
  for (int i = 0; i < n; ++i) {
    const TensorId next = dev.new_tensor_id();
    EXPECT_TRUE(dev.register_op(s, ok(ir::build::scalar(ir::Family::NumericFloat, ir::OpKind::Numeric_AddScalar, cur,
                                                        ir::ScalarIr::Float(0.5), next)))
                    .ok());
    cur = TensorIr{next, {2}, TensorStatus::ReadWrite, ir::dtypes::f32};
  }
  return cur;
}

RuntimeOptions lazy_wake_options(std::size_t wake_after, bool inline_waits) {
  RuntimeOptions o;
  o.threads = 2;
  o.wake_after = wake_after;
  o.inline_waits = inline_waits;
  o.spin_waits = false;
  o.config_path = "";
  o.fusion = fusion::FusionConfig{};
  return o;
}

// The lone-core rule (RuntimeOptions::wake_after): registrations leave the actor asleep until
// wake_after of them are queued, and a read runs the unwoken backlog itself. Forced here on a
// machine with more cores.
TEST(Runtime, RegistrationsWakeTheActorOnlyEveryWakeAfterOps) {
  auto dev = ok(Device::create(make_backend(), lazy_wake_options(4, true)));
  EXPECT_EQ(dev->options().wake_after, std::optional<std::size_t>(4));
  const StreamId L(560);
  TensorIr cur = add_halves_waking(*dev, L, upload_f32x2(*dev, 1.0f, 2.0f), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(dev->stream_stats(L)->commands, 0u) << "three registrations woke the actor";
  cur = add_halves_waking(*dev, L, cur, 1);  // the fourth wakes it
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  // Until the woken turn has ended, not only run the four: a turn still polling (or not yet past
  // its clear-and-recheck) would take the next two itself.
  auto asleep_after_four = [&] {
    const StreamStats st = *dev->stream_stats(L);
    return st.commands == 4 && !st.awake;
  };
  while (!asleep_after_four() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  ASSERT_TRUE(asleep_after_four());
  EXPECT_EQ(dev->stream_stats(L)->inline_runs, 0u);
  cur = add_halves_waking(*dev, L, cur, 2);  // asleep again: the read runs these two inline
  Result<HostData> d = dev->read(L, cur);
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  EXPECT_FLOAT_EQ(first_f32(d), 1.0f + 0.5f * 6);
  EXPECT_EQ(dev->stream_stats(L)->inline_runs, 1u);
}

// Without inline waits nobody would run an unwoken backlog: every registration wakes the actor.
TEST(Runtime, WakeAfterNeedsInlineWaits) {
  auto dev = ok(Device::create(make_backend(), lazy_wake_options(64, false)));
  const StreamId L(561);
  add_halves_waking(*dev, L, upload_f32x2(*dev, 1.0f, 2.0f), 3);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (dev->stream_stats(L)->commands < 3 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  EXPECT_EQ(dev->stream_stats(L)->commands, 3u);
}

TEST(Runtime, WakeAfterZeroIsAConfigError) {
  Result<std::unique_ptr<Device>> dev = Device::create(make_backend(), lazy_wake_options(0, true));
  ASSERT_FALSE(dev.ok());
  EXPECT_EQ(dev.error().code, ErrorCode::Config);
}

// With another stream's turn waiting for the device's only pool thread, a spent batch re-posts
// (the fairness point): the waiting stream runs before the busy one finishes.
TEST(Runtime, ASpentBatchRePostsWhileAnotherStreamWaitsForTheThread) {
  auto dev = make_tuned_device(1, 2, false);
  const StreamId F(600), G(601);
  const TensorIr x = upload_f32x2(*dev, 1.0f, 2.0f);
  bool re_posted = false;
  // F's 64-command turn must still be running when G's turn is posted right after it; a client
  // thread preempted for that whole turn would miss it, so a few tries are allowed.
  for (int attempt = 0; attempt < 20 && !re_posted; ++attempt) {
    const std::uint64_t before = dev->stream_stats(F) ? dev->stream_stats(F)->deferred : 0;
    const TensorIr f_last = add_halves_deferred(*dev, F, x, 64);
    const TensorIr g_last = add_halves_deferred(*dev, G, x, 1);
    dev->wake_stream(F);
    dev->wake_stream(G);
    Result<HostData> g = dev->read(G, g_last);
    Result<HostData> f = dev->read(F, f_last);
    ASSERT_TRUE(f.ok() && g.ok());
    EXPECT_FLOAT_EQ(first_f32(f), 1.0f + 0.5f * 64);
    EXPECT_FLOAT_EQ(first_f32(g), 1.5f);
    re_posted = dev->stream_stats(F)->deferred > before;
  }
  EXPECT_TRUE(re_posted) << "a spent batch never re-posted while another turn waited";
}

// A stream alone on its device runs batch after batch in place, but a strand handler posted for
// it (the memory report's snapshot, close_stream's quiesce) still gets in while its producer
// keeps feeding it: the report comes back before the producer stops.
TEST(Runtime, AStreamRunningInPlaceLetsItsSnapshotIn) {
  auto dev = make_tuned_device(2, 16, false);
  const StreamId K(800);
  const TensorIr x = upload_f32x2(*dev, 0.0f, 0.0f);
  std::atomic<bool> reported{false};
  std::atomic<bool> producer_stopped{false};
  std::thread producer([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    TensorIr cur = x;
    while (!reported.load() && std::chrono::steady_clock::now() < give_up) {
      const TensorId next = dev->new_tensor_id();
      if (!dev->register_op(K, ok(ir::build::scalar(ir::Family::NumericFloat, ir::OpKind::Numeric_AddScalar, cur,
                                                    ir::ScalarIr::Float(0.5), next)))
               .ok())
        break;
      // Each op consumes the last one's output: memory stays bounded, and the actor never runs
      // dry (a full intake makes this thread yield, never the actor idle).
      cur = TensorIr{next, {2}, TensorStatus::ReadWrite, ir::dtypes::f32};
    }
    (void)dev->read(K, cur);
    producer_stopped = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the producer is in full swing
  (void)dev->memory_report();
  const bool before_stop = !producer_stopped.load();
  reported = true;
  producer.join();
  EXPECT_TRUE(before_stop) << "the snapshot waited for the producer to stop";
  EXPECT_GT(dev->stream_stats(K)->turns, 1u);
}

// A waiter spins for its answer (RuntimeOptions::spin_waits) only when asked to and when the
// machine has a core for it beside the actor, and then (with the spin's limits stretched) every
// answer comes while it spins; the answers are the same either way.
TEST(Runtime, WaitersSpinOnlyWhenAskedAndACoreIsFree) {
  for (bool spin : {false, true}) {
    auto dev = make_tuned_device(2, 64, spin);
    const StreamId H(700);
    TensorIr cur = upload_f32x2(*dev, 0.0f, 0.0f);
    constexpr int kReads = 200;
    for (int i = 0; i < kReads; ++i) {
      const TensorIr next = add_halves_deferred(*dev, H, cur, 1);
      Result<HostData> d = dev->read(H, TensorIr{next.id, next.shape, TensorStatus::ReadOnly, next.dtype});
      ASSERT_TRUE(d.ok()) << d.error().to_string();
      ASSERT_FLOAT_EQ(first_f32(d), 0.5f * static_cast<float>(i + 1));
      cur = next;
    }
    const bool spins = spin && usable_cores() >= 2;
    if (!spins) {
      EXPECT_EQ(dev->spun_waits(), 0u) << "spin " << spin;
    } else {
      // The busy-stream count is a relaxed hint, updated just after the scheduled flag: a read
      // that lands while the previous turn ends (between the two, on a loaded machine) may see
      // the stream counted busy twice and sleep instead. Nearly every read spins.
      EXPECT_GE(dev->spun_waits(), static_cast<std::uint64_t>(kReads) * 9 / 10) << "spin " << spin;
      EXPECT_LE(dev->spun_waits(), static_cast<std::uint64_t>(kReads));
    }
  }
}

// drop_deferred: a queued Drop that does not wake the actor; the tensor is freed when the stream
// is woken (or waited on), not before.
TEST(Runtime, DeferredDropsRunOnWake) {
  auto dev = make_device();
  const StreamId C(300);
  const TensorIr xr = upload_f32x2(*dev, 0.5f, 1.0f);
  const TensorId c1 = dev->new_tensor_id();
  // Deferred, then drained by this thread (inline): no turn was ever posted for C, so none can
  // come along later and run the drop below by chance.
  ASSERT_TRUE(
      dev->register_op_deferred(C, ok(ir::build::unary(ir::Family::Float, ir::OpKind::Float_Exp, xr, c1))).ok());
  KILN_ASSERT_OK(dev->drain(C));
  ASSERT_EQ(dev->stream_stats(C)->turns, 0u);
  const std::uint64_t tensors_with_c1 = dev->backend().memory_stats().tensors;
  const std::uint64_t commands = dev->stream_stats(C)->commands;
  KILN_ASSERT_OK(dev->drop_deferred(C, TensorIr{c1, {2}, TensorStatus::ReadWrite, ir::dtypes::f32}));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(dev->stream_stats(C)->commands, commands);  // not run: nobody woke the actor
  EXPECT_EQ(dev->backend().memory_stats().tensors, tensors_with_c1);
  dev->wake_stream(C);
  for (int i = 0; i < 2000 && dev->stream_stats(C)->commands < commands + 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(dev->stream_stats(C)->commands, commands + 1);
  KILN_ASSERT_OK(dev->drain(C));
  EXPECT_EQ(dev->backend().memory_stats().tensors, tensors_with_c1 - 1);
}

// docs/spec/fusion.md §16.4: a read drains only when the tensor is not produced yet; a last-use read of a
// tensor queued ops still reference defers its free.
TEST(Runtime, ReadDrainsOnlyWhenNotProduced) {
  auto dev = make_device();
  Session s(*dev);
  const StreamId id = s.current_stream();
  Tensor x = ok(s.from_host(std::vector<float>{1, 2}, {2}));
  Tensor y = ok(s.exp(x));
  expect_near_all(ok(s.to_host(x)), {1, 2});  // materialized: Direct
  StreamStats st = *dev->stream_stats(id);
  EXPECT_EQ(st.drains, 0u);
  EXPECT_EQ(st.pending_ops, 1u);
  const TensorId xid = x.id();
  expect_near_all(ok(s.to_host(std::move(x))), {1, 2});  // last use, still referenced: DeferFree
  st = *dev->stream_stats(id);
  EXPECT_EQ(st.drains, 0u);
  EXPECT_EQ(st.pending_ops, 1u);
  EXPECT_TRUE(dev->backend().is_materialized(xid));
  expect_near_all(ok(s.to_host(y)), {std::exp(1.0), std::exp(2.0)});  // not produced: Drain
  st = *dev->stream_stats(id);
  EXPECT_EQ(st.drains, 1u);
  EXPECT_EQ(st.pending_ops, 0u);
  EXPECT_FALSE(dev->backend().is_materialized(xid));  // the deferred free ran at the boundary
}

// Caller runs: a wait on a stream with no turn running is served on the waiting thread
// (StreamStats::inline_runs), with the same results; RuntimeOptions::inline_waits = false keeps
// every command on the pool.
TEST(Runtime, InlineWaitsServeAnIdleStreamOnTheCallersThread) {
  for (bool inline_waits : {true, false}) {
    RuntimeOptions o;
    o.threads = 2;
    o.fusion = fusion::FusionConfig{};
    o.config_path = "";
    o.inline_waits = inline_waits;
    auto dev = ok(Device::create(make_backend(), std::move(o)));
    ASSERT_EQ(dev->options().inline_waits, inline_waits);
    Session s(*dev);
    const StreamId id = s.current_stream();
    Tensor x = ok(s.from_host(std::vector<float>{1, 2, 3}, {3}));
    // A turn may still be letting go of the stream right after a wait it answered: the actor is
    // idle within a few attempts, and then the next wait runs inline.
    std::uint64_t inline_runs = 0;
    for (int i = 0; i < 2000 && inline_runs == 0; ++i) {
      x = ok(s.add(std::move(x), 1.0));
      KILN_ASSERT_OK(s.sync());
      inline_runs = dev->stream_stats(id)->inline_runs;
    }
    if (inline_waits)
      EXPECT_GT(inline_runs, 0u);
    else
      EXPECT_EQ(inline_runs, 0u);
    // Values are the same either way: every op queued before a wait ran before it.
    const std::vector<float> before = ok(s.to_host(x));
    Tensor y = ok(s.mul(x, 2.0));
    Tensor z = ok(s.sub(y, 1.0));
    const std::vector<float> got = ok(s.to_host(std::move(z)));
    ASSERT_EQ(got.size(), 3u);
    for (std::size_t i = 0; i < 3; ++i) EXPECT_FLOAT_EQ(got[i], before[i] * 2 - 1);
    EXPECT_EQ(dev->stream_stats(id)->pending_ops, 0u);
  }
}

// docs/spec/fusion.md §16.5: drops from another thread neither enter nor cut the pending segment.
TEST(Runtime, ForeignDrops) {
  auto dev = make_device();
  Session s(*dev);
  const StreamId id = s.current_stream();
  Tensor x = ok(s.from_host(std::vector<float>{3, 4}, {2}));
  Tensor y = ok(s.mul_scalar(x, 2.0));
  const TensorId xid = x.id();
  // Materialized and still referenced by the pending exp: the free is deferred. (The foreign
  // command runs after every intake command pushed before it, so y is registered by then.)
  std::thread([t = std::move(x)]() mutable { Tensor dropped = std::move(t); }).join();
  // A drain from a third thread is a foreign command too, FIFO after the drop.
  std::thread([&] { KILN_EXPECT_OK(dev->drain(id)); }).join();
  EXPECT_FALSE(dev->backend().is_materialized(xid));  // freed at the drain's boundary
  EXPECT_EQ(dev->stream_stats(id)->drains, 1u);       // the drop itself did not drain
  expect_near_all(ok(s.to_host(std::move(y))), {6, 8});
  // A tensor not produced yet dropped from another thread: drain + queued Drop.
  Tensor u = ok(s.from_host(std::vector<float>{1}, {1}));
  Tensor v = ok(s.exp(u));
  const TensorId vid = v.id();
  std::thread([t = std::move(v)]() mutable { Tensor dropped = std::move(t); }).join();
  std::thread([&] { KILN_EXPECT_OK(dev->drain(id)); }).join();
  EXPECT_FALSE(dev->backend().is_materialized(vid));
  EXPECT_FALSE(dev->backend().error_of(vid).has_value());
  EXPECT_EQ(dev->stream_stats(id)->pending_ops, 0u);
}

// An execution failure: downstream tensors are errored with the same root and a skip count;
// other tensors and streams keep working.
TEST(Runtime, ExecutionFailurePropagates) {
  auto dev = make_device();
  Session s(*dev);
  Tensor x = ok(s.from_host(std::vector<float>{1, 2}, {2}));
  Tensor bad = ok(s.custom("kiln.test.boom", {x}, {2}, ir::dtypes::f32));
  Tensor d1 = ok(s.exp(bad));
  Tensor d2 = ok(s.mul_scalar(d1, 2.0));
  Tensor fine = ok(s.mul_scalar(x, 10.0));
  // The sync reports the stream's first failure since the last sync (issue 19.2), once.
  Status synced = s.sync();
  ASSERT_FALSE(synced.ok()) << "a sync answered ok for work that failed";
  EXPECT_NE(synced.error().message.find("kiln.test.boom"), std::string::npos) << synced.error().message;
  KILN_ASSERT_OK(s.sync());
  std::optional<ir::TensorError> root = dev->backend().error_of(bad.id());
  std::optional<ir::TensorError> e1 = dev->backend().error_of(d1.id());
  std::optional<ir::TensorError> e2 = dev->backend().error_of(d2.id());
  ASSERT_TRUE(root && e1 && e2);
  EXPECT_TRUE(e1->same_root(*root));
  EXPECT_TRUE(e2->same_root(*root));
  EXPECT_EQ(root->depth, 0u);
  EXPECT_EQ(e2->depth, 2u);
  Result<std::vector<float>> r = s.to_host(d2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::Execution);
  EXPECT_NE(r.error().message.find(root->root->message()), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("2 operations skipped"), std::string::npos) << r.error().message;
  // The same stream and other streams keep working.
  expect_near_all(ok(s.to_host(fine)), {10, 20});
  std::vector<float> other;
  std::thread([&] { other = ok(s.to_host(ok(s.exp(ok(s.from_host(std::vector<float>{0}, {1})))))); }).join();
  expect_near_all(other, {1});
  // A shared view of an errored tensor is errored with the same root.
  std::thread([&] {
    Tensor e = ok(s.exp(d1));
    Result<std::vector<float>> er = s.to_host(std::move(e));
    ASSERT_FALSE(er.ok());
    EXPECT_NE(er.error().message.find(root->root->message()), std::string::npos);
  }).join();
}

// Shutdown while producers are still pushing: returns, joins everything, later calls fail cleanly.
TEST(Runtime, ShutdownWhileBusy) {
  auto dev = make_device(2);
  Session s(*dev);
  std::atomic<int> started{0};
  std::vector<std::thread> producers;
  for (int t = 0; t < 4; ++t) {
    producers.emplace_back([&] {
      Result<Tensor> x = s.from_host(std::vector<float>(16, 0.0f), {16});
      if (!x.ok()) return;
      Tensor cur = std::move(x).value();
      started.fetch_add(1);
      for (int i = 0; i < 2000; ++i) {
        Result<Tensor> n = s.mul_scalar(std::move(cur), 1.0);
        if (!n.ok()) return;  // the device shut down
        cur = std::move(n).value();
      }
    });
  }
  while (started.load() < 4) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  Status st = dev->shutdown();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  if (!st.ok()) {
    EXPECT_NE(st.error().message.find("cancelled"), std::string::npos) << st.error().message;
  }
  for (auto& p : producers) p.join();
  EXPECT_TRUE(dev->is_shut_down());
  EXPECT_FALSE(s.from_host(std::vector<float>{1}, {1}).ok());
  KILN_EXPECT_OK(dev->shutdown());  // idempotent
}

// 8 threads x 200 ops on their own streams, with reads, cross-stream shares of a common tensor
// and values checked.
TEST(Runtime, StressThreadsTimesStreams) {
  constexpr int kThreads = 8, kOps = 200;
  auto dev = make_device(4);
  Session s(*dev);
  std::vector<Tensor> bases;
  for (int t = 0; t < kThreads; ++t) bases.push_back(ok(s.from_host(std::vector<float>(4, float(t)), {4})));
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Tensor ones = ok(s.from_host(std::vector<float>(4, 1.0f), {4}));
      Tensor x = ok(s.mul_scalar(bases[t], 1.0));  // shared view of a main-stream tensor
      for (int k = 0; k < kOps; ++k) {
        x = (k % 2 == 0) ? ok(s.add(std::move(x), ones)) : ok(s.mul_scalar(std::move(x), 1.0));
        if (k % 50 == 49) {
          std::vector<float> v = ok(s.to_host(x));
          const int adds = (k + 2) / 2;  // every other op adds 1 (whole ops: integer division)
          if (v.size() != 4 || v[0] != static_cast<float>(t + adds)) failures.fetch_add(1);
        }
      }
      std::vector<float> v = ok(s.to_host(std::move(x)));
      const int adds = kOps / 2;  // every other op adds 1
      for (float f : v)
        if (f != static_cast<float>(t + adds)) failures.fetch_add(1);
      std::vector<float> nb = ok(s.to_host(ok(s.add(bases[(t + 1) % kThreads], ones))));
      if (nb[0] != float((t + 1) % kThreads + 1)) failures.fetch_add(1);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  bases.clear();
  KILN_ASSERT_OK(dev->shutdown());
  EXPECT_EQ(dev->backend().memory_stats().tensors, 0u);
}

// Stream removal (docs/spec/fusion.md §16.6): a closed stream's actor goes away after its work ran; its
// results stay readable (they live in the device's table); the id can be used again afterwards.
TEST(Runtime, CloseStreamDrainsAndRemovesTheActor) {
  auto dev = make_device(2);
  {
    Session s(*dev);
    const StreamId explicit_stream = StreamId::from_number(41);
    Tensor a = ok(s.from_host(std::vector<float>{1, 2, 3, 4}, {4}));
    Tensor r = s.executes(explicit_stream, [&] { return ok(s.exp(ok(s.mul(a, 2.0)))); });
    const std::size_t before = dev->num_streams();
    KILN_ASSERT_OK(dev->close_stream(explicit_stream));
    EXPECT_EQ(dev->num_streams(), before - 1);
    EXPECT_FALSE(dev->stream_stats(explicit_stream).has_value());
    EXPECT_TRUE(dev->backend().is_materialized(r.id()));   // the drain ran it
    std::vector<float> got = ok(s.to_host(std::move(r)));  // re-creates the stream for the read
    ASSERT_EQ(got.size(), 4u);
    EXPECT_NEAR(got[3], std::exp(8.0), 1e-2);
    KILN_EXPECT_OK(dev->close_stream(StreamId::from_number(999)));  // unknown: nothing to do
  }
  KILN_ASSERT_OK(dev->shutdown());
  EXPECT_EQ(dev->backend().memory_stats().tensors, 0u);
}

// A close racing other threads that use the same stream (a cross-stream drain, an importer's
// shared view, a reader, a foreign registration, a wake): every call completes, or fails with an error
// that names the closed stream; none reaches a destroyed actor. An actor is reached with its
// table entry read-locked, and a close waits for that lock before it erases and destroys it (the
// dev preset's ASan and the tsan preset report a use after free otherwise).
TEST(Runtime, ClosingAStreamWhileOtherThreadsUseIt) {
  auto dev = make_device(2);
  const TensorIr x = upload_f32x2(*dev, 1.0f, 2.0f);
  std::atomic<int> failures{0}, unavailable{0}, after_close{0};
  auto check = [&](const Status& st) {
    if (st.ok()) return;
    if (st.error().message.find("closed") != std::string::npos) {
      unavailable.fetch_add(1);
      return;
    }
    // The stream re-created by a late call no longer knows the closed one's tensors.
    if (st.error().code == ErrorCode::InvalidHandle || st.error().message.find("unknown") != std::string::npos ||
        st.error().message.find("no data") != std::string::npos)
      return;
    ADD_FAILURE() << st.error().to_string();
    failures.fetch_add(1);
  };
  constexpr int kRounds = 60;
  for (int round = 0; round < kRounds; ++round) {
    const StreamId s(7000 + round);
    const TensorId y = dev->new_tensor_id();
    ASSERT_TRUE(dev->register_op(s, ok(ir::build::scalar(ir::Family::NumericFloat, ir::OpKind::Numeric_AddScalar, x,
                                                         ir::ScalarIr::Float(0.5), y)))
                    .ok());
    const TensorIr y_ro{y, {2}, TensorStatus::ReadOnly, ir::dtypes::f32};
    std::atomic<bool> closed{false};
    std::vector<std::thread> users;
    for (int kind = 0; kind < 4; ++kind) {
      users.emplace_back([&, kind] {
        // Calls before, during and after the close: up to 400 before it, then (however the
        // threads are scheduled: on one core they may all get there before the close starts)
        // 20 after it.
        for (int late = 0, i = 0; late < 20; ++i) {
          if (closed.load()) {
            after_close.fetch_add(1);
            ++late;
          } else if (i >= 400) {
            std::this_thread::sleep_for(std::chrono::microseconds(20));
            continue;
          }
          switch (kind) {
            case 0: {
              Result<HostData> d = dev->read(s, y_ro);
              if (d.ok() && first_f32(d) != 1.5f) {
                ADD_FAILURE() << "read " << first_f32(d) << ", want 1.5";
                failures.fetch_add(1);
              }
              if (!d.ok()) check(d.error());
              break;
            }
            case 1: {
              const TensorId view = dev->new_tensor_id();
              check(dev->share(s, y, s, view));
              break;
            }
            case 2:
              check(dev->drain(s));
              dev->wake_stream(s);
              (void)dev->stream_stats(s);
              break;
            default:
              check(dev->register_op(s, ok(ir::build::scalar(ir::Family::NumericFloat, ir::OpKind::Numeric_MulScalar, x,
                                                             ir::ScalarIr::Float(2.0), dev->new_tensor_id()))));
              break;
          }
        }
      });
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50 * (round % 8)));
    check(dev->close_stream(s));
    closed.store(true);
    for (std::thread& t : users) t.join();
    check(dev->close_stream(s));  // whatever the late calls re-created
    EXPECT_FALSE(dev->stream_stats(s).has_value());
  }
  EXPECT_EQ(failures.load(), 0);
  // The race was run: calls came after closes, not only before them.
  EXPECT_GT(after_close.load(), 0);
  KILN_EXPECT_OK(dev->shutdown());
}

// A close or shutdown cancels what its drain did not run. A cancelled registration and a
// cancelled drop are not run, but what they consumed is released: no later command names those
// tensors, so nothing else would free them (a daemon would hold them until it stops).
TEST(Runtime, CancelledRegistrationsAndDropsReleaseWhatTheyConsumed) {
  std::unique_ptr<DeviceBackend> backend = make_backend();
  std::uint64_t next_id = 1;
  auto upload = [&](float v) {
    const TensorId id(next_id++);
    const std::vector<float> data{v, v};
    EXPECT_TRUE(backend->upload(id, ir::dtypes::f32, {2}, std::as_bytes(std::span<const float>(data))).ok());
    return TensorIr{id, {2}, TensorStatus::ReadWrite, ir::dtypes::f32};
  };
  const TensorIr consumed = upload(1.0f), dropped = upload(2.0f), kept = upload(3.0f);
  const std::uint64_t before = backend->memory_stats().tensors;
  ASSERT_EQ(before, 3u);
  fusion::FusionLog log;
  fusion::ExecutionPlanStore store;
  std::atomic<std::int64_t> turns_waiting{0}, busy_streams{0};
  boost::asio::thread_pool pool(1);
  ActorContext ctx;
  ctx.backend = backend.get();
  ctx.store = &store;
  ctx.log = &log;
  ctx.turns_waiting = &turns_waiting;
  ctx.busy_streams = &busy_streams;
  {
    StreamActor actor(StreamId(1), ctx, pool);
    // Queued without waking the actor (as the daemon defers a burst): nothing runs them.
    ASSERT_TRUE(
        actor.submit_op(ok(ir::build::unary(ir::Family::Float, ir::OpKind::Float_Exp, consumed, TensorId(100))), false)
            .ok());
    TensorIr kept_ro = kept;
    kept_ro.status = TensorStatus::ReadOnly;  // read, not consumed: it stays
    ASSERT_TRUE(
        actor.submit_op(ok(ir::build::unary(ir::Family::Float, ir::OpKind::Float_Exp, kept_ro, TensorId(101))), false)
            .ok());
    // A drop from another thread than the stream's producer: a foreign drop.
    std::thread([&] { KILN_ASSERT_OK(actor.submit_drop(dropped, false)); }).join();
    EXPECT_EQ(backend->memory_stats().tensors, before);
    EXPECT_EQ(actor.cancel_pending("test"), 3u);
    EXPECT_EQ(backend->memory_stats().tensors, 1u);  // `kept` only; the outputs never existed
    EXPECT_TRUE(backend->is_materialized(kept.id));
    EXPECT_FALSE(backend->is_materialized(consumed.id));
    EXPECT_FALSE(backend->is_materialized(dropped.id));
  }
  pool.join();
}

// docs/spec/fusion.md §16.8: the memory check. A live tensor shows in the report (its handle and the
// stream variable that tracks it, in the spec's rendering); once it is dropped and the stream
// drained, the check passes.
TEST(Runtime, MemoryCheckReportsWhatIsLeft) {
  auto dev = make_device(2);
  {
    Session s(*dev);
    Tensor kept = ok(s.exp(ok(s.from_host(std::vector<float>{1, 2}, {2}))));
    KILN_ASSERT_OK(s.sync());
    const MemoryReport r = dev->memory_report();
    EXPECT_FALSE(r.clean());
    EXPECT_GE(r.handles, 1u);
    ASSERT_FALSE(r.streams.empty());
    const std::string text = r.to_string();
    EXPECT_NE(text.find("==== Fusion Memory Report ===="), std::string::npos) << text;
    EXPECT_NE(text.find("TensorId(" + std::to_string(kept.id().value()) + ") => status:"), std::string::npos) << text;
    Status leak = dev->check_memory_leaks();
    ASSERT_FALSE(leak.ok());
    EXPECT_NE(leak.error().message.find("Handles: "), std::string::npos);
  }
  // The session's drops are queued; a drain of the stream runs them.
  KILN_ASSERT_OK(dev->shutdown());
  Status clean = dev->check_memory_leaks();
  EXPECT_TRUE(clean.ok()) << clean.error().to_string();
}

// The MLP of the benchmarks and the demo (apps/common): matmuls, broadcasts, reductions, masks,
// swaps and four fused Adam chains per step; 40 steps must bring the loss well down, and the
// hand-written backward pass must agree with the forward one (a wrong kernel stalls the loss).
TEST(Runtime, MlpTrainingLossFalls) {
  auto dev = make_device(2);
  {
    Session s(*dev);
    apps::MlpTrainer<Session, Tensor> mlp(s, apps::MlpOptions{.batch = 32, .seed = 7});
    KILN_ASSERT_OK(mlp.init());
    double first = 0, last = 0;
    for (int i = 0; i < 40; ++i) {
      Result<double> loss = mlp.step();
      ASSERT_TRUE(loss.ok()) << loss.error().to_string();
      ASSERT_TRUE(std::isfinite(*loss));
      if (i < 3) first += *loss / 3;
      if (i >= 37) last += *loss / 3;
    }
    EXPECT_LT(last, 0.6 * first) << "first " << first << " last " << last;
  }
  KILN_ASSERT_OK(dev->shutdown());
  EXPECT_EQ(dev->backend().memory_stats().tensors, 0u);
}

}  // namespace
}  // namespace kiln::runtime

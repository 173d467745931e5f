// The fixture the client-API suites share (api_test.cc, api_ops_test.cc). Each suite is built three
// times (tests/runtime/CMakeLists.txt): in process over the reference backend, in process over the
// fast one (KILN_TEST_FAST_BACKEND), and over IPC (KILN_TEST_IPC: the client library and a daemon
// service on the fast backend, ipc_harness.h).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/base/mutex.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/cpu/reference_backend.h"
#include "kiln/runtime/device.h"
#include "kiln/runtime/session.h"
#include "kiln/testing/status.h"
#if KILN_TEST_IPC
#include "ipc_harness.h"
#endif

namespace kiln::runtime::api_testing {

inline std::unique_ptr<DeviceBackend> make_backend() {
#if KILN_TEST_FAST_BACKEND || KILN_TEST_IPC
  return std::make_unique<cpu::CpuBackend>(cpu::CpuBackendOptions{.threads = 2, .jit = cpu::CpuJitMode::Off});
#else
  return std::make_unique<cpu::ReferenceCpuBackend>();
#endif
}

inline std::unique_ptr<Device> make_device(std::size_t threads = 2) {
  RuntimeOptions o;
  o.threads = threads;
  o.fusion = fusion::FusionConfig{};
  o.config_path = "";  // never read a kiln.toml from the test's directory
  Result<std::unique_ptr<Device>> d = Device::create(make_backend(), std::move(o));
  KILN_EXPECT_OK(d);
  return std::move(d).value();
}

// A device and the Session `s` the test drives; the suite's fixture makes `s` over direct_target()
// (or over a wrapper of it) in its constructor.
class SessionFixture : public ::testing::Test {
 protected:
  std::unique_ptr<Device> dev = make_device();
#if KILN_TEST_IPC
  kiln::testing::IpcHarness ipc{*dev};
#endif
  std::unique_ptr<Session> s;

  // What a Session sends to: the device itself, or the IPC client of a daemon serving it.
  SessionTarget& direct_target() {
#if KILN_TEST_IPC
    return ipc.target();
#else
    return *dev;
#endif
  }

  // Before the target (and any wrapper of it a derived fixture owns) goes away.
  void TearDown() override { s.reset(); }

  Tensor f32(std::vector<float> v, ir::Shape shape) { return ::kiln::testing::ok(s->from_host(v, std::move(shape))); }
  Tensor i64(std::vector<std::int64_t> v, ir::Shape shape) {
    return ::kiln::testing::ok(s->from_host(v, std::move(shape)));
  }
  Tensor bools(std::vector<bool> v, ir::Shape shape) { return ::kiln::testing::ok(s->from_host(v, std::move(shape))); }
  // Reads an f32 tensor and checks its shape.
  std::vector<double> get(Result<Tensor> r, const ir::Shape& shape) {
    Tensor t = ::kiln::testing::ok(std::move(r));
    EXPECT_EQ(t.shape(), shape);
    std::vector<float> v = ::kiln::testing::ok(s->to_host<float>(std::move(t)));
    return std::vector<double>(v.begin(), v.end());
  }
  std::vector<bool> get_bool(Result<Tensor> r, const ir::Shape& shape) {
    Tensor t = ::kiln::testing::ok(std::move(r));
    EXPECT_EQ(t.shape(), shape);
    EXPECT_EQ(t.dtype(), Session::kBoolDType);
    return ::kiln::testing::ok(s->to_host<bool>(std::move(t)));
  }
  std::vector<std::int64_t> get_i64(Result<Tensor> r, const ir::Shape& shape) {
    Tensor t = ::kiln::testing::ok(std::move(r));
    EXPECT_EQ(t.shape(), shape);
    return ::kiln::testing::ok(s->to_host<std::int64_t>(std::move(t)));
  }
};

// A SessionTarget that forwards everything and records the kind of every registered operation
// ("NumericFloat::Lower"): what a Session call emitted, in order, in process and over IPC alike.
class RecordingTarget final : public SessionTarget {
 public:
  explicit RecordingTarget(SessionTarget& inner) : inner_(inner) {}

  // The kinds registered since the last call.
  std::vector<std::string> take() {
    MutexLock lock(mu_);
    return std::exchange(kinds_, {});
  }
  // Every kind seen since construction, take() or not. An upload counts as Init (kiln registers
  // the buffer out of band where Burn's client emits Init{out}) and a drop as Drop (the runtime
  // queues Drop(t) for it).
  std::set<ir::OpKind> seen() {
    MutexLock lock(mu_);
    return seen_;
  }

  ir::TensorId new_tensor_id() override { return inner_.new_tensor_id(); }
  ir::TensorId new_tensor_ids(std::uint64_t count) override { return inner_.new_tensor_ids(count); }
  Status upload(StreamId home, ir::TensorId id, ir::DType dtype, ir::Shape shape,
                std::span<const std::byte> bytes) override {
    see(ir::OpKind::Init_Init);
    return inner_.upload(home, id, dtype, std::move(shape), bytes);
  }
  Status register_op(StreamId stream, ir::Operation&& op) override {
    {
      MutexLock lock(mu_);
      kinds_.push_back(op.kind_name());
      seen_.insert(op.kind);
    }
    return inner_.register_op(stream, std::move(op));
  }
  Status drain(StreamId stream) override { return inner_.drain(stream); }
  Result<HostData> read(StreamId home, const ir::TensorIr& t) override { return inner_.read(home, t); }
  Status read_into(StreamId home, const ir::TensorIr& t, std::span<std::byte> dst) override {
    return inner_.read_into(home, t, dst);
  }
  Status drop(StreamId home, const ir::TensorIr& t) override {
    see(ir::OpKind::Drop_Drop);
    return inner_.drop(home, t);
  }
  Status share(StreamId src_stream, ir::TensorId src, StreamId dst_stream, ir::TensorId dst) override {
    return inner_.share(src_stream, src, dst_stream, dst);
  }
  void claim_stream(StreamId stream) override { inner_.claim_stream(stream); }

 private:
  void see(ir::OpKind kind) KILN_EXCLUDES(mu_) {
    MutexLock lock(mu_);
    seen_.insert(kind);
  }

  SessionTarget& inner_;
  Mutex mu_;
  std::vector<std::string> kinds_ KILN_GUARDED_BY(mu_);
  std::set<ir::OpKind> seen_ KILN_GUARDED_BY(mu_);
};

// SessionFixture with `s` over a RecordingTarget: kinds_of(f) says what f registered.
class RecordingSessionFixture : public SessionFixture {
 protected:
  RecordingTarget rec{direct_target()};

  RecordingSessionFixture() { s = std::make_unique<Session>(rec); }

  // The kinds `f` registers (its inputs are uploaded before: uploads register no operation).
  template <class F>
  std::vector<std::string> kinds_of(F&& f) {
    (void)rec.take();
    f();
    return rec.take();
  }
};

// Element by element, relative to the larger of 1 and |want|.
inline void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << "at " << i;
}

}  // namespace kiln::runtime::api_testing

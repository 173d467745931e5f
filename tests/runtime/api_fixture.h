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
#include <utility>
#include <vector>

#include <gtest/gtest.h>

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

// Element by element, relative to the larger of 1 and |want|.
inline void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << "at " << i;
}

}  // namespace kiln::runtime::api_testing

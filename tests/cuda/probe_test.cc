// probe() on whatever machine runs the tests (no GPU on the development VM: a reason, no
// crash), and the --device / KILN_DEVICE choice.
#include <gtest/gtest.h>

#include "kiln/cuda/probe.h"
#include "kiln/testing/status.h"

namespace kiln::cuda {
namespace {

TEST(Probe, ReturnsCleanlyWithDevicesOrAReason) {
  const ProbeResult p = probe();
  EXPECT_GE(p.runtime_version, 12000) << "built against a CUDA 12+ runtime";
  if (p.available()) {
    EXPECT_TRUE(p.reason.empty());
    for (const DeviceInfo& d : p.devices) {
      EXPECT_FALSE(d.name.empty());
      EXPECT_GE(d.arch(), 50);
      EXPECT_GT(d.total_memory, 0u);
    }
  } else {
    EXPECT_FALSE(p.reason.empty());
    if (p.driver_version == 0) {
      EXPECT_EQ(p.reason, "no CUDA driver found");
    }
  }
  std::printf("probe: %s\n", p.describe().c_str());
  // Probing twice is harmless (cudart's error state is cleared).
  const ProbeResult q = probe();
  EXPECT_EQ(q.available(), p.available());
  EXPECT_EQ(q.reason, p.reason);
}

ProbeResult with_gpu() {
  ProbeResult p;
  p.driver_version = 13000;
  p.runtime_version = 13000;
  p.devices.push_back(DeviceInfo{0, "NVIDIA H200", 9, 0, std::uint64_t{141} << 30, 132, true});
  return p;
}
ProbeResult without_gpu() {
  ProbeResult p;
  p.runtime_version = 13000;
  p.reason = "no CUDA driver found";
  return p;
}

TEST(Probe, AutoPicksTheGpuWhenThereIsOne) {
  Result<DeviceChoice> c = choose_device("auto", with_gpu());
  KILN_ASSERT_OK(c);
  EXPECT_EQ(c->kind, DeviceKind::Cuda);
  EXPECT_EQ(c->ordinal, 0);
  EXPECT_NE(c->why.find("H200"), std::string::npos);
  c = choose_device("", without_gpu());
  KILN_ASSERT_OK(c);
  EXPECT_EQ(c->kind, DeviceKind::Cpu);
  EXPECT_EQ(c->why, "auto: no GPU: no CUDA driver found");
}

TEST(Probe, ExplicitRequests) {
  EXPECT_EQ(choose_device("cpu", with_gpu())->kind, DeviceKind::Cpu);
  EXPECT_EQ(choose_device("CUDA", with_gpu())->kind, DeviceKind::Cuda);
  EXPECT_EQ(choose_device("cuda:0", with_gpu())->ordinal, 0);
  EXPECT_EQ(choose_device("cuda0", with_gpu())->ordinal, 0) << "the form of a systemd instance, kilnd@cuda0";
  EXPECT_NE(choose_device("cuda1", with_gpu()).error().message.find("only 1 CUDA device"), std::string::npos);
  Result<DeviceChoice> c = choose_device("cuda:1", with_gpu());
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, ErrorCode::Config);
  EXPECT_NE(c.error().message.find("only 1 CUDA device"), std::string::npos) << c.error().message;
  c = choose_device("cuda", without_gpu());
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.error().message.find("no CUDA driver found"), std::string::npos) << c.error().message;
  for (const char* bad : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:1x", "cudax", "cuda-1", "cuda0x"}) {
    c = choose_device(bad, with_gpu());
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.error().code, ErrorCode::Config);
  }
}

TEST(Probe, Describe) {
  EXPECT_EQ(without_gpu().describe(), "no GPU: no CUDA driver found (runtime 13.0)");
  EXPECT_EQ(with_gpu().describe(), "1 CUDA device: NVIDIA H200 (sm_90, 141 GiB, 132 SMs); driver 13.0, runtime 13.0");
}

}  // namespace
}  // namespace kiln::cuda

namespace kiln::cuda {
namespace {

TEST(Probe, SelectDeviceReadsTheEnvironment) {
  ::setenv("KILN_DEVICE", "cpu", 1);
  Result<DeviceChoice> c = select_device("");
  KILN_ASSERT_OK(c);
  EXPECT_EQ(c->kind, DeviceKind::Cpu);
  ::setenv("KILN_DEVICE", "nonsense", 1);
  EXPECT_FALSE(select_device("").ok());
  EXPECT_TRUE(select_device("cpu").ok()) << "the flag wins over the environment";
  ::unsetenv("KILN_DEVICE");
  c = select_device("auto");
  KILN_ASSERT_OK(c);
  EXPECT_EQ(c->kind == DeviceKind::Cuda, probe().available());
}

}  // namespace
}  // namespace kiln::cuda

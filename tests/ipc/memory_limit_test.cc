// The default device memory limit's inputs (kiln/ipc/memory_limit.h): MemTotal and the memory
// cgroup limits on this process's path, read from fake /proc and /sys/fs/cgroup trees.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "kiln/ipc/memory_limit.h"

namespace kiln::ipc {
namespace {

namespace fs = std::filesystem;

class FakeHost : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kiln-memlimit-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    write("proc/meminfo", "MemTotal:       8388608 kB\nMemFree:        1000 kB\n");  // 8 GiB
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  HostMemory read() const { return read_host_memory((root_ / "proc").string(), (root_ / "cgroup").string()); }
  fs::path root_;
};

constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;

TEST_F(FakeHost, NoCgroupLimitUsesMemTotal) {
  write("proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  write("cgroup/cgroup.controllers", "memory\n");
  write("cgroup/user.slice/session-1.scope/memory.max", "max\n");
  const HostMemory h = read();
  EXPECT_EQ(h.mem_total, 8 * kGiB);
  EXPECT_FALSE(h.cgroup_limit.has_value());
  EXPECT_EQ(default_host_memory_limit(h), static_cast<std::uint64_t>(8 * kGiB * 0.8));
}

TEST_F(FakeHost, V2TakesTheSmallestLimitOnThePath) {
  write("proc/self/cgroup", "0::/jobs/a/b\n");
  write("cgroup/cgroup.controllers", "memory\n");
  write("cgroup/jobs/memory.max", std::to_string(2 * kGiB) + "\n");  // an ancestor's bound counts
  write("cgroup/jobs/a/memory.max", "max\n");
  write("cgroup/jobs/a/b/memory.max", std::to_string(3 * kGiB) + "\n");
  const HostMemory h = read();
  ASSERT_TRUE(h.cgroup_limit.has_value());
  EXPECT_EQ(*h.cgroup_limit, 2 * kGiB);
  EXPECT_NE(h.cgroup_file.find("jobs/memory.max"), std::string::npos) << h.cgroup_file;
  EXPECT_EQ(default_host_memory_limit(h), static_cast<std::uint64_t>(2 * kGiB * 0.8));
}

TEST_F(FakeHost, V1MemoryControllerOnAHybridSystem) {
  write("proc/self/cgroup", "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n");
  write("cgroup/unified/cgroup.controllers", "");
  write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "no limit"
  write("cgroup/memory/process_api/abc/memory.limit_in_bytes", std::to_string(1536ull << 20) + "\n");
  const HostMemory h = read();
  ASSERT_TRUE(h.cgroup_limit.has_value());
  EXPECT_EQ(*h.cgroup_limit, 1536ull << 20);
  EXPECT_EQ(default_host_memory_limit(h), static_cast<std::uint64_t>((1536ull << 20) * 0.8));
}

TEST_F(FakeHost, ANamespacedPathFallsBackToTheMountRoot) {
  write("proc/self/cgroup", "0::/not/visible/here\n");
  write("cgroup/cgroup.controllers", "memory\n");
  write("cgroup/memory.max", std::to_string(kGiB) + "\n");
  const HostMemory h = read();
  ASSERT_TRUE(h.cgroup_limit.has_value());
  EXPECT_EQ(*h.cgroup_limit, kGiB);
}

TEST_F(FakeHost, MemTotalBoundsALargerCgroupLimit) {
  write("proc/self/cgroup", "0::/big\n");
  write("cgroup/cgroup.controllers", "memory\n");
  write("cgroup/big/memory.max", std::to_string(64 * kGiB) + "\n");
  EXPECT_EQ(default_host_memory_limit(read()), static_cast<std::uint64_t>(8 * kGiB * 0.8));
}

TEST(HostMemory, ThisMachineHasAMemTotal) {
  const HostMemory h = read_host_memory();
  EXPECT_GT(h.mem_total, 0u);
  ASSERT_TRUE(default_host_memory_limit(h).has_value());
  EXPECT_LE(*default_host_memory_limit(h), h.mem_total);
}

}  // namespace
}  // namespace kiln::ipc

// usable_cores(): the affinity mask and the cgroup CPU quota (cgroup_cpu_quota_cores), the
// latter over fake /proc/<pid>/cgroup files and cgroup trees in a temporary directory.
#include "kiln/runtime/usable_cores.h"

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace kiln::runtime {
namespace {

namespace fs = std::filesystem;

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("kiln_cgroup_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "sys");
  }
  void TearDown() override { fs::remove_all(root_); }

  // Writes `text` at sys/<rel>, creating its directories.
  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / "sys" / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  fs::path proc_cgroup(const std::string& text) {
    const fs::path p = root_ / "cgroup";
    std::ofstream(p) << text;
    return p;
  }
  fs::path sys() const { return root_ / "sys"; }

  fs::path root_;
};

TEST_F(CgroupTree, V2QuotaRoundsUpToWholeCores) {
  write("kubepods/pod1/cpu.max", "150000 100000\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("0::/kubepods/pod1\n"), sys()), 2u);
}

TEST_F(CgroupTree, V2AncestorsLimitToo) {
  // The pod allows 4 cores, its parent 1.5: the parent's limit holds for the whole subtree.
  write("kubepods/cpu.max", "150000 100000\n");
  write("kubepods/pod1/cpu.max", "400000 100000\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("0::/kubepods/pod1\n"), sys()), 2u);
  write("kubepods/cpu.max", "max 100000\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("0::/kubepods/pod1\n"), sys()), 4u);
}

TEST_F(CgroupTree, V2NoLimitIsNone) {
  write("user.slice/cpu.max", "max 100000\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("0::/user.slice\n"), sys()), std::nullopt);
}

TEST_F(CgroupTree, V2InsideAContainerReadsTheMountRoot) {
  // The listed path names the host's view; in the container the cgroup is the mount's root.
  write("cpu.max", "200000 100000\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("0::/docker/0123abcd\n"), sys()), 2u);
}

TEST_F(CgroupTree, V2UnderTheHybridUnifiedMount) {
  write("unified/svc/cpu.max", "300000 100000\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("1:cpu,cpuacct:/\n0::/svc\n"), sys()), 3u);
}

TEST_F(CgroupTree, V1CfsQuota) {
  write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000\n");
  write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  const fs::path pc = proc_cgroup("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n2:cpuset:/\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(pc, sys()), 3u);
  write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");  // unlimited
  EXPECT_EQ(cgroup_cpu_quota_cores(pc, sys()), std::nullopt);
}

TEST_F(CgroupTree, V1MountedAsCpuOnly) {
  write("cpu/cpu.cfs_quota_us", "50000\n");  // half a core: still one
  write("cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("2:cpu:/\n"), sys()), 1u);
}

TEST_F(CgroupTree, OtherControllersAreNotTheCpuOne) {
  // cpuset and cpuacct hierarchies hold no quota, even with quota-named files in them.
  write("cpuacct/cpu.cfs_quota_us", "100000\n");
  write("cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("2:cpuacct:/\n3:cpuset:/\n"), sys()), std::nullopt);
}

TEST_F(CgroupTree, MissingOrMalformedFilesAreNoLimit) {
  EXPECT_EQ(cgroup_cpu_quota_cores(root_ / "no-such-file", sys()), std::nullopt);
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("garbage without colons\n0::/a\n"), sys()), std::nullopt);
  write("a/cpu.max", "lots 100000\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("0::/a\n"), sys()), std::nullopt);
  write("a/cpu.max", "100000\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("0::/a\n"), sys()), std::nullopt);
  write("a/cpu.max", "100000 0\n");
  EXPECT_EQ(cgroup_cpu_quota_cores(proc_cgroup("0::/a\n"), sys()), std::nullopt);
}

// This process: the affinity mask bounds it, and so does the quota its cgroups set, if any.
TEST(UsableCores, AtMostTheAffinityMaskAndTheQuota) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const unsigned cores = usable_cores();
  EXPECT_GE(cores, 1u);
  EXPECT_LE(cores, static_cast<unsigned>(CPU_COUNT(&set)));
  if (const auto quota = cgroup_cpu_quota_cores("/proc/self/cgroup", "/sys/fs/cgroup")) {
    EXPECT_EQ(cores, std::min<unsigned>(*quota, static_cast<unsigned>(CPU_COUNT(&set))));
  } else {
    EXPECT_EQ(cores, static_cast<unsigned>(CPU_COUNT(&set)));
  }
}

}  // namespace
}  // namespace kiln::runtime

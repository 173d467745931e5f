// usable_cores(): the affinity mask and the cgroup CPU quota (cgroup_cpu_quota_cores), the
// latter over fake /proc/<pid>/cgroup and mountinfo files and cgroup trees in a temporary
// directory.
#include "kiln/runtime/usable_cores.h"

#include <sched.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace kiln::runtime {
namespace {

namespace fs = std::filesystem;

class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kiln_cgroup_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Writes `text` at <tmp>/<rel>, creating its directories.
  void write(const std::string& rel, const std::string& text) {
    const fs::path p = root_ / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  // A mountinfo line for a cgroup2 mount, or a v1 one with `controllers`, at <tmp>/<at>.
  std::string v2_mount(const std::string& at, const std::string& root = "/") const {
    return "29 23 0:26 " + root + " " + (root_ / at).string() + " rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
  }
  std::string v1_mount(const std::string& at, const std::string& controllers, const std::string& root = "/") const {
    return "35 24 0:30 " + root + " " + (root_ / at).string() + " rw,relatime shared:9 - cgroup cgroup rw," +
           controllers + "\n";
  }
  std::optional<unsigned> quota(const std::string& proc_cgroup, const std::string& mountinfo) {
    write("proc/cgroup", proc_cgroup);
    write("proc/mountinfo", mountinfo);
    return cgroup_cpu_quota_cores((root_ / "proc/cgroup").string(), (root_ / "proc/mountinfo").string());
  }

  fs::path root_;
};

TEST_F(CgroupTree, V2QuotaRoundsUpToWholeCores) {
  write("cg/kubepods/pod1/cpu.max", "150000 100000\n");
  EXPECT_EQ(quota("0::/kubepods/pod1\n", v2_mount("cg")), 2u);
  write("cg/kubepods/pod1/cpu.max", "120000 100000\n");  // up, not to the nearest
  EXPECT_EQ(quota("0::/kubepods/pod1\n", v2_mount("cg")), 2u);
  write("cg/kubepods/pod1/cpu.max", "50000 100000\n");  // half a core: still one
  EXPECT_EQ(quota("0::/kubepods/pod1\n", v2_mount("cg")), 1u);
}

TEST_F(CgroupTree, V2TheSmallestOnTheWayUpWins) {
  // The parent allows 1.5 cores, the pod 4: the parent's limit holds for its whole subtree.
  write("cg/kubepods/cpu.max", "150000 100000\n");
  write("cg/kubepods/pod1/cpu.max", "400000 100000\n");
  EXPECT_EQ(quota("0::/kubepods/pod1\n", v2_mount("cg")), 2u);
  // The other way round: the pod's own 1.5 under a parent's 4.
  write("cg/kubepods/cpu.max", "400000 100000\n");
  write("cg/kubepods/pod1/cpu.max", "150000 100000\n");
  EXPECT_EQ(quota("0::/kubepods/pod1\n", v2_mount("cg")), 2u);
  write("cg/kubepods/pod1/cpu.max", "max 100000\n");
  EXPECT_EQ(quota("0::/kubepods/pod1\n", v2_mount("cg")), 4u);
}

TEST_F(CgroupTree, V2AnAncestorLimitsAProcessWhoseOwnCgroupHasNoFiles) {
  write("cg/kubepods/cpu.max", "100000 100000\n");
  EXPECT_EQ(quota("0::/kubepods/gone\n", v2_mount("cg")), 1u);
}

TEST_F(CgroupTree, V2NoLimitIsNone) {
  write("cg/user.slice/cpu.max", "max 100000\n");
  EXPECT_EQ(quota("0::/user.slice\n", v2_mount("cg")), std::nullopt);
}

TEST_F(CgroupTree, V2HugeQuotasDoNotWrap) {
  // The kernel takes quotas far above UINT_MAX cores' worth: practically no limit, not 1.
  write("cg/a/cpu.max", "4294967297000 1000\n");
  EXPECT_EQ(quota("0::/a\n", v2_mount("cg")), 4294967295u);
}

TEST_F(CgroupTree, AContainerSeesItsOwnCgroupAsTheMountRoot) {
  // The host's path is listed (no cgroup namespace); the mount's root names the same cgroup.
  write("cg/cpu.max", "200000 100000\n");
  EXPECT_EQ(quota("0::/docker/0123abcd\n", v2_mount("cg", "/docker/0123abcd")), 2u);
  // A sibling of the mount's root is not below it: nothing to read for it.
  EXPECT_EQ(quota("0::/docker/other\n", v2_mount("cg", "/docker/0123abcd")), std::nullopt);
}

TEST_F(CgroupTree, ACgroupOutsideTheNamespaceIsSkipped) {
  write("cg/cpu.max", "100000 100000\n");
  write("x/cpu.max", "100000 100000\n");
  EXPECT_EQ(quota("0::/../x\n", v2_mount("cg")), std::nullopt);
}

TEST_F(CgroupTree, MountPointsWithSlashesAndEscapes) {
  write("my cg/a/cpu.max", "300000 100000\n");
  const std::string escaped = "29 23 0:26 / " + (root_ / "my\\040cg").string() + "/ rw - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(quota("0::/a/\n", escaped), 3u);
}

TEST_F(CgroupTree, V1CfsQuota) {
  write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "250000\n");
  write("cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n");
  const std::string pc = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n2:cpuset:/\n";
  const std::string mi = v1_mount("memory", "memory") + v1_mount("cpu,cpuacct", "cpu,cpuacct");
  EXPECT_EQ(quota(pc, mi), 3u);
  write("cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "-1\n");  // unlimited
  EXPECT_EQ(quota(pc, mi), std::nullopt);
}

TEST_F(CgroupTree, V1FoundWhereverItsMountIs) {
  // The hierarchy is listed as "cpu,cpuacct" but mounted at a directory called "cpu".
  write("cpu/cpu.cfs_quota_us", "200000\n");
  write("cpu/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(quota("3:cpu,cpuacct:/\n", v1_mount("cpu", "cpu,cpuacct")), 2u);
}

TEST_F(CgroupTree, OtherControllersAreNotTheCpuOne) {
  // cpuset and cpuacct hierarchies hold no quota, even with quota-named files in them.
  write("cpuacct/cpu.cfs_quota_us", "100000\n");
  write("cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(quota("2:cpuacct:/\n3:cpuset:/\n", v1_mount("cpuacct", "cpuacct") + v1_mount("cpuset", "cpuset")),
            std::nullopt);
}

TEST_F(CgroupTree, HybridTakesTheSmallerOfV1AndV2) {
  write("cpu/cpu.cfs_quota_us", "300000\n");
  write("cpu/cpu.cfs_period_us", "100000\n");
  write("unified/svc/cpu.max", "200000 100000\n");
  const std::string mi = v1_mount("cpu", "cpu") + v2_mount("unified");
  EXPECT_EQ(quota("1:cpu:/\n0::/svc\n", mi), 2u);
  write("unified/svc/cpu.max", "400000 100000\n");
  EXPECT_EQ(quota("1:cpu:/\n0::/svc\n", mi), 3u);
}

TEST_F(CgroupTree, MissingOrMalformedFilesAreNoLimit) {
  EXPECT_EQ(cgroup_cpu_quota_cores((root_ / "none").string(), (root_ / "none").string()), std::nullopt);
  write("cg/a/cpu.max", "200000 100000\n");
  // A line without two colons names no cgroup, and neither does a mount line missing its fields.
  EXPECT_EQ(quota("0/a\n", v2_mount("cg")), std::nullopt);
  EXPECT_EQ(quota("0::/a\n", "29 23 0:26 / " + (root_ / "cg").string() + "\n"), std::nullopt);
  EXPECT_EQ(quota("0::/a\n", v2_mount("cg")), 2u);  // the same files, well formed
  for (const char* bad : {"lots 100000\n", "100000\n", "100000 0\n", "100000 100000 7\n", ""}) {
    write("cg/a/cpu.max", bad);
    EXPECT_EQ(quota("0::/a\n", v2_mount("cg")), std::nullopt) << bad;
  }
}

// This process: at least one core, and no more than its affinity mask allows.
TEST(UsableCores, WithinTheAffinityMask) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  EXPECT_GE(usable_cores(), 1u);
  EXPECT_LE(usable_cores(), static_cast<unsigned>(CPU_COUNT(&set)));
}

}  // namespace
}  // namespace kiln::runtime

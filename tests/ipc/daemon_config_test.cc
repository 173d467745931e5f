// kiln.toml's [daemon] table: every key, types, bounds, unknown keys, malformed files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kiln/ipc/daemon_config.h"
#include "kiln/testing/status.h"

namespace kiln::ipc {
namespace {

TEST(DaemonConfig, ReadsEveryKey) {
  Result<DaemonFileConfig> c = parse_daemon_config(R"(
[daemon]
device = "cuda:1"
runtime_dir = "/run/kiln"
socket = "s.sock"
allowed_group = "trainers"
job_memory_mib = 4096
job_queued_ops = 0
arena_mib = 128
plan_cache = "/var/cache/kiln"
log_level = "debug"
[fusion]
max_explorations = 3
)");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(*c->device, "cuda:1");
  EXPECT_EQ(*c->runtime_dir, "/run/kiln");
  EXPECT_EQ(*c->socket, "s.sock");
  EXPECT_EQ(*c->allowed_group, "trainers");
  EXPECT_EQ(*c->job_memory_mib, 4096u);
  EXPECT_EQ(*c->job_queued_ops, 0u);
  EXPECT_EQ(*c->arena_mib, 128u);
  EXPECT_EQ(*c->plan_cache, "/var/cache/kiln");
  EXPECT_EQ(*c->log_level, "debug");
}

// Issue 19's keys: job policy, per-uid quotas, the device memory limit, the stuck-client timeout,
// memory given back, plan saves.
TEST(DaemonConfig, ReadsTheLimitsKeys) {
  Result<DaemonFileConfig> c = parse_daemon_config(R"(
[daemon]
job_policy = "group"
uid_memory_mib = 8192
uid_queued_ops = 5000
uid_jobs = 4
device_memory_mib = 0
completion_timeout_ms = 250
large_block_mib = 32
large_block_retention_ms = 0
plan_save_ms = 500
)");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  EXPECT_EQ(*c->job_policy, "group");
  EXPECT_EQ(*c->uid_memory_mib, 8192u);
  EXPECT_EQ(*c->uid_queued_ops, 5000u);
  EXPECT_EQ(*c->uid_jobs, 4u);
  EXPECT_EQ(*c->device_memory_mib, 0u);
  EXPECT_EQ(*c->completion_timeout_ms, 250u);
  EXPECT_EQ(*c->large_block_mib, 32u);
  EXPECT_EQ(*c->large_block_retention_ms, 0u);
  EXPECT_EQ(*c->plan_save_ms, 500u);
  Result<DaemonFileConfig> bad = parse_daemon_config("[daemon]\njob_policy = \"everyone\"\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("daemon.job_policy: job policy 'everyone': expected uid, group or any"),
            std::string::npos)
      << bad.error().message;
  Result<DaemonFileConfig> zero = parse_daemon_config("[daemon]\ncompletion_timeout_ms = 0\n");
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.error().message.find("daemon.completion_timeout_ms must be an integer in [1, 4294967296]"),
            std::string::npos);
}

// Issue 26's keys: the log format and the metrics endpoint, their grammar checked at parse time.
TEST(DaemonConfig, LogFormatAndMetrics) {
  Result<DaemonFileConfig> c = parse_daemon_config(
      "[daemon]\nlog_format = \"json\"\nmetrics = \"tcp:0.0.0.0:9464\"\nmetrics_allow_remote = true\n");
  KILN_ASSERT_OK(c);
  EXPECT_EQ(*c->log_format, "json");
  EXPECT_EQ(*c->metrics, "tcp:0.0.0.0:9464");  // the remote check is kilnd's, with metrics_allow_remote
  EXPECT_EQ(c->metrics_allow_remote, std::optional<bool>(true));
  auto message = [](const char* text) {
    Result<DaemonFileConfig> r = parse_daemon_config(text);
    return r.ok() ? std::string("ok") : r.error().message;
  };
  EXPECT_EQ(message("[daemon]\nlog_format = \"xml\"\n"),
            "kiln.toml: daemon.log_format: log format 'xml': expected text or json");
  EXPECT_NE(message("[daemon]\nmetrics = \"http:9464\"\n").find("daemon.metrics: metrics 'http:9464': expected unix"),
            std::string::npos);
  EXPECT_EQ(message("[daemon]\nmetrics_allow_remote = 1\n"),
            "kiln.toml: daemon.metrics_allow_remote must be true or false");
}

TEST(DaemonConfig, AbsentTableOrFileSetsNothing) {
  Result<DaemonFileConfig> c = parse_daemon_config("[runtime]\nthreads = 2\n");
  KILN_ASSERT_OK(c);
  EXPECT_FALSE(c->device.has_value());
  EXPECT_FALSE(c->arena_mib.has_value());
  Result<DaemonFileConfig> f = load_daemon_config("/nonexistent/kiln.toml");
  KILN_ASSERT_OK(f);
  EXPECT_FALSE(f->socket.has_value());
}

TEST(DaemonConfig, ErrorsNameTheKey) {
  auto message = [](const char* text) {
    Result<DaemonFileConfig> c = parse_daemon_config(text);
    EXPECT_FALSE(c.ok()) << text;
    return c.ok() ? std::string() : c.error().message;
  };
  EXPECT_NE(message("[daemon]\narena_mib = 0\n").find("daemon.arena_mib must be an integer in [1, 65536]"),
            std::string::npos);
  // Bounded so that MiB -> bytes cannot overflow into "unlimited".
  EXPECT_NE(message("[daemon]\nuid_memory_mib = 17592186044416\n").find("daemon.uid_memory_mib must be an integer in"),
            std::string::npos);
  EXPECT_NE(message("[daemon]\njob_memory_mib = -5\n").find("daemon.job_memory_mib"), std::string::npos);
  EXPECT_NE(message("[daemon]\ndevice = 3\n").find("daemon.device must be a non-empty string"), std::string::npos);
  EXPECT_NE(message("[daemon]\nsokcet = \"x\"\n").find("daemon.sokcet: unknown key"), std::string::npos);
  EXPECT_NE(message("daemon = 1\n").find("daemon must be a table"), std::string::npos);
  EXPECT_NE(message("[daemon\n").find("kiln.toml:1"), std::string::npos);
}

}  // namespace
}  // namespace kiln::ipc

namespace kiln::ipc {
namespace {

TEST(DaemonConfig, ReadsTheDistributedTable) {
  Result<DaemonFileConfig> c = parse_daemon_config(R"(
[distributed]
job = "train"
rank = 1
world_size = 4
rendezvous = "tcp:10.0.0.1:29400"
host = "10.0.0.2"
timeout_ms = 5000
)");
  ASSERT_TRUE(c.ok()) << c.error().to_string();
  const DistributedFileConfig& d = c->distributed;
  EXPECT_EQ(*d.job, "train");
  EXPECT_EQ(*d.rank, 1u);
  EXPECT_EQ(*d.world_size, 4u);
  EXPECT_EQ(*d.rendezvous, "tcp:10.0.0.1:29400");
  EXPECT_EQ(*d.host, "10.0.0.2");
  EXPECT_EQ(*d.timeout_ms, 5000u);
  EXPECT_FALSE(parse_daemon_config("[daemon]\narena_mib = 8\n")->distributed.job.has_value());
}

TEST(DaemonConfig, DistributedErrorsNameTheKey) {
  const auto error = [](const char* text) {
    Result<DaemonFileConfig> c = parse_daemon_config(text);
    return c.ok() ? std::string("ok") : c.error().message;
  };
  EXPECT_THAT(error("[distributed]\nworld = 2\n"), ::testing::HasSubstr("distributed.world: unknown key"));
  EXPECT_THAT(error("[distributed]\njob = \"a b\"\n"), ::testing::HasSubstr("distributed.job: job name: byte 0x20"));
  EXPECT_THAT(error("[distributed]\nrendezvous = \"tcp:host:1\"\n"),
              ::testing::HasSubstr("distributed.rendezvous: rendezvous 'tcp:host:1'"));
  EXPECT_THAT(error("[distributed]\nworld_size = 0\n"),
              ::testing::HasSubstr("distributed.world_size must be an integer in [1, 1024]"));
  EXPECT_THAT(error("[distributed]\ntimeout_ms = 0\n"), ::testing::HasSubstr("distributed.timeout_ms"));
}

}  // namespace
}  // namespace kiln::ipc

// kiln.toml's [daemon] table: every key, types, bounds, unknown keys, malformed files.
#include <gtest/gtest.h>

#include "kiln/ipc/daemon_config.h"

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

TEST(DaemonConfig, AbsentTableOrFileSetsNothing) {
  Result<DaemonFileConfig> c = parse_daemon_config("[runtime]\nthreads = 2\n");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->device.has_value());
  EXPECT_FALSE(c->arena_mib.has_value());
  Result<DaemonFileConfig> f = load_daemon_config("/nonexistent/kiln.toml");
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->socket.has_value());
}

TEST(DaemonConfig, ErrorsNameTheKey) {
  auto message = [](const char* text) {
    Result<DaemonFileConfig> c = parse_daemon_config(text);
    EXPECT_FALSE(c.ok()) << text;
    return c.ok() ? std::string() : c.error().message;
  };
  EXPECT_NE(message("[daemon]\narena_mib = 0\n").find("daemon.arena_mib must be an integer >= 1"), std::string::npos);
  EXPECT_NE(message("[daemon]\njob_memory_mib = -5\n").find("daemon.job_memory_mib"), std::string::npos);
  EXPECT_NE(message("[daemon]\ndevice = 3\n").find("daemon.device must be a non-empty string"), std::string::npos);
  EXPECT_NE(message("[daemon]\nsokcet = \"x\"\n").find("daemon.sokcet: unknown key"), std::string::npos);
  EXPECT_NE(message("daemon = 1\n").find("daemon must be a table"), std::string::npos);
  EXPECT_NE(message("[daemon\n").find("kiln.toml:1"), std::string::npos);
}

}  // namespace
}  // namespace kiln::ipc

// The [daemon] and [distributed] tables of kiln.toml: kilnd's settings in a file. Precedence in kilnd: flags >
// environment (KILN_DEVICE) > this table > defaults. Every key is optional.
//
//   [daemon]
//   device = "auto"            # auto, cpu, cuda, cuda:N
//   runtime_dir = "/run/kiln"  # the control socket's directory
//   socket = "kilnd-cpu.sock"
//   allowed_group = "trainers"
//   job_policy = "uid"         # who may join a job: uid (its creator's), group (primary gid), any
//   job_memory_mib = 4096      # 0 = unlimited
//   job_queued_ops = 100000    # 0 = unlimited
//   uid_memory_mib = 8192      # per client uid, over all its jobs; 0 = unlimited
//   uid_queued_ops = 1048576   # 0 = unlimited
//   uid_jobs = 64              # jobs one uid owns at once; 0 = unlimited
//   device_memory_mib = 16384  # absent: 80% of min(cgroup limit, MemTotal) (CPU), 90% of the GPU's; 0 = none
//   completion_timeout_ms = 5000  # a client whose completion ring stays full this long is dropped
//   large_block_mib = 16       # CPU device: freed blocks this large go back to the OS ...
//   large_block_retention_ms = 2000  # ... after this long unused (0: at once)
//   plan_save_ms = 2000        # with plan_cache: new plans are saved this long after they appear
//   arena_mib = 64             # 1..65536
//   staging_mib = 2048         # chunked transfers' host staging, all clients; absent: a share of the host's memory
//   plan_cache = "/var/cache/kiln/plans"
//   log_level = "info"         # trace, debug, info, warn, error
//   log_format = "text"        # text, or json: one object per line (kiln/ipc/log_format.h)
//   metrics = "unix"           # the metrics endpoint: unix, unix:PATH, tcp:HOST:PORT (metrics_server.h); absent: off
//   metrics_allow_remote = false  # tcp on a non-loopback address
//
//   [distributed]              # one job of this daemon spans daemons (docs/distributed.md)
//   job = "train"
//   rank = 0
//   world_size = 2
//   rendezvous = "tcp:10.0.0.1:29400"
//   host = "10.0.0.1"          # optional: the address peers reach this daemon at
//   timeout_ms = 30000
//
// A malformed file, an unknown key or a value of the wrong type is an ErrorCode::Config error
// naming the key ("kiln.toml: daemon.arena_mib must be an integer >= 1").
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/base/result.h"

namespace kiln::ipc {

// [distributed] (kiln/distributed/config.h; kilnd puts it together with its flags and
// environment and checks the whole).
struct DistributedFileConfig {
  std::optional<std::string> job, rendezvous, host;
  std::optional<std::uint64_t> rank, world_size, timeout_ms;
};

struct DaemonFileConfig {
  std::optional<std::string> device, runtime_dir, socket, allowed_group, plan_cache, log_level, lock_dir, job_policy;
  std::optional<std::string> log_format, metrics;
  std::optional<bool> metrics_allow_remote;
  std::optional<std::uint64_t> job_memory_mib, job_queued_ops, arena_mib, max_connections, max_connections_per_uid;
  std::optional<std::uint64_t> uid_memory_mib, uid_queued_ops, uid_jobs, device_memory_mib, completion_timeout_ms;
  std::optional<std::uint64_t> large_block_mib, large_block_retention_ms, plan_save_ms, staging_mib;
  DistributedFileConfig distributed;
};

Result<DaemonFileConfig> parse_daemon_config(std::string_view toml_text, std::string_view source_name = "kiln.toml");
// The file at `path`; an empty path or an absent file sets nothing.
Result<DaemonFileConfig> load_daemon_config(const std::string& path);

}  // namespace kiln::ipc

// The [daemon] table of kiln.toml: kilnd's settings in a file. Precedence in kilnd: flags >
// environment (KILN_DEVICE) > this table > defaults. Every key is optional.
//
//   [daemon]
//   device = "auto"            # auto, cpu, cuda, cuda:N
//   runtime_dir = "/run/kiln"  # the control socket's directory
//   socket = "kilnd-cpu.sock"
//   allowed_group = "trainers"
//   job_memory_mib = 4096      # 0 = unlimited
//   job_queued_ops = 100000    # 0 = unlimited
//   arena_mib = 64             # >= 1
//   plan_cache = "/var/cache/kiln/plans"
//   log_level = "info"         # trace, debug, info, warn, error
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

#include "kiln/ir/result.h"

namespace kiln::ipc {

struct DaemonFileConfig {
  std::optional<std::string> device, runtime_dir, socket, allowed_group, plan_cache, log_level, lock_dir;
  std::optional<std::uint64_t> job_memory_mib, job_queued_ops, arena_mib, max_connections, max_connections_per_uid;
};

Result<DaemonFileConfig> parse_daemon_config(std::string_view toml_text, std::string_view source_name = "kiln.toml");
// The file at `path`; an empty path or an absent file sets nothing.
Result<DaemonFileConfig> load_daemon_config(const std::string& path);

}  // namespace kiln::ipc

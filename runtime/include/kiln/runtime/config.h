// Runtime configuration: the [runtime] table of kiln.toml (architecture "Configuration"),
// read by Device::create beside the [fusion] tables. Precedence: explicit RuntimeOptions >
// environment > kiln.toml > defaults.
//
//   [runtime]   threads = 8        pool threads (>= 1; absent = the cores the process may use)
//               drain_batch = 64   commands a stream actor runs per turn (>= 1)
//               inline_waits = true  a thread waiting on an idle stream runs it itself
//               spin_waits = true    a waiter spins for its answer (<= 200 µs) while no other
//                                    stream is busy, before it sleeps (default: true from 2
//                                    cores; kilnd: false unless configured)
//   KILN_RUNTIME_THREADS, KILN_RUNTIME_DRAIN_BATCH, KILN_RUNTIME_INLINE_WAITS,
//   KILN_RUNTIME_SPIN_WAITS (the last two 0|1|true|false)
//   (unparsable values are ignored with a warning, as for the KILN_FUSION_* variables)
//
// Pure functions: safe from any thread.
//
// Usage:
//   Result<RuntimeFileConfig> c = parse_runtime_config("[runtime]\nthreads = 4\n");
//   // c->threads == 4, c->drain_batch == nullopt
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/base/result.h"
#include "kiln/fusion/config.h"

namespace kiln::runtime {

// What the file and the environment set; nullopt = not set there.
struct RuntimeFileConfig {
  std::optional<std::size_t> threads;
  std::optional<std::size_t> drain_batch;
  std::optional<bool> inline_waits;
  std::optional<bool> spin_waits;
};

// Parses the [runtime] table of a kiln.toml text. A malformed file, a key that is not a positive
// integer or an unknown key of [runtime] is an ErrorCode::Config error naming the key
// ("kiln.toml: runtime.threads must be a positive integer").
Result<RuntimeFileConfig> parse_runtime_config(std::string_view toml_text, std::string_view source_name = "kiln.toml");
// Applies the KILN_RUNTIME_* variables on top; an unparsable value is
// ignored and its reason appended to `warnings` if given.
RuntimeFileConfig apply_runtime_env(RuntimeFileConfig config, const fusion::EnvLookup& env,
                                    std::string* warnings = nullptr);
// kiln.toml at `path` (empty path or absent file = nothing set) + environment.
Result<RuntimeFileConfig> load_runtime_config(const std::string& path, const fusion::EnvLookup& env,
                                              std::string* warnings = nullptr);

}  // namespace kiln::runtime

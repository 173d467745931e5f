// kilnd's log lines: text (the default) or one JSON object per line for log shippers
// (`[daemon] log_format = "json"`, `kilnd --log-format json`), with the client, job and stream on
// every line that concerns one.
//
// A JSON line: {"time":"2026-12-06T12:29:28.123456Z","level":"info","pid":4242,"thread":4250,
//               "client":7,"job":"resnet","stream":2,"msg":"kilnd: client 7 gone: ..."}
// "client", "job" and "stream" appear when the logging thread has them in its LogScope: a client
// session's thread names its client and job for all it logs, and narrows to a stream where a line
// is about one. Text lines already name them in the message.
//
// Thread-safety: use_json_logs() before the daemon's threads log (it replaces the default
// logger's formatter); a LogScope is its own thread's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/base/result.h"

namespace kiln::ipc {

enum class LogFormat { Text, Json };
Result<LogFormat> parse_log_format(std::string_view name);  // "text" or "json"

// Sets the default spdlog logger's pattern for `format` (text: "[12:29:28.123] [info] msg").
void set_log_format(LogFormat format);

// What the lines this thread logs concern, while the scope lives (scopes nest; the inner one's
// fields win, the outer ones' fill the rest).
class LogScope {
 public:
  LogScope(std::optional<std::uint64_t> client, std::string job, std::optional<std::uint64_t> stream = std::nullopt);
  ~LogScope();
  LogScope(const LogScope&) = delete;
  LogScope& operator=(const LogScope&) = delete;

  const LogScope* outer() const { return outer_; }

  std::optional<std::uint64_t> client, stream;
  std::string job;  // empty: none

 private:
  const LogScope* outer_;
};

// The JSON line for one message (the formatter's; tests call it directly).
std::string json_log_line(std::string_view time_iso, std::string_view level, std::uint64_t pid, std::uint64_t thread,
                          std::string_view message, const LogScope* scope);
const LogScope* current_log_scope();

}  // namespace kiln::ipc

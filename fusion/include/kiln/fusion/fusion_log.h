// The fusion log (docs/spec/fusion.md §17): levels disabled < basic < medium < full; messages are built
// lazily (no formatting cost when filtered out) and go to spdlog (stderr by default) under the
// logger name "kiln::fusion". Tests capture the lines instead.
//
// Thread-safety: a FusionLog is immutable after construction and may be shared by all streams;
// the spdlog logger behind it is thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/base/mutex.h"

namespace spdlog {
class logger;
}

namespace kiln::fusion {

enum class LogLevel : std::uint8_t { Disabled = 0, Basic = 1, Medium = 2, Full = 3 };
const char* log_level_name(LogLevel l);
// "disabled"/"off"/"0", "basic", "medium", "full"/"1" (case-insensitive); nullopt otherwise.
std::optional<LogLevel> parse_log_level(std::string_view text);

// Collects log records in memory (tests, kiln-lab --capture).
class LogCapture {
 public:
  void push(std::string line);
  std::vector<std::string> lines() const;
  void clear();

 private:
  mutable Mutex mu_;
  std::vector<std::string> lines_ KILN_GUARDED_BY(mu_);
};

class FusionLog {
 public:
  // Disabled.
  FusionLog() = default;
  // To spdlog's "kiln::fusion" logger writing to stderr (created on first use).
  static FusionLog to_stderr(LogLevel level);
  static FusionLog to_logger(LogLevel level, std::shared_ptr<spdlog::logger> logger);
  static FusionLog to_capture(LogLevel level, std::shared_ptr<LogCapture> capture);

  LogLevel level() const { return level_; }
  bool enabled(LogLevel l) const { return level_ != LogLevel::Disabled && l <= level_; }

  // Emits make() as one record iff `l` is enabled.
  template <class MakeMessage>
  void log(LogLevel l, MakeMessage&& make) const {
    if (enabled(l)) emit(std::string(make()));
  }
  void emit(const std::string& record) const;

 private:
  LogLevel level_ = LogLevel::Disabled;
  std::shared_ptr<spdlog::logger> logger_;
  std::shared_ptr<LogCapture> capture_;
};

}  // namespace kiln::fusion

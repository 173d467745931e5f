#include "kiln/fusion/fusion_log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>

namespace kiln::fusion {

const char* log_level_name(LogLevel l) {
  switch (l) {
    case LogLevel::Disabled: return "disabled";
    case LogLevel::Basic: return "basic";
    case LogLevel::Medium: return "medium";
    case LogLevel::Full: return "full";
  }
  return "?";
}

std::optional<LogLevel> parse_log_level(std::string_view text) {
  std::string s(text);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (s == "disabled" || s == "off" || s == "0") return LogLevel::Disabled;
  if (s == "basic") return LogLevel::Basic;
  if (s == "medium") return LogLevel::Medium;
  if (s == "full" || s == "1") return LogLevel::Full;
  return std::nullopt;
}

void LogCapture::push(std::string line) {
  MutexLock lock(mu_);
  lines_.push_back(std::move(line));
}
std::vector<std::string> LogCapture::lines() const {
  MutexLock lock(mu_);
  return lines_;
}
void LogCapture::clear() {
  MutexLock lock(mu_);
  lines_.clear();
}

FusionLog FusionLog::to_stderr(LogLevel level) {
  // One named logger per process; spdlog's registry makes the lookup/creation thread-safe.
  auto logger = spdlog::get("kiln::fusion");
  if (!logger) {
    auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
    logger = std::make_shared<spdlog::logger>("kiln::fusion", sink);
    logger->set_pattern("%v");
    logger->set_level(spdlog::level::info);
    try {
      spdlog::register_logger(logger);
    } catch (const spdlog::spdlog_ex&) {
      logger = spdlog::get("kiln::fusion");  // another thread registered it first
    }
  }
  return to_logger(level, std::move(logger));
}

FusionLog FusionLog::to_logger(LogLevel level, std::shared_ptr<spdlog::logger> logger) {
  FusionLog log;
  log.level_ = level;
  log.logger_ = std::move(logger);
  return log;
}

FusionLog FusionLog::to_capture(LogLevel level, std::shared_ptr<LogCapture> capture) {
  FusionLog log;
  log.level_ = level;
  log.capture_ = std::move(capture);
  return log;
}

void FusionLog::emit(const std::string& record) const {
  if (capture_) capture_->push(record);
  if (logger_) logger_->info(record);
}

}  // namespace kiln::fusion

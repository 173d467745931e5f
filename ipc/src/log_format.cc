// kilnd's log formats (kiln/ipc/log_format.h).
#include "kiln/ipc/log_format.h"

#include "json_text.h"

#include <fmt/format.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <memory>

namespace kiln::ipc {

namespace {

// The scope chain of this thread: each LogScope points at the one it nests in.
thread_local const LogScope* innermost_scope = nullptr;

class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using namespace std::chrono;
    const auto since = msg.time.time_since_epoch();
    const std::time_t secs = duration_cast<seconds>(since).count();
    const auto micros = duration_cast<microseconds>(since).count() % 1'000'000;
    std::tm utc{};
    gmtime_r(&secs, &utc);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &utc);
    const std::string time = fmt::format("{}.{:06}Z", when, micros);
    const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
    const std::string line =
        json_log_line(time, std::string_view(level.data(), level.size()), static_cast<std::uint64_t>(::getpid()),
                      msg.thread_id, std::string_view(msg.payload.data(), msg.payload.size()), current_log_scope());
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }
};

}  // namespace

Result<LogFormat> parse_log_format(std::string_view name) {
  if (name == "text") return LogFormat::Text;
  if (name == "json") return LogFormat::Json;
  return make_error(ErrorCode::Config, fmt::format("log format '{}': expected text or json", name));
}

void set_log_format(LogFormat format) {
  if (format == LogFormat::Json)
    spdlog::set_formatter(std::make_unique<JsonFormatter>());
  else
    spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
}

LogScope::LogScope(std::optional<std::uint64_t> c, std::string j, std::optional<std::uint64_t> s)
    : client(c), stream(s), job(std::move(j)), outer_(innermost_scope) {
  innermost_scope = this;
}

LogScope::~LogScope() { innermost_scope = outer_; }

const LogScope* current_log_scope() { return innermost_scope; }

std::string json_log_line(std::string_view time_iso, std::string_view level, std::uint64_t pid, std::uint64_t thread,
                          std::string_view message, const LogScope* scope) {
  std::string out = "{\"time\":";
  out += json_text(time_iso);
  out += ",\"level\":";
  out += json_text(level);
  out += fmt::format(",\"pid\":{},\"thread\":{}", pid, thread);
  // The innermost value of each field along the chain.
  std::optional<std::uint64_t> client, stream;
  const std::string* job = nullptr;
  for (const LogScope* s = scope; s != nullptr; s = s->outer()) {
    if (!client) client = s->client;
    if (!stream) stream = s->stream;
    if (job == nullptr && !s->job.empty()) job = &s->job;
  }
  if (client) out += fmt::format(",\"client\":{}", *client);
  if (job != nullptr) {
    out += ",\"job\":";
    out += json_text(*job);
  }
  if (stream) out += fmt::format(",\"stream\":{}", *stream);
  out += ",\"msg\":";
  out += json_text(message);
  out += "}\n";
  return out;
}

}  // namespace kiln::ipc

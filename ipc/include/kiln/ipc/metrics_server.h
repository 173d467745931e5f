// The daemon's metrics endpoint: HTTP/1.1 GET /metrics, answered with the Prometheus text
// exposition of DaemonService::metrics() (daemon_metrics.h), on a Unix socket by default or a
// loopback TCP port. Opt-in (kiln.toml `[daemon] metrics`, `kilnd --metrics`).
//
// Where it listens (parse_metrics_listen):
//   "unix"                   <runtime dir>/<control socket's stem>.metrics, e.g. kilnd-cpu.metrics
//   "unix:/path/to/socket"   that path
//   "tcp:127.0.0.1:9464"     a TCP port; a non-loopback address only with allow_remote
//                            (`metrics_allow_remote = true`): the metrics name jobs and uids
//   "tcp:[::1]:9464"         IPv6 loopback
// The Unix socket gets the control socket's mode (0600, or 0660 with the allowed group).
//
// One request per connection (the answer says Connection: close): a request's head is read up to
// kMaxRequestBytes within kRequestTimeout; GET /metrics answers 200, any other path 404, any
// other method 405, a malformed or oversized head 400. At most kMaxMetricsConnections are served
// at once; more are closed unanswered. The body is built on the server's thread.
//
// Thread-safety: start, stop and the destructor from the owner's thread; address() and scrapes()
// from any; the handlers run on the server's own io thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/base/result.h"

namespace kiln::ipc {

struct MetricsListen {
  enum class Kind { Unix, Tcp } kind = Kind::Unix;
  std::string path;  // Unix: empty = the default next to the control socket
  std::string host;  // Tcp: an address literal
  std::uint16_t port = 0;
};

// Parses a `metrics` setting (see above). Errors name the setting's form.
Result<MetricsListen> parse_metrics_listen(std::string_view text, bool allow_remote);

inline constexpr std::size_t kMaxRequestBytes = 8192;
inline constexpr std::size_t kMaxMetricsConnections = 16;

struct MetricsServerOptions {
  MetricsListen listen;
  std::string default_unix_path;      // used when listen is Unix without a path
  std::optional<gid_t> allowed_gid;   // the Unix socket's group (mode 0660), as the control socket's
  std::function<std::string()> body;  // the exposition text, built per scrape
  std::chrono::milliseconds request_timeout{5000};
};

class MetricsServer {
 public:
  static Result<std::unique_ptr<MetricsServer>> start(MetricsServerOptions options);
  ~MetricsServer();  // stop()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "unix:/run/kiln/kilnd-cpu.metrics" or "tcp:127.0.0.1:9464" (the bound port when 0 was asked).
  const std::string& address() const;
  std::uint64_t scrapes() const;  // 200 answers so far
  void stop();                    // idempotent; removes the Unix socket file

  struct Impl;

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::ipc

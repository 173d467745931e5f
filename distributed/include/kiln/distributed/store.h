// The rendezvous store of a distributed job: a small key-value server that rank 0's daemon runs
// (StoreServer), and the client every rank's daemon keeps connected to it (StoreClient). Gloo
// builds its full mesh through it (set/get of the ranks' transport addresses); kiln adds what
// Gloo's stores lack: a meeting (join: every rank of the world, or an error naming the ranks
// that did not come within the timeout), and the ranks whose daemons are connected (live_ranks),
// which names the rank a failed collective lost.
//
// Every message is validated as untrusted input: the first one must name the server's job,
// world size and kiln version, and a rank of that world not connected already; keys, values,
// message sizes, key counts and total bytes are bounded; anything else closes the connection.
// The store trusts the network it listens on as PyTorch's TCPStore does: bind it to an interface
// only the job's hosts reach (docs/distributed.md).
//
// Thread-safety: StoreServer runs an acceptor thread and one thread per connection, all joined
// by its destructor. A StoreClient serializes its requests (one at a time over its connection);
// any thread may call it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/result.h"
#include "kiln/distributed/config.h"

namespace kiln::distributed {

// What a rank must match to join: the job, its world size, and the kiln build (version and IPC
// protocol), so that daemons of different builds never exchange tensors.
struct StoreIdentity {
  std::string job;
  std::uint32_t world_size = 0;
  std::string version;
};

// Bounds of the wire (each checked on both sides).
inline constexpr std::size_t kMaxStoreKeyBytes = 256;
inline constexpr std::size_t kMaxStoreValueBytes = std::size_t{1} << 20;  // a full mesh's addresses at 1024 ranks: ~40 KiB
inline constexpr std::size_t kMaxStoreKeys = 65'536;
inline constexpr std::size_t kMaxStoreBytes = std::size_t{64} << 20;

class StoreServer {
 public:
  // Binds `at` (port 0: any free port, see port()) and serves until destroyed.
  static Result<std::unique_ptr<StoreServer>> start(const TcpAddress& at, StoreIdentity identity);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  std::uint16_t port() const;
  // Ranks with a connection open, ascending.
  std::vector<std::uint32_t> live_ranks() const;

  class Impl;

 private:
  explicit StoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class StoreClient {
 public:
  // Connects to `at` as `rank` (retrying a refused connection until `timeout`: rank 0's daemon
  // may start after this one) and introduces itself. Errors name the store and what it refused.
  static Result<std::unique_ptr<StoreClient>> connect(const TcpAddress& at, const StoreIdentity& identity,
                                                      std::uint32_t rank, std::chrono::milliseconds timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  [[nodiscard]] Status set(std::string_view key, std::span<const std::uint8_t> value);
  // Waits up to `timeout` for `key` to be set.
  [[nodiscard]] Result<std::vector<std::uint8_t>> get(std::string_view key, std::chrono::milliseconds timeout);
  // The meeting: returns once every rank of the world has joined the same generation (its
  // number, counted from 0 by the server), or fails after `timeout` naming the ranks missing.
  [[nodiscard]] Result<std::uint64_t> join(std::chrono::milliseconds timeout);
  // Ranks whose daemons hold a connection to the store, ascending.
  [[nodiscard]] Result<std::vector<std::uint32_t>> live_ranks();
  // Whether the connection is still usable: a refusal keeps it, a transport failure (or a
  // half-read answer) ends it.
  bool connected() const;
  // This end's address of the connection (the interface that reaches the store).
  const std::string& local_host() const;
  std::string where() const;  // "the rendezvous store at tcp:HOST:PORT"

  class Impl;

 private:
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::distributed

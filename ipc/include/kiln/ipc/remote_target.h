// RemoteTarget: the client library — a runtime::SessionTarget whose operations go to a daemon
// over the shared-memory rings, so that runtime::Session (the same session and tensor API as
// in process) drives a device in another process:
//
//   auto remote = ipc::RemoteTarget::connect({.runtime_dir = dir, .job = "resnet"});
//   runtime::Session s(**remote);
//   Tensor y = *s.exp(*s.from_host(values, {n}));   // builders run here; ops go to the daemon
//   std::vector<float> v = *s.to_host(std::move(y));
//
// Tensor and stream ids are this client's own (the daemon keeps them apart from every other
// client's). Operations are built and checked by the same ir builders as in process, so an
// input error is reported at the call that made it. register_op, drop and report_fallbacks are
// one ring record each and get no answer unless the daemon rejects them (it should not, for ops
// built here and snapshots fitted here); such a rejection is reported by the next sync or read.
// Uploads and reads go through the segment's arena; one larger than the arena moves in parts of
// a quarter of the arena (upload_part, read_part), two in flight, one chunked transfer per
// connection at a time, transparently.
//
// Errors the user can act on: "daemon not running at PATH" (connect), "the daemon went away"
// (any call after the daemon closed the connection; no call hangs: every wait is bounded and
// watches the socket), the daemon's own messages for rejected commands.
//
// Thread-safety: every method may be called from any number of threads at once (a Session is
// used from several); sends are serialised, and whichever thread waits for a completion pops
// the ring for the others.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>

#include "kiln/base/mutex.h"
#include "kiln/ipc/arena.h"
#include "kiln/ipc/control_client.h"
#include "kiln/ipc/protocol.h"
#include "kiln/runtime/session_target.h"

namespace kiln::ipc {

struct RemoteOptions : ClientOptions {
  // Bound of every wait for a completion (a sync of a long queue included).
  std::chrono::milliseconds reply_timeout{120'000};
};

class RemoteTarget final : public runtime::SessionTarget {
 public:
  static Result<std::unique_ptr<RemoteTarget>> connect(const RemoteOptions& options);
  ~RemoteTarget() override;  // closes the connection: the daemon frees what is left
  RemoteTarget(const RemoteTarget&) = delete;
  RemoteTarget& operator=(const RemoteTarget&) = delete;

  // runtime::SessionTarget
  ir::TensorId new_tensor_id() override;
  ir::TensorId new_tensor_ids(std::uint64_t count) override;
  Status upload(runtime::StreamId home, ir::TensorId id, ir::DType dtype, ir::Shape shape,
                std::span<const std::byte> bytes) override;
  Status register_op(runtime::StreamId stream, ir::Operation&& op) override;
  Status drain(runtime::StreamId stream) override;
  Result<runtime::HostData> read(runtime::StreamId home, const ir::TensorIr& t) override;
  // Straight from the arena into `dst` (no intermediate buffer).
  Status read_into(runtime::StreamId home, const ir::TensorIr& t, std::span<std::byte> dst) override;
  Status drop(runtime::StreamId home, const ir::TensorIr& t) override;
  Status share(runtime::StreamId src_stream, ir::TensorId src, runtime::StreamId dst_stream, ir::TensorId dst) override;
  void claim_stream(runtime::StreamId) override {}

  // Beyond the in-process API: sharing with other processes of the same job.
  Result<ExportToken> export_tensor(runtime::StreamId home, ir::TensorId id);
  Status import_tensor(runtime::StreamId stream, const ExportToken& token, ir::TensorId id);
  // The daemon's status report, as text or JSON (what `kilnctl status [--json]` prints).
  Result<std::string> daemon_status(bool json);
  // kilnctl's live control (protocol.h, ControlVerb): the daemon's answer, text or JSON. Only the
  // daemon's uid and root are served; anyone else gets the refusal as an error.
  Result<std::string> control(ControlVerb verb, std::string args = {}, bool json = false);
  // Tells the daemon which ops this client ran on its own CPU instead of kiln, with their calls
  // (`calls`: a full snapshot, replacing the last one; empty clears it); its status shows them
  // with this client. One ring record, no answer awaited (the daemon answers only a rejection,
  // which a snapshot fitted here never gets). Fitted to what the protocol carries: names it
  // cannot (fallback_name_problem) are left out, and beyond kMaxFallbackEntries, or what one
  // message of the command ring holds, the most-called ops go. An error when it was not sent
  // (the daemon went away).
  //
  //   (void)remote->report_fallbacks({{"aten::flip", 12}, {"aten::index_add_", 3}});
  Status report_fallbacks(const std::map<std::string, std::uint64_t>& calls);

  std::uint64_t client_id() const { return conn_.client_id(); }
  std::uint64_t requests() const { return next_request_.load(std::memory_order_relaxed) - 1; }
  std::uint64_t ops_sent() const { return ops_sent_.load(std::memory_order_relaxed); }
  // How long a request waits for its answer from now on (RemoteOptions::reply_timeout at first).
  void set_reply_timeout(std::chrono::milliseconds t) { reply_timeout_ms_.store(t.count(), std::memory_order_relaxed); }
  // Arena bytes held by requests whose wait timed out, until their late answers arrive.
  std::uint64_t quarantined_bytes() const;

 private:
  explicit RemoteTarget(ClientConnection conn, RemoteOptions options);
  // Sends one command; returns its request id.
  Result<std::uint64_t> send(CommandBody body);
  // Waits for the completion of `request` (popping the ring for other waiters meanwhile).
  // `holds_range`: the request names an arena range the daemon reads or writes; if the wait
  // times out, release_range() then keeps that range until the late answer arrives.
  Result<Completion> wait(std::uint64_t request, bool holds_range = false);
  // An error completion of a fire-and-forget command, if one arrived (reported once).
  Status take_async_error();
  Status completion_status(const Completion& c, const char* what);
  Result<ArenaRange> allocate(std::uint64_t bytes, const char* what);
  std::optional<ArenaRange> try_allocate(std::uint64_t bytes);  // nullopt when no room now
  void free_range(ArenaRange r);
  // Returns the range of `request` once its wait is over: freed, unless the wait timed out, in
  // which case the daemon may still write into it: it stays allocated (quarantined) until the
  // request's answer arrives, or with the connection.
  void release_range(std::uint64_t request, ArenaRange r);
  // Transfers larger than the arena, in parts of part_bytes() (protocol.h, "Chunked transfers").
  std::uint64_t part_bytes() const;
  // The arena range for a part of n bytes. While the arena has no room, earlier parts are
  // settled oldest first (settle_oldest(): false when none is in flight) until there is, or
  // until failed() (a settled part's error): then nullopt. With none in flight, waits for other
  // threads' transfers (an error if that wait fails).
  Result<std::optional<ArenaRange>> next_part_range(std::uint64_t n, const std::function<bool()>& settle_oldest,
                                                    const std::function<bool()>& failed, const char* what);
  Status upload_chunked(runtime::StreamId home, ir::TensorId id, ir::DType dtype, const ir::Shape& shape,
                        std::span<const std::byte> bytes);
  Status read_chunked(runtime::StreamId home, const ir::TensorIr& t, std::span<std::byte> out);

  ClientConnection conn_;
  RemoteOptions options_;
  std::atomic<std::uint64_t> next_tensor_{1};
  std::atomic<std::uint64_t> next_request_{1};
  std::atomic<bool> daemon_gone_{false};
  std::atomic<std::uint64_t> ops_sent_{0};
  std::atomic<std::chrono::milliseconds::rep> reply_timeout_ms_;

  // One chunked transfer at a time: the daemon stages one chunked upload and one chunked read
  // per connection (a new one discards an unfinished one as abandoned).
  // Lock order: chunk_mu_, then send_mu_, then rx_mu_.
  Mutex chunk_mu_ KILN_ACQUIRED_BEFORE(send_mu_);
  Mutex send_mu_ KILN_ACQUIRED_BEFORE(rx_mu_);  // one sender at a time (the command ring is single-producer)
  std::vector<std::uint8_t> tx_buf_ KILN_GUARDED_BY(send_mu_);

  mutable Mutex rx_mu_;
  std::condition_variable_any rx_cv_;                                    // waits on rx_mu_ (through MutexLock)
  bool receiving_ KILN_GUARDED_BY(rx_mu_) = false;                       // a thread is popping the completion ring
  std::map<std::uint64_t, Completion> ready_ KILN_GUARDED_BY(rx_mu_);    // completions waited for, not yet taken
  std::map<std::uint64_t, bool> awaited_ KILN_GUARDED_BY(rx_mu_);        // requests some thread waits for
  std::deque<Error> async_errors_ KILN_GUARDED_BY(rx_mu_);               // rejections of fire-and-forget commands
  std::unordered_set<std::uint64_t> timed_out_ KILN_GUARDED_BY(rx_mu_);  // range-holding requests whose wait gave up
  std::unordered_map<std::uint64_t, ArenaRange> quarantined_ KILN_GUARDED_BY(rx_mu_);  // their ranges, until the late
                                                                                       // answer
  const std::uint64_t arena_capacity_;  // the arena's size, fixed at connection
  ArenaAllocator arena_alloc_ KILN_GUARDED_BY(rx_mu_);
  // Owned by the thread that set receiving_ (it pops the ring with rx_mu_ released).
  std::vector<std::uint8_t> rx_buf_;
};

}  // namespace kiln::ipc

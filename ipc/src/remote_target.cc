// The client library's SessionTarget over a daemon connection (kiln/ipc/remote_target.h).
#include "kiln/ipc/remote_target.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <deque>

namespace kiln::ipc {

namespace {
constexpr std::chrono::milliseconds kPoll{100};  // a waiter re-checks the socket this often
constexpr std::chrono::milliseconds kSendTimeout{60'000};

Error daemon_gone_error() {
  return make_error(ErrorCode::Execution, "the daemon went away (its connection closed); reconnect to continue");
}

// A part of a chunked transfer in flight: its request, the arena range it holds until the
// completion arrives, and which bytes of the tensor it carries.
struct InFlight {
  std::uint64_t request = 0;
  ArenaRange range;
  std::uint64_t offset = 0;
  std::uint64_t length = 0;
};
}  // namespace

RemoteTarget::RemoteTarget(ClientConnection conn, RemoteOptions options)
    : conn_(std::move(conn)),
      options_(std::move(options)),
      reply_timeout_ms_(options_.reply_timeout.count()),
      arena_capacity_(conn_.endpoint().layout().arena_size),
      arena_alloc_(arena_capacity_),
      rx_buf_(conn_.endpoint().max_receive_bytes()) {
  conn_.endpoint().watch_hangup(conn_.socket_fd());
}

RemoteTarget::~RemoteTarget() = default;

Result<std::unique_ptr<RemoteTarget>> RemoteTarget::connect(const RemoteOptions& options) {
  KILN_ASSIGN_OR_RETURN(ClientConnection conn, connect_to_daemon(options));
  return std::unique_ptr<RemoteTarget>(new RemoteTarget(std::move(conn), options));
}

ir::TensorId RemoteTarget::new_tensor_id() {
  return ir::TensorId(next_tensor_.fetch_add(1, std::memory_order_relaxed));
}

ir::TensorId RemoteTarget::new_tensor_ids(std::uint64_t count) {
  return ir::TensorId(next_tensor_.fetch_add(count, std::memory_order_relaxed));
}

Result<std::uint64_t> RemoteTarget::send(CommandBody body) {
  if (daemon_gone_.load(std::memory_order_acquire)) return daemon_gone_error();
  const std::uint64_t request = next_request_.fetch_add(1, std::memory_order_relaxed);
  // Commands with an answer are registered as awaited before they go out: another thread may
  // be popping the completion ring, and it keeps only answers someone awaits (the others it
  // takes for rejections of fire-and-forget commands).
  const bool answered = !std::holds_alternative<RegisterOpCmd>(body) && !std::holds_alternative<DropCmd>(body) &&
                        !std::holds_alternative<ReportFallbacksCmd>(body);
  MutexLock lock(send_mu_);
  // One encoding buffer, reused under the send lock: no allocation per op on the client side.
  tx_buf_.clear();
  KILN_RETURN_IF_ERROR(encode_command(Command{request, std::move(body)}, tx_buf_));
  if (answered) {
    MutexLock rx_lock(rx_mu_);
    awaited_[request] = true;
  }
  Status st = conn_.endpoint().send(tx_buf_, kSendTimeout);
  if (!st.ok()) {
    if (answered) {
      MutexLock rx_lock(rx_mu_);
      awaited_.erase(request);
    }
    if (!conn_.daemon_alive()) {
      daemon_gone_.store(true, std::memory_order_release);
      rx_cv_.notify_all();
      return daemon_gone_error();
    }
    return st.error();
  }
  return request;
}

Result<Completion> RemoteTarget::wait(std::uint64_t request, bool holds_range) {
  const std::chrono::milliseconds timeout(reply_timeout_ms_.load(std::memory_order_relaxed));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(rx_mu_);
  awaited_[request] = true;
  for (;;) {
    if (auto it = ready_.find(request); it != ready_.end()) {
      Completion c = std::move(it->second);
      ready_.erase(it);
      awaited_.erase(request);
      return c;
    }
    if (daemon_gone_.load(std::memory_order_acquire)) {
      awaited_.erase(request);
      return daemon_gone_error();
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      awaited_.erase(request);
      if (holds_range) timed_out_.insert(request);
      return make_error(ErrorCode::Execution,
                        fmt::format("no answer from the daemon within {} ms (request {})", timeout.count(), request));
    }
    if (receiving_) {
      rx_cv_.wait_for(lock, kPoll);
      continue;
    }
    // Become the receiver for everyone until one message arrives (or the poll interval ends).
    receiving_ = true;
    lock.unlock();
    Result<std::optional<std::size_t>> got = conn_.endpoint().receive(rx_buf_, kPoll);
    std::optional<Completion> cpl;
    Error failure = make_error(ErrorCode::Internal, "");
    bool failed = false;
    if (!got.ok()) {
      failed = true;
      failure = got.error();
    } else if (got->has_value()) {
      Result<Completion> decoded =
          decode_completion(std::span<const std::uint8_t>(rx_buf_.data(), **got), conn_.endpoint().layout().arena_size);
      if (decoded.ok())
        cpl = std::move(decoded).value();
      else {
        failed = true;
        failure = decoded.error();
      }
    }
    lock.lock();
    receiving_ = false;
    if (failed) {
      // A closed socket or a corrupt completion ring: nothing more can be trusted from it.
      daemon_gone_.store(true, std::memory_order_release);
      rx_cv_.notify_all();
      awaited_.erase(request);
      if (!conn_.daemon_alive()) return daemon_gone_error();
      return make_error(ErrorCode::Execution, "connection to the daemon broken: " + failure.message);
    }
    if (cpl) {
      if (awaited_.count(cpl->request_id) != 0) {
        ready_.emplace(cpl->request_id, std::move(*cpl));
      } else if (timed_out_.erase(cpl->request_id) != 0) {
        // A late answer to a wait that gave up: the daemon is done with its range.
        if (auto q = quarantined_.find(cpl->request_id); q != quarantined_.end()) {
          (void)arena_alloc_.free(q->second);
          quarantined_.erase(q);
        }
      } else if (const auto* e = std::get_if<ErrorCpl>(&cpl->body)) {
        async_errors_.push_back(make_error(e->code, e->message));
      }
    }
    rx_cv_.notify_all();
  }
}

Status RemoteTarget::take_async_error() {
  MutexLock lock(rx_mu_);
  if (async_errors_.empty()) return Status::Ok();
  Error e = async_errors_.front();
  async_errors_.pop_front();
  e.message = "the daemon rejected an earlier operation: " + e.message;
  return e;
}

Status RemoteTarget::completion_status(const Completion& c, const char* what) {
  if (const auto* e = std::get_if<ErrorCpl>(&c.body)) return make_error(e->code, e->message);
  if (!std::holds_alternative<OkCpl>(c.body))
    return make_error(ErrorCode::Internal,
                      fmt::format("{}: unexpected {} completion", what, completion_kind_name(c.kind())));
  return Status::Ok();
}

Result<ArenaRange> RemoteTarget::allocate(std::uint64_t bytes, const char* what) {
  if (bytes > arena_capacity_)
    return make_error(ErrorCode::ResourceExhausted,
                      fmt::format("{}: {} bytes do not fit the transfer arena of {} bytes (daemon --arena-mib)", what,
                                  bytes, arena_capacity_));
  const std::chrono::milliseconds timeout(reply_timeout_ms_.load(std::memory_order_relaxed));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(rx_mu_);
  for (;;) {
    if (std::optional<ArenaRange> r = arena_alloc_.allocate(std::max<std::uint64_t>(bytes, 1))) return *r;
    // Other threads' transfers hold the arena: their completions free it.
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(ErrorCode::ResourceExhausted, fmt::format("{}: the transfer arena stayed full", what));
    rx_cv_.wait_for(lock, kPoll);
  }
}

std::optional<ArenaRange> RemoteTarget::try_allocate(std::uint64_t bytes) {
  MutexLock lock(rx_mu_);
  return arena_alloc_.allocate(std::max<std::uint64_t>(bytes, 1));
}

void RemoteTarget::free_range(ArenaRange r) {
  {
    MutexLock lock(rx_mu_);
    (void)arena_alloc_.free(r);
  }
  rx_cv_.notify_all();
}

std::uint64_t RemoteTarget::quarantined_bytes() const {
  MutexLock lock(rx_mu_);
  std::uint64_t n = 0;
  for (const auto& [request, range] : quarantined_) n += range.length;
  return n;
}

void RemoteTarget::release_range(std::uint64_t request, ArenaRange r) {
  {
    MutexLock lock(rx_mu_);
    if (timed_out_.count(request) != 0) {
      quarantined_.emplace(request, r);  // its late answer frees it (wait)
      return;
    }
    (void)arena_alloc_.free(r);
  }
  rx_cv_.notify_all();
}

Status RemoteTarget::upload(runtime::StreamId home, ir::TensorId id, ir::DType dtype, ir::Shape shape,
                            std::span<const std::byte> bytes) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t need, tensor_bytes(dtype, shape));
  if (need != bytes.size())
    return make_error(ErrorCode::Invalid, fmt::format("upload: {} bytes for a tensor of {}", bytes.size(), need));
  if (need > arena_capacity_) return upload_chunked(home, id, dtype, shape, bytes);
  KILN_ASSIGN_OR_RETURN(ArenaRange range, allocate(need, "upload"));
  const ArenaRange data{range.offset, need};  // `range` (rounded up) is what goes back to the allocator
  Status written = conn_.endpoint().arena().write(
      data, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
  if (!written.ok()) {
    free_range(range);
    return written;
  }
  Result<std::uint64_t> request = send(UploadCmd{home.value(), id, dtype, std::move(shape), data});
  if (!request.ok()) {
    free_range(range);
    return request.error();
  }
  Result<Completion> c = wait(*request, /*holds_range=*/true);
  release_range(*request, range);  // the completion (or the end of the connection) returns the range
  if (!c.ok()) return c.error();
  return completion_status(*c, "upload");
}

// Half the arena, rounded down to the allocator's 64-byte alignment: one part is written (or
// copied out) while the other is in flight.
std::uint64_t RemoteTarget::part_bytes() const {
  // A quarter: with two parts in flight, half the arena stays free for other threads' transfers
  // (half-arena parts filled it, and a waiter woken by a freed part lost the race to the next).
  return std::max<std::uint64_t>(64, (arena_capacity_ / 4) & ~std::uint64_t{63});
}

Result<std::optional<ArenaRange>> RemoteTarget::next_part_range(std::uint64_t n,
                                                                const std::function<bool()>& settle_oldest,
                                                                const std::function<bool()>& failed, const char* what) {
  std::optional<ArenaRange> range = try_allocate(n);
  while (!range && !failed() && settle_oldest()) range = try_allocate(n);
  if (failed()) {
    if (range) free_range(*range);
    return std::optional<ArenaRange>();
  }
  if (range) return range;
  KILN_ASSIGN_OR_RETURN(ArenaRange r, allocate(n, what));  // only other threads' transfers hold the arena
  return std::optional<ArenaRange>(r);
}

Status RemoteTarget::upload_chunked(runtime::StreamId home, ir::TensorId id, ir::DType dtype, const ir::Shape& shape,
                                    std::span<const std::byte> bytes) {
  MutexLock chunked(chunk_mu_);
  const std::uint64_t part = part_bytes();
  std::deque<InFlight> in_flight;
  std::optional<Error> failed;  // the first failure; later parts are only settled
  auto settle_oldest = [&] {
    if (in_flight.empty()) return false;
    const InFlight f = in_flight.front();
    in_flight.pop_front();
    Result<Completion> c = wait(f.request, /*holds_range=*/true);
    release_range(f.request, f.range);  // the completion (or the end of the connection) returns the range
    Status st = c.ok() ? completion_status(*c, "upload") : Status(c.error());
    if (!failed && !st.ok()) failed = st.error();
    return true;
  };
  auto has_failed = [&] { return failed.has_value(); };
  std::uint64_t sent = 0;
  while (sent < bytes.size() && !failed) {
    const std::uint64_t n = std::min<std::uint64_t>(part, bytes.size() - sent);
    // Earlier parts are waited for only as far as the arena needs their space.
    Result<std::optional<ArenaRange>> next = next_part_range(n, settle_oldest, has_failed, "upload");
    if (!next.ok()) failed = next.error();
    if (failed) break;
    const ArenaRange range = **next;
    const ArenaRange data{range.offset, n};
    Status written = conn_.endpoint().arena().write(
        data, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(bytes.data()) + sent, n));
    Result<std::uint64_t> request = written.ok() ? send(UploadPartCmd{home.value(), id, dtype, shape, sent, data})
                                                 : Result<std::uint64_t>(written.error());
    if (!request.ok()) {
      free_range(range);
      failed = request.error();
      break;
    }
    in_flight.push_back(InFlight{*request, range, sent, n});
    sent += n;
  }
  while (settle_oldest()) {
  }
  if (failed) return *failed;
  return Status::Ok();
}

Status RemoteTarget::read_chunked(runtime::StreamId home, const ir::TensorIr& t, std::span<std::byte> out) {
  MutexLock chunked(chunk_mu_);
  const std::uint64_t part = part_bytes();
  const std::uint64_t bytes = out.size();
  std::deque<InFlight> in_flight;
  std::optional<Error> failed;  // the first failure; later windows are only settled
  bool rejected = false;        // the daemon answered with an error
  auto settle_oldest = [&] {
    if (in_flight.empty()) return false;
    const InFlight f = in_flight.front();
    in_flight.pop_front();
    Result<Completion> c = wait(f.request, /*holds_range=*/true);
    Status st = Status::Ok();
    if (!c.ok()) {
      st = c.error();
    } else if (const auto* e = std::get_if<ErrorCpl>(&c->body)) {
      st = make_error(e->code, e->message);
      rejected = rejected || !failed;
    } else if (const auto* done = std::get_if<ReadPartDoneCpl>(&c->body);
               done == nullptr || done->offset != f.offset || done->data.offset != f.range.offset ||
               done->data.length != f.length || !(done->dtype == t.dtype) || done->shape != t.shape) {
      st = make_error(ErrorCode::Internal, "read: the daemon answered outside the requested window");
    } else {
      st = conn_.endpoint().arena().read(
          done->data, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(out.data()) + f.offset, f.length));
    }
    release_range(f.request, f.range);
    if (!failed && !st.ok()) failed = st.error();
    return true;
  };
  auto has_failed = [&] { return failed.has_value(); };
  std::uint64_t requested = 0;
  while (requested < bytes && !failed) {
    const std::uint64_t n = std::min<std::uint64_t>(part, bytes - requested);
    Result<std::optional<ArenaRange>> next = next_part_range(n, settle_oldest, has_failed, "read");
    if (!next.ok()) failed = next.error();
    if (failed) break;
    const ArenaRange range = **next;
    // The window's capacity is exactly n: the daemon fills all of it.
    Result<std::uint64_t> request = send(ReadPartCmd{home.value(), t, requested, ArenaRange{range.offset, n}});
    if (!request.ok()) {
      free_range(range);
      failed = request.error();
      break;
    }
    in_flight.push_back(InFlight{*request, range, requested, n});
    requested += n;
  }
  while (settle_oldest()) {
  }
  if (failed) {
    // The usual cause of a failed read is an op the daemon rejected earlier: say so first.
    if (rejected)
      if (Status earlier = take_async_error(); !earlier.ok()) return earlier.error();
    return *failed;
  }
  return Status::Ok();
}

Status RemoteTarget::register_op(runtime::StreamId stream, ir::Operation&& op) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t request, send(RegisterOpCmd{stream.value(), std::move(op)}));
  (void)request;
  ops_sent_.fetch_add(1, std::memory_order_relaxed);
  return Status::Ok();
}

Status RemoteTarget::drain(runtime::StreamId stream) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t request, send(SyncCmd{stream.value()}));
  KILN_ASSIGN_OR_RETURN(Completion c, wait(request));
  KILN_RETURN_IF_ERROR(completion_status(c, "sync"));
  return take_async_error();
}

Result<runtime::HostData> RemoteTarget::read(runtime::StreamId home, const ir::TensorIr& t) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t need, tensor_bytes(t.dtype, t.shape));
  runtime::HostData data{t.dtype, t.shape, std::vector<std::byte>(need)};
  KILN_RETURN_IF_ERROR(read_into(home, t, data.bytes));
  return data;
}

Status RemoteTarget::read_into(runtime::StreamId home, const ir::TensorIr& t, std::span<std::byte> dst) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t need, tensor_bytes(t.dtype, t.shape));
  if (need != dst.size())
    return make_error(ErrorCode::Invalid,
                      fmt::format("read of {}: {} bytes into a buffer of {}", t.id.to_string(), need, dst.size()));
  if (need > arena_capacity_) return read_chunked(home, t, dst);
  KILN_ASSIGN_OR_RETURN(ArenaRange range, allocate(need, "read"));
  Result<std::uint64_t> request = send(ReadCmd{home.value(), t, range});
  if (!request.ok()) {
    free_range(range);
    return request.error();
  }
  Result<Completion> c = wait(*request, /*holds_range=*/true);
  if (!c.ok()) {
    release_range(*request, range);
    return c.error();
  }
  if (const auto* e = std::get_if<ErrorCpl>(&c->body)) {
    release_range(*request, range);
    // The usual cause of a failed read is an op the daemon rejected earlier: say so first.
    if (Status earlier = take_async_error(); !earlier.ok()) return earlier.error();
    return make_error(e->code, e->message);
  }
  const auto* done = std::get_if<ReadDoneCpl>(&c->body);
  if (done == nullptr || done->data.offset != range.offset || done->data.length > range.length ||
      done->data.length != need || !(done->dtype == t.dtype) || done->shape != t.shape) {
    release_range(*request, range);
    return make_error(ErrorCode::Internal, "read: the daemon answered outside the requested range");
  }
  // Straight from the arena into the caller's buffer.
  Status copied = conn_.endpoint().arena().read(
      done->data, std::span<std::uint8_t>(reinterpret_cast<std::uint8_t*>(dst.data()), dst.size()));
  release_range(*request, range);
  return copied;
}

Status RemoteTarget::drop(runtime::StreamId home, const ir::TensorIr& t) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t request, send(DropCmd{home.value(), t}));
  (void)request;
  return Status::Ok();
}

Result<ExportToken> RemoteTarget::export_tensor(runtime::StreamId home, ir::TensorId id) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t request, send(ExportCmd{home.value(), id}));
  KILN_ASSIGN_OR_RETURN(Completion c, wait(request));
  if (const auto* e = std::get_if<ErrorCpl>(&c.body)) return make_error(e->code, e->message);
  const auto* ex = std::get_if<ExportedCpl>(&c.body);
  if (ex == nullptr) return make_error(ErrorCode::Internal, "export: unexpected completion");
  return ex->token;
}

Status RemoteTarget::import_tensor(runtime::StreamId stream, const ExportToken& token, ir::TensorId id) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t request, send(ImportCmd{stream.value(), token, id}));
  KILN_ASSIGN_OR_RETURN(Completion c, wait(request));
  return completion_status(c, "import");
}

// A view of one of our tensors on another of our streams: export it to ourselves and import
// it under the new id, homed on the stream that will use it (the daemon makes the shared view).
Status RemoteTarget::share(runtime::StreamId src_stream, ir::TensorId src, runtime::StreamId dst_stream,
                           ir::TensorId dst) {
  KILN_ASSIGN_OR_RETURN(ExportToken token, export_tensor(src_stream, src));
  return import_tensor(dst_stream, token, dst);
}

Result<std::string> RemoteTarget::daemon_status(bool json) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t request, send(StatusCmd{json}));
  KILN_ASSIGN_OR_RETURN(Completion c, wait(request));
  if (const auto* e = std::get_if<ErrorCpl>(&c.body)) return make_error(e->code, e->message);
  const auto* text = std::get_if<StatusTextCpl>(&c.body);
  if (text == nullptr) return make_error(ErrorCode::Internal, "status: unexpected completion");
  return text->text;
}

Result<std::string> RemoteTarget::control(ControlVerb verb, std::string args, bool json) {
  KILN_ASSIGN_OR_RETURN(std::uint64_t request, send(ControlCmd{verb, json, std::move(args)}));
  KILN_ASSIGN_OR_RETURN(Completion c, wait(request));
  if (const auto* e = std::get_if<ErrorCpl>(&c.body)) return make_error(e->code, e->message);
  const auto* text = std::get_if<StatusTextCpl>(&c.body);
  if (text == nullptr) return make_error(ErrorCode::Internal, "control: unexpected completion");
  return text->text;
}

Status RemoteTarget::report_fallbacks(const std::map<std::string, std::uint64_t>& calls) {
  // The most-called first (ties by name), each taken while the message still fits the protocol's
  // bounds and the command ring; then in name order, as the format wants.
  std::vector<FallbackCount> by_calls;
  by_calls.reserve(calls.size());
  for (const auto& [name, n] : calls)
    if (!fallback_name_problem(name)) by_calls.push_back(FallbackCount{name, n});
  std::stable_sort(by_calls.begin(), by_calls.end(),
                   [](const FallbackCount& a, const FallbackCount& b) { return a.calls > b.calls; });
  const std::size_t max_bytes = std::min(kMaxMessageBytes, conn_.endpoint().max_send_bytes());
  std::size_t bytes = kMessageHeaderBytes + 2;  // the header and the count
  ReportFallbacksCmd report;
  for (FallbackCount& f : by_calls) {
    const std::size_t entry = 1 + f.name.size() + 8;  // name_len, name, calls
    if (report.counts.size() == kMaxFallbackEntries || bytes + entry > max_bytes) break;
    bytes += entry;
    report.counts.push_back(std::move(f));
  }
  std::sort(report.counts.begin(), report.counts.end(),
            [](const FallbackCount& a, const FallbackCount& b) { return a.name < b.name; });
  KILN_ASSIGN_OR_RETURN(std::uint64_t request, send(std::move(report)));
  (void)request;
  return Status::Ok();
}

}  // namespace kiln::ipc

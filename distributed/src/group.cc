#include "kiln/distributed/group.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "kiln/base/mutex.h"
#include "kiln/distributed/store.h"
#include "kiln/reference/tensor.h"

namespace kiln::distributed {
namespace {

using Clock = std::chrono::steady_clock;
using ReduceFn = void (*)(void*, const void*, const void*, std::size_t);

// Gloo's view of kiln's store: the keys of one generation under its prefix. Gloo calls it from
// connectFullMesh and expects failures as exceptions (caught by the group, never further).
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(StoreClient& store, std::uint64_t generation, std::chrono::milliseconds timeout)
      : store_(store), prefix_(fmt::format("{}/", generation)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    check(store_.set(prefix_ + key, {reinterpret_cast<const std::uint8_t*>(data.data()), data.size()}));
  }
  std::vector<char> get(const std::string& key) override {
    Result<std::vector<std::uint8_t>> v = store_.get(prefix_ + key, timeout_);
    check(v.status());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) check(store_.get(prefix_ + key, timeout).status());
  }

 private:
  static void check(const Status& st) {
    if (!st.ok()) throw gloo::IoException(st.error().message);
  }
  StoreClient& store_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

template <class T>
ReduceFn reduce_fn(ir::ReduceOperation op) {
  switch (op) {
    case ir::ReduceOperation::Sum:
    case ir::ReduceOperation::Mean: return &gloo::sum<T>;
    case ir::ReduceOperation::Min: return &gloo::min<T>;
    case ir::ReduceOperation::Max: return &gloo::max<T>;
    case ir::ReduceOperation::Prod: return &gloo::product<T>;
  }
  return &gloo::sum<T>;
}

// Mean: the sum over `world` ranks divided by it (integers truncate toward zero, as C++ does).
template <class T>
void divide(std::span<T> values, std::uint32_t world) {
  for (T& v : values) v = static_cast<T>(v / static_cast<T>(world));
}

// One all-reduce of T elements, in place.
template <class T>
void gloo_all_reduce(const std::shared_ptr<gloo::Context>& context, std::span<T> values, ir::ReduceOperation op,
                     std::uint32_t tag, std::chrono::milliseconds timeout) {
  if (values.empty()) return;
  gloo::AllreduceOptions options(context);
  options.setOutput(values.data(), values.size());
  options.setReduceFunction(reduce_fn<T>(op));
  options.setTag(tag);
  options.setTimeout(timeout);
  gloo::allreduce(options);
  if (op == ir::ReduceOperation::Mean) divide(values, static_cast<std::uint32_t>(context->size));
}

template <class T>
std::span<T> as_span(std::span<std::byte> data) {
  return {reinterpret_cast<T*>(data.data()), data.size() / sizeof(T)};
}

// f16 and bf16: widened to f32 (exact), reduced, rounded back once.
void half_all_reduce(const std::shared_ptr<gloo::Context>& context, std::span<std::byte> data, bool bf16,
                     ir::ReduceOperation op, std::uint32_t tag, std::chrono::milliseconds timeout) {
  const std::size_t n = data.size() / 2;
  std::vector<std::uint16_t> bits(n);
  std::memcpy(bits.data(), data.data(), n * 2);
  std::vector<float> wide(n);
  for (std::size_t i = 0; i < n; ++i) wide[i] = bf16 ? reference::bf16_to_f32(bits[i]) : reference::f16_to_f32(bits[i]);
  gloo_all_reduce<float>(context, wide, op, tag, timeout);
  for (std::size_t i = 0; i < n; ++i) bits[i] = bf16 ? reference::bf16_from_f32(wide[i]) : reference::f16_from_f32(wide[i]);
  std::memcpy(data.data(), bits.data(), n * 2);
}

void dispatch_all_reduce(const std::shared_ptr<gloo::Context>& context, ir::DType dtype, std::span<std::byte> data,
                         ir::ReduceOperation op, std::uint32_t tag, std::chrono::milliseconds timeout) {
  using K = ir::DTypeKind;
  switch (dtype.kind()) {
    case K::F64: return gloo_all_reduce(context, as_span<double>(data), op, tag, timeout);
    case K::F32:
    case K::Flex32: return gloo_all_reduce(context, as_span<float>(data), op, tag, timeout);
    case K::F16: return half_all_reduce(context, data, false, op, tag, timeout);
    case K::BF16: return half_all_reduce(context, data, true, op, tag, timeout);
    case K::I64: return gloo_all_reduce(context, as_span<std::int64_t>(data), op, tag, timeout);
    case K::I32: return gloo_all_reduce(context, as_span<std::int32_t>(data), op, tag, timeout);
    case K::I16: return gloo_all_reduce(context, as_span<std::int16_t>(data), op, tag, timeout);
    case K::I8: return gloo_all_reduce(context, as_span<std::int8_t>(data), op, tag, timeout);
    case K::U64: return gloo_all_reduce(context, as_span<std::uint64_t>(data), op, tag, timeout);
    case K::U32: return gloo_all_reduce(context, as_span<std::uint32_t>(data), op, tag, timeout);
    case K::U16: return gloo_all_reduce(context, as_span<std::uint16_t>(data), op, tag, timeout);
    case K::U8: return gloo_all_reduce(context, as_span<std::uint8_t>(data), op, tag, timeout);
    default: throw gloo::Exception("unsupported dtype");  // check_dtype refused it before
  }
}

// Tags keep consecutive collectives apart on Gloo's pairs; every rank counts them alike.
constexpr std::uint32_t kTagModulus = 1u << 30;
// How long a failure's diagnosis waits for the store to see a dead peer's connection close: the
// collective may notice the reset before the store's thread reads the end of the stream.
constexpr std::chrono::milliseconds kLeaveGrace{300};

}  // namespace

const char* group_state_name(GroupState state) {
  switch (state) {
    case GroupState::Idle: return "idle";
    case GroupState::Meeting: return "meeting";
    case GroupState::Ready: return "ready";
    case GroupState::Failed: return "failed";
  }
  return "unknown";
}

class CollectiveGroup::Impl {
 public:
  Impl(DistributedConfig config, std::string version) : config_(std::move(config)), version_(std::move(version)) {
    status_.job = config_.job;
    status_.rank = config_.rank;
    status_.world_size = config_.world_size;
    status_.rendezvous = config_.rendezvous.to_string();
  }

  // Rank 0 serves the store; port 0 takes a free port, which config() then reports.
  Status start_store() {
    if (config_.rank != 0) return Status::Ok();
    KILN_ASSIGN_OR_RETURN(server_, StoreServer::start(config_.rendezvous, identity()));
    config_.rendezvous.port = server_->port();
    MutexLock lock(status_mu_);
    status_.rendezvous = config_.rendezvous.to_string();
    return Status::Ok();
  }

  const DistributedConfig& config() const { return config_; }

  Status all_reduce(ir::DType dtype, std::span<std::byte> data, ir::ReduceOperation op) {
    KILN_RETURN_IF_ERROR(check_dtype(dtype));
    if (data.size() % dtype.size_bytes() != 0)
      return make_error(ErrorCode::Invalid, fmt::format("all_reduce: {} bytes is not a whole number of {} elements",
                                                        data.size(), dtype.name()));
    const std::string what = fmt::format("all_reduce ({}, {} {} elements)", ir::reduce_operation_name(op),
                                         data.size() / dtype.size_bytes(), dtype.name());
    return run(what, [&](const std::shared_ptr<gloo::Context>& context, std::uint32_t tag) {
      if (context) dispatch_all_reduce(context, dtype, data, op, tag, config_.timeout);  // else: one rank's
    });
  }

  Status broadcast(std::span<std::byte> data, std::uint32_t root) {
    if (root >= config_.world_size)
      return make_error(ErrorCode::Invalid,
                        fmt::format("broadcast: root {} is not a rank of the world of {}", root, config_.world_size));
    return run(fmt::format("broadcast ({} bytes from rank {})", data.size(), root),
               [&](const std::shared_ptr<gloo::Context>& context, std::uint32_t tag) {
                 if (data.empty() || !context) return;  // a world of one holds the root's data
                 gloo::BroadcastOptions options(context);
                 options.setOutput(reinterpret_cast<std::uint8_t*>(data.data()), data.size());
                 options.setRoot(static_cast<int>(root));
                 options.setTag(tag);
                 options.setTimeout(config_.timeout);
                 gloo::broadcast(options);
               });
  }

  Status all_gather(std::span<const std::byte> mine, std::span<std::byte> all) {
    if (all.size() != mine.size() * config_.world_size)
      return make_error(ErrorCode::Invalid, fmt::format("all_gather: {} bytes from each of {} ranks do not fill {}",
                                                        mine.size(), config_.world_size, all.size()));
    return run(fmt::format("all_gather ({} bytes from each rank)", mine.size()),
               [&](const std::shared_ptr<gloo::Context>& context, std::uint32_t tag) {
                 if (mine.empty()) return;
                 if (!context) {  // a world of one
                   std::memcpy(all.data(), mine.data(), mine.size());
                   return;
                 }
                 gloo::AllgatherOptions options(context);
                 // Gloo reads the input without writing it; its API takes a mutable pointer.
                 options.setInput(const_cast<std::uint8_t*>(reinterpret_cast<const std::uint8_t*>(mine.data())),
                                  mine.size());
                 options.setOutput(reinterpret_cast<std::uint8_t*>(all.data()), all.size());
                 options.setTag(tag);
                 options.setTimeout(config_.timeout);
                 gloo::allgather(options);
               });
  }

  void abandon(const std::string& reason) {
    MutexLock lock(mu_);
    if (config_.world_size == 1) return;
    (void)fail_locked(reason);
  }

  GroupStatus status() const {
    MutexLock lock(status_mu_);
    return status_;
  }

 private:
  StoreIdentity identity() const { return StoreIdentity{config_.job, config_.world_size, version_}; }

  // One collective, in the order every rank runs them: the meeting first when there is no
  // communicator, a fresh tag, `call` (Gloo throws on failure: caught here, the message names
  // the ranks that left). A world of one calls it with no context.
  template <class Call>
  Status run(const std::string& what, Call&& call) {
    MutexLock lock(mu_);
    if (config_.world_size == 1) {
      try {
        call(std::shared_ptr<gloo::Context>(), 0u);
      } catch (const std::exception& e) {
        return fail_locked(fmt::format("{} failed: {}", what, e.what()));
      }
      return finish_locked();
    }
    if (!context_) {
      Status met = meet_locked();
      if (!met.ok()) return fail_locked(met.error().message);
    }
    const std::uint32_t tag = next_tag_;
    next_tag_ = (next_tag_ + 1) % kTagModulus;
    try {
      call(context_, tag);
    } catch (const std::exception& e) {
      return fail_locked(diagnose_locked(fmt::format("{} failed: {}", what, e.what())));
    }
    return finish_locked();
  }

  // The meeting: the store (connected once, again after it failed), every rank's join, then
  // Gloo's full mesh over this generation's keys.
  Status meet_locked() KILN_REQUIRES(mu_) {
    set_state(GroupState::Meeting);
    const auto deadline = Clock::now() + config_.timeout;
    if (!store_) {
      KILN_ASSIGN_OR_RETURN(store_, StoreClient::connect(config_.rendezvous, identity(), config_.rank, config_.timeout));
    }
    const auto left = [&deadline] {
      return std::max(std::chrono::milliseconds(1),
                      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
    };
    Result<std::uint64_t> generation = store_->join(left());
    if (!generation.ok()) {
      if (!store_->connected()) store_.reset();  // the next meeting connects again
      return generation.error();
    }
    try {
      gloo::transport::tcp::attr attr;
      attr.hostname = config_.host.empty() ? store_->local_host() : config_.host;
      std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(config_.rank),
                                                                 static_cast<int>(config_.world_size));
      context->setTimeout(config_.timeout);
      GlooStore store(*store_, *generation, left());
      context->connectFullMesh(store, device);
      context_ = std::move(context);
    } catch (const std::exception& e) {
      return make_error(ErrorCode::Execution,
                        diagnose_locked(fmt::format("meeting {} of job '{}' failed: {}", *generation, config_.job, e.what())));
    }
    next_tag_ = 0;
    MutexLock lock(status_mu_);
    status_.state = GroupState::Ready;
    status_.generation = *generation;
    ++status_.meetings;
    return Status::Ok();
  }

  // `what`, and which ranks the store no longer sees (their daemons' connections closed).
  std::string diagnose_locked(const std::string& what) KILN_REQUIRES(mu_) {
    std::vector<std::uint32_t> live;
    const auto until = Clock::now() + kLeaveGrace;
    for (;;) {
      if (server_) {
        live = server_->live_ranks();
      } else if (store_) {
        Result<std::vector<std::uint32_t>> r = store_->live_ranks();
        if (!r.ok()) {
          store_.reset();
          return fmt::format("{}; rank 0, which serves the rendezvous, is unreachable ({})", what, r.error().message);
        }
        live = std::move(r).value();
      } else {
        return what;
      }
      if (live.size() < config_.world_size || Clock::now() >= until) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::vector<std::uint32_t> missing;
    for (std::uint32_t r = 0; r < config_.world_size; ++r)
      if (!std::binary_search(live.begin(), live.end(), r)) missing.push_back(r);
    if (missing.empty())
      return fmt::format("{}; every rank's daemon is still connected to the rendezvous (a peer stalled, or left the "
                         "collective on an error of its own)",
                         what);
    return fmt::format("{}; rank(s) {} of job '{}' left (their daemon's connection to the rendezvous closed)", what,
                       fmt::join(missing, ", "), config_.job);
  }

  Status fail_locked(std::string message) KILN_REQUIRES(mu_) {
    context_.reset();  // the next collective meets again
    MutexLock lock(status_mu_);
    status_.state = GroupState::Failed;
    ++status_.failures;
    status_.last_error = message;
    return make_error(ErrorCode::Execution, std::move(message));
  }

  Status finish_locked() KILN_REQUIRES(mu_) {
    MutexLock lock(status_mu_);
    if (config_.world_size == 1) status_.state = GroupState::Ready;
    ++status_.collectives;
    return Status::Ok();
  }

  void set_state(GroupState state) {
    MutexLock lock(status_mu_);
    status_.state = state;
  }

  DistributedConfig config_;  // written only by start_store, before the group is shared
  const std::string version_;
  std::unique_ptr<StoreServer> server_;  // rank 0 only; set before any collective

  // Held for a whole collective (or meeting): they are matched in order on every rank.
  Mutex mu_ KILN_ACQUIRED_BEFORE(status_mu_);
  std::unique_ptr<StoreClient> store_ KILN_GUARDED_BY(mu_);
  std::shared_ptr<gloo::Context> context_ KILN_GUARDED_BY(mu_);
  std::uint32_t next_tag_ KILN_GUARDED_BY(mu_) = 0;

  mutable Mutex status_mu_;
  GroupStatus status_ KILN_GUARDED_BY(status_mu_);
};

CollectiveGroup::CollectiveGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CollectiveGroup::~CollectiveGroup() = default;

Result<std::unique_ptr<CollectiveGroup>> CollectiveGroup::create(DistributedConfig config, std::string version) {
  KILN_RETURN_IF_ERROR(validate(config));
  auto impl = std::make_unique<Impl>(std::move(config), std::move(version));
  KILN_RETURN_IF_ERROR(impl->start_store());
  return std::unique_ptr<CollectiveGroup>(new CollectiveGroup(std::move(impl)));
}

const DistributedConfig& CollectiveGroup::config() const { return impl_->config(); }

Status CollectiveGroup::check_dtype(ir::DType dtype) {
  if (dtype.is_float() || dtype.is_integral()) return Status::Ok();
  return make_error(ErrorCode::Unsupported,
                    fmt::format("all_reduce across daemons takes float and integer tensors, not {}", dtype.name()));
}

Status CollectiveGroup::all_reduce(ir::DType dtype, std::span<std::byte> data, ir::ReduceOperation op) {
  return impl_->all_reduce(dtype, data, op);
}

Status CollectiveGroup::broadcast(std::span<std::byte> data, std::uint32_t root) {
  return impl_->broadcast(data, root);
}

Status CollectiveGroup::all_gather(std::span<const std::byte> mine, std::span<std::byte> all) {
  return impl_->all_gather(mine, all);
}

void CollectiveGroup::abandon(const std::string& reason) { impl_->abandon(reason); }

GroupStatus CollectiveGroup::status() const { return impl_->status(); }

}  // namespace kiln::distributed

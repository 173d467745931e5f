// DeviceBackend: what a device's backend implements for the runtime (per-stream executors, the
// fuser prototypes, the tensor table: upload, download, free, alias, presence, statistics).
// Backends live in their own modules (cpu/, cuda/) and depend on this one.
//
// Thread-safety: every DeviceBackend method may be called from any thread at any time (stream
// actors, client threads reading or uploading). The Executor a backend makes is used by one
// stream actor at a time (fusion/executor.h), but executors of different streams run at once
// over the one shared tensor table.
//
// Usage:
//   auto backend = std::make_unique<cpu::ReferenceCpuBackend>();   // kiln/cpu/reference_backend.h
//   Status st = backend->upload(TensorId{1}, dtypes::f32, {2}, std::as_bytes(std::span(values)));
//   Result<HostData> data = backend->download(TensorIr{TensorId{1}, {2}, TensorStatus::ReadOnly, dtypes::f32});
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/base/function_ref.h"
#include "kiln/base/result.h"
#include "kiln/fusion/executor.h"
#include "kiln/fusion/fuser.h"
#include "kiln/fusion/fusers.h"
#include "kiln/fusion/fusion_log.h"
#include "kiln/ir/handle_container.h"
#include "kiln/ir/handle_error.h"
#include "kiln/ir/tensor.h"
#include "kiln/runtime/session_target.h"

namespace kiln::runtime {

struct MemoryStats {
  std::uint64_t tensors = 0;       // entries in the tensor table (any state)
  std::uint64_t errored = 0;       // Errored entries
  std::uint64_t bytes_in_use = 0;  // bytes the backend's allocator holds for live buffers
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual std::string_view name() const = 0;
  // A new executor for one stream (it may keep per-stream state: a CUDA stream, a RNG).
  virtual std::unique_ptr<fusion::Executor> make_executor() = 0;
  // The fuser prototypes a new stream's processor starts with (registry order); `options` come
  // from the fusion configuration ([fusion] row_fuser).
  virtual fusion::FuserList fusers(const fusion::FusionLog& log, const fusion::FuserOptions& options) const = 0;

  // Registers host data under a fresh id (no stream involved: the id is new, docs/spec/fusion.md §16.2
  // register_tensor_handle). Errors name the id, shape and dtype that did not fit. `bytes` may
  // be memory another process can write meanwhile (the daemon passes its client's arena range):
  // an upload copies them once and decides nothing on their values.
  [[nodiscard]] virtual Status upload(ir::TensorId id, ir::DType dtype, ir::Shape shape,
                                      std::span<const std::byte> bytes) = 0;
  // Copies a tensor to the host; t.status == ReadWrite also releases its entry. An Errored
  // tensor gives ErrorCode::Execution with TensorError::to_string() (root cause and the number of
  // skipped operations); an absent entry gives ErrorCode::InvalidHandle.
  [[nodiscard]] virtual Result<HostData> download(const ir::TensorIr& t) = 0;
  // An Existing entry (not NotInit, not Errored): its producer has run and succeeded.
  virtual bool is_materialized(ir::TensorId id) const = 0;
  // The error of an Errored entry (root shared by pointer identity), nullopt otherwise.
  virtual std::optional<ir::TensorError> error_of(ir::TensorId id) const = 0;
  // Registers `id` (fresh: no entry yet) as Errored with `error`: an output that work outside the
  // backend failed to produce (a collective across daemons), read like any failed op's output.
  // Default: Unsupported, for backends that keep no errors.
  [[nodiscard]] virtual Status claim_error(ir::TensorId id, const ir::TensorError& error);
  // Runs `update` on the bytes of a materialized tensor and keeps what it leaves there: the
  // daemon's collectives across daemons reduce into their output this way. The caller guarantees
  // that nothing else uses the tensor meanwhile (it is fresh, and its stream is drained). An
  // Errored entry gives ErrorCode::Execution with its error, an absent one InvalidHandle. The
  // default goes through the host (download, update, upload: a GPU's tensors); a host-memory
  // backend updates its buffer where it is.
  [[nodiscard]] virtual Status update_in_place(const ir::TensorIr& t, FunctionRef<Status(std::span<std::byte>)> update);
  // Releases the entry iff t.status == ReadWrite; an absent id is a no-op.
  virtual void free(const ir::TensorIr& t) = 0;
  // A cross-stream shared view (docs/spec/fusion.md §16.5): dst becomes an independent entry over src's
  // buffer; an Errored src gives an Errored dst with the same root and depth. InvalidHandle if
  // src has no entry (or is NotInit).
  [[nodiscard]] virtual Status alias(ir::TensorId src, ir::TensorId dst) = 0;
  virtual MemoryStats memory_stats() const = 0;
  // Gives memory the backend keeps cached for reuse, and has kept idle past its retention, back
  // to the system; returns the bytes released. The owner (the daemon) calls it from a
  // maintenance timer, so that an idle process falls back to its live tensors even when no
  // allocation comes to release lazily. Default: nothing is cached, 0.
  virtual std::uint64_t release_idle_memory() { return 0; }
  // Whether a stream's executor may run on a client thread that waits for the stream (a drain,
  // read or shared view run inline, see StreamActor::try_run_inline) rather than only on the
  // device's pool threads. A backend with per-thread state (a current device) says no.
  virtual bool executes_on_any_thread() const { return true; }
};

inline Status DeviceBackend::update_in_place(const ir::TensorIr& t, FunctionRef<Status(std::span<std::byte>)> update) {
  ir::TensorIr read = t;
  read.status = ir::TensorStatus::ReadOnly;
  KILN_ASSIGN_OR_RETURN(HostData data, download(read));
  KILN_RETURN_IF_ERROR(update(std::span<std::byte>(data.bytes)));
  return upload(t.id, data.dtype, std::move(data.shape), data.bytes);
}

inline Status DeviceBackend::claim_error(ir::TensorId id, const ir::TensorError& /*error*/) {
  return make_error(ErrorCode::Unsupported,
                    "the " + std::string(name()) + " backend keeps no error for " + id.to_string());
}

}  // namespace kiln::runtime

// The PyTorch device's process-wide state: where its tensors live (a kiln Device in this process,
// or a running kilnd reached through the IPC client), the Session its kernels queue ops through,
// and the fallback counts; and how kiln's errors reach Python.
//
// Why process-wide: PyTorch's PrivateUse1 model registers kernels and a device guard once per
// process, as free functions with no context argument, so the state they use cannot be passed
// in as kiln's other code passes its stores and caches. This is the one exception to "no global
// mutable state" (docs/decisions.md, "PyTorch device"): one object, made on first use, owned here.
//
// Thread-safety: every function may be called from any thread (PyTorch calls kernels from the
// Python thread and from its autograd threads). The Session is thread-safe; the counts take a
// mutex.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "kiln/base/result.h"
#include "kiln/runtime/session.h"

namespace kiln::pytorch {

// The Session of the process's kiln device, started by the first call: over the kilnd whose socket
// KILN_SOCKET names (a RemoteTarget; job "pytorch"), or, without KILN_SOCKET (or with it empty),
// over a Device in this process on the best CPU backend (cpu::CpuBackend, the fast executor, as
// `kilnd --device auto` picks on a machine without a GPU). A device that cannot start throws (a
// KilnError in Python; "daemon not running at PATH") and the next call tries again. In a child
// forked after the start it throws too: the parent's threads and connection are not the child's.
runtime::Session& session();

// kiln.connect(path, job): starts the device in the kilnd at `path` (relative to the working
// directory, as KILN_SOCKET), overriding KILN_SOCKET. Once the device has started, a second
// connect to the same socket does nothing and any other one throws, saying where it runs.
void connect(const std::string& path, const std::string& job);

// Where the tensors live, without starting the device: whether it started, the daemon's socket
// (absolute; empty: in process; before the start, the one KILN_SOCKET names) and this process's
// client id at the daemon (-1 in process or before the start).
struct Placement {
  bool started = false;
  std::string socket;
  std::int64_t client_id = -1;
};
Placement placement();

// The daemon's status report (what `kilnctl status [--json]` prints). Starts the device as the
// first op would; throws if it runs in process. Reports this process's fallback counts first if
// they changed, so that the report shows them as they are.
std::string daemon_status(bool json);

// Drains the calling thread's stream: the error of a queued op that failed, naming it, is thrown.
// In a kilnd, reports the fallback counts first when due (see sync_point): once it returns, the
// daemon's status shows what it reported.
void synchronize();

// A sync point (synchronize, a read): in a kilnd, sends the fallback counts to the daemon, which
// shows them per client in its status, if they changed since the last report and that report is
// at least 0.5 s old (kFallbackReportInterval). Cheap when there is nothing to send (one atomic
// load). A failed report raises nothing: it is dropped (the daemon may be gone, and the next op
// that waits on it says so).
void sync_point();

// Shuts the device down (drains every stream, joins its threads) if it was started in process.
// Called at Python exit; the objects stay allocated (tensors freed later drop into a closed
// device, which is a no-op), because Python does not free every tensor before the process's
// static destructors. In a kilnd there is nothing to stop: the connection closes with the
// process and the daemon frees what the process left (its queued ops are abandoned, as in
// process nobody would read them); fallback counts not reported yet are sent.
void shutdown();

// The op ran on the CPU instead of kiln (the boxed fallback, or a kernel's CPU path): counts it
// under `name` ("aten::op.overload") and warns on the first call for that name. In a kilnd the
// counts reach the daemon at a later sync point (sync_point).
void note_fallback(const std::string& name);
// {"aten::name.overload": calls} since the start or the last reset.
std::map<std::string, std::int64_t> fallback_counts();
// Clears the counts; in a kilnd, reports the empty snapshot at once.
void reset_fallback_counts();

// ---- Errors. kiln's errors (a Result's Error) are thrown as c10::AcceleratorError, which
// PyTorch turns into torch.AcceleratorError, a RuntimeError subclass that kiln.KilnError names,
// with `error_code` = kiln's ErrorCode value and the message "kiln: <what>: <kiln's message>".
// PyTorch-side argument errors (a CPU tensor where a kiln one is needed) stay plain TORCH_CHECKs
// (RuntimeError), as on PyTorch's other devices.
[[noreturn]] void throw_error(const Error& error, std::string_view what);

inline void check(const Status& status, std::string_view what) {
  if (!status.ok()) throw_error(status.error(), what);
}

template <class T>
T value_or_throw(Result<T> result, std::string_view what) {
  if (!result.ok()) throw_error(result.error(), what);
  return std::move(result).value();
}

}  // namespace kiln::pytorch

#include "state.h"

#include <c10/util/Exception.h>

#include <memory>
#include <mutex>

#include "kiln/base/mutex.h"
#include "kiln/cpu/cpu_backend.h"
#include "kiln/runtime/device.h"

namespace kiln::pytorch {
namespace {

struct State {
  std::once_flag started;
  std::unique_ptr<runtime::Device> device;
  std::unique_ptr<runtime::Session> session;
  Mutex mu;
  std::map<std::string, std::int64_t> fallbacks KILN_GUARDED_BY(mu);
};

// Never destroyed (see shutdown() in state.h): a tensor Python frees during its finalization
// must still find its Session.
State& state() {
  static State* const s = new State();
  return *s;
}

void start(State& s) {
  // The configuration comes from kiln.toml and KILN_* variables, as for every kiln client
  // (RuntimeOptions' defaults); the backend is the fast CPU executor with the JIT on Auto.
  Result<std::unique_ptr<runtime::Device>> device = runtime::Device::create(std::make_unique<cpu::CpuBackend>());
  s.device = value_or_throw(std::move(device), "starting the in-process device");
  s.session = std::make_unique<runtime::Session>(*s.device);
}

}  // namespace

runtime::Session& session() {
  State& s = state();
  // A throwing start leaves the flag unset: the next call tries again.
  std::call_once(s.started, start, s);
  return *s.session;
}

void synchronize() { check(session().sync(), "synchronize"); }

void shutdown() {
  State& s = state();
  if (!s.device) return;
  Status st = s.device->shutdown();
  (void)st;  // at exit there is no one left to tell; a failed op was reported at its sync
}

void note_fallback(const std::string& name) {
  bool first = false;
  {
    State& s = state();
    MutexLock lock(s.mu);
    first = s.fallbacks[name]++ == 0;
  }
  if (first) {
    TORCH_WARN("kiln: ", name, " is not lowered to kiln; it runs on the CPU (kiln.stats() counts it; warned once)");
  }
}

std::map<std::string, std::int64_t> fallback_counts() {
  State& s = state();
  MutexLock lock(s.mu);
  return s.fallbacks;
}

void reset_fallback_counts() {
  State& s = state();
  MutexLock lock(s.mu);
  s.fallbacks.clear();
}

void throw_error(const Error& error, std::string_view what) {
  throw c10::AcceleratorError({__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
                              static_cast<std::int32_t>(error.code),
                              "kiln: " + std::string(what) + ": " + error.to_string());
}

}  // namespace kiln::pytorch

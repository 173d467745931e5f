// Why a fused program ran op by op instead of as one launch: a value the backends return from
// their program runners, count by reason in their stats (CpuDeviceStats, CudaStats) and log with
// its detail. Both backends share the vocabulary so that a monitor reads their counts alike.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kiln::runtime {

enum class FallbackReason : std::uint8_t {
  // An input is errored: the op-by-op path propagates its error exactly as unfused execution
  // would.
  InputErrored,
  // The binding does not match the program: a tensor missing from the container, or held with
  // another dtype or shape than the program expects, a scalar or dim out of range.
  Binding,
  // The backend's compiled or generated form refuses the program (an instruction, a dtype or a
  // structure it has no kernel for).
  Unsupported,
  // The concrete shapes exceed what the kernels take (a rank above the limit, a view or an
  // indexed read that does not map onto the block).
  ShapeLimits,
  // An error only the reference executor reports exactly (a reduction without identity over an
  // empty axis, an index dtype too narrow): it runs the ops and reports it.
  ReferenceDecides,
  // The kernel faulted (integer division by zero, an index out of range); nothing was committed.
  Fault,
  // A plan whose kernel faulted before runs unfused for good.
  Quarantined,
  // The executor lacks its device resources (allocation of scratch or of the fault word failed);
  // the ops report the failure.
  Resources,
};
inline constexpr std::size_t kFallbackReasonCount = 8;

// Counts per reason, indexed by the enum's value.
using FallbackCounts = std::array<std::uint64_t, kFallbackReasonCount>;

constexpr std::string_view fallback_reason_name(FallbackReason r) {
  switch (r) {
    case FallbackReason::InputErrored: return "input_errored";
    case FallbackReason::Binding: return "binding";
    case FallbackReason::Unsupported: return "unsupported";
    case FallbackReason::ShapeLimits: return "shape_limits";
    case FallbackReason::ReferenceDecides: return "reference_decides";
    case FallbackReason::Fault: return "fault";
    case FallbackReason::Quarantined: return "quarantined";
    case FallbackReason::Resources: return "resources";
  }
  return "unknown";
}

// One decision: the reason, and a detail that names the values involved (which input, its
// shape, the limit) for the log and the tests.
struct Fallback {
  FallbackReason reason;
  std::string detail;
};

}  // namespace kiln::runtime

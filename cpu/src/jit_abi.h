// The binary interface between the fast executor and a JIT-compiled elementwise kernel
// (jit.cc generates the kernel). This header is compiled into kiln AND its text is embedded
// verbatim into every generated source (jit_prelude.cc.in), so both sides see one definition;
// kAbiVersion and the embedded text are part of the disk-cache key, so a kernel built against
// another layout is never loaded.
//
// Only fixed-width types and plain pointers: the generated library is built by another compiler
// invocation (possibly another compiler) and must agree on the layout without kiln's headers.
//
// Thread-safety: a Frame is built by one launch and read concurrently by the kernel calls of
// its parallel loop.
#pragma once

#include <cstdint>

namespace kiln::cpu::jit {

inline constexpr std::uint32_t kAbiVersion = 4;
inline constexpr int kAbiMaxRank = 8;

// A tensor read or written over the launch's coalesced iteration space: element offset of
// position (i0, ..., i_{rank-1}) = sum i_d * stride[d] (elements of the tensor's dtype).
struct Access {
  char* base;
  std::int64_t stride[kAbiMaxRank];
  // Store only: a broadcast output, written only where every stride-0 dim has index 0 (one
  // writer per element, so chunks never race).
  std::uint32_t masked;
  // Store only: 1 = a fresh f32 output of a memory-bound launch that streams from DRAM (the
  // interpreter's criterion, BlockRunner::streams_outputs and streamable_store): written with
  // non-temporal stores where the kernel has them (AVX-512) and the output is 64-byte aligned,
  // so that its lines are not first read for ownership. 0 for an output written in place over a
  // consumed input: its lines were just loaded, and streaming them evicts them (fused Adam's
  // kernel with its 14 in-place outputs streamed: 1.8x slower).
  std::uint32_t nontemporal;
};

// A scalar operand, already converted to its instruction's dtype and read through its class.
struct ScalarValue {
  double f;
  std::int64_t i;
  std::uint64_t u;
  std::uint64_t b;
};

struct Frame {
  std::uint64_t rank;  // 1..kAbiMaxRank
  std::uint64_t dims[kAbiMaxRank];
  const Access* loads;         // per block load, in CBlock::loads order
  const Access* stores;        // per block store, in CBlock::stores order
  const ScalarValue* scalars;  // per CompiledProgram::scalars slot
  // kiln's f64 -> f16 / bf16 narrowing (rounded once from the double), for results computed in
  // f64 (libm functions, casts): passed in so that the kernel rounds exactly as the interpreter.
  std::uint16_t (*f16_from_f64)(double);
  std::uint16_t (*bf16_from_f64)(double);
  // 1: every load is as the kernel's fast path expects (contiguous, or one element broadcast for
  // a broadcast load) and every store contiguous and unmasked: one flat loop over [start, start+n).
  std::uint32_t flat;
  // 1: run the program's independent parts one after another over [start, start + n) (fewer
  // streams at a time), for kernels generated with more than one part. The launch sets it only
  // when no part writes a buffer that another part reads (an output written in place over a
  // consumed input of another part would otherwise be read after it was overwritten).
  std::uint32_t by_component;
  // Out: the kernel ORs in bit k (k < 64) for each store k it wrote with non-temporal stores in
  // this call (atomically: the calls of one launch run on several threads). Null: not reported.
  std::uint64_t* streamed;
};

// The kernel: runs flat positions [start, start + n) of the iteration space; returns 0, or
// non-zero after a fault (an integer division by zero), like the interpreter's kernels.
using KernelFn = int (*)(const Frame*, std::uint64_t start, std::uint64_t n);

}  // namespace kiln::cpu::jit

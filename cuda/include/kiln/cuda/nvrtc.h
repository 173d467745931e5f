// NVRTC compilation of generated CUDA source for one GPU architecture. Needs the NVRTC library
// only, never a GPU or a driver, so every machine with the toolkit compile-checks the kernels.
//
// Usage:
//   Result<CompiledCode> c = nvrtc_compile(g.source(), "kiln_program.cu", {.arch = 90});
//   if (!c.ok()) spdlog::warn("{}", c.error().message);   // carries NVRTC's log
//
// Thread-safety: nvrtc_compile may be called from any thread concurrently (NVRTC programs are
// independent objects).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/result.h"

namespace kiln::cuda {

struct CompileOptions {
  int arch = 90;      // compute capability major * 10 + minor: sm_90
  bool cubin = true;  // CUBIN (loads without a JIT step); false: PTX (forward compatible)
  // Directory holding cuda_fp16.h / cuda_bf16.h; empty: the toolkit's include directory found at
  // build time (KILN_CUDA_INCLUDE_DIR), overridden by the environment variable KILN_CUDA_INCLUDE.
  std::string include_dir;
  bool line_info = false;  // -lineinfo, for profilers
};

struct CompiledCode {
  std::vector<std::byte> bytes;  // CUBIN, or PTX text with its terminating NUL
  bool is_cubin = true;
  int arch = 0;
  std::string log;  // NVRTC's log (warnings), may be empty
};

// Compiles `source`. Errors: ErrorCode::Execution with the NVRTC log (a compilation error is a
// bug in the generator, reported, never fatal), or Unsupported for an architecture NVRTC does
// not know.
Result<CompiledCode> nvrtc_compile(std::string_view source, std::string_view name, const CompileOptions& options);

// NVRTC's version as major * 1000 + minor * 10 (the CUDA convention: 13.0 -> 13000).
int nvrtc_version();
// Architectures NVRTC can target (ascending: 75, 80, ...).
std::vector<int> nvrtc_supported_archs();
// The include directory used when CompileOptions::include_dir is empty.
std::string default_include_dir();

}  // namespace kiln::cuda

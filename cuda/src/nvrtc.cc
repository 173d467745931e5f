// NVRTC wrapper (nvrtc.h).
#include "kiln/cuda/nvrtc.h"

#include <nvrtc.h>

#include <fmt/format.h>
#include <algorithm>
#include <cstdlib>
#include <memory>

namespace kiln::cuda {
namespace {

// Owns an nvrtcProgram.
struct ProgramDeleter {
  void operator()(nvrtcProgram p) const { (void)nvrtcDestroyProgram(&p); }
};
using ProgramHandle = std::unique_ptr<std::remove_pointer_t<nvrtcProgram>, ProgramDeleter>;

std::string program_log(nvrtcProgram p) {
  std::size_t size = 0;
  if (nvrtcGetProgramLogSize(p, &size) != NVRTC_SUCCESS || size <= 1) return {};
  std::string log(size, '\0');
  if (nvrtcGetProgramLog(p, log.data()) != NVRTC_SUCCESS) return {};
  log.resize(size - 1);  // the terminating NUL
  return log;
}

}  // namespace

int nvrtc_version() {
  int major = 0, minor = 0;
  if (nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return 0;
  return major * 1000 + minor * 10;
}

std::vector<int> nvrtc_supported_archs() {
  int n = 0;
  if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0) return {};
  std::vector<int> archs(static_cast<std::size_t>(n));
  if (nvrtcGetSupportedArchs(archs.data()) != NVRTC_SUCCESS) return {};
  std::sort(archs.begin(), archs.end());
  return archs;
}

std::string default_include_dir() {
  if (const char* env = std::getenv("KILN_CUDA_INCLUDE"); env != nullptr && *env != '\0') return env;
#ifdef KILN_CUDA_INCLUDE_DIR
  return KILN_CUDA_INCLUDE_DIR;
#else
  return "/usr/local/cuda/include";
#endif
}

Result<CompiledCode> nvrtc_compile(std::string_view source, std::string_view name, const CompileOptions& options) {
  const std::vector<int> archs = nvrtc_supported_archs();
  if (std::find(archs.begin(), archs.end(), options.arch) == archs.end())
    return make_error(ErrorCode::Unsupported, fmt::format("nvrtc: architecture sm_{} is not supported by NVRTC {}",
                                                          options.arch, nvrtc_version()));
  const std::string src(source);
  const std::string nm(name);
  nvrtcProgram raw = nullptr;
  nvrtcResult r = nvrtcCreateProgram(&raw, src.c_str(), nm.c_str(), 0, nullptr, nullptr);
  if (r != NVRTC_SUCCESS)
    return make_error(ErrorCode::Execution, fmt::format("nvrtc: creating {}: {}", nm, nvrtcGetErrorString(r)));
  ProgramHandle prog(raw);
  // sm_XX produces SASS (a CUBIN) for exactly that architecture; compute_XX produces PTX.
  const std::string arch = fmt::format("--gpu-architecture={}_{}", options.cubin ? "sm" : "compute", options.arch);
  const std::string include =
      "--include-path=" + (options.include_dir.empty() ? default_include_dir() : options.include_dir);
  std::vector<const char*> opts = {arch.c_str(), include.c_str(), "--std=c++17", "--device-as-default-execution-space"};
  if (options.line_info) opts.push_back("--generate-line-info");
  r = nvrtcCompileProgram(prog.get(), static_cast<int>(opts.size()), opts.data());
  std::string log = program_log(prog.get());
  if (r != NVRTC_SUCCESS)
    return make_error(ErrorCode::Execution, fmt::format("nvrtc: compiling {} for sm_{}: {}\n{}", nm, options.arch,
                                                        nvrtcGetErrorString(r), log));
  CompiledCode out;
  out.is_cubin = options.cubin;
  out.arch = options.arch;
  out.log = std::move(log);
  std::size_t size = 0;
  r = options.cubin ? nvrtcGetCUBINSize(prog.get(), &size) : nvrtcGetPTXSize(prog.get(), &size);
  if (r != NVRTC_SUCCESS || size == 0)
    return make_error(ErrorCode::Execution, fmt::format("nvrtc: no code for {} ({})", nm, nvrtcGetErrorString(r)));
  out.bytes.resize(size);
  r = options.cubin ? nvrtcGetCUBIN(prog.get(), reinterpret_cast<char*>(out.bytes.data()))
                    : nvrtcGetPTX(prog.get(), reinterpret_cast<char*>(out.bytes.data()));
  if (r != NVRTC_SUCCESS)
    return make_error(ErrorCode::Execution,
                      fmt::format("nvrtc: reading the code of {}: {}", nm, nvrtcGetErrorString(r)));
  return out;
}

}  // namespace kiln::cuda

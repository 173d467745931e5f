# cmake/KilnTorch.cmake: find the PyTorch of a Python environment deterministically.
#
# Input:  Python3_EXECUTABLE (the venv's python; find_package(Python3) sets it).
# Output: kiln::torch         INTERFACE target: headers + libtorch_cpu.so + libc10.so
#         KILN_TORCH_DIR      the torch package directory (site-packages/torch)
#         KILN_TORCH_VERSION  e.g. 2.11.0+cu130
#
# KILN_TORCH_FIND=direct (default): imported targets over the wheel's lib/ and include/, made
#   here. Python only *locates* torch (importlib, no `import torch`), so configuring needs
#   neither the CUDA libraries loadable nor a CUDA toolkit; nothing else is searched.
# KILN_TORCH_FIND=config: the wheel's TorchConfig.cmake, with its CUDA search pre-empted
#   (a dummy torch::cudart target makes Caffe2's public/cuda.cmake return at once) and MKL /
#   MKLDNN searches disabled, so a local CUDA toolkit or oneAPI install changes nothing.
set(KILN_TORCH_FIND "direct" CACHE STRING "How to find PyTorch: direct or config")
set_property(CACHE KILN_TORCH_FIND PROPERTY STRINGS direct config)

execute_process(
  COMMAND "${Python3_EXECUTABLE}" -c
    "import importlib.util as u, importlib.metadata as m, os; s = u.find_spec('torch'); print(os.path.dirname(s.origin)); print(m.version('torch'))"
  OUTPUT_VARIABLE _kt_out RESULT_VARIABLE _kt_rc ERROR_VARIABLE _kt_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _kt_rc EQUAL 0)
  message(FATAL_ERROR "torch is not installed for ${Python3_EXECUTABLE}: ${_kt_err}")
endif()
string(REPLACE "\n" ";" _kt_out "${_kt_out}")
list(GET _kt_out 0 KILN_TORCH_DIR)
list(GET _kt_out 1 KILN_TORCH_VERSION)
message(STATUS "kiln: torch ${KILN_TORCH_VERSION} at ${KILN_TORCH_DIR} (KILN_TORCH_FIND=${KILN_TORCH_FIND})")

if(KILN_TORCH_FIND STREQUAL "config")
  if(NOT TARGET torch::cudart)
    add_library(torch::cudart INTERFACE IMPORTED)  # pre-empts Caffe2's CUDA search
  endif()
  set(CMAKE_DISABLE_FIND_PACKAGE_MKL ON)
  set(CMAKE_DISABLE_FIND_PACKAGE_MKLDNN ON)
  find_package(Torch REQUIRED CONFIG PATHS "${KILN_TORCH_DIR}/share/cmake/Torch" NO_DEFAULT_PATH)
  add_library(kiln_torch INTERFACE)
  target_link_libraries(kiln_torch INTERFACE torch_cpu_library)
else()
  add_library(kiln_torch INTERFACE)
  target_include_directories(kiln_torch SYSTEM INTERFACE
    "${KILN_TORCH_DIR}/include" "${KILN_TORCH_DIR}/include/torch/csrc/api/include")
  target_link_libraries(kiln_torch INTERFACE
    "${KILN_TORCH_DIR}/lib/libtorch_cpu.so" "${KILN_TORCH_DIR}/lib/libc10.so")
endif()
# The wheels are built with the new libstdc++ ABI (torch.compiled_with_cxx11_abi() is True),
# g++'s default; say so, so that a stray -D_GLIBCXX_USE_CXX11_ABI=0 cannot slip in.
target_compile_definitions(kiln_torch INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
add_library(kiln::torch ALIAS kiln_torch)

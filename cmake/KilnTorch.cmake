# cmake/KilnTorch.cmake: whether the PyTorch device (python/, issue 23) is built, and the PyTorch
# it builds against, found deterministically (docs/pytorch.md, "Building").
#
# Input:  KILN_TORCH         AUTO (default): build it when KILN_TORCH_PYTHON has a usable torch,
#                            else skip it with a message saying why; ON: a missing torch fails
#                            the configure; OFF: never.
#         KILN_TORCH_PYTHON  the Python whose torch is used (default: <repo>/.venv/bin/python,
#                            the venv scripts/setup.sh makes; on a machine with its own torch,
#                            e.g. -DKILN_TORCH_PYTHON=/usr/bin/python3).
# Output: KILN_TORCH_ENABLED  TRUE when the device is built
#         kiln::libtorch      INTERFACE target: torch's headers (SYSTEM) + libtorch_cpu.so + libc10.so
#         KILN_TORCH_DIR      the torch package directory (site-packages/torch)
#         KILN_TORCH_VERSION  e.g. 2.11.0+cu130
#
# Why not the wheel's TorchConfig.cmake: PyPI's Linux wheels are CUDA builds, and their config
# enables CUDA and links NVRTC whenever a CUDA toolkit is installed, so the same command would
# configure differently on two machines (docs/pytorch-spike.md §2). Here Python only *locates*
# torch (importlib, no `import torch`): configuring needs neither a loadable CUDA runtime nor a
# toolkit, and nothing else is searched.
set(KILN_TORCH "AUTO" CACHE STRING "Build the PyTorch device (python/): AUTO, ON or OFF")
set_property(CACHE KILN_TORCH PROPERTY STRINGS AUTO ON OFF)
set(KILN_TORCH_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH
    "The Python whose torch the PyTorch device builds against and its tests run with")
# The torch release the extension is written against (scripts/requirements-torch.txt); the C++
# API of another minor release may not compile, so AUTO skips it and ON refuses it.
set(KILN_TORCH_WANTED "2.11")

set(KILN_TORCH_ENABLED FALSE)
string(TOUPPER "${KILN_TORCH}" _kt_mode)

# _kt_unavailable(why): AUTO skips the device with the reason; ON fails the configure with it.
macro(_kt_unavailable why)
  if(_kt_mode STREQUAL "ON")
    message(FATAL_ERROR "kiln: KILN_TORCH=ON but ${why}")
  endif()
  message(STATUS "kiln: PyTorch device not built (KILN_TORCH=AUTO): ${why}")
  return()
endmacro()

if(_kt_mode STREQUAL "OFF")
  message(STATUS "kiln: PyTorch device not built (KILN_TORCH=OFF)")
  return()
elseif(NOT _kt_mode MATCHES "^(AUTO|ON)$")
  message(FATAL_ERROR "kiln: KILN_TORCH must be AUTO, ON or OFF, not '${KILN_TORCH}'")
endif()
# A ThreadSanitizer extension would need libtsan preloaded into Python and torch's own threads
# uninstrumented: a flood of false reports, nothing learnt.
if(KILN_SANITIZE MATCHES "thread")
  _kt_unavailable("KILN_SANITIZE=thread is not supported for the extension")
endif()
if(NOT EXISTS "${KILN_TORCH_PYTHON}")
  _kt_unavailable("no Python at ${KILN_TORCH_PYTHON} (scripts/setup.sh makes the venv, or set KILN_TORCH_PYTHON)")
endif()

execute_process(
  COMMAND "${KILN_TORCH_PYTHON}" -c
    "import importlib.util as u, importlib.metadata as m, os; s = u.find_spec('torch'); print(os.path.dirname(s.origin)); print(m.version('torch'))"
  OUTPUT_VARIABLE _kt_out RESULT_VARIABLE _kt_rc ERROR_VARIABLE _kt_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _kt_rc EQUAL 0)
  _kt_unavailable("torch is not installed for ${KILN_TORCH_PYTHON} (scripts/setup.sh installs it)")
endif()
string(REPLACE "\n" ";" _kt_out "${_kt_out}")
list(GET _kt_out 0 KILN_TORCH_DIR)
list(GET _kt_out 1 KILN_TORCH_VERSION)
if(NOT KILN_TORCH_VERSION MATCHES "^${KILN_TORCH_WANTED}\\.")
  _kt_unavailable("torch ${KILN_TORCH_VERSION} at ${KILN_TORCH_DIR} is not ${KILN_TORCH_WANTED}.x")
endif()
foreach(_kt_file include/ATen/ATen.h lib/libtorch_cpu.so lib/libc10.so)
  if(NOT EXISTS "${KILN_TORCH_DIR}/${_kt_file}")
    _kt_unavailable("torch at ${KILN_TORCH_DIR} has no ${_kt_file}")
  endif()
endforeach()

message(STATUS "kiln: PyTorch device built against torch ${KILN_TORCH_VERSION} at ${KILN_TORCH_DIR}")
set(KILN_TORCH_ENABLED TRUE)
add_library(kiln_libtorch INTERFACE)
# SYSTEM: torch's headers are not project code, so they are outside -Werror.
target_include_directories(kiln_libtorch SYSTEM INTERFACE
  "${KILN_TORCH_DIR}/include" "${KILN_TORCH_DIR}/include/torch/csrc/api/include")
target_link_libraries(kiln_libtorch INTERFACE
  "${KILN_TORCH_DIR}/lib/libtorch_cpu.so" "${KILN_TORCH_DIR}/lib/libc10.so")
# The wheels are built with the new libstdc++ ABI (torch.compiled_with_cxx11_abi() is True),
# g++'s default; say so, so that a stray -D_GLIBCXX_USE_CXX11_ABI=0 cannot slip in.
target_compile_definitions(kiln_libtorch INTERFACE _GLIBCXX_USE_CXX11_ABI=1)
add_library(kiln::libtorch ALIAS kiln_libtorch)

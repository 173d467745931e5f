# libFuzzer targets. libFuzzer ships with clang only; when the main build uses GCC, the fuzz
# targets (and the modules they link) are built by a clang sub-build of this same source tree
# (KILN_FUZZERS_ONLY=ON), and ctest runs them from there for a bounded time (label `fuzz`).
set(KILN_FUZZ_SECONDS 20 CACHE STRING "How long each fuzz ctest runs")
set(KILN_FUZZ_TARGETS ir_codec_fuzzer ipc_decoder_fuzzer)
# Per-target overrides of KILN_FUZZ_SECONDS: the ipc decoder is small and flat (fixed fields
# plus the codec, which ir_codec_fuzzer covers), so 10 s saturates its coverage.
set(KILN_FUZZ_SECONDS_ipc_decoder_fuzzer 10 CACHE STRING "How long the ipc_decoder_fuzzer ctest runs")

if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
  add_subdirectory(fuzz)
  set(_fuzz_bin_dir ${CMAKE_BINARY_DIR}/fuzz)
else()
  find_program(KILN_CLANGXX NAMES clang++ clang++-14)
  if(NOT KILN_CLANGXX)
    message(WARNING "kiln: clang++ not found; fuzz targets are not built (scripts/setup.sh installs clang)")
    return()
  endif()
  include(ExternalProject)
  set(_fuzz_build ${CMAKE_BINARY_DIR}/fuzz-clang)
  ExternalProject_Add(kiln_fuzzers
    SOURCE_DIR ${CMAKE_SOURCE_DIR}
    BINARY_DIR ${_fuzz_build}
    CMAKE_ARGS -G Ninja -DCMAKE_CXX_COMPILER=${KILN_CLANGXX} -DCMAKE_BUILD_TYPE=RelWithDebInfo
               -DKILN_FUZZERS_ONLY=ON -DKILN_WERROR=${KILN_WERROR}
    BUILD_ALWAYS ON
    INSTALL_COMMAND ""
    USES_TERMINAL_BUILD ON)
  set(_fuzz_bin_dir ${_fuzz_build}/fuzz)
endif()

foreach(f IN LISTS KILN_FUZZ_TARGETS)
  set(_corpus ${CMAKE_BINARY_DIR}/fuzz-corpus/${f})
  file(MAKE_DIRECTORY ${_corpus})
  set(_seconds ${KILN_FUZZ_SECONDS})
  if(DEFINED KILN_FUZZ_SECONDS_${f})
    set(_seconds ${KILN_FUZZ_SECONDS_${f}})
  endif()
  add_test(NAME ${f}
           COMMAND ${_fuzz_bin_dir}/${f} -max_total_time=${_seconds} -rss_limit_mb=2048
                   -print_final_stats=1 ${_corpus} ${CMAKE_SOURCE_DIR}/fuzz/seeds/${f})
  set_tests_properties(${f} PROPERTIES LABELS fuzz TIMEOUT 300
                       ENVIRONMENT "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1")
endforeach()

# The two declarative helpers every module and test uses.
#
#   kiln_add_module(NAME ir SOURCES src/a.cc ... DEPS kiln::x ... PRIVATE_DEPS ...)
#     -> library target kiln_<name>, alias kiln::<name>, public headers in <module>/include.
#   kiln_add_test(NAME ir_shape_test SOURCES shape_test.cc DEPS kiln::ir [LABELS unit] [TIMEOUT s])
#     -> GoogleTest executable registered with ctest (one ctest entry per executable).

function(kiln_project_options target)
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                                           -Wno-missing-field-initializers)
  if(KILN_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  # GCC 12 at -O2/-O3 reports false positives that are not actionable in our code:
  # -Wstringop-overread inside boost::container::small_vector's move constructor (every Shape
  # move), and -Wrestrict on std::string concatenation (GCC bug 105651).
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(${target} PRIVATE -Wno-stringop-overread -Wno-restrict)
  endif()
endfunction()

# Sanitizers apply to everything we compile (instrumenting only part of a program gives false
# TSan reports), so they are set globally, not per target.
if(KILN_SANITIZE)
  add_compile_options(-fsanitize=${KILN_SANITIZE} -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${KILN_SANITIZE})
  if(KILN_SANITIZE MATCHES "undefined")
    add_compile_options(-fno-sanitize-recover=undefined)
  endif()
endif()

# The clang fuzz sub-build instruments every library for coverage and ASan/UBSan, so that
# libFuzzer sees the code under test (the fuzzer main links -fsanitize=fuzzer itself).
if(KILN_FUZZERS_ONLY)
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()

function(kiln_add_module)
  cmake_parse_arguments(M "" "NAME" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(kiln_${M_NAME} ${M_SOURCES})
  add_library(kiln::${M_NAME} ALIAS kiln_${M_NAME})
  target_include_directories(kiln_${M_NAME} PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
                                            PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(kiln_${M_NAME} PUBLIC ${M_DEPS} PRIVATE ${M_PRIVATE_DEPS})
  kiln_project_options(kiln_${M_NAME})
endfunction()

function(kiln_add_test)
  cmake_parse_arguments(T "" "NAME;TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${T_NAME} ${T_SOURCES})
  target_link_libraries(${T_NAME} PRIVATE ${T_DEPS} kiln::testing GTest::gtest GTest::gmock GTest::gtest_main)
  kiln_project_options(${T_NAME})
  add_test(NAME ${T_NAME} COMMAND ${T_NAME})
  if(NOT T_LABELS)
    set(T_LABELS unit)
  endif()
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  set_tests_properties(${T_NAME} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT})
endfunction()

# bench/gpu/programs.sh — sourced by check.sh and pack.sh: the programs the GPU check runs,
# relative to a build directory, and the Release configuration both build them with.
KILN_GPU_PROGRAMS=(tests/cuda/cuda_codegen_test tests/cuda/cuda_launch_test tests/cuda/cuda_probe_test
  tests/cuda/cuda_disk_cache_test tests/cuda/cuda_nvrtc_test tests/cuda/cuda_gpu_test bench/gpu/kiln-gpu-bench
  bench/kiln-bench-runtime apps/kilnd apps/kiln-demo apps/kilnctl)
KILN_GPU_CMAKE_FLAGS=(-G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG" -DKILN_BUILD_FUZZERS=OFF
  -DKILN_BUILD_BENCH=ON -DKILN_BUILD_TESTS=ON)

#!/usr/bin/env bash
# bench/gpu/pack.sh [DEST] — builds the GPU check's programs on this machine (Release, the same
# flags as check.sh) and packs them with the shared libraries they load into DEST (default
# .gpu-carry), for `KILN_GPU_PREBUILT=DEST bench/gpu/check.sh` on a GPU machine that has the
# CUDA toolkit and a driver but not kiln's build dependencies (Boost, oneTBB, spdlog, ...).
#
# DEST/bin: the programs. DEST/lib: the libraries they need that are not part of the C and C++
# run time (cudart included; never libcuda, the driver's, nor NVRTC, 100+ MiB: check.sh finds
# the GPU machine's own). DEST/lib/sys: this machine's loader, C and C++ run time, used only
# when the GPU machine's C library is older than the one the programs were built against.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${KILN_GPU_BUILD:-$ROOT/build/gpu}
DEST=${1:-$ROOT/.gpu-carry}
PROGRAMS=(tests/cuda/cuda_codegen_test tests/cuda/cuda_launch_test tests/cuda/cuda_probe_test
  tests/cuda/cuda_disk_cache_test tests/cuda/cuda_gpu_test bench/gpu/kiln-gpu-bench bench/kiln-bench-runtime
  apps/kilnd apps/kiln-demo apps/kilnctl)

if [[ ! -f $BUILD/build.ninja ]]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O2 -DNDEBUG" \
    -DKILN_BUILD_FUZZERS=OFF -DKILN_BUILD_BENCH=ON -DKILN_BUILD_TESTS=ON
fi
targets=()
for p in "${PROGRAMS[@]}"; do targets+=("$(basename "$p")"); done
cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}"

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib/sys"
for p in "${PROGRAMS[@]}"; do cp "$BUILD/$p" "$DEST/bin/"; done
declare -A seen=()
for p in "${PROGRAMS[@]}"; do
  while read -r name path; do
    [[ -z $path || -n ${seen[$name]:-} ]] && continue
    seen[$name]=1
    case $name in
      libcuda.so* | libnvrtc* | linux-vdso*) ;;
      libc.so* | libm.so* | libdl.so* | libpthread.so* | librt.so* | libstdc++.so* | libgcc_s.so* | ld-linux*)
        cp -L "$path" "$DEST/lib/sys/$name" ;;
      *) cp -L "$path" "$DEST/lib/$name" ;;
    esac
  done < <(ldd "$BUILD/$p" | awk '/=>/ {print $1, $3} !/=>/ && /ld-linux/ {n=$1; sub(".*/", "", n); print n, $1}')
done
git -C "$ROOT" rev-parse HEAD > "$DEST/commit" 2> /dev/null || true
echo "# packed $(ls "$DEST/bin" | wc -l) programs, $(du -sh "$DEST" | cut -f1), into $DEST"

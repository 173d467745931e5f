#!/usr/bin/env bash
# scripts/setup.sh: install what kiln needs to build and test, from Debian's packages.
#
# Idempotent: each package is checked with dpkg-query; `apt-get update` and `apt-get install`
# run only when something is missing. Runs as root, or through `sudo -n` otherwise.
# Then reports the optional CUDA toolkit and GPU driver (never fails on them).
#
# Usage: scripts/setup.sh [-h|--help]
set -euo pipefail

# Every name below exists in Debian 12 (bookworm).
PACKAGES=(
  build-essential g++ clang
  libclang-rt-14-dev          # libFuzzer runtime for clang 14 (the fuzz sub-build)
  cmake ninja-build pkg-config git
  libboost-dev                # header-only: Asio, Lockfree, Interprocess, Container
  libtbb-dev                  # oneTBB concurrent containers (the shared plan store)
  libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  libtomlplusplus-dev         # kiln.toml
  libcli11-dev                # command-line flags
  libeigen3-dev               # kiln-bench-peers times Eigen's sgemm beside kiln's matmul
  python3                     # bench comparison scripts, the layering check (lint)
  procps                      # pkill, ps: the daemon tests end their helper processes
  util-linux passwd           # setpriv, useradd: the tests run clients as a second user (root)
)

case "${1:-}" in
  -h|--help) sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "setup.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

die() { printf 'setup.sh: error: %s\n' "$*" >&2; exit 1; }

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  die "this script needs a Debian-based system (dpkg-query, apt-get). Install the equivalents of: ${PACKAGES[*]}"
fi

# Prints the installed version of package $1, or nothing (status non-zero) when it is not installed.
installed_version() {
  local out
  out=$(dpkg-query -W -f='${db:Status-Status} ${Version}' "$1" 2>/dev/null) || return 1
  [[ $out == "installed "* ]] || return 1
  printf '%s\n' "${out#installed }"
}

echo "==> setup: checking ${#PACKAGES[@]} Debian packages"
missing=()
for p in "${PACKAGES[@]}"; do
  if v=$(installed_version "$p"); then
    printf '    ok       %-22s %s\n' "$p" "$v"
  else
    printf '    missing  %s\n' "$p"
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  if ((EUID == 0)); then
    as_root=()
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    die "missing packages: ${missing[*]}; not root and 'sudo -n' is not available. Run as root:
  apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
  fi
  echo "==> setup: installing ${missing[*]}"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update ||
    die "'apt-get update' failed (see above)"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}" ||
    die "'apt-get install ${missing[*]}' failed (see above)"
  still=()
  for p in "${missing[@]}"; do
    if v=$(installed_version "$p"); then
      printf '    installed %-21s %s\n' "$p" "$v"
    else
      still+=("$p")
    fi
  done
  ((${#still[@]} == 0)) || die "still not installed after apt-get: ${still[*]}"
else
  echo "==> setup: all packages present (no apt-get run)"
fi

# Optional: the CUDA toolkit (the cuda module builds when CMake finds it) and a GPU driver.
nvcc=$(command -v nvcc 2>/dev/null || true)
[[ -n $nvcc || ! -x /usr/local/cuda/bin/nvcc ]] || nvcc=/usr/local/cuda/bin/nvcc
if [[ -n $nvcc ]]; then
  ver=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\).*/\1/p' | head -n 1 || true)
  echo "==> setup: CUDA toolkit ${ver:-(unknown version)} at $nvcc (optional; the cuda module builds with it)"
else
  echo "==> setup: no CUDA toolkit (optional): CPU device only"
fi
if command -v nvidia-smi >/dev/null 2>&1 &&
   gpus=$(timeout 20 nvidia-smi -L 2>/dev/null) && [[ -n $gpus ]]; then
  echo "==> setup: GPU driver present:"
  printf '    %s\n' "$gpus"
else
  echo "==> setup: no GPU: the CPU device will be used"
fi

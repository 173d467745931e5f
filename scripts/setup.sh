#!/usr/bin/env bash
# scripts/setup.sh: install what kiln needs to build and test, from Debian's packages, then the
# project's PyPI tools into a virtual environment, <repo>/.venv.
#
# Idempotent: each package is checked with dpkg-query; `apt-get update` and `apt-get install`
# run only when something is missing. Runs as root, or through `sudo -n` otherwise.
# The venv is made with Debian's /usr/bin/python3 when it is missing (or broken); each pin
# of scripts/requirements-dev.txt (`name==version` lines) is compared with what the venv has,
# and pip runs only when one is missing or at another version: a second run does no network
# work. The same for PyTorch (scripts/requirements-torch.txt, installed with --no-deps: no
# nvidia-* wheels), then stand-ins for the CUDA libraries torch links
# (scripts/make_torch_cuda_stubs.py, which keeps what it made before and any real library) and
# a check that torch imports: what the `kiln` PyTorch device builds and runs against
# (docs/pytorch.md). Then reports the optional CUDA toolkit and GPU driver (never fails on them).
#
# Environment: KILN_VENV     the venv to make or update (default <repo>/.venv, the one CMake uses)
#              KILN_SETUP_TORCH=0   skip PyTorch (559 MB download, 1.4 GB in the venv); the build
#                            then leaves the PyTorch device out (KILN_TORCH=AUTO)
#
# Usage: scripts/setup.sh [-h|--help]
set -euo pipefail

# Every name below exists in Debian 12 (bookworm).
PACKAGES=(
  build-essential g++ clang
  libclang-rt-14-dev          # libFuzzer runtime for clang 14 (the fuzz sub-build)
  clang-format                # the format check (ctest lint_format, .clang-format)
  clang-tidy                  # the tidy check (ctest lint_tidy, target tidy, .clang-tidy)
  cmake ninja-build pkg-config git
  libboost-dev                # header-only: Asio, Lockfree, Interprocess, Container
  libtbb-dev                  # oneTBB concurrent containers (the shared plan store)
  libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  libtomlplusplus-dev         # kiln.toml
  libcli11-dev                # command-line flags
  libgloo-dev                 # CPU collectives between daemons (kiln::distributed)
  libeigen3-dev               # kiln-bench-peers times Eigen's sgemm beside kiln's matmul
  python3                     # bench comparison scripts, the layering check (lint)
  python3-venv                # `python3 -m venv` with pip: the project venv (.venv) for PyPI tools
  python3-dev                 # Python.h: torch.compile's CPU kernels include it (bench/torch)
  procps                      # pkill, ps: the daemon tests end their helper processes
  util-linux passwd           # setpriv, useradd: the tests run clients as a second user (root)
  systemd                     # systemd-analyze: the service unit's check (ctest apps_service_unit)
)

case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;
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

# The project venv: PyPI tools (lizard for scripts/function_sizes.py), pinned exactly in
# scripts/requirements-dev.txt. Made by the invoking user (not through sudo), with Debian's
# python3 so that it is the same interpreter on every machine, whatever else is on PATH.
ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${KILN_VENV:-$ROOT/.venv}
REQS=$ROOT/scripts/requirements-dev.txt
TORCH_REQS=$ROOT/scripts/requirements-torch.txt
SYS_PYTHON=/usr/bin/python3
[[ -f $REQS ]] || die "$REQS is missing"
[[ -x $SYS_PYTHON ]] || die "$SYS_PYTHON is missing (Debian package python3)"

# A usable venv runs its python and has pip; anything less (a copy from another machine, a venv
# made before python3-venv was installed) is made again.
venv_ok() { [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; }

if venv_ok; then
  printf '==> setup: venv %s (%s)\n' "$VENV" "$("$VENV/bin/python" --version 2>&1)"
else
  if [[ -e $VENV ]]; then
    echo "==> setup: venv $VENV is unusable (no python or no pip): making it again"
    rm -rf -- "$VENV"
  else
    echo "==> setup: making the venv $VENV ($("$SYS_PYTHON" --version 2>&1), $SYS_PYTHON -m venv)"
  fi
  "$SYS_PYTHON" -m venv "$VENV" || die "'$SYS_PYTHON -m venv $VENV' failed (see above)"
  venv_ok || die "the new venv $VENV has no working pip"
fi

# Compares each `name==version` pin of file $1 with the venv's installed distributions (no
# network, no pip): prints one line per pin, as the Debian check does, and exits 1 when any is
# missing or differs, 2 when the file has a line that is not an exact pin.
check_pins() {
  "$VENV/bin/python" - "$1" <<'PY'
import re, sys
from importlib import metadata
pin = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*==\s*([^\s;#]+)\s*$")
bad = 0
for n, raw in enumerate(open(sys.argv[1], encoding="utf-8"), 1):
    line = re.sub(r"(^|\s)#.*", "", raw).strip()
    if not line or line.startswith("#") or line.startswith("-"):  # comments, pip options
        continue
    m = pin.match(line)
    if not m:
        print(f"setup.sh: error: {sys.argv[1]}:{n}: not an exact pin (name==version): {line}",
              file=sys.stderr)
        sys.exit(2)
    name, want = m.group(1), m.group(3)
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have == want:
        print(f"    ok       {name:<22} {have}")
    else:
        print(f"    {'missing' if have is None else 'differs'}  {name:<22} "
              f"{'wanted ' + want if have is None else have + ', wanted ' + want}")
        bad = 1
sys.exit(bad)
PY
}

# install_pins FILE [pip options...]: checks FILE's pins, runs pip only when one is missing or
# differs, then checks again.
install_pins() {
  local file=$1 rc=0; shift
  echo "==> setup: checking the pins of ${file#"$ROOT"/} in the venv"
  check_pins "$file" || rc=$?
  ((rc != 2)) || die "fix $file (every package line must be name==version)"
  if ((rc)); then
    echo "==> setup: pip install $* -r ${file#"$ROOT"/} (into $VENV)"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input "$@" -r "$file" ||
      die "'pip install $* -r $file' failed (see above)"
    echo "==> setup: checking the pins again"
    check_pins "$file" || die "the venv still differs from $file after pip install"
  else
    echo "==> setup: all pins present (no pip run)"
  fi
}

install_pins "$REQS"

# PyTorch for the `kiln` device: the wheel and its pure-Python pins without their dependencies
# (torch's metadata names ~2.2 GB of nvidia-* and triton wheels a CPU machine does not need),
# then stubs for the CUDA sonames torch links against, then a check that it imports.
if [[ ${KILN_SETUP_TORCH:-1} == 0 ]]; then
  echo "==> setup: KILN_SETUP_TORCH=0: PyTorch skipped (the build leaves the kiln PyTorch device out)"
else
  [[ -f $TORCH_REQS ]] || die "$TORCH_REQS is missing"
  install_pins "$TORCH_REQS" --no-deps
  echo "==> setup: CUDA stand-ins for torch (scripts/make_torch_cuda_stubs.py)"
  "$VENV/bin/python" "$ROOT/scripts/make_torch_cuda_stubs.py" ||
    die "scripts/make_torch_cuda_stubs.py failed (see above)"
  torch_version=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>&1 | tail -n 1) ||
    die "torch does not import in $VENV: $torch_version"
  echo "==> setup: torch $torch_version imports"
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

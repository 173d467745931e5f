#!/usr/bin/env python3
"""Make tiny stand-ins for the CUDA libraries that PyPI's torch wheel links against, so that a
CPU-only machine can `import torch` without the ~1.7 GB of nvidia-* wheels.

The Linux wheel's libtorch_cpu/libtorch_cuda/libtorch_python have DT_NEEDED entries on
libcudart, libcublas, libcudnn, libnccl, ... and Python loads extensions with RTLD_NOW, so every
symbol torch imports from them must resolve. This script reads only the installed torch (no
CUDA library, no toolkit): for each NEEDED CUDA soname it collects the symbols torch imports
from it (by symbol version, e.g. cudaMalloc@libcudart.so.13, or by name prefix for the
unversioned nccl*/cuFile*/cusparseLt* ones), writes a C file where each one returns an error
code (cudaGetDeviceCount reports 0 devices), links it with the same soname and symbol version,
and puts the result where torch's RPATH looks first: <site-packages>/nvidia/cu13/lib.
torch.cuda.is_available() is then False; everything on the CPU works.

Usage: python make_cuda_stubs.py [--dry-run]   (run with the venv's python; needs gcc, nm)
"""
import argparse
import collections
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

# soname -> how to recognise its symbols among torch's undefined ones
VERSIONED = {  # symbol version tag -> soname
    "libcudart.so.13": "libcudart.so.13", "libcublas.so.13": "libcublas.so.13",
    "libcublasLt.so.13": "libcublasLt.so.13", "libcudnn.so.9": "libcudnn.so.9",
    "libcufft.so.12": "libcufft.so.12", "libcupti.so.13": "libcupti.so.13",
    "libcusparse.so.12": "libcusparse.so.12", "NVSHMEM": "libnvshmem_host.so.3",
    "libcurand.so.10": "libcurand.so.10",
}
PREFIXES = {"nccl": "libnccl.so.2", "cuFile": "libcufile.so.0", "cusparseLt": "libcusparseLt.so.0"}
SYSTEM = re.compile(r"^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+|ld-linux|libutil)[.-]")


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="list what would be made")
    args = ap.parse_args()

    torch_dir = os.path.dirname(importlib.util.find_spec("torch").origin)
    lib_dir = os.path.join(torch_dir, "lib")
    own = set(os.listdir(lib_dir))
    # What `import torch` loads: torch/_C*.so and lib/libtorch_global_deps.so, and their
    # NEEDED closure inside torch/lib (libtorch_cuda_linalg, libcaffe2_nvrtc are dlopen'ed
    # only when CUDA is used, and are left out).
    todo = [os.path.join(torch_dir, f) for f in os.listdir(torch_dir)
            if f.startswith("_C.") and f.endswith(".so")]
    todo.append(os.path.join(lib_dir, "libtorch_global_deps.so"))
    seen, needed, undefined = set(), set(), set()
    while todo:
        o = todo.pop()
        if o in seen:
            continue
        seen.add(o)
        for m in re.finditer(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", run("readelf", "-d", o)):
            needed.add(m.group(1))
            if m.group(1) in own:
                todo.append(os.path.join(lib_dir, m.group(1)))
        for line in run("nm", "-D", "--undefined-only", o).splitlines():
            undefined.add(line.split()[-1])
    cuda = sorted(n for n in needed if n not in own and not SYSTEM.match(n))

    syms = collections.defaultdict(dict)  # soname -> {name: version or None}
    for u in undefined:
        name, _, ver = u.partition("@")
        if ver in VERSIONED:
            syms[VERSIONED[ver]][name] = ver
        elif not ver:
            for p, so in PREFIXES.items():
                if name.startswith(p) and not name.startswith("_Z"):
                    syms[so][name] = None
    unknown = [n for n in cuda if n not in set(VERSIONED.values()) | set(PREFIXES.values())]
    if unknown:
        sys.exit(f"make_cuda_stubs: torch needs {unknown}, which this script does not know")

    site = os.path.dirname(torch_dir)
    out_dir = os.path.join(site, "nvidia", "cu13", "lib")
    print(f"torch at {torch_dir}; stubs into {out_dir}")
    for so in cuda:
        print(f"  {so:24} {len(syms[so]):4d} symbols")
    if args.dry_run:
        return
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for so in cuda:
            lines = ['static const char msg[] = "CUDA stub: no CUDA library on this machine";']
            for name in sorted(syms[so]):
                if re.search(r"GetErrorString|GetErrorName|GetString$", name):
                    lines.append(f"const char* {name}(void) {{ return msg; }}")
                elif name == "cudaGetDeviceCount":
                    lines.append(f"int {name}(int* n) {{ if (n) *n = 0; return 100; }}")
                elif name.startswith("__cuda"):  # fat-binary registration in static ctors
                    lines.append(f"void* {name}(void) {{ return 0; }}")
                else:  # cudaErrorNoDevice (100); a failure status for every other library
                    lines.append(f"int {name}(void) {{ return 100; }}")
            versions = {v for v in syms[so].values()}
            if len(versions) > 1:
                sys.exit(f"make_cuda_stubs: {so} mixes symbol versions {versions}")
            (ver,) = versions or {None}
            names = " ".join(f"{n};" for n in sorted(syms[so]))
            c, m = os.path.join(tmp, so + ".c"), os.path.join(tmp, so + ".map")
            open(c, "w").write("\n".join(lines) + "\n")
            flags = []
            if names:  # an empty one (libcurand: nothing imported) only needs its soname
                open(m, "w").write(f"{ver or ''} {{ global: {names} local: *; }};\n")
                flags.append(f"-Wl,--version-script={m}")
            run("gcc", "-shared", "-fPIC", "-O1", "-w", f"-Wl,-soname,{so}", *flags,
                "-o", os.path.join(out_dir, so), c)
    print(f"made {len(cuda)} stub libraries")


if __name__ == "__main__":
    main()

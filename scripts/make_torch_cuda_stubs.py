#!/usr/bin/env python3
"""Make tiny stand-ins for the CUDA libraries that PyPI's torch wheel links against, so that a
CPU-only machine can `import torch` without the ~1.7 GB of nvidia-* wheels (docs/pytorch.md,
"Install"; measured in docs/pytorch-spike.md §1).

The Linux wheel's libtorch_cpu/libtorch_cuda/libtorch_python have DT_NEEDED entries on
libcudart, libcublas, libcudnn, libnccl, ... and Python loads extensions with RTLD_NOW, so every
symbol torch imports from them must resolve. This script reads only the installed torch (no
CUDA library, no toolkit): for each NEEDED CUDA soname it collects the symbols torch imports
from it (by symbol version, e.g. cudaMalloc@libcudart.so.13, or by name prefix for the
unversioned nccl*/cuFile*/cusparseLt* ones), writes a C file where each one returns an error
code (cudaGetDeviceCount reports 0 devices), links it with the same soname and symbol version,
and puts the result where torch's RPATH looks first: <site-packages>/nvidia/cu13/lib.
torch.cuda.is_available() is then False; everything on the CPU works.

Idempotent: the stubs it made are listed, with the torch version they were made for, in
<site-packages>/nvidia/cu13/lib/kiln-cuda-stubs.txt. A stub listed for the same torch is kept;
a library torch's RPATH already finds and that the list does not name (a real CUDA library from
an nvidia-* wheel) is left alone; everything else is made. It says what it did, one line per
library.

Usage: <venv>/bin/python scripts/make_torch_cuda_stubs.py [--dry-run]   (needs gcc, readelf, nm)
"""
import argparse
import collections
import importlib.metadata
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
MANIFEST = "kiln-cuda-stubs.txt"


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def scan_torch(torch_dir):
    """(CUDA sonames torch needs, {soname: {symbol: version}}, RPATH directories) of what
    `import torch` loads: torch/_C*.so, lib/libtorch_global_deps.so and their NEEDED closure
    inside torch/lib (libtorch_cuda_linalg and libcaffe2_nvrtc are dlopen'ed only when CUDA is
    used, and are left out)."""
    lib_dir = os.path.join(torch_dir, "lib")
    own = set(os.listdir(lib_dir))
    todo = [os.path.join(torch_dir, f) for f in os.listdir(torch_dir) if f.startswith("_C.") and f.endswith(".so")]
    todo.append(os.path.join(lib_dir, "libtorch_global_deps.so"))
    seen, needed, undefined, rpath = set(), set(), set(), set()
    while todo:
        o = todo.pop()
        if o in seen:
            continue
        seen.add(o)
        dynamic = run("readelf", "-d", o)
        for m in re.finditer(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic):
            needed.add(m.group(1))
            if m.group(1) in own:
                todo.append(os.path.join(lib_dir, m.group(1)))
        for m in re.finditer(r"\((?:RUNPATH|RPATH)\)\s+Library (?:runpath|rpath): \[(.+?)\]", dynamic):
            for d in m.group(1).split(":"):
                rpath.add(os.path.normpath(d.replace("$ORIGIN", os.path.dirname(o))))
        for line in run("nm", "-D", "--undefined-only", o).splitlines():
            undefined.add(line.split()[-1])
    cuda = sorted(n for n in needed if n not in own and not SYSTEM.match(n))

    syms = collections.defaultdict(dict)
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
        sys.exit(f"make_torch_cuda_stubs: torch needs {unknown}, which this script does not know")
    return cuda, syms, sorted(rpath)


def stub_source(symbols):
    lines = ['static const char msg[] = "CUDA stub: no CUDA library on this machine";']
    for name in sorted(symbols):
        if re.search(r"GetErrorString|GetErrorName|GetString$", name):
            lines.append(f"const char* {name}(void) {{ return msg; }}")
        elif name == "cudaGetDeviceCount":
            lines.append(f"int {name}(int* n) {{ if (n) *n = 0; return 100; }}")
        elif name.startswith("__cuda"):  # fat-binary registration in static ctors
            lines.append(f"void* {name}(void) {{ return 0; }}")
        else:  # cudaErrorNoDevice (100); a failure status for every other library
            lines.append(f"int {name}(void) {{ return 100; }}")
    return "\n".join(lines) + "\n"


def make_stub(so, symbols, out_path, tmp):
    versions = set(symbols.values())
    if len(versions) > 1:
        sys.exit(f"make_torch_cuda_stubs: {so} mixes symbol versions {versions}")
    (ver,) = versions or {None}
    c, m = os.path.join(tmp, so + ".c"), os.path.join(tmp, so + ".map")
    with open(c, "w", encoding="utf-8") as f:
        f.write(stub_source(symbols))
    flags = []
    if symbols:  # an empty one (libcurand: nothing imported) only needs its soname
        names = " ".join(f"{n};" for n in sorted(symbols))
        with open(m, "w", encoding="utf-8") as f:
            f.write(f"{ver or ''} {{ global: {names} local: *; }};\n")
        flags.append(f"-Wl,--version-script={m}")
    # Written beside the target, then renamed over it: a reader never sees half a library.
    part = out_path + ".part"
    run("gcc", "-shared", "-fPIC", "-O1", "-w", f"-Wl,-soname,{so}", *flags, "-o", part, c)
    os.replace(part, out_path)


def read_manifest(path):
    """(torch version, set of sonames) of the stubs made before, or (None, empty)."""
    if not os.path.exists(path):
        return None, set()
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    if not lines or not lines[0].startswith("torch "):
        return None, set()
    return lines[0].split(" ", 1)[1], set(lines[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="say what would be done, do nothing")
    args = ap.parse_args()

    spec = importlib.util.find_spec("torch")
    if spec is None:
        sys.exit(f"make_torch_cuda_stubs: torch is not installed for {sys.executable}")
    torch_dir = os.path.dirname(spec.origin)
    version = importlib.metadata.version("torch")
    cuda, syms, rpath = scan_torch(torch_dir)
    out_dir = os.path.join(os.path.dirname(torch_dir), "nvidia", "cu13", "lib")
    manifest = os.path.join(out_dir, MANIFEST)
    made_for, ours = read_manifest(manifest)

    plan = {}  # soname -> "keep" (our stub, same torch), "real" (not ours, found), "make"
    for so in cuda:
        found = any(os.path.exists(os.path.join(d, so)) for d in rpath)
        if so in ours and made_for == version and os.path.exists(os.path.join(out_dir, so)):
            plan[so] = "keep"
        elif found and so not in ours:
            plan[so] = "real"
        else:
            plan[so] = "make"
    what = {"keep": "stub present (made earlier)", "real": "real library present: left alone",
            "make": "would make a stub" if args.dry_run else "made a stub"}
    print(f"torch {version} at {torch_dir}; stubs in {out_dir}")
    if not args.dry_run and "make" in plan.values():
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            for so in cuda:
                if plan[so] == "make":
                    make_stub(so, syms[so], os.path.join(out_dir, so), tmp)
    for so in cuda:
        print(f"  {so:24} {len(syms[so]):4d} symbols: {what[plan[so]]}")
    stubs = sorted(so for so in cuda if plan[so] != "real")
    if not args.dry_run:
        with open(manifest + ".part", "w", encoding="utf-8") as f:
            f.write("# The CUDA stubs scripts/make_torch_cuda_stubs.py made (kiln), and for which torch.\n")
            f.write(f"torch {version}\n" + "".join(f"{so}\n" for so in stubs))
        os.replace(manifest + ".part", manifest)
    counts = collections.Counter(plan.values())
    print(f"make_torch_cuda_stubs: {counts['make']} made, {counts['keep']} kept, {counts['real']} real "
          f"librar{'y' if counts['real'] == 1 else 'ies'} left alone" + (" (dry run)" if args.dry_run else ""))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The lock discipline, checked: clang's thread-safety analysis (-Wthread-safety, syntax only)
over every source that uses the annotated locks of kiln/base/mutex.h (MutexLock, ReaderLock,
WriterLock) or declares what a lock guards (KILN_GUARDED_BY, KILN_REQUIRES). GCC builds the
tree; the annotations are clang's, so this pass is how they are checked.

    scripts/check_thread_safety.py --cxx CLANG [--root DIR] [--jobs N]   exit 0: clean; 1: warnings
    scripts/check_thread_safety.py --cxx CLANG --self-test              an unguarded read fails
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

MODULES = ("base", "ir", "fusion", "runtime", "reference", "cpu", "cuda", "distributed", "ipc")
ANNOTATED = re.compile(r"\b(MutexLock|ReaderLock|WriterLock|KILN_GUARDED_BY|KILN_REQUIRES)\b")
FLAGS = ["-std=c++20", "-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety", "-Wno-unknown-warning-option"]


def include_flags(root):
    flags = [f"-I{os.path.join(root, m, 'include')}" for m in MODULES if os.path.isdir(os.path.join(root, m, "include"))]
    cuda = os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include")
    if os.path.isdir(cuda):
        flags.append(f"-I{cuda}")
    return flags


def annotated_sources(root):
    """Each .cc whose text, or whose module's headers it may include, uses the annotations."""
    headers = set()
    for m in MODULES:
        for dirpath, _, files in os.walk(os.path.join(root, m)):
            for f in files:
                if f.endswith(".h"):
                    with open(os.path.join(dirpath, f), encoding="utf-8", errors="replace") as h:
                        if ANNOTATED.search(h.read()) and f != "mutex.h":
                            headers.add(f)
    out = []
    for m in MODULES:
        if m == "cuda" and not os.path.isdir(os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include")):
            continue
        src = os.path.join(root, m, "src")
        if not os.path.isdir(src):
            continue
        for f in sorted(os.listdir(src)):
            if not f.endswith(".cc"):
                continue
            path = os.path.join(src, f)
            with open(path, encoding="utf-8", errors="replace") as s:
                text = s.read()
            stem = f[:-3] + ".h"
            if ANNOTATED.search(text) or stem in headers:
                out.append(path)
    return out


def analyse(cxx, root, path):
    module_src = os.path.dirname(path)
    cmd = [cxx, *FLAGS, *include_flags(root), f"-I{module_src}", path]
    r = subprocess.run(cmd, capture_output=True, text=True)
    return path, r.returncode, r.stderr


def check(cxx, root, jobs):
    sources = annotated_sources(root)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for path, rc, err in pool.map(lambda p: analyse(cxx, root, p), sources):
            rel = os.path.relpath(path, root)
            if rc != 0:
                failed.append(rel)
                print(f"{rel}:\n{err}")
    return sources, failed


def self_test(cxx):
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "base", "include", "kiln", "base"))
        here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "base", "include", "kiln", "base")
        with open(os.path.join(here, "mutex.h"), encoding="utf-8") as f:
            mutex_h = f.read()
        with open(os.path.join(tmp, "base", "include", "kiln", "base", "mutex.h"), "w") as f:
            f.write(mutex_h)
        os.makedirs(os.path.join(tmp, "fusion", "src"))
        good = ('#include "kiln/base/mutex.h"\nstruct T { kiln::Mutex mu; int n KILN_GUARDED_BY(mu) = 0;\n'
                '  int get() { kiln::MutexLock l(mu); return n; } };\nint main() { T t; return t.get(); }\n')
        path = os.path.join(tmp, "fusion", "src", "t.cc")
        with open(path, "w") as f:
            f.write(good)
        if check(cxx, tmp, 1)[1]:
            print("self-test: a guarded read under its lock was reported")
            return 1
        with open(path, "w") as f:
            f.write(good.replace("kiln::MutexLock l(mu); ", ""))
        sources, failed = check(cxx, tmp, 1)
        if failed != ["fusion/src/t.cc"]:
            print(f"self-test: an unguarded read was not reported (checked {sources})")
            return 1
    print("self-test: a read of guarded state without its lock fails the check")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--cxx", default="clang++")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test(args.cxx)
    sources, failed = check(args.cxx, os.path.abspath(args.root), args.jobs)
    if failed:
        print(f"thread safety: {len(failed)} of {len(sources)} annotated source(s) have warnings")
        return 1
    print(f"thread safety: {len(sources)} annotated source(s) clean under clang -Wthread-safety")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The format check: every C++ file of the project is as clang-format (.clang-format at the root)
leaves it. Fix with `scripts/check_format.py --fix`.

    scripts/check_format.py [--clang-format BIN] [--root DIR] [--fix]   exit 0: formatted; 1: not (listed)
    scripts/check_format.py --self-test                                 an unformatted file fails
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

FOLDERS = ("base", "ir", "fusion", "runtime", "reference", "cpu", "cuda", "ipc", "apps", "tests", "stress", "bench",
           "fuzz", "python")
SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh")


def sources(root):
    for folder in FOLDERS:
        for dirpath, dirnames, files in os.walk(os.path.join(root, folder)):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for f in sorted(files):
                if f.endswith(SUFFIXES):
                    yield os.path.join(dirpath, f)


def unformatted(binary, root, paths):
    """The files clang-format would change (checked in batches)."""
    bad = []
    paths = list(paths)
    for i in range(0, len(paths), 64):
        batch = paths[i:i + 64]
        r = subprocess.run([binary, "--dry-run", "-Werror", "--style=file", *batch], capture_output=True, text=True,
                           cwd=root)
        if r.returncode != 0:
            for p in batch:
                one = subprocess.run([binary, "--dry-run", "-Werror", "--style=file", p], capture_output=True,
                                     text=True, cwd=root)
                if one.returncode != 0:
                    bad.append(os.path.relpath(p, root))
    return bad


def self_test(binary, root):
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(root, ".clang-format"), tmp)
        os.makedirs(os.path.join(tmp, "ir", "src"))
        good = os.path.join(tmp, "ir", "src", "good.cc")
        bad = os.path.join(tmp, "ir", "src", "bad.cc")
        with open(good, "w") as f:
            f.write("int add(int a, int b) { return a + b; }\n")
        with open(bad, "w") as f:
            f.write("int  add( int a,int b ){return a+b;}\n")
        got = unformatted(binary, tmp, sources(tmp))
        if got != ["ir/src/bad.cc"]:
            print(f"self-test: expected only ir/src/bad.cc, got {got}")
            return 1
    print("self-test: an unformatted file fails the check, a formatted one passes")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--clang-format", default="clang-format")
    parser.add_argument("--fix", action="store_true")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    if args.self_test:
        return self_test(args.clang_format, root)
    paths = list(sources(root))
    if args.fix:
        subprocess.run([args.clang_format, "-i", "--style=file", *paths], check=True, cwd=root)
        print(f"format: {len(paths)} file(s) formatted")
        return 0
    bad = unformatted(args.clang_format, root, paths)
    for p in bad:
        print(f"{p}: not formatted (scripts/check_format.py --fix)")
    if bad:
        print(f"format: {len(bad)} of {len(paths)} file(s) differ from clang-format's output")
        return 1
    print(f"format: {len(paths)} file(s) formatted")
    return 0


if __name__ == "__main__":
    sys.exit(main())

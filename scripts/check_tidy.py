#!/usr/bin/env python3
"""clang-tidy over kiln's sources with the checks of .clang-tidy (bugprone-*, performance-*,
readability-function-size; the exclusions and thresholds are documented there and in
docs/building.md). Any finding fails.

    scripts/check_tidy.py -p BUILD_DIR [--clang-tidy BIN] [--jobs N]          the lint set (ctest lint_tidy)
    scripts/check_tidy.py -p BUILD_DIR --all [--jobs N]                       every project source (target `tidy`)
    scripts/check_tidy.py -p BUILD_DIR FILE...                                those files
    scripts/check_tidy.py --clang-tidy BIN --self-test                        a finding fails, clean code passes

A whole-tree run takes about 30 CPU-minutes (2 cores: ~15 minutes), too long for the test command;
the lint set is the modules that hold shared state and take client input (base, ir, runtime,
ipc), a few minutes. BUILD_DIR must hold compile_commands.json (every preset exports it).
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_SET = ("base", "ir", "runtime", "ipc")
ALL_FOLDERS = ("base", "ir", "fusion", "runtime", "reference", "cpu", "cuda", "ipc", "apps", "bench", "stress",
               "tests", "python")
# gcc's warning flags and pragmas (GCC ivdep) that clang does not know are not findings.
EXTRA_ARGS = ["--extra-arg=-Wno-unknown-warning-option", "--extra-arg=-Wno-unknown-pragmas"]


def project_files(build_dir, root, folders):
    """The .cc files of `folders` that compile_commands.json compiles, sorted."""
    with open(os.path.join(build_dir, "compile_commands.json"), encoding="utf-8") as f:
        db = json.load(f)
    out = set()
    for entry in db:
        path = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
        rel = os.path.relpath(path, root)
        if rel.split(os.sep)[0] in folders and rel.endswith(".cc"):
            out.add(path)
    return sorted(out)


def tidy_one(binary, build_dir, path):
    r = subprocess.run([binary, "-p", build_dir, "--quiet", *EXTRA_ARGS, path], capture_output=True, text=True)
    findings = [line for line in r.stdout.splitlines() if any(k in line for k in (": error: ", ": warning: ", ": note: "))]
    return path, r.returncode, findings, r.stdout + r.stderr


def run(binary, build_dir, files, jobs):
    failed = 0
    seen = set()
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for done, (path, rc, findings, text) in enumerate(pool.map(lambda p: tidy_one(binary, build_dir, p), files), 1):
            print(f"[{done}/{len(files)}] {os.path.relpath(path, ROOT)}", flush=True)
            if rc != 0:
                failed += 1
                new = [f for f in findings if f not in seen]  # a header's finding once, not per includer
                seen.update(new)
                print("\n".join(new) if new else text, flush=True)
    if failed:
        print(f"check_tidy.py: {failed} of {len(files)} files have findings")
        return 1
    print(f"check_tidy.py: {len(files)} files clean")
    return 0


def self_test(binary):
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(os.path.join(ROOT, ".clang-tidy"), tmp)
        os.makedirs(os.path.join(tmp, "ir", "src"))
        good = os.path.join(tmp, "ir", "src", "good.cc")
        bad = os.path.join(tmp, "ir", "src", "bad.cc")
        with open(good, "w") as f:
            f.write("#include <string>\nstd::size_t size_of(const std::string& s) { return s.size(); }\n")
        with open(bad, "w") as f:  # performance-unnecessary-value-param
            f.write("#include <string>\nstd::size_t size_of(std::string s) { return s.size(); }\n")
        db = [{"directory": tmp, "file": p, "command": f"clang++ -std=c++20 -c {p}"} for p in (good, bad)]
        with open(os.path.join(tmp, "compile_commands.json"), "w") as f:
            json.dump(db, f)
        results = {os.path.basename(p): tidy_one(binary, tmp, p)[1] for p in (good, bad)}
        if results["good.cc"] != 0 or results["bad.cc"] == 0:
            print(f"self-test: expected good.cc clean and bad.cc failing, got return codes {results}")
            return 1
    print("self-test: a finding fails the check, clean code passes")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-p", dest="build_dir", help="build directory with compile_commands.json")
    ap.add_argument("--clang-tidy", default=shutil.which("clang-tidy") or shutil.which("clang-tidy-14") or "clang-tidy")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--all", action="store_true", help="every project source, not only the lint set")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    if a.self_test:
        return self_test(a.clang_tidy)
    if not a.build_dir:
        ap.error("-p BUILD_DIR is required")
    if a.files:
        files = [os.path.abspath(f) for f in a.files]
    else:
        files = project_files(a.build_dir, ROOT, ALL_FOLDERS if a.all else LINT_SET)
    if not files:
        print("check_tidy.py: no files to check (is compile_commands.json empty?)")
        return 1
    return run(a.clang_tidy, a.build_dir, files, a.jobs)


if __name__ == "__main__":
    sys.exit(main())

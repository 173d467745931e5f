#!/usr/bin/env python3
"""The layering check: a module includes only headers of the modules it may depend on.

The table below is the one place that says what may include what (docs/architecture.md draws
it). Every `#include "kiln/<module>/..."` in a module's sources and headers, and every relative
include that reaches into another top-level folder, is checked against it.

    scripts/check_layering.py [--root DIR]      exit 0: clean; 1: violations (listed)
    scripts/check_layering.py --self-test       checks that the check fails on a forbidden include
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

# module -> the modules it may include (besides itself). Folders not listed are not checked.
ALLOWED = {
    "base": set(),
    "ir": {"base"},
    "fusion": {"base", "ir"},
    "runtime": {"base", "ir", "fusion"},
    "reference": {"base", "ir", "fusion", "runtime"},
    "cpu": {"base", "ir", "fusion", "runtime", "reference"},
    "cuda": {"base", "ir", "fusion", "runtime", "reference"},
    "distributed": {"base", "ir", "fusion", "runtime", "reference"},
    "ipc": {"base", "ir", "fusion", "runtime", "distributed"},
    "python": {"base", "ir", "fusion", "runtime", "reference", "cpu", "cuda", "distributed", "ipc"},
    "apps": {"base", "ir", "fusion", "runtime", "reference", "cpu", "cuda", "distributed", "ipc"},
}

# Known violations still to be removed, each with the reason it is still there. A listed pair
# that no longer occurs is itself reported, so that the list only ever shrinks.
# (Empty since the reference executor moved to reference/: CUDA's host fallback no longer
# includes the CPU backend.)
TEMPORARY = {}

SOURCE_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".in")
KILN_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]kiln/([a-z_]+)/')
RELATIVE_INCLUDE = re.compile(r'^\s*#\s*include\s*"((?:\.\./)+[^"]+)"')


def module_files(root, module):
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, module)):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        for name in sorted(filenames):
            if name.endswith(SOURCE_SUFFIXES):
                yield os.path.join(dirpath, name)


def included_modules(root, path):
    """(line number, included module) for each include of a kiln module in `path`."""
    top = os.path.realpath(root)
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = KILN_INCLUDE.match(line)
            if m:
                yield number, m.group(1)
                continue
            m = RELATIVE_INCLUDE.match(line)
            if m:
                target = os.path.realpath(os.path.join(os.path.dirname(path), m.group(1)))
                rel = os.path.relpath(target, top)
                if not rel.startswith(".."):
                    yield number, rel.split(os.sep)[0]


def check(root, temporary=None):
    temporary = TEMPORARY if temporary is None else temporary
    problems = []
    seen_temporary = set()
    for module, allowed in ALLOWED.items():
        if not os.path.isdir(os.path.join(root, module)):
            continue
        for path in module_files(root, module):
            for number, dep in included_modules(root, path):
                if dep == module or dep in allowed or dep not in ALLOWED:
                    continue
                if (module, dep) in temporary:
                    seen_temporary.add((module, dep))
                    continue
                problems.append(f"{os.path.relpath(path, root)}:{number}: {module} may not include {dep} "
                                f"({module} may include: {', '.join(sorted(allowed)) or 'nothing'})")
    for pair, why in temporary.items():
        if pair not in seen_temporary and os.path.isdir(os.path.join(root, pair[0])):
            problems.append(f"the temporary exception {pair[0]} -> {pair[1]} ({why}) no longer occurs: "
                            "remove it from scripts/check_layering.py")
    return problems


def self_test():
    """A tree with a forbidden include fails; the same tree without it passes."""
    with tempfile.TemporaryDirectory() as tmp:
        def write(rel, text):
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        write("ir/include/kiln/ir/shape.h", "#pragma once\n")
        write("fusion/src/plan.cc", '#include "kiln/ir/shape.h"\n')
        write("cuda/src/backend.cc", '#include "kiln/cpu/tensor.h"\n')  # a temporary exception (below)
        write("cpu/include/kiln/cpu/tensor.h", "#pragma once\n")
        exceptions = {("cuda", "cpu"): "a self-test exception"}
        clean = check(tmp, exceptions)
        if clean:
            print("self-test: a clean tree was reported:\n  " + "\n  ".join(clean))
            return 1
        if not any(p.startswith("cuda/src/backend.cc:1: cuda may not include cpu") for p in check(tmp, {})):
            print("self-test: without its exception, cuda including cpu was not reported")
            return 1
        write("ir/src/codec.cc", '#include "kiln/fusion/plan.h"\n')          # ir may not include fusion
        write("runtime/src/device.cc", '#include "../../cpu/src/fast.h"\n')  # nor reach into cpu
        dirty = check(tmp, exceptions)
        expected = ["ir/src/codec.cc:1: ir may not include fusion", "runtime/src/device.cc:1: runtime may not include cpu"]
        missing = [e for e in expected if not any(p.startswith(e) for p in dirty)]
        if missing or len(dirty) != len(expected):
            print("self-test: expected exactly\n  " + "\n  ".join(expected) + "\ngot\n  " + "\n  ".join(dirty))
            return 1
        shutil.rmtree(os.path.join(tmp, "cuda"))
        shutil.rmtree(os.path.join(tmp, "ir", "src"))
        shutil.rmtree(os.path.join(tmp, "runtime"))
        if check(tmp, exceptions):
            print("self-test: a tree without the cuda folder still reported its exception")
            return 1
    print("self-test: the check fails on a forbidden include and passes without it")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    problems = check(args.root)
    for p in problems:
        print(p)
    if problems:
        print(f"layering: {len(problems)} forbidden include(s); the table is scripts/check_layering.py ALLOWED")
        return 1
    print("layering: every module includes only what it may")
    return 0


if __name__ == "__main__":
    sys.exit(main())

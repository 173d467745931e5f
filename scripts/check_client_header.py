#!/usr/bin/env python3
"""The client header stays light: preprocessing kiln/runtime/session.h pulls in no Boost.Asio,
Boost.Lockfree or oneTBB header (the device's internals stay behind runtime/session_target.h).

    scripts/check_client_header.py --cxx COMPILER [--root DIR]   exit 0: light; 1: heavy (listed)
    scripts/check_client_header.py --cxx COMPILER --self-test    checks that a heavy header fails
"""
import argparse
import os
import subprocess
import sys
import tempfile

FORBIDDEN = ("boost/asio", "boost/lockfree", "tbb/")


def headers_of(cxx, root, header, extra_includes=()):
    """Every header preprocessing `header` reads (the compiler's -M list)."""
    includes = [f"-I{os.path.join(root, d, 'include')}" for d in sorted(os.listdir(root))
                if os.path.isdir(os.path.join(root, d, "include"))]
    includes += [f"-I{d}" for d in extra_includes]
    with tempfile.NamedTemporaryFile("w", suffix=".cc", delete=False) as tu:
        tu.write(f'#include "{header}"\n')
    try:
        out = subprocess.run([cxx, "-std=c++20", *includes, "-M", tu.name], capture_output=True, text=True)
    finally:
        os.unlink(tu.name)
    if out.returncode != 0:
        sys.exit(f"client header: {cxx} could not preprocess {header}:\n{out.stderr}")
    words = out.stdout.replace("\\\n", " ").split()
    return sorted({w for w in words[1:] if not w.endswith(":")})


def heavy(paths):
    return [p for p in paths if any(f in p for f in FORBIDDEN)]


def self_test(cxx):
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "m", "include", "kiln", "m"))
        os.makedirs(os.path.join(tmp, "fake", "tbb"))
        open(os.path.join(tmp, "fake", "tbb", "concurrent_hash_map.h"), "w").close()
        with open(os.path.join(tmp, "m", "include", "kiln", "m", "h.h"), "w") as f:
            f.write('#include <cstdint>\n#include "tbb/concurrent_hash_map.h"\n')
        found = heavy(headers_of(cxx, tmp, "kiln/m/h.h", [os.path.join(tmp, "fake")]))
        if len(found) != 1 or not found[0].endswith("tbb/concurrent_hash_map.h"):
            print(f"self-test: expected the one tbb header, got {found}")
            return 1
    print("self-test: a header that reaches oneTBB is reported")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    parser.add_argument("--cxx", default="c++")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test(args.cxx)
    paths = headers_of(args.cxx, args.root, "kiln/runtime/session.h")
    bad = heavy(paths)
    for p in bad:
        print(f"kiln/runtime/session.h reaches {p}")
    if bad:
        print(f"client header: {len(bad)} of {len(paths)} headers are the device's internals "
              "(Asio, Lockfree, oneTBB); keep them behind runtime/session_target.h")
        return 1
    print(f"client header: kiln/runtime/session.h reads {len(paths)} headers, none of Asio, Lockfree or oneTBB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Function sizes and cyclomatic complexity of kiln's modules, measured by lizard (PyPI).

Runs lizard over the module folders (ir fusion runtime cpu cuda ipc apps base reference, those
that exist; tests, stress, bench and fuzz are not modules and are left out) on every .h .hpp .cc
.cpp .cu .cuh and .in file, and prints the number of functions, how many are longer than 60 and
than 100 lines, how many have a cyclomatic complexity (CCN) above 30, and the functions longer
than 100 lines, longest first.

"Lines" is lizard's `length`: the function's extent in the file, its first line to its closing
brace, blank and comment lines included (end_line - start_line + 1). It reproduces issue 20's
figures exactly (measured at f18f777: 2,212 functions, 54 longer than 60 lines, 18 longer than
100, 27 with CCN above 30; generate_source 346, BlockRunner::prepare 213), where lizard's `nloc`
(code lines only) gives 47 and 17, and 286 for generate_source.

lizard comes from the project venv that scripts/setup.sh makes (started by another python, the
script runs itself again under .venv/bin/python):

    .venv/bin/python scripts/function_sizes.py [--root DIR]
        prints the figures; exit 0
    .venv/bin/python scripts/function_sizes.py --max-lines N [--allow FILE:FUNCTION ...]
        also exit 1 when a function is longer than N lines and not on the allow-list
    .venv/bin/python scripts/function_sizes.py --self-test
        checks that --max-lines fails on a long function and passes once it is allowed

The allow-list is scripts/function_sizes_allow.txt (one `path:function  # reason` a line, see
its header) plus the --allow arguments. Only data and pure mapping tables may be listed. A
function is named as lizard names it (`kiln::cuda::prelude`) or by a `::`-suffix of that name
(`prelude`, `StageGen::instruction`); every function of that file with that name is allowed. An
entry that matches no function, or none longer than N, is itself reported (exit 1), so that the
list only ever shrinks.
"""
import argparse
import os
import re
import sys
import tempfile

MODULES = ("ir", "fusion", "runtime", "cpu", "cuda", "distributed", "ipc", "apps", "base", "reference", "python")
EXCLUDED_DIRS = {"tests", "test", "stress", "bench", "fuzz", "build", ".git", ".venv"}
SOURCE_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".in")
LONG = 60
VERY_LONG = 100
COMPLEX = 30
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_ALLOW_FILE = os.path.join(ROOT, "scripts", "function_sizes_allow.txt")


def import_lizard():
    try:
        import lizard  # noqa: PLC0415 (a clear message when the venv is not in use)
    except ImportError:
        venv_python = os.path.join(ROOT, ".venv", "bin", "python")
        if os.path.exists(venv_python) and os.environ.get("KILN_FUNCTION_SIZES_REEXEC") != "1":
            # Started by another python (`scripts/function_sizes.py`): run again under the venv's.
            os.environ["KILN_FUNCTION_SIZES_REEXEC"] = "1"
            os.execv(venv_python, [venv_python, os.path.abspath(__file__)] + sys.argv[1:])
        sys.exit("function_sizes.py: lizard is not importable from %s. Run scripts/setup.sh, "
                 "then `.venv/bin/python scripts/function_sizes.py`." % sys.executable)
    return lizard


def source_files(root):
    """The module sources under root, as paths relative to it (sorted, '/'-separated)."""
    files = []
    for module in MODULES:
        top = os.path.join(root, module)
        if not os.path.isdir(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    rel = os.path.relpath(os.path.join(dirpath, name), root)
                    files.append(rel.replace(os.sep, "/"))
    return files


def measure(root):
    """[(path, function)] for every function lizard finds; a file of no language lizard knows
    (.cu, .in) is read as C/C++ (lizard's fallback reader)."""
    lizard = import_lizard()
    analyzer = lizard.FileAnalyzer(lizard.get_extensions([]))
    found = []
    for rel in source_files(root):
        info = analyzer(os.path.join(root, rel))
        found.extend((rel, f) for f in info.function_list)
    return found


def read_allow_file(path):
    """The entries of an allow-list file: `path:function  # reason`, blank lines and comments
    skipped."""
    if not os.path.exists(path):
        return []
    entries = []
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = re.sub(r"(^|\s)#.*", "", raw).strip()
            if not line:
                continue
            if ":" not in line or line.startswith(":") or line.endswith(":"):
                sys.exit("function_sizes.py: %s:%d: expected `path:function  # reason`, got: %s"
                         % (path, n, line))
            entries.append(line)
    return entries


def split_entry(entry):
    # path:function, where the function may itself contain '::'.
    m = re.match(r"^([^:]+):(.+)$", entry)
    if not m or m.group(2).startswith(":"):
        sys.exit("function_sizes.py: an allow entry is `path:function`, got: %s" % entry)
    return m.group(1).strip(), m.group(2).strip()


def matches(entry_fn, name):
    return name == entry_fn or name.endswith("::" + entry_fn)


def report(found, list_over, out):
    lengths = [f.length for _, f in found]
    print("functions:                      %d" % len(found), file=out)
    print("longer than %d lines:           %d" % (LONG, sum(n > LONG for n in lengths)), file=out)
    print("longer than %d lines:          %d" % (VERY_LONG, sum(n > VERY_LONG for n in lengths)),
          file=out)
    print("cyclomatic complexity above %d: %d"
          % (COMPLEX, sum(f.cyclomatic_complexity > COMPLEX for _, f in found)), file=out)
    longest = sorted((t for t in found if t[1].length > list_over),
                     key=lambda t: (-t[1].length, t[0], t[1].start_line))
    print("\nfunctions longer than %d lines (file:line name lines ccn), longest first:" % list_over,
          file=out)
    for rel, f in longest:
        print("  %s:%d %s %d %d" % (rel, f.start_line, f.name, f.length, f.cyclomatic_complexity),
              file=out)


def check_max_lines(found, max_lines, entries, out):
    """Exit status of the --max-lines check: 0 clean, 1 a function too long or a stale entry."""
    allow = [(e,) + split_entry(e) for e in entries]
    used = set()
    failures = []
    allowed = []
    for rel, f in sorted(found, key=lambda t: (-t[1].length, t[0], t[1].start_line)):
        if f.length <= max_lines:
            continue
        hit = [e for e, path, fn in allow if path == rel and matches(fn, f.name)]
        used.update(hit)
        (allowed if hit else failures).append((rel, f))
    stale = [e for e, _, _ in allow if e not in used]
    print("\n--max-lines %d:" % max_lines, file=out)
    for rel, f in allowed:
        print("  allowed  %s:%d %s %d lines" % (rel, f.start_line, f.name, f.length), file=out)
    for rel, f in failures:
        print("  TOO LONG %s:%d %s %d lines (limit %d)"
              % (rel, f.start_line, f.name, f.length, max_lines), file=out)
    for e in stale:
        print("  STALE    allow entry %s: no function of that name longer than %d lines; "
              "remove it" % (e, max_lines), file=out)
    if failures or stale:
        print("function_sizes.py: %d function(s) over %d lines, %d stale allow entr%s. Split the "
              "function; only data and pure mapping tables may go on the allow-list "
              "(scripts/function_sizes_allow.txt)."
              % (len(failures), max_lines, len(stale), "y" if len(stale) == 1 else "ies"),
              file=out)
        return 1
    print("  ok: no function over %d lines outside the allow-list" % max_lines, file=out)
    return 0


def run(argv, out=sys.stdout):
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--root", default=ROOT, help="the tree to measure (default: this checkout)")
    ap.add_argument("--list-over", type=int, default=VERY_LONG, metavar="N",
                    help="list the functions longer than N lines (default %(default)s)")
    ap.add_argument("--max-lines", type=int, metavar="N",
                    help="exit 1 when a function not on the allow-list is longer than N lines")
    ap.add_argument("--allow", action="append", default=[], metavar="FILE:FUNCTION",
                    help="allow one function past --max-lines (repeatable)")
    ap.add_argument("--allow-file", default=DEFAULT_ALLOW_FILE,
                    help="allow-list file (default scripts/function_sizes_allow.txt)")
    ap.add_argument("--self-test", action="store_true",
                    help="check that --max-lines fails on a long function, then passes once allowed")
    args = ap.parse_args(argv)
    if args.self_test:
        return self_test(out)
    found = measure(args.root)
    report(found, args.list_over, out)
    if args.max_lines is None:
        return 0
    entries = read_allow_file(args.allow_file) + args.allow
    return check_max_lines(found, args.max_lines, entries, out)


def self_test(out):
    import io
    body = "".join("    x += %d;\n" % i for i in range(12))
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "cpu", "src"))
        os.makedirs(os.path.join(root, "tests"))
        with open(os.path.join(root, "cpu", "src", "a.cc"), "w") as f:
            f.write("namespace kiln::cpu {\nint long_one(int x) {\n%s    return x;\n}\n"
                    "int short_one(int x) { return x; }\n}\n" % body)
        with open(os.path.join(root, "tests", "t.cc"), "w") as f:  # not a module: not measured
            f.write("int in_tests(int x) {\n%s    return x;\n}\n" % body)
        empty = os.path.join(root, "allow.txt")
        open(empty, "w").close()
        common = ["--root", root, "--allow-file", empty]
        cases = [  # (arguments, expected status, text the output must hold)
            ([], 0, "functions:                      2"),
            (["--max-lines", "10"], 1, "TOO LONG cpu/src/a.cc:2 kiln::cpu::long_one 15 lines"),
            (["--max-lines", "10", "--allow", "cpu/src/a.cc:long_one"], 0, "allowed  cpu/src/a."),
            (["--max-lines", "10", "--allow", "cpu/src/a.cc:kiln::cpu::long_one"], 0, "ok: no"),
            (["--max-lines", "20", "--allow", "cpu/src/a.cc:long_one"], 1, "STALE"),
            (["--max-lines", "10", "--allow", "cpu/src/b.cc:long_one"], 1, "TOO LONG"),
            (["--max-lines", "20"], 0, "ok: no function over 20 lines"),
        ]
        for argv, want, text in cases:
            buf = io.StringIO()
            got = run(common + argv, buf)
            if got != want or text not in buf.getvalue():
                print("self-test FAILED: %s -> exit %d (wanted %d), output:\n%s"
                      % (" ".join(argv) or "(no options)", got, want, buf.getvalue()), file=out)
                return 1
    print("self-test passed (%d cases)" % len(cases), file=out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(run(sys.argv[1:]))
    except BrokenPipeError:  # `| head`
        sys.stderr.close()
        sys.exit(1)

#!/usr/bin/env python3
"""The citation check: every citation of the behaviour spec names a section that exists.

The spec is the repository's own copy in docs/spec/ (fusion.md, ir.md). Code and docs cite it as
`docs/spec/fusion.md §16.4` or `docs/spec/ir.md §5.11`; ranges (`§14.4–§14.8`, `§10–11`) and
lists (`§5.1, §5.2`, `§14.7/§14.8`) are allowed, and each section named must be a numbered
heading of the cited file at any level (`## 16. ...` for §16, `### 16.4 ...` for §16.4, or a bold
numbered lead such as `**19.1.4 Title.**`). An item of a numbered list inside a section is cited
as `§19.11 item 9`; only the section is checked. A spec file cited by any other path (bare
`fusion.md §3.8`, which collides with the repository's own docs/fusion.md, or a path outside the
repository) is an error too, and so is a mention of one without a section (`../x/spec/ir.md`).

Scanned: .h .hpp .cc .cpp .cu .cuh .def .in files in the module, test and tool folders, .md files
under docs/ (except docs/spec/ and docs/archive/), and README.md.

    scripts/check_citations.py [--root DIR]      exit 0: clean; 1: problems (path:line: citation: problem)
    scripts/check_citations.py --self-test       checks that the check reports exactly the bad citations
"""
import argparse
import os
import re
import sys
import tempfile

SPEC_DIR = "docs/spec"
FOLDERS = ("ir", "fusion", "runtime", "reference", "base", "cpu", "cuda", "ipc", "apps", "tests",
           "stress", "bench", "fuzz", "python", "docs", "scripts")
SOURCE_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".def", ".in")
DOC_SKIP = ("docs/spec", "docs/archive")  # the spec itself, and history that is not maintained

SECTION = r"\d+(?:\.\d+)*"
# One item: a section, or a range of two (the second `§` is optional: `§16.4–16.6`).
ITEM = rf"§{SECTION}(?:[ \t]*[–-][ \t]*§?{SECTION})?"
# `<path/>name.md` (optionally closed by a backtick) then a list of items.
CITATION = re.compile(rf"(?P<path>(?:[\w.-]+/)*)(?P<name>[A-Za-z0-9_-]+)\.md(?P<tick>`?)[ \t]*"
                      rf"(?P<sections>{ITEM}(?:(?:[ \t]*,[ \t]*|[ \t]*/[ \t]*|[ \t]+(?:and|or)[ \t]+){ITEM})*)")
ONE_ITEM = re.compile(rf"§(?P<first>{SECTION})(?:[ \t]*[–-][ \t]*§?(?P<last>{SECTION}))?")
# A spec file named by a path other than docs/spec/ (no section needed): `../shared/spec/ir.md`.
FOREIGN_SPEC_PATH = re.compile(r"(?P<path>(?:[\w.-]+/)*spec/)(?P<name>[A-Za-z0-9_-]+)\.md")

HEADING = re.compile(rf"^#{{1,6}}[ \t]+(?P<number>{SECTION})\.?(?:[ \t]|$)")
BOLD_LEAD = re.compile(rf"^\*\*(?P<number>{SECTION})\.?[ \t]")


def spec_sections(path):
    """The section numbers of one spec file: numbered headings and bold numbered leads."""
    sections = set()
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if in_code:
                continue
            m = HEADING.match(line) or BOLD_LEAD.match(line)
            if m:
                sections.add(m.group("number"))
    return sections


def load_spec(root):
    """name (without .md) -> set of section numbers, for every spec file in docs/spec/."""
    spec = {}
    directory = os.path.join(root, SPEC_DIR)
    if os.path.isdir(directory):
        for name in sorted(os.listdir(directory)):
            if name.endswith(".md") and name != "README.md":
                spec[name[:-3]] = spec_sections(os.path.join(directory, name))
    return spec


def scanned_files(root):
    """Repository-relative paths (with '/') of every file the check reads."""
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, folder)):
            rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".")
                                 and f"{rel_dir}/{d}" not in DOC_SKIP)
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES) or (folder == "docs" and name.endswith(".md")):
                    yield f"{rel_dir}/{name}"
    if os.path.isfile(os.path.join(root, "README.md")):
        yield "README.md"


def section_key(number):
    return tuple(int(part) for part in number.split("."))


def items(sections_text):
    """(text, first, last) for each item of a citation's section list; last is None unless a range."""
    for m in ONE_ITEM.finditer(sections_text):
        yield m.group(0), m.group("first"), m.group("last")


def names_repo_spec(root, rel, path, name):
    """True if `<path><name>.md`, read from the repository root or from the folder of the file
    `rel` that names it (a relative Markdown link), is the repository's docs/spec/<name>.md."""
    target = os.path.realpath(os.path.join(root, SPEC_DIR, name + ".md"))
    return any(os.path.realpath(os.path.join(base, path + name + ".md")) == target
               for base in (root, os.path.join(root, os.path.dirname(rel))))


def check_line(line, spec, known_names, root=".", rel=""):
    """(citation text, problem) for each problem in one line of the file `rel`."""
    problems = []
    citations = list(CITATION.finditer(line))
    for m in citations:
        name, path, text = m.group("name"), m.group("path"), m.group(0)
        if path == SPEC_DIR + "/":
            if name not in spec:
                problems.append((text, f"{SPEC_DIR}/{name}.md does not exist"))
                continue
            for item, first, last in items(m.group("sections")):
                missing = [s for s in (first, last) if s is not None and s not in spec[name]]
                if missing:
                    problems.append((text, f"no section {', '.join('§' + s for s in missing)} in "
                                           f"{SPEC_DIR}/{name}.md"))
                elif last is not None and section_key(last) <= section_key(first):
                    problems.append((text, f"the range {item} does not run forwards"))
        elif name in known_names:
            where = "a bare spec citation" if not path else f"the spec cited by the path {path}{name}.md"
            problems.append((text, f"{where}; cite it as {SPEC_DIR}/{name}.md §N"))
    for m in FOREIGN_SPEC_PATH.finditer(line):
        if m.group("name") not in known_names or any(c.start() <= m.start() < c.end() for c in citations):
            continue
        if not names_repo_spec(root, rel, m.group("path"), m.group("name")):
            problems.append((m.group(0), f"a path outside the repository; the spec is {SPEC_DIR}/"
                                         f"{m.group('name')}.md"))
    return problems


def check(root):
    spec = load_spec(root)
    # Bare names are recognised even when docs/spec/ is missing, so that they are still reported.
    known_names = set(spec) | {"fusion", "ir"}
    problems = []
    for rel in scanned_files(root):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                if "§" not in line and "spec/" not in line:
                    continue
                for text, problem in check_line(line, spec, known_names, root, rel):
                    problems.append(f"{rel}:{number}: {text}: {problem}")
    return problems


def self_test():
    """A tree with one good and one bad citation: exactly the bad one is reported."""
    with tempfile.TemporaryDirectory() as tmp:
        def write(rel, text):
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
        write("docs/spec/fusion.md", "# spec\n\n## 16. MultiStream\n\n### 16.4 Reads\n\n"
                                     "```\n### 16.9 not a heading: inside a code block\n```\n")
        write("fusion/src/read.cc", "// A read drains only when needed (docs/spec/fusion.md §16.4).\n"
                                    "// Streams are removed when empty (docs/spec/fusion.md §16.9).\n")
        got = check(tmp)
        expected = ["fusion/src/read.cc:2: docs/spec/fusion.md §16.9: no section §16.9"]
        if len(got) != 1 or not got[0].startswith(expected[0]):
            print("self-test: expected exactly\n  " + "\n  ".join(expected) + "\ngot\n  " + "\n  ".join(got))
            return 1
        # Ranges, lists and a chapter-level section resolve; a bare citation and a backwards range do not.
        write("fusion/src/read.cc", "// (docs/spec/fusion.md §16–§16.4, §16.4/§16.4 and §16).\n"
                                    "// as fusion.md §16.4 says\n"
                                    "// docs/spec/fusion.md §16.4-§16\n")
        # A relative Markdown link into docs/spec/ resolves; a path outside the repository does not.
        write("docs/guide.md", "See [the spec](spec/fusion.md), not ../shared/spec/fusion.md.\n")
        got = check(tmp)
        expected = ["fusion/src/read.cc:2: fusion.md §16.4: a bare spec citation",
                    "fusion/src/read.cc:3: docs/spec/fusion.md §16.4-§16: the range §16.4-§16 does not run forwards",
                    "docs/guide.md:1: ../shared/spec/fusion.md: a path outside the repository"]
        if len(got) != 3 or not all(g.startswith(e) for g, e in zip(got, expected)):
            print("self-test: expected exactly\n  " + "\n  ".join(expected) + "\ngot\n  " + "\n  ".join(got))
            return 1
    print("self-test: the check reports exactly the bad citations (missing section, bare, backwards, outside)")
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
        print(f"citations: {len(problems)} problem(s); the spec is {SPEC_DIR}/, cited as "
              f"{SPEC_DIR}/<file>.md §N.M")
        return 1
    print(f"citations: every citation of {SPEC_DIR}/ names a section that exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())

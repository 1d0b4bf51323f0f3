#!/usr/bin/env python3
"""Fails when Rust source code uses `unsafe` outside the modules docs/ARCHITECTURE.md names.

The list is the one between `<!-- unsafe:begin -->` and `<!-- unsafe:end -->`: a line
`crate-name: ...` names that crate's modules (in backquotes, `a::b` for a nested one);
text in parentheses is commentary, whatever it quotes. A source file may use `unsafe`
when its module is a listed one or lies inside one. Comments and string literals do not
count. Checked: every `src/` tree of the workspace's crates (named by their folder under
`crates/`), and `python/src` (the Python package's crate, outside the workspace, named
`python`). Not checked: integration tests, benchmarks and fuzz targets (they set up what
they exercise).

Usage: python3 .ci/unsafe_places.py [REPO]      (exit 1 and one line per file)
       python3 .ci/unsafe_places.py --self-test (checks that the checker bites)
"""
import os
import re
import sys
import tempfile

UNSAFE = re.compile(r"\bunsafe\b")


def read_places(doc):
    text = open(doc, encoding="utf-8").read()
    m = re.search(r"<!-- unsafe:begin -->(.*?)<!-- unsafe:end -->", text, re.S)
    if not m:
        sys.exit(f"{doc}: no list between <!-- unsafe:begin --> and <!-- unsafe:end -->")
    places = {}
    crate = None
    for line in m.group(1).splitlines():
        head = re.match(r"\s*[-*]?\s*`?([a-z][a-z0-9_-]*)`?\s*:(?!:)", line)
        if head:
            crate = head.group(1)
            line = line[head.end():]
        if crate is None:
            continue
        while re.search(r"\([^()]*\)", line):
            line = re.sub(r"\([^()]*\)", "", line)
        places.setdefault(crate, set()).update(re.findall(r"`([a-z_][a-z0-9_:]*)`", line))
    return places


def code_only(text):
    """The text without comments, string and character literals."""
    out = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    out = re.sub(r'r(#*)".*?"\1', '""', out, flags=re.S)
    out = re.sub(r'"(?:\\.|[^"\\])*"', '""', out, flags=re.S)
    out = re.sub(r"'(?:\\.|[^'\\])'", "' '", out)
    return re.sub(r"//[^\n]*", "", out)


def module_of(src, path):
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return rel


def check(repo):
    places = read_places(os.path.join(repo, "docs", "ARCHITECTURE.md"))
    found = []
    crates = os.path.join(repo, "crates")
    roots = [(crate, os.path.join(crates, crate, "src")) for crate in sorted(os.listdir(crates))]
    roots.append(("python", os.path.join(repo, "python", "src")))
    for crate, src in roots:
        if not os.path.isdir(src):
            continue
        allowed = [p.split("::") for p in places.get(crate, ())]
        for root, _, names in os.walk(src):
            for name in sorted(names):
                if not name.endswith(".rs"):
                    continue
                path = os.path.join(root, name)
                if not UNSAFE.search(code_only(open(path, encoding="utf-8").read())):
                    continue
                mod = module_of(src, path)
                if not any(mod[: len(a)] == a for a in allowed):
                    shown = "::".join(mod) or "the crate root"
                    found.append(
                        f"{os.path.relpath(path, repo)}: unsafe code in {crate}'s {shown}, "
                        "which docs/ARCHITECTURE.md does not list as a place for it"
                    )
    return found


def self_test():
    with tempfile.TemporaryDirectory() as repo:
        src = os.path.join(repo, "crates", "lib", "src")
        os.makedirs(os.path.join(src, "low"))
        os.makedirs(os.path.join(repo, "docs"))
        open(os.path.join(repo, "docs", "ARCHITECTURE.md"), "w").write(
            "text `high`\n<!-- unsafe:begin -->\n- lib: `low` (sockets; not `high`),\n"
            "  `mid::deep`\n- `other`: `x`\n<!-- unsafe:end -->\n"
        )
        files = {
            "lib.rs": "#![deny(unsafe_op_in_unsafe_fn)]\nmod low;\n// unsafe in a comment\n",
            "low/mod.rs": "fn f() { unsafe { g() } }\n",
            "mid/deep.rs": "unsafe fn g() {}\n",
            "mid/mod.rs": 'const S: &str = "unsafe"; /* unsafe */\n',
            "high.rs": "fn h() {}\n",
        }
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(src, name)), exist_ok=True)
            open(os.path.join(src, name), "w").write(text)
        assert check(repo) == [], check(repo)
        # python/src is checked too, under the name `python`.
        py = os.path.join(repo, "python", "src")
        os.makedirs(py)
        open(os.path.join(py, "lib.rs"), "w").write("mod ffi;\n")
        open(os.path.join(py, "ffi.rs"), "w").write("fn f() { unsafe { g() } }\n")
        found = check(repo)
        assert len(found) == 1 and "python's ffi" in found[0], found
        os.remove(os.path.join(py, "ffi.rs"))
        for name, text in [
            ("high.rs", "fn h() { unsafe { x() } }\n"),
            ("mid/mod.rs", "unsafe impl Send for X {}\n"),
            ("lib.rs", "unsafe fn top() {}\n"),
        ]:
            open(os.path.join(src, name), "w").write(text)
            found = check(repo)
            assert len(found) == 1 and name.split("/")[0].split(".")[0] in found[0] or (
                name == "lib.rs" and "crate root" in found[0]
            ), (name, found)
            open(os.path.join(src, name), "w").write(files[name])
    print("unsafe_places.py: self-test passed")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = check(repo)
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)

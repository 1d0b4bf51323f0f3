#!/usr/bin/env python3
"""Fails when a module of the quiver crate imports one that the layer table forbids.

The table is the one in docs/ARCHITECTURE.md between `<!-- layers:begin -->` and
`<!-- layers:end -->`: each row names modules (in backquotes) in its first column and what
they may use (in backquotes; anything else in the cell is commentary) in its second. A
source file belongs to the most specific row whose module is it or one of its ancestors.
An entry of the second column is a module
or one item of a module (`link::Transport`). A file may always use its own row's subtree and the modules above it (their `mod.rs`
items, such as `link::Datagram`). `lib.rs` and modules whose row says `everything` are
not checked.

Production code only: a file compiled only for tests (declared under `#[cfg(test)]` or
`#[cfg(all(test, ...))]`) and a trailing `#[cfg(test)] mod tests { ... }` block are
skipped, since tests may set up whatever they exercise.

Usage: python3 .ci/layers.py [REPO]      (exit 1 and one line per forbidden import)
       python3 .ci/layers.py --self-test (checks that the checker bites)
"""
import os
import re
import sys
import tempfile

IMPORT = re.compile(r"\bcrate((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
TEST_MOD = re.compile(r"#\[cfg\((?:test|all\(test[^\]]*)\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;")
TEST_BLOCK = re.compile(r"^#\[cfg\(test\)\]\s*\n\s*mod\s+[a-z_0-9]+\s*\{", re.M)


def read_table(doc):
    text = open(doc, encoding="utf-8").read()
    m = re.search(r"<!-- layers:begin -->(.*?)<!-- layers:end -->", text, re.S)
    if not m:
        sys.exit(f"{doc}: no layer table between <!-- layers:begin --> and <!-- layers:end -->")
    rules = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        mods = re.findall(r"`([a-z_:]+)`", cells[0])
        allowed = re.findall(r"`([A-Za-z_:]+)`", cells[1])
        everything = "everything" in cells[1]
        for mod in mods:
            rules[mod] = None if everything else set(allowed)
    return rules


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    return "::".join(rel) if rel != ["lib"] else ""


def is_module(src, parts):
    base = os.path.join(src, *parts)
    return os.path.isfile(base + ".rs") or os.path.isdir(base)


def target_module(src, parts):
    """The longest prefix of `parts` that names a module of the crate."""
    best = []
    for i in range(1, len(parts) + 1):
        if is_module(src, parts[:i]):
            best = parts[:i]
        else:
            break
    return "::".join(best)


def under(mod, root):
    return mod == root or mod.startswith(root + "::")


def test_only_files(src):
    """Files declared under #[cfg(test)] (and everything below them)."""
    skipped = set()
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            text = open(path, encoding="utf-8").read()
            here = dirpath if f in ("mod.rs", "lib.rs") else os.path.join(dirpath, f[:-3])
            for name in TEST_MOD.findall(text):
                skipped.add(os.path.join(here, name + ".rs"))
                skipped.add(os.path.join(here, name))
    return skipped


def check(repo):
    src = os.path.join(repo, "crates", "quiver", "src")
    rules = read_table(os.path.join(repo, "docs", "ARCHITECTURE.md"))
    skipped = test_only_files(src)
    problems = []
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            path = os.path.join(dirpath, f)
            if not f.endswith(".rs") or path in skipped or any(
                path.startswith(s + os.sep) for s in skipped
            ):
                continue
            mod = module_of(src, path)
            if not mod:
                continue
            owners = [r for r in rules if under(mod, r)]
            if not owners:
                problems.append(f"{path}: module {mod} has no row in the layer table")
                continue
            row = max(owners, key=len)
            allowed = rules[row]
            if allowed is None:
                continue
            text = open(path, encoding="utf-8").read()
            block = TEST_BLOCK.search(text)
            if block:
                text = text[: block.start()]
            for n, line in enumerate(text.splitlines(), 1):
                code = line.split("//")[0]
                for m in IMPORT.finditer(code):
                    full = m.group(1).strip(":")
                    target = target_module(src, full.split("::"))
                    if not target or under(target, row) or under(row, target):
                        continue
                    # An entry names a module or one item (`link::Transport`).
                    if any(under(target, a) or under(full, a) for a in allowed):
                        continue
                    problems.append(
                        f"{os.path.relpath(path, repo)}:{n}: {row} may not use {target} "
                        f"(docs/ARCHITECTURE.md, layer table)"
                    )
    return problems


def self_test():
    with tempfile.TemporaryDirectory() as repo:
        src = os.path.join(repo, "crates", "quiver", "src")
        os.makedirs(os.path.join(src, "low"))
        os.makedirs(os.path.join(repo, "docs"))
        open(os.path.join(repo, "docs", "ARCHITECTURE.md"), "w").write(
            "<!-- layers:begin -->\n| module | may use |\n|---|---|\n"
            "| `low` | nothing |\n| `high` | `low` (commentary `ignored` is not) |\n"
            "<!-- layers:end -->\n"
        )
        open(os.path.join(src, "lib.rs"), "w").write("mod low;\nmod high;\n")
        open(os.path.join(src, "high.rs"), "w").write("use crate::low::Thing;\n")
        open(os.path.join(src, "low", "mod.rs"), "w").write(
            "pub struct Thing;\nmod inner;\n#[cfg(test)]\nmod helper;\n"
        )
        open(os.path.join(src, "low", "inner.rs"), "w").write("use crate::low::Thing;\n")
        open(os.path.join(src, "low", "helper.rs"), "w").write("use crate::high::X;\n")
        assert check(repo) == [], check(repo)
        open(os.path.join(src, "low", "inner.rs"), "a").write("fn f() { crate::high::g() }\n")
        found = check(repo)
        assert len(found) == 1 and "low may not use high" in found[0], found
        open(os.path.join(src, "low", "inner.rs"), "w").write(
            "#[cfg(test)]\nmod tests {\n    use crate::high::X;\n}\n"
        )
        assert check(repo) == [], check(repo)
    print("layers.py: self-test passed")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    repo = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    found = check(repo)
    for p in found:
        print(p)
    if found:
        print(f"layers.py: {len(found)} import(s) the layer table forbids", file=sys.stderr)
        sys.exit(1)
    print("layers.py: every import follows the layer table")

#!/usr/bin/env python3
"""Fails when a module of the quiver crate imports one that the layer table forbids.

The table is the one in docs/ARCHITECTURE.md between `<!-- layers:begin -->` and
`<!-- layers:end -->`: each row names modules (in backquotes) in its first column and what
they may use in its second. In the second column only the backquoted names outside
commentary count: text in parentheses, and everything after a `;`, is commentary,
whatever it quotes. An entry names a module or one item of a module (`link::Transport`).
A source file belongs to the most specific row whose module is it or one of its
ancestors; it may always use its own row's subtree and the modules above it (their
`mod.rs` items, such as `link::Datagram`). `lib.rs` and rows that say `everything` are
not checked.

Paths are read as written: `crate::a::b`, `super::a` (resolved against the file's module)
and grouped `use` lines (`use crate::a::{b, c::d}`).

Production code only: a file compiled only for tests (declared under `#[cfg(test)]` or
`#[cfg(all(test, ...))]`) and every inline `#[cfg(test)] mod NAME { ... }` block are
skipped, since tests may set up whatever they exercise.

Usage: python3 .ci/layers.py [REPO]      (exit 1 and one line per forbidden import)
       python3 .ci/layers.py --self-test (checks that the checker bites)
"""
import os
import re
import sys
import tempfile

PATH = re.compile(r"\b((?:crate|super)(?:::(?:super|[A-Za-z_][A-Za-z0-9_]*))+)")
USE_GROUP = re.compile(r"\buse\s+((?:crate|super)(?:::super)*::[^;{]*\{[^;]*);", re.S)
TEST_MOD = re.compile(
    r"#\[cfg\((?:test|all\(test[^\]]*)\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;"
)
TEST_BLOCK = re.compile(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+[a-z_0-9]+\s*\{")


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
        names = cells[1]
        while re.search(r"\([^()]*\)", names):
            names = re.sub(r"\([^()]*\)", "", names)
        names = names.split(";")[0]
        allowed = set(re.findall(r"`([A-Za-z_:]+)`", names))
        everything = "everything" in names
        for mod in re.findall(r"`([a-z_:]+)`", cells[0]):
            rules[mod] = None if everything else allowed
    return rules


def strip_test_blocks(text):
    """The text without its inline `#[cfg(test)] mod NAME { ... }` blocks."""
    while True:
        m = TEST_BLOCK.search(text)
        if not m:
            return text
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[: m.start()] + text[i:]


def expand_group(path):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e]."""
    path = "".join(path.split())
    if "{" not in path:
        return [path]
    head, rest = path.split("{", 1)
    body = rest[: rest.rindex("}")]
    parts, depth, cur = [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    out = []
    for part in parts:
        if not part:
            continue
        if part == "self":
            out.append(head.rstrip(":"))
        else:
            out.extend(expand_group(head + part))
    return out


def absolute(mod, path):
    """A `crate::` or `super::` path as a path from the crate root (without `crate::`)."""
    segs = path.split("::")
    if segs[0] == "crate":
        return "::".join(segs[1:])
    here = mod.split("::") if mod else []
    while segs and segs[0] == "super":
        here = here[:-1]
        segs = segs[1:]
    return "::".join(here + segs)


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
            text = open(os.path.join(dirpath, f), encoding="utf-8").read()
            here = dirpath if f in ("mod.rs", "lib.rs") else os.path.join(dirpath, f[:-3])
            for name in TEST_MOD.findall(text):
                skipped.add(os.path.join(here, name + ".rs"))
                skipped.add(os.path.join(here, name))
    return skipped


def imports(mod, text):
    """(line number, path from the crate root) of every path the code names."""
    code = strip_test_blocks(text)
    code = "\n".join(line.split("//")[0] for line in code.splitlines())
    found = []
    for m in USE_GROUP.finditer(code):
        n = code.count("\n", 0, m.start()) + 1
        found.extend((n, absolute(mod, p)) for p in expand_group(m.group(1)))
    # Blank the grouped lines out (keeping line numbers) and read the plain paths.
    plain = USE_GROUP.sub(lambda m: "\n" * m.group(0).count("\n"), code)
    for n, line in enumerate(plain.splitlines(), 1):
        found.extend((n, absolute(mod, m.group(1))) for m in PATH.finditer(line))
    return found


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
            # `super` in `a/mod.rs` (module `a`) is `a`'s parent, in `a/b.rs` it is `a`.
            for n, full in imports(mod, open(path, encoding="utf-8").read()):
                target = target_module(src, full.split("::"))
                if not target or under(target, row) or under(row, target):
                    continue
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
            "| `low` | nothing (commentary may quote `high`) |\n"
            "| `low::side` | `low::inner::Thing`; later perhaps `high` |\n"
            "| `high` | `low` |\n<!-- layers:end -->\n"
        )
        files = {
            "lib.rs": "mod low;\nmod high;\n",
            "high.rs": "use crate::low::Thing;\n",
            "low/mod.rs": "pub struct Thing;\nmod inner;\nmod side;\n#[cfg(test)]\nmod helper;\n",
            "low/inner.rs": "use crate::low::Thing;\npub struct Thing2;\n",
            "low/side.rs": "use super::inner::Thing;\n",
            "low/helper.rs": "use crate::high::X;\n",
        }

        def write(name, text):
            open(os.path.join(src, name), "w").write(text)

        for name, text in files.items():
            write(name, text)
        assert check(repo) == [], check(repo)

        def bites(name, text, what):
            write(name, text)
            found = check(repo)
            assert len(found) == 1 and what in found[0], (text, found)
            write(name, files[name])

        # A plain path, commentary names, `super::`, grouped uses, code after a test block.
        bites("low/inner.rs", "fn f() { crate::high::g() }\n", "low may not use high")
        bites("low/side.rs", "use crate::high::Y;\n", "low::side may not use high")
        bites("low/side.rs", "use super::super::high::Y;\n", "low::side may not use high")
        bites("low/side.rs", "use super::inner::Thing2;\n", "low::side may not use low::inner")
        bites("low/inner.rs", "use crate::{low::Thing, high::Z};\n", "low may not use high")
        bites(
            "low/inner.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::high::X;\n}\nuse crate::high::W;\n",
            "low may not use high",
        )
        # What tests alone use is not checked.
        write("low/inner.rs", "#[cfg(test)]\nmod tests {\n    use crate::high::X;\n}\n")
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

#!/usr/bin/env python3
"""Fails when the C library or the Python package falls behind the Rust API.

Every public method of the types programs use (`Job`, and the public types of lib.rs's
public modules other than tools and plumbing: `dm`, `tagged`, and each personality's
module as it lands) must have a row in the table of docs/BINDINGS.md, between `<!-- bindings:begin -->` and `<!-- bindings:end -->`:

    | Rust | C | Python |
    | `Job::rank` | `quiver_job_rank` | `Job.rank` |
    | `Job::from_lookup` | — (why not) | — (why not) |

A cell names one or more items in backquotes, or is `—` followed by the reason in
parentheses. Then every C item must be declared in crates/quiver-c/include/quiver.h,
every Python item (`Class.method`) defined in python/quiver/_quiver.pyi, and every
function quiver.h declares must appear in the table (a row whose Rust cell is `—` lists
what only the bindings have). A new Rust call thus fails CI until it is bound in C and
in Python, or the table says why not.

Usage: python3 .ci/bindings.py [REPO]      (exit 1 and one line per problem)
       python3 .ci/bindings.py --self-test (checks that the checker bites)
"""
import os
import re
import sys
import tempfile

#: Types always checked; beside them, every `pub struct` or `pub enum` with public
#: methods of the modules programs use (`program_types`): a new personality's module
#: (`pub mod ports` in lib.rs) is checked from the day it lands.
TYPES = ["Job", "Endpoint", "Message", "Tagged", "Scope", "Request"]
#: Public modules of lib.rs that are not message APIs: tools and plumbing.
NOT_APIS = {"admin", "config", "wire", "fuzzing"}
PUB_MOD = re.compile(r"^\s*(?:#\[[^\]]*\]\s*)*pub mod ([a-z_0-9]+)\s*;", re.M)
PUB_TYPE = re.compile(r"^pub (?:struct|enum) ([A-Z][A-Za-z0-9_]*)", re.M)


def program_types(src):
    """The public types declared in the files of lib.rs's public message-API modules
    (and their `pub mod` submodules), with the job's `Job`."""
    lib = open(os.path.join(src, "lib.rs"), encoding="utf-8").read()
    files = [os.path.join(src, "job", "mod.rs")]

    def module_files(base):
        """The file of module `base` (a path without extension) and of its pub mods."""
        for f in (base + ".rs", os.path.join(base, "mod.rs")):
            if os.path.exists(f):
                files.append(f)
                text = open(f, encoding="utf-8").read()
                sub = os.path.dirname(f) if f.endswith("mod.rs") else base
                for m in PUB_MOD.finditer(text):
                    module_files(os.path.join(sub, m.group(1)))

    for m in PUB_MOD.finditer(lib):
        if m.group(1) not in NOT_APIS:
            module_files(os.path.join(src, m.group(1)))
    types = set(TYPES)
    for f in files:
        if os.path.exists(f):
            text = open(f, encoding="utf-8").read()
            types.update(PUB_TYPE.findall(text))
            # Types a module re-exports from a private one (`pub use access::{Rma, ..}`).
            for group in PUB_USE.findall(text):
                types.update(n for n in re.findall(r"\b([A-Z][A-Za-z0-9_]*)\b", group))
    return types
PUB_USE = re.compile(r"^pub use [a-z_:]+::(\{[^}]*\}|[A-Z][A-Za-z0-9_]*);", re.M)
IMPL = re.compile(r"^impl(?:<[^>]*>)?\s+(?:([A-Za-z_:]+)\s+for\s+)?([A-Za-z_]+)(?:<[^>]*>)?\s*\{", re.M)
PUB_FN = re.compile(r"\s*pub (?:unsafe )?fn ([a-z_0-9]+)")


def rust_api(src):
    """{"Type::method"} of the inherent `pub fn`s of the program types under `src`."""
    types = program_types(src)
    found = set()
    for dirpath, _, files in os.walk(src):
        for f in files:
            if not f.endswith(".rs"):
                continue
            text = open(os.path.join(dirpath, f), encoding="utf-8").read()
            for m in IMPL.finditer(text):
                trait, ty = m.group(1), m.group(2)
                if trait or ty not in types:
                    continue
                depth, j = 1, m.end()
                while depth and j < len(text):
                    depth += {"{": 1, "}": -1}.get(text[j], 0)
                    j += 1
                level = 0
                for line in text[m.end():j].split("\n"):
                    if level == 0:
                        fm = PUB_FN.match(line)
                        if fm:
                            found.add(f"{ty}::{fm.group(1)}")
                    level += line.count("{") - line.count("}")
    return found


def cell_items(cell):
    """The backquoted items of a cell, or [] for `—` (the reason must be given)."""
    cell = cell.strip()
    if cell.startswith("—"):
        if not re.search(r"\(.+\)", cell):
            raise ValueError(f"a '—' cell without its reason in parentheses: {cell!r}")
        return []
    items = re.findall(r"`([^`]+)`", cell)
    if not items:
        raise ValueError(f"a cell that names nothing: {cell!r}")
    return items


def read_table(doc):
    text = open(doc, encoding="utf-8").read()
    m = re.search(r"<!-- bindings:begin -->(.*?)<!-- bindings:end -->", text, re.S)
    if not m:
        raise ValueError(f"{doc}: no <!-- bindings:begin --> ... <!-- bindings:end --> table")
    rows = []
    for line in m.group(1).splitlines():
        line = line.strip()
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        cells = [c for c in line.strip("|").split("|")]
        if len(cells) != 3 or cells[0].strip() == "Rust":
            continue
        rows.append(tuple(cells))
    return rows


def check(repo):
    problems = []
    api = rust_api(os.path.join(repo, "crates/quiver/src"))
    header = open(os.path.join(repo, "crates/quiver-c/include/quiver.h"), encoding="utf-8").read()
    declared = set(re.findall(r"\b(quiver_[a-z_0-9]+)\(", header))
    stub_path = os.path.join(repo, "python/quiver/_quiver.pyi")
    stub = open(stub_path, encoding="utf-8").read() if os.path.exists(stub_path) else None
    python = set()
    if stub is not None:
        cls = None
        for line in stub.splitlines():
            cm = re.match(r"class (\w+)", line)
            if cm:
                cls = cm.group(1)
            dm = re.match(r"    def (\w+)", line)
            if dm and cls:
                python.add(f"{cls}.{dm.group(1)}")
            fm = re.match(r"def (\w+)", line)
            if fm:
                python.add(fm.group(1))
    named_rust, named_c = set(), set()
    try:
        rows = read_table(os.path.join(repo, "docs/BINDINGS.md"))
    except (OSError, ValueError) as e:
        return [str(e)]
    for rust, c, py in rows:
        try:
            r_items, c_items, p_items = cell_items(rust), cell_items(c), cell_items(py)
        except ValueError as e:
            problems.append(f"docs/BINDINGS.md: {e}")
            continue
        for r in r_items:
            named_rust.add(r)
            if r not in api:
                problems.append(f"docs/BINDINGS.md names {r}, which is not a public method of the API's types")
        for f in c_items:
            named_c.add(f)
            if f not in declared:
                problems.append(f"docs/BINDINGS.md names {f}, which quiver.h does not declare")
        if stub is not None:
            for p in p_items:
                if p not in python:
                    problems.append(f"docs/BINDINGS.md names {p}, which python/quiver/_quiver.pyi does not define")
    for r in sorted(api - named_rust):
        problems.append(f"{r} has no row in docs/BINDINGS.md: bind it in C and Python, or say why not")
    for f in sorted(declared - named_c):
        problems.append(f"quiver.h declares {f}, which docs/BINDINGS.md does not list")
    return problems


def self_test():
    """The checker finds a missing row, a wrong C name and an unlisted C function."""
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "crates/quiver/src"))
        os.makedirs(os.path.join(d, "crates/quiver-c/include"))
        os.makedirs(os.path.join(d, "docs"))
        open(os.path.join(d, "crates/quiver/src/lib.rs"), "w").write(
            "pub mod ports;\npub mod config;\n"
            "impl Job {\n    pub fn rank(&self) -> u32 { 0 }\n    pub fn size(&self) -> u32 { 1 }\n"
            "    fn private(&self) {}\n}\nimpl Drop for Job {\n    fn drop(&mut self) {}\n}\n"
        )
        # A new personality's type is checked without being named anywhere; config's not.
        open(os.path.join(d, "crates/quiver/src/ports.rs"), "w").write(
            "pub struct Port;\nimpl Port {\n    pub fn bind(&self) {}\n}\n"
        )
        open(os.path.join(d, "crates/quiver/src/config.rs"), "w").write(
            "pub struct Config;\nimpl Config {\n    pub fn knob(&self) {}\n}\n"
        )
        open(os.path.join(d, "crates/quiver-c/include/quiver.h"), "w").write(
            "int quiver_job_rank(const quiver_job *job);\nint quiver_extra(void);\n"
        )
        open(os.path.join(d, "docs/BINDINGS.md"), "w").write(
            "<!-- bindings:begin -->\n| Rust | C | Python |\n|---|---|---|\n"
            "| `Job::rank` | `quiver_job_rnak` | — (no Python here) |\n<!-- bindings:end -->\n"
        )
        got = check(d)
        want = ["quiver_job_rnak", "Job::size has no row", "quiver.h declares quiver_extra",
                "quiver.h declares quiver_job_rank", "Port::bind has no row"]
        if any("Config::knob" in p for p in got):
            print(f"bindings.py self-test: config's methods are not a message API; got {got}")
            return 1
        for w in want:
            if not any(w in p for p in got):
                print(f"bindings.py self-test: expected a problem mentioning {w!r}; got {got}")
                return 1
    print("bindings.py self-test: the checker bites")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    repo = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    problems = check(repo)
    for p in problems:
        print(p)
    if problems:
        print(f"bindings.py: {len(problems)} problem(s)")
        return 1
    print("bindings.py: the C library and the Python package follow the Rust API")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

//! Reads MPICH's ABI from MPICH's own header and writes what the library needs of it:
//!
//! - `mpich_abi.rs`: every integer constant `mpi.h` defines (`MPI_COMM_WORLD`,
//!   `MPI_DOUBLE`, `MPI_ERR_TRUNCATE`, ...) as a Rust `const`, and the pointer constants
//!   (`MPI_IN_PLACE`, `MPI_STATUS_IGNORE`, ...) as `isize`; nothing is copied by hand.
//! - `stubs.rs`: every function `mpi_proto.h` declares that `src/` does not define, as
//!   an exported function that says once on stderr that quiver does not implement it
//!   and returns `MPI_ERR_UNSUPPORTED_OPERATION` (handle conversions `*_c2f`/`*_f2c` are
//!   the identity, as in MPICH, whose Fortran and C handles are the same integers).
//!
//! The header is MPICH's wheel's (`pip install mpich==5.0.2`: the ABI of `libmpi.so.12`
//! that MPICH and Intel MPI share), found in `QUIVER_MPICH_INCLUDE` or the target
//! directory's `mpi-wheels/mpich/include`, where this script installs the wheel with pip
//! when it is missing.

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The MPICH release whose header defines the ABI here.
const MPICH: &str = "mpich==5.0.2";

fn main() {
    println!("cargo:rerun-if-env-changed=QUIVER_MPICH_INCLUDE");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmpi.so.12");
    let include = include_dir();
    println!("cargo:rerun-if-changed={}", include.join("mpi.h").display());
    let mpi_h = fs::read_to_string(include.join("mpi.h"))
        .unwrap_or_else(|e| panic!("{}: {e}", include.join("mpi.h").display()));
    let proto = fs::read_to_string(include.join("mpi_proto.h"))
        .unwrap_or_else(|e| panic!("{}: {e}", include.join("mpi_proto.h").display()));
    check_types(&mpi_h);
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    fs::write(out.join("mpich_abi.rs"), constants(&mpi_h)).unwrap();
    let defined = defined_in(Path::new("src"));
    let mut generated = stubs(&proto, &defined);
    generated.push_str(&data_symbols(&mpi_h));
    fs::write(out.join("stubs.rs"), generated).unwrap();
}

/// Where MPICH's headers are (installing the wheel when they are nowhere).
fn include_dir() -> PathBuf {
    if let Ok(dir) = env::var("QUIVER_MPICH_INCLUDE") {
        return PathBuf::from(dir);
    }
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    // OUT_DIR is <target>/<profile>/build/<package>/out.
    let profile = out
        .ancestors()
        .find(|a| a.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .expect("OUT_DIR under a build directory");
    let prefix = profile.join("..").join("mpi-wheels").join("mpich");
    let include = prefix.join("include");
    if include.join("mpi.h").exists() {
        return include;
    }
    println!(
        "cargo:warning=installing {MPICH}'s wheel (its header defines the ABI) into {}",
        prefix.display()
    );
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--disable-pip-version-check",
            "--prefix",
        ])
        .arg(&prefix)
        .arg(MPICH)
        .status();
    match status {
        Ok(s) if s.success() && include.join("mpi.h").exists() => include,
        other => panic!(
            "quiver-mpich needs MPICH's mpi.h: `python3 -m pip install --no-deps --target {} {MPICH}` \
             failed ({other:?}); install it so, or set QUIVER_MPICH_INCLUDE to a directory with \
             mpi.h and mpi_proto.h of MPICH 5",
            prefix.display()
        ),
    }
}

/// The library's Rust types follow these C types: fail if the header says otherwise.
fn check_types(h: &str) {
    for t in [
        "typedef int MPI_Datatype;",
        "typedef int MPI_Comm;",
        "typedef int MPI_Group;",
        "typedef int MPI_Win;",
        "typedef int MPI_Op;",
        "typedef int MPI_Request;",
        "typedef int MPI_Errhandler;",
        "typedef int MPI_Info;",
        "typedef long MPI_Aint;",
        "typedef int MPI_Fint;",
        "typedef long long MPI_Count;",
    ] {
        assert!(
            h.contains(t),
            "mpi.h does not say `{t}`: not the MPICH ABI this library implements"
        );
    }
    assert!(
        h.contains("typedef struct MPI_Status {\n    int count_lo;\n    int count_hi_and_cancelled;\n    int MPI_SOURCE;\n    int MPI_TAG;\n    int MPI_ERROR;\n} MPI_Status;"),
        "mpi.h's MPI_Status is not MPICH's five ints"
    );
}

/// `text` without C comments.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        match rest[i..].find("*/") {
            Some(j) => rest = &rest[i + j + 2..],
            None => return out,
        }
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// An integer literal, hexadecimal or decimal, maybe negative.
fn int_literal(s: &str) -> Option<i64> {
    let (neg, s) = match s.strip_prefix('-') {
        Some(r) => (true, r.trim()),
        None => (false, s),
    };
    let s = s.trim_end_matches(['L', 'l', 'U', 'u']);
    let v = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => i64::from_str_radix(h, 16).ok()?,
        None => s.parse::<i64>().ok()?,
    };
    Some(if neg { -v } else { v })
}

/// The `#define MPI_*` constants of `mpi.h` as Rust.
fn constants(h: &str) -> String {
    let h = strip_comments(h);
    let mut ints: BTreeMap<String, i64> = BTreeMap::new();
    let mut ptrs: BTreeMap<String, i64> = BTreeMap::new();
    let mut aliases: Vec<(String, String)> = Vec::new();
    for line in h.lines() {
        let Some(rest) = line.trim_start().strip_prefix("#define ") else {
            continue;
        };
        let rest = rest.trim();
        let (name, value) = match rest.split_once(char::is_whitespace) {
            Some((n, v)) => (n, v.trim()),
            None => continue,
        };
        if !name.starts_with("MPI_") || name.contains('(') || value.is_empty() {
            continue;
        }
        // Casts to pointers: `(void *) -1`, `(MPI_Status *)1`.
        let pointer = value.contains("*)");
        let mut v = value.to_string();
        // Remove casts `(TYPE)` / `(TYPE *)` and the parentheses around.
        while let Some(i) = v
            .find("(MPI_")
            .or_else(|| v.find("(void"))
            .or_else(|| v.find("(int"))
        {
            match v[i..].find(')') {
                Some(j) => v.replace_range(i..i + j + 1, ""),
                None => break,
            }
        }
        let v: String = v
            .chars()
            .filter(|c| !matches!(c, '(' | ')' | ' ' | '\t'))
            .collect();
        match int_literal(&v) {
            Some(n) if pointer => {
                ptrs.insert(name.to_string(), n);
            }
            Some(n) => {
                ints.insert(name.to_string(), n);
            }
            None if v.starts_with("MPI_")
                && v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
            {
                aliases.push((name.to_string(), v));
            }
            None => {}
        }
    }
    for (name, of) in aliases {
        if let Some(&n) = ints.get(&of) {
            ints.entry(name).or_insert(n);
        }
    }
    let mut s = String::from("// Generated by build.rs from MPICH's mpi.h.\n");
    for (name, v) in &ints {
        // Handles like 0x8c000000 are ints whose top bit is set.
        let v = if *v > i64::from(i32::MAX) && *v <= i64::from(u32::MAX) {
            i64::from(*v as u32 as i32)
        } else {
            *v
        };
        if i32::try_from(v).is_ok() {
            writeln!(s, "pub const {name}: c_int = {v};").unwrap();
        }
    }
    for (name, v) in &ptrs {
        writeln!(s, "pub const {name}: isize = {v};").unwrap();
    }
    // The builtin datatypes: MPICH's kind bits "builtin" and type bits "datatype".
    let builtins: Vec<&String> = ints
        .iter()
        .filter(|(_, v)| (**v as u32) & 0xfc00_0000 == 0x4c00_0000)
        .map(|(n, _)| n)
        .collect();
    writeln!(s, "/// Every builtin datatype of mpi.h.").unwrap();
    writeln!(
        s,
        "pub const BUILTIN_DATATYPES: [c_int; {}] = [{}];",
        builtins.len(),
        builtins
            .iter()
            .map(|n| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )
    .unwrap();
    s
}

/// The `MPI_*` functions `src/` defines (`extern "C" fn MPI_...`).
fn defined_in(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            names.extend(defined_in(&path));
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("extern \"C\" fn MPI_") {
            let name: String = rest[i + 14..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            names.insert(name);
            rest = &rest[i + 14..];
        }
    }
    names
}

/// The pointer variables `mpi.h` declares (`extern int * const MPI_UNWEIGHTED`, ...):
/// each exported, pointing at a sentinel of its own (programs compare against them, and
/// never read or write through them).
fn data_symbols(h: &str) -> String {
    let h = strip_comments(h);
    let mut s =
        String::from("// Generated by build.rs from MPICH's mpi.h: its pointer variables.\n");
    for decl in h.split(';') {
        let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
        let Some(rest) = decl.rsplit("\n").next().and_then(|d| {
            d.strip_prefix("extern ")
                .or_else(|| d.split("\n").last().and_then(|l| l.strip_prefix("extern ")))
        }) else {
            continue;
        };
        if !rest.contains('*') || rest.contains('(') {
            continue;
        }
        let words: Vec<&str> = rest
            .split(|c: char| c.is_whitespace() || c == '*')
            .filter(|w| !w.is_empty())
            .collect();
        let Some(name) = words.iter().rev().find(|w| {
            w.starts_with("MPI_")
                && w.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        }) else {
            continue;
        };
        writeln!(
            s,
            "#[no_mangle]\npub static {name}: crate::DataPtr = crate::DataPtr(&crate::SENTINELS[{}] as *const u64 as *mut c_void);",
            s.matches("SENTINELS[").count()
        )
        .unwrap();
    }
    s
}

/// Handle types that are `int` in MPICH's ABI.
const INT_HANDLES: [&str; 11] = [
    "MPI_Fint",
    "MPI_Comm",
    "MPI_Datatype",
    "MPI_Errhandler",
    "MPI_Group",
    "MPI_Info",
    "MPI_Message",
    "MPI_Op",
    "MPI_Request",
    "MPI_Session",
    "MPI_Win",
];

/// Exported stubs for the functions of `mpi_proto.h` not in `defined`.
fn stubs(proto: &str, defined: &BTreeSet<String>) -> String {
    // Without comments and preprocessor lines: declarations end with `;`.
    let proto: String = strip_comments(proto)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let mut s = String::from(
        "// Generated by build.rs from MPICH's mpi_proto.h: what quiver does not implement.\n",
    );
    let mut seen = BTreeSet::new();
    for decl in proto.split(';') {
        let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
        let Some(open) = decl.find('(') else { continue };
        let head = &decl[..open];
        let Some((ret, name)) = head.rsplit_once(' ') else {
            continue;
        };
        let ret = ret.trim().trim_start_matches("extern ").trim();
        if !name.starts_with("MPI_") || defined.contains(name) || !seen.insert(name.to_string()) {
            continue;
        }
        let args = decl[open + 1..].split(')').next().unwrap_or("");
        let conversion =
            (name.ends_with("_c2f") || name.ends_with("_f2c")) && !args.contains("MPI_File");
        let body = match ret {
            "int" => format!("unsupported(&ONCE, \"{name}\"); MPI_ERR_UNSUPPORTED_OPERATION"),
            r if conversion && INT_HANDLES.contains(&r) => {
                writeln!(
                    s,
                    "#[no_mangle]\npub extern \"C\" fn {name}(h: c_int) -> c_int {{ h }}"
                )
                .unwrap();
                continue;
            }
            "double" => format!("unsupported(&ONCE, \"{name}\"); 0.0"),
            "MPI_Aint" | "MPI_Count" | "MPI_Offset" => format!("unsupported(&ONCE, \"{name}\"); 0"),
            r if INT_HANDLES.contains(&r) => format!("unsupported(&ONCE, \"{name}\"); 0"),
            "MPI_File" => format!("unsupported(&ONCE, \"{name}\"); std::ptr::null_mut()"),
            other => panic!("mpi_proto.h: {name} returns {other:?}, which build.rs does not know"),
        };
        let rust_ret = match ret {
            "int" => "c_int",
            "double" => "f64",
            "MPI_Aint" | "MPI_Count" | "MPI_Offset" => "i64",
            "MPI_File" => "*mut c_void",
            _ => "c_int",
        };
        writeln!(
            s,
            "#[no_mangle]\npub extern \"C\" fn {name}() -> {rust_ret} {{ static ONCE: std::sync::Once = std::sync::Once::new(); {body} }}"
        )
        .unwrap();
    }
    s
}

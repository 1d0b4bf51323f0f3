//! Reading MPI's C headers, for the build scripts of `libmpi.so.12` (quiver-mpich) and
//! `libmpi_abi.so.1` (quiver-mpi-abi): where MPICH's wheel installed them, their
//! constants as Rust, the functions a library's sources define, and stubs for the rest.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The MPICH release whose headers define the ABIs here.
pub const MPICH: &str = "mpich==5.0.2";

/// Where MPICH's headers are (installing the wheel when they are nowhere): `mpi.h`,
/// `mpi_proto.h` (the MPICH ABI) and `mpi_abi.h` (the MPI-5 standard ABI).
pub fn include_dir(who: &str) -> PathBuf {
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
            "{who} needs MPICH's mpi.h: `python3 -m pip install --no-deps --target {} {MPICH}` \
             failed ({other:?}); install it so, or set QUIVER_MPICH_INCLUDE to a directory with \
             mpi.h and mpi_proto.h of MPICH 5",
            prefix.display()
        ),
    }
}

/// `text` without C comments.
pub fn strip_comments(text: &str) -> String {
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
pub fn int_literal(s: &str) -> Option<i64> {
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
pub fn constants(h: &str) -> String {
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
pub fn defined_in(dir: &Path) -> BTreeSet<String> {
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

/// Which ABI a library's stubs follow.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// MPICH's `libmpi.so.12`: integer handles, whose C and Fortran forms are the same.
    Mpich,
    /// The MPI-5 standard ABI (`libmpi_abi.so.1`): handles are pointers.
    Standard,
}

/// Handle types that are pointers in the MPI-5 standard ABI.
const POINTER_HANDLES: [&str; 11] = [
    "MPI_Comm",
    "MPI_Datatype",
    "MPI_Errhandler",
    "MPI_File",
    "MPI_Group",
    "MPI_Info",
    "MPI_Message",
    "MPI_Op",
    "MPI_Request",
    "MPI_Session",
    "MPI_Win",
];

/// Exported stubs for the functions declared in `proto` that are not in `defined`:
/// each says once on stderr that quiver does not implement it and returns
/// `MPI_ERR_UNSUPPORTED_OPERATION` (or a zero of its return type). They take no
/// parameters: a C caller's arguments are ignored, which the x86-64 and AArch64 calling
/// conventions allow.
pub fn stubs(proto: &str, defined: &BTreeSet<String>, abi: Abi) -> String {
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
        let conversion = abi == Abi::Mpich
            && (name.ends_with("_c2f") || name.ends_with("_f2c"))
            && !args.contains("MPI_File");
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
            "MPI_File" if abi == Abi::Mpich => {
                format!("unsupported(&ONCE, \"{name}\"); std::ptr::null_mut()")
            }
            "MPI_Fint" => format!("unsupported(&ONCE, \"{name}\"); 0"),
            r if abi == Abi::Standard && POINTER_HANDLES.contains(&r) => {
                format!("unsupported(&ONCE, \"{name}\"); 0")
            }
            other => panic!("{name} returns {other:?}, which build.rs does not know"),
        };
        let rust_ret = match ret {
            "int" | "MPI_Fint" => "c_int",
            "double" => "f64",
            "MPI_Aint" | "MPI_Count" | "MPI_Offset" => "i64",
            "MPI_File" if abi == Abi::Mpich => "*mut c_void",
            r if abi == Abi::Standard && POINTER_HANDLES.contains(&r) => "usize",
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

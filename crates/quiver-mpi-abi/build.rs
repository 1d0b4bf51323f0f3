//! Reads the MPI-5 standard ABI (`mpi_abi.h`) and MPICH's (`mpi.h`) from MPICH's wheel
//! and writes what the translation between them needs:
//!
//! - `abi.rs`: the standard ABI's constants: handles (`MPI_COMM_WORLD` is `0x101`) as
//!   `usize`, pointer constants (`MPI_IN_PLACE`) as `isize`, the rest (`MPI_ANY_SOURCE`,
//!   error classes, `MPI_LOCK_SHARED`...) as `c_int`;
//! - `mpich.rs`: MPICH's constants, as `libmpi.so.12`'s build script reads them;
//! - `maps.rs`: the predefined handles both ABIs name (the standard's value, MPICH's,
//!   the type), and the error classes both name; nothing is paired by hand;
//! - `stubs.rs`: every function `mpi_abi.h` declares that `src/` does not define, as an
//!   exported function that says once on stderr that quiver does not implement it.

#[path = "../quiver-mpich/build/header.rs"]
mod header;

use header::{constants, defined_in, include_dir, int_literal, strip_comments, stubs, Abi};
use std::collections::BTreeMap;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-env-changed=QUIVER_MPICH_INCLUDE");
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=../quiver-mpich/build");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmpi_abi.so.1");
    let include = include_dir("quiver-mpi-abi");
    let read = |name: &str| {
        let path = include.join(name);
        println!("cargo:rerun-if-changed={}", path.display());
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let (abi_h, mpi_h) = (read("mpi_abi.h"), read("mpi.h"));
    assert!(
        abi_h.contains("#define MPI_ABI_VERSION    1"),
        "mpi_abi.h is not version 1 of the standard ABI"
    );
    assert!(
        abi_h.contains("typedef struct {\n    int MPI_SOURCE;\n    int MPI_TAG;\n    int MPI_ERROR;\n    int MPI_internal[5];\n} MPI_Status;"),
        "mpi_abi.h's MPI_Status is not the standard's"
    );
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let abi = StandardConstants::read(&abi_h);
    fs::write(out.join("abi.rs"), abi.rust()).unwrap();
    fs::write(out.join("mpich.rs"), constants(&mpi_h)).unwrap();
    fs::write(out.join("maps.rs"), maps(&abi, &mpi_h)).unwrap();
    let defined = defined_in(Path::new("src"));
    fs::write(out.join("stubs.rs"), stubs(&abi_h, &defined, Abi::Standard)).unwrap();
}

/// The constants of `mpi_abi.h`.
struct StandardConstants {
    /// Predefined handles (`((MPI_Comm)0x00000101)`), with their type.
    handles: BTreeMap<String, (u64, String)>,
    /// Pointer constants (`((void*)1)`).
    pointers: BTreeMap<String, i64>,
    /// Integers, from `#define`s and enums.
    ints: BTreeMap<String, i64>,
}

impl StandardConstants {
    fn read(h: &str) -> StandardConstants {
        let h = strip_comments(h);
        let mut c = StandardConstants {
            handles: BTreeMap::new(),
            pointers: BTreeMap::new(),
            ints: BTreeMap::new(),
        };
        let mut aliases = Vec::new();
        let mut in_enum = false;
        for line in h.lines() {
            let t = line.trim();
            if t.starts_with("enum") {
                in_enum = true;
                continue;
            }
            if in_enum {
                if t.starts_with('}') {
                    in_enum = false;
                    continue;
                }
                // `NAME = value,`
                if let Some((name, v)) = t.trim_end_matches(',').split_once('=') {
                    let name = name.trim();
                    if let Some(v) = int_literal(v.trim()) {
                        if name.starts_with("MPI") {
                            c.ints.insert(name.to_string(), v);
                        }
                    }
                }
                continue;
            }
            let Some(rest) = t.strip_prefix("#define ") else {
                continue;
            };
            let Some((name, value)) = rest.split_once(char::is_whitespace) else {
                continue;
            };
            let value = value.trim();
            if !name.starts_with("MPI_") || name.contains('(') {
                continue;
            }
            // `((MPI_Comm)0x00000101)`, `((void*)1)`, `512`, `MPI_LONG_LONG`.
            if let Some(cast) = value.strip_prefix("((") {
                let Some((ty, v)) = cast.split_once(')') else {
                    continue;
                };
                let v = v.trim_end_matches(')').trim();
                let Some(v) = int_literal(v) else { continue };
                if ty.ends_with('*') {
                    c.pointers.insert(name.to_string(), v);
                } else if ty.starts_with("MPI_") {
                    c.handles
                        .insert(name.to_string(), (v as u64, ty.to_string()));
                } else {
                    c.ints.insert(name.to_string(), v);
                }
            } else if let Some(v) = int_literal(value) {
                c.ints.insert(name.to_string(), v);
            } else if value.starts_with("MPI_") {
                aliases.push((name.to_string(), value.to_string()));
            }
        }
        for (name, of) in aliases {
            if let Some(v) = c.handles.get(&of).cloned() {
                c.handles.entry(name).or_insert(v);
            } else if let Some(&v) = c.ints.get(&of) {
                c.ints.entry(name).or_insert(v);
            }
        }
        c
    }

    fn rust(&self) -> String {
        let mut s = String::from("// Generated by build.rs from mpi_abi.h.\n");
        for (name, (v, _)) in &self.handles {
            writeln!(s, "pub const {name}: usize = {v:#x};").unwrap();
        }
        for (name, v) in &self.pointers {
            writeln!(s, "pub const {name}: isize = {v};").unwrap();
        }
        for (name, v) in &self.ints {
            if i32::try_from(*v).is_ok() {
                writeln!(s, "pub const {name}: c_int = {v};").unwrap();
            }
        }
        s
    }
}

/// The handles and error classes both headers name, paired.
fn maps(abi: &StandardConstants, mpi_h: &str) -> String {
    let mpich = mpich_ints(mpi_h);
    let mut s = String::from("// Generated by build.rs from mpi_abi.h and mpi.h.\n");
    let pairs: Vec<(u64, i64, &str, &str)> = abi
        .handles
        .iter()
        .filter_map(|(n, (v, ty))| mpich.get(n).map(|&m| (*v, m, ty.as_str(), n.as_str())))
        .collect();
    writeln!(
        s,
        "/// (the standard's handle, MPICH's, the handle's type) of every predefined handle both\n/// name (MPICH gives some of different types one number: `MPI_MESSAGE_NULL` is\n/// `MPI_REQUEST_NULL`).\npub const HANDLES: [(usize, c_int, &str); {}] = [",
        pairs.len()
    )
    .unwrap();
    for (v, m, ty, n) in &pairs {
        writeln!(s, "    ({v:#x}, {m}, \"{ty}\"), // {n}").unwrap();
    }
    s.push_str("];\n");
    let errors: Vec<(i64, i64, &str)> = abi
        .ints
        .iter()
        .filter(|(n, _)| {
            *n == "MPI_SUCCESS" || n.starts_with("MPI_ERR_") || n.starts_with("MPI_T_ERR_")
        })
        .filter_map(|(n, &v)| mpich.get(n).map(|&m| (m, v, n.as_str())))
        .collect();
    writeln!(
        s,
        "/// (MPICH's class, the standard's) of every error class both name.\npub const ERRORS: [(c_int, c_int); {}] = [",
        errors.len()
    )
    .unwrap();
    for (m, v, n) in &errors {
        writeln!(s, "    ({m}, {v}), // {n}").unwrap();
    }
    s.push_str("];\n");
    s
}

/// MPICH's integer constants, as `constants` writes them (handles as `c_int`).
fn mpich_ints(mpi_h: &str) -> BTreeMap<String, i64> {
    constants(mpi_h)
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("pub const ")?;
            let (name, rest) = rest.split_once(": c_int = ")?;
            Some((name.to_string(), rest.trim_end_matches(';').parse().ok()?))
        })
        .collect()
}

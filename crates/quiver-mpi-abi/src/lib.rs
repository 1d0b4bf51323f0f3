//! `libmpi_abi.so.1`: MPI with the MPI-5 standard ABI, on quiver.
//!
//! A program built with MPICH's `mpicc_abi` (or any compiler against the standard's
//! `mpi_abi.h`) loads this library. It translates each call into MPICH's ABI and makes
//! it on quiver's `libmpi.so.12` (crates/quiver-mpich), which it loads privately
//! (`RTLD_LOCAL`, from its own directory: `QUIVER_MPI_LIB` when set): handles are
//! pointers here and integers there (the predefined ones paired by name from both
//! headers, `maps`; the library's own pass through as the same number), the wildcard and
//! sentinel ranks and tags, thread levels, lock types, comparison results and error
//! classes have other numbers, `MPI_Status` another layout, `MPI_IN_PLACE` another
//! address. One core, two front-ends: no MPI semantics here.
//!
//! Implemented: initialization, point-to-point (blocking and not), the common
//! collectives, datatypes' basics, memory, windows and one-sided operations, errors. Every
//! other function of `mpi_abi.h` exists, says once on stderr that quiver does not
//! implement it, and returns `MPI_ERR_UNSUPPORTED_OPERATION` (`stubs`, generated). An
//! unknown handle is the class's error code (no error handler runs for it).
//! `MPI_Abi_get_version` answers 1.0.

#![allow(non_snake_case, non_camel_case_types)]
#![allow(
    clippy::missing_safety_doc,
    clippy::not_unsafe_ptr_arg_deref,
    clippy::too_many_arguments
)]

use std::sync::Once;

mod calls;

/// The standard ABI's constants, from `mpi_abi.h`.
#[allow(dead_code, clippy::all)]
mod abi {
    use std::ffi::c_int;
    include!(concat!(env!("OUT_DIR"), "/abi.rs"));
}

/// MPICH's constants, from `mpi.h`.
#[allow(dead_code, clippy::all)]
mod mpich {
    use std::ffi::c_int;
    include!(concat!(env!("OUT_DIR"), "/mpich.rs"));
}

/// The predefined handles and error classes both ABIs name, paired.
#[allow(dead_code, clippy::all)]
mod maps {
    use std::ffi::c_int;
    include!(concat!(env!("OUT_DIR"), "/maps.rs"));
}

#[allow(clippy::all, unused_imports)]
mod stubs {
    use crate::abi::*;
    use crate::unsupported;
    use std::ffi::{c_int, c_void};
    include!(concat!(env!("OUT_DIR"), "/stubs.rs"));
}

/// Writes one line to stderr in one `write` (ranks share the pipe).
pub(crate) fn say(line: &str) {
    use std::io::Write as _;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// A function quiver does not implement: says so once on stderr.
pub(crate) fn unsupported(once: &Once, name: &str) {
    once.call_once(|| {
        say(&format!(
            "quiver MPI: {name} is not supported (it returns MPI_ERR_UNSUPPORTED_OPERATION)"
        ))
    });
}

//! What the CLI's integration tests share.
#![allow(dead_code)]

pub mod jobs;

/// Skips a test that needs what this machine lacks (root, a command, a package), with one
/// line saying why; under `.ci/run` (`QUIVER_CI` set), which runs as root and installs
/// every tool, fails instead, so that CI never passes a test it did not run.
pub fn cannot_run(why: &str) {
    if std::env::var_os("QUIVER_CI").is_some() {
        panic!("{why} (QUIVER_CI is set: .ci/run must run this test)");
    }
    eprintln!("skipped: {why}");
}

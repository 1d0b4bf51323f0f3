//! What the crate's own tests share: how a test that cannot run here says so.

/// Skips a test that needs what this machine lacks (root, a raw socket, a network
/// namespace, a command), with one line saying why; under `.ci/run` (`QUIVER_CI` set),
/// which runs as root with every tool installed, fails instead, so that CI never passes a
/// test it did not run.
pub(crate) fn cannot_run(why: &str) {
    if std::env::var_os("QUIVER_CI").is_some() {
        panic!("{why} (QUIVER_CI is set: .ci/run must run this test)");
    }
    eprintln!("skipping: {why}");
}

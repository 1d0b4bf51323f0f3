//! Smoke test of `bench/compare` (the comparison with the established systems): one small
//! scenario (intra-node), one repetition, short measurements, nothing installed. It keeps
//! the script from rotting: every figure of quiver's row is measured, the outputs (table,
//! JSON, CSV, plot) are written, and a system that cannot run here is named with a
//! one-line reason instead of vanishing. It times nothing: figures are only checked to be
//! positive.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `bench/compare ARGS` with python3; None (and a line saying why) without python3.
fn compare(args: &[&str]) -> Option<Output> {
    if Command::new("python3").arg("--version").output().is_err() {
        common::cannot_run("python3 is not installed (.ci/run installs it)");
        return None;
    }
    let run = Command::new("python3")
        .arg(repo_root().join("bench/compare"))
        .args(args)
        .output()
        .expect("run bench/compare");
    Some(run)
}

/// One quick repetition of `scenario` for the `systems` filter, nothing installed, this
/// build's quiver, results in `out`.
fn compare_quick(scenario: &str, systems: &str, out: &Path) -> Option<Output> {
    compare(&[
        "--scenarios",
        scenario,
        "--reps",
        "1",
        "--quick",
        "--no-install",
        "--systems",
        systems,
        "--quiver",
        env!("CARGO_BIN_EXE_quiver"),
        "--out",
        out.to_str().expect("temporary path is UTF-8"),
    ])
}

#[test]
fn compare_runs_one_small_scenario() {
    let out = std::env::temp_dir().join(format!("quiver-compare-smoke-{}", std::process::id()));
    // quiver's shared-memory rows, the limits, kernel sockets and Open MPI (present in CI):
    // the systems whose names contain one of these.
    let Some(run) = compare_quick("intra", "quiver,limit,kernel,open mpi,ucx", &out) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "bench/compare failed: {}\n{stdout}\n{stderr}",
        run.status
    );
    assert!(
        stdout.contains("## Intra-node"),
        "no intra-node table:\n{stdout}"
    );

    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let summary = results["summary"].as_array().expect("summary rows");
    let figure = |system: &str, fig: &str, size: u64| {
        summary.iter().find(|r| {
            r["system"] == system && r["figure"] == fig && r["size"].as_u64() == Some(size)
        })
    };
    for (fig, size) in [
        ("lat", 8),
        ("lat", 1024),
        ("lat", 65536),
        ("bw", 65536),
        ("bw", 1 << 20),
        ("bw", 16 << 20),
    ] {
        let row = figure("quiver shm", fig, size)
            .unwrap_or_else(|| panic!("quiver shm has no {fig} {size}:\n{stdout}\n{stderr}"));
        assert!(row["median"].as_f64().unwrap() > 0.0, "{row}");
        assert_eq!(row["ratio_to_quiver"].as_f64(), Some(1.0), "{row}");
    }
    // Every selected system either has figures or is skipped with its reason, in the JSON
    // and as one line under the table.
    let skipped = results["skipped"].as_array().unwrap();
    for name in [
        "quiver tagged shm",
        "limit: cache-line ping-pong",
        "limit: memcpy (1 thread)",
        "limit: process_vm_readv",
        "kernel UDP sockets",
        "kernel TCP sockets",
        "Open MPI",
        "UCX (tag)",
        "UCX (UCP tag, OSU windows)",
    ] {
        let measured = summary.iter().any(|r| r["system"] == name);
        let skip = skipped.iter().find(|s| s["system"] == name);
        let failed = results["failures"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["system"] == name);
        assert!(
            measured || skip.is_some() || failed,
            "{name}: neither measured nor skipped nor failed:\n{stdout}\n{stderr}"
        );
        if let Some(s) = skip {
            let reason = s["reason"].as_str().unwrap();
            assert!(!reason.is_empty() && !reason.contains('\n'), "{s}");
            assert!(
                stdout.contains(&format!("- skipped: {name}: {reason}")),
                "the skip of {name} is not in the table:\n{stdout}"
            );
        }
    }
    // Ratios are relative to quiver, with a figure that both have.
    if let Some(row) = figure("limit: cache-line ping-pong", "lat", 8) {
        assert!(row["ratio_to_quiver"].as_f64().unwrap() > 0.0, "{row}");
    }
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    assert!(
        runs.starts_with("scenario,system,figure,size,rep,value,unit"),
        "{runs}"
    );
    assert!(runs.lines().count() > 6, "{runs}");
    let commands = std::fs::read_to_string(out.join("commands.md")).unwrap();
    assert!(commands.contains("quiver shm"), "{commands}");
    let png = std::fs::read(out.join("intra.png")).expect("intra.png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn compare_rejects_an_unknown_scenario() {
    let Some(run) = compare(&["--scenarios", "intra,10gbit", "--no-install"]) else {
        return;
    };
    assert_eq!(run.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("unknown scenario 10gbit"), "{stderr}");
}

/// The network path of the script: a 2-node emulated cluster built, measured and removed
/// (needs root; without it the scenario must be skipped with a reason, which is checked
/// instead).
#[test]
fn compare_runs_a_network_scenario() {
    let out = std::env::temp_dir().join(format!("quiver-compare-net-{}", std::process::id()));
    let Some(run) = compare_quick("unshaped", "quiver eth,quiver udp,kernel udp", &out) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{}\n{stdout}\n{stderr}", run.status);
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let skipped = results["skipped"].as_array().unwrap();
        assert_eq!(skipped.len(), 3, "{stdout}");
        assert!(
            stdout.contains("- skipped: quiver eth: needs root"),
            "{stdout}"
        );
        return;
    }
    let summary = results["summary"].as_array().unwrap();
    for system in ["quiver eth", "quiver udp"] {
        for fig in ["lat", "bw"] {
            assert!(
                summary.iter().any(|r| r["system"] == system
                    && r["figure"] == fig
                    && r["median"].as_f64().unwrap() > 0.0),
                "{system} has no {fig}:\n{stdout}\n{stderr}"
            );
        }
    }
    assert!(
        summary.iter().any(|r| r["system"] == "kernel UDP sockets"),
        "{stdout}"
    );
    assert!(out.join("unshaped.png").exists());
    // The cluster and its management namespace are gone.
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&netns.stdout);
    assert!(!left.contains("qvc"), "namespaces left behind:\n{left}");
    let _ = std::fs::remove_dir_all(&out);
}

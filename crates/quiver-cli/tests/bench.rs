//! End-to-end tests of `quiver bench`: the command re-launches itself as a two-rank job
//! over shared memory and over UDP, and its JSON lines carry the documented keys with
//! positive values.

use std::process::{Command, Output};
use std::sync::Mutex;

/// One benchmark job at a time: two spinning ranks per job already fill a small machine.
static SERIAL: Mutex<()> = Mutex::new(());

fn quiver_bench(args: &[&str]) -> Output {
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .arg("bench")
        .args(args)
        .args(["--format", "json", "--timeout", "120", "--no-pin"])
        .env_remove("QUIVER_RANK")
        .env_remove("QUIVER_TRANSPORT")
        .env_remove("QUIVER_WAIT")
        .env_remove("QUIVER_RELIABILITY")
        .env_remove("QUIVER_FAULTS")
        .output()
        .expect("run quiver");
    assert!(
        out.status.success(),
        "quiver bench {args:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json_lines(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

fn positive(v: &serde_json::Value, key: &str) -> f64 {
    let x = v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"));
    assert!(x > 0.0 && x.is_finite(), "{key} = {x} in {v}");
    x
}

fn check_pingpong(transport: &str) {
    let out = quiver_bench(&[
        "pingpong",
        "--transport",
        transport,
        "--sizes",
        "0,8,1K",
        "--iters",
        "200",
    ]);
    let lines = json_lines(&out);
    let sizes: Vec<u64> = lines
        .iter()
        .map(|v| v["size"].as_u64().expect("size"))
        .collect();
    assert_eq!(sizes, [0, 8, 1024], "{lines:?}");
    for v in &lines {
        assert_eq!(v["bench"], "pingpong");
        assert_eq!(v["transport"], transport);
        assert_eq!(v["iters"], 200);
        assert_eq!(v["wait"], "spin");
        let median = positive(v, "latency_us_median");
        let p99 = positive(v, "latency_us_p99");
        positive(v, "latency_us_avg80");
        assert!(p99 >= median * 0.99, "{v}");
    }
}

fn check_bw(transport: &str) {
    let out = quiver_bench(&[
        "bw",
        "--transport",
        transport,
        "--sizes",
        "4K",
        "--iters",
        "20",
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v = &lines[0];
    assert_eq!(v["bench"], "bw");
    assert_eq!(v["transport"], transport);
    assert_eq!(v["size"], 4096);
    assert_eq!(v["iters"], 20);
    assert!(v["wait"].is_string());
    positive(v, "bandwidth_MBps");
    positive(v, "window");
}

#[test]
fn pingpong_over_shm() {
    check_pingpong("shm");
}

#[test]
fn pingpong_over_udp() {
    check_pingpong("udp");
}

#[test]
fn bw_over_shm() {
    check_bw("shm");
}

#[test]
fn bw_over_udp() {
    check_bw("udp");
}

#[test]
fn bibw_over_shm() {
    let out = quiver_bench(&["bibw", "--sizes", "64K", "--iters", "10"]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["bench"], "bibw");
    positive(&lines[0], "bandwidth_MBps");
}

#[test]
fn reliability_is_selectable_and_reported() {
    for mode in ["none", "host"] {
        let out = quiver_bench(&[
            "pingpong",
            "--transport",
            "udp",
            "--reliability",
            mode,
            "--sizes",
            "8",
            "--iters",
            "200",
        ]);
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0]["reliability"], mode, "{}", lines[0]);
        positive(&lines[0], "latency_us_median");
    }
    // Shared memory has no network channel, so no reliability to report.
    let out = quiver_bench(&["pingpong", "--sizes", "8", "--iters", "200"]);
    assert!(json_lines(&out)[0].get("reliability").is_none());
}

fn check_logp(transport: &str) {
    let out = quiver_bench(&[
        "logp",
        "--transport",
        transport,
        "--sizes",
        "8",
        "--iters",
        "300",
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v = &lines[0];
    assert_eq!(v["bench"], "logp");
    assert_eq!(v["transport"], transport);
    assert_eq!(v["size"], 8);
    assert_eq!(v["iters"], 300);
    for key in ["o_s_us", "o_r_us", "g_us", "latency_us"] {
        positive(v, key);
    }
    // L = latency - o_s - o_r may be negative on one host, but it is a number.
    let l = v["L_us"]
        .as_f64()
        .unwrap_or_else(|| panic!("L_us missing in {v}"));
    assert!(l.is_finite(), "{v}");
    assert!(v.get("latency_us_median").is_none(), "{v}");
}

#[test]
fn logp_over_shm() {
    check_logp("shm");
}

#[test]
fn logp_over_udp() {
    check_logp("udp");
}

#[test]
fn bad_sizes_are_rejected_before_launching() {
    let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["bench", "pingpong", "--sizes", "3..8"])
        .output()
        .expect("run quiver");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("power of two"));
}

//! End-to-end tests of `quiver bench`: the command re-launches itself as a two-rank job
//! over shared memory and over UDP, and its JSON lines carry the documented keys with
//! positive values; the same for the tagged API (`--api tagged`, `--push`), `early-late`,
//! `tune-btp`, and for `quiver info`.

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
        .env_remove("QUIVER_PUSH")
        .env_remove("QUIVER_BTP1")
        .env_remove("QUIVER_BTP2")
        .env_remove("QUIVER_CMA")
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
        // Directed Point results name no API and no push mode.
        assert!(v.get("api").is_none() && v.get("push").is_none(), "{v}");
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

/// `rate`: 8-byte windows counted in messages per second, for endpoints and tagged
/// messages over shm and udp; every per-window sample is window / time, and the byte
/// rate size x window / time, so their means agree.
#[test]
fn message_rate_of_endpoints_and_tagged() {
    for (api, transport) in [
        ("dm", "shm"),
        ("tagged", "shm"),
        ("dm", "udp"),
        ("tagged", "udp"),
    ] {
        let out = quiver_bench(&[
            "rate",
            "--api",
            api,
            "--transport",
            transport,
            "--iters",
            "20",
        ]);
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let v = &lines[0];
        assert_eq!(v["bench"], "rate", "{v}");
        assert_eq!(v["size"], 8, "{v}");
        // Tagged over udp caps its window to a quarter of the channel's (bw.rs).
        let window = if (api, transport) == ("tagged", "udp") {
            16
        } else {
            64
        };
        assert_eq!(v["window"], window, "{v}");
        let rate = positive(v, "messages_per_s");
        positive(v, "messages_per_s_median");
        let from_bytes = positive(v, "bandwidth_MBps") * 1e6 / 8.0;
        assert!(
            (rate - from_bytes).abs() <= 0.01 * rate,
            "{api} over {transport}: {rate} messages/s, {from_bytes} from the byte rate"
        );
    }
}

/// `match`: the tagged ping-pong with N operations outstanding in each queue, over shm
/// and udp and in every push mode (zero makes the unexpected messages' sends wait for
/// their receives); one row per queue and N, in order; the run checks the outstanding
/// messages' contents and that no outstanding receive was matched.
#[test]
fn matching_with_operations_outstanding() {
    for (transport, push) in [("shm", "pull"), ("shm", "zero"), ("udp", "all")] {
        let out = quiver_bench(&[
            "match",
            "--transport",
            transport,
            "--push",
            push,
            // Largest first: a run's receives must be gone before the next run sends.
            "--outstanding",
            "300,0,5",
            "--iters",
            "50",
        ]);
        let lines = json_lines(&out);
        let got: Vec<(String, u64)> = lines
            .iter()
            .map(|v| {
                assert_eq!(v["bench"], "match", "{v}");
                assert_eq!(v["size"], 8, "{v}");
                assert_eq!(v["push"], push, "{v}");
                positive(v, "latency_us_median");
                (
                    v["queue"].as_str().unwrap_or_default().to_string(),
                    v["outstanding"].as_u64().unwrap_or(u64::MAX),
                )
            })
            .collect();
        let want: Vec<(String, u64)> = ["posted", "wildcard", "unexpected"]
            .iter()
            .flat_map(|q| [300, 0, 5].map(|n| (q.to_string(), n)))
            .collect();
        assert_eq!(got, want, "{transport}, push {push}");
    }
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

/// `quiver bench logp` over `transport`: one result per reliability scheme in
/// `schemes` (none for shared memory), each with its overheads, gap and latency, and L
/// where it is separable (else left out, which happens only where o_s + o_r exceeds
/// the latency).
fn check_logp(transport: &str, schemes: &[&str]) {
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
    assert_eq!(lines.len(), schemes.len().max(1), "{lines:?}");
    for (i, v) in lines.iter().enumerate() {
        assert_eq!(v["bench"], "logp");
        assert_eq!(v["transport"], transport);
        if let Some(scheme) = schemes.get(i) {
            assert_eq!(v["reliability"], *scheme, "{v}");
        }
        assert_eq!(v["size"], 8);
        assert_eq!(v["iters"], 300);
        for key in ["o_s_us", "o_r_us", "g_us", "latency_us"] {
            positive(v, key);
        }
        let num = |k: &str| v[k].as_f64().unwrap();
        let rest = num("latency_us") - num("o_s_us") - num("o_r_us");
        match v.get("L_us").and_then(|l| l.as_f64()) {
            Some(l) => assert!(l >= 0.0 && (l - rest).abs() < 0.01, "{v}"),
            None => assert!(rest < 0.0, "L left out where it is separable: {v}"),
        }
        assert!(v.get("latency_us_median").is_none(), "{v}");
    }
}

#[test]
fn logp_over_shm() {
    check_logp("shm", &[]);
}

/// Without --reliability, every scheme.
#[test]
fn logp_over_udp() {
    check_logp("udp", &["none", "host", "offload"]);
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

/// Runs `quiver ARGS` (not a benchmark) and returns its output, failing on an error.
fn quiver(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quiver"));
    cmd.args(args);
    for var in [
        "QUIVER_TRANSPORT",
        "QUIVER_WAIT",
        "QUIVER_RELIABILITY",
        "QUIVER_PUSH",
        "QUIVER_BTP1",
        "QUIVER_BTP2",
        "QUIVER_CMA",
        "QUIVER_MAX_MESSAGE",
        "QUIVER_WINDOW",
        "QUIVER_ETH_RING",
    ] {
        cmd.env_remove(var);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run quiver");
    assert!(
        out.status.success(),
        "quiver {args:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn check_tagged_fields(v: &serde_json::Value, push: &str) {
    assert_eq!(v["api"], "tagged", "{v}");
    assert_eq!(v["push"], push, "{v}");
    if push == "pull" {
        assert!(v["btp1"].is_u64() && v["btp2"].is_u64(), "{v}");
    } else {
        assert!(v.get("btp1").is_none(), "{v}");
    }
}

#[test]
fn tagged_pingpong_every_push_mode() {
    // The default push mode is the library's: pull.
    let out = quiver_bench(&[
        "pingpong",
        "--api",
        "tagged",
        "--sizes",
        "0,8,64K,1M",
        "--iters",
        "50",
    ]);
    let lines = json_lines(&out);
    let sizes: Vec<u64> = lines.iter().map(|v| v["size"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [0, 8, 65536, 1 << 20], "{lines:?}");
    for v in &lines {
        assert_eq!(v["bench"], "pingpong");
        assert_eq!(v["transport"], "shm");
        check_tagged_fields(v, "pull");
        assert_eq!(v["btp1"], quiver::config::DEFAULT_BTP1, "{v}");
        positive(v, "latency_us_median");
    }
    for push in ["zero", "all"] {
        let out = quiver_bench(&[
            "pingpong", "--api", "tagged", "--push", push, "--sizes", "8,64K", "--iters", "50",
        ]);
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 2, "{lines:?}");
        for v in &lines {
            check_tagged_fields(v, push);
            positive(v, "latency_us_median");
        }
    }
}

#[test]
fn tagged_pingpong_64m_and_udp() {
    // Tagged messages travel in chunks: 64 MiB works with the default maximum message.
    let out = quiver_bench(&[
        "pingpong", "--api", "tagged", "--sizes", "64M", "--iters", "3", "--warmup", "1",
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["size"], 64u64 << 20);
    positive(&lines[0], "latency_us_median");
    let out = quiver_bench(&[
        "pingpong",
        "--api",
        "tagged",
        "--transport",
        "udp",
        "--sizes",
        "8,64K",
        "--iters",
        "50",
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for v in &lines {
        assert_eq!(v["transport"], "udp");
        check_tagged_fields(v, "pull");
        positive(v, "latency_us_median");
    }
}

/// GAMMA's ports: each benchmark with the ports API (and with the extra receive copy),
/// over shared memory and UDP, in jobs of two processes; every received length is
/// checked by the benchmark itself.
#[test]
fn ports_pingpong_bw_bibw_and_rate() {
    for (bench, transport, sizes, copy) in [
        ("pingpong", "shm", "0,8,64K", false),
        ("pingpong", "udp", "8,4K", true),
        ("bw", "shm", "1K,64K", true),
        ("bw", "udp", "4K", false),
        ("bibw", "shm", "4K", false),
        ("rate", "shm", "8", false),
    ] {
        let mut args = vec![
            bench,
            "--api",
            "ports",
            "--transport",
            transport,
            "--sizes",
            sizes,
            "--iters",
            "20",
        ];
        if copy {
            args.push("--ports-copy");
        }
        let lines = json_lines(&quiver_bench(&args));
        assert_eq!(
            lines.len(),
            sizes.split(',').count(),
            "{bench} {transport}: {lines:?}"
        );
        for v in &lines {
            assert_eq!(v["bench"], bench);
            assert_eq!(v["api"], "ports");
            assert_eq!(v["transport"], transport);
            if bench == "pingpong" {
                positive(v, "latency_us_median");
            } else {
                positive(v, "bandwidth_MBps");
            }
        }
    }
}

#[test]
fn tagged_bw_and_bibw() {
    for (bench, transport, push) in [
        ("bw", "shm", "zero"),
        ("bw", "shm", "all"),
        ("bw", "udp", "pull"),
        ("bibw", "shm", "pull"),
        // Both ranks send the acknowledgement: in push mode zero a blocking send waits
        // for its receiver, so they must not both send first.
        ("bibw", "shm", "zero"),
        ("bibw", "udp", "zero"),
    ] {
        let out = quiver_bench(&[
            bench,
            "--api",
            "tagged",
            "--push",
            push,
            "--transport",
            transport,
            "--sizes",
            "1K,64K",
            "--iters",
            "5",
        ]);
        let lines = json_lines(&out);
        assert_eq!(lines.len(), 2, "{bench} {transport} {push}: {lines:?}");
        for v in &lines {
            assert_eq!(v["bench"], bench);
            assert_eq!(v["transport"], transport);
            check_tagged_fields(v, push);
            positive(v, "bandwidth_MBps");
            positive(v, "window");
        }
    }
    // 64 MiB in a window of one.
    let out = quiver_bench(&[
        "bw", "--api", "tagged", "--sizes", "64M", "--iters", "2", "--warmup", "1",
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines[0]["window"], 1, "{lines:?}");
    positive(&lines[0], "bandwidth_MBps");
}

#[test]
fn early_late_rows_per_mode_and_receiver() {
    let out = quiver_bench(&["early-late", "--sizes", "8,16K", "--iters", "40"]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 3 * 2 * 2, "{lines:?}");
    let mut seen = Vec::new();
    for v in &lines {
        assert_eq!(v["bench"], "early-late", "{v}");
        assert_eq!(v["api"], "tagged", "{v}");
        assert_eq!(v["transport"], "shm", "{v}");
        assert_eq!(v["iters"], 40, "{v}");
        let mode = v["mode"].as_str().expect("mode").to_string();
        assert_eq!(v["push"], mode.as_str(), "{v}");
        let receiver = v["receiver"].as_str().expect("receiver").to_string();
        assert!(receiver == "early" || receiver == "late", "{v}");
        let x = positive(v, "compute_x_us");
        let y = positive(v, "compute_y_us");
        let c = positive(v, "compute_us");
        // The compute on the critical path: 2x early, x + y late; early computes longer
        // before sending than the receiver before receiving, late the other way round.
        if receiver == "early" {
            assert!((c - 2.0 * x).abs() < 0.01 && x > y, "{v}");
        } else {
            assert!((c - x - y).abs() < 0.01 && y > x, "{v}");
        }
        let median = v["latency_us_median"]
            .as_f64()
            .unwrap_or_else(|| panic!("latency_us_median in {v}"));
        // Ordered statistics, not a speed: a loaded machine may stretch any of them
        // (a bound like "under 100x the compute" failed with a build running beside).
        let min = v["latency_us_min"].as_f64().expect("latency_us_min");
        let max = v["latency_us_max"].as_f64().expect("latency_us_max");
        assert!(0.0 <= min && min <= median && median <= max, "{v}");
        for key in ["pong_late_fraction", "ping_late_fraction"] {
            let f = v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"));
            assert!((0.0..=1.0).contains(&f), "{v}");
        }
        let key = (mode, receiver);
        if seen.last() != Some(&key) {
            assert!(
                !seen.contains(&key),
                "rows of {key:?} not together: {lines:?}"
            );
            seen.push(key);
        }
    }
    let modes: Vec<&str> = seen.iter().step_by(2).map(|k| k.0.as_str()).collect();
    assert_eq!(modes, ["zero", "all", "pull"]);

    // --push runs one mode only.
    let out = quiver_bench(&[
        "early-late",
        "--push",
        "pull",
        "--sizes",
        "0",
        "--iters",
        "20",
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().all(|v| v["mode"] == "pull"), "{lines:?}");
}

#[test]
fn tune_btp_chooses_and_says_how_to_set() {
    let out = quiver_bench(&["tune-btp", "--iters", "10", "--warmup", "2"]);
    let lines = json_lines(&out);
    let (rows, last) = lines.split_at(lines.len() - 1);
    let choice = &last[0];
    assert_eq!(choice["bench"], "tune-btp");
    assert_eq!(choice["chosen"], true, "{choice}");
    assert_eq!(choice["transport"], "shm");
    let btp1 = choice["btp1"].as_u64().expect("btp1");
    let btp2 = choice["btp2"].as_u64().expect("btp2");
    assert_eq!(
        choice["env"],
        format!("QUIVER_BTP1={btp1} QUIVER_BTP2={btp2}"),
        "{choice}"
    );
    let step1: Vec<_> = rows.iter().filter(|v| v["step"] == 1).collect();
    let step2: Vec<_> = rows.iter().filter(|v| v["step"] == 2).collect();
    assert_eq!(step1.len() + step2.len(), rows.len(), "{rows:?}");
    assert!(!step1.is_empty() && !step2.is_empty(), "{rows:?}");
    for v in &step1 {
        assert_eq!(v["btp1"], 0, "{v}");
        // Step 1's sizes lie beyond the pushed bytes.
        assert!(
            v["size"].as_u64().unwrap() > v["btp2"].as_u64().unwrap(),
            "{v}"
        );
    }
    for v in &step2 {
        assert_eq!(v["btp2"], btp2, "{v}");
    }
    for v in rows {
        assert_eq!(v["bench"], "tune-btp");
        assert_eq!(v["api"], "tagged");
        assert_eq!(v["push"], "pull");
        assert_eq!(v["iters"], 10, "{v}");
        positive(v, "latency_us_median");
        assert!(positive(v, "score") >= 1.0, "{v}");
    }
    // The chosen values are among the candidates, with the lowest score.
    let best2 = step1
        .iter()
        .min_by(|a, b| {
            a["score"]
                .as_f64()
                .unwrap()
                .total_cmp(&b["score"].as_f64().unwrap())
        })
        .unwrap();
    assert_eq!(
        best2["score"],
        step1.iter().find(|v| v["btp2"] == btp2).unwrap()["score"]
    );
    assert!(step2.iter().any(|v| v["btp1"] == btp1));
}

#[test]
fn info_reports_configuration_and_paths() {
    let out = quiver(&["info", "--format", "json"], &[]);
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("one JSON object");
    assert_eq!(v["transport"], "auto");
    assert_eq!(v["push"], "pull");
    assert_eq!(v["btp1"], quiver::config::DEFAULT_BTP1);
    assert_eq!(v["btp2"], quiver::config::DEFAULT_BTP2);
    assert_eq!(v["cma"], true);
    assert!(v["cma_check"]["works"].is_boolean(), "{v}");
    assert!(v["cma_check"]["detail"].is_string(), "{v}");
    for key in [
        "wait",
        "reliability",
        "max_message",
        "pool_size",
        "tagged_chunk",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {v}");
    }
    assert!(v["window"].is_null() && v["eth_ring"].is_null(), "{v}");
    let paths = v["tagged_paths"].as_array().expect("tagged_paths");
    let kinds: Vec<&str> = paths.iter().map(|p| p["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["eager", "pipelined", "pushed+pulled"], "{v}");
    let b1 = quiver::config::DEFAULT_BTP1;
    assert_eq!(paths[0]["to"], b1);
    let pipe = |v: &serde_json::Value| {
        let max = |k: &str| v[k].as_u64().unwrap();
        max("pipeline_max_shm").max(max("pipeline_max_net"))
    };
    assert!(pipe(&v) > b1 as u64, "{v}");
    assert_eq!(paths[1]["to"], pipe(&v));
    assert_eq!(paths[2]["from"], pipe(&v) + 1);
    assert!(paths[2]["to"].is_null());
    assert!(
        v["selection"].as_array().is_some_and(|s| !s.is_empty()),
        "{v}"
    );
    // QUIVER_PIPELINE_MAX is read: 0, no pipeline.
    let out = quiver(
        &["info", "--format", "json"],
        &[("QUIVER_PIPELINE_MAX", "0")],
    );
    let v0: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let kinds: Vec<&str> = v0["tagged_paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["eager", "pushed", "pushed+pulled"], "{v0}");
    assert_eq!(v0["pipeline_max_set"], true);
    assert_eq!(paths[2]["pull_other_node"], "request");
    let cma_works = v["cma_check"]["works"] == true;
    assert_eq!(
        paths[2]["pull_same_node"],
        if cma_works { "cma" } else { "request" },
        "{v}"
    );

    // The variables are read: push mode, BTP, CMA off, UDP.
    let out = quiver(
        &["info", "--format", "json"],
        &[
            ("QUIVER_PUSH", "zero"),
            ("QUIVER_CMA", "off"),
            ("QUIVER_TRANSPORT", "udp"),
        ],
    );
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(v["push"], "zero");
    assert_eq!(v["cma"], false);
    assert_eq!(v["transport"], "udp");
    let paths = v["tagged_paths"].as_array().unwrap();
    assert_eq!(paths.last().unwrap()["kind"], "pulled");
    assert_eq!(paths.last().unwrap()["pull_same_node"], "request");

    let out = quiver(
        &["info"],
        &[
            ("QUIVER_BTP1", "80"),
            ("QUIVER_BTP2", "680"),
            ("QUIVER_PIPELINE_MAX", "0"),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("QUIVER_BTP1") && text.contains("80 B"),
        "{text}"
    );
    assert!(text.contains("761 B and more"), "{text}");

    // The network window and the eth receive ring, set and shown.
    let set = [("QUIVER_ETH_RING", "512"), ("QUIVER_WINDOW", "32")];
    let out = quiver(&["info", "--format", "json"], &set);
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("one JSON object");
    assert_eq!(
        (v["eth_ring"].as_u64(), v["window"].as_u64()),
        (Some(512), Some(32)),
        "{v}"
    );
    let text = String::from_utf8_lossy(&quiver(&["info"], &set).stdout).to_string();
    assert!(
        text.contains("QUIVER_ETH_RING") && text.contains("512 frames"),
        "{text}"
    );

    // A bad variable is an error.
    let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
        .args(["info"])
        .env("QUIVER_PUSH", "some")
        .output()
        .expect("run quiver");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("QUIVER_PUSH"));
}

#[test]
fn api_and_push_combinations_are_checked_before_launching() {
    for (args, says) in [
        (&["logp", "--api", "tagged"][..], "logp"),
        (&["pingpong", "--push", "zero"][..], "--api tagged"),
        (&["early-late", "--api", "dm"][..], "tagged"),
        (&["tune-btp", "--sizes", "8"][..], "--sizes"),
        (&["tune-btp", "--push", "all"][..], "pull"),
        (&["logp", "--api", "ports"][..], "--api ports runs"),
        (
            &["pingpong", "--api", "ports", "--push", "all"][..],
            "--api tagged",
        ),
        (&["pingpong", "--ports-copy"][..], "--api ports"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_quiver"))
            .arg("bench")
            .args(args)
            .env_remove("QUIVER_RANK")
            .output()
            .expect("run quiver");
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

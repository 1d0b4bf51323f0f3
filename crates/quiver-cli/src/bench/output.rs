//! Every way `quiver bench` presents results: the result record ([`BenchResult`], also
//! the JSON line exchanged between a suite and its jobs), aligned tables, CSV and JSON
//! lines ([`Reporter`]), and the suite's summary ([`SummaryRow`]). Benchmarks produce
//! records; only this module turns them into text.

use super::Bench;
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Output format of `--format`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns, one table per benchmark and transport.
    Table,
    /// One JSON object per line.
    Json,
    /// A header line, then one row per result.
    Csv,
}

impl Format {
    /// Name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Format::Table => "table",
            Format::Json => "json",
            Format::Csv => "csv",
        }
    }
}

/// The result of one benchmark at one message size.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct BenchResult {
    /// Benchmark.
    pub bench: Bench,
    /// Transport between the two ranks (`shm`, `udp`).
    pub transport: String,
    /// Wait mode of blocking reads (`spin`, `block`, `hybrid:US`).
    pub wait: String,
    /// Reliability of the network channel (`none`, `host`); absent over shared memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reliability: Option<String>,
    /// Message API (`tagged`); absent for Directed Point endpoints (`dm`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    /// Push mode of tagged messages (`zero`, `all`, `pull`); absent for `dm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<String>,
    /// Push mode under test (early-late; the same as `push`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Which side is posted first (early-late): `early` (the receive is posted before
    /// the message arrives) or `late` (after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receiver: Option<String>,
    /// Queue of the outstanding operations (match): `posted`, `wildcard` or `unexpected`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Operations outstanding in that queue on each rank during the ping-pong (match).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outstanding: Option<u32>,
    /// Step of tune-btp: 1 (BTP(2) varied, BTP(1) = 0) or 2 (BTP(1) varied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u8>,
    /// BTP(1) in force (tagged, push mode pull).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub btp1: Option<u64>,
    /// BTP(2) in force (tagged, push mode pull).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub btp2: Option<u64>,
    /// Message size in bytes.
    pub size: u64,
    /// Measured iterations (round trips or windows).
    pub iters: u64,
    /// Warm-up iterations before them.
    pub warmup: u64,
    /// Messages per window (bandwidth benchmarks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    /// One-way latency, median (pingpong).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us_median: Option<f64>,
    /// One-way latency, mean of the middle 80 % (pingpong).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us_avg80: Option<f64>,
    /// One-way latency, 99th percentile (pingpong).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us_p99: Option<f64>,
    /// One-way latency, minimum (pingpong).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us_min: Option<f64>,
    /// One-way latency, maximum (pingpong).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us_max: Option<f64>,
    /// Bandwidth, mean of the middle 80 % of the per-window samples, in 10^6 bytes/s.
    #[serde(
        rename = "bandwidth_MBps",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bandwidth_mbps: Option<f64>,
    /// Bandwidth, median of the per-window samples, in 10^6 bytes/s.
    #[serde(
        rename = "bandwidth_MBps_median",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub bandwidth_mbps_median: Option<f64>,
    /// Message rate, mean of the middle 80 % of the per-window samples, messages/s
    /// (rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_per_s: Option<f64>,
    /// Message rate, median of the per-window samples, messages/s (rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_per_s_median: Option<f64>,
    /// Send overhead per message, mean of the middle 80 %, us (logp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub o_s_us: Option<f64>,
    /// Receive overhead per message, mean of the middle 80 %, us (logp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub o_r_us: Option<f64>,
    /// Gap per message (time of a back-to-back burst / messages), us (logp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub g_us: Option<f64>,
    /// L = latency - o_s - o_r, us; may be small or negative (logp).
    #[serde(rename = "L_us", default, skip_serializing_if = "Option::is_none")]
    pub l_us: Option<f64>,
    /// End-to-end one-way latency, median of round trip / 2, us (logp).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_us: Option<f64>,
    /// Compute x of the iteration, us (early-late).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_x_us: Option<f64>,
    /// Compute y of the iteration, us (early-late).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_y_us: Option<f64>,
    /// Compute on the critical path, subtracted from the measured time, us (early-late:
    /// 2x early, x + y late).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_us: Option<f64>,
    /// Fraction of measured iterations in which the pong's receive found the message
    /// already arrived (early-late: about 0 early, 1 late).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pong_late_fraction: Option<f64>,
    /// The same for the ping's receive of the reply (early-late: about 0 in both tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ping_late_fraction: Option<f64>,
    /// Score of the candidate BTP value (tune-btp): the mean over the sizes of its
    /// median latency divided by the best candidate's at that size (1 = best everywhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
}

impl BenchResult {
    /// Sets the latency figures (median, avg80, p99, min, max; us) from a summary of
    /// one-way samples in ns.
    pub fn set_latency(&mut self, s: &super::stats::Summary) {
        let us = |ns: f64| Some(round(ns / 1e3, 4));
        self.latency_us_median = us(s.median);
        self.latency_us_avg80 = us(s.avg80);
        self.latency_us_p99 = us(s.p99);
        self.latency_us_min = us(s.min);
        self.latency_us_max = us(s.max);
    }

    /// A record with the identifying fields set and no measurements.
    pub fn new(
        bench: Bench,
        transport: &str,
        wait: &str,
        size: usize,
        iters: u64,
        warmup: u64,
    ) -> Self {
        BenchResult {
            bench,
            transport: transport.to_string(),
            wait: wait.to_string(),
            reliability: None,
            api: None,
            push: None,
            mode: None,
            receiver: None,
            queue: None,
            outstanding: None,
            step: None,
            btp1: None,
            btp2: None,
            size: size as u64,
            iters,
            warmup,
            window: None,
            latency_us_median: None,
            latency_us_avg80: None,
            latency_us_p99: None,
            latency_us_min: None,
            latency_us_max: None,
            bandwidth_mbps: None,
            bandwidth_mbps_median: None,
            messages_per_s: None,
            messages_per_s_median: None,
            o_s_us: None,
            o_r_us: None,
            g_us: None,
            l_us: None,
            latency_us: None,
            compute_x_us: None,
            compute_y_us: None,
            compute_us: None,
            pong_late_fraction: None,
            ping_late_fraction: None,
            score: None,
        }
    }

    /// The value a chart shows: median latency (us) or bandwidth (MB/s); none for logp,
    /// which charts leave out.
    pub fn headline(&self) -> Option<f64> {
        if self.bench.is_bandwidth() {
            self.bandwidth_mbps
        } else if self.bench.is_latency() {
            self.latency_us_median
        } else {
            None
        }
    }

    /// One JSON line (no newline).
    pub fn to_json(&self) -> String {
        // Serializing plain fields (strings, integers, finite or non-finite floats) into
        // a String cannot fail; fall back to a minimal object all the same.
        serde_json::to_string(self).unwrap_or_else(|e| {
            format!(
                "{{\"bench\":\"{}\",\"size\":{},\"error\":{:?}}}",
                self.bench,
                self.size,
                e.to_string()
            )
        })
    }
}

/// Rounds `v` to `decimals` decimal places (results carry no false precision).
pub fn round(v: f64, decimals: i32) -> f64 {
    let m = 10f64.powi(decimals);
    (v * m).round() / m
}

/// CSV columns, in order.
/// Set in the environment of a benchmark job whose CSV continues an earlier job's: its
/// rows come without the header.
pub const CSV_CONTINUES: &str = "QUIVER_BENCH_CSV_CONTINUES";

pub const CSV_COLUMNS: [&str; 30] = [
    "bench",
    "transport",
    "wait",
    "reliability",
    "size",
    "iters",
    "warmup",
    "window",
    "latency_us_median",
    "latency_us_avg80",
    "latency_us_p99",
    "latency_us_min",
    "latency_us_max",
    "bandwidth_MBps",
    "bandwidth_MBps_median",
    "o_s_us",
    "o_r_us",
    "g_us",
    "L_us",
    "latency_us",
    "api",
    "push",
    "receiver",
    "btp1",
    "btp2",
    "compute_us",
    "messages_per_s",
    "messages_per_s_median",
    "queue",
    "outstanding",
];

/// What a table groups rows by: benchmark, transport, wait mode, API, push mode,
/// receiver or queue, BTP values.
type GroupKey = (
    Bench,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<(u64, u64)>,
);

/// Turns results into text for stdout, one result at a time, adding headers where
/// needed (a CSV header once; a table title and header whenever the benchmark, the
/// transport, the API, the push mode or the receiver changes).
#[derive(Debug)]
pub struct Reporter {
    format: Format,
    last: Option<GroupKey>,
    csv_header_done: bool,
}

fn num(v: Option<f64>, decimals: usize) -> String {
    match v {
        Some(x) => format!("{x:.decimals$}"),
        None => "-".to_string(),
    }
}

fn csv_num(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.4}")).unwrap_or_default()
}

impl Reporter {
    /// A reporter for `format`.
    pub fn new(format: Format) -> Reporter {
        Reporter {
            format,
            last: None,
            // A later job of one command (logp's schemes) continues the first's CSV.
            csv_header_done: std::env::var_os(CSV_CONTINUES).is_some(),
        }
    }

    /// The lines (each ending in a newline) that present `r`.
    pub fn render(&mut self, r: &BenchResult) -> String {
        let mut out = String::new();
        match self.format {
            Format::Json => {
                out.push_str(&r.to_json());
                out.push('\n');
            }
            Format::Csv => {
                if !self.csv_header_done {
                    out.push_str(&CSV_COLUMNS.join(","));
                    out.push('\n');
                    self.csv_header_done = true;
                }
                let cells = [
                    r.bench.name().to_string(),
                    r.transport.clone(),
                    r.wait.clone(),
                    r.reliability.clone().unwrap_or_default(),
                    r.size.to_string(),
                    r.iters.to_string(),
                    r.warmup.to_string(),
                    r.window.map(|w| w.to_string()).unwrap_or_default(),
                    csv_num(r.latency_us_median),
                    csv_num(r.latency_us_avg80),
                    csv_num(r.latency_us_p99),
                    csv_num(r.latency_us_min),
                    csv_num(r.latency_us_max),
                    csv_num(r.bandwidth_mbps),
                    csv_num(r.bandwidth_mbps_median),
                    csv_num(r.o_s_us),
                    csv_num(r.o_r_us),
                    csv_num(r.g_us),
                    csv_num(r.l_us),
                    csv_num(r.latency_us),
                    r.api.clone().unwrap_or_default(),
                    r.push.clone().unwrap_or_default(),
                    r.receiver.clone().unwrap_or_default(),
                    r.btp1.map(|v| v.to_string()).unwrap_or_default(),
                    r.btp2.map(|v| v.to_string()).unwrap_or_default(),
                    csv_num(r.compute_us),
                    csv_num(r.messages_per_s),
                    csv_num(r.messages_per_s_median),
                    r.queue.clone().unwrap_or_default(),
                    r.outstanding.map(|n| n.to_string()).unwrap_or_default(),
                ];
                out.push_str(&cells.join(","));
                out.push('\n');
            }
            Format::Table => {
                let key = (
                    r.bench,
                    r.transport.clone(),
                    r.wait.clone(),
                    r.api.clone(),
                    r.push.clone(),
                    r.receiver.clone().or_else(|| r.queue.clone()),
                    r.btp1.zip(r.btp2),
                );
                if self.last.as_ref() != Some(&key) {
                    if self.last.is_some() {
                        out.push('\n');
                    }
                    out.push_str(&table_title(r));
                    out.push_str(&table_header(r.bench));
                    self.last = Some(key);
                }
                if r.bench == Bench::Logp {
                    let _ = writeln!(
                        out,
                        "{:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>8}",
                        r.size,
                        num(r.o_s_us, 3),
                        num(r.o_r_us, 3),
                        num(r.g_us, 3),
                        r.l_us
                            .map_or_else(|| "n/s".to_string(), |l| format!("{l:.3}")),
                        num(r.latency_us, 3),
                        r.iters
                    );
                } else if r.bench == Bench::EarlyLate {
                    let _ = writeln!(
                        out,
                        "{:>10} {:>12} {:>12} {:>12} {:>9} {:>9} {:>9} {:>9} {:>7}",
                        r.size,
                        num(r.latency_us_median, 2),
                        num(r.latency_us_avg80, 2),
                        num(r.latency_us_p99, 2),
                        num(r.compute_x_us, 1),
                        num(r.compute_y_us, 1),
                        num(r.pong_late_fraction, 2),
                        num(r.ping_late_fraction, 2),
                        r.iters
                    );
                } else if r.bench == Bench::Match {
                    let _ = writeln!(
                        out,
                        "{:>10} {:>11} {:>12} {:>12} {:>12} {:>8}",
                        r.size,
                        r.outstanding
                            .map(|n| n.to_string())
                            .unwrap_or_else(|| "-".into()),
                        num(r.latency_us_median, 3),
                        num(r.latency_us_avg80, 3),
                        num(r.latency_us_p99, 3),
                        r.iters
                    );
                } else if r.bench == Bench::Rate {
                    let _ = writeln!(
                        out,
                        "{:>10} {:>14} {:>14} {:>10} {:>8} {:>8}",
                        r.size,
                        num(r.messages_per_s, 0),
                        num(r.messages_per_s_median, 0),
                        num(r.bandwidth_mbps, 1),
                        r.window
                            .map(|w| w.to_string())
                            .unwrap_or_else(|| "-".into()),
                        r.iters
                    );
                } else if r.bench.is_bandwidth() {
                    let _ = writeln!(
                        out,
                        "{:>10} {:>12} {:>12} {:>8} {:>8}",
                        r.size,
                        num(r.bandwidth_mbps, 1),
                        num(r.bandwidth_mbps_median, 1),
                        r.window
                            .map(|w| w.to_string())
                            .unwrap_or_else(|| "-".into()),
                        r.iters
                    );
                } else {
                    let _ = writeln!(
                        out,
                        "{:>10} {:>12} {:>12} {:>12} {:>8}",
                        r.size,
                        num(r.latency_us_median, 2),
                        num(r.latency_us_avg80, 2),
                        num(r.latency_us_p99, 2),
                        r.iters
                    );
                }
            }
        }
        out
    }
}

fn table_title(r: &BenchResult) -> String {
    let what = match r.bench {
        Bench::Pingpong => "one-way latency (round trip / 2)",
        Bench::Bw => "uni-directional bandwidth, MB/s = 10^6 B/s",
        Bench::Bibw => "bi-directional bandwidth (both directions), MB/s = 10^6 B/s",
        Bench::Rate => "message rate (windows of messages, each acknowledged), messages/s",
        Bench::Logp => {
            "LogP parameters per message, us (L = latency - o_s - o_r; n/s: not separable, \
             o_s + o_r exceed the latency)"
        }
        Bench::EarlyLate => {
            "time of an iteration less its compute on the critical path (2x early, x+y late), \
             us; late = fraction of receives that found the message arrived"
        }
        Bench::TuneBtp => "one-way latency (round trip / 2)",
        Bench::Match => {
            "one-way latency (round trip / 2) with other operations outstanding on each rank"
        }
    };
    let mut api = String::new();
    if let Some(a) = &r.api {
        let _ = write!(api, ", {a} api");
    }
    if let Some(p) = &r.push {
        let _ = write!(api, ", push {p}");
        if let (Some(b1), Some(b2)) = (r.btp1, r.btp2) {
            let _ = write!(api, " (BTP1 {b1}, BTP2 {b2})");
        }
    }
    if let Some(rcv) = &r.receiver {
        let _ = write!(api, ", {rcv} receiver");
    }
    if let Some(q) = &r.queue {
        let _ = write!(api, ", {q} queue");
    }
    if let Some(rel) = &r.reliability {
        let _ = write!(api, ", reliability {rel}");
    }
    format!(
        "# {} over {}, wait {}{}: {}\n",
        r.bench, r.transport, r.wait, api, what
    )
}

fn table_header(bench: Bench) -> String {
    if bench == Bench::EarlyLate {
        format!(
            "{:>10} {:>12} {:>12} {:>12} {:>9} {:>9} {:>9} {:>9} {:>7}\n",
            "size(B)",
            "median(us)",
            "avg80(us)",
            "p99(us)",
            "x(us)",
            "y(us)",
            "late@pong",
            "late@ping",
            "iters"
        )
    } else if bench == Bench::Logp {
        format!(
            "{:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>8}\n",
            "size(B)", "o_s(us)", "o_r(us)", "g(us)", "L(us)", "latency(us)", "iters"
        )
    } else if bench == Bench::Match {
        format!(
            "{:>10} {:>11} {:>12} {:>12} {:>12} {:>8}\n",
            "size(B)", "outstanding", "median(us)", "avg80(us)", "p99(us)", "iters"
        )
    } else if bench == Bench::Rate {
        format!(
            "{:>10} {:>14} {:>14} {:>10} {:>8} {:>8}\n",
            "size(B)", "avg80 msg/s", "median msg/s", "MB/s", "window", "iters"
        )
    } else if bench.is_bandwidth() {
        format!(
            "{:>10} {:>12} {:>12} {:>8} {:>8}\n",
            "size(B)", "avg80 MB/s", "median MB/s", "window", "iters"
        )
    } else {
        format!(
            "{:>10} {:>12} {:>12} {:>12} {:>8}\n",
            "size(B)", "median(us)", "avg80(us)", "p99(us)", "iters"
        )
    }
}

/// One line of the suite's summary: the figures of one transport.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct SummaryRow {
    /// Always `"summary"`, so that JSON consumers can tell these lines apart.
    pub bench: &'static str,
    /// Transport.
    pub transport: String,
    /// Median one-way latency of 8-byte messages, us.
    #[serde(rename = "latency_us_median_8B")]
    pub latency_us_median_8b: Option<f64>,
    /// 99th percentile one-way latency of 8-byte messages, us.
    #[serde(rename = "latency_us_p99_8B")]
    pub latency_us_p99_8b: Option<f64>,
    /// Bandwidth with 64 KiB messages, MB/s.
    #[serde(rename = "bandwidth_MBps_64K")]
    pub bandwidth_mbps_64k: Option<f64>,
    /// Bandwidth with 1 MiB messages, MB/s.
    #[serde(rename = "bandwidth_MBps_1M")]
    pub bandwidth_mbps_1m: Option<f64>,
}

/// Summary rows, one per transport in order of first appearance.
pub fn summarize(results: &[BenchResult]) -> Vec<SummaryRow> {
    let mut rows: Vec<SummaryRow> = Vec::new();
    for r in results {
        let idx = match rows.iter().position(|row| row.transport == r.transport) {
            Some(i) => i,
            None => {
                rows.push(SummaryRow {
                    bench: "summary",
                    transport: r.transport.clone(),
                    latency_us_median_8b: None,
                    latency_us_p99_8b: None,
                    bandwidth_mbps_64k: None,
                    bandwidth_mbps_1m: None,
                });
                rows.len() - 1
            }
        };
        let row = &mut rows[idx];
        match (r.bench, r.size) {
            (Bench::Pingpong, 8) => {
                row.latency_us_median_8b = r.latency_us_median;
                row.latency_us_p99_8b = r.latency_us_p99;
            }
            (Bench::Bw, 65_536) => row.bandwidth_mbps_64k = r.bandwidth_mbps,
            (Bench::Bw, 1_048_576) => row.bandwidth_mbps_1m = r.bandwidth_mbps,
            _ => {}
        }
    }
    rows
}

/// The summary as text: a table (for `table` and `csv`) or JSON lines (for `json`).
pub fn render_summary(format: Format, rows: &[SummaryRow]) -> String {
    let mut out = String::new();
    if format == Format::Json {
        for row in rows {
            if let Ok(line) = serde_json::to_string(row) {
                out.push_str(&line);
                out.push('\n');
            }
        }
        return out;
    }
    out.push_str("# summary: one-way latency of 8 B messages; bandwidth (bw, avg80) in MB/s\n");
    let _ = writeln!(
        out,
        "{:>9} {:>14} {:>14} {:>12} {:>12}",
        "transport", "8B median(us)", "8B p99(us)", "64K MB/s", "1M MB/s"
    );
    for row in rows {
        let _ = writeln!(
            out,
            "{:>9} {:>14} {:>14} {:>12} {:>12}",
            row.transport,
            num(row.latency_us_median_8b, 2),
            num(row.latency_us_p99_8b, 2),
            num(row.bandwidth_mbps_64k, 1),
            num(row.bandwidth_mbps_1m, 1)
        );
    }
    out
}

/// Where the summary goes: stdout, or stderr (so that CSV on stdout stays one table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// The summary of `results` as printed after a suite: its text and its stream.
pub fn summary_block(format: Format, results: &[BenchResult]) -> (String, Stream) {
    let text = render_summary(format, &summarize(results));
    match format {
        Format::Json => (text, Stream::Stdout),
        Format::Table => (format!("\n{text}"), Stream::Stdout),
        Format::Csv => (format!("\n{text}"), Stream::Stderr),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pingpong(size: usize, median: f64) -> BenchResult {
        let mut r = BenchResult::new(Bench::Pingpong, "shm", "spin", size, 200, 20);
        r.latency_us_median = Some(median);
        r.latency_us_avg80 = Some(median * 1.1);
        r.latency_us_p99 = Some(median * 3.0);
        r.latency_us_min = Some(median * 0.9);
        r.latency_us_max = Some(median * 10.0);
        r
    }

    fn bw(transport: &str, size: usize, mbps: f64) -> BenchResult {
        let mut r = BenchResult::new(Bench::Bw, transport, "spin", size, 20, 2);
        r.window = Some(64);
        r.bandwidth_mbps = Some(mbps);
        r.bandwidth_mbps_median = Some(mbps);
        r
    }

    #[test]
    fn json_line_has_required_keys() {
        let mut rep = Reporter::new(Format::Json);
        let line = rep.render(&pingpong(8, 0.5));
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        for key in [
            "bench",
            "transport",
            "size",
            "latency_us_median",
            "latency_us_p99",
            "latency_us_avg80",
            "iters",
            "wait",
        ] {
            assert!(v.get(key).is_some(), "missing {key} in {line}");
        }
        assert_eq!(v["bench"], "pingpong");
        assert_eq!(v["size"], 8);
        assert!(v.get("bandwidth_MBps").is_none());

        let line = rep.render(&bw("udp", 4096, 812.5));
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        for key in [
            "bench",
            "transport",
            "size",
            "bandwidth_MBps",
            "iters",
            "wait",
            "window",
        ] {
            assert!(v.get(key).is_some(), "missing {key} in {line}");
        }
        assert_eq!(v["bandwidth_MBps"], 812.5);
        // Round trip: the suite reads these lines back.
        let back: BenchResult = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(back, bw("udp", 4096, 812.5));
    }

    #[test]
    fn csv_has_one_header_and_fixed_columns() {
        let mut rep = Reporter::new(Format::Csv);
        let mut text = rep.render(&pingpong(0, 0.3));
        text += &rep.render(&bw("shm", 65536, 5000.0));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], CSV_COLUMNS.join(","));
        for l in &lines[1..] {
            assert_eq!(l.split(',').count(), CSV_COLUMNS.len(), "{l}");
        }
        assert!(lines[1].starts_with("pingpong,shm,spin,,0,200,20,,0.3000,"));
        assert!(lines[2].starts_with("bw,shm,spin,,65536,20,2,64,,"));
    }

    #[test]
    fn table_is_aligned_with_titles_per_group() {
        let mut rep = Reporter::new(Format::Table);
        let mut text = String::new();
        for s in [0, 8, 1 << 20] {
            text += &rep.render(&pingpong(s, 1.5));
        }
        text += &rep.render(&bw("shm", 4096, 123.4));
        let titles = text.lines().filter(|l| l.starts_with('#')).count();
        assert_eq!(titles, 2, "{text}");
        // The pingpong header and its three rows.
        let widths: Vec<usize> = text.lines().skip(1).take(4).map(str::len).collect();
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{text}");
        assert!(text.contains("   1048576 "), "{text}");
    }

    fn logp(size: usize) -> BenchResult {
        let mut r = BenchResult::new(Bench::Logp, "udp", "spin", size, 300, 30);
        r.reliability = Some("none".into());
        r.o_s_us = Some(1.5);
        r.o_r_us = Some(0.5);
        r.g_us = Some(1.25);
        r.l_us = Some(0.25);
        r.latency_us = Some(1.75);
        r
    }

    #[test]
    fn logp_in_every_format() {
        let mut rep = Reporter::new(Format::Json);
        let line = rep.render(&logp(8));
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(v["bench"], "logp");
        for key in [
            "o_s_us",
            "o_r_us",
            "g_us",
            "L_us",
            "latency_us",
            "reliability",
        ] {
            assert!(v.get(key).is_some(), "missing {key} in {line}");
        }
        assert_eq!(v["L_us"], 0.25);
        // Where L is not separable it is left out, and the table says so.
        let mut hidden = logp(8);
        hidden.l_us = None;
        let json = Reporter::new(Format::Json).render(&hidden);
        assert!(!json.contains("L_us"), "{json}");
        let table = Reporter::new(Format::Table).render(&hidden);
        assert!(
            table.contains(" n/s ") && table.contains("not separable"),
            "{table}"
        );
        assert!(v.get("latency_us_median").is_none());
        let back: BenchResult = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(back, logp(8));
        // Other benchmarks carry no logp keys.
        let line = rep.render(&pingpong(8, 0.5));
        assert!(!line.contains("o_s_us") && !line.contains("L_us"), "{line}");

        let mut rep = Reporter::new(Format::Csv);
        let text = rep.render(&logp(8));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1].split(',').count(), CSV_COLUMNS.len());
        // The logp columns, then the empty columns of the tagged API, of the rate and of
        // match.
        assert!(
            lines[1].ends_with(",1.5000,0.5000,1.2500,0.2500,1.7500,,,,,,,,,,"),
            "{}",
            lines[1]
        );

        let mut rep = Reporter::new(Format::Table);
        let text = rep.render(&logp(8)) + &rep.render(&logp(64));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[0].starts_with("# logp over udp"), "{text}");
        assert!(lines[0].contains("reliability none"), "{text}");
        assert!(
            lines[1].contains("o_s(us)") && lines[1].contains("L(us)"),
            "{text}"
        );
        assert!(lines[2].contains(" 0.250 "), "{text}");
        assert!(
            lines[1..].windows(2).all(|w| w[0].len() == w[1].len()),
            "{text}"
        );
        // Charts leave logp out.
        assert_eq!(logp(8).headline(), None);
    }

    fn early_late(mode: &str, receiver: &str, size: usize) -> BenchResult {
        let mut r = BenchResult::new(Bench::EarlyLate, "shm", "spin", size, 1000, 100);
        r.api = Some("tagged".into());
        r.push = Some(mode.into());
        r.mode = Some(mode.into());
        r.receiver = Some(receiver.into());
        r.latency_us_median = Some(2.5);
        r.latency_us_avg80 = Some(2.6);
        r.latency_us_p99 = Some(9.0);
        r.compute_x_us = Some(50.0);
        r.compute_y_us = Some(10.0);
        r.compute_us = Some(100.0);
        r.pong_late_fraction = Some(0.0);
        r.ping_late_fraction = Some(0.01);
        r
    }

    #[test]
    fn tagged_and_early_late_fields() {
        let mut rep = Reporter::new(Format::Json);
        let line = rep.render(&early_late("zero", "early", 8));
        let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(v["bench"], "early-late");
        assert_eq!(v["mode"], "zero");
        assert_eq!(v["push"], "zero");
        assert_eq!(v["api"], "tagged");
        assert_eq!(v["receiver"], "early");
        assert_eq!(v["compute_us"], 100.0);
        assert!(v.get("btp1").is_none() && v.get("step").is_none());
        let back: BenchResult = serde_json::from_str(line.trim()).unwrap();
        assert_eq!(back, early_late("zero", "early", 8));
        // A chart shows early-late as latency.
        assert_eq!(back.headline(), Some(2.5));

        // Tables: a title per mode and receiver, aligned rows.
        let mut rep = Reporter::new(Format::Table);
        let mut text = String::new();
        for (m, rcv) in [("zero", "early"), ("zero", "late"), ("pull", "early")] {
            for size in [0, 65536] {
                text += &rep.render(&early_late(m, rcv, size));
            }
        }
        let titles: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
        assert_eq!(titles.len(), 3, "{text}");
        assert!(titles[1].contains("push zero") && titles[1].contains("late receiver"));
        let block: Vec<&str> = text.lines().skip(1).take(3).collect();
        assert!(block[0].contains("late@pong"), "{text}");
        assert!(block.windows(2).all(|w| w[0].len() == w[1].len()), "{text}");

        // CSV: the same columns for every row.
        let mut rep = Reporter::new(Format::Csv);
        let text = rep.render(&early_late("all", "late", 8)) + &rep.render(&pingpong(8, 1.0));
        for l in text.lines() {
            assert_eq!(l.split(',').count(), CSV_COLUMNS.len(), "{l}");
        }
        assert!(text
            .lines()
            .nth(1)
            .unwrap()
            .contains(",tagged,all,late,,,100.0000"));
    }

    #[test]
    fn summary_picks_8b_64k_1m() {
        let results = vec![
            pingpong(0, 0.2),
            pingpong(8, 0.25),
            bw("shm", 65536, 4000.0),
            bw("shm", 1 << 20, 6000.0),
            bw("udp", 65536, 500.0),
        ];
        let rows = summarize(&results);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].latency_us_median_8b, Some(0.25));
        assert_eq!(rows[0].latency_us_p99_8b, Some(0.75));
        assert_eq!(rows[0].bandwidth_mbps_1m, Some(6000.0));
        assert_eq!(rows[1].transport, "udp");
        assert_eq!(rows[1].bandwidth_mbps_1m, None);
        let table = render_summary(Format::Table, &rows);
        assert!(table.contains("udp") && table.contains("6000.0") && table.contains(" -"));
        let json = render_summary(Format::Json, &rows);
        let v: serde_json::Value = serde_json::from_str(json.lines().next().unwrap()).unwrap();
        assert_eq!(v["bench"], "summary");
        assert_eq!(v["bandwidth_MBps_64K"], 4000.0);
    }
}

//! The default suite (`quiver bench` alone): pingpong and bw over shared memory, then
//! over UDP, one two-rank job per transport, followed by a summary per transport (8-byte
//! latency, median and p99; bandwidth at 64 KiB and 1 MiB) and, with `--plot`, one chart
//! of everything.
//!
//! Each job's rank 0 appends its results as JSON lines to a temporary file named in
//! [`RESULTS_ENV`] and prints nothing; this process reads them back after each job and
//! prints them, so that tables, CSV and JSON come out as one document.

use super::ctx::RESULTS_ENV;
use super::launch::{child_args, child_env, launch_job};
use super::output::{self, BenchResult, Reporter};
use super::{plot, BenchOpts, TransportArg};
use anyhow::Context as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// A results file that is removed when dropped.
struct ResultsFile(PathBuf);

impl ResultsFile {
    fn create() -> anyhow::Result<ResultsFile> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path =
            std::env::temp_dir().join(format!("quiver-bench-{}-{nanos}.jsonl", std::process::id()));
        std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(ResultsFile(path))
    }

    fn truncate(&self) -> anyhow::Result<()> {
        std::fs::File::create(&self.0)
            .with_context(|| format!("truncating {}", self.0.display()))?;
        Ok(())
    }
}

impl Drop for ResultsFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Reads the JSON lines a job wrote.
pub fn read_results(path: &Path) -> anyhow::Result<Vec<BenchResult>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).with_context(|| format!("bad result line {l:?}")))
        .collect()
}

/// Runs the suite; returns the exit code.
pub fn main(opts: &BenchOpts) -> i32 {
    match run(opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("quiver bench: suite: {e:#}");
            1
        }
    }
}

fn run(opts: &BenchOpts) -> anyhow::Result<i32> {
    let transports = match opts.transport {
        Some(t) => vec![t],
        None => vec![TransportArg::Shm, TransportArg::Udp],
    };
    let file = ResultsFile::create()?;
    let mut reporter = Reporter::new(opts.format);
    let mut all = Vec::new();
    let mut code = 0;
    for t in transports {
        file.truncate()?;
        let args = child_args(opts, None, t, false);
        let mut env = child_env(opts, t);
        env.push((RESULTS_ENV.into(), file.0.to_string_lossy().into_owned()));
        let exit = match launch_job(opts, args, env) {
            Ok(c) => c,
            Err(e) => {
                eprintln!(
                    "quiver bench: suite over {}: cannot launch: {e:#}",
                    t.name()
                );
                1
            }
        };
        // Print what the job measured, also when it failed part way.
        let results = read_results(&file.0)?;
        let mut text = String::new();
        for r in &results {
            text.push_str(&reporter.render(r));
        }
        print_stdout(&text)?;
        all.extend(results);
        if exit != 0 {
            eprintln!(
                "quiver bench: suite over {} failed (exit code {exit})",
                t.name()
            );
            code = exit;
        }
    }
    match output::summary_block(opts.format, &all) {
        (text, output::Stream::Stdout) => print_stdout(&text)?,
        (text, output::Stream::Stderr) => eprint!("{text}"),
    }
    if let Some(path) = &opts.plot {
        if let Err(e) = plot::write_png(path, &all) {
            eprintln!("quiver bench: {e:#}");
            code = if code == 0 { 1 } else { code };
        }
    }
    Ok(code)
}

fn print_stdout(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("writing to stdout")
}

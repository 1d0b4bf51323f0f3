//! `quiver bench tune-btp`: chooses BTP(1) and BTP(2) of Push-Pull for one transport
//! (`--transport shm|udp`) with the two-step procedure of the Push-Pull paper (section
//! 5.2), on the tagged ping-pong of [`super::pingpong`] in push mode pull:
//!
//! 1. **BTP(2)**, with BTP(1) = 0: each candidate of [`BTP2_CANDIDATES`] on the sizes of
//!    [`STEP1_SIZES`], all beyond the pushed bytes, so that every message is pushed in
//!    part and pulled in part (the second push travels while the receiver's pull request
//!    or single-copy pull proceeds).
//! 2. **BTP(1)**, with the chosen BTP(2): each candidate of [`BTP1_CANDIDATES`] on the
//!    small and medium sizes of [`STEP2_SIZES`] (whole message in the first push, in two
//!    pushes, or pushed and pulled).
//!
//! Both ranks set the candidate ([`quiver::tagged::Tagged::set_btp`]) before measuring
//! it. The candidates are measured in [`ROUNDS`] interleaved rounds (every candidate and
//! size once per round), so that a slow stretch of the machine spreads over all of them.
//! A candidate's score is the mean over the sizes of its median one-way latency divided
//! by the best candidate's median at that size (1 is best at every size); the lowest
//! score wins, the smaller value on a tie. `--iters` sets the round trips per candidate
//! and size (default [`super::tune_btp_iters`]: about a second in all over shared memory,
//! some 15 seconds over UDP on one host).
//!
//! Rank 0 prints a table per step (or JSON / CSV rows: `bench` `tune-btp`, `step`,
//! `btp1`, `btp2`, `size`, the latency fields and the candidate's `score`), then the
//! choice and the variables that apply it (`QUIVER_BTP1`, `QUIVER_BTP2`); in JSON a last
//! line `{"bench":"tune-btp","chosen":true,...,"btp1":..,"btp2":..,"env":".."}`.

use super::ctx::{check_len, Ctx, Sink, CONTROL_TAG};
use super::output::{round, BenchResult, Format};
use super::pingpong::tagged_one_way_samples;
use super::sizes::fmt_size;
use super::stats::Summary;
use super::Bench;
use anyhow::Context as _;
use quiver::tagged::{PushMode, Tagged};
use serde::Serialize;
use std::fmt::Write as _;

/// BTP(2) candidates of step 1, in bytes.
pub const BTP2_CANDIDATES: [usize; 8] = [0, 512, 1024, 2048, 4096, 7168, 8192, 12288];

/// Message sizes of step 1: beyond every BTP(2) candidate.
pub const STEP1_SIZES: [usize; 3] = [16 << 10, 64 << 10, 256 << 10];

/// BTP(1) candidates of step 2, in bytes.
pub const BTP1_CANDIDATES: [usize; 8] = [0, 64, 128, 256, 512, 1024, 2048, 4096];

/// Message sizes of step 2: small and medium.
pub const STEP2_SIZES: [usize; 4] = [256, 2048, 8192, 32 << 10];

/// Interleaved rounds over the candidates.
pub const ROUNDS: u64 = 5;

/// Every size the two steps measure, ascending.
pub fn sizes() -> Vec<usize> {
    let mut v: Vec<usize> = STEP1_SIZES.iter().chain(&STEP2_SIZES).copied().collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Progress steps: one per round, candidate and size.
pub fn steps() -> u64 {
    ROUNDS
        * (BTP2_CANDIDATES.len() * STEP1_SIZES.len() + BTP1_CANDIDATES.len() * STEP2_SIZES.len())
            as u64
}

/// The scores of candidates from their medians: `medians[c][s]` is candidate `c`'s
/// median latency at size `s`; a score is the mean over sizes of the median divided by
/// the smallest median at that size.
pub fn scores(medians: &[Vec<f64>]) -> Vec<f64> {
    let n_sizes = medians.first().map_or(0, Vec::len);
    let best: Vec<f64> = (0..n_sizes)
        .map(|s| {
            medians
                .iter()
                .map(|m| m[s])
                .fold(f64::INFINITY, f64::min)
                .max(1e-9)
        })
        .collect();
    medians
        .iter()
        .map(|m| {
            if n_sizes == 0 {
                return 1.0;
            }
            m.iter().zip(&best).map(|(v, b)| v / b).sum::<f64>() / n_sizes as f64
        })
        .collect()
}

/// The index of the lowest score; the first (smallest candidate) on a tie.
pub fn best(scores: &[f64]) -> usize {
    let mut at = 0;
    for (i, s) in scores.iter().enumerate() {
        if *s < scores[at] {
            at = i;
        }
    }
    at
}

/// The last JSON line: the choice.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Choice {
    /// Always `"tune-btp"`.
    pub bench: &'static str,
    /// Always true: tells this line from the measurement rows.
    pub chosen: bool,
    /// Transport tuned.
    pub transport: String,
    /// Wait mode of the run.
    pub wait: String,
    /// Chosen BTP(1), bytes.
    pub btp1: u64,
    /// Chosen BTP(2), bytes.
    pub btp2: u64,
    /// The variables that apply the choice.
    pub env: String,
}

/// One step: every candidate on every size, in interleaved rounds; rank 0 returns the
/// medians (us) and summaries per candidate and size. `set(t, candidate)` applies a
/// candidate on this rank.
fn measure(
    ctx: &Ctx<'_>,
    t: &Tagged,
    step: u8,
    candidates: &[usize],
    sizes: &[usize],
    set: impl Fn(&Tagged, usize),
    sink: &mut Option<&mut Sink>,
) -> anyhow::Result<Vec<Vec<(Summary, u64, u64)>>> {
    let mut samples: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); sizes.len()]; candidates.len()];
    let mut counts = vec![vec![(0u64, 0u64); sizes.len()]; candidates.len()];
    let bufs: Vec<Vec<u8>> = sizes.iter().map(|&s| vec![0x6bu8; s]).collect();
    for round in 0..ROUNDS {
        for (c, &cand) in candidates.iter().enumerate() {
            set(t, cand);
            for (s, buf) in bufs.iter().enumerate() {
                let (iters, warmup) = ctx.iterations(Bench::TuneBtp, buf.len(), 1);
                let per_round = iters.div_ceil(ROUNDS);
                let warm = if round == 0 {
                    warmup.max(2)
                } else {
                    (warmup / ROUNDS).max(2)
                };
                if let Some(sk) = sink.as_deref_mut() {
                    sk.progress.begin(&format!(
                        "tune-btp step {step}: {cand} B, {}",
                        fmt_size(buf.len())
                    ));
                }
                let got = tagged_one_way_samples(t, ctx.rank, buf, warm, per_round).with_context(
                    || {
                        format!(
                            "rank {}: tune-btp step {step}, candidate {cand} B, size {} B over {}",
                            ctx.rank,
                            buf.len(),
                            ctx.transport
                        )
                    },
                )?;
                samples[c][s].extend(got);
                counts[c][s].0 += per_round;
                counts[c][s].1 += warm;
                if let Some(sk) = sink.as_deref_mut() {
                    sk.progress.end();
                }
            }
        }
    }
    if ctx.rank != 0 {
        return Ok(Vec::new());
    }
    samples
        .into_iter()
        .zip(counts)
        .map(|(per_size, cnt)| {
            per_size
                .into_iter()
                .zip(cnt)
                .map(|(v, (iters, warm))| {
                    Summary::of_nanos(v)
                        .context("no samples to summarize")
                        .map(|s| (s, iters, warm))
                })
                .collect()
        })
        .collect()
}

/// The rows of one step, and the index of the chosen candidate.
fn rows(
    ctx: &Ctx<'_>,
    step: u8,
    candidates: &[usize],
    sizes: &[usize],
    fixed: usize,
    summaries: &[Vec<(Summary, u64, u64)>],
) -> (Vec<BenchResult>, Vec<f64>, usize) {
    let medians: Vec<Vec<f64>> = summaries
        .iter()
        .map(|per| per.iter().map(|(s, _, _)| s.median / 1e3).collect())
        .collect();
    let sc = scores(&medians);
    let chosen = best(&sc);
    let mut out = Vec::new();
    for (c, &cand) in candidates.iter().enumerate() {
        for (s, &size) in sizes.iter().enumerate() {
            let (sum, iters, warm) = summaries[c][s];
            let mut r = ctx.result(Bench::TuneBtp, size, iters, warm);
            r.step = Some(step);
            let (b1, b2) = if step == 1 {
                (fixed, cand)
            } else {
                (cand, fixed)
            };
            r.btp1 = Some(b1 as u64);
            r.btp2 = Some(b2 as u64);
            r.set_latency(&sum);
            r.score = Some(round(sc[c], 4));
            out.push(r);
        }
    }
    (out, sc, chosen)
}

/// The table of one step: a row per candidate, a column per size, the score; the chosen
/// candidate marked with `*`.
pub fn grid(
    title: &str,
    name: &str,
    candidates: &[usize],
    sizes: &[usize],
    medians: &[Vec<f64>],
    scores: &[f64],
    chosen: usize,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{title}");
    let _ = write!(out, "  {name:>8}");
    for &s in sizes {
        let _ = write!(out, " {:>10}", fmt_size(s));
    }
    let _ = writeln!(out, " {:>8}", "score");
    for (c, &cand) in candidates.iter().enumerate() {
        let mark = if c == chosen { '*' } else { ' ' };
        let _ = write!(out, "{mark} {cand:>8}");
        for v in &medians[c] {
            let _ = write!(out, " {v:>10.2}");
        }
        let _ = writeln!(out, " {:>8.3}", scores[c]);
    }
    out
}

/// Runs both steps; rank 0 reports.
pub fn run(ctx: &Ctx<'_>, mut sink: Option<&mut Sink>) -> anyhow::Result<()> {
    let t = ctx.tagged()?;
    t.set_push(PushMode::Pull);
    let peer = ctx.peer();

    // Step 1: BTP(2) with BTP(1) = 0.
    let s1 = measure(
        ctx,
        t,
        1,
        &BTP2_CANDIDATES,
        &STEP1_SIZES,
        |t, c| t.set_btp(0, c),
        &mut sink,
    )?;
    let btp2 = if ctx.rank == 0 {
        let (rows1, sc, chosen) = rows(ctx, 1, &BTP2_CANDIDATES, &STEP1_SIZES, 0, &s1);
        let btp2 = BTP2_CANDIDATES[chosen];
        t.send(peer, CONTROL_TAG, &(btp2 as u64).to_le_bytes())
            .context("sending the chosen BTP(2)")?;
        if let Some(sk) = sink.as_deref_mut() {
            report_step(ctx, sk, 1, rows1, &sc, chosen)?;
        }
        btp2
    } else {
        let mut b = [0u8; 8];
        let st = t
            .recv(&mut b, peer, CONTROL_TAG)
            .context("receiving the chosen BTP(2)")?;
        check_len(st.len as usize, 8, "chosen BTP(2)")?;
        usize::try_from(u64::from_le_bytes(b)).context("BTP(2) out of range")?
    };

    // Step 2: BTP(1) with the chosen BTP(2).
    let s2 = measure(
        ctx,
        t,
        2,
        &BTP1_CANDIDATES,
        &STEP2_SIZES,
        |t, c| t.set_btp(c, btp2),
        &mut sink,
    )?;
    let Some(sk) = sink else { return Ok(()) };
    let (rows2, sc, chosen) = rows(ctx, 2, &BTP1_CANDIDATES, &STEP2_SIZES, btp2, &s2);
    let btp1 = BTP1_CANDIDATES[chosen];
    report_step(ctx, sk, 2, rows2, &sc, chosen)?;
    t.set_btp(btp1, btp2);

    let env = format!("QUIVER_BTP1={btp1} QUIVER_BTP2={btp2}");
    match sk.format {
        Format::Json => {
            let c = Choice {
                bench: "tune-btp",
                chosen: true,
                transport: ctx.transport_name(),
                wait: ctx.wait.clone(),
                btp1: btp1 as u64,
                btp2: btp2 as u64,
                env,
            };
            sk.print(&format!("{}\n", serde_json::to_string(&c)?))?;
        }
        Format::Table => sk.print(&format!(
            "\nchosen for {}: BTP(1) = {btp1} B, BTP(2) = {btp2} B\n\
             set them for tagged messages with: export {env}\n",
            ctx.transport
        ))?,
        Format::Csv => eprintln!(
            "chosen for {}: BTP(1) = {btp1} B, BTP(2) = {btp2} B; set them with: export {env}",
            ctx.transport
        ),
    }
    Ok(())
}

/// Prints (table) or emits (JSON, CSV) the rows of a step.
fn report_step(
    ctx: &Ctx<'_>,
    sk: &mut Sink,
    step: u8,
    rows: Vec<BenchResult>,
    scores: &[f64],
    chosen: usize,
) -> anyhow::Result<()> {
    if sk.format != Format::Table || sk.to_file() {
        for r in rows {
            sk.emit(r)?;
        }
        return Ok(());
    }
    let (candidates, sizes, name, title): (&[usize], &[usize], &str, String) = if step == 1 {
        (
            &BTP2_CANDIDATES,
            &STEP1_SIZES,
            "BTP(2)",
            format!(
                "# tune-btp over {}, wait {}, step 1: BTP(2) varied, BTP(1) = 0; median \
                 one-way latency (us) of a tagged ping-pong in push mode pull",
                ctx.transport, ctx.wait
            ),
        )
    } else {
        let btp2 = rows.first().and_then(|r| r.btp2).unwrap_or(0);
        (
            &BTP1_CANDIDATES,
            &STEP2_SIZES,
            "BTP(1)",
            format!(
                "\n# tune-btp over {}, wait {}, step 2: BTP(1) varied, BTP(2) = {btp2}; median \
                 one-way latency (us)",
                ctx.transport, ctx.wait
            ),
        )
    };
    let medians: Vec<Vec<f64>> = candidates
        .iter()
        .enumerate()
        .map(|(c, _)| {
            rows[c * sizes.len()..(c + 1) * sizes.len()]
                .iter()
                .map(|r| r.latency_us_median.unwrap_or(f64::NAN))
                .collect()
        })
        .collect();
    let mut text = grid(&title, name, candidates, sizes, &medians, scores, chosen);
    let _ = writeln!(
        text,
        "(score: mean over the sizes of latency / best latency at that size; * lowest)"
    );
    for r in rows {
        sk.keep(r);
    }
    sk.print(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_and_sizes() {
        // Step 1's sizes lie beyond every BTP(2) candidate: every message is pulled in part.
        assert!(STEP1_SIZES
            .iter()
            .all(|&s| s > *BTP2_CANDIDATES.iter().max().unwrap()));
        assert_eq!(
            sizes(),
            vec![256, 2048, 8192, 16 << 10, 32 << 10, 64 << 10, 256 << 10]
        );
        assert_eq!(steps(), 5 * (8 * 3 + 8 * 4));
    }

    #[test]
    fn scores_weigh_sizes_equally() {
        // Candidate 1 is best at both sizes; candidate 0 twice as slow at the first.
        let m = vec![vec![2.0, 100.0], vec![1.0, 100.0], vec![1.0, 150.0]];
        let sc = scores(&m);
        assert_eq!(sc, vec![1.5, 1.0, 1.25]);
        assert_eq!(best(&sc), 1);
        // Ties go to the first (smaller) candidate.
        assert_eq!(best(&[1.0, 1.0, 2.0]), 0);
        assert!(scores(&[]).is_empty());
    }

    #[test]
    fn grid_marks_the_choice() {
        let g = grid(
            "# t",
            "BTP(2)",
            &[0, 512],
            &[16 << 10],
            &[vec![3.0], vec![2.5]],
            &[1.2, 1.0],
            1,
        );
        let lines: Vec<&str> = g.lines().collect();
        assert_eq!(lines.len(), 4, "{g}");
        assert!(lines[3].starts_with("*      512"), "{g}");
        assert!(lines[2].starts_with("         0"), "{g}");
        assert_eq!(lines[2].len(), lines[3].len());
    }
}

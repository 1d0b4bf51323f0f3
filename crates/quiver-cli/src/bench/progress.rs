//! The progress bar of a benchmark run and the printing of results next to it.
//!
//! A bar appears only when the output goes to a terminal and the run turns out to be long
//! (more than [`SHOW_AFTER`] elapsed); it advances between message sizes, never inside a
//! timed loop, and has no ticking thread that could disturb the measurement.
//!
//! Where it is drawn: on stderr when this rank's stdout is a terminal. In a job that
//! `quiver bench` re-launched, the launcher copies each rank's stdout and stderr through
//! pipes, in two threads; the parent, if its stdout is a terminal, sets [`PROGRESS_ENV`]
//! to the terminal's width and rank 0 then draws the bar on its stdout, the stream of its
//! results, so that the launcher cannot reorder bar and results.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How long a run must have lasted before the bar is drawn.
pub const SHOW_AFTER: Duration = Duration::from_secs(1);

/// Set by a re-launching `quiver bench` whose stdout is a terminal: its width in columns.
pub const PROGRESS_ENV: &str = "QUIVER_BENCH_PROGRESS";

/// The value of [`PROGRESS_ENV`] for children of this process: the width of the terminal
/// on stdout, or `None` when stdout is not a terminal.
pub fn env_for_children() -> Option<String> {
    let out = std::io::stdout();
    if !out.is_terminal() {
        return None;
    }
    Some(terminal_width(&out).unwrap_or(80).to_string())
}

fn terminal_width(out: &std::io::Stdout) -> Option<u16> {
    use std::os::fd::AsRawFd;
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the valid, exclusively borrowed `ws`;
    // the descriptor is stdout's, open for the life of the process.
    let rc = unsafe { libc::ioctl(out.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(ws.ws_col)
}

/// A terminal reached through this process's stdout pipe (see the module docs).
#[derive(Debug)]
struct PipedTerminal {
    width: u16,
}

impl PipedTerminal {
    fn out(&self, s: &str) -> std::io::Result<()> {
        std::io::stdout().lock().write_all(s.as_bytes())
    }
}

impl TermLike for PipedTerminal {
    fn width(&self) -> u16 {
        self.width
    }
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        if n > 0 {
            self.out(&format!("\x1b[{n}A"))
        } else {
            Ok(())
        }
    }
    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        if n > 0 {
            self.out(&format!("\x1b[{n}B"))
        } else {
            Ok(())
        }
    }
    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        if n > 0 {
            self.out(&format!("\x1b[{n}C"))
        } else {
            Ok(())
        }
    }
    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        if n > 0 {
            self.out(&format!("\x1b[{n}D"))
        } else {
            Ok(())
        }
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.out(&format!("{s}\n"))
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.out(s)
    }
    fn clear_line(&self) -> std::io::Result<()> {
        self.out("\r\x1b[2K")
    }
    fn flush(&self) -> std::io::Result<()> {
        std::io::stdout().lock().flush()
    }
}

/// Where the bar of this process would be drawn, if anywhere.
fn draw_target() -> Option<ProgressDrawTarget> {
    if std::io::stdout().is_terminal() {
        return Some(ProgressDrawTarget::stderr());
    }
    let width = std::env::var(PROGRESS_ENV)
        .ok()?
        .parse::<u16>()
        .ok()
        .filter(|&w| w >= 20)?;
    Some(ProgressDrawTarget::term_like_with_hz(
        Box::new(PipedTerminal { width }),
        10,
    ))
}

/// Progress over the steps (benchmark × size) of a run.
pub struct Progress {
    bar: Option<ProgressBar>,
    target: Option<ProgressDrawTarget>,
    start: Instant,
    shown: bool,
}

impl Progress {
    /// A progress over `steps` steps; drawn only if `enabled` and the output is a
    /// terminal.
    pub fn new(steps: u64, enabled: bool) -> Progress {
        let target = if enabled { draw_target() } else { None };
        let bar = target.is_some().then(|| {
            let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::hidden());
            if let Ok(style) = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix("quiver bench");
            bar
        });
        Progress {
            bar,
            target,
            start: Instant::now(),
            shown: false,
        }
    }

    /// Announces the step about to run (e.g. `pingpong 64K`).
    pub fn begin(&mut self, what: &str) {
        if let Some(bar) = &self.bar {
            if !self.shown && self.start.elapsed() >= SHOW_AFTER {
                if let Some(target) = self.target.take() {
                    bar.set_draw_target(target);
                    self.shown = true;
                }
            }
            bar.set_message(what.to_string());
        }
    }

    /// Marks a step done.
    pub fn end(&mut self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// Prints `text` (complete lines) on stdout without tearing the bar.
    pub fn print(&self, text: &str) -> std::io::Result<()> {
        let write = || {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()
        };
        match &self.bar {
            Some(bar) if self.shown => bar.suspend(write),
            _ => write(),
        }
    }

    /// Removes the bar.
    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

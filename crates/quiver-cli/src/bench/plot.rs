//! PNG charts of benchmark results (`--plot FILE.png`): message size on a log2 x axis,
//! one-way latency (us, log scale) in one panel and bandwidth (MB/s) in another, one line
//! per (benchmark, transport), and with the tagged API per push mode (and early-late
//! receiver, tune-btp candidate) too. Size 0 cannot sit on a log axis and is left out.
//! `quiver plot` draws the same chart from a CSV file ([`write_chart`], [`draw_chart`]).
//!
//! Text needs a TrueType font: `QUIVER_PLOT_FONT` names one, otherwise the usual places
//! under `/usr/share/fonts` are searched. Without a font the chart is drawn without text
//! (no titles, labels or legend) and a warning says so.

use super::output::BenchResult;
use super::sizes::fmt_size;
use anyhow::{anyhow, Context as _};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Variable naming a TTF font for chart text.
pub const FONT_ENV: &str = "QUIVER_PLOT_FONT";

const FONT_FAMILY: &str = "sans-serif";

const FONT_CANDIDATES: [&str; 8] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
];

/// One line of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend label (`pingpong shm`).
    pub label: String,
    /// (size in bytes, value) with size > 0 and value > 0, ascending by size.
    pub points: Vec<(f64, f64)>,
}

/// Groups results into latency series and bandwidth series.
pub fn series(results: &[BenchResult]) -> (Vec<Series>, Vec<Series>) {
    let mut lat: Vec<Series> = Vec::new();
    let mut bw: Vec<Series> = Vec::new();
    for r in results {
        // logp results have no headline value: charts leave them out.
        let Some(v) = r.headline() else { continue };
        if r.size == 0 || !v.is_finite() || v <= 0.0 {
            continue;
        }
        let mut label = format!("{} {}", r.bench, r.transport);
        if let Some(push) = &r.push {
            label = format!("{label} {} {push}", r.api.as_deref().unwrap_or("tagged"));
        }
        if let Some(rcv) = &r.receiver {
            label = format!("{label} {rcv}");
        }
        if let (Some(q), Some(n)) = (&r.queue, r.outstanding) {
            label = format!("{label} {n} {q}");
        }
        if let (Some(step), Some(b1), Some(b2)) = (r.step, r.btp1, r.btp2) {
            label = format!("{label} step {step} btp {b1}/{b2}");
        }
        let list = if r.bench.is_latency() {
            &mut lat
        } else {
            &mut bw
        };
        let idx = match list.iter().position(|s| s.label == label) {
            Some(i) => i,
            None => {
                list.push(Series {
                    label,
                    points: Vec::new(),
                });
                list.len() - 1
            }
        };
        list[idx].points.push((r.size as f64, v));
    }
    for s in lat.iter_mut().chain(bw.iter_mut()) {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    (lat, bw)
}

/// Registers a font for chart text once per process; false when none could be loaded.
pub fn font_available() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        let Some(path) = find_font() else {
            return false;
        };
        let Ok(bytes) = std::fs::read(&path) else {
            return false;
        };
        // plotters keeps registered fonts for the life of the process; so does this leak,
        // once.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, bytes).is_ok()
    })
}

fn find_font() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(FONT_ENV) {
        // An explicit choice, even a wrong one, disables the search.
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    if let Some(p) = FONT_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    {
        return Some(p);
    }
    // Any regular sans TTF under the font directories, at most a few levels deep.
    let mut found = Vec::new();
    for root in ["/usr/share/fonts", "/usr/local/share/fonts"] {
        collect_ttf(Path::new(root), 4, &mut found);
    }
    found.sort();
    let plain = |p: &PathBuf| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        name.contains("sans")
            && !["bold", "italic", "oblique", "mono", "light"]
                .iter()
                .any(|w| name.contains(w))
    };
    found.iter().find(|p| plain(p)).or(found.first()).cloned()
}

fn collect_ttf(dir: &Path, depth: u32, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() && depth > 0 {
            collect_ttf(&p, depth - 1, out);
        } else if p.extension().is_some_and(|x| x.eq_ignore_ascii_case("ttf")) {
            out.push(p);
        }
    }
}

/// Writes a PNG chart of `results` to `path`; text is drawn if a font is available.
pub fn write_png(path: &Path, results: &[BenchResult]) -> anyhow::Result<()> {
    let text = text_or_warn(path, "quiver bench");
    draw(path, results, text).with_context(|| format!("writing plot {}", path.display()))
}

/// Draws the chart of `results`, with or without text.
pub fn draw(path: &Path, results: &[BenchResult], text: bool) -> anyhow::Result<()> {
    let (lat, bw) = series(results);
    if lat.is_empty() && bw.is_empty() {
        return Err(anyhow!("no results with a size above 0 to plot"));
    }
    draw_chart(path, &lat, &bw, None, text)
}

/// Writes a PNG chart of latency and bandwidth series to `path` ([`draw_chart`]), with an
/// optional title above both panels; text is drawn if a font is available, otherwise
/// `command` (`quiver plot`) warns on stderr that it is not.
pub fn write_chart(
    path: &Path,
    latency: &[Series],
    bandwidth: &[Series],
    title: Option<&str>,
    command: &str,
) -> anyhow::Result<()> {
    let text = text_or_warn(path, command);
    draw_chart(path, latency, bandwidth, title, text)
        .with_context(|| format!("writing plot {}", path.display()))
}

/// Whether chart text can be drawn ([`font_available`]); when not, `command` warns on
/// stderr that `path` is drawn without text.
fn text_or_warn(path: &Path, command: &str) -> bool {
    let text = font_available();
    if !text {
        tracing::warn!(
            "no TrueType font found (set {FONT_ENV} or install fonts-dejavu-core); the chart has no text"
        );
        eprintln!(
            "{command}: warning: no TrueType font found (set {FONT_ENV} or install \
             fonts-dejavu-core); {} is drawn without text",
            path.display()
        );
    }
    text
}

/// Draws a chart of latency series (left panel, log y) and bandwidth series (right
/// panel), with or without text. A panel is drawn only for a list with points; points
/// that do not fit log axes (size or value not finite and above 0) are left out, and so
/// are series left without points; nothing is written when no point is left (an error).
/// The title needs text and is dropped without it.
pub fn draw_chart(
    path: &Path,
    latency: &[Series],
    bandwidth: &[Series],
    title: Option<&str>,
    text: bool,
) -> anyhow::Result<()> {
    let lat = drawable(latency);
    let bw = drawable(bandwidth);
    if lat.is_empty() && bw.is_empty() {
        return Err(anyhow!("nothing to plot: no series has a point"));
    }
    let title = title.filter(|t| text && !t.trim().is_empty());
    let panels = usize::from(!lat.is_empty()) + usize::from(!bw.is_empty());
    let width = 820 * panels as u32;
    let height = if title.is_some() { 600 } else { 560 };
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let body = match title {
        Some(t) => root
            .margin(8, 0, 0, 0)
            .titled(t, (FONT_FAMILY, 26))
            .map_err(|e| anyhow!("{e}"))?,
        None => root.clone(),
    };
    let areas = body.split_evenly((1, panels));
    let mut next = areas.iter();
    if !lat.is_empty() {
        if let Some(area) = next.next() {
            latency_panel(area, &lat, text).map_err(|e| anyhow!("{e}"))?;
        }
    }
    if !bw.is_empty() {
        if let Some(area) = next.next() {
            bandwidth_panel(area, &bw, text).map_err(|e| anyhow!("{e}"))?;
        }
    }
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

/// The series and points that can be drawn on log axes: size and value finite and above
/// 0.
fn drawable(series: &[Series]) -> Vec<Series> {
    series
        .iter()
        .map(|s| Series {
            label: s.label.clone(),
            points: s
                .points
                .iter()
                .copied()
                .filter(|&(x, y)| x.is_finite() && x > 0.0 && y.is_finite() && y > 0.0)
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

type PlotResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Line colours: Tableau's 10, dark enough on white and told apart at a glance; beyond
/// them, plotters' 99-colour palette.
fn series_color(i: usize) -> RGBAColor {
    const TABLEAU: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    match TABLEAU.get(i) {
        Some(&(r, g, b)) => RGBColor(r, g, b).to_rgba(),
        None => Palette99::pick(i).to_rgba(),
    }
}

fn x_range(series: &[Series]) -> (f64, f64) {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let lo = xs.clone().fold(f64::INFINITY, f64::min);
    let hi = xs.fold(0.0, f64::max);
    (lo / 1.5, hi * 1.5)
}

fn y_values(series: &[Series]) -> impl Iterator<Item = f64> + Clone + '_ {
    series.iter().flat_map(|s| s.points.iter().map(|p| p.1))
}

/// Draws the lines, the mesh and (with text) the legend of one panel.
macro_rules! panel {
    ($area:expr, $series:expr, $text:expr, $title:expr, $ylabel:expr, $yspec:expr, $ydigits:expr, $legend:expr) => {{
        let area = $area;
        let series: &[Series] = $series;
        let text: bool = $text;
        let (x0, x1) = x_range(series);
        let mut builder = ChartBuilder::on(area);
        builder.margin(16);
        if text {
            builder
                .caption($title, (FONT_FAMILY, 22))
                .x_label_area_size(44)
                .y_label_area_size(64);
        } else {
            builder.x_label_area_size(8).y_label_area_size(8);
        }
        let mut chart = builder.build_cartesian_2d((x0..x1).log_scale().base(2.0), $yspec)?;
        if text {
            let yfmt = |v: &f64| format!("{:.*}", $ydigits(*v), v);
            let xfmt = |v: &f64| fmt_size(v.round() as usize);
            chart
                .configure_mesh()
                .x_desc("message size (bytes)")
                .y_desc($ylabel)
                .x_labels(12)
                .x_label_formatter(&xfmt)
                .y_label_formatter(&yfmt)
                .label_style((FONT_FAMILY, 14))
                .draw()?;
        } else {
            // The mesh needs a font even without labels: draw a frame and a vertical line
            // at every power of 4 bytes instead.
            let (xr, yr) = (chart.x_range(), chart.y_range());
            let grid = RGBColor(220, 220, 220);
            let mut x = 1.0f64;
            while x <= xr.end {
                if x >= xr.start {
                    chart.draw_series(std::iter::once(PathElement::new(
                        vec![(x, yr.start), (x, yr.end)],
                        grid.stroke_width(1),
                    )))?;
                }
                x *= 4.0;
            }
            chart.draw_series(std::iter::once(Rectangle::new(
                [(xr.start, yr.start), (xr.end, yr.end)],
                BLACK.stroke_width(1),
            )))?;
        }
        for (i, s) in series.iter().enumerate() {
            let color = series_color(i);
            let line = chart.draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?;
            if text {
                line.label(s.label.clone()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            }
            chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
        if text {
            chart
                .configure_series_labels()
                .position($legend)
                .background_style(WHITE.mix(0.7))
                .border_style(BLACK)
                .label_font((FONT_FAMILY, 14))
                .draw()?;
        }
        Ok(())
    }};
}

fn latency_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    series: &[Series],
    text: bool,
) -> PlotResult
where
    DB::ErrorType: 'static,
{
    let ys = y_values(series);
    let lo = ys.clone().fold(f64::INFINITY, f64::min);
    let hi = ys.fold(0.0, f64::max);
    let digits = |v: f64| if v < 10.0 { 2 } else { 0 };
    panel!(
        area,
        series,
        text,
        "one-way latency",
        "latency (us)",
        (lo / 1.5..hi * 1.5).log_scale(),
        digits,
        // latency grows with size: the lower right corner is the emptiest
        SeriesLabelPosition::LowerRight
    )
}

fn bandwidth_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    series: &[Series],
    text: bool,
) -> PlotResult
where
    DB::ErrorType: 'static,
{
    let ys = y_values(series);
    let lo = ys.clone().fold(f64::INFINITY, f64::min);
    let hi = ys.fold(0.0, f64::max);
    let digits = |v: f64| if v < 10.0 { 1 } else { 0 };
    // Systems that differ by orders of magnitude (shared memory beside a 100 Mbit/s link)
    // need a log scale to be read at all; close values read better on a linear one.
    if hi > 10.0 * lo {
        panel!(
            area,
            series,
            text,
            "bandwidth",
            "MB/s (10^6 B/s)",
            (lo / 1.5..hi * 1.5).log_scale(),
            digits,
            SeriesLabelPosition::LowerRight
        )
    } else {
        panel!(
            area,
            series,
            text,
            "bandwidth",
            "MB/s (10^6 B/s)",
            0.0..hi * 1.1,
            digits,
            SeriesLabelPosition::LowerRight
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::Bench;
    use super::*;

    fn results() -> Vec<BenchResult> {
        let mut v = Vec::new();
        for (t, base) in [("shm", 0.3), ("udp", 8.0)] {
            for (i, size) in [0usize, 8, 1024, 65536, 1 << 20].into_iter().enumerate() {
                let mut r = BenchResult::new(Bench::Pingpong, t, "spin", size, 100, 10);
                r.latency_us_median = Some(base * (1.0 + i as f64));
                v.push(r);
            }
            for size in [4096usize, 65536, 1 << 20] {
                let mut r = BenchResult::new(Bench::Bw, t, "spin", size, 20, 2);
                r.bandwidth_mbps = Some(size as f64 / base / 100.0);
                v.push(r);
            }
        }
        v
    }

    #[test]
    fn series_per_bench_and_transport_without_size_zero() {
        let (lat, bw) = series(&results());
        assert_eq!(lat.len(), 2);
        assert_eq!(bw.len(), 2);
        assert_eq!(lat[0].label, "pingpong shm");
        assert_eq!(lat[0].points.len(), 4);
        assert_eq!(lat[0].points[0].0, 8.0);
    }

    fn check_png(path: &Path) {
        let bytes = std::fs::read(path).unwrap();
        assert!(bytes.len() > 1000);
        assert_eq!(&bytes[1..4], b"PNG");
    }

    #[test]
    fn draws_with_and_without_text() {
        let dir = std::env::temp_dir();
        let pid = std::process::id();
        let no_text = dir.join(format!("quiver-plot-test-{pid}-plain.png"));
        draw(&no_text, &results(), false).unwrap();
        check_png(&no_text);
        let _ = std::fs::remove_file(&no_text);
        if font_available() {
            let with_text = dir.join(format!("quiver-plot-test-{pid}-text.png"));
            draw(&with_text, &results(), true).unwrap();
            check_png(&with_text);
            let _ = std::fs::remove_file(&with_text);
        }
        // Only one kind of result: a single panel.
        let only_bw: Vec<_> = results()
            .into_iter()
            .filter(|r| r.bench == Bench::Bw)
            .collect();
        let one = dir.join(format!("quiver-plot-test-{pid}-bw.png"));
        draw(&one, &only_bw, false).unwrap();
        check_png(&one);
        let _ = std::fs::remove_file(&one);
        assert!(draw(&one, &[], false).is_err());
    }
}

//! `quiver plot`: PNG charts of latency and bandwidth against message size from a CSV
//! file, every series (system, transport, ...) on one chart — for comparisons with other
//! systems measured elsewhere. The drawing is the one of `quiver bench --plot`
//! ([`crate::bench::plot`]): a latency panel (log2 x, log y) and a bandwidth panel (log2
//! x), each drawn only when the file has rows of its kind.
//!
//! The file has a header line naming at least the columns `series`, `kind`, `size` and
//! `value`, in any order (other columns are ignored):
//!
//! - `series`: the legend label, any text (quote it, CSV style, when it has a comma);
//! - `kind`: `latency` (one-way, microseconds) or `bandwidth` (MB/s = 10^6 bytes/s);
//! - `size`: the message size in bytes, an integer;
//! - `value`: a number.
//!
//! Rows that cannot sit on log axes are skipped: size 0, and a value that is empty, not
//! finite (`nan`, `inf`) or not above 0. Two rows for the same series, kind and size are
//! an error: average repeated runs before plotting.

use crate::bench::plot::{write_chart, Series};
use anyhow::{anyhow, bail, Context as _};
use clap::Args;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Arguments of `quiver plot`.
#[derive(Args, Debug, Clone)]
#[command(after_long_help = "\
INPUT is a CSV file whose header line names the columns series, kind, size and value (any \
order; other columns are ignored). series is the legend label (quote it when it has a comma); \
kind is latency (one-way, us) or bandwidth (MB/s = 10^6 bytes/s); size is the message size in \
bytes (an integer); value is a number. Rows with size 0 or a value that is empty, nan, inf or \
not above 0 are skipped; two rows with the same series, kind and size are an error.

Example:
  series,kind,size,value
  quiver shm,latency,8,0.31
  \"Open MPI 5.0, vader\",latency,8,0.42
  quiver shm,bandwidth,65536,9120

The chart has a latency panel (log scales) and a bandwidth panel (log x), one line per \
series; a panel without rows is left out. Text needs a TrueType font (QUIVER_PLOT_FONT, or \
one under /usr/share/fonts); without one the chart has no text.")]
pub struct PlotArgs {
    /// CSV file with the columns series, kind, size and value.
    pub input: PathBuf,
    /// PNG file to write.
    #[arg(short, long, value_name = "FILE.png")]
    pub output: PathBuf,
    /// Title above the chart.
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,
}

/// Which panel a row belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// One-way latency, microseconds.
    Latency,
    /// Bandwidth, MB/s.
    Bandwidth,
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("latency") {
            Some(Kind::Latency)
        } else if s.eq_ignore_ascii_case("bandwidth") {
            Some(Kind::Bandwidth)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Latency => "latency",
            Kind::Bandwidth => "bandwidth",
        }
    }
}

/// The series read from a CSV file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    /// Latency series, in the order of their first row; points ascending by size.
    pub latency: Vec<Series>,
    /// Bandwidth series, likewise.
    pub bandwidth: Vec<Series>,
    /// Rows left out: size 0, or a value empty, not finite or not above 0.
    pub skipped: usize,
}

const COLUMNS: [&str; 4] = ["series", "kind", "size", "value"];

/// Reads the series of a CSV file (header line first; see the module documentation).
/// Errors name the line: a missing or repeated column, an unknown kind, a size or value
/// that is not a number, a repeated point, malformed CSV.
pub fn parse<R: std::io::Read>(input: R) -> anyhow::Result<Table> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(input);
    let header = reader.headers().context("reading the header line")?.clone();
    let mut col = [0usize; 4];
    for (slot, name) in col.iter_mut().zip(COLUMNS) {
        let mut found = header
            .iter()
            .enumerate()
            .filter(|(_, h)| h.trim().eq_ignore_ascii_case(name))
            .map(|(i, _)| i);
        *slot = found.next().ok_or_else(|| {
            anyhow!(
                "the header line has no column `{name}` (it needs series, kind, size and \
                 value; it has: {})",
                header.iter().collect::<Vec<_>>().join(",")
            )
        })?;
        if found.next().is_some() {
            bail!("the header line has the column `{name}` twice");
        }
    }
    let [c_series, c_kind, c_size, c_value] = col;

    let mut table = Table::default();
    // (kind, label) -> index in its list; (kind, label, size) -> line of the first row.
    let mut index: HashMap<(Kind, String), usize> = HashMap::new();
    let mut seen: HashMap<(Kind, String, u64), u64> = HashMap::new();
    for record in reader.records() {
        let record = record.context("reading CSV")?;
        let line = record.position().map_or(0, |p| p.line());
        let field = |i: usize| record.get(i).unwrap_or("");
        let label = field(c_series).to_string();
        let kind_text = field(c_kind);
        let kind = Kind::parse(kind_text).ok_or_else(|| {
            anyhow!("line {line}: kind `{kind_text}` is neither `latency` nor `bandwidth`")
        })?;
        let size_text = field(c_size).trim();
        let size: u64 = size_text.parse().map_err(|_| {
            anyhow!("line {line}: size `{size_text}` is not a whole number of bytes")
        })?;
        let value_text = field(c_value).trim();
        let value: Option<f64> = if value_text.is_empty() {
            None
        } else {
            Some(
                value_text
                    .parse()
                    .map_err(|_| anyhow!("line {line}: value `{value_text}` is not a number"))?,
            )
        };
        let value = match value {
            Some(v) if size > 0 && v.is_finite() && v > 0.0 => v,
            _ => {
                table.skipped += 1;
                continue;
            }
        };
        if let Some(first) = seen.insert((kind, label.clone(), size), line) {
            bail!(
                "line {line}: series `{label}` has a second {} row for size {size} (the \
                 first is on line {first}); average repeated runs before plotting",
                kind.name()
            );
        }
        let list = match kind {
            Kind::Latency => &mut table.latency,
            Kind::Bandwidth => &mut table.bandwidth,
        };
        let i = *index.entry((kind, label.clone())).or_insert_with(|| {
            list.push(Series {
                label,
                points: Vec::new(),
            });
            list.len() - 1
        });
        list[i].points.push((size as f64, value));
    }
    for s in table.latency.iter_mut().chain(table.bandwidth.iter_mut()) {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Ok(table)
}

/// Reads `path` ([`parse`]); errors name the file.
pub fn load(path: &Path) -> anyhow::Result<Table> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    parse(std::io::BufReader::new(file)).with_context(|| format!("reading {}", path.display()))
}

/// Reads the CSV file and writes the chart.
pub fn plot(args: &PlotArgs) -> anyhow::Result<()> {
    let png = args
        .output
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !png {
        bail!("the output file {} must end in .png", args.output.display());
    }
    let table = load(&args.input)?;
    if table.latency.is_empty() && table.bandwidth.is_empty() {
        bail!(
            "{}: no row to plot ({} skipped: size 0, or a value empty, not finite or not \
             above 0)",
            args.input.display(),
            table.skipped
        );
    }
    if table.skipped > 0 {
        eprintln!(
            "quiver plot: {} row(s) of {} skipped (size 0, or a value empty, not finite or \
             not above 0)",
            table.skipped,
            args.input.display()
        );
    }
    write_chart(
        &args.output,
        &table.latency,
        &table.bandwidth,
        args.title.as_deref(),
        "quiver plot",
    )
}

/// `quiver plot`: 0 when the chart is written, 1 with a message otherwise.
pub fn main(args: PlotArgs) -> i32 {
    match plot(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("quiver plot: {e:#}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> anyhow::Result<Table> {
        parse(text.as_bytes())
    }

    fn err(text: &str) -> String {
        format!("{:#}", table(text).unwrap_err())
    }

    #[test]
    fn columns_are_found_by_name_in_any_order() {
        let a = table(
            "series,kind,size,value\n\
             quiver,latency,8,0.5\n\
             quiver,bandwidth,65536,9000\n",
        )
        .unwrap();
        let b = table(
            "run,value,size,Kind,series,note\n\
             1,0.5,8,latency,quiver,x\n\
             1,9000,65536,bandwidth,quiver,y\n",
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.latency.len(), 1);
        assert_eq!(a.latency[0].label, "quiver");
        assert_eq!(a.latency[0].points, vec![(8.0, 0.5)]);
        assert_eq!(a.bandwidth[0].points, vec![(65536.0, 9000.0)]);
        assert_eq!(a.skipped, 0);
    }

    #[test]
    fn quoted_labels_keep_their_commas_and_series_keep_file_order() {
        let t = table(
            "series,kind,size,value\n\
             \"Open MPI 5.0, vader\",latency,1024,0.9\n\
             quiver shm,latency,8,0.3\n\
             \"Open MPI 5.0, vader\",latency,8,0.4\n\
             \"UCX \"\"rc\"\"\",latency,8,1.5\n\
             quiver shm,latency,1024,0.6\n",
        )
        .unwrap();
        let labels: Vec<_> = t.latency.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["Open MPI 5.0, vader", "quiver shm", "UCX \"rc\""]);
        // Points ascending by size, whatever the order of the rows.
        assert_eq!(t.latency[0].points, vec![(8.0, 0.4), (1024.0, 0.9)]);
        assert_eq!(t.latency[1].points, vec![(8.0, 0.3), (1024.0, 0.6)]);
        assert!(t.bandwidth.is_empty());
    }

    #[test]
    fn rows_off_log_axes_are_skipped() {
        let t = table(
            "series,kind,size,value\n\
             a,latency,0,0.2\n\
             a,latency,8,nan\n\
             a,latency,16,inf\n\
             a,latency,32,0\n\
             a,latency,64,-1\n\
             a,latency,128,\n\
             a,latency,256,0.7\n\
             a,bandwidth,0,10\n",
        )
        .unwrap();
        assert_eq!(t.skipped, 7);
        assert_eq!(t.latency.len(), 1);
        assert_eq!(t.latency[0].points, vec![(256.0, 0.7)]);
        // No series is made of skipped rows only.
        assert!(t.bandwidth.is_empty());
    }

    #[test]
    fn bad_kind_names_its_line() {
        let e = err("series,kind,size,value\n\
                     a,latency,8,1\n\
                     \"b,\nc\",latency,8,1\n\
                     a,throughput,8,1\n");
        // The quoted label spans lines 3 and 4: the bad row starts on line 5.
        assert!(e.contains("line 5"), "{e}");
        assert!(e.contains("throughput"), "{e}");
    }

    #[test]
    fn bad_numbers_name_their_line() {
        let e = err("series,kind,size,value\na,latency,8k,1\n");
        assert!(e.contains("line 2") && e.contains("8k"), "{e}");
        let e = err("series,kind,size,value\na,latency,8,1\na,latency,16,fast\n");
        assert!(e.contains("line 3") && e.contains("fast"), "{e}");
    }

    #[test]
    fn missing_or_repeated_column_is_an_error() {
        let e = err("series,kind,bytes,value\na,latency,8,1\n");
        assert!(e.contains("`size`"), "{e}");
        assert!(e.contains("series,kind,bytes,value"), "{e}");
        let e = err("series,kind,size,value,value\na,latency,8,1,2\n");
        assert!(e.contains("`value` twice"), "{e}");
        assert!(table("").is_err());
    }

    #[test]
    fn repeated_point_is_an_error() {
        let e = err("series,kind,size,value\na,latency,8,1\nb,latency,8,1\na,latency,8,2\n");
        assert!(e.contains("line 4") && e.contains("line 2"), "{e}");
        // The same size in the other kind is another point.
        table("series,kind,size,value\na,latency,8,1\na,bandwidth,8,2\n").unwrap();
    }

    fn check_png(path: &Path) {
        let bytes = std::fs::read(path).unwrap();
        assert!(bytes.len() > 1000);
        assert_eq!(&bytes[1..4], b"PNG");
    }

    #[test]
    fn plots_a_csv_file_to_png() {
        let dir = std::env::temp_dir();
        let pid = std::process::id();
        let csv = dir.join(format!("quiver-plot-csv-test-{pid}.csv"));
        let png = dir.join(format!("quiver-plot-csv-test-{pid}.png"));
        let mut text = String::from("series,kind,size,value\n");
        for (name, lat, bw) in [
            ("quiver shm", 0.3, 9000.0),
            ("\"Open MPI, vader\"", 0.5, 7000.0),
        ] {
            for (i, size) in [0u64, 8, 1024, 65536, 1 << 20].into_iter().enumerate() {
                let f = 1.0 + i as f64;
                text.push_str(&format!("{name},latency,{size},{}\n", lat * f));
                text.push_str(&format!("{name},bandwidth,{size},{}\n", bw * f / 5.0));
            }
        }
        std::fs::write(&csv, text).unwrap();
        let mut args = PlotArgs {
            input: csv.clone(),
            output: png.clone(),
            title: Some("quiver vs Open MPI".into()),
        };
        plot(&args).unwrap();
        check_png(&png);
        let _ = std::fs::remove_file(&png);

        // Only bandwidth rows: one panel.
        std::fs::write(
            &csv,
            "series,kind,size,value\na,bandwidth,8,1\na,bandwidth,64,5\n",
        )
        .unwrap();
        args.title = None;
        plot(&args).unwrap();
        check_png(&png);
        let _ = std::fs::remove_file(&png);

        // Nothing drawable, a file that is not there, an output that is not .png.
        std::fs::write(&csv, "series,kind,size,value\na,latency,0,1\n").unwrap();
        let e = format!("{:#}", plot(&args).unwrap_err());
        assert!(e.contains("no row to plot"), "{e}");
        assert!(!png.exists());
        let _ = std::fs::remove_file(&csv);
        let e = format!("{:#}", plot(&args).unwrap_err());
        assert!(e.contains("opening"), "{e}");
        args.output = dir.join(format!("quiver-plot-csv-test-{pid}.svg"));
        let e = format!("{:#}", plot(&args).unwrap_err());
        assert!(e.contains(".png"), "{e}");
    }
}

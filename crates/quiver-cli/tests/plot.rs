//! End-to-end test of `quiver plot`: a CSV file of latency and bandwidth rows becomes a
//! PNG file; a bad file is an error that names the line, and no PNG is written.

use std::path::PathBuf;
use std::process::{Command, Output};

fn quiver_plot(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quiver"))
        .arg("plot")
        .args(args)
        .output()
        .expect("run quiver")
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("quiver-plot-it-{}-{name}", std::process::id()))
}

#[test]
fn plot_writes_a_png_from_csv() {
    let csv = temp("in.csv");
    let png = temp("out.png");
    std::fs::write(
        &csv,
        "size,series,kind,value,stddev\n\
         0,quiver shm,latency,0.2,0\n\
         8,quiver shm,latency,0.25,0\n\
         1024,quiver shm,latency,0.5,0\n\
         8,\"Open MPI, vader\",latency,0.4,0\n\
         1024,\"Open MPI, vader\",latency,0.7,0\n\
         65536,quiver shm,bandwidth,9000,0\n\
         1048576,quiver shm,bandwidth,11000,0\n\
         65536,\"Open MPI, vader\",bandwidth,7000,0\n\
         1048576,\"Open MPI, vader\",bandwidth,10000,0\n",
    )
    .unwrap();
    let out = quiver_plot(&[
        csv.as_os_str(),
        "--output".as_ref(),
        png.as_os_str(),
        "--title".as_ref(),
        "quiver vs Open MPI".as_ref(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "quiver plot failed: {stderr}");
    // The size-0 row cannot sit on a log axis and is reported as skipped.
    assert!(stderr.contains("1 row(s)"), "{stderr}");
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.len() > 1000);
    assert_eq!(&bytes[1..4], b"PNG");
    let _ = std::fs::remove_file(&png);

    std::fs::write(
        &csv,
        "series,kind,size,value\na,latency,8,1\na,latncy,16,1\n",
    )
    .unwrap();
    let out = quiver_plot(&[csv.as_os_str(), "-o".as_ref(), png.as_os_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("line 3") && stderr.contains("latncy"),
        "{stderr}"
    );
    assert!(!png.exists());
    let _ = std::fs::remove_file(&csv);
}

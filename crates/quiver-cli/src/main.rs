//! The `quiver` command: `run` (launcher), `bench` (benchmarks), `check` (a job that
//! verifies its traffic byte for byte), `info` (the configuration in force and the path
//! of tagged messages), `cluster` (an emulated cluster of network namespaces, on which
//! `run --cluster` places ranks), `plot` (PNG charts of latency and bandwidth from a CSV
//! file, to compare with other systems).
use clap::{Parser, Subcommand};

mod bench;
mod check;
mod cluster;
mod info;
mod plot;
mod run;

#[derive(Parser)]
#[command(
    name = "quiver",
    version,
    about = "quiver: cluster communication — launcher and benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start N processes of one job on this host.
    Run(run::RunArgs),
    /// Benchmarks; with no subcommand, the default suite.
    Bench(bench::BenchArgs),
    /// Verify an installation: run inside a job, every rank exchanges verified messages.
    Check(check::CheckArgs),
    /// Show the configuration in force, whether cross-memory attach works, tagged paths,
    /// the ports feature.
    ///
    /// The configuration comes from the QUIVER_* variables (defaults where unset); the
    /// path of a tagged message is given by size range for the push mode in force.
    Info(info::InfoArgs),
    /// Emulated clusters on this machine: network namespaces joined by a switch, with
    /// shaped links and loss (needs root).
    Cluster(cluster::ClusterArgs),
    /// Draw PNG charts of latency and bandwidth against message size from a CSV file.
    ///
    /// The CSV file has the columns series, kind (latency in us, or bandwidth in MB/s),
    /// size (bytes) and value; every series is a line on the same chart, as with
    /// `quiver bench --plot`.
    Plot(plot::PlotArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("QUIVER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Run(args) => run::main(args),
        Command::Bench(args) => bench::main(args),
        Command::Check(args) => check::main(args),
        Command::Info(args) => info::main(args),
        Command::Cluster(args) => cluster::main(args),
        Command::Plot(args) => plot::main(args),
    };
    std::process::exit(code);
}

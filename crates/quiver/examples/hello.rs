//! Every rank sends a greeting to the next rank and prints the one it receives.
//! Run: `cargo build --release --example hello && quiver run -n 4 -- target/release/examples/hello`

use quiver::Job;

fn main() -> quiver::Result<()> {
    let job = Job::from_env()?; // rank, size, nodes from the launcher
    let ep = job.open(1)?; // endpoint (NID, DPID 1)
    let peer = (job.rank() + 1) % job.size();
    ep.target_rank(peer)?;
    ep.write(format!("hello from {}", job.rank()).as_bytes())?; // buffer reusable on return
    let msg = ep.read()?; // zero-copy view into the token buffer pool
    println!(
        "rank {} got {:?} from rank {}",
        job.rank(),
        String::from_utf8_lossy(&msg),
        msg.source().rank
    );
    Ok(()) // dropping `msg` releases its token
}

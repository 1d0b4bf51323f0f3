//! `quiver bench` (placeholder).
use clap::Args;

/// Arguments of `quiver bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {}

pub fn main(_args: BenchArgs) -> i32 {
    0
}

//! `quiver run` (placeholder).
use clap::Args;

/// Arguments of `quiver run`.
#[derive(Args, Debug)]
pub struct RunArgs {}

pub fn main(_args: RunArgs) -> i32 {
    0
}

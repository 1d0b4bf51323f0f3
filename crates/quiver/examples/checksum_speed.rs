//! How long the frame checksum takes: quiver's `wire::checksum` (CRC32C by `crc-fast`)
//! against the `crc32c` crate (the SSE 4.2 instruction), over a frame header
//! (`HEADER_LEN` bytes) and a body: 8 bytes, and the 1448 of a full 1500-MTU datagram.
//! Run: `cargo run --release -p quiver --example checksum_speed` (pin it with `taskset`).

use quiver::wire::{checksum, HEADER_LEN};
use std::hint::black_box;
use std::time::Instant;

const FRAMES: u32 = 2_000_000;

/// Nanoseconds per frame of `f` over `FRAMES` frames that differ in their first byte.
fn time(mut f: impl FnMut(u8) -> u32) -> f64 {
    let start = Instant::now();
    let mut acc = 0u32;
    for i in 0..FRAMES {
        acc = acc.wrapping_add(f(i as u8));
    }
    black_box(acc);
    start.elapsed().as_secs_f64() * 1e9 / f64::from(FRAMES)
}

fn main() {
    println!("body_bytes  quiver_ns  crc32c_crate_ns");
    for body_len in [8usize, 1448] {
        let body = vec![0x5a_u8; body_len];
        for _round in 0..2 {
            let quiver = time(|b| {
                let mut head = [7u8; HEADER_LEN];
                head[0] = b;
                checksum(black_box(&head), &[black_box(&body)])
            });
            let reference = time(|b| {
                let mut head = [7u8; HEADER_LEN];
                head[0] = b;
                crc32c::crc32c_append(crc32c::crc32c(black_box(&head)), black_box(&body))
            });
            println!("{body_len:10}  {quiver:9.1}  {reference:15.1}");
        }
    }
}

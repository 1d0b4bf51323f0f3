//! Message-size lists: parsing `--sizes` (`0,8,1K,64K,1M`, ranges `A..B` of powers of
//! two) and printing sizes compactly (`64K`, `1M`). Owns the largest size a benchmark
//! accepts ([`MAX_SIZE`]).

/// Largest message size `--sizes` accepts (256 MiB).
pub const MAX_SIZE: usize = 256 << 20;

/// Parses a comma-separated size list. Each item is a size (`4096`, `64K`, `1M`, binary
/// multiples) or a range `A..B`: the powers of two from `A` to `B`, both powers of two,
/// with `0` allowed as `A` (`0..4` is `0,1,2,4`). The result is sorted and free of
/// duplicates.
pub fn parse_sizes(s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    if s.trim().is_empty() {
        return Err("empty size list; expected e.g. 0,8,1K,64K or 1K..1M".into());
    }
    for item in s.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!("empty item in size list {s:?}"));
        }
        if let Some((a, b)) = item.split_once("..") {
            let lo = parse_one(a)?;
            let hi = parse_one(b)?;
            if lo != 0 && !lo.is_power_of_two() {
                return Err(format!(
                    "range {item}: lower bound {lo} is not a power of two (0 is allowed)"
                ));
            }
            if !hi.is_power_of_two() && hi != 0 {
                return Err(format!(
                    "range {item}: upper bound {hi} is not a power of two"
                ));
            }
            if hi < lo {
                return Err(format!(
                    "range {item}: upper bound is below the lower bound"
                ));
            }
            if lo == 0 {
                out.push(0);
            }
            let mut v = lo.max(1);
            while v <= hi && hi != 0 {
                out.push(v);
                v *= 2;
            }
        } else {
            out.push(parse_one(item)?);
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

fn parse_one(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let v = quiver::config::parse_size(s)
        .ok_or_else(|| format!("bad size {s:?}: expected a number with optional K or M suffix"))?;
    if v > MAX_SIZE {
        return Err(format!(
            "size {s} exceeds the maximum of {}",
            fmt_size(MAX_SIZE)
        ));
    }
    Ok(v)
}

/// Formats a size the way `--sizes` accepts it: `0`, `512`, `64K`, `1M`, `1536`.
pub fn fmt_size(n: usize) -> String {
    if n >= 1 << 20 && n & ((1 << 20) - 1) == 0 {
        format!("{}M", n >> 20)
    } else if n >= 1 << 10 && n & ((1 << 10) - 1) == 0 {
        format!("{}K", n >> 10)
    } else {
        n.to_string()
    }
}

/// Formats a list for a command line (`0,8,1K`).
pub fn fmt_list(sizes: &[usize]) -> String {
    sizes
        .iter()
        .map(|&s| fmt_size(s))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_list() {
        assert_eq!(
            parse_sizes("0,8,1K,64K,1M").unwrap(),
            vec![0, 8, 1024, 65536, 1 << 20]
        );
        assert_eq!(parse_sizes(" 8 , 4 ,8").unwrap(), vec![4, 8]);
        assert_eq!(parse_sizes("1536").unwrap(), vec![1536]);
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_sizes("0..4").unwrap(), vec![0, 1, 2, 4]);
        assert_eq!(parse_sizes("1K..8K").unwrap(), vec![1024, 2048, 4096, 8192]);
        assert_eq!(parse_sizes("0..0").unwrap(), vec![0]);
        assert_eq!(parse_sizes("8..8").unwrap(), vec![8]);
        let all = parse_sizes("0..4M").unwrap();
        assert_eq!(all.len(), 24);
        assert_eq!(*all.last().unwrap(), 4 << 20);
        assert_eq!(
            parse_sizes("0,16..64,1M").unwrap(),
            vec![0, 16, 32, 64, 1 << 20]
        );
    }

    #[test]
    fn errors() {
        for bad in [
            "", "8,,16", "abc", "1X", "-1", "3..8", "8..12", "16..8", "1K..", "..1K", "1G", "4.5K",
        ] {
            assert!(parse_sizes(bad).is_err(), "{bad:?} should be rejected");
        }
        let e = parse_sizes("3..8").unwrap_err();
        assert!(e.contains("power of two"), "{e}");
    }

    #[test]
    fn formatting_round_trips() {
        let sizes = vec![0, 1, 8, 1000, 1024, 1536, 65536, 1 << 20, 3 << 20];
        assert_eq!(fmt_list(&sizes), "0,1,8,1000,1K,1536,64K,1M,3M");
        assert_eq!(parse_sizes(&fmt_list(&sizes)).unwrap(), sizes);
    }
}

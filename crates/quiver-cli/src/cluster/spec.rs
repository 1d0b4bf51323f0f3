//! The pure part of a cluster: the names, addresses and link parameters that `up`
//! creates, computed from the command line and what the host already uses, without
//! touching the system. Everything here is deterministic, so tables and tests are stable.

use std::fmt;
use std::net::Ipv4Addr;

/// Every namespace of every cluster starts with this.
pub const NS_PREFIX: &str = "qv-";
/// The node's end of its veth pair, inside the node's namespace.
pub const NODE_IFACE: &str = "qv0";
/// The bridge, inside the switch namespace.
pub const BRIDGE: &str = "br0";
/// The most nodes a cluster may have: node `i` is host `i + 1` of a /24.
pub const MAX_NODES: u32 = 254;
/// The longest cluster name.
pub const MAX_NAME: usize = 32;
/// Bytes of an Ethernet header (destination, source, EtherType), added to the MTU to
/// get the largest frame `tbf` sees.
pub const ETH_HEADER: u32 = 14;
/// How late the kernel usually wakes `tbf` to send the next frame: the peak bucket, which
/// paces frame by frame, holds this much link time beyond one frame (see the module
/// documentation of [`super`], "Link shaping").
pub const TIMER_SLACK_NS: u64 = 50_000;
/// How late the kernel may wake `tbf` under load without a fast link losing time: there
/// the rate bucket holds this much link time beyond one frame, and the peak rate's
/// headroom ([`PEAK_HEADROOM_PERCENT`]) sends it after the late wake-up.
pub const CATCH_UP_NS: u64 = 250_000;
/// How much faster than the link rate the peak bucket lets frames go, in percent.
pub const PEAK_HEADROOM_PERCENT: u64 = 5;
/// The slowest link that gets the catch-up bucket: from 1 Gbit/s a full-size frame
/// (12 µs) is shorter than the timer's usual lateness, and the link lost time to it;
/// at 100 Mbit/s (121 µs a frame) one bucket delivered the rate, and the latency curves
/// there stay those of one bucket.
pub const CATCH_UP_FROM_BPS: u64 = 1_000_000_000;
/// Frames every peer node may have queued at one `tbf` at once: two channel windows of
/// the largest default (UDP with segmentation offload), so that a full window and the
/// acknowledgements or another endpoint's frames beside it never overflow the queue.
pub const WINDOW_FRAMES: u64 = 2 * quiver::config::DEFAULT_WINDOW_SEGMENTED as u64;
/// Resolution of the loss probability: the nftables rule draws a number below this.
pub const LOSS_SCALE: u32 = 1_000_000;

/// Why `name` cannot name a cluster, if it cannot: 1 to [`MAX_NAME`] characters of
/// `a-z`, `0-9` and `-`, starting with a letter or digit and not ending with `-`.
pub fn check_name(name: &str) -> Result<(), String> {
    let rule = format!(
        "a cluster name is 1 to {MAX_NAME} characters of a-z, 0-9 and '-', starting with a \
         letter or digit and not ending with '-'"
    );
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a valid cluster name: {rule}"))
    }
}

/// The switch namespace of cluster `name`.
pub fn switch_ns(name: &str) -> String {
    format!("{NS_PREFIX}{name}-sw")
}

/// The namespace of node `i` of cluster `name`.
pub fn node_ns(name: &str, i: u32) -> String {
    format!("{NS_PREFIX}{name}-n{i}")
}

/// The node name ranks on node `i` get as `QUIVER_NODE`.
pub fn node_name(name: &str, i: u32) -> String {
    format!("{name}-n{i}")
}

/// The bridge port (switch end of the veth pair) of node `i`.
pub fn port_name(i: u32) -> String {
    format!("p{i}")
}

/// What a namespace is to its cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// The switch: the bridge and every node's port.
    Switch,
    /// Node `i`.
    Node(u32),
}

/// The cluster and role of namespace `ns`, if it is one of a cluster's: `qv-NAME-sw` or
/// `qv-NAME-nI` (I in decimal without leading zeros). The split is unambiguous: the
/// role is the text after the last `-`.
pub fn parse_ns(ns: &str) -> Option<(&str, Role)> {
    let rest = ns.strip_prefix(NS_PREFIX)?;
    let (name, role) = rest.rsplit_once('-')?;
    check_name(name).ok()?;
    let role = if role == "sw" {
        Role::Switch
    } else {
        let digits = role.strip_prefix('n')?;
        if digits.is_empty()
            || !digits.bytes().all(|b| b.is_ascii_digit())
            || (digits.len() > 1 && digits.starts_with('0'))
        {
            return None;
        }
        let i: u32 = digits.parse().ok()?;
        if i >= MAX_NODES {
            return None;
        }
        Role::Node(i)
    };
    Some((name, role))
}

/// A MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Locally administered, unicast (`0x02`), then `q` `v` in ASCII, then a role byte.
const MAC_OUI: [u8; 3] = [0x02, 0x71, 0x76];

fn mac(role: u8, i: u32) -> Mac {
    let [_, _, hi, lo] = i.to_be_bytes();
    Mac([MAC_OUI[0], MAC_OUI[1], MAC_OUI[2], role, hi, lo])
}

/// MAC address of node `i`'s interface: `02:71:76:00:00:ii`.
pub fn node_mac(i: u32) -> Mac {
    mac(0, i)
}

/// MAC address of the switch port of node `i`: `02:71:76:01:00:ii`.
pub fn port_mac(i: u32) -> Mac {
    mac(1, i)
}

/// MAC address of the bridge: `02:71:76:02:00:00`.
pub fn bridge_mac() -> Mac {
    mac(2, 0)
}

/// An IPv4 prefix (network address and length), for overlap tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// The address, host bits cleared.
    pub addr: u32,
    /// The prefix length, 0 to 32.
    pub len: u8,
}

impl Prefix {
    /// The prefix of `addr/len` (host bits cleared); `None` if `len > 32`.
    pub fn new(addr: Ipv4Addr, len: u8) -> Option<Prefix> {
        if len > 32 {
            return None;
        }
        Some(Prefix {
            addr: u32::from(addr) & Self::mask(len),
            len,
        })
    }

    fn mask(len: u8) -> u32 {
        if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len))
        }
    }

    /// Parses `a.b.c.d/len` or `a.b.c.d` (a /32).
    pub fn parse(s: &str) -> Option<Prefix> {
        match s.split_once('/') {
            Some((a, l)) => Prefix::new(a.parse().ok()?, l.parse().ok()?),
            None => Prefix::new(s.parse().ok()?, 32),
        }
    }

    /// Whether the two prefixes share an address.
    pub fn overlaps(self, other: Prefix) -> bool {
        let len = self.len.min(other.len);
        let m = Self::mask(len);
        self.addr & m == other.addr & m
    }
}

/// The /24 of a cluster: node `i` is host `i + 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Subnet(pub [u8; 3]);

impl Subnet {
    /// The address of node `i` (below [`MAX_NODES`]).
    pub fn node_ip(self, i: u32) -> Ipv4Addr {
        let [a, b, c] = self.0;
        Ipv4Addr::new(a, b, c, (i + 1) as u8)
    }

    /// As a prefix.
    pub fn prefix(self) -> Prefix {
        let [a, b, c] = self.0;
        Prefix {
            addr: u32::from(Ipv4Addr::new(a, b, c, 0)),
            len: 24,
        }
    }

    /// The /24 that holds `ip`.
    pub fn of(ip: Ipv4Addr) -> Subnet {
        let [a, b, c, _] = ip.octets();
        Subnet([a, b, c])
    }
}

impl fmt::Display for Subnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c] = self.0;
        write!(f, "{a}.{b}.{c}.0/24")
    }
}

/// The /24s tried, in order: `10.77.0.0/24` to `10.77.255.0/24`, then `172.31.0.0/24`
/// to `172.31.255.0/24`, then `192.168.200.0/24` to `192.168.255.0/24` (private ranges,
/// away from the ones routers and container engines hand out first).
pub fn candidates() -> impl Iterator<Item = Subnet> {
    let a = (0..=255u8).map(|c| Subnet([10, 77, c]));
    let b = (0..=255u8).map(|c| Subnet([172, 31, c]));
    let c = (200..=255u8).map(|c| Subnet([192, 168, c]));
    a.chain(b).chain(c)
}

/// The first candidate /24 that overlaps none of `used` (prefixes of length 0, default
/// routes, are ignored: they overlap everything).
pub fn choose_subnet(used: &[Prefix]) -> Option<Subnet> {
    candidates().find(|s| {
        used.iter()
            .filter(|p| p.len > 0)
            .all(|p| !p.overlaps(s.prefix()))
    })
}

/// The rate of every link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// No shaping: no qdisc is added.
    Unlimited,
    /// Shaped to this many bits per second in each direction.
    Rate(u64),
}

impl Link {
    /// Parses `unlimited` or `Nkbit`, `Nmbit`, `Ngbit` (N a positive integer; tc's units,
    /// powers of 1000), e.g. `100mbit`, `1gbit`, `10gbit`; at least 64 kbit/s and at most
    /// 400 Gbit/s.
    pub fn parse(s: &str) -> Result<Link, String> {
        let bad = || {
            format!(
                "{s:?}: expected unlimited or a rate such as 100mbit, 1gbit, 10gbit \
                 (a whole number of kbit, mbit or gbit)"
            )
        };
        let t = s.trim().to_ascii_lowercase();
        if t == "unlimited" {
            return Ok(Link::Unlimited);
        }
        let (num, scale) = if let Some(n) = t.strip_suffix("gbit") {
            (n, 1_000_000_000u64)
        } else if let Some(n) = t.strip_suffix("mbit") {
            (n, 1_000_000)
        } else if let Some(n) = t.strip_suffix("kbit") {
            (n, 1_000)
        } else {
            return Err(bad());
        };
        if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let bps = num
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(scale))
            .ok_or_else(bad)?;
        if !(64_000..=400_000_000_000).contains(&bps) {
            return Err(format!(
                "{s:?}: the rate must lie between 64kbit and 400gbit"
            ));
        }
        Ok(Link::Rate(bps))
    }

    /// Bits per second, `None` when unlimited.
    pub fn bps(self) -> Option<u64> {
        match self {
            Link::Unlimited => None,
            Link::Rate(r) => Some(r),
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Link::Unlimited => f.write_str("unlimited"),
            Link::Rate(r) if r % 1_000_000_000 == 0 => write!(f, "{}gbit", r / 1_000_000_000),
            Link::Rate(r) if r % 1_000_000 == 0 => write!(f, "{}mbit", r / 1_000_000),
            Link::Rate(r) => write!(f, "{}kbit", r / 1_000),
        }
    }
}

/// The parameters of the `tbf` on each end of each link. Frames leave from a bucket of
/// about one frame, so each frame waits its serialization time. On links of at least
/// [`CATCH_UP_FROM_BPS`] that bucket is the peak bucket, refilled a little faster than
/// the link ([`PEAK_HEADROOM_PERCENT`]), and a second bucket enforces the link rate on
/// average and also covers a late timer ([`CATCH_UP_NS`]), so that the link does not
/// lose the time the kernel wakes `tbf` late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    /// Link rate, bits per second.
    pub rate: u64,
    /// Bucket refilled at the link rate, in bytes: one full-size frame plus
    /// [`CATCH_UP_NS`] of link time with a peak bucket, [`TIMER_SLACK_NS`] without,
    /// rounded up to a multiple of 64.
    pub burst: u64,
    /// The peak bucket, on links of at least [`CATCH_UP_FROM_BPS`].
    pub peak: Option<Peak>,
    /// Queue in bytes: [`WINDOW_FRAMES`] full-size frames per peer node (a cluster of
    /// one node: as for two).
    pub limit: u64,
}

/// The peak bucket of a [`Tbf`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peak {
    /// Bits per second: the link rate plus [`PEAK_HEADROOM_PERCENT`].
    pub rate: u64,
    /// Bytes (`tc`'s `mtu`): one full-size frame plus [`TIMER_SLACK_NS`] of link time,
    /// rounded up to a multiple of 64.
    pub bucket: u64,
}

impl Tbf {
    /// The `tbf` of a cluster of `nodes` nodes whose links run at `link` with `mtu`;
    /// `None` when the links are unlimited.
    pub fn new(link: Link, mtu: u32, nodes: u32) -> Option<Tbf> {
        let rate = link.bps()?;
        let frame = u64::from(mtu + ETH_HEADER);
        let bucket = |ns: u64| {
            let slack = (u128::from(rate) * u128::from(ns)).div_ceil(8 * 1_000_000_000);
            (frame + slack as u64).next_multiple_of(64)
        };
        let peers = u64::from(nodes.saturating_sub(1));
        let peak = (rate >= CATCH_UP_FROM_BPS).then(|| Peak {
            rate: rate + rate * PEAK_HEADROOM_PERCENT / 100,
            bucket: bucket(TIMER_SLACK_NS),
        });
        // With a peak bucket pacing the frames, the rate bucket may also cover a late timer.
        let slack = if peak.is_some() {
            CATCH_UP_NS
        } else {
            TIMER_SLACK_NS
        };
        Some(Tbf {
            rate,
            burst: bucket(slack),
            peak,
            limit: frame * WINDOW_FRAMES * peers.max(1),
        })
    }

    /// The arguments of `tc qdisc add dev DEV root` that install it.
    pub fn tc_args(&self) -> Vec<String> {
        let mut args = vec![
            "tbf".into(),
            "rate".into(),
            format!("{}bit", self.rate),
            "burst".into(),
            self.burst.to_string(),
        ];
        if let Some(p) = self.peak {
            args.extend([
                "peakrate".into(),
                format!("{}bit", p.rate),
                "mtu".into(),
                p.bucket.to_string(),
            ]);
        }
        args.extend(["limit".into(), self.limit.to_string()]);
        args
    }
}

/// Parses a loss probability: `P%` (0 ≤ P < 100) or a fraction `0 ≤ P < 1`; at most
/// [`LOSS_SCALE`] steps, so a nonzero loss below one in a million is refused.
pub fn parse_loss(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix('%') {
        Some(n) => (n.trim(), 100.0),
        None => (t, 1.0),
    };
    let p = match num.parse::<f64>() {
        Ok(v) if v.is_finite() => v / scale,
        _ => {
            return Err(format!(
                "{s:?}: expected a loss probability such as 1% or 0.01"
            ))
        }
    };
    if !(0.0..1.0).contains(&p) {
        return Err(format!(
            "{s:?}: the loss probability must be at least 0 and below 1 (100%)"
        ));
    }
    if p > 0.0 && loss_threshold(p) == 0 {
        return Err(format!(
            "{s:?}: the smallest loss that can be set is 0.0001% (one frame in a million)"
        ));
    }
    Ok(p)
}

/// The nftables threshold for loss `p`: a frame is dropped when a random number below
/// [`LOSS_SCALE`] is below it.
pub fn loss_threshold(p: f64) -> u32 {
    (p * f64::from(LOSS_SCALE)).round() as u32
}

/// `p` as a percentage, e.g. `1%`, `0.5%`, `0%`.
pub fn fmt_loss(p: f64) -> String {
    let pct = f64::from(loss_threshold(p)) / f64::from(LOSS_SCALE / 100);
    let mut s = format!("{pct:.4}");
    while s.ends_with('0') {
        s.pop();
    }
    if s.ends_with('.') {
        s.pop();
    }
    format!("{s}%")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "demo", "x-1", "0", "a-n0", &"z".repeat(MAX_NAME)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a_b",
            "a.b",
            "a b",
            &"z".repeat(MAX_NAME + 1),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
        assert_eq!(switch_ns("demo"), "qv-demo-sw");
        assert_eq!(node_ns("demo", 3), "qv-demo-n3");
        assert_eq!(node_name("demo", 3), "demo-n3");
    }

    #[test]
    fn namespaces_parse_back_unambiguously() {
        assert_eq!(parse_ns("qv-demo-sw"), Some(("demo", Role::Switch)));
        assert_eq!(parse_ns("qv-demo-n12"), Some(("demo", Role::Node(12))));
        // A cluster named "a-n0" is not node 0 of cluster "a".
        assert_eq!(parse_ns("qv-a-n0-n1"), Some(("a-n0", Role::Node(1))));
        assert_eq!(parse_ns("qv-a-n0-sw"), Some(("a-n0", Role::Switch)));
        for other in [
            "qv-demo",
            "qv-demo-n",
            "qv-demo-n01",
            "qv-demo-x1",
            "qv--sw",
            "demo-sw",
            "qv-demo-n254",
        ] {
            assert_eq!(parse_ns(other), None, "{other}");
        }
        for i in [0, 1, 253] {
            assert_eq!(parse_ns(&node_ns("c", i)), Some(("c", Role::Node(i))));
        }
    }

    #[test]
    fn macs_are_local_unicast_and_distinct() {
        assert_eq!(node_mac(0).to_string(), "02:71:76:00:00:00");
        assert_eq!(node_mac(17).to_string(), "02:71:76:00:00:11");
        assert_eq!(port_mac(1).to_string(), "02:71:76:01:00:01");
        assert_eq!(bridge_mac().to_string(), "02:71:76:02:00:00");
        for m in [node_mac(5), port_mac(5), bridge_mac()] {
            assert_eq!(m.0[0] & 0x03, 0x02, "locally administered unicast");
        }
    }

    #[test]
    fn subnets_avoid_what_is_used() {
        let p = |s| Prefix::parse(s).unwrap();
        assert_eq!(choose_subnet(&[]), Some(Subnet([10, 77, 0])));
        // The default route is ignored; the host's own /24 and a wider route are avoided.
        let used = [
            p("0.0.0.0/0"),
            p("10.77.0.5/24"),
            p("10.77.1.0/25"),
            p("10.77.2.9"),
        ];
        assert_eq!(choose_subnet(&used), Some(Subnet([10, 77, 3])));
        assert_eq!(
            choose_subnet(&[p("10.0.0.0/8")]),
            Some(Subnet([172, 31, 0]))
        );
        assert_eq!(
            choose_subnet(&[p("10.0.0.0/8"), p("172.16.0.0/12")]),
            Some(Subnet([192, 168, 200]))
        );
        assert_eq!(
            choose_subnet(&[p("10.0.0.0/8"), p("172.16.0.0/12"), p("192.168.0.0/16")]),
            None
        );
        let s = Subnet([10, 77, 4]);
        assert_eq!(s.to_string(), "10.77.4.0/24");
        assert_eq!(s.node_ip(0), Ipv4Addr::new(10, 77, 4, 1));
        assert_eq!(s.node_ip(253), Ipv4Addr::new(10, 77, 4, 254));
        assert_eq!(Subnet::of(Ipv4Addr::new(10, 77, 4, 9)), s);
    }

    #[test]
    fn links() {
        assert_eq!(Link::parse("unlimited"), Ok(Link::Unlimited));
        assert_eq!(Link::parse("100mbit"), Ok(Link::Rate(100_000_000)));
        assert_eq!(Link::parse("1gbit"), Ok(Link::Rate(1_000_000_000)));
        assert_eq!(Link::parse("10GBIT"), Ok(Link::Rate(10_000_000_000)));
        assert_eq!(Link::parse("2500mbit").unwrap().to_string(), "2500mbit");
        assert_eq!(Link::Rate(10_000_000_000).to_string(), "10gbit");
        for bad in [
            "", "fast", "1.5gbit", "-1mbit", "1mb", "0mbit", "1kbit", "1000gbit",
        ] {
            assert!(Link::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tbf_parameters() {
        assert_eq!(Tbf::new(Link::Unlimited, 1500, 2), None);
        // 100 Mbit/s: one bucket, one frame (1514 B) plus 50 µs (625 B), rounded up to 64.
        let t = Tbf::new(Link::Rate(100_000_000), 1500, 2).unwrap();
        assert_eq!((t.burst, t.peak), (2176, None));
        assert_eq!(t.limit, 1514 * 256);
        assert_eq!(
            t.tc_args().join(" "),
            "tbf rate 100000000bit burst 2176 limit 387584"
        );
        // 1 Gbit/s: the rate bucket holds 1514 + 31250 B, the peak bucket 1514 + 6250 B
        // at 1.05 Gbit/s.
        let g = Tbf::new(Link::Rate(1_000_000_000), 1500, 2).unwrap();
        assert_eq!(g.burst, 32768);
        assert_eq!(
            g.peak,
            Some(Peak {
                rate: 1_050_000_000,
                bucket: 7808
            })
        );
        assert_eq!(
            g.tc_args().join(" "),
            "tbf rate 1000000000bit burst 32768 peakrate 1050000000bit mtu 7808 limit 387584"
        );
        // Jumbo frames: every bucket holds a whole frame.
        let j = Tbf::new(Link::Rate(100_000_000), 9000, 10).unwrap();
        assert!(j.burst >= 9014);
        assert_eq!(j.limit, 9014 * 256 * 9);
        let jg = Tbf::new(Link::Rate(10_000_000_000), 9000, 2).unwrap();
        assert!(jg.peak.unwrap().bucket >= 9014 && jg.burst > jg.peak.unwrap().bucket);
    }

    #[test]
    fn losses() {
        assert_eq!(parse_loss("1%"), Ok(0.01));
        assert_eq!(parse_loss("0.01"), Ok(0.01));
        assert_eq!(parse_loss("0"), Ok(0.0));
        assert_eq!(parse_loss(" 12.5 % "), Ok(0.125));
        for bad in ["1", "100%", "-1%", "x", "nan", "0.0000001", "inf"] {
            assert!(parse_loss(bad).is_err(), "{bad}");
        }
        assert_eq!(loss_threshold(0.01), 10_000);
        assert_eq!(fmt_loss(0.01), "1%");
        assert_eq!(fmt_loss(0.125), "12.5%");
        assert_eq!(fmt_loss(0.0), "0%");
        assert_eq!(fmt_loss(0.000001), "0.0001%");
    }
}

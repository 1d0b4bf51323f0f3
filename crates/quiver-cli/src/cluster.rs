//! `quiver cluster`: an emulated cluster on this machine, and the placement of a job's
//! ranks on its nodes.
//!
//! ```text
//! quiver cluster up NAME --nodes K [--link 100mbit|1gbit|10gbit|unlimited] [--loss P] [--mtu N]
//! quiver cluster down NAME
//! quiver cluster list [--format text|json]
//! quiver run --cluster NAME -n N [--ppn M] PROGRAM ARGS...
//! quiver bench ... --cluster NAME [--ppn M]
//! ```
//!
//! This module owns everything named `qv-*` in `/run/netns` and the state files in
//! [`STATE_DIR`]. It guarantees:
//!
//! - **The host is left alone.** Every device of a cluster lives in a namespace of its
//!   own: the bridge and the switch ends of the veth pairs in `qv-NAME-sw`, each node's
//!   end in `qv-NAME-nI`. Veth pairs are created with both ends directly in their
//!   namespaces, so no device, address, route, qdisc or nftables rule of the host's
//!   namespace is ever added, changed or removed.
//! - **Nothing is left half-built.** If a step of `up` fails, or SIGINT, SIGTERM or SIGHUP
//!   arrives during it, the namespaces created so far are deleted (which deletes every
//!   device, qdisc and table in them). `up` of a cluster that exists fails and says to
//!   run `down` first.
//! - **`down` needs nothing but the namespaces.** It deletes every namespace whose name is
//!   `qv-NAME-sw` or `qv-NAME-nI`, whether or not the state file exists (an `up` killed
//!   with SIGKILL, a state directory wiped by a reboot of `/run`). The names parse back
//!   unambiguously (the role is the text after the last `-`), so cluster `a` never
//!   touches cluster `a-n0`.
//! - **Stable names and addresses.** Node I of cluster NAME is node `NAME-nI` (its ranks'
//!   `QUIVER_NODE`), namespace `qv-NAME-nI`, interface `qv0`, MAC `02:71:76:00:00:II`
//!   (locally administered, unicast; the switch port is `02:71:76:01:00:II`, the bridge
//!   `02:71:76:02:00:00`), IPv4 address host I+1 of the cluster's /24. The /24 is the first
//!   of `10.77.0-255.0`, `172.31.0-255.0`, `192.168.200-255.0` that overlaps no address
//!   and no route (of any table) of the host and no other cluster's /24. Every node has a
//!   permanent neighbour entry for every other node: there is no ARP, so the first frame
//!   of a job is not delayed by address resolution (nor lost with it). IPv6 link-local
//!   addresses are not generated (`addrgenmode none`) and the bridge runs neither
//!   spanning tree nor multicast snooping: the links carry only what the ranks send.
//! - **A switch, not a firewall.** Where br_netfilter is loaded, the switch namespace turns
//!   off the bridge's calls into iptables, ip6tables and arptables (its own
//!   `bridge-nf-call-*` settings; the host's are untouched): a switch forwards frames, it
//!   does not route-check and filter them, and raw Ethernet frames were never filtered, so
//!   with the calls on, udp and TCP paid a per-frame cost that eth did not.
//!
//! `up`, `down` and `list` need root (CAP_SYS_ADMIN to create and enter namespaces,
//! CAP_NET_ADMIN for the devices); without it they fail with one line that says so
//! (status 1). They run the standard tools, `ip` and `tc` (iproute2) and `nft`
//! (nftables), with [`std::process::Command`]: what they do is then exactly what an
//! administrator would type, and a netlink library would add much code for the
//! bridge, veth, tbf and nftables messages. Every command's exit status is checked and
//! its stderr goes into the error. A missing command is named with its package.
//!
//! # Link shaping (`--link`)
//!
//! Each direction of each link is shaped by a token bucket filter (`tbf`): on the node's
//! veth (what the node sends) and on its switch port (what the switch sends to the
//! node, which is where several senders to one node queue, as on a real switch).
//! `unlimited` adds no qdisc.
//!
//! - **burst** = one full-size frame (MTU + 14 bytes of Ethernet header) plus 50 µs of
//!   link time ([`spec::TIMER_SLACK_NS`]), rounded up to 64 bytes: 2176 B at 100 Mbit/s,
//!   7808 B at 1 Gbit/s, 64064 B at 10 Gbit/s with MTU 1500. The bucket must hold a whole
//!   frame (`tbf` drops bigger ones) and should hold little more: whatever the bucket
//!   holds crosses the link at no cost after an idle period, so a large burst (the
//!   64 KiB people often use) lets small and medium messages through without their
//!   serialization time and makes latency curves and half-power points meaningless.
//!   The 50 µs are there because a bucket of exactly one frame does not deliver the
//!   rate: after each frame `tbf` sleeps until the next one's tokens are due, the
//!   kernel wakes it some 10 to 20 µs late on this kind of machine, and tokens beyond
//!   the bucket are lost; measured with a UDP blast of 1514-byte frames between two
//!   nodes, one frame gave 88 % of 100 Mbit/s and 48 % of 1 Gbit/s; one frame plus 50 µs
//!   gives 99.7 % and 97 to 99 % (1514-byte frames counted on the wire). What this
//!   bucket takes off the time of any message is at most 50 µs plus one frame time.
//! - **From 1 Gbit/s, a second bucket for late timers** ([`spec::CATCH_UP_FROM_BPS`]).
//!   The bucket above becomes the *peak* bucket (`tc`'s `peakrate` and `mtu`), refilled
//!   5 % faster than the link ([`spec::PEAK_HEADROOM_PERCENT`]); the link rate is
//!   enforced on average by a bucket of one frame plus 250 µs of link time
//!   ([`spec::CATCH_UP_NS`]; 32768 B at 1 Gbit/s). Under load the kernel wakes `tbf`
//!   much later than 50 µs: a trace of the qdiscs (`bench/tbf-trace.sh`) during
//!   bi-directional eth runs at 1 Gbit/s, both cores busy, found the link idle 5-9 % of
//!   the time while `tbf` held a frame it had tokens for, and 1-2 % with nothing
//!   queued. A NIC keeps sending from its ring while the CPU is late; the second bucket
//!   keeps up to 250 µs of such time and the 5 % send it afterwards. Its price: it also
//!   forgives a sender up to 250 µs of its own idle time, and after an idle period a
//!   message goes up to 5 % faster than the link for up to 5 ms (250 µs / 5 %). Below
//!   1 Gbit/s a frame lasts longer than the usual lateness (121 µs at 100 Mbit/s), one
//!   bucket delivered the rate (99.9-100 %), and the latency curves keep its fidelity.
//! - **limit** (the queue) = 256 full-size frames per peer node (387584 B with MTU
//!   1500 and two nodes: 31 ms at 100 Mbit/s, 3.1 ms at 1 Gbit/s): a channel keeps at
//!   most 128 frames in flight (UDP with segmentation offload; 64 over raw Ethernet;
//!   `QUIVER_WINDOW`), and a switch port queues what all the other nodes send to its
//!   node, so two full windows from every peer fit without a drop. The queue bounds
//!   what may wait; it does not change the rate or what a frame waits behind.
//!
//! # Loss (`--loss`)
//!
//! `--loss P` (`1%` or `0.01`, 0 ≤ P < 1, in steps of one in a million) drops frames at
//! random in the switch: table `bridge quiver` in the switch namespace holds, in the
//! bridge's forward hook, `numgen random mod 1000000 lt P*1000000 counter drop`. Every
//! frame from one node to another passes that hook exactly once, in either direction,
//! whatever its EtherType (IP, or quiver's raw frames, 0x88B5), so each frame is lost
//! with probability P independently. Frames within a node (its loopback) are never lost.
//!
//! # State file
//!
//! `/run/quiver/clusters/NAME.json` ([`inspect::State`]) records the subnet, link, tbf,
//! loss and MTU chosen. Namespaces are read live; the state file only supplies what
//! cannot be read back simply.
//!
//! # `list --format json`
//!
//! An array with one object per cluster ([`inspect::ClusterView`]):
//!
//! ```text
//! [{"name": "demo", "subnet": "10.77.0.0/24", "link": "1gbit",
//!   "tbf": {"rate_bps": 1000000000, "burst": 32768, "peakrate_bps": 1050000000,
//!           "minburst": 7808, "limit": 387584} | null,   (peak: null below 1 Gbit/s)
//!   "loss": 0.01, "mtu": 1500, "switch": "qv-demo-sw", "complete": true,
//!   "nodes": [{"node": "demo-n0", "index": 0, "namespace": "qv-demo-n0",
//!              "interface": "qv0", "mac": "02:71:76:00:00:00", "ip": "10.77.0.1",
//!              "mtu": 1500}, ...]}]
//! ```
//!
//! `link`, `tbf`, `loss` are `null` without a state file; a node's `mac`, `ip`, `mtu` are
//! `null` when its interface is missing; `complete` is true when the state file, the
//! switch and every node with its address are there.
//!
//! # Placement (`quiver run --cluster NAME -n N [--ppn M]`)
//!
//! [`Placement::resolve`] reads the cluster live. Ranks are placed in blocks of M per
//! node: rank r runs on node r / M, with local rank r mod M. M defaults to ceil(N / K)
//! for K nodes (every node used, as evenly as blocks allow); N > K * M is an error. The
//! launcher makes each rank enter its node's namespace between fork and exec
//! ([`tools::enter_netns_before_exec`], `setns(2)` on `/run/netns/NS` opened beforehand)
//! and sets `QUIVER_NODE=NAME-nI`, `QUIVER_ADDR` (the node's address), `QUIVER_CLUSTER`,
//! `QUIVER_LOCAL_RANK` and `QUIVER_LOCAL_SIZE`. Ranks of one node share memory (`/dev/shm`
//! and process ids are not namespaced); ranks of different nodes reach each other only
//! through the switch. Only the network namespace changes: a rank sees the host's
//! `/sys`, so per-interface facts must come from netlink, ioctls or `/proc/self/net`,
//! which follow the namespace, not from `/sys/class/net`.

use std::io::Write as _;
use std::net::Ipv4Addr;

use clap::{Args, Subcommand, ValueEnum};

pub mod build;
pub mod inspect;
pub mod spec;
pub mod tools;

/// Where named network namespaces live (`ip netns`).
pub const NETNS_DIR: &str = "/run/netns";
/// Where `up` records what it built.
pub const STATE_DIR: &str = "/run/quiver/clusters";

/// Arguments of `quiver cluster`.
#[derive(Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCmd,
}

#[derive(Subcommand, Debug)]
enum ClusterCmd {
    /// Build cluster NAME: K nodes (network namespaces) joined by a switch (a bridge).
    Up(UpArgs),
    /// Remove cluster NAME: every namespace of it, even without its state file.
    Down {
        /// The cluster's name.
        #[arg(value_parser = parse_name)]
        name: String,
    },
    /// Show every cluster: link, loss, MTU and each node's namespace, MAC and address.
    List {
        /// Output format.
        #[arg(long, value_enum, default_value_t = ListFormat::Text)]
        format: ListFormat,
    },
}

/// Arguments of `quiver cluster up`.
#[derive(Args, Debug)]
struct UpArgs {
    /// The cluster's name: up to 32 characters of a-z, 0-9 and '-'.
    #[arg(value_parser = parse_name)]
    name: String,
    /// Number of nodes.
    #[arg(long, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..=i64::from(spec::MAX_NODES)))]
    nodes: u32,
    /// Rate of every link, each direction: 100mbit, 1gbit, 10gbit (any whole number of
    /// kbit, mbit or gbit), or unlimited (no shaping).
    #[arg(long, value_name = "RATE", default_value = "unlimited", value_parser = spec::Link::parse)]
    link: spec::Link,
    /// Probability that the switch drops a frame: 1% or 0.01 (0 to below 1).
    #[arg(long, value_name = "P", default_value = "0", value_parser = spec::parse_loss)]
    loss: f64,
    /// MTU of every interface, 68 (the IPv4 minimum) to 65535 (a veth's maximum).
    #[arg(long, value_name = "N", default_value_t = 1500,
          value_parser = clap::value_parser!(u32).range(68..=65535))]
    mtu: u32,
}

/// `list --format` values.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum ListFormat {
    /// A table per cluster.
    Text,
    /// A JSON array (schema in the module documentation).
    Json,
}

fn parse_name(s: &str) -> Result<String, String> {
    spec::check_name(s).map(|()| s.to_string())
}

/// A build stopped by this signal.
#[derive(Debug, thiserror::Error)]
#[error("interrupted by signal {0}")]
pub struct Interrupted(pub i32);

/// `down` of a cluster that does not exist.
#[derive(Debug, thiserror::Error)]
#[error("no cluster {0}")]
pub struct NoCluster(pub String);

/// A placement that cannot be: an argument to change.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadPlacement(pub String);

/// Entry point of `quiver cluster`; returns the exit status.
pub fn main(args: ClusterArgs) -> i32 {
    let result = match args.command {
        ClusterCmd::Up(a) => up(a),
        ClusterCmd::Down { name } => down(&name),
        ClusterCmd::List { format } => list(format),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("quiver cluster: {e:#}");
            match e.downcast_ref::<Interrupted>() {
                Some(Interrupted(sig)) => 128 + sig,
                None => 1,
            }
        }
    }
}

fn up(a: UpArgs) -> anyhow::Result<()> {
    let plan = build::Plan {
        name: a.name,
        nodes: a.nodes,
        link: a.link,
        loss: a.loss,
        mtu: a.mtu,
    };
    let view = build::up(&plan)?;
    print!("{}", inspect::format_text(std::slice::from_ref(&view)));
    Ok(())
}

fn down(name: &str) -> anyhow::Result<()> {
    let removed = build::down(name)?;
    if removed.namespaces.is_empty() {
        println!("cluster {name}: no namespaces left; removed its stale state file");
    } else {
        let ns = &removed.namespaces;
        let shown = match ns.as_slice() {
            [first, _, _, _, _, .., last] => format!("{first}, ..., {last}"),
            _ => ns.join(", "),
        };
        println!(
            "cluster {name}: removed {} namespace{} ({shown}){}",
            ns.len(),
            if ns.len() == 1 { "" } else { "s" },
            if removed.state {
                ""
            } else {
                "; it had no state file"
            }
        );
    }
    Ok(())
}

fn list(format: ListFormat) -> anyhow::Result<()> {
    tools::check_privileges()?;
    let ip = tools::require("ip", "iproute2")?;
    let mut clusters: Vec<inspect::ClusterView> = inspect::namespaces()?
        .iter()
        .map(|(name, roles)| inspect::inspect(&ip, name, roles))
        .collect();
    clusters.sort_by(|a, b| a.name.cmp(&b.name));
    let text = match format {
        ListFormat::Text => inspect::format_text(&clusters),
        ListFormat::Json => serde_json::to_string_pretty(&clusters)? + "\n",
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// A node of a placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedNode {
    /// Node name (`QUIVER_NODE`): `NAME-nI`.
    pub name: String,
    /// Its network namespace.
    pub namespace: String,
    /// Its address (`QUIVER_ADDR`).
    pub ip: Ipv4Addr,
}

/// Where each rank of a job runs on a cluster: in blocks of `ppn` ranks per node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The cluster's name (`QUIVER_CLUSTER`).
    pub cluster: String,
    /// The cluster's nodes, by index.
    pub nodes: Vec<PlacedNode>,
    /// Number of ranks.
    pub n: u32,
    /// Ranks per node.
    pub ppn: u32,
}

/// Where one rank runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// Index of its node.
    pub node: usize,
    /// Its rank among the node's ranks.
    pub local_rank: u32,
    /// Number of ranks on its node.
    pub local_size: u32,
}

impl Placement {
    /// Places `n` ranks on cluster `cluster`, `ppn` per node (default ceil(n / nodes)).
    ///
    /// # Errors
    ///
    /// An error that says how to create the cluster when it does not exist;
    /// [`BadPlacement`] when the ranks do not fit
    /// or the cluster is incomplete; the one-line privilege error without root.
    pub fn resolve(cluster: &str, n: u32, ppn: Option<u32>) -> anyhow::Result<Placement> {
        spec::check_name(cluster).map_err(BadPlacement)?;
        tools::check_privileges()?;
        let ip = tools::require("ip", "iproute2")?;
        let roles = inspect::namespaces_of(cluster)?;
        if roles.is_empty() {
            return Err(anyhow::anyhow!(
                "no cluster {cluster}; create it with `quiver cluster up {cluster} --nodes K`"
            ));
        }
        let view = inspect::inspect(&ip, cluster, &roles);
        let incomplete = || {
            BadPlacement(format!(
                "cluster {cluster} is incomplete (see `quiver cluster list`); rebuild it with \
                 `quiver cluster down {cluster}` and `quiver cluster up`"
            ))
        };
        if view.switch.is_none() || view.nodes.is_empty() {
            return Err(incomplete().into());
        }
        let mut nodes = Vec::with_capacity(view.nodes.len());
        for (i, node) in view.nodes.iter().enumerate() {
            let ip = node
                .ip
                .filter(|_| node.index == i as u32)
                .ok_or_else(incomplete)?;
            nodes.push(PlacedNode {
                name: node.node.clone(),
                namespace: node.namespace.clone(),
                ip,
            });
        }
        Placement::new(cluster, nodes, n, ppn).map_err(anyhow::Error::new)
    }

    /// Places `n` ranks on `nodes`, `ppn` per node (default ceil(n / nodes)).
    pub fn new(
        cluster: &str,
        nodes: Vec<PlacedNode>,
        n: u32,
        ppn: Option<u32>,
    ) -> Result<Placement, BadPlacement> {
        let k = nodes.len() as u32;
        if k == 0 || n == 0 {
            return Err(BadPlacement("no node or no rank to place".into()));
        }
        let ppn = ppn.unwrap_or_else(|| n.div_ceil(k));
        if ppn == 0 {
            return Err(BadPlacement("--ppn must be at least 1".into()));
        }
        if u64::from(n) > u64::from(k) * u64::from(ppn) {
            return Err(BadPlacement(format!(
                "{n} ranks do not fit on cluster {cluster}: {k} node{} with {ppn} rank{} per \
                 node hold {}; raise --ppn or build a cluster with more nodes",
                if k == 1 { "" } else { "s" },
                if ppn == 1 { "" } else { "s" },
                u64::from(k) * u64::from(ppn)
            )));
        }
        Ok(Placement {
            cluster: cluster.to_string(),
            nodes,
            n,
            ppn,
        })
    }

    /// Where rank `rank` (below `n`) runs.
    pub fn slot(&self, rank: u32) -> Slot {
        let node = rank / self.ppn;
        let first = node * self.ppn;
        Slot {
            node: node as usize,
            local_rank: rank - first,
            local_size: self.ppn.min(self.n - first),
        }
    }

    /// The nodes that receive ranks.
    pub fn used_nodes(&self) -> usize {
        self.n.div_ceil(self.ppn) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(k: u32) -> Vec<PlacedNode> {
        (0..k)
            .map(|i| PlacedNode {
                name: spec::node_name("c", i),
                namespace: spec::node_ns("c", i),
                ip: spec::Subnet([10, 77, 0]).node_ip(i),
            })
            .collect()
    }

    #[test]
    fn blocks_of_ppn() {
        let p = Placement::new("c", nodes(2), 4, Some(2)).unwrap();
        let slots: Vec<_> = (0..4).map(|r| p.slot(r)).collect();
        assert_eq!(
            slots
                .iter()
                .map(|s| (s.node, s.local_rank, s.local_size))
                .collect::<Vec<_>>(),
            [(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]
        );
        // Default: ceil(N / K), the last node possibly short.
        let p = Placement::new("c", nodes(2), 3, None).unwrap();
        assert_eq!(p.ppn, 2);
        assert_eq!(
            p.slot(2),
            Slot {
                node: 1,
                local_rank: 0,
                local_size: 1
            }
        );
        assert_eq!(p.used_nodes(), 2);
        // Fewer ranks than nodes: one per node, the rest unused.
        let p = Placement::new("c", nodes(4), 2, None).unwrap();
        assert_eq!((p.ppn, p.used_nodes()), (1, 2));
        assert_eq!(p.slot(1).node, 1);
    }

    #[test]
    fn too_many_ranks() {
        let e = Placement::new("c", nodes(2), 5, Some(2)).unwrap_err();
        assert!(e.0.contains("5 ranks do not fit"), "{e}");
        assert!(Placement::new("c", nodes(2), 2, Some(0)).is_err());
        assert!(Placement::new("c", nodes(0), 2, None).is_err());
    }
}

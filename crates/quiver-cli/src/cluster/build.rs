//! `up` and `down`: building a cluster step by step, removing it again on any failure,
//! and removing every namespace of a cluster whatever state it was left in.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context as _};

use super::inspect::{self, ClusterView, State, TbfState, STATE_VERSION};
use super::spec::{self, Link, Role, Tbf, BRIDGE, NODE_IFACE};
use super::tools::{self, Interrupts, Lock};
use super::{Interrupted, NoCluster, STATE_DIR};

/// What `up` builds.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Cluster name (valid).
    pub name: String,
    /// Number of nodes, 1 to [`spec::MAX_NODES`].
    pub nodes: u32,
    /// Rate of every link.
    pub link: Link,
    /// Probability that the switch drops a frame.
    pub loss: f64,
    /// MTU of every interface.
    pub mtu: u32,
}

/// The commands a build needs.
struct Tools {
    ip: PathBuf,
    tc: Option<PathBuf>,
    nft: Option<PathBuf>,
}

/// The namespaces created so far; removed when dropped unless the build completed.
struct Rollback<'a> {
    ip: &'a Path,
    name: &'a str,
    created: Vec<String>,
    done: bool,
}

impl Drop for Rollback<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut left = Vec::new();
        for ns in self.created.iter().rev() {
            if let Err(e) = tools::run(self.ip, &strings(&["netns", "del", ns]), None, None) {
                left.push(format!("{ns} ({e:#})"));
            }
        }
        if left.is_empty() {
            eprintln!(
                "quiver cluster: removed what was built of cluster {}",
                self.name
            );
        } else {
            eprintln!(
                "quiver cluster: could not remove {}; run `quiver cluster down {}`",
                left.join(", "),
                self.name
            );
        }
    }
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// Builds the cluster `plan` describes and returns it as `list` shows it.
///
/// Fails without building anything if the cluster exists (any namespace of it), if a
/// command is missing, or without the privileges; removes what it built if a step fails
/// or a signal (SIGINT, SIGTERM, SIGHUP) arrives half-way ([`Interrupted`]).
pub fn up(plan: &Plan) -> anyhow::Result<ClusterView> {
    tools::check_privileges()?;
    let tools = Tools {
        ip: tools::require("ip", "iproute2")?,
        tc: match plan.link {
            Link::Unlimited => None,
            Link::Rate(_) => Some(tools::require("tc", "iproute2")?),
        },
        nft: if plan.loss > 0.0 {
            Some(tools::require("nft", "nftables")?)
        } else {
            None
        },
    };
    let _lock = Lock::acquire(Path::new(STATE_DIR))?;
    let name = plan.name.as_str();
    if !inspect::namespaces_of(name)
        .context("cannot list the network namespaces")?
        .is_empty()
    {
        bail!("cluster {name} exists already; remove it first with `quiver cluster down {name}`");
    }
    // A state file without namespaces is stale (a crashed `down`, or namespaces removed by
    // hand): it is replaced.
    let used = inspect::used_prefixes(&tools.ip, name)?;
    let subnet = spec::choose_subnet(&used).ok_or_else(|| {
        anyhow!(
            "no free private /24 for the cluster: every candidate (10.77.x.0, 172.31.x.0, \
             192.168.200-255.0) overlaps an address or route of this host or another cluster"
        )
    })?;
    let tbf = Tbf::new(plan.link, plan.mtu, plan.nodes);

    let interrupts = Interrupts::catch();
    let mut rollback = Rollback {
        ip: &tools.ip,
        name,
        created: Vec::new(),
        done: false,
    };
    if let Err(e) = build(plan, &tools, subnet, tbf, &interrupts, &mut rollback) {
        // A signal sent to the process group also kills the step's command, whose failure
        // then comes first: the signal is what to report (exit status 128 + signal).
        return Err(match interrupts.received() {
            Some(sig) => anyhow::Error::new(Interrupted(sig)),
            None => e,
        });
    }

    let state = State {
        version: STATE_VERSION,
        name: name.to_string(),
        nodes: plan.nodes,
        subnet: subnet.to_string(),
        link: plan.link.to_string(),
        tbf: tbf.map(|t| TbfState {
            rate_bps: t.rate,
            burst: t.burst,
            peakrate_bps: t.peak.map(|p| p.rate),
            minburst: t.peak.map(|p| p.bucket),
            limit: t.limit,
        }),
        loss: plan.loss,
        mtu: plan.mtu,
    };
    inspect::write_state(&state)?;
    let roles = inspect::namespaces_of(name)?;
    let view = inspect::inspect(&tools.ip, name, &roles);
    if !view.complete {
        let _ = inspect::remove_state(name);
        bail!("cluster {name} was built but does not read back complete: {view:?}");
    }
    rollback.done = true;
    Ok(view)
}

/// Turns off the bridge's calls into iptables, ip6tables and arptables in the current
/// network namespace, where br_netfilter provides them (its settings exist only while
/// the module is loaded).
const NO_BRIDGE_NETFILTER: &str =
    "for f in /proc/sys/net/bridge/bridge-nf-call-*; do [ -e \"$f\" ] && echo 0 > \"$f\"; done; true";

/// The steps of [`up`]; every namespace created is recorded in `rollback` first.
fn build(
    plan: &Plan,
    tools: &Tools,
    subnet: spec::Subnet,
    tbf: Option<Tbf>,
    interrupts: &Interrupts,
    rollback: &mut Rollback<'_>,
) -> anyhow::Result<()> {
    let name = plan.name.as_str();
    let ip = tools.ip.as_path();
    let mtu = plan.mtu.to_string();
    let step = || match interrupts.received() {
        Some(sig) => Err(anyhow::Error::new(Interrupted(sig))),
        None => Ok(()),
    };
    let sw = spec::switch_ns(name);
    let nodes: Vec<String> = (0..plan.nodes).map(|i| spec::node_ns(name, i)).collect();

    // Namespaces: the switch, then the nodes.
    for ns in std::iter::once(&sw).chain(&nodes) {
        step()?;
        tools::run(ip, &strings(&["netns", "add", ns]), None, None)?;
        rollback.created.push(ns.clone());
    }
    // The bridge: no spanning tree (ports forward at once), no multicast snooping (which
    // would make the bridge send IGMP and MLD reports of its own).
    step()?;
    let bridge_mac = spec::bridge_mac().to_string();
    tools::run(
        ip,
        &strings(&[
            "-n",
            &sw,
            "link",
            "add",
            BRIDGE,
            "address",
            &bridge_mac,
            "type",
            "bridge",
            "stp_state",
            "0",
            "mcast_snooping",
            "0",
        ]),
        None,
        None,
    )?;
    // A switch does not run the host's firewall: with br_netfilter loaded, every IPv4,
    // IPv6 and ARP frame crossing a bridge would go through iptables and a route lookup
    // (per-namespace settings; the host's stay as they are). Raw Ethernet frames never
    // did, so without this udp and TCP paid a cost that eth did not.
    step()?;
    let sw_ns = tools::open_netns(&sw).with_context(|| format!("cannot open namespace {sw}"))?;
    tools::run(
        Path::new("/bin/sh"),
        &strings(&["-c", NO_BRIDGE_NETFILTER]),
        Some(&sw_ns),
        None,
    )?;
    // One veth pair per node, created with each end in its namespace: nothing ever
    // appears in the host's namespace.
    for (i, ns) in (0..plan.nodes).zip(&nodes) {
        step()?;
        let (mac, pmac, port) = (
            spec::node_mac(i).to_string(),
            spec::port_mac(i).to_string(),
            spec::port_name(i),
        );
        tools::run(
            ip,
            &strings(&[
                "link", "add", NODE_IFACE, "address", &mac, "mtu", &mtu, "netns", ns, "type",
                "veth", "peer", "name", &port, "address", &pmac, "mtu", &mtu, "netns", &sw,
            ]),
            None,
            None,
        )?;
    }
    // The switch: ports into the bridge, no IPv6 link-local addresses (no stray frames).
    step()?;
    let mut batch = String::from("link set lo up\n");
    for i in 0..plan.nodes {
        let port = spec::port_name(i);
        batch.push_str(&format!(
            "link set {port} addrgenmode none\nlink set {port} master {BRIDGE}\nlink set {port} up\n"
        ));
    }
    batch.push_str(&format!(
        "link set {BRIDGE} mtu {mtu}\nlink set {BRIDGE} addrgenmode none\nlink set {BRIDGE} up\n"
    ));
    tools::run(
        ip,
        &strings(&["-n", &sw, "-batch", "-"]),
        None,
        Some(&batch),
    )?;
    // The nodes: address, and a permanent neighbour entry for every other node, so that
    // no ARP exchange (which the loss would hit too) precedes the first frame.
    for (i, ns) in (0..plan.nodes).zip(&nodes) {
        step()?;
        let mut batch = format!(
            "link set lo up\nlink set {NODE_IFACE} addrgenmode none\n\
             addr add {}/24 dev {NODE_IFACE}\nlink set {NODE_IFACE} up\n",
            subnet.node_ip(i)
        );
        for j in (0..plan.nodes).filter(|&j| j != i) {
            batch.push_str(&format!(
                "neigh replace {} lladdr {} dev {NODE_IFACE} nud permanent\n",
                subnet.node_ip(j),
                spec::node_mac(j)
            ));
        }
        tools::run(ip, &strings(&["-n", ns, "-batch", "-"]), None, Some(&batch))?;
    }
    // Shaping: a tbf on both ends of every link.
    if let (Some(tbf), Some(tc)) = (tbf, &tools.tc) {
        let qdisc = tbf.tc_args().join(" ");
        for ns in &nodes {
            step()?;
            let line = format!("qdisc add dev {NODE_IFACE} root {qdisc}\n");
            tools::run(tc, &strings(&["-n", ns, "-batch", "-"]), None, Some(&line))?;
        }
        step()?;
        let batch: String = (0..plan.nodes)
            .map(|i| format!("qdisc add dev {} root {qdisc}\n", spec::port_name(i)))
            .collect();
        tools::run(
            tc,
            &strings(&["-n", &sw, "-batch", "-"]),
            None,
            Some(&batch),
        )?;
    }
    // Loss: in the bridge's forward hook, which every frame from one port to another
    // passes once, whatever its EtherType.
    if let Some(nft) = &tools.nft {
        step()?;
        let ruleset = format!(
            "table bridge quiver {{\n  chain forward {{\n    type filter hook forward priority 0; policy accept;\n    numgen random mod {} lt {} counter drop\n  }}\n}}\n",
            spec::LOSS_SCALE,
            spec::loss_threshold(plan.loss)
        );
        let ns = tools::open_netns(&sw).with_context(|| format!("cannot open namespace {sw}"))?;
        tools::run(nft, &strings(&["-f", "-"]), Some(&ns), Some(&ruleset))?;
    }
    step()
}

/// What `down` removed.
#[derive(Debug)]
pub struct Removed {
    /// The namespaces deleted.
    pub namespaces: Vec<String>,
    /// Whether a state file was removed.
    pub state: bool,
}

/// Removes every namespace of cluster `name` (the veths, the bridge, the qdiscs and the
/// nftables table in them go with them) and its state file. Works from the namespaces
/// alone: the state file may be missing or stale. [`NoCluster`] when there is nothing.
pub fn down(name: &str) -> anyhow::Result<Removed> {
    tools::check_privileges()?;
    let ip = tools::require("ip", "iproute2")?;
    let _lock = Lock::acquire(Path::new(STATE_DIR))?;
    let roles = inspect::namespaces_of(name).context("cannot list the network namespaces")?;
    let had_state = inspect::state_path(name).exists();
    if roles.is_empty() && !had_state {
        return Err(anyhow::Error::new(NoCluster(name.to_string())));
    }
    let mut removed = Vec::new();
    let mut failed = Vec::new();
    // Nodes first, the switch last.
    for role in roles.iter().rev() {
        let ns = match *role {
            Role::Switch => spec::switch_ns(name),
            Role::Node(i) => spec::node_ns(name, i),
        };
        match tools::run(&ip, &strings(&["netns", "del", &ns]), None, None) {
            Ok(_) => removed.push(ns),
            Err(e) => failed.push(format!("{e:#}")),
        }
    }
    removed.reverse();
    if !failed.is_empty() {
        bail!(
            "could not remove every namespace of cluster {name}: {}",
            failed.join("; ")
        );
    }
    let state = inspect::remove_state(name).with_context(|| {
        format!(
            "cannot remove the state file {}",
            inspect::state_path(name).display()
        )
    })?;
    Ok(Removed {
        namespaces: removed,
        state,
    })
}

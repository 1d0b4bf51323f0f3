//! What exists: the clusters found in the named network namespaces, read live from the
//! namespaces (`ip -n NS -j addr`), and the state file `up` writes beside them.
//!
//! The namespaces are the truth: a cluster exists as long as one of its namespaces does,
//! whatever the state file says. The state file adds what cannot be read back simply
//! (the link rate, the loss, the subnet chosen); a cluster without one (an `up` that
//! crashed) is listed with those fields unknown.

use std::collections::BTreeMap;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::spec::{self, Role, NODE_IFACE};
use super::tools;
use super::{NETNS_DIR, STATE_DIR};

/// Version of the state file's layout.
pub const STATE_VERSION: u32 = 1;

/// What `up` records in `STATE_DIR/NAME.json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct State {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// The cluster's name.
    pub name: String,
    /// Number of nodes.
    pub nodes: u32,
    /// The /24, e.g. `10.77.0.0/24`.
    pub subnet: String,
    /// `unlimited` or the rate, e.g. `1gbit`.
    pub link: String,
    /// The `tbf` on each end of each link, when shaped.
    pub tbf: Option<TbfState>,
    /// Loss probability of every frame through the switch, 0 to below 1.
    pub loss: f64,
    /// MTU of every interface.
    pub mtu: u32,
}

/// The `tbf` parameters in the state file and in `list --format json`.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct TbfState {
    /// Bits per second.
    pub rate_bps: u64,
    /// Rate bucket in bytes.
    pub burst: u64,
    /// Peak rate, bits per second, on links of at least 1 Gbit/s; `null` otherwise.
    #[serde(default)]
    pub peakrate_bps: Option<u64>,
    /// Peak bucket in bytes; `null` where there is no peak rate.
    #[serde(default)]
    pub minburst: Option<u64>,
    /// Queue in bytes.
    pub limit: u64,
}

/// The state file of cluster `name`.
pub fn state_path(name: &str) -> PathBuf {
    Path::new(STATE_DIR).join(format!("{name}.json"))
}

/// The state of cluster `name`; `None` if the file is missing or unreadable.
pub fn read_state(name: &str) -> Option<State> {
    let text = std::fs::read_to_string(state_path(name)).ok()?;
    serde_json::from_str::<State>(&text)
        .ok()
        .filter(|s| s.version == STATE_VERSION && s.name == name)
}

/// Writes the state file (a temporary file renamed into place).
pub fn write_state(state: &State) -> anyhow::Result<()> {
    let path = state_path(&state.name);
    let temp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(state)?;
    std::fs::write(&temp, text + "\n")
        .and_then(|()| std::fs::rename(&temp, &path))
        .with_context(|| format!("cannot write the state file {}", path.display()))
}

/// Removes the state file of cluster `name`; whether there was one.
pub fn remove_state(name: &str) -> io::Result<bool> {
    match std::fs::remove_file(state_path(name)) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The names of the clusters that have a state file.
pub fn state_names() -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(STATE_DIR) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let name = name.strip_suffix(".json")?.to_string();
            spec::check_name(&name).ok()?;
            Some(name)
        })
        .collect()
}

/// The namespaces of every cluster on this host: cluster name to roles, sorted.
pub fn namespaces() -> io::Result<BTreeMap<String, Vec<Role>>> {
    let mut map: BTreeMap<String, Vec<Role>> = BTreeMap::new();
    let dir = match std::fs::read_dir(NETNS_DIR) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(map),
        Err(e) => return Err(e),
    };
    for entry in dir {
        let entry = entry?;
        let Ok(ns) = entry.file_name().into_string() else {
            continue;
        };
        if let Some((name, role)) = spec::parse_ns(&ns) {
            map.entry(name.to_string()).or_default().push(role);
        }
    }
    for roles in map.values_mut() {
        roles.sort_unstable();
    }
    Ok(map)
}

/// The roles of the namespaces of cluster `name` that exist.
pub fn namespaces_of(name: &str) -> io::Result<Vec<Role>> {
    Ok(namespaces()?.remove(name).unwrap_or_default())
}

/// One node as `list` shows it.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct NodeView {
    /// Node name, `QUIVER_NODE` of its ranks: `NAME-nI`.
    pub node: String,
    /// Index I.
    pub index: u32,
    /// Its network namespace, `qv-NAME-nI`.
    pub namespace: String,
    /// Its interface in the namespace.
    pub interface: String,
    /// The interface's MAC address; `null` if the interface is missing.
    pub mac: Option<String>,
    /// The interface's IPv4 address; `null` if it has none.
    pub ip: Option<Ipv4Addr>,
    /// The interface's MTU; `null` if the interface is missing.
    pub mtu: Option<u32>,
}

/// One cluster as `list` shows it.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct ClusterView {
    /// The cluster's name.
    pub name: String,
    /// The /24 of its nodes.
    pub subnet: Option<String>,
    /// `unlimited` or the rate of every link; `null` without a state file.
    pub link: Option<String>,
    /// The `tbf` on both ends of every link; `null` when unlimited or unknown.
    pub tbf: Option<TbfState>,
    /// Probability that the switch drops a frame; `null` without a state file.
    pub loss: Option<f64>,
    /// MTU of the interfaces (read from node 0, else the state file).
    pub mtu: Option<u32>,
    /// The switch namespace, `null` if it is missing.
    pub switch: Option<String>,
    /// Whether everything `up` builds is there: the state file, the switch, and every
    /// node with its address.
    pub complete: bool,
    /// The nodes whose namespaces exist, by index.
    pub nodes: Vec<NodeView>,
}

/// Reads cluster `name` live: its namespaces `roles`, its state file, and in each node
/// namespace the interface's addresses (`ip` is the path of the `ip` command).
pub fn inspect(ip: &Path, name: &str, roles: &[Role]) -> ClusterView {
    let state = read_state(name);
    let mut nodes = Vec::new();
    let mut switch = None;
    for &role in roles {
        match role {
            Role::Switch => switch = Some(spec::switch_ns(name)),
            Role::Node(i) => nodes.push(node_view(ip, name, i)),
        }
    }
    let live_mtu = nodes.first().and_then(|n| n.mtu);
    let subnet = state.as_ref().map(|s| s.subnet.clone()).or_else(|| {
        nodes
            .iter()
            .find_map(|n| n.ip)
            .map(|ip| spec::Subnet::of(ip).to_string())
    });
    let complete = match &state {
        Some(s) => {
            switch.is_some()
                && nodes.len() == s.nodes as usize
                && nodes
                    .iter()
                    .enumerate()
                    .all(|(i, n)| n.index == i as u32 && n.ip.is_some() && n.mac.is_some())
        }
        None => false,
    };
    ClusterView {
        name: name.to_string(),
        subnet,
        link: state.as_ref().map(|s| s.link.clone()),
        tbf: state.as_ref().and_then(|s| s.tbf),
        loss: state.as_ref().map(|s| s.loss),
        mtu: live_mtu.or(state.as_ref().map(|s| s.mtu)),
        switch,
        complete,
        nodes,
    }
}

/// Node `i` of cluster `name`, read from its namespace.
fn node_view(ip: &Path, name: &str, i: u32) -> NodeView {
    let namespace = spec::node_ns(name, i);
    let args: Vec<String> = ["-n", &namespace, "-j", "addr", "show", "dev", NODE_IFACE]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let live = tools::run(ip, &args, None, None)
        .ok()
        .and_then(|out| serde_json::from_str::<serde_json::Value>(&out).ok());
    let link = live.as_ref().and_then(|v| v.get(0));
    let mac = link
        .and_then(|l| l.get("address"))
        .and_then(|a| a.as_str())
        .map(str::to_string);
    let mtu = link
        .and_then(|l| l.get("mtu"))
        .and_then(|m| m.as_u64())
        .and_then(|m| u32::try_from(m).ok());
    let addr = link
        .and_then(|l| l.get("addr_info"))
        .and_then(|a| a.as_array())
        .and_then(|infos| {
            infos.iter().find_map(|info| {
                if info.get("family")?.as_str()? != "inet" {
                    return None;
                }
                info.get("local")?.as_str()?.parse::<Ipv4Addr>().ok()
            })
        });
    NodeView {
        node: spec::node_name(name, i),
        index: i,
        namespace,
        interface: NODE_IFACE.to_string(),
        mac,
        ip: addr,
        mtu,
    }
}

/// The IPv4 prefixes in use on the host (addresses and routes of every table) and by
/// the other clusters, which a new cluster's subnet must avoid.
pub fn used_prefixes(ip: &Path, except: &str) -> anyhow::Result<Vec<spec::Prefix>> {
    let mut used = Vec::new();
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let addrs: serde_json::Value = serde_json::from_str(&tools::run(
        ip,
        &args(&["-j", "-4", "addr", "show"]),
        None,
        None,
    )?)
    .context("cannot parse the output of `ip -j -4 addr show`")?;
    for link in addrs.as_array().into_iter().flatten() {
        for info in link["addr_info"].as_array().into_iter().flatten() {
            let local = info["local"].as_str().and_then(|a| a.parse().ok());
            let len = info["prefixlen"]
                .as_u64()
                .and_then(|l| u8::try_from(l).ok());
            if let (Some(local), Some(len)) = (local, len) {
                used.extend(spec::Prefix::new(local, len));
            }
        }
    }
    let routes: serde_json::Value = serde_json::from_str(&tools::run(
        ip,
        &args(&["-j", "-4", "route", "show", "table", "all"]),
        None,
        None,
    )?)
    .context("cannot parse the output of `ip -j -4 route show table all`")?;
    for route in routes.as_array().into_iter().flatten() {
        if let Some(p) = route["dst"].as_str().and_then(spec::Prefix::parse) {
            used.push(p);
        }
    }
    let mut others: Vec<String> = namespaces()?.into_keys().collect();
    others.extend(state_names());
    others.sort();
    others.dedup();
    for other in others.iter().filter(|o| o.as_str() != except) {
        let subnet = match read_state(other) {
            Some(s) => spec::Prefix::parse(&s.subnet),
            None => {
                let roles = namespaces_of(other)?;
                inspect(ip, other, &roles)
                    .subnet
                    .and_then(|s| spec::Prefix::parse(&s))
            }
        };
        used.extend(subnet);
    }
    Ok(used)
}

/// `list --format text` of `clusters`.
pub fn format_text(clusters: &[ClusterView]) -> String {
    if clusters.is_empty() {
        return "no clusters\n".to_string();
    }
    let mut out = String::new();
    let unknown = || "?".to_string();
    for c in clusters {
        let loss = c.loss.map_or_else(unknown, spec::fmt_loss);
        out.push_str(&format!(
            "cluster {}: {} node{}, subnet {}, link {}, loss {}, mtu {}{}\n",
            c.name,
            c.nodes.len(),
            if c.nodes.len() == 1 { "" } else { "s" },
            c.subnet.clone().unwrap_or_else(unknown),
            c.link.clone().unwrap_or_else(unknown),
            loss,
            c.mtu.map_or_else(unknown, |m| m.to_string()),
            if c.complete {
                ""
            } else {
                " (incomplete: run `quiver cluster down` and `up` again)"
            },
        ));
        if let Some(t) = c.tbf {
            let peak = match (t.peakrate_bps, t.minburst) {
                (Some(rate), Some(bucket)) => format!(", peak rate {rate} bit/s with {bucket} B"),
                _ => String::new(),
            };
            out.push_str(&format!(
                "  tbf on both ends of every link: burst {} B{peak}, limit {} B\n",
                t.burst, t.limit
            ));
        }
        let rows: Vec<[String; 5]> = c
            .nodes
            .iter()
            .map(|n| {
                [
                    n.node.clone(),
                    n.namespace.clone(),
                    n.interface.clone(),
                    n.mac.clone().unwrap_or_else(|| "-".into()),
                    n.ip.map_or_else(|| "-".into(), |ip| ip.to_string()),
                ]
            })
            .collect();
        let header = ["node", "namespace", "interface", "mac", "ip"].map(str::to_string);
        let mut width = header.clone().map(|h| h.len());
        for r in &rows {
            for (w, cell) in width.iter_mut().zip(r) {
                *w = (*w).max(cell.len());
            }
        }
        for r in std::iter::once(&header).chain(&rows) {
            let mut line = String::new();
            for (cell, w) in r.iter().zip(width) {
                line.push_str(&format!("  {cell:<w$}"));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

#!/usr/bin/env python3
"""Tables of bench/cluster.sh from its results directory.

usage: summarise.py OUT_DIR REPS ELAPSED_S "SCENARIOS"
Reads OUT_DIR/records.tsv (scenario, system, metric, size, repetition, value),
OUT_DIR/commands.tsv (scenario, system, command) and OUT_DIR/meta.tsv (the clusters).
Cells are median (min-max) over the repetitions; ratios are of medians, with the ratios
paired per repetition beside them. MB/s = 10^6 B/s; latency = one-way = round trip / 2.
"""
import math
import os
import platform
import statistics
import sys
from collections import defaultdict

out, reps, elapsed, scenarios = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
R = defaultdict(dict)          # (scen, system, metric, size) -> {rep: value}
for line in open(os.path.join(out, "records.tsv")):
    f = line.rstrip("\n").split("\t")
    if len(f) != 6:
        continue
    try:
        R[(f[0], f[1], f[2], int(f[3]))][int(f[4])] = float(f[5])
    except ValueError:
        pass
CMDS = defaultdict(list)       # (scen, system) -> unique commands, in order
for line in open(os.path.join(out, "commands.tsv")):
    f = line.rstrip("\n").split("\t")
    if len(f) == 3 and f[2] not in CMDS[(f[0], f[1])]:
        CMDS[(f[0], f[1])].append(f[2])
META = [l.rstrip("\n").split("\t") for l in open(os.path.join(out, "meta.tsv")) if l.strip()]


def vals(scen, system, metric, size):
    return R.get((scen, system, metric, size), {})


def med(d):
    return statistics.median(d.values()) if d else None


def fnum(v, d=None):
    if v is None:
        return "-"
    if d is None:
        d = 0 if abs(v) >= 1000 else 1 if abs(v) >= 100 else 2 if abs(v) >= 1 else 3
    return f"{v:.{d}f}"


def cell(d, dec=None):
    if not d:
        return "-"
    v = list(d.values())
    return f"{fnum(statistics.median(v), dec)} ({fnum(min(v), dec)}-{fnum(max(v), dec)})"


def ratio(a, b):
    """ratio of medians and the paired ratios per repetition"""
    if not a or not b:
        return None, "-"
    r = med(a) / med(b)
    paired = " ".join(f"{a[k] / b[k]:.2f}" for k in sorted(a) if k in b and b[k] > 0)
    return r, paired


def size_name(s):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if s >= n and s % n == 0:
            return f"{s // n} {unit}"
    return f"{s} B"


def verdict(ok):
    return "-" if ok is None else ("met" if ok else "**not met**")


def commands(pairs, only=None):
    """the commands of (scenario, system) pairs; only: keep those containing one of these words"""
    lines = []
    for key in pairs:
        for c in CMDS.get(key, []):
            if only is None or any(w in f" {c} " for w in only):
                lines.append(f"- {key[1]}: `{c}`")
    return "\n".join(lines)


P = print
P(f"# bench/cluster.sh: Ethernet figures of GAMMA and Directed Point on a 2-node emulated cluster\n")
P(f"- {reps} repetition(s) per figure; cells are **median (min-max) over the repetitions**; "
  f"measurements took {elapsed // 60} min {elapsed % 60} s; host {platform.node()}, kernel {platform.release()}, "
  f"{os.cpu_count()} cores; scenarios: {' '.join(scenarios)}.")
P("- Latency = one-way = round trip / 2, in µs (quiver: median of its round trips; raw ping-pongs: p50; "
  "Open MPI mpi_lat: median). Bandwidth in MB/s = 10^6 B/s (quiver: mean of the middle 80 % of its windows).")
P("- rank 0 / client / sender on node 0 pinned to core 0, rank 1 / server on node 1 pinned to core 1; "
  "every timing run under `flock -x /tmp/bench.lock`.")
P("- Clusters (`quiver cluster up NAME --nodes 2 --link LINK --mtu MTU`):\n")
P("| cluster | link | MTU | tbf rate (bit/s) | tbf burst (B) | tbf peak rate (bit/s) | tbf peak bucket (B) | tbf limit (B) | subnet |")
P("|---|---|---|---|---|---|---|---|---|")
for m in META:
    peak, minburst = (m[9], m[10]) if len(m) > 10 else ("0", "")
    P(f"| {m[0]} | {m[1]} | {m[2]} | {m[3] if m[3] != '0' else '-'} | {m[4] or '-'} | "
      f"{peak if peak != '0' else '-'} | {minburst or '-'} | {m[5] or '-'} | {m[6]} |")
P()


def link_rate(scen):
    """link rate in MB/s and MTU of a scenario's cluster"""
    for m in META:
        if m[1] == scen:
            return int(m[3]) / 8e6, int(m[2])
    return None, 1500


def limits(rate, mtu):
    """payload limit per frame format: eth (MTU-36)/(MTU+14), udp (MTU-60)/(MTU+14) of the rate"""
    return {"eth": rate * (mtu - 36) / (mtu + 14), "udp": rate * (mtu - 60) / (mtu + 14)}


def wire_expected(tr, mtu):
    return (mtu + 14) / (mtu - (36 if tr == "eth" else 60))


# ---------------------------------------------------------------- 1a
if "unshaped" in scenarios:
    S = "unshaped"
    P("## 1a. Unshaped veth, MTU 1500: 8 B one-way latency (µs)\n")
    P("| system | one-way 8 B (median / p50) | mean (quiver: avg80) |")
    P("|---|---|---|")
    rows = [("quiver eth", "lat_avg80"), ("AF_PACKET ping-pong (busy)", "lat_avg"),
            ("AF_PACKET ring ping-pong", "lat_avg"),
            ("quiver udp", "lat_avg80"), ("UDP ping-pong (busy)", "lat_avg")]
    for sysname, mean_metric in rows:
        P(f"| {sysname} | {cell(vals(S, sysname, 'lat', 8))} | {cell(vals(S, sysname, mean_metric, 8))} |")
    P("\n| ratio | of medians | paired per repetition | target | |")
    P("|---|---|---|---|---|")
    for a, b, target, note in (("quiver eth", "AF_PACKET ping-pong (busy)", 1.15, ""),
                               ("quiver eth", "AF_PACKET ring ping-pong", None, "(quiver's own cost)"),
                               ("quiver udp", "UDP ping-pong (busy)", 1.15, ""),
                               ("quiver eth", "quiver udp", None, "(eth vs udp)")):
        r, paired = ratio(vals(S, a, "lat", 8), vals(S, b, "lat", 8))
        P(f"| {a} / {b} | {fnum(r)} | {paired} | {'<= %.2f' % target if target else note} | "
          f"{verdict(None if r is None or target is None else r <= target)} |")
    P("\nThe target names the anchors' `limits/afpacket_pingpong` (recvfrom spin); `AF_PACKET ring ping-pong` "
      "(bench/progs/afpacket_ring_pp.c) reads a TPACKET_V2 receive ring in place, as quiver eth does: the "
      "fastest raw path we know, shown for what it says about quiver's own cost.")
    P("\nCommands:\n" + commands([(S, s) for s, _ in rows],
                                 [" pingpong ", "afpacket_pingpong ", "afpacket_ring_pp ", "udp_pingpong "]) + "\n")

    # ------------------------------------------------------------ 1b
    P("## 1b. Unshaped veth, MTU 1500: uni-directional bandwidth (MB/s)\n")
    sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20]
    P("| system | " + " | ".join(size_name(s) for s in sizes) + " | stream |")
    P("|---|" + "---|" * (len(sizes) + 1))
    for sysname, metric in (("quiver eth", "bw"), ("quiver udp", "bw"), ("Open MPI (ob1/tcp)", "bw")):
        P(f"| {sysname} | " + " | ".join(cell(vals(S, sysname, metric, s)) for s in sizes) + " | - |")
    P(f"| iperf3 TCP (1 stream) | " + " | ".join("-" for _ in sizes) + f" | {cell(vals(S, 'iperf3 TCP', 'stream', 0))} |")
    P("\nMessages per window (quiver: as run, udp capped by quiver at 2 MiB; Open MPI: 64, at most 64 MiB per window):")
    P("| system | " + " | ".join(size_name(s) for s in sizes) + " |")
    P("|---|" + "---|" * len(sizes))
    for sysname in ("quiver eth", "quiver udp"):
        P(f"| {sysname} | " + " | ".join(fnum(med(vals(S, sysname, 'bw_window', s)), 0) for s in sizes) + " |")
    P("\nBytes node 0 put on qv0 per payload byte (expected without retransmission: eth "
      f"{wire_expected('eth', 1500):.3f}, udp {wire_expected('udp', 1500):.3f}):")
    P("| system | " + " | ".join(size_name(s) for s in sizes) + " |")
    P("|---|" + "---|" * len(sizes))
    for sysname in ("quiver eth", "quiver udp"):
        P(f"| {sysname} | " + " | ".join(cell(vals(S, sysname, 'bw_wire', s), 3) for s in sizes) + " |")
    P("\n| ratio at 1 MiB | of medians | paired per repetition | target | |")
    P("|---|---|---|---|---|")
    for a in ("quiver eth", "quiver udp"):
        r, paired = ratio(vals(S, a, "bw", 1 << 20), vals(S, "Open MPI (ob1/tcp)", "bw", 1 << 20))
        P(f"| {a} / Open MPI (ob1/tcp) | {fnum(r)} | {paired} | >= 1 | {verdict(None if r is None else r >= 1)} |")
    r, paired = ratio(vals(S, "quiver eth", "bw", 1 << 20), vals(S, "iperf3 TCP", "stream", 0))
    P(f"| quiver eth / iperf3 TCP stream | {fnum(r)} | {paired} | - | - |")
    P("\nCommands:\n" + commands([(S, s) for s in ("quiver eth", "quiver udp", "Open MPI (ob1/tcp)", "iperf3 TCP")], [" bw ", "pp_ompi ", "iperf3 "]) + "\n")

    # ------------------------------------------------------------ 1c
    P("## 1c. Unshaped veth: quiver bandwidth by MTU (MB/s), what jumbo frames buy\n")
    sizes = [64 << 10, 1 << 20, 16 << 20]
    P("| system | MTU | payload per frame (B) | " + " | ".join(size_name(s) for s in sizes) + " | 1 MiB vs MTU 1500 |")
    P("|---|---|---|" + "---|" * (len(sizes) + 1))
    for tr in ("eth", "udp"):
        base = vals(S, f"quiver {tr}", "bw", 1 << 20)
        for mtu in (1500, 9000, 65000):
            sysname = f"quiver {tr}" if mtu == 1500 else f"quiver {tr} MTU {mtu}"
            r, _ = ratio(vals(S, sysname, "bw", 1 << 20), base)
            P(f"| quiver {tr} | {mtu} | {mtu - (36 if tr == 'eth' else 60)} | "
              + " | ".join(cell(vals(S, sysname, 'bw', s)) for s in sizes) + f" | {fnum(r)}x |")
    P("\nCommands:\n" + commands([(S, f"quiver {tr} MTU {m}") for tr in ("eth", "udp") for m in (9000, 65000)]) + "\n")

# ---------------------------------------------------------------- shaped throughput
def shaped_throughput(S, title, tests):
    """tests: (system, test, size, frame format eth|udp|tcp)"""
    rate, mtu = link_rate(S)
    if rate is None:
        return
    lim = limits(rate, mtu)
    lim["tcp"] = rate * (mtu - 52) / (mtu + 14)
    lim["raw"] = rate * mtu / (mtu + 14)
    raw = any(fmt == "raw" for _, _, _, fmt in tests)
    P(f"## {title}\n")
    P(f"Link rate {rate:.3f} MB/s each way (tbf counts the 14-byte Ethernet header); payload limits: "
      f"eth (MTU-36)/(MTU+14) = {lim['eth']:.3f} MB/s, udp (MTU-60)/(MTU+14) = {lim['udp']:.3f} MB/s per direction "
      f"(bibw: twice); the iperf3 TCP anchor on the same link: (MTU-52)/(MTU+14) = {lim['tcp']:.3f} MB/s "
      f"(IP + TCP + timestamps)"
      + (f"; the raw AF_PACKET streams (bench/progs/afpacket_blast: MTU-sized frames, no protocol, no "
         f"receiving program; bibw: one stream each way at once, the two summed): MTU/(MTU+14) = "
         f"{lim['raw']:.3f} MB/s per direction" if raw else "")
      + ". Target for quiver: within 1 % of the limit.\n")
    P("| system | test | size | window | MB/s | % of link | limit MB/s | % of limit | target >= 99 % | wire bytes / payload (expected) |")
    P("|---|---|---|---|---|---|---|---|---|---|")
    keys = []
    for sysname, test, size, fmt in tests:
        d = vals(S, sysname, test, size)
        ways = 2 if test == "bibw" else 1
        l = lim[fmt] * ways
        m = med(d)
        pct_link = None if m is None else 100 * m / (rate * ways)
        pct_lim = None if m is None else 100 * m / l
        if m is None:
            v = "-"
        elif not sysname.startswith("quiver") or "--reliability none" in sysname:
            v = "(anchor)" if not sysname.startswith("quiver") else "(diagnostic)"
        else:
            v = verdict(pct_lim >= 99)
        wire = "-" if fmt in ("tcp", "raw") else f"{cell(vals(S, sysname, test + '_wire', size), 3)} ({wire_expected(fmt, mtu):.3f})"
        win = "-" if fmt in ("tcp", "raw") else fnum(med(vals(S, sysname, test + '_window', size)), 0)
        P(f"| {sysname} | {test} | {size_name(size) if size else '-'} | {win} | {cell(d)} | "
          f"{fnum(pct_link, 1)} % | {l:.3f} | {fnum(pct_lim, 1)} % | {v} | {wire} |")
        if (S, sysname) not in keys:
            keys.append((S, sysname))
    P("\nCommands:\n" + commands(keys, [" bw ", " bibw ", "iperf3 ", "afpacket_blast "]) + "\n")


if "100mbit" in scenarios:
    S = "100mbit"
    tests = [(f"quiver {tr}", "bw", s, tr) for tr in ("eth", "udp") for s in (1 << 20, 16 << 20)]
    tests += [(f"quiver {tr} --reliability none", "bw", 1 << 20, tr) for tr in ("eth", "udp")]
    tests += [("quiver ports eth", "bw", 1 << 20, "eth")]
    tests += [("iperf3 TCP", "stream", 0, "tcp")]
    shaped_throughput(S, "2a. 100 Mbit/s link, MTU 1500: large-message throughput (uni-directional)", tests)

    # ------------------------------------------------------------ half-power
    systems = ["quiver eth", "quiver udp", "Open MPI (ob1/tcp)", "quiver eth --wait block",
               "quiver ports eth", "quiver ports eth buffered"]
    sizes = sorted({k[3] for k in R if k[0] == S and k[2] == "lat" and k[1] in systems})
    P("## 2b. 100 Mbit/s link: ping-pong throughput (GAMMA Figure 1): size / one-way time, one message in flight\n")
    P("Cells: one-way µs, median / avg80 (mean of the middle 80 % of the round trips), each the median over "
      "repetitions, and the throughput size / median one-way time. Open MPI: the anchors' launch recipe with "
      "bench/cluster/mpi_lat.c (same sizes, same statistics). `quiver eth --wait block` is a diagnostic "
      "(blocking reads instead of spinning). On tbf a frame passes without serialization delay while the "
      "bucket holds tokens, and each direction has buckets of its own, so a ping-pong of frames below the "
      "burst can exceed the link rate (up to twice it, one direction refilling while the other sends): "
      "the curve rises above the link rate for a few hundred bytes to a few KiB and falls to it only for "
      "messages well above the burst, and the half-power point is "
      "set by the small-message one-way latency (half-power size ~ one-way latency x asymptote / 2).\n")
    P("| size | " + " | ".join(systems) + " |")
    P("|---|" + "---|" * len(systems))
    for s in sizes:
        cells = []
        for sysname in systems:
            m, a = med(vals(S, sysname, "lat", s)), med(vals(S, sysname, "lat_avg80", s))
            cells.append("-" if m is None else f"{fnum(m)} / {fnum(a)} µs = {fnum(s / m)} MB/s")
        P(f"| {size_name(s)} | " + " | ".join(cells) + " |")

    def half_power(curve):
        """curve: [(size, one-way us)] -> (asymptote MB/s, first size >= half, log-interpolated size)"""
        curve = sorted(curve)
        if len(curve) < 2:
            return None
        thr = [(s, s / t) for s, t in curve if t > 0]
        asym = thr[-1][1]
        prev = None
        for s, v in thr:
            if v >= asym / 2:
                if prev is None:
                    return asym, s, s
                s0, v0 = prev
                frac = (asym / 2 - v0) / (v - v0)
                return asym, s, 2 ** (math.log2(s0) + frac * (math.log2(s) - math.log2(s0)))
            prev = (s, v)
        return None

    P("\n### Half-power point: the smallest size whose ping-pong throughput reaches half of the 64 KiB throughput\n")
    P("Per repetition from that repetition's curve; median (min-max) over repetitions; \"interpolated\" is "
      "log-linear between the two sizes around half. One-way time per size: the median of the round trips "
      "(and, second block, their avg80). Target: quiver eth <= 192 B and <= half of Open MPI's (median rows).\n")
    P("| system | statistic | asymptote (64 KiB) MB/s | half-power size (first size >= half) | interpolated (B) | from the median curve: first / interpolated |")
    P("|---|---|---|---|---|---|")
    hp, asyms = {}, {}
    for metric in ("lat", "lat_avg80"):
        for sysname in systems:
            per = {}
            for rep in range(1, reps + 1):
                curve = [(s, vals(S, sysname, metric, s)[rep]) for s in sizes if rep in vals(S, sysname, metric, s)]
                h = half_power(curve)
                if h:
                    per[rep] = h
            mc = half_power([(s, med(vals(S, sysname, metric, s))) for s in sizes if vals(S, sysname, metric, s)])
            hp[(sysname, metric)] = {k: v[2] for k, v in per.items()}
            asyms[(sysname, metric)] = {k: v[0] for k, v in per.items()}
            P(f"| {sysname} | {'median' if metric == 'lat' else 'avg80'} | {cell({k: v[0] for k, v in per.items()})} | "
              f"{cell({k: v[1] for k, v in per.items()}, 0)} | {cell({k: v[2] for k, v in per.items()}, 0)} | "
              f"{'-' if not mc else f'{mc[1]} B / {mc[2]:.0f} B'} |")
    e, o = med(hp[("quiver eth", "lat")]), med(hp[("Open MPI (ob1/tcp)", "lat")])
    P("\n| target | value | |")
    P("|---|---|---|")
    P(f"| quiver eth half-power (interpolated, median) <= 192 B | {fnum(e, 0)} B | {verdict(None if e is None else e <= 192)} |")
    P(f"| quiver eth <= half of Open MPI's (interpolated, medians) | {fnum(e, 2)} B vs {fnum(o, 2)} / 2 = {fnum(None if o is None else o / 2, 2)} B | "
      f"{verdict(None if e is None or o is None else e <= o / 2)} |")
    r, paired = ratio(hp[("quiver eth", "lat")], hp[("Open MPI (ob1/tcp)", "lat")])
    P(f"| quiver eth / Open MPI (interpolated), paired per repetition | {paired} | - |")
    pe = med(hp.get(("quiver ports eth", "lat"), {}))
    if pe is not None:
        P(f"| quiver ports eth half-power (interpolated, median) <= 192 B | {fnum(pe, 0)} B | {verdict(pe <= 192)} |")
        P(f"| quiver ports eth <= half of Open MPI's (interpolated, medians) | {fnum(pe, 2)} B vs {fnum(o, 2)} / 2 | "
          f"{verdict(None if o is None else pe <= o / 2)} |")
        b = med(hp.get(("quiver ports eth buffered", "lat"), {}))
        P(f"| quiver ports eth buffered (one extra receive copy) half-power | {fnum(b, 0)} B | - |")
    # The limits of this path: throughput at size s is s / t(s), and no quiver frame crosses
    # the two tbfs faster than a raw 60-byte frame, so half of an asymptote A needs
    # s >= A / 2 x t_raw. Shown for both raw ping-pongs.
    asym = asyms[("quiver eth", "lat")]
    for raw_sys, how in (("AF_PACKET ping-pong (busy)", "anchors' limits/afpacket_pingpong, recvfrom spin"),
                         ("AF_PACKET ring ping-pong", "bench/progs/afpacket_ring_pp, receive ring read in place")):
        raw = vals(S, raw_sys, "lat", 8)
        if not raw or not asym:
            continue
        t, a = med(raw), med(asym)
        bound = a / 2 * t
        P(f"| {raw_sys} ({how}), 60-byte frames through the same link, one-way | {cell(raw)} µs | - |")
        P(f"| the half-power a sender as fast as that would reach (quiver eth's asymptote / 2 x that time) | "
          f"{fnum(a)} / 2 x {fnum(t)} = {fnum(bound, 1)} B = {fnum(None if not o else bound / o)}x Open MPI's | "
          f"{'-' if not o else 'within half of Open MPI' if bound <= o / 2 else 'above half of Open MPI'} |")
    # The machine moves between a fast and a slow phase within minutes (PERFORMANCE,
    # section 3): the raw ring ping-pong of each repetition shows which one it ran in.
    ring = vals(S, "AF_PACKET ring ping-pong", "lat", 8)
    qe, om = hp[("quiver eth", "lat")], hp[("Open MPI (ob1/tcp)", "lat")]
    if qe and om:
        P("\nPer repetition, unrounded. The raw ring ping-pong of the same repetition hints at the "
          "machine's phase (about 3.0 µs fast, 3.4 µs slow through this link); it ran minutes "
          "apart from the others, and the phase can change in between.\n")
        P("| repetition | quiver eth half-power (B) | Open MPI half-power (B) | quiver / Open MPI | "
          "quiver eth 16 B one-way (µs) | Open MPI 16 B one-way (µs) | raw ring 8 B one-way (µs) |")
        P("|---|---|---|---|---|---|---|")
        for k in sorted(qe):
            q16 = vals(S, "quiver eth", "lat", 16).get(k)
            o16 = vals(S, "Open MPI (ob1/tcp)", "lat", 16).get(k)
            P(f"| {k} | {fnum(qe[k], 2)} | {fnum(om.get(k), 2)} | "
              f"{fnum(None if not om.get(k) else qe[k] / om[k], 3)} | {fnum(q16)} | {fnum(o16)} | "
              f"{fnum(ring.get(k))} |")
    P("\nCommands:\n" + commands([(S, s) for s in systems + ["AF_PACKET ping-pong (busy)", "AF_PACKET ring ping-pong"]],
                                 [" pingpong ", "mpi_lat ", "afpacket_pingpong ", "afpacket_ring_pp "]) + "\n")

if "1gbit" in scenarios:
    S = "1gbit"
    tests = [(f"quiver {tr}", t, s, tr) for tr in ("eth", "udp") for t in ("bw", "bibw") for s in (1 << 20, 16 << 20)]
    tests += [(f"quiver {tr} --reliability none", "bw", 1 << 20, tr) for tr in ("eth", "udp")]
    tests += [("iperf3 TCP", "stream", 0, "tcp")]
    tests += [("raw AF_PACKET stream", t, 0, "raw") for t in ("bw", "bibw")]
    shaped_throughput(S, "3. 1 Gbit/s link, MTU 1500: throughput, uni- (bw) and bi-directional (bibw)", tests)

# ---------------------------------------------------------------- GAMMA Table 1
if "gamma" in scenarios:
    S, U = "gamma", "unshaped"
    P("## 4. GAMMA Table 1 style: unshaped veth, MTU 1500\n")
    P("Latency: 8 B one-way, busy-polling on both sides (quiver: median; socket ping-pongs: p50). "
      "Throughput: quiver = best median of its uni-directional bw runs over 64 KiB-16 MiB (size given); "
      "kernel sockets = iperf3, one stream, receiver side.\n")
    P("| system | one-way latency 8 B (µs) | large-message throughput (MB/s) | what |")
    P("|---|---|---|---|")

    def best_bw(sysname):
        best = None
        for s in (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20):
            d = vals(U, sysname, "bw", s)
            if d and (best is None or med(d) > med(best[1])):
                best = (s, d)
        return best

    for sysname, what in (("quiver eth", "quiver bench pingpong / bw --transport eth"),
                          ("quiver udp", "quiver bench pingpong / bw --transport udp")):
        b = best_bw(sysname)
        P(f"| {sysname} | {cell(vals(U, sysname, 'lat', 8))} | {'-' if not b else cell(b[1]) + ' (' + size_name(b[0]) + ')'} | {what} |")
    P(f"| kernel TCP sockets | {cell(vals(S, 'TCP ping-pong (busy)', 'lat', 8))} | {cell(vals(U, 'iperf3 TCP', 'stream', 0))} (stream) | "
      "bench/cluster/tcp_pingpong.c (TCP_NODELAY); iperf3 TCP |")
    loss = vals(S, "iperf3 UDP (-b 0 -l 1472)", "loss_pct", 0)
    P(f"| kernel UDP sockets | {cell(vals(U, 'UDP ping-pong (busy)', 'lat', 8))} | {cell(vals(S, 'iperf3 UDP (-b 0 -l 1472)', 'stream', 0))} "
      f"(1472 B datagrams, loss {fnum(med(loss))} %) | anchors' limits/udp_pingpong.c; iperf3 -u -b 0 -l 1472 |")
    P(f"| (raw AF_PACKET, no protocol) | {cell(vals(U, 'AF_PACKET ping-pong (busy)', 'lat', 8))} | - | anchors' limits/afpacket_pingpong.c |")
    P("\nCommands:\n" + commands([(U, "quiver eth"), (U, "quiver udp"), (S, "TCP ping-pong (busy)"), (U, "iperf3 TCP"),
                                  (U, "UDP ping-pong (busy)"), (S, "iperf3 UDP (-b 0 -l 1472)")]) + "\n")

failed = sum(1 for l in open(os.path.join(out, "raw.log")) if l.startswith("FAILED\t"))
if failed:
    P(f"**{failed} measurement(s) failed** and are missing above: grep '^FAILED' {out}/raw.log\n")

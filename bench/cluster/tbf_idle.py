"""Splits the idle time of every tbf in a tracefs trace (bench/tbf-trace.sh).

usage: tbf_idle.py TRACE [LINK]      LINK: 1gbit (default) or 100mbit

Each tbf feeds a virtual wire at the link rate: a dequeued frame occupies it for its
length (`net_dev_queue`'s, which includes the Ethernet header). When a frame is dequeued after the wire went free, the gap is idle time: while nothing
was enqueued yet, the sender's; from the frame's enqueue on, the tbf's (it held a
frame it had tokens for, because the kernel woke it late). A segmentation-offload skb
is one enqueue of len/1514 segments, dequeued one by one; that count misses often
(udp with offload: the node's tbf shows fewer frames than its switch port), so with
offload only the switch port's figures hold. Approximate: the wire runs at
exactly the link rate, so a tbf that sends faster for a while (a peak rate) shows less
idle time than it had. Only tbfs with at least 1000 frames are printed.
"""
import re, sys, collections
RATE = {"1gbit": 125e6, "100mbit": 12.5e6}[sys.argv[2] if len(sys.argv) > 2 else "1gbit"]
rx = re.compile(r'\s(\d+\.\d+): (qdisc_enqueue|qdisc_dequeue|net_dev_queue): (.*)')
kv = lambda s: dict(x.split('=', 1) for x in s.split() if '=' in x)
lens = {}                           # skbaddr -> len (net_dev_queue, before the qdisc)
pend = collections.defaultdict(collections.deque)   # handle -> deque [enq_time, segments left]
wire = {}; stat = collections.defaultdict(lambda: [0.0, 0.0, 0])
t0 = t1 = None
for line in open(sys.argv[1]):
    m = rx.search(line)
    if not m: continue
    t = float(m.group(1)); ev = m.group(2); f = kv(m.group(3))
    t0 = t if t0 is None else t0; t1 = t
    if ev == 'net_dev_queue':
        lens[f['skbaddr']] = int(f['len']); continue
    h = f['handle']
    if ev == 'qdisc_enqueue':
        L = lens.get(f['skbaddr'], 1514)
        segs = max(1, round(L / 1514)) if L > 1514 else 1
        pend[h].append([t, segs, L / segs]); continue
    if int(f.get('packets', 0)) == 0: continue
    if not pend[h]: continue
    e = pend[h][0]; te, size = e[0], e[2]
    e[1] -= 1
    if e[1] == 0: pend[h].popleft()
    s = stat[h]; free = wire.get(h, t)
    if t > free:
        s[1] += max(0.0, min(te, t) - free)       # nothing waiting
        s[0] += t - max(te, free)                  # a frame waited, tbf did not send it
    wire[h] = max(free, t) + size / RATE
    s[2] += 1
if t0 is None:
    sys.exit(f"{sys.argv[1]}: no qdisc events in the trace")
span = t1 - t0
print(f"trace span {span*1e3:.1f} ms")
for h, s in stat.items():
    if s[2] < 1000: continue
    print(f"qdisc {h}: {s[2]} frames; wire busy {100 - (s[0]+s[1])/span*100:.1f} %; idle with a frame waiting {s[0]/span*100:.2f} %, with nothing waiting {s[1]/span*100:.2f} %")

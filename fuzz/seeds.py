#!/usr/bin/env python3
"""Writes the seed corpora of the tagged_decode, rendezvous_request and channel_frames
fuzz targets (fuzz/corpus/<target>/seed-*). Run it again after a change of the formats
the targets read: python3 fuzz/seeds.py
(frame_decode's seeds come from `cargo test -p quiver --lib wire::tests::write_fuzz_seeds
-- --ignored`.)"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


# tagged_decode: one message of each kind, laid out as crates/quiver/src/tagged/wire.rs
# documents (little-endian; kind byte, then the header, then the payload).
def tagged():
    push = struct.pack("<BBHIQQQIIQ", 1, 0, 3, 7, 42, 5000, 100, 4242, 0, 0xDEADBEEF0000)
    write("tagged_decode", "push", push + bytes(range(64)))
    write("tagged_decode", "more", struct.pack("<B7xQQ", 2, 42, 64) + b"\x09" * 36)
    write("tagged_decode", "pull", struct.pack("<B7xQQQ", 3, 42, 100, 4900))
    write("tagged_decode", "data", struct.pack("<B7xQQ", 4, 42, 100) + b"\x01\x02\x03")
    write("tagged_decode", "done", struct.pack("<B7xQ", 5, 42))
    write("tagged_decode", "credit", struct.pack("<B7xQ", 6, 1 << 20))
    write("tagged_decode", "abandon", struct.pack("<B7xQ", 7, 42))


# rendezvous_request: [limit, capacity, split] then what a client sends. limit 200 means
# the server's own line limit; split 0 is one read, others cut the stream.
def rendezvous():
    session = (
        b"PUT job/1/addr 10.0.0.1:7000\n"
        b"PUTNX barrier/0 1\n"
        b"GET job/1/addr 30000\r\n"
        b"TRYGET job/2/addr\n"
    )
    write("rendezvous_request", "session", bytes([200, 200, 0]) + session)
    write("rendezvous_request", "session-pieces", bytes([200, 3, 77]) + session)
    bad = b"\nHELLO\nPUT onlykey\nPUT k v extra\nPUT  k v\nGET k soon\nGET k -1\nput k v\nPUT k \xff\xfe\nPUT k v"
    write("rendezvous_request", "malformed", bytes([200, 16, 5]) + bad)
    # Lines past a small limit, one exactly at it (its \r counted), one cut by the end.
    write("rendezvous_request", "too-long", bytes([12, 4, 9]) + b"PUT k 0123456789\nPUT kk vvvv\r\nGET k 1\nTRYGET abc")
    # A line past the server's own limit.
    long = b"PUT k " + b"v" * 8500 + b"\nTRYGET k\n"
    write("rendezvous_request", "too-long-server", bytes([200, 200, 1]) + long)


# channel_frames: [mode etc., window, datagram size] then operations (opcode byte, the
# high bit picking the endpoint; see the target for the arguments).
PUMP = b"\x00"


def send(side, n):
    return bytes([10 | side << 7]) + struct.pack("<H", n)


def send_lone(side, n, cut):
    return bytes([20 | side << 7, n, cut])


def send_part(side, n, cut, ahead):
    return bytes([25 | side << 7]) + struct.pack("<H", n) + bytes([cut, ahead])


def transmit(side, n):
    return bytes([30 | side << 7, n])


def network(side, action, i, at=0, flip=0):
    return bytes([45 | side << 7, action, i, at, flip])


def forge(side, kind, flags, near, seq, ack, credits):
    return bytes([70 | side << 7, kind, flags, near]) + struct.pack("<IIH", seq, ack, credits)


def deliver(side):
    return bytes([85 | side << 7])


def release(side, n):
    return bytes([95 | side << 7, n])


def timeout(side):
    return bytes([110 | side << 7])


def advance(v, unit):
    return bytes([115]) + struct.pack("<H", v) + bytes([unit])


NEXT_DEADLINE = advance(0, 3)


def channel():
    # Host, go-back-N, W = 8: a few messages both ways, pumped.
    write("channel_frames", "host-gbn", bytes([0x01, 7, 40]) + send(0, 300) + send(1, 20)
          + PUMP * 4 + send_lone(0, 10, 3) + PUMP * 3)
    # Host, selective repeat, W = 4: a loss and a reordering, repaired by timeouts.
    write("channel_frames", "host-selective-loss", bytes([0x05, 3, 20]) + send(0, 200)
          + transmit(0, 8) + network(0, 2, 0) + network(0, 0, 2) + network(0, 4, 0)
          + transmit(1, 4) + network(1, 0, 0) + NEXT_DEADLINE + timeout(0) + PUMP
          + NEXT_DEADLINE + PUMP * 3)
    # Offload with liveness, W = 2: an idle pair's heartbeats, then silence from one side.
    write("channel_frames", "offload-liveness", bytes([0x12, 1, 0]) + send(1, 5) + PUMP
          + (NEXT_DEADLINE + PUMP) * 3 + (NEXT_DEADLINE + timeout(0) + transmit(0, 4)) * 4)
    # None with checksums, W = 4: a lost frame, a corrupted one, a tail probe.
    write("channel_frames", "none-checksum", bytes([0x08, 3, 10]) + send(0, 120)
          + transmit(0, 7) + network(0, 2, 1) + network(0, 3, 0, 40, 0x10) + network(0, 0, 0)
          + deliver(1) + NEXT_DEADLINE + timeout(0) + PUMP + release(1, 9))
    # Blocked sender, parts, releases held back: credits and zero-window probes.
    write("channel_frames", "credits", bytes([0x01, 2, 5]) + send_part(0, 400, 4, 1)
          + PUMP + send_part(0, 0, 0, 1) + transmit(0, 3) + network(0, 0, 0) + deliver(1)
          + NEXT_DEADLINE + timeout(0) + PUMP + release(1, 1) + PUMP + send_part(0, 0, 0, 2) + PUMP * 2)
    # Forged frames: acknowledgements near the right ones, a probe, a goodbye.
    write("channel_frames", "forged", bytes([0x05, 15, 30]) + send(0, 500) + transmit(0, 5)
          + forge(0, 1, 4, 2, 0b1010, 2, 8) + forge(1, 0, 7, 1, 1, 0, 16) + forge(1, 2, 4, 3, 9, 0, 4)
          + forge(0, 3, 4, 0, 0, 0, 0) + PUMP + NEXT_DEADLINE + PUMP)


tagged()
rendezvous()
channel()

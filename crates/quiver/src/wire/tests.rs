//! Tests of the wire format: layout, round trips, rejection of malformed frames,
//! checksums, fragmentation plans, and properties over arbitrary input.

use proptest::prelude::*;

use super::*;

fn header(kind: FrameKind, flags: Flags) -> Header {
    Header {
        kind,
        flags,
        src_dpid: 0x0102,
        dst_dpid: 0x0304,
        credits: 0,
        src_rank: 0x0506_0708,
        job_id: 0x090a_0b0c,
        token: 0xdead_beef,
        seq: 0x1122_3344,
        ack: 0x5566_7788,
        checksum: 0,
    }
}

/// A datagram for `h` and a body given in parts; sealed when `h.flags` has CHECKSUM.
fn encode(h: &Header, body_parts: &[&[u8]]) -> Vec<u8> {
    let mut head = [0; HEADER_LEN];
    if h.flags.contains(Flags::CHECKSUM) {
        h.emit_sealed(&mut head, body_parts);
    } else {
        h.emit(&mut head);
    }
    let mut out = head.to_vec();
    for part in body_parts {
        out.extend_from_slice(part);
    }
    out
}

/// One valid frame of every shape, each without and with a checksum.
fn valid_frames() -> Vec<(&'static str, Vec<u8>)> {
    let mut frames = Vec::new();
    for (sealed, flags) in [("", Flags::EMPTY), ("-checksum", Flags::CHECKSUM)] {
        let data = |f: Flags| header(FrameKind::Data, f | flags);
        let prefix = 100u32.to_le_bytes();
        let shapes: [(&str, Header, Vec<&[u8]>); 8] = [
            (
                "data-single",
                data(Flags::FIRST | Flags::LAST),
                vec![b"hello"],
            ),
            ("data-empty", data(Flags::FIRST | Flags::LAST), vec![]),
            (
                "data-first",
                data(Flags::FIRST),
                vec![&prefix, b"0123456789"],
            ),
            ("data-middle", data(Flags::EMPTY), vec![b"middle"]),
            ("data-last", data(Flags::LAST), vec![b"z"]),
            ("ack", header(FrameKind::Ack, flags), vec![]),
            ("heartbeat", header(FrameKind::Heartbeat, flags), vec![]),
            ("goodbye", header(FrameKind::Goodbye, flags), vec![]),
        ];
        for (name, h, parts) in shapes {
            let name: &'static str = format!("{name}{sealed}").leak();
            frames.push((name, encode(&h, &parts)));
        }
    }
    frames
}

#[test]
fn layout_is_little_endian_at_the_documented_offsets() {
    let mut h = header(
        FrameKind::Data,
        Flags::FIRST | Flags::LAST | Flags::CHECKSUM,
    );
    h.credits = 0x0a0b;
    h.checksum = 0xcafe_f00d;
    let mut b = [0; HEADER_LEN];
    h.emit(&mut b);
    assert_eq!(b[field::VERSION_KIND], 0x11);
    assert_eq!(b[field::FLAGS], 0x07);
    assert_eq!(b[field::SRC_DPID..][..2], [0x02, 0x01]);
    assert_eq!(b[field::DST_DPID..][..2], [0x04, 0x03]);
    assert_eq!(b[field::CREDITS..][..2], [0x0b, 0x0a]);
    assert_eq!(b[field::SRC_RANK..][..4], [0x08, 0x07, 0x06, 0x05]);
    assert_eq!(b[field::JOB_ID..][..4], [0x0c, 0x0b, 0x0a, 0x09]);
    assert_eq!(b[field::TOKEN..][..4], [0xef, 0xbe, 0xad, 0xde]);
    assert_eq!(b[field::SEQ..][..4], [0x44, 0x33, 0x22, 0x11]);
    assert_eq!(b[field::ACK..][..4], [0x88, 0x77, 0x66, 0x55]);
    assert_eq!(b[field::CHECKSUM..][..4], [0x0d, 0xf0, 0xfe, 0xca]);
    let view = FrameView::new_checked(&b[..]).unwrap();
    assert_eq!(view.version(), VERSION);
    assert_eq!(view.kind_raw(), FrameKind::Data as u8);
    assert!(view.body().is_empty());
}

#[test]
fn emit_parse_round_trips_for_every_kind_and_flag_combination() {
    for kind in FrameKind::ALL {
        for bits in 0..=Flags::ALL.bits() {
            let flags = Flags::from_bits(bits).unwrap();
            let h = header(kind, flags);
            let mut b = [0; HEADER_LEN];
            h.emit(&mut b);
            let parsed = Header::parse(&b);
            let both_groups = flags.contains(Flags::GROUP | Flags::GROUP_REPLY);
            let stray_block = kind != FrameKind::Ack && flags.intersects(Flags::SACK_BLOCK);
            if (kind == FrameKind::Data || !flags.intersects(Flags::FIRST | Flags::LAST))
                && !both_groups
                && !stray_block
            {
                assert_eq!(parsed, Ok(h), "{kind:?} {flags:?}");
                let mut again = [0; HEADER_LEN];
                parsed.unwrap().emit(&mut again);
                assert_eq!(again, b);
            } else {
                assert!(
                    matches!(parsed, Err(DecodeError::BadFlags { .. })),
                    "{kind:?} {flags:?}"
                );
            }
        }
    }
}

#[test]
fn valid_frames_decode_to_what_was_encoded() {
    for (name, bytes) in valid_frames() {
        let frame = decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(frame.body, &bytes[HEADER_LEN..], "{name}");
        assert_eq!(Header::parse(&bytes), Ok(frame.header), "{name}");
        let sealed = name.ends_with("-checksum");
        assert_eq!(
            frame.header.flags.contains(Flags::CHECKSUM),
            sealed,
            "{name}"
        );
        let (total, data): (Option<u32>, &[u8]) = match name.trim_end_matches("-checksum") {
            "data-single" => (Some(5), b"hello"),
            "data-empty" => (Some(0), b""),
            "data-first" => (Some(100), b"0123456789"),
            "data-middle" => (None, b"middle"),
            "data-last" => (None, b"z"),
            _ => (None, b""),
        };
        assert_eq!(frame.total_len(), total, "{name}");
        assert_eq!(frame.data(), data, "{name}");
    }
}

#[test]
fn every_truncation_is_rejected_or_a_shorter_unsealed_frame() {
    for (name, bytes) in valid_frames() {
        for len in 0..bytes.len() {
            let cut = &bytes[..len];
            let result = decode(cut);
            if len < HEADER_LEN {
                assert_eq!(
                    result,
                    Err(DecodeError::Truncated { len }),
                    "{name} at {len}"
                );
                assert_eq!(Header::parse(cut), Err(DecodeError::Truncated { len }));
                assert!(FrameView::new_checked(cut).is_err());
            } else if name.ends_with("-checksum") {
                assert!(
                    matches!(result, Err(DecodeError::Checksum { .. })),
                    "{name} at {len}: {result:?}"
                );
            } else if let Ok(frame) = result {
                // Without a checksum a shorter body can still be well formed; it must
                // then be exactly what is left.
                assert_eq!(frame.body, &cut[HEADER_LEN..], "{name} at {len}");
            }
        }
    }
}

#[test]
fn every_single_bit_flip_of_a_sealed_frame_is_rejected() {
    for (name, bytes) in valid_frames() {
        if !name.ends_with("-checksum") {
            continue;
        }
        for bit in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode(&b).is_err(),
                "{name}: bit {bit} flipped went unnoticed"
            );
        }
    }
}

#[test]
fn checksum_errors_report_both_values() {
    let mut b = encode(&header(FrameKind::Ack, Flags::CHECKSUM), &[]);
    let good = u32::from_le_bytes(b[field::CHECKSUM..][..4].try_into().unwrap());
    b[field::CHECKSUM] ^= 0xff;
    let found = good ^ 0xff;
    assert_eq!(
        decode(&b),
        Err(DecodeError::Checksum {
            expected: good,
            found
        })
    );
}

#[test]
fn checksum_is_crc32c_of_zeroed_header_then_body_however_split() {
    // The CRC32C check value (RFC 3720, B.4 style).
    assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
    let mut head = [0; HEADER_LEN];
    header(FrameKind::Data, Flags::FIRST | Flags::LAST).emit(&mut head);
    head[field::CHECKSUM..].copy_from_slice(&[1, 2, 3, 4]);
    let body = b"the quick brown fox";
    let mut flat = head.to_vec();
    flat[field::CHECKSUM..HEADER_LEN].fill(0);
    flat.extend_from_slice(body);
    let want = crc32c::crc32c(&flat);
    assert_eq!(checksum(&head, &[body]), want);
    assert_eq!(checksum(&head, &[&body[..3], &[], &body[3..]]), want);
    head[field::CHECKSUM..].copy_from_slice(&[9, 9, 9, 9]);
    assert_eq!(
        checksum(&head, &[body]),
        want,
        "the stored checksum is ignored"
    );
}

#[test]
fn sealing_a_patched_precomputed_header_gives_a_valid_frame() {
    // A channel emits its header once and patches the per-frame fields.
    let mut template = [0; HEADER_LEN];
    header(FrameKind::Data, Flags::FIRST | Flags::LAST).emit(&mut template);
    for seq in [0, 1, u32::MAX] {
        let mut head = template;
        let mut view = FrameView::new_checked(&mut head).unwrap();
        view.set_seq(seq);
        view.set_ack(seq.wrapping_sub(1));
        let sum = seal(&mut head, &[b"pay", b"load"]);
        let mut datagram = head.to_vec();
        datagram.extend_from_slice(b"payload");
        let frame = decode(&datagram).unwrap();
        assert_eq!(frame.header.seq, seq);
        assert_eq!(frame.header.checksum, sum);
        assert!(frame.header.flags.contains(Flags::CHECKSUM));

        // The same through a view of the whole datagram.
        let mut whole = datagram.clone();
        let mut view = FrameView::new_checked(&mut whole[..]).unwrap();
        view.set_checksum(0);
        view.set_flags(Flags::FIRST | Flags::LAST);
        view.body_mut().copy_from_slice(b"PAYLOAD");
        let sum2 = view.fill_checksum();
        assert_eq!(view.compute_checksum(), sum2);
        assert_eq!(decode(&whole).unwrap().body, b"PAYLOAD");
    }
}

#[test]
fn malformed_headers_are_rejected_with_the_reason() {
    let good = encode(&header(FrameKind::Ack, Flags::EMPTY), &[]);
    for version in (0..16).filter(|&v| v != VERSION) {
        let mut b = good.clone();
        b[0] = (version << 4) | FrameKind::Ack as u8;
        assert_eq!(decode(&b), Err(DecodeError::BadVersion(version)));
    }
    for kind in [0u8, 5, 6, 15] {
        let mut b = good.clone();
        b[0] = (VERSION << 4) | kind;
        assert_eq!(decode(&b), Err(DecodeError::UnknownKind(kind)));
    }
    // Both group flags (with and without others) on this Ack frame; a SACK block on a
    // Data frame.
    for flags in [0x18u8, 0x38, 0xff] {
        let mut b = good.clone();
        b[field::FLAGS] = flags;
        assert!(matches!(decode(&b), Err(DecodeError::BadFlags { flags: f, .. }) if f == flags));
    }
    for flags in [0x20u8, 0x80] {
        let mut b = encode(
            &header(FrameKind::Data, Flags::FIRST | Flags::LAST),
            &[&[1u8][..]],
        );
        b[field::FLAGS] |= flags;
        assert!(
            matches!(decode(&b), Err(DecodeError::BadFlags { .. })),
            "{flags:#x}"
        );
    }
    let mut b = good.clone();
    b[field::FLAGS] = Flags::FIRST.bits();
    assert!(matches!(decode(&b), Err(DecodeError::BadFlags { .. })));
    let mut b = good.clone();
    b[field::CHECKSUM + 3] = 0x80;
    assert_eq!(decode(&b), Err(DecodeError::StrayChecksum(0x8000_0000)));
}

#[test]
fn malformed_bodies_are_rejected_with_the_reason() {
    let bad_body = |h: Header, parts: &[&[u8]]| {
        let bytes = encode(&h, parts);
        match decode(&bytes) {
            Err(DecodeError::BadBody {
                kind, flags, len, ..
            }) => {
                assert_eq!(
                    (kind, flags, len),
                    (h.kind, h.flags.bits(), bytes.len() - HEADER_LEN)
                );
            }
            other => panic!("{h:?} {parts:?}: {other:?}"),
        }
    };
    for kind in [FrameKind::Ack, FrameKind::Heartbeat, FrameKind::Goodbye] {
        bad_body(header(kind, Flags::EMPTY), &[b"x"]);
        bad_body(header(kind, Flags::CHECKSUM), &[b"x"]);
    }
    let first = header(FrameKind::Data, Flags::FIRST);
    bad_body(first, &[]);
    bad_body(first, &[b"abc"]);
    bad_body(first, &[&0u32.to_le_bytes()]);
    bad_body(first, &[&3u32.to_le_bytes(), b"abc"]);
    bad_body(first, &[&2u32.to_le_bytes(), b"abc"]);
    assert!(decode(&encode(&first, &[&4u32.to_le_bytes(), b"abc"])).is_ok());
    assert!(decode(&encode(&first, &[&u32::MAX.to_le_bytes()])).is_ok());
    bad_body(header(FrameKind::Data, Flags::EMPTY), &[]);
    bad_body(header(FrameKind::Data, Flags::LAST), &[]);
    bad_body(header(FrameKind::Data, Flags::LAST | Flags::CHECKSUM), &[]);
}

/// Whether `part` lies inside `whole` (an empty `part` at its end included).
fn within(part: &[u8], whole: &[u8]) -> bool {
    let (p, w) = (part.as_ptr() as usize, whole.as_ptr() as usize);
    p >= w && p + part.len() <= w + whole.len()
}

/// The receive path computes where the data start from `data()`'s address: it must
/// point into the datagram for every kind, also when there are no data (a constant
/// empty slice lies elsewhere, and the subtraction overflowed).
#[test]
fn data_always_lies_in_the_body() {
    for (name, bytes) in valid_frames() {
        let frame = decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(within(frame.data(), frame.body), "{name}");
        assert!(within(frame.body, &bytes), "{name}");
    }
    for (kind, flags, body) in [
        (FrameKind::Ack, Flags::EMPTY, &b"ab"[..]),
        (FrameKind::Heartbeat, Flags::EMPTY, b""),
        (FrameKind::Data, Flags::FIRST, b"ab"),
    ] {
        let frame = Frame {
            header: header(kind, flags),
            body,
        };
        assert!(
            frame.data().is_empty() && within(frame.data(), body),
            "{kind:?}"
        );
    }
}

#[test]
fn hand_built_frames_never_panic_in_accessors() {
    let frame = Frame {
        header: header(FrameKind::Data, Flags::FIRST),
        body: b"ab",
    };
    assert_eq!(frame.total_len(), None);
    assert_eq!(frame.data(), b"");
    let frame = Frame {
        header: header(FrameKind::Ack, Flags::EMPTY),
        body: b"ab",
    };
    assert_eq!(frame.total_len(), None);
    assert_eq!(frame.data(), b"");
}

#[test]
fn errors_and_flags_display_clearly() {
    assert_eq!(
        DecodeError::Truncated { len: 7 }.to_string(),
        "frame of 7 bytes is shorter than the 32-byte header"
    );
    assert_eq!(
        DecodeError::BadVersion(2).to_string(),
        "frame has wire format version 2, this build speaks version 1"
    );
    assert_eq!(
        DecodeError::Checksum {
            expected: 1,
            found: 2
        }
        .to_string(),
        "frame checksum mismatch: computed 0x00000001, header says 0x00000002"
    );
    let e = decode(&encode(&header(FrameKind::Data, Flags::LAST), &[])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Data frame with flags 0x02 has a malformed 0-byte body: \
         a middle or last fragment carries at least one byte"
    );
    assert_eq!(
        format!("{:?}", Flags::FIRST | Flags::CHECKSUM),
        "FIRST | CHECKSUM"
    );
    assert_eq!(format!("{:?}", Flags::EMPTY), "EMPTY");
    assert_eq!(
        Flags::from_bits(0x20),
        Some(Flags::EMPTY.with_sack_block(1))
    );
    assert_eq!(Flags::EMPTY.with_sack_block(7).sack_block(), 7);
    assert_eq!(
        format!("{:?}", Flags::EMPTY.with_sack_block(5)),
        "SACK_BLOCK(5)"
    );
    assert_eq!(format!("{:?}", Flags::GROUP | Flags::LAST), "LAST | GROUP");
    assert_eq!(FrameKind::try_from(9), Err(DecodeError::UnknownKind(9)));
}

/// Checks a fragmentation plan against its specification, and returns it.
fn check_plan(msg_len: usize, max: usize) -> Vec<Fragment> {
    let plan = fragments(msg_len, max);
    assert_eq!(plan.len(), fragment_count(msg_len, max));
    let frags: Vec<Fragment> = plan.collect();
    assert_eq!(frags.len(), fragment_count(msg_len, max));
    let n = frags.len();
    let mut offset = 0;
    for (i, f) in frags.iter().enumerate() {
        assert_eq!(f.offset, offset, "contiguous, in order");
        assert!(f.datagram_len() <= max, "{f:?} exceeds {max}");
        assert_eq!(f.flags.contains(Flags::FIRST), i == 0, "{f:?}");
        assert_eq!(f.flags.contains(Flags::LAST), i == n - 1, "{f:?}");
        assert!(!f.flags.contains(Flags::CHECKSUM));
        assert_eq!(f.length_prefix, i == 0 && n > 1, "{f:?}");
        if i > 0 {
            assert!(f.len >= 1, "{f:?}");
        }
        if n > 1 && i < n - 1 {
            assert_eq!(f.datagram_len(), max, "all but the last fragment are full");
        }
        offset += f.len;
    }
    assert_eq!(offset, msg_len, "covers the message exactly");
    frags
}

/// Sends `msg` through the plan as datagrams and reassembles it from the decoded frames.
fn round_trip_message(msg: &[u8], max: usize, sealed: bool) -> Vec<u8> {
    let extra = if sealed {
        Flags::CHECKSUM
    } else {
        Flags::EMPTY
    };
    let mut out = Vec::new();
    let mut total = None;
    for (seq, f) in fragments(msg.len(), max).enumerate() {
        let mut h = header(FrameKind::Data, f.flags | extra);
        h.seq = seq as u32;
        let prefix = (msg.len() as u32).to_le_bytes();
        let data = &msg[f.offset..f.offset + f.len];
        let parts: Vec<&[u8]> = if f.length_prefix {
            vec![&prefix, data]
        } else {
            vec![data]
        };
        let datagram = encode(&h, &parts);
        assert_eq!(datagram.len(), f.datagram_len());
        let frame = decode(&datagram).unwrap();
        if let Some(t) = frame.total_len() {
            total = Some(t);
        }
        out.extend_from_slice(frame.data());
    }
    assert_eq!(total, Some(msg.len() as u32));
    out
}

#[test]
fn fragment_plans_at_the_edges() {
    for max in [MIN_DATAGRAM, MIN_DATAGRAM + 1, 100, 1472, 9000, 65507] {
        let cap = max - HEADER_LEN;
        for len in [
            0,
            1,
            cap - 4,
            cap - 3,
            cap - 1,
            cap,
            cap + 1,
            2 * cap,
            3 * cap + 7,
        ] {
            let frags = check_plan(len, max);
            assert_eq!(frags.len() == 1, len <= cap, "len {len} max {max}");
        }
    }
    assert_eq!(fragment_count(0, 1472), 1);
    assert_eq!(fragment_count(1440, 1472), 1);
    assert_eq!(fragment_count(1441, 1472), 2);
    // First carries cap - 4 = 1436 bytes, then 1440 per fragment.
    assert_eq!(fragment_count(1436 + 1440, 1472), 2);
    assert_eq!(fragment_count(1436 + 1441, 1472), 3);
    let msg: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    for max in [MIN_DATAGRAM, 64, 1472] {
        for sealed in [false, true] {
            assert_eq!(round_trip_message(&msg, max, sealed), msg);
            assert_eq!(round_trip_message(&[], max, sealed), b"");
        }
    }
}

#[test]
#[should_panic(expected = "below the minimum")]
fn fragments_refuse_a_datagram_too_small_to_progress() {
    let _ = fragments(100, MIN_DATAGRAM - 1);
}

fn arb_header() -> impl Strategy<Value = Header> {
    (
        prop::sample::select(FrameKind::ALL.to_vec()),
        0..=Flags::ALL.bits(),
        any::<(u16, u16, u16)>(),
        any::<(u32, u32, u32, u32, u32, u32)>(),
    )
        .prop_map(|(kind, bits, (s, d, c), (r, j, t, q, a, x))| {
            let mut flags = Flags::from_bits(bits).unwrap_or(Flags::EMPTY);
            if kind != FrameKind::Data {
                flags = flags.difference(Flags::FIRST | Flags::LAST);
            }
            if flags.contains(Flags::GROUP | Flags::GROUP_REPLY) {
                flags = flags.difference(Flags::GROUP_REPLY);
            }
            if kind != FrameKind::Ack {
                flags = flags.difference(Flags::SACK_BLOCK);
            }
            let checksum = if flags.contains(Flags::CHECKSUM) {
                x
            } else {
                0
            };
            Header {
                kind,
                flags,
                src_dpid: s,
                dst_dpid: d,
                credits: c,
                src_rank: r,
                job_id: j,
                token: t,
                seq: q,
                ack: a,
                checksum,
            }
        })
}

/// A plan (message length, datagram size) biased towards the edges of the body capacity.
fn arb_plan() -> impl Strategy<Value = (usize, usize)> {
    (MIN_DATAGRAM..=9000usize, 0..8usize, 0..20_000usize).prop_map(|(max, edge, random)| {
        let cap = max - HEADER_LEN;
        let len = match edge {
            0 => 0,
            1 => 1,
            2 => cap - 1,
            3 => cap,
            4 => cap + 1,
            5 => cap + cap - 4,
            6 => cap + cap - 3,
            _ => random,
        };
        (len, max)
    })
}

proptest! {
    #[test]
    fn arbitrary_headers_round_trip(h in arb_header()) {
        let mut b = [0; HEADER_LEN];
        h.emit(&mut b);
        prop_assert_eq!(Header::parse(&b), Ok(h));
    }

    #[test]
    fn arbitrary_sealed_frames_round_trip(h in arb_header(), body in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut h = h;
        h.flags |= Flags::CHECKSUM;
        let bytes = encode(&h, &[&body]);
        if let Ok(frame) = decode(&bytes) {
            prop_assert_eq!(frame.body, &body[..]);
            prop_assert_eq!(frame.header.checksum, checksum(&bytes[..HEADER_LEN].try_into().unwrap(), &[&body]));
        }
    }

    #[test]
    fn checksum_matches_an_independent_crc32c_at_every_length_and_split(
        h in arb_header(),
        body in prop::collection::vec(any::<u8>(), 0..9100),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
    ) {
        // The frame checksum (crc-fast, carry-less multiplication) against the crc32c
        // crate (the SSE 4.2 instruction) over the same bytes: lengths up to a jumbo
        // frame's body, cut into pieces as vectored I/O gives them.
        let mut head = [0; HEADER_LEN];
        h.emit(&mut head);
        let mut flat = head.to_vec();
        flat[field::CHECKSUM..HEADER_LEN].fill(0);
        flat.extend_from_slice(&body);
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(body.len() + 1)).collect();
        at.sort_unstable();
        let mut parts = Vec::new();
        let mut from = 0;
        for to in at.into_iter().chain([body.len()]) {
            parts.push(&body[from..to]);
            from = to;
        }
        prop_assert_eq!(checksum(&head, &parts), crc32c::crc32c(&flat));
    }

    #[test]
    fn small_frames_checksum_matches_an_independent_crc32c(
        h in arb_header(),
        body in prop::collection::vec(any::<u8>(), 0..300),
        cut in any::<prop::sample::Index>(),
    ) {
        // Bodies up to 64 bytes take the CRC instruction directly, longer ones
        // crc-fast: every length around the switch, whole and in two pieces.
        let mut head = [0; HEADER_LEN];
        h.emit(&mut head);
        let mut flat = head.to_vec();
        flat[field::CHECKSUM..HEADER_LEN].fill(0);
        flat.extend_from_slice(&body);
        let want = crc32c::crc32c(&flat);
        prop_assert_eq!(checksum(&head, &[&body]), want);
        let (a, b) = body.split_at(cut.index(body.len() + 1));
        prop_assert_eq!(checksum(&head, &[a, b]), want);
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..96)) {
        check_decoded(&bytes)?;
    }

    #[test]
    fn decoding_near_valid_frames_never_panics(
        kind in 0u8..6,
        flags in 0u8..8,
        rest in prop::collection::vec(any::<u8>(), HEADER_LEN - 2..HEADER_LEN + 40),
    ) {
        // Mostly-valid first two bytes, so that decoding gets past the header checks.
        let mut bytes = vec![(VERSION << 4) | kind, flags];
        bytes.extend_from_slice(&rest);
        check_decoded(&bytes)?;
    }

    #[test]
    fn fragment_plans_cover_the_message((len, max) in arb_plan()) {
        check_plan(len, max);
    }
}

fn check_decoded(bytes: &[u8]) -> Result<(), TestCaseError> {
    if let Ok(frame) = decode(bytes) {
        let mut again = [0; HEADER_LEN];
        frame.header.emit(&mut again);
        prop_assert_eq!(&again[..], &bytes[..HEADER_LEN]);
        prop_assert_eq!(Header::parse(&again), Ok(frame.header));
        let _ = frame.total_len();
        prop_assert!(within(frame.data(), bytes));
    }
    Ok(())
}

/// Writes the seed corpus of the `frame_decode` fuzz target. Run it after a format change:
/// `cargo test -p quiver --lib wire::tests::write_fuzz_seeds -- --ignored`.
#[test]
#[ignore = "writes files into fuzz/corpus"]
fn write_fuzz_seeds() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/frame_decode");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in valid_frames() {
        decode(&bytes).unwrap();
        std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
    }
}

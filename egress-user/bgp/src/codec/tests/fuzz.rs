//! What the fuzz targets check, run by `cargo test`: a deterministic
//! mutation round over the seeds, and a replay of both seed corpora.

use std::path::{Path, PathBuf};

use super::*;

/// xorshift64*: small, deterministic, good enough to shake the decoder.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn seeds() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = vec![
        Message::Open(full_open()).to_bytes(FOUR).unwrap().to_vec(),
        Message::Update(full_update())
            .to_bytes(FOUR)
            .unwrap()
            .to_vec(),
        Message::Update(full_update())
            .to_bytes(TWO)
            .unwrap()
            .to_vec(),
        Message::Keepalive.to_bytes(FOUR).unwrap().to_vec(),
        frame(
            MSG_UPDATE,
            &update_body(&[], &good_attrs_plus(&[]), &NLRI_10_1),
        ),
        Message::Update(add_path::update_with_ids())
            .to_bytes(ADD_PATH)
            .unwrap()
            .to_vec(),
        frame(MSG_ROUTE_REFRESH, &[0, 2, 1, 1]),
        frame(MSG_NOTIFICATION, &[6, 2, 0]),
    ];
    v.extend(corpus("decode"));
    v.extend(corpus("roundtrip"));
    v
}

/// Decodes with each codec option (2- and 4-octet AS, path ids); what decodes must re-encode into
/// something that decodes (the `decode` target) and, when it decoded
/// cleanly, keep the round-trip property (the `roundtrip` target).
pub(crate) fn exercise(data: &[u8]) {
    for opts in [FOUR, TWO, ADD_PATH] {
        match Message::decode(data, opts) {
            Ok(m) => {
                if let Ok(b) = m.to_bytes(opts) {
                    if let Err(e) = Message::decode(&b, opts) {
                        panic!("re-encoded {m:?} does not decode: {e}");
                    }
                }
                roundtrip_holds(data, opts);
            }
            Err(e) => {
                let _ = e.notification();
            }
        }
    }
    let mut buf = BytesMut::from(data);
    while let Ok(Some(f)) = split_frame(&mut buf) {
        let _ = Message::decode(&f, FOUR);
    }
}

/// The round-trip property, as `fuzz/fuzz_targets/roundtrip.rs` checks it:
/// a message that decodes cleanly encodes, decodes back equal, and encodes
/// to the same bytes again. Panics when it does not hold; returns whether
/// it applied (false when the input does not decode cleanly).
fn roundtrip_holds(data: &[u8], opts: CodecOptions) -> bool {
    let Ok(m) = Message::decode(data, opts) else {
        return false;
    };
    if matches!(&m, Message::Update(u) if !u.errors.is_empty()) {
        return false;
    }
    let first = match m.to_bytes(opts) {
        Ok(b) => b,
        // Only AS4_PATH, added toward 2-octet speakers, grows a message.
        Err(EncodeError::TooLong { .. }) if opts == TWO => return true,
        Err(e) => panic!("{m:?} decoded but does not encode: {e}"),
    };
    let back = match Message::decode(&first, opts) {
        Ok(b) => b,
        Err(e) => panic!("{m:?} encodes to bytes that do not decode: {e}"),
    };
    assert_eq!(back, m, "decode(encode(m)) differs from m");
    let second = back.to_bytes(opts).unwrap();
    assert_eq!(second, first, "the encoder's output is not stable");
    true
}

#[test]
fn random_and_mutated_input_never_panics() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let seeds = seeds();
    for _ in 0..60_000 {
        let mut d = seeds[rng.below(seeds.len())].clone();
        match rng.below(5) {
            // Truncate anywhere, then fix up the length field half the time.
            0 => {
                let n = rng.below(d.len() + 1);
                d.truncate(n);
            }
            // Flip random bytes past the marker.
            1 | 2 => {
                for _ in 0..1 + rng.below(4) {
                    if d.len() > 19 {
                        let i = 19 + rng.below(d.len() - 19);
                        d[i] = rng.next() as u8;
                    }
                }
            }
            // Insert or delete a byte in the body.
            3 => {
                if d.len() > 19 {
                    let i = 19 + rng.below(d.len() - 19);
                    if rng.below(2) == 0 {
                        d.remove(i);
                    } else {
                        d.insert(i, rng.next() as u8);
                    }
                }
            }
            // Entirely random body after a valid marker.
            _ => {
                d.truncate(19);
                for _ in 0..rng.below(200) {
                    d.push(rng.next() as u8);
                }
                d[18] = 1 + rng.below(5) as u8;
            }
        }
        if d.len() >= 18 && rng.below(2) == 0 {
            let l = d.len() as u16;
            d[16..18].copy_from_slice(&l.to_be_bytes());
        }
        exercise(&d);
    }
}

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

/// A cargo-fuzz seed corpus, committed under fuzz/corpus/<target>.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(corpus_dir(target)).expect("fuzz corpus folder") {
        v.push(std::fs::read(e.unwrap().path()).unwrap());
    }
    v
}

#[test]
fn fuzz_corpus_replays_without_panic() {
    let c = corpus("decode");
    assert!(c.len() >= 8, "seed corpus should not be empty");
    let mut decoded = 0;
    for d in &c {
        exercise(d);
        if Message::decode(d, FOUR).is_ok() {
            decoded += 1;
        }
    }
    // Most seeds are valid messages; the rest are known-bad inputs.
    assert!(decoded >= 6, "only {decoded} seeds decode");
}

/// Every seed of the `roundtrip` target is a clean message for at least
/// one codec option, and keeps the property.
#[test]
fn roundtrip_corpus_is_clean_and_holds() {
    let c = corpus("roundtrip");
    assert!(c.len() >= 12, "only {} roundtrip seeds", c.len());
    for d in &c {
        let applied = [FOUR, TWO, ADD_PATH].map(|o| roundtrip_holds(d, o));
        assert!(applied.contains(&true), "seed {d:02x?} is not clean");
    }
}

fn write_corpus(target: &str, items: Vec<(&str, Vec<u8>)>) {
    let dir = corpus_dir(target);
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in items {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

fn four(m: Message) -> Vec<u8> {
    m.to_bytes(FOUR).unwrap().to_vec()
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Writes both seed corpora; run with `--ignored` after changing the codec.
#[test]
#[ignore = "regenerates fuzz/corpus"]
fn write_seed_corpus() {
    write_corpus("decode", decode_seeds());
    write_corpus("roundtrip", roundtrip_seeds());
}

/// The seeds both corpora start from: a valid message of each common
/// shape.
fn shared_seeds() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("open-all-caps", four(Message::Open(full_open()))),
        ("update-full-4oct", four(Message::Update(full_update()))),
        (
            "update-full-2oct",
            Message::Update(full_update())
                .to_bytes(TWO)
                .unwrap()
                .to_vec(),
        ),
        (
            "update-eor-v6",
            four(Message::Update(Update::end_of_rib(Family::Ipv6Unicast))),
        ),
        (
            "update-simple",
            frame(
                MSG_UPDATE,
                &update_body(&[], &good_attrs_plus(&[]), &NLRI_10_1),
            ),
        ),
        ("keepalive", four(Message::Keepalive)),
        (
            "open-add-path",
            four(Message::Open(add_path::open_with_add_path())),
        ),
        (
            "update-add-path",
            Message::Update(add_path::update_with_ids())
                .to_bytes(ADD_PATH)
                .unwrap()
                .to_vec(),
        ),
    ]
}

fn decode_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let mut seeds = shared_seeds();
    seeds.extend([
        (
            "open-plain",
            four(Message::Open(Open::new(
                65000,
                90,
                Ipv4Addr::new(1, 1, 1, 1),
                vec![],
            ))),
        ),
        ("notification", frame(MSG_NOTIFICATION, &[6, 4, 1, 2])),
        (
            "route-refresh-borr",
            frame(MSG_ROUTE_REFRESH, &[0, 1, 1, 1]),
        ),
        (
            "bad-origin",
            frame(MSG_UPDATE, &update_body(&[], &[0x40, 1, 1, 9], &NLRI_10_1)),
        ),
        (
            "bad-attr-overrun",
            frame(
                MSG_UPDATE,
                &update_body(&[], &[0x40, 1, 200, 0], &NLRI_10_1),
            ),
        ),
    ]);
    seeds
}

/// Valid messages of every type; the 2-octet ones include the three
/// confederation cases of issue 22.
fn roundtrip_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let two_octet_open = Open {
        my_as: 65010,
        hold_time: 180,
        bgp_id: Ipv4Addr::new(10, 0, 0, 9),
        capabilities: vec![Capability::RouteRefresh],
    };
    let withdraw = Update {
        withdrawn: vec![p("10.1.0.0/16"), p("192.0.2.10/32")],
        ..Update::default()
    };
    let rr = |subtype| {
        four(Message::RouteRefresh(RouteRefresh {
            afi_safi: Family::Ipv6Unicast.into(),
            subtype,
        }))
    };
    let mut seeds = shared_seeds();
    seeds.extend([
        ("open-2oct", four(Message::Open(two_octet_open))),
        ("update-withdraw", four(Message::Update(withdraw))),
        (
            "update-eor-v4",
            four(Message::Update(Update::end_of_rib(Family::Ipv4Unicast))),
        ),
        ("update-2oct-as4-confed", hex("ffffffffffffffffffffffffffffffff0036020000001b40010100400204020100014003040a000001c01106030100011170180a0102")),
        ("update-2oct-leading-confed", hex("ffffffffffffffffffffffffffffffff003c02000000214001010040020a0301fde8020200015ba04003040a000001c01106020100011170180a0102")),
        ("update-2oct-confed-only", hex("ffffffffffffffffffffffffffffffff0036020000001b4001010040020403015ba04003040a000001c01106030100011170180a0102")),
        (
            "notification-cease",
            four(Message::Notification(Notification::cease(
                notif::CEASE_ADMIN_SHUTDOWN,
            ))),
        ),
        ("notification-data", frame(MSG_NOTIFICATION, &[3, 1, 0x40, 1])),
        ("route-refresh", rr(RouteRefreshSubtype::Request)),
        ("route-refresh-borr", rr(RouteRefreshSubtype::BeginRefresh)),
        ("route-refresh-eorr", rr(RouteRefreshSubtype::EndRefresh)),
    ]);
    seeds
}

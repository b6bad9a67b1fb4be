//! The round-trip property of the BGP codec: a message that decodes cleanly
//! (no RFC 7606 outcome recorded) encodes, decodes back equal, and the
//! encoder's output is stable: encode(decode(encode(m))) == encode(m).
//!
//! Run: `cd egress-user/bgp/fuzz && cargo +nightly fuzz run roundtrip corpus/roundtrip`
#![no_main]

use egress_bgp::codec::{AddPathFamilies, CodecOptions, EncodeError, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let four = CodecOptions::default();
    let two = CodecOptions {
        four_octet_as: false,
        ..four
    };
    for opts in [four, two, four.with_add_path(AddPathFamilies::ALL)] {
        check(data, opts);
    }
});

fn check(data: &[u8], opts: CodecOptions) {
    let Ok(m) = Message::decode(data, opts) else {
        return;
    };
    if matches!(&m, Message::Update(u) if !u.errors.is_empty()) {
        return;
    }
    let first = match m.to_bytes(opts) {
        Ok(b) => b,
        // Toward a 2-octet speaker the encoder adds an AS4_PATH for every
        // AS number over 65535, which may not fit where the input did.
        // Between 4-octet speakers nothing grows, so refusing is a bug.
        Err(EncodeError::TooLong { .. }) if !opts.four_octet_as => return,
        Err(e) => panic!("{m:?} decoded but does not encode: {e}"),
    };
    let back = match Message::decode(&first, opts) {
        Ok(b) => b,
        Err(e) => panic!("{m:?} encodes to bytes that do not decode: {e}"),
    };
    assert_eq!(back, m, "decode(encode(m)) differs from m");
    let second = back.to_bytes(opts).expect("encoded once, encodes again");
    assert_eq!(second, first, "the encoder's output is not stable");
}

//! Feeds arbitrary bytes to the BGP decoder: it must return errors, never
//! panic, and whatever it accepts must encode and decode again.
//!
//! Run: `cd egress-user/bgp/fuzz && cargo +nightly fuzz run decode corpus/decode`
#![no_main]

use bytes::BytesMut;
use egress_bgp::codec::{split_frame, AddPathFamilies, CodecOptions, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for opts in options() {
        match Message::decode(data, opts) {
            Ok(m) => {
                if let Ok(b) = m.to_bytes(opts) {
                    Message::decode(&b, opts).expect("re-encoded message must decode");
                }
            }
            Err(e) => {
                let _ = e.notification();
            }
        }
    }
    let mut buf = BytesMut::from(data);
    while let Ok(Some(frame)) = split_frame(&mut buf) {
        let _ = Message::decode(&frame, CodecOptions::default());
    }
});

/// 4-octet, 2-octet, and 4-octet with RFC 7911 path ids in both families.
fn options() -> [CodecOptions; 3] {
    let four = CodecOptions::default();
    let two = CodecOptions {
        four_octet_as: false,
        ..four
    };
    [four, two, four.with_add_path(AddPathFamilies::ALL)]
}

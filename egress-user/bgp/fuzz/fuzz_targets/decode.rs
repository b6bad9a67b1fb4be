//! Feeds arbitrary bytes to the BGP decoder: it must return errors, never
//! panic, and whatever it accepts must encode and decode again.
//!
//! Run: `cd egress-user/bgp/fuzz && cargo +nightly fuzz run decode corpus/decode`
#![no_main]

use bytes::BytesMut;
use egress_bgp::codec::{split_frame, CodecOptions, Message};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for four_octet_as in [true, false] {
        let opts = CodecOptions { four_octet_as };
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

//! Every datapath program run on crafted packets with BPF_PROG_TEST_RUN:
//! one test per path and per drop reason. Output bytes are parsed and their
//! checksums recomputed by etherparse, never by the code under test.
//!
//! Each test loads the embedded object with its own pin folder, so tests
//! run in parallel without sharing maps.

#[path = "../testrun/mod.rs"]
mod testrun;

mod fail_closed;
mod gateway;
mod gateway_xdp;
mod gateway_xdp_forward;
mod gateway_xdp_v6;
mod port_blocks;
mod slots;
mod spread;
mod stats_slots;
mod underlay_v6;
mod userspace_apply;
mod worker;
mod worker_drops;
mod worker_replies;

use testrun::*;

/// Sends a flow out and returns the EIP port it got.
pub(crate) fn open_flow(fx: &mut Fixture, pkt: &[u8]) -> u16 {
    let (rc, out) = fx.run("worker_egress", pkt).unwrap();
    assert_eq!(rc, TC_ACT_REDIRECT);
    check(&out).sport
}

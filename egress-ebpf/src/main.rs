//! TC/XDP programs of the egress gateway.
//!
//! One file per hook or protocol:
//! - `pod_veth`: `worker_egress`, ingress on a pod's host-side veth; policy
//!   match, SNAT, VXLAN toward the gateway.
//! - `tunnel`: `tunnel_ingress`, ingress on the VXLAN device; gateway
//!   forward, worker reply.
//! - `uplink`: `uplink_ingress`, ingress on a gateway's uplink; reply
//!   steering, with `neigh` (ARP/NDP answers) and `probe` (probe answers).
//! - `uplink_xdp`: `uplink_xdp`, XDP on a gateway's uplink; the common
//!   reply steered back out with `XDP_TX`, and with `xdp_forward` the
//!   common forward decapsulated and sent out; everything else to `uplink`
//!   (and the VXLAN device).
//! - `vxlan` / `vxlan6`: the tunnel's outer headers over an IPv4 / IPv6
//!   underlay.
//! - `count`: `tc_count`, the smallest program (packets and bytes).
#![no_std]
#![no_main]
// Inline assembly for packet words of any alignment (see `pkt`).
#![feature(asm_experimental_arch)]

#[cfg(feature = "bench")]
mod bench;
mod cache;
mod clock;
mod count;
mod ctx;
mod flow;
mod frag;
mod fwd;
mod hdr;
mod icmp_err;
mod icmp_quote;
mod maps;
mod mem;
mod nat;
mod neigh;
mod pkt;
mod pod_veth;
mod policy_stats;
mod probe;
mod tcp;
mod tunnel;
mod uplink;
mod uplink_xdp;
mod verdict;
mod vxlan;
mod vxlan6;
mod xdp_forward;
mod xdp_reply6;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any path that could reach here; this only satisfies the compiler.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

//! TC/XDP programs of the egress gateway.
//!
//! - `worker_egress`: pod veth ingress; policy match, SNAT, VXLAN.
//! - `tunnel_ingress`: VXLAN device ingress; gateway forward / worker reply.
//! - `uplink_ingress`: gateway uplink ingress; ARP/NDP, reply steering.
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
mod gateway;
mod hdr;
mod icmp_err;
mod maps;
mod mem;
mod nat;
mod pkt;
mod probe;
mod vxlan;
mod worker;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any path that could reach here; this only satisfies the compiler.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

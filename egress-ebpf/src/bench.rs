//! Programs for the datapath benchmark only (feature `bench`, object
//! `egress-bench.bpf.o`; never loaded by the agent).
//!
//! BPF_PROG_TEST_RUN with `repeat` runs a program again and again on the
//! same buffer, and every measured path rewrites it; so each `bench_*`
//! path program first puts the template packet (`BENCH_PACKET`) back
//! (`bench_restore` alone measures that), then runs the real program's
//! code. The kernel refuses to encapsulate an skb twice (it stays marked
//! as encapsulated), so on these runs the room for the VXLAN headers is
//! grown without the encapsulation flags (`PLAIN_ROOM`, see
//! `vxlan::room_flags`); the flags only record the inner headers' offsets
//! for segmentation, and the benchmark also times the agent's own programs
//! as single runs. The helper programs time the helper calls the paths
//! cannot do without, so the benchmark can say what a path costs beyond
//! them.

use aya_ebpf::{
    bindings::{
        bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
        bpf_fib_lookup as FibParams,
        xdp_action::{XDP_ABORTED, XDP_TX},
        TC_ACT_OK,
    },
    btf_maps::{Array, PerCpuArray},
    helpers::generated::{bpf_fib_lookup, bpf_redirect},
    macros::{btf_map, classifier, xdp},
    programs::{TcContext, XdpContext},
};

use crate::{
    ctx::{csum_replace4, csum_update16, ptr_at},
    hdr::{Ipv4Hdr, ETH_LEN, UDP_CHECK},
};

const IPV4_LEN: usize = core::mem::size_of::<Ipv4Hdr>();

/// Bytes of the template the restore writes (the benchmark's packets are this long).
pub const BENCH_LEN: usize = 64;

#[btf_map]
static BENCH_PACKET: Array<[u64; BENCH_LEN / 8], 1> = Array::new();
/// Writes the template over the first `BENCH_LEN` bytes of the packet,
/// after taking off what the last run's encapsulation put in front (the
/// buffer would grow by 50 bytes a run, and soon be reallocated).
/// Non-inlined (as `new_flow`): its stack stays out of the frame the real
/// program's code runs in, which is as large as the verifier allows.
#[inline(never)]
fn restore(ctx: &TcContext) -> bool {
    let len = ctx.len() as i32;
    if len > BENCH_LEN as i32
        && ctx
            .adjust_room(BENCH_LEN as i32 - len, BPF_ADJ_ROOM_MAC, 0)
            .is_err()
    {
        return false;
    }
    let tpl = match BENCH_PACKET.get(0) {
        Some(t) => t,
        None => return false,
    };
    let p: *mut [u64; BENCH_LEN / 8] = match ptr_at(ctx, 0) {
        Ok(p) => p,
        Err(_) => return false,
    };
    // SAFETY: bounds checked by ptr_at; a map value and the packet never
    // overlap (a plain assignment would be a byte-loop `memmove` call).
    unsafe { core::ptr::copy_nonoverlapping(tpl, p, 1) };
    true
}

/// Bytes of the frame the XDP traffic generator writes back each time (the
/// longest frame: a 64-byte packet in VXLAN over IPv6, 134 bytes).
pub const BENCH_FRAME_LEN: usize = 136;

#[btf_map]
static BENCH_FRAME: Array<[u64; BENCH_FRAME_LEN / 8], 1> = Array::new();

/// The reply-rate benchmark's traffic generator (BPF_PROG_TEST_RUN in
/// live-frames mode): sends its frame out with `XDP_TX`. A live frame's
/// page comes back to the generator with whatever the receivers wrote in
/// it (a forward decrements the TTL in place), so its first
/// `BENCH_FRAME_LEN` bytes are written from `BENCH_FRAME` each time.
#[xdp]
pub fn bench_xdp_send(ctx: XdpContext) -> u32 {
    let (d, end) = (ctx.data(), ctx.data_end());
    let Some(tpl) = BENCH_FRAME.get(0) else {
        return XDP_ABORTED;
    };
    let mut i = 0;
    while i < BENCH_FRAME_LEN / 8 {
        if d + 8 * (i + 1) > end {
            break;
        }
        // SAFETY: `d + 8i .. d + 8i + 8` is inside the frame (checked).
        unsafe { crate::pkt::store32(d + 8 * i, tpl[i] as u32) };
        unsafe { crate::pkt::store32(d + 8 * i + 4, (tpl[i] >> 32) as u32) };
        i += 1;
    }
    XDP_TX
}

#[classifier]
pub fn bench_restore(ctx: TcContext) -> i32 {
    if restore(&ctx) {
        TC_ACT_OK as i32
    } else {
        -1
    }
}

/// One byte written to the packet: what any program that writes the packet
/// pays before it starts (the verifier's prologue makes the skb writable).
/// The restore's own cost is `bench_restore - bench_touch`.
#[classifier]
pub fn bench_touch(ctx: TcContext) -> i32 {
    // A whole header's bounds check (a 1-byte one compiles to a form the
    // verifier does not follow).
    match ptr_at::<[u8; ETH_LEN]>(&ctx, 0) {
        // SAFETY: bounds checked by ptr_at.
        Ok(p) => unsafe {
            (*p)[0] = 2;
            TC_ACT_OK as i32
        },
        Err(_) => -1,
    }
}

/// A 50-byte growth in front of the network header (the room for the VXLAN
/// headers), and the shrink of the next run's restore: half of it, less
/// `bench_restore`, is what the growth costs (the two are the same work).
#[classifier]
pub fn bench_grow_shrink(ctx: TcContext) -> i32 {
    if !restore(&ctx) {
        return -1;
    }
    match ctx.adjust_room(50, BPF_ADJ_ROOM_MAC, 0) {
        Ok(()) => TC_ACT_OK as i32,
        Err(_) => -1,
    }
}

#[inline(always)]
fn plain_room(ctx: &mut TcContext) {
    // SAFETY: skb pointer from the context; cb is the program's scratch.
    unsafe { (*ctx.skb.skb).cb[0] = crate::vxlan::PLAIN_ROOM };
}

/// Runs so far on this CPU: each `bench_worker_first` run is a new flow.
#[btf_map]
static BENCH_SEQ: PerCpuArray<u32, 1> = PerCpuArray::new();

/// Makes the template a flow not seen before: destination and source port
/// from the run's number (as the single runs do), checksums updated.
#[inline(never)]
fn new_flow(ctx: &TcContext) -> bool {
    let seq = match BENCH_SEQ.get_ptr_mut(0) {
        // SAFETY: this CPU's slot.
        Some(s) => unsafe {
            *s = (*s).wrapping_add(1);
            *s
        },
        None => return false,
    };
    let ip: *mut Ipv4Hdr = match ptr_at(ctx, ETH_LEN) {
        Ok(p) => p,
        Err(_) => return false,
    };
    let l4: *mut [u8; 8] = match ptr_at(ctx, ETH_LEN + IPV4_LEN) {
        Ok(p) => p,
        Err(_) => return false,
    };
    // 100.96.0.0/11: not a destination the single runs (100.64.0.0/11) use.
    let dst = (0x6460_0000 | (seq & 0x001f_ffff)).to_be_bytes();
    let sport = ((seq % 50_000) as u16 + 1024).to_be_bytes();
    // SAFETY: both bounds-checked by ptr_at.
    unsafe {
        let old_dst = (*ip).daddr;
        (*ip).daddr = dst;
        (*ip).check = csum_replace4((*ip).check, old_dst, dst);
        let u = &mut *l4;
        // The UDP checksum covers the destination (pseudo-header) and the port.
        let check = csum_replace4([u[6], u[7]], old_dst, dst);
        let check = csum_update16(
            u16::from_be_bytes(check),
            u16::from_be_bytes([u[0], u[1]]),
            u16::from_be_bytes(sport),
        );
        u[0] = sport[0];
        u[1] = sport[1];
        u[6..8].copy_from_slice(&check.to_be_bytes());
    }
    true
}

/// The restore and the new flow's writes alone (taken off `bench_worker_first`).
#[classifier]
pub fn bench_new_flow(ctx: TcContext) -> i32 {
    if restore(&ctx) && new_flow(&ctx) {
        TC_ACT_OK as i32
    } else {
        -1
    }
}

/// Puts the template back (and, for `fresh_flow`, makes it a new flow) and
/// marks the run for plain room; the caller then runs the real program's
/// path. The path is called directly, not through a closure: an outlined
/// `FnOnce` shim would add a frame under the path's deepest calls, and
/// the verifier's 512-byte limit on the combined stack has no room for it.
#[inline(always)]
fn prepare(ctx: &mut TcContext, fresh_flow: bool) -> bool {
    if !restore(ctx) || (fresh_flow && !new_flow(ctx)) {
        return false;
    }
    plain_room(ctx);
    true
}

/// The worker's first packet of a flow, every run a new flow.
#[classifier]
pub fn bench_worker_first(mut ctx: TcContext) -> i32 {
    if !prepare(&mut ctx, true) {
        return -1;
    }
    crate::pod_veth::worker_egress_verdict(&mut ctx)
}

/// The worker's packet of an established flow.
#[classifier]
pub fn bench_worker_established(mut ctx: TcContext) -> i32 {
    if !prepare(&mut ctx, false) {
        return -1;
    }
    crate::pod_veth::worker_egress_verdict(&mut ctx)
}

/// The gateway's reply, steered into the tunnel.
#[classifier]
pub fn bench_gateway_reply(mut ctx: TcContext) -> i32 {
    if !prepare(&mut ctx, false) {
        return -1;
    }
    crate::uplink::uplink_ingress_verdict(&mut ctx)
}

/// The gateway's forward of a decapsulated packet.
#[classifier]
pub fn bench_gateway_forward(mut ctx: TcContext) -> i32 {
    if !prepare(&mut ctx, false) {
        return -1;
    }
    crate::tunnel::tunnel_ingress_verdict(&mut ctx)
}

/// The trivial program: what TestRun itself costs per run.
#[classifier]
pub fn bench_empty(_ctx: TcContext) -> i32 {
    TC_ACT_OK as i32
}

/// One `bpf_l4_csum_replace` (a translated packet needs two: address, port).
#[classifier]
pub fn bench_l4_csum_replace(ctx: TcContext) -> i32 {
    let off = ETH_LEN + IPV4_LEN + UDP_CHECK;
    match ctx.l4_csum_replace(off, 0x1234, 0x4321, 2) {
        Ok(()) => TC_ACT_OK as i32,
        Err(_) => -1,
    }
}

/// `bpf_skb_set_tunnel_key` and `bpf_redirect`: handing a packet to the
/// VXLAN device.
#[classifier]
pub fn bench_tunnel_redirect(ctx: TcContext) -> i32 {
    crate::fwd::via_vxlan_device(&ctx, 7, [10, 100, 0, 11], 1).unwrap_or(-1)
}

/// `bpf_redirect` alone: all a forwarded packet needs when its FIB result
/// is cached.
#[classifier]
pub fn bench_redirect(_ctx: TcContext) -> i32 {
    // SAFETY: plain helper call.
    unsafe { bpf_redirect(1, 0) as i32 }
}

/// `bpf_fib_lookup` for the packet's IPv4 destination, then `bpf_redirect`.
#[classifier]
pub fn bench_fib_redirect(ctx: TcContext) -> i32 {
    let ip: *const Ipv4Hdr = match ptr_at(&ctx, ETH_LEN) {
        Ok(p) => p,
        Err(_) => return -1,
    };
    let mut p = core::mem::MaybeUninit::<FibParams>::uninit();
    // SAFETY: a zeroed parameter block is valid (as the real code builds it).
    let p = unsafe { crate::mem::zeroed_in(&mut p) };
    unsafe {
        p.ifindex = (*ctx.skb.skb).ifindex;
        p.family = 2;
        p.l4_protocol = (*ip).proto;
        p.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes((*ip).saddr);
        p.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes((*ip).daddr);
    }
    // SAFETY: helper with a valid stack parameter block.
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.skb.skb as *mut _,
            p,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    if rc != 0 {
        return -1;
    }
    // SAFETY: plain helper call.
    unsafe { bpf_redirect(p.ifindex, 0) as i32 }
}

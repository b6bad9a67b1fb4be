//! Answers for the EIPs a gateway owns: ARP replies and IPv6 neighbour
//! advertisements, written in place and sent back out of the uplink, while
//! the agent's announce lease holds.

use aya_ebpf::{
    bindings::TC_ACT_OK,
    helpers::generated::{bpf_ktime_get_ns, bpf_redirect},
    programs::TcContext,
};
use egress_common::{addr::Addr, drops::*, steering::OWNED_ANSWER_NEIGH};

use crate::{
    ctx::ptr_at,
    hdr::*,
    maps::{ANNOUNCE_UNTIL, OWNED_EIPS},
    verdict::Packed,
};

/// The agent's announce lease has not run out (or there is none). It is
/// extended on every heartbeat renewal; when the agent dies the node stops
/// answering for its EIPs when the agent itself would have fenced.
#[inline(always)]
fn announce_lease_valid() -> bool {
    match ANNOUNCE_UNTIL.get(0) {
        // SAFETY: plain helper call.
        Some(&until) => until == 0 || unsafe { bpf_ktime_get_ns() } < until,
        None => true,
    }
}

#[inline(always)]
fn owned_answering(addr: &Addr) -> bool {
    if !announce_lease_valid() {
        return false;
    }
    match OWNED_EIPS.get_ptr(addr) {
        // SAFETY: valid map value pointer.
        Some(o) => unsafe { (*o).flags & OWNED_ANSWER_NEIGH != 0 },
        None => false,
    }
}

/// Turns an ARP request for an owned EIP into the reply, sent back out of
/// the interface it came in on.
#[inline(always)]
fn answer_arp(ctx: &TcContext, mac: [u8; 6]) -> Result<i32, u32> {
    let eth: *mut EthHdr = ptr_at(ctx, 0).map_err(|_| DROP_MALFORMED)?;
    let arp: *mut ArpHdr = match ptr_at(ctx, ETH_LEN) {
        Ok(p) => p,
        Err(_) => return Ok(TC_ACT_OK as i32),
    };
    // SAFETY: both pointers bounds-checked by ptr_at; no helper call in between.
    unsafe {
        if (*arp).htype != [0, 1]
            || (*arp).ptype != [0x08, 0x00]
            || (*arp).hlen != 6
            || (*arp).plen != 4
            || (*arp).op != [0, 1]
        {
            return Ok(TC_ACT_OK as i32);
        }
        let tpa = (*arp).tpa;
        let spa = (*arp).spa;
        if tpa == spa || !owned_answering(&crate::mem::v4_mapped(&tpa)) {
            return Ok(TC_ACT_OK as i32);
        }
        let sha = (*arp).sha;
        (*arp).op = [0, 2];
        (*arp).tha = sha;
        (*arp).tpa = spa;
        (*arp).sha = mac;
        (*arp).spa = tpa;
        (*eth).dst = sha;
        (*eth).src = mac;
        Ok(bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32)
    }
}

/// Answers a neighbour solicitation for an owned IPv6 EIP with a solicited
/// advertisement (rewritten in place; both carry one link-layer option).
#[inline(always)]
fn answer_ndp(ctx: &TcContext, mac: [u8; 6]) -> Result<i32, u32> {
    let eth: *mut EthHdr = ptr_at(ctx, 0).map_err(|_| DROP_MALFORMED)?;
    let ip: *mut Ipv6Hdr = ptr_at(ctx, ETH_LEN).map_err(|_| DROP_MALFORMED)?;
    let nd: *mut NdMsg = match ptr_at(ctx, ETH_LEN + IPV6_LEN) {
        Ok(p) => p,
        Err(_) => return Ok(TC_ACT_OK as i32),
    };
    // SAFETY: pointers bounds-checked by ptr_at; no helper call in between
    // except the map lookup, which does not touch the packet.
    unsafe {
        if (*ip).nexthdr != IPPROTO_ICMPV6
            || (*ip).hop_limit != 255
            || u16::from_be_bytes((*ip).payload_len) as usize != ND_LEN
            || (*nd).ty != ICMP6_NEIGH_SOLICIT
            || (*nd).code != 0
            || (*nd).opt_type != 1
            || (*nd).opt_len != 1
        {
            return Ok(TC_ACT_OK as i32);
        }
        let target = (*nd).target;
        let src = (*ip).saddr;
        // Duplicate address detection (unspecified source) is not answered here.
        if src == [0u8; 16] || !owned_answering(&target) {
            return Ok(TC_ACT_OK as i32);
        }
        let peer_mac = (*eth).src;
        (*eth).dst = peer_mac;
        (*eth).src = mac;
        (*ip).daddr = src;
        (*ip).saddr = target;
        (*nd).ty = ICMP6_NEIGH_ADVERT;
        (*nd).flags = [0x60, 0, 0, 0]; // solicited + override
        (*nd).opt_type = 2;
        (*nd).opt_mac = mac;
        (*nd).check = [0, 0];
        // Full checksum: pseudo-header (src, dst, length, next header) + message.
        let mut sum: u32 = 0;
        let mut i = 0;
        while i < 16 {
            sum += u32::from(u16::from_be_bytes([target[i], target[i + 1]]));
            sum += u32::from(u16::from_be_bytes([src[i], src[i + 1]]));
            i += 2;
        }
        sum += ND_LEN as u32 + u32::from(IPPROTO_ICMPV6);
        let words = nd as *const [u8; 2];
        let mut j = 0;
        while j < ND_LEN / 2 {
            let w = *words.add(j);
            sum += u32::from(u16::from_be_bytes(w));
            j += 1;
        }
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        let mut c = !(sum as u16);
        if c == 0 {
            c = 0xffff;
        }
        (*nd).check = c.to_be_bytes();
        Ok(bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32)
    }
}

/// Out of line (see `verdict::Packed`).
#[inline(never)]
fn arp_reply_packed(ctx: &TcContext, mac: [u8; 6]) -> Packed {
    Packed::new(answer_arp(ctx, mac))
}

#[inline(always)]
pub fn arp_reply(ctx: &TcContext, mac: [u8; 6]) -> Result<i32, u32> {
    arp_reply_packed(ctx, mac).get().map(|v| v as i32)
}

/// Out of line (see `verdict::Packed`).
#[inline(never)]
fn ndp_reply_packed(ctx: &TcContext, mac: [u8; 6]) -> Packed {
    Packed::new(answer_ndp(ctx, mac))
}

#[inline(always)]
pub fn ndp_reply(ctx: &TcContext, mac: [u8; 6]) -> Result<i32, u32> {
    ndp_reply_packed(ctx, mac).get().map(|v| v as i32)
}

//! Policy match: two LPM tries and a slot table.
//!
//! Userspace gives every policy that applies on this node a slot
//! `0..MAX_POLICY_SLOTS`, ordered by priority (slot 0 wins). The source trie maps a pod prefix to
//! the set (bitmask) of slots whose pods it covers; the destination trie maps
//! a destination prefix to the slots whose `destSubnet` covers it and the
//! slots whose `excludedSubnet` covers it. Userspace folds every covering
//! prefix into each more specific one, so one longest-prefix lookup per trie
//! gives the complete sets. The program takes
//! `src.slots & dst.slots & !dst.excluded` and picks the lowest set bit.
//! A set of slots is `SLOT_WORDS` 64-bit words; bit `b` of word `w` is slot
//! `64 * w + b`.

use crate::addr::Addr;

/// Most policies that can apply on one node at the same time.
pub const MAX_POLICY_SLOTS: usize = 1024;

/// 64-bit words of one set of slots.
pub const SLOT_WORDS: usize = MAX_POLICY_SLOTS / 64;

/// A set of policy slots as a bitmask (see the module comment).
pub type SlotSet = [u64; SLOT_WORDS];

/// Adds `slot` to `set`.
#[inline(always)]
pub fn set_slot(set: &mut SlotSet, slot: usize) {
    set[slot / 64] |= 1 << (slot % 64);
}

/// Whether `slot` is in `set`.
#[inline(always)]
pub fn has_slot(set: &SlotSet, slot: usize) -> bool {
    set[slot / 64] & (1 << (slot % 64)) != 0
}

/// The destination is a cluster CIDR (pods, services, nodes, extra): skip.
pub const DST_CLUSTER: u32 = 1 << 0;

/// Value of the source trie (key: pod prefix).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SrcMatch {
    pub slots: SlotSet,
}

/// Value of the destination trie (key: destination prefix).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DstMatch {
    pub slots: SlotSet,
    pub excluded: SlotSet,
    /// `DST_*` bits.
    pub flags: u32,
    pub _pad: u32,
}

/// The policy's EIP lives on this node: skip the tunnel (worker and gateway in one).
pub const TARGET_LOCAL_GATEWAY: u32 = 1 << 0;
/// The policy has an IPv4 EIP (`eip_v4` is valid).
pub const TARGET_HAS_V4: u32 = 1 << 1;
/// The policy has an IPv6 EIP (`eip_v6` is valid).
pub const TARGET_HAS_V6: u32 = 1 << 2;
/// The EIP is the gateway node's own address (`useNodeIP`).
pub const TARGET_USE_NODE_IP: u32 = 1 << 3;
/// The policy cannot be applied on this node yet (no EIP, or no gateway
/// tunnel endpoint): packets it matches are dropped (`DROP_NO_GATEWAY`),
/// whatever their family (fail closed).
pub const TARGET_NO_GATEWAY: u32 = 1 << 4;

/// The policy's EIPs are held by several gateways at once (ActiveActive):
/// a new flow goes to the gateway its hash picks in the slot's
/// `GatewaySpread`, not to `gateway_tunnel_ip` or the EIP's route.
pub const TARGET_SPREAD: u32 = 1 << 5;

/// Flow buckets of a `GatewaySpread`: with buckets given out by
/// rendezvous hashing (which keeps every other bucket in place when a
/// gateway leaves), 256 keep up to six gateways within about 15% of an
/// even share; 64 would leave some with half of theirs.
pub const SPREAD_WAYS: usize = 256;

/// Value of `GATEWAY_SPREAD` (a hash keyed by policy slot, holding the
/// slots whose target has `TARGET_SPREAD`): the gateway tunnel endpoint
/// of each flow bucket.
/// A flow's bucket is its hash modulo `SPREAD_WAYS`, so it keeps its
/// gateway for as long as the table keeps that bucket's entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatewaySpread {
    pub tunnel_ips: [[u8; 4]; SPREAD_WAYS],
}

impl Default for GatewaySpread {
    fn default() -> Self {
        Self {
            tunnel_ips: [[0; 4]; SPREAD_WAYS],
        }
    }
}

/// The bucket of a flow with hash `entropy`.
#[inline(always)]
pub fn spread_bucket(entropy: u32) -> usize {
    entropy as usize % SPREAD_WAYS
}

/// Value of the slot table (`POLICY_TARGETS`, an array indexed by slot).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EgressTarget {
    /// Identifier of the policy (what userspace names its counters by).
    pub policy_id: u32,
    /// `TARGET_*` bits; 0 means the slot is unused.
    pub flags: u32,
    /// IPv4 EIP, mapped (see `addr`).
    pub eip_v4: Addr,
    pub eip_v6: Addr,
    /// Tunnel endpoint of the gateway that owns the EIPs (IPv4 underlay).
    pub gateway_tunnel_ip: [u8; 4],
    /// Index of the policy's counters in `POLICY_STATS`; NAT and fragment
    /// entries carry it. Held by the policy while it is on the node (see
    /// the agent's `translate::stats_slots`). Once the struct's padding:
    /// an older agent's pinned targets read as slot 0.
    pub stats_slot: u32,
}

/// Per policy (`POLICY_STATS`, a per-CPU array indexed by the policy's
/// `EgressTarget::stats_slot`: its lookup is inlined by the verifier, where
/// a hash's is a call that hashes the key).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyStats {
    pub egress_packets: u64,
    pub egress_bytes: u64,
    pub reply_packets: u64,
    pub reply_bytes: u64,
}

impl PolicyStats {
    pub fn merge(&mut self, o: &PolicyStats) {
        self.egress_packets = self.egress_packets.wrapping_add(o.egress_packets);
        self.egress_bytes = self.egress_bytes.wrapping_add(o.egress_bytes);
        self.reply_packets = self.reply_packets.wrapping_add(o.reply_packets);
        self.reply_bytes = self.reply_bytes.wrapping_add(o.reply_bytes);
    }
}

/// Picks the winning slot: the lowest bit of `src & dst & !excluded`.
/// A bounded scan over the words (the verifier sees `SLOT_WORDS` rounds at
/// most); the first word with a candidate decides.
#[inline(always)]
pub fn pick_slot(src: &SrcMatch, dst: &DstMatch) -> Option<u32> {
    if dst.flags & DST_CLUSTER != 0 {
        return None;
    }
    let mut w = 0;
    while w < SLOT_WORDS {
        let cand = src.slots[w] & dst.slots[w] & !dst.excluded[w];
        if cand != 0 {
            return Some(w as u32 * 64 + cand.trailing_zeros());
        }
        w += 1;
    }
    None
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all repr(C) with explicit padding; every bit pattern valid.
    unsafe impl aya::Pod for super::SrcMatch {}
    unsafe impl aya::Pod for super::DstMatch {}
    unsafe impl aya::Pod for super::EgressTarget {}
    unsafe impl aya::Pod for super::GatewaySpread {}
    unsafe impl aya::Pod for super::PolicyStats {}
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<SrcMatch>(), 8 * SLOT_WORDS);
        assert_eq!(core::mem::size_of::<DstMatch>(), 16 * SLOT_WORDS + 8);
        assert_eq!(core::mem::offset_of!(DstMatch, excluded), 8 * SLOT_WORDS);
        assert_eq!(core::mem::offset_of!(DstMatch, flags), 16 * SLOT_WORDS);
        assert_eq!(core::mem::size_of::<EgressTarget>(), 48);
        assert_eq!(core::mem::offset_of!(EgressTarget, gateway_tunnel_ip), 40);
        assert_eq!(core::mem::size_of::<GatewaySpread>(), 4 * SPREAD_WAYS);
    }

    fn src(slots: &[usize]) -> SrcMatch {
        let mut m = SrcMatch::default();
        slots.iter().for_each(|s| set_slot(&mut m.slots, *s));
        m
    }

    fn dst(slots: &[usize], excluded: &[usize]) -> DstMatch {
        let mut m = DstMatch::default();
        slots.iter().for_each(|s| set_slot(&mut m.slots, *s));
        excluded.iter().for_each(|s| set_slot(&mut m.excluded, *s));
        m
    }

    #[test]
    fn lowest_slot_wins_and_exclusions_and_cluster_skip() {
        let d = dst(&[1, 2], &[1]);
        assert_eq!(pick_slot(&src(&[0, 1, 2]), &d), Some(2));
        assert_eq!(pick_slot(&src(&[0]), &d), None);
        let c = DstMatch {
            flags: DST_CLUSTER,
            ..d
        };
        assert_eq!(pick_slot(&src(&[0, 1, 2]), &c), None);
    }

    #[test]
    fn slots_beyond_the_first_word_match_and_the_lowest_still_wins() {
        let last = MAX_POLICY_SLOTS - 1;
        assert_eq!(pick_slot(&src(&[700]), &dst(&[700], &[])), Some(700));
        assert_eq!(
            pick_slot(&src(&[last]), &dst(&[last], &[])),
            Some(last as u32)
        );
        assert_eq!(
            pick_slot(&src(&[63, 700]), &dst(&[64, 700], &[])),
            Some(700)
        );
        assert_eq!(
            pick_slot(&src(&[65, 700]), &dst(&[65, 700], &[65])),
            Some(700)
        );
        assert_eq!(pick_slot(&src(&[700]), &dst(&[701], &[])), None);
        assert!(has_slot(&src(&[700]).slots, 700) && !has_slot(&src(&[700]).slots, 636));
    }
}

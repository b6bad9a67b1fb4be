//! Adj-RIB-Out: what each peer is told, and packing it into UPDATEs.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::{decision, PeerConfig, RibConfig, Route, RouteSource};
use crate::codec::{MpReach, MpUnreach, PathAttributes, Update};
use crate::reflect;
use crate::types::{Family, Prefix, PrefixHash};

/// Attributes and next hop as sent to one peer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Exported {
    pub attrs: PathAttributes,
    pub next_hop: IpAddr,
}

/// What the receiving session agreed that decides whether it may be sent a
/// route at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Understands {
    /// Long-lived graceful restart (RFC 9494).
    pub llgr: bool,
    /// IPv4 routes with IPv6 next hops (RFC 8950).
    pub ipv4_via_ipv6: bool,
}

/// The route as `peer` should see it, or None when it must not see it.
pub(crate) fn export(
    rib: &RibConfig,
    peer: &PeerConfig,
    ebgp: bool,
    local_addr: IpAddr,
    target: Understands,
    r: &Route,
) -> Option<Exported> {
    // RFC 9494 4.5: long-lived stale routes only go to peers that know
    // what LLGR_STALE means.
    let llgr = decision::is_llgr_stale(r);
    if llgr && !target.llgr {
        return None;
    }
    if r.source.peer_addr() == Some(peer.addr) {
        return None; // never back to where it came from
    }
    let to = match (ebgp, peer.client) {
        (true, _) => reflect::Target::Ebgp,
        (false, true) => reflect::Target::Client,
        (false, false) => reflect::Target::NonClient,
    };
    let from = r.source.reflect_from();
    if !reflect::may_advertise(from, to) {
        return None;
    }
    let mut attrs = (*r.attrs).clone();
    if llgr && !attrs.communities.contains(&crate::gr::LLGR_STALE) {
        attrs.communities.push(crate::gr::LLGR_STALE);
    }
    let mut next_hop = r.next_hop;
    if ebgp {
        // The peer would drop it anyway (RFC 4271 9.1.2).
        if attrs.as_path.contains(peer.asn) {
            return None;
        }
        attrs.as_path.prepend(rib.local_asn);
        attrs.local_pref = None;
        attrs.originator_id = None;
        attrs.cluster_list.clear();
        // RFC 4271 5.1.4: a MED learned from one AS is not passed to another.
        if r.source != RouteSource::Local {
            attrs.med = None;
        }
    } else {
        attrs.local_pref = Some(decision::local_pref(r));
        if reflect::is_reflection(from, to) {
            let RouteSource::Peer(src) = &r.source else {
                unreachable!("reflection needs a peer source")
            };
            reflect::stamp(&mut attrs, src.router_id, rib.cluster_id);
        }
    }
    if peer.next_hop_self && local_addr.is_ipv4() == next_hop.is_ipv4() {
        next_hop = local_addr;
    }
    // An IPv4 route via an IPv6 next hop needs RFC 8950 on the session.
    if r.prefix.addr().is_ipv4() && next_hop.is_ipv6() && !target.ipv4_via_ipv6 {
        return None;
    }
    Some(Exported { attrs, next_hop })
}

/// Most prefixes one UPDATE may carry after the attributes; sized from the
/// longest prefix encoding (and its path id, when it has one) so the
/// message always fits in 4096 octets.
fn nlri_budget(family: Family, attrs: &PathAttributes, with_ids: bool) -> usize {
    let attr_room: usize = 4096 - 23 - 64; // header, fields, MP_REACH header
    let mut scratch = bytes::BytesMut::new();
    let probe = Update {
        attrs: attrs.clone(),
        ..Update::default()
    };
    // Two-octet sessions add AS4_PATH: reserve for it by doubling.
    let size = crate::codec::Message::Update(probe)
        .encode(Default::default(), &mut scratch)
        .map(|_| scratch.len() * 2)
        .unwrap_or(4096);
    let per_prefix = match family {
        Family::Ipv4Unicast => 5,
        Family::Ipv6Unicast => 17,
    } + if with_ids { 4 } else { 0 };
    (attr_room.saturating_sub(size) / per_prefix).max(1)
}

/// A prefix as it goes in NLRI: with a path id toward ADD-PATH peers.
pub(crate) type OutNlri = (Prefix, Option<u32>);

/// Prefixes sharing one attribute set.
type Group = (Arc<Exported>, Vec<OutNlri>);

/// Splits NLRI into prefixes and, when any carries one, their path ids.
fn split_ids(chunk: &[OutNlri]) -> (Vec<Prefix>, Vec<u32>) {
    let prefixes = chunk.iter().map(|(p, _)| *p).collect();
    let ids = if chunk.iter().any(|(_, id)| id.is_some()) {
        chunk.iter().map(|(_, id)| id.unwrap_or(0)).collect()
    } else {
        Vec::new()
    };
    (prefixes, ids)
}

/// Groups pending changes by attribute set into UPDATE messages: each item
/// is a prefix (with its path id toward ADD-PATH peers) and its export, or
/// None for a withdrawal.
pub(crate) fn pack(
    pending: impl IntoIterator<Item = (OutNlri, Option<Arc<Exported>>)>,
) -> Vec<Update> {
    let mut withdrawn: [Vec<OutNlri>; 2] = [Vec::new(), Vec::new()];
    // Attribute sets are interned per peer, so the pointer identifies one.
    let mut groups: HashMap<(Family, *const Exported), Group, PrefixHash> = HashMap::default();
    for (nlri, e) in pending {
        let fam = nlri.0.family();
        match e {
            None => withdrawn[fam as usize].push(nlri),
            Some(e) => groups
                .entry((fam, Arc::as_ptr(&e)))
                .or_insert_with(|| (e.clone(), Vec::new()))
                .1
                .push(nlri),
        }
    }
    let mut out = Vec::new();
    for (fam, list) in Family::ALL.into_iter().zip(withdrawn) {
        let ids = list.iter().any(|(_, id)| id.is_some());
        let budget = nlri_budget(fam, &PathAttributes::default(), ids);
        for chunk in list.chunks(budget) {
            out.push(withdrawal(fam, chunk));
        }
    }
    for ((fam, _), (e, mut list)) in groups {
        list.sort_unstable();
        let ids = list.iter().any(|(_, id)| id.is_some());
        let budget = nlri_budget(fam, &e.attrs, ids);
        for chunk in list.chunks(budget) {
            out.push(announcement(fam, &e, chunk));
        }
    }
    out
}

fn withdrawal(fam: Family, chunk: &[OutNlri]) -> Update {
    let (prefixes, ids) = split_ids(chunk);
    match fam {
        Family::Ipv4Unicast => Update {
            withdrawn: prefixes,
            withdrawn_ids: ids,
            ..Update::default()
        },
        Family::Ipv6Unicast => Update {
            mp_unreach: Some(MpUnreach {
                family: fam,
                withdrawn: prefixes,
                path_ids: ids,
            }),
            ..Update::default()
        },
    }
}

/// One UPDATE announcing `chunk` with `e`.
fn announcement(fam: Family, e: &Exported, chunk: &[OutNlri]) -> Update {
    let mut attrs = e.attrs.clone();
    let (prefixes, ids) = split_ids(chunk);
    match (fam, e.next_hop) {
        (Family::Ipv4Unicast, IpAddr::V4(nh)) => {
            attrs.next_hop = Some(nh);
            Update {
                attrs,
                nlri: prefixes,
                nlri_ids: ids,
                ..Update::default()
            }
        }
        // An IPv6 route via an IPv4 next hop (a node with only an
        // IPv4 tunnel address) travels with the IPv4-mapped form,
        // as RFC 4798 does; MP_REACH needs a next hop of its family.
        // An IPv4 one via an IPv6 next hop (RFC 8950; `export` only lets
        // it through to sessions that agreed) goes in MP_REACH of AFI 1.
        (fam, nh) => Update {
            attrs,
            mp_reach: Some(MpReach {
                family: fam,
                next_hop: match nh {
                    IpAddr::V4(a) => IpAddr::V6(a.to_ipv6_mapped()),
                    v6 => v6,
                },
                link_local: None,
                nlri: prefixes,
                path_ids: ids,
            }),
            ..Update::default()
        },
    }
}

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

/// The route as `peer` should see it, or None when it must not see it.
pub(crate) fn export(
    rib: &RibConfig,
    peer: &PeerConfig,
    ebgp: bool,
    local_addr: IpAddr,
    target_llgr: bool,
    r: &Route,
) -> Option<Exported> {
    // RFC 9494 4.5: long-lived stale routes only go to peers that know
    // what LLGR_STALE means.
    let llgr = decision::is_llgr_stale(r);
    if llgr && !target_llgr {
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
    Some(Exported { attrs, next_hop })
}

/// Most prefixes one UPDATE may carry after the attributes; sized from the
/// longest prefix encoding so the message always fits in 4096 octets.
fn nlri_budget(family: Family, attrs: &PathAttributes) -> usize {
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
    };
    (attr_room.saturating_sub(size) / per_prefix).max(1)
}

/// Prefixes sharing one attribute set.
type Group = (Arc<Exported>, Vec<Prefix>);

/// Groups pending changes by attribute set into UPDATE messages.
pub(crate) fn pack(
    pending: impl IntoIterator<Item = (Prefix, Option<Arc<Exported>>)>,
) -> Vec<Update> {
    let mut withdrawn: [Vec<Prefix>; 2] = [Vec::new(), Vec::new()];
    // Attribute sets are interned per peer, so the pointer identifies one.
    let mut groups: HashMap<(Family, *const Exported), Group, PrefixHash> = HashMap::default();
    for (prefix, e) in pending {
        let fam = prefix.family();
        match e {
            None => withdrawn[fam as usize].push(prefix),
            Some(e) => groups
                .entry((fam, Arc::as_ptr(&e)))
                .or_insert_with(|| (e.clone(), Vec::new()))
                .1
                .push(prefix),
        }
    }
    let mut out = Vec::new();
    for (fam, list) in Family::ALL.into_iter().zip(withdrawn) {
        let budget = nlri_budget(fam, &PathAttributes::default());
        for chunk in list.chunks(budget) {
            out.push(match fam {
                Family::Ipv4Unicast => Update {
                    withdrawn: chunk.to_vec(),
                    ..Update::default()
                },
                Family::Ipv6Unicast => Update {
                    mp_unreach: Some(MpUnreach {
                        family: fam,
                        withdrawn: chunk.to_vec(),
                    }),
                    ..Update::default()
                },
            });
        }
    }
    for ((fam, _), (e, mut list)) in groups {
        list.sort_unstable();
        let budget = nlri_budget(fam, &e.attrs);
        for chunk in list.chunks(budget) {
            let mut attrs = e.attrs.clone();
            let u = match (fam, e.next_hop) {
                (Family::Ipv4Unicast, IpAddr::V4(nh)) => {
                    attrs.next_hop = Some(nh);
                    Update {
                        attrs,
                        nlri: chunk.to_vec(),
                        ..Update::default()
                    }
                }
                // An IPv6 route via an IPv4 next hop (a node with only an
                // IPv4 tunnel address) travels with the IPv4-mapped form,
                // as RFC 4798 does; MP_REACH needs a next hop of its family.
                (Family::Ipv6Unicast, nh) => Update {
                    attrs,
                    mp_reach: Some(MpReach {
                        family: fam,
                        next_hop: match nh {
                            IpAddr::V4(a) => IpAddr::V6(a.to_ipv6_mapped()),
                            v6 => v6,
                        },
                        link_local: None,
                        nlri: chunk.to_vec(),
                    }),
                    ..Update::default()
                },
                // IPv4 via an IPv6 next hop needs RFC 8950, which is not
                // negotiated: such routes are not sent.
                (Family::Ipv4Unicast, IpAddr::V6(_)) => {
                    tracing::debug!(
                        routes = chunk.len(),
                        "IPv4 routes with an IPv6 next hop not sent"
                    );
                    continue;
                }
            };
            out.push(u);
        }
    }
    out
}

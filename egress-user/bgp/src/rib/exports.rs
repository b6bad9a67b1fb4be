//! The exports of routes to the update groups of one [`GroupKey`]: every
//! group with that key sees a route exported the same way, so they share
//! one memo and one interned copy of each exported attribute set (with
//! many groups alive at once, as while a thousand sessions come up, each
//! holding its own would cost a copy per group and route).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use super::{out, PeerConfig, RibConfig, Route};
use crate::codec::PathAttributes;

pub(super) struct Exports {
    key: GroupKey,
    rib: RibConfig,
    /// One shared copy per distinct attribute set, so pending changes cost
    /// one pointer each, and packing can group by it.
    interned: HashSet<Arc<out::Exported>>,
    /// The last few exports, by source attributes: the prefixes of one
    /// UPDATE all share them, so one export serves them all.
    memo: Vec<(MemoKey, Option<Arc<out::Exported>>)>,
}

/// What decides how a route is exported to a peer, apart from the peer's
/// own address (a route never goes back to the peer it came from, which
/// each member applies for itself when the changes are packed).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct GroupKey {
    pub(super) asn: u32,
    pub(super) client: bool,
    /// With next-hop-self: our address on the session, put as next hop.
    pub(super) next_hop_self: Option<IpAddr>,
    pub(super) understands: out::Understands,
    /// Families sent ADD-PATH (RFC 7911): multipath sets, not best routes.
    pub(super) add_path: crate::codec::AddPathFamilies,
}

/// Holding the Arc keeps the pointer from being reused while memoized.
struct MemoKey {
    attrs: Arc<PathAttributes>,
    next_hop: IpAddr,
    from: Option<IpAddr>,
    llgr_stale: bool,
    /// Whether an IPv4 route may go depends on its family (RFC 8950).
    ipv4: bool,
}

impl MemoKey {
    fn matches(&self, r: &Route) -> bool {
        Arc::ptr_eq(&self.attrs, &r.attrs)
            && self.next_hop == r.next_hop
            && self.from == r.source.peer_addr()
            && self.llgr_stale == r.llgr_stale
            && self.ipv4 == r.prefix.addr().is_ipv4()
    }
}

const MEMO_SIZE: usize = 4;

impl Exports {
    pub(super) fn new(key: GroupKey, rib: RibConfig) -> Exports {
        Exports {
            key,
            rib,
            interned: HashSet::new(),
            memo: Vec::new(),
        }
    }

    /// The route as the group sees it (None: not sent), memoized and interned.
    pub(super) fn export(&mut self, r: Option<&Route>) -> Option<Arc<out::Exported>> {
        let r = r?;
        if let Some((_, e)) = self.memo.iter().find(|(k, _)| k.matches(r)) {
            return e.clone();
        }
        let peer = PeerConfig {
            // Not a peer: split horizon is applied per member.
            addr: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            asn: self.key.asn,
            client: self.key.client,
            next_hop_self: self.key.next_hop_self.is_some(),
        };
        let rib = &self.rib;
        let ebgp = self.key.asn != rib.local_asn;
        let local = self
            .key
            .next_hop_self
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        let e =
            out::export(rib, &peer, ebgp, local, self.key.understands, r).map(|e| self.intern(e));
        if self.memo.len() == MEMO_SIZE {
            self.memo.remove(0);
        }
        self.memo.push((
            MemoKey {
                attrs: r.attrs.clone(),
                next_hop: r.next_hop,
                from: r.source.peer_addr(),
                llgr_stale: r.llgr_stale,
                ipv4: r.prefix.addr().is_ipv4(),
            },
            e.clone(),
        ));
        e
    }

    fn intern(&mut self, e: out::Exported) -> Arc<out::Exported> {
        if let Some(a) = self.interned.get(&e) {
            return a.clone();
        }
        // Forget attribute sets no prefix uses any more, now and then.
        if self.interned.len() >= 1024 && self.interned.len().is_power_of_two() {
            self.interned.retain(|a| Arc::strong_count(a) > 1);
        }
        let a = Arc::new(e);
        self.interned.insert(a.clone());
        a
    }
}

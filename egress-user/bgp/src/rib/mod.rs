//! Adj-RIB-In, Loc-RIB and Adj-RIB-Out (RFC 4271 3.2), without I/O.
//!
//! The Adj-RIBs-In of all peers are stored indexed by prefix (one entry per
//! source), which is what the decision process needs; [`Rib::adj_rib_in`]
//! gives the per-peer view. Every change runs the decision process for the
//! prefixes it touches, records Loc-RIB changes for the agent, and queues
//! per-peer Adj-RIB-Out changes that [`Rib::take_updates`] packs into
//! UPDATE messages.

mod decision;
mod exports;
mod group;
mod multipath;
mod out;
mod paths_out;
mod select;

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use serde::Serialize;

pub use decision::{select_best, DEFAULT_LOCAL_PREF};
use exports::Exports;
use exports::GroupKey;
use group::OutGroup;
pub use group::{Outgoing, Readiness};

use multipath::{PathIds, Selection};

use crate::codec::{AddPathFamilies, PathAttributes, Update};
use crate::reflect::{self, LoopDiscard};
use crate::types::{AsPath, Family, Origin, Prefix, PrefixMap};

/// The peer a route was learned from, with what the decision needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSource {
    pub addr: IpAddr,
    pub router_id: Ipv4Addr,
    pub asn: u32,
    pub ebgp: bool,
    /// A route reflector client of ours.
    pub client: bool,
    /// The RFC 7911 path id of this peer's routes towards ADD-PATH peers.
    pub path_id: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteSource {
    /// Announced through the handle by the agent.
    Local,
    /// Shared by all routes of one session.
    Peer(Arc<PeerSource>),
}

impl RouteSource {
    fn peer_addr(&self) -> Option<IpAddr> {
        match self {
            RouteSource::Peer(p) => Some(p.addr),
            RouteSource::Local => None,
        }
    }

    fn reflect_from(&self) -> reflect::Learned {
        match self {
            RouteSource::Local => reflect::Learned::Local,
            RouteSource::Peer(p) if p.ebgp => reflect::Learned::Ebgp,
            RouteSource::Peer(p) if p.client => reflect::Learned::Client,
            RouteSource::Peer(_) => reflect::Learned::NonClient,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Route {
    pub prefix: Prefix,
    pub next_hop: IpAddr,
    /// Shared by all prefixes of one UPDATE; `next_hop` inside is unused.
    pub attrs: Arc<PathAttributes>,
    pub source: RouteSource,
    /// Kept from a peer that is restarting gracefully (RFC 4724).
    pub stale: bool,
    /// Kept past the restart time as long-lived stale (RFC 9494).
    pub llgr_stale: bool,
    /// The prefix's best route (in the Loc-RIB): the Loc-RIB is these
    /// flags on the candidates, not a second table.
    pub(crate) best: bool,
}

/// Equal routes are the same route whether or not selected.
impl PartialEq for Route {
    fn eq(&self, o: &Route) -> bool {
        self.prefix == o.prefix
            && self.next_hop == o.next_hop
            && self.attrs == o.attrs
            && self.source == o.source
            && self.stale == o.stale
            && self.llgr_stale == o.llgr_stale
    }
}

impl Eq for Route {}

/// The selected route among a prefix's candidates.
fn flagged(routes: &[Route]) -> Option<&Route> {
    routes.iter().find(|r| r.best)
}

/// A change of the best route for a prefix, for the agent's routes map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum BestChange {
    Set {
        prefix: Prefix,
        next_hop: IpAddr,
        /// None for our own announcements.
        from: Option<IpAddr>,
        /// LOCAL_PREF of the best route, if it carries one (agents announce
        /// EIPs with 100 + the assignment's epoch).
        local_pref: Option<u32>,
    },
    Removed {
        prefix: Prefix,
    },
}

#[derive(Clone, Debug)]
pub struct RibConfig {
    pub local_asn: u32,
    pub router_id: Ipv4Addr,
    /// Shared by all reflectors of one cluster; defaults to the router id.
    pub cluster_id: Ipv4Addr,
}

/// A configured neighbour, as the RIB sees it.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    pub addr: IpAddr,
    pub asn: u32,
    pub client: bool,
    /// Put our own session address as next hop on routes sent to it.
    pub next_hop_self: bool,
}

/// What one UPDATE did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImportReport {
    pub accepted: usize,
    pub withdrawn: usize,
    /// Discarded by RFC 4456 loop checks or because our AS is in the path.
    pub looped: usize,
}

/// The Adj-RIB-Out of a peer is not stored: it is by definition the
/// export of the Loc-RIB towards that peer ([`Rib::adj_rib_out`]), so only
/// its changes are queued, per update group. That saves one table per peer.
struct PeerState {
    cfg: PeerConfig,
    /// Set while a session is Established.
    session: Option<SessionInfo>,
    received: usize,
    /// The update group the peer is in while Established.
    group: Option<u64>,
    /// Path id of the routes learned from it (see [`PathIds`]).
    path_id: u32,
}

#[derive(Clone, Debug)]
struct SessionInfo {
    router_id: Ipv4Addr,
    local_addr: IpAddr,
    understands: out::Understands,
}

/// What a session agreed that changes what the RIB sends on it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionOptions {
    /// Both sides do long-lived graceful restart (RFC 9494).
    pub llgr: bool,
    /// Families we send ADD-PATH in (RFC 7911): the multipath set, each
    /// path under its path id, instead of the best route.
    pub add_path: AddPathFamilies,
    /// Both sides agreed on IPv4 routes with IPv6 next hops (RFC 8950).
    pub ipv4_via_ipv6: bool,
}

impl PeerState {
    fn source(&self) -> Option<PeerSource> {
        let s = self.session.as_ref()?;
        Some(PeerSource {
            addr: self.cfg.addr,
            router_id: s.router_id,
            asn: self.cfg.asn,
            ebgp: false, // filled in by Rib::source_of
            client: self.cfg.client,
            path_id: self.path_id,
        })
    }
}

pub struct Rib {
    cfg: RibConfig,
    peers: HashMap<IpAddr, PeerState>,
    /// All Adj-RIBs-In and our local routes, indexed by prefix.
    candidates: PrefixMap<Vec<Route>>,
    /// Number of prefixes with a best route.
    loc_len: usize,
    best_changes: Vec<BestChange>,
    /// While set, the decision process waits (RFC 4724 selection deferral).
    deferring: bool,
    /// Prefixes to decide when deferral ends, with their best route
    /// before the first change.
    dirty: PrefixMap<Selection>,
    groups: HashMap<u64, OutGroup>,
    next_group: u64,
    /// The exports every group of one key shares.
    exports: HashMap<GroupKey, Exports>,
    path_ids: PathIds,
}

/// The exports of the groups with `key`.
fn exports_for<'a>(
    all: &'a mut HashMap<GroupKey, Exports>,
    cfg: &RibConfig,
    key: &GroupKey,
) -> &'a mut Exports {
    all.entry(key.clone())
        .or_insert_with(|| Exports::new(key.clone(), cfg.clone()))
}

impl Rib {
    pub fn new(cfg: RibConfig) -> Rib {
        Rib {
            cfg,
            peers: HashMap::new(),
            candidates: PrefixMap::default(),
            loc_len: 0,
            best_changes: Vec::new(),
            deferring: false,
            dirty: PrefixMap::default(),
            groups: HashMap::new(),
            next_group: 0,
            exports: HashMap::new(),
            path_ids: PathIds::default(),
        }
    }

    pub fn config(&self) -> &RibConfig {
        &self.cfg
    }

    pub fn add_peer(&mut self, cfg: PeerConfig) {
        let path_id = self.path_ids.id_for(cfg.addr);
        self.peers.insert(
            cfg.addr,
            PeerState {
                cfg,
                session: None,
                received: 0,
                group: None,
                path_id,
            },
        );
    }

    pub fn remove_peer(&mut self, addr: IpAddr) {
        self.peer_down(addr, false);
        self.peers.remove(&addr);
    }

    fn is_ebgp(&self, p: &PeerConfig) -> bool {
        p.asn != self.cfg.local_asn
    }

    /// A session came up: queue our whole table towards the peer.
    pub fn peer_up(&mut self, addr: IpAddr, router_id: Ipv4Addr, local_addr: IpAddr) {
        self.peer_up_llgr(addr, router_id, local_addr, false)
    }

    /// [`Self::peer_up`] for a session where `llgr` says whether both sides
    /// negotiated long-lived graceful restart: only then may long-lived
    /// stale routes be sent to it (RFC 9494 4.5).
    pub fn peer_up_llgr(
        &mut self,
        addr: IpAddr,
        router_id: Ipv4Addr,
        local_addr: IpAddr,
        llgr: bool,
    ) {
        let opts = SessionOptions {
            llgr,
            ..Default::default()
        };
        self.peer_up_with(addr, router_id, local_addr, opts)
    }

    /// [`Self::peer_up`] with what the session agreed (long-lived GR,
    /// ADD-PATH families): peers sent ADD-PATH in a family get the
    /// multipath set of each prefix there, and have update groups of
    /// their own kind.
    pub fn peer_up_with(
        &mut self,
        addr: IpAddr,
        router_id: Ipv4Addr,
        local_addr: IpAddr,
        opts: SessionOptions,
    ) {
        let understands = out::Understands {
            llgr: opts.llgr,
            ipv4_via_ipv6: opts.ipv4_via_ipv6,
        };
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        p.session = Some(SessionInfo {
            router_id,
            local_addr,
            understands,
        });
        let key = GroupKey {
            asn: p.cfg.asn,
            client: p.cfg.client,
            next_hop_self: p.cfg.next_hop_self.then_some(local_addr),
            understands,
            add_path: opts.add_path,
        };
        self.leave_group(addr);
        if let Some(id) = self.fresh_group(&key) {
            self.join_fresh(id, addr);
            return;
        }
        let mut g = OutGroup::new(key, addr);
        g.fresh = true;
        let id = self.new_group(g);
        let g = self.groups.get_mut(&id).expect("just made");
        let exports = exports_for(&mut self.exports, &self.cfg, &g.key);
        select::queue_table(g, exports, &self.candidates);
    }

    /// A group of `key` whose pending changes are still its whole table.
    fn fresh_group(&self, key: &GroupKey) -> Option<u64> {
        self.groups
            .iter()
            .find(|(_, g)| g.fresh && g.key == *key)
            .map(|(id, _)| *id)
    }

    /// Adds `addr` to the fresh group `id`: what the group waits to send
    /// is what the new session is to be sent, less its own routes (kept
    /// stale from its last session), which each member skips for itself.
    fn join_fresh(&mut self, id: u64, addr: IpAddr) {
        let g = self.groups.get_mut(&id).expect("listed");
        let own = g
            .pending
            .values()
            .filter(|p| p.value.is_some() && p.from == Some(addr))
            .count()
            + g.paths
                .values()
                .flat_map(|p| &p.now)
                .filter(|s| s.from == Some(addr))
                .count();
        g.members.push(addr);
        g.own.insert(addr, own);
        if let Some(p) = self.peers.get_mut(&addr) {
            p.group = Some(id);
        }
    }

    fn new_group(&mut self, g: OutGroup) -> u64 {
        let id = self.next_group;
        self.next_group += 1;
        for m in &g.members {
            if let Some(p) = self.peers.get_mut(m) {
                p.group = Some(id);
            }
        }
        self.groups.insert(id, g);
        id
    }

    /// Takes `addr` out of its update group (dropping the group if empty).
    fn leave_group(&mut self, addr: IpAddr) {
        let Some(id) = self.peers.get_mut(&addr).and_then(|p| p.group.take()) else {
            return;
        };
        if let Some(g) = self.groups.get_mut(&id) {
            g.members.retain(|m| *m != addr);
            g.own.remove(&addr);
            if g.members.is_empty() {
                self.groups.remove(&id);
            }
        }
    }

    /// Gives `addr` an update group of its own with what was pending for
    /// it, and returns that group's id.
    fn split(&mut self, addr: IpAddr) -> Option<u64> {
        let id = self.peers.get(&addr)?.group?;
        let g = self.groups.get(&id)?;
        if g.members.len() == 1 {
            return Some(id);
        }
        let mut alone = OutGroup::new(g.key.clone(), addr);
        alone.pending = g.pending.clone();
        alone.paths = g.paths.clone();
        alone.advertised = g.advertised;
        alone
            .own
            .insert(addr, g.own.get(&addr).copied().unwrap_or(0));
        self.leave_group(addr);
        Some(self.new_group(alone))
    }

    /// Joins groups with the same key once neither has anything pending.
    fn merge_groups(&mut self) {
        let mut first: HashMap<GroupKey, u64> = HashMap::new();
        let mut ids: Vec<u64> = self.groups.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            let g = &self.groups[&id];
            if g.has_pending() {
                continue;
            }
            match first.get(&g.key) {
                None => {
                    first.insert(g.key.clone(), id);
                }
                Some(&into) => {
                    let g = self.groups.remove(&id).expect("listed");
                    for m in &g.members {
                        if let Some(p) = self.peers.get_mut(m) {
                            p.group = Some(into);
                        }
                    }
                    let target = self.groups.get_mut(&into).expect("listed");
                    target.members.extend(g.members);
                    target.own.extend(g.own);
                    target.fresh &= g.fresh;
                }
            }
        }
    }

    /// A session went down. With `keep_as_stale` (graceful restart helper)
    /// its routes stay in use, marked stale; otherwise they are removed.
    pub fn peer_down(&mut self, addr: IpAddr, keep_as_stale: bool) {
        let Some(p) = self.peers.get_mut(&addr) else {
            return;
        };
        p.session = None;
        self.leave_group(addr);
        if keep_as_stale {
            self.mark_stale(addr);
        } else {
            self.remove_routes_from(addr, |_| true);
        }
    }

    /// Marks every route from `addr` stale; returns how many.
    pub fn mark_stale(&mut self, addr: IpAddr) -> usize {
        self.mark_stale_family(addr, None)
    }

    /// RFC 9494: the stale routes of `addr` become long-lived stale, least
    /// preferred; those carrying NO_LLGR are removed instead.
    pub fn mark_llgr_stale(&mut self, addr: IpAddr) -> usize {
        let mut touched = Vec::new();
        for (prefix, routes) in self.candidates.iter_mut() {
            if !routes
                .iter()
                .any(|r| r.source.peer_addr() == Some(addr) && r.stale)
            {
                continue;
            }
            let old = Selection::of(routes);
            let before = routes.len();
            routes.retain(|r| {
                !(r.source.peer_addr() == Some(addr)
                    && r.stale
                    && r.attrs.communities.contains(&crate::gr::NO_LLGR))
            });
            let mut changed = routes.len() != before;
            for r in routes.iter_mut() {
                if r.source.peer_addr() == Some(addr) && r.stale && !r.llgr_stale {
                    r.llgr_stale = true;
                    changed = true;
                }
            }
            if changed {
                touched.push((*prefix, old));
            }
        }
        let n = touched.len();
        for (prefix, old) in touched {
            self.recompute(prefix, old);
        }
        n
    }

    /// Marks routes from `addr` in `family` (all when None) stale, as at
    /// the start of an enhanced route refresh (RFC 7313).
    pub fn mark_stale_family(&mut self, addr: IpAddr, family: Option<Family>) -> usize {
        let mut touched = Vec::new();
        for (prefix, routes) in self.candidates.iter_mut() {
            if family.is_some_and(|f| prefix.family() != f) {
                continue;
            }
            if !routes
                .iter()
                .any(|r| r.source.peer_addr() == Some(addr) && !r.stale)
            {
                continue;
            }
            let old = Selection::of(routes);
            for r in routes.iter_mut() {
                if r.source.peer_addr() == Some(addr) && !r.stale {
                    r.stale = true;
                }
            }
            touched.push((*prefix, old));
        }
        // Stale routes stay candidates; nothing changes on the wire.
        let n = touched.len();
        for (prefix, old) in touched {
            self.recompute(prefix, old);
        }
        n
    }

    /// Removes the routes from `addr` still stale in `family` (at its
    /// End-of-RIB, or when the restart or stale timer runs out).
    pub fn purge_stale(&mut self, addr: IpAddr, family: Option<Family>) -> usize {
        self.remove_routes_from(addr, |r| {
            r.stale && family.is_none_or(|f| r.prefix.family() == f)
        })
    }

    fn remove_routes_from(&mut self, addr: IpAddr, pred: impl Fn(&Route) -> bool) -> usize {
        let mut touched = Vec::new();
        for (prefix, routes) in self.candidates.iter_mut() {
            let gone = |r: &Route| r.source.peer_addr() == Some(addr) && pred(r);
            if !routes.iter().any(gone) {
                continue;
            }
            let old = Selection::of(routes);
            routes.retain(|r| !gone(r));
            touched.push((*prefix, old));
        }
        let n = touched.len();
        if let Some(p) = self.peers.get_mut(&addr) {
            p.received = p.received.saturating_sub(n);
        }
        for (prefix, old) in touched {
            self.recompute(prefix, old);
        }
        n
    }

    fn source_of(&self, addr: IpAddr) -> Option<Arc<PeerSource>> {
        let p = self.peers.get(&addr)?;
        let mut s = p.source()?;
        s.ebgp = self.is_ebgp(&p.cfg);
        Some(Arc::new(s))
    }

    /// Applies one UPDATE received from an Established peer.
    pub fn apply_update(&mut self, from: IpAddr, u: &Update) -> ImportReport {
        let mut report = ImportReport::default();
        let Some(source) = self.source_of(from) else {
            return report;
        };
        for prefix in u.withdrawals() {
            if self.remove_candidate(prefix, from) {
                report.withdrawn += 1;
            }
        }
        if u.treat_as_withdraw() {
            // RFC 7606: its announcements were counted as withdrawals above.
            return report;
        }
        let mut attrs = u.attrs.clone();
        let v4_next_hop = attrs.next_hop.take().map(IpAddr::V4);
        let mut items: Vec<(Prefix, Option<IpAddr>)> =
            u.nlri.iter().map(|p| (*p, v4_next_hop)).collect();
        if let Some(m) = &u.mp_reach {
            items.extend(m.nlri.iter().map(|p| (*p, Some(m.next_hop))));
        }
        if items.is_empty() {
            return report;
        }
        let loop_found =
            reflect::check_receipt(&u.attrs, self.cfg.router_id, self.cfg.cluster_id).is_err();
        let as_loop = source.ebgp && u.attrs.as_path.contains(self.cfg.local_asn);
        if source.ebgp {
            // Non-transitive iBGP attributes have no business coming from
            // another AS.
            attrs.originator_id = None;
            attrs.cluster_list.clear();
        }
        let attrs = Arc::new(attrs);
        for (prefix, nh) in items {
            let Some(nh) = nh.filter(|_| !loop_found && !as_loop) else {
                // RFC 4456 8: discard; a copy accepted earlier is gone too.
                self.remove_candidate(prefix, from);
                report.looped += 1;
                continue;
            };
            self.insert_candidate(Route {
                prefix,
                next_hop: nh,
                attrs: attrs.clone(),
                source: RouteSource::Peer(source.clone()),
                stale: false,
                llgr_stale: false,
                best: false,
            });
            report.accepted += 1;
        }
        report
    }

    /// Why a route would be discarded on receipt, for logs and tests.
    pub fn loop_check(&self, attrs: &PathAttributes) -> Result<(), LoopDiscard> {
        reflect::check_receipt(attrs, self.cfg.router_id, self.cfg.cluster_id)
    }

    /// Announces a prefix of ours (pod CIDR, EIP) with the given next hop.
    pub fn announce_local(&mut self, prefix: Prefix, next_hop: IpAddr) {
        self.announce_local_with_pref(prefix, next_hop, DEFAULT_LOCAL_PREF);
    }

    /// Like [`Self::announce_local`] with a chosen LOCAL_PREF, so that a
    /// newer owner of a prefix wins over an older one whose route lingers
    /// (for example kept as stale by graceful restart).
    pub fn announce_local_with_pref(&mut self, prefix: Prefix, next_hop: IpAddr, local_pref: u32) {
        let attrs = PathAttributes {
            origin: Some(Origin::Igp),
            as_path: AsPath::default(),
            local_pref: Some(local_pref),
            ..Default::default()
        };
        self.insert_candidate(Route {
            prefix,
            next_hop,
            attrs: Arc::new(attrs),
            source: RouteSource::Local,
            stale: false,
            llgr_stale: false,
            best: false,
        });
    }

    pub fn withdraw_local(&mut self, prefix: Prefix) -> bool {
        let Some(routes) = self.candidates.get_mut(&prefix) else {
            return false;
        };
        let old = Selection::of(routes);
        let before = routes.len();
        routes.retain(|r| r.source != RouteSource::Local);
        let removed = routes.len() != before;
        if removed {
            self.recompute(prefix, old);
        }
        removed
    }

    fn insert_candidate(&mut self, route: Route) {
        let prefix = route.prefix;
        let from = route.source.peer_addr();
        // Most prefixes have one candidate: a first push would reserve four.
        let routes = self
            .candidates
            .entry(prefix)
            .or_insert_with(|| Vec::with_capacity(1));
        let old = Selection::of(routes);
        match routes.iter_mut().find(|r| r.source.peer_addr() == from) {
            Some(slot) => *slot = route,
            None => {
                routes.push(route);
                if let Some(p) = from.and_then(|a| self.peers.get_mut(&a)) {
                    p.received += 1;
                }
            }
        }
        self.recompute(prefix, old);
    }

    fn remove_candidate(&mut self, prefix: Prefix, from: IpAddr) -> bool {
        let Some(routes) = self.candidates.get_mut(&prefix) else {
            return false;
        };
        let old = Selection::of(routes);
        let before = routes.len();
        routes.retain(|r| r.source.peer_addr() != Some(from));
        if routes.len() == before {
            return false;
        }
        if let Some(p) = self.peers.get_mut(&from) {
            p.received = p.received.saturating_sub(1);
        }
        self.recompute(prefix, old);
        true
    }

    /// Starts or ends selection deferral (RFC 4724 4.1). While deferring,
    /// routes are collected but no best route is chosen or advertised.
    pub fn set_deferral(&mut self, on: bool) {
        self.deferring = on;
        if !on {
            let dirty: Vec<(Prefix, Selection)> = self.dirty.drain().collect();
            for (prefix, old) in dirty {
                self.recompute(prefix, old);
            }
        }
    }

    pub fn deferring(&self) -> bool {
        self.deferring
    }

    /// Drains the Loc-RIB changes since the last call.
    pub fn take_best_changes(&mut self) -> Vec<BestChange> {
        std::mem::take(&mut self.best_changes)
    }

    /// Peers with Adj-RIB-Out changes waiting to be sent.
    pub fn peers_with_pending(&self) -> Vec<IpAddr> {
        self.groups
            .values()
            .filter(|g| g.has_pending())
            .flat_map(|g| g.members.iter().copied())
            .collect()
    }

    /// Packs the waiting changes for `addr` alone into UPDATE messages, one
    /// per distinct attribute set, each within the 4096-octet limit.
    pub fn take_updates(&mut self, addr: IpAddr) -> Vec<Update> {
        let Some(id) = self.split(addr) else {
            return Vec::new();
        };
        let g = self.groups.get_mut(&id).expect("split");
        let mut updates = Vec::new();
        g.take(&mut |o: Outgoing| updates.extend(o.updates));
        updates
    }

    /// Packs every waiting change, once per set of peers that are sent the
    /// same UPDATEs (see [`OutGroup`]): the caller encodes each list once.
    pub fn take_outgoing(&mut self) -> Vec<Outgoing> {
        self.take_outgoing_where(|_| Readiness::Ready)
    }

    /// [`Self::take_outgoing`] for the peers that are ready for more
    /// (see [`Readiness`]). The changes of a peer that is not wait here,
    /// one per prefix however often it changes. A busy member gets a group
    /// of its own at once, so that the others never wait for it, and
    /// rejoins them once it has caught up; a group whose members are all
    /// still writing waits for the first of them to finish.
    pub fn take_outgoing_where(&mut self, state: impl Fn(IpAddr) -> Readiness) -> Vec<Outgoing> {
        let mut out = Vec::new();
        self.take_outgoing_each(state, |o| out.push(o));
        out
    }

    /// [`Self::take_outgoing_where`], handing each list to `send` as soon
    /// as it is packed: with many groups packing their full tables at
    /// once (a thousand sessions coming up), holding all the lists before
    /// encoding any was most of the speaker's memory.
    pub fn take_outgoing_each(
        &mut self,
        state: impl Fn(IpAddr) -> Readiness,
        mut send: impl FnMut(Outgoing),
    ) {
        let mut slow = Vec::new();
        for g in self.groups.values().filter(|g| g.has_pending()) {
            let behind: Vec<IpAddr> = g
                .members
                .iter()
                .copied()
                .filter(|m| state(*m) == Readiness::Busy)
                .collect();
            if behind.len() < g.members.len() {
                slow.extend(behind);
            }
        }
        for addr in slow {
            self.split(addr);
        }
        for g in self.groups.values_mut() {
            let any_ready = g.members.iter().any(|m| state(*m) == Readiness::Ready);
            let none_busy = g.members.iter().all(|m| state(*m) != Readiness::Busy);
            if any_ready && none_busy {
                g.take(&mut send);
            }
        }
        self.merge_groups();
    }

    /// Prefixes whose change waits to be sent to `addr`.
    pub fn pending_len(&self, addr: IpAddr) -> usize {
        self.peers
            .get(&addr)
            .and_then(|p| p.group)
            .and_then(|id| self.groups.get(&id))
            .map_or(0, |g| g.pending_len())
    }

    pub fn best(&self, prefix: &Prefix) -> Option<&Route> {
        flagged(self.candidates.get(prefix)?)
    }

    pub fn loc_rib(&self) -> impl Iterator<Item = &Route> {
        self.candidates.values().filter_map(|v| flagged(v))
    }

    /// Routes received from one peer and kept (its Adj-RIB-In).
    pub fn adj_rib_in(&self, addr: IpAddr) -> impl Iterator<Item = &Route> {
        self.candidates
            .values()
            .flatten()
            .filter(move |r| r.source.peer_addr() == Some(addr))
    }

    /// The Adj-RIB-Out of a peer: the Loc-RIB as exported to it (prefix,
    /// next hop and attributes it is told). Empty without a session. The
    /// best paths only: an ADD-PATH peer is told the multipath sets.
    pub fn adj_rib_out(&self, addr: IpAddr) -> Vec<(Prefix, IpAddr, PathAttributes)> {
        let Some(p) = self.peers.get(&addr) else {
            return Vec::new();
        };
        let Some(session) = &p.session else {
            return Vec::new();
        };
        let ebgp = self.is_ebgp(&p.cfg);
        self.loc_rib()
            .filter_map(|r| {
                out::export(
                    &self.cfg,
                    &p.cfg,
                    ebgp,
                    session.local_addr,
                    session.understands,
                    r,
                )
                .map(|e| (r.prefix, e.next_hop, e.attrs))
            })
            .collect()
    }

    pub fn loc_rib_len(&self) -> usize {
        self.loc_len
    }

    /// Number of stale routes kept from a peer.
    pub fn stale_count(&self, addr: IpAddr) -> usize {
        self.adj_rib_in(addr).filter(|r| r.stale).count()
    }

    /// (received, advertised) prefix counts for a peer.
    pub fn prefix_counts(&self, addr: IpAddr) -> (usize, usize) {
        let Some(p) = self.peers.get(&addr) else {
            return (0, 0);
        };
        let advertised = p
            .group
            .and_then(|id| self.groups.get(&id))
            .map(|g| g.advertised - g.own.get(&addr).copied().unwrap_or(0).min(g.advertised))
            .unwrap_or(0);
        (p.received, advertised)
    }
}

#[cfg(test)]
mod tests;

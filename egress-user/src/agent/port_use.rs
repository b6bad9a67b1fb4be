//! What the agent tells the controller about its port blocks: per EIP, the
//! ports in use (the live NAT flows to the busiest remote address and
//! port: that is what competes for ports), and the draining blocks that no
//! live NAT entry uses and have not for the quarantine
//! (`--port-release-quarantine`, 30 s by default). The decisions are
//! pure functions over plain data ([`summarize`], [`Drains::released`],
//! [`must_publish`]); [`read_flows`] and [`run`] are the thin I/O around
//! them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use egress_common::config::{DatapathConfig, NatTimeouts};
use egress_common::nat::{NatEntry, NatKey, TCP_ESTABLISHED};
use egress_control::api::{EgressTunnelStatus, EipPortUse};
use egress_control::controller::grants::wanted_blocks;
use egress_control::datastore::Datastore;

use crate::datapath::stats::addr_from_key;

/// How often the agent reads its NAT tables and reports.
pub const PERIOD: Duration = Duration::from_secs(2);

/// One translated flow as the NAT tables hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    pub eip: IpAddr,
    pub eip_port: u16,
    /// The remote end and protocol: ports are unique per remote.
    pub remote: (IpAddr, u16, u8),
    /// Nanoseconds since its last packet either way (coarse clock).
    pub idle_ns: u64,
    /// Its idle timeout, from its protocol and state.
    pub timeout_ns: u64,
}

impl Flow {
    /// A flow the datapath would not yet reclaim.
    pub fn live(&self) -> bool {
        self.idle_ns < self.timeout_ns
    }
}

/// One EIP's use on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Live flows to the busiest remote (address, port, protocol).
    pub in_use: u32,
    /// Blocks with at least one live flow.
    pub live_blocks: BTreeSet<u16>,
}

/// Per EIP: ports in use and the blocks live flows use.
pub fn summarize(flows: &[Flow], block_size: u16) -> BTreeMap<IpAddr, Summary> {
    let size = block_size.max(1);
    let mut per_remote: HashMap<(IpAddr, (IpAddr, u16, u8)), u32> = HashMap::new();
    let mut out: BTreeMap<IpAddr, Summary> = BTreeMap::new();
    for f in flows.iter().filter(|f| f.live()) {
        let n = per_remote.entry((f.eip, f.remote)).or_default();
        *n += 1;
        let s = out.entry(f.eip).or_default();
        s.in_use = s.in_use.max(*n);
        s.live_blocks.insert(f.eip_port / size);
    }
    out
}

/// When each draining block was first seen free of live flows.
#[derive(Clone, Debug, Default)]
pub struct Drains {
    free_since: BTreeMap<(IpAddr, u16), Instant>,
}

impl Drains {
    /// The draining blocks free for at least `quarantine`, per EIP. A block
    /// with a live flow, or no longer draining, starts over.
    pub fn released(
        &mut self,
        now: Instant,
        draining: &BTreeSet<(IpAddr, u16)>,
        use_: &BTreeMap<IpAddr, Summary>,
        quarantine: Duration,
    ) -> BTreeMap<IpAddr, Vec<u16>> {
        let busy = |eip: &IpAddr, b: &u16| use_.get(eip).is_some_and(|s| s.live_blocks.contains(b));
        self.free_since
            .retain(|(eip, b), _| draining.contains(&(*eip, *b)) && !busy(eip, b));
        let mut out: BTreeMap<IpAddr, Vec<u16>> = BTreeMap::new();
        for (eip, b) in draining {
            if busy(eip, b) {
                continue;
            }
            let since = *self.free_since.entry((*eip, *b)).or_insert(now);
            if now.duration_since(since) >= quarantine {
                out.entry(*eip).or_default().push(*b);
            }
        }
        out
    }
}

/// The report for this node's grants in `st`.
pub fn report(
    st: &EgressTunnelStatus,
    use_: &BTreeMap<IpAddr, Summary>,
    released: &BTreeMap<IpAddr, Vec<u16>>,
) -> Vec<EipPortUse> {
    let mut out: Vec<EipPortUse> = st
        .port_blocks
        .iter()
        .filter_map(|g| {
            let eip: IpAddr = g.eip.parse().ok()?;
            Some(EipPortUse {
                gateway: g.gateway.clone(),
                eip: g.eip.clone(),
                in_use: use_.get(&eip).map_or(0, |s| s.in_use),
                released: released.get(&eip).cloned().unwrap_or_default(),
            })
        })
        .collect();
    out.sort();
    out
}

/// Whether `new` says something the controller would act on that `last`
/// (what it holds now) did not: a different number of wanted blocks, or
/// other released blocks.
pub fn must_publish(new: &[EipPortUse], last: &[EipPortUse], block_size: u16) -> bool {
    let key = |r: &[EipPortUse]| -> Vec<(String, String, u16, Vec<u16>)> {
        r.iter()
            .map(|u| {
                let w = wanted_blocks(u.in_use, block_size);
                (u.gateway.clone(), u.eip.clone(), w, u.released.clone())
            })
            .collect()
    };
    key(new) != key(last)
}

/// The draining blocks of this node's grants.
fn draining(st: &EgressTunnelStatus) -> BTreeSet<(IpAddr, u16)> {
    st.port_blocks
        .iter()
        .filter_map(|g| Some((g.eip.parse::<IpAddr>().ok()?, &g.draining)))
        .flat_map(|(eip, d)| d.iter().map(move |b| (eip, *b)))
        .collect()
}

const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

fn timeout_ns(t: &NatTimeouts, proto: u8, fwd: u8, rev: u8) -> u64 {
    let secs = match proto {
        IPPROTO_TCP if fwd == TCP_ESTABLISHED && rev == TCP_ESTABLISHED => t.tcp_established,
        IPPROTO_TCP => t.tcp_transitory,
        IPPROTO_UDP => t.udp,
        _ => t.icmp,
    };
    u64::from(secs) * 1_000_000_000
}

/// The coarse monotonic clock the programs stamp NAT entries with.
fn coarse_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn lru(
    pin_dir: &Path,
    name: &str,
) -> Result<aya::maps::HashMap<aya::maps::MapData, NatKey, NatEntry>> {
    let data = aya::maps::MapData::from_pin(pin_dir.join(name))?;
    Ok(aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(
        data,
    ))?)
}

/// Every translated flow, from the pinned NAT tables (a reverse entry is
/// a port taken; its forward entry has the pod side's last packet).
pub fn read_flows(pin_dir: &Path) -> Result<Vec<Flow>> {
    let cfg_data = aya::maps::MapData::from_pin(pin_dir.join(egress_common::maps::CONFIG))?;
    let cfg: aya::maps::Array<_, DatapathConfig> =
        aya::maps::Array::try_from(aya::maps::Map::Array(cfg_data))?;
    let timeouts = cfg.get(&0, 0)?.timeouts;
    let mut fwd: HashMap<NatKey, NatEntry> = HashMap::new();
    for r in lru(pin_dir, egress_common::maps::NAT_FWD)?.iter() {
        let (k, v) = r?;
        fwd.insert(k, v);
    }
    let now = coarse_now_ns();
    let mut out = Vec::new();
    for r in lru(pin_dir, egress_common::maps::NAT_REV)?.iter() {
        let (k, rev) = r?;
        let fk = NatKey {
            src: rev.addr,
            dst: k.src,
            sport: rev.port,
            dport: k.sport,
            proto: k.proto,
            ..k
        };
        let f = fwd.get(&fk);
        let seen = f.map_or(0, |f| f.last_seen_ns).max(rev.last_seen_ns);
        out.push(Flow {
            eip: addr_from_key(&k.dst),
            eip_port: k.dport,
            remote: (addr_from_key(&k.src), k.sport, k.proto),
            idle_ns: now.saturating_sub(seen),
            timeout_ns: timeout_ns(&timeouts, k.proto, f.map_or(0, |f| f.state), rev.state),
        });
    }
    Ok(out)
}

/// Reads, decides and publishes every [`PERIOD`] until dropped; `grants`
/// is the node's EgressTunnel status as the agent's view last held it.
pub async fn run(
    ds: Arc<dyn Datastore>,
    node: String,
    pin_dir: PathBuf,
    quarantine: Duration,
    grants: tokio::sync::watch::Receiver<Option<EgressTunnelStatus>>,
) {
    let mut drains = Drains::default();
    let mut tick = tokio::time::interval(PERIOD);
    loop {
        tick.tick().await;
        let st = grants.borrow().clone();
        let Some(st) = st else { continue };
        if let Err(e) = once(ds.as_ref(), &node, &pin_dir, quarantine, &st, &mut drains).await {
            tracing::debug!(error = %format!("{e:#}"), "port use not reported this time");
        }
    }
}

async fn once(
    ds: &dyn Datastore,
    node: &str,
    pin_dir: &Path,
    quarantine: Duration,
    st: &EgressTunnelStatus,
    drains: &mut Drains,
) -> Result<()> {
    if st.port_blocks.is_empty() && st.port_use.is_empty() {
        return Ok(());
    }
    let flows = read_flows(pin_dir)?;
    let use_ = summarize(&flows, st.port_block_size);
    let released = drains.released(Instant::now(), &draining(st), &use_, quarantine);
    let new = report(st, &use_, &released);
    if must_publish(&new, &st.port_use, st.port_block_size) {
        egress_control::registration::publish_port_use(ds, node, &new).await?;
        for u in new.iter().filter(|u| !u.released.is_empty()) {
            tracing::info!(eip = %u.eip, blocks = ?u.released, "draining port blocks emptied: released");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

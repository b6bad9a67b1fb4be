mod config; // each kind's configuration file

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use egress_tests::{link_veth, run, unique_name, Netns, Proc};
use serde_json::Value;

use crate::wait_until;

pub(crate) fn speaker_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("BGP_SPEAKER_BIN") {
        return Ok(p.into());
    }
    // target/<profile>/deps/<test> -> target/<profile>/examples/bgp-speaker
    let exe = std::env::current_exe()?;
    let candidate = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|p| p.join("examples/bgp-speaker"))
        .context("no target folder")?;
    anyhow::ensure!(
        candidate.exists(),
        "{} is missing: run `cargo build -p egress-bgp --examples` (or set BGP_SPEAKER_BIN)",
        candidate.display()
    );
    Ok(candidate)
}

/// A scratch folder, removed on drop; world-writable for FRR's own user.
pub(crate) struct Dir(PathBuf);

impl Dir {
    pub(crate) fn new(label: &str) -> Result<Dir> {
        let p = std::env::temp_dir().join(unique_name(label));
        std::fs::create_dir_all(&p)?;
        run(&["chmod", "0777", p.to_str().context("path")?])?;
        Ok(Dir(p))
    }

    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub(crate) fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One L2 segment (a bridge in its own namespace) that every router joins.
pub(crate) struct Lan {
    ns: Netns,
    ports: usize,
}

/// Node `n`'s IPv4 address on the LAN.
pub(crate) fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, n)
}

/// Node `n`'s IPv6 address on the LAN (every node has both).
pub(crate) fn ip6(n: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x99, 0, 0, 0, 0, 0, n as u16)
}

/// No neighbours, for the lists that take either family.
pub(crate) const NO_PEERS: [IpAddr; 0] = [];

/// The node number of a LAN address of either family ([`ip`], [`ip6`]).
fn node_number(a: IpAddr) -> u8 {
    match a {
        IpAddr::V4(a) => a.octets()[3],
        IpAddr::V6(a) => a.octets()[15],
    }
}

/// The router id of the node at `me`: its IPv4 address, also when it
/// speaks BGP over IPv6 only.
fn router_id_of(me: IpAddr) -> Ipv4Addr {
    ip(node_number(me))
}

impl Lan {
    pub(crate) fn new() -> Result<Lan> {
        let ns = Netns::new("lan")?;
        ns.bridge("br0")?;
        Ok(Lan { ns, ports: 0 })
    }

    /// A new node joined to the bridge with both its addresses, [`ip`] and
    /// [`ip6`] of `addr`'s node number (IPv6 without duplicate address
    /// detection, so usable at once).
    pub(crate) fn node(&mut self, label: &str, addr: impl Into<IpAddr>) -> Result<Netns> {
        let n = node_number(addr.into());
        let ns = Netns::new(label)?;
        self.ports += 1;
        let port = format!("p{}", self.ports);
        link_veth(&ns, "eth0", &self.ns, &port)?;
        self.ns.ip(&["link", "set", &port, "master", "br0"])?;
        ns.addr("eth0", &format!("{}/24", ip(n)))?;
        ns.addr("eth0", &format!("{}/64", ip6(n)))?;
        Ok(ns)
    }

    /// A `kind` speaker on a new node `label` at `addr` whose neighbours
    /// `peers` are plain peers ([`RouterCfg::peer_of`]), announcing
    /// `announce`.
    pub(crate) fn peer(
        &mut self,
        kind: Kind,
        label: &str,
        addr: impl Into<IpAddr> + Copy,
        peers: &[impl Into<IpAddr> + Copy],
        announce: Vec<String>,
    ) -> Result<Router> {
        Router::start(
            kind,
            self.node(label, addr)?,
            RouterCfg::peer_of(addr, peers, announce),
        )
    }

    /// Our reflector on a new node `label` at `addr`
    /// ([`RouterCfg::reflector`]).
    pub(crate) fn reflector(
        &mut self,
        label: &str,
        addr: impl Into<IpAddr> + Copy,
        clients: &[impl Into<IpAddr> + Copy],
        peers: &[impl Into<IpAddr> + Copy],
        announce: Vec<String>,
    ) -> Result<Router> {
        let cfg = RouterCfg::reflector(addr, clients, peers, announce);
        Router::start(Kind::Ours, self.node(label, addr)?, cfg)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Ours,
    Frr,
    Bird,
    Gobgp,
}

#[derive(Clone, Debug)]
pub(crate) struct Neighbor {
    /// Either family: an IPv6 session carries IPv4 unicast too.
    pub(crate) addr: IpAddr,
    /// The neighbour is a route reflector client of this router.
    pub(crate) client: bool,
    /// Ours only: offer it ADD-PATH Send (RFC 7911).
    pub(crate) add_path: bool,
    /// FRR and BIRD on an IPv6 session: offer the extended next hop
    /// capability (RFC 8950) for IPv4 unicast. Ours always offers it, and
    /// GoBGP 3.10 offers it on every session of a configured ipv4-unicast
    /// family, with no setting to turn it off.
    pub(crate) ext_next_hop: bool,
}

impl Neighbor {
    fn new(addr: impl Into<IpAddr>, client: bool) -> Neighbor {
        Neighbor {
            addr: addr.into(),
            client,
            add_path: false,
            ext_next_hop: true,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct RouterCfg {
    /// The session address (every neighbour's session is of this family).
    pub(crate) me: IpAddr,
    /// [`router_id_of`] `me`.
    pub(crate) router_id: Ipv4Addr,
    /// Set on reflectors.
    pub(crate) cluster_id: Option<&'static str>,
    pub(crate) neighbors: Vec<Neighbor>,
    pub(crate) announce: Vec<String>,
}

impl RouterCfg {
    /// A speaker whose neighbours are plain peers (a reflector's client,
    /// an upstream router).
    /// `announce` may hold prefixes of both families.
    pub(crate) fn peer_of(
        me: impl Into<IpAddr>,
        peers: &[impl Into<IpAddr> + Copy],
        announce: Vec<String>,
    ) -> Self {
        let me = me.into();
        Self {
            me,
            router_id: router_id_of(me),
            cluster_id: None,
            neighbors: peers.iter().map(|&a| Neighbor::new(a, false)).collect(),
            announce,
        }
    }

    /// A reflector of the test cluster (`CLUSTER`): `clients` are its route
    /// reflector clients, `peers` its other neighbours.
    pub(crate) fn reflector(
        me: impl Into<IpAddr>,
        clients: &[impl Into<IpAddr> + Copy],
        peers: &[impl Into<IpAddr> + Copy],
        announce: Vec<String>,
    ) -> Self {
        let me = me.into();
        Self {
            me,
            router_id: router_id_of(me),
            cluster_id: Some(crate::CLUSTER),
            neighbors: clients
                .iter()
                .map(|&a| Neighbor::new(a, true))
                .chain(peers.iter().map(|&a| Neighbor::new(a, false)))
                .collect(),
            announce,
        }
    }
}

/// A running BGP router of any kind, with its own namespace.
pub(crate) struct Router {
    kind: Kind,
    ns: Netns,
    dir: Dir,
    pub(crate) cfg: RouterCfg,
    proc: Option<Proc>,
    /// TCP-MD5 key used with every neighbour.
    password: Option<&'static str>,
    /// Ours only: the neighbours are added through the handle once running
    /// (as a reflector adds the nodes of the datastore) and the password is
    /// the speaker's default key rather than each peer's own.
    late_peers: bool,
    /// Whether the router has run before: a restart, not a first start.
    restarted: bool,
}

impl Router {
    pub(crate) fn start(kind: Kind, ns: Netns, cfg: RouterCfg) -> Result<Router> {
        Self::start_with_password(kind, ns, cfg, None)
    }

    pub(crate) fn start_with_password(
        kind: Kind,
        ns: Netns,
        cfg: RouterCfg,
        password: Option<&'static str>,
    ) -> Result<Router> {
        let dir = Dir::new(match kind {
            Kind::Ours => "ours",
            Kind::Frr => "frr",
            Kind::Bird => "bird",
            Kind::Gobgp => "gobgp",
        })?;
        let mut r = Router {
            kind,
            ns,
            dir,
            cfg,
            proc: None,
            password,
            late_peers: false,
            restarted: false,
        };
        r.write_config()?;
        r.spawn()?;
        Ok(r)
    }

    /// Our speaker with its neighbours added at run time, under the
    /// speaker-wide default TCP-MD5 key.
    pub(crate) fn start_ours_with_late_peers(
        ns: Netns,
        cfg: RouterCfg,
        password: &'static str,
    ) -> Result<Router> {
        let mut r = Router {
            kind: Kind::Ours,
            ns,
            dir: Dir::new("ours")?,
            cfg,
            proc: None,
            password: Some(password),
            late_peers: true,
            restarted: false,
        };
        r.write_config()?;
        r.spawn()?;
        Ok(r)
    }

    pub(crate) fn spawn(&mut self) -> Result<()> {
        let d = self.dir.path().to_string();
        let proc = match self.kind {
            Kind::Ours => {
                // The previous run's status must not pass for this one's.
                let _ = std::fs::remove_file(self.dir.file("status.json"));
                let bin = speaker_bin()?;
                let cfg = self.dir.file("speaker.json");
                let mut p = self
                    .ns
                    .spawn(&[bin.to_str().context("bin")?, cfg.to_str().context("cfg")?])?;
                p.wait_for_line("ready", Duration::from_secs(10))?;
                p
            }
            Kind::Frr => {
                let _ = std::fs::remove_file(self.dir.file("bgpd.pid"));
                egress_tests::frr::spawn_bgpd(&self.ns, &d)?
            }
            Kind::Bird => {
                let conf = format!("{d}/bird.conf");
                let sock = format!("{d}/bird.ctl");
                // BIRD claims preserved forwarding state (the F bit) only
                // when started in recovery mode (-R), as a supervisor
                // restarting it for graceful restart does. Without the F
                // bit, RFC 4724 4.2 has the helper drop its stale routes
                // at once.
                let mut args = vec!["bird", "-f", "-c", &conf, "-s", &sock];
                if self.restarted {
                    args.push("-R");
                }
                self.ns.spawn(&args)?
            }
            Kind::Gobgp => {
                let conf = format!("{d}/gobgp.toml");
                self.ns.spawn(&[
                    "gobgpd",
                    "-f",
                    &conf,
                    "--api-hosts",
                    "127.0.0.1:50051",
                    "-l",
                    "warn",
                ])?
            }
        };
        self.proc = Some(proc);
        self.restarted = true;
        // Ready when the management interface answers.
        wait_until(
            &format!("{:?} to answer", self.kind),
            Duration::from_secs(15),
            || Ok(self.established().is_ok()),
        )?;
        if self.kind == Kind::Gobgp {
            for p in &self.cfg.announce {
                let family = if p.contains(':') { "ipv6" } else { "ipv4" };
                self.ns
                    .exec(&["gobgp", "global", "rib", "add", p, "-a", family])?;
            }
        }
        Ok(())
    }

    /// SIGKILL, as a crash would: no NOTIFICATION, TCP just goes away.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    /// Ours only: has the running speaker carry out `lines` (see the
    /// `bgp-speaker` example's `command_file`), written whole at once.
    pub(crate) fn ours_command(&self, lines: &str) -> Result<()> {
        let tmp = self.dir.file("commands.tmp");
        std::fs::write(&tmp, lines)?;
        std::fs::rename(&tmp, self.dir.file("commands"))?;
        Ok(())
    }

    pub(crate) fn ours_doc(&self) -> Result<Value> {
        let text = std::fs::read_to_string(self.dir.file("status.json"))?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Neighbours with an Established session.
    pub(crate) fn established(&self) -> Result<BTreeSet<IpAddr>> {
        let mut up = BTreeSet::new();
        match self.kind {
            Kind::Ours => {
                for p in self.ours_doc()?["status"]["peers"]
                    .as_array()
                    .context("peers")?
                {
                    if p["state"] == "Established" {
                        up.insert(p["address"].as_str().context("address")?.parse()?);
                    }
                }
            }
            Kind::Frr => {
                let out = self.vtysh("show bgp ipv4 unicast summary json")?;
                let v: Value = serde_json::from_str(&out)?;
                if let Some(peers) = v["peers"].as_object() {
                    for (a, p) in peers {
                        if p["state"] == "Established" {
                            up.insert(a.parse()?);
                        }
                    }
                }
            }
            Kind::Bird => {
                let out = self.birdc(&["show", "protocols"])?;
                for n in &self.cfg.neighbors {
                    let name = bird_proto(n.addr);
                    if out
                        .lines()
                        .any(|l| l.starts_with(&name) && l.contains("Established"))
                    {
                        up.insert(n.addr);
                    }
                }
            }
            Kind::Gobgp => {
                let out = self.ns.exec(&["gobgp", "neighbor"])?;
                for l in out.lines().skip(1) {
                    let mut f = l.split_whitespace();
                    if let (Some(a), true) = (f.next(), l.contains("Establ")) {
                        up.insert(a.parse()?);
                    }
                }
            }
        }
        Ok(up)
    }

    pub(crate) fn vtysh(&self, cmd: &str) -> Result<String> {
        self.ns
            .exec(&["vtysh", "--vty_socket", self.dir.path(), "-c", cmd])
    }

    pub(crate) fn birdc(&self, args: &[&str]) -> Result<String> {
        let sock = self.dir.file("bird.ctl");
        let mut argv = vec!["birdc", "-s", sock.to_str().context("sock")?];
        argv.extend_from_slice(args);
        self.ns.exec(&argv)
    }

    /// prefix (IPv4 and IPv6 unicast) -> the BGP next hops of its paths as
    /// the router holds them (global addresses: the link-local one FRR and
    /// BIRD keep beside an IPv6 next hop is left out). Ours holds only its
    /// best path.
    pub(crate) fn next_hops(&self) -> Result<BTreeMap<String, BTreeSet<IpAddr>>> {
        let mut out: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
        match self.kind {
            Kind::Ours => {
                let doc = self.ours_doc()?;
                for (prefix, v) in doc["routes"].as_object().context("routes")? {
                    let nh = v[0].as_str().context("next hop")?.parse()?;
                    out.entry(prefix.clone()).or_default().insert(nh);
                }
            }
            Kind::Frr => {
                for family in ["ipv4", "ipv6"] {
                    let text = self.vtysh(&format!("show bgp {family} unicast json"))?;
                    let v: Value = serde_json::from_str(&text)?;
                    let Some(routes) = v["routes"].as_object() else {
                        continue;
                    };
                    for (prefix, paths) in routes {
                        let e = out.entry(prefix.clone()).or_default();
                        for p in paths.as_array().context("paths")? {
                            for nh in p["nexthops"].as_array().context("nexthops")? {
                                if nh["scope"] != "link-local" {
                                    e.insert(nh["ip"].as_str().context("ip")?.parse()?);
                                }
                            }
                        }
                    }
                }
            }
            Kind::Gobgp => {
                for family in ["ipv4", "ipv6"] {
                    let text = self
                        .ns
                        .exec(&["gobgp", "-j", "global", "rib", "-a", family])?;
                    let v: Value = serde_json::from_str(&text)?;
                    for (prefix, paths) in v.as_object().context("rib")? {
                        let e = out.entry(prefix.clone()).or_default();
                        for p in paths.as_array().context("paths")? {
                            // NEXT_HOP (type 3) or MP_REACH_NLRI (type 14).
                            for a in p["attrs"].as_array().context("attrs")? {
                                if a["type"] == 3 || a["type"] == 14 {
                                    let nh = a["nexthop"].as_str().context("nexthop")?;
                                    e.insert(nh.parse()?);
                                }
                            }
                        }
                    }
                }
            }
            Kind::Bird => {
                // "10.1.0.0/24   unicast [p10_99_0_1 ...] * (100) [i]", then
                // indented attribute lines, among them
                // "BGP.next_hop: fd00:99::11 fe80::..." (global first).
                let text = self.birdc(&["show", "route", "all"])?;
                let mut current = None;
                for l in text.lines() {
                    let first = l.split_whitespace().next().unwrap_or("");
                    if !l.starts_with(char::is_whitespace) && first.contains('/') {
                        current = Some(first.to_string());
                    }
                    let (Some(prefix), Some(rest)) =
                        (&current, l.trim_start().strip_prefix("BGP.next_hop:"))
                    else {
                        continue;
                    };
                    let nh = rest.split_whitespace().next().context("next hop")?;
                    out.entry(prefix.clone()).or_default().insert(nh.parse()?);
                }
            }
        }
        Ok(out)
    }

    /// prefix -> the neighbours it was learned from (empty for our own).
    pub(crate) fn routes(&self) -> Result<BTreeMap<String, BTreeSet<IpAddr>>> {
        let mut out: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
        match self.kind {
            Kind::Ours => {
                let doc = self.ours_doc()?;
                for (prefix, v) in doc["routes"].as_object().context("routes")? {
                    let e = out.entry(prefix.clone()).or_default();
                    if let Some(from) = v[1].as_str() {
                        e.insert(from.parse()?);
                    }
                }
            }
            Kind::Frr => {
                let v: Value = serde_json::from_str(&self.vtysh("show bgp ipv4 unicast json")?)?;
                for (prefix, paths) in v["routes"].as_object().context("routes")? {
                    let e = out.entry(prefix.clone()).or_default();
                    for p in paths.as_array().context("paths")? {
                        if let Some(Ok(a)) = p["peerId"].as_str().map(|s| s.parse()) {
                            e.insert(a);
                        }
                    }
                }
            }
            Kind::Gobgp => {
                let text = self
                    .ns
                    .exec(&["gobgp", "-j", "global", "rib", "-a", "ipv4"])?;
                let v: Value = serde_json::from_str(&text)?;
                for (prefix, paths) in v.as_object().context("rib")? {
                    let e = out.entry(prefix.clone()).or_default();
                    for p in paths.as_array().context("paths")? {
                        if let Some(Ok(a)) = p["neighbor-ip"].as_str().map(|s| s.parse()) {
                            e.insert(a);
                        }
                    }
                }
            }
            Kind::Bird => {
                // "10.1.0.0/24   unicast [p10_99_0_1 12:00:00.000 from ...] * (100) [i]"
                // with further paths of the same prefix on indented lines.
                let text = self.birdc(&["show", "route"])?;
                let mut current = None;
                for l in text.lines() {
                    let first = l.split_whitespace().next().unwrap_or("");
                    if !l.starts_with(char::is_whitespace) && first.contains('/') {
                        current = Some(first.to_string());
                    }
                    let (Some(prefix), Some(start)) = (&current, l.find('[')) else {
                        continue;
                    };
                    let proto = l[start + 1..].split_whitespace().next().unwrap_or("");
                    let e = out.entry(prefix.clone()).or_default();
                    if let Some(a) = self
                        .cfg
                        .neighbors
                        .iter()
                        .find(|n| bird_proto(n.addr) == proto)
                    {
                        e.insert(a.addr);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// BIRD's protocol name for the session with `a` (a symbol: no dots or
/// colons).
fn bird_proto(a: IpAddr) -> String {
    format!("p{}", a.to_string().replace(['.', ':'], "_"))
}

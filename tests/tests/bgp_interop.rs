//! BGP interop with real peers from Debian's packages (FRR 8.4, BIRD 2,
//! GoBGP 3) in network namespaces, and the route-reflector incident as a
//! regression test. Needs root:
//!
//! ```text
//! cargo build -p egress-bgp --examples
//! cargo test -p egress-tests --test bgp_interop -- --ignored --test-threads=1
//! ```
//!
//! Our side runs as the `bgp-speaker` example process (so it can be killed
//! with SIGKILL and started again); set BGP_SPEAKER_BIN to use another
//! build. Every peer's routes are read with its own JSON or CLI output.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use egress_tests::{is_root, link_veth, run, unique_name, Netns, Proc};
use serde_json::{json, Value};

const ASN: u32 = 65000;
const CLUSTER: &str = "1.1.1.1";

fn speaker_bin() -> Result<PathBuf> {
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
struct Dir(PathBuf);

impl Dir {
    fn new(label: &str) -> Result<Dir> {
        let p = std::env::temp_dir().join(unique_name(label));
        std::fs::create_dir_all(&p)?;
        run(&["chmod", "0777", p.to_str().context("path")?])?;
        Ok(Dir(p))
    }

    fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 temp path")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One L2 segment (a bridge in its own namespace) that every router joins.
struct Lan {
    ns: Netns,
    ports: usize,
}

fn ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 99, 0, n)
}

impl Lan {
    fn new() -> Result<Lan> {
        let ns = Netns::new("lan")?;
        ns.bridge("br0")?;
        Ok(Lan { ns, ports: 0 })
    }

    fn node(&mut self, label: &str, addr: Ipv4Addr) -> Result<Netns> {
        let ns = Netns::new(label)?;
        self.ports += 1;
        let port = format!("p{}", self.ports);
        link_veth(&ns, "eth0", &self.ns, &port)?;
        self.ns.ip(&["link", "set", &port, "master", "br0"])?;
        ns.addr("eth0", &format!("{addr}/24"))?;
        Ok(ns)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Ours,
    Frr,
    Bird,
    Gobgp,
}

#[derive(Clone, Debug)]
struct Neighbor {
    addr: Ipv4Addr,
    /// The neighbour is a route reflector client of this router.
    client: bool,
}

#[derive(Clone, Debug)]
struct RouterCfg {
    me: Ipv4Addr,
    /// Set on reflectors.
    cluster_id: Option<&'static str>,
    neighbors: Vec<Neighbor>,
    announce: Vec<String>,
}

/// A running BGP router of any kind, with its own namespace.
struct Router {
    kind: Kind,
    ns: Netns,
    dir: Dir,
    cfg: RouterCfg,
    proc: Option<Proc>,
    /// TCP-MD5 key used with every neighbour.
    password: Option<&'static str>,
    /// Ours only: the neighbours are added through the handle once running
    /// (as a reflector adds the nodes of the datastore) and the password is
    /// the speaker's default key rather than each peer's own.
    late_peers: bool,
}

/// A broken invariant (a route that must never leave a table did): fails
/// a [`wait_until`] at once. Other errors, such as a daemon not answering
/// while it restarts, are retried until the timeout.
#[derive(Debug)]
struct Violation(String);

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Violation {}

fn hold(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Violation(what()).into())
    }
}

fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match f() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) if e.downcast_ref::<Violation>().is_some() => return Err(e),
            Err(e) => last_err = Some(e),
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what} (last error: {last_err:?})");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Router {
    fn start(kind: Kind, ns: Netns, cfg: RouterCfg) -> Result<Router> {
        Self::start_with_password(kind, ns, cfg, None)
    }

    fn start_with_password(
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
        };
        r.write_config()?;
        r.spawn()?;
        Ok(r)
    }

    /// Our speaker with its neighbours added at run time, under the
    /// speaker-wide default TCP-MD5 key.
    fn start_ours_with_late_peers(
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
        };
        r.write_config()?;
        r.spawn()?;
        Ok(r)
    }

    fn write_config(&self) -> Result<()> {
        let c = &self.cfg;
        match self.kind {
            Kind::Ours => {
                let peers: Vec<Value> = c
                    .neighbors
                    .iter()
                    .map(|n| {
                        let own = if self.late_peers { None } else { self.password };
                        json!({"address": n.addr.to_string(), "asn": ASN, "client": n.client,
                            "password": own})
                    })
                    .collect();
                let (peers, late_peers) = if self.late_peers {
                    (Vec::new(), peers)
                } else {
                    (peers, Vec::new())
                };
                let announce: Vec<Value> = c
                    .announce
                    .iter()
                    .map(|p| json!([p, c.me.to_string()]))
                    .collect();
                let doc = json!({
                    "asn": ASN, "router_id": c.me.to_string(), "cluster_id": c.cluster_id,
                    "listen": format!("{}:179", c.me), "hold_time": 9, "restart_time": 30,
                    "restarting": true, "deferral_time": 15, "connect_retry_ms": 500,
                    "peers": peers, "announce": announce, "print_routes": false,
                    "late_peers": late_peers,
                    "default_password": if self.late_peers { self.password } else { None },
                    "status_file": self.dir.file("status.json"),
                });
                std::fs::write(self.dir.file("speaker.json"), doc.to_string())?;
            }
            Kind::Frr => {
                let mut s = format!(
                    "frr defaults datacenter\nhostname r{me}\nrouter bgp {ASN}\n bgp router-id {me}\n \
                     no bgp ebgp-requires-policy\n no bgp network import-check\n bgp graceful-restart\n \
                     bgp graceful-restart restart-time 30\n bgp graceful-restart preserve-fw-state\n",
                    me = c.me
                );
                if let Some(id) = c.cluster_id {
                    s += &format!(" bgp cluster-id {id}\n");
                }
                for n in &c.neighbors {
                    s += &format!(
                        " neighbor {a} remote-as {ASN}\n neighbor {a} timers 3 9\n neighbor {a} timers connect 1\n",
                        a = n.addr
                    );
                    if let Some(pw) = self.password {
                        s += &format!(" neighbor {} password {pw}\n", n.addr);
                    }
                }
                s += " address-family ipv4 unicast\n";
                for n in c.neighbors.iter().filter(|n| n.client) {
                    s += &format!("  neighbor {} route-reflector-client\n", n.addr);
                }
                for p in &c.announce {
                    s += &format!("  network {p}\n");
                }
                s += " exit-address-family\n address-family ipv6 unicast\n";
                for n in &c.neighbors {
                    s += &format!("  neighbor {} activate\n", n.addr);
                    if n.client {
                        s += &format!("  neighbor {} route-reflector-client\n", n.addr);
                    }
                }
                s += " exit-address-family\n";
                std::fs::write(self.dir.file("bgpd.conf"), s)?;
            }
            Kind::Bird => {
                let mut s = format!(
                    "router id {};\nprotocol device {{ }}\nprotocol static {{ ipv4;\n",
                    c.me
                );
                for p in &c.announce {
                    s += &format!("  route {p} blackhole;\n");
                }
                s += "}\n";
                for n in &c.neighbors {
                    let rr = match (n.client, c.cluster_id) {
                        (true, Some(id)) => format!("  rr client;\n  rr cluster id {id};\n"),
                        (true, None) => "  rr client;\n".to_string(),
                        _ => String::new(),
                    };
                    let pw = self
                        .password
                        .map(|p| format!("  password \"{p}\";\n"))
                        .unwrap_or_default();
                    s += &format!(
                        "protocol bgp {name} {{\n{pw}  local {me} as {ASN};\n  neighbor {a} as {ASN};\n  direct;\n  \
                         hold time 9;\n  keepalive time 3;\n  connect retry time 1;\n  graceful restart on;\n  \
                         graceful restart time 30;\n{rr}  ipv4 {{ import all; export where source ~ [RTS_STATIC, RTS_BGP]; }};\n}}\n",
                        name = bird_proto(n.addr),
                        me = c.me,
                        a = n.addr
                    );
                }
                std::fs::write(self.dir.file("bird.conf"), s)?;
            }
            Kind::Gobgp => {
                let mut s = format!(
                    "[global.config]\n  as = {ASN}\n  router-id = \"{me}\"\n  local-address-list = [\"{me}\"]\n",
                    me = c.me
                );
                for n in &c.neighbors {
                    s += &format!(
                        "[[neighbors]]\n  [neighbors.config]\n    neighbor-address = \"{a}\"\n    peer-as = {ASN}\n{auth}  \
                         [neighbors.timers.config]\n    hold-time = 9\n    keepalive-interval = 3\n    connect-retry = 1\n  \
                         [neighbors.graceful-restart.config]\n    enabled = true\n    restart-time = 30\n",
                        a = n.addr,
                        auth = self
                            .password
                            .map(|p| format!("    auth-password = \"{p}\"\n"))
                            .unwrap_or_default()
                    );
                    if n.client {
                        s += &format!(
                            "  [neighbors.route-reflector.config]\n    route-reflector-client = true\n    \
                             route-reflector-cluster-id = \"{}\"\n",
                            c.cluster_id.unwrap_or(CLUSTER)
                        );
                    }
                    s += "  [[neighbors.afi-safis]]\n    [neighbors.afi-safis.config]\n      afi-safi-name = \"ipv4-unicast\"\n    \
                          [neighbors.afi-safis.mp-graceful-restart.config]\n      enabled = true\n";
                }
                std::fs::write(self.dir.file("gobgp.toml"), s)?;
            }
        }
        Ok(())
    }

    fn spawn(&mut self) -> Result<()> {
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
                self.ns.spawn(&["bird", "-f", "-c", &conf, "-s", &sock])?
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
        // Ready when the management interface answers.
        wait_until(
            &format!("{:?} to answer", self.kind),
            Duration::from_secs(15),
            || Ok(self.established().is_ok()),
        )?;
        if self.kind == Kind::Gobgp {
            for p in &self.cfg.announce {
                self.ns
                    .exec(&["gobgp", "global", "rib", "add", p, "-a", "ipv4"])?;
            }
        }
        Ok(())
    }

    /// SIGKILL, as a crash would: no NOTIFICATION, TCP just goes away.
    fn kill9(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
    }

    fn ours_doc(&self) -> Result<Value> {
        let text = std::fs::read_to_string(self.dir.file("status.json"))?;
        Ok(serde_json::from_str(&text)?)
    }

    /// Neighbours with an Established session.
    fn established(&self) -> Result<BTreeSet<Ipv4Addr>> {
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

    fn vtysh(&self, cmd: &str) -> Result<String> {
        self.ns
            .exec(&["vtysh", "--vty_socket", self.dir.path(), "-c", cmd])
    }

    fn birdc(&self, args: &[&str]) -> Result<String> {
        let sock = self.dir.file("bird.ctl");
        let mut argv = vec!["birdc", "-s", sock.to_str().context("sock")?];
        argv.extend_from_slice(args);
        self.ns.exec(&argv)
    }

    /// prefix -> the neighbours it was learned from (empty for our own).
    fn routes(&self) -> Result<BTreeMap<String, BTreeSet<Ipv4Addr>>> {
        let mut out: BTreeMap<String, BTreeSet<Ipv4Addr>> = BTreeMap::new();
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

/// One peer's entry in our speaker's status document.
fn peer_status(doc: &Value, addr: Ipv4Addr) -> Result<Value> {
    doc["status"]["peers"]
        .as_array()
        .context("peers")?
        .iter()
        .find(|p| p["address"] == addr.to_string())
        .cloned()
        .with_context(|| format!("no peer {addr} in {doc}"))
}

fn bird_proto(a: Ipv4Addr) -> String {
    format!("p{}", a.to_string().replace('.', "_"))
}

fn client_prefix(i: u8) -> String {
    format!("10.244.{i}.0/24")
}

/// How many of `prefixes` the router holds.
fn count_present(r: &Router, prefixes: &[String]) -> Result<usize> {
    let routes = r.routes()?;
    Ok(prefixes.iter().filter(|p| routes.contains_key(*p)).count())
}

fn skip_unless_root() -> bool {
    if !is_root() {
        eprintln!("skipped: needs root");
        return true;
    }
    false
}

/// Our reflector with two of our clients and `kind` as an upstream
/// non-client: the upstream receives every client route, reflected with
/// ORIGINATOR_ID/CLUSTER_LIST (checked for FRR and BIRD through their
/// detailed output); and `kind` announces a route our clients receive.
fn upstream_receives_every_route(kind: Kind) -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let up = ip(254);
    let clients = [11u8, 12];
    let rr_cfg = RouterCfg {
        me: rr,
        cluster_id: Some(CLUSTER),
        neighbors: clients
            .iter()
            .map(|c| Neighbor {
                addr: ip(*c),
                client: true,
            })
            .chain([Neighbor {
                addr: up,
                client: false,
            }])
            .collect(),
        announce: vec![],
    };
    let upstream = Router::start(
        kind,
        lan.node("up", up)?,
        RouterCfg {
            me: up,
            cluster_id: None,
            neighbors: vec![Neighbor {
                addr: rr,
                client: false,
            }],
            announce: vec!["203.0.113.0/24".into()],
        },
    )?;
    let _rr = Router::start(Kind::Ours, lan.node("rr", rr)?, rr_cfg)?;
    let mut cs = Vec::new();
    for c in clients {
        cs.push(Router::start(
            Kind::Ours,
            lan.node("c", ip(c))?,
            RouterCfg {
                me: ip(c),
                cluster_id: None,
                neighbors: vec![Neighbor {
                    addr: rr,
                    client: false,
                }],
                announce: vec![client_prefix(c)],
            },
        )?);
    }
    let want: Vec<String> = clients.iter().map(|c| client_prefix(*c)).collect();
    wait_until(
        "client routes at the upstream",
        Duration::from_secs(30),
        || Ok(count_present(&upstream, &want)? == want.len()),
    )?;
    match kind {
        Kind::Frr => {
            let v: Value = serde_json::from_str(
                &upstream.vtysh(&format!("show bgp ipv4 unicast {} json", want[0]))?,
            )?;
            let path = &v["paths"][0];
            assert_eq!(path["originatorId"], "10.99.0.11", "{v}");
            assert_eq!(path["clusterList"]["list"][0], CLUSTER, "{v}");
        }
        Kind::Bird => {
            let text = upstream.birdc(&["show", "route", &want[0], "all"])?;
            assert!(text.contains("BGP.originator_id: 10.99.0.11"), "{text}");
            assert!(
                text.contains(&format!("BGP.cluster_list: {CLUSTER}")),
                "{text}"
            );
        }
        _ => {}
    }
    for c in &cs {
        wait_until(
            "upstream route at our clients",
            Duration::from_secs(30),
            || Ok(c.routes()?.contains_key("203.0.113.0/24")),
        )?;
    }
    Ok(())
}

/// `kind` as a client of our reflector next to one of our clients: each
/// gets the other's route.
fn client_of_our_reflector(kind: Kind) -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let _rr = Router::start(
        Kind::Ours,
        lan.node("rr", rr)?,
        RouterCfg {
            me: rr,
            cluster_id: Some(CLUSTER),
            neighbors: vec![
                Neighbor {
                    addr: ip(11),
                    client: true,
                },
                Neighbor {
                    addr: ip(12),
                    client: true,
                },
            ],
            announce: vec![],
        },
    )?;
    let theirs = Router::start(
        kind,
        lan.node("peer", ip(11))?,
        RouterCfg {
            me: ip(11),
            cluster_id: None,
            neighbors: vec![Neighbor {
                addr: rr,
                client: false,
            }],
            announce: vec![client_prefix(11)],
        },
    )?;
    let ours = Router::start(
        Kind::Ours,
        lan.node("c", ip(12))?,
        RouterCfg {
            me: ip(12),
            cluster_id: None,
            neighbors: vec![Neighbor {
                addr: rr,
                client: false,
            }],
            announce: vec![client_prefix(12)],
        },
    )?;
    wait_until(
        "our client's route at theirs",
        Duration::from_secs(30),
        || Ok(theirs.routes()?.contains_key(&client_prefix(12))),
    )?;
    wait_until("their route at our client", Duration::from_secs(30), || {
        Ok(ours.routes()?.contains_key(&client_prefix(11)))
    })?;
    Ok(())
}

/// Graceful restart both ways between our speaker and `kind`:
/// 1. ours is killed and restarted while `kind` keeps its route: polled
///    every 50 ms, the route never leaves `kind`'s table;
/// 2. `kind` is killed and restarted while our reflector keeps its route
///    and goes on reflecting it: our observer client never loses it.
fn graceful_restart_both_ways(kind: Kind) -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let mut ours = Router::start(
        Kind::Ours,
        lan.node("rr", rr)?,
        RouterCfg {
            me: rr,
            cluster_id: Some(CLUSTER),
            neighbors: vec![
                Neighbor {
                    addr: ip(11),
                    client: true,
                },
                Neighbor {
                    addr: ip(12),
                    client: true,
                },
            ],
            announce: vec!["192.0.2.1/32".into()],
        },
    )?;
    let mut theirs = Router::start(
        kind,
        lan.node("peer", ip(11))?,
        RouterCfg {
            me: ip(11),
            cluster_id: None,
            neighbors: vec![Neighbor {
                addr: rr,
                client: false,
            }],
            announce: vec![client_prefix(11)],
        },
    )?;
    let observer = Router::start(
        Kind::Ours,
        lan.node("obs", ip(12))?,
        RouterCfg {
            me: ip(12),
            cluster_id: None,
            neighbors: vec![Neighbor {
                addr: rr,
                client: false,
            }],
            announce: vec![],
        },
    )?;
    let ours_route = vec!["192.0.2.1/32".to_string()];
    let their_route = vec![client_prefix(11)];
    wait_until("our route at theirs", Duration::from_secs(30), || {
        Ok(count_present(&theirs, &ours_route)? == 1)
    })?;
    wait_until(
        "their route at the observer",
        Duration::from_secs(30),
        || Ok(count_present(&observer, &their_route)? == 1),
    )?;

    // 1. We restart; they help.
    ours.kill9();
    let restart_at = Instant::now();
    wait_until("them to notice our crash", Duration::from_secs(20), || {
        hold(count_present(&theirs, &ours_route)? == 1, || {
            format!("{kind:?} dropped our route")
        })?;
        Ok(!theirs.established()?.contains(&rr))
    })?;
    ours.spawn()?;
    wait_until(
        "session back after our restart",
        Duration::from_secs(40),
        || {
            hold(count_present(&theirs, &ours_route)? == 1, || {
                format!(
                    "{kind:?} dropped our route {:?} after our restart",
                    restart_at.elapsed()
                )
            })?;
            Ok(theirs.established()?.contains(&rr) && ours.established()?.contains(&ip(11)))
        },
    )
    .map_err(|e| anyhow::anyhow!("{e:#}"))?;
    // The restart is over once we stopped deferring, hold their route
    // again, and the observer has nothing stale from us.
    wait_until("our restart to complete", Duration::from_secs(40), || {
        hold(count_present(&theirs, &ours_route)? == 1, || {
            format!("{kind:?} dropped our route")
        })?;
        let doc = ours.ours_doc()?;
        let peer = peer_status(&doc, ip(11))?;
        let obs = peer_status(&observer.ours_doc()?, rr)?;
        Ok(doc["status"]["deferring"] == false
            && peer["received"] == 1
            && obs["stale"] == 0
            && obs["state"] == "Established")
    })?;
    // Routes learned from them reach the observer again. (Not checked
    // without a gap: when they claim a restart of their own (R bit, as FRR
    // does shortly after it starts), RFC 4724 says not to wait for their
    // End-of-RIB, so our table can go out before their routes are back.)
    wait_until(
        "their route at the observer again",
        Duration::from_secs(20),
        || Ok(count_present(&observer, &their_route)? == 1),
    )?;

    // 2. They restart; we help, and keep reflecting their route. GoBGP
    // gets its route from the CLI after it starts, so it sends End-of-RIB
    // before the route exists and the route rightly goes away for a moment:
    // for GoBGP only the return of the route is checked.
    let table_at_start = kind != Kind::Gobgp;
    theirs.kill9();
    wait_until("our side to notice", Duration::from_secs(20), || {
        hold(
            !table_at_start || count_present(&observer, &their_route)? == 1,
            || "observer lost their route".into(),
        )?;
        Ok(!ours.established()?.contains(&ip(11)))
    })?;
    theirs.spawn()?;
    wait_until("their session back", Duration::from_secs(40), || {
        hold(
            !table_at_start || count_present(&observer, &their_route)? == 1,
            || "observer lost their route".into(),
        )?;
        Ok(ours.established()?.contains(&ip(11)))
    })?;
    // Their table came back: nothing stale is left on our side.
    wait_until("stale routes resolved", Duration::from_secs(20), || {
        hold(
            !table_at_start || count_present(&observer, &their_route)? == 1,
            || "observer lost their route".into(),
        )?;
        let peer = peer_status(&ours.ours_doc()?, ip(11))?;
        Ok(peer["stale"] == 0
            && peer["received"] == 1
            && count_present(&observer, &their_route)? == 1)
    })?;
    Ok(())
}

/// The incident: two of our reflectors share one cluster id, `n` clients
/// of kind `clients`, FRR upstream. Each reflector alone sends every
/// client prefix upstream; then one reflector is killed with SIGKILL and
/// started again while FRR is polled every 50 ms: the number of client
/// prefixes at FRR never drops.
fn incident(clients: Kind, n: u8) -> Result<()> {
    let mut lan = Lan::new()?;
    let rrs = [ip(1), ip(2)];
    let up = ip(254);
    let client_ips: Vec<Ipv4Addr> = (0..n).map(|i| ip(11 + i)).collect();
    let prefixes: Vec<String> = (0..n).map(|i| client_prefix(11 + i)).collect();
    let frr = Router::start(
        Kind::Frr,
        lan.node("up", up)?,
        RouterCfg {
            me: up,
            cluster_id: None,
            neighbors: rrs
                .iter()
                .map(|a| Neighbor {
                    addr: *a,
                    client: false,
                })
                .collect(),
            announce: vec![],
        },
    )?;
    let mut reflectors = Vec::new();
    for (i, me) in rrs.iter().enumerate() {
        let mut neighbors: Vec<Neighbor> = client_ips
            .iter()
            .map(|a| Neighbor {
                addr: *a,
                client: true,
            })
            .collect();
        neighbors.push(Neighbor {
            addr: up,
            client: false,
        });
        neighbors.push(Neighbor {
            addr: rrs[1 - i],
            client: false,
        });
        reflectors.push(Router::start(
            Kind::Ours,
            lan.node("rr", *me)?,
            RouterCfg {
                me: *me,
                cluster_id: Some(CLUSTER),
                neighbors,
                announce: vec![],
            },
        )?);
    }
    let mut cs = Vec::new();
    for (i, a) in client_ips.iter().enumerate() {
        cs.push(Router::start(
            clients,
            lan.node("c", *a)?,
            RouterCfg {
                me: *a,
                cluster_id: None,
                neighbors: rrs
                    .iter()
                    .map(|r| Neighbor {
                        addr: *r,
                        client: false,
                    })
                    .collect(),
                announce: vec![prefixes[i].clone()],
            },
        )?);
    }
    // Each reflector alone sends all client prefixes upstream.
    wait_until(
        "every prefix from both reflectors at FRR",
        Duration::from_secs(60),
        || {
            let routes = frr.routes()?;
            Ok(prefixes.iter().all(|p| {
                routes
                    .get(p)
                    .is_some_and(|from| rrs.iter().all(|r| from.contains(r)))
            }))
        },
    )?;
    // And by its own count (the status file lags by up to 50 ms).
    for rr in &reflectors {
        wait_until("reflector's own count", Duration::from_secs(5), || {
            Ok(peer_status(&rr.ours_doc()?, up)?["advertised"] == n as u64)
        })?;
    }

    // Kill one reflector and start it again; FRR must never lose a prefix.
    let victim = &mut reflectors[0];
    victim.kill9();
    let min_seen = std::cell::Cell::new(usize::MAX);
    let poll = || -> Result<usize> {
        let c = count_present(&frr, &prefixes)?;
        min_seen.set(min_seen.get().min(c));
        hold(c == prefixes.len(), || {
            format!("FRR dropped to {c} of {} client prefixes", prefixes.len())
        })?;
        Ok(c)
    };
    wait_until(
        "FRR to notice the reflector is gone",
        Duration::from_secs(20),
        || {
            poll()?;
            Ok(!frr.established()?.contains(&rrs[0]))
        },
    )?;
    victim.spawn()?;
    wait_until(
        "restarted reflector to send its table again",
        Duration::from_secs(60),
        || {
            poll()?;
            let routes = frr.routes()?;
            Ok(frr.established()?.contains(&rrs[0])
                && prefixes
                    .iter()
                    .all(|p| routes.get(p).is_some_and(|from| from.contains(&rrs[0]))))
        },
    )?;
    assert_eq!(min_seen.get(), prefixes.len());
    Ok(())
}

/// TCP-MD5 (RFC 2385): our reflector and `kind` share a key; the session
/// comes up and our route arrives.
fn md5_session(kind: Kind) -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let _ours = Router::start_with_password(
        Kind::Ours,
        lan.node("rr", rr)?,
        RouterCfg {
            me: rr,
            cluster_id: Some(CLUSTER),
            neighbors: vec![Neighbor {
                addr: ip(11),
                client: true,
            }],
            announce: vec!["192.0.2.1/32".into()],
        },
        Some("s3cret"),
    )?;
    let theirs = Router::start_with_password(
        kind,
        lan.node("peer", ip(11))?,
        RouterCfg {
            me: ip(11),
            cluster_id: None,
            neighbors: vec![Neighbor {
                addr: rr,
                client: false,
            }],
            announce: vec![],
        },
        Some("s3cret"),
    )?;
    wait_until(
        "our route over an MD5-signed session",
        Duration::from_secs(30),
        || Ok(theirs.routes()?.contains_key("192.0.2.1/32")),
    )
}

/// TCP-MD5 with the peers a reflector adds at run time (the agents it
/// finds in the datastore), from its default key: an FRR with the key comes
/// up and exchanges routes; an FRR with a wrong key, and one without a
/// key, never reach Established (the kernel drops their segments).
fn md5_for_peers_added_at_run_time() -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let peers = [
        (ip(11), Some("s3cret")),
        (ip(12), Some("wrong")),
        (ip(13), None),
    ];
    let ours = Router::start_ours_with_late_peers(
        lan.node("rr", rr)?,
        RouterCfg {
            me: rr,
            cluster_id: Some(CLUSTER),
            neighbors: peers
                .iter()
                .map(|(a, _)| Neighbor {
                    addr: *a,
                    client: true,
                })
                .collect(),
            announce: vec!["192.0.2.1/32".into()],
        },
        "s3cret",
    )?;
    let mut frrs = Vec::new();
    for (a, pw) in peers {
        frrs.push(Router::start_with_password(
            Kind::Frr,
            lan.node("peer", a)?,
            RouterCfg {
                me: a,
                cluster_id: None,
                neighbors: vec![Neighbor {
                    addr: rr,
                    client: false,
                }],
                announce: vec![format!("198.51.100.{}/32", a.octets()[3])],
            },
            pw,
        )?);
    }
    wait_until(
        "our route at the FRR with the key",
        Duration::from_secs(30),
        || Ok(frrs[0].routes()?.contains_key("192.0.2.1/32")),
    )?;
    wait_until(
        "its route at our reflector",
        Duration::from_secs(30),
        || Ok(ours.routes()?.contains_key("198.51.100.11/32")),
    )?;
    // Both sides retry every second: give the other two several chances.
    std::thread::sleep(Duration::from_secs(5));
    let up = ours.established()?;
    hold(up == BTreeSet::from([ip(11)]), || {
        format!("sessions up at our reflector: {up:?}")
    })?;
    for f in &frrs[1..] {
        let theirs = f.established()?;
        hold(theirs.is_empty(), || {
            format!("{} has a session: {theirs:?}", f.cfg.me)
        })?;
        hold(!f.routes()?.contains_key("192.0.2.1/32"), || {
            format!("{} got our route", f.cfg.me)
        })?;
    }
    Ok(())
}

/// IPv6 unicast over an IPv4 session (MP_REACH_NLRI, RFC 4760): a client
/// of ours announces an IPv6 prefix (next hop: the IPv4-mapped form of its
/// address); FRR upstream gets it through our reflector.
fn ipv6_routes_reach_frr() -> Result<()> {
    let mut lan = Lan::new()?;
    let rr = ip(1);
    let up = ip(254);
    let frr = Router::start(
        Kind::Frr,
        lan.node("up", up)?,
        RouterCfg {
            me: up,
            cluster_id: None,
            neighbors: vec![Neighbor {
                addr: rr,
                client: false,
            }],
            announce: vec![],
        },
    )?;
    let _rr = Router::start(
        Kind::Ours,
        lan.node("rr", rr)?,
        RouterCfg {
            me: rr,
            cluster_id: Some(CLUSTER),
            neighbors: vec![
                Neighbor {
                    addr: ip(11),
                    client: true,
                },
                Neighbor {
                    addr: up,
                    client: false,
                },
            ],
            announce: vec![],
        },
    )?;
    let _c = Router::start(
        Kind::Ours,
        lan.node("c", ip(11))?,
        RouterCfg {
            me: ip(11),
            cluster_id: None,
            neighbors: vec![Neighbor {
                addr: rr,
                client: false,
            }],
            announce: vec!["2001:db8:11::/48".into()],
        },
    )?;
    wait_until("the IPv6 prefix at FRR", Duration::from_secs(30), || {
        let v: Value = serde_json::from_str(&frr.vtysh("show bgp ipv6 unicast json")?)?;
        Ok(v["routes"].get("2001:db8:11::/48").is_some())
    })?;
    let v: Value =
        serde_json::from_str(&frr.vtysh("show bgp ipv6 unicast 2001:db8:11::/48 json")?)?;
    let text = v.to_string();
    // 10.99.0.11 as an IPv4-mapped IPv6 address, as FRR prints it.
    assert!(text.contains("::ffff:a63:b"), "next hop: {text}");
    Ok(())
}

macro_rules! interop {
    ($name:ident, $body:expr) => {
        #[test]
        #[ignore = "needs root"]
        fn $name() -> Result<()> {
            if skip_unless_root() {
                return Ok(());
            }
            $body
        }
    };
}

interop!(
    frr_upstream_receives_every_route,
    upstream_receives_every_route(Kind::Frr)
);
interop!(
    bird_upstream_receives_every_route,
    upstream_receives_every_route(Kind::Bird)
);
interop!(
    gobgp_upstream_receives_every_route,
    upstream_receives_every_route(Kind::Gobgp)
);
interop!(frr_as_client, client_of_our_reflector(Kind::Frr));
interop!(bird_as_client, client_of_our_reflector(Kind::Bird));
interop!(gobgp_as_client, client_of_our_reflector(Kind::Gobgp));
interop!(
    frr_graceful_restart_both_ways,
    graceful_restart_both_ways(Kind::Frr)
);
interop!(
    bird_graceful_restart_both_ways,
    graceful_restart_both_ways(Kind::Bird)
);
interop!(
    gobgp_graceful_restart_both_ways,
    graceful_restart_both_ways(Kind::Gobgp)
);
interop!(incident_with_our_clients, incident(Kind::Ours, 20));
interop!(incident_with_frr_clients, incident(Kind::Frr, 20));
interop!(incident_with_bird_clients, incident(Kind::Bird, 20));
interop!(frr_tcp_md5, md5_session(Kind::Frr));
interop!(bird_tcp_md5, md5_session(Kind::Bird));
interop!(gobgp_tcp_md5, md5_session(Kind::Gobgp));
interop!(
    frr_tcp_md5_with_peers_added_at_run_time,
    md5_for_peers_added_at_run_time()
);
interop!(frr_ipv6_unicast, ipv6_routes_reach_frr());

//! A whole cluster on the shared topology: a real etcd and the controller in
//! the fabric namespace, one real agent per node, pods registered in the
//! datastore. The e2e tests, the failover scenarios and the demo build on it.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context, Result};

use crate::{
    chart_pods::{ChartPods, ContainerSpec, PodEnv},
    etcd::EtcdServer,
    kube_api::FakeApiServer,
    netns::PinDir,
    process::Proc,
    topology::{eip, Topology, FABRIC_UNDERLAY_IP, FABRIC_UNDERLAY_IP6},
};

/// Label that the example EgressGateway selects.
pub const GATEWAY_LABEL: &str = "egress-gateway=true";
/// Port of every agent's admin endpoint, on each node's own loopback.
pub const AGENT_ADMIN: &str = "127.0.0.1:9465";

/// The failover timers, as the flags of both controller and agents.
#[derive(Clone, Debug)]
pub struct Timers {
    pub update: String,
    pub monitor: String,
    pub eviction: String,
    /// The controllers' leader lease (`--leader-election-lease-duration`).
    pub lease: String,
    /// Datapath probes (interval ms, detect multiplier): given to the
    /// controllers, and to the agents once their CLI has the flags.
    pub probe: Option<(u64, u32)>,
}

impl Default for Timers {
    fn default() -> Self {
        Self {
            update: "5s".into(),
            monitor: "5s".into(),
            eviction: "15s".into(),
            lease: "15s".into(),
            probe: None,
        }
    }
}

/// True when `egress agent --help` lists `flag` (a feature the agent may not have yet).
pub fn agent_has_flag(egress: &Path, flag: &str) -> bool {
    std::process::Command::new(egress)
        .args(["agent", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
        .unwrap_or(false)
}

fn probe_flags(probe: Option<(u64, u32)>) -> Vec<String> {
    probe
        .map(|(ms, mult)| {
            vec![
                "--probe-interval-ms".into(),
                ms.to_string(),
                "--probe-detect-multiplier".into(),
                mult.to_string(),
            ]
        })
        .unwrap_or_default()
}

#[derive(Clone, Debug)]
pub struct ClusterSpec {
    pub workers: usize,
    pub gateways: usize,
    pub pods_per_worker: usize,
    pub controllers: usize,
    pub timers: Timers,
    /// Run a route reflector in the fabric (10.10.0.254:179) and let every
    /// agent peer with it.
    pub bgp: bool,
    /// Also an FRR upstream router (10.10.0.253, iBGP non-client of the reflector).
    pub upstream_frr: bool,
    /// With `upstream_frr`: prefixes the fabric routes through the upstream
    /// router, which then runs zebra and forwards by the routes it learned
    /// (ECMP over equal paths). Replies to an EIP in one of them reach a
    /// gateway only as BGP says.
    pub via_upstream: Vec<String>,
    /// With `bgp`: the reflector runs inside controller 0 (`egress controller
    /// --bgp=true`, as the chart runs it) instead of as `egress reflector`.
    pub reflector_in_controller: bool,
    /// The agents' `--eip-eviction-timeout` when it must differ from the
    /// controllers' (`timers.eviction`): a shorter one makes an agent fence
    /// itself well before the controller would evict it, the window a
    /// test of reconfirmation needs.
    pub agent_eviction: Option<String>,
    /// Label the workers as gateway candidates too: a node that is worker
    /// and gateway at once (its pods' traffic skips the tunnel).
    pub workers_are_gateways: bool,
    /// The Kubernetes datastore, against the in-memory API server
    /// ([`crate::kube_api`]) in the fabric, instead of etcd. The test plays
    /// the kubelet: Nodes (labels, addresses, pod CIDRs, Ready) and Pods are
    /// written to the API server directly, as Kubernetes would have them.
    pub kubernetes: bool,
    /// How the workers' pods are wired (routed veth, or a CNI plugin).
    pub wiring: crate::cni::Wiring,
    /// How the agents and controllers are started.
    pub launcher: Launcher,
    /// More flags for every controller process.
    pub controller_args: Vec<String>,
    /// More flags for every agent process.
    pub agent_args: Vec<String>,
    /// Nodes with IPv6 addresses only, the tunnels over IPv6 (`--underlay
    /// ipv6`); etcd and the probes reached over IPv6.
    pub ipv6_underlay: bool,
}

/// How a [`Cluster`] starts its agents and controllers.
#[derive(Clone, Debug, Default)]
pub enum Launcher {
    /// `egress` processes with the harness's flags.
    #[default]
    Process,
    /// Containers of the chart's image, each run as the chart renders its
    /// container ([`crate::chart_pods`]); needs `kubernetes`. The timers
    /// and every other setting are the chart's, as rendered: the spec's
    /// `timers` and `bgp` are not used.
    Chart(Box<ChartPods>),
}

impl Default for ClusterSpec {
    fn default() -> Self {
        Self {
            workers: 2,
            gateways: 2,
            pods_per_worker: 2,
            controllers: 1,
            timers: Timers::default(),
            bgp: false,
            upstream_frr: false,
            via_upstream: Vec::new(),
            reflector_in_controller: false,
            agent_eviction: None,
            workers_are_gateways: false,
            kubernetes: false,
            wiring: crate::cni::Wiring::Routed,
            launcher: Launcher::Process,
            controller_args: Vec::new(),
            agent_args: Vec::new(),
            ipv6_underlay: false,
        }
    }
}

/// Where the cluster's objects live.
pub enum DatastoreServer {
    Etcd(EtcdServer),
    Kubernetes(KubeApi),
}

/// The API server and a kubeconfig per caller: the agents and the
/// controllers with the chart's RBAC, the CLI as a cluster admin.
pub struct KubeApi {
    pub server: FakeApiServer,
    agent: PathBuf,
    controller: PathBuf,
    admin: PathBuf,
}

impl KubeApi {
    /// On the fabric's underlay address: its IPv6 one on an IPv6 underlay.
    fn start(fabric: &crate::Netns, ipv6_underlay: bool) -> Result<Self> {
        let rbac = crate::chart_rbac::chart_rbac()?;
        let ip: std::net::IpAddr = match ipv6_underlay {
            true => FABRIC_UNDERLAY_IP6.into(),
            false => FABRIC_UNDERLAY_IP.into(),
        };
        let addr = std::net::SocketAddr::from((ip, API_SERVER_PORT));
        let server = FakeApiServer::start_in(fabric, addr)?;
        server.install_chart_crds()?;
        let sa = |n: &str| format!("system:serviceaccount:{}:{n}", crate::chart_rbac::NAMESPACE);
        Ok(Self {
            agent: server.add_caller("agent-token", &sa("egress-agent"), Some(rbac.agent))?,
            controller: server.add_caller(
                "controller-token",
                &sa("egress-controller"),
                Some(rbac.controller),
            )?,
            admin: server.add_caller("admin-token", "kubernetes-admin", None)?,
            server,
        })
    }
}

/// Who runs an `egress` command (which kubeconfig it gets on Kubernetes).
#[derive(Clone, Copy)]
enum Caller {
    Agent,
    Controller,
    Admin,
}

/// Port of the in-memory API server, on the fabric's underlay address.
pub const API_SERVER_PORT: u16 = 6443;

/// The FRR upstream router's address on the underlay.
pub const UPSTREAM_IP: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 10, 0, 253);
/// ... and on an IPv6 underlay.
pub const UPSTREAM_IP6: std::net::Ipv6Addr =
    std::net::Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0, 0, 0x253);

/// An upstream router: FRR in its own namespace on the underlay bridge.
pub struct Upstream {
    pub frr: crate::frr::Frr,
    pub ns: crate::Netns,
}

/// Admin endpoint of the fabric's reflector (on the fabric's loopback).
pub const REFLECTOR_ADMIN: &str = "127.0.0.1:9464";

/// Controller `i` serves /metrics, /healthz, /readyz and /bgp/status on
/// this port + `i` (`--metrics-port`), in the fabric.
pub const CONTROLLER_METRICS_PORT: u16 = 9477;

pub struct Cluster {
    pub topo: Topology,
    pub datastore: DatastoreServer,
    pub controllers: Vec<Option<Proc>>,
    pub agents: Vec<Option<Proc>>,
    pub reflector: Option<Proc>,
    pub upstream: Option<Upstream>,
    pins: Vec<PinDir>,
    egress: PathBuf,
    spec: ClusterSpec,
    agent_probes: bool,
    /// Where each agent serves /state, on its node's loopback.
    agent_admin: String,
}

impl Cluster {
    /// [`Cluster::start`] of [`ClusterSpec::default`] with this build's
    /// egress binary ([`crate::egress_bin`]).
    pub fn start_default() -> Result<Self> {
        Self::start(&crate::egress_bin()?, ClusterSpec::default())
    }

    /// Builds the topology and starts etcd, the controllers and the agents.
    /// Nodes are `w1..` (workers) then `g1..` (gateways, labelled
    /// [`GATEWAY_LABEL`]); every worker's pods are registered in the
    /// datastore, the first one of each labelled `app=web`.
    pub fn start(egress: &Path, spec: ClusterSpec) -> Result<Self> {
        let names: Vec<String> = (1..=spec.workers)
            .map(|i| format!("w{i}"))
            .chain((1..=spec.gateways).map(|i| format!("g{i}")))
            .collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let agent_admin = match &spec.launcher {
            Launcher::Process => AGENT_ADMIN.to_owned(),
            Launcher::Chart(chart) => {
                ensure!(
                    spec.kubernetes,
                    "the chart's containers need `kubernetes: true`"
                );
                let port = chart
                    .agent
                    .args
                    .iter()
                    .find_map(|a| a.strip_prefix("--metrics-port="))
                    .context("the chart's agent has no --metrics-port")?;
                format!("127.0.0.1:{port}")
            }
        };
        let mut topo = Topology::build_on(&refs, spec.ipv6_underlay)?;
        for w in 0..spec.workers {
            for p in 0..spec.pods_per_worker {
                topo.add_pod_wired(w, &format!("p{}{}", w + 1, p + 1), spec.wiring)?;
            }
        }
        let datastore = if spec.kubernetes {
            DatastoreServer::Kubernetes(KubeApi::start(&topo.fabric, spec.ipv6_underlay)?)
        } else {
            DatastoreServer::Etcd(EtcdServer::start_in(
                topo.fabric.name(),
                &topo.fabric_host(),
            )?)
        };
        let mut cluster = Self {
            topo,
            datastore,
            controllers: Vec::new(),
            agents: Vec::new(),
            reflector: None,
            upstream: None,
            pins: Vec::new(),
            egress: egress.to_owned(),
            spec: spec.clone(),
            agent_probes: spec.timers.probe.is_some()
                && agent_has_flag(egress, "--probe-interval-ms"),
            agent_admin,
        };
        if let DatastoreServer::Kubernetes(k) = &cluster.datastore {
            crate::kube_objects::add_nodes(&k.server, &cluster.topo, |name| {
                name.starts_with('g') || spec.workers_are_gateways
            })?;
        }
        if spec.bgp && spec.upstream_frr {
            let ns = crate::Netns::new("up")?;
            crate::link_veth(&ns, "eth0", &cluster.topo.fabric, "up0")?;
            cluster
                .topo
                .fabric
                .ip(&["link", "set", "up0", "master", "br0"])?;
            let frr = if spec.ipv6_underlay {
                // The reflector over IPv6, IPv4 routes by RFC 8950.
                ns.addr("eth0", &format!("{UPSTREAM_IP6}/64"))?;
                let peers = [(FABRIC_UNDERLAY_IP6.into(), 64512)];
                if spec.via_upstream.is_empty() {
                    crate::frr::Frr::start_on(&ns, UPSTREAM_IP, 64512, &peers)?
                } else {
                    crate::frr::Frr::start_forwarding_on(&ns, UPSTREAM_IP, 64512, &peers)?
                }
            } else if spec.via_upstream.is_empty() {
                ns.addr("eth0", &format!("{UPSTREAM_IP}/24"))?;
                let peers = [(FABRIC_UNDERLAY_IP, 64512)];
                crate::frr::Frr::start(&ns, UPSTREAM_IP, 64512, &peers)?
            } else {
                ns.addr("eth0", &format!("{UPSTREAM_IP}/24"))?;
                let peers = [(FABRIC_UNDERLAY_IP, 64512)];
                crate::frr::Frr::start_forwarding(&ns, UPSTREAM_IP, 64512, &peers)?
            };
            for prefix in &spec.via_upstream {
                if spec.ipv6_underlay {
                    let via = UPSTREAM_IP6.to_string();
                    let route = ["-4", "route", "add", prefix, "via", "inet6", &via];
                    cluster.topo.fabric.ip(&route)?;
                } else {
                    let via = UPSTREAM_IP.to_string();
                    cluster.topo.fabric.route(&[prefix, "via", &via])?;
                }
            }
            cluster.upstream = Some(Upstream { frr, ns });
        }
        for i in 0..spec.controllers {
            let mut c = cluster.spawn_controller(i)?;
            if i == 0 {
                // Agents started before decide to read every pod (etcd's
                // pod index is complete only once a controller said so).
                c.wait_for_line("datastore indexes complete", Duration::from_secs(30))?;
            }
            cluster.controllers.push(Some(c));
        }
        if spec.bgp && !spec.reflector_in_controller {
            cluster.reflector = Some(cluster.spawn_reflector()?);
        }
        for i in 0..cluster.topo.nodes.len() {
            cluster.pins.push(PinDir::new(&format!("pin{i}"))?);
            let a = cluster.spawn_agent(i)?;
            cluster.agents.push(Some(a));
        }
        for w in 0..spec.workers {
            for p in 0..spec.pods_per_worker {
                let pod = &cluster.topo.nodes[w].pods[p];
                let node = cluster.topo.nodes[w].name.clone();
                let labels = if p == 0 { "app=web" } else { "app=other" };
                let ips = format!("{},{}", pod.ip, pod.ip6);
                let name = pod.name.clone();
                cluster.add_pod(&name, labels, &node, &ips)?;
            }
        }
        Ok(cluster)
    }

    /// The cluster's etcd; panics on a Kubernetes cluster.
    pub fn etcd(&self) -> &EtcdServer {
        match &self.datastore {
            DatastoreServer::Etcd(e) => e,
            DatastoreServer::Kubernetes(_) => panic!("this cluster runs on Kubernetes, not etcd"),
        }
    }

    /// The TCP port the datastore's server listens on, in the fabric.
    pub fn datastore_port(&self) -> u16 {
        match &self.datastore {
            DatastoreServer::Etcd(_) => 2379,
            DatastoreServer::Kubernetes(_) => API_SERVER_PORT,
        }
    }

    /// Stops the datastore's server (etcd, or the API server): every
    /// connection breaks and requests are refused until
    /// [`Cluster::start_datastore_again`].
    pub fn stop_datastore(&mut self) {
        match &mut self.datastore {
            DatastoreServer::Etcd(e) => e.stop(),
            DatastoreServer::Kubernetes(k) => k.server.stop(),
        }
    }

    /// Starts the datastore's server again, on the same data and address.
    pub fn start_datastore_again(&mut self) -> Result<()> {
        match &mut self.datastore {
            DatastoreServer::Etcd(e) => e.start_again(),
            DatastoreServer::Kubernetes(k) => k.server.start_again(),
        }
    }

    /// The cluster's API server; panics on an etcd cluster.
    pub fn api_server(&self) -> &FakeApiServer {
        match &self.datastore {
            DatastoreServer::Kubernetes(k) => &k.server,
            DatastoreServer::Etcd(_) => panic!("this cluster runs on etcd, not Kubernetes"),
        }
    }

    /// The command line of `egress ARGS` against the cluster's datastore.
    fn egress_argv(&self, caller: Caller, args: &[String]) -> Vec<String> {
        let mut argv = Vec::new();
        if let DatastoreServer::Kubernetes(k) = &self.datastore {
            let config = match caller {
                Caller::Agent => &k.agent,
                Caller::Controller => &k.controller,
                Caller::Admin => &k.admin,
            };
            argv.extend([
                "env".to_string(),
                format!("KUBECONFIG={}", config.display()),
            ]);
        }
        argv.push(self.egress.to_string_lossy().into_owned());
        argv.extend(args.iter().cloned());
        match &self.datastore {
            DatastoreServer::Etcd(etcd) => argv.extend([
                "--datastore".into(),
                "etcd".into(),
                "--etcd-endpoints".into(),
                etcd.endpoint(),
            ]),
            DatastoreServer::Kubernetes(_) => {
                argv.extend(["--datastore".into(), "kubernetes".into()])
            }
        }
        argv
    }

    fn spawn_controller(&self, i: usize) -> Result<Proc> {
        let t = &self.spec.timers;
        let id = format!("controller-{i}");
        let mut args: Vec<String> = vec![
            "controller".into(),
            "--identity".into(),
            id,
            "--tunnel-update-period".into(),
            t.update.clone(),
            "--tunnel-monitor-period".into(),
            t.monitor.clone(),
            "--eip-eviction-timeout".into(),
            t.eviction.clone(),
            "--leader-election-lease-duration".into(),
            t.lease.clone(),
        ];
        args.extend(probe_flags(t.probe));
        if self.spec.bgp {
            args.push("--bgp-announcements=true".into());
        }
        args.extend([
            "--metrics-port".into(),
            (CONTROLLER_METRICS_PORT + i as u16).to_string(),
        ]);
        args.extend(self.spec.controller_args.iter().cloned());
        if i == 0 && self.spec.bgp && self.spec.reflector_in_controller {
            let rid = FABRIC_UNDERLAY_IP.to_string();
            args.extend([
                "--bgp=true".into(),
                "--bgp-listen".into(),
                format!("{}:179", self.topo.fabric_host()),
                "--bgp-router-id".into(),
                rid.clone(),
                "--bgp-cluster-id".into(),
                rid,
                "--bgp-hold-time".into(),
                "9".into(),
            ]);
            if self.upstream.is_some() {
                args.extend(["--bgp-peer".into(), self.upstream_peer()]);
            }
        }
        let mut p = match &self.spec.launcher {
            Launcher::Process => {
                let argv = self.egress_argv(Caller::Controller, &args);
                let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
                self.topo
                    .fabric
                    .spawn_logged(&argv, &format!("controller-{i}"))?
            }
            Launcher::Chart(chart) => {
                // The fabric stands in for the pod network (the chart's
                // default, no hostNetwork).
                let pod = PodEnv {
                    node_name: "fabric",
                    node_ip: FABRIC_UNDERLAY_IP.to_string(),
                    pod_ip: FABRIC_UNDERLAY_IP.to_string(),
                    pod_name: format!("controller-{i}"),
                    namespace: crate::chart_rbac::NAMESPACE,
                };
                let port = (CONTROLLER_METRICS_PORT + i as u16).to_string();
                self.spawn_container(
                    &chart.image,
                    &chart.controller,
                    &format!("controller{i}"),
                    &self.topo.fabric,
                    &pod,
                    &[("--metrics-port", port)],
                    Caller::Controller,
                )?
            }
        };
        p.wait_for_line("started", Duration::from_secs(20))?;
        Ok(p)
    }

    /// Starts `spec` from `image` in `ns`, as the chart's container, with
    /// the caller's kubeconfig in place of a service account token.
    #[allow(clippy::too_many_arguments)]
    fn spawn_container(
        &self,
        image: &str,
        spec: &ContainerSpec,
        label: &str,
        ns: &crate::Netns,
        pod: &PodEnv,
        replace: &[(&str, String)],
        caller: Caller,
    ) -> Result<Proc> {
        let DatastoreServer::Kubernetes(k) = &self.datastore else {
            bail!("the chart's containers run on the Kubernetes datastore only");
        };
        let config = match caller {
            Caller::Agent => &k.agent,
            Caller::Controller => &k.controller,
            Caller::Admin => &k.admin,
        };
        let env = [("KUBECONFIG".to_string(), config.display().to_string())];
        spec.spawn(image, label, ns, pod, replace, &[config.as_path()], &env)
    }

    /// Starts node `i`'s agent from the chart's image with `spec` (the
    /// chart's agent container, or a variant of it); returns at once.
    pub fn spawn_agent_container(&self, i: usize, spec: &ContainerSpec) -> Result<Proc> {
        let Launcher::Chart(chart) = &self.spec.launcher else {
            bail!("the cluster does not run the chart's containers");
        };
        let node = &self.topo.nodes[i];
        let pod = PodEnv {
            node_name: &node.name,
            node_ip: node.ip.to_string(),
            pod_ip: node.ip.to_string(),
            pod_name: format!("agent-{}", node.name),
            namespace: crate::chart_rbac::NAMESPACE,
        };
        // Every node here shares the host's bpffs: each gets its own folder.
        let pin = self.pins[i].path().display().to_string();
        // The cluster DNS: the reflectors' Service name is the controller's
        // pod address, the fabric's.
        let mut spec = spec.clone();
        if let Some(name) = spec
            .args
            .iter()
            .find_map(|a| a.strip_prefix("--bgp-reflectors="))
        {
            spec.hosts
                .push((name.to_owned(), FABRIC_UNDERLAY_IP.to_string()));
        }
        self.spawn_container(
            &chart.image,
            &spec,
            &format!("agent{}", node.name),
            &node.ns,
            &pod,
            &[("--pin-dir", pin)],
            Caller::Agent,
        )
    }

    /// Starts the route reflector in the fabric; the nodes registered in
    /// the datastore become its clients.
    pub fn spawn_reflector(&self) -> Result<Proc> {
        let rid = FABRIC_UNDERLAY_IP.to_string();
        let listen = format!("{}:179", self.topo.fabric_host());
        let mut argv: Vec<&str> = vec![
            "reflector",
            "--bgp-listen",
            &listen,
            "--bgp-router-id",
            &rid,
            "--bgp-cluster-id",
            &rid,
            "--bgp-hold-time",
            "9",
            "--clients-from-datastore",
            "--admin-addr",
            REFLECTOR_ADMIN,
        ];
        let upstream_peer = self.upstream_peer();
        if self.upstream.is_some() {
            argv.extend(["--bgp-peer", &upstream_peer]);
        }
        let args: Vec<String> = argv.iter().map(|a| a.to_string()).collect();
        let argv = self.egress_argv(Caller::Controller, &args);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut p = self.topo.fabric.spawn_logged(&argv, "reflector")?;
        p.wait_for_line("ready bgp=", Duration::from_secs(20))?;
        Ok(p)
    }

    /// The reflector's `--bgp-peer` for the upstream router, in the
    /// underlay's family.
    fn upstream_peer(&self) -> String {
        let ip: std::net::IpAddr = if self.topo.ipv6_underlay {
            UPSTREAM_IP6.into()
        } else {
            UPSTREAM_IP.into()
        };
        format!("{ip},asn=64512")
    }

    /// Starts (again) the agent of node `i`.
    pub fn spawn_agent(&self, i: usize) -> Result<Proc> {
        let mut p = self.spawn_agent_process(i)?;
        p.wait_for_line("ready node=", Duration::from_secs(30))
            .with_context(|| format!("agent of {}", self.topo.nodes[i].name))?;
        Ok(p)
    }

    /// Starts node `i`'s agent; returns at once.
    fn spawn_agent_process(&self, i: usize) -> Result<Proc> {
        if let Launcher::Chart(chart) = &self.spec.launcher {
            return self.spawn_agent_container(i, &chart.agent);
        }
        let node = &self.topo.nodes[i];
        let t = &self.spec.timers;
        let pin = self.pins[i].path().to_string_lossy().into_owned();
        let mut args: Vec<String> = vec![
            "agent".into(),
            "--node-name".into(),
            node.name.clone(),
            "--pin-dir".into(),
            pin,
            "--uplink".into(),
            node.uplink.clone(),
            "--pod-cidr".into(),
            node.pod_cidr(),
            "--pod-cidr".into(),
            node.pod_cidr6(),
            "--tunnel-update-period".into(),
            t.update.clone(),
            "--tunnel-monitor-period".into(),
            t.monitor.clone(),
            "--eip-eviction-timeout".into(),
            self.spec
                .agent_eviction
                .clone()
                .unwrap_or_else(|| t.eviction.clone()),
            "--admin-addr".into(),
            AGENT_ADMIN.into(),
        ];
        if node.name.starts_with('g') || self.spec.workers_are_gateways {
            args.extend(["--node-label".into(), GATEWAY_LABEL.into()]);
        }
        if self.spec.bgp {
            args.extend([
                "--bgp-reflectors".into(),
                self.topo.fabric_ip().to_string(),
                "--bgp-hold-time".into(),
                "9".into(),
            ]);
        }
        if self.agent_probes {
            args.extend(probe_flags(t.probe));
        }
        if self.spec.ipv6_underlay {
            // Every other node finds the family itself: with an IPv4
            // default route by an IPv6 next hop and no IPv4 address, `auto`
            // must still choose IPv6.
            let family = if i.is_multiple_of(2) { "ipv6" } else { "auto" };
            args.extend(["--underlay".into(), family.into()]);
        }
        args.extend(self.spec.agent_args.iter().cloned());
        let argv = self.egress_argv(Caller::Agent, &args);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        node.ns.spawn_logged(&argv, &format!("agent-{}", node.name))
    }

    /// The extra agent flags of the agents started from now on.
    pub fn set_agent_args(&mut self, args: &[&str]) {
        self.spec.agent_args = args.iter().map(|a| a.to_string()).collect();
    }

    /// Kills node `i`'s agent and starts it again without waiting for it to
    /// be ready (its "ready node=" line, after it registered).
    pub fn restart_agent_unready(&mut self, i: usize) -> Result<()> {
        self.kill_agent(i);
        let p = self.spawn_agent_process(i)?;
        self.agents[i] = Some(p);
        Ok(())
    }

    /// Runs an `egress` CLI command against the cluster's datastore (from the fabric).
    pub fn egress(&self, args: &[&str]) -> Result<String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let argv = self.egress_argv(Caller::Admin, &args);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        self.topo.fabric.exec(&argv)
    }

    /// Registers pod `name` (namespace default) of `node` with `labels`
    /// (`k=v,...`) and addresses `ips` (comma-separated), as `egress pod add`.
    pub fn add_pod(&self, name: &str, labels: &str, node: &str, ips: &str) -> Result<String> {
        if let DatastoreServer::Kubernetes(k) = &self.datastore {
            return crate::kube_objects::put_pod(&k.server, name, labels, node, ips);
        }
        self.egress(&[
            "pod", "add", name, "-n", "default", "-l", labels, "--node", node, "--ip", ips,
        ])
    }

    /// `egress apply -f FILE`.
    pub fn apply(&self, file: &Path) -> Result<String> {
        self.egress(&["apply", "-f", &file.to_string_lossy()])
    }

    /// Fails unless the cluster runs on an IPv6-only underlay: no node's
    /// uplink has an IPv4 address (so that nothing can fall back to IPv4).
    pub fn ensure_ipv6_only(&self) -> Result<()> {
        ensure!(self.topo.ipv6_underlay, "not an IPv6 underlay");
        for n in &self.topo.nodes {
            let v4 = n.ns.ip(&["-4", "-o", "addr", "show", "dev", &n.uplink])?;
            ensure!(v4.trim().is_empty(), "{} has IPv4: {v4}", n.name);
        }
        Ok(())
    }

    /// Node `i`'s pinned-map folder (for `egress inspect --pin-dir`).
    pub fn pin_dir(&self, i: usize) -> &Path {
        self.pins[i].path()
    }

    /// The body of `GET path` from node `i`'s agent admin endpoint.
    pub fn agent_http(&self, i: usize, path: &str) -> Result<String> {
        let req = format!("GET {path} HTTP/1.1\r\nconnection: close\r\n\r\n");
        let admin = self.agent_admin.clone();
        self.topo.nodes[i].ns.enter(move || {
            let mut s = TcpStream::connect(&admin)?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(req.as_bytes())?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out
                .split_once("\r\n\r\n")
                .map(|(_, b)| b.to_owned())
                .unwrap_or_default())
        })
    }

    /// The body of `GET path` from controller `i`'s HTTP endpoint (in the
    /// fabric); an error unless it answers 200.
    pub fn controller_http(&self, i: usize, path: &str) -> Result<String> {
        self.fabric_http(
            &format!("127.0.0.1:{}", CONTROLLER_METRICS_PORT + i as u16),
            path,
        )
    }

    /// The body of `GET path` from `addr`, connecting from the fabric (the
    /// controllers', the reflector's endpoints); an error unless it answers 200.
    pub fn fabric_http(&self, addr: &str, path: &str) -> Result<String> {
        let addr = addr.to_owned();
        // Go's HTTP servers (etcd's /metrics) refuse HTTP/1.1 without a Host.
        let req = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        let path = path.to_owned();
        self.topo.fabric.enter(move || {
            let mut s = TcpStream::connect(&addr)?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(req.as_bytes())?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
            if !head.starts_with("HTTP/1.1 200") {
                bail!("{addr}{path}: {}", head.lines().next().unwrap_or(""));
            }
            Ok(body.to_owned())
        })
    }

    /// Applies the example gateway and policy (`docs/examples/gateway.yaml`,
    /// `policy.yaml`: pods labelled `app=web` leave with [`eip`]`(0)`).
    pub fn apply_examples(&self) -> Result<()> {
        let ex = examples_dir();
        self.apply(&ex.join("gateway.yaml"))?;
        self.apply(&ex.join("policy.yaml"))?;
        Ok(())
    }

    /// [`Cluster::apply_examples`], then waits until w1's agent applies the policy.
    pub fn apply_example_policy(&self) -> Result<()> {
        self.apply_policy(&examples_dir().join("policy.yaml"))
    }

    /// The example gateway and the one policy in `file`, then waits until
    /// w1's agent applies the policy.
    pub fn apply_policy(&self, file: &Path) -> Result<()> {
        self.apply(&examples_dir().join("gateway.yaml"))?;
        self.apply(file)?;
        wait_until("w1 applies the policy", Duration::from_secs(30), || {
            Ok(self.agent_state(0)?["policies"].as_u64() == Some(1))
        })?;
        Ok(())
    }

    /// [`Cluster::apply_examples`], then waits until one gateway (not a
    /// worker) announces the EIP and w1's agent applies the policy; returns
    /// the owner's index. The start of most end-to-end tests.
    pub fn examples_up(&self) -> Result<usize> {
        self.apply_examples()?;
        let owner = self.example_eip_owner()?;
        anyhow::ensure!(
            self.topo.nodes[owner].name.starts_with('g'),
            "a worker announces the EIP"
        );
        wait_until("w1 applies the policy", Duration::from_secs(30), || {
            Ok(self.agent_state(0)?["policies"].as_u64() == Some(1))
        })?;
        Ok(owner)
    }

    /// Waits until exactly one node announces the examples' EIP
    /// ([`eip`]`(0)`) and returns that node's index.
    pub fn example_eip_owner(&self) -> Result<usize> {
        let address = eip(0).to_string();
        wait_until(
            "one node announces the EIP",
            Duration::from_secs(30),
            || Ok(self.announcers(&address).len() == 1),
        )?;
        Ok(self.announcers(&address)[0])
    }

    /// The source prefixes in node `i`'s POLICY_SRC map (`egress inspect --json`).
    pub fn policy_sources(&self, i: usize) -> Result<Vec<String>> {
        policy_sources_in(&self.egress, self.pin_dir(i))
    }

    /// How often each agent (in node order) listed the datastore (`/state`
    /// `datastore_lists`).
    pub fn agent_lists(&self) -> Result<Vec<u64>> {
        (0..self.topo.nodes.len())
            .map(|i| {
                self.agent_state(i)?["datastore_lists"]
                    .as_u64()
                    .context("datastore_lists in /state")
            })
            .collect()
    }

    /// The `/state` document of node `i`'s agent.
    pub fn agent_state(&self, i: usize) -> Result<serde_json::Value> {
        let admin = self.agent_admin.clone();
        self.topo.nodes[i].ns.enter(move || {
            let mut s = TcpStream::connect(&admin)?;
            s.set_read_timeout(Some(Duration::from_secs(2)))?;
            s.write_all(b"GET /state HTTP/1.1\r\nconnection: close\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
            Ok(serde_json::from_str(body)?)
        })
    }

    /// Index of the node whose agent announces `eip` (none, or the first if several).
    pub fn announcers(&self, eip: &str) -> Vec<usize> {
        (0..self.topo.nodes.len())
            .filter(|&i| self.agents[i].is_some())
            .filter(|&i| {
                self.agent_state(i)
                    .ok()
                    .and_then(|s| s["announced"].as_array().cloned())
                    .is_some_and(|a| a.iter().any(|e| e == eip))
            })
            .collect()
    }

    /// Kills node `i`'s agent (SIGKILL, as a crash).
    pub fn kill_agent(&mut self, i: usize) {
        if let Some(mut p) = self.agents[i].take() {
            p.kill();
        }
    }

    /// True when the agents were given the probe flags (the agent has them
    /// and the spec asks for probes).
    pub fn agents_probe(&self) -> bool {
        self.agent_probes
    }

    /// Waits until controller `i` says it leads; returns that line. It may
    /// have said so before the start waited for its indexes (the two run
    /// side by side), so a line passed over then counts.
    pub fn wait_leading(&mut self, i: usize, timeout: Duration) -> Result<String> {
        match self.controllers.get_mut(i).and_then(Option::as_mut) {
            Some(p) => p.wait_for_line_seen_or_next(" leading, term ", timeout),
            None => bail!("controller {i} is not running"),
        }
    }

    /// Kills controller `i`.
    pub fn kill_controller(&mut self, i: usize) {
        if let Some(mut p) = self.controllers[i].take() {
            p.kill();
        }
    }
}

/// Polls `check` until it returns true; fails with `what` after `timeout`.
/// The source prefixes in the POLICY_SRC map pinned in `pin_dir`, read
/// with `egress inspect --json` (another process: the agent does no work).
pub fn policy_sources_in(egress: &Path, pin_dir: &Path) -> Result<Vec<String>> {
    let out = std::process::Command::new(egress)
        .args(["inspect", "--json", "--pin-dir"])
        .arg(pin_dir)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "egress inspect: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["datapath"]["policy_sources"]
        .as_array()
        .context("policy_sources in egress inspect --json")?
        .iter()
        .filter_map(|s| s["source"].as_str().map(str::to_owned))
        .collect())
}

pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<Duration> {
    let start = Instant::now();
    let mut last_err = None;
    while start.elapsed() < timeout {
        match check() {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    match last_err {
        Some(e) => bail!("{what}: not reached within {timeout:?} (last error: {e:#})"),
        None => bail!("{what}: not reached within {timeout:?}"),
    }
}

/// The repository's example objects folder.
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples")
}

/// Runs `egress-traffic` in a namespace to completion (with a duration) and returns its report.
pub fn traffic_report(
    ns: &crate::Netns,
    args: &[&str],
    duration_s: f64,
) -> Result<serde_json::Value> {
    let bin = crate::traffic_bin()?;
    let bin = bin.to_string_lossy().into_owned();
    let env = format!("EGRESS_TRAFFIC_DURATION_S={duration_s}");
    let mut argv = vec!["env", env.as_str(), bin.as_str()];
    argv.extend_from_slice(args);
    let out = match ns.exec(&argv) {
        Ok(o) => o,
        Err(e) => bail!("egress-traffic {}: {e:#}", args.join(" ")),
    };
    let line = out
        .lines()
        .rev()
        .find(|l| l.contains("\"role\""))
        .context("no report line")?;
    Ok(serde_json::from_str(line)?)
}

/// The address the server sees a TCP connection (port 5000) from pod `pod`
/// of worker `worker` come from: the EIP when the pod's policy applies.
pub fn pod_source_seen(cluster: &Cluster, worker: usize, pod: usize) -> Result<String> {
    let pod_ns = &cluster.topo.nodes[worker].pods[pod].ns;
    Ok(tcp_peer_seen(cluster, pod_ns, 5000)?.0)
}

impl Cluster {
    /// The example objects up ([`Cluster::examples_up`]) and their effect
    /// checked: p11 (app=web) leaves with the EIP, p12 (app=other) with its
    /// own address. The EIP and the index of the node that owns it.
    pub fn examples_up_and_checked(&mut self) -> Result<(String, usize)> {
        let eip = crate::topology::eip(0).to_string();
        let owner = self.examples_up()?;
        assert_eq!(pod_source_seen(self, 0, 0)?, eip, "p11 leaves with the EIP");
        let p12 = self.topo.nodes[0].pods[1].ip.to_string();
        assert_eq!(
            pod_source_seen(self, 0, 1)?,
            p12,
            "p12 leaves with its own address"
        );
        Ok((eip, owner))
    }

    /// A gateway failover: the agent of `owner` (the EIP's owner) dies,
    /// another gateway announces `eip` (`moved` names that wait), and p11
    /// (pod 0 of worker 0) leaves with the EIP there, each within 30 s.
    pub fn kill_owner_and_wait_failover(
        &mut self,
        owner: usize,
        eip: &str,
        moved: &str,
    ) -> Result<()> {
        self.kill_agent(owner);
        wait_until(moved, Duration::from_secs(30), || {
            Ok(matches!(self.announcers(eip).as_slice(), [n] if *n != owner))
        })?;
        self.wait_pod_source(0, 0, eip, "p11 leaves with the EIP again")
    }

    /// Waits up to 30 s (`what` names the wait) for pod `pod` of worker
    /// `worker` to leave with `want` ([`pod_source_seen`]).
    pub fn wait_pod_source(&self, worker: usize, pod: usize, want: &str, what: &str) -> Result<()> {
        wait_until(what, Duration::from_secs(30), || {
            Ok(pod_source_seen(self, worker, pod)? == want)
        })?;
        Ok(())
    }
}

/// One short TCP connection from `ns` to the server's port `port`, echoed
/// back: the (address, port) the server saw it come from.
pub fn tcp_peer_seen(cluster: &Cluster, ns: &crate::Netns, port: u16) -> Result<(String, u64)> {
    tcp_peer_seen_at(cluster, ns, (crate::topology::SERVER_IP, port).into())
}

/// As [`tcp_peer_seen`], to the server's address `server` (IPv4 or IPv6).
pub fn tcp_peer_seen_at(
    cluster: &Cluster,
    ns: &crate::Netns,
    server: std::net::SocketAddr,
) -> Result<(String, u64)> {
    let traffic = crate::traffic_bin()?.to_string_lossy().into_owned();
    let any: std::net::IpAddr = if server.is_ipv6() {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    };
    let mut sink = cluster.topo.server.spawn(&[
        &traffic,
        "tcp-sink",
        &std::net::SocketAddr::new(any, server.port()).to_string(),
    ])?;
    sink.wait_for_line("ready", Duration::from_secs(10))?;
    let src = traffic_report(ns, &["tcp-source", &server.to_string(), "5"], 0.3)?;
    anyhow::ensure!(
        src["survived"] == true && src["echoed"].as_u64() > Some(0),
        "no echo: {src}"
    );
    sink.signal_term();
    let report: serde_json::Value =
        serde_json::from_str(&sink.wait_for_line("\"role\"", Duration::from_secs(10))?)?;
    let c = &report["connections"][0];
    Ok((
        c["peer"].as_str().unwrap_or_default().to_owned(),
        c["peer_port"].as_u64().unwrap_or(0),
    ))
}

//! A small cluster in network namespaces: the underlay every end-to-end
//! scenario, benchmark and the demo share.
//!
//! ```text
//!   pod ns --veth-- node ns (worker or gateway) --veth-- fabric ns --veth-- server ns
//!                     10.10.0.N/24                 br0 10.10.0.254      198.51.100.10
//!                                                  198.51.100.1
//! ```
//! The fabric is the underlay switch (bridge `br0`) and the upstream router
//! to the external server; etcd, FRR and controllers can run there. EIPs are
//! taken from the underlay subnet (10.10.0.200-220, fd00:10::200-220), so in
//! L2 mode the fabric finds an EIP's owner by ARP/NDP. Pod CIDRs are routed
//! by the fabric to their node, so traffic outside any policy leaves with the
//! pod's own address.
//!
//! On an IPv6 underlay ([`Topology::build_on`]) the nodes have no IPv4
//! address: the tunnels, the datastore and the probes run over
//! fd00:10::/64, and IPv4 routes (the nodes' default, the fabric's routes
//! to the pods) have IPv6 next hops. The fabric keeps 10.10.0.254 on the
//! bridge: the IPv4 EIPs are still found there by ARP.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Context, Result};

use crate::{
    cni::{CniNetwork, PodAddrs, Wiring},
    netns::{link_veth, Netns},
};

pub const UNDERLAY_PREFIX: &str = "10.10.0";
pub const FABRIC_UNDERLAY_IP: Ipv4Addr = Ipv4Addr::new(10, 10, 0, 254);
pub const FABRIC_UNDERLAY_IP6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0, 0, 0x254);
pub const SERVER_IP: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
pub const SERVER_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x100, 0, 0, 0, 0, 0x10);

/// The `i`-th EIP of the test pool (0-based), on the underlay subnet.
pub fn eip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 10, 0, 200 + i)
}

/// The `i`-th IPv6 EIP of the test pool.
pub fn eip6(i: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0, 0, 0x200 + u16::from(i))
}

pub struct Pod {
    pub name: String,
    /// Field order is drop order: the pod's namespace goes before its CNI network.
    pub ns: Netns,
    pub ip: Ipv4Addr,
    pub ip6: Ipv6Addr,
    /// The host-side veth in the node namespace.
    pub host_veth: String,
}

pub struct Node {
    pub name: String,
    pub ns: Netns,
    /// The node's IPv4 address (not configured on an IPv6 underlay).
    pub ip: Ipv4Addr,
    pub ip6: Ipv6Addr,
    /// The address it has on the underlay: `ip`, or `ip6` on an IPv6 one.
    pub underlay_ip: IpAddr,
    /// Index into the topology's nodes; also picks the pod CIDR 10.244.<index+1>.0/24.
    pub index: u8,
    pub uplink: String,
    /// The fabric-side end of this node's uplink (cut it to kill the node's datapath).
    pub fabric_port: String,
    pub pods: Vec<Pod>,
    /// The CNI network of pods wired by a plugin (see [`Topology::add_pod_wired`]).
    pub cni: Option<CniNetwork>,
}

impl Node {
    pub fn pod_cidr(&self) -> String {
        format!("10.244.{}.0/24", self.index + 1)
    }
    pub fn pod_cidr6(&self) -> String {
        format!("fd00:244:{}::/64", self.index + 1)
    }
}

pub struct Topology {
    pub fabric: Netns,
    pub server: Netns,
    pub nodes: Vec<Node>,
    /// The nodes have IPv6 addresses only.
    pub ipv6_underlay: bool,
}

impl Topology {
    /// Builds the fabric, the server and one namespace per node name.
    pub fn build(node_names: &[&str]) -> Result<Self> {
        Self::build_on(node_names, false)
    }

    /// The fabric's address on the underlay (where etcd listens).
    pub fn fabric_ip(&self) -> IpAddr {
        if self.ipv6_underlay {
            FABRIC_UNDERLAY_IP6.into()
        } else {
            FABRIC_UNDERLAY_IP.into()
        }
    }

    /// [`Topology::fabric_ip`] as the host part of a URL.
    pub fn fabric_host(&self) -> String {
        match self.fabric_ip() {
            IpAddr::V4(a) => a.to_string(),
            IpAddr::V6(a) => format!("[{a}]"),
        }
    }

    /// As [`Topology::build`], on an IPv6-only underlay when `ipv6_underlay`.
    pub fn build_on(node_names: &[&str], ipv6_underlay: bool) -> Result<Self> {
        let fabric = Netns::new("fab")?;
        let server = Netns::new("srv")?;
        fabric.enable_forwarding()?;
        fabric.bridge("br0")?;
        fabric.addr("br0", &format!("{FABRIC_UNDERLAY_IP}/24"))?;
        fabric.addr("br0", "fd00:10::254/64")?;
        link_veth(&fabric, "srv0", &server, "eth0")?;
        fabric.addr("srv0", "198.51.100.1/24")?;
        fabric.addr("srv0", "2001:db8:100::1/64")?;
        server.addr("eth0", &format!("{SERVER_IP}/24"))?;
        server.addr("eth0", &format!("{SERVER_IP6}/64"))?;
        server.route(&["default", "via", "198.51.100.1"])?;
        server.route(&["default", "via", "2001:db8:100::1"])?;
        let mut topo = Self {
            fabric,
            server,
            nodes: Vec::new(),
            ipv6_underlay,
        };
        for name in node_names {
            topo.add_node(name)?;
        }
        Ok(topo)
    }

    fn add_node(&mut self, name: &str) -> Result<()> {
        let index = self.nodes.len() as u8;
        let ns = Netns::new(name)?;
        ns.enable_forwarding()?;
        let fabric_port = format!("n{index}");
        link_veth(&ns, "eth0", &self.fabric, &fabric_port)?;
        self.fabric
            .ip(&["link", "set", &fabric_port, "master", "br0"])?;
        let ip = Ipv4Addr::new(10, 10, 0, index + 1);
        let ip6: Ipv6Addr = format!("fd00:10::{}", index + 1).parse()?;
        ns.addr("eth0", &format!("{ip6}/64"))?;
        let fab6 = FABRIC_UNDERLAY_IP6.to_string();
        if self.ipv6_underlay {
            ns.ip(&["-4", "route", "add", "default", "via", "inet6", &fab6])?;
        } else {
            ns.addr("eth0", &format!("{ip}/24"))?;
            ns.route(&["default", "via", &FABRIC_UNDERLAY_IP.to_string()])?;
        }
        ns.route(&["default", "via", &fab6])?;
        let node = Node {
            name: name.to_owned(),
            ns,
            ip,
            ip6,
            underlay_ip: if self.ipv6_underlay {
                ip6.into()
            } else {
                ip.into()
            },
            index,
            uplink: "eth0".into(),
            fabric_port,
            pods: Vec::new(),
            cni: None,
        };
        // The fabric routes each node's pod CIDRs to it (what BGP would teach it).
        if self.ipv6_underlay {
            self.fabric.ip(&[
                "-4",
                "route",
                "add",
                &node.pod_cidr(),
                "via",
                "inet6",
                &ip6.to_string(),
            ])?;
        } else {
            self.fabric
                .route(&[&node.pod_cidr(), "via", &ip.to_string()])?;
        }
        self.fabric
            .route(&[&node.pod_cidr6(), "via", &ip6.to_string()])?;
        self.nodes.push(node);
        Ok(())
    }

    /// Adds a pod to node `node` (index), wired the way common CNIs do it: a
    /// /32 (/128) on the pod's eth0, a default route to a link-local next hop
    /// that the host veth answers by proxy ARP/NDP, and a host route back.
    pub fn add_pod(&mut self, node: usize, name: &str) -> Result<&Pod> {
        let n = &mut self.nodes[node];
        let j = n.pods.len() as u8;
        let ns = Netns::new(name)?;
        let host_veth = format!("veth{}", j);
        link_veth(&n.ns, &host_veth, &ns, "eth0")?;
        let ip = Ipv4Addr::new(10, 244, n.index + 1, j + 2);
        let ip6: Ipv6Addr = format!("fd00:244:{}::{}", n.index + 1, j + 2).parse()?;
        ns.addr("eth0", &format!("{ip}/32"))?;
        ns.addr("eth0", &format!("{ip6}/128"))?;
        ns.route(&["169.254.1.1", "dev", "eth0", "scope", "link"])?;
        ns.route(&["default", "via", "169.254.1.1", "dev", "eth0"])?;
        ns.route(&["default", "via", "fe80::1", "dev", "eth0"])?;
        n.ns.sysctl(&[&format!("net.ipv4.conf.{host_veth}.proxy_arp=1")])?;
        // Proxy ARP answers broadcast requests after a random delay of up
        // to 0.8 s by default; the pod's first packets would wait in its
        // neighbour queue that long. CNIs set it to 0 (Calico does).
        n.ns.sysctl(&[&format!("net.ipv4.neigh.{host_veth}.proxy_delay=0")])?;
        n.ns.sysctl(&[&format!("net.ipv6.conf.{host_veth}.proxy_ndp=1")])?;
        n.ns.ip(&[
            "-6",
            "addr",
            "add",
            "fe80::1/64",
            "dev",
            &host_veth,
            "nodad",
        ])?;
        n.ns.route(&[&format!("{ip}/32"), "dev", &host_veth])?;
        n.ns.route(&[&format!("{ip6}/128"), "dev", &host_veth])?;
        n.pods.push(Pod {
            name: name.to_owned(),
            ns,
            ip,
            ip6,
            host_veth,
        });
        Ok(n.pods.last().unwrap())
    }

    /// Adds a pod to node `node` wired as `wiring` says: [`Topology::add_pod`]
    /// for the routed style, the CNI `bridge` or `ptp` plugin otherwise
    /// (10.244.<node+1>.<j+2>, fd00:244:<node+1>::<j+2>, gateway .1 / ::1).
    pub fn add_pod_wired(&mut self, node: usize, name: &str, wiring: Wiring) -> Result<&Pod> {
        if wiring == Wiring::Routed {
            return self.add_pod(node, name);
        }
        let n = &mut self.nodes[node];
        let j = n.pods.len() as u8;
        let addrs = pod_addrs(n.index, j);
        if n.cni.is_none() {
            n.cni = Some(CniNetwork::new(wiring)?);
        }
        let cni = n.cni.as_ref().unwrap();
        let ns = Netns::new(name)?;
        let host_veth = cni.add(&n.ns, &ns, "", &addrs)?;
        n.pods.push(Pod {
            name: name.to_owned(),
            ns,
            ip: addrs.v4,
            ip6: addrs.v6,
            host_veth,
        });
        Ok(n.pods.last().unwrap())
    }

    /// Removes pod `pod` of node `node` as a kubelet does (CNI DEL, then
    /// its namespace) and wires a new one with the same name and addresses,
    /// on a new veth (a new bridge port): a pod re-created in place.
    pub fn recreate_pod(&mut self, node: usize, pod: usize) -> Result<&Pod> {
        let n = &mut self.nodes[node];
        let cni = n
            .cni
            .as_ref()
            .context("only CNI-wired pods are re-created")?;
        let old = &n.pods[pod];
        let addrs = pod_addrs(n.index, pod as u8);
        cni.del(&n.ns, &old.ns, &addrs)?;
        let name = old.name.clone();
        let ns = Netns::new(&name)?;
        let host_veth = cni.add(&n.ns, &ns, "", &addrs)?;
        n.pods[pod] = Pod {
            name,
            ns,
            ip: addrs.v4,
            ip6: addrs.v6,
            host_veth,
        };
        Ok(&n.pods[pod])
    }

    /// Cuts node `node` off the underlay (its fabric port goes down), as a
    /// dead link or a dead machine looks from the outside.
    pub fn cut_node(&self, node: usize) -> Result<()> {
        self.fabric
            .ip(&["link", "set", &self.nodes[node].fabric_port, "down"])
            .map(|_| ())
    }

    /// Restores a cut node's link.
    pub fn restore_node(&self, node: usize) -> Result<()> {
        self.fabric
            .ip(&["link", "set", &self.nodes[node].fabric_port, "up"])
            .map(|_| ())
    }
}

/// The addresses of pod `j` of node `index` (as [`Topology::add_pod`] numbers them).
fn pod_addrs(index: u8, j: u8) -> PodAddrs {
    let sub = u16::from(index) + 1;
    PodAddrs {
        v4: Ipv4Addr::new(10, 244, index + 1, j + 2),
        v6: Ipv6Addr::new(0xfd00, 0x244, sub, 0, 0, 0, 0, u16::from(j) + 2),
        gw4: Ipv4Addr::new(10, 244, index + 1, 1),
        gw6: Ipv6Addr::new(0xfd00, 0x244, sub, 0, 0, 0, 0, 1),
        subnet4: format!("10.244.{}.0/24", index + 1),
        subnet6: format!("fd00:244:{sub}::/64"),
    }
}

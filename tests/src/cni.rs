//! Pods wired the way clusters wire them: by hand as Calico does (a routed
//! veth), or by the CNI reference plugins from Debian's
//! `containernetworking-plugins` (`bridge` as flannel and many kubeadm
//! set-ups use it, `ptp` as kindnet does), invoked as a kubelet invokes
//! them: `CNI_COMMAND=ADD/DEL`, the netconf on stdin, inside the node's
//! network namespace, with `host-local` IPAM.
//!
//! Each pod gets exactly the addresses the caller names (a one-address
//! `host-local` range), so tests know them in advance.

use std::{
    io::Write,
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    process::Stdio,
};

use anyhow::{bail, Context, Result};

use crate::Netns;

/// Where Debian's package puts the plugins.
pub const CNI_PATH: &str = "/usr/lib/cni";

/// How a pod's interface is joined to its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wiring {
    /// A veth whose host side is routed, with a gateway address (Calico style).
    Routed,
    /// A veth enslaved to the node's bridge `cni0` (CNI `bridge`, flannel).
    Bridge,
    /// A point-to-point veth (CNI `ptp`, kindnet).
    Ptp,
}

impl Wiring {
    pub const ALL: [Wiring; 3] = [Wiring::Routed, Wiring::Bridge, Wiring::Ptp];

    fn plugin(self) -> Option<&'static str> {
        match self {
            Wiring::Routed => None,
            Wiring::Bridge => Some("bridge"),
            Wiring::Ptp => Some("ptp"),
        }
    }
}

/// A pod's addresses and next hops on its node.
#[derive(Clone, Debug)]
pub struct PodAddrs {
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    /// The pod's gateway in its subnet (the bridge's or the host veth's address).
    pub gw4: Ipv4Addr,
    pub gw6: Ipv6Addr,
    /// The pod subnet the plugins' IPAM allocates from.
    pub subnet4: String,
    pub subnet6: String,
}

/// One node's CNI network: the plugin, and `host-local`'s state folder
/// (removed on drop).
pub struct CniNetwork {
    wiring: Wiring,
    data_dir: PathBuf,
}

impl CniNetwork {
    pub fn new(wiring: Wiring) -> Result<Self> {
        let data_dir = std::env::temp_dir().join(crate::unique_name("cni"));
        std::fs::create_dir_all(&data_dir)?;
        Ok(Self { wiring, data_dir })
    }

    pub fn wiring(&self) -> Wiring {
        self.wiring
    }

    /// Wires `pod` into `node` and returns the host-side interface's name.
    /// `host_if` names it for the routed style; the plugins choose their own.
    pub fn add(&self, node: &Netns, pod: &Netns, host_if: &str, a: &PodAddrs) -> Result<String> {
        let Some(plugin) = self.wiring.plugin() else {
            wire_routed(node, pod, host_if, a)?;
            return Ok(host_if.to_owned());
        };
        let out = self.invoke(plugin, "ADD", node, pod, a)?;
        host_interface(&out).with_context(|| format!("{plugin} ADD result: {out}"))
    }

    /// `CNI_COMMAND=DEL` for `pod`, as a kubelet sends when the pod goes.
    pub fn del(&self, node: &Netns, pod: &Netns, a: &PodAddrs) -> Result<()> {
        match self.wiring.plugin() {
            Some(plugin) => self.invoke(plugin, "DEL", node, pod, a).map(|_| ()),
            None => node
                .ip(&["link", "del", "dev", &routed_host_if(node, pod)?])
                .map(|_| ()),
        }
    }

    fn netconf(&self, plugin: &str, a: &PodAddrs) -> serde_json::Value {
        let range = |subnet: &str, ip: String, gw: String| serde_json::json!([{ "subnet": subnet, "rangeStart": ip, "rangeEnd": ip, "gateway": gw }]);
        let mut conf = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": "egress-test",
            "type": plugin,
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": self.data_dir,
                "ranges": [
                    range(&a.subnet4, a.v4.to_string(), a.gw4.to_string()),
                    range(&a.subnet6, a.v6.to_string(), a.gw6.to_string()),
                ],
                "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }],
            },
        });
        if plugin == "bridge" {
            conf["bridge"] = "cni0".into();
            conf["isGateway"] = true.into();
        }
        conf
    }

    fn invoke(
        &self,
        plugin: &str,
        cmd: &str,
        node: &Netns,
        pod: &Netns,
        a: &PodAddrs,
    ) -> Result<String> {
        let conf = serde_json::to_vec(&self.netconf(plugin, a))?;
        let mut c = node.command(&[&format!("{CNI_PATH}/{plugin}")]);
        c.env("CNI_COMMAND", cmd)
            .env("CNI_CONTAINERID", pod.name())
            .env("CNI_NETNS", pod.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", CNI_PATH)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c
            .spawn()
            .with_context(|| format!("{CNI_PATH}/{plugin}: install containernetworking-plugins"))?;
        child.stdin.take().context("stdin")?.write_all(&conf)?;
        let out = child.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            bail!(
                "{plugin} {cmd} failed ({}): {stdout} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(stdout)
    }
}

impl Drop for CniNetwork {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// The interface of a CNI result that is not inside the pod's namespace
/// (the host-side veth; the bridge is listed too, but without a MAC of a
/// veth peer it is told apart by name).
fn host_interface(result: &str) -> Result<String> {
    let v: serde_json::Value = serde_json::from_str(result)?;
    let ifaces = v["interfaces"].as_array().context("no interfaces")?;
    ifaces
        .iter()
        .filter(|i| i["sandbox"].as_str().is_none_or(str::is_empty))
        .filter_map(|i| i["name"].as_str())
        .find(|n| *n != "cni0")
        .map(str::to_owned)
        .context("no host-side interface")
}

/// Calico's wiring: the host veth holds the gateway address, the pod a /32
/// (/128) with a host route to it, and the node a host route back.
fn wire_routed(node: &Netns, pod: &Netns, host_if: &str, a: &PodAddrs) -> Result<()> {
    crate::link_veth(pod, "eth0", node, host_if)?;
    let (v4, v6, gw4, gw6) = (
        a.v4.to_string(),
        a.v6.to_string(),
        a.gw4.to_string(),
        a.gw6.to_string(),
    );
    node.addr(host_if, &format!("{gw4}/32"))?;
    node.addr(host_if, &format!("{gw6}/128"))?;
    node.route(&[&format!("{v4}/32"), "dev", host_if])?;
    node.route(&[&format!("{v6}/128"), "dev", host_if])?;
    pod.addr("eth0", &format!("{v4}/32"))?;
    pod.addr("eth0", &format!("{v6}/128"))?;
    pod.route(&[&gw4, "dev", "eth0"])?;
    pod.route(&["default", "via", &gw4])?;
    pod.route(&[&gw6, "dev", "eth0"])?;
    pod.route(&["default", "via", &gw6])?;
    Ok(())
}

/// The node-side peer of a routed pod's eth0 (its `link-netnsid` peer).
fn routed_host_if(node: &Netns, pod: &Netns) -> Result<String> {
    let out = pod.ip(&["-j", "link", "show", "dev", "eth0"])?;
    let v: serde_json::Value = serde_json::from_str(&out)?;
    let peer = v[0]["link_index"].as_u64().context("eth0 has no peer")?;
    let links: serde_json::Value = serde_json::from_str(&node.ip(&["-j", "link", "show"])?)?;
    links
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["ifindex"].as_u64() == Some(peer))
        .and_then(|l| l["ifname"].as_str())
        .map(str::to_owned)
        .context("peer of eth0 not found on the node")
}

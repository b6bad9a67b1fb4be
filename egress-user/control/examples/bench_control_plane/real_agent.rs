//! One real `egress agent`, with its datapath, in the namespace of one
//! worker node: the measure of what a single agent spends per change. Its
//! maps are read with `egress inspect` (another process, so the reading
//! costs the agent nothing).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use egress_tests::cluster::policy_sources_in;
use egress_tests::{Netns, Proc};

use super::{node_name, pod_cidr, Size, PREFIX};

/// Where the agent serves /state, on its node's underlay address.
const ADMIN: &str = "10.10.0.1:9470";

/// The `egress` binary: `EGRESS_BIN`, else the one built beside this example.
pub fn egress_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("EGRESS_BIN") {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .context("the example's folder")?;
    let bin = dir.join("egress");
    anyhow::ensure!(
        bin.exists(),
        "{} not found: build it (cargo build --release --bin egress) or set EGRESS_BIN",
        bin.display()
    );
    Ok(bin)
}

/// The command that starts the agent of the measured node inside `ns`.
pub fn command(egress: &Path, ns: &Netns, size: Size, pin: &Path, endpoint: &str) -> Command {
    let node = size.measured_node();
    let pin = pin.to_string_lossy().into_owned();
    let egress = egress.to_string_lossy().into_owned();
    let name = node_name(node);
    let cidr = pod_cidr(node);
    ns.command(&[
        &egress,
        "agent",
        "--node-name",
        &name,
        "--pin-dir",
        &pin,
        "--uplink",
        "eth0",
        "--pod-cidr",
        &cidr,
        "--admin-addr",
        ADMIN,
        "--datastore",
        "etcd",
        "--etcd-endpoints",
        endpoint,
        "--etcd-prefix",
        PREFIX,
    ])
}

pub struct RealAgent {
    pub proc: Proc,
    egress: PathBuf,
    pin: PathBuf,
}

impl RealAgent {
    pub fn start(cmd: Command, egress: PathBuf, pin: PathBuf) -> Result<Self> {
        let mut proc = Proc::spawn(cmd, "egress agent (measured)".into())?;
        proc.wait_for_line("ready node=", Duration::from_secs(180))?;
        Ok(Self { proc, egress, pin })
    }

    /// Waits until the maps hold (or, with `present` false, no longer hold)
    /// a policy source for `ip`.
    pub fn wait_source(&self, ip: &str, present: bool, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let host = format!("{ip}/32");
        loop {
            if policy_sources_in(&self.egress, &self.pin)?.contains(&host) == present {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the agent's maps did not get to {ip} present={present} within {timeout:?}");
            }
            // Polling another process's maps; the agent is not woken by it.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The agent's reconcile passes and watch batches so far, from `/state`:
    /// how often a change woke it, beside what it cost.
    pub fn counters(&self) -> Result<Counters> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(ADMIN).context("the agent's admin endpoint")?;
        s.write_all(b"GET /state HTTP/1.0\r\nHost: agent\r\n\r\n")?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let v: serde_json::Value = serde_json::from_str(body).context("/state as JSON")?;
        let n = |k: &str| v[k].as_u64().with_context(|| format!("/state has no {k}"));
        let rebuilt_by = v["prepared_rebuilt_by"]
            .as_object()
            .context("/state has no prepared_rebuilt_by")?
            .iter()
            .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
            .collect();
        Ok(Counters {
            passes: n("reconciles")?,
            batches: n("watch_batches")?,
            skipped: n("batches_skipped")?,
            lists: n("datastore_lists")?,
            rebuilt_by,
        })
    }
}

#[derive(Clone, Debug)]
pub struct Counters {
    pub passes: u64,
    pub batches: u64,
    pub skipped: u64,
    /// Full lists of the datastore (the start, a failed watch, the
    /// periodic relist).
    pub lists: u64,
    /// Rebuilds of the agent's prepared parts, by the kind that caused them.
    pub rebuilt_by: std::collections::BTreeMap<String, u64>,
}

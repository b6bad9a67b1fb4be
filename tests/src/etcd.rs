//! A real etcd for tests: random free ports, its own data folder, killed and
//! removed on drop (also when the test panics).
//!
//! ```no_run
//! let etcd = egress_tests::etcd::EtcdServer::start().unwrap();
//! println!("{}", etcd.endpoint()); // http://127.0.0.1:PORT
//! ```
//!
//! Optionally inside a network namespace ([`EtcdServer::start_in`]), for the
//! multi-node tests: then it listens on the given address.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

static NEXT: AtomicU32 = AtomicU32::new(0);

pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    client: SocketAddr,
    netns: Option<String>,
    /// The member's name (`--name`).
    name: String,
    /// The command line it runs with (again on [`EtcdServer::restart`]).
    argv: Vec<String>,
}

/// Starts `argv` with its log in `dir/etcd.log` (appended: a restart keeps
/// the first run's lines).
fn run(argv: &[String], dir: &Path) -> Result<Child> {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("etcd.log"))?;
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting etcd (is etcd-server installed?)")
}

/// A port the kernel says is free right now.
fn free_port(ip: &str) -> Result<u16> {
    let l = TcpListener::bind((ip, 0)).context("binding a probe socket")?;
    Ok(l.local_addr()?.port())
}

impl EtcdServer {
    /// Starts etcd on 127.0.0.1 and waits until it answers `/health`.
    pub fn start() -> Result<Self> {
        let mut me = Self::spawn(None, "127.0.0.1", None)?;
        me.wait_healthy(Duration::from_secs(20))?;
        Ok(me)
    }

    /// Starts etcd inside network namespace `netns`, listening on `ip`
    /// (an address of that namespace).
    pub fn start_in(netns: &str, ip: &str) -> Result<Self> {
        let mut me = Self::spawn(Some(netns), ip, None)?;
        me.wait_healthy(Duration::from_secs(20))?;
        Ok(me)
    }

    /// A cluster of one member per (namespace, address) of `members`
    /// (ports 2379 and 2380 on each address); returns once every member is
    /// healthy (the cluster has a leader).
    pub fn cluster_in(members: &[(&str, &str)]) -> Result<Vec<Self>> {
        let first = NEXT.load(Ordering::Relaxed);
        let initial = members
            .iter()
            .enumerate()
            .map(|(i, (_, ip))| format!("t{}=http://{ip}:2380", first + i as u32))
            .collect::<Vec<_>>()
            .join(",");
        let mut started = Vec::new();
        for (i, (netns, ip)) in members.iter().enumerate() {
            let m = Self::spawn(Some(netns), ip, Some(&initial))?;
            anyhow::ensure!(
                m.name == format!("t{}", first + i as u32),
                "etcd members started concurrently by another test"
            );
            started.push(m);
        }
        for m in &mut started {
            m.wait_healthy(Duration::from_secs(30))?;
        }
        Ok(started)
    }

    /// `initial_cluster`: every member's `name=peer URL` (a cluster of one
    /// when `None`).
    fn spawn(netns: Option<&str>, ip: &str, initial_cluster: Option<&str>) -> Result<Self> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("egress-etcd-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        // In a namespace the probe binds on the host; ports there are free
        // anyway (fresh namespace), so any pair will do.
        let (cport, pport) = if netns.is_some() {
            (2379, 2380)
        } else {
            (free_port(ip)?, free_port(ip)?)
        };
        let curl = format!("http://{ip}:{cport}");
        let purl = format!("http://{ip}:{pport}");
        let name = format!("t{n}");
        let mut argv: Vec<String> = match netns {
            Some(ns) => ["ip", "netns", "exec", ns, "etcd"].map(String::from).into(),
            None => vec!["etcd".into()],
        };
        let data = dir.join("data").to_string_lossy().into_owned();
        let own = format!("{name}={purl}");
        argv.extend(
            [
                "--name",
                &name,
                "--data-dir",
                &data,
                "--listen-client-urls",
                &curl,
                "--advertise-client-urls",
                &curl,
                "--listen-peer-urls",
                &purl,
                "--initial-advertise-peer-urls",
                &purl,
                "--initial-cluster",
                initial_cluster.unwrap_or(&own),
            ]
            .map(String::from),
        );
        let child = run(&argv, &dir)?;
        Ok(Self {
            child,
            dir,
            client: format!("{ip}:{cport}").parse()?,
            netns: netns.map(String::from),
            name,
            argv,
        })
    }

    /// Kills etcd (SIGKILL), leaves it down for `down`, and starts it again
    /// on the same data and addresses; returns once it is healthy. Clients
    /// see their connections break and requests refused meanwhile.
    pub fn restart_after(&mut self, down: Duration) -> Result<()> {
        self.stop();
        std::thread::sleep(down);
        self.start_again()
    }

    /// Kills etcd (SIGKILL); [`EtcdServer::start_again`] brings it back.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a stopped etcd again on the same data and addresses; returns
    /// once it is healthy.
    pub fn start_again(&mut self) -> Result<()> {
        self.child = run(&self.argv, &self.dir)?;
        self.wait_healthy(Duration::from_secs(20))
    }

    /// Polls `/health` until etcd says it is healthy.
    fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "etcd exited ({status}) before it was healthy: {}",
                    self.log_tail()
                );
            }
            if self.healthy() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "etcd at {} not healthy after {timeout:?}: {}",
                    self.client,
                    self.log_tail()
                );
            }
            // Each probe blocks on connect/read; a failed one comes back
            // at once, so pace the retries a little.
            std::thread::park_timeout(Duration::from_millis(20));
        }
    }

    fn healthy(&self) -> bool {
        if let Some(ns) = &self.netns {
            // The host cannot reach into the namespace: ask from inside.
            return Command::new("ip")
                .args(["netns", "exec", ns, "etcdctl", "--dial-timeout=1s"])
                .arg(format!("--endpoints={}", self.endpoint()))
                .args(["endpoint", "health"])
                .env("ETCDCTL_API", "3")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        }
        let Ok(mut s) = TcpStream::connect_timeout(&self.client, Duration::from_millis(200)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = format!("GET /health HTTP/1.0\r\nHost: {}\r\n\r\n", self.client);
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }

    /// `http://IP:PORT`, for clients.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.client)
    }

    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join(" | ")
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_answers_and_cleans_up() {
        let dir;
        {
            let e = EtcdServer::start().unwrap();
            dir = e.data_dir().to_path_buf();
            assert!(e.healthy());
            assert!(dir.exists());
        }
        assert!(!dir.exists(), "data folder removed on drop");
    }
}

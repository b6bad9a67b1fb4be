//! Namespaces, veth pairs and pinned-map folders that clean up after themselves.

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::{AtomicU32, Ordering},
};

use anyhow::{Context, Result};

use crate::process::{run, Proc};

static NEXT_ID: AtomicU32 = AtomicU32::new(0);

/// A name no other test, run or process on this machine uses at the same time:
/// `eg<pid>x<counter><label>`.
pub fn unique_name(label: &str) -> String {
    let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    format!("eg{}x{}{}", std::process::id(), n, label)
}

/// A network namespace, deleted (with every process still in it) on drop.
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `eg<pid>x<n><label>` with loopback up.
    pub fn new(label: &str) -> Result<Self> {
        let name = unique_name(label);
        run(&["ip", "netns", "add", &name])?;
        let ns = Self { name };
        ns.ip(&["link", "set", "lo", "up"])?;
        // No duplicate address detection: addresses (link-local ones too) are
        // usable at once, instead of about a second after each link comes up.
        ns.sysctl(&[
            "net.ipv6.conf.all.accept_dad=0",
            "net.ipv6.conf.default.accept_dad=0",
        ])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path nsenter and setns use.
    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// Runs `ip -n NS args...`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut full = vec!["ip", "-n", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// Builds the command line that runs `argv` inside this namespace.
    pub fn command(&self, argv: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", self.path().display()))
            .arg("--")
            .args(argv);
        cmd
    }

    /// Runs `argv` inside the namespace to completion; an error carries its stderr.
    pub fn exec(&self, argv: &[&str]) -> Result<String> {
        let ns_arg = format!("--net={}", self.path().display());
        let mut full = vec!["nsenter", &ns_arg, "--"];
        full.extend_from_slice(argv);
        run(&full)
    }

    /// Starts `argv` inside the namespace; the process is killed on drop.
    pub fn spawn(&self, argv: &[&str]) -> Result<Proc> {
        Proc::spawn(self.command(argv), argv.join(" "))
    }

    /// [`Netns::spawn`] of a program that prints `ready` once it serves
    /// (the traffic tool's sinks and sources), waiting up to 10 s for that.
    pub fn spawn_ready(&self, argv: &[&str]) -> Result<Proc> {
        let mut p = self.spawn(argv)?;
        p.wait_for_line("ready", std::time::Duration::from_secs(10))
            .with_context(|| argv.join(" "))?;
        Ok(p)
    }

    /// [`Netns::spawn`], its output in the log file `name` when the
    /// harness logs to a folder ([`crate::process::LOG_DIR_VAR`]).
    pub fn spawn_logged(&self, argv: &[&str], name: &str) -> Result<Proc> {
        Proc::spawn_logged(self.command(argv), argv.join(" "), name)
    }

    /// Adds an address (CIDR notation) to `dev` and brings it up.
    pub fn addr(&self, dev: &str, cidr: &str) -> Result<()> {
        let family = if cidr.contains(':') { "-6" } else { "-4" };
        let mut args = vec![family, "addr", "add", cidr, "dev", dev];
        if cidr.contains(':') {
            args.push("nodad");
        }
        self.ip(&args)?;
        self.ip(&["link", "set", dev, "up"])?;
        Ok(())
    }

    /// Adds a permanent neighbour entry: `addr` is at `mac` on `dev`, so a
    /// FIB lookup finds the next hop's MAC without resolving it.
    pub fn permanent_neighbour(&self, dev: &str, addr: &str, mac: &str) -> Result<()> {
        let mut args = Vec::new();
        if addr.contains(':') {
            args.push("-6");
        }
        args.extend_from_slice(&[
            "neigh",
            "add",
            addr,
            "lladdr",
            mac,
            "dev",
            dev,
            "nud",
            "permanent",
        ]);
        self.ip(&args).map(|_| ())
    }

    /// Adds a route, e.g. `route(&["default", "via", "10.0.0.1"])`.
    pub fn route(&self, spec: &[&str]) -> Result<()> {
        let family = if spec.iter().any(|s| s.contains(':')) {
            "-6"
        } else {
            "-4"
        };
        let mut args = vec![family, "route", "add"];
        args.extend_from_slice(spec);
        self.ip(&args).map(|_| ())
    }

    /// `sysctl -qw` of `settings` (`key=value` each) in this namespace.
    pub fn sysctl(&self, settings: &[&str]) -> Result<()> {
        let mut argv = vec!["sysctl", "-qw"];
        argv.extend_from_slice(settings);
        self.exec(&argv)?;
        Ok(())
    }

    /// Turns on IPv4 and IPv6 forwarding (a router or gateway node).
    pub fn enable_forwarding(&self) -> Result<()> {
        self.sysctl(&["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"])
    }

    /// Creates a bridge `name` inside the namespace and brings it up.
    pub fn bridge(&self, name: &str) -> Result<()> {
        self.ip(&["link", "add", name, "type", "bridge"])?;
        self.ip(&["link", "set", name, "up"])?;
        Ok(())
    }

    /// Creates the VXLAN device `name` as the agent makes it (external,
    /// port 4789, accepting the zero UDP checksum of our IPv6 outer
    /// headers) and brings it up.
    pub fn vxlan_external(&self, name: &str) -> Result<()> {
        self.ip(&[
            "link",
            "add",
            name,
            "type",
            "vxlan",
            "external",
            "dstport",
            "4789",
            "udp6zerocsumrx",
        ])?;
        self.ip(&["link", "set", name, "up"])?;
        Ok(())
    }

    /// Runs `f` on a new thread that has joined this namespace (setns), and
    /// returns its result. For in-process netlink and BPF attach calls, which
    /// act on the calling thread's network namespace.
    pub fn enter<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let file = std::fs::File::open(self.path())
            .with_context(|| format!("opening {}", self.path().display()))?;
        std::thread::spawn(move || {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid namespace fd; affects only this new thread.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error()).context("setns");
            }
            f()
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the thread inside the namespace panicked"))?
    }

    /// Kills every process still inside the namespace.
    fn kill_all(&self) {
        if let Ok(out) = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
        {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: plain kill(2) on a pid we just read.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.kill_all();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Joins `a:a_if` and `b:b_if` with a veth pair created directly in the two
/// namespaces, so no name is ever taken in the root namespace.
pub fn link_veth(a: &Netns, a_if: &str, b: &Netns, b_if: &str) -> Result<()> {
    a.ip(&[
        "link",
        "add",
        a_if,
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "netns",
        b.name(),
    ])
    .with_context(|| format!("veth {}:{a_if} <-> {}:{b_if}", a.name(), b.name()))?;
    a.ip(&["link", "set", a_if, "up"])?;
    b.ip(&["link", "set", b_if, "up"])?;
    Ok(())
}

/// A unique folder under /sys/fs/bpf for one test's pinned maps, removed on drop.
pub struct PinDir {
    path: PathBuf,
}

impl PinDir {
    pub fn new(label: &str) -> Result<Self> {
        let path = Path::new("/sys/fs/bpf").join(unique_name(label));
        Ok(Self { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        // bpffs allows unlinking pins and then rmdir of the empty folders.
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

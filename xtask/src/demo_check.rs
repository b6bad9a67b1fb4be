//! The check `cargo xtask test` runs on `demo --keep` and `demo --stop`, as
//! a user would run them: every command the kept demo prints works when
//! pasted into a shell as printed, and `--stop` removes the demo's
//! processes, namespaces, pin and temporary folders while a namespace, a
//! process and a folder of someone else's survive it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use anyhow::{bail, ensure, Context, Result};

use crate::demo_stop::{state_file, Kept};

/// Another user's things on the same host, which `--stop` must not touch.
struct Bystander {
    namespace: String,
    process: std::process::Child,
    folder: PathBuf,
}

impl Bystander {
    fn new() -> Result<Self> {
        let tag = format!("bystander{}", std::process::id());
        crate::shell::exec(Command::new("ip").args(["netns", "add", &tag]))?;
        let process = Command::new("ip")
            .args(["netns", "exec", &tag, "sleep", "600"])
            .spawn()?;
        let folder = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&folder)?;
        Ok(Self {
            namespace: tag,
            process,
            folder,
        })
    }

    fn untouched(&mut self) -> Result<()> {
        ensure!(
            Path::new("/run/netns").join(&self.namespace).exists(),
            "--stop deleted the namespace {}",
            self.namespace
        );
        ensure!(
            self.process.try_wait()?.is_none(),
            "--stop ended a process it did not start"
        );
        ensure!(
            self.folder.exists(),
            "--stop removed {}",
            self.folder.display()
        );
        Ok(())
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.namespace])
            .status();
        let _ = std::fs::remove_dir_all(&self.folder);
    }
}

/// The commands under "Look at it with:", as printed (comments cut).
fn printed_commands(out: &str) -> Vec<String> {
    out.lines()
        .skip_while(|l| !l.contains("Look at it with:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split("   #").next().unwrap_or(l).trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Runs `cargo xtask demo <args>` (this same binary) with its output in a
/// file: kept processes may hold a pipe open after the demo exits.
fn demo(root: &Path, args: &[&str]) -> Result<String> {
    let log = root.join(format!("target/demo/check-{}.out", std::process::id()));
    std::fs::create_dir_all(log.parent().unwrap())?;
    let file = std::fs::File::create(&log)?;
    let status = Command::new(std::env::current_exe()?)
        .arg("demo")
        .args(args)
        .current_dir(root)
        .stdout(Stdio::from(file.try_clone()?))
        .stderr(Stdio::from(file))
        .status()?;
    let out = std::fs::read_to_string(&log)?;
    let _ = std::fs::remove_file(&log);
    ensure!(status.success(), "demo {args:?} failed:\n{out}");
    Ok(out)
}

fn pids_in(ns: &str) -> Vec<u32> {
    crate::shell::output("ip", &["netns", "pids", ns])
        .map(|o| {
            o.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Entries of the pin and temp folders named after the demo process `pid`.
fn named_after(pid: u32) -> Vec<PathBuf> {
    let prefixes = [format!("eg{pid}x"), format!("egress-etcd-{pid}-")];
    [PathBuf::from("/sys/fs/bpf"), std::env::temp_dir()]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|entries| entries.flatten().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            prefixes.iter().any(|pre| name.starts_with(pre.as_str()))
        })
        .collect()
}

/// `demo --keep` (short timers, debug binaries already built), each printed
/// command, then `demo --stop`.
pub fn run(root: &Path) -> Result<()> {
    if state_file(root).exists() {
        bail!("a kept demo is up already: `cargo xtask demo --stop` first");
    }
    let mut bystander = Bystander::new()?;
    let out = demo(root, &["--keep", "--no-build", "--debug", "--fast"])?;
    let kept: Kept = serde_json::from_slice(&std::fs::read(state_file(root))?)
        .context("--keep wrote no record")?;
    let result = look_then_stop(root, &kept, &out);
    if state_file(root).exists() {
        // Something failed before --stop: remove the cluster anyway.
        let _ = demo(root, &["--stop"]);
    }
    result?;
    bystander.untouched()
}

fn look_then_stop(root: &Path, kept: &Kept, out: &str) -> Result<()> {
    let commands = printed_commands(out);
    ensure!(commands.len() >= 4, "--keep printed {commands:?}");
    for c in &commands {
        let o = Command::new("sh").args(["-c", c]).output()?;
        ensure!(
            o.status.success() && !o.stdout.is_empty(),
            "printed command `{c}` failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        println!("ok: {c}");
    }
    let processes: Vec<u32> = kept.namespaces.iter().flat_map(|n| pids_in(n)).collect();
    ensure!(
        !processes.is_empty(),
        "no process runs in the kept namespaces"
    );
    ensure!(
        !named_after(kept.pid).is_empty(),
        "the kept demo has no pins"
    );
    demo(root, &["--stop"])?;
    let alive: Vec<_> = processes
        .iter()
        .filter(|&&p| crate::demo_stop::running(p as i32))
        .collect();
    ensure!(alive.is_empty(), "--stop left processes {alive:?}");
    let namespaces: Vec<_> = kept
        .namespaces
        .iter()
        .filter(|n| Path::new("/run/netns").join(n).exists())
        .collect();
    ensure!(
        namespaces.is_empty(),
        "--stop left namespaces {namespaces:?}"
    );
    let folders = named_after(kept.pid);
    ensure!(folders.is_empty(), "--stop left {folders:?}");
    println!(
        "demo --keep printed {} working commands; --stop removed {} processes and {} namespaces and touched nothing else",
        commands.len(),
        processes.len(),
        kept.namespaces.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_read_as_printed() {
        let out = "x\n--keep: the cluster stays up. Look at it with:\n  nsenter --net=/run/netns/a egress inspect   # w1's maps\n  vtysh -c 'show bgp'\nStop it with:\n  cargo xtask demo --stop\n";
        assert_eq!(
            printed_commands(out),
            [
                "nsenter --net=/run/netns/a egress inspect",
                "vtysh -c 'show bgp'"
            ]
        );
    }
}

//! `cargo xtask demo --keep` leaves its cluster up; `cargo xtask demo
//! --stop` removes exactly what that run made and nothing else: the
//! processes inside its namespaces, the namespaces, and the pin and
//! temporary folders named after it.
//!
//! Everything the harness makes carries the demo process's id in its name
//! (`eg<pid>x...`, etcd's `egress-etcd-<pid>-...`), which `--keep` records.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// What a kept demo left running, written by `--keep`.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Kept {
    /// The demo process's id: the prefix of every name it made.
    pub pid: u32,
    /// Namespaces it made (their processes are the cluster's).
    pub namespaces: Vec<String>,
}

impl Kept {
    fn prefixes(&self) -> [String; 2] {
        [
            format!("eg{}x", self.pid),
            format!("egress-etcd-{}-", self.pid),
        ]
    }
}

/// Where `--keep` writes its record.
pub fn state_file(root: &Path) -> PathBuf {
    root.join("target/demo/kept.json")
}

pub fn record(root: &Path, kept: &Kept) -> Result<()> {
    let path = state_file(root);
    std::fs::create_dir_all(path.parent().unwrap())?;
    std::fs::write(&path, serde_json::to_vec_pretty(kept)?)?;
    Ok(())
}

/// `cargo xtask demo --stop`.
pub fn stop(root: &Path) -> Result<()> {
    let path = state_file(root);
    let kept: Kept = serde_json::from_slice(
        &std::fs::read(&path)
            .with_context(|| format!("no kept demo to stop ({} is missing)", path.display()))?,
    )?;
    let removed = remove(&kept, &[Path::new("/sys/fs/bpf"), &std::env::temp_dir()])?;
    std::fs::remove_file(&path)?;
    println!("stopped the demo kept by process {}:", kept.pid);
    println!(
        "  (its logs stay in {})",
        root.join(format!("target/demo/logs-{}", kept.pid))
            .display()
    );
    for r in removed {
        println!("  {r}");
    }
    Ok(())
}

/// Stops the processes in `kept`'s namespaces, deletes the namespaces, and
/// removes the entries of `dirs` named after it. Returns what it removed.
pub fn remove(kept: &Kept, dirs: &[&Path]) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    let [ours, _] = kept.prefixes();
    for ns in kept.namespaces.iter().filter(|n| n.starts_with(&ours)) {
        for pid in pids_in(ns) {
            stop_process(pid);
            removed.push(format!("process {pid} (in {ns})"));
        }
        if Path::new("/run/netns").join(ns).exists() {
            crate::shell::exec(std::process::Command::new("ip").args(["netns", "delete", ns]))?;
            removed.push(format!("namespace {ns}"));
        }
    }
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if kept.prefixes().iter().any(|p| name.starts_with(p)) {
                let p = e.path();
                let _ = std::fs::remove_dir_all(&p).or_else(|_| std::fs::remove_file(&p));
                removed.push(p.display().to_string());
            }
        }
    }
    Ok(removed)
}

fn pids_in(ns: &str) -> Vec<i32> {
    std::process::Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// SIGTERM, then SIGKILL if it still runs after 5 s; returns once it has
/// exited (a SIGKILLed process can take a moment to go).
fn stop_process(pid: i32) {
    // SAFETY: kill(2) on a pid found in the demo's own namespace.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    if exited_within(pid, Duration::from_secs(5)) {
        return;
    }
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    exited_within(pid, Duration::from_secs(5));
}

fn exited_within(pid: i32, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    while running(pid) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// The process exists and has not exited (a zombie waiting to be reaped
/// has exited).
pub fn running(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(argv: &[&str]) {
        let ok = std::process::Command::new(argv[0])
            .args(&argv[1..])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "{argv:?}");
    }

    /// A kept demo (a namespace with a process in it, pin and temp folders)
    /// is removed whole; another run's namespace and folder are not touched.
    /// Removes what the test made, also when it fails.
    struct Cleanup(Vec<String>, PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            for ns in &self.0 {
                let _ = std::process::Command::new("ip")
                    .args(["netns", "delete", ns])
                    .status();
            }
            let _ = std::fs::remove_dir_all(&self.1);
        }
    }

    #[test]
    #[ignore = "needs root: creates namespaces"]
    fn stop_removes_the_kept_demo_and_nothing_else() {
        // A pid no live process has (above the kernel's pid_max default).
        let pid = 4_200_000 + std::process::id() % 100_000;
        let ours = format!("eg{pid}xfab");
        let other = format!("eg{}xfab", pid + 1);
        let dir = std::env::temp_dir().join(format!("stoptest{pid}"));
        let _cleanup = Cleanup(vec![ours.clone(), other.clone()], dir.clone());
        for ns in [&ours, &other] {
            run(&["ip", "netns", "add", ns]);
        }
        let mut sleeper = std::process::Command::new("ip")
            .args(["netns", "exec", &ours, "sleep", "300"])
            .spawn()
            .unwrap();
        std::fs::create_dir_all(dir.join(format!("eg{pid}xpin0"))).unwrap();
        std::fs::create_dir_all(dir.join(format!("egress-etcd-{pid}-0"))).unwrap();
        std::fs::create_dir_all(dir.join(format!("eg{}xpin0", pid + 1))).unwrap();
        // The sleeper is in the namespace once `ip netns pids` lists it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while pids_in(&ours).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let kept = Kept {
            pid,
            namespaces: vec![ours.clone()],
        };
        let removed = remove(&kept, &[&dir]).unwrap();
        let status = sleeper.wait().unwrap();
        assert!(!status.success(), "the kept process was stopped");
        assert!(!Path::new("/run/netns").join(&ours).exists());
        assert!(
            Path::new("/run/netns").join(&other).exists(),
            "another run's namespace stays"
        );
        assert!(
            dir.join(format!("eg{}xpin0", pid + 1)).exists(),
            "another run's folder stays"
        );
        assert!(!dir.join(format!("eg{pid}xpin0")).exists());
        assert!(!dir.join(format!("egress-etcd-{pid}-0")).exists());
        assert_eq!(removed.len(), 4, "{removed:?}");
    }
}

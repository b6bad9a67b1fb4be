//! TC programs attached through pinned TCX links, so that they stay attached
//! while the agent restarts (traffic does not stop), and so that a new agent
//! swaps in its own program atomically (BPF_LINK_UPDATE) instead of
//! detaching and re-attaching.
//!
//! Pins live at `<pin_dir>/links/<program>@<ifindex>`: the ifindex, not the
//! name, because a pod veth's name is reused by the next pod while its
//! ifindex is not.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use aya::programs::{
    links::{FdLink, PinnedLink},
    tc::{SchedClassifierLink, TcAttachOptions, TcAttachType},
    LinkOrder, SchedClassifier,
};

use super::Datapath;

/// Whether an attach made a new link or took over one a previous agent left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    New,
    TakenOver,
}

/// Pin path of `program`'s link on the interface with `ifindex`.
pub fn link_pin_path(pin_dir: &Path, program: &str, ifindex: u32) -> PathBuf {
    pin_dir.join("links").join(format!("{program}@{ifindex}"))
}

/// Attaches `program` (TC ingress) to `iface`, or, when a previous agent left
/// a pinned link there, points that link at this agent's program.
pub fn attach_ingress(
    dp: &mut Datapath,
    program: &str,
    iface: &str,
    ifindex: u32,
) -> Result<Attached> {
    let path = link_pin_path(&dp.pin_dir, program, ifindex);
    std::fs::create_dir_all(path.parent().unwrap())
        .with_context(|| format!("creating {}", path.display()))?;
    let prog = load(dp, program)?;
    match PinnedLink::from_pin(&path) {
        Ok(old) => {
            let link: SchedClassifierLink = FdLink::from(old).try_into()?;
            let id = prog
                .attach_to_link(link)
                .with_context(|| format!("updating the link of {program} on {iface}"))?;
            // The pin keeps the link; our handle to it can go.
            drop(prog.take_link(id)?);
            Ok(Attached::TakenOver)
        }
        Err(_) => {
            let id = prog
                .attach_with_options(
                    iface,
                    TcAttachType::Ingress,
                    TcAttachOptions::TcxOrder(LinkOrder::default()),
                )
                .with_context(|| format!("attaching {program} to {iface}"))?;
            let link: FdLink = prog.take_link(id)?.try_into()?;
            link.pin(&path)
                .with_context(|| format!("pinning the link at {}", path.display()))?;
            Ok(Attached::New)
        }
    }
}

/// Loads `program` into the kernel once (the verifier's pass takes up to
/// seconds on a busy node). The agent loads every program at start, so that
/// attaching one to a new pod's veth inside its loop never blocks the
/// heartbeat for that time.
pub fn load<'a>(dp: &'a mut Datapath, program: &str) -> Result<&'a mut SchedClassifier> {
    let prog: &mut SchedClassifier = dp
        .ebpf
        .program_mut(program)
        .with_context(|| format!("program {program} is not in the eBPF object"))?
        .try_into()?;
    if prog.fd().is_err() {
        prog.load().with_context(|| format!("loading {program}"))?;
    }
    Ok(prog)
}

/// Removes the pins of every link on a vanished interface (the kernel already
/// detached them; the pins would only leak).
pub fn forget_interface(pin_dir: &Path, ifindex: u32) {
    let suffix = format!("@{ifindex}");
    if let Ok(entries) = std::fs::read_dir(pin_dir.join("links")) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().ends_with(&suffix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_are_keyed_by_ifindex() {
        let p = link_pin_path(Path::new("/sys/fs/bpf/egress"), "worker_egress", 42);
        assert_eq!(p, Path::new("/sys/fs/bpf/egress/links/worker_egress@42"));
    }
}

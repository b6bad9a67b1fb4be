//! Loads the embedded object with every map pinned under one folder.

use std::path::{Path, PathBuf};

use aya::{
    programs::{tc::TcAttachType, ProgramError, SchedClassifier},
    Ebpf, EbpfError, EbpfLoader,
};
use egress_common::maps::PINNED_MAPS;

use super::bpffs;

/// Why the datapath could not be loaded, in words an operator can act on.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("this process lacks {} (needed to load BPF programs and maps, attach them and announce EIPs; docs/deploy.md says what each is for): run the agent as root, or grant these capabilities (the chart grants them, or agent.privileged)", missing.join(", "))]
    MissingCapabilities { missing: Vec<&'static str> },
    #[error("bpf() is refused (errno {errno}) although this process holds the capabilities it needs: the container runtime's seccomp profile lets bpf() through only with CAP_SYS_ADMIN (containers-common's default, which CRI-O and podman use), or an LSM denies it. Set the chart's agent.sysAdminForBpf=true, or give the agent a seccomp profile that allows bpf() (agent.seccompProfile); docs/deploy.md, \"Security settings of the pods\"")]
    BpfRefused { errno: i32 },
    #[error("pin folder {path}: {source}")]
    PinDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("loading the eBPF object failed: {hint} ({source})")]
    Load {
        hint: &'static str,
        source: EbpfError,
    },
    #[error("program {program} not found in the eBPF object (was it built by `cargo xtask build-ebpf` from this tree?)")]
    NoProgram { program: String },
    #[error("program {program}: {hint} ({source})")]
    Program {
        program: String,
        hint: &'static str,
        source: ProgramError,
    },
}

/// Turns the errno behind a failed bpf() call into the missing capability or feature.
fn hint_for_errno(errno: Option<i32>) -> &'static str {
    match errno {
        Some(libc::EPERM) | Some(libc::EACCES) => {
            "permission denied: the process needs CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON or CAP_SYS_ADMIN (run as root, or with the chart's capabilities)"
        }
        Some(libc::ENOSYS) => "this kernel has no bpf() system call (CONFIG_BPF_SYSCALL is off)",
        Some(libc::EINVAL) => "the kernel rejected the object: it needs BTF and TCX (Linux 6.6 or newer)",
        Some(libc::ENOMEM) => "the kernel is out of memory for BPF maps (check RLIMIT_MEMLOCK / memory cgroup)",
        Some(libc::ENODEV) => "no such interface",
        Some(libc::EEXIST) => "a program is already attached there",
        _ => "see the cause",
    }
}

fn errno_in(err: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if let Some(code) = io.raw_os_error() {
                return Some(code);
            }
        }
        cur = e.source();
    }
    None
}

/// Whether a pinned map's shape no longer fits the object.
type Incompatible = fn(&aya::maps::MapInfo) -> bool;

/// The pinned maps an older object may have defined with another shape,
/// and how to tell. A pinned map is reused by name as it is, so one of an
/// old shape would be misread; these are replaced instead. What that
/// costs: `DROPS` and `POLICY_STATS` lose their counters (`POLICY_STATS`
/// was a per-CPU hash keyed by policy id before it became an array of
/// counter slots); `CONFIG` and
/// the policy maps (`POLICY_SRC`, `POLICY_DST`, `POLICY_TARGETS`, whose
/// slot sets grew from 64 to 1024 slots) and `PORT_BLOCKS` (from 16 to
/// 1024 blocks per EIP) start empty and are written whole by the agent's
/// first apply.
fn shape_checks() -> [(&'static str, Incompatible); 7] {
    use core::mem::size_of;
    use egress_common::{config::DatapathConfig, maps, policy};
    [
        (maps::DROPS, |i| {
            (i.max_entries() as usize) < egress_common::drops::DROP_REASONS
        }),
        (maps::CONFIG, |i| {
            i.value_size() as usize != size_of::<DatapathConfig>()
        }),
        (maps::POLICY_SRC, |i| {
            i.value_size() as usize != size_of::<policy::SrcMatch>()
        }),
        (maps::POLICY_DST, |i| {
            i.value_size() as usize != size_of::<policy::DstMatch>()
        }),
        (maps::POLICY_TARGETS, |i| {
            (i.max_entries() as usize) < policy::MAX_POLICY_SLOTS
        }),
        // Once a per-CPU hash keyed by policy id, now an array by slot.
        (maps::POLICY_STATS, |i| {
            i.max_entries() < maps::POLICY_STATS_SIZE
                || !matches!(i.map_type(), Ok(aya::maps::MapType::PerCpuArray))
        }),
        (maps::PORT_BLOCKS, |i| {
            i.value_size() as usize != size_of::<egress_common::ports::PortBlocks>()
        }),
    ]
}

/// Unpins every map of [`shape_checks`] whose pin has an old shape, so
/// that the load creates it anew; returns their names.
fn replace_incompatible_pins(pin_dir: &Path) -> Vec<&'static str> {
    let mut replaced = Vec::new();
    for (name, incompatible) in shape_checks() {
        let path = pin_dir.join(name);
        let Ok(data) = aya::maps::MapData::from_pin(&path) else {
            continue;
        };
        let replace = data.info().map(|i| incompatible(&i)).unwrap_or(false);
        drop(data);
        if replace {
            tracing::info!(path = %path.display(), "map pinned by an older datapath has another shape; replacing it");
            let _ = std::fs::remove_file(&path);
            replaced.push(name);
        }
    }
    replaced
}

/// Map sizes the operator chooses at load time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Entries of each NAT table (`NAT_FWD`, `NAT_REV`): one per flow.
    pub nat_entries: u32,
}

impl Default for MapSizes {
    fn default() -> Self {
        Self {
            nat_entries: egress_common::maps::NAT_TABLE_SIZE,
        }
    }
}

/// Smallest and largest NAT table the agent accepts (`--nat-table-size`).
pub const NAT_TABLE_MIN: u32 = 1024;
pub const NAT_TABLE_MAX: u32 = 1 << 24;

/// The entries a pinned map was created with, if it is pinned.
pub fn pinned_capacity(pin_dir: &Path, map: &str) -> Option<u32> {
    let data = aya::maps::MapData::from_pin(pin_dir.join(map)).ok()?;
    data.info().ok().map(|i| i.max_entries())
}

/// A NAT table pinned with another size is kept as it is: replacing it
/// would drop every connection of the node. The new size applies once the
/// pins are gone (a reboot, or the pin files removed on a drained node).
fn warn_on_pinned_nat_size(pin_dir: &Path, want: u32) {
    for map in [egress_common::maps::NAT_FWD, egress_common::maps::NAT_REV] {
        match pinned_capacity(pin_dir, map) {
            Some(have) if have != want => tracing::warn!(
                map,
                pinned_entries = have,
                requested_entries = want,
                "NAT table pinned with another size is kept (replacing it would break every connection); \
                 the requested size applies once its pin is removed"
            ),
            _ => {}
        }
    }
}

/// The loaded object and where its maps are pinned.
pub struct Datapath {
    pub ebpf: Ebpf,
    pub pin_dir: PathBuf,
    /// Pinned maps of an old shape that this load replaced by empty ones.
    pub replaced: Vec<&'static str>,
}

impl Datapath {
    /// Whether the policy maps started empty (replaced after an upgrade):
    /// until the first apply fills them, the program would match no
    /// policy, so pod veths keep their old program until then.
    pub fn policy_maps_replaced(&self) -> bool {
        use egress_common::maps::{POLICY_DST, POLICY_SRC, POLICY_TARGETS};
        self.replaced
            .iter()
            .any(|m| [POLICY_SRC, POLICY_DST, POLICY_TARGETS].contains(m))
    }

    /// Loads `object`, reusing maps already pinned in `pin_dir` (so a restart
    /// keeps the state the programs use) and pinning the others there.
    pub fn load(object: &[u8], pin_dir: &Path) -> Result<Self, LoadError> {
        Self::load_with(object, pin_dir, MapSizes::default())
    }

    /// [`Datapath::load`] with the maps that are created sized by `sizes`.
    pub fn load_with(object: &[u8], pin_dir: &Path, sizes: MapSizes) -> Result<Self, LoadError> {
        let missing = super::caps::missing();
        if !missing.is_empty() {
            return Err(LoadError::MissingCapabilities { missing });
        }
        // Only a refusal is told apart here; any other failure of the probe
        // (memory, an old kernel) is left to the loader's own hint.
        if let Err(errno @ (libc::EPERM | libc::EACCES)) = super::caps::bpf_syscall_allowed() {
            return Err(LoadError::BpfRefused { errno });
        }
        bpffs::ensure_pin_dir(pin_dir).map_err(|source| LoadError::PinDir {
            path: pin_dir.to_owned(),
            source,
        })?;
        let replaced = replace_incompatible_pins(pin_dir);
        warn_on_pinned_nat_size(pin_dir, sizes.nat_entries);
        let paths: Vec<(&str, PathBuf)> =
            PINNED_MAPS.iter().map(|m| (*m, pin_dir.join(m))).collect();
        let mut loader = EbpfLoader::new();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        loader
            .map_max_entries(egress_common::maps::NAT_FWD, sizes.nat_entries)
            .map_max_entries(egress_common::maps::NAT_REV, sizes.nat_entries);
        let ebpf = loader.load(object).map_err(|source| LoadError::Load {
            hint: hint_for_errno(errno_in(&source)),
            source,
        })?;
        Ok(Self {
            ebpf,
            pin_dir: pin_dir.to_owned(),
            replaced,
        })
    }

    /// Loads the TC program `program` (once) and attaches it to `iface`.
    pub fn attach_tc(
        &mut self,
        program: &str,
        iface: &str,
        direction: TcAttachType,
    ) -> Result<(), LoadError> {
        let wrap = |source: ProgramError| LoadError::Program {
            program: program.to_owned(),
            hint: hint_for_errno(errno_in(&source)),
            source,
        };
        let prog: &mut SchedClassifier = self
            .ebpf
            .program_mut(program)
            .ok_or_else(|| LoadError::NoProgram {
                program: program.to_owned(),
            })?
            .try_into()
            .map_err(wrap)?;
        if prog.fd().is_err() {
            prog.load().map_err(wrap)?;
        }
        prog.attach(iface, direction).map_err(wrap)?;
        Ok(())
    }

    /// Worker: the SNAT program on a pod's host-side veth (packets from the pod).
    pub fn attach_pod_veth(&mut self, iface: &str) -> Result<(), LoadError> {
        self.attach_tc(
            egress_common::maps::PROG_WORKER_EGRESS,
            iface,
            TcAttachType::Ingress,
        )
    }

    /// Every node: the tunnel receive program on the VXLAN device
    /// (gateway forward and worker reply).
    pub fn attach_vxlan(&mut self, iface: &str) -> Result<(), LoadError> {
        self.attach_tc(
            egress_common::maps::PROG_TUNNEL_INGRESS,
            iface,
            TcAttachType::Ingress,
        )
    }

    /// Gateway: ARP/NDP for owned EIPs and reply steering on the uplink.
    pub fn attach_uplink(&mut self, iface: &str) -> Result<(), LoadError> {
        self.attach_tc(
            egress_common::maps::PROG_UPLINK_INGRESS,
            iface,
            TcAttachType::Ingress,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_errors_name_the_capabilities() {
        let h = hint_for_errno(Some(libc::EPERM));
        assert!(h.contains("CAP_BPF") && h.contains("CAP_NET_ADMIN"), "{h}");
    }

    #[test]
    fn errno_is_found_through_the_error_chain() {
        let io = std::io::Error::from_raw_os_error(libc::EPERM);
        let wrapped = ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_prog_load",
            io_error: io,
        });
        assert_eq!(errno_in(&wrapped), Some(libc::EPERM));
    }
}

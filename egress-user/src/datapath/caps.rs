//! Which of the capabilities the datapath needs this process lacks, and
//! whether bpf() itself is let through.
//!
//! Checked before the loader's first bpf() call so the operator reads
//! "lacks CAP_BPF" or "the seccomp profile refuses bpf()" instead of a bare
//! EPERM from somewhere inside the loader.

const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// One need, met by any of its capabilities; the first is the one to grant.
struct Need {
    any_of: &'static [u32],
    name: &'static str,
}

/// The capabilities the agent needs on Linux 5.8+ (docs/deploy.md,
/// "Security settings of the pods", says what fails without each):
/// creating maps (BPF); loading TC programs, attaching them, the VXLAN
/// device, routes (NET_ADMIN); the verifier's pointer arithmetic, allowed
/// to a "perfmon-capable" loader only (PERFMON, or SYS_ADMIN, which implies
/// it); the gratuitous ARP / unsolicited NA of a takeover from a packet
/// socket (NET_RAW: without it a takeover only logs a warning, and upstream
/// routers keep sending to the old gateway until their neighbour entry
/// expires, so the agent refuses to start instead).
const NEEDED: &[Need] = &[
    Need {
        any_of: &[CAP_BPF],
        name: "CAP_BPF",
    },
    Need {
        any_of: &[CAP_NET_ADMIN],
        name: "CAP_NET_ADMIN",
    },
    Need {
        any_of: &[CAP_PERFMON, CAP_SYS_ADMIN],
        name: "CAP_PERFMON (or CAP_SYS_ADMIN)",
    },
    Need {
        any_of: &[CAP_NET_RAW],
        name: "CAP_NET_RAW",
    },
];

/// Parses the hex `CapEff:` line of /proc/<pid>/status.
pub fn effective_from_status(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
}

/// Names of the needs the `effective` set does not meet.
pub fn missing_from(effective: u64) -> Vec<&'static str> {
    NEEDED
        .iter()
        .filter(|need| need.any_of.iter().all(|bit| effective & (1u64 << bit) == 0))
        .map(|need| need.name)
        .collect()
}

/// Names of the needed capabilities this process lacks (empty when it has them all
/// or when /proc cannot tell, in which case the kernel's own answer decides).
pub fn missing() -> Vec<&'static str> {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| effective_from_status(&s))
        .map(missing_from)
        .unwrap_or_default()
}

/// Whether bpf() is let through, tried with the smallest call that needs
/// only CAP_BPF: creating (and closing) a one-entry array map. `Err` holds
/// the errno when it is refused. A seccomp filter answers before any
/// capability check, so an EPERM here, from a process that holds CAP_BPF,
/// is the container runtime's profile (containers-common's, which CRI-O and
/// podman use, lets bpf() through only with CAP_SYS_ADMIN) or an LSM.
pub fn bpf_syscall_allowed() -> Result<(), i32> {
    // union bpf_attr for BPF_MAP_CREATE: map_type, key_size, value_size,
    // max_entries, then fields left zero.
    const BPF_MAP_TYPE_ARRAY: u32 = 2;
    let mut attr = [0u32; 18];
    attr[..4].copy_from_slice(&[BPF_MAP_TYPE_ARRAY, 4, 4, 1]);
    // SAFETY: attr outlives the call and its size is passed with it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            0, // BPF_MAP_CREATE
            attr.as_mut_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: fd is the map just created and owned by nobody else.
    unsafe { libc::close(fd as i32) };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_root_set_lacks_nothing() {
        assert!(missing_from(0x000001ffffffffff).is_empty());
    }

    #[test]
    fn empty_set_lacks_all_four() {
        assert_eq!(
            missing_from(0),
            vec![
                "CAP_BPF",
                "CAP_NET_ADMIN",
                "CAP_PERFMON (or CAP_SYS_ADMIN)",
                "CAP_NET_RAW"
            ]
        );
    }

    #[test]
    fn sys_admin_stands_in_for_perfmon() {
        let base = (1 << CAP_BPF) | (1 << CAP_NET_ADMIN) | (1 << CAP_NET_RAW);
        assert!(missing_from(base | (1 << CAP_PERFMON)).is_empty());
        assert!(missing_from(base | (1 << CAP_SYS_ADMIN)).is_empty());
        assert_eq!(missing_from(base), vec!["CAP_PERFMON (or CAP_SYS_ADMIN)"]);
    }

    #[test]
    fn status_line_is_parsed() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000001000\n";
        assert_eq!(effective_from_status(status), Some(1 << 12));
        assert_eq!(
            missing_from(1 << 12),
            vec!["CAP_BPF", "CAP_PERFMON (or CAP_SYS_ADMIN)", "CAP_NET_RAW"]
        );
    }
}

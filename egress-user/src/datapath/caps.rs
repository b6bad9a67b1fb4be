//! Which of the capabilities the datapath needs this process lacks.
//!
//! Checked before any bpf() call so the operator reads "missing CAP_BPF"
//! instead of a bare EPERM from somewhere inside the loader.

const CAP_NET_ADMIN: u32 = 12;
const CAP_NET_RAW: u32 = 13;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_BPF: u32 = 39;

/// The capabilities the agent needs (docs/deploy.md, "Security settings of
/// the pods", says what fails without each): creating maps (BPF); loading
/// TC programs, attaching them, the VXLAN device, routes (NET_ADMIN); the
/// verifier's pointer arithmetic and the container runtimes' default
/// seccomp profiles that allow bpf() only with it (SYS_ADMIN); the
/// gratuitous ARP / unsolicited NA of a takeover from a packet socket
/// (NET_RAW: without it a takeover only logs a warning, and upstream
/// routers keep sending to the old gateway until their neighbour entry
/// expires, so the agent refuses to start instead).
const NEEDED: &[(u32, &str)] = &[
    (CAP_BPF, "CAP_BPF"),
    (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
    (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
    (CAP_NET_RAW, "CAP_NET_RAW"),
];

/// Parses the hex `CapEff:` line of /proc/<pid>/status.
pub fn effective_from_status(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
}

/// Names of the needed capabilities missing from the `effective` set.
pub fn missing_from(effective: u64) -> Vec<&'static str> {
    NEEDED
        .iter()
        .filter(|(bit, _)| effective & (1u64 << bit) == 0)
        .map(|(_, name)| *name)
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
            vec!["CAP_BPF", "CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_NET_RAW"]
        );
    }

    #[test]
    fn status_line_is_parsed() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000001000\n";
        assert_eq!(effective_from_status(status), Some(1 << 12));
        assert_eq!(
            missing_from(1 << 12),
            vec!["CAP_BPF", "CAP_SYS_ADMIN", "CAP_NET_RAW"]
        );
    }
}

//! Names of the maps in the eBPF object.
//!
//! Userspace pins every map under one bpffs folder, by these names, so that
//! an agent restart reuses the maps (and the traffic they steer) instead of
//! creating empty ones.

/// Default bpffs folder for the pinned maps and links of one node.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/egress";

/// Per-CPU packet/byte counter of the `tc_count` probe program.
pub const IFACE_STATS: &str = "IFACE_STATS";

/// Every map userspace pins, in the order it creates them.
pub const PINNED_MAPS: &[&str] = &[IFACE_STATS];

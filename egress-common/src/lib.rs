//! Types and pure helpers shared by the eBPF programs and userspace.
//!
//! Every map key and value is `#[repr(C)]` with explicit padding so the
//! kernel, the programs and userspace agree on the layout byte for byte, and
//! so `bpftool map dump` prints named fields from the BTF.
#![no_std]

pub mod counters;
pub mod maps;

pub use counters::TrafficCounter;

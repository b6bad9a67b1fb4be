//! Types and pure helpers shared by the eBPF programs and userspace.
//!
//! Every map key and value is `#[repr(C)]` with explicit padding so the
//! kernel, the programs and userspace agree on the layout byte for byte, and
//! so `bpftool map dump` prints named fields from the BTF.
#![no_std]

pub mod addr;
pub mod config;
pub mod counters;
pub mod drops;
pub mod endpoints;
pub mod maps;
pub mod nat;
pub mod pod_link;
pub mod policy;
pub mod ports;
pub mod route;
pub mod steering;

pub use counters::TrafficCounter;

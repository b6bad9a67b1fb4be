//! The kernel edge: loading the eBPF object, pinning its maps, attaching
//! programs, reading maps. Decisions about what the maps should hold live
//! elsewhere; this module only carries them out.

pub mod bpffs;
pub mod caps;
pub mod loader;
pub mod stats;

pub use loader::{Datapath, LoadError};

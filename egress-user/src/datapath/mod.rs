//! The kernel edge: loading the eBPF object, pinning its maps, attaching
//! programs, reading maps. Decisions about what the maps should hold live
//! elsewhere; this module only carries them out.
//!
//! The control plane builds a [`DesiredMaps`] (plain `std::net` data) and
//! calls [`apply`]; the translation to BPF keys and values is the pure
//! function [`translate::translate`].

pub mod announce;
pub mod apply;
pub mod bpffs;
pub mod capacity;
pub mod caps;
pub mod desired;
pub mod lease;
pub mod links;
pub mod loader;
pub mod stats;
mod stats_endpoints;
pub mod translate;
pub mod uplink_xdp;

pub use apply::{apply, apply_with, ApplyError, ApplyReport, MapShadow, MapSource, PinnedMaps};
pub use desired::{
    kernel_tick, Cidr, DesiredMaps, EipRoute, NodeConfig, OwnedEip, PolicyRule, PortBlockGrant,
    ReplySteering,
};
pub use loader::{Datapath, LoadError, MapSizes};

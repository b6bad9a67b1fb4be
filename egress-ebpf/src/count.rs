//! `tc_count`: counts every packet and byte that crosses an interface.
//!
//! The smallest real program: it proves the chain build -> embed -> load ->
//! attach -> read a pinned, BTF-typed map, and it lets an operator see that
//! traffic reaches an interface at all.

use aya_ebpf::{
    bindings::TC_ACT_OK,
    btf_maps::PerCpuArray,
    macros::{btf_map, classifier},
    programs::TcContext,
};
use egress_common::TrafficCounter;

#[btf_map]
static IFACE_STATS: PerCpuArray<TrafficCounter, 1> = PerCpuArray::new();

#[classifier]
pub fn tc_count(ctx: TcContext) -> i32 {
    if let Some(slot) = IFACE_STATS.get_ptr_mut(0) {
        // SAFETY: the slot belongs to this CPU and lives as long as the map.
        unsafe {
            (*slot).packets += 1;
            (*slot).bytes += u64::from(ctx.len());
        }
    }
    TC_ACT_OK
}

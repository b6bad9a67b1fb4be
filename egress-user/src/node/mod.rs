//! The node's network devices, seen and changed through netlink: the VXLAN
//! device the tunnel uses, and the pod veths the worker program attaches to.
//! What should exist is decided by pure functions; the netlink calls only
//! carry the decision out.

pub mod link;
pub mod route;
pub mod vxlan;
pub mod watch;

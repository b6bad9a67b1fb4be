//! Control plane of the egress gateway (issue 4).
//!
//! - [`api`]: the custom resources and the plain node/pod records.
//! - [`validate`]: checks with errors that name the field and the reason.
//! - [`datastore`]: one trait, backends for memory, etcd and Kubernetes.
//! - [`view`]: the decoded cluster every reconciler reads.
//! - [`controller`]: pure reconcile functions and the leader-elected loop.
//! - [`agent_state`]: a node's desired dataplane, as a pure function.
//! - [`registration`]: the records an agent keeps about its own node.

pub mod agent_state;
pub mod api;
pub mod controller;
pub mod datastore;
pub mod manifest;
pub mod registration;
pub mod validate;
pub mod view;

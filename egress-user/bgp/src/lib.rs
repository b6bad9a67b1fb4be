//! BGP speaker and route reflector for the egress gateway.
//!
//! Everything except [`speaker`] is a pure state machine without I/O:
//! [`codec`] (wire format), [`fsm`] (RFC 4271 session), [`rib`] (decision
//! process), [`reflect`] (RFC 4456) and [`gr`] (RFC 4724 graceful restart).

pub mod codec;
pub mod fsm;
pub mod gr;
pub mod reflect;
pub mod rib;
pub mod speaker;
pub mod types;

pub use types::{AsPath, Family, Origin, Prefix};

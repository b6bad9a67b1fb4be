//! Helpers every metrics page (agent, controller, reflector) shares.

use prometheus_client::{metrics::gauge::Gauge, registry::Registry};

/// A gauge holding `v`, registered as `name`.
pub(crate) fn register_gauge(reg: &mut Registry, name: &str, help: &str, v: i64) {
    let g = Gauge::<i64>::default();
    g.set(v);
    reg.register(name, help, g);
}

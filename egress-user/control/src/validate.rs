//! Checks on API objects, with errors that name the field and the reason.
//!
//! The same functions run in `egress apply --dry-run`, in `egress apply`
//! before anything is written, and in the controller (an object that fails
//! gets a status condition and an event; nothing else is affected).

use std::net::IpAddr;

use ipnet::IpNet;

use crate::api::{
    EgressClusterPolicySpec, EgressGateway, EgressGatewaySpec, EgressPolicySpec, GatewayMode,
    LabelSelector,
};

/// One problem: the field's path and why it is wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

fn err(field: impl Into<String>, reason: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        reason: reason.into(),
    }
}

/// Every problem of one object.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {name} is invalid: {}", .errors.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
pub struct ValidationError {
    pub kind: String,
    pub name: String,
    pub errors: Vec<FieldError>,
}

/// An address pool: sorted, merged inclusive ranges of one family.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IpPool {
    pub v6: bool,
    ranges: Vec<(u128, u128)>,
}

impl IpPool {
    /// Parses pool entries (`a.b.c.d`, `a.b.c.d-e.f.g.h`, `a.b.c.d/n`).
    pub fn parse(entries: &[String], v6: bool, field: &str) -> Result<Self, Vec<FieldError>> {
        let mut errors = Vec::new();
        let mut ranges = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            let f = format!("{field}[{i}]");
            match parse_range(e.trim(), v6) {
                Ok(r) => ranges.push(r),
                Err(reason) => errors.push(err(f, reason)),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        ranges.sort();
        let mut merged: Vec<(u128, u128)> = Vec::new();
        for (a, b) in ranges {
            match merged.last_mut() {
                Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
                _ => merged.push((a, b)),
            }
        }
        Ok(Self { v6, ranges: merged })
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        if ip.is_ipv6() != self.v6 {
            return false;
        }
        let n = ip_to_u128(ip);
        self.ranges.iter().any(|&(a, b)| a <= n && n <= b)
    }

    /// Number of addresses (saturating).
    pub fn len(&self) -> u64 {
        self.ranges
            .iter()
            .map(|&(a, b)| u64::try_from(b - a).unwrap_or(u64::MAX).saturating_add(1))
            .fold(0u64, u64::saturating_add)
    }

    /// The `i`-th address of the pool.
    pub fn nth(&self, mut i: u128) -> Option<IpAddr> {
        for &(a, b) in &self.ranges {
            let n = b - a + 1;
            if i < n {
                return Some(u128_to_ip(a + i, self.v6));
            }
            i -= n;
        }
        None
    }

    /// Index of `ip` in the pool.
    pub fn index_of(&self, ip: IpAddr) -> Option<u128> {
        let n = ip_to_u128(ip);
        let mut base = 0u128;
        for &(a, b) in &self.ranges {
            if a <= n && n <= b {
                return Some(base + (n - a));
            }
            base += b - a + 1;
        }
        None
    }

    /// First address of another pool that is also in this one.
    pub fn overlap(&self, other: &IpPool) -> Option<IpAddr> {
        if self.v6 != other.v6 {
            return None;
        }
        for &(a, b) in &self.ranges {
            for &(c, d) in &other.ranges {
                let lo = a.max(c);
                if lo <= b.min(d) {
                    return Some(u128_to_ip(lo, self.v6));
                }
            }
        }
        None
    }
}

fn parse_range(s: &str, v6: bool) -> Result<(u128, u128), String> {
    let fam = if v6 { "IPv6" } else { "IPv4" };
    let one = |t: &str| -> Result<u128, String> {
        let ip: IpAddr = t
            .trim()
            .parse()
            .map_err(|_| format!("{t:?} is not an IP address, a range a-b or a CIDR"))?;
        if ip.is_ipv6() != v6 {
            return Err(format!("{t:?} is not an {fam} address"));
        }
        Ok(ip_to_u128(ip))
    };
    if let Some((a, b)) = s.split_once('-') {
        let (a, b) = (one(a)?, one(b)?);
        if a > b {
            return Err(format!("{s:?}: the range ends before it starts"));
        }
        Ok((a, b))
    } else if s.contains('/') {
        let net: IpNet = s
            .parse()
            .map_err(|_| format!("{s:?} is not a valid CIDR"))?;
        if net.addr().is_ipv6() != v6 {
            return Err(format!("{s:?} is not an {fam} CIDR"));
        }
        let net = net.trunc();
        Ok((ip_to_u128(net.network()), ip_to_u128(net.broadcast())))
    } else {
        let n = one(s)?;
        Ok((n, n))
    }
}

pub fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn u128_to_ip(n: u128, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(n.into())
    } else {
        IpAddr::V4((n as u32).into())
    }
}

/// Parses a CIDR (a bare address counts as /32 or /128).
pub fn parse_cidr(s: &str) -> Result<IpNet, String> {
    if let Ok(n) = s.parse::<IpNet>() {
        return Ok(n.trunc());
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(IpNet::from(ip));
    }
    Err(format!("{s:?} is not a valid CIDR"))
}

fn check_cidrs(list: &[String], field: &str, out: &mut Vec<FieldError>) {
    for (i, s) in list.iter().enumerate() {
        if let Err(r) = parse_cidr(s) {
            out.push(err(format!("{field}[{i}]"), r));
        }
    }
}

fn check_selector(sel: &LabelSelector, field: &str, out: &mut Vec<FieldError>) {
    for (i, e) in sel.match_expressions.iter().enumerate() {
        let f = format!("{field}.matchExpressions[{i}]");
        match e.operator.as_str() {
            "In" | "NotIn" if e.values.is_empty() => out.push(err(
                format!("{f}.values"),
                format!("operator {} needs values", e.operator),
            )),
            "Exists" | "DoesNotExist" if !e.values.is_empty() => out.push(err(
                format!("{f}.values"),
                format!("operator {} takes no values", e.operator),
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            o => out.push(err(
                format!("{f}.operator"),
                format!("{o:?} is not one of In, NotIn, Exists, DoesNotExist"),
            )),
        }
    }
}

/// The parsed pools of a gateway.
pub fn gateway_pools(spec: &EgressGatewaySpec) -> Result<(IpPool, IpPool), Vec<FieldError>> {
    let v4 = IpPool::parse(&spec.ippools.ipv4, false, "spec.ippools.ipv4");
    let v6 = IpPool::parse(&spec.ippools.ipv6, true, "spec.ippools.ipv6");
    match (v4, v6) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        (a, b) => Err([a.err(), b.err()].into_iter().flatten().flatten().collect()),
    }
}

/// Checks a gateway on its own.
pub fn gateway(spec: &EgressGatewaySpec) -> Vec<FieldError> {
    let mut out = Vec::new();
    check_selector(
        &spec.node_selector.selector,
        "spec.nodeSelector.selector",
        &mut out,
    );
    let pools = match gateway_pools(spec) {
        Ok(p) => p,
        Err(e) => {
            out.extend(e);
            return out;
        }
    };
    for (field, value, pool) in [
        (
            "spec.ippools.ipv4DefaultEIP",
            &spec.ippools.ipv4_default_eip,
            &pools.0,
        ),
        (
            "spec.ippools.ipv6DefaultEIP",
            &spec.ippools.ipv6_default_eip,
            &pools.1,
        ),
    ] {
        if value.is_empty() {
            continue;
        }
        match value.parse::<IpAddr>() {
            Err(_) => out.push(err(field, format!("{value:?} is not an IP address"))),
            Ok(ip) if ip.is_ipv6() != pool.v6 => out.push(err(
                field,
                format!(
                    "{value} is not an {} address",
                    if pool.v6 { "IPv6" } else { "IPv4" }
                ),
            )),
            Ok(ip) if !pool.contains(ip) => out.push(err(
                field,
                format!(
                    "{value} is outside the gateway's {} pool",
                    if pool.v6 { "ipv6" } else { "ipv4" }
                ),
            )),
            Ok(_) => {}
        }
    }
    out
}

/// Checks `spec.mode` against how EIPs are announced: in L2 mode every
/// node holding an EIP answers ARP/NDP for it, so only one node may.
pub fn gateway_mode(spec: &EgressGatewaySpec, bgp: bool) -> Option<FieldError> {
    (spec.mode == GatewayMode::ActiveActive && !bgp).then(|| {
        err(
            "spec.mode",
            "ActiveActive needs BGP announcement of the EIPs (the controller runs with neither \
             --bgp=true nor --bgp-announcements=true, so EIPs are announced by ARP/NDP, where \
             only one node may answer for an address)",
        )
    })
}

/// The fields EgressPolicy and EgressClusterPolicy share, one shape for both.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyFields<'a> {
    pub gateway: &'a str,
    pub egress_ip: &'a crate::api::EgressIp,
    pub pod_selector: Option<&'a LabelSelector>,
    pub pod_subnet: &'a [String],
    pub namespace_selector: Option<&'a LabelSelector>,
    pub dest_subnet: &'a [String],
    pub excluded_subnet: &'a [String],
    pub max_ports_per_node: Option<u32>,
}

/// [`PolicyFields`] of a policy spec of either kind (the two spec types
/// name their shared fields alike), with the namespace selector given.
macro_rules! policy_fields {
    ($s:expr, $namespace_selector:expr) => {
        PolicyFields {
            gateway: &$s.egress_gateway_name,
            egress_ip: &$s.egress_ip,
            pod_selector: $s.applied_to.pod_selector.as_ref(),
            pod_subnet: &$s.applied_to.pod_subnet,
            namespace_selector: $namespace_selector,
            dest_subnet: &$s.dest_subnet,
            excluded_subnet: &$s.excluded_subnet,
            max_ports_per_node: $s.max_ports_per_node,
        }
    };
}

impl<'a> From<&'a EgressPolicySpec> for PolicyFields<'a> {
    fn from(s: &'a EgressPolicySpec) -> Self {
        policy_fields!(s, None)
    }
}

impl<'a> From<&'a EgressClusterPolicySpec> for PolicyFields<'a> {
    fn from(s: &'a EgressClusterPolicySpec) -> Self {
        policy_fields!(s, s.applied_to.namespace_selector.as_ref())
    }
}

/// Checks a policy; with its gateway when that exists (a missing gateway is
/// not an error here: the controller reports it as a condition).
pub fn policy(p: &PolicyFields<'_>, gateway: Option<&EgressGateway>) -> Vec<FieldError> {
    let mut out = Vec::new();
    if p.pod_selector.is_some() && !p.pod_subnet.is_empty() {
        out.push(err(
            "spec.appliedTo",
            "podSelector and podSubnet are both set; set only one",
        ));
    }
    if p.pod_selector.is_none() && p.pod_subnet.is_empty() {
        out.push(err(
            "spec.appliedTo",
            "neither podSelector nor podSubnet is set; set one",
        ));
    }
    if let Some(s) = p.pod_selector {
        check_selector(s, "spec.appliedTo.podSelector", &mut out);
    }
    if let Some(s) = p.namespace_selector {
        check_selector(s, "spec.appliedTo.namespaceSelector", &mut out);
    }
    check_cidrs(p.pod_subnet, "spec.appliedTo.podSubnet", &mut out);
    check_cidrs(p.dest_subnet, "spec.destSubnet", &mut out);
    check_cidrs(p.excluded_subnet, "spec.excludedSubnet", &mut out);
    if let Some(e) = check_max_ports(p.max_ports_per_node) {
        out.push(e);
    }
    let pools = gateway.and_then(|g| gateway_pools(&g.spec).ok());
    for (field, value, v6) in [
        ("spec.egressIP.ipv4", p.egress_ip.ipv4.as_str(), false),
        ("spec.egressIP.ipv6", p.egress_ip.ipv6.as_str(), true),
    ] {
        if value.is_empty() {
            continue;
        }
        if p.egress_ip.use_node_ip {
            out.push(err(field, "cannot be set together with useNodeIP"));
            continue;
        }
        let fam = if v6 { "IPv6" } else { "IPv4" };
        match value.parse::<IpAddr>() {
            Err(_) => out.push(err(field, format!("{value:?} is not an IP address"))),
            Ok(ip) if ip.is_ipv6() != v6 => {
                out.push(err(field, format!("{value} is not an {fam} address")))
            }
            Ok(ip) => {
                if let (Some((p4, p6)), Some(g)) = (&pools, gateway) {
                    let pool = if v6 { p6 } else { p4 };
                    if !pool.contains(ip) {
                        out.push(err(
                            field,
                            format!(
                                "{value} is outside the {} pool of gateway {}",
                                if v6 { "ipv6" } else { "ipv4" },
                                g.metadata.name.as_deref().unwrap_or_default()
                            ),
                        ));
                    }
                }
            }
        }
    }
    out
}

/// Changes that are refused once an object exists.
/// `spec.maxPortsPerNode`: at least one port, at most an EIP's 65,536.
fn check_max_ports(v: Option<u32>) -> Option<FieldError> {
    match v {
        Some(0) => Some(err(
            "spec.maxPortsPerNode",
            "0 ports would refuse every connection; leave it unset for the controller's limit, or set at least 1",
        )),
        Some(n) if n > 65536 => Some(err(
            "spec.maxPortsPerNode",
            format!("{n} is more ports than an EIP has (65536)"),
        )),
        _ => None,
    }
}

pub fn policy_update(old: &PolicyFields<'_>, new: &PolicyFields<'_>) -> Vec<FieldError> {
    let mut out = Vec::new();
    if old.gateway != new.gateway {
        out.push(err(
            "spec.egressGatewayName",
            format!(
                "cannot change once set (was {:?}); delete and recreate the policy",
                old.gateway
            ),
        ));
    }
    let (o, n) = (old.egress_ip, new.egress_ip);
    for (f, a, b) in [
        ("spec.egressIP.ipv4", &o.ipv4, &n.ipv4),
        ("spec.egressIP.ipv6", &o.ipv6, &n.ipv6),
    ] {
        if a != b {
            out.push(err(f, format!("cannot change once set (was {a:?})")));
        }
    }
    if o.use_node_ip != n.use_node_ip {
        out.push(err("spec.egressIP.useNodeIP", "cannot change once set"));
    }
    if o.allocator_policy != n.allocator_policy {
        out.push(err(
            "spec.egressIP.allocatorPolicy",
            "cannot change once set",
        ));
    }
    out
}

/// Changes refused on a gateway: the default EIPs are fixed once set.
pub fn gateway_update(old: &EgressGatewaySpec, new: &EgressGatewaySpec) -> Vec<FieldError> {
    let mut out = Vec::new();
    for (f, a, b) in [
        (
            "spec.ippools.ipv4DefaultEIP",
            &old.ippools.ipv4_default_eip,
            &new.ippools.ipv4_default_eip,
        ),
        (
            "spec.ippools.ipv6DefaultEIP",
            &old.ippools.ipv6_default_eip,
            &new.ippools.ipv6_default_eip,
        ),
    ] {
        if !a.is_empty() && a != b {
            out.push(err(f, format!("cannot change once set (was {a})")));
        }
    }
    out
}

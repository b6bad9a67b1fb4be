//! Route reflection rules (RFC 4456), as pure functions.
//!
//! Several reflectors may share one cluster id: each discards routes that
//! already passed through the cluster, and stamps every route it reflects,
//! towards clients and non-clients alike, so that the others can tell.

use std::net::Ipv4Addr;

use crate::codec::PathAttributes;

/// Where a route came from, as far as reflection is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    Local,
    Ebgp,
    Client,
    NonClient,
}

/// The kind of peer a route would go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Ebgp,
    Client,
    NonClient,
}

/// Why a received route was thrown away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopDiscard {
    /// ORIGINATOR_ID is our own router id: our route came back.
    OwnOriginatorId,
    /// CLUSTER_LIST holds our cluster id: the route already passed
    /// through our cluster (maybe through a sibling reflector).
    OwnClusterId,
}

/// RFC 4456 8: loop checks on receipt.
pub fn check_receipt(
    attrs: &PathAttributes,
    router_id: Ipv4Addr,
    cluster_id: Ipv4Addr,
) -> Result<(), LoopDiscard> {
    if attrs.originator_id == Some(router_id) {
        return Err(LoopDiscard::OwnOriginatorId);
    }
    if attrs.cluster_list.contains(&cluster_id) {
        return Err(LoopDiscard::OwnClusterId);
    }
    Ok(())
}

/// RFC 4271 9.2 and RFC 4456 6: may a best route from `from` go to `to`?
pub fn may_advertise(from: Learned, to: Target) -> bool {
    match (from, to) {
        (_, Target::Ebgp) => true,
        (Learned::Local | Learned::Ebgp, _) => true,
        // A client's route goes to every other client and every non-client.
        (Learned::Client, _) => true,
        // A non-client's route goes to clients only.
        (Learned::NonClient, Target::Client) => true,
        (Learned::NonClient, Target::NonClient) => false,
    }
}

/// Sending an iBGP-learned route to an iBGP peer is a reflection.
pub fn is_reflection(from: Learned, to: Target) -> bool {
    matches!(from, Learned::Client | Learned::NonClient)
        && matches!(to, Target::Client | Target::NonClient)
}

/// RFC 4456 8: stamp a reflected route. ORIGINATOR_ID names the router
/// that put the route into our AS (the peer we learned it from, unless
/// already set); our cluster id goes in front of CLUSTER_LIST.
pub fn stamp(attrs: &mut PathAttributes, learned_from: Ipv4Addr, cluster_id: Ipv4Addr) {
    if attrs.originator_id.is_none() {
        attrs.originator_id = Some(learned_from);
    }
    attrs.cluster_list.insert(0, cluster_id);
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const CLUSTER: Ipv4Addr = Ipv4Addr::new(1, 1, 1, 1);

    /// RFC 4456 8: a route carrying our cluster id or our router id as
    /// its originator looped back and is discarded; another cluster's is
    /// accepted.
    #[test]
    fn check_receipt_discards_looped_routes() {
        let cases = [
            (
                "route with our cluster id is discarded",
                PathAttributes {
                    cluster_list: vec![Ipv4Addr::new(9, 9, 9, 9), CLUSTER],
                    ..Default::default()
                },
                Err(LoopDiscard::OwnClusterId),
            ),
            (
                "route with our originator id is discarded",
                PathAttributes {
                    originator_id: Some(ME),
                    ..Default::default()
                },
                Err(LoopDiscard::OwnOriginatorId),
            ),
            (
                "route from another cluster is accepted",
                PathAttributes {
                    originator_id: Some(Ipv4Addr::new(10, 0, 0, 50)),
                    cluster_list: vec![Ipv4Addr::new(2, 2, 2, 2)],
                    ..Default::default()
                },
                Ok(()),
            ),
        ];
        for (name, a, want) in cases {
            assert_eq!(check_receipt(&a, ME, CLUSTER), want, "{name}");
        }
    }

    #[test]
    fn advertisement_rules() {
        use Learned as F;
        use Target as T;
        let table = [
            (F::Client, T::Client, true),
            (F::Client, T::NonClient, true),
            (F::Client, T::Ebgp, true),
            (F::NonClient, T::Client, true),
            (F::NonClient, T::NonClient, false),
            (F::NonClient, T::Ebgp, true),
            (F::Ebgp, T::Client, true),
            (F::Ebgp, T::NonClient, true),
            (F::Ebgp, T::Ebgp, true),
            (F::Local, T::NonClient, true),
            (F::Local, T::Client, true),
        ];
        for (from, to, want) in table {
            assert_eq!(may_advertise(from, to), want, "{from:?} -> {to:?}");
        }
    }

    #[test]
    fn reflection_is_ibgp_to_ibgp_only() {
        assert!(is_reflection(Learned::Client, Target::NonClient));
        assert!(is_reflection(Learned::NonClient, Target::Client));
        assert!(is_reflection(Learned::Client, Target::Client));
        assert!(!is_reflection(Learned::Ebgp, Target::Client));
        assert!(!is_reflection(Learned::Local, Target::NonClient));
        assert!(!is_reflection(Learned::Client, Target::Ebgp));
    }

    #[test]
    fn stamp_sets_originator_once_and_prepends_cluster_id() {
        let mut a = PathAttributes::default();
        stamp(&mut a, Ipv4Addr::new(10, 0, 0, 50), CLUSTER);
        assert_eq!(a.originator_id, Some(Ipv4Addr::new(10, 0, 0, 50)));
        assert_eq!(a.cluster_list, vec![CLUSTER]);
        stamp(
            &mut a,
            Ipv4Addr::new(10, 0, 0, 2),
            Ipv4Addr::new(2, 2, 2, 2),
        );
        assert_eq!(a.originator_id, Some(Ipv4Addr::new(10, 0, 0, 50)));
        assert_eq!(a.cluster_list, vec![Ipv4Addr::new(2, 2, 2, 2), CLUSTER]);
    }
}

use std::net::{IpAddr, Ipv4Addr};

use super::*;
use crate::codec::{Capability, LlgrFamily, Open};

const V4: Family = Family::Ipv4Unicast;
const V6: Family = Family::Ipv6Unicast;

fn cfg() -> GrConfig {
    GrConfig {
        restart_time: 90,
        stale_time: Duration::from_secs(300),
        deferral_time: Duration::from_secs(60),
        forwarding_preserved: true,
        llgr_stale_time: 0,
    }
}

fn open_with(cap: Option<GracefulRestartCap>) -> Open {
    let caps = cap.map(Capability::GracefulRestart).into_iter().collect();
    Open::new(65000, 90, Ipv4Addr::new(10, 0, 0, 2), caps)
}

fn peer_cap(families: &[(Family, bool)], notification: bool) -> GracefulRestartCap {
    GracefulRestartCap {
        restarting: false,
        notification,
        restart_time: 120,
        families: families
            .iter()
            .map(|(f, fwd)| GrFamily {
                afi_safi: (*f).into(),
                forwarding_preserved: *fwd,
            })
            .collect(),
    }
}

fn helper_up(peer: GracefulRestartCap) -> Helper {
    let mut h = Helper::new(Duration::from_secs(300));
    let local = capability(&cfg(), false, &[V4, V6]);
    assert!(h
        .session_up(Some(&local), &open_with(Some(peer)))
        .is_empty());
    h
}

#[test]
fn our_capability_has_r_and_f_bits_and_restart_time() {
    let c = capability(&cfg(), true, &[V4, V6]);
    assert!(c.restarting);
    assert_eq!(c.restart_time, 90);
    assert!(c.families.iter().all(|f| f.forwarding_preserved));
    let c = capability(
        &GrConfig {
            forwarding_preserved: false,
            restart_time: 5000,
            ..cfg()
        },
        false,
        &[V4],
    );
    assert!(!c.restarting);
    assert_eq!(c.restart_time, 0x0fff, "12-bit field");
    assert!(!c.families[0].forwarding_preserved);
}

#[test]
fn tcp_failure_keeps_routes_stale_for_the_peer_restart_time() {
    let mut h = helper_up(peer_cap(&[(V4, true), (V6, true)], false));
    let a = h.session_down(&DownReason::TcpFailure);
    assert!(a.contains(&HelperAction::KeepRoutesAsStale));
    assert!(a.contains(&HelperAction::StartRestartTimer(Duration::from_secs(120))));
    assert!(!a.contains(&HelperAction::DeleteRoutes));
}

#[test]
fn families_the_peer_did_not_list_are_purged_at_once() {
    let mut h = helper_up(peer_cap(&[(V4, true)], false));
    let a = h.session_down(&DownReason::TcpFailure);
    assert!(a.contains(&HelperAction::KeepRoutesAsStale));
    assert!(a.contains(&HelperAction::PurgeStale(V6)));
}

#[test]
fn without_peer_capability_routes_are_deleted() {
    let mut h = Helper::new(Duration::from_secs(300));
    let local = capability(&cfg(), false, &[V4]);
    h.session_up(Some(&local), &open_with(None));
    assert!(h
        .session_down(&DownReason::TcpFailure)
        .contains(&HelperAction::DeleteRoutes));
}

#[test]
fn without_our_capability_routes_are_deleted() {
    let mut h = Helper::new(Duration::from_secs(300));
    h.session_up(None, &open_with(Some(peer_cap(&[(V4, true)], true))));
    assert!(h
        .session_down(&DownReason::TcpFailure)
        .contains(&HelperAction::DeleteRoutes));
}

#[test]
fn notification_deletes_routes_unless_both_sides_set_n_bit() {
    let n = Notification::cease(notif::CEASE_ADMIN_RESET);
    let mut h = helper_up(peer_cap(&[(V4, true)], false));
    assert!(h
        .session_down(&DownReason::NotificationReceived(n.clone()))
        .contains(&HelperAction::DeleteRoutes));
    // RFC 8538: with N on both sides, a NOTIFICATION is graceful...
    let mut h = helper_up(peer_cap(&[(V4, true)], true));
    assert!(h
        .session_down(&DownReason::NotificationReceived(n))
        .contains(&HelperAction::KeepRoutesAsStale));
    // ...except a Hard Reset.
    let mut h = helper_up(peer_cap(&[(V4, true)], true));
    let hard = Notification::cease(9);
    assert!(h
        .session_down(&DownReason::NotificationSent(hard))
        .contains(&HelperAction::DeleteRoutes));
    // An administrative stop is never graceful.
    let mut h = helper_up(peer_cap(&[(V4, true)], true));
    assert!(h
        .session_down(&DownReason::Stopped)
        .contains(&HelperAction::DeleteRoutes));
}

#[test]
fn restart_timer_expiry_purges_all_stale() {
    let mut h = helper_up(peer_cap(&[(V4, true)], false));
    h.session_down(&DownReason::TcpFailure);
    assert_eq!(h.restart_timer_expired(), vec![HelperAction::PurgeAllStale]);
    assert_eq!(h.state(), &HelperState::Normal);
    assert!(h.restart_timer_expired().is_empty());
}

#[test]
fn reconnect_waits_for_end_of_rib_then_purges_each_family() {
    let cap = peer_cap(&[(V4, true), (V6, true)], false);
    let mut h = helper_up(cap.clone());
    h.session_down(&DownReason::TcpFailure);
    let local = capability(&cfg(), false, &[V4, V6]);
    let a = h.session_up(Some(&local), &open_with(Some(cap)));
    assert_eq!(
        a,
        vec![
            HelperAction::StopRestartTimer,
            HelperAction::StopLlgrTimer,
            HelperAction::StartStaleTimer(Duration::from_secs(300))
        ]
    );
    assert_eq!(h.end_of_rib(V4), vec![HelperAction::PurgeStale(V4)]);
    assert_eq!(
        h.end_of_rib(V6),
        vec![HelperAction::PurgeStale(V6), HelperAction::StopStaleTimer]
    );
    assert_eq!(h.state(), &HelperState::Normal);
}

#[test]
fn reconnect_without_forwarding_preserved_purges_that_family_at_once() {
    let mut h = helper_up(peer_cap(&[(V4, true), (V6, true)], false));
    h.session_down(&DownReason::TcpFailure);
    let local = capability(&cfg(), false, &[V4, V6]);
    let a = h.session_up(
        Some(&local),
        &open_with(Some(peer_cap(&[(V4, true), (V6, false)], false))),
    );
    assert!(a.contains(&HelperAction::PurgeStale(V6)));
    assert!(!a.contains(&HelperAction::PurgeStale(V4)));
}

#[test]
fn reconnect_without_capability_purges_everything_stale() {
    let mut h = helper_up(peer_cap(&[(V4, true)], false));
    h.session_down(&DownReason::TcpFailure);
    let local = capability(&cfg(), false, &[V4]);
    let a = h.session_up(Some(&local), &open_with(None));
    assert!(a.contains(&HelperAction::PurgeStale(V4)));
    assert_eq!(h.state(), &HelperState::Normal);
}

/// A helper whose peer (graceful restart for IPv4) failed and is back,
/// still with the capability: its stale routes wait for End-of-RIB.
fn helper_back_with_gr() -> Helper {
    let cap = peer_cap(&[(V4, true)], false);
    let mut h = helper_up(cap.clone());
    h.session_down(&DownReason::TcpFailure);
    let local = capability(&cfg(), false, &[V4]);
    h.session_up(Some(&local), &open_with(Some(cap)));
    h
}

#[test]
fn stale_timer_expiry_purges_what_is_left() {
    let mut h = helper_back_with_gr();
    assert_eq!(h.stale_timer_expired(), vec![HelperAction::PurgeAllStale]);
}

#[test]
fn second_failure_before_end_of_rib_keeps_routes_again() {
    let mut h = helper_back_with_gr();
    let a = h.session_down(&DownReason::TcpFailure);
    assert!(a.contains(&HelperAction::StopStaleTimer));
    assert!(a.contains(&HelperAction::KeepRoutesAsStale));
}

fn addr(n: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 0, 0, n))
}

#[test]
fn restarter_defers_until_end_of_rib_from_every_gr_peer() {
    let (mut r, a) = Restarter::new(true, [addr(2), addr(3)], Duration::from_secs(60));
    assert_eq!(
        a,
        vec![RestartAction::StartDeferralTimer(Duration::from_secs(60))]
    );
    assert!(r.deferring());
    assert!(r.peer_up(addr(2), Some(vec![V4, V6])).is_empty());
    assert!(r.end_of_rib(addr(2), V4).is_empty());
    assert!(r.end_of_rib(addr(2), V6).is_empty(), "peer 3 is not up yet");
    assert!(r.peer_up(addr(3), Some(vec![V4])).is_empty());
    assert_eq!(
        r.end_of_rib(addr(3), V4),
        vec![RestartAction::StopDeferralTimer, RestartAction::EndDeferral]
    );
    assert!(!r.deferring());
}

#[test]
fn restarter_does_not_wait_for_peers_without_graceful_restart() {
    let (mut r, _) = Restarter::new(true, [addr(2)], Duration::from_secs(60));
    assert_eq!(
        r.peer_up(addr(2), None),
        vec![RestartAction::StopDeferralTimer, RestartAction::EndDeferral]
    );
}

#[test]
fn restarter_deferral_timer_ends_the_wait() {
    let (mut r, _) = Restarter::new(true, [addr(2)], Duration::from_secs(60));
    assert_eq!(r.deferral_timer_expired(), vec![RestartAction::EndDeferral]);
    assert!(r.deferral_timer_expired().is_empty());
    assert!(r.peer_up(addr(2), Some(vec![V4])).is_empty());
}

#[test]
fn restarter_stops_waiting_for_a_peer_that_goes_away() {
    let (mut r, _) = Restarter::new(true, [addr(2), addr(3)], Duration::from_secs(60));
    r.peer_up(addr(2), None);
    assert_eq!(
        r.peer_gone(addr(3)),
        vec![RestartAction::StopDeferralTimer, RestartAction::EndDeferral]
    );
}

#[test]
fn fresh_start_does_not_defer() {
    let (mut r, a) = Restarter::new(false, [addr(2)], Duration::from_secs(60));
    assert!(a.is_empty());
    assert!(!r.deferring());
    assert!(r.peer_up(addr(2), Some(vec![V4])).is_empty());
}

#[test]
fn negotiated_families_need_both_sides() {
    let local = capability(&cfg(), false, &[V4, V6]);
    let peer = open_with(Some(peer_cap(&[(V4, true)], false)));
    assert_eq!(negotiated_families(Some(&local), &peer), Some(vec![V4]));
    assert_eq!(negotiated_families(None, &peer), None);
    assert_eq!(negotiated_families(Some(&local), &open_with(None)), None);
}

#[test]
fn end_of_rib_markers_per_family() {
    let m = end_of_rib_markers(&[V4, V6]);
    assert_eq!(m[0].end_of_rib_family(), Some(V4));
    assert_eq!(m[1].end_of_rib_family(), Some(V6));
}

#[test]
fn restarting_peer_is_not_waited_for() {
    let local = capability(&cfg(), true, &[V4]);
    let mut restarting = peer_cap(&[(V4, true)], false);
    restarting.restarting = true;
    assert_eq!(
        eor_to_wait_for(Some(&local), &open_with(Some(restarting))),
        None
    );
    let steady = peer_cap(&[(V4, true)], false);
    assert_eq!(
        eor_to_wait_for(Some(&local), &open_with(Some(steady))),
        Some(vec![V4])
    );
}

fn llgr_fams(families: &[Family], stale_time: u32) -> Vec<LlgrFamily> {
    families
        .iter()
        .map(|f| LlgrFamily {
            afi_safi: (*f).into(),
            forwarding_preserved: true,
            stale_time,
        })
        .collect()
}

fn open_llgr(gr: Option<GracefulRestartCap>, llgr: Option<Vec<LlgrFamily>>) -> Open {
    let mut caps: Vec<Capability> = gr.map(Capability::GracefulRestart).into_iter().collect();
    caps.extend(llgr.map(Capability::LongLivedGr));
    Open::new(65000, 90, Ipv4Addr::new(10, 0, 0, 2), caps)
}

fn llgr_helper(peer_gr: Option<GracefulRestartCap>, peer_llgr: Vec<LlgrFamily>) -> Helper {
    let mut h = Helper::new(Duration::from_secs(300));
    let c = GrConfig {
        llgr_stale_time: 3600,
        ..cfg()
    };
    h.set_local_llgr(llgr_capability(&c, &[V4, V6]));
    let local = capability(&c, false, &[V4, V6]);
    h.session_up(Some(&local), &open_llgr(peer_gr, Some(peer_llgr)));
    h
}

#[test]
fn our_llgr_capability_only_when_configured() {
    assert_eq!(llgr_capability(&cfg(), &[V4]), None);
    let c = GrConfig {
        llgr_stale_time: 1 << 30,
        ..cfg()
    };
    let caps = llgr_capability(&c, &[V4]).unwrap();
    assert_eq!(caps[0].stale_time, 0x00ff_ffff, "24-bit field");
}

#[test]
fn restart_time_over_with_llgr_keeps_routes_long_lived() {
    let mut h = llgr_helper(Some(peer_cap(&[(V4, true)], false)), llgr_fams(&[V4], 600));
    assert!(h
        .session_down(&DownReason::TcpFailure)
        .contains(&HelperAction::KeepRoutesAsStale));
    let a = h.restart_timer_expired();
    assert!(a.contains(&HelperAction::EnterLongLivedStale));
    assert!(a.contains(&HelperAction::StartLlgrTimer(Duration::from_secs(600))));
    assert!(
        a.contains(&HelperAction::PurgeStale(V6)),
        "not kept long-lived: purged"
    );
    assert!(!a.contains(&HelperAction::PurgeAllStale));
    assert_eq!(h.llgr_timer_expired(), vec![HelperAction::PurgeAllStale]);
    assert_eq!(h.state(), &HelperState::Normal);
}

#[test]
fn llgr_without_graceful_restart_starts_long_lived_at_once() {
    let mut h = llgr_helper(None, llgr_fams(&[V4, V6], 120));
    let a = h.session_down(&DownReason::TcpFailure);
    assert!(a.contains(&HelperAction::KeepRoutesAsStale));
    assert!(a.contains(&HelperAction::EnterLongLivedStale));
    assert!(a.contains(&HelperAction::StartLlgrTimer(Duration::from_secs(120))));
    assert!(!a.contains(&HelperAction::DeleteRoutes));
    // An administrative stop is still a stop.
    let mut h = llgr_helper(None, llgr_fams(&[V4], 120));
    assert!(h
        .session_down(&DownReason::Stopped)
        .contains(&HelperAction::DeleteRoutes));
}

#[test]
fn peer_back_during_long_lived_phase_waits_for_end_of_rib() {
    let gr = peer_cap(&[(V4, true)], false);
    let mut h = llgr_helper(Some(gr.clone()), llgr_fams(&[V4], 600));
    h.session_down(&DownReason::TcpFailure);
    h.restart_timer_expired();
    let c = GrConfig {
        llgr_stale_time: 3600,
        ..cfg()
    };
    let local = capability(&c, false, &[V4]);
    let a = h.session_up(
        Some(&local),
        &open_llgr(Some(gr), Some(llgr_fams(&[V4], 600))),
    );
    assert!(a.contains(&HelperAction::StopLlgrTimer));
    assert!(matches!(h.state(), HelperState::AwaitingEor { .. }));
    assert_eq!(
        h.end_of_rib(V4),
        vec![HelperAction::PurgeStale(V4), HelperAction::StopStaleTimer]
    );
}

#[test]
fn deferral_always_ends_before_the_restart_time() {
    let c = |restart_time, secs| GrConfig {
        restart_time,
        deferral_time: Duration::from_secs(secs),
        ..cfg()
    };
    assert_eq!(effective_deferral(&c(120, 60)), Duration::from_secs(60));
    assert_eq!(effective_deferral(&c(30, 60)), Duration::from_secs(15));
    assert_eq!(effective_deferral(&c(30, 30)), Duration::from_secs(15));
}

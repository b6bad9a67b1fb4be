use super::*;
use crate::codec::{AddPathFamily, Capability, Update};

fn cfg() -> FsmConfig {
    FsmConfig {
        local_asn: 65000,
        router_id: Ipv4Addr::new(10, 0, 0, 1),
        peer_asn: 65000,
        hold_time: 90,
        keepalive_time: 0,
        connect_retry_time: Duration::from_secs(5),
        idle_hold_time: Duration::from_secs(1),
        passive: false,
        capabilities: vec![Capability::RouteRefresh],
        send_hold_time: Duration::from_secs(480),
    }
}

fn peer_open(hold: u16) -> Open {
    Open::new(65000, hold, Ipv4Addr::new(10, 0, 0, 2), vec![])
}

fn sent(actions: &[Action]) -> Vec<&Message> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send(m) => Some(m),
            _ => None,
        })
        .collect()
}

fn notification_sent(actions: &[Action]) -> Option<(u8, u8)> {
    sent(actions).into_iter().find_map(|m| match m {
        Message::Notification(n) => Some((n.code, n.subcode)),
        _ => None,
    })
}

fn established() -> Fsm {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    f.handle(Event::BgpOpen(peer_open(90)));
    f.handle(Event::KeepAliveMsg);
    assert_eq!(f.state(), State::Established);
    f
}

#[test]
fn manual_start_connects_and_starts_connect_retry() {
    let mut f = Fsm::new(cfg());
    let a = f.handle(Event::ManualStart);
    assert_eq!(f.state(), State::Connect);
    assert!(a.contains(&Action::Connect));
    assert!(a.contains(&Action::StartTimer(
        Timer::ConnectRetry,
        Duration::from_secs(5)
    )));
}

#[test]
fn passive_start_waits_in_active_without_connecting() {
    let mut f = Fsm::new(FsmConfig {
        passive: true,
        ..cfg()
    });
    let a = f.handle(Event::ManualStart);
    assert_eq!(f.state(), State::Active);
    assert!(!a.contains(&Action::Connect));
    let a = f.handle(Event::TcpConnectionConfirmed);
    assert_eq!(f.state(), State::OpenSent);
    assert!(matches!(sent(&a)[..], [Message::Open(_)]));
}

#[test]
fn idle_refuses_connections_and_ignores_other_events() {
    let mut f = Fsm::new(cfg());
    assert_eq!(
        f.handle(Event::TcpConnectionConfirmed),
        vec![Action::DropConnection]
    );
    assert!(f.handle(Event::KeepAliveMsg).is_empty());
    assert_eq!(f.state(), State::Idle);
}

#[test]
fn connect_retry_expiry_in_connect_retries_the_connection() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    let a = f.handle(Event::ConnectRetryTimerExpires);
    assert_eq!(f.state(), State::Connect);
    assert!(a.contains(&Action::DropConnection));
    assert!(a.contains(&Action::Connect));
    assert!(a.contains(&Action::StartTimer(
        Timer::ConnectRetry,
        Duration::from_secs(5)
    )));
}

#[test]
fn tcp_failure_in_connect_goes_active_then_retry_reconnects() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpConnectionFails);
    assert_eq!(f.state(), State::Active);
    let a = f.handle(Event::ConnectRetryTimerExpires);
    assert_eq!(f.state(), State::Connect);
    assert!(a.contains(&Action::Connect));
}

#[test]
fn tcp_failure_in_active_goes_idle_and_schedules_restart() {
    let mut f = Fsm::new(FsmConfig {
        passive: true,
        ..cfg()
    });
    f.handle(Event::ManualStart);
    let a = f.handle(Event::TcpConnectionFails);
    assert_eq!(f.state(), State::Idle);
    assert_eq!(f.connect_retry_counter(), 1);
    assert!(a.contains(&Action::StartTimer(Timer::IdleHold, Duration::from_secs(1))));
    f.handle(Event::IdleHoldTimerExpires);
    assert_eq!(f.state(), State::Active);
}

#[test]
fn connection_sends_open_with_large_hold_timer() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    let a = f.handle(Event::TcpCrAcked);
    assert_eq!(f.state(), State::OpenSent);
    let Message::Open(o) = sent(&a)[0] else {
        panic!()
    };
    assert_eq!((o.hold_time, o.asn()), (90, 65000));
    assert!(a.contains(&Action::StartTimer(Timer::Hold, LARGE_HOLD_TIME)));
    assert!(a.contains(&Action::StopTimer(Timer::ConnectRetry)));
}

#[test]
fn open_received_in_open_sent_sends_keepalive_and_negotiates() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    let a = f.handle(Event::BgpOpen(peer_open(30)));
    assert_eq!(f.state(), State::OpenConfirm);
    assert_eq!(sent(&a), vec![&Message::Keepalive]);
    assert!(a.contains(&Action::StartTimer(Timer::Hold, Duration::from_secs(30))));
    assert!(a.contains(&Action::StartTimer(
        Timer::Keepalive,
        Duration::from_secs(10)
    )));
    let a = f.handle(Event::KeepAliveMsg);
    assert_eq!(f.state(), State::Established);
    let Some(Action::SessionUp(n)) = a.iter().find(|a| matches!(a, Action::SessionUp(_))) else {
        panic!("no SessionUp in {a:?}")
    };
    assert_eq!((n.hold_time, n.keepalive_time, n.peer_asn), (30, 10, 65000));
    assert!(n.codec.four_octet_as);
}

#[test]
fn hold_time_negotiation_rules() {
    assert_eq!(negotiate_hold_time(90, 30), Ok(30));
    assert_eq!(negotiate_hold_time(9, 30), Ok(9));
    assert_eq!(negotiate_hold_time(90, 0), Ok(0));
    assert_eq!(negotiate_hold_time(0, 90), Ok(0));
    assert_eq!(negotiate_hold_time(90, 3), Ok(3));
    for bad in [1, 2] {
        let n = negotiate_hold_time(90, bad).unwrap_err();
        assert_eq!((n.code, n.subcode), (2, 6));
    }
}

#[test]
fn unacceptable_hold_time_in_open_is_refused_with_2_6() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    let a = f.handle(Event::BgpOpen(peer_open(2)));
    assert_eq!(f.state(), State::Idle);
    assert_eq!(notification_sent(&a), Some((2, 6)));
    assert!(a.contains(&Action::DropConnection));
}

#[test]
fn zero_hold_time_runs_no_keepalive_or_hold_timer() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    let a = f.handle(Event::BgpOpen(peer_open(0)));
    assert!(!a
        .iter()
        .any(|a| matches!(a, Action::StartTimer(Timer::Keepalive | Timer::Hold, _))));
    assert!(a.contains(&Action::StopTimer(Timer::Hold)));
    let a = f.handle(Event::KeepAliveMsg);
    assert!(!a.iter().any(|a| matches!(a, Action::StartTimer(..))));
}

#[test]
fn configured_keepalive_is_capped_at_a_third_of_hold() {
    let mut f = Fsm::new(FsmConfig {
        keepalive_time: 60,
        ..cfg()
    });
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    f.handle(Event::BgpOpen(peer_open(9)));
    assert_eq!(f.negotiated().unwrap().keepalive_time, 3);
}

#[test]
fn wrong_peer_as_is_refused_with_2_2() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    let a = f.handle(Event::BgpOpen(Open::new(
        65099,
        90,
        Ipv4Addr::new(10, 0, 0, 2),
        vec![],
    )));
    assert_eq!(notification_sent(&a), Some((2, 2)));
    assert_eq!(f.state(), State::Idle);
}

#[test]
fn same_router_id_on_ibgp_is_refused_with_2_3() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    let a = f.handle(Event::BgpOpen(Open::new(
        65000,
        90,
        Ipv4Addr::new(10, 0, 0, 1),
        vec![],
    )));
    assert_eq!(notification_sent(&a), Some((2, 3)));
}

#[test]
fn unexpected_message_in_open_sent_is_fsm_error_5_1() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    let a = f.handle(Event::KeepAliveMsg);
    assert_eq!(notification_sent(&a), Some((5, 1)));
    assert_eq!(f.state(), State::Idle);
}

#[test]
fn unexpected_message_in_open_confirm_is_fsm_error_5_2() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    f.handle(Event::BgpOpen(peer_open(90)));
    let a = f.handle(Event::UpdateMsg(Update::default()));
    assert_eq!(notification_sent(&a), Some((5, 2)));
}

#[test]
fn open_in_established_is_fsm_error_5_3_and_session_down() {
    let mut f = established();
    let a = f.handle(Event::BgpOpen(peer_open(90)));
    assert_eq!(notification_sent(&a), Some((5, 3)));
    assert!(a
        .iter()
        .any(|a| matches!(a, Action::SessionDown(DownReason::NotificationSent(_)))));
    assert_eq!(f.state(), State::Idle);
    assert!(f.negotiated().is_none());
}

#[test]
fn hold_timer_expiry_sends_4_in_every_state_that_runs_it() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    assert_eq!(
        notification_sent(&f.handle(Event::HoldTimerExpires)),
        Some((4, 0))
    );
    let mut f = established();
    let a = f.handle(Event::HoldTimerExpires);
    assert_eq!(notification_sent(&a), Some((4, 0)));
    assert!(a.contains(&Action::SessionDown(DownReason::HoldTimerExpired)));
}

#[test]
fn keepalive_timer_sends_keepalive_and_restarts() {
    let mut f = established();
    let a = f.handle(Event::KeepaliveTimerExpires);
    assert_eq!(sent(&a), vec![&Message::Keepalive]);
    assert!(a.contains(&Action::StartTimer(
        Timer::Keepalive,
        Duration::from_secs(30)
    )));
}

#[test]
fn update_and_keepalive_restart_the_hold_timer_and_updates_are_delivered() {
    let mut f = established();
    let a = f.handle(Event::KeepAliveMsg);
    assert_eq!(
        a,
        vec![Action::StartTimer(Timer::Hold, Duration::from_secs(90))]
    );
    let u = Update::end_of_rib(crate::types::Family::Ipv4Unicast);
    let a = f.handle(Event::UpdateMsg(u.clone()));
    assert_eq!(
        a,
        vec![
            Action::StartTimer(Timer::Hold, Duration::from_secs(90)),
            Action::DeliverUpdate(u)
        ]
    );
}

#[test]
fn decode_error_in_established_sends_its_notification() {
    let mut f = established();
    let a = f.handle(Event::MessageError(DecodeError::InvalidNetworkField));
    assert_eq!(notification_sent(&a), Some((3, 10)));
    assert_eq!(f.state(), State::Idle);
}

#[test]
fn tcp_failure_in_established_is_reported_for_graceful_restart() {
    let mut f = established();
    let a = f.handle(Event::TcpConnectionFails);
    assert!(a.contains(&Action::SessionDown(DownReason::TcpFailure)));
    assert!(notification_sent(&a).is_none());
    assert!(a
        .iter()
        .any(|a| matches!(a, Action::StartTimer(Timer::IdleHold, _))));
}

#[test]
fn manual_stop_sends_cease_and_does_not_restart() {
    let mut f = established();
    let a = f.handle(Event::ManualStop);
    assert_eq!(notification_sent(&a), Some((6, 2)));
    assert!(a.contains(&Action::SessionDown(DownReason::Stopped)));
    assert!(!a
        .iter()
        .any(|a| matches!(a, Action::StartTimer(Timer::IdleHold, _))));
    assert!(f.handle(Event::IdleHoldTimerExpires).is_empty());
    assert_eq!(f.state(), State::Idle);
}

#[test]
fn collision_dump_sends_cease_7() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    f.handle(Event::BgpOpen(peer_open(90)));
    let a = f.handle(Event::OpenCollisionDump);
    assert_eq!(notification_sent(&a), Some((6, 7)));
}

#[test]
fn collision_keeps_the_connection_of_the_higher_identifier() {
    let low = Ipv4Addr::new(10, 0, 0, 1);
    let high = Ipv4Addr::new(10, 0, 0, 9);
    assert_eq!(
        resolve_collision(high, low),
        CollisionWinner::LocallyInitiated
    );
    assert_eq!(
        resolve_collision(low, high),
        CollisionWinner::RemotelyInitiated
    );
    // Compared as numbers, not text: 10.0.0.10 > 10.0.0.9.
    assert_eq!(
        resolve_collision(Ipv4Addr::new(10, 0, 0, 10), high),
        CollisionWinner::LocallyInitiated
    );
}

#[test]
fn notification_received_ends_the_session_without_reply() {
    let mut f = established();
    let n = Notification::cease(notif::CEASE_ADMIN_RESET);
    let a = f.handle(Event::NotifMsg(n.clone()));
    assert!(a.contains(&Action::SessionDown(DownReason::NotificationReceived(n))));
    assert!(notification_sent(&a).is_none());
}

#[test]
fn hard_reset_stop_sends_cease_9_with_inner_reason() {
    let mut f = established();
    let a = f.handle(Event::ManualStopHardReset);
    assert_eq!(notification_sent(&a), Some((6, 9)));
    let Message::Notification(n) = sent(&a)[0] else {
        panic!()
    };
    assert_eq!(&n.data[..], &[6, 3]);
    assert!(a.contains(&Action::SessionDown(DownReason::Stopped)));
}

const SEND_HOLD: Action = Action::StartTimer(Timer::SendHold, Duration::from_secs(480));

#[test]
fn send_hold_timer_runs_while_output_waits() {
    let mut f = established();
    assert_eq!(f.handle(Event::OutputWaiting), vec![SEND_HOLD]);
    // Already running: more output does not push the deadline back.
    assert_eq!(f.handle(Event::OutputWaiting), vec![]);
    // Progress restarts it; everything written stops it.
    assert_eq!(
        f.handle(Event::OutputWritten { all: false }),
        vec![SEND_HOLD]
    );
    assert_eq!(
        f.handle(Event::OutputWritten { all: true }),
        vec![Action::StopTimer(Timer::SendHold)]
    );
    assert_eq!(f.handle(Event::OutputWritten { all: true }), vec![]);
    assert_eq!(f.state(), State::Established);
}

#[test]
fn send_hold_expiry_sends_8_and_drops_the_session() {
    let mut f = established();
    f.handle(Event::OutputWaiting);
    let a = f.handle(Event::SendHoldTimerExpires);
    assert_eq!(f.state(), State::Idle);
    assert_eq!(notification_sent(&a), Some((8, 0)));
    let n = Notification::new(8, 0, Default::default());
    assert!(a.contains(&Action::SessionDown(DownReason::NotificationSent(n))));
    assert!(a.contains(&Action::DropConnection));
    assert!(a.contains(&Action::StartTimer(Timer::IdleHold, Duration::from_secs(1))));
    // A new connection starts with the timer off.
    f.handle(Event::IdleHoldTimerExpires);
    f.handle(Event::TcpCrAcked);
    assert_eq!(f.handle(Event::OutputWaiting), vec![SEND_HOLD]);
}

#[test]
fn send_hold_expiry_in_open_sent_and_open_confirm() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    f.handle(Event::OutputWaiting);
    let a = f.handle(Event::SendHoldTimerExpires);
    assert_eq!(
        (f.state(), notification_sent(&a)),
        (State::Idle, Some((8, 0)))
    );

    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    f.handle(Event::BgpOpen(peer_open(90)));
    f.handle(Event::OutputWaiting);
    let a = f.handle(Event::SendHoldTimerExpires);
    assert_eq!(
        (f.state(), notification_sent(&a)),
        (State::Idle, Some((8, 0)))
    );
}

#[test]
fn send_hold_timer_is_off_before_open_sent_when_zero_and_once_stopped() {
    let mut f = Fsm::new(cfg());
    f.handle(Event::ManualStart);
    assert_eq!(f.handle(Event::OutputWaiting), vec![]);

    let mut c = cfg();
    c.send_hold_time = Duration::ZERO;
    let mut f = Fsm::new(c);
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    assert_eq!(f.handle(Event::OutputWaiting), vec![]);

    // An expiry that raced with the last write is stale.
    let mut f = established();
    f.handle(Event::OutputWaiting);
    f.handle(Event::OutputWritten { all: true });
    assert_eq!(f.handle(Event::SendHoldTimerExpires), vec![]);
    assert_eq!(f.state(), State::Established);
}

#[test]
fn stopping_stops_the_send_hold_timer() {
    let mut f = established();
    f.handle(Event::OutputWaiting);
    let a = f.handle(Event::ManualStop);
    assert!(a.contains(&Action::StopTimer(Timer::SendHold)));
    assert_eq!(f.handle(Event::SendHoldTimerExpires), vec![]);
}

/// The codec options of a session whose OPENs carried these ADD-PATH
/// tuples (ours in our OPEN, theirs in the peer's).
fn negotiated_codec(ours: Vec<AddPathFamily>, theirs: Vec<AddPathFamily>) -> CodecOptions {
    negotiated_with(
        vec![Capability::AddPath(ours)],
        vec![Capability::AddPath(theirs)],
    )
}

/// The codec options of a session whose OPENs carried these capabilities
/// besides the usual ones (ours in our OPEN, theirs in the peer's).
fn negotiated_with(ours: Vec<Capability>, theirs: Vec<Capability>) -> CodecOptions {
    let mut c = cfg();
    c.capabilities.extend(ours);
    let mut f = Fsm::new(c);
    f.handle(Event::ManualStart);
    f.handle(Event::TcpCrAcked);
    let open = Open::new(65000, 90, Ipv4Addr::new(10, 0, 0, 2), theirs);
    f.handle(Event::BgpOpen(open));
    let a = f.handle(Event::KeepAliveMsg);
    let Some(Action::SessionUp(n)) = a.iter().find(|a| matches!(a, Action::SessionUp(_))) else {
        panic!("no SessionUp in {a:?}")
    };
    n.codec
}

#[test]
fn extended_next_hop_is_negotiated_into_the_codec_options() {
    use crate::codec::{Ipv4ViaIpv6, NextHopTuple};
    let enh = || Capability::ExtendedNextHop(vec![NextHopTuple::IPV4_UNICAST_VIA_IPV6]);
    let both = negotiated_with(vec![enh()], vec![enh()]);
    assert_eq!(both.ipv4_via_ipv6, Ipv4ViaIpv6::BOTH);
    let ours = negotiated_with(vec![enh()], vec![]);
    assert_eq!(
        ours.ipv4_via_ipv6,
        Ipv4ViaIpv6 {
            receive: true,
            send: false
        },
        "the peer did not say it takes them"
    );
    let theirs = negotiated_with(vec![], vec![enh()]);
    assert_eq!(theirs.ipv4_via_ipv6, Ipv4ViaIpv6::NONE);
}

#[test]
fn add_path_is_negotiated_per_direction_into_the_codec_options() {
    use crate::codec::AddPathFamilies;
    use crate::types::Family::{Ipv4Unicast as V4, Ipv6Unicast as V6};
    let send = |f| AddPathFamily::new(f, true, false);
    let recv = |f| AddPathFamily::new(f, false, true);
    let c = negotiated_codec(vec![send(V4), send(V6)], vec![recv(V4), send(V6)]);
    assert_eq!(c.add_path_tx, AddPathFamilies::NONE.with(V4));
    assert_eq!(
        c.add_path_rx,
        AddPathFamilies::NONE,
        "we never offered Receive"
    );
    let c = negotiated_codec(vec![send(V4)], vec![send(V4)]);
    assert_eq!(
        (c.add_path_tx, c.add_path_rx),
        (AddPathFamilies::NONE, AddPathFamilies::NONE)
    );
}

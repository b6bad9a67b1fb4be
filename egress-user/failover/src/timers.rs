//! The three heartbeat timers (names and defaults as in spidernet's
//! egressgateway), their parsing from CLI/chart values and their validation.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// How often agents renew their heartbeat, how often the controller checks
/// the heartbeats, and how long a heartbeat may be missing before the node's
/// EIPs move.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailoverTimers {
    /// Agent: period of heartbeat renewals (`tunnelUpdatePeriod`).
    pub tunnel_update_period: Duration,
    /// Controller: period of heartbeat checks (`tunnelMonitorPeriod`).
    pub tunnel_monitor_period: Duration,
    /// Time without a heartbeat after which the tunnel goes HeartbeatTimeout
    /// and its EIPs move (`eipEvictionTimeout`). Also the agent's self-fencing
    /// deadline.
    pub eip_eviction_timeout: Duration,
}

impl Default for FailoverTimers {
    fn default() -> Self {
        Self {
            tunnel_update_period: Duration::from_secs(5),
            tunnel_monitor_period: Duration::from_secs(5),
            eip_eviction_timeout: Duration::from_secs(15),
        }
    }
}

/// A timer configuration that must be refused at start.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum TimerError {
    #[error("{field} must be greater than zero")]
    Zero { field: &'static str },
    #[error(
        "eipEvictionTimeout ({eviction}) must be longer than tunnelMonitorPeriod ({monitor}) + \
         tunnelUpdatePeriod ({update}) = {sum}: the controller only sees a renewal at its next \
         check, so two heartbeats it sees can be up to that sum apart, and a shorter timeout \
         would declare a healthy node dead",
        eviction = HumanDuration(*.eviction),
        monitor = HumanDuration(*.monitor),
        update = HumanDuration(*.update),
        sum = HumanDuration(*.monitor + *.update)
    )]
    EvictionTooShort {
        update: Duration,
        monitor: Duration,
        eviction: Duration,
    },
    #[error("{field}: {source}")]
    Parse {
        field: &'static str,
        source: DurationParseError,
    },
}

/// A duration string that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum DurationParseError {
    #[error("empty duration")]
    Empty,
    #[error("{0:?} is not a duration: expected numbers with units (300ms, 5s, 1.5s, 1m30s) or a number of seconds")]
    Malformed(String),
    #[error("{0:?} has an unknown unit (use ns, us, ms, s, m or h)")]
    UnknownUnit(String),
    #[error("{0:?} is too large")]
    Overflow(String),
}

impl FailoverTimers {
    /// Builds and validates the timers.
    pub fn new(
        tunnel_update_period: Duration,
        tunnel_monitor_period: Duration,
        eip_eviction_timeout: Duration,
    ) -> Result<Self, TimerError> {
        let timers = Self {
            tunnel_update_period,
            tunnel_monitor_period,
            eip_eviction_timeout,
        };
        timers.validate()?;
        Ok(timers)
    }

    /// Parses the three values as given on the command line or in the chart
    /// (see [`parse_duration`]) and validates them.
    pub fn parse(update: &str, monitor: &str, eviction: &str) -> Result<Self, TimerError> {
        let field = |field: &'static str, s: &str| {
            parse_duration(s).map_err(|source| TimerError::Parse { field, source })
        };
        Self::new(
            field("tunnelUpdatePeriod", update)?,
            field("tunnelMonitorPeriod", monitor)?,
            field("eipEvictionTimeout", eviction)?,
        )
    }

    /// Checks the rule `eipEvictionTimeout > tunnelMonitorPeriod + tunnelUpdatePeriod`
    /// and that no timer is zero.
    pub fn validate(&self) -> Result<(), TimerError> {
        for (field, value) in [
            ("tunnelUpdatePeriod", self.tunnel_update_period),
            ("tunnelMonitorPeriod", self.tunnel_monitor_period),
            ("eipEvictionTimeout", self.eip_eviction_timeout),
        ] {
            if value.is_zero() {
                return Err(TimerError::Zero { field });
            }
        }
        if self.eip_eviction_timeout <= self.tunnel_monitor_period + self.tunnel_update_period {
            return Err(TimerError::EvictionTooShort {
                update: self.tunnel_update_period,
                monitor: self.tunnel_monitor_period,
                eviction: self.eip_eviction_timeout,
            });
        }
        Ok(())
    }

    /// The longest time from a node's last heartbeat write to the controller
    /// declaring the timeout: the controller sees the write up to one check
    /// period late, and checks the timeout only once per period.
    pub fn worst_case_detection(&self) -> Duration {
        self.eip_eviction_timeout + 2 * self.tunnel_monitor_period
    }

    /// How long after its last successful heartbeat renewal an agent stops
    /// announcing its EIPs. A little shorter than `eipEvictionTimeout`, so the
    /// old owner is silent before the controller can possibly hand the EIP to
    /// another node, yet always longer than `tunnelUpdatePeriod`, so a healthy
    /// agent never fences itself: `eviction - min(eviction / 10, (eviction - update) / 2)`.
    pub fn fence_after(&self) -> Duration {
        let e = self.eip_eviction_timeout;
        let u = self.tunnel_update_period;
        let margin = (e / 10).min(e.saturating_sub(u) / 2);
        e - margin
    }
}

/// Parses "300ms", "5s", "1.5s", "1m30s", "2h" (a sequence of numbers with
/// units ns, us, ms, s, m, h, as the chart's schema allows), or a bare number
/// of seconds ("5", as spidernet's chart values are written).
pub fn parse_duration(input: &str) -> Result<Duration, DurationParseError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(DurationParseError::Empty);
    }
    let malformed = || DurationParseError::Malformed(input.to_string());
    let overflow = || DurationParseError::Overflow(input.to_string());
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(num_len);
        let unit_len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        if number.is_empty() && unit.is_empty() {
            // Neither a digit nor a letter: a sign, a space, punctuation.
            return Err(malformed());
        }
        let nanos_per_unit: u128 = match unit {
            "ns" => 1,
            "us" => 1_000,
            "ms" => 1_000_000,
            // A bare number is seconds, but only on its own ("5", not "1m5").
            "" if s == number => 1_000_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(malformed()),
            _ => return Err(DurationParseError::UnknownUnit(input.to_string())),
        };
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if int.is_empty() && frac.is_empty() || frac.contains('.') {
            return Err(malformed());
        }
        let int: u128 = if int.is_empty() {
            0
        } else {
            int.parse().map_err(|_| overflow())?
        };
        let mut nanos = int.checked_mul(nanos_per_unit).ok_or_else(overflow)?;
        // Fraction digits beyond nanosecond precision are dropped.
        let mut scale = nanos_per_unit;
        for digit in frac.bytes() {
            scale /= 10;
            nanos += u128::from(digit - b'0') * scale;
        }
        total = total.checked_add(nanos).ok_or_else(overflow)?;
        rest = after;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| overflow())?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// Prints a duration the way [`parse_duration`] reads it ("300ms", "5s", "1.5s").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if !d.subsec_nanos().is_multiple_of(1_000_000) {
            write!(f, "{}ns", d.as_nanos())
        } else if d.as_millis() < 1000 {
            write!(f, "{}ms", d.as_millis())
        } else if d.subsec_millis() == 0 {
            write!(f, "{}s", d.as_secs())
        } else {
            let frac = format!("{:03}", d.subsec_millis());
            write!(f, "{}.{}s", d.as_secs(), frac.trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn defaults_match_spidernet_and_are_valid() {
        let t = FailoverTimers::default();
        assert_eq!(t.tunnel_update_period, ms(5000));
        assert_eq!(t.tunnel_monitor_period, ms(5000));
        assert_eq!(t.eip_eviction_timeout, ms(15000));
        t.validate().unwrap();
    }

    #[test]
    fn parses_durations() {
        let cases: &[(&str, Duration)] = &[
            ("5s", ms(5000)),
            ("300ms", ms(300)),
            ("1m", ms(60_000)),
            ("2h", ms(7_200_000)),
            ("1.5s", ms(1500)),
            ("0.25s", ms(250)),
            (".5s", ms(500)),
            ("5", ms(5000)),
            (" 15s ", ms(15000)),
            ("0.5ms", Duration::from_micros(500)),
            ("1m30s", ms(90_000)),
            ("1h1m1s1ms", ms(3_661_001)),
            ("1.5m", ms(90_000)),
            ("250us", Duration::from_micros(250)),
        ];
        for (input, want) in cases {
            assert_eq!(parse_duration(input).as_ref(), Ok(want), "{input}");
        }
    }

    #[test]
    fn rejects_bad_durations() {
        use DurationParseError as E;
        let kind = |r: Result<Duration, E>| match r {
            Ok(_) => "ok",
            Err(E::Empty) => "empty",
            Err(E::Malformed(_)) => "malformed",
            Err(E::UnknownUnit(_)) => "unit",
            Err(E::Overflow(_)) => "overflow",
        };
        let cases = [
            ("", "empty"),
            ("  ", "empty"),
            ("5x", "unit"),
            ("5sec", "unit"),
            ("ms", "malformed"),
            ("1.2.3s", "malformed"),
            ("-5s", "malformed"),
            ("5 s", "malformed"),
            ("1m30", "malformed"),
            ("99999999999999999999999999h", "overflow"),
        ];
        for (input, want) in cases {
            assert_eq!(kind(parse_duration(input)), want, "{input:?}");
        }
    }

    #[test]
    fn validation_rule_table() {
        // (update, monitor, eviction, accepted)
        let cases = [
            (5000, 5000, 15000, true),
            (5000, 5000, 10001, true),
            (5000, 5000, 10000, false), // equal to the sum: refused
            (5000, 5000, 9000, false),
            (100, 100, 300, true), // sub-second values work
            (100, 100, 200, false),
            (100, 200, 300, false),
            (0, 100, 300, false),
            (100, 0, 300, false),
        ];
        for (u, m, e, ok) in cases {
            let got = FailoverTimers::new(ms(u), ms(m), ms(e));
            assert_eq!(
                got.is_ok(),
                ok,
                "update={u}ms monitor={m}ms eviction={e}ms: {got:?}"
            );
        }
    }

    #[test]
    fn rejection_message_names_fields_values_and_reason() {
        let err = FailoverTimers::parse("5s", "5s", "10s").unwrap_err();
        let msg = err.to_string();
        for needle in [
            "eipEvictionTimeout (10s)",
            "tunnelMonitorPeriod (5s)",
            "tunnelUpdatePeriod (5s)",
            "= 10s",
            "healthy node dead",
        ] {
            assert!(msg.contains(needle), "{needle:?} missing from: {msg}");
        }
        let err = FailoverTimers::parse("300ms", "200ms", "0.5s").unwrap_err();
        assert!(
            err.to_string().contains("eipEvictionTimeout (500ms)"),
            "{err}"
        );
        assert!(
            err.to_string().contains("tunnelMonitorPeriod (200ms)"),
            "{err}"
        );
    }

    #[test]
    fn timer_config_rejects_eviction_not_longer_than_monitor_plus_update() {
        let t = FailoverTimers {
            tunnel_update_period: Duration::from_secs(5),
            tunnel_monitor_period: Duration::from_secs(5),
            eip_eviction_timeout: Duration::from_secs(10),
        };
        let e = t.validate().unwrap_err().to_string();
        assert!(
            e.contains("eipEvictionTimeout (10s) must be longer than"),
            "{e}"
        );
        assert!(FailoverTimers::default().validate().is_ok());
    }

    #[test]
    fn parse_error_names_the_field() {
        let err = FailoverTimers::parse("5s", "five", "15s").unwrap_err();
        assert!(
            matches!(
                err,
                TimerError::Parse {
                    field: "tunnelMonitorPeriod",
                    ..
                }
            ),
            "{err}"
        );
        let err = FailoverTimers::parse("0s", "5s", "15s").unwrap_err();
        assert_eq!(
            err,
            TimerError::Zero {
                field: "tunnelUpdatePeriod"
            }
        );
    }

    #[test]
    fn fence_after_is_between_update_period_and_timeout() {
        let cases = [
            (5000, 5000, 15000, 13500),
            (100, 100, 300, 270),
            (1000, 100, 1110, 1055),
        ];
        for (u, m, e, want) in cases {
            let t = FailoverTimers::new(ms(u), ms(m), ms(e)).unwrap();
            let f = t.fence_after();
            assert_eq!(f, ms(want), "{t:?}");
            assert!(f > t.tunnel_update_period && f <= t.eip_eviction_timeout);
        }
    }

    #[test]
    fn human_duration_round_trips() {
        for d in [
            ms(300),
            ms(5000),
            ms(1500),
            ms(60_000),
            Duration::from_micros(500),
        ] {
            let text = HumanDuration(d).to_string();
            assert_eq!(parse_duration(&text), Ok(d), "{text}");
        }
    }
}

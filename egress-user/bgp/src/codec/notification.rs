//! NOTIFICATION (RFC 4271 4.5) and ROUTE-REFRESH (RFC 2918, RFC 7313).

use bytes::{BufMut, Bytes, BytesMut};

use super::reader::Reader;
use super::DecodeError;
use crate::types::AfiSafi;

/// Error codes and subcodes (RFC 4271 4.5, RFC 4486, RFC 6608, RFC 7313,
/// RFC 9687).
pub mod notif {
    pub const HEADER: u8 = 1;
    pub const HEADER_NOT_SYNCHRONIZED: u8 = 1;
    pub const HEADER_BAD_LENGTH: u8 = 2;
    pub const HEADER_BAD_TYPE: u8 = 3;

    pub const OPEN: u8 = 2;
    pub const OPEN_UNSUPPORTED_VERSION: u8 = 1;
    pub const OPEN_BAD_PEER_AS: u8 = 2;
    pub const OPEN_BAD_BGP_ID: u8 = 3;
    pub const OPEN_UNSUPPORTED_PARAM: u8 = 4;
    pub const OPEN_UNACCEPTABLE_HOLD: u8 = 6;
    pub const OPEN_UNSUPPORTED_CAPABILITY: u8 = 7;

    pub const UPDATE: u8 = 3;
    pub const UPDATE_MALFORMED_ATTR_LIST: u8 = 1;
    pub const UPDATE_UNRECOGNIZED_WELL_KNOWN: u8 = 2;
    pub const UPDATE_MISSING_WELL_KNOWN: u8 = 3;
    pub const UPDATE_ATTR_FLAGS: u8 = 4;
    pub const UPDATE_ATTR_LENGTH: u8 = 5;
    pub const UPDATE_INVALID_ORIGIN: u8 = 6;
    pub const UPDATE_INVALID_NEXT_HOP: u8 = 8;
    pub const UPDATE_OPTIONAL_ATTR: u8 = 9;
    pub const UPDATE_INVALID_NETWORK: u8 = 10;
    pub const UPDATE_MALFORMED_AS_PATH: u8 = 11;

    pub const HOLD_TIMER_EXPIRED: u8 = 4;

    pub const FSM: u8 = 5;
    pub const FSM_UNEXPECTED_IN_OPENSENT: u8 = 1;
    pub const FSM_UNEXPECTED_IN_OPENCONFIRM: u8 = 2;
    pub const FSM_UNEXPECTED_IN_ESTABLISHED: u8 = 3;

    pub const CEASE: u8 = 6;
    pub const CEASE_MAX_PREFIXES: u8 = 1;
    pub const CEASE_ADMIN_SHUTDOWN: u8 = 2;
    pub const CEASE_PEER_DECONFIGURED: u8 = 3;
    pub const CEASE_ADMIN_RESET: u8 = 4;
    pub const CEASE_CONNECTION_REJECTED: u8 = 5;
    pub const CEASE_COLLISION: u8 = 7;
    pub const CEASE_HARD_RESET: u8 = 9;

    pub const ROUTE_REFRESH: u8 = 7;
    pub const ROUTE_REFRESH_INVALID_LENGTH: u8 = 1;

    /// RFC 9687 (no subcodes).
    pub const SEND_HOLD_TIMER_EXPIRED: u8 = 8;
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    pub code: u8,
    pub subcode: u8,
    pub data: Bytes,
}

impl Notification {
    pub fn new(code: u8, subcode: u8, data: Bytes) -> Self {
        Notification {
            code,
            subcode,
            data,
        }
    }

    pub fn cease(subcode: u8) -> Self {
        Notification::new(notif::CEASE, subcode, Bytes::new())
    }

    pub(super) fn decode(body: &[u8]) -> Result<Notification, DecodeError> {
        let mut r = Reader::new(body);
        let code = r.u8().ok_or(DecodeError::MalformedNotification)?;
        let subcode = r.u8().ok_or(DecodeError::MalformedNotification)?;
        Ok(Notification::new(
            code,
            subcode,
            Bytes::copy_from_slice(r.rest()),
        ))
    }

    pub(super) fn encode_body(&self, out: &mut BytesMut) {
        out.put_u8(self.code);
        out.put_u8(self.subcode);
        out.put_slice(&self.data);
    }
}

impl std::fmt::Display for Notification {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NOTIFICATION {}/{}", self.code, self.subcode)
    }
}

/// Message subtype of RFC 7313 enhanced route refresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RouteRefreshSubtype {
    /// Plain request to re-send the Adj-RIB-Out (RFC 2918).
    Request,
    /// Beginning of a route refresh.
    BeginRefresh,
    /// End of a route refresh.
    EndRefresh,
    /// Anything else; RFC 7313 says to ignore the message.
    Other(u8),
}

impl RouteRefreshSubtype {
    fn to_u8(self) -> u8 {
        match self {
            RouteRefreshSubtype::Request => 0,
            RouteRefreshSubtype::BeginRefresh => 1,
            RouteRefreshSubtype::EndRefresh => 2,
            RouteRefreshSubtype::Other(v) => v,
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            0 => RouteRefreshSubtype::Request,
            1 => RouteRefreshSubtype::BeginRefresh,
            2 => RouteRefreshSubtype::EndRefresh,
            v => RouteRefreshSubtype::Other(v),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteRefresh {
    pub afi_safi: AfiSafi,
    pub subtype: RouteRefreshSubtype,
}

impl RouteRefresh {
    pub(super) fn decode(body: &[u8]) -> Result<RouteRefresh, DecodeError> {
        let mut r = Reader::new(body);
        let err = || DecodeError::RouteRefreshLength((body.len() + super::HEADER_LEN) as u16);
        let afi = r.u16().ok_or_else(err)?;
        let subtype = RouteRefreshSubtype::from_u8(r.u8().ok_or_else(err)?);
        let safi = r.u8().ok_or_else(err)?;
        if !r.is_empty() {
            return Err(err());
        }
        Ok(RouteRefresh {
            afi_safi: AfiSafi { afi, safi },
            subtype,
        })
    }

    pub(super) fn encode_body(&self, out: &mut BytesMut) {
        out.put_u16(self.afi_safi.afi);
        out.put_u8(self.subtype.to_u8());
        out.put_u8(self.afi_safi.safi);
    }
}

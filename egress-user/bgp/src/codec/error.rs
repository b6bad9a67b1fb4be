//! Decode errors and the NOTIFICATION each one calls for (RFC 4271 6, RFC 7313).

use bytes::Bytes;

use super::notif;
use super::Notification;

/// A message that cannot be accepted: the session must be reset with the
/// NOTIFICATION returned by [`DecodeError::notification`].
///
/// UPDATE attribute errors that RFC 7606 downgrades to treat-as-withdraw or
/// attribute-discard are not errors: they are reported on the decoded
/// [`super::Update`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("message header marker is not all ones")]
    ConnectionNotSynchronized,
    #[error("bad message length {0}")]
    BadMessageLength(u16),
    #[error("bad message type {0}")]
    BadMessageType(u8),

    #[error("unsupported BGP version {0}")]
    UnsupportedVersion(u8),
    #[error("bad BGP identifier")]
    BadBgpIdentifier,
    #[error("unsupported optional parameter {0}")]
    UnsupportedOptionalParameter(u8),
    #[error("unacceptable hold time {0}")]
    UnacceptableHoldTime(u16),
    #[error("malformed OPEN: {0}")]
    MalformedOpen(&'static str),

    #[error("malformed attribute list: {0}")]
    MalformedAttributeList(&'static str),
    #[error("unrecognized well-known attribute {type_code}")]
    UnrecognizedWellKnown { type_code: u8, attr: Bytes },
    #[error("malformed optional attribute {type_code}: {reason}")]
    OptionalAttribute {
        type_code: u8,
        reason: &'static str,
        attr: Bytes,
    },
    #[error("invalid network field")]
    InvalidNetworkField,

    #[error("malformed NOTIFICATION")]
    MalformedNotification,
    #[error("ROUTE-REFRESH with length {0}, expected 23")]
    RouteRefreshLength(u16),
}

impl DecodeError {
    /// The NOTIFICATION that RFC 4271 section 6 prescribes for this error.
    pub fn notification(&self) -> Notification {
        use DecodeError::*;
        let (code, sub, data) = match self {
            ConnectionNotSynchronized => {
                (notif::HEADER, notif::HEADER_NOT_SYNCHRONIZED, Bytes::new())
            }
            BadMessageLength(l) => (
                notif::HEADER,
                notif::HEADER_BAD_LENGTH,
                Bytes::copy_from_slice(&l.to_be_bytes()),
            ),
            BadMessageType(t) => (
                notif::HEADER,
                notif::HEADER_BAD_TYPE,
                Bytes::copy_from_slice(&[*t]),
            ),
            UnsupportedVersion(_) => (
                notif::OPEN,
                notif::OPEN_UNSUPPORTED_VERSION,
                Bytes::from_static(&[0, 4]),
            ),
            BadBgpIdentifier => (notif::OPEN, notif::OPEN_BAD_BGP_ID, Bytes::new()),
            UnsupportedOptionalParameter(_) => {
                (notif::OPEN, notif::OPEN_UNSUPPORTED_PARAM, Bytes::new())
            }
            UnacceptableHoldTime(_) => (notif::OPEN, notif::OPEN_UNACCEPTABLE_HOLD, Bytes::new()),
            // No specific subcode exists for a garbled OPEN body.
            MalformedOpen(_) => (notif::OPEN, 0, Bytes::new()),
            MalformedAttributeList(_) => (
                notif::UPDATE,
                notif::UPDATE_MALFORMED_ATTR_LIST,
                Bytes::new(),
            ),
            UnrecognizedWellKnown { attr, .. } => (
                notif::UPDATE,
                notif::UPDATE_UNRECOGNIZED_WELL_KNOWN,
                attr.clone(),
            ),
            OptionalAttribute { attr, .. } => {
                (notif::UPDATE, notif::UPDATE_OPTIONAL_ATTR, attr.clone())
            }
            InvalidNetworkField => (notif::UPDATE, notif::UPDATE_INVALID_NETWORK, Bytes::new()),
            // RFC 4271 has no NOTIFICATION error subcode; closing is enough,
            // but we say why with a header error on the length.
            MalformedNotification => (notif::HEADER, notif::HEADER_BAD_LENGTH, Bytes::new()),
            RouteRefreshLength(l) => (
                notif::ROUTE_REFRESH,
                notif::ROUTE_REFRESH_INVALID_LENGTH,
                Bytes::copy_from_slice(&l.to_be_bytes()),
            ),
        };
        Notification::new(code, sub, data)
    }
}

//! Link events from the kernel: the agent learns about pod veths as they
//! appear (to attach the worker program) and disappear, and about address
//! changes (the node's addresses it registers).

use anyhow::{Context, Result};
use futures::{channel::mpsc::UnboundedReceiver, StreamExt, TryStreamExt};
use rtnetlink::{
    constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR, RTMGRP_LINK},
    packet_core::{NetlinkMessage, NetlinkPayload},
    packet_route::RouteNetlinkMessage,
    sys::{AsyncSocket, SocketAddr},
    Handle,
};

use super::link::ObservedLink;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// A link exists now (also sent once for every link present at start).
    Present(ObservedLink),
    Removed(ObservedLink),
    /// An address of the link with this index was added or removed.
    AddressChanged(u32),
}

/// A subscription to link changes in this process's network namespace.
pub struct LinkWatch {
    pub handle: Handle,
    messages: UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
    initial: std::vec::IntoIter<ObservedLink>,
}

impl LinkWatch {
    /// Subscribes first, then lists the links present, so no link that appears
    /// in between is missed (it may be reported twice, which is harmless).
    pub async fn start() -> Result<Self> {
        let (mut conn, handle, messages) =
            rtnetlink::new_connection().context("opening a netlink socket")?;
        conn.socket_mut()
            .socket_mut()
            .bind(&SocketAddr::new(
                0,
                RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR,
            ))
            .context("subscribing to link and address events")?;
        tokio::spawn(conn);
        let initial: Vec<ObservedLink> = handle
            .link()
            .get()
            .execute()
            .map_ok(|m| ObservedLink::from_message(&m))
            .try_collect()
            .await
            .context("listing links")?;
        Ok(Self {
            handle,
            messages,
            initial: initial.into_iter(),
        })
    }

    /// The next link event; `None` when the netlink connection is gone.
    pub async fn next(&mut self) -> Option<LinkEvent> {
        if let Some(link) = self.initial.next() {
            return Some(LinkEvent::Present(link));
        }
        while let Some((msg, _)) = self.messages.next().await {
            if let NetlinkPayload::InnerMessage(inner) = msg.payload {
                match inner {
                    RouteNetlinkMessage::NewLink(m) => {
                        return Some(LinkEvent::Present(ObservedLink::from_message(&m)))
                    }
                    RouteNetlinkMessage::DelLink(m) => {
                        return Some(LinkEvent::Removed(ObservedLink::from_message(&m)))
                    }
                    RouteNetlinkMessage::NewAddress(m) | RouteNetlinkMessage::DelAddress(m) => {
                        return Some(LinkEvent::AddressChanged(m.header.index))
                    }
                    _ => continue,
                }
            }
        }
        None
    }
}

//! `egress reflector`: a standalone BGP route reflector (the controller runs
//! the same speaker in-process).

use std::{net::SocketAddr, sync::Arc};

use anyhow::Result;
use clap::Args;
use egress_bgp::speaker::Speaker;

use super::bgp::{status_json, BgpArgs};
use crate::admin::{self, Response};

#[derive(Debug, Args)]
pub struct ReflectorArgs {
    #[command(flatten)]
    pub bgp: BgpArgs,
    /// Admin endpoint: /healthz, /readyz, /bgp/status, /metrics.
    #[arg(long, env = "EGRESS_ADMIN_ADDR", default_value = "127.0.0.1:9464")]
    pub admin_addr: SocketAddr,
    /// Make every node registered in the datastore a (passive) client.
    #[arg(long)]
    pub clients_from_datastore: bool,
    #[command(flatten)]
    pub datastore: super::datastore::DatastoreArgs,
}

pub async fn run(args: ReflectorArgs) -> Result<()> {
    let cfg = args.bgp.speaker_config(None)?;
    let mut exclude: std::collections::BTreeSet<std::net::IpAddr> =
        cfg.peers.iter().map(|p| p.address).collect();
    exclude.insert(std::net::IpAddr::V4(cfg.router_id));
    exclude.insert(args.bgp.listen.ip());
    let asn = cfg.local_asn;
    let mut cfg = cfg;
    let ds = if args.clients_from_datastore {
        let ds = args.datastore.connect().await?;
        cfg.peers
            .extend(crate::reflector_clients::initial_clients(&*ds, asn, &exclude).await);
        Some(ds)
    } else {
        None
    };
    let initial = cfg
        .peers
        .iter()
        .filter(|p| p.client)
        .map(|p| p.address)
        .collect();
    let speaker = Speaker::start(cfg).await?;
    let handle = speaker.handle();
    if let Some(ds) = ds {
        tokio::spawn(crate::reflector_clients::keep_in_step(
            ds,
            handle.clone(),
            asn,
            exclude,
            initial,
        ));
    }
    let status_handle = handle.clone();
    let (admin, _task) = admin::serve(
        args.admin_addr,
        Arc::new(move |path: String| {
            let h = status_handle.clone();
            Box::pin(async move {
                match path.as_str() {
                    "/healthz" | "/readyz" => match h.status().await {
                        Ok(_) => Response::ok("text/plain", "ok\n".into()),
                        Err(e) => Response::unavailable(&e.to_string()),
                    },
                    "/bgp/status" => match h.status().await {
                        Ok(s) => Response::json(&status_json(&s)),
                        Err(e) => Response::unavailable(&e.to_string()),
                    },
                    "/metrics" => match h.status().await {
                        Ok(s) => Response::ok(
                            crate::controller_metrics::CONTENT_TYPE,
                            crate::bgp_metrics::render(&s),
                        ),
                        Err(e) => Response::unavailable(&e.to_string()),
                    },
                    _ => Response::not_found(),
                }
            })
        }),
    )
    .await?;
    let listen = handle
        .listen_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    tracing::info!(%listen, %admin, "reflector running");
    println!("ready bgp={listen} admin={admin}");
    crate::signals::shutdown_signal().await;
    // Close without NOTIFICATION: every graceful-restart helper keeps our routes
    // for our restart time, so a reflector restart drops nothing (RFC 4724).
    speaker.abort();
    Ok(())
}

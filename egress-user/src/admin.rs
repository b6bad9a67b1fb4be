//! A tiny HTTP/1.1 endpoint for probes, metrics and status: GET only, one
//! request per connection. Each process (agent, controller, reflector) serves
//! its routes here; `egress bgp status` and the chart's probes read them.

use std::{future::Future, net::SocketAddr, pin::Pin, sync::Arc};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

/// A response: status code, content type, body.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    pub fn ok(content_type: &'static str, body: String) -> Self {
        Self {
            status: 200,
            content_type,
            body,
        }
    }
    pub fn json(value: &impl serde::Serialize) -> Self {
        Self::ok(
            "application/json",
            serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")),
        )
    }
    pub fn not_found() -> Self {
        Self {
            status: 404,
            content_type: "text/plain",
            body: "not found\n".into(),
        }
    }
    pub fn unavailable(why: &str) -> Self {
        Self {
            status: 503,
            content_type: "text/plain",
            body: format!("{why}\n"),
        }
    }
}

pub type Handler =
    Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// Binds `addr` and serves `handler` until the task is dropped. Returns the
/// bound address (useful with port 0).
pub async fn serve(
    addr: SocketAddr,
    handler: Handler,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                continue;
            };
            let handler = handler.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut used = 0;
                // Read up to the end of the request head; bodies are not used.
                while used < buf.len() {
                    match sock.read(&mut buf[used..]).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => used += n,
                    }
                    if buf[..used].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                let head = String::from_utf8_lossy(&buf[..used]);
                let mut parts = head.split_whitespace();
                let resp = match (parts.next(), parts.next()) {
                    (Some("GET"), Some(path)) => handler(path.to_owned()).await,
                    _ => Response {
                        status: 405,
                        content_type: "text/plain",
                        body: "only GET\n".into(),
                    },
                };
                let reason = match resp.status {
                    200 => "OK",
                    404 => "Not Found",
                    405 => "Method Not Allowed",
                    _ => "Service Unavailable",
                };
                let msg = format!(
                    "HTTP/1.1 {} {reason}\r\ncontent-type: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{}",
                    resp.status,
                    resp.content_type,
                    resp.body.len(),
                    resp.body
                );
                let _ = sock.write_all(msg.as_bytes()).await;
            });
        }
    });
    Ok((bound, task))
}

/// GETs `path` from an admin endpoint; returns the body of a 200 answer.
pub async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut sock = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach the admin endpoint {addr}: {e} (is the process running, and is --admin-addr right?)"))?;
    sock.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut out = String::new();
    sock.read_to_string(&mut out).await?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    anyhow::ensure!(
        status == "200",
        "{addr}{path} answered {status}: {}",
        body.trim()
    );
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn routes_answer_and_unknown_paths_are_404() {
        let handler: Handler = Arc::new(|path: String| {
            Box::pin(async move {
                match path.as_str() {
                    "/healthz" => Response::ok("text/plain", "ok\n".into()),
                    _ => Response::not_found(),
                }
            })
        });
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), handler)
            .await
            .unwrap();
        assert_eq!(get(addr, "/healthz").await.unwrap(), "ok\n");
        let err = get(addr, "/nope").await.unwrap_err().to_string();
        assert!(err.contains("404"), "{err}");
        task.abort();
    }
}

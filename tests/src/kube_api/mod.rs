//! A Kubernetes API server for the tests, in memory: the real one cannot be
//! installed here, so the egress binaries' Kubernetes datastore is run
//! against this one at the HTTP level. It serves, with the API server's
//! rules, the requests the datastore makes: lists (label and field
//! selectors), watches (chunked JSON lines from a resourceVersion), get,
//! create (generateName too), replace (409 on a stale resourceVersion),
//! merge patches, server-side apply of status by field manager, and
//! deletes with a resourceVersion precondition. See [`store`] for the rules.
//!
//! Anything else is answered 404 or 415 and logged in [`FakeApiServer::requests`],
//! so a request the datastore starts to make shows up as a failure, not a
//! silent success. Core objects keep the status they are created with: the
//! test plays the kubelet and writes Nodes and Pods whole.

pub mod authz;
pub mod schema;
pub mod store;
mod watch;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use axum::{
    body::{Body, Bytes},
    http::{header::CONTENT_TYPE, HeaderMap, Method, StatusCode, Uri},
    response::Response,
    Router,
};
use serde_json::{json, Value};

use crate::Netns;
use authz::{Attributes, Rule};
use store::{ApiError, ApiResult, Resource, Selector, Store};

struct Shared {
    store: Mutex<Store>,
    /// The store's revision after each change; watches wait on it.
    changed: tokio::sync::watch::Sender<u64>,
    /// Bumped by [`FakeApiServer::restart`]: every open watch ends.
    restarts: tokio::sync::watch::Sender<u64>,
    /// Watches answered 410 Gone.
    expired: std::sync::atomic::AtomicU64,
    requests: Mutex<Vec<Request>>,
    /// Bearer token -> caller. Empty: every request is allowed.
    callers: Mutex<std::collections::HashMap<String, Caller>>,
}

#[derive(Clone)]
struct Caller {
    name: String,
    /// None: allowed everything (a cluster admin).
    rules: Option<Vec<Rule>>,
}

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Request {
    /// Who sent it (each node of a test cluster has its own address).
    pub peer: std::net::IpAddr,
    /// The caller's name ("" without callers).
    pub who: String,
    /// `METHOD path?query`.
    pub line: String,
    /// The HTTP status of the answer (for a watch: of its start).
    pub status: u16,
}

impl Request {
    /// Answered 401 or 403: with the chart's RBAC, not allowed by its roles.
    pub fn refused(&self) -> bool {
        self.status == 401 || self.status == 403
    }
}

impl Shared {
    fn change<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        let mut s = self.store.lock().expect("store lock");
        let out = f(&mut s);
        self.changed.send_replace(s.revision());
        out
    }
}

/// Reads a server's objects; outlives nothing but the objects.
#[derive(Clone)]
pub struct StoreReader(Arc<Shared>);

impl StoreReader {
    pub fn read<R>(&self, f: impl FnOnce(&Store) -> R) -> R {
        f(&self.0.store.lock().expect("store lock"))
    }
}

/// The running server; stopped when dropped.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    kubeconfig: PathBuf,
    /// The callers' kubeconfigs (removed with the server).
    caller_configs: Mutex<Vec<PathBuf>>,
    /// The network namespace it listens in (None: this process's).
    ns_path: Option<PathBuf>,
    running: Option<Running>,
}

/// The serving thread, with its own runtime: stopping it closes the
/// listener and every connection.
struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Running {
    fn start(shared: Arc<Shared>, listener: std::net::TcpListener) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = Router::new().fallback(handle).with_state(shared);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
                let app = app.into_make_service_with_connect_info::<SocketAddr>();
                tokio::select! {
                    r = axum::serve(l, app) => r.expect("serving"),
                    _ = stopped => {}
                }
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        });
        Self { stop, thread }
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

impl FakeApiServer {
    /// Listens on `addr` inside `ns` (plain HTTP).
    pub fn start_in(ns: &Netns, addr: SocketAddr) -> Result<Self> {
        let listener = ns.enter(move || bind(addr))?;
        Self::serve(listener, Some(ns.path()))
    }

    /// Listens on `addr` in this process's namespace (port 0: any).
    pub fn start(addr: SocketAddr) -> Result<Self> {
        Self::serve(bind(addr)?, None)
    }

    fn serve(listener: std::net::TcpListener, ns_path: Option<PathBuf>) -> Result<Self> {
        let addr = listener.local_addr()?;
        let (changed, _) = tokio::sync::watch::channel(0);
        let (restarts, _) = tokio::sync::watch::channel(0);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            changed,
            restarts,
            expired: Default::default(),
            requests: Mutex::new(Vec::new()),
            callers: Mutex::new(Default::default()),
        });
        let running = Running::start(shared.clone(), listener);
        let kubeconfig =
            std::env::temp_dir().join(format!("{}.kubeconfig", crate::unique_name("kube")));
        std::fs::write(&kubeconfig, kubeconfig_text(addr, None))?;
        Ok(Self {
            shared,
            addr,
            kubeconfig,
            caller_configs: Mutex::new(Vec::new()),
            ns_path,
            running: Some(running),
        })
    }

    /// Stops serving, as an API server that went down: connections close,
    /// new ones are refused. The objects stay for [`FakeApiServer::start_again`].
    pub fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            r.stop();
        }
    }

    /// Serves again on the same address, with the same objects; the watch
    /// history is gone (see [`Store::compact`]).
    pub fn start_again(&mut self) -> Result<()> {
        if self.running.is_some() {
            return Ok(());
        }
        let addr = self.addr;
        let listener = match &self.ns_path {
            Some(path) => {
                let file = std::fs::File::open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                std::thread::spawn(move || {
                    use std::os::fd::AsRawFd;
                    // SAFETY: a valid namespace fd; affects only this new thread.
                    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(std::io::Error::last_os_error()).context("setns");
                    }
                    bind(addr)
                })
                .join()
                .map_err(|_| anyhow::anyhow!("binding inside the namespace panicked"))??
            }
            None => bind(addr)?,
        };
        self.shared.change(Store::compact);
        self.running = Some(Running::start(self.shared.clone(), listener));
        Ok(())
    }

    /// A kubeconfig file for this server (for `KUBECONFIG`).
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// Changes the stored objects directly, as the kubelet or kubectl
    /// would; watches see the change.
    pub fn change<R>(&self, f: impl FnOnce(&mut Store) -> R) -> R {
        self.shared.change(f)
    }

    /// Installs the CRDs of the chart (`charts/egress-gateway/crds`), as
    /// `kubectl apply -f` of them: their objects follow their schemas.
    pub fn install_chart_crds(&self) -> Result<()> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/egress-gateway/crds");
        let crds = schema::load_crds(&dir)?;
        self.change(|s| s.install_crds(crds));
        Ok(())
    }

    /// A handle that reads the stored objects from another thread.
    pub fn reader(&self) -> StoreReader {
        StoreReader(self.shared.clone())
    }

    /// Reads the stored objects.
    pub fn read<R>(&self, f: impl FnOnce(&Store) -> R) -> R {
        f(&self.shared.store.lock().expect("store lock"))
    }

    /// A caller known by its bearer `token`, allowed what `rules` grant
    /// (None: everything); returns a kubeconfig that authenticates as it.
    /// Once a caller is known, a request without a known token gets 401.
    pub fn add_caller(&self, token: &str, name: &str, rules: Option<Vec<Rule>>) -> Result<PathBuf> {
        self.shared.callers.lock().expect("callers lock").insert(
            token.into(),
            Caller {
                name: name.into(),
                rules,
            },
        );
        let path = self.kubeconfig.with_extension(format!(
            "{}.kubeconfig",
            token.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        ));
        std::fs::write(&path, kubeconfig_text(self.addr, Some(token)))?;
        self.caller_configs
            .lock()
            .expect("configs lock")
            .push(path.clone());
        Ok(path)
    }

    /// As an API server restart: every open watch ends; with `compact`,
    /// the change history goes too (etcd compacted while it was down), so
    /// a watch resuming from an older resourceVersion is answered 410 Gone.
    pub fn restart(&self, compact: bool) {
        if compact {
            self.shared.change(Store::compact);
        }
        self.shared.restarts.send_modify(|n| *n += 1);
    }

    /// How many watches were answered 410 Gone.
    pub fn expired_watches(&self) -> u64 {
        self.shared
            .expired
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Request> {
        self.shared.requests.lock().expect("requests lock").clone()
    }

    /// The requests so far that were refused (401 or 403): with the chart's
    /// RBAC, those its roles do not allow.
    pub fn refused_requests(&self) -> Vec<Request> {
        let mut all = self.requests();
        all.retain(Request::refused);
        all
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.kubeconfig);
        for p in self.caller_configs.lock().expect("configs lock").iter() {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn bind(addr: SocketAddr) -> Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?;
    l.set_nonblocking(true)?;
    Ok(l)
}

fn kubeconfig_text(addr: SocketAddr, token: Option<&str>) -> String {
    let user = match token {
        Some(t) => format!("\n    token: {t}"),
        None => " {}".into(),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
         users:\n- name: fake\n  user:{user}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
         current-context: fake\n"
    )
}

/// What a path names.
#[derive(Debug, PartialEq)]
enum Target {
    Collection {
        r: Resource,
        ns: String,
    },
    Object {
        r: Resource,
        ns: String,
        name: String,
        status: bool,
    },
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (gv, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => (v.to_string(), rest),
        ["apis", g, v, rest @ ..] => (format!("{g}/{v}"), rest),
        _ => return None,
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, plural, more @ ..] if *plural != "status" => (ns.to_string(), {
            let mut v = vec![*plural];
            v.extend_from_slice(more);
            v
        }),
        _ => (String::new(), rest.to_vec()),
    };
    let r = |p: &str| Resource::new(&gv, p);
    Some(match rest.as_slice() {
        [plural] => Target::Collection { r: r(plural), ns },
        [plural, name] => Target::Object {
            r: r(plural),
            ns,
            name: name.to_string(),
            status: false,
        },
        [plural, name, "status"] => Target::Object {
            r: r(plural),
            ns,
            name: name.to_string(),
            status: true,
        },
        _ => return None,
    })
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16);
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query(uri: &Uri, name: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == name).then(|| percent_decode(v))
    })
}

fn json_response(code: u16, v: &Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(v).expect("serialisable")))
        .expect("a response")
}

fn answer(code: u16, r: ApiResult<Value>) -> Response {
    match r {
        Ok(v) => json_response(code, &v),
        Err(e) => json_response(e.code, &e.status()),
    }
}

fn bad(code: u16, reason: &'static str, message: String) -> Response {
    json_response(
        code,
        &ApiError {
            code,
            reason,
            message,
        }
        .status(),
    )
}

fn body_json(body: &Bytes) -> Result<Value, String> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))
}

async fn handle(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let line = format!(
        "{method} {}",
        uri.path_and_query().map(|p| p.as_str()).unwrap_or("")
    );
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_string();
    let caller = {
        let callers = shared.callers.lock().expect("callers lock");
        if callers.is_empty() {
            Some(Caller {
                name: String::new(),
                rules: None,
            })
        } else {
            callers.get(&token).cloned()
        }
    };
    let resp = match &caller {
        None => bad(401, "Unauthorized", "Unauthorized".into()),
        Some(c) => match forbidden(c, &method, &uri) {
            Some(resp) => resp,
            None => route(&shared, method, &uri, &headers, body, &line),
        },
    };
    shared
        .requests
        .lock()
        .expect("requests lock")
        .push(Request {
            peer: peer.ip(),
            who: caller.map(|c| c.name).unwrap_or_default(),
            line,
            status: resp.status().as_u16(),
        });
    resp
}

/// The request's RBAC attributes, if its path is one the server knows.
fn attributes(method: &Method, uri: &Uri) -> Option<Attributes> {
    let target = parse_path(uri.path())?;
    let group = |r: &Resource| {
        r.group_version
            .rsplit_once('/')
            .map(|(g, _)| g.to_string())
            .unwrap_or_default()
    };
    let watch = matches!(query(uri, "watch").as_deref(), Some("true" | "1"));
    Some(match target {
        Target::Collection { r, ns } => Attributes {
            verb: match (method.as_str(), watch) {
                ("GET", true) => "watch",
                ("GET", false) => "list",
                ("POST", _) => "create",
                _ => return None,
            },
            api_group: group(&r),
            resource: r.plural.clone(),
            namespace: ns,
            name: String::new(),
        },
        Target::Object {
            r,
            ns,
            name,
            status,
        } => Attributes {
            verb: match method.as_str() {
                "GET" => "get",
                "PUT" => "update",
                "PATCH" => "patch",
                "DELETE" => "delete",
                _ => return None,
            },
            api_group: group(&r),
            resource: if status {
                format!("{}/status", r.plural)
            } else {
                r.plural.clone()
            },
            namespace: ns,
            name,
        },
    })
}

/// A 403 as the API server words it, unless the caller may.
fn forbidden(caller: &Caller, method: &Method, uri: &Uri) -> Option<Response> {
    let rules = caller.rules.as_ref()?;
    let a = attributes(method, uri)?;
    if authz::allowed(rules, &a) {
        return None;
    }
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    Some(bad(
        403,
        "Forbidden",
        format!(
            "{} is forbidden: User \"{}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            a.resource, caller.name, a.verb, a.resource, a.api_group
        ),
    ))
}

fn route(
    shared: &Arc<Shared>,
    method: Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Bytes,
    line: &str,
) -> Response {
    let uri = uri.clone();
    let Some(target) = parse_path(uri.path()) else {
        return bad(404, "NotFound", format!("not served here: {line}"));
    };
    let body = match body_json(&body) {
        Ok(b) => b,
        Err(why) => return bad(400, "BadRequest", why),
    };
    let ctype = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    match (method, target) {
        (Method::GET, Target::Collection { r, ns }) => {
            let sel = match Selector::parse(
                query(&uri, "labelSelector").as_deref(),
                query(&uri, "fieldSelector").as_deref(),
            ) {
                Ok(s) => s,
                Err(e) => return json_response(e.code, &e.status()),
            };
            if matches!(query(&uri, "watch").as_deref(), Some("true" | "1")) {
                let since = query(&uri, "resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let timeout = query(&uri, "timeoutSeconds")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(300u64);
                return watch::watch(
                    shared.clone(),
                    r,
                    ns,
                    sel,
                    since,
                    Duration::from_secs(timeout),
                );
            }
            let st = shared.store.lock().expect("store lock");
            answer(
                200,
                st.list(&r, &ns, &sel).map(|(items, rev)| {
                    let kind = store::info(&r).map(|i| i.kind).unwrap_or_default();
                    json!({"apiVersion": r.group_version, "kind": format!("{kind}List"),
                           "metadata": {"resourceVersion": rev.to_string()}, "items": items})
                }),
            )
        }
        (Method::POST, Target::Collection { r, ns }) => {
            answer(201, shared.change(|s| s.create(&r, &ns, body)))
        }
        (Method::GET, Target::Object { r, ns, name, .. }) => answer(
            200,
            shared.store.lock().expect("store lock").get(&r, &ns, &name),
        ),
        (
            Method::PUT,
            Target::Object {
                r,
                ns,
                name,
                status: false,
            },
        ) => answer(200, shared.change(|s| s.replace(&r, &ns, &name, body))),
        (
            Method::PATCH,
            Target::Object {
                r,
                ns,
                name,
                status,
            },
        ) => {
            if ctype.starts_with("application/merge-patch+json") && !status {
                answer(200, shared.change(|s| s.merge(&r, &ns, &name, &body)))
            } else if ctype.starts_with("application/apply-patch+yaml") && status {
                let manager = query(&uri, "fieldManager").unwrap_or_default();
                let force = query(&uri, "force").as_deref() == Some("true");
                answer(
                    200,
                    shared.change(|s| s.apply_status(&r, &ns, &name, &manager, force, &body)),
                )
            } else {
                bad(
                    415,
                    "UnsupportedMediaType",
                    format!(
                        "{ctype} on {} is not served here",
                        if status { "status" } else { "the object" }
                    ),
                )
            }
        }
        (
            Method::DELETE,
            Target::Object {
                r,
                ns,
                name,
                status: false,
            },
        ) => {
            let pre = body
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(str::to_string);
            answer(
                200,
                shared.change(|s| s.delete(&r, &ns, &name, pre.as_deref())),
            )
        }
        (m, _) => bad(
            405,
            "MethodNotAllowed",
            format!("{m} not served here: {line}"),
        ),
    }
}

#[cfg(test)]
mod tests;

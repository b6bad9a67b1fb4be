//! Watches: every change after a resourceVersion, then new ones as they
//! come, as JSON lines on one chunked response that ends after its
//! timeout or when the server restarts. A resourceVersion of 0 starts with
//! the current objects as ADDED; one older than the compacted history gets
//! a single ERROR event (410 Expired), as the API server answers.

use std::{collections::VecDeque, sync::Arc, time::Duration};

use axum::{
    body::{Body, Bytes},
    http::{header::CONTENT_TYPE, StatusCode},
    response::Response,
};
use serde_json::{json, Value};

use super::{
    bad,
    store::{self, Resource, Selector},
    Shared,
};

struct State {
    shared: Arc<Shared>,
    changed: tokio::sync::watch::Receiver<u64>,
    restarts: tokio::sync::watch::Receiver<u64>,
    since: u64,
    queue: VecDeque<Value>,
    /// An ERROR event was queued: the watch ends after it.
    over: bool,
}

pub(super) fn watch(
    shared: Arc<Shared>,
    r: Resource,
    ns: String,
    sel: Selector,
    since: u64,
    timeout: Duration,
) -> Response {
    if store::info(&r).is_none() {
        return bad(404, "NotFound", format!("no resource {r:?}"));
    }
    let deadline = tokio::time::Instant::now() + timeout;
    let mut queue = VecDeque::new();
    let mut since = since;
    if since == 0 {
        let st = shared.store.lock().expect("store lock");
        if let Ok((items, rev)) = st.list(&r, &ns, &sel) {
            queue.extend(
                items
                    .into_iter()
                    .map(|o| json!({"type": "ADDED", "object": o})),
            );
            since = rev;
        }
    }
    let state = State {
        changed: shared.changed.subscribe(),
        restarts: shared.restarts.subscribe(),
        shared,
        since,
        queue,
        over: false,
    };
    let stream = futures::stream::unfold(state, move |mut st| {
        let (r, ns, sel) = (r.clone(), ns.clone(), sel.clone());
        async move {
            loop {
                if let Some(ev) = st.queue.pop_front() {
                    let mut line = serde_json::to_vec(&ev).expect("serialisable");
                    line.push(b'\n');
                    return Some((Ok::<_, std::io::Error>(Bytes::from(line)), st));
                }
                if st.over {
                    return None;
                }
                {
                    let store = st.shared.store.lock().expect("store lock");
                    match store.events_after(&r, &ns, &sel, st.since) {
                        Ok(events) => st.queue.extend(
                            events
                                .into_iter()
                                .map(|(t, o)| json!({"type": t, "object": o})),
                        ),
                        Err(e) => {
                            st.shared
                                .expired
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            st.queue
                                .push_back(json!({"type": "ERROR", "object": e.status()}));
                            st.over = true;
                        }
                    }
                    st.since = store.revision();
                    st.changed.mark_unchanged();
                }
                if !st.queue.is_empty() {
                    continue;
                }
                tokio::select! {
                    r = st.changed.changed() => if r.is_err() { return None },
                    _ = st.restarts.changed() => return None,
                    _ = tokio::time::sleep_until(deadline) => return None,
                }
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(CONTENT_TYPE, "application/json")
        .body(Body::from_stream(stream))
        .expect("a response")
}

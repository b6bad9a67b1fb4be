//! The worker program on pod veths. Its first load (the verifier's pass,
//! seconds on a busy node) runs on a blocking thread, off the agent's loop:
//! done in the loop, it held the heartbeat back, and a gateway whose first
//! pod veth appeared could be taken for dead; done before the loop, it
//! delayed a restarted agent's first heartbeat past the announce lease.
//! Veths that appear meanwhile keep their previous attachment and wait.

use std::sync::Mutex;

use anyhow::Result;
use egress_common::maps::PROG_WORKER_EGRESS;

use super::published::Published;
use crate::{
    datapath::{links, Datapath},
    node::link::ObservedLink,
};

pub(super) struct PodVeths {
    /// None while the worker program loads.
    dp: Option<Datapath>,
    loading: Option<tokio::task::JoinHandle<(Datapath, Result<()>)>>,
    /// Veths that appeared while the program loaded or while held.
    waiting: Vec<ObservedLink>,
    /// The policy maps were created anew (their pins had an older layout):
    /// pod veths keep the previous program, with its filled maps, until the
    /// first apply has filled the new ones; a new program would match no
    /// policy and let selected pods' traffic out untranslated.
    held: bool,
}

impl PodVeths {
    /// Starts loading the worker program of `dp`.
    pub fn start(dp: Datapath, held: bool) -> Self {
        let loading = tokio::task::spawn_blocking(move || {
            let mut dp = dp;
            let started = std::time::Instant::now();
            let r = links::load(&mut dp, PROG_WORKER_EGRESS).map(|_| ());
            tracing::debug!(took = ?started.elapsed(), ok = r.is_ok(), "worker program loaded");
            (dp, r)
        });
        Self {
            dp: None,
            loading: Some(loading),
            waiting: Vec::new(),
            held,
        }
    }

    /// The worker program is loaded (or its load failed and each attach
    /// tries again).
    pub fn is_loaded(&self) -> bool {
        self.dp.is_some()
    }

    /// A pod veth exists: attach now, or once the program is loaded and
    /// the hold is released.
    pub fn appeared(&mut self, link: ObservedLink, published: &Mutex<Published>) {
        match self.dp.as_mut() {
            Some(dp) if !self.held => attach(dp, &link, published),
            _ => self.waiting.push(link),
        }
    }

    pub fn removed(&mut self, index: u32) {
        self.waiting.retain(|l| l.index != index);
    }

    /// The first apply filled the maps: held veths may get the program.
    pub fn release(&mut self, published: &Mutex<Published>) {
        self.held = false;
        self.flush(published);
    }

    /// Waits for the load (pending once it is done).
    pub async fn loaded(&mut self) -> (Datapath, Result<()>) {
        match self.loading.as_mut() {
            Some(task) => task
                .await
                .expect("the worker program's load does not panic"),
            None => std::future::pending().await,
        }
    }

    /// The load finished. A failure is reported; each attach then tries the
    /// load again and reports its own error.
    pub fn on_loaded(&mut self, (dp, r): (Datapath, Result<()>), published: &Mutex<Published>) {
        self.loading = None;
        if let Err(e) = r {
            tracing::error!(error = %format!("{e:#}"), "loading the worker program failed");
        }
        self.dp = Some(dp);
        self.flush(published);
    }

    fn flush(&mut self, published: &Mutex<Published>) {
        let Some(dp) = self.dp.as_mut() else { return };
        if self.held {
            return;
        }
        for link in std::mem::take(&mut self.waiting) {
            attach(dp, &link, published);
        }
    }
}

/// Puts the worker program on a pod's veth (taking over a previous
/// agent's attachment).
fn attach(dp: &mut Datapath, link: &ObservedLink, published: &Mutex<Published>) {
    match links::attach_ingress(dp, PROG_WORKER_EGRESS, &link.name, link.index) {
        Ok(how) => {
            let mut p = published.lock().unwrap();
            match how {
                links::Attached::TakenOver => p.resumed.pod_links_taken_over += 1,
                links::Attached::New => p.resumed.pod_links_new += 1,
            }
            tracing::info!(iface = %link.name, ?how, "worker program on pod veth")
        }
        Err(e) => {
            tracing::error!(iface = %link.name, error = %format!("{e:#}"), "attaching to pod veth failed")
        }
    }
}

//! A [`ClusterView`] read from the datastore in one go (every kind, or a
//! few), for passes and readers that keep no watch.

use super::{put, ClusterView, Put};
use crate::datastore::{Datastore, Kind, Result};

/// Lists every kind and decodes it. Objects that do not decode are skipped
/// (and logged): one bad object never stops the others.
pub async fn load_view(ds: &dyn Datastore) -> Result<ClusterView> {
    load_kinds(ds, &Kind::ALL).await
}

/// As [`load_view`], listing only `kinds` (the others stay empty): for
/// readers that need a few small kinds and must not read every pod.
pub async fn load_kinds(ds: &dyn Datastore, kinds: &[Kind]) -> Result<ClusterView> {
    let mut view = ClusterView::default();
    for &kind in kinds {
        for s in &ds.list(kind).await?.0 {
            put(&mut view, s, Put::Append);
        }
    }
    Ok(view)
}

//! Reads of a whole key prefix in pages. One answer is one gRPC message,
//! and the client refuses messages over 4 MiB: 50,000 pods in one answer
//! were 16 MB, and every list of them failed. Each page is read at the
//! revision of the first, so together they are one consistent snapshot.

use etcd_client::{GetOptions, KeyValue};

use super::{again, EtcdDatastore};
use crate::datastore::Result;

/// Keys per page: 500 pods are about 160 kB. An object is at most the
/// server's request limit (1.5 MiB by default), so a page of large ones can
/// still be big: a page's answer may be up to [`MAX_ANSWER`].
const PAGE: i64 = 500;
const MAX_ANSWER: usize = 64 << 20;

/// Every key under a prefix, and the revision they were read at.
pub(super) struct Ranged {
    pub kvs: Vec<KeyValue>,
    pub revision: i64,
}

impl Ranged {
    pub fn kvs(&self) -> &[KeyValue] {
        &self.kvs
    }
}

/// The first key after every key that starts with `prefix` (etcd's range
/// end for a prefix): the prefix with its last byte below 0xff raised by one.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the key space.
    vec![0]
}

impl EtcdDatastore {
    /// Every key under `prefix`, page by page at one revision.
    pub(super) async fn range_prefix(&self, prefix: String) -> Result<Ranged> {
        self.range_pages(prefix, false).await
    }

    /// [`EtcdDatastore::range_prefix`], the keys without their values.
    pub(super) async fn range_prefix_keys(&self, prefix: String) -> Result<Ranged> {
        self.range_pages(prefix, true).await
    }

    async fn range_pages(&self, prefix: String, keys_only: bool) -> Result<Ranged> {
        let end = prefix_end(prefix.as_bytes());
        let mut from = prefix.into_bytes();
        let mut out = Ranged {
            kvs: Vec::new(),
            revision: 0,
        };
        loop {
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(PAGE)
                .with_revision(out.revision);
            if keys_only {
                opts = opts.with_keys_only();
            }
            let mut resp = again(|| {
                let mut kv = self
                    .client()
                    .kv_client()
                    .max_decoding_message_size(MAX_ANSWER);
                let (key, opts) = (from.clone(), opts.clone());
                async move { Ok(kv.get(key, Some(opts)).await?) }
            })
            .await?;
            if out.revision == 0 {
                out.revision = resp.header().map(|h| h.revision()).unwrap_or_default();
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            // The next page starts right after this page's last key.
            if let Some(last) = kvs.last() {
                from = [last.key(), &[0]].concat();
            }
            let empty = kvs.is_empty();
            out.kvs.extend(kvs);
            if !more || empty {
                return Ok(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn the_range_end_of_a_prefix() {
        assert_eq!(
            prefix_end(b"/egress/objects/pods/"),
            b"/egress/objects/pods0"
        );
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), [0]);
    }
}

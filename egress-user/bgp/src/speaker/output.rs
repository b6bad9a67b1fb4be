//! A session's output: the bytes waiting for the socket, written as the
//! peer takes them. The session's loop writes when the socket is writable,
//! next to its reads and timers, so a peer that stops reading stalls
//! nothing but its own output (and the send hold timer sees it).

use std::collections::VecDeque;
use std::io;

use bytes::{Buf, Bytes};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;

pub(super) struct Output {
    wr: OwnedWriteHalf,
    queue: VecDeque<Bytes>,
    /// The RIB's last batch in the queue, confirmed once all is written.
    batch: Option<u64>,
}

impl Output {
    pub(super) fn new(wr: OwnedWriteHalf) -> Output {
        Output {
            wr,
            queue: VecDeque::new(),
            batch: None,
        }
    }

    pub(super) fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.queue.push_back(b);
        }
    }

    /// Marks the end of the RIB's batch `seq` (pushed just before).
    pub(super) fn end_batch(&mut self, seq: u64) {
        self.batch = Some(seq);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The batch to confirm, once nothing is left to write.
    pub(super) fn take_done_batch(&mut self) -> Option<u64> {
        if self.is_empty() {
            self.batch.take()
        } else {
            None
        }
    }

    /// Waits until the socket takes some of the front chunk and drops what
    /// it took. Cancel-safe: when the wait is abandoned, nothing was
    /// written. Pending forever when there is nothing to write.
    pub(super) async fn write_some(&mut self) -> io::Result<()> {
        let Some(front) = self.queue.front_mut() else {
            return std::future::pending().await;
        };
        let n = self.wr.write(front).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        self.took(n);
        Ok(())
    }

    /// Writes what the socket takes right now, without waiting: the last
    /// words (a NOTIFICATION) before the connection is dropped.
    pub(super) fn flush_now(&mut self) {
        while let Some(front) = self.queue.front() {
            match self.wr.try_write(front) {
                Ok(n) if n > 0 => self.took(n),
                _ => return,
            }
        }
    }

    fn took(&mut self, n: usize) {
        if let Some(front) = self.queue.front_mut() {
            front.advance(n);
            if front.is_empty() {
                self.queue.pop_front();
            }
        }
    }
}

//! A session's output: the bytes waiting for the socket, written as the
//! peer takes them, with the ends of the RIB's batches among them. The
//! session's loop writes when the socket is writable, next to its reads
//! and timers, so a peer that stops reading stalls nothing but its own
//! output (and the send hold timer sees it).

use std::collections::VecDeque;
use std::io;

use bytes::{Buf, Bytes};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;

enum Item {
    Data(Bytes),
    /// The RIB's batch ends here: confirmed once what is before is written.
    End(u64),
}

pub(super) struct Output {
    wr: OwnedWriteHalf,
    queue: VecDeque<Item>,
    /// Data items in the queue.
    data: usize,
}

impl Output {
    pub(super) fn new(wr: OwnedWriteHalf) -> Output {
        Output {
            wr,
            queue: VecDeque::new(),
            data: 0,
        }
    }

    pub(super) fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.queue.push_back(Item::Data(b));
            self.data += 1;
        }
    }

    /// Marks the end of the RIB's batch `seq` (pushed just before).
    pub(super) fn end_batch(&mut self, seq: u64) {
        self.queue.push_back(Item::End(seq));
    }

    pub(super) fn is_empty(&self) -> bool {
        self.data == 0
    }

    /// The last batch all written, if one was since the last call.
    pub(super) fn take_done_batch(&mut self) -> Option<u64> {
        let mut done = None;
        while let Some(Item::End(seq)) = self.queue.front() {
            done = Some(*seq);
            self.queue.pop_front();
        }
        done
    }

    fn front_data(&mut self) -> Option<&mut Bytes> {
        self.queue.iter_mut().find_map(|i| match i {
            Item::Data(b) => Some(b),
            Item::End(_) => None,
        })
    }

    /// Waits until the socket takes some of the first chunk and drops what
    /// it took. Cancel-safe: when the wait is abandoned, nothing was
    /// written. Pending forever when there is nothing to write.
    pub(super) async fn write_some(&mut self) -> io::Result<()> {
        let Some(front) = self.front_data() else {
            return std::future::pending().await;
        };
        let front = front.clone();
        let n = self.wr.write(&front).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        self.took(n);
        Ok(())
    }

    /// Writes what the socket takes right now, without waiting: the last
    /// words (a NOTIFICATION) before the connection is dropped.
    pub(super) fn flush_now(&mut self) {
        while let Some(front) = self.front_data() {
            let front = front.clone();
            match self.wr.try_write(&front) {
                Ok(n) if n > 0 => self.took(n),
                _ => return,
            }
        }
    }

    fn took(&mut self, n: usize) {
        let Some(at) = self.queue.iter().position(|i| matches!(i, Item::Data(_))) else {
            return;
        };
        if let Some(Item::Data(b)) = self.queue.get_mut(at) {
            b.advance(n);
            if b.is_empty() {
                self.queue.remove(at);
                self.data -= 1;
            }
        }
    }
}

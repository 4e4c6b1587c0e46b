//! Read-ahead of chunks for sequential reads.
//!
//! A chunk is 4 MiB (1024 blocks of 4 KiB) and one GET of it costs a
//! round trip plus its transfer; fetched one at a time, as a reader asks
//! for them, a cold sequential read runs at one GET's speed, far below
//! what the store serves with several in flight (`foliofs bench` measures
//! both). When reads go on where the previous one ended, the chunks
//! after the read's last are GOT meanwhile on the device's runtime, up to
//! `depth` at a time; `chunk()` takes a fetch's bytes instead of asking
//! the store and verifies them (`decode_chunk`) as it verifies its own,
//! then caches them like any chunk. A fetch that failed is forgotten and
//! the chunk is fetched again, with retries, by the reader that needs it:
//! read-ahead never turns a passing failure into an error.
//!
//! A few sequential streams are followed at once, each by where its last
//! read ended: the engine's direct read of a file interleaves its data
//! with reads of the blocks holding their checksums elsewhere, one block
//! at a time, and either alone would break the other's sequence. A
//! stream reads ahead once it has read a quarter of a chunk in order (a
//! file's 1 MiB reads from the second on; a stream of single metadata
//! blocks only after 256 of them). A read a few blocks past a stream's
//! end (up to 64: a file's next extent) goes on with it; reads that jump
//! about start nothing.
//! The depth, for all streams together, is bounded by the cache, so that
//! chunks fetched ahead are not evicted by each other before they are
//! read: at most half the chunks the cache holds.
//!
//! Lock: `inner` is taken alone: never with the device's `state`, never
//! while waiting for a fetch.

use bytes::Bytes;
use object_store::path::Path;
use object_store::ObjectStore;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::task::JoinHandle;

type Fetch = JoinHandle<object_store::Result<Bytes>>;

pub(crate) struct ReadAhead {
    /// Chunks fetched ahead at a time (0: read-ahead off).
    depth: usize,
    inner: Mutex<Inner>,
    /// Chunks read from a fetch made ahead (`ObjectStats::chunks_read_ahead`).
    used: AtomicU64,
}

/// Streams followed at once.
const STREAMS: usize = 4;

/// Reads that went on from each other: where the next would start, and
/// blocks read in order so far.
#[derive(Clone, Copy)]
struct Stream {
    next_block: u64,
    run_blocks: u64,
}

struct Inner {
    /// The streams, the latest read's first.
    streams: Vec<Stream>,
    /// Fetches started, by chunk index: (version, the fetch).
    fetches: BTreeMap<u64, (u64, Fetch)>,
}

impl ReadAhead {
    /// Read-ahead of `wanted` chunks at a time, within a cache of
    /// `cache_chunks`.
    pub(crate) fn new(wanted: usize, cache_chunks: usize) -> ReadAhead {
        ReadAhead {
            depth: wanted.min(cache_chunks / 2),
            inner: Mutex::new(Inner {
                streams: Vec::with_capacity(STREAMS),
                fetches: BTreeMap::new(),
            }),
            used: AtomicU64::new(0),
        }
    }

    /// A read of blocks `first..end` (chunks of `chunk_blocks`): if it
    /// goes on where a stream's last read ended and the stream has read a
    /// quarter chunk in order, the chunks to fetch ahead (those after the
    /// read's last chunk, `depth` of them). Fetches of chunks before this
    /// read's are dropped: its stream has passed them.
    pub(crate) fn after_read(
        &self,
        first: u64,
        end: u64,
        chunk_blocks: u64,
    ) -> std::ops::Range<u64> {
        if self.depth == 0 || end <= first {
            return 0..0;
        }
        let mut a = self.inner.lock();
        let n = end - first;
        // A small step forward (the next extent of a file, after a few
        // blocks of metadata) still goes on.
        let step = chunk_blocks / 16;
        let goes_on = |s: &Stream| first >= s.next_block && first - s.next_block <= step;
        let stream = match a.streams.iter().position(goes_on) {
            Some(i) => {
                let s = a.streams.remove(i);
                Stream {
                    next_block: end,
                    run_blocks: s.run_blocks + n,
                }
            }
            None => {
                a.streams.truncate(STREAMS - 1);
                Stream {
                    next_block: end,
                    run_blocks: 0,
                }
            }
        };
        a.streams.insert(0, stream);
        let from = first / chunk_blocks;
        let passed: Vec<u64> = a.fetches.range(..from).map(|(&i, _)| i).collect();
        for i in passed {
            let (_, f) = a.fetches.remove(&i).expect("listed");
            f.abort();
        }
        if stream.run_blocks < chunk_blocks / 4 {
            return 0..0;
        }
        let last = (end - 1) / chunk_blocks;
        last + 1..last + 1 + self.depth as u64
    }

    /// Start fetching chunk `idx` at `version` from `key`, unless it is
    /// fetching already or `depth` fetches are.
    pub(crate) fn start(
        &self,
        rt: &tokio::runtime::Runtime,
        store: &Arc<dyn ObjectStore>,
        key: Path,
        idx: u64,
        version: u64,
    ) {
        let mut a = self.inner.lock();
        if a.fetches.get(&idx).is_some_and(|(v, _)| *v == version) || a.fetches.len() >= self.depth
        {
            return;
        }
        let store = store.clone();
        let fetch = rt.spawn(async move { store.get(&key).await?.bytes().await });
        if let Some((_, old)) = a.fetches.insert(idx, (version, fetch)) {
            old.abort();
        }
    }

    /// The bytes of chunk `idx` at `version` if a fetch made ahead has
    /// them (waiting for it if it is still running), unverified; None if
    /// none was made or it failed.
    pub(crate) fn take(
        &self,
        rt: &tokio::runtime::Runtime,
        idx: u64,
        version: u64,
    ) -> Option<Bytes> {
        let fetch = {
            let mut a = self.inner.lock();
            match a.fetches.get(&idx) {
                Some((v, _)) if *v == version => a.fetches.remove(&idx).map(|(_, f)| f),
                _ => None,
            }
        }?;
        match rt.block_on(fetch) {
            Ok(Ok(bytes)) => {
                self.used.fetch_add(1, Ordering::Relaxed);
                Some(bytes)
            }
            Ok(Err(e)) => {
                log::debug!("chunk {idx} fetched ahead: {e}; fetching it again");
                None
            }
            Err(_) => None,
        }
    }

    /// Chunks read from fetches made ahead so far.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::ReadAhead;

    #[test]
    fn only_sequential_reads_look_ahead() {
        let ra = ReadAhead::new(4, 64);
        assert_eq!(ra.after_read(0, 256, 1024), 0..0, "the first read");
        assert_eq!(ra.after_read(256, 512, 1024), 1..5);
        assert_eq!(ra.after_read(5000, 5256, 1024), 0..0, "a jump");
        assert_eq!(ra.after_read(5256, 5512, 1024), 6..10);
        assert_eq!(ra.after_read(5550, 5600, 1024), 6..10, "a step");
        assert_eq!(ra.after_read(5300, 5400, 1024), 0..0, "backwards");
        assert_eq!(ra.after_read(5600, 6144, 1024), 6..10);
        // A file's data and its checksums' blocks, in turn.
        let ra = ReadAhead::new(4, 64);
        for k in 0..4 {
            let data = ra.after_read(4096 + k * 256, 4096 + (k + 1) * 256, 1024);
            assert_eq!(data, if k == 0 { 0..0 } else { 5..9 }, "data read {k}");
            assert_eq!(
                ra.after_read(9 + k, 10 + k, 1024),
                0..0,
                "checksum read {k}"
            );
        }
        assert_eq!(ReadAhead::new(4, 4).depth, 2, "half the cache");
        assert_eq!(ReadAhead::new(0, 64).after_read(0, 1, 1024), 0..0);
    }
}

//! Read-ahead of chunks for sequential reads.
//!
//! A chunk is 4 MiB (1024 blocks of 4 KiB) and one GET of it costs a
//! round trip plus its transfer; fetched one at a time, as a reader asks
//! for them, a cold sequential read runs at one GET's speed, far below
//! what the store serves with several in flight (`foliofs bench` measures
//! both). When reads go on where the previous one ended, the chunks
//! after the read's last are GOT meanwhile on the device's runtime, up to
//! `depth` GETs running at a time. A read that spans chunks the cache
//! lacks starts those after its first the same way, so that they come in
//! together rather than one after the other (a cold file's first read,
//! a large random read). A fetch also verifies what it got
//! (`Chunk::decode`, on the runtime's blocking threads): the checksum is
//! done beside the reader, not by it, and `chunk()` takes the verified
//! chunk (the GET's own buffer) instead of asking the store, then
//! caches it like any chunk. A fetch that failed, or got bytes that do
//! not verify, is forgotten and the chunk is fetched again, with retries,
//! and verified by the reader that needs it: read-ahead never turns a
//! passing failure into an error, nor lets an unverified block through.
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
//! read: at most half the chunks the cache holds. Only GETs still running
//! count against it: a fetch that is done waits for its reader without
//! holding the next one back (done or not, at most twice `depth` fetches
//! are held).
//!
//! Lock: `inner` is taken alone: never with the device's `state`, never
//! while waiting for a fetch.

use crate::layout::Chunk;
use object_store::path::Path;
use object_store::ObjectStore;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// What a fetch made ahead got: the chunk, verified; None if the GET
/// failed or what it got does not verify.
type Fetched = Option<Chunk>;
type Fetch = JoinHandle<Fetched>;

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
    /// read's last chunk, `depth` of them). Fetches that no stream
    /// followed will read any more are dropped.
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
        // Fetches no stream will read: behind every stream, or of a
        // stream no longer followed. (Not just those behind this read:
        // the file's data and its checksums are read in turn, and each
        // stream's fetches must outlive the other's reads.)
        let depth = self.depth as u64;
        let wanted = |i: u64, s: &Stream| {
            let at = s.next_block / chunk_blocks;
            i >= at && i <= at + depth
        };
        let unwanted: Vec<u64> = a
            .fetches
            .keys()
            .copied()
            .filter(|&i| !a.streams.iter().any(|s| wanted(i, s)))
            .collect();
        for i in unwanted {
            let (_, f) = a.fetches.remove(&i).expect("listed");
            f.abort();
        }
        if stream.run_blocks < chunk_blocks / 4 {
            return 0..0;
        }
        let last = (end - 1) / chunk_blocks;
        last + 1..last + 1 + self.depth as u64
    }

    /// Start fetching chunk `idx` at `version` (`len` bytes of blocks)
    /// from `key` and verifying it, unless it is fetching already or
    /// `depth` GETs are running.
    pub(crate) fn start(
        &self,
        rt: &tokio::runtime::Runtime,
        store: &Arc<dyn ObjectStore>,
        key: Path,
        idx: u64,
        version: u64,
        len: usize,
    ) {
        let mut a = self.inner.lock();
        if a.fetches.get(&idx).is_some_and(|(v, _)| *v == version) {
            return;
        }
        let running = a.fetches.values().filter(|(_, f)| !f.is_finished()).count();
        if running >= self.depth || a.fetches.len() >= 2 * self.depth {
            return;
        }
        let store = store.clone();
        let fetch = rt.spawn(async move {
            let bytes = match crate::pool::get(&*store, &key, Chunk::object_len(len)).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    log::debug!("chunk {idx} fetched ahead: {e}; fetching it again");
                    return None;
                }
            };
            // The checksum of 4 MiB: off the runtime's workers, which go
            // on receiving the other fetches.
            let checked = tokio::task::spawn_blocking(move || Chunk::decode(&key, idx, bytes, len))
                .await
                .ok()?;
            match checked {
                Ok(chunk) => Some(chunk),
                Err(e) => {
                    log::warn!("chunk {idx} fetched ahead: {e}; fetching it again");
                    None
                }
            }
        });
        if let Some((_, old)) = a.fetches.insert(idx, (version, fetch)) {
            old.abort();
        }
    }

    /// Chunk `idx` at `version`, verified, if a fetch made ahead has it
    /// (waiting for it if it is still running); None if none was made or
    /// it failed.
    pub(crate) fn take(
        &self,
        rt: &tokio::runtime::Runtime,
        idx: u64,
        version: u64,
    ) -> Option<Chunk> {
        let fetch = {
            let mut a = self.inner.lock();
            match a.fetches.get(&idx) {
                Some((v, _)) if *v == version => a.fetches.remove(&idx).map(|(_, f)| f),
                _ => None,
            }
        }?;
        let got = rt.block_on(fetch).ok().flatten()?;
        self.used.fetch_add(1, Ordering::Relaxed);
        Some(got)
    }

    /// Chunks read from fetches made ahead so far.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::ReadAhead;
    use object_store::path::Path;
    use object_store::ObjectStore;
    use std::sync::Arc;

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

    #[test]
    fn a_read_of_checksums_further_on_keeps_the_data_fetches() {
        let rt = crate::store::runtime().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let ra = ReadAhead::new(4, 64);
        let start = |r: std::ops::Range<u64>| {
            for i in r {
                ra.start(&rt, &store, Path::from(format!("c{i}")), i, 1, 4096);
            }
        };
        let fetching = || ra.inner.lock().fetches.keys().copied().collect::<Vec<_>>();
        // Data in chunk 4 on, its checksums' blocks in chunk 300.
        for k in 0..4 {
            start(ra.after_read(4096 + k * 256, 4096 + (k + 1) * 256, 1024));
            start(ra.after_read(300 * 1024 + k, 300 * 1024 + k + 1, 1024));
        }
        assert_eq!(fetching(), vec![5, 6, 7, 8], "the data's fetches stay");
        // A jump elsewhere, four times: the old streams are forgotten and
        // their fetches dropped.
        for k in 0..4 {
            ra.after_read(100_000 + k * 100, 100_001 + k * 100, 1024);
        }
        assert!(fetching().is_empty(), "{:?}", fetching());
    }
}

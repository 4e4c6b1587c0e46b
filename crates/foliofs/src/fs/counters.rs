//! Event counters (bumped without the metadata lock, read as a snapshot)
//! and the statistics the engine reports.

use crate::meta;
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Declares the event counters once: the atomics the engine bumps and the
/// plain snapshot readers get.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        /// Event counters, readable at any time without the metadata lock.
        #[derive(Debug, Default)]
        pub struct Counters {
            $($(#[$doc])* pub $name: AtomicU64,)*
            /// Direct I/O device requests by size: bucket k counts requests
            /// of 2^k .. 2^(k+1)-1 blocks.
            pub dio_request_blocks: [AtomicU64; DIO_HIST_BUCKETS],
        }

        #[derive(Clone, Debug, Serialize)]
        pub struct CounterSnapshot {
            $($(#[$doc])* pub $name: u64,)*
            pub dio_request_blocks: Vec<u64>,
            pub journal: meta::JournalStats,
        }

        impl Counters {
            pub(super) fn snapshot(&self, journal: meta::JournalStats) -> CounterSnapshot {
                CounterSnapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                    dio_request_blocks: self
                        .dio_request_blocks
                        .iter()
                        .map(|a| a.load(Ordering::Relaxed))
                        .collect(),
                    journal,
                }
            }
        }
    };
}

/// Buckets of the direct I/O request-size histogram (1 .. 2^15+ blocks).
pub const DIO_HIST_BUCKETS: usize = 16;

counters! {
    bytes_written_app,
    bytes_read_app,
    bytes_dirtied,
    bytes_written_back,
    data_device_writes,
    data_device_reads,
    /// Data blocks whose checksum did not match (EIO returned).
    csum_failures,
    mapping_lookups,
    writebacks,
    overwrite_intents,
    /// Overwritten bytes logged in the journal (small overwrites), and
    /// written out of place (large ones).
    overwrite_logged_bytes,
    overwrite_cow_bytes,
    /// fsync and fdatasync calls (for flushes per fdatasync).
    fsyncs,
    /// Durable commits that waited for other committers to join.
    commit_batch_waits,
    /// fdatasync calls that only flushed the data (no journal commit).
    datasync_flush_only,
    /// Clean folios evicted from the page cache, and the scans for them.
    folios_evicted,
    cache_scans,
    /// Folios dropped as their writeback completed
    /// (`MountOptions::drop_behind`).
    folios_dropped_behind,
    /// Buffered reads drop-behind served from the device straight into
    /// the caller's buffer, not through folios, and their bytes.
    uncached_reads,
    uncached_read_bytes,
    /// Passes over the inodes in memory that let go of the unused ones.
    inode_trims,
    /// Bytes of fresh memory mapped for folios (the rest reuse freed
    /// folio memory).
    folio_bytes_mapped,
    /// Direct reads and writes asked for by the application, and bytes.
    dio_reads,
    dio_writes,
    dio_read_bytes,
    dio_write_bytes,
    /// Device requests issued by direct I/O.
    dio_read_requests,
    dio_write_requests,
    /// Direct writes done as overwrites under the shared lock, and those
    /// that took the exclusive lock.
    dio_overwrites_shared,
    dio_writes_exclusive,
    /// Most direct overwrites in progress at once, over all files (not an
    /// event count). For one file above 1 only under the shared lock:
    /// through FUSE it shows the kernel passing direct writes on in
    /// parallel.
    dio_overwrites_peak,
    /// Checksum mismatches retried because a direct write was racing.
    dio_read_retries,
    /// Direct reads read ahead (`MountOptions::direct_read_ahead`),
    /// direct reads served from them, and of those the ones that waited
    /// for it to finish.
    dio_ahead_reads,
    dio_ahead_hits,
    dio_ahead_waits,
    lock_shared,
    lock_exclusive,
    lock_shared_waits,
    lock_exclusive_waits,
    lock_shared_wait_ns,
    lock_exclusive_wait_ns,
    /// Blocks reserved by speculative preallocation past EOF, allocated
    /// from it at writeback, and given back (close, ENOSPC, truncate,
    /// unmount).
    prealloc_reserved,
    prealloc_allocated,
    prealloc_trimmed,
    /// Writers throttled for dirty memory, and the time they waited.
    throttle_waits,
    throttle_wait_ns,
}

impl Counters {
    pub(crate) fn dio_request(&self, blocks: u64) {
        let k = (63 - blocks.max(1).leading_zeros() as usize).min(DIO_HIST_BUCKETS - 1);
        bump(&self.dio_request_blocks[k], 1);
    }
}

pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

#[derive(Clone, Debug, Serialize)]
pub struct CacheStats {
    pub folios: u64,
    pub folios_with_state: u64,
    pub cached_bytes: u64,
    pub dirty_bytes: u64,
    pub largest_folio_bytes: u64,
}

/// What one writeback context has done.
#[derive(Clone, Debug, Serialize)]
pub struct WritebackContextStats {
    pub context: usize,
    /// Bytes written back and passes (inodes taken from its lists).
    pub bytes: u64,
    pub passes: u64,
    /// Bytes per second, a moving average over passes of 1 MiB or more.
    pub bandwidth: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct AgUsage {
    pub agno: u32,
    pub blocks: u64,
    pub metadata_blocks: u64,
    pub free_blocks: u64,
    pub inodes: u64,
    pub free_inodes: u64,
}

/// What a writeback context has done, readable without locks.
#[derive(Debug, Default)]
pub(crate) struct ContextStats {
    pub bytes: AtomicU64,
    pub passes: AtomicU64,
    /// Bytes per second, a moving average over passes.
    pub bandwidth: AtomicU64,
}

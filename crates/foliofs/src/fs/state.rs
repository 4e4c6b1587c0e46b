//! The engine's shared state: `Inner` behind the metadata lock (the
//! metadata cache and journal, the allocator, the in-memory inodes and the
//! page cache's books) and `Shared` between the API and the writeback
//! threads. Every metadata change runs through `Inner::guarded` and ends
//! with `maybe_commit`.

use super::counters::{ContextStats, Counters};
use super::ctx::Ctx;
use super::data::folio::BufPool;
use super::data::iolock::IoLocks;
use super::inode::Inode;
use super::options::{Atime, MountOptions};
use crate::alloc::Alloc;
use crate::books::ScanFloor;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::format::inode::Timespec;
use crate::meta::{Batch, GroupCommit, Journaled, Meta};
use crate::u64map::U64Map;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;

/// Knobs that can change while mounted.
pub(crate) struct Knobs {
    pub dio_max_blocks: AtomicU64,
    pub dio_exclusive: AtomicBool,
    /// `MountOptions::direct_read_ahead`, switchable (`Fs::set_direct_read_ahead`).
    pub dio_ahead: AtomicBool,
    /// Writeback contexts in use (1 ..= MAX_WB_CONTEXTS).
    pub wb_contexts: AtomicUsize,
}

pub(crate) struct Inner {
    pub meta: Meta,
    pub alloc: Alloc,
    pub inodes: U64Map<Inode>,
    /// When loading one more inode first lets go of the unused ones
    /// (`load_inode`): at `INODES_KEPT`, or half that past what the last
    /// pass had to keep (open, dirty, with reservations).
    pub inodes_trim_at: ScanFloor,
    /// Inodes a caller holds beside its opens (`Fs::hold`: a FUSE
    /// kernel's lookups), with their counts: one unlinked stays, as an
    /// orphan, until its last hold goes.
    pub held: U64Map<u64>,
    pub opts: MountOptions,
    pub dirty_bytes: u64,
    /// Bytes of all folios in the page cache.
    pub cache_bytes: u64,
    /// When the page cache next scans for clean folios to evict: at its
    /// limit, or past what a scan had to keep (dirty data above the
    /// limit, under a dirty limit set above it).
    pub evict_floor: ScanFloor,
    /// Clock for the cache's least-recently-used eviction.
    pub tick: u64,
    pub counters: Arc<Counters>,
    /// Freed folio and writeback buffers for reuse.
    pub pool: BufPool,
    /// Per AG: dirty inodes, oldest first (see `writeback`).
    pub dirty_queues: Vec<std::collections::VecDeque<u64>>,
    /// Per AG: inodes whose sequential writer is due for write-behind.
    pub behind_queues: Vec<std::collections::VecDeque<u64>>,
    /// Writeback errors on any inode so far, and how many `sync` has
    /// reported.
    pub wb_errors: u64,
    pub wb_errors_synced: u64,
    /// Durable commits gathering (`meta::commit`).
    pub batch: Batch,
}

impl Shared {
    /// Make every change made so far durable (group commit: see
    /// `meta::commit`).
    pub(crate) fn commit_sync<'a>(
        &'a self,
        g: MutexGuard<'a, Inner>,
    ) -> Result<MutexGuard<'a, Inner>> {
        self.commit_to(g, true)
    }

    /// `commit_sync`, or with `durable` false: every change made so far is
    /// written to the log, not necessarily flushed.
    pub(crate) fn commit_to<'a>(
        &'a self,
        g: MutexGuard<'a, Inner>,
        durable: bool,
    ) -> Result<MutexGuard<'a, Inner>> {
        self.group.commit(&self.inner, g, durable)
    }

    pub(crate) fn commit_wait(&self, g: MutexGuard<'_, Inner>) -> Result<()> {
        self.commit_sync(g).map(drop)
    }
}

impl Journaled for Inner {
    fn meta(&mut self) -> &mut Meta {
        &mut self.meta
    }
    fn batch(&mut self) -> &mut Batch {
        &mut self.batch
    }
    fn waited_for_group(&mut self) {
        super::bump(&self.counters.commit_batch_waits, 1);
    }
}

impl Inner {
    /// Nothing keeps `ino` once it has no name: not an open, not a hold.
    pub(crate) fn unused(&self, ino: u64, open: u32) -> bool {
        open == 0 && !self.held.contains_key(&ino)
    }
}

/// What the API and the writeback threads share.
pub(crate) struct Shared {
    /// The metadata lock. Lock order: second, under an inode I/O lock
    /// (`iolocks`); over the AG allocator locks (`Alloc::ags`), the
    /// journal's I/O state (`JournalIo`). Let go of for
    /// device I/O and large copies.
    pub inner: Mutex<Inner>,
    pub counters: Arc<Counters>,
    pub dev: Arc<dyn Device>,
    pub block_size: u64,
    pub iolocks: IoLocks,
    pub knobs: Knobs,
    pub next_dio_id: AtomicU64,
    /// Direct overwrites in progress (`Counters::dio_overwrites_peak`).
    pub dio_overwrites_now: AtomicU64,
    pub data_flush: Arc<crate::meta::DataFlush>,
    /// Signalled (with `inner`) when a writeback completes: fsync,
    /// truncate and throttled writers wait on it.
    pub wb_done: Condvar,
    /// A buffered read's fill without the metadata lock ended
    /// (`Folio::filling`).
    pub fill_done: Condvar,
    /// Wakes the writeback contexts (with `inner`).
    pub wb_kick: Condvar,
    /// Group commit under `inner` (`meta::commit`).
    pub group: GroupCommit,
    /// Per-context statistics, `MAX_WB_CONTEXTS` long.
    pub wb_stats: Vec<ContextStats>,
    /// Set at unmount: the writeback threads exit.
    pub stopping: AtomicBool,
    /// Sequential direct readers' reads ahead (`data/ahead.rs`).
    pub ahead: crate::fs::data::ahead_slot::AheadQueue,
}

impl Inner {
    pub fn ctx(&mut self) -> Ctx<'_> {
        self.split().1
    }

    /// The inode table, a context and the buffer pool, borrowed apart.
    pub fn split(&mut self) -> (&mut U64Map<Inode>, Ctx<'_>, &mut BufPool) {
        let Inner {
            meta,
            alloc,
            inodes,
            counters,
            pool,
            ..
        } = self;
        (
            inodes,
            Ctx {
                meta,
                alloc,
                counters,
            },
            pool,
        )
    }

    /// Whether a read of `ino` at `now` updates its access time, as the
    /// mount's atime mode says: never with noatime, on a read-only or
    /// shut-down mount, or for a directory with nodiratime; always with
    /// strictatime; with relatime when the atime is not after the mtime
    /// or ctime, or is a day old. Not when it already reads `now`.
    pub(in crate::fs) fn atime_due(&mut self, ino: u64, now: Timespec) -> Result<bool> {
        if self.opts.atime == Atime::Noatime || self.check_writable().is_err() {
            return Ok(false);
        }
        let (strict, no_dir) = (self.opts.atime == Atime::Strictatime, self.opts.no_diratime);
        let ip = self.with(ino)?.0;
        if (no_dir && ip.is_dir()) || ip.no_atime() {
            return Ok(false);
        }
        let key = |t: Timespec| (t.sec, t.nsec);
        let (a, m, c) = (key(ip.d.atime), key(ip.d.mtime), key(ip.d.ctime));
        let stale = a <= m || a <= c || now.sec - ip.d.atime.sec >= 24 * 3600;
        Ok((strict || stale) && a != key(now))
    }

    /// `Inode::check_unfrozen` of `ino`.
    pub(in crate::fs) fn check_unfrozen(&mut self, ino: u64, append_ok: bool) -> Result<()> {
        self.with(ino)?.0.check_unfrozen(append_ok)
    }

    pub(in crate::fs) fn check_writable(&self) -> Result<()> {
        self.meta.check_live()?;
        if self.opts.read_only {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Run one metadata operation. If it fails with an I/O error or
    /// corruption after changing metadata, the change is half done and
    /// sits in the running transaction: committing it would make the
    /// damage durable (an inode marked in use that no directory names, a
    /// block in two places), so the file system shuts down instead and
    /// the journal keeps the last whole state, as XFS does when a dirty
    /// transaction is cancelled. Errors found before any change (ENOENT,
    /// EEXIST, ENOSPC at reservation, ...) leave it running.
    #[inline]
    pub(in crate::fs) fn guarded<T>(
        &mut self,
        f: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let before = self.meta.changes();
        let r = f(self);
        if let Err(e) = &r {
            if matches!(e, Error::Io(_) | Error::Corrupted { .. } | Error::NoSpace)
                && self.meta.changes() != before
            {
                log::error!("shutting down: an operation failed half way: {e}");
                self.meta
                    .poison(format!("a metadata operation failed half way ({e})"));
            }
        }
        r
    }

    /// Commit at an operation boundary when the running transaction grows
    /// past a quarter of the journal, so no transaction outgrows it.
    pub(in crate::fs) fn maybe_commit(&mut self) -> Result<()> {
        if self.meta.tx_filling() {
            self.meta.commit()?;
        }
        // Half full: write the committed blocks home in the background,
        // so the log has room before writers need it. (A job whose thread
        // cannot start is dropped, which fails the checkpoint.)
        if self.meta.journal_used() > self.meta.geo.journal_blocks / 2 {
            if let Some(job) = self.meta.checkpoint_begin()? {
                let _ = std::thread::Builder::new()
                    .name("foliofs-checkpoint".into())
                    .spawn(move || job.run());
            }
        }
        // After every operation, so free-space counts (ENOSPC pressure,
        // reservations) see what its commits made reusable.
        self.alloc.take_freed(&mut self.meta);
        Ok(())
    }
}

//! The engine's shared state: `Inner` behind the metadata lock (the
//! metadata cache and journal, the allocator, the in-memory inodes and the
//! page cache's books), `Shared` between the API and the writeback
//! threads, and `Ctx`, what the parts borrow together. Every metadata
//! change runs through `Inner::guarded` and ends with `maybe_commit`.

use super::contexts::ContextStats;
use super::counters::Counters;
use super::folio::BufPool;
use super::inode::Inode;
use super::iolock::IoLocks;
use super::options::{Atime, MountOptions};
use crate::alloc::Alloc;
use crate::books::ScanFloor;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::format::inode::Timespec;
use crate::meta::Meta;
use crate::U64Map;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;

/// Knobs that can change while mounted.
pub(crate) struct Knobs {
    pub dio_max_blocks: AtomicU64,
    pub dio_exclusive: AtomicBool,
    /// Writeback contexts in use (1 ..= MAX_WB_CONTEXTS).
    pub wb_contexts: AtomicUsize,
}

/// What the engine's parts borrow together: metadata cache/journal,
/// allocator and counters.
pub(crate) struct Ctx<'a> {
    pub meta: &'a mut Meta,
    pub alloc: &'a mut Alloc,
    pub counters: &'a Counters,
}

impl Ctx<'_> {
    /// Allocate, making room first if frees are only waiting for a checkpoint.
    pub fn alloc(&mut self, ag: u32, goal: Option<u64>, want: u64) -> Result<(u64, u64)> {
        match self.alloc.alloc(self.meta, ag, goal, want) {
            Err(Error::NoSpace) if self.reclaimable() => {
                self.reclaim()?;
                self.alloc.alloc(self.meta, ag, goal, want)
            }
            r => r,
        }
    }

    pub fn reclaimable(&self) -> bool {
        !self.meta.freed_running.is_empty() || !self.meta.freed_committed.is_empty()
    }

    /// Commit and checkpoint so that freed blocks become reusable.
    pub fn reclaim(&mut self) -> Result<()> {
        self.meta.commit()?;
        self.meta.checkpoint()?;
        self.alloc.take_freed(self.meta);
        Ok(())
    }

    /// Reserve blocks for dirty data, reclaiming first if that helps.
    pub fn reserve(&mut self, n: u64) -> Result<()> {
        self.reserve_from(n, false)
    }

    /// Before a change that may take metadata blocks (a name, a
    /// symlink's target, an xattr block): ENOSPC, before anything
    /// changes, unless more than half of the blocks kept for metadata
    /// are free, reclaiming first if that helps. The other half is for
    /// what must not fail: writeback's extent and checksum records for
    /// data already reserved, and removals. One change takes a few blocks
    /// at most (a split per tree level), so one that starts never runs
    /// out half way (a rename did: its old name went, and the new one
    /// found no block).
    pub fn meta_room(&mut self) -> Result<()> {
        self.alloc.take_freed(self.meta);
        if !self.alloc.meta_room() && self.reclaimable() {
            self.reclaim()?;
        }
        match self.alloc.meta_room() {
            true => Ok(()),
            false => Err(Error::NoSpace),
        }
    }

    /// `reserve` for a write from a client's cache (`Alloc::reserve_cached`).
    pub fn reserve_cached(&mut self, n: u64) -> Result<()> {
        self.reserve_from(n, true)
    }

    fn reserve_from(&mut self, n: u64, cached: bool) -> Result<()> {
        let try_once = |a: &mut Alloc| {
            if cached {
                a.reserve_cached(n)
            } else {
                a.reserve(n)
            }
        };
        self.alloc.take_freed(self.meta);
        match try_once(self.alloc) {
            Err(Error::NoSpace) if self.reclaimable() => {
                self.reclaim()?;
                try_once(self.alloc)
            }
            r => r,
        }
    }
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
    /// Durable commits gathering (`Shared::commit_to`).
    pub batch: Batch,
}

impl Inner {
    /// Nothing keeps `ino` once it has no name: not an open, not a hold.
    pub(crate) fn unused(&self, ino: u64, open: u32) -> bool {
        open == 0 && !self.held.contains_key(&ino)
    }
}

/// Durable commits batched across threads, as jbd2 batches fsync: a
/// committer that expects others (the last group had more than one)
/// waits a moment, at most about one commit's time, for them to join the
/// running transaction, so one write and one flush serve them all.
/// Commits that only write (direct overwrites) never wait for others: a
/// flush is what batching saves.
#[derive(Default)]
pub(crate) struct Batch {
    /// The running transaction being gathered for, and its committers.
    pub seq: u64,
    pub joined: usize,
    /// Threads committing now, and how many there were when the last
    /// durable transaction was sealed (the group to expect).
    pub active: usize,
    pub last_group: usize,
    /// Committers asleep in the wait for the group (`Shared::batch_written`).
    pub waiting: usize,
    /// Average time of a commit's write and flush.
    pub avg_ns: u64,
}

/// What the API and the writeback threads share.
pub(crate) struct Shared {
    pub inner: Mutex<Inner>,
    pub counters: Arc<Counters>,
    pub dev: Arc<dyn Device>,
    pub block_size: u64,
    pub iolocks: IoLocks,
    pub knobs: Knobs,
    /// Checksum arrays for direct reads, each at most the I/O cap long.
    pub csum_pool: Mutex<Vec<Vec<u32>>>,
    pub next_dio_id: AtomicU64,
    /// Direct overwrites in progress (`Counters::dio_overwrites_peak`).
    pub dio_overwrites_now: AtomicU64,
    pub data_flush: Arc<crate::meta::DataFlush>,
    /// Signalled (with `inner`) when a writeback completes: fsync,
    /// truncate and throttled writers wait on it.
    pub wb_done: Condvar,
    /// Wakes the writeback contexts (with `inner`).
    pub wb_kick: Condvar,
    /// Signalled (with `inner`) when a durable commit's write completes
    /// while committers wait for their group to gather.
    pub batch_written: Condvar,
    /// Per-context statistics, `MAX_WB_CONTEXTS` long.
    pub wb_stats: Vec<ContextStats>,
    /// Set at unmount: the writeback threads exit.
    pub stopping: AtomicBool,
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

/// The time the system clock reads, to the nanosecond (mkfs).
pub(crate) fn now_precise() -> crate::format::inode::Timespec {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    crate::format::inode::Timespec {
        sec: d.as_secs() as i64,
        nsec: d.subsec_nanos(),
    }
}

/// The time for a file's timestamps: the kernel's coarse clock (one tick,
/// a few milliseconds), the one Linux stamps files with. Through a FUSE
/// mount with the writeback cache the kernel sets mtime and ctime itself
/// from that clock: stamps the engine makes (a create's atime, a rename's
/// ctime) must come from it too, or a new file's atime lands after the
/// kernel's later mtime and relatime never updates it. Writes within a
/// tick also leave the inode record unchanged and out of the transaction.
pub(crate) fn now() -> crate::format::inode::Timespec {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
        return crate::format::inode::Timespec {
            sec: ts.tv_sec,
            nsec: ts.tv_nsec as u32,
        };
    }
    now_precise()
}

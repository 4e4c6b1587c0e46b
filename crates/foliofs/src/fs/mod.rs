//! The file system: mount, unmount and the public API.
//!
//! Locking: a per-inode I/O lock (`iolock`: shared for reads and direct
//! overwrites, exclusive for buffered writes, truncate, fallocate and
//! close) orders data operations on one file. One metadata lock
//! (`Fs::inner`) serialises namespace and mapping changes and the page
//! cache's books; under it, per-AG allocator locks (see `alloc`). The bulk
//! data work runs without the metadata lock: device I/O of direct I/O and
//! writeback, a buffered write's copy into its pinned folio, and the
//! mapping of fresh folio memory.

mod acl;
mod clock;
mod counters;
mod ctx;
mod data;
pub(crate) mod dir;
pub(crate) mod fork;
pub(crate) mod inode;
mod itable;
mod mkfs;
mod ns;
mod options;
mod state;
pub mod types;
pub(crate) mod xattr;

pub use counters::*;
pub use mkfs::{mkfs, open_for_mkfs, MkfsOptions};
pub use options::{parse_size, Atime, DioLock, MountOptions, ENGINE_OPTIONS, MAX_WB_CONTEXTS};
pub use types::*;

use crate::alloc::Alloc;
use crate::books::ScanFloor;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::format::superblock::Superblock;
use crate::meta::{self, Meta};
use clock::now;
use data::iolock::{IoLocks, Mode};
use data::read::Read;
use data::write::{drive, Locked};

/// How many times a buffered read plans a fill to run without the
/// metadata lock before it fills under it (`Fs::read`).
const UNLOCKED_FILLS: u32 = 4;

use parking_lot::{Condvar, Mutex, MutexGuard};
use state::{Inner, Knobs, Shared};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// A mounted foliofs file system. Send + Sync: share it with `Arc`.
pub struct Fs {
    s: Arc<Shared>,
    /// The writeback context threads (see `writeback`). Taken alone, at
    /// mount, unmount and when the number of contexts changes.
    workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    /// The read-ahead threads of direct reads (`data/ahead.rs`), started
    /// by the first sequential direct reader.
    ahead_threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Fs {
    /// Mount: read the superblock, replay the journal, load the AGs and
    /// finish any orphaned inodes left by a crash.
    pub fn mount(dev: Arc<dyn Device>, opts: MountOptions) -> Result<Fs> {
        let mut dev = dev;
        let mut sb = meta::read_superblock(&*dev)?;
        meta::check_device_size(&*dev, &sb)?;
        if !opts.read_only {
            let n = meta::replay(&*dev, &mut sb)?;
            if n > 0 {
                log::info!("journal replay: {n} transactions applied");
            }
            // Written with the clean flag cleared below, before any
            // transaction of this format's.
            sb.version = crate::format::FORMAT_VERSION;
        } else if has_journal_work(&*dev, &sb)? {
            // A read-only mount recovers the journal, as XFS's and ext4's
            // do, but into memory: the device is not written.
            let (overlay, n) = meta::replay_in_memory(dev, &mut sb)?;
            log::info!("journal replay into memory (read-only): {n} transactions applied");
            dev = overlay;
        }
        let mut opts = opts;
        if opts.dirty_limit_bytes == 0 {
            opts.dirty_limit_bytes = (opts.cache_bytes / 4).max(1 << 20);
        }
        let counters = Arc::new(Counters::default());
        let mut meta = Meta::new(dev.clone(), sb, opts.meta_cache_bytes);
        meta.stats.replayed_transactions = 0;
        meta.sync_dirs = opts.sync || opts.dirsync;
        let alloc = Alloc::load(&mut meta)?;
        let mut inner = Inner {
            meta,
            alloc,
            inodes: Default::default(),
            inodes_trim_at: ScanFloor::new(itable::INODES_KEPT as u64),
            held: Default::default(),
            evict_floor: ScanFloor::new(opts.cache_bytes),
            opts,
            dirty_bytes: 0,
            cache_bytes: 0,
            tick: 0,
            counters: counters.clone(),
            pool: data::folio::BufPool::new(),
            dirty_queues: Vec::new(),
            behind_queues: Vec::new(),
            wb_errors: 0,
            wb_errors_synced: 0,
            batch: Default::default(),
        };
        inner.dirty_queues = vec![Default::default(); inner.meta.geo.ag_count as usize];
        inner.behind_queues = inner.dirty_queues.clone();
        // The root must be a directory.
        let root = inner.meta.sb.root_ino;
        inner.load_inode(root)?;
        if !inner.inodes[&root].is_dir() {
            return Err(Error::corrupted(
                "inode",
                root,
                "root inode is not a directory",
            ));
        }
        if !inner.opts.read_only {
            inner.meta.set_clean(false)?;
            inner.process_orphans()?;
            inner.meta.commit()?;
        }
        let ags = inner.meta.geo.ag_count as usize;
        let contexts = match inner.opts.writeback_contexts {
            0 => ags.min(MAX_WB_CONTEXTS),
            n => n.min(MAX_WB_CONTEXTS),
        };
        let knobs = Knobs {
            dio_max_blocks: AtomicU64::new(inner.opts.dio_max_blocks.max(1)),
            dio_exclusive: AtomicBool::new(inner.opts.dio_lock == DioLock::Exclusive),
            dio_ahead: AtomicBool::new(inner.opts.direct_read_ahead),
            wb_contexts: AtomicUsize::new(contexts),
        };
        let read_only = inner.opts.read_only;
        let fs = Fs {
            s: Arc::new(Shared {
                block_size: inner.meta.geo.block_size,
                data_flush: inner.meta.data_flush().clone(),
                inner: Mutex::new(inner),
                counters,
                dev,
                iolocks: IoLocks::default(),
                knobs,
                next_dio_id: AtomicU64::new(1),
                dio_overwrites_now: AtomicU64::new(0),
                wb_done: Condvar::new(),
                fill_done: Condvar::new(),
                wb_kick: Condvar::new(),
                group: Default::default(),
                wb_stats: (0..MAX_WB_CONTEXTS)
                    .map(|_| ContextStats::default())
                    .collect(),
                stopping: AtomicBool::new(false),
                ahead: Default::default(),
            }),
            workers: Mutex::new(Vec::new()),
            ahead_threads: Mutex::new(Vec::new()),
        };
        if !read_only {
            fs.start_workers(contexts);
        }
        Ok(fs)
    }

    /// Write everything back, checkpoint and mark the file system clean.
    pub fn unmount(self) -> Result<()> {
        self.stop_workers();
        let mut g = self.s.inner.lock();
        if g.opts.read_only || g.meta.is_shutdown() {
            return g.meta.check_live();
        }
        for ino in g.inodes.keys().copied().collect::<Vec<_>>() {
            self.s.wait_wb_idle(&mut g, ino);
        }
        // Holds end with the mount: orphans nothing else keeps go now.
        for ino in std::mem::take(&mut g.held).into_keys() {
            g.guarded(|g| g.destroy_if_unkept(ino))?;
        }
        g.trim_all_prealloc()?;
        drop(g);
        self.s.sync_all()?;
        let mut g = self.s.inner.lock();
        // Everything is written back: every reservation became blocks or
        // was given back.
        assert_eq!(g.alloc.reserved, 0, "block reservations left at unmount");
        g.meta.checkpoint()?;
        let g = &mut *g;
        g.alloc.take_freed(&mut g.meta);
        g.meta.set_clean(true)?;
        Ok(())
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.s.dev
    }

    pub fn superblock(&self) -> Superblock {
        self.s.inner.lock().meta.sb.clone()
    }

    pub fn root_ino(&self) -> u64 {
        self.s.inner.lock().meta.sb.root_ino
    }

    pub fn block_size(&self) -> u64 {
        self.s.block_size
    }

    /// Turn read-ahead for sequential direct readers on or off
    /// (`MountOptions::direct_read_ahead`).
    pub fn set_direct_read_ahead(&self, on: bool) {
        self.s.knobs.dio_ahead.store(on, Ordering::Relaxed);
    }

    /// Set the direct I/O request cap in blocks (at least 1).
    pub fn set_dio_max_blocks(&self, blocks: u64) {
        self.s
            .knobs
            .dio_max_blocks
            .store(blocks.max(1), Ordering::Relaxed);
    }

    /// Set the lock mode for direct overwrites.
    pub fn set_dio_lock(&self, mode: DioLock) {
        self.s
            .knobs
            .dio_exclusive
            .store(mode == DioLock::Exclusive, Ordering::Relaxed);
    }

    /// Turn the overwrite log on or off (the A/B benchmark). Off: the
    /// log is checkpointed first, so no logged image is left for replay
    /// to write over a block the old scheme then writes in place.
    pub fn set_overwrite_log(&self, on: bool) -> Result<()> {
        let mut g = self.s.inner.lock();
        if g.opts.overwrite_log && !on {
            g.meta.commit()?;
            g.meta.checkpoint()?;
        }
        g.opts.overwrite_log = on;
        Ok(())
    }

    /// Check internal bookkeeping that tests rely on (delayed-allocation
    /// reservations). Err names what disagrees.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> Result<()> {
        let mut g = self.s.inner.lock();
        for ino in g.inodes.keys().copied().collect::<Vec<_>>() {
            self.s.wait_wb_idle(&mut g, ino);
        }
        g.check_reservations()
    }

    /// Shut the file system down on request, as a crash would
    /// (FS_IOC_SHUTDOWN; xfstests' godown): with `flush_log`, the
    /// journal's running transaction is committed first (metadata only;
    /// cached data is not written back). From then on every change fails
    /// with `Error::Shutdown` and nothing new is written; unmount leaves
    /// the image for the next mount to replay its journal.
    pub fn shutdown(&self, flush_log: bool) -> Result<()> {
        let g = self.s.inner.lock();
        if g.meta.is_shutdown() {
            return Ok(());
        }
        let mut g = if flush_log && !g.opts.read_only {
            self.s.commit_sync(g)?
        } else {
            g
        };
        g.meta.poison("shut down on request".into());
        Ok(())
    }

    /// Change the `sync` and `dirsync` mount options of a live file
    /// system (`mount -o remount,sync`); calls made afterwards follow them.
    pub fn set_sync_mode(&self, sync: bool, dirsync: bool) {
        let mut g = self.s.inner.lock();
        g.opts.sync = sync;
        g.opts.dirsync = dirsync;
        g.meta.sync_dirs = sync || dirsync;
    }

    /// The `sync` and `dirsync` mount options in force.
    pub fn sync_mode(&self) -> (bool, bool) {
        let g = self.s.inner.lock();
        (g.opts.sync, g.opts.dirsync)
    }

    /// Why the file system shut down, if it did.
    /// Have `f` called once if the file system shuts down (a failed
    /// journal write or flush, `shutdown`), for an adapter to stop taking
    /// what it can no longer write. It runs under the engine's metadata
    /// lock: it must not call back into the engine.
    pub fn on_shutdown(&self, f: impl Fn() + Send + Sync + 'static) {
        self.s.inner.lock().meta.on_shutdown = Some(Box::new(f));
    }

    pub fn shutdown_reason(&self) -> Option<String> {
        self.s
            .inner
            .lock()
            .meta
            .check_live()
            .err()
            .map(|e| e.to_string())
    }

    /// Per-AG usage.
    pub fn ag_usage(&self) -> Vec<AgUsage> {
        let g = self.s.inner.lock();
        let geo = &g.meta.geo;
        g.alloc
            .ags
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let a = a.lock();
                AgUsage {
                    agno: i as u32,
                    blocks: geo.ag_len(i as u32),
                    metadata_blocks: geo.data_start_agbno(i as u32),
                    free_blocks: a.free,
                    inodes: geo.inodes_per_ag,
                    free_inodes: a.free_inodes,
                }
            })
            .collect()
    }

    /// The page cache now: folios, how many carry per-block state, bytes
    /// cached and dirty.
    pub fn cache_stats(&self) -> CacheStats {
        let g = self.s.inner.lock();
        let mut st = CacheStats {
            folios: 0,
            folios_with_state: 0,
            cached_bytes: g.cache_bytes,
            dirty_bytes: g.dirty_bytes,
            largest_folio_bytes: 0,
        };
        for ip in g.inodes.values() {
            for f in ip.cache.folios.values() {
                st.folios += 1;
                st.folios_with_state += f.has_state() as u64;
                st.largest_folio_bytes = st.largest_folio_bytes.max(f.data.len() as u64);
            }
        }
        st
    }

    pub fn counters(&self) -> CounterSnapshot {
        let mut journal = {
            let g = self.s.inner.lock();
            let mut j = g.meta.stats.clone();
            j.log_used_blocks = g.meta.journal_used();
            j.log_blocks = g.meta.geo.journal_blocks;
            j
        };
        journal.data_flushes = self.s.data_flush.flushes();
        self.s.counters.snapshot(journal)
    }

    // ---- namespace ----

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        self.s.inner.lock().lookup(parent, name)
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        self.s.inner.lock().getattr(ino)
    }

    /// One metadata change: under the metadata lock, on a writable file
    /// system, shut down if it fails half way (`Inner::guarded`), then
    /// commit if the running transaction is due.
    fn mutate<R>(&self, f: impl FnOnce(&mut Inner) -> Result<R>) -> Result<R> {
        let mut g = self.s.inner.lock();
        g.check_writable()?;
        let r = g.guarded(f);
        self.settle(g, r)
    }

    /// `mutate` for a change that may take metadata blocks: refused with
    /// ENOSPC before anything changes when the space kept for metadata
    /// runs low (`Ctx::meta_room`).
    fn grow<R>(&self, f: impl FnOnce(&mut Inner) -> Result<R>) -> Result<R> {
        self.mutate(|g| {
            g.split().1.meta_room()?;
            f(g)
        })
    }

    /// After a change, its outcome `r`: commit if the running transaction
    /// is large, and before returning if the change must be synchronous
    /// (the `sync` mount option; an inode or directory with chattr +S or
    /// +D; a directory's entries under `dirsync`).
    fn settle<R>(&self, mut g: MutexGuard<'_, Inner>, r: Result<R>) -> Result<R> {
        g.maybe_commit()?;
        // Taken whatever the outcome: a failed change leaves no wish for
        // the next caller to commit.
        let wanted = std::mem::take(&mut g.meta.sync_wanted);
        let r = r?;
        if wanted || g.opts.sync {
            self.s.commit_wait(g)?;
        }
        Ok(r)
    }

    pub fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        // A size change is a truncate: exclusive, after in-flight I/O.
        let _io = set
            .size
            .map(|_| self.s.iolocks.lock(ino, Mode::Exclusive, &self.s.counters));
        let mut g = self.s.inner.lock();
        g.check_writable()?;
        if set.size.is_some() {
            // Blocks a truncate frees must not be under writeback.
            self.s.wait_wb_idle(&mut g, ino);
        }
        let r = g.guarded(|g| g.setattr(ino, set));
        self.settle(g, r)
    }

    /// Set the inode's flags (`FL_*`, as chattr does; `Attr::flags` has
    /// them). Setting or clearing immutable or append-only needs
    /// `privileged` (CAP_LINUX_IMMUTABLE); whether the caller may change
    /// the inode's flags at all (its owner) is the caller's to check, as
    /// for `setattr`. Flags outside `FL_SUPPORTED` are refused; dirsync
    /// is kept for directories only (as ext4 does).
    pub fn set_flags(&self, ino: u64, flags: u32, privileged: bool) -> Result<Attr> {
        if flags & !FL_SUPPORTED != 0 {
            return Err(Error::Unsupported(
                "inode flags other than i, a, d, A, S and D",
            ));
        }
        self.mutate(|g| {
            let (ip, mut cx) = g.with(ino)?;
            let flags = if ip.is_dir() {
                flags
            } else {
                flags & !FL_DIRSYNC
            };
            let old = ip.user_flags();
            if (old ^ flags) & (FL_IMMUTABLE | FL_APPEND) != 0 && !privileged {
                return Err(Error::NotPermitted(
                    "setting or clearing immutable or append-only needs privilege",
                ));
            }
            if old != flags {
                ip.set_user_flags(flags);
                ip.touch_ctime();
                ip.store(&mut cx)?;
            }
            g.getattr(ino)
        })
    }

    /// Create a node of any type (regular file, directory, fifo, device,
    /// socket) with mode `node.perm` less `node.umask`; under a directory
    /// with a default ACL the ACL decides instead of the umask (POSIX.1e).
    pub fn mknod(&self, parent: u64, name: &[u8], node: &NewNode) -> Result<Attr> {
        self.grow(|g| g.create(parent, name, node))
    }

    pub fn create(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mknod(parent, name, &NewNode::new(FileType::File, perm, uid, gid))
    }

    /// An unnamed regular file in `parent`, open (O_TMPFILE): it goes
    /// with its last `release_file` (or with the next mount after a
    /// crash) unless `link` names it first. Mode and group as `mknod`
    /// gives them.
    pub fn tmpfile(
        &self,
        parent: u64,
        perm: u32,
        umask: u32,
        uid: u32,
        gid: u32,
    ) -> Result<(Attr, OpenFile)> {
        let attr = self.grow(|g| {
            let a = g.tmpfile(parent, perm, umask, uid, gid)?;
            g.inodes.get_mut(&a.ino).expect("just made").open += 1;
            Ok(a)
        })?;
        let seen = self.s.inner.lock().with(attr.ino)?.0.wb_errors;
        Ok((
            attr.clone(),
            OpenFile {
                ino: attr.ino,
                errors_seen: AtomicU64::new(seen),
            },
        ))
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.mknod(parent, name, &NewNode::new(FileType::Dir, perm, uid, gid))
    }

    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        let node = NewNode {
            target: Some(target),
            ..NewNode::new(FileType::Symlink, 0o777, uid, gid)
        };
        self.grow(|g| g.create(parent, name, &node))
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        self.s.inner.lock().readlink(ino)
    }

    pub fn link(&self, ino: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        self.grow(|g| g.link(ino, parent, name))
    }

    /// Name `ino`, which no entry names, in /lost+found (fsck's repair);
    /// returns the name.
    pub(crate) fn reconnect(&self, ino: u64) -> Result<Vec<u8>> {
        self.grow(|g| g.reconnect(ino))
    }

    /// Remove entry `name` of `dir`, which names `ino`, and nothing else
    /// (fsck's repair).
    pub(crate) fn drop_entry(&self, dir: u64, name: &[u8], ino: u64) -> Result<()> {
        self.mutate(|g| g.drop_entry(dir, name, ino))
    }

    /// Give entry `name` of `dir` the type of the inode it names (fsck's
    /// repair).
    pub(crate) fn retype_entry(&self, dir: u64, name: &[u8]) -> Result<()> {
        self.mutate(|g| g.retype_entry(dir, name))
    }

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.mutate(|g| g.unlink(parent, name, false))
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.mutate(|g| g.unlink(parent, name, true))
    }

    /// rename(2) with RENAME_NOREPLACE / RENAME_EXCHANGE flags.
    pub fn rename(
        &self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.grow(|g| g.rename(parent, name, new_parent, new_name, flags, None))
    }

    /// rename(2) with RENAME_WHITEOUT (and RENAME_NOREPLACE if asked):
    /// the rename and, in the same transaction, a whiteout where the old
    /// name was, owned by `owner` (uid, gid) as `mknod` would make it.
    /// overlayfs marks a name removed from its lower layers so; its upper
    /// layer needs this.
    pub fn rename_whiteout(
        &self,
        from: (u64, &[u8]),
        to: (u64, &[u8]),
        flags: u32,
        owner: (u32, u32),
    ) -> Result<()> {
        self.grow(|g| g.rename(from.0, from.1, to.0, to.1, flags, Some(owner)))
    }

    /// Directory entries after `cookie` (0 to start), "." and ".." first.
    pub fn readdir(&self, ino: u64, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        self.list(ino, cookie, max, |_, e| Ok(e))
    }

    /// `readdir` with each entry's attributes, under one hold of the
    /// metadata lock (FUSE's readdirplus).
    pub fn readdir_attrs(
        &self,
        ino: u64,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<(DirEntry, Attr)>> {
        self.list(ino, cookie, max, |g, e| {
            let a = g.getattr(e.ino)?;
            Ok((e, a))
        })
    }

    /// A listing from `cookie`, each entry through `f` under the lock; a
    /// listing from the start is a read of the directory (atime).
    fn list<T>(
        &self,
        ino: u64,
        cookie: u64,
        max: usize,
        mut f: impl FnMut(&mut Inner, DirEntry) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut g = self.s.inner.lock();
        let out = g
            .readdir(ino, cookie, max)?
            .into_iter()
            .map(|e| f(&mut g, e))
            .collect::<Result<Vec<_>>>()?;
        if cookie == 0 {
            self.accessed(&mut g, ino)?;
        }
        Ok(out)
    }

    /// A read of `ino` happened: update its access time as the mount's
    /// atime mode says (nothing on a read-only or shut-down mount).
    fn accessed(&self, g: &mut MutexGuard<Inner>, ino: u64) -> Result<()> {
        let now = now();
        if !g.atime_due(ino, now)? {
            return Ok(());
        }
        let r = g.guarded(|g| {
            let (ip, mut cx) = g.with(ino)?;
            ip.d.atime = now;
            ip.store(&mut cx)
        });
        g.maybe_commit()?;
        r
    }

    /// Whether a read of `ino` now would update its access time. A cache
    /// in front of the engine (the FUSE kernel's page cache) lets the
    /// next read through when it would, so that read reaches `accessed`.
    pub fn atime_due(&self, ino: u64) -> Result<bool> {
        let mut g = self.s.inner.lock();
        g.load_inode(ino)?;
        g.atime_due(ino, now())
    }

    /// Note an open file description; unlinked inodes live until the last
    /// one is released.
    pub fn open(&self, ino: u64) -> Result<Attr> {
        let mut g = self.s.inner.lock();
        g.load_inode(ino)?;
        g.inodes.get_mut(&ino).unwrap().open += 1;
        g.getattr(ino)
    }

    /// Hold `ino` beside its opens: unlinked, it stays (an orphan) until
    /// `unhold` lets go of the last hold. For a caller that keeps
    /// referring to inodes by number after their names go, as a FUSE
    /// kernel does between lookup and forget. A hold is not an open: the
    /// last close still trims preallocation.
    pub fn hold(&self, ino: u64) -> Result<()> {
        let mut g = self.s.inner.lock();
        g.load_inode(ino)?;
        *g.held.entry(ino).or_default() += 1;
        Ok(())
    }

    /// Let go of `n` holds of `ino`; an unlinked, unopened inode goes
    /// with its last.
    pub fn unhold(&self, ino: u64, n: u64) -> Result<()> {
        let mut g = self.s.inner.lock();
        let Some(c) = g.held.get_mut(&ino) else {
            return Ok(());
        };
        *c = c.saturating_sub(n);
        if *c > 0 {
            return Ok(());
        }
        g.held.remove(&ino);
        if g.check_writable().is_err() {
            return Ok(());
        }
        self.s.wait_wb_idle(&mut g, ino);
        g.guarded(|g| g.destroy_if_unkept(ino))?;
        g.maybe_commit()
    }

    /// The last close of a file trims its speculative preallocation.
    pub fn release(&self, ino: u64) -> Result<()> {
        // After in-flight I/O: a writer copies without the metadata lock.
        let _io = self.s.iolocks.lock(ino, Mode::Exclusive, &self.s.counters);
        let mut g = self.s.inner.lock();
        self.s.wait_wb_idle(&mut g, ino);
        let last = g.with(ino)?.0.open <= 1;
        let trim = last && g.check_writable().is_ok();
        g.guarded(|g| {
            if trim {
                g.trim_eof(ino)?;
            }
            g.release(ino)
        })?;
        g.maybe_commit()
    }

    /// Open a file description that reports writeback errors to its own
    /// fsync once each, as Linux does (errors before the open are not
    /// its business).
    pub fn open_file(&self, ino: u64) -> Result<(Attr, OpenFile)> {
        let attr = self.open(ino)?;
        let seen = self.s.inner.lock().with(ino)?.0.wb_errors;
        Ok((
            attr,
            OpenFile {
                ino,
                errors_seen: AtomicU64::new(seen),
            },
        ))
    }

    /// fsync through an open file description: a writeback error since
    /// this description last saw one is returned (EIO) once.
    pub fn fsync_file(&self, f: &OpenFile, datasync: bool) -> Result<()> {
        let r = self.fsync_inner(f.ino, datasync);
        let errors = self.s.inner.lock().with(f.ino)?.0.wb_errors;
        let seen = f.errors_seen.swap(errors, Ordering::SeqCst);
        r?;
        if errors > seen {
            return Err(writeback_error(f.ino));
        }
        Ok(())
    }

    pub fn release_file(&self, f: OpenFile) -> Result<()> {
        self.release(f.ino)
    }

    pub fn statfs(&self) -> Result<StatFs> {
        Ok(self.s.inner.lock().statfs())
    }

    /// Bytes that writes may still reserve for delayed allocation: when a
    /// write needs more, it fails with ENOSPC. Cheaper than `statfs`.
    pub fn reservable_bytes(&self) -> u64 {
        self.s.inner.lock().alloc.available() * self.block_size()
    }

    // ---- data ----

    pub fn read(&self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        if let Some(n) = self.read_past_cache(ino, offset, buf)? {
            return Ok(n);
        }
        let _io = self.s.iolocks.lock(ino, Mode::Shared, &self.s.counters);
        let mut tries = 0;
        let mut fills = 0;
        loop {
            let mut g = self.s.inner.lock();
            let gen = g.with(ino)?.0.data_gen;
            // The device reads and their checksums run without the
            // metadata lock, so readers of other folios (the kernel's
            // readahead on several request threads) and everything else
            // go on meanwhile. A plan that meets a change (the folio
            // evicted, a direct overwrite) is made again, a few times;
            // then the fill runs under the lock.
            match g.read_or_plan(ino, offset, buf, fills < UNLOCKED_FILLS) {
                Ok(Read::Wait) => {
                    self.s.fill_done.wait(&mut g);
                }
                Ok(Read::Plan(plan)) => {
                    fills += 1;
                    self.fill_unlocked(g, ino, &plan, &mut tries)?;
                }
                Err(e @ Error::DataChecksum { .. }) => {
                    // A direct overwrite racing this read is not corruption.
                    if self.s.race_explains(&mut g, ino, gen, &mut tries)? {
                        drop(g);
                        std::thread::yield_now();
                        continue;
                    }
                    return Err(self.checksum_failed(e));
                }
                Ok(Read::Done(n)) => {
                    self.accessed(&mut g, ino)?;
                    return Ok(n);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Run `plan` (`Inner::read_or_plan`'s): its device reads and checksums
    /// without the metadata lock (`g`, released), its folio's blocks
    /// installed under it. Ok also when what it read was stale (the
    /// caller plans again) or a direct overwrite explains a checksum
    /// mismatch.
    fn fill_unlocked(
        &self,
        mut g: MutexGuard<'_, Inner>,
        ino: u64,
        plan: &data::read::FillPlan,
        tries: &mut u32,
    ) -> Result<()> {
        // Pinned: the inode outlives the read even if its last name and
        // description go meanwhile.
        g.with(ino)?.0.open += 1;
        drop(g);
        let (r, mut g, installed) = data::read::with_fill_buf(|io| {
            let r = plan.read(ino, &*self.s.dev, io);
            let mut g = self.s.inner.lock();
            let installed = g.fill_install(ino, plan, r.is_ok().then_some(&io[..]));
            (r, g, installed)
        });
        self.s.fill_done.notify_all();
        g.release(ino)?;
        installed?;
        match r {
            Err(e @ Error::DataChecksum { .. }) => {
                if self.s.race_explains(&mut g, ino, plan.gen(), tries)? {
                    Ok(())
                } else {
                    Err(self.checksum_failed(e))
                }
            }
            r => r,
        }
    }

    /// Count and log a data checksum failure on its way to the caller.
    fn checksum_failed(&self, e: Error) -> Error {
        if matches!(e, Error::DataChecksum { .. }) {
            bump(&self.s.counters.csum_failures, 1);
            log::error!("{e}");
        }
        e
    }

    /// Buffered write. A large step's copy into its folio runs without
    /// the metadata lock (the folio pinned), so writers of different files
    /// copy in parallel.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_at(ino, Some(offset), data, false)
            .map(|(_, n)| n)
    }

    /// A buffered write of data a client cached before the engine saw it
    /// (the kernel's page cache over FUSE, writing back): all of it or,
    /// for lack of space or any other error, an error, never a short
    /// count, since the client takes its writeback as done or failed
    /// (the FUSE kernel ignores a short reply's count). Its space comes
    /// from the free space and then from the cache floor
    /// (`set_cache_reserve`), and is reserved before anything changes,
    /// so one that finds no room changes nothing.
    pub fn write_cached(&self, ino: u64, offset: u64, data: &[u8]) -> Result<()> {
        let (_, n) = self.write_at(ino, Some(offset), data, true)?;
        debug_assert_eq!(n, data.len(), "a whole write came back short");
        Ok(())
    }

    /// Keep `bytes` of free space back for a client that caches writes
    /// before it hands them over (`write_cached`): at least as much as
    /// it may hold unwritten at once. Ordinary reservations (writes,
    /// direct writes, fallocate) leave that space, and `statfs` counts it
    /// as unavailable; 0 gives it back. A floor, not a reservation:
    /// space freed later refills it by itself.
    pub fn set_cache_reserve(&self, bytes: u64) {
        let mut g = self.s.inner.lock();
        g.alloc.cache_floor = bytes.div_ceil(g.meta.geo.block_size);
    }

    /// Bytes a write from the client's cache may still reserve: the free
    /// space less every reservation and the metadata's share, the cache
    /// floor included. Frees waiting for a checkpoint are taken back
    /// first when that is below the floor.
    pub fn cache_reservable_bytes(&self) -> u64 {
        let mut g = self.s.inner.lock();
        let bs = g.meta.geo.block_size;
        let (_, mut cx, _) = g.split();
        cx.alloc.take_freed(cx.meta);
        if cx.alloc.available_to_cache() < cx.alloc.cache_floor.max(1) && cx.reclaimable() {
            // A failed reclaim shuts the file system down; the space
            // stays as it was.
            let _ = cx.reclaim();
        }
        cx.alloc.available_to_cache() * bs
    }

    /// Whether the free space no longer covers the cache floor
    /// (`set_cache_reserve`): writes from the client's cache have taken
    /// part of it, and it should take no more writes it has no room for.
    pub fn cache_reserve_short(&self) -> bool {
        let floor = self.s.inner.lock().alloc.cache_floor;
        floor > 0 && self.cache_reservable_bytes() < floor * self.block_size()
    }

    /// A buffered write at the end of the file, as with O_APPEND: the
    /// offset is the size under the inode's lock, so appends by many
    /// threads never overlap. Returns the offset written at and the count.
    pub fn append(&self, ino: u64, data: &[u8]) -> Result<(u64, usize)> {
        self.write_at(ino, None, data, false)
    }

    /// `write` at `offset`, or at the end of the file when None; `whole`
    /// as `write_cached`.
    fn write_at(
        &self,
        ino: u64,
        offset: Option<u64>,
        data: &[u8],
        whole: bool,
    ) -> Result<(u64, usize)> {
        let (r, over, sync, offset) = {
            let _io = self.s.iolocks.lock(ino, Mode::Exclusive, &self.s.counters);
            let mut g = self.s.inner.lock();
            g.check_writable()?;
            let mount_sync = g.opts.sync;
            let ip = g.with(ino)?.0;
            ip.check_unfrozen(true)?;
            let offset = offset.unwrap_or(ip.size);
            // chattr +S or `-o sync`: as O_SYNC.
            let sync = mount_sync || ip.sync_updates();
            if ip.size < offset {
                // The old last block is zeroed past EOF: stable pages.
                self.s.wait_wb_idle(&mut g, ino);
            }
            let mut h = Locked { g, s: &self.s };
            let r = drive(&mut h, ino, offset, data, whole).map(|(n, behind)| {
                if behind {
                    self.s.wb_kick.notify_all();
                }
                n
            });
            let mut g = h.g;
            g.maybe_commit()?;
            (r, g.dirty_bytes > g.background_bytes(), sync, offset)
        };
        if over {
            // No lock held: throttled writers sleep here.
            self.s.balance_dirty(ino, data.len() as u64)?;
        }
        let n = r.map_err(|e| self.checksum_failed(e))?;
        if sync {
            self.fsync(ino, false)?;
        }
        Ok((offset, n))
    }

    /// fsync / fdatasync: the file's data and the metadata needed to reach
    /// it are durable when this returns Ok; fsync also makes the rest of
    /// the inode durable (timestamps), fdatasync need not. A
    /// writeback error since the last `fsync(ino)` is returned once; open
    /// file descriptions (`open_file`) each see it once instead.
    pub fn fsync(&self, ino: u64, datasync: bool) -> Result<()> {
        self.fsync_inner(ino, datasync)?;
        let mut g = self.s.inner.lock();
        let ip = g.with(ino)?.0;
        if ip.wb_errors > ip.wb_errors_seen {
            ip.wb_errors_seen = ip.wb_errors;
            return Err(writeback_error(ino));
        }
        Ok(())
    }

    fn fsync_inner(&self, ino: u64, datasync: bool) -> Result<()> {
        bump(&self.s.counters.fsyncs, 1);
        let g = self.s.inner.lock();
        g.meta.check_live()?;
        if g.opts.read_only {
            return Ok(());
        }
        let (g, _) = self.s.writeback_inode(g, ino, u64::MAX)?;
        // fdatasync: when what reaches the data is durable already (an
        // in-place overwrite with the overwrite log off, whose "no
        // checksum" intent was committed before the write), flushing the
        // data is all that is left. Logged overwrites are in a
        // transaction: `datasync_seq` waits for it.
        let reach = g.inodes.get(&ino).map(|ip| ip.datasync_seq);
        if datasync && reach.is_some_and(|seq| seq < g.meta.done_seq()) {
            drop(g);
            bump(&self.s.counters.datasync_flush_only, 1);
            return Ok(self.s.data_flush.flush(&*self.s.dev)?);
        }
        self.s.commit_wait(g)
    }

    /// Write back every file and commit (sync, syncfs). A writeback error
    /// on any file since the last sync is returned once.
    pub fn sync(&self) -> Result<()> {
        self.s.sync_all()?;
        let mut g = self.s.inner.lock();
        if g.wb_errors > g.wb_errors_synced {
            g.wb_errors_synced = g.wb_errors;
            return Err(Error::Io(std::io::Error::other(
                "a writeback failed since the last sync",
            )));
        }
        Ok(())
    }

    pub fn fallocate(&self, ino: u64, mode: Falloc, offset: u64, len: u64) -> Result<()> {
        let _io = self.s.iolocks.lock(ino, Mode::Exclusive, &self.s.counters);
        let mut g = self.s.inner.lock();
        g.check_writable()?;
        // chattr +a: allocating is no change to the data (Linux's rule).
        g.check_unfrozen(ino, matches!(mode, Falloc::Allocate { .. }))?;
        self.s.wait_wb_idle(&mut g, ino);
        let r = g.guarded(|g| g.fallocate(ino, mode, offset, len));
        self.settle(g, r)
    }

    /// SEEK_DATA / SEEK_HOLE. `Ok(None)` is ENXIO. After the inode's
    /// writeback in flight, if any: its blocks are no longer dirty and
    /// still mapped unwritten until it completes, so they would read as
    /// a hole.
    pub fn seek(&self, ino: u64, offset: u64, whence: Whence) -> Result<Option<u64>> {
        let mut g = self.s.inner.lock();
        self.s.wait_wb_idle(&mut g, ino);
        g.seek(ino, offset, whence)
    }

    /// The file's extent map (after writing back its dirty data).
    pub fn extents(&self, ino: u64) -> Result<Vec<ExtentInfo>> {
        self.written_back(ino)?.extent_info(ino)
    }

    /// The device block holding byte `at` of the file (after writing back
    /// its dirty data): None in a hole or an unwritten extent (FIBMAP).
    pub fn block_at(&self, ino: u64, at: u64) -> Result<Option<u64>> {
        self.written_back(ino)?.block_at(ino, at)
    }

    /// The lock, once `ino`'s dirty data is written back (unless read-only).
    fn written_back(&self, ino: u64) -> Result<MutexGuard<'_, Inner>> {
        let g = self.s.inner.lock();
        if g.opts.read_only {
            return Ok(g);
        }
        Ok(self.s.writeback_inode(g, ino, u64::MAX)?.0)
    }

    // ---- xattrs ----

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.s.inner.lock().getxattr(ino, name)
    }

    /// flags: XATTR_CREATE (1) fails if it exists, XATTR_REPLACE (2) if not.
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        self.setxattr_by(ino, name, value, flags, |_| true)
    }

    /// `setxattr` for a caller who may lack the file's group: an access
    /// ACL it sets takes set-group-ID unless `in_group` (asked of the
    /// file's gid; true for a caller with CAP_FSETID) says it is in it.
    pub fn setxattr_by(
        &self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        flags: u32,
        in_group: impl FnOnce(u32) -> bool,
    ) -> Result<()> {
        self.grow(|g| g.setxattr(ino, name, value, flags, in_group))
    }

    /// Take from a regular file what a write, truncate or chown takes on
    /// Linux: set-user-ID, set-group-ID when group-executable, and the
    /// file capability (`security.capability`). For an adapter that does
    /// this instead of the kernel (FUSE_HANDLE_KILLPRIV_V2). With nothing
    /// to take, nothing changes.
    pub fn kill_priv(&self, ino: u64, in_group: impl FnOnce(u32) -> bool) -> Result<bool> {
        self.mutate(|g| g.kill_priv(ino, in_group))
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        self.s.inner.lock().listxattr(ino)
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.mutate(|g| {
            // Not in `Inner::removexattr`: an append to a chattr +a file
            // still takes its file capability (`kill_priv`).
            g.check_unfrozen(ino, false)?;
            g.removexattr(ino, name)
        })
    }

    // ---- path helpers for tools and tests ----

    /// Resolve an absolute path (no symlink following).
    pub fn resolve(&self, path: &str) -> Result<u64> {
        let mut ino = self.root_ino();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            ino = self.lookup(ino, part.as_bytes())?.ino;
        }
        Ok(ino)
    }
}

/// An open file description (see `Fs::open_file`).
#[derive(Debug)]
pub struct OpenFile {
    pub ino: u64,
    errors_seen: AtomicU64,
}

fn writeback_error(ino: u64) -> Error {
    Error::Io(std::io::Error::other(format!(
        "writeback of inode {ino} failed: data written since the last fsync may be lost"
    )))
}

fn has_journal_work(dev: &dyn Device, sb: &Superblock) -> Result<bool> {
    let bs = sb.block_size as usize;
    let mut b = crate::device::AlignedBuf::zeroed(bs);
    dev.read_at(&mut b, (sb.journal_start + sb.tail_pos) * bs as u64)?;
    Ok(matches!(
        crate::format::header::verify(&b, "journal descriptor", crate::format::magic::JOURNAL_DESC, sb.journal_start + sb.tail_pos, &sb.uuid),
        Ok(h) if h.lsn == sb.tail_seq
    ))
}

/// For the crate's own tests: a fresh 64 MiB file system in memory,
/// mounted without periodic writeback (nothing is written back unless a
/// test asks).
#[cfg(test)]
pub(crate) fn quiet_test_fs() -> Fs {
    let dev = std::sync::Arc::new(crate::device::MemDevice::new(64 << 20));
    mkfs(&*dev, &MkfsOptions::default(), |_, _| {}).unwrap();
    let o = MountOptions {
        writeback_interval_ms: 0,
        ..Default::default()
    };
    Fs::mount(dev, o).unwrap()
}

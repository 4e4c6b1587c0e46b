//! Per-inode I/O locks (reader/writer), taken before the metadata lock.
//!
//! Shared: buffered reads, direct reads, and direct writes that are pure
//! overwrites (aligned, inside the file, every block allocated and
//! written). Exclusive: buffered writes, direct writes that extend the
//! file, fill holes or convert unwritten blocks, truncate, hole punch and
//! fallocate. Direct I/O here is synchronous and holds its lock until the
//! device has answered, so taking the lock exclusive is also the wait for
//! in-flight direct I/O (ext4's inode_dio_wait).
//!
//! Lock order: inode I/O lock -> metadata lock (`Fs::inner`) -> AG locks.
//! Nothing takes an I/O lock while holding the metadata lock, and no
//! operation holds two I/O locks.

use crate::fs::{bump, Counters};
use crate::u64map::U64Map;
use parking_lot::lock_api::{ArcRwLockReadGuard, ArcRwLockWriteGuard};
use parking_lot::{Mutex, RawRwLock, RwLock};
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Shared,
    Exclusive,
}

/// A held I/O lock; dropping it unlocks. The lock guards its
/// exclusive count: how many times it has been taken exclusive.
pub(crate) enum IoGuard {
    Shared(ArcRwLockReadGuard<RawRwLock, AtomicU64>),
    Exclusive(ArcRwLockWriteGuard<RawRwLock, AtomicU64>),
}

/// One inode's I/O lock.
pub(crate) type Lock = Arc<RwLock<AtomicU64>>;

impl IoGuard {
    /// How many times this lock has been taken exclusive. The same under
    /// two shared holds of one lock (that is, one lock the table kept
    /// between them: see `Lock`) means nothing took it exclusive between.
    pub fn exclusive_count(&self) -> u64 {
        match self {
            IoGuard::Shared(g) => g.load(AtomicOrdering::Relaxed),
            IoGuard::Exclusive(g) => g.load(AtomicOrdering::Relaxed),
        }
    }

    /// The lock itself: holding it keeps the table from dropping it, so
    /// its exclusive count goes on from where it is.
    pub fn lock(&self) -> Lock {
        match self {
            IoGuard::Shared(g) => ArcRwLockReadGuard::rwlock(g).clone(),
            IoGuard::Exclusive(g) => ArcRwLockWriteGuard::rwlock(g).clone(),
        }
    }
}

#[derive(Default)]
struct Table {
    locks: U64Map<Lock>,
    prune_at: usize,
}

/// The lock table. An entry nobody holds carries no state, so entries are
/// dropped when the table doubles.
///
/// Lock order: an inode's I/O lock is first, taken before the metadata
/// lock (`Shared::inner`), and a thread holds at most one; `table` is
/// held only to find or make an entry, never while waiting for one.
#[derive(Default)]
pub(crate) struct IoLocks {
    table: Mutex<Table>,
}

impl IoLocks {
    fn get(&self, ino: u64) -> Lock {
        let mut t = self.table.lock();
        if t.locks.len() >= t.prune_at {
            t.locks.retain(|_, l| Arc::strong_count(l) > 1);
            t.prune_at = (t.locks.len() * 2).max(4096);
        }
        t.locks.entry(ino).or_default().clone()
    }

    /// Take inode `ino`'s I/O lock, counting acquisitions and waits.
    pub fn lock(&self, ino: u64, mode: Mode, c: &Counters) -> IoGuard {
        let l = self.get(ino);
        match mode {
            Mode::Shared => {
                bump(&c.lock_shared, 1);
                if let Some(g) = l.try_read_arc() {
                    return IoGuard::Shared(g);
                }
                bump(&c.lock_shared_waits, 1);
                let t = Instant::now();
                let g = l.read_arc();
                bump(&c.lock_shared_wait_ns, t.elapsed().as_nanos() as u64);
                IoGuard::Shared(g)
            }
            Mode::Exclusive => {
                bump(&c.lock_exclusive, 1);
                let g = match l.try_write_arc() {
                    Some(g) => g,
                    None => {
                        bump(&c.lock_exclusive_waits, 1);
                        let t = Instant::now();
                        let g = l.write_arc();
                        bump(&c.lock_exclusive_wait_ns, t.elapsed().as_nanos() as u64);
                        g
                    }
                };
                g.fetch_add(1, AtomicOrdering::Relaxed);
                IoGuard::Exclusive(g)
            }
        }
    }

    /// Inode `ino`'s I/O lock shared, if it is to be had at once (not
    /// held or awaited exclusive).
    pub fn try_shared(&self, ino: u64) -> Option<IoGuard> {
        self.get(ino).try_read_arc().map(IoGuard::Shared)
    }
}

//! ENOSPC under the kernel's write cache.
//!
//! With FUSE_WRITEBACK_CACHE the kernel takes a write(2) into its page
//! cache without asking the daemon and hands the data over later, as a
//! writeback; a writeback the engine has no room for fails where no
//! program waits for it (the kernel reports it at fsync or close, as NFS
//! does). Kernel file systems fail the write(2) itself. Three parts keep
//! that promise here:
//!
//! - **A floor for the kernel's cache.** While a description of some file
//!   is open for writing through the kernel's cache, the engine keeps
//!   back (`Fs::set_cache_reserve`) at least as much space as the kernel
//!   may hold unwritten for this mount: its dirty limit for the mount
//!   (`/sys/class/bdi/<dev>/max_bytes`, a strict limit of 1% of the
//!   machine's dirty threshold: about 50 MB with 24 GiB), a quarter more
//!   for its overshoot and the pages of one write in flight, and 8 MiB.
//!   Other writes (descriptions opened uncached, direct I/O, fallocate)
//!   leave that space; the kernel's writebacks (`Fs::write_cached`, whole
//!   or not at all) may take it.
//! - **Uncached opens when the floor is not covered.** A file opened for
//!   writing while the space outside other reservations does not cover
//!   the floor is served uncached (FOPEN_DIRECT_IO, through the engine's
//!   page cache, whose delayed allocation fails write(2) with ENOSPC).
//! - **A gate for descriptions already open.** The kernel cannot switch
//!   an open description to uncached, but before each cached write(2) it
//!   refreshes the file's attributes if its mode is marked stale (size,
//!   mtime and ctime it keeps as its own under the write cache), and a
//!   write whose GETATTR fails fails with that error
//!   (fuse_cache_write_iter). So once a writeback has taken part of the
//!   floor, the gate marks the attributes of every file with a cached
//!   writable description stale (FUSE_NOTIFY_INVAL_INODE without pages),
//!   and answers the GETATTR such a write sends (it names the
//!   description) with ENOSPC until space is freed. Reads past EOF and
//!   lseek(SEEK_END) refresh only the size, which the kernel owns, so
//!   they do not reach the gate; neither does stat(2), which names no
//!   description. Any reply that carries the file's attributes (a stat,
//!   the kernel's SETATTR of the times at fsync) marks them fresh again,
//!   so the gate marks them stale again after such replies and every
//!   `TICK` while the floor is short.
//!
//! The gate refuses cached writes with EIO too once the file system has
//! shut down (a failed journal commit, FS_IOC_SHUTDOWN), for the same
//! reason: no writeback of them can succeed.
//!
//! What the gate cannot stop: a single write(2) that began before the
//! floor ran short copies on; the floor covers what the kernel may hold
//! at once, and a writeback that still finds no room fails whole, is
//! logged, and reaches the next fsync of every description (the kernel's
//! errseq), its pages dropped so that readers see what the file holds.

use crate::bdi;
use foliofs::Fs;
use fuser::{Errno, INodeNo, Notifier};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often the gate marks attributes stale again while the floor is
/// short (a reply with attributes between two marks lets writes through).
const TICK: Duration = Duration::from_millis(20);

/// How long the gate's thread waits after being woken by a reply before
/// it marks the attributes stale: over the rings the reply is sent after
/// the request's handler returns, and a mark made before it lands would
/// be undone by it.
const AFTER_REPLY: Duration = Duration::from_micros(500);

/// The floor when the kernel's dirty limit for the mount cannot be read
/// (a kernel before 6.2 has no `max_bytes`).
const FALLBACK_FLOOR: u64 = 256 << 20;

/// How much space to keep for the kernel's cached writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheFloor {
    /// From the kernel's dirty limit for the mount (the default).
    Auto,
    /// This many bytes; 0 keeps none, opens nothing uncached and gates
    /// nothing (writebacks may then fail for lack of space, reported at
    /// fsync and close only).
    Bytes(u64),
}

/// The space floor and the gate of one mount (see the module comment).
pub(crate) struct SpaceGate {
    gate: Arc<Gate>,
}

struct Gate {
    fs: Arc<Fs>,
    setting: CacheFloor,
    /// The mount point, to find the mount's backing device (`Auto`).
    mount_point: Option<PathBuf>,
    floor: OnceLock<u64>,
    /// Cached descriptions open for writing, by inode, and in all.
    /// Lock order: taken under `KernelCache`'s handles (a description
    /// opened or closed), and takes the engine's metadata lock under it
    /// (`Fs::set_cache_reserve`); never `thread`.
    writers: Mutex<(HashMap<u64, u32>, u32)>,
    /// Cached writes must be refused: the attributes of cached writers
    /// are kept stale.
    armed: AtomicBool,
    notifier: Notifier,
    /// Cached writes refused (at their GETATTR).
    refused: AtomicU64,
    /// The thread that marks attributes stale, started when first armed
    /// (it holds the gate weakly); joined when the mount's file system
    /// goes. Lock order: a leaf, taken under the engine's metadata lock
    /// by the shutdown hook (`wake`), so nothing of the engine's is taken
    /// under it.
    thread: Mutex<Option<(SyncSender<u64>, JoinHandle<()>)>>,
}

impl SpaceGate {
    pub fn new(
        fs: Arc<Fs>,
        setting: CacheFloor,
        mount_point: Option<PathBuf>,
        notifier: Notifier,
    ) -> Self {
        let gate = Arc::new(Gate {
            fs,
            setting,
            mount_point,
            floor: OnceLock::new(),
            writers: Mutex::new((HashMap::new(), 0)),
            armed: AtomicBool::new(false),
            notifier,
            refused: AtomicU64::new(0),
            thread: Mutex::new(None),
        });
        // A shutdown found anywhere (a background writeback, another
        // request) closes the gate at once. The hook runs under the
        // engine's lock: it only wakes the thread.
        let weak = Arc::downgrade(&gate);
        gate.fs.on_shutdown(move || {
            if let Some(g) = weak.upgrade() {
                g.armed.store(true, Ordering::Release);
                g.wake(0);
            }
        });
        SpaceGate { gate }
    }

    /// Where the file system is mounted, once it is.
    pub(crate) fn mount_point(&self) -> Option<&Path> {
        self.gate.mount_point.as_deref()
    }

    /// The floor in bytes, 0 for none.
    pub fn floor(&self) -> u64 {
        self.gate.floor()
    }

    /// Cached writes refused so far (the counters' `fuse_enospc_gated`).
    pub fn refused(&self) -> u64 {
        self.gate.refused.load(Ordering::Relaxed)
    }

    /// Whether a file opened for writing now may be cached by the kernel:
    /// the free space outside other reservations covers the floor.
    pub fn room_for_cache(&self) -> bool {
        let floor = self.floor();
        floor == 0 || self.gate.fs.cache_reservable_bytes() >= floor
    }

    /// A cached description of `ino` opened for writing: the first one of
    /// the mount sets the floor.
    pub fn writer_opened(&self, ino: u64) {
        let mut w = self.gate.writers.lock();
        *w.0.entry(ino).or_default() += 1;
        w.1 += 1;
        if w.1 == 1 {
            self.gate.fs.set_cache_reserve(self.floor());
        }
    }

    /// One closed: the last one of the mount gives the floor back (the
    /// kernel has written back its pages at the description's flush and
    /// release).
    pub fn writer_closed(&self, ino: u64) {
        let mut w = self.gate.writers.lock();
        if let Some(n) = w.0.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                w.0.remove(&ino);
            }
            w.1 -= 1;
            if w.1 == 0 {
                self.gate.fs.set_cache_reserve(0);
            }
        }
    }

    /// The GETATTR a cached write(2) sends through a description of
    /// `ino` when the file's attributes are stale: refused while the
    /// floor is short (ENOSPC) or the file system is shut down (EIO: the
    /// kernel would otherwise take writes no writeback can deliver).
    pub fn check_write(&self, ino: u64) -> Result<(), Errno> {
        if !self.gate.writing(ino) {
            return Ok(());
        }
        let refuse = self.gate.refusal();
        if let Some(e) = refuse {
            self.gate.refused.fetch_add(1, Ordering::Relaxed);
            self.arm(e);
        }
        refuse.map_or(Ok(()), Err)
    }

    /// After a writeback of the kernel's reached the engine (or failed).
    pub fn after_writeback(&self) {
        if !self.gate.armed.load(Ordering::Relaxed) {
            if let Some(e) = self.gate.refusal() {
                self.arm(e);
            }
        }
    }

    /// A reply carried `ino`'s attributes, which the kernel now takes as
    /// fresh: while the gate is armed, mark them stale again.
    pub fn after_attr_reply(&self, ino: u64) {
        if self.gate.armed.load(Ordering::Relaxed) && self.gate.writing(ino) {
            self.gate.wake(ino);
        }
    }

    fn arm(&self, why: Errno) {
        if !self.gate.armed.swap(true, Ordering::AcqRel) && why == Errno::ENOSPC {
            log::warn!(
                "free space is down to the {} MiB kept for the kernel's cached writes: \
                 writes through descriptions opened before now fail with ENOSPC until \
                 space is freed",
                self.floor() >> 20
            );
        }
        self.gate.wake(0);
    }
}

impl Drop for SpaceGate {
    /// The thread is gone before the mount's end unmounts the file
    /// system.
    fn drop(&mut self) {
        let t = self.gate.thread.lock().take();
        if let Some((tx, h)) = t {
            drop(tx);
            let _ = h.join();
        }
    }
}

impl Gate {
    fn floor(&self) -> u64 {
        *self.floor.get_or_init(|| match self.setting {
            CacheFloor::Bytes(n) => n,
            CacheFloor::Auto => match self.mount_point.as_deref().and_then(bdi::dirty_limit) {
                Some(d) => {
                    let f = d + d / 4 + (8 << 20);
                    log::info!(
                        "the kernel may hold {} MiB of cached writes for this mount: {} MiB \
                         are kept free for them while files are open for writing",
                        d >> 20,
                        f >> 20
                    );
                    f
                }
                None => FALLBACK_FLOOR,
            },
        })
    }

    fn writing(&self, ino: u64) -> bool {
        self.writers.lock().0.contains_key(&ino)
    }

    /// Why cached writes must be refused now, if they must.
    fn refusal(&self) -> Option<Errno> {
        if self.fs.shutdown_reason().is_some() {
            Some(Errno::EIO)
        } else if self.floor() > 0 && self.fs.cache_reserve_short() {
            Some(Errno::ENOSPC)
        } else {
            None
        }
    }

    /// Wake the gate's thread: mark `ino`'s attributes stale (0: those of
    /// every file with a cached writer). Touches nothing of the engine's
    /// (`Fs::on_shutdown` calls it under the engine's lock).
    fn wake(self: &Arc<Self>, ino: u64) {
        let mut t = self.thread.lock();
        if t.is_none() {
            let (tx, rx) = std::sync::mpsc::sync_channel(1024);
            let gate = Arc::downgrade(self);
            match std::thread::Builder::new()
                .name("foliofs-gate".into())
                .spawn(move || run(gate, rx))
            {
                Ok(h) => *t = Some((tx, h)),
                Err(e) => {
                    log::error!("no thread for the space gate: {e}");
                    return;
                }
            }
        }
        if let Some((tx, _)) = t.as_ref() {
            let _ = tx.try_send(ino);
        }
    }

    /// Mark the attributes of these inodes stale (FUSE_NOTIFY_INVAL_INODE
    /// with a negative offset: no pages).
    fn mark(&self, inos: impl IntoIterator<Item = u64>) {
        for ino in inos {
            let _ = self.notifier.inval_inode(INodeNo(ino), -1, 0);
        }
    }
}

/// The gate's thread: marks on request, and every `TICK` while armed;
/// disarms once nothing is to be refused. Ends with the gate.
fn run(gate: Weak<Gate>, rx: Receiver<u64>) {
    loop {
        let armed = gate
            .upgrade()
            .is_some_and(|g| g.armed.load(Ordering::Acquire));
        let first = match rx.recv_timeout(if armed {
            TICK
        } else {
            Duration::from_secs(3600)
        }) {
            Ok(ino) => Some(ino),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if first.is_some() {
            std::thread::sleep(AFTER_REPLY);
        }
        let mut asked: HashSet<u64> = first.into_iter().collect();
        asked.extend(rx.try_iter());
        let Some(g) = gate.upgrade() else { return };
        if !g.armed.load(Ordering::Acquire) {
            continue;
        }
        if g.refusal().is_none() {
            g.armed.store(false, Ordering::Release);
            // (Not when the last writer closed, which gives the floor
            // back.)
            if g.writers.lock().1 > 0 {
                log::info!("free space covers the kernel's cached writes again");
            }
            continue;
        }
        let all: Vec<u64> = g.writers.lock().0.keys().copied().collect();
        if asked.contains(&0) || first.is_none() {
            g.mark(all);
        } else {
            g.mark(asked.into_iter().filter(|i| all.contains(i)));
        }
    }
}

//! Keeping the kernel's page cache coherent with the engine (`KernelCache`).
//!
//! The kernel caches file data across opens (FOPEN_KEEP_CACHE) and, with
//! the writeback cache, writes too. Descriptions opened uncached
//! (FOPEN_DIRECT_IO: O_DIRECT, or for writing while space is low) reach
//! the engine around that cache. Where a file is open both ways, this
//! keeps the two coherent as the kernel does for its own file systems:
//! before a direct request it has the kernel write back and drop its
//! pages of the file (while a cached description is open for writing),
//! after a direct write it has the kernel drop its now stale pages of
//! the range (FUSE_NOTIFY_INVAL_INODE), and an open after data was
//! written around the cache drops the kernel's pages instead of keeping
//! them.

use crate::threads::{pin_to_cpu, Drops, Transport};
use foliofs::fs::OpenFile;
use fuser::{FileHandle, FopenFlags, INodeNo, Notifier};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How long a request waits for the kernel to drop its pages
/// (`KernelCache::kernel_drop`).
const INVAL_WAIT: Duration = Duration::from_secs(10);

/// One FUSE_NOTIFY_INVAL_INODE for the `foliofs-inval` thread; `done` is
/// told when the kernel has finished it.
struct InvalJob {
    ino: u64,
    off: i64,
    len: i64,
    done: std::sync::mpsc::SyncSender<()>,
}

/// The invalidation thread. The kernel writes back the dirty pages it
/// drops through requests of this thread's own, which over rings go to
/// the queue of the CPU it runs on: so before each job it moves to the CPU
/// whose queue has the fewest threads inside `kernel_drop`, one that has a
/// thread free to serve them (`Drops`).
fn spawn_invalidator(
    notifier: Notifier,
    drops: Arc<Drops>,
    transport: Arc<Transport>,
) -> Mutex<std::sync::mpsc::Sender<InvalJob>> {
    let (tx, rx) = std::sync::mpsc::channel::<InvalJob>();
    let r = std::thread::Builder::new()
        .name("foliofs-inval".into())
        .spawn(move || {
            let mut pinned = None;
            for j in rx {
                if transport.rings() {
                    let q = drops.quietest_queue();
                    if q.is_some() && q != pinned && q.is_some_and(pin_to_cpu) {
                        pinned = q;
                    }
                }
                if let Err(e) = notifier.inval_inode(INodeNo(j.ino), j.off, j.len) {
                    log::debug!("inode {}: dropping the kernel's pages: {e}", j.ino);
                }
                let _ = j.done.try_send(());
            }
        });
    if let Err(e) = r {
        log::warn!("cannot start the invalidation thread: {e}");
    }
    Mutex::new(tx)
}

/// What `KernelCache::uncached` says of an uncached description: whether the
/// kernel caches the file through another for writing, and whether this
/// one takes the engine's direct path.
#[derive(Clone, Copy)]
pub(crate) struct Uncached {
    pub(crate) cached_writable: bool,
    pub(crate) odirect: bool,
}

/// One open file description.
pub(crate) struct Handle {
    pub(crate) ino: u64,
    /// Not cached by the kernel (FOPEN_DIRECT_IO): opened with O_DIRECT,
    /// or for writing while space was low (`CacheOptions::cache_floor`).
    pub(crate) uncached: bool,
    /// Opened with O_DIRECT: reads and writes take the engine's direct
    /// path (the others its page cache).
    pub(crate) odirect: bool,
    /// Opened for writing: with the writeback cache, the kernel may hold
    /// dirty pages of the file until this description's last close.
    pub(crate) writable: bool,
    /// The engine's description: its fsync hears of a writeback error once.
    pub(crate) file: OpenFile,
}

/// What the kernel may cache of a file: its cached (not FOPEN_DIRECT_IO)
/// descriptions, those open for writing (with the writeback cache the
/// kernel may hold dirty pages of the file until their close), and
/// whether its data was written around the kernel's page cache (a
/// FOPEN_DIRECT_IO write, a copy in the engine) since its last open: the
/// next open then drops the kernel's pages instead of keeping them.
#[derive(Default)]
struct FileCache {
    cached: u32,
    cached_writable: u32,
    bypassed: bool,
}

/// Open descriptions by handle, and per file what they mean for the
/// kernel's cache (`FileCache`): one lock, counted as descriptions come
/// and go, so a direct request learns it in O(1).
#[derive(Default)]
struct Handles {
    by_fh: HashMap<u64, Arc<Handle>>,
    files: HashMap<u64, FileCache>,
}

impl Handles {
    fn file(&mut self, ino: u64) -> &mut FileCache {
        self.files.entry(ino).or_default()
    }

    /// Forget `ino`'s entry when it says nothing any more.
    fn tidy(&mut self, ino: u64) {
        if let Some(f) = self.files.get(&ino) {
            if f.cached == 0 && !f.bypassed {
                self.files.remove(&ino);
            }
        }
    }
}

/// What the kernel may cache of the files this mount serves, and the
/// means to keep it coherent with the engine: the open descriptions
/// (`Handles`), the session's notifier and the thread that sends its
/// invalidations. `FuseFs` holds one.
pub(crate) struct KernelCache {
    /// FUSE_WRITEBACK_CACHE asked for (`CacheOptions::writeback_cache`).
    writeback_cache: bool,
    /// The kernel writes back a direct request's range itself
    /// (FUSE_DIRECT_IO_ALLOW_MMAP; `kernel_writeback`), known at INIT.
    dio_writeback: bool,
    /// Lock order: taken after no other lock of the adapter; under it
    /// only `SpaceGate`'s writers (through `open`'s and `close`'s
    /// callbacks), and through them the engine's lock. Never held across
    /// a request to the engine's data path or a wait for the kernel.
    handles: Mutex<Handles>,
    next_fh: AtomicU64,
    /// The session's: lets a request make the kernel write back and drop
    /// the pages it caches.
    notifier: Notifier,
    /// Request threads inside `kernel_drop`.
    drops: Arc<Drops>,
    /// Whether requests come through rings (for the invalidation thread).
    transport: Arc<Transport>,
    /// The thread that runs `kernel_drop`'s invalidations, started at the
    /// first. Lock order: a leaf, held only to send.
    inval: OnceLock<Mutex<std::sync::mpsc::Sender<InvalJob>>>,
}

impl KernelCache {
    pub(crate) fn new(
        writeback_cache: bool,
        notifier: Notifier,
        drops: Arc<Drops>,
        transport: Arc<Transport>,
    ) -> Self {
        KernelCache {
            writeback_cache,
            dio_writeback: false,
            handles: Mutex::new(Handles::default()),
            next_fh: AtomicU64::new(1),
            notifier,
            drops,
            transport,
            inval: OnceLock::new(),
        }
    }

    /// At INIT: whether the kernel writes back the range of a direct
    /// read or write itself before sending it.
    pub(crate) fn set_dio_writeback(&mut self, on: bool) {
        self.dio_writeback = on;
    }

    pub(crate) fn dio_writeback(&self) -> bool {
        self.dio_writeback
    }

    /// The accounts of request threads waiting in `kernel_drop`.
    pub(crate) fn drops(&self) -> &Drops {
        &self.drops
    }

    /// Register description `h` and give the open flags the kernel gets
    /// for it. Uncached ones get FOPEN_DIRECT_IO (O_DIRECT ones also
    /// FOPEN_PARALLEL_DIRECT_WRITES: the kernel serializes them itself
    /// while a cached description is open). The kernel keeps its cached
    /// pages of the file unless they may be stale: data written around
    /// them since the last open, or a read due to update the access
    /// time (`atime_due`). `cached_writer` runs, under the table's lock,
    /// for a cached description open for writing through the writeback
    /// cache.
    pub(crate) fn open(
        &self,
        h: Handle,
        atime_due: bool,
        cached_writer: impl FnOnce(),
    ) -> (u64, FopenFlags) {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        let ino = h.ino;
        let mut open = FopenFlags::empty();
        if h.uncached {
            open |= FopenFlags::FOPEN_DIRECT_IO;
        }
        if h.odirect {
            open |= FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES;
        }
        let mut hs = self.handles.lock();
        let f = hs.file(ino);
        if !std::mem::take(&mut f.bypassed) && !atime_due {
            open |= FopenFlags::FOPEN_KEEP_CACHE;
        }
        if !h.uncached {
            f.cached += 1;
            f.cached_writable += h.writable as u32;
            if h.writable && self.writeback_cache {
                cached_writer();
            }
        }
        hs.tidy(ino);
        hs.by_fh.insert(fh, Arc::new(h));
        (fh, open)
    }

    /// Forget description `fh`, and hand back its engine description if
    /// no request holds it any more. `cached_writer_closed` runs, under
    /// the table's lock, for a cached description that was open for
    /// writing through the writeback cache.
    pub(crate) fn close(
        &self,
        fh: FileHandle,
        cached_writer_closed: impl FnOnce(u64),
    ) -> Option<OpenFile> {
        let h = {
            let mut hs = self.handles.lock();
            let h = hs.by_fh.remove(&fh.0);
            if let Some(h) = h.as_ref().filter(|h| !h.uncached) {
                let f = hs.file(h.ino);
                f.cached -= 1;
                f.cached_writable -= h.writable as u32;
                hs.tidy(h.ino);
                if h.writable && self.writeback_cache {
                    cached_writer_closed(h.ino);
                }
            }
            h
        };
        h.and_then(|h| Arc::try_unwrap(h).ok()).map(|h| h.file)
    }

    pub(crate) fn handle(&self, fh: FileHandle) -> Option<Arc<Handle>> {
        self.handles.lock().by_fh.get(&fh.0).cloned()
    }

    /// Whether `fh` takes the engine's direct path (O_DIRECT).
    pub(crate) fn is_odirect(&self, fh: FileHandle) -> bool {
        self.handle(fh).is_some_and(|h| h.odirect)
    }

    /// Cached descriptions of `ino`: whether any is open, and whether any
    /// is open for writing (`FileCache`).
    pub(crate) fn cached_opens(&self, ino: u64) -> (bool, bool) {
        match self.handles.lock().files.get(&ino) {
            Some(f) => (f.cached > 0, f.cached_writable > 0),
            None => (false, false),
        }
    }

    /// For a request on description `fh` of `ino`: None unless it is
    /// uncached (FOPEN_DIRECT_IO); for an uncached one, `cached_opens` of
    /// the file, which a write also marks as written around the kernel's
    /// cache, and whether it takes the engine's direct path (O_DIRECT).
    /// One look at the table.
    pub(crate) fn uncached(&self, fh: FileHandle, ino: u64, write: bool) -> Option<Uncached> {
        let mut hs = self.handles.lock();
        let odirect = match hs.by_fh.get(&fh.0) {
            Some(h) if h.uncached => h.odirect,
            _ => return None,
        };
        let f = hs.file(ino);
        f.bypassed |= write;
        let u = Uncached {
            cached_writable: f.cached_writable > 0,
            odirect,
        };
        hs.tidy(ino);
        Some(u)
    }

    /// Data of `ino` changed where the kernel's page cache did not see
    /// it (a FOPEN_DIRECT_IO write, a copy in the engine).
    pub(crate) fn bypass(&self, ino: u64) {
        self.handles.lock().file(ino).bypassed = true;
    }

    /// A write that bypassed the kernel's cache is done: mark it again
    /// (an open while it ran took the mark, and may have cached the old
    /// data since), and say whether a cached description is open now,
    /// whose pages of the range the caller must drop.
    pub(crate) fn bypass_done(&self, ino: u64) -> bool {
        let mut hs = self.handles.lock();
        let f = hs.file(ino);
        f.bypassed = true;
        f.cached > 0
    }

    /// Before a request that works on the engine's copy of a file from
    /// `from` to its end rather than the kernel's, where the kernel does
    /// not write back first: with the writeback cache and a cached
    /// description open for writing (`cached_writable`), make the kernel
    /// write back and drop what it caches of the file there.
    ///
    /// Direct reads and writes (FOPEN_DIRECT_IO) need it only past the
    /// engine's end of file: the kernel writes back the range of each
    /// itself, in the caller's context (fuse_direct_io, with
    /// FUSE_DIRECT_IO_ALLOW_MMAP, Linux 6.6+), but the size its cached
    /// writes made stays its own until written back (`FuseFs::read`). A kernel
    /// without it (`dio_writeback` false) needs it before each
    /// (`direct_writeback`). SEEK_DATA and SEEK_HOLE it passes on as they
    /// are.
    pub(crate) fn kernel_writeback(&self, ino: u64, cached_writable: bool, from: u64) {
        if self.writeback_cache && cached_writable {
            self.kernel_drop(ino, from as i64, 0);
        }
    }

    /// Before a direct read or write, on a kernel that does not write
    /// back its range itself.
    pub(crate) fn direct_writeback(&self, ino: u64, u: Option<Uncached>) {
        if let Some(u) = u.filter(|_| !self.dio_writeback) {
            self.kernel_writeback(ino, u.cached_writable, 0);
        }
    }

    /// FUSE_NOTIFY_INVAL_INODE for a range of `ino` (len 0: to the end):
    /// the kernel drops its pages there, writing dirty ones back first,
    /// through requests that other threads serve (`Drops` keeps some
    /// free).
    ///
    /// The kernel's side runs on the `foliofs-inval` thread, and the
    /// request waits for it at most `INVAL_WAIT`, a backstop: should the
    /// kernel hold locked a page that only this request's reply unlocks
    /// (as a page-cache fill through an O_DIRECT handle did before `FuseFs::read`
    /// told fills apart; xfstests generic/647 hung on it), the request
    /// goes on, its reply unlocks the page, and the invalidation finishes
    /// after it.
    pub(crate) fn kernel_drop(&self, ino: u64, off: i64, len: i64) {
        let Some(_slot) = self.drops.enter(ino) else {
            return;
        };
        if let Some(wait) = self.queue_drop(ino, off, len) {
            if wait.recv_timeout(INVAL_WAIT).is_err() {
                log::warn!(
                    "inode {ino}: the kernel's invalidation waits on a page this request fills; \
                     going on"
                );
            }
        }
    }

    /// `kernel_drop` without waiting for it: the invalidation thread runs
    /// it, after this request's reply if it waits on pages the reply
    /// releases. Returns what tells when it is done, if it was queued.
    pub(crate) fn queue_drop(
        &self,
        ino: u64,
        off: i64,
        len: i64,
    ) -> Option<std::sync::mpsc::Receiver<()>> {
        let (done, wait) = std::sync::mpsc::sync_channel(1);
        let job = InvalJob {
            ino,
            off,
            len,
            done,
        };
        self.inval
            .get_or_init(|| {
                spawn_invalidator(
                    self.notifier.clone(),
                    self.drops.clone(),
                    self.transport.clone(),
                )
            })
            .lock()
            .send(job)
            .is_ok()
            .then_some(wait)
    }

    /// The kernel's cached attributes of `ino` are stale (its mode after
    /// a kill_priv, its change time after chattr): it is told to ask
    /// again (FUSE_NOTIFY_INVAL_INODE without pages).
    pub(crate) fn stale_attrs(&self, ino: u64) {
        let _ = self.notifier.inval_inode(INodeNo(ino), -1, 0);
    }
}

//! The request threads: how requests reach them (`Transport`, with its
//! counters), which ring queue a thread serves, and who must stay free
//! for the kernel's writeback (`Drops`).
//!
//! A request that makes the kernel drop its pages of a file
//! (`KernelCache::kernel_drop`) waits for a writeback that other request
//! threads serve. This module counts the threads inside such a wait and
//! makes more (`Spawn`) before the last free one would enter it; the
//! session (`Session::serve`) says how a thread is made.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How requests reach the request threads, and what the ring threads
/// count: one per mount, shared by the file system (which reports it in
/// its counters) and the session's threads (which count in it).
#[derive(Default)]
pub struct Transport {
    /// The kernel agreed to FUSE over io_uring at INIT.
    rings: AtomicBool,
    /// Requests served through rings (the counters' `fuse_ring_requests`).
    ring_requests: AtomicU64,
    /// Replies sent from SCHED_IDLE (`fuse_idle_replies`).
    idle_replies: AtomicU64,
    /// Ring threads the watchdog took out of SCHED_IDLE
    /// (`fuse_idle_rescues`).
    idle_rescues: AtomicU64,
}

impl Transport {
    /// The kernel's answer at INIT: requests come through rings.
    pub fn set_rings(&self) {
        self.rings.store(true, Ordering::Release);
    }

    pub fn rings(&self) -> bool {
        self.rings.load(Ordering::Acquire)
    }

    /// One request served through a ring; true for the first.
    pub fn ring_request(&self) -> bool {
        self.ring_requests.fetch_add(1, Ordering::Relaxed) == 0
    }

    pub fn idle_reply(&self) {
        self.idle_replies.fetch_add(1, Ordering::Relaxed);
    }

    pub fn idle_rescue(&self) {
        self.idle_rescues.fetch_add(1, Ordering::Relaxed);
    }

    pub fn ring_requests(&self) -> u64 {
        self.ring_requests.load(Ordering::Relaxed)
    }

    pub fn idle_replies(&self) -> u64 {
        self.idle_replies.load(Ordering::Relaxed)
    }

    pub fn idle_rescues(&self) -> u64 {
        self.idle_rescues.load(Ordering::Relaxed)
    }
}

thread_local! {
    /// The queue a ring thread serves; None on other threads.
    static QUEUE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// The queue the calling thread serves, if it is a ring thread: a request
/// it serves came from that queue's CPU, and while it waits no other
/// request of that CPU reaches it.
pub(crate) fn current_queue() -> Option<usize> {
    QUEUE.get()
}

/// Run on the queue's own CPU: the kernel queues a request on the CPU
/// that made it, so its server wakes there (as libfuse's ring threads).
/// Also moves a thread whose own requests to the kernel must land on
/// queue `cpu` (`KernelCache::kernel_drop`'s invalidations). False if the
/// CPU cannot run it (offline).
pub(crate) fn pin_to_cpu(cpu: usize) -> bool {
    if cpu >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it for
    // cpu < CPU_SETSIZE, and sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

/// The calling thread serves ring queue `qid` from now on.
pub(crate) fn serve_queue(qid: usize) {
    QUEUE.set(Some(qid));
}

/// Makes one more request thread while the session runs: for ring queue
/// `Some(q)`, or one more /dev/fuse loop for None; true once it serves.
pub type Spawn = Box<dyn Fn(Option<usize>) -> bool + Send + Sync>;

/// Where the session puts its `Spawn` while it runs (`Session::serve`).
/// A slot filled late, and the only one: a `Spawn` holds the session's
/// dispatcher, which holds the file system that holds this, so no order
/// of construction can pass it in. `clear` it when the session ends,
/// before the file system is destroyed.
///
/// Lock order: held while a `Spawn` runs, which takes the session's list
/// of added ring threads (`AddedRings::threads`) under it and no lock of
/// the file system's; taken by a request thread that holds none.
#[derive(Clone, Default)]
pub(crate) struct SpawnSlot(Arc<Mutex<Option<Spawn>>>);

impl SpawnSlot {
    pub(crate) fn set(&self, s: Spawn) {
        *self.0.lock() = Some(s);
    }

    pub(crate) fn clear(&self) {
        self.0.lock().take();
    }

    fn spawn(&self, queue: Option<usize>) -> bool {
        self.0.lock().as_ref().is_some_and(|s| s(queue))
    }
}

/// Request threads inside `KernelCache::kernel_drop`. The kernel writes back
/// the pages it drops through requests that other threads serve, so one
/// must stay free to serve them.
///
/// Over /dev/fuse any worker serves any request. Over rings a request goes
/// to the queue of the CPU that made it, and only that queue's threads
/// serve it: each queue keeps its own account, and the invalidation thread
/// makes its requests from the CPU of the queue with the fewest threads
/// inside (`spawn_invalidator`). A thread that would leave its account none free
/// first makes one more (`Spawn`, up to four times the threads it started
/// with and at least `MIN_THREAD_CAP`), as libfuse's loop makes workers
/// when all are busy. Past that, at most all but one wait, and a thread
/// finding those waits taken waits for one; after 2 s it goes on without
/// (a deadlock otherwise), logged and counted.
pub(crate) struct Drops {
    any: Account,
    queues: Box<[Account]>,
    spawn: SpawnSlot,
    /// Waits had, requests that went on without one, threads made (the
    /// counters' `fuse_kernel_drops`, `fuse_kernel_drops_skipped`,
    /// `fuse_threads_added`).
    pub(crate) had: AtomicU64,
    pub(crate) skipped: AtomicU64,
    pub(crate) added: AtomicU64,
}

/// One set of threads that serve the same requests.
struct Account {
    threads: AtomicUsize,
    cap: usize,
    inside: AtomicUsize,
    waiting: AtomicUsize,
}

/// Threads an account may grow to whatever it started with: one thread
/// (`-o threads=1` or `ring_depth=1`) with six readers waiting needs
/// seven.
const MIN_THREAD_CAP: usize = 16;

impl Account {
    fn new(threads: usize) -> Self {
        Account {
            threads: AtomicUsize::new(threads),
            cap: (threads * 4).max(MIN_THREAD_CAP),
            inside: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
        }
    }
}

/// A wait in `kernel_drop`, given back when dropped.
pub(crate) struct DropSlot<'a>(&'a Account);

impl Drop for DropSlot<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
        self.0.inside.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Drops {
    /// The accounts of `workers` /dev/fuse loops and of `queues` ring
    /// queues of `depth` threads each; more are made through `spawn`.
    pub(crate) fn new(workers: usize, depth: usize, queues: usize, spawn: SpawnSlot) -> Self {
        Drops {
            any: Account::new(workers),
            queues: (0..queues).map(|_| Account::new(depth)).collect(),
            spawn,
            had: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            added: AtomicU64::new(0),
        }
    }

    /// A wait for the calling thread: over rings on its queue's account,
    /// otherwise on the workers'. None if none came free in 2 s.
    pub(crate) fn enter(&self, ino: u64) -> Option<DropSlot<'_>> {
        let queue = current_queue().filter(|&q| q < self.queues.len());
        let a = queue.map_or(&self.any, |q| &self.queues[q]);
        let inside = a.inside.fetch_add(1, Ordering::AcqRel) + 1;
        let threads = a.threads.load(Ordering::Acquire);
        if inside >= threads && threads < a.cap && self.spawn.spawn(queue) {
            a.threads.fetch_add(1, Ordering::AcqRel);
            self.added.fetch_add(1, Ordering::Relaxed);
        }
        let mut tries = 0;
        while a
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
                (b + 1 < a.threads.load(Ordering::Acquire)).then_some(b + 1)
            })
            .is_err()
        {
            tries += 1;
            if tries > 2000 {
                a.inside.fetch_sub(1, Ordering::AcqRel);
                self.skipped.fetch_add(1, Ordering::Relaxed);
                log::warn!(
                    "inode {ino}: no thread free to wait for the kernel's writeback; \
                     a request goes on without it"
                );
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.had.fetch_add(1, Ordering::Relaxed);
        Some(DropSlot(a))
    }

    /// The ring queue with the fewest threads inside `kernel_drop`. Not
    /// the one with the most threads free: a thread added to a queue
    /// takes only requests queued after it came, and those queued before
    /// (behind which the writeback would wait) only as others finish.
    pub(crate) fn quietest_queue(&self) -> Option<usize> {
        (0..self.queues.len()).min_by_key(|&q| self.queues[q].inside.load(Ordering::Acquire))
    }
}

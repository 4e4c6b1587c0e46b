//! FUSE over io_uring (Linux 6.14+, `fuse.enable_uring=Y`): requests
//! reach the server through io_uring commands on /dev/fuse instead of
//! read(2) and write(2) on it, one queue per possible CPU; the kernel puts
//! a request on the queue of the CPU that made it.
//!
//! Each serving thread owns one ring and one ring entry (a header buffer
//! and a payload buffer the kernel fills with a request) and serves one
//! request at a time: it registers the entry (FUSE_IO_URING_CMD_REGISTER),
//! waits for a request, has the file system serve it (fuser's
//! `RawDispatcher`, the same `Filesystem` the /dev/fuse loops serve), puts
//! the reply into the entry and sends it with the next fetch in one
//! command (FUSE_IO_URING_CMD_COMMIT_AND_FETCH). `depth` threads per
//! queue let that many requests of one CPU be served at once (the engine
//! blocks on the device). The kernel switches the connection to the rings
//! once every queue has an entry; until then, and for what never goes
//! through them (forgets, interrupts), the /dev/fuse loops serve.
//!
//! Layouts from include/uapi/linux/fuse.h (protocol 7.42+): a request's
//! `fuse_in_header` is in `in_out`, its first argument (the per-opcode
//! header, possibly empty) in `op_in`, the other arguments in the
//! payload, `payload_sz` bytes; a reply's `fuse_out_header` goes into
//! `in_out` and all its arguments into the payload.

use crate::threads::{pin_to_cpu, serve_queue, Transport};
use foliofs::device::AlignedBuf;
use fuser::{Filesystem, RawDispatcher};
use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use std::time::Instant;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;

/// `struct fuse_uring_req_header`.
#[repr(C)]
struct Header {
    in_out: [u8; 128],
    op_in: [u8; 128],
    // struct fuse_uring_ent_in_out
    flags: u64,
    commit_id: u64,
    payload_sz: u32,
    padding: u32,
    reserved: u64,
}

/// Room before the payload in an entry's buffer: a request's headers are
/// put there, next to its payload, so that the dispatcher reads the whole
/// request in place (a write's megabyte is not copied once more to join
/// its headers). A page, so that the payload starts on one.
const PREFIX: usize = 4096;

/// One ring entry's memory: the kernel keeps pointers into it from
/// registration on, so it stays put for the thread's life.
struct Entry {
    header: Box<Header>,
    /// `PREFIX` bytes, then the payload the kernel fills: one allocation,
    /// addressed only through this pointer, so that a request read from
    /// its front (`request`) and a reply written into its payload
    /// (`PayloadSink`) are two disjoint views, neither a borrow of the
    /// whole.
    base: std::ptr::NonNull<u8>,
    len: usize,
    /// The allocation `base` points into: whole huge pages
    /// (`AlignedBuf`'s `HUGE_PAGE`), so that a payload the engine reads
    /// the device into is a few physically contiguous segments.
    _buf: AlignedBuf,
    iov: Box<[libc::iovec; 2]>,
}

impl Entry {
    fn new(payload: usize) -> Entry {
        let mut header = Box::new(Header {
            in_out: [0; 128],
            op_in: [0; 128],
            flags: 0,
            commit_id: 0,
            payload_sz: 0,
            padding: 0,
            reserved: 0,
        });
        let len = PREFIX + payload;
        let buf = AlignedBuf::zeroed(len.next_multiple_of(foliofs::device::HUGE_PAGE));
        let base = std::ptr::NonNull::new(buf.ptr_at(0)).expect("a mapped buffer");
        let iov = Box::new([
            libc::iovec {
                iov_base: (&mut *header as *mut Header).cast(),
                iov_len: std::mem::size_of::<Header>(),
            },
            libc::iovec {
                // SAFETY: PREFIX is inside the allocation.
                iov_base: unsafe { base.as_ptr().add(PREFIX) }.cast(),
                iov_len: payload,
            },
        ]);
        Entry {
            header,
            base,
            len,
            _buf: buf,
            iov,
        }
    }

    fn payload_len(&self) -> usize {
        self.len - PREFIX
    }

    /// The payload's address, for a reply written into it while the
    /// request (before it) is read.
    fn payload_ptr(&self) -> *mut u8 {
        // SAFETY: PREFIX is inside the allocation.
        unsafe { self.base.as_ptr().add(PREFIX) }
    }

    /// The request the kernel put into the entry, laid out as /dev/fuse
    /// gives one (`fuse_in_header`, the per-opcode header, the payload),
    /// its headers copied in front of the payload where it lies.
    fn request(&mut self) -> &[u8] {
        let h = &*self.header;
        let len = u32::from_ne_bytes(h.in_out[0..4].try_into().unwrap()) as usize;
        let psz = (h.payload_sz as usize).min(self.payload_len());
        let op = len.saturating_sub(IN_HEADER + psz).min(h.op_in.len());
        let start = PREFIX - IN_HEADER - op;
        // SAFETY: [start, PREFIX + psz) is inside the allocation, and no
        // other view of it is alive (`&mut self`; a sink writes only
        // while a request without payload is served, past PREFIX).
        let front = unsafe {
            std::slice::from_raw_parts_mut(self.base.as_ptr().add(start), PREFIX - start)
        };
        front[..IN_HEADER].copy_from_slice(&h.in_out[..IN_HEADER]);
        front[IN_HEADER..].copy_from_slice(&h.op_in[..op]);
        // The header's length as /dev/fuse would give it.
        let total = (IN_HEADER + op + psz) as u32;
        front[..4].copy_from_slice(&total.to_ne_bytes());
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(start), PREFIX + psz - start) }
    }

    fn payload_mut(&mut self) -> &mut [u8] {
        // SAFETY: the payload is inside the allocation; `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.payload_ptr(), self.payload_len()) }
    }
}

/// Where the reply to a request without payload goes (most requests: a
/// read's data, attributes, a directory listing): straight into the ring
/// entry's payload, its `fuse_out_header` kept aside for the entry's
/// header, instead of into a vector copied there afterwards (a large
/// read's megabyte, once more). Open only while its request is served
/// (`begin`, `end`): a reply that came later would find the payload
/// holding the next request, and is refused.
#[derive(Default)]
struct PayloadSink {
    state: std::sync::Mutex<SinkState>,
}

#[derive(Default)]
struct SinkState {
    /// The payload's address and length while a request is served.
    to: Option<(usize, usize)>,
    header: [u8; OUT_HEADER],
    /// The reply's length, its header included, once it came.
    len: Option<usize>,
    /// It did not fit into the payload.
    too_large: bool,
}

thread_local! {
    /// The payload an open `PayloadSink` of this thread writes into.
    static REPLY_SPACE: std::cell::Cell<Option<(usize, usize)>> =
        const { std::cell::Cell::new(None) };
}

/// Where the reply to the request this thread serves will be written,
/// when it is served from a ring with its reply going straight into the
/// entry's payload (`PayloadSink`) and that holds `len` bytes: the
/// payload's address, page-aligned (a direct read may go there). A
/// handler that makes its reply's data there (the engine reading into
/// it) sends it without a copy: the sink finds the bytes in place. The
/// memory is the handler's until it replies, and must not be used after.
pub(crate) fn reply_space(len: usize) -> Option<*mut u8> {
    REPLY_SPACE
        .get()
        .filter(|&(_, cap)| cap >= len)
        .map(|(p, _)| p as *mut u8)
}

impl PayloadSink {
    fn begin(&self, payload: *mut u8, len: usize) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        *s = SinkState {
            to: Some((payload as usize, len)),
            ..SinkState::default()
        };
        REPLY_SPACE.set(Some((payload as usize, len)));
    }

    /// Close it: the reply's header and the length of its arguments (in
    /// the payload), if a reply that fits came.
    fn end(&self) -> Option<([u8; OUT_HEADER], usize)> {
        REPLY_SPACE.set(None);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.to = None;
        match s.len {
            Some(n) if n >= OUT_HEADER && !s.too_large => Some((s.header, n - OUT_HEADER)),
            _ => None,
        }
    }
}

impl fuser::ReplySink for PayloadSink {
    fn send(&self, data: &[std::io::IoSlice<'_>]) -> io::Result<()> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some((to, cap)) = s.to else {
            return Err(io::Error::other("a reply after its request was answered"));
        };
        let mut at = 0;
        for d in data {
            let mut d: &[u8] = d;
            if at < OUT_HEADER {
                let k = (OUT_HEADER - at).min(d.len());
                s.header[at..at + k].copy_from_slice(&d[..k]);
                at += k;
                d = &d[k..];
            }
            if d.is_empty() {
                continue;
            }
            let off = at - OUT_HEADER;
            if off + d.len() > cap {
                s.too_large = true;
                return Err(io::Error::other("a reply larger than the ring's payload"));
            }
            let dst = to as *mut u8;
            // Bytes made in place (`reply_space`) need no copy.
            if !std::ptr::eq(d.as_ptr(), dst.wrapping_add(off)) {
                // SAFETY: [to, to + cap) is the ring entry's payload,
                // which nothing else writes while the sink is open: the
                // kernel has handed the entry over, the request being
                // served has no payload (its bytes lie before it), and a
                // handler that made its reply in it (`reply_space`) is
                // done with it. `copy`, not the nonoverlapping one: such
                // a reply's data may lie in the payload elsewhere.
                unsafe { std::ptr::copy(d.as_ptr(), dst.add(off), d.len()) };
            }
            at += d.len();
        }
        s.len = Some(at);
        Ok(())
    }
}

/// The possible CPUs (/sys/devices/system/cpu/possible, e.g. "0-3"): one
/// queue each.
pub fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let mut max = 0usize;
    for part in s.trim().split(',') {
        let last = part.rsplit('-').next().unwrap_or(part);
        let n: usize = last
            .parse()
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, format!("cpu list {s:?}")))?;
        max = max.max(n);
    }
    Ok(max + 1)
}

/// Start `depth` serving threads for each possible CPU's queue, each
/// entry with a payload buffer of `payload` bytes (at least the largest
/// read or write request), replying from SCHED_IDLE where it helps if
/// `idle_reply` (`IdleReply`).
pub fn start<FS: Filesystem>(
    d: RawDispatcher<FS>,
    depth: usize,
    payload: usize,
    idle_reply: bool,
    transport: Arc<Transport>,
) -> io::Result<Vec<JoinHandle<()>>> {
    let queues = possible_cpus()?;
    let limbo = Arc::new(Limbo::new(queues * depth, transport));
    let mut threads = Vec::new();
    for qid in 0..queues {
        for i in 0..depth {
            let d = d.clone();
            let limbo = limbo.clone();
            let slot = qid * depth + i;
            threads.push(
                std::thread::Builder::new()
                    .name(format!("fuse-ring-{qid}.{i}"))
                    .spawn(move || {
                        if !pin_to_cpu(qid) {
                            log::debug!("FUSE ring thread: cannot pin to CPU {qid}");
                        }
                        serve_queue(qid);
                        let idle = idle_reply.then_some((&*limbo, slot));
                        let t = &limbo.transport;
                        if let Err(e) = serve(&d, t, qid as u16, payload, idle, None) {
                            log::error!("FUSE ring {qid}.{i}: {e}");
                        }
                        limbo.ended();
                    })?,
            );
        }
    }
    if idle_reply {
        let closed = move || d.closed();
        threads.push(
            std::thread::Builder::new()
                .name("fuse-ring-watch".into())
                .spawn(move || limbo.watch(closed))?,
        );
    }
    Ok(threads)
}

/// Where each ring thread is in SCHED_IDLE after a reply, and since when.
///
/// A thread leaves SCHED_IDLE as soon as it runs again, but while its CPU
/// is busy with other work it may not run for a long time, and the
/// kernel hands the next request of that CPU's queue to the entry
/// committed last: its own. So a watchdog thread puts any ring thread
/// that has been in SCHED_IDLE for over `LIMBO_MAX` back into
/// SCHED_OTHER (setting the policy of another thread needs the same
/// CAP_SYS_NICE). It looks every `LIMBO_TICK` while replies go out this
/// way and sleeps when none has for a while. Ending a thread's stay early
/// is always harmless: what matters happens inside the reply's submit.
struct Limbo {
    epoch: Instant,
    /// Where replies from SCHED_IDLE and rescues are counted.
    transport: Arc<Transport>,
    slots: Vec<LimboSlot>,
    /// Ring threads with a slot still serving: none left (the session is
    /// over), the watchdog ends.
    live: AtomicUsize,
    parked: AtomicBool,
    /// Lock order: a leaf, held only around `parked` and the condvar's
    /// wait, by the watchdog and by ring threads entering SCHED_IDLE.
    wake: Mutex<()>,
    cv: Condvar,
}

#[derive(Default)]
struct LimboSlot {
    tid: AtomicI32,
    /// `Limbo::now` at entry, 0 while not in SCHED_IDLE.
    since: AtomicU64,
}

const LIMBO_MAX: Duration = Duration::from_millis(1);
const LIMBO_TICK: Duration = Duration::from_millis(2);
/// Ticks without a thread in SCHED_IDLE before the watchdog sleeps.
const LIMBO_IDLE_TICKS: u32 = 50;

impl Limbo {
    fn new(n: usize, transport: Arc<Transport>) -> Limbo {
        Limbo {
            epoch: Instant::now(),
            transport,
            slots: (0..n).map(|_| LimboSlot::default()).collect(),
            live: AtomicUsize::new(n),
            parked: AtomicBool::new(false),
            wake: Mutex::new(()),
            cv: Condvar::new(),
        }
    }

    /// Nanoseconds since `epoch`, never 0 (0 marks "not in SCHED_IDLE").
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64 + 1
    }

    /// The thread serving `slot` is the calling thread.
    fn register(&self, slot: usize) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        self.slots[slot].tid.store(tid, Ordering::SeqCst);
    }

    /// Thread `slot` is about to reply from SCHED_IDLE.
    fn enter(&self, slot: usize) {
        self.slots[slot].since.store(self.now(), Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            let _g = self.wake.lock().unwrap_or_else(|e| e.into_inner());
            self.parked.store(false, Ordering::SeqCst);
            self.cv.notify_one();
        }
    }

    /// A ring thread with a slot has stopped serving: the last one wakes
    /// the watchdog to end.
    fn ended(&self) {
        if self.live.fetch_sub(1, Ordering::SeqCst) == 1 {
            let _g = self.wake.lock().unwrap_or_else(|e| e.into_inner());
            self.cv.notify_one();
        }
    }

    /// The watchdog has nothing left to watch.
    fn over(&self, closed: &impl Fn() -> bool) -> bool {
        self.live.load(Ordering::SeqCst) == 0 || closed()
    }

    /// Thread `slot` is back in SCHED_OTHER.
    fn leave(&self, slot: usize) {
        self.slots[slot].since.store(0, Ordering::SeqCst);
    }

    /// Any thread in SCHED_IDLE now; those there for over LIMBO_MAX are
    /// put back into SCHED_OTHER.
    fn sweep(&self) -> bool {
        let now = self.now();
        let mut any = false;
        for s in &self.slots {
            let since = s.since.load(Ordering::SeqCst);
            if since == 0 {
                continue;
            }
            any = true;
            // Claimed only while it is still the same stay (entry times
            // differ), so each stay is ended at most once.
            if now.saturating_sub(since) > LIMBO_MAX.as_nanos() as u64
                && s.since
                    .compare_exchange(since, 0, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
            {
                let p = libc::sched_param { sched_priority: 0 };
                let tid = s.tid.load(Ordering::Relaxed);
                // SAFETY: sched_setscheduler on a thread of this process
                // with a valid sched_param.
                if unsafe { libc::sched_setscheduler(tid, libc::SCHED_OTHER, &p) } == 0 {
                    self.transport.idle_rescue();
                }
            }
        }
        any
    }

    /// The watchdog's loop, until `closed()` or no ring thread with a
    /// slot serves (they end as soon as the kernel ends the connection,
    /// before the session is marked closed).
    fn watch(&self, closed: impl Fn() -> bool) {
        let mut quiet = 0u32;
        while !self.over(&closed) {
            std::thread::sleep(LIMBO_TICK);
            if self.sweep() {
                quiet = 0;
                continue;
            }
            quiet += 1;
            if quiet < LIMBO_IDLE_TICKS {
                continue;
            }
            // Sleep until a thread enters SCHED_IDLE or the last ring
            // thread ends (100 ms at most, to look at `closed` too).
            // Parked first, then one more look: an `enter` either sees
            // `parked` or is seen here, and `ended` notifies under the
            // lock held from here to the wait.
            let mut g = self.wake.lock().unwrap_or_else(|e| e.into_inner());
            self.parked.store(true, Ordering::SeqCst);
            if self
                .slots
                .iter()
                .any(|s| s.since.load(Ordering::SeqCst) != 0)
            {
                self.parked.store(false, Ordering::SeqCst);
                continue;
            }
            while self.parked.load(Ordering::SeqCst) && !self.over(&closed) {
                g = self
                    .cv
                    .wait_timeout(g, Duration::from_millis(100))
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            self.parked.store(false, Ordering::SeqCst);
            quiet = 0;
        }
    }
}

/// Replies sent from the idle scheduling class (`-o idle_reply`).
///
/// A ring thread serves a request on the CPU of the thread that made it,
/// and sends the reply while it still runs there. The scheduler then
/// wakes the caller on another CPU if one is idle, and on a virtual
/// machine without guest halt polling, waking an idle (halted) vCPU
/// costs more than the request itself: a round trip takes 27-35 us
/// instead of 11-15. A CPU that runs only SCHED_IDLE threads counts as
/// idle to the scheduler, and a woken thread preempts them at once, so a
/// reply sent from SCHED_IDLE wakes the caller right here. Used for the
/// requests a caller waits for that need no device I/O (lookups,
/// attributes, listings, namespace changes), not for reads, writes,
/// fsync or the kernel's background requests.
struct IdleReply;

impl IdleReply {
    /// Switch this thread to SCHED_IDLE or back to SCHED_OTHER; false if
    /// the kernel refused (leaving SCHED_IDLE needs CAP_SYS_NICE).
    fn set(idle: bool) -> bool {
        let p = libc::sched_param { sched_priority: 0 };
        let policy = if idle {
            libc::SCHED_IDLE
        } else {
            libc::SCHED_OTHER
        };
        // SAFETY: sched_setscheduler on the calling thread with a valid
        // sched_param.
        unsafe { libc::sched_setscheduler(0, policy, &p) == 0 }
    }

    /// Whether this thread runs as SCHED_OTHER and may go to SCHED_IDLE
    /// and back: leaving SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE
    /// that allows nice 0, so without them it is never entered.
    fn works() -> bool {
        // SAFETY: sched_getscheduler on the calling thread.
        if unsafe { libc::sched_getscheduler(0) } != libc::SCHED_OTHER {
            return false;
        }
        if !IdleReply::may_leave() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                log::info!("FUSE rings: replies not from SCHED_IDLE (no CAP_SYS_NICE)")
            });
            return false;
        }
        if !IdleReply::set(true) {
            return false;
        }
        if IdleReply::set(false) {
            return true;
        }
        log::warn!("FUSE ring thread: stuck in SCHED_IDLE after a probe");
        false
    }

    fn may_leave() -> bool {
        const CAP_SYS_NICE: u32 = 23;
        let caps = std::fs::read_to_string("/proc/thread-self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("CapEff:"))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
            })
            .unwrap_or(0);
        if caps & (1 << CAP_SYS_NICE) != 0 {
            return true;
        }
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit fills the rlimit it is given.
        unsafe { libc::getrlimit(libc::RLIMIT_NICE, &mut r) == 0 && r.rlim_cur >= 20 }
    }

    /// Requests a caller waits for whose reply comes without device I/O.
    fn quick(opcode: u32) -> bool {
        matches!(
            opcode,
            1 | 3..=6 | 8..=14 | 17 | 21..=24 | 27 | 28 | 34 | 35 | 44 | 45 | 51 | 52
        )
    }
}

/// A FUSE ring command: `struct fuse_uring_cmd_req` in the SQE's command
/// area; registration also points at the entry's two buffers.
fn command(
    fd: RawFd,
    op: u32,
    qid: u16,
    commit_id: u64,
    iov: Option<&[libc::iovec; 2]>,
) -> squeue::Entry128 {
    let mut cmd = [0u8; 80];
    cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    cmd[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut b = opcode::UringCmd80::new(types::Fd(fd), op).cmd(cmd);
    if let Some(iov) = iov {
        b = b.addr(Some(iov.as_ptr() as u64));
    }
    let sqe = b.build();
    if iov.is_none() {
        return sqe;
    }
    // The kernel reads the iovec count from the SQE's len (offset 24),
    // which the builder does not set.
    // SAFETY: Entry128 is a 128-byte repr(C) SQE; only `len` changes.
    unsafe {
        let mut raw: [u8; 128] = std::mem::transmute(sqe);
        raw[24..28].copy_from_slice(&2u32.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(raw)
    }
}

/// Start one more thread serving one more entry of queue `qid`, called
/// `fuse-ring-{qid}.+{n}`, while the session runs; the receiver hears
/// once the entry is registered, so that the next request queued there
/// finds it.
pub fn add_thread<FS: Filesystem>(
    d: &RawDispatcher<FS>,
    transport: &Arc<Transport>,
    qid: usize,
    n: usize,
    payload: usize,
) -> io::Result<(JoinHandle<()>, std::sync::mpsc::Receiver<()>)> {
    let (ready, registered) = std::sync::mpsc::sync_channel(1);
    let (d, t) = (d.clone(), transport.clone());
    let thread = std::thread::Builder::new()
        .name(format!("fuse-ring-{qid}.+{n}"))
        .spawn(move || {
            pin_to_cpu(qid);
            serve_queue(qid);
            if let Err(e) = serve(&d, &t, qid as u16, payload, None, Some(ready)) {
                log::error!("FUSE ring {qid}, a thread added: {e}");
            }
        })?;
    Ok((thread, registered))
}

/// Serve one entry of queue `qid` until the session ends; `ready` is told
/// once the entry is registered.
fn serve<FS: Filesystem>(
    d: &RawDispatcher<FS>,
    transport: &Transport,
    qid: u16,
    payload: usize,
    idle: Option<(&Limbo, usize)>,
    mut ready: Option<std::sync::mpsc::SyncSender<()>>,
) -> io::Result<()> {
    let mut ring: IoUring<squeue::Entry128, cqueue::Entry> = IoUring::builder().build(2)?;
    let fd = d.fuse_fd().as_raw_fd();
    let mut ent = Entry::new(payload);
    let mut next = command(fd, CMD_REGISTER, qid, 0, Some(&ent.iov));
    let mut reply = Vec::new();
    let sink = Arc::new(PayloadSink::default());
    let tick = types::Timespec::from(Duration::from_millis(100));
    let mut idle = idle.filter(|_| IdleReply::works());
    if let Some((limbo, slot)) = idle {
        limbo.register(slot);
    }
    let mut quick = false;
    loop {
        // SAFETY: the entry's buffers outlive the command (they live as
        // long as the ring, which this function owns).
        unsafe { ring.submission().push(&next) }.map_err(|_| io::Error::other("ring full"))?;
        if let Some(r) = ready.take() {
            // The kernel registers the entry as the command is submitted.
            ring.submit()?;
            let _ = r.send(());
        }
        if let Some((limbo, slot)) = idle.filter(|_| quick) {
            // The caller waits for this reply; it wakes on this CPU if
            // the CPU runs nothing but idle-class work when it does.
            limbo.enter(slot);
            IdleReply::set(true);
            let r = ring.submit();
            let back = IdleReply::set(false);
            limbo.leave(slot);
            if !back {
                log::error!("FUSE ring {qid}: cannot leave SCHED_IDLE; replies stop using it");
                idle = None;
            }
            r?;
            transport.idle_reply();
        }
        let res = loop {
            let args = types::SubmitArgs::new().timespec(&tick);
            match ring.submitter().submit_with_args(1, &args) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::ETIME) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
            if let Some(c) = ring.completion().next() {
                break c.result();
            }
            if d.closed() {
                return Ok(());
            }
        };
        if res < 0 {
            let e = io::Error::from_raw_os_error(-res);
            // Unmounted, or the kernel stopped the rings.
            if d.closed() || matches!(-res, libc::ENOTCONN | libc::ECANCELED | libc::ENODEV) {
                return Ok(());
            }
            return Err(e);
        }
        let h = &*ent.header;
        quick = IdleReply::quick(u32::from_ne_bytes(h.in_out[4..8].try_into().unwrap()));
        let unique = u64::from_ne_bytes(h.in_out[8..16].try_into().unwrap());
        if transport.ring_request() {
            log::info!("serving requests through FUSE over io_uring");
        }
        if ent.header.payload_sz == 0 {
            // The reply goes straight into the payload.
            sink.begin(ent.payload_ptr(), ent.payload_len());
            if let Err(e) = d.dispatch_into(ent.request(), sink.clone()) {
                log::warn!("FUSE ring {qid}: {e}");
            }
            if let Some((out, args)) = sink.end() {
                let h = &mut *ent.header;
                h.in_out[..OUT_HEADER].copy_from_slice(&out);
                h.payload_sz = args as u32;
                next = command(fd, CMD_COMMIT_AND_FETCH, qid, h.commit_id, None);
                continue;
            }
            reply.clear();
        } else {
            reply.clear();
            if let Err(e) = d.dispatch(ent.request(), &mut reply) {
                log::warn!("FUSE ring {qid}: {e}");
            }
        }
        let args = reply.len().saturating_sub(OUT_HEADER);
        if reply.len() < OUT_HEADER || args > ent.payload_len() {
            // No reply (a request that has none never comes here) or one
            // too large for the entry: answer EIO so the caller goes on.
            reply.clear();
            reply.extend_from_slice(&(OUT_HEADER as u32).to_ne_bytes());
            reply.extend_from_slice(&(-libc::EIO).to_ne_bytes());
            reply.extend_from_slice(&unique.to_ne_bytes());
        }
        let args = reply.len() - OUT_HEADER;
        ent.payload_mut()[..args].copy_from_slice(&reply[OUT_HEADER..]);
        let h = &mut *ent.header;
        h.in_out[..OUT_HEADER].copy_from_slice(&reply[..OUT_HEADER]);
        h.payload_sz = args as u32;
        next = command(fd, CMD_COMMIT_AND_FETCH, qid, h.commit_id, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// The watchdog ends with the last ring thread, before the session
    /// is marked closed (what an unmount waits for), parked or not.
    #[test]
    fn the_watchdog_ends_with_the_last_ring_thread() {
        for wait_parked in [false, true] {
            let limbo = Arc::new(Limbo::new(2, Arc::default()));
            let (done, ended) = mpsc::channel();
            let l = limbo.clone();
            std::thread::spawn(move || {
                l.watch(|| false);
                let _ = done.send(());
            });
            if wait_parked {
                // Past LIMBO_IDLE_TICKS quiet ticks: parked on its condvar.
                std::thread::sleep(LIMBO_TICK * (LIMBO_IDLE_TICKS + 20));
            }
            limbo.ended();
            assert!(
                ended.recv_timeout(Duration::from_millis(300)).is_err(),
                "the watchdog ended while a ring thread still served"
            );
            limbo.ended();
            assert!(
                ended.recv_timeout(Duration::from_secs(10)).is_ok(),
                "the watchdog outlived the ring threads"
            );
        }
    }
}

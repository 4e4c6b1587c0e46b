//! Read-ahead for sequential direct readers
//! (`MountOptions::direct_read_ahead`; the FUSE mount turns it on).
//!
//! A direct read at queue depth 1 leaves the device idle while the caller
//! takes what it read: in the engine the caller's own work, through the
//! mount the whole round trip (the reply, the kernel's copy into the
//! caller's buffer, the next request). When a direct read starts where
//! the file's last one ended, the engine reads the next ones (the same
//! length on) on its read-ahead thread meanwhile, into buffers of its
//! own; the next read, if it asks for exactly that, checks it against
//! its checksums and takes it from there instead of the device.
//!
//! queue: (a sequential direct read, before it is served) `Fs::ahead_take`:
//!       the next `AHEAD_DEPTH` reads on the inode (`dio_ahead`) and in
//!       the queue -> (the thread) I/O lock shared if free at once, else
//!       dropped -> pin, `Shared::fetch_direct_pinned` into the buffer
//!       (mapping, checksums and logged images in one pass under the
//!       metadata lock, device reads without it) -> unpin; kept if
//!       `data_gen` did not move
//! serve: (the read it was for, I/O lock shared) taken from the inode ->
//!       wait if running, or read the device if still queued -> used only
//!       if the inode's `data_gen` and its I/O lock's exclusive count are
//!       those of the read ahead, and every block matches its checksum
//!       (else the reader reads the device, which tells a race from
//!       corruption)
//!
//! Invariant: a read served from read-ahead returns what a device read
//! at that moment would: every change to a file's data either moves its
//! `data_gen` (direct writes starting and ending, writeback, logged
//! overwrites) or takes its I/O lock exclusive (buffered writes,
//! extending direct writes, truncate, punch, fallocate), and the reader
//! holds the lock shared from before it looks until it has copied.

use super::ahead_slot::{Ahead, State};
use crate::device::{AlignedBuf, HUGE_PAGE};
use crate::error::Result;
use crate::fs::bump;
use crate::fs::data::iolock::IoGuard;
use crate::fs::data::verify::DevRun;
use crate::fs::state::{Inner, Shared};
use crate::fs::Fs;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Largest direct read whose successors are read ahead.
const AHEAD_MAX_BYTES: usize = 4 << 20;

/// How many reads a sequential reader has read ahead of it.
const AHEAD_DEPTH: usize = 2;

/// Threads reading ahead. One: two device reads at once each took twice
/// as long on the disk measured (docs/BENCH.md), and a second thread
/// whose device reads wait for the first's only shares the CPU the
/// reader's round trip needs.
const AHEAD_THREADS: usize = 1;

/// Buffers of served reads ahead kept for the next.
const SPARE_BUFS: usize = 2 * AHEAD_DEPTH;

impl Fs {
    /// At a direct read of `len` bytes at `offset` (`g` held, and the
    /// inode's I/O lock shared): take its read ahead, if any, and drop
    /// those behind it (all of them unless the read is `sequential`);
    /// then, for a sequential reader, queue the reads of the next
    /// `AHEAD_DEPTH` lengths that are not queued yet, so the device has
    /// the next one to read while this one is served.
    pub(in crate::fs) fn ahead_take(
        &self,
        g: &mut Inner,
        ino: u64,
        offset: u64,
        len: usize,
        sequential: bool,
    ) -> Result<Option<Arc<Ahead>>> {
        let ip = g.with(ino)?.0;
        let mut this = None;
        ip.dio_ahead.retain(|a| {
            if a.offset == offset && a.len == len {
                this = Some(a.clone());
            }
            sequential && a.offset > offset && a.len == len
        });
        if !sequential
            || len > AHEAD_MAX_BYTES
            || !self.s.knobs.dio_ahead.load(Ordering::Relaxed)
            || !ip.dio_inflight.is_empty()
        {
            return Ok(this);
        }
        let mut jobs = Vec::new();
        for k in 1..=AHEAD_DEPTH {
            let at = offset + (k * len) as u64;
            if at >= ip.size {
                break;
            }
            if ip.dio_ahead.iter().any(|a| a.offset == at) {
                continue;
            }
            let a = Arc::new(Ahead {
                offset: at,
                len,
                state: Mutex::new(State::Queued),
                done: Condvar::new(),
            });
            ip.dio_ahead.push(a.clone());
            jobs.push((ino, a));
        }
        if !jobs.is_empty() {
            self.start_ahead_threads();
            let mut q = self.s.ahead.jobs.lock();
            q.extend(jobs);
            self.s.ahead.kick.notify_all();
        }
        Ok(this)
    }

    fn start_ahead_threads(&self) {
        let mut t = self.ahead_threads.lock();
        while t.len() < AHEAD_THREADS && !self.s.stopping.load(Ordering::SeqCst) {
            let s = self.s.clone();
            match std::thread::Builder::new()
                .name(format!("foliofs-ahead{}", t.len()))
                .spawn(move || s.ahead_loop())
            {
                Ok(h) => t.push(h),
                Err(_) => break,
            }
        }
    }

    pub(in crate::fs) fn stop_ahead_threads(&self) {
        self.s.ahead.wake();
        for t in self.ahead_threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn ahead_loop(&self) {
        loop {
            let (ino, a) = {
                let mut q = self.ahead.jobs.lock();
                loop {
                    if self.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    if let Some(j) = q.pop_front() {
                        break j;
                    }
                    self.ahead.kick.wait(&mut q);
                }
            };
            {
                let mut st = a.state.lock();
                if !matches!(*st, State::Queued) {
                    continue;
                }
                *st = State::Running;
            }
            let r = self.ahead_read(ino, &a).unwrap_or(State::Gone);
            *a.state.lock() = r;
            a.done.notify_all();
        }
    }

    /// Read `a` (on the read-ahead thread), or say why not (`Gone`).
    fn ahead_read(&self, ino: u64, a: &Arc<Ahead>) -> Option<State> {
        // Never wait for the lock: an exclusive holder or waiter is about
        // to change the file, which would make the read ahead stale.
        let io = self.iolocks.try_shared(ino)?;
        let mut g = self.inner.lock();
        let ip = g.with(ino).ok()?.0;
        let bs = self.block_size;
        // Still wanted, and nothing cached or in flight would have the
        // reader write back first or race it.
        if !ip.dio_ahead.iter().any(|x| Arc::ptr_eq(x, a))
            || a.offset >= ip.size
            || ip.wb_busy
            || !ip.dio_inflight.is_empty()
            || ip
                .cache
                .any_dirty_in(a.offset / bs, (a.offset + a.len as u64).div_ceil(bs))
        {
            return None;
        }
        let n = (a.len as u64).min(ip.size - a.offset) as usize;
        let blocks = n.div_ceil(bs as usize) * bs as usize;
        let gen = ip.data_gen;
        ip.open += 1;
        let mut buf = self
            .ahead
            .spare
            .lock()
            .pop()
            .unwrap_or_else(|| AlignedBuf::zeroed(0));
        if buf.len() < blocks {
            buf = AlignedBuf::zeroed(blocks.next_multiple_of(HUGE_PAGE));
        }
        let r = self.fetch_direct_pinned(g, ino, a.offset, &mut buf[..blocks]);
        let mut g = self.inner.lock();
        let _ = g.release(ino);
        let same = g.with(ino).is_ok_and(|(ip, _)| ip.data_gen == gen);
        drop(g);
        let Some(runs) = r.ok().filter(|_| same) else {
            self.keep_spare(buf);
            return None;
        };
        bump(&self.counters.dio_ahead_reads, 1);
        Some(State::Read {
            buf,
            runs,
            n,
            gen,
            lock: io.lock(),
            excl: io.exclusive_count(),
        })
    }

    fn keep_spare(&self, buf: AlignedBuf) {
        let mut s = self.ahead.spare.lock();
        if s.len() < SPARE_BUFS {
            s.push(buf);
        }
    }

    /// Serve a direct read of `n` bytes of `ino` into `buf` (whole blocks)
    /// from `a`, its read ahead, taken from the inode: the count, or None
    /// to read the device (not read yet, failed, or stale). `io` is the
    /// reader's shared I/O lock; the metadata lock is not held.
    pub(in crate::fs) fn ahead_serve(
        &self,
        a: &Ahead,
        io: &IoGuard,
        ino: u64,
        n: usize,
        buf: &mut [u8],
    ) -> Result<Option<usize>> {
        let got = {
            let mut st = a.state.lock();
            if matches!(*st, State::Running) {
                bump(&self.counters.dio_ahead_waits, 1);
            }
            while matches!(*st, State::Running) {
                a.done.wait(&mut st);
            }
            std::mem::replace(&mut *st, State::Gone)
        };
        let State::Read {
            buf: read,
            runs,
            n: m,
            gen,
            lock,
            excl,
        } = got
        else {
            return Ok(None);
        };
        let fresh = m == n
            && Arc::ptr_eq(&lock, &io.lock())
            && io.exclusive_count() == excl
            && self.inner.lock().with(ino)?.0.data_gen == gen;
        // Checked here, by the reader, so that the read-ahead thread
        // only waits for the device. A mismatch is left to the reader's
        // own device read, which tells a race from corruption.
        let bs = self.block_size;
        let first = a.offset / bs;
        let at = |r: &DevRun| ((r.lblk - first) * bs) as usize;
        let good = fresh && runs.verify(ino, bs, &read, &at).is_ok();
        if good {
            buf.copy_from_slice(&read[..buf.len()]);
            bump(&self.counters.dio_ahead_hits, 1);
        }
        self.keep_spare(read);
        Ok(good.then_some(n))
    }
}

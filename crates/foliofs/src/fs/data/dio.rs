//! Direct I/O: block-aligned reads and writes between the caller's buffer
//! and the device, bypassing the cache.
//!
//! read: shared I/O lock -> write back dirty cached blocks in the range ->
//!       per request of at most `dio_max_blocks` blocks: map the range and
//!       fetch its checksums in one pass under the metadata lock -> one
//!       device read per mapped run, holes and unwritten blocks zero-filled
//!       -> verify every block -> EIO on a mismatch (counted, logged).
//!       A sequential reader's next reads are read ahead (`ahead`, with
//!       `MountOptions::direct_read_ahead`) and served from memory when
//!       nothing changed the file since.
//! overwrite (every block allocated and written, inside the file): shared
//!       lock -> small runs logged with their checksums (the writer waits
//!       for the log write), large runs written to new blocks and remapped
//!       (`overwrite`).
//! other writes: exclusive lock -> write back the cache -> allocate holes
//!       as unwritten -> write unwritten blocks in place, written ones as
//!       overwrites -> checksums, written extents and the size in the
//!       running transaction.
//!
//! A data write is counted (`DataFlush`), so the commit that makes
//! its checksums, extents or size durable first flushes the data. A
//! checksum on disk therefore always matches the data (with the overwrite
//! log off, it is zero while an in-place overwrite may be torn).
//!
//! Readers racing a direct overwrite of the same blocks may see new data
//! with the old checksum: `Inode::data_gen` and the in-flight list tell a
//! race from corruption, and the read is retried.
//!
//! Invariants (seeds/btrfs-large-dio-reads.txt): a read fetches the
//! checksums of its whole range in one pass and issues as few device
//! requests as the extents allow, up to `dio_max_blocks`; every block is
//! verified before the read returns, and a mismatch is EIO, counted and
//! logged with inode, offset and device address, never wrong data; the
//! checksum array of one request is bounded by the cap. Dirty cached data
//! in the range is written back first; a direct write invalidates cached
//! folios in its range.
//!
//! Invariants (seeds/ext4-shared-dio-lock.txt, with `iolock`): a direct
//! write takes the inode lock shared only as a pure overwrite (aligned,
//! inside the file, every block allocated and written); anything else
//! takes it exclusive, which also waits out in-flight direct I/O; the
//! size on disk moves only after an extending write's data is on the
//! device.

use super::verify::{DevRun, DeviceRuns};
use super::MAX_FILE_SIZE;
use crate::csums::{clear_csums, set_csums};
use crate::error::{Error, Result};
use crate::format::data_crc;
use crate::fs::ctx::Ctx;
use crate::fs::data::iolock::Mode;
use crate::fs::data::overwrite::{cow_alloc, unalloc, Cow};
use crate::fs::inode::{DioWrite, Inode};
use crate::fs::state::{Inner, Shared};
use crate::fs::{bump, Fs};
use parking_lot::MutexGuard;
use std::sync::atomic::Ordering;

/// Retries of a read whose checksum failed while a direct write raced it.
const RACE_RETRIES: u32 = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Hole,
    Unwritten(u64),
    Written(u64),
}

/// A run of file blocks with one state, and its device address.
#[derive(Clone, Copy, Debug)]
struct Seg {
    lblk: u64,
    len: u64,
    state: State,
}

impl Seg {
    fn pblk(&self) -> Option<u64> {
        match self.state {
            State::Hole => None,
            State::Unwritten(p) | State::Written(p) => Some(p),
        }
    }
}

/// The state of file blocks [from, to), in order.
fn map_range(ip: &Inode, cx: &mut Ctx, from: u64, to: u64) -> Result<Vec<Seg>> {
    bump(&cx.counters.mapping_lookups, 1);
    let mut out = Vec::new();
    let mut l = from;
    for e in ip.ext_range(cx, from, to)? {
        if e.lblk > l {
            out.push(Seg {
                lblk: l,
                len: e.lblk - l,
                state: State::Hole,
            });
            l = e.lblk;
        }
        let end = e.end().min(to);
        if end <= l {
            continue;
        }
        let p = e.pblk + (l - e.lblk);
        out.push(Seg {
            lblk: l,
            len: end - l,
            state: if e.unwritten {
                State::Unwritten(p)
            } else {
                State::Written(p)
            },
        });
        l = end;
    }
    if l < to {
        out.push(Seg {
            lblk: l,
            len: to - l,
            state: State::Hole,
        });
    }
    Ok(out)
}

impl Shared {
    /// A reader that read data generation `gen` of `ino` saw a checksum
    /// mismatch. True when a write racing it explains that (the data
    /// generation moved, or a direct write is in flight): the retry is
    /// counted and the caller drops its locks and reads again. False, and
    /// the mismatch is corruption, once that has happened RACE_RETRIES
    /// times.
    pub(in crate::fs) fn race_explains(
        &self,
        g: &mut Inner,
        ino: u64,
        gen: u64,
        tries: &mut u32,
    ) -> Result<bool> {
        let ip = g.with(ino)?.0;
        if *tries >= RACE_RETRIES || (ip.data_gen == gen && ip.dio_inflight.is_empty()) {
            return Ok(false);
        }
        *tries += 1;
        bump(&self.counters.dio_read_retries, 1);
        Ok(true)
    }
}

/// Smallest read drop-behind takes past the cache (`read_past_cache`):
/// the kernel's read-ahead requests, not a program's small reads, which
/// the folios serve (and their neighbours with them).
const UNCACHED_READ_MIN: usize = 128 << 10;

fn check_aligned(bs: u64, offset: u64, len: usize, ptr: *const u8) -> Result<()> {
    let mem = bs.min(4096);
    if offset % bs != 0 || len as u64 % bs != 0 || (len > 0 && ptr as u64 % mem != 0) {
        return Err(Error::Invalid(format!(
            "direct I/O needs an offset and a length in whole {bs}-byte blocks and a \
             buffer aligned to {mem} bytes (offset {offset}, length {len})"
        )));
    }
    Ok(())
}

impl Inode {
    /// Register a direct write over [from, to); overlapping ones in flight
    /// (and this one) are tainted. Pins the inode.
    fn dio_begin(&mut self, id: u64, from: u64, to: u64) {
        let mut tainted = false;
        for w in &mut self.dio_inflight {
            if w.from < to && from < w.to {
                w.tainted = true;
                tainted = true;
            }
        }
        self.dio_inflight.push(DioWrite {
            id,
            from,
            to,
            tainted,
        });
        self.data_gen += 1;
        self.open += 1;
    }

    /// Unregister direct write `id`; true when it was tainted. The caller
    /// unpins with `Inner::release`.
    fn dio_end(&mut self, id: u64) -> bool {
        self.data_gen += 1;
        match self.dio_inflight.iter().position(|w| w.id == id) {
            Some(i) => self.dio_inflight.swap_remove(i).tainted,
            None => true,
        }
    }
}

/// Record the checksums of the blocks of `segs` (written from file block
/// `from` on) in the running transaction.
fn record_csums(cx: &mut Ctx, segs: &[Seg], from: u64, crcs: &[u32]) -> Result<()> {
    for s in segs {
        if let Some(p) = s.pblk() {
            let i = (s.lblk - from) as usize;
            set_csums(cx.meta, p, &crcs[i..i + s.len as usize])?;
        }
    }
    Ok(())
}

/// What a direct write does with its range (overwrite log on): the
/// device writes left (unwritten blocks, and the new blocks of
/// out-of-place runs), the out-of-place runs to remap, and whether some
/// blocks were logged (their data is in the running transaction).
struct Plan {
    writes: Vec<Seg>,
    cows: Vec<Cow>,
    logged: bool,
}

/// Plan the direct write of `data` over `segs` (mapped, from file block
/// `from`): written runs shorter than the log's limit are logged now,
/// longer ones get new blocks; unwritten runs are written in place.
fn plan(g: &mut Inner, ino: u64, segs: &[Seg], from: u64, data: &[u8]) -> Result<Plan> {
    let bs = g.meta.geo.block_size;
    let max = g.log_max_blocks();
    let ag = g.meta.geo.inode_ag(ino);
    let (ip, mut cx) = g.with(ino)?;
    let mut out = Plan {
        writes: Vec::new(),
        cows: Vec::new(),
        logged: false,
    };
    let r = plan_into(ip, &mut cx, &mut out, (ag, max, bs), segs, from, data);
    if r.is_err() {
        // New blocks taken so far go back.
        unalloc(&mut cx, &out.cows);
    }
    r.map(|()| out)
}

fn plan_into(
    ip: &mut Inode,
    cx: &mut Ctx,
    out: &mut Plan,
    (ag, max, bs): (u32, u64, u64),
    segs: &[Seg],
    from: u64,
    data: &[u8],
) -> Result<()> {
    for s in segs {
        let at = ((s.lblk - from) * bs) as usize;
        let bytes = &data[at..at + (s.len * bs) as usize];
        match s.state {
            State::Hole => {
                return Err(Error::Invalid("direct write to an unmapped block".into()));
            }
            State::Unwritten(_) => out.writes.push(*s),
            State::Written(p) if s.len >= max => {
                if let Some(cows) = cow_alloc(cx, ag, Some(p), s.lblk, s.len)? {
                    out.writes.extend(cows.iter().map(|c| Seg {
                        lblk: c.lblk,
                        len: c.len,
                        state: State::Unwritten(c.pblk),
                    }));
                    out.cows.extend(cows);
                    continue;
                }
                // No room for a second copy: logged, a piece at a time.
                for (k, piece) in bytes.chunks((max * bs) as usize).enumerate() {
                    ip.log_overwrite(cx, p + k as u64 * max, piece)?;
                }
                out.logged = true;
            }
            State::Written(p) => {
                ip.log_overwrite(cx, p, bytes)?;
                out.logged = true;
            }
        }
    }
    Ok(())
}

impl Plan {
    /// The device writes are done: checksums of the blocks written in
    /// place, and the out-of-place runs mapped (the caller converts
    /// unwritten blocks and sets the size).
    fn record(&self, ip: &mut Inode, cx: &mut Ctx, from: u64, crcs: &[u32]) -> Result<()> {
        let in_place: Vec<Seg> = self
            .writes
            .iter()
            .filter(|w| !self.cows.iter().any(|c| c.lblk == w.lblk))
            .copied()
            .collect();
        record_csums(cx, &in_place, from, crcs)?;
        if !self.cows.is_empty() {
            let cow_crcs: Vec<u32> = self
                .cows
                .iter()
                .flat_map(|c| (c.lblk..c.lblk + c.len).map(|l| crcs[(l - from) as usize]))
                .collect();
            ip.cow_remap(cx, &self.cows, &cow_crcs)?;
        }
        Ok(())
    }
}

impl Fs {
    /// Read with O_DIRECT semantics: `offset`, `buf.len()` in whole blocks
    /// and `buf` aligned (EINVAL otherwise). Returns the bytes read, short
    /// at end of file. Every block is verified against its checksum.
    pub fn read_direct(&self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let n = self.read_direct_as(ino, offset, buf, false)?;
        Ok(n.expect("a direct read is never turned back"))
    }

    /// Drop-behind for reads (`MountOptions::drop_behind`): a read of at
    /// least `UNCACHED_READ_MIN` in whole blocks into an aligned buffer,
    /// of blocks no folio holds, while no writeback of the file is in
    /// flight, goes from the device straight into `buf` (verified, as a
    /// direct read, and read ahead for a sequential reader) instead of
    /// through new folios. The caller caches what it reads (the kernel's
    /// page cache over the mount), so a folio would be a second copy of
    /// a file streamed once: the copy into it, and memory the kernel
    /// zeroes for it until the cache is full. None: read through the
    /// cache.
    pub(in crate::fs) fn read_past_cache(
        &self,
        ino: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<Option<usize>> {
        let bs = self.s.block_size;
        if buf.len() < UNCACHED_READ_MIN
            || check_aligned(bs, offset, buf.len(), buf.as_ptr()).is_err()
        {
            return Ok(None);
        }
        self.read_direct_as(ino, offset, buf, true)
    }

    /// `read_direct`, counted as a direct read; or, `uncached`, as a
    /// buffered one past the cache (`read_past_cache`), turned back
    /// (None) under the same hold of the locks when the cache must serve
    /// it.
    fn read_direct_as(
        &self,
        ino: u64,
        offset: u64,
        buf: &mut [u8],
        uncached: bool,
    ) -> Result<Option<usize>> {
        let bs = self.s.block_size;
        check_aligned(bs, offset, buf.len(), buf.as_ptr())?;
        let io = self.s.iolocks.lock(ino, Mode::Shared, &self.s.counters);
        let mut g = self.s.inner.lock();
        let drop_behind = g.opts.drop_behind;
        let (ip, _) = g.with(ino)?;
        if uncached {
            let end = (offset + buf.len() as u64).div_ceil(bs);
            // A directory is refused below as the cache would refuse it;
            // a read at or past the end goes through the cache, which
            // counts it as a read (atime).
            if !drop_behind
                || offset >= ip.size
                || ip.wb_busy
                || ip.cache.holds_any(offset / bs, end)
            {
                return Ok(None);
            }
        }
        if ip.is_dir() {
            return Err(Error::IsDir);
        }
        if offset >= ip.size || buf.is_empty() {
            return Ok(Some(0));
        }
        let n = (buf.len() as u64).min(ip.size - offset) as usize;
        let (from, to) = (offset / bs, (offset + n as u64).div_ceil(bs));
        if ip.wb_busy || ip.cache.any_dirty_in(from, to) {
            g = self.s.writeback_inode(g, ino, u64::MAX)?.0;
        }
        let ip = g.with(ino)?.0;
        let blocks = (n as u64).div_ceil(bs) as usize * bs as usize;
        // A sequential reader's next reads, read ahead (`ahead`): this
        // one's is taken, those behind it dropped, and the next ones
        // queued before this one is served.
        let sequential = ip.dio_next == Some(offset);
        ip.dio_next = Some(offset + blocks as u64);
        let ahead = self.ahead_take(&mut g, ino, offset, buf.len(), sequential)?;
        let c = &self.s.counters;
        let (reads, read_bytes) = if uncached {
            (&c.uncached_reads, &c.uncached_read_bytes)
        } else {
            (&c.dio_reads, &c.dio_read_bytes)
        };
        bump(reads, 1);
        let r = match ahead {
            Some(a) => {
                drop(g);
                let served = self.s.ahead_serve(&a, &io, ino, n, &mut buf[..blocks])?;
                g = self.s.inner.lock();
                served
            }
            None => None,
        };
        let r = match r {
            Some(n) => Ok(n),
            None => {
                g.with(ino)?.0.open += 1;
                // The pin and the first mapping pass under one hold of the lock.
                let r = self
                    .s
                    .read_direct_pinned(g, ino, offset, &mut buf[..blocks]);
                g = self.s.inner.lock();
                g.release(ino)?;
                r.map(|()| n)
            }
        };
        let n = match r {
            Ok(n) => n,
            Err(e) => return Err(self.checksum_failed(e)),
        };
        self.accessed(&mut g, ino)?;
        drop(g);
        // Bytes past the end of file in the last block are not file data.
        buf[n..blocks].fill(0);
        bump(read_bytes, n as u64);
        bump(&c.bytes_read_app, n as u64);
        Ok(Some(n))
    }
}

impl Shared {
    /// Read into `buf` from a pinned inode; `g` (the metadata lock) is
    /// used for the first mapping pass, then released.
    pub(in crate::fs) fn read_direct_pinned(
        &self,
        g: MutexGuard<'_, Inner>,
        ino: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let mut held = Some(g);
        let bs = self.block_size;
        let first = offset / bs;
        let nblk = buf.len() as u64 / bs;
        let mut done = 0u64;
        let mut tries = 0;
        while done < nblk {
            let cap = self.knobs.dio_max_blocks.load(Ordering::Relaxed);
            let lblk = first + done;
            let want = (nblk - done).min(cap);
            let g = held.take().unwrap_or_else(|| self.inner.lock());
            let (runs, gen) = self.direct_pass(g, ino, first, lblk, want, buf)?;
            let r = runs.verify(ino, bs, buf, &|r: &DevRun| ((r.lblk - first) * bs) as usize);
            match r {
                Err(e @ Error::DataChecksum { .. }) => {
                    if self.race_explains(&mut self.inner.lock(), ino, gen, &mut tries)? {
                        std::thread::yield_now();
                        continue;
                    }
                    return Err(e);
                }
                r => r?,
            }
            done += want;
        }
        Ok(())
    }
}

impl Shared {
    /// A read ahead's device reads (`ahead`): `direct_pass` over all of
    /// `buf`, nothing verified: the reader it is for checks the runs
    /// handed back (`DeviceRuns::verify`) before it takes the bytes.
    pub(in crate::fs) fn fetch_direct_pinned(
        &self,
        g: MutexGuard<'_, Inner>,
        ino: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<DeviceRuns> {
        let first = offset / self.block_size;
        let nblk = buf.len() as u64 / self.block_size;
        Ok(self.direct_pass(g, ino, first, first, nblk, buf)?.0)
    }

    /// One pass of a direct read whose `buf` starts at file block
    /// `first`: blocks [lblk, lblk + want) mapped, their checksums and
    /// logged images taken under `g` (the metadata lock, then released),
    /// holes and unwritten blocks zeroed, the runs (at most
    /// `dio_max_blocks` each) read without the lock. Nothing is
    /// verified yet: the runs and the inode's `data_gen` at the mapping.
    fn direct_pass(
        &self,
        mut g: MutexGuard<'_, Inner>,
        ino: u64,
        first: u64,
        lblk: u64,
        want: u64,
        buf: &mut [u8],
    ) -> Result<(DeviceRuns, u64)> {
        let bs = self.block_size;
        let cap = self.knobs.dio_max_blocks.load(Ordering::Relaxed).max(1);
        let mut runs = DeviceRuns::take();
        let (ip, mut cx) = g.with(ino)?;
        let segs = map_range(ip, &mut cx, lblk, lblk + want)?;
        for s in &segs {
            if let State::Written(p) = s.state {
                let mut k = 0;
                while k < s.len {
                    let c = (s.len - k).min(cap);
                    runs.push(cx.meta, s.lblk + k, p + k, c)?;
                    k += c;
                }
            }
        }
        let gen = ip.data_gen;
        drop(g);
        for s in segs
            .iter()
            .filter(|s| !matches!(s.state, State::Written(_)))
        {
            let at = ((s.lblk - first) * bs) as usize;
            buf[at..at + (s.len * bs) as usize].fill(0);
        }
        runs.fetch(bs, &*self.dev, buf, &|r: &DevRun| {
            ((r.lblk - first) * bs) as usize
        })?;
        for r in runs.runs() {
            bump(&self.counters.dio_read_requests, 1);
            self.counters.dio_request(r.count);
        }
        Ok((runs, gen))
    }
}

impl Fs {
    /// Write with O_DIRECT semantics (alignment as for `read_direct`).
    /// Pure overwrites take the inode's I/O lock shared (unless the
    /// `DioLock::Exclusive` knob is set); anything that allocates, converts
    /// unwritten blocks or extends the file takes it exclusive.
    pub fn write_direct(&self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        self.write_direct_at(ino, Some(offset), data)
            .map(|(_, n)| n)
    }

    /// A direct write at the end of the file, as O_DIRECT with O_APPEND:
    /// the offset is the size under the inode's exclusive lock, which must
    /// be a whole number of blocks (EINVAL otherwise, as Linux's own file
    /// systems refuse it). Returns the offset written at and the count.
    pub fn append_direct(&self, ino: u64, data: &[u8]) -> Result<(u64, usize)> {
        self.write_direct_at(ino, None, data)
    }

    /// `write_direct` at `pos`, or at the end of the file when None.
    fn write_direct_at(&self, ino: u64, pos: Option<u64>, data: &[u8]) -> Result<(u64, usize)> {
        let bs = self.s.block_size;
        let span = |offset: u64| -> Result<(u64, u64, u64)> {
            check_aligned(bs, offset, data.len(), data.as_ptr())?;
            let end = offset
                .checked_add(data.len() as u64)
                .filter(|e| *e <= MAX_FILE_SIZE)
                .ok_or(Error::FileTooBig)?;
            Ok((end, offset / bs, end / bs))
        };
        let (mut offset, mut end, mut from, mut to) = (0, 0, 0, 0);
        if let Some(o) = pos {
            (end, from, to) = span(o)?;
            offset = o;
        }
        if data.is_empty() {
            if pos.is_none() {
                // An empty append writes nowhere: its offset is the size.
                offset = self.s.inner.lock().with(ino)?.0.size;
            }
            return Ok((offset, 0));
        }
        let crcs: Vec<u32> = data.chunks(bs as usize).map(data_crc).collect();
        let mut mode = if pos.is_none() || self.s.knobs.dio_exclusive.load(Ordering::Relaxed) {
            Mode::Exclusive
        } else {
            Mode::Shared
        };
        loop {
            let io = self.s.iolocks.lock(ino, mode, &self.s.counters);
            let mut g = self.s.inner.lock();
            g.check_writable()?;
            let mount_sync = g.opts.sync;
            let (ip, mut cx) = g.with(ino)?;
            ip.check_unfrozen(true)?;
            if ip.is_dir() {
                return Err(Error::IsDir);
            }
            if pos.is_none() {
                offset = ip.size;
                (end, from, to) = span(offset)?;
            }
            // chattr +S or `-o sync`: as O_SYNC.
            let sync = mount_sync || ip.sync_updates();
            let segs = map_range(ip, &mut cx, from, to)?;
            let overwrite = end <= ip.size
                && !ip.wb_busy
                && !ip.cache.any_dirty_in(from, to)
                && segs.iter().all(|s| matches!(s.state, State::Written(_)));
            if !overwrite && mode == Mode::Shared {
                drop(g);
                drop(io);
                mode = Mode::Exclusive;
                continue;
            }
            bump(&self.s.counters.dio_writes, 1);
            match mode {
                Mode::Shared => bump(&self.s.counters.dio_overwrites_shared, 1),
                Mode::Exclusive => bump(&self.s.counters.dio_writes_exclusive, 1),
            }
            let r = if overwrite {
                // Overwrites in progress at once, under the shared lock
                // several of one file.
                let now = self.s.dio_overwrites_now.fetch_add(1, Ordering::Relaxed) + 1;
                self.s
                    .counters
                    .dio_overwrites_peak
                    .fetch_max(now, Ordering::Relaxed);
                let r = self.dio_overwrite(g, ino, from, to, data, &crcs, segs);
                self.s.dio_overwrites_now.fetch_sub(1, Ordering::Relaxed);
                r
            } else {
                self.dio_allocating(g, ino, offset, data, &crcs)
            };
            drop(io);
            r?;
            bump(&self.s.counters.dio_write_bytes, data.len() as u64);
            bump(&self.s.counters.bytes_written_app, data.len() as u64);
            if sync {
                self.fsync(ino, false)?;
            }
            return Ok((offset, data.len()));
        }
    }

    /// Every block of [from, to) is allocated and written: no mapping
    /// changes, only checksums.
    #[allow(clippy::too_many_arguments)]
    fn dio_overwrite(
        &self,
        mut g: MutexGuard<'_, Inner>,
        ino: u64,
        from: u64,
        to: u64,
        data: &[u8],
        crcs: &[u32],
        segs: Vec<Seg>,
    ) -> Result<()> {
        let max = g.log_max_blocks();
        if max > 0 && segs.iter().all(|s| s.len < max) {
            return self.dio_logged(g, ino, (from, to), data, &segs);
        }
        let id = self.s.next_dio_id.fetch_add(1, Ordering::Relaxed);
        if max > 0 {
            g.with(ino)?.0.dio_begin(id, from, to);
            return self.dio_planned(g, ino, id, (from, to), data, crcs, &segs, None);
        }
        let (ip, cx) = g.with(ino)?;
        ip.dio_begin(id, from, to);
        let mut r = Ok(());
        for s in &segs {
            if let Some(p) = s.pblk() {
                r = r.and_then(|()| clear_csums(cx.meta, p, s.len));
            }
        }
        bump(&cx.counters.overwrite_intents, to - from);
        // The cleared checksums must be durable before the data changes.
        let r = r
            .and_then(|()| self.s.commit_wait(g))
            .and_then(|()| self.write_segs(&segs, from, data));
        self.dio_finish(ino, id, (from, to), r, |_, cx, tainted| {
            if tainted {
                return Ok(());
            }
            record_csums(cx, &segs, from, crcs)
        })
    }

    /// A direct overwrite whose runs are all short enough to log: one
    /// pass under the metadata lock puts the data, its checksums and the
    /// new mtime in the running transaction, then the caller waits for
    /// the log write (not a flush). No device write, nothing in flight.
    fn dio_logged(
        &self,
        mut g: MutexGuard<'_, Inner>,
        ino: u64,
        (from, to): (u64, u64),
        data: &[u8],
        segs: &[Seg],
    ) -> Result<()> {
        g.guarded(|g| {
            // Every run is written and short: all of it is logged.
            plan(g, ino, segs, from, data)?;
            let (ip, mut cx) = g.with(ino)?;
            ip.data_gen += 1;
            ip.touch_mtime();
            ip.store(&mut cx)?;
            g.drop_cached(ino, from, to)
        })?;
        let mut g = self.s.commit_to(g, false)?;
        g.maybe_commit()
    }

    /// A direct write `id` over mapped `segs` with the overwrite log on
    /// (`plan`): small written runs logged, large ones out of place,
    /// unwritten blocks in place. A logged write waits for its log write
    /// (its data is then on the device, as a direct write's is) but not
    /// for a flush: fdatasync or O_DSYNC asks for that. `end`: the file
    /// grows to it (an extending write).
    #[allow(clippy::too_many_arguments)]
    fn dio_planned(
        &self,
        mut g: MutexGuard<'_, Inner>,
        ino: u64,
        id: u64,
        (from, to): (u64, u64),
        data: &[u8],
        crcs: &[u32],
        segs: &[Seg],
        end: Option<u64>,
    ) -> Result<()> {
        let plan = g.guarded(|g| plan(g, ino, segs, from, data));
        let r = if plan.as_ref().is_ok_and(|p| p.logged) {
            self.s.commit_to(g, false).map(drop)
        } else {
            drop(g);
            Ok(())
        };
        let r = r.and(plan).and_then(|plan| {
            let r = self.write_segs(&plan.writes, from, data);
            if r.is_err() && !plan.cows.is_empty() {
                let mut g = self.s.inner.lock();
                unalloc(&mut g.with(ino)?.1, &plan.cows);
            }
            r.map(|()| plan)
        });
        let (r, plan) = match r {
            Ok(p) => (Ok(()), Some(p)),
            Err(e) => (Err(e), None),
        };
        self.dio_finish(ino, id, (from, to), r, |ip, cx, _| {
            // Every block went to its own place: no race to taint it.
            let plan = plan.expect("a plan when the writes succeeded");
            plan.record(ip, cx, from, crcs)?;
            ip.ext_mark_written(cx, from, to)?;
            if let Some(end) = end {
                // The data is written; the commit that makes this size
                // durable flushes it first (`DataFlush`).
                ip.size = ip.size.max(end);
                ip.d.size = ip.size;
            }
            Ok(())
        })
    }

    /// Complete direct write `id` over blocks [from, to) whose device
    /// write gave `r`: `record` puts what the write established into the
    /// running transaction (told whether it was tainted), then the mtime
    /// is set, cached copies of the range are dropped (stale now) and the
    /// inode unpinned.
    fn dio_finish(
        &self,
        ino: u64,
        id: u64,
        (from, to): (u64, u64),
        r: Result<()>,
        record: impl FnOnce(&mut Inode, &mut Ctx, bool) -> Result<()>,
    ) -> Result<()> {
        let mut g = self.s.inner.lock();
        let (ip, _) = g.with(ino)?;
        let tainted = ip.dio_end(id);
        // The device write's own error changed nothing; a failure while
        // recording what it established is half done.
        let r = r.and_then(|()| {
            g.guarded(|g| {
                let (ip, mut cx) = g.with(ino)?;
                record(ip, &mut cx, tainted)?;
                ip.touch_mtime();
                ip.store(&mut cx)?;
                g.drop_cached(ino, from, to)
            })
        });
        g.release(ino)?;
        r?;
        g.maybe_commit()
    }

    /// A write that fills holes, converts unwritten blocks or extends the
    /// file. The caller holds the inode's I/O lock exclusive.
    fn dio_allocating<'a>(
        &'a self,
        mut g: MutexGuard<'a, Inner>,
        ino: u64,
        offset: u64,
        data: &[u8],
        crcs: &[u32],
    ) -> Result<()> {
        let bs = self.s.block_size;
        let end = offset + data.len() as u64;
        let (from, to) = (offset / bs, end / bs);
        let ag = g.meta.geo.inode_ag(ino);
        // Coherence: cached data goes to the device first, including the
        // zeroed tail of the old last block when the write leaves a gap.
        let size = g.with(ino)?.0.size;
        if offset > size {
            // The tail block may be under writeback: stable pages.
            self.s.wait_wb_idle(&mut g, ino);
            g.zero_eof_tail(ino, size)?;
        }
        g.drop_prealloc(ino)?;
        let ip = g.with(ino)?.0;
        if ip.wb_busy || ip.cache.any_dirty() {
            g = self.s.writeback_inode(g, ino, u64::MAX)?.0;
        }
        let logging = g.log_max_blocks() > 0;
        let (ip, mut cx) = g.with(ino)?;
        let before = map_range(ip, &mut cx, from, to)?;
        let holes: u64 = before
            .iter()
            .filter(|s| s.state == State::Hole)
            .map(|s| s.len)
            .sum();
        cx.reserve(holes)?;
        let mut reserved = holes;
        let mut overwrites = false;
        let mut r = Ok(());
        for s in &before {
            match s.state {
                State::Hole => {
                    let mut l = s.lblk;
                    while r.is_ok() && l < s.lblk + s.len {
                        match ip.alloc_unwritten(&mut cx, ag, l, s.lblk + s.len - l) {
                            Ok((_, n)) => {
                                cx.alloc.unreserve(n);
                                reserved -= n;
                                l += n;
                            }
                            Err(e) => r = Err(e),
                        }
                    }
                }
                State::Written(_) if logging => {}
                State::Written(p) => {
                    overwrites = true;
                    r = r.and_then(|()| clear_csums(cx.meta, p, s.len));
                }
                State::Unwritten(_) => {}
            }
        }
        cx.alloc.unreserve(reserved);
        r?;
        let segs = map_range(ip, &mut cx, from, to)?;
        ip.store(&mut cx)?;
        let id = self.s.next_dio_id.fetch_add(1, Ordering::Relaxed);
        ip.dio_begin(id, from, to);
        if logging {
            return self.dio_planned(g, ino, id, (from, to), data, crcs, &segs, Some(end));
        }
        if overwrites {
            bump(&cx.counters.overwrite_intents, 1);
        }
        let r = if overwrites {
            self.s.commit_wait(g)
        } else {
            drop(g);
            Ok(())
        };
        let r = r.and_then(|()| self.write_segs(&segs, from, data));
        self.dio_finish(ino, id, (from, to), r, |ip, cx, _| {
            record_csums(cx, &segs, from, crcs)?;
            ip.ext_mark_written(cx, from, to)?;
            // The data is written; the commit that makes this size durable
            // flushes it first (`DataFlush`).
            ip.size = ip.size.max(end);
            ip.d.size = ip.size;
            Ok(())
        })
    }

    /// Write `data` (file blocks from `from` on) to the mapped runs of
    /// `segs`, at most `dio_max_blocks` per device request.
    fn write_segs(&self, segs: &[Seg], from: u64, data: &[u8]) -> Result<()> {
        let bs = self.s.block_size;
        let cap = self.s.knobs.dio_max_blocks.load(Ordering::Relaxed);
        let r = (|| {
            for s in segs {
                let p = s
                    .pblk()
                    .ok_or_else(|| Error::Invalid("direct write to an unmapped block".into()))?;
                let mut k = 0;
                while k < s.len {
                    let n = (s.len - k).min(cap);
                    let at = ((s.lblk - from + k) * bs) as usize;
                    self.s
                        .dev
                        .write_at(&data[at..at + (n * bs) as usize], (p + k) * bs)?;
                    bump(&self.s.counters.dio_write_requests, 1);
                    self.s.counters.dio_request(n);
                    k += n;
                }
            }
            Ok(())
        })();
        self.s.data_flush.note_written();
        r
    }
}

//! Buffered reads: fill a folio's missing blocks from the device in
//! merged runs (verifying each block's checksum), zeroes for holes and
//! unwritten extents, then copy out.

use super::verify::DeviceRuns;
use super::MAX_IO_BLOCKS;
use crate::device::AlignedBuf;
use crate::error::{Error, Result};
use crate::fs::bump;
use crate::fs::ctx::Ctx;
use crate::fs::inode::Inode;
use crate::fs::state::Inner;

impl Inode {
    /// The current contents of file block `lblk` (cached, on disk, or zeros).
    pub(super) fn block_contents(&self, cx: &mut Ctx, lblk: u64) -> Result<Box<[u8]>> {
        let bs = cx.meta.geo.block_size;
        if let Some(b) = self.cache.block(lblk, bs as usize) {
            return Ok(b.into());
        }
        let mut buf = vec![0u8; bs as usize].into_boxed_slice();
        if let Some(e) = self.ext_find(cx, lblk)? {
            if !e.unwritten {
                let mut runs = DeviceRuns::take();
                runs.push(cx.meta, lblk, e.pblk + (lblk - e.lblk), 1)?;
                let mut a = AlignedBuf::zeroed(bs as usize);
                runs.read(self.d.ino, bs, &*cx.meta.dev, &mut a, |_| 0)?;
                bump(&cx.counters.data_device_reads, 1);
                buf.copy_from_slice(&a);
            }
        }
        Ok(buf)
    }

    /// Bring the blocks of the folio at `first` that are not uptodate up
    /// to date from the device (zeros for holes and unwritten blocks), one
    /// device read per mapped run, under the metadata lock (`Fs::read`
    /// plans the same reads and runs them without it).
    pub(super) fn fill_folio(&mut self, cx: &mut Ctx, first: u64) -> Result<()> {
        let plan = self.plan_fill(cx, first)?;
        with_fill_buf(|io| {
            plan.read(self.d.ino, &*cx.meta.dev, io)?;
            self.apply_fill(cx, &plan, io);
            Ok(())
        })
    }

    /// Copy what `plan` read (`io`, laid out as its folio) into the
    /// folio's blocks that are still not up to date, and zeros into the
    /// rest (holes, unwritten blocks).
    fn apply_fill(&mut self, cx: &Ctx, plan: &FillPlan, io: &[u8]) {
        let bs = plan.bs as usize;
        let f = self
            .cache
            .folios
            .get_mut(&plan.first)
            .expect("a planned folio");
        for r in plan.runs.runs() {
            bump(&cx.counters.data_device_reads, 1);
            let from = (r.lblk - plan.first) as usize;
            for i in from..from + r.count as usize {
                if !f.uptodate(i) {
                    f.block_mut(i, bs)
                        .copy_from_slice(&io[i * bs..(i + 1) * bs]);
                    f.set_uptodate(i, true);
                }
            }
        }
        for i in 0..f.nblocks {
            if !f.uptodate(i) {
                f.block_mut(i, bs).fill(0);
                f.set_uptodate(i, true);
            }
        }
    }
}

thread_local! {
    /// Each thread's buffer for the device reads of its fills, kept
    /// rather than mapped (and zeroed by the kernel) anew for each.
    static FILL_BUF: std::cell::Cell<AlignedBuf> = std::cell::Cell::new(AlignedBuf::zeroed(0));
}

/// Run `f` with this thread's fill buffer (an empty one if it is in use
/// already).
pub(in crate::fs) fn with_fill_buf<R>(f: impl FnOnce(&mut AlignedBuf) -> R) -> R {
    let mut io = FILL_BUF.replace(AlignedBuf::zeroed(0));
    let r = f(&mut io);
    FILL_BUF.set(io);
    r
}

/// A folio's missing blocks as `Fs::read` reads them without the
/// metadata lock: the device runs with what checking them needs
/// (`DeviceRuns`), taken under the lock with the inode's `data_gen`,
/// then read and verified outside it, then installed under it if nothing
/// moved them meanwhile (`Inner::fill_install`).
pub(in crate::fs) struct FillPlan {
    first: u64,
    nblocks: u32,
    bs: u64,
    gen: u64,
    runs: DeviceRuns,
}

/// How far a buffered read got (`Inner::read`).
pub(in crate::fs) enum Read {
    /// Every byte copied out: the count.
    Done(usize),
    /// A folio it needs is missing blocks: its plan, for the caller to
    /// read without the lock and install.
    Plan(FillPlan),
    /// Another reader is filling a folio it needs: wait for `fill_done`.
    Wait,
}

impl FillPlan {
    /// Read and verify the runs (no lock held) into `io`, each at its
    /// place in the folio (`io` grows to hold the folio); the first block
    /// whose checksum does not match is an error.
    pub(in crate::fs) fn read(
        &self,
        ino: u64,
        dev: &dyn crate::device::Device,
        io: &mut AlignedBuf,
    ) -> Result<()> {
        let size = self.nblocks as usize * self.bs as usize;
        if io.len() < size {
            *io = AlignedBuf::zeroed(size.next_multiple_of(crate::device::HUGE_PAGE));
        }
        let (bs, first) = (self.bs, self.first);
        self.runs
            .read(ino, bs, dev, io, |r| ((r.lblk - first) * bs) as usize)
    }

    pub(in crate::fs) fn gen(&self) -> u64 {
        self.gen
    }
}

impl Inode {
    /// Readahead: a sequential reader's folios double in size, up to
    /// `max` blocks.
    fn ra_window(&self, first_blk: u64, end_blk: u64, max: u64) -> u64 {
        if first_blk == self.ra_next && first_blk > 0 {
            (self.ra_blocks * 2).clamp(4, max)
        } else {
            (end_blk - first_blk).clamp(4, max)
        }
    }

    /// The device runs that would bring the folio at `first` up to date
    /// (for `fill_folio`, or for `Fs::read` to read without the lock).
    fn plan_fill(&self, cx: &mut Ctx, first: u64) -> Result<FillPlan> {
        let n = self.cache.folios[&first].nblocks as u64;
        let exts = self.ext_range(cx, first, first + n)?;
        bump(&cx.counters.mapping_lookups, 1);
        let f = &self.cache.folios[&first];
        let mut runs = DeviceRuns::take();
        for e in exts.iter().filter(|e| !e.unwritten) {
            let to = e.end().min(first + n);
            let mut l = e.lblk.max(first);
            while l < to {
                if f.uptodate((l - first) as usize) {
                    l += 1;
                    continue;
                }
                let mut k = l + 1;
                while k < to && !f.uptodate((k - first) as usize) && k - l < MAX_IO_BLOCKS {
                    k += 1;
                }
                runs.push(cx.meta, l, e.pblk + (l - e.lblk), k - l)?;
                l = k;
            }
        }
        Ok(FillPlan {
            first,
            nblocks: f.nblocks as u32,
            bs: cx.meta.geo.block_size,
            gen: self.data_gen,
            runs,
        })
    }
}

impl Inner {
    /// End the fill of `plan`'s folio (its readers wait on `fill_done`
    /// until then) and install what it read (`io`, None if the read
    /// failed): the blocks still not up to date, then zeros for the rest
    /// (holes and unwritten blocks). Nothing is installed when the
    /// inode's data moved since the plan (`data_gen`): the caller plans
    /// again.
    pub(in crate::fs) fn fill_install(
        &mut self,
        ino: u64,
        plan: &FillPlan,
        io: Option<&[u8]>,
    ) -> Result<()> {
        let (ip, cx) = self.with(ino)?;
        let Some(f) = ip.cache.folios.get_mut(&plan.first) else {
            return Ok(());
        };
        if f.nblocks as u32 != plan.nblocks {
            return Ok(());
        }
        f.filling = false;
        let Some(io) = io.filter(|_| ip.data_gen == plan.gen) else {
            return Ok(());
        };
        ip.apply_fill(&cx, plan, io);
        Ok(())
    }

    /// Buffered read of `buf.len()` bytes at `offset`, every fill under
    /// the lock: the count.
    pub fn read(&mut self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        match self.read_or_plan(ino, offset, buf, false)? {
            Read::Done(n) => Ok(n),
            Read::Plan(_) | Read::Wait => unreachable!("a locked read fills its own folios"),
        }
    }

    /// Buffered read of `buf.len()` bytes at `offset`, copied folio by
    /// folio. A folio missing blocks the read needs is filled here, under
    /// the lock, unless `unlocked`: then the read stops at it and hands
    /// back its plan (the folio marked `filling`), or `Read::Wait` when
    /// another reader is filling it, and the caller starts again once it
    /// is in (the folios it made are found again, and the readahead
    /// window moves only when a read is done).
    pub(in crate::fs) fn read_or_plan(
        &mut self,
        ino: u64,
        offset: u64,
        buf: &mut [u8],
        unlocked: bool,
    ) -> Result<Read> {
        let bs = self.meta.geo.block_size;
        let max = self.max_folio_blocks() as u64;
        let (ip, _) = self.with(ino)?;
        if ip.is_dir() {
            return Err(Error::IsDir);
        }
        if offset >= ip.size {
            return Ok(Read::Done(0));
        }
        let n = (buf.len() as u64).min(ip.size - offset) as usize;
        let (first_blk, end_blk) = (offset / bs, (offset + n as u64).div_ceil(bs));
        let window = ip.ra_window(first_blk, end_blk, max);
        let eof_blk = ip.size.div_ceil(bs);
        let mut done = 0usize;
        while done < n {
            let pos = offset + done as u64;
            let lblk = pos / bs;
            let want = window.max(end_blk - lblk).min(eof_blk - lblk).max(1);
            let first = self.folio_for(ino, lblk, want, lblk / max * max)?;
            let (ip, mut cx) = self.with(ino)?;
            let i = (lblk - first) as usize;
            let f = &ip.cache.folios[&first];
            let at = i * bs as usize + (pos % bs) as usize;
            let k = (f.data.len() - at).min(n - done);
            let last = (at + k - 1) / bs as usize;
            if (i..=last).any(|b| !f.uptodate(b)) {
                if !unlocked {
                    ip.fill_folio(&mut cx, first)?;
                } else if f.filling {
                    return Ok(Read::Wait);
                } else {
                    let plan = ip.plan_fill(&mut cx, first)?;
                    ip.cache.folios.get_mut(&first).unwrap().filling = true;
                    return Ok(Read::Plan(plan));
                }
            }
            let f = &ip.cache.folios[&first];
            buf[done..done + k].copy_from_slice(f.data.range(at..at + k));
            done += k;
        }
        let ip = self.with(ino)?.0;
        ip.ra_blocks = window;
        ip.ra_next = end_blk;
        bump(&self.counters.bytes_read_app, n as u64);
        self.maybe_evict();
        Ok(Read::Done(n))
    }
}

//! Buffered reads: fill a folio's missing blocks from the device in
//! merged runs (verifying each block's checksum), zeroes for holes and
//! unwritten extents, then copy out.

use super::MAX_IO_BLOCKS;
use crate::csums::get_csums;
use crate::device::AlignedBuf;
use crate::error::{Error, Result};
use crate::format::data_crc;
use crate::fs::bump;
use crate::fs::ctx::Ctx;
use crate::fs::inode::Inode;
use crate::fs::state::Inner;

impl Inode {
    /// Read `count` mapped blocks starting at file block `lblk` (device
    /// block `pblk`) into `out`, verifying their checksums.
    pub(super) fn read_mapped(
        &self,
        cx: &mut Ctx,
        lblk: u64,
        pblk: u64,
        count: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let bs = cx.meta.geo.block_size;
        cx.meta.dev.read_at(out, pblk * bs)?;
        bump(&cx.counters.data_device_reads, 1);
        // Logged overwrites not yet home: the log has the newest data.
        for (b, img) in cx.meta.logged_range(pblk, count) {
            let at = ((b - pblk) * bs) as usize;
            out[at..at + bs as usize].copy_from_slice(img);
        }
        let mut crcs = Vec::with_capacity(count as usize);
        get_csums(cx.meta, pblk, count, &mut crcs)?;
        for (i, stored) in crcs.iter().enumerate() {
            let blk = &out[i * bs as usize..(i + 1) * bs as usize];
            if *stored != 0 && data_crc(blk) != *stored {
                return Err(Error::DataChecksum {
                    ino: self.d.ino,
                    offset: (lblk + i as u64) * bs,
                    addr: pblk + i as u64,
                });
            }
        }
        Ok(())
    }

    /// The current contents of file block `lblk` (cached, on disk, or zeros).
    pub(super) fn block_contents(&self, cx: &mut Ctx, lblk: u64) -> Result<Box<[u8]>> {
        let bs = cx.meta.geo.block_size as usize;
        if let Some(b) = self.cache.block(lblk, bs) {
            return Ok(b.into());
        }
        let mut buf = vec![0u8; bs].into_boxed_slice();
        if let Some(e) = self.ext_find(cx, lblk)? {
            if !e.unwritten {
                let mut a = AlignedBuf::zeroed(bs);
                self.read_mapped(cx, lblk, e.pblk + (lblk - e.lblk), 1, &mut a)?;
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
        let bs = cx.meta.geo.block_size;
        with_fill_buf(|io| {
            plan.read(self.d.ino, bs, &*cx.meta.dev, io)?;
            self.apply_fill(cx, &plan, io);
            Ok(())
        })
    }

    /// Copy what `plan` read (`io`) into its folio's blocks that are
    /// still not up to date, and zeros into the rest (holes, unwritten
    /// blocks).
    fn apply_fill(&mut self, cx: &Ctx, plan: &FillPlan, io: &[u8]) {
        let bs = cx.meta.geo.block_size as usize;
        let f = self
            .cache
            .folios
            .get_mut(&plan.first)
            .expect("a planned folio");
        let mut at = 0;
        for r in &plan.runs {
            bump(&cx.counters.data_device_reads, 1);
            for k in 0..r.count as usize {
                let i = (r.lblk - plan.first) as usize + k;
                if !f.uptodate(i) {
                    let src = &io[at + k * bs..at + (k + 1) * bs];
                    f.block_mut(i, bs).copy_from_slice(src);
                    f.set_uptodate(i, true);
                }
            }
            at += r.count as usize * bs;
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
/// metadata lock (`Inner::fill_plan`): the device runs with their
/// checksums and their logged images, taken under the lock with the
/// inode's `data_gen`, then read and verified outside it, then installed
/// under it if nothing moved them meanwhile (`Inner::fill_install`).
pub(in crate::fs) struct FillPlan {
    first: u64,
    nblocks: u32,
    gen: u64,
    runs: Vec<FillRun>,
}

struct FillRun {
    lblk: u64,
    pblk: u64,
    count: u64,
    crcs: Vec<u32>,
    /// (file block, image): the overwrite log has their newest data.
    logged: Vec<(u64, Box<[u8]>)>,
}

/// What a buffered read needs before it copies out (`Inner::fill_plan`).
pub(in crate::fs) enum Fill {
    /// Every block it touches is up to date.
    Ready,
    /// This folio's missing blocks, for the caller to read.
    Plan(FillPlan),
    /// Another reader is filling a folio it needs: wait for `fill_done`.
    Wait,
}

impl FillPlan {
    /// Read and verify the runs (no lock held) into `io`, one after the
    /// other (it grows to hold them); the first block whose checksum does
    /// not match is an error.
    pub(in crate::fs) fn read(
        &self,
        ino: u64,
        bs: u64,
        dev: &dyn crate::device::Device,
        io: &mut AlignedBuf,
    ) -> Result<()> {
        let total = (self.runs.iter().map(|r| r.count).sum::<u64>() * bs) as usize;
        if io.len() < total {
            *io = AlignedBuf::zeroed(total.next_multiple_of(crate::device::HUGE_PAGE));
        }
        let mut at = 0;
        for r in &self.runs {
            let out = &mut io[at..at + (r.count * bs) as usize];
            at += out.len();
            dev.read_at(out, r.pblk * bs)?;
            for (l, img) in &r.logged {
                let at = ((l - r.lblk) * bs) as usize;
                out[at..at + bs as usize].copy_from_slice(img);
            }
            for (i, stored) in r.crcs.iter().enumerate() {
                let blk = &out[i * bs as usize..(i + 1) * bs as usize];
                if *stored != 0 && data_crc(blk) != *stored {
                    return Err(Error::DataChecksum {
                        ino,
                        offset: (r.lblk + i as u64) * bs,
                        addr: r.pblk + i as u64,
                    });
                }
            }
        }
        Ok(())
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
        let mut runs = Vec::new();
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
                let pblk = e.pblk + (l - e.lblk);
                let mut crcs = Vec::with_capacity((k - l) as usize);
                get_csums(cx.meta, pblk, k - l, &mut crcs)?;
                let logged = cx
                    .meta
                    .logged_range(pblk, k - l)
                    .map(|(b, img)| (l + (b - pblk), img.into()))
                    .collect();
                runs.push(FillRun {
                    lblk: l,
                    pblk,
                    count: k - l,
                    crcs,
                    logged,
                });
                l = k;
            }
        }
        Ok(FillPlan {
            first,
            nblocks: f.nblocks as u32,
            gen: 0,
            runs,
        })
    }
}

impl Inner {
    /// The first folio a buffered read of `len` bytes at `offset` needs
    /// filled from the device, planned (`FillPlan`); None when every
    /// folio it touches is up to date (or the read is past the end). The
    /// folios are made as `read` makes them, which then finds them.
    pub(in crate::fs) fn fill_plan(&mut self, ino: u64, offset: u64, len: usize) -> Result<Fill> {
        let bs = self.meta.geo.block_size;
        let max = self.max_folio_blocks() as u64;
        let (ip, _) = self.with(ino)?;
        if ip.is_dir() || offset >= ip.size || len == 0 {
            return Ok(Fill::Ready);
        }
        let n = (len as u64).min(ip.size - offset);
        let (first_blk, end_blk) = (offset / bs, (offset + n).div_ceil(bs));
        let window = ip.ra_window(first_blk, end_blk, max);
        let eof_blk = ip.size.div_ceil(bs);
        let mut lblk = first_blk;
        while lblk < end_blk {
            let want = window.max(end_blk - lblk).min(eof_blk - lblk).max(1);
            let first = self.folio_for(ino, lblk, want, lblk / max * max)?;
            let (ip, mut cx) = self.with(ino)?;
            let f = &ip.cache.folios[&first];
            let fend = first + f.nblocks as u64;
            if (lblk..fend.min(end_blk)).any(|b| !f.uptodate((b - first) as usize)) {
                if f.filling {
                    return Ok(Fill::Wait);
                }
                let mut plan = ip.plan_fill(&mut cx, first)?;
                plan.gen = ip.data_gen;
                ip.cache.folios.get_mut(&first).unwrap().filling = true;
                return Ok(Fill::Plan(plan));
            }
            lblk = fend;
        }
        Ok(Fill::Ready)
    }

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

    pub fn read(&mut self, ino: u64, offset: u64, buf: &mut [u8]) -> Result<usize> {
        let bs = self.meta.geo.block_size;
        let max = self.max_folio_blocks() as u64;
        let (ip, _) = self.with(ino)?;
        if ip.is_dir() {
            return Err(Error::IsDir);
        }
        if offset >= ip.size {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(ip.size - offset) as usize;
        let (first_blk, end_blk) = (offset / bs, (offset + n as u64).div_ceil(bs));
        let window = ip.ra_window(first_blk, end_blk, max);
        ip.ra_blocks = window;
        ip.ra_next = end_blk;
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
                ip.fill_folio(&mut cx, first)?;
            }
            let f = &ip.cache.folios[&first];
            buf[done..done + k].copy_from_slice(f.data.range(at..at + k));
            done += k;
        }
        bump(&self.counters.bytes_read_app, n as u64);
        self.maybe_evict();
        Ok(n)
    }
}

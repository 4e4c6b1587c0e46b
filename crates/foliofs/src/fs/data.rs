//! The buffered data path: dirty blocks live in each inode's folio cache
//! (`folio`) and are written back by the writeback contexts, fsync, sync,
//! memory pressure and unmount (`writeback`).
//!
//! write, one step per folio: find or make the folio (fresh memory mapped
//!        without the metadata lock) -> wait while it is under writeback
//!        (stable pages) -> reserve space for holes -> read or zero partial
//!        blocks -> mark the blocks dirty and pin the folio -> copy (large
//!        steps without the metadata lock) -> unpin
//! writeback: classify dirty blocks -> log overwrite intents -> allocate
//!        holes as unwritten extents -> write merged device runs from the
//!        folios -> flush -> record checksums, convert to written, publish
//!        the size
//!
//! Ordering rules that make crashes safe:
//! - newly allocated blocks are mapped unwritten until their data is on the
//!   device, so a crash never exposes what was there before;
//! - an in-place overwrite first commits "no checksum" for its blocks, so a
//!   torn overwrite reads back (old, new or mixed sectors) without a false
//!   EIO; the new checksum is committed after the data is flushed;
//! - the on-disk size only covers data already on the device.

use super::folio::{Folio, MAX_FOLIO_BLOCKS};
use super::fork::Extent;
use super::inode::Inode;
use super::types::{ExtentInfo, Falloc, Whence};
use super::writeback::runs;
use super::{bump, Ctx, Inner};
use crate::alloc::get_csums;
use crate::device::AlignedBuf;
use crate::error::{Error, Result};
use crate::format::data_crc;
use crate::format::inode::FLAG_PREALLOC;

/// Largest file offset: keeps block arithmetic far from overflow.
pub const MAX_FILE_SIZE: u64 = 1 << 50;
/// Largest device I/O writeback and reads issue (1 MiB at 4 KiB blocks).
pub(super) const MAX_IO_BLOCKS: u64 = 256;

impl Inode {
    /// Read `count` mapped blocks starting at file block `lblk` (device
    /// block `pblk`) into `out`, verifying their checksums.
    fn read_mapped(
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
    fn block_contents(&self, cx: &mut Ctx, lblk: u64) -> Result<Box<[u8]>> {
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
    /// device read per mapped run.
    fn fill_folio(&mut self, cx: &mut Ctx, first: u64) -> Result<()> {
        let bs = cx.meta.geo.block_size as usize;
        let n = self.cache.folios[&first].nblocks as u64;
        let exts = self.ext_range(cx, first, first + n)?;
        bump(&cx.counters.mapping_lookups, 1);
        let mut io = AlignedBuf::zeroed(0);
        for e in exts.iter().filter(|e| !e.unwritten) {
            let from = e.lblk.max(first);
            let to = e.end().min(first + n);
            let mut l = from;
            while l < to {
                let f = &self.cache.folios[&first];
                if f.uptodate((l - first) as usize) {
                    l += 1;
                    continue;
                }
                let mut k = l + 1;
                while k < to && !f.uptodate((k - first) as usize) && k - l < MAX_IO_BLOCKS {
                    k += 1;
                }
                let len = ((k - l) as usize) * bs;
                if io.len() < len {
                    io = AlignedBuf::zeroed(len);
                }
                self.read_mapped(cx, l, e.pblk + (l - e.lblk), k - l, &mut io[..len])?;
                let f = self.cache.folios.get_mut(&first).unwrap();
                let at = (l - first) as usize * bs;
                f.data.range_mut(at..at + len).copy_from_slice(&io[..len]);
                for i in l..k {
                    f.set_uptodate((i - first) as usize, true);
                }
                l = k;
            }
        }
        // Whatever is left is a hole or unwritten: zeros.
        let f = self.cache.folios.get_mut(&first).unwrap();
        for i in 0..n as usize {
            if !f.uptodate(i) {
                f.block_mut(i, bs).fill(0);
                f.set_uptodate(i, true);
            }
        }
        Ok(())
    }

    /// Allocate up to `want` blocks for file block `lblk` on, next to the
    /// blocks before it where free space allows, and map them unwritten.
    pub(super) fn alloc_unwritten(
        &mut self,
        cx: &mut Ctx,
        ag: u32,
        lblk: u64,
        want: u64,
    ) -> Result<(u64, u64)> {
        let goal = match lblk.checked_sub(1) {
            Some(prev) => self.ext_find(cx, prev)?.map(|e| e.pblk + (lblk - e.lblk)),
            None => None,
        };
        let (p, n) = cx.alloc(ag, goal, want)?;
        self.ext_insert(
            cx,
            Extent {
                lblk,
                pblk: p,
                len: n,
                unwritten: true,
            },
        )?;
        self.d.nblocks += n;
        Ok((p, n))
    }
}

/// Write steps at least this large copy without the metadata lock; the
/// lock round trip costs more than copying less.
const UNLOCKED_COPY_BYTES: usize = 64 << 10;

/// A buffered write in progress (see `Inner::write_begin`).
pub(super) struct WriteOp {
    offset: u64,
    len: usize,
    end_blk: u64,
    /// New folios end at or before this block: `end_blk`, or for a large
    /// write past EOF the end of its last max-size folio window.
    ceil_blk: u64,
    whole_folio: bool,
    by_length: bool,
    speculate: bool,
    /// Extents of [from, to), looked up when a block about to turn dirty
    /// has no known mapping (dirty, preallocated, or in the inode's
    /// mapping hint), or once per write when mapping by write length.
    mapping: Option<(u64, u64, Vec<Extent>)>,
    /// Bytes copied so far.
    pub done: usize,
    new_dirty: u64,
    /// Why the write stopped early, if it did.
    pub result: Result<()>,
    /// Fresh memory for the next new folio, mapped without the lock.
    pub spare: Option<AlignedBuf>,
}

pub(super) enum WriteStep {
    /// The step's bytes are in (a small step, copied under the lock).
    Copied,
    /// Copy these bytes without the lock, then `write_copied`.
    Copy(CopyStep),
    /// The folio is under writeback: wait for a completion, then retry.
    Wait,
    /// A new folio needs this many bytes of fresh memory: map them into
    /// `WriteOp::spare` (without the lock), then retry.
    Alloc(usize),
}

/// The copy of one write step into its pinned folio.
pub(super) struct CopyStep {
    first: u64,
    dst: *mut u8,
    /// Bytes this step copies.
    pub len: usize,
}

impl CopyStep {
    /// Copy the step's bytes, the first `len` of `src`. Needs no lock:
    /// the folio is pinned (`Folio::writer`), so it is neither evicted
    /// nor written back meanwhile, and the inode's I/O lock, held
    /// exclusive by the writer, keeps readers, other writers, truncate
    /// and close away from it.
    pub fn copy_from(&self, src: &[u8]) {
        assert!(src.len() >= self.len, "write step past the caller's buffer");
        // SAFETY: `dst` points into the folio's memory with at least
        // `len` bytes left (`write_step`), which stays allocated and is
        // touched by no one else while pinned (above).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.dst, self.len) };
    }
}

/// Smallest and largest speculative preallocation, in blocks.
const PREALLOC_MIN: u64 = 16;
const PREALLOC_MAX: u64 = 8192;

impl Inode {
    pub(super) fn in_prealloc(&self, lblk: u64) -> bool {
        self.prealloc.is_some_and(|(a, b)| a <= lblk && lblk < b)
    }

    /// True if the mapping hint says `lblk` is mapped.
    pub(super) fn hint_mapped(&self, lblk: u64) -> bool {
        self.map_hint.0 <= lblk && lblk < self.map_hint.1
    }

    /// Start (or extend) the speculative preallocation at hole `lblk`,
    /// past EOF: reserve a range that grows with the file (the file's
    /// size rounded up to a power of two, PREALLOC_MIN..PREALLOC_MAX
    /// blocks), halved for each percent free space is below 5%, never
    /// more than an eighth of what is free, and stopping at the next
    /// mapped block. False if none was made.
    pub(super) fn start_prealloc(&mut self, cx: &mut Ctx, lblk: u64) -> Result<bool> {
        let bs = cx.meta.geo.block_size;
        let size_blocks = self.size.div_ceil(bs);
        let mut n = size_blocks
            .next_power_of_two()
            .clamp(PREALLOC_MIN, PREALLOC_MAX);
        let avail = cx.alloc.available();
        let total = cx.meta.geo.total_blocks;
        for pct in 1..=5 {
            if avail < total * pct / 100 {
                n >>= 1;
            }
        }
        n = n.min(avail / 8);
        if n < 2 {
            return Ok(false);
        }
        // Stop before anything already mapped past here.
        bump(&cx.counters.mapping_lookups, 1);
        if let Some(e) = self.ext_range(cx, lblk, lblk + n)?.first() {
            n = e.lblk.saturating_sub(lblk);
        }
        if n < 2 || cx.alloc.reserve(n).is_err() {
            return Ok(false);
        }
        cx.alloc.speculative += n;
        bump(&cx.counters.prealloc_reserved, n);
        self.prealloc = match self.prealloc {
            Some((a, b)) if b == lblk => Some((a, lblk + n)),
            Some((a, b)) => {
                self.release_range(cx, a, b);
                Some((lblk, lblk + n))
            }
            None => Some((lblk, lblk + n)),
        };
        Ok(true)
    }

    /// Give up the speculative reservation: its dirty blocks keep theirs
    /// as ordinary delayed allocation, the rest goes back.
    pub(super) fn release_prealloc(&mut self, cx: &mut Ctx) {
        if let Some((a, b)) = self.prealloc.take() {
            self.release_range(cx, a, b);
        }
    }

    pub(super) fn release_range(&mut self, cx: &mut Ctx, a: u64, b: u64) {
        let dirty = self.cache.dirty_blocks(a, b).count() as u64;
        self.delalloc += dirty;
        cx.alloc.unreserve(b - a - dirty);
        cx.alloc.speculative -= b - a;
        bump(&cx.counters.prealloc_trimmed, b - a - dirty);
    }
}

impl Inner {
    /// Check the delayed-allocation books: each inode's `delalloc` is its
    /// dirty unmapped blocks outside its speculative range, and the
    /// allocator's reservations are those plus the speculative ranges.
    pub(super) fn check_reservations(&mut self) -> Result<()> {
        let (mut total, mut speculative) = (0, 0);
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        for ino in inos {
            let (ip, mut cx) = self.with(ino)?;
            if let Err(first) = ip.cache.check_dirty_index() {
                return Err(Error::Invalid(format!(
                    "inode {ino}: the dirty folio at block {first} is missing from the dirty index"
                )));
            }
            let mut unmapped = 0;
            for l in ip.cache.dirty_blocks(0, u64::MAX) {
                if !ip.in_prealloc(l) && ip.ext_find(&mut cx, l)?.is_none() {
                    unmapped += 1;
                }
            }
            if unmapped != ip.delalloc {
                return Err(Error::Invalid(format!(
                    "inode {ino}: {unmapped} dirty unmapped blocks, {} reserved (prealloc {:?})",
                    ip.delalloc, ip.prealloc
                )));
            }
            total += ip.delalloc + ip.prealloc.map_or(0, |(a, b)| b - a);
            speculative += ip.prealloc.map_or(0, |(a, b)| b - a);
        }
        if speculative != self.alloc.speculative {
            return Err(Error::Invalid(format!(
                "{speculative} blocks in speculative ranges, {} counted",
                self.alloc.speculative
            )));
        }
        if total != self.alloc.reserved {
            return Err(Error::Invalid(format!(
                "{total} blocks owed reservations, {} reserved",
                self.alloc.reserved
            )));
        }
        Ok(())
    }
}

impl Inner {
    /// Release the speculative preallocation past EOF: the reservation,
    /// and blocks allocated past EOF unless fallocate put them there.
    pub(super) fn trim_eof(&mut self, ino: u64) -> Result<()> {
        let bs = self.meta.geo.block_size;
        let (ip, mut cx) = self.with(ino)?;
        if ip.is_dir() {
            return Ok(());
        }
        ip.release_prealloc(&mut cx);
        if ip.d.flags & FLAG_PREALLOC != 0 || !ip.spec_eof {
            return Ok(());
        }
        let eof_blk = ip.size.div_ceil(bs);
        // Cached blocks past EOF (dirtied whole-folio) go first: they
        // would otherwise be written into blocks no longer mapped.
        self.drop_cached(ino, eof_blk, u64::MAX)?;
        let (ip, mut cx) = self.with(ino)?;
        let mut freed = 0;
        for (p, n) in ip.ext_remove(&mut cx, eof_blk, u64::MAX)? {
            cx.alloc.free(cx.meta, p, n)?;
            ip.d.nblocks = ip.d.nblocks.saturating_sub(n);
            freed += n;
        }
        ip.spec_eof = false;
        bump(&cx.counters.prealloc_trimmed, freed);
        if freed > 0 {
            ip.store(&mut cx)?;
        }
        Ok(())
    }

    /// Release every inode's speculative preallocation (unmount).
    pub(super) fn trim_all_prealloc(&mut self) -> Result<()> {
        let inos: Vec<u64> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.prealloc.is_some() || i.spec_eof)
            .map(|(k, _)| *k)
            .collect();
        for ino in inos {
            self.trim_eof(ino)?;
            self.maybe_commit()?;
        }
        Ok(())
    }

    /// ENOSPC pressure: give back every speculative reservation.
    fn release_all_prealloc(&mut self) {
        let (inodes, mut cx, _) = self.split();
        for ip in inodes.values_mut() {
            ip.release_prealloc(&mut cx);
        }
    }

    /// Truncate: the speculative reservation goes (blocks past the new
    /// end are freed by the truncate itself).
    pub(super) fn drop_prealloc(&mut self, ino: u64) -> Result<()> {
        let (ip, mut cx) = self.with(ino)?;
        ip.release_prealloc(&mut cx);
        Ok(())
    }
}

impl Inner {
    /// A folio for file block `lblk`: the one holding it, or a new one of
    /// up to `want` blocks (capped by the folio size knobs) that does not
    /// overlap its neighbours and does not start before `floor`. Returns
    /// its first block.
    fn folio_for(&mut self, ino: u64, lblk: u64, want: u64, floor: u64) -> Result<u64> {
        match self.folio_or_alloc(ino, lblk, want, floor, None)? {
            Ok(first) => Ok(first),
            Err(_) => unreachable!("without a spare buffer the pool maps one"),
        }
    }

    /// `folio_for`, except that with `spare`, memory for a new folio the
    /// pool cannot supply comes from the spare buffer if it has the size,
    /// and otherwise Err(bytes) asks the caller to map that much without
    /// the metadata lock: the kernel zeroes fresh pages, a cost writers of
    /// different files then pay in parallel.
    fn folio_or_alloc(
        &mut self,
        ino: u64,
        lblk: u64,
        want: u64,
        floor: u64,
        spare: Option<&mut Option<AlignedBuf>>,
    ) -> Result<std::result::Result<u64, usize>> {
        let bs = self.meta.geo.block_size as usize;
        let max = self.max_folio_blocks();
        let fixed = self.opts.fixed_folio_bytes.is_some();
        self.tick += 1;
        let tick = self.tick;
        let (ip, _) = self.with(ino)?;
        if let Some((first, f)) = ip.cache.find_mut(lblk) {
            f.tick = tick;
            return Ok(Ok(first));
        }
        let (first, n) = if fixed {
            ip.cache.fit(lblk, max, 0, u64::MAX)
        } else {
            // A folio grows to what the write or read covers: it starts at
            // or after `floor` and ends at or before lblk + want.
            let want = want.clamp(1, max as u64);
            ip.cache.fit(lblk, max, floor, lblk + want)
        };
        let len = n * bs;
        self.make_room(len as u64);
        let fresh = !self.pool.has(len);
        let data = match spare {
            Some(s) if fresh => match s.take() {
                Some(b) if b.len() == len => b,
                other => {
                    if let Some(b) = other {
                        self.pool.put(b);
                    }
                    return Ok(Err(len));
                }
            },
            _ => self.pool.get(len),
        };
        if fresh {
            bump(&self.counters.folio_bytes_mapped, len as u64);
        }
        let (ip, _) = self.with(ino)?;
        ip.cache
            .folios
            .insert(first, Folio::with_data(n, data, tick));
        self.cache_bytes += len as u64;
        Ok(Ok(first))
    }

    fn max_folio_blocks(&self) -> usize {
        let bytes = self
            .opts
            .fixed_folio_bytes
            .unwrap_or(self.opts.max_folio_bytes);
        ((bytes / self.meta.geo.block_size).max(1) as usize)
            .next_power_of_two()
            .min(MAX_FOLIO_BLOCKS)
    }

    /// Evict the least recently used clean folios while the cache is over
    /// its limit. Dirty folios are never evicted.
    pub(super) fn maybe_evict(&mut self) {
        self.make_room(0);
    }

    /// Evict before `need` more bytes of folios join the cache if they
    /// would take it over its limit, so the new folio reuses the memory
    /// evicted (as the kernel reclaims on allocation) rather than mapping
    /// fresh memory while the evicted goes back to the kernel.
    fn make_room(&mut self, need: u64) {
        if self.cache_bytes + need <= self.opts.cache_bytes {
            self.trim_pool();
            return;
        }
        let target = (self.opts.cache_bytes / 4 * 3).saturating_sub(need);
        let mut clean: Vec<(u64, u64, u64)> = Vec::new();
        for (&ino, ip) in &self.inodes {
            for (&first, f) in &ip.cache.folios {
                if !f.any_dirty() && f.idle() {
                    clean.push((f.tick, ino, first));
                }
            }
        }
        clean.sort_unstable();
        for (_, ino, first) in clean {
            if self.cache_bytes <= target {
                break;
            }
            if let Some(f) = self
                .inodes
                .get_mut(&ino)
                .and_then(|ip| ip.cache.folios.remove(&first))
            {
                self.cache_bytes -= f.data.len() as u64;
                self.pool.put(f.data);
                bump(&self.counters.folios_evicted, 1);
            }
        }
        self.trim_pool();
    }

    /// Free folio memory kept for reuse stays within what the cache
    /// limit leaves.
    pub(super) fn trim_pool(&mut self) {
        let room = self.opts.cache_bytes.saturating_sub(self.cache_bytes);
        self.pool.trim(room);
    }

    /// Drop cached blocks [from, to) of `ino`, giving back the delalloc
    /// reservations of dirty blocks that were never mapped.
    pub(super) fn drop_cached(&mut self, ino: u64, from: u64, to: u64) -> Result<()> {
        let bs = self.meta.geo.block_size;
        self.load_inode(ino)?;
        let (inodes, mut cx, pool) = self.split();
        let ip = inodes.get_mut(&ino).unwrap();
        let (dirty, freed) = ip.cache.drop_range(from, to, bs as usize, pool);
        let mut unmapped = 0;
        if !dirty.is_empty() {
            let exts = ip.ext_range(&mut cx, dirty[0], dirty[dirty.len() - 1] + 1)?;
            // Dirty blocks in the speculative range hold its reservation.
            unmapped = dirty
                .iter()
                .filter(|&&l| {
                    !ip.in_prealloc(l) && !exts.iter().any(|e| e.lblk <= l && l < e.end())
                })
                .count() as u64;
        }
        cx.alloc.unreserve(unmapped);
        ip.delalloc -= unmapped;
        self.cache_bytes -= freed;
        self.dirty_bytes = self.dirty_bytes.saturating_sub(dirty.len() as u64 * bs);
        self.trim_pool();
        Ok(())
    }

    /// Zero bytes [from, to) of block `lblk` if it holds data; returns the
    /// bytes newly dirtied. The caller has waited for the inode's
    /// writeback (stable pages: the block may be under it).
    fn zero_in_block(&mut self, ino: u64, lblk: u64, from: usize, to: usize) -> Result<u64> {
        let bs = self.meta.geo.block_size as usize;
        let (ip, mut cx) = self.with(ino)?;
        let mapped_written = ip.ext_find(&mut cx, lblk)?.is_some_and(|e| !e.unwritten);
        let cached = ip
            .cache
            .find(lblk)
            .is_some_and(|(first, f)| f.uptodate((lblk - first) as usize));
        if !cached && !mapped_written {
            return Ok(0);
        }
        let first = self.folio_for(ino, lblk, 1, 0)?;
        let (ip, mut cx) = self.with(ino)?;
        let i = (lblk - first) as usize;
        if !ip.cache.folios[&first].uptodate(i) {
            let data = ip.block_contents(&mut cx, lblk)?;
            let f = ip.cache.folios.get_mut(&first).unwrap();
            f.block_mut(i, bs).copy_from_slice(&data);
            f.set_uptodate(i, true);
        }
        let f = ip.cache.folios.get_mut(&first).unwrap();
        debug_assert_eq!(f.wb_pending, 0, "zeroing a folio under writeback");
        f.block_mut(i, bs)[from..to].fill(0);
        if f.dirty(i) || !mapped_written {
            return Ok(0);
        }
        f.set_dirty(i, true);
        ip.cache.note_dirty(first);
        self.dirty_bytes += bs as u64;
        Ok(bs as u64)
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
        // Readahead: a sequential reader's folios double in size.
        let window = if first_blk == ip.ra_next && first_blk > 0 {
            (ip.ra_blocks * 2).clamp(4, max)
        } else {
            (end_blk - first_blk).clamp(4, max)
        };
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

    /// Start a buffered write of `len` bytes at `offset`: checks, the
    /// zeroed tail of the old last block, ENOSPC pressure. The inode is
    /// pinned (like an open file) until `write_end`, since the copies
    /// run without the metadata lock. The caller has waited for the
    /// inode's writeback when `offset` is past EOF (the tail block may be
    /// under writeback, and must not change under it).
    pub(super) fn write_begin(&mut self, ino: u64, offset: u64, len: usize) -> Result<WriteOp> {
        let bs = self.meta.geo.block_size;
        let end = offset.checked_add(len as u64).ok_or(Error::FileTooBig)?;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let size = {
            let (ip, _) = self.with(ino)?;
            if ip.is_dir() {
                return Err(Error::IsDir);
            }
            ip.size
        };
        if offset > size && len > 0 {
            self.zero_eof_tail(ino, size)?;
        }
        // ENOSPC pressure: speculative reservations go before a write
        // that might need the space fails.
        if self.alloc.speculative > 0
            && self.alloc.available() < end.div_ceil(bs) - offset / bs + PREALLOC_MIN
        {
            self.release_all_prealloc();
        }
        let by_length = self.opts.map_by_write_length;
        let end_blk = end.div_ceil(bs);
        // A large write extending the file (a streaming writer) makes its
        // last folio a whole max-size one, past the write into the blocks
        // beyond EOF, which the next write fills: the writer gets one 2 MiB
        // folio instead of two halves. At most the write's own size more
        // memory, and only for large writes.
        let max = self.max_folio_blocks() as u64;
        let streaming = !self.opts.whole_folio_dirty && len as u64 * 2 >= max * bs && end > size;
        let ceil_blk = if streaming {
            end_blk.next_multiple_of(max)
        } else {
            end_blk
        };
        let mut w = WriteOp {
            offset,
            len,
            end_blk,
            ceil_blk,
            whole_folio: self.opts.whole_folio_dirty,
            by_length,
            // Speculative preallocation past EOF, unless a knob turns it
            // off; mapping by write length only sees it for writes of
            // whole blocks (the seed's regression: 1-byte writes never
            // preallocate).
            speculate: !self.opts.no_prealloc && (!by_length || len as u64 >= bs),
            mapping: None,
            done: 0,
            new_dirty: 0,
            result: Ok(()),
            spare: None,
        };
        let (ip, mut cx) = self.with(ino)?;
        if by_length && len > 0 {
            bump(&cx.counters.mapping_lookups, 1);
            let from = offset / bs;
            w.mapping = Some((from, end_blk, ip.ext_range(&mut cx, from, end_blk)?));
        }
        ip.open += 1;
        Ok(w)
    }

    /// The next step of a write: the write's bytes in one folio (from
    /// `src`, the bytes not yet written), with space reserved for the holes
    /// among its blocks and partial blocks read or zeroed. A small step is
    /// copied here (`Copied`); a large one pins the folio (`Folio::writer`)
    /// for the caller to copy without the lock, then `write_copied`. None
    /// when the write is done; `Wait` when the folio is under writeback
    /// (stable pages: wait, then ask again).
    pub(super) fn write_step(
        &mut self,
        ino: u64,
        w: &mut WriteOp,
        src: &[u8],
    ) -> Result<Option<WriteStep>> {
        let bs = self.meta.geo.block_size;
        if w.done == w.len {
            return Ok(None);
        }
        let pos = w.offset + w.done as u64;
        let lblk = pos / bs;
        let end_blk = w.end_blk;
        // A large write grows its folio to the whole blocks it covers.
        let first =
            match self.folio_or_alloc(ino, lblk, w.ceil_blk - lblk, lblk, Some(&mut w.spare))? {
                Ok(first) => first,
                Err(len) => return Ok(Some(WriteStep::Alloc(len))),
            };
        let (ip, mut cx) = self.with(ino)?;
        let f = &ip.cache.folios[&first];
        if f.wb_pending > 0 {
            return Ok(Some(WriteStep::Wait));
        }
        let i = (lblk - first) as usize;
        let nblocks = f.nblocks;
        let folio_end = (first + nblocks as u64) * bs;
        let k = ((folio_end - pos) as usize).min(w.len - w.done);
        let step_end = pos + k as u64;
        let j = (step_end.div_ceil(bs) - first) as usize;
        // Block b is wholly overwritten by this step: it needs no read
        // and no zeroing first.
        let covered = |b: usize| {
            let at = (first + b as u64) * bs;
            at >= pos && at + bs <= step_end
        };
        let blocks = if w.whole_folio && !f.any_dirty() {
            0..nblocks
        } else {
            i..j
        };
        // Blocks about to turn dirty: holes among them reserve space.
        let eof_blk = ip.size.div_ceil(bs);
        let mut holes = 0u64;
        for b in blocks.clone() {
            let l = first + b as u64;
            if ip.cache.folios[&first].dirty(b) || ip.in_prealloc(l) || ip.hint_mapped(l) {
                continue;
            }
            if w.mapping
                .as_ref()
                .is_none_or(|(from, to, _)| l < *from || l >= *to)
            {
                bump(&cx.counters.mapping_lookups, 1);
                let to = end_blk.max(first + nblocks as u64).max(l + 1);
                w.mapping = Some((l, to, ip.ext_range(&mut cx, l, to)?));
            }
            let exts = &w.mapping.as_ref().unwrap().2;
            if let Some(e) = exts.iter().find(|e| e.lblk <= l && l < e.end()) {
                if !w.by_length {
                    ip.map_hint = (e.lblk, e.end());
                }
                continue;
            }
            // A new range replaces an old one only if none of the blocks
            // turning dirty in this step are in the old one (they are not
            // marked dirty yet, so giving it up now would lose their
            // reservation).
            let lo = first + blocks.start as u64;
            let may_start = ip.prealloc.is_none_or(|(_, b)| b == l || b <= lo);
            if w.speculate && l >= eof_blk && may_start && ip.start_prealloc(&mut cx, l)? {
                continue;
            }
            holes += 1;
        }
        cx.reserve(holes)?;
        ip.delalloc += holes;
        // Partial blocks (and, whole-folio, the rest of the folio) are
        // read or zeroed before they turn dirty. Blocks wholly past EOF
        // read as zeros (a truncate frees or zeroes what was there):
        // zeroed here, no mapping lookup, no device read.
        let f = ip.cache.folios.get_mut(&first).unwrap();
        for b in blocks.clone() {
            if first + b as u64 >= eof_blk && !f.uptodate(b) && !covered(b) {
                f.block_mut(b, bs as usize).fill(0);
                f.set_uptodate(b, true);
            }
        }
        if blocks.clone().any(|b| !f.uptodate(b) && !covered(b)) {
            if let Err(e) = ip.fill_folio(&mut cx, first) {
                cx.alloc.unreserve(holes);
                ip.delalloc -= holes;
                return Err(e);
            }
        }
        // The blocks turn dirty now, so their reservations are counted
        // as every other dirty block's while the copy runs; writeback
        // leaves the pinned folio alone until the copy is done.
        let f = ip.cache.folios.get_mut(&first).unwrap();
        w.new_dirty += blocks.clone().filter(|&b| !f.dirty(b)).count() as u64 * bs;
        f.fill_dirty(blocks.start, blocks.end);
        let at = (pos - first * bs) as usize;
        let step = if k < UNLOCKED_COPY_BYTES {
            f.data.range_mut(at..at + k).copy_from_slice(&src[..k]);
            w.done += k;
            WriteStep::Copied
        } else {
            f.writer = true;
            WriteStep::Copy(CopyStep {
                first,
                dst: f.data.ptr_at(at),
                len: k,
            })
        };
        ip.cache.note_dirty(first);
        Ok(Some(step))
    }

    /// A step's bytes are in its folio: unpin it.
    pub(super) fn write_copied(&mut self, ino: u64, w: &mut WriteOp, c: CopyStep) -> Result<()> {
        let (ip, _) = self.with(ino)?;
        let f = ip
            .cache
            .folios
            .get_mut(&c.first)
            .expect("a folio pinned by a writer stays cached");
        f.writer = false;
        w.done += c.len;
        Ok(())
    }

    /// Finish a write: size, timestamps, dirty accounting; unpin the
    /// inode. The bytes written, or the error if none were.
    /// Finish a write: the size, the dirty accounting, write-behind. The
    /// bytes written, and whether the inode was queued for write-behind
    /// now (its writeback context should be woken).
    pub(super) fn write_end(&mut self, ino: u64, mut w: WriteOp) -> Result<(usize, bool)> {
        if let Some(b) = w.spare.take() {
            self.pool.put(b);
        }
        let threshold = self.opts.write_behind_bytes;
        let (ip, cx) = self.with(ino)?;
        if w.done > 0 {
            ip.size = ip.size.max(w.offset + w.done as u64);
            ip.touch_mtime();
            if w.offset != ip.stream_end {
                ip.stream_dirty = 0;
            }
            ip.stream_dirty += w.new_dirty;
            ip.stream_end = w.offset + w.done as u64;
        }
        ip.open -= 1;
        let destroy = ip.open == 0 && ip.d.nlink == 0;
        let behind = threshold > 0 && !destroy && !ip.behind_queued && ip.stream_dirty >= threshold;
        ip.behind_queued |= behind;
        bump(&cx.counters.bytes_written_app, w.done as u64);
        bump(&cx.counters.bytes_dirtied, w.new_dirty);
        self.dirty_bytes += w.new_dirty;
        if w.done > 0 {
            self.mark_inode_dirty(ino);
        }
        if behind {
            let ag = self.meta.geo.inode_ag(ino) as usize;
            self.behind_queues[ag].push_back(ino);
        }
        if destroy {
            self.destroy_inode(ino)?;
        }
        self.maybe_evict();
        match w.result {
            Err(e) if w.done == 0 => Err(e),
            _ => Ok((w.done, behind)),
        }
    }

    /// A whole buffered write under the metadata lock (symlink targets,
    /// written into inodes nothing else can see yet).
    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        let mut w = self.write_begin(ino, offset, data.len())?;
        loop {
            let src = &data[w.done..];
            match self.write_step(ino, &mut w, src) {
                Ok(None) => break,
                Ok(Some(WriteStep::Copied)) => {}
                Ok(Some(WriteStep::Copy(c))) => {
                    c.copy_from(src);
                    self.write_copied(ino, &mut w, c)?;
                }
                Ok(Some(WriteStep::Alloc(len))) => w.spare = Some(AlignedBuf::zeroed(len)),
                Ok(Some(WriteStep::Wait)) => {
                    w.result = Err(Error::Invalid(format!(
                        "inode {ino} is under writeback while it is created"
                    )));
                    break;
                }
                Err(e) => {
                    w.result = Err(e);
                    break;
                }
            }
        }
        self.write_end(ino, w).map(|(n, _)| n)
    }

    /// Before the size grows past `old_size`, zero the rest of the old last
    /// block so bytes left there by an earlier truncate never reappear.
    pub(super) fn zero_eof_tail(&mut self, ino: u64, old_size: u64) -> Result<()> {
        let bs = self.meta.geo.block_size;
        if old_size % bs == 0 {
            return Ok(());
        }
        self.zero_in_block(ino, old_size / bs, (old_size % bs) as usize, bs as usize)?;
        Ok(())
    }

    /// Change the size (truncate up or down).
    pub fn set_size(&mut self, ino: u64, size: u64) -> Result<()> {
        if size > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let bs = self.meta.geo.block_size;
        let old = self.with(ino)?.0.size;
        if size > old {
            self.zero_eof_tail(ino, old)?;
            let (ip, _) = self.with(ino)?;
            ip.size = size;
            ip.touch_mtime();
            // The on-disk size follows at writeback, after the zeroed tail
            // is on the device.
            self.mark_inode_dirty(ino);
            return Ok(());
        }
        self.drop_prealloc(ino)?;
        let first_gone = size.div_ceil(bs);
        self.drop_cached(ino, first_gone, u64::MAX)?;
        let (ip, mut cx) = self.with(ino)?;
        if size % bs != 0 {
            // Bytes past the new end in the cached last block read as zeros
            // if the file grows again.
            if let Some((first, f)) = ip.cache.find_mut(size / bs) {
                let i = (size / bs - first) as usize;
                if f.uptodate(i) {
                    f.block_mut(i, bs as usize)[(size % bs) as usize..].fill(0);
                }
            }
        }
        ip.size = size;
        ip.d.size = ip.d.size.min(size);
        ip.touch_mtime();
        ip.store(&mut cx)?;
        self.truncate_blocks(ino, first_gone)
    }

    /// Unmap and free every block from file block `first` on, committing
    /// in steps so that huge files never outgrow the journal.
    pub fn truncate_blocks(&mut self, ino: u64, first: u64) -> Result<()> {
        loop {
            let (ip, mut cx) = self.with(ino)?;
            let batch: Vec<Extent> = ip
                .ext_range(&mut cx, first, u64::MAX)?
                .into_iter()
                .rev()
                .take(32)
                .collect();
            if batch.is_empty() {
                return ip.store(&mut cx);
            }
            let from = batch.last().unwrap().lblk.max(first);
            for (p, n) in ip.ext_remove(&mut cx, from, u64::MAX)? {
                cx.alloc.free(cx.meta, p, n)?;
                ip.d.nblocks = ip.d.nblocks.saturating_sub(n);
            }
            ip.store(&mut cx)?;
            if self.meta.running_blocks() > self.meta.max_tx_blocks() / 2 {
                self.meta.commit()?;
            }
        }
    }

    /// Allocate unwritten blocks over the holes in [from, to).
    fn prealloc(&mut self, ino: u64, from: u64, to: u64) -> Result<()> {
        let ag = self.meta.geo.inode_ag(ino);
        let (ip, mut cx) = self.with(ino)?;
        let mut holes = Vec::new();
        let mut l = from;
        for e in ip
            .ext_range(&mut cx, from, to)?
            .into_iter()
            .chain(std::iter::once(Extent {
                lblk: to,
                pblk: 0,
                len: 0,
                unwritten: false,
            }))
        {
            while l < e.lblk.min(to) {
                // Dirty blocks in holes already hold a reservation.
                if !ip.cache.is_dirty(l) {
                    holes.push(l);
                }
                l += 1;
            }
            l = l.max(e.end());
        }
        if cx.alloc.available() < holes.len() as u64 {
            cx.reclaim()?;
            if cx.alloc.available() < holes.len() as u64 {
                return Err(Error::NoSpace);
            }
        }
        for (start, len) in runs(&holes) {
            let mut l = start;
            while l < start + len {
                let (_, n) = ip.alloc_unwritten(&mut cx, ag, l, start + len - l)?;
                l += n;
                if cx.meta.running_blocks() > cx.meta.max_tx_blocks() / 2 {
                    ip.store(&mut cx)?;
                    cx.meta.commit()?;
                }
            }
        }
        ip.store(&mut cx)
    }

    /// Punch [from, to) in blocks: drop cached data and unmap.
    fn punch_blocks(&mut self, ino: u64, from: u64, to: u64) -> Result<()> {
        self.drop_cached(ino, from, to)?;
        let (ip, mut cx) = self.with(ino)?;
        for (p, n) in ip.ext_remove(&mut cx, from, to)? {
            cx.alloc.free(cx.meta, p, n)?;
            ip.d.nblocks = ip.d.nblocks.saturating_sub(n);
        }
        ip.store(&mut cx)
    }

    /// Zero the partial-block edges of [offset, end) and return the range
    /// of whole blocks inside it.
    fn zero_edges(&mut self, ino: u64, offset: u64, end: u64) -> Result<(u64, u64)> {
        let bs = self.meta.geo.block_size;
        let first_full = offset.div_ceil(bs);
        let end_full = end / bs;
        if first_full > end_full {
            // Inside one block.
            let (a, b) = ((offset % bs) as usize, (end % bs) as usize);
            self.zero_in_block(ino, offset / bs, a, b)?;
        } else {
            if offset % bs != 0 {
                self.zero_in_block(ino, offset / bs, (offset % bs) as usize, bs as usize)?;
            }
            if end % bs != 0 {
                self.zero_in_block(ino, end / bs, 0, (end % bs) as usize)?;
            }
        }
        Ok((first_full, end_full.max(first_full)))
    }

    pub fn fallocate(&mut self, ino: u64, mode: Falloc, offset: u64, len: u64) -> Result<()> {
        let bs = self.meta.geo.block_size;
        if len == 0 {
            return Err(Error::Invalid("fallocate length 0".into()));
        }
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= MAX_FILE_SIZE)
            .ok_or(Error::FileTooBig)?;
        {
            let (ip, _) = self.with(ino)?;
            if ip.is_dir() {
                return Err(Error::IsDir);
            }
        }
        // The speculative reservation would overlap what fallocate maps.
        self.drop_prealloc(ino)?;
        let size = self.with(ino)?.0.size;
        if !matches!(mode, Falloc::PunchHole) {
            let (ip, _) = self.with(ino)?;
            ip.d.flags |= FLAG_PREALLOC;
        }
        match mode {
            Falloc::Allocate { keep_size } => {
                self.prealloc(ino, offset / bs, end.div_ceil(bs))?;
                if !keep_size && end > size {
                    self.set_size(ino, end)?;
                }
            }
            Falloc::PunchHole => {
                // Only within the file; the size never changes.
                let end = end.min(size);
                if offset < end {
                    let (a, b) = self.zero_edges(ino, offset, end)?;
                    self.punch_blocks(ino, a, b)?;
                }
                let (ip, mut cx) = self.with(ino)?;
                ip.touch_mtime();
                ip.store(&mut cx)?;
            }
            Falloc::ZeroRange { keep_size } => {
                let zend = end.min(size.max(if keep_size { size } else { end }));
                if offset < zend {
                    let (a, b) = self.zero_edges(ino, offset, zend.min(size).max(offset))?;
                    self.punch_blocks(ino, a, b)?;
                }
                self.prealloc(ino, offset / bs, end.div_ceil(bs))?;
                if !keep_size && end > size {
                    self.set_size(ino, end)?;
                }
                let (ip, mut cx) = self.with(ino)?;
                ip.touch_mtime();
                ip.store(&mut cx)?;
            }
        }
        Ok(())
    }

    /// SEEK_DATA / SEEK_HOLE. Unwritten extents count as holes (they read
    /// as zeros), dirty cached blocks as data.
    pub fn seek(&mut self, ino: u64, offset: u64, whence: Whence) -> Result<Option<u64>> {
        let bs = self.meta.geo.block_size;
        let (ip, mut cx) = self.with(ino)?;
        let size = ip.size;
        if offset >= size {
            return Ok(None);
        }
        let mut l = offset / bs;
        let last = size.div_ceil(bs);
        match whence {
            Whence::Data => {
                let dirty = ip.cache.dirty_blocks(l, last).next();
                let ext = ip
                    .ext_range(&mut cx, l, last)?
                    .into_iter()
                    .find(|e| !e.unwritten && e.end() > l)
                    .map(|e| e.lblk.max(l));
                let Some(b) = dirty.into_iter().chain(ext).min() else {
                    return Ok(None);
                };
                let pos = (b * bs).max(offset);
                Ok((pos < size).then_some(pos))
            }
            Whence::Hole => {
                while l < last {
                    if ip.cache.is_dirty(l) {
                        l += 1;
                        continue;
                    }
                    match ip.ext_find(&mut cx, l)? {
                        Some(e) if !e.unwritten => l = e.end(),
                        _ => break,
                    }
                }
                Ok(Some((l * bs).max(offset).min(size)))
            }
        }
    }

    pub fn extent_info(&mut self, ino: u64) -> Result<Vec<ExtentInfo>> {
        let bs = self.meta.geo.block_size;
        let (ip, mut cx) = self.with(ino)?;
        if ip.is_dir() {
            return Ok(Vec::new());
        }
        Ok(ip
            .ext_all(&mut cx)?
            .into_iter()
            .map(|e| ExtentInfo {
                offset: e.lblk * bs,
                device_block: e.pblk,
                blocks: e.len,
                unwritten: e.unwritten,
            })
            .collect())
    }
}

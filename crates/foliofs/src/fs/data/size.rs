//! Size changes and space management: zeroing the old tail when a file
//! grows, truncate, fallocate (preallocate, punch, zero), seek to data or
//! hole, and the extent listing.

use super::MAX_FILE_SIZE;
use crate::error::{Error, Result};
use crate::format::inode::FLAG_PREALLOC;
use crate::fs::state::Inner;
use crate::fs::types::{ExtentInfo, Falloc, Whence};
use crate::runs::{gaps, runs};
use std::ops::Range;

impl Inner {
    /// Zero bytes [from, to) of block `lblk` if it holds data; returns the
    /// bytes newly dirtied. The caller has waited for the inode's
    /// writeback (stable pages: the block may be under it).
    pub(super) fn zero_in_block(
        &mut self,
        ino: u64,
        lblk: u64,
        from: usize,
        to: usize,
    ) -> Result<u64> {
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

    /// Before the size grows past `old_size`, zero the rest of the old last
    /// block so bytes left there by an earlier truncate never reappear.
    pub(in crate::fs) fn zero_eof_tail(&mut self, ino: u64, old_size: u64) -> Result<()> {
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
        let mut later_step = false;
        loop {
            let (ip, mut cx) = self.with(ino)?;
            let batch = ip.ext_last(&mut cx, first, 32)?;
            let Some(lowest) = batch.first() else {
                return ip.store(&mut cx);
            };
            // Commits fall between steps, never after the last one: a
            // file of one step is cut within the caller's transaction
            // (`destroy_inode` counts on it).
            if later_step && cx.meta.tx_filling() {
                cx.meta.commit()?;
            }
            later_step = true;
            let from = lowest.lblk.max(first);
            for (p, n) in ip.ext_remove(&mut cx, from, u64::MAX)? {
                cx.alloc.free(cx.meta, p, n)?;
                ip.d.nblocks = ip.d.nblocks.saturating_sub(n);
            }
            ip.store(&mut cx)?;
        }
    }

    /// Allocate unwritten blocks over the holes in [from, to).
    pub(super) fn prealloc(&mut self, ino: u64, from: u64, to: u64) -> Result<()> {
        let ag = self.meta.geo.inode_ag(ino);
        let (ip, mut cx) = self.with(ino)?;
        // The holes as runs, less the dirty blocks in them (they already
        // hold a reservation): a few runs, not a list of every block (an
        // fallocate of a terabyte on a small image is refused without
        // building one).
        let mapped: Vec<Range<u64>> = ip
            .ext_range(&mut cx, from, to)?
            .iter()
            .map(|e| e.lblk..e.end())
            .collect();
        let dirty: Vec<u64> = ip.cache.dirty_blocks(from, to).collect();
        let dirty = runs(&dirty).into_iter().map(|(s, n)| s..s + n);
        let holes = gaps(from, to, mapped.into_iter().chain(dirty));
        let want: u64 = holes.iter().map(|&(_, n)| n).sum();
        if cx.alloc.available() < want {
            cx.reclaim()?;
            if cx.alloc.available() < want {
                return Err(Error::NoSpace);
            }
        }
        for (start, len) in holes {
            let mut l = start;
            while l < start + len {
                let (_, n) = ip.alloc_unwritten(&mut cx, ag, l, start + len - l)?;
                l += n;
                if cx.meta.tx_filling() {
                    ip.store(&mut cx)?;
                    cx.meta.commit()?;
                }
            }
        }
        ip.store(&mut cx)
    }

    /// Punch [from, to) in blocks: drop cached data and unmap.
    pub(super) fn punch_blocks(&mut self, ino: u64, from: u64, to: u64) -> Result<()> {
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
    pub(super) fn zero_edges(&mut self, ino: u64, offset: u64, end: u64) -> Result<(u64, u64)> {
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
                    .ext_first(&mut cx, l, last, |e| !e.unwritten && e.end() > l)?
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

    /// The device block holding byte `at` of `ino`: None in a hole or an
    /// unwritten extent. One lookup in the file's map.
    pub fn block_at(&mut self, ino: u64, at: u64) -> Result<Option<u64>> {
        let lblk = at / self.meta.geo.block_size;
        let (ip, mut cx) = self.with(ino)?;
        if ip.is_dir() {
            return Ok(None);
        }
        Ok(ip
            .ext_find(&mut cx, lblk)?
            .filter(|e| !e.unwritten)
            .map(|e| e.pblk + (lblk - e.lblk)))
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

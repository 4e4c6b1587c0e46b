//! Technique 5, delayed allocation with speculative preallocation: a
//! buffered write into a hole reserves space but allocates nothing; a
//! write past EOF reserves a range that grows with the file (post-EOF
//! preallocation), so appends find their blocks reserved and writeback
//! allocates one contiguous extent. Close, truncate, ENOSPC and unmount
//! give back what was not used.
//!
//! Invariants (seeds/xfs-subblock-prealloc.txt): the mapping step works
//! in whole blocks, so a stream of 1-byte appends does one mapping lookup
//! per block or per preallocated range, never one per write; ENOSPC is
//! reported at write time, never as a lost write at writeback; blocks
//! reserved or preallocated but not yet written read as zeros (unwritten
//! extents), after a crash too; no reservation outlives the last writable
//! close, ENOSPC pressure or unmount; and the allocator's reservations are
//! always each inode's delayed blocks plus the speculative ranges
//! (`check_reservations`).

use crate::books::take;
use crate::error::{Error, Result};
use crate::format::inode::FLAG_PREALLOC;
use crate::fs::bump;
use crate::fs::ctx::Ctx;
use crate::fs::fork::{Extent, MAX_EXTENT_LEN};
use crate::fs::inode::Inode;
use crate::fs::state::Inner;
use crate::runs::runs;

impl Inode {
    /// Allocate up to `want` blocks for file block `lblk` on, next to the
    /// blocks before it where free space allows, and map them unwritten.
    pub(in crate::fs) fn alloc_unwritten(
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

    /// Writeback's conversion of delayed allocation: allocate the dirty
    /// blocks `holes` (sorted file blocks, unmapped), mapped unwritten
    /// until their data is down, and return the runs allocated as
    /// (file block, device block, blocks). A run that reaches into the
    /// speculative preallocation takes all of it that lies past it, so
    /// an appending file stays in one extent; the blocks past the run stay
    /// mapped unwritten beyond EOF. Each allocation turns its reservation
    /// (delayed or speculative) into the blocks.
    pub(in crate::fs) fn allocate_delayed(
        &mut self,
        cx: &mut Ctx,
        ag: u32,
        holes: &[u64],
    ) -> Result<Vec<(u64, u64, u64)>> {
        let bs = cx.meta.geo.block_size;
        let mut mapped = Vec::new();
        let mut spec: Option<(u64, u64, u64)> = None; // (lblk, pblk, end)
        for (start, len) in runs(holes) {
            let end = start + len;
            let mut l = start;
            while l < end {
                if let Some((l0, p0, l1)) = spec.filter(|s| s.0 <= l && l < s.2) {
                    // Mapped by the preallocation allocated just before.
                    let to = l1.min(end);
                    mapped.push((l, p0 + (l - l0), to - l));
                    l = to;
                    continue;
                }
                match self.prealloc {
                    Some((a, b)) if a <= l && l < b => {
                        let (p, n) =
                            self.alloc_unwritten(cx, ag, l, (b - l).min(MAX_EXTENT_LEN))?;
                        // The preallocation's reservation becomes blocks;
                        // what is left of it stays reserved as one range.
                        cx.alloc.unreserve(n);
                        take(&mut cx.alloc.speculative, n, "speculative blocks");
                        self.prealloc = match (a < l, l + n < b) {
                            (false, false) => None,
                            (false, true) => Some((l + n, b)),
                            (true, false) => Some((a, l)),
                            (true, true) => {
                                // Two pieces: the one past the allocation
                                // is given up (its dirty blocks keep their
                                // reservation as delayed allocation).
                                self.release_range(cx, l + n, b);
                                Some((a, l))
                            }
                        };
                        bump(&cx.counters.prealloc_allocated, n);
                        if l + n > self.size.div_ceil(bs) {
                            self.spec_eof = true;
                        }
                        spec = Some((l, p, l + n));
                    }
                    pre => {
                        let stop = match pre {
                            Some((a, _)) if a > l => a.min(end),
                            _ => end,
                        };
                        let (p, n) = self.alloc_unwritten(cx, ag, l, stop - l)?;
                        // Delayed allocation: the reservation becomes the blocks.
                        cx.alloc.unreserve(n);
                        take(&mut self.delalloc, n, "delayed blocks");
                        mapped.push((l, p, n));
                        l += n;
                    }
                }
            }
        }
        Ok(mapped)
    }
}

/// Smallest and largest speculative preallocation, in blocks.
pub(super) const PREALLOC_MIN: u64 = 16;

pub(super) const PREALLOC_MAX: u64 = 8192;

impl Inode {
    pub(in crate::fs) fn in_prealloc(&self, lblk: u64) -> bool {
        self.prealloc.is_some_and(|(a, b)| a <= lblk && lblk < b)
    }

    /// True if the mapping hint says `lblk` is mapped.
    pub(in crate::fs) fn hint_mapped(&self, lblk: u64) -> bool {
        self.map_hint.0 <= lblk && lblk < self.map_hint.1
    }

    /// Start (or extend) the speculative preallocation at hole `lblk`,
    /// past EOF: reserve a range that grows with the file (the file's
    /// size rounded up to a power of two, PREALLOC_MIN..PREALLOC_MAX
    /// blocks), halved for each percent free space is below 5%, never
    /// more than an eighth of what is free, and stopping at the next
    /// mapped block. False if none was made.
    pub(in crate::fs) fn start_prealloc(&mut self, cx: &mut Ctx, lblk: u64) -> Result<bool> {
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
    pub(in crate::fs) fn release_prealloc(&mut self, cx: &mut Ctx) {
        if let Some((a, b)) = self.prealloc.take() {
            self.release_range(cx, a, b);
        }
    }

    pub(in crate::fs) fn release_range(&mut self, cx: &mut Ctx, a: u64, b: u64) {
        let dirty = self.cache.dirty_blocks(a, b).count() as u64;
        self.delalloc += dirty;
        cx.alloc.unreserve(b - a - dirty);
        take(&mut cx.alloc.speculative, b - a, "speculative blocks");
        bump(&cx.counters.prealloc_trimmed, b - a - dirty);
    }
}

impl Inner {
    /// Check the delayed-allocation books: each inode's `delalloc` is its
    /// dirty unmapped blocks outside its speculative range, and the
    /// allocator's reservations are those plus the speculative ranges.
    pub(in crate::fs) fn check_reservations(&mut self) -> Result<()> {
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
    pub(in crate::fs) fn trim_eof(&mut self, ino: u64) -> Result<()> {
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
    pub(in crate::fs) fn trim_all_prealloc(&mut self) -> Result<()> {
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
    pub(super) fn release_all_prealloc(&mut self) {
        let (inodes, mut cx, _) = self.split();
        for ip in inodes.values_mut() {
            ip.release_prealloc(&mut cx);
        }
    }

    /// Truncate: the speculative reservation goes (blocks past the new
    /// end are freed by the truncate itself).
    pub(in crate::fs) fn drop_prealloc(&mut self, ino: u64) -> Result<()> {
        let (ip, mut cx) = self.with(ino)?;
        ip.release_prealloc(&mut cx);
        Ok(())
    }
}

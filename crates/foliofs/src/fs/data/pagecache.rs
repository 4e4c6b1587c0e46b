//! The page cache's books: finding or making an inode's folio for a block,
//! the memory pool folios are mapped from, and eviction of clean folios
//! when the cache is over its size.

use super::folio::{Folio, MAX_FOLIO_BLOCKS};
use crate::books::take;
use crate::device::AlignedBuf;
use crate::error::Result;
use crate::fs::bump;
use crate::fs::state::Inner;

impl Inner {
    /// A folio for file block `lblk`: the one holding it, or a new one of
    /// up to `want` blocks (capped by the folio size knobs) that does not
    /// overlap its neighbours and does not start before `floor`. Returns
    /// its first block.
    pub(super) fn folio_for(&mut self, ino: u64, lblk: u64, want: u64, floor: u64) -> Result<u64> {
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
    pub(super) fn folio_or_alloc(
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

    pub(super) fn max_folio_blocks(&self) -> usize {
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
    pub(in crate::fs) fn maybe_evict(&mut self) {
        self.make_room(0);
    }

    /// Evict before `need` more bytes of folios join the cache if they
    /// would take it over its limit, so the new folio reuses the memory
    /// evicted (as the kernel reclaims on allocation) rather than mapping
    /// fresh memory while the evicted goes back to the kernel.
    pub(super) fn make_room(&mut self, need: u64) {
        if !self.evict_floor.due(self.cache_bytes + need) {
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
                take(&mut self.cache_bytes, f.data.len() as u64, "cached bytes");
                self.pool.put(f.data);
                bump(&self.counters.folios_evicted, 1);
            }
        }
        // A scan walks every folio. When too few were clean (more dirty
        // data than the cache holds, under a dirty limit set above it),
        // the next waits for an eighth of the limit more, or a quarter of
        // the excess, not for the next folio.
        let (limit, left) = (self.opts.cache_bytes, self.cache_bytes);
        let over = left.saturating_sub(limit);
        self.evict_floor
            .walked(limit, left, (limit / 8).max(over / 4));
        bump(&self.counters.cache_scans, 1);
        self.trim_pool();
    }

    /// Free folio memory kept for reuse stays within what the cache
    /// limit leaves.
    /// Drop-behind (`MountOptions::drop_behind`): the folios of `ino`
    /// starting at `firsts`, whose writeback just completed, leave the
    /// cache if nothing dirtied them since; their buffers go to the pool.
    pub(in crate::fs) fn drop_behind(&mut self, ino: u64, firsts: &[u64]) {
        let (inodes, _, pool) = self.split();
        let Some(ip) = inodes.get_mut(&ino) else {
            return;
        };
        let (mut freed, mut n) = (0, 0);
        for &first in firsts {
            let b = ip.cache.drop_clean(first, pool);
            freed += b;
            n += u64::from(b > 0);
        }
        take(&mut self.cache_bytes, freed, "cached bytes");
        bump(&self.counters.folios_dropped_behind, n);
    }

    pub(in crate::fs) fn trim_pool(&mut self) {
        let room = self.opts.cache_bytes.saturating_sub(self.cache_bytes);
        self.pool.trim(room);
    }

    /// Drop cached blocks [from, to) of `ino`, giving back the delalloc
    /// reservations of dirty blocks that were never mapped.
    pub(in crate::fs) fn drop_cached(&mut self, ino: u64, from: u64, to: u64) -> Result<()> {
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
        take(&mut ip.delalloc, unmapped, "delayed blocks");
        take(&mut self.cache_bytes, freed, "cached bytes");
        self.dirty_bytes = self.dirty_bytes.saturating_sub(dirty.len() as u64 * bs);
        self.trim_pool();
        Ok(())
    }
}

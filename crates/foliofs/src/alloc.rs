//! Allocation groups: free space and inodes.
//!
//! Each AG has an in-memory copy of its block and inode bitmaps behind its
//! own lock, so that allocations in different AGs do not contend. The
//! on-disk bitmaps and AG header counters change through the journal.
//!
//! A freed block is cleared on disk at once (in the running transaction)
//! but stays set in memory until the commit that freed it is durable (a
//! crash could undo an uncommitted free while a new owner had already
//! written data into it), and, if the block has an image in the live
//! journal (a metadata block), until the checkpoint that retires it
//! (replay could write that image over the new owner's data).
//!
//! Lock order: the engine's metadata lock, then an AG lock; never two AG
//! locks at once.

use crate::books::take;
use crate::error::{Error, Result};
use crate::format::ag_header::AgHeader;
use crate::format::{bitmap, magic};
use crate::geometry::Geometry;
use crate::meta::Meta;
use parking_lot::Mutex;

pub struct AgState {
    /// One bit per AG block; set = used or not yet reusable.
    used: Vec<u64>,
    /// Blocks clear in `used`.
    pub free: u64,
    /// One bit per inode of the AG; set = in use.
    inodes: Vec<u64>,
    pub free_inodes: u64,
    /// No inode below this one is free: the search for the lowest free
    /// inode starts here instead of at 0 (an AG of a million inodes
    /// otherwise walks 16,000 words per create once it is full).
    inode_hint: u64,
    len: u64,
}

pub struct Alloc {
    /// Per-AG free-space state. Lock order: third, under the inode I/O
    /// lock and the metadata lock (`Shared::inner`); one AG's at a time,
    /// and no device I/O is waited for while one is held.
    pub ags: Vec<Mutex<AgState>>,
    /// Delayed-allocation reservations: blocks promised to dirty data.
    pub reserved: u64,
    /// The part of `reserved` held by speculative preallocation ranges
    /// (given back first under ENOSPC pressure).
    pub speculative: u64,
    /// Blocks kept back for metadata (tree splits, journal-driven needs) so
    /// that data reservations can never starve the writeback that honours them.
    pub meta_reserve: u64,
    /// Blocks kept back for writes a client has cached before the engine
    /// sees them (the kernel's page cache over FUSE, `Fs::set_cache_reserve`):
    /// ordinary reservations leave them, `reserve_cached` may take them.
    /// A floor, not a reservation: what frees up refills it by itself.
    pub cache_floor: u64,
    pub dir_rotor: u32,
}

fn find_zero(bits: &[u64], from: u64, end: u64) -> Option<u64> {
    let mut i = from;
    while i < end {
        let w = bits[(i / 64) as usize] | ((1u64 << (i % 64)) - 1);
        if w != u64::MAX {
            let bit = (i / 64) * 64 + (!w).trailing_zeros() as u64;
            return (bit < end).then_some(bit);
        }
        i = (i / 64 + 1) * 64;
    }
    None
}

fn find_one(bits: &[u64], from: u64, end: u64) -> u64 {
    let mut i = from;
    while i < end {
        let w = bits[(i / 64) as usize] & !((1u64 << (i % 64)) - 1);
        if w != 0 {
            return ((i / 64) * 64 + w.trailing_zeros() as u64).min(end);
        }
        i = (i / 64 + 1) * 64;
    }
    end
}

fn set_bits(bits: &mut [u64], start: u64, len: u64, v: bool) {
    for i in start..start + len {
        let (w, b) = ((i / 64) as usize, i % 64);
        if v {
            bits[w] |= 1 << b;
        } else {
            bits[w] &= !(1 << b);
        }
    }
}

fn get_bit(bits: &[u64], i: u64) -> bool {
    bits[(i / 64) as usize] & (1 << (i % 64)) != 0
}

impl AgState {
    /// First free run at or after `from` (wrapping once), at most `want`.
    fn find_run(&self, from: u64, floor: u64, want: u64) -> Option<(u64, u64)> {
        let from = from.clamp(floor, self.len);
        for (lo, hi) in [(from, self.len), (floor, from)] {
            if let Some(s) = find_zero(&self.used, lo, hi) {
                let e = find_one(&self.used, s, self.len.min(s + want));
                return Some((s, e - s));
            }
        }
        None
    }
}

/// Read `nblocks` bitmap blocks from `start` covering `items` bits: the
/// in-memory bits and the count of clear ones.
fn load_bitmap(
    meta: &mut Meta,
    start: u64,
    nblocks: u64,
    items: u64,
    magic: u32,
    what: &'static str,
) -> Result<(Vec<u64>, u64)> {
    let per = meta.geo.bits_per_bmap;
    let mut bits = vec![0u64; items.div_ceil(64) as usize];
    let mut clear = 0;
    for i in 0..nblocks {
        let b = meta.read(start + i, magic, what)?;
        let first = i * per;
        for bit in 0..per.min(items.saturating_sub(first)) {
            if bitmap::get_bit(b, bit as u32) {
                set_bits(&mut bits, first + bit, 1, true);
            } else {
                clear += 1;
            }
        }
    }
    Ok((bits, clear))
}

impl Alloc {
    /// Load every AG's header and bitmaps (verifying them).
    pub fn load(meta: &mut Meta) -> Result<Self> {
        let geo = meta.geo.clone();
        let mut ags = Vec::new();
        let mut total_free = 0;
        for ag in 0..geo.ag_count {
            let len = geo.ag_len(ag);
            let agh = AgHeader::decode(
                meta.read(geo.agh_blk(ag), magic::AG_HEADER, "AG header")?,
                geo.agh_blk(ag),
                ag,
            )?;
            if agh.blocks != len {
                return Err(Error::corrupted(
                    "AG header",
                    geo.agh_blk(ag),
                    format!("AG has {} blocks, header says {}", len, agh.blocks),
                ));
            }
            let (used, free) = load_bitmap(
                meta,
                geo.bmap_start(ag),
                geo.bmap_blocks,
                len,
                magic::BLOCK_BITMAP,
                "block bitmap",
            )?;
            let (inodes, free_inodes) = load_bitmap(
                meta,
                geo.imap_start(ag),
                geo.imap_blocks,
                geo.inodes_per_ag,
                magic::INODE_BITMAP,
                "inode bitmap",
            )?;
            if free != agh.free_blocks || free_inodes != agh.free_inodes {
                return Err(Error::corrupted(
                    "AG header",
                    geo.agh_blk(ag),
                    format!(
                        "counters say {} free blocks and {} free inodes, bitmaps {} and {}",
                        agh.free_blocks, agh.free_inodes, free, free_inodes
                    ),
                ));
            }
            total_free += free;
            ags.push(Mutex::new(AgState {
                used,
                free,
                inodes,
                free_inodes,
                inode_hint: 0,
                len,
            }));
        }
        let meta_reserve = (geo.total_blocks / 64).clamp(16, 8192).min(total_free / 4);
        Ok(Alloc {
            ags,
            reserved: 0,
            speculative: 0,
            meta_reserve,
            cache_floor: 0,
            dir_rotor: 0,
        })
    }

    pub fn free_blocks(&self) -> u64 {
        self.ags.iter().map(|a| a.lock().free).sum()
    }

    /// Blocks a new reservation may still take.
    pub fn available(&self) -> u64 {
        self.available_to_cache().saturating_sub(self.cache_floor)
    }

    /// Blocks a write from a client's cache may still take: the cache
    /// floor too.
    pub fn available_to_cache(&self) -> u64 {
        self.free_blocks()
            .saturating_sub(self.reserved + self.meta_reserve)
    }

    /// Whether the free space no longer covers the cache floor: a write
    /// from the client's cache has taken part of it, and the client must
    /// stop taking writes it has no room for.
    pub fn cache_short(&self) -> bool {
        self.cache_floor > 0 && self.available_to_cache() < self.cache_floor
    }

    /// Whether a change that may take metadata blocks may start: more
    /// than half of `meta_reserve` is free beside every reservation and
    /// the cache floor (`Ctx::meta_room`).
    pub fn meta_room(&self) -> bool {
        self.free_blocks()
            .saturating_sub(self.reserved + self.cache_floor)
            > self.meta_reserve / 2
    }

    /// Reserve `n` blocks for delayed allocation. ENOSPC now, never later.
    pub fn reserve(&mut self, n: u64) -> Result<()> {
        self.reserve_from(n, false)
    }

    /// `reserve` for a write from a client's cache, which may take the
    /// cache floor.
    pub fn reserve_cached(&mut self, n: u64) -> Result<()> {
        self.reserve_from(n, true)
    }

    fn reserve_from(&mut self, n: u64, cached: bool) -> Result<()> {
        let avail = if cached {
            self.available_to_cache()
        } else {
            self.available()
        };
        if avail < n {
            return Err(Error::NoSpace);
        }
        self.reserved += n;
        Ok(())
    }

    pub fn unreserve(&mut self, n: u64) {
        assert!(self.reserved >= n, "unreserve {n} of {}", self.reserved);
        take(&mut self.reserved, n, "reserved blocks");
    }

    /// Allocate up to `want` contiguous blocks, preferring AG `ag` at or
    /// after `goal`. Returns (first block, count) with count >= 1.
    pub fn alloc(
        &mut self,
        meta: &mut Meta,
        ag: u32,
        goal: Option<u64>,
        want: u64,
    ) -> Result<(u64, u64)> {
        let run = self.alloc_in_memory(meta, ag, goal, want)?;
        self.mark_on_disk(meta, run.0, run.1, true)?;
        Ok(run)
    }

    /// `alloc`, taken in memory only: the run is nobody else's, but the
    /// on-disk bitmap does not say so until `commit_alloc` (in the
    /// transaction that gives the blocks an owner, so a crash before
    /// leaks nothing) or `unalloc` gives it back.
    pub fn alloc_in_memory(
        &mut self,
        meta: &mut Meta,
        ag: u32,
        goal: Option<u64>,
        want: u64,
    ) -> Result<(u64, u64)> {
        self.take_freed(meta);
        let geo = meta.geo.clone();
        let n = geo.ag_count;
        for k in 0..n {
            let a = (ag + k) % n;
            let floor = geo.data_start_agbno(a);
            let from = match goal {
                Some(g) if k == 0 && geo.ag_of(g) == a => geo.agbno(g),
                _ => floor,
            };
            let mut st = self.ags[a as usize].lock();
            if st.free == 0 {
                continue;
            }
            let Some((s, len)) = st.find_run(from, floor, want) else {
                continue;
            };
            set_bits(&mut st.used, s, len, true);
            take(&mut st.free, len, "AG free blocks");
            return Ok((geo.ag_start(a) + s, len));
        }
        Err(Error::NoSpace)
    }

    /// Record on disk a run taken by `alloc_in_memory`.
    pub fn commit_alloc(&mut self, meta: &mut Meta, start: u64, len: u64) -> Result<()> {
        self.mark_on_disk(meta, start, len, true)
    }

    /// Give back a run taken by `alloc_in_memory` and never committed.
    pub fn unalloc(&mut self, geo: &Geometry, start: u64, len: u64) {
        let mut st = self.ags[geo.ag_of(start) as usize].lock();
        set_bits(&mut st.used, geo.agbno(start), len, false);
        st.free += len;
    }

    /// Allocate exactly one block (tree nodes).
    pub fn alloc_one(&mut self, meta: &mut Meta, ag: u32, goal: Option<u64>) -> Result<u64> {
        Ok(self.alloc(meta, ag, goal, 1)?.0)
    }

    /// Free a run: cleared on disk now, reusable after the next checkpoint.
    /// Its data checksums are cleared too, so a free block has none.
    pub fn free(&mut self, meta: &mut Meta, start: u64, len: u64) -> Result<()> {
        let geo = meta.geo.clone();
        if len == 0 {
            return Ok(());
        }
        if !geo.is_data_block(start)
            || !geo.is_data_block(start + len - 1)
            || geo.ag_of(start) != geo.ag_of(start + len - 1)
        {
            return Err(Error::corrupted(
                "extent",
                start,
                format!("free of {len} blocks outside one AG's data area"),
            ));
        }
        self.mark_on_disk(meta, start, len, false)?;
        crate::csums::clear_csums(meta, start, len)?;
        for b in start..start + len {
            meta.forget(b);
        }
        meta.freed_running.push((start, len));
        Ok(())
    }

    /// Take back the runs whose frees became safe to reuse (see `Meta`).
    pub fn take_freed(&mut self, meta: &mut Meta) {
        let geo = &meta.geo;
        for (start, len) in meta.freed_reusable.drain(..) {
            let ag = geo.ag_of(start);
            let mut st = self.ags[ag as usize].lock();
            set_bits(&mut st.used, geo.agbno(start), len, false);
            st.free += len;
        }
    }

    /// Set or clear bits in the on-disk bitmap and adjust the AG header.
    fn mark_on_disk(&mut self, meta: &mut Meta, start: u64, len: u64, used: bool) -> Result<()> {
        let geo = meta.geo.clone();
        let mut b = start;
        while b < start + len {
            let (blk, bit) = geo.bmap_loc(b);
            let n = (geo.bits_per_bmap - bit as u64).min(start + len - b);
            meta.read(blk, magic::BLOCK_BITMAP, "block bitmap")?;
            let buf = meta.write(blk);
            for i in 0..n as u32 {
                if bitmap::get_bit(buf, bit + i) == used {
                    return Err(Error::corrupted(
                        "block bitmap",
                        blk,
                        format!(
                            "block {} already {}",
                            b + i as u64,
                            if used { "in use" } else { "free" }
                        ),
                    ));
                }
                bitmap::set_bit(buf, bit + i, used);
            }
            b += n;
        }
        update_ag_header(meta, geo.ag_of(start), |h| {
            if used {
                h.free_blocks -= len;
            } else {
                h.free_blocks += len;
            }
        })
    }

    /// Allocate an inode in AG `ag` (or the next with room).
    pub fn alloc_inode(&mut self, meta: &mut Meta, ag: u32) -> Result<u64> {
        let geo = meta.geo.clone();
        for k in 0..geo.ag_count {
            let a = (ag + k) % geo.ag_count;
            let idx = {
                let mut st = self.ags[a as usize].lock();
                if st.free_inodes == 0 {
                    continue;
                }
                let Some(i) = find_zero(&st.inodes, st.inode_hint, geo.inodes_per_ag) else {
                    continue;
                };
                set_bits(&mut st.inodes, i, 1, true);
                st.inode_hint = i + 1;
                take(&mut st.free_inodes, 1, "AG free inodes");
                i
            };
            let ino = a as u64 * geo.inodes_per_ag + idx;
            self.mark_inode_on_disk(meta, ino, true)?;
            return Ok(ino);
        }
        Err(Error::NoSpace)
    }

    pub fn free_inode(&mut self, meta: &mut Meta, ino: u64) -> Result<()> {
        let geo = meta.geo.clone();
        self.mark_inode_on_disk(meta, ino, false)?;
        let mut st = self.ags[geo.inode_ag(ino) as usize].lock();
        let i = ino % geo.inodes_per_ag;
        set_bits(&mut st.inodes, i, 1, false);
        st.inode_hint = st.inode_hint.min(i);
        st.free_inodes += 1;
        Ok(())
    }

    pub fn inode_in_use(&self, geo: &Geometry, ino: u64) -> bool {
        ino < geo.max_ino()
            && get_bit(
                &self.ags[geo.inode_ag(ino) as usize].lock().inodes,
                ino % geo.inodes_per_ag,
            )
    }

    fn mark_inode_on_disk(&mut self, meta: &mut Meta, ino: u64, used: bool) -> Result<()> {
        let geo = meta.geo.clone();
        let (blk, bit) = geo.imap_loc(ino);
        meta.read(blk, magic::INODE_BITMAP, "inode bitmap")?;
        let buf = meta.write(blk);
        if bitmap::get_bit(buf, bit) == used {
            return Err(Error::corrupted(
                "inode bitmap",
                blk,
                format!(
                    "inode {ino} already {}",
                    if used { "in use" } else { "free" }
                ),
            ));
        }
        bitmap::set_bit(buf, bit, used);
        update_ag_header(meta, geo.inode_ag(ino), |h| {
            if used {
                h.free_inodes -= 1;
            } else {
                h.free_inodes += 1;
            }
        })
    }

    /// The AG for a new directory: the next in rotation.
    pub fn next_dir_ag(&mut self, ag_count: u32) -> u32 {
        let a = self.dir_rotor % ag_count;
        self.dir_rotor = self.dir_rotor.wrapping_add(1);
        a
    }
}

/// Change AG `ag`'s header in the running transaction.
fn update_ag_header(meta: &mut Meta, ag: u32, f: impl FnOnce(&mut AgHeader)) -> Result<()> {
    let blk = meta.geo.agh_blk(ag);
    let mut h = AgHeader::decode(meta.read(blk, magic::AG_HEADER, "AG header")?, blk, ag)?;
    f(&mut h);
    let uuid = meta.uuid;
    h.encode(meta.write(blk), blk, uuid);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_search() {
        let mut bits = vec![0u64; 4];
        set_bits(&mut bits, 0, 70, true);
        assert_eq!(find_zero(&bits, 0, 256), Some(70));
        assert_eq!(find_one(&bits, 70, 256), 256);
        set_bits(&mut bits, 100, 1, true);
        assert_eq!(find_one(&bits, 70, 256), 100);
        assert_eq!(find_zero(&bits, 100, 256), Some(101));
        set_bits(&mut bits, 0, 256, true);
        assert_eq!(find_zero(&bits, 0, 256), None);
        assert_eq!(find_zero(&bits, 0, 0), None);
    }
}

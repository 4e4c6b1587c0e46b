//! The page cache of one inode: folios of 2^k blocks (one block up to the
//! maximum folio size), each aligned to its own size in the file and never
//! overlapping another.
//!
//! A folio with more than one block carries a state object with two
//! per-block bitmaps, uptodate and dirty. A folio whose blocks are all
//! uptodate and either all dirty or all clean needs no state object (a
//! whole-folio write, or a folio read in full). Dirty bits are cleared when
//! writeback takes the blocks for the device; the device write reads the
//! folio's own memory, so a writer waits for it before changing the folio
//! (stable pages) and its blocks turn dirty again to be written again.
//!
//! Invariants (seeds/iomap-per-block-dirty.txt): dirty bits are cleared
//! when the I/O is submitted, and the folio stays under writeback (pinned)
//! until every submitted byte completes; a folio that is dirty or under
//! writeback is never evicted; a write that fails part-way leaves no dirty
//! bit over bytes it did not copy; a 4 KiB write into a 2 MiB folio makes
//! 4 KiB dirty, not 2 MiB.

use crate::books::take;
use crate::device::AlignedBuf;
use std::collections::{BTreeMap, BTreeSet};

/// Largest folio in blocks (2 MiB of 512-byte blocks).
pub(crate) const MAX_FOLIO_BLOCKS: usize = 4096;

/// Per-block state of a folio.
#[derive(Clone, Debug)]
struct BlockState {
    uptodate: Vec<u64>,
    dirty: Vec<u64>,
}

fn bit(b: &[u64], i: usize) -> bool {
    b[i / 64] >> (i % 64) & 1 == 1
}

fn set(b: &mut [u64], i: usize, v: bool) {
    if v {
        b[i / 64] |= 1 << (i % 64);
    } else {
        b[i / 64] &= !(1 << (i % 64));
    }
}

/// Set (`v`) or clear bits [from, to), a word at a time: a large folio
/// has 512 blocks or more.
fn set_range(b: &mut [u64], from: usize, to: usize, v: bool) {
    let mut i = from;
    while i < to {
        let (w, lo) = (i / 64, i % 64);
        let hi = (to - w * 64).min(64);
        let mask = (!0u64 >> (64 - (hi - lo))) << lo;
        if v {
            b[w] |= mask;
        } else {
            b[w] &= !mask;
        }
        i = w * 64 + hi;
    }
}

fn all(b: &[u64], n: usize) -> bool {
    let (full, tail) = (n / 64, n % 64);
    b[..full].iter().all(|w| *w == !0) && (tail == 0 || b[full] | (!0 << tail) == !0)
}

/// The indexes of the bits set in `b`, in order.
fn ones(b: &[u64]) -> impl Iterator<Item = usize> + '_ {
    b.iter().enumerate().flat_map(|(w, &word)| {
        let mut x = word;
        std::iter::from_fn(move || {
            (x != 0).then(|| {
                let t = x.trailing_zeros() as usize;
                x &= x - 1;
                w * 64 + t
            })
        })
    })
}

fn none(b: &[u64]) -> bool {
    b.iter().all(|w| *w == 0)
}

pub(crate) struct Folio {
    pub nblocks: usize,
    pub data: AlignedBuf,
    /// None: every block is uptodate, and dirty exactly when `all_dirty`.
    state: Option<Box<BlockState>>,
    all_dirty: bool,
    /// Last use, for eviction of clean folios.
    pub tick: u64,
    /// Blocks of this folio under writeback (taken from the dirty bits,
    /// device write not yet complete). While this is non-zero the folio
    /// is not evicted or dropped (the device reads its memory), and its
    /// memory is not written (stable pages: the checksums writeback
    /// computes must match what reaches the device), so a writer waits.
    pub wb_pending: u32,
    /// A writer is copying into this folio without the metadata lock.
    /// The blocks it writes are marked dirty already (their reservations
    /// count as any dirty block's); writeback leaves the folio alone and
    /// eviction skips it until the copy is done.
    pub writer: bool,
    /// A reader is reading its missing blocks from the device without
    /// the metadata lock (`FillPlan`). Other readers of it wait for that
    /// fill rather than read the same blocks again; eviction skips it.
    pub filling: bool,
}

impl Folio {
    /// A folio of `nblocks` blocks with nothing uptodate.
    #[cfg(test)]
    pub fn new(nblocks: usize, bs: usize, tick: u64) -> Folio {
        Folio::with_data(nblocks, AlignedBuf::zeroed(nblocks * bs), tick)
    }

    /// A folio over `data` (any contents: nothing is uptodate yet).
    pub fn with_data(nblocks: usize, data: AlignedBuf, tick: u64) -> Folio {
        let words = nblocks.div_ceil(64);
        Folio {
            nblocks,
            data,
            state: Some(Box::new(BlockState {
                uptodate: vec![0; words],
                dirty: vec![0; words],
            })),
            all_dirty: false,
            tick,
            wb_pending: 0,
            writer: false,
            filling: false,
        }
    }

    pub fn has_state(&self) -> bool {
        self.state.is_some()
    }

    pub fn uptodate(&self, i: usize) -> bool {
        self.state.as_ref().is_none_or(|s| bit(&s.uptodate, i))
    }

    /// Every block is uptodate (written, or read from the device).
    pub fn all_uptodate(&self) -> bool {
        self.state
            .as_ref()
            .is_none_or(|s| all(&s.uptodate, self.nblocks))
    }

    pub fn dirty(&self, i: usize) -> bool {
        match &self.state {
            None => self.all_dirty,
            Some(s) => bit(&s.dirty, i),
        }
    }

    /// The indexes of the dirty blocks, in order.
    pub fn dirty_indexes(&self) -> impl Iterator<Item = usize> + '_ {
        let (whole, bits) = match &self.state {
            None if self.all_dirty => (self.nblocks, None),
            None => (0, None),
            Some(s) => (0, Some(ones(&s.dirty))),
        };
        (0..whole).chain(bits.into_iter().flatten())
    }

    pub fn any_dirty(&self) -> bool {
        match &self.state {
            None => self.all_dirty,
            Some(s) => !none(&s.dirty),
        }
    }

    /// The state object, made if the folio has none.
    fn state_mut(&mut self) -> &mut BlockState {
        let (n, d) = (self.nblocks, self.all_dirty);
        self.state.get_or_insert_with(|| {
            let words = n.div_ceil(64);
            let mut s = BlockState {
                uptodate: vec![0; words],
                dirty: vec![0; words],
            };
            set_range(&mut s.uptodate, 0, n, true);
            set_range(&mut s.dirty, 0, n, d);
            Box::new(s)
        })
    }

    /// Drop the state object when the bitmaps say nothing per block.
    fn compact(&mut self) {
        if let Some(s) = &self.state {
            if all(&s.uptodate, self.nblocks) {
                if none(&s.dirty) {
                    self.all_dirty = false;
                    self.state = None;
                } else if all(&s.dirty, self.nblocks) {
                    self.all_dirty = true;
                    self.state = None;
                }
            }
        }
    }

    pub fn set_uptodate(&mut self, i: usize, v: bool) {
        if self.uptodate(i) != v {
            set(&mut self.state_mut().uptodate, i, v);
            self.compact();
        }
    }

    pub fn set_dirty(&mut self, i: usize, v: bool) {
        if self.dirty(i) != v {
            set(&mut self.state_mut().dirty, i, v);
            self.compact();
        }
    }

    /// Mark blocks [from, to) uptodate and dirty at once; the whole folio
    /// ends without a state object.
    pub fn fill_dirty(&mut self, from: usize, to: usize) {
        if (from == 0 && to == self.nblocks) || (self.state.is_none() && self.all_dirty) {
            self.state = None;
            self.all_dirty = true;
            return;
        }
        let s = self.state_mut();
        set_range(&mut s.uptodate, from, to, true);
        set_range(&mut s.dirty, from, to, true);
        self.compact();
    }

    /// Clear the dirty bits of blocks [from, to).
    pub fn clear_dirty(&mut self, from: usize, to: usize) {
        if from == 0 && to == self.nblocks && self.state.is_none() {
            self.all_dirty = false;
            return;
        }
        set_range(&mut self.state_mut().dirty, from, to, false);
        self.compact();
    }

    /// Blocks [from, to) hold nothing: neither dirty nor uptodate, and
    /// zeroed.
    pub fn forget(&mut self, from: usize, to: usize, bs: usize) {
        let s = self.state_mut();
        set_range(&mut s.dirty, from, to, false);
        set_range(&mut s.uptodate, from, to, false);
        self.data.range_mut(from * bs..to * bs).fill(0);
        self.compact();
    }

    pub fn block(&self, i: usize, bs: usize) -> &[u8] {
        self.data.range(i * bs..(i + 1) * bs)
    }

    pub fn block_mut(&mut self, i: usize, bs: usize) -> &mut [u8] {
        self.data.range_mut(i * bs..(i + 1) * bs)
    }

    /// Neither under writeback nor being copied into nor filled: it may
    /// be evicted or dropped if clean.
    pub fn idle(&self) -> bool {
        self.wb_pending == 0 && !self.writer && !self.filling
    }
}

/// Freed folio buffers kept for reuse, so a steady stream of writes does
/// not map, fault in (the kernel zeroes every page) and unmap fresh memory
/// for every folio: what the page cache gives up is what it takes next.
/// The owner bounds it (`trim`: cached plus pooled bytes stay within the
/// cache limit) and gives it back to the kernel when unused
/// (`trim_idle`). Buffers come back with stale contents: folios start
/// with nothing uptodate.
pub(crate) struct BufPool {
    bufs: std::collections::HashMap<usize, Vec<AlignedBuf>>,
    pub bytes: u64,
    /// A buffer was taken since the last `trim_idle`.
    used: bool,
}

impl BufPool {
    pub fn new() -> BufPool {
        BufPool {
            bufs: Default::default(),
            bytes: 0,
            used: false,
        }
    }

    pub fn get(&mut self, len: usize) -> AlignedBuf {
        self.used = true;
        match self.bufs.get_mut(&len).and_then(|v| v.pop()) {
            Some(b) => {
                take(&mut self.bytes, len as u64, "pool bytes");
                b
            }
            None => AlignedBuf::zeroed(len),
        }
    }

    /// Whether a buffer of `len` bytes is kept.
    pub fn has(&self, len: usize) -> bool {
        self.bufs.get(&len).is_some_and(|v| !v.is_empty())
    }

    pub fn put(&mut self, b: AlignedBuf) {
        if !b.is_empty() {
            self.bytes += b.len() as u64;
            self.bufs.entry(b.len()).or_default().push(b);
        }
    }

    /// Free buffers until at most `max` bytes are kept.
    pub fn trim(&mut self, max: u64) {
        if self.bytes <= max {
            return;
        }
        for v in self.bufs.values_mut() {
            while self.bytes > max {
                let Some(b) = v.pop() else { break };
                take(&mut self.bytes, b.len() as u64, "pool bytes");
            }
        }
        self.bufs.retain(|_, v| !v.is_empty());
    }

    /// Halve what is kept if nothing was taken since the last call (a
    /// periodic pass): idle memory goes back to the kernel in a few
    /// periods.
    pub fn trim_idle(&mut self) {
        if !self.used {
            self.trim(self.bytes / 2);
        }
        self.used = false;
    }
}

/// One inode's folios, by first file block.
#[derive(Default)]
pub(crate) struct Cache {
    pub folios: BTreeMap<u64, Folio>,
    /// First blocks of the folios that may hold dirty blocks (a superset,
    /// kept by `note_dirty` and pruned as blocks are cleaned), so finding
    /// dirty data costs what is dirty, not what is cached: a file written
    /// by 4 KiB appends holds tens of thousands of small folios.
    dirty: BTreeSet<u64>,
}

impl Cache {
    /// The folio holding file block `lblk`: (its first block, the folio).
    pub fn find(&self, lblk: u64) -> Option<(u64, &Folio)> {
        let (&first, f) = self.folios.range(..=lblk).next_back()?;
        (lblk < first + f.nblocks as u64).then_some((first, f))
    }

    pub fn find_mut(&mut self, lblk: u64) -> Option<(u64, &mut Folio)> {
        let (&first, f) = self.folios.range_mut(..=lblk).next_back()?;
        (lblk < first + f.nblocks as u64).then_some((first, f))
    }

    /// Contents of block `lblk` if the cache holds it uptodate.
    pub fn block(&self, lblk: u64, bs: usize) -> Option<&[u8]> {
        let (first, f) = self.find(lblk)?;
        let i = (lblk - first) as usize;
        f.uptodate(i).then(|| f.block(i, bs))
    }

    pub fn is_dirty(&self, lblk: u64) -> bool {
        self.find(lblk)
            .is_some_and(|(first, f)| f.dirty((lblk - first) as usize))
    }

    /// The folio starting at `first` has dirty blocks now.
    pub fn note_dirty(&mut self, first: u64) {
        self.dirty.insert(first);
    }

    /// The folio starting at `first` may have lost its last dirty block.
    /// Drop the folio at `first` if it is clean and idle, its buffer to
    /// `pool`: the bytes freed (0 when it stays).
    pub fn drop_clean(&mut self, first: u64, pool: &mut BufPool) -> u64 {
        if !self
            .folios
            .get(&first)
            .is_some_and(|f| !f.any_dirty() && f.idle())
        {
            return 0;
        }
        let Some(f) = self.folios.remove(&first) else {
            return 0;
        };
        self.dirty.remove(&first);
        let n = f.data.len() as u64;
        pool.put(f.data);
        n
    }

    pub fn note_cleaned(&mut self, first: u64) {
        if !self.folios.get(&first).is_some_and(|f| f.any_dirty()) {
            self.dirty.remove(&first);
        }
    }

    /// Every folio with dirty blocks is in the dirty index.
    pub fn check_dirty_index(&self) -> Result<(), u64> {
        match self
            .folios
            .iter()
            .find(|(first, f)| f.any_dirty() && !self.dirty.contains(first))
        {
            Some((first, _)) => Err(*first),
            None => Ok(()),
        }
    }

    /// Dirty blocks in [from, to), in order, as they are found.
    pub fn dirty_blocks(&self, from: u64, to: u64) -> impl Iterator<Item = u64> + '_ {
        let start = self.find(from).map_or(from, |(first, _)| first);
        self.dirty
            .range(start..to)
            .filter_map(|first| self.folios.get(first).map(|f| (first, f)))
            .filter(|(_, f)| f.any_dirty())
            .flat_map(move |(&first, f)| {
                f.dirty_indexes()
                    .map(move |i| first + i as u64)
                    .filter(move |&l| l >= from && l < to)
            })
    }

    /// Up to `max` dirty blocks below block `below`, lowest first, from
    /// whole folios below it, stopping before the first folio a writer is
    /// copying into; and whether one stopped it.
    pub fn dirty_for_writeback(&self, max: usize, below: u64) -> (Vec<u64>, bool) {
        let mut out = Vec::new();
        for first in &self.dirty {
            let Some(f) = self.folios.get(first) else {
                continue;
            };
            if first + f.nblocks as u64 > below {
                break;
            }
            if f.writer && f.any_dirty() {
                return (out, true);
            }
            for i in f.dirty_indexes() {
                if out.len() == max {
                    return (out, false);
                }
                out.push(first + i as u64);
            }
        }
        (out, false)
    }

    /// Whether a folio holds any block of [from, to).
    pub fn holds_any(&self, from: u64, to: u64) -> bool {
        self.find(from).is_some() || self.folios.range(from..to).next().is_some()
    }

    pub fn any_dirty_in(&self, from: u64, to: u64) -> bool {
        self.dirty_blocks(from, to).next().is_some()
    }

    pub fn any_dirty(&self) -> bool {
        self.dirty
            .iter()
            .any(|first| self.folios.get(first).is_some_and(|f| f.any_dirty()))
    }

    /// The largest folio size (in blocks, a power of two up to `max`) that
    /// can start at an aligned position holding `lblk` without overlapping
    /// another folio, and without going below `floor` or past `ceil`.
    pub fn fit(&self, lblk: u64, max: usize, floor: u64, ceil: u64) -> (u64, usize) {
        let mut n = max.max(1);
        loop {
            let first = lblk / n as u64 * n as u64;
            let end = first + n as u64;
            let clear = first >= floor
                && end <= ceil.max(lblk + 1)
                && self.find(first).is_none()
                && self.folios.range(first..end).next().is_none();
            if clear || n == 1 {
                return (first, n);
            }
            n /= 2;
        }
    }

    /// Drop cached blocks in [from, to): folios inside it go (their
    /// buffers into `pool`), folios straddling it lose those blocks'
    /// state. Returns the dirty blocks dropped and the bytes freed.
    pub fn drop_range(
        &mut self,
        from: u64,
        to: u64,
        bs: usize,
        pool: &mut BufPool,
    ) -> (Vec<u64>, u64) {
        let mut dirty = Vec::new();
        let mut freed = 0;
        let start = self.find(from).map_or(from, |(first, _)| first);
        let keys: Vec<u64> = self.folios.range(start..to).map(|(k, _)| *k).collect();
        for first in keys {
            let f = self.folios.get_mut(&first).unwrap();
            let end = first + f.nblocks as u64;
            // The folio's blocks inside [from, to).
            let (lo, hi) = (
                (from.max(first) - first) as usize,
                (to.min(end) - first) as usize,
            );
            dirty.extend(
                f.dirty_indexes()
                    .filter(|&i| i >= lo && i < hi)
                    .map(|i| first + i as u64),
            );
            if first >= from && end <= to {
                debug_assert!(f.idle(), "dropping a folio under writeback or copy");
                freed += f.data.len() as u64;
                if let Some(f) = self.folios.remove(&first) {
                    pool.put(f.data);
                }
                self.dirty.remove(&first);
                continue;
            }
            f.forget(lo, hi, bs);
            self.note_cleaned(first);
        }
        (dirty, freed)
    }

    pub fn bytes(&self) -> u64 {
        self.folios.values().map(|f| f.data.len() as u64).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_object_only_when_needed() {
        let mut f = Folio::new(16, 512, 0);
        assert!(f.has_state() && !f.uptodate(3) && !f.any_dirty());
        f.fill_dirty(0, 16);
        assert!(!f.has_state() && f.dirty(15) && f.uptodate(0));
        f.set_dirty(4, false);
        assert!(f.has_state() && !f.dirty(4) && f.dirty(5));
        assert_eq!((0..16).filter(|&i| f.dirty(i)).count(), 15);
        for i in 0..16 {
            f.set_dirty(i, false);
        }
        assert!(!f.has_state() && !f.any_dirty() && f.uptodate(9));
    }

    proptest::proptest! {
        /// Ranges of dirty and clean blocks in a large folio, set a word
        /// at a time, agree with one bit at a time; so do the dirty
        /// indexes and the state object's presence.
        #[test]
        fn range_bits_match_single_bits(
            n in proptest::sample::select(vec![1usize, 8, 63, 64, 65, 130, 512]),
            ops in proptest::collection::vec((0usize..600, 0usize..600, proptest::bool::ANY), 1..24),
        ) {
            let mut f = Folio::new(n, 512, 0);
            f.fill_dirty(0, n);
            f.clear_dirty(0, n);
            let mut model = vec![false; n];
            for (a, b, v) in ops {
                let (from, to) = (a.min(b) % (n + 1), a.max(b) % (n + 1));
                let (from, to) = (from.min(to), from.max(to));
                if v {
                    f.fill_dirty(from, to);
                } else {
                    f.clear_dirty(from, to);
                }
                model[from..to].iter_mut().for_each(|d| *d = v);
                let want: Vec<usize> = (0..n).filter(|&i| model[i]).collect();
                proptest::prop_assert_eq!(f.dirty_indexes().collect::<Vec<_>>(), want.clone());
                proptest::prop_assert_eq!(f.any_dirty(), !want.is_empty());
                proptest::prop_assert!((0..n).all(|i| f.uptodate(i) && f.dirty(i) == model[i]));
                let uniform = want.is_empty() || want.len() == n;
                proptest::prop_assert_eq!(f.has_state(), !uniform);
            }
        }
    }

    /// A range dropped from the middle of a large dirty folio: its blocks
    /// are returned as dirty, and leave the folio clean, not uptodate and
    /// zeroed; the blocks around it keep their data and dirty bits.
    #[test]
    fn drop_range_inside_a_large_folio() {
        let mut c = Cache::default();
        let mut f = Folio::new(512, 512, 0);
        f.data.fill(7);
        f.fill_dirty(0, 512);
        c.folios.insert(1024, f);
        c.note_dirty(1024);
        let (d, freed) = c.drop_range(1100, 1300, 512, &mut BufPool::new());
        assert_eq!(freed, 0);
        assert_eq!(d, (1100..1300).collect::<Vec<_>>());
        let left: Vec<u64> = c.dirty_blocks(0, 4096).collect();
        assert_eq!(left, (1024..1100).chain(1300..1536).collect::<Vec<_>>());
        assert!(c
            .block(1099, 512)
            .is_some_and(|b| b.iter().all(|&x| x == 7)));
        assert!(c.block(1100, 512).is_none() && c.block(1299, 512).is_none());
        assert!(c
            .block(1300, 512)
            .is_some_and(|b| b.iter().all(|&x| x == 7)));
        let f = &c.folios[&1024];
        assert!(f.data.range(76 * 512..276 * 512).iter().all(|&x| x == 0));
    }

    #[test]
    fn fit_and_drop() {
        let mut c = Cache::default();
        c.folios.insert(8, Folio::new(4, 512, 0));
        // A 16-block folio at 0 would overlap [8, 12): shrink to 8.
        assert_eq!(c.fit(3, 16, 0, 100), (0, 8));
        assert_eq!(c.fit(13, 16, 0, 100), (12, 4));
        assert_eq!(c.fit(20, 16, 0, 100), (16, 16));
        assert_eq!(c.fit(20, 16, 18, 100), (20, 4));
        c.folios.get_mut(&8).unwrap().fill_dirty(0, 4);
        c.note_dirty(8);
        assert_eq!(
            c.dirty_blocks(0, 100).collect::<Vec<_>>(),
            vec![8, 9, 10, 11]
        );
        let mut pool = BufPool::new();
        let (d, freed) = c.drop_range(10, 100, 512, &mut pool);
        assert_eq!((d, freed), (vec![10, 11], 0));
        assert_eq!(c.dirty_blocks(0, 100).collect::<Vec<_>>(), vec![8, 9]);
        assert!(c.block(10, 512).is_none() && c.block(9, 512).is_some());
        let (d, freed) = c.drop_range(0, 100, 512, &mut pool);
        assert_eq!((d.len(), freed), (2, 2048));
        assert!(c.folios.is_empty());
        // The freed buffers are reused.
        assert_eq!(pool.get(2048).len(), 2048);
        assert_eq!(pool.bytes, 0);
        let mut p = BufPool::new();
        for _ in 0..4 {
            p.put(AlignedBuf::zeroed(4096));
        }
        p.trim(8192);
        assert_eq!(p.bytes, 8192);
        // Used during a period: kept; idle for one: half goes.
        let b = p.get(4096);
        p.put(b);
        p.trim_idle();
        assert_eq!(p.bytes, 8192);
        p.trim_idle();
        assert_eq!(p.bytes, 4096);
    }
}

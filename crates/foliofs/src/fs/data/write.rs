//! Buffered writes, one step per folio: find or make the folio (fresh
//! memory mapped without the metadata lock) -> wait while it is under
//! writeback (stable pages) -> reserve space for holes (`delalloc`) ->
//! read or zero partial blocks -> mark the blocks dirty and pin the folio
//! -> copy (large steps without the metadata lock) -> unpin. `Fs::write`
//! drives the steps; `Inner::write` is the same loop for callers that
//! already hold the lock.

use super::delalloc::PREALLOC_MIN;
use super::MAX_FILE_SIZE;
use crate::books::take;
use crate::device::AlignedBuf;
use crate::error::{Error, Result};
use crate::fs::bump;
use crate::fs::fork::Extent;
use crate::fs::state::{Inner, Shared};
use parking_lot::MutexGuard;
use std::ops::{Deref, DerefMut};

/// Write steps at least this large copy without the metadata lock; the
/// lock round trip costs more than copying less.
pub(super) const UNLOCKED_COPY_BYTES: usize = 64 << 10;

/// A buffered write in progress (see `Inner::write_begin`).
pub(in crate::fs) struct WriteOp {
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
    /// The inode's `map_gen` when `mapping` was looked up: writeback may
    /// map blocks while the lock is let go between steps (a block it
    /// wrote back is neither dirty nor preallocated any more), and a
    /// stale lookup would count them as holes to reserve.
    mapping_gen: u64,
    /// A write from a client's cache (`Fs::write_cached`): the blocks
    /// reserved for its holes before it began, not yet taken by a step;
    /// None for an ordinary write, which reserves step by step.
    credit: Option<u64>,
    /// Bytes copied so far.
    pub done: usize,
    new_dirty: u64,
    /// Why the write stopped early, if it did.
    pub result: Result<()>,
    /// Fresh memory for the next new folio, mapped without the lock.
    pub spare: Option<AlignedBuf>,
}

pub(in crate::fs) enum WriteStep {
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
pub(in crate::fs) struct CopyStep {
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

impl Inner {
    /// Start a buffered write of `len` bytes at `offset`: checks, the
    /// zeroed tail of the old last block, ENOSPC pressure. The inode is
    /// pinned (like an open file) until `write_end`, since the copies
    /// run without the metadata lock. The caller has waited for the
    /// inode's writeback when `offset` is past EOF (the tail block may be
    /// under writeback, and must not change under it).
    ///
    /// `whole`: a write from a client's cache, which must go in whole or
    /// not at all (the kernel takes a short reply to its writeback as
    /// complete): the space for every block of the range that is neither
    /// mapped nor dirty is reserved here, from the cache floor too
    /// (`Alloc::reserve_cached`), or the write fails with ENOSPC having
    /// changed nothing.
    pub(in crate::fs) fn write_begin(
        &mut self,
        ino: u64,
        offset: u64,
        len: usize,
        whole: bool,
    ) -> Result<WriteOp> {
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
        let end_blk = end.div_ceil(bs);
        let credit = match whole && len > 0 {
            true => Some(self.reserve_whole(ino, offset / bs, end_blk)?),
            false => None,
        };
        if offset > size && len > 0 {
            if let Err(e) = self.zero_eof_tail(ino, size) {
                self.alloc.unreserve(credit.unwrap_or(0));
                return Err(e);
            }
        }
        // ENOSPC pressure: speculative reservations go before a write
        // that might need the space fails.
        if self.alloc.speculative > 0
            && self.alloc.available() < end_blk - offset / bs + PREALLOC_MIN
        {
            self.release_all_prealloc();
        }
        let by_length = self.opts.map_by_write_length;
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
            mapping_gen: 0,
            credit,
            done: 0,
            new_dirty: 0,
            result: Ok(()),
            spare: None,
        };
        let (ip, mut cx) = self.with(ino)?;
        if by_length && len > 0 {
            bump(&cx.counters.mapping_lookups, 1);
            let from = offset / bs;
            match ip.ext_range(&mut cx, from, end_blk) {
                Ok(m) => w.mapping = Some((from, end_blk, m)),
                Err(e) => {
                    cx.alloc.unreserve(w.credit.unwrap_or(0));
                    return Err(e);
                }
            }
            w.mapping_gen = ip.map_gen;
        }
        ip.open += 1;
        Ok(w)
    }

    /// Reserve, for a whole write of blocks [from, to), every block there
    /// that is neither dirty (a dirty block holds its space already) nor
    /// mapped (an overwrite needs none: a large one that finds no room
    /// elsewhere at writeback is logged instead), giving up speculative
    /// ranges first if that makes room. Blocks in the inode's own range
    /// count too: another write under ENOSPC pressure may give the range
    /// up while this one lets go of the lock. Returns the blocks reserved.
    fn reserve_whole(&mut self, ino: u64, from: u64, to: u64) -> Result<u64> {
        let need = {
            let (ip, mut cx) = self.with(ino)?;
            bump(&cx.counters.mapping_lookups, 1);
            let mapped = ip.ext_range(&mut cx, from, to)?;
            let mut dirty = ip.cache.dirty_blocks(from, to).peekable();
            let mut ext = mapped.iter().peekable();
            let mut need = 0;
            for l in from..to {
                while dirty.next_if(|&d| d < l).is_some() {}
                while ext.next_if(|e| e.end() <= l).is_some() {}
                let is_dirty = dirty.peek() == Some(&l);
                let is_mapped = ext.peek().is_some_and(|e| e.lblk <= l);
                need += u64::from(!is_dirty && !is_mapped);
            }
            need
        };
        if self.alloc.speculative > 0 && self.alloc.available_to_cache() < need {
            self.release_all_prealloc();
        }
        let (_, mut cx) = self.with(ino)?;
        cx.reserve_cached(need)?;
        Ok(need)
    }

    /// The next step of a write: the write's bytes in one folio (from
    /// `src`, the bytes not yet written), with space reserved for the holes
    /// among its blocks and partial blocks read or zeroed. A small step is
    /// copied here (`Copied`); a large one pins the folio (`Folio::writer`)
    /// for the caller to copy without the lock, then `write_copied`. None
    /// when the write is done; `Wait` when the folio is under writeback
    /// (stable pages: wait, then ask again).
    pub(in crate::fs) fn write_step(
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
        if w.mapping_gen != ip.map_gen {
            w.mapping = None;
        }
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
                w.mapping_gen = ip.map_gen;
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
        // A whole write reserved its holes before it began.
        let credited = w.credit.as_mut().map_or(0, |c| {
            let k = holes.min(*c);
            *c -= k;
            k
        });
        cx.reserve(holes - credited)?;
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
                take(&mut ip.delalloc, holes, "delayed blocks");
                return Err(e);
            }
        }
        // The blocks turn dirty now, so their reservations are counted
        // as every other dirty block's while the copy runs; writeback
        // leaves the pinned folio alone until the copy is done. They join
        // the dirty bytes now too: writeback may take them before the
        // write ends (while a later step lets go of the lock).
        let f = ip.cache.folios.get_mut(&first).unwrap();
        let newly = blocks.clone().filter(|&b| !f.dirty(b)).count() as u64 * bs;
        w.new_dirty += newly;
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
        self.dirty_bytes += newly;
        Ok(Some(step))
    }

    /// A step's bytes are in its folio: unpin it.
    pub(in crate::fs) fn write_copied(
        &mut self,
        ino: u64,
        w: &mut WriteOp,
        c: CopyStep,
    ) -> Result<()> {
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

    /// Finish a write: the size, the dirty accounting, write-behind. The
    /// bytes written, and whether the inode was queued for write-behind
    /// now (its writeback context should be woken).
    pub(in crate::fs) fn write_end(&mut self, ino: u64, mut w: WriteOp) -> Result<(usize, bool)> {
        if let Some(b) = w.spare.take() {
            self.pool.put(b);
        }
        let whole = w.credit.is_some();
        if let Some(c) = w.credit.take() {
            self.alloc.unreserve(c);
        }
        let threshold = self.opts.write_behind_bytes;
        let held = self.held.contains_key(&ino);
        let bs = self.meta.geo.block_size;
        let (ip, cx) = self.with(ino)?;
        if w.done > 0 {
            ip.size = ip.size.max(w.offset + w.done as u64);
            ip.touch_mtime();
            let end = w.offset + w.done as u64;
            if continues_stream(ip.stream_end, w.offset) {
                ip.stream_end = ip.stream_end.max(end);
            } else {
                ip.stream_dirty = 0;
                ip.stream_end = end;
                // What writeback took of an earlier stream is no guide
                // to the gaps of this one.
                ip.stream_taken = w.offset / bs;
            }
            ip.stream_dirty += w.new_dirty;
        }
        take(&mut ip.open, 1, "inode opens");
        let destroy = ip.d.nlink == 0 && ip.open == 0 && !held;
        let behind = threshold > 0 && !destroy && !ip.behind_queued && ip.stream_dirty >= threshold;
        ip.behind_queued |= behind;
        bump(&cx.counters.bytes_written_app, w.done as u64);
        bump(&cx.counters.bytes_dirtied, w.new_dirty);
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
            Err(e) if w.done == 0 || whole => Err(e),
            _ => Ok((w.done, behind)),
        }
    }

    /// A whole buffered write under the metadata lock (symlink targets,
    /// written into inodes nothing else can see yet).
    /// A whole buffered write by a caller already inside an operation
    /// (a long symlink's target): the same driver, without letting go of
    /// the lock.
    pub fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<usize> {
        let mut inner = self;
        drive(&mut inner, ino, offset, data, false).map(|(n, _)| n)
    }
}

/// The metadata lock as the write driver holds it. The real lock
/// (`Locked`) lets go for large copies and fresh memory and waits for
/// writeback; `&mut Inner`, for a caller inside an operation, does all
/// under the lock and cannot wait.
pub(in crate::fs) trait Held: DerefMut<Target = Inner> {
    /// Run one metadata step (shut down if it fails half way).
    fn step<T>(&mut self, f: impl FnOnce(&mut Inner) -> Result<T>) -> Result<T>;
    fn unlocked<R>(&mut self, f: impl FnOnce() -> R) -> R;
    /// Wait for a writeback completion.
    fn wait_writeback(&mut self, ino: u64) -> Result<()>;
    /// A pinned folio was released: wake writeback waiting for it.
    fn copied(&mut self);
}

impl Held for &mut Inner {
    fn step<T>(&mut self, f: impl FnOnce(&mut Inner) -> Result<T>) -> Result<T> {
        f(self)
    }
    fn unlocked<R>(&mut self, f: impl FnOnce() -> R) -> R {
        f()
    }
    fn wait_writeback(&mut self, ino: u64) -> Result<()> {
        Err(Error::Invalid(format!(
            "inode {ino} is under writeback while it is created"
        )))
    }
    fn copied(&mut self) {}
}

/// The metadata lock of a mounted file system, as `Fs::write` holds it.
pub(in crate::fs) struct Locked<'a> {
    pub g: MutexGuard<'a, Inner>,
    pub s: &'a Shared,
}

impl Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.g
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.g
    }
}

impl Held for Locked<'_> {
    #[inline]
    fn step<T>(&mut self, f: impl FnOnce(&mut Inner) -> Result<T>) -> Result<T> {
        self.g.guarded(f)
    }
    #[inline]
    fn unlocked<R>(&mut self, f: impl FnOnce() -> R) -> R {
        MutexGuard::unlocked(&mut self.g, f)
    }
    fn wait_writeback(&mut self, _ino: u64) -> Result<()> {
        self.s.wb_done.wait(&mut self.g);
        Ok(())
    }
    fn copied(&mut self) {
        self.s.wb_done.notify_all();
    }
}

/// How far a write may start from where the stream has reached and still
/// continue it. Through the mount, the kernel's writeback sends a file's
/// pages in order, but the requests in flight are handled by several ring
/// threads and finish out of order: 1 MiB writes of one file arrived up to
/// 10 MiB before or after the furthest one (W4). A writer jumping further
/// than this starts a new stream, and one rewriting blocks near the end
/// dirties no new bytes, so neither counts.
pub(in crate::fs) const STREAM_SLACK: u64 = 16 << 20;

/// Whether a write at `offset` continues a stream that has reached `end`.
fn continues_stream(end: u64, offset: u64) -> bool {
    offset.abs_diff(end) <= STREAM_SLACK
}

/// The buffered-write driver, the one loop: begin, then a step per folio
/// (copying, waiting or mapping memory as the step asks), then end.
/// Returns the bytes written and whether write-behind should be kicked.
/// `whole`: all of `data` or nothing for lack of space (`write_begin`).
#[inline]
pub(in crate::fs) fn drive<H: Held>(
    h: &mut H,
    ino: u64,
    offset: u64,
    data: &[u8],
    whole: bool,
) -> Result<(usize, bool)> {
    let mut w = h.step(|g| g.write_begin(ino, offset, data.len(), whole))?;
    loop {
        let src = &data[w.done..];
        let r = match h.step(|g| g.write_step(ino, &mut w, src)) {
            Ok(None) => break,
            Ok(Some(WriteStep::Copied)) => Ok(()),
            Ok(Some(WriteStep::Copy(c))) => {
                h.unlocked(|| c.copy_from(src));
                let r = h.write_copied(ino, &mut w, c);
                h.copied();
                r
            }
            Ok(Some(WriteStep::Wait)) => h.wait_writeback(ino),
            Ok(Some(WriteStep::Alloc(len))) => {
                w.spare = Some(h.unlocked(|| AlignedBuf::zeroed(len)));
                Ok(())
            }
            Err(e) => Err(e),
        };
        if let Err(e) = r {
            w.result = Err(e);
            break;
        }
    }
    h.step(|g| g.write_end(ino, w))
}

#[cfg(test)]
mod tests {
    use super::WriteStep;
    use crate::fs::quiet_test_fs;

    /// Writeback takes blocks while a write has let go of the lock between
    /// two of its steps: the later step must not count them as holes from
    /// the mapping looked up before (they are neither dirty nor
    /// preallocated any more), or their reservations outlive them; and
    /// the first step's blocks must already be in the dirty bytes that
    /// writeback takes them from.
    #[test]
    fn a_step_after_writeback_mapped_its_blocks_reserves_no_holes() {
        let fs = quiet_test_fs();
        let ino = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
        let bs = 4096u64;
        // Blocks 16..32 past EOF: dirty in the speculative range.
        fs.write(ino, 16 * bs, &[1; 16 * 4096]).unwrap();
        // A write over blocks 8..24, driven step by step: its first step
        // looks up the mapping of the whole write (nothing mapped yet).
        let src = vec![2u8; 16 * 4096];
        let mut g = fs.s.inner.lock();
        let mut w = g.write_begin(ino, 8 * bs, src.len(), false).unwrap();
        let mut steps = 0;
        loop {
            let done = w.done;
            match g.write_step(ino, &mut w, &src[done..]).unwrap() {
                Some(WriteStep::Copied) => {}
                Some(WriteStep::Copy(c)) => {
                    c.copy_from(&src[done..]);
                    g.write_copied(ino, &mut w, c).unwrap();
                }
                Some(WriteStep::Alloc(len)) => {
                    w.spare = Some(crate::device::AlignedBuf::zeroed(len));
                    continue;
                }
                Some(WriteStep::Wait) => panic!("nothing is under writeback"),
                None => break,
            }
            steps += 1;
            if steps == 1 {
                // Between the steps, with the lock let go: writeback maps
                // every dirty block, the speculative range among them.
                drop(g);
                fs.fsync(ino, true).unwrap();
                g = fs.s.inner.lock();
            }
        }
        assert!(steps >= 2, "the write took {steps} steps, not two or more");
        g.write_end(ino, w).unwrap();
        drop(g);
        fs.check_invariants().unwrap();
        // The dirty bytes count what is dirty, whichever step dirtied it
        // and whenever writeback took it: none once all is written back.
        fs.fsync(ino, true).unwrap();
        assert_eq!(fs.s.inner.lock().dirty_bytes, 0, "dirty bytes after fsync");
        fs.unmount().unwrap();
    }
}

//! The write-ahead journal of the metadata cache: group commit of the
//! running transaction (one sequential write and one flush for every
//! change since the last commit, whichever thread asked), checkpoint of
//! committed blocks to their homes, and replay after a crash.
//!
//! Durability order: journal images, commit block, flush; only then may a
//! checkpoint write the home copies; flush; only then does the superblock
//! move the tail past them.

use super::{write_superblock, Kind, Meta};
use crate::device::{AlignedBuf, Device};
use crate::error::{Error, Result};
use crate::format::superblock::Superblock;
use crate::format::{header, journal, magic};
use crate::geometry::Geometry;
use crate::runs::runs_by;
use parking_lot::{Condvar, Mutex};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(super) struct InFlight {
    seq: u64,
    /// (metadata block, index of its image in `buf`)
    blocks: Vec<(u64, usize)>,
    buf: Arc<AlignedBuf>,
    freed: Vec<(u64, u64)>,
    /// The write is followed by a flush: durable once it completes.
    flush: bool,
}

/// Completion state of the one journal write in flight. Waiting on it
/// needs no other lock, so the writer never needs the caller's lock to
/// finish.
#[derive(Default)]
pub struct JournalIo {
    state: Mutex<IoState>,
    cv: Condvar,
}

#[derive(Default)]
pub(super) struct IoState {
    busy: bool,
    done: Option<std::result::Result<(), String>>,
}

impl JournalIo {
    pub fn wait_idle(&self) {
        let mut st = self.state.lock();
        while st.busy {
            self.cv.wait(&mut st);
        }
    }
}

/// Counts data writes and flushes, so a flush is issued only when some
/// completed data write is not yet known to be durable.
#[derive(Default)]
pub struct DataFlush {
    /// Data writes completed (a generation number).
    written: AtomicU64,
    /// Every data write up to this generation has been flushed.
    flushed: AtomicU64,
    /// Flushes issued for data.
    flushes: AtomicU64,
}

impl DataFlush {
    /// A data write has completed (before its metadata joins a transaction).
    pub fn note_written(&self) {
        self.written.fetch_add(1, Ordering::SeqCst);
    }

    /// The generation of the data writes completed so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }

    /// Make every data write up to generation `upto` durable, flushing
    /// the device unless an earlier flush already covered them.
    pub fn flush_through(&self, upto: u64, dev: &dyn Device) -> std::io::Result<()> {
        if upto <= self.flushed.load(Ordering::SeqCst) {
            return Ok(());
        }
        // The flush also covers writes completed since `upto` was read.
        let now = self.written();
        dev.flush()?;
        self.flushes.fetch_add(1, Ordering::Relaxed);
        self.flushed.fetch_max(now, Ordering::SeqCst);
        Ok(())
    }

    /// Flushes issued for data writes so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Make every data write completed before this call durable.
    pub fn flush(&self, dev: &dyn Device) -> std::io::Result<()> {
        self.flush_through(self.written(), dev)
    }
}

/// A sealed transaction: its journal image and where it goes.
pub struct SealedTx {
    dev: Arc<dyn Device>,
    io: Arc<JournalIo>,
    buf: Arc<AlignedBuf>,
    seq: u64,
    /// Byte address of the journal area.
    at: u64,
    head_pos: u64,
    jlen: u64,
    bs: u64,
    /// Data writes its metadata may point at: flushed before the journal
    /// blocks are written.
    data_gen: u64,
    data_flush: Arc<DataFlush>,
    /// Flush after the write (a durable commit); without, the transaction
    /// is written but may still be lost, whole (its commit block checksums
    /// all of it), until a later flush.
    flush: bool,
}

impl SealedTx {
    /// Write the image (at most two runs: the log may wrap) and flush
    /// unless sealed without (`Meta::seal_with`).
    /// The outcome is picked up by `Meta::reap` / `Meta::wait_io`.
    pub fn write(self) {
        let r = (|| -> Result<()> {
            self.data_flush.flush_through(self.data_gen, &*self.dev)?;
            let total = self.buf.len() as u64 / self.bs;
            let first = (self.jlen - self.head_pos).min(total);
            let split = (first * self.bs) as usize;
            self.dev
                .write_at(&self.buf[..split], self.at + self.head_pos * self.bs)?;
            if first < total {
                self.dev.write_at(&self.buf[split..], self.at)?;
            }
            if self.flush {
                self.dev.flush()?;
            }
            Ok(())
        })();
        let mut st = self.io.state.lock();
        st.busy = false;
        st.done = Some(r.map_err(|e| format!("transaction {}: {e}", self.seq)));
        self.io.cv.notify_all();
    }
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct JournalStats {
    pub commits: u64,
    /// Commits written without a flush (direct overwrites that need only
    /// their data on the device); a later flush makes them durable.
    pub commits_unflushed: u64,
    /// Flushes issued for the journal: commits, checkpoints, and flushes
    /// that made unflushed commits durable.
    pub flushes: u64,
    /// Flushes issued for data written in place before the metadata
    /// pointing at it (`DataFlush`), and by fdatasync of such data.
    pub data_flushes: u64,
    pub blocks_logged: u64,
    /// Data blocks logged by overwrites (images put in a transaction).
    pub data_blocks_logged: u64,
    pub checkpoints: u64,
    /// Checkpoints forced because the log had no room for a commit.
    pub checkpoint_stalls: u64,
    pub blocks_checkpointed: u64,
    /// Logged data blocks written home by checkpoints, and the writes
    /// that did it (sorted, contiguous runs).
    pub data_home_blocks: u64,
    pub data_home_writes: u64,
    pub replayed_transactions: u64,
}

impl Meta {
    pub fn running_blocks(&self) -> usize {
        self.running.len()
    }

    pub fn journal_used(&self) -> u64 {
        let j = self.geo.journal_blocks;
        (self.head_pos + j - self.sb.tail_pos) % j
    }

    pub fn journal_free(&self) -> u64 {
        self.geo.journal_blocks - 1 - self.journal_used()
    }

    pub fn seq(&self) -> u64 {
        self.head_seq
    }

    /// Blocks a transaction of `n` metadata blocks takes in the journal.
    pub(super) fn tx_len(&self, n: usize) -> u64 {
        let per = journal::targets_per_desc(self.geo.block_size as usize);
        (n.div_ceil(per) + n + 1) as u64
    }

    /// Largest number of metadata blocks one transaction may hold; the
    /// engine commits at operation boundaries long before this.
    pub fn max_tx_blocks(&self) -> usize {
        (self.geo.journal_blocks / 2) as usize
    }

    /// Write the running transaction to the journal and flush, holding the
    /// caller's lock throughout (group commit across threads goes through
    /// `seal` / `SealedTx::write` / `reap` instead).
    pub fn commit(&mut self) -> Result<()> {
        if let Some(tx) = self.seal()? {
            tx.write();
        }
        self.wait_io()
    }

    /// Seal the running transaction into a journal image and reserve its
    /// place in the log. The caller writes it (`SealedTx::write`), usually
    /// without holding the lock around `Meta`, and the next `reap` or
    /// `wait_io` completes it. One sealed transaction is in flight at a
    /// time; sealing waits for the previous one.
    pub fn seal(&mut self) -> Result<Option<SealedTx>> {
        self.seal_with(true)
    }

    /// `seal`, with or without the flush after the write: a transaction
    /// written without one is in the log (`written_seq`) but not durable
    /// (`done_seq`) until some later flush.
    pub fn seal_with(&mut self, flush: bool) -> Result<Option<SealedTx>> {
        self.wait_io()?;
        self.check_live()?;
        if self.running.is_empty() {
            self.freed_committed.append(&mut self.freed_running);
            return Ok(None);
        }
        let blocks: Vec<u64> = self.running.iter().copied().collect();
        let need = self.tx_len(blocks.len());
        if need > self.geo.journal_blocks - 1 {
            return Err(self.poison(format!(
                "transaction of {} blocks does not fit the {}-block journal",
                blocks.len(),
                self.geo.journal_blocks
            )));
        }
        if need > self.journal_free() {
            self.stats.checkpoint_stalls += 1;
            self.checkpoint()?;
        }
        let (buf, offsets) = self.build_transaction(&blocks);
        let buf = Arc::new(buf);
        let tx = SealedTx {
            dev: self.dev.clone(),
            io: self.io.clone(),
            buf: buf.clone(),
            seq: self.head_seq,
            at: self.geo.journal_start * self.geo.block_size,
            head_pos: self.head_pos,
            jlen: self.geo.journal_blocks,
            bs: self.geo.block_size,
            data_gen: self.data_flush.written(),
            data_flush: self.data_flush.clone(),
            flush,
        };
        let total = self.tx_len(blocks.len());
        self.head_pos = (self.head_pos + total) % self.geo.journal_blocks;
        self.head_seq += 1;
        for b in &blocks {
            self.sealed_set.insert(*b);
        }
        self.sealed = Some(InFlight {
            seq: tx.seq,
            blocks: blocks.into_iter().zip(offsets).collect(),
            buf,
            freed: std::mem::take(&mut self.freed_running),
            flush,
        });
        self.running.clear();
        self.running_data = 0;
        self.io.state.lock().busy = true;
        Ok(Some(tx))
    }

    /// Complete the sealed transaction if its write has finished.
    pub fn reap(&mut self) -> Result<()> {
        let done = self.io.state.lock().done.take();
        match done {
            Some(r) => self.finish(r),
            None => Ok(()),
        }
    }

    /// Wait for the sealed transaction's write and complete it.
    pub fn wait_io(&mut self) -> Result<()> {
        self.io.wait_idle();
        self.reap()
    }

    pub(super) fn finish(&mut self, r: std::result::Result<(), String>) -> Result<()> {
        let Some(tx) = self.sealed.take() else {
            return Ok(());
        };
        if let Err(e) = r {
            return Err(self.poison(format!("journal commit failed: {e}")));
        }
        let bs = self.geo.block_size as usize;
        self.stats.commits += 1;
        if tx.flush {
            self.stats.flushes += 1;
        } else {
            self.stats.commits_unflushed += 1;
        }
        self.stats.blocks_logged += tx.blocks.len() as u64;
        for (b, off) in tx.blocks {
            self.sealed_set.remove(&b);
            if self.running.contains(&b) || !self.cache.contains_key(&b) {
                // Changed again (or dropped) since sealing: the committed
                // image is the one in the journal buffer.
                let mut img = AlignedBuf::zeroed(bs);
                img.copy_from_slice(&tx.buf[off * bs..(off + 1) * bs]);
                self.frozen.insert(b, img);
            } else {
                self.frozen.remove(&b);
            }
            self.checkpoint.insert(b);
        }
        // The free is durable now. Blocks no journaled image can be
        // replayed over (data blocks, mostly) are reusable at once; the
        // rest wait for the checkpoint that retires their images.
        for (start, len) in tx.freed {
            let end = start + len;
            let imaged = self.checkpoint.range(start..end).next().is_some()
                || self.sealed_set.range(start..end).next().is_some()
                || self.running.range(start..end).next().is_some();
            if imaged {
                self.freed_committed.push((start, len));
            } else {
                self.freed_reusable.push((start, len));
            }
        }
        self.written_seq = tx.seq + 1;
        if tx.flush {
            self.done_seq = tx.seq + 1;
        }
        Ok(())
    }

    /// Every transaction with a sequence number below this is durable.
    pub fn done_seq(&self) -> u64 {
        self.done_seq
    }

    /// Every transaction with a sequence number below this is written to
    /// the log (durable or not).
    pub fn written_seq(&self) -> u64 {
        self.written_seq
    }

    /// A flush issued after `written_seq` read `upto` made those
    /// transactions durable.
    pub fn mark_durable(&mut self, upto: u64) {
        self.stats.flushes += 1;
        self.done_seq = self.done_seq.max(upto);
    }

    /// Changes made now go into the transaction with this number.
    pub fn running_seq(&self) -> u64 {
        self.head_seq
    }

    pub fn has_running(&self) -> bool {
        !self.running.is_empty()
    }

    pub fn io_busy(&self) -> bool {
        self.io.state.lock().busy
    }

    pub fn journal_io(&self) -> Arc<JournalIo> {
        self.io.clone()
    }

    /// Data writes and the flushes that made them durable: the next
    /// commit flushes the device before writing its journal blocks when a
    /// data write completed since the last flush, so metadata that points
    /// at the data (checksums, written extents, sizes) is never durable
    /// before the data is.
    pub fn data_flush(&self) -> &Arc<DataFlush> {
        &self.data_flush
    }

    /// Lay out the journal image of a transaction: descriptors, block
    /// images, commit block. Returns the image and each block's index in it.
    pub(super) fn build_transaction(&mut self, blocks: &[u64]) -> (AlignedBuf, Vec<usize>) {
        let bs = self.geo.block_size as usize;
        let seq = self.head_seq;
        let per = journal::targets_per_desc(bs);
        let jstart = self.geo.journal_start;
        let jlen = self.geo.journal_blocks;
        let total = self.tx_len(blocks.len()) as usize;
        let mut out = AlignedBuf::zeroed(total * bs);
        let mut offsets = Vec::with_capacity(blocks.len());
        let mut pos = self.head_pos;
        let mut i = 0; // block index within `out`
        let mut targets = Vec::with_capacity(per);
        for (ci, chunk) in blocks.chunks(per).enumerate() {
            let last = (ci + 1) * per >= blocks.len();
            let (di, dpos) = (i, pos);
            i += 1;
            pos = (pos + 1) % jlen;
            targets.clear();
            for b in chunk {
                let c = self.cache.get_mut(b).expect("running block not cached");
                if c.kind == Kind::Header {
                    header::stamp_lsn(&mut c.data, seq);
                }
                if c.kind == Kind::Data {
                    targets.push(b | journal::DATA_TARGET);
                } else {
                    targets.push(*b);
                }
                out[i * bs..(i + 1) * bs].copy_from_slice(&c.data);
                offsets.push(i);
                i += 1;
                pos = (pos + 1) % jlen;
            }
            let desc = &mut out[di * bs..(di + 1) * bs];
            journal::encode_desc(desc, jstart + dpos, self.uuid, seq, &targets, last);
        }
        let nblocks = (total - 1) as u32;
        // Every descriptor and image, in journal order.
        let crc = crc32c::crc32c(&out[..(total - 1) * bs]);
        journal::encode_commit(
            &mut out[i * bs..(i + 1) * bs],
            jstart + pos,
            self.uuid,
            seq,
            nblocks,
            crc,
        );
        (out, offsets)
    }

    /// Write every committed block home, then move the journal tail to the
    /// head. The extents freed by committed transactions are now safe to
    /// reuse (`freed_reusable`).
    pub fn checkpoint(&mut self) -> Result<()> {
        self.wait_io()?;
        self.check_live()?;
        let blocks: Vec<u64> = self.checkpoint.iter().copied().collect();
        let bs = self.geo.block_size as usize;
        let (mut home_blocks, mut home_writes) = (0u64, 0u64);
        let r: Result<()> = (|| {
            // Nothing goes home before its transaction is durable.
            if self.written_seq > self.done_seq {
                self.dev.flush()?;
                self.mark_durable(self.written_seq);
            }
            // Up to 256 consecutive blocks a write.
            for Range { start: i, end: j } in runs_by(&blocks, 256, |a, b| *b == a + 1) {
                let mut buf = AlignedBuf::zeroed((j - i) * bs);
                let data = blocks[i..j]
                    .iter()
                    .filter(|b| self.logged.contains(b))
                    .count();
                if data > 0 {
                    home_blocks += data as u64;
                    home_writes += 1;
                }
                for (k, b) in blocks[i..j].iter().enumerate() {
                    let img: &[u8] = match self.frozen.get(b) {
                        Some(f) => f,
                        None => &self.cache[b].data,
                    };
                    buf[k * bs..(k + 1) * bs].copy_from_slice(img);
                }
                self.dev.write_at(&buf, blocks[i] * bs as u64)?;
            }
            self.dev.flush()?;
            let mut sb = self.sb.clone();
            sb.tail_pos = self.head_pos;
            sb.tail_seq = self.head_seq;
            write_superblock(&*self.dev, &mut sb)?;
            self.sb = sb;
            Ok(())
        })();
        if let Err(e) = r {
            return Err(self.poison(format!("checkpoint failed: {e}")));
        }
        self.stats.checkpoints += 1;
        // Its own and the superblock's.
        self.stats.flushes += 2;
        self.stats.blocks_checkpointed += blocks.len() as u64;
        self.stats.data_home_blocks += home_blocks;
        self.stats.data_home_writes += home_writes;
        // Logged data now home leaves the cache, unless changed again
        // since (the running transaction has a newer image).
        for b in &blocks {
            if !self.running.contains(b) && self.logged.remove(b) {
                self.cache.remove(b);
            }
        }
        self.checkpoint.clear();
        self.frozen.clear();
        self.freed_reusable.append(&mut self.freed_committed);
        Ok(())
    }

    /// Write the superblock with the clean flag set or cleared (at unmount
    /// or at mount).
    pub fn set_clean(&mut self, clean: bool) -> Result<()> {
        let mut sb = self.sb.clone();
        if clean {
            sb.flags |= crate::format::superblock::FLAG_CLEAN;
        } else {
            sb.flags &= !crate::format::superblock::FLAG_CLEAN;
        }
        write_superblock(&*self.dev, &mut sb)?;
        self.sb = sb;
        Ok(())
    }
}

/// Replay committed transactions from the superblock's tail. Returns the
/// number of transactions applied; the superblock's tail is moved past them.
pub fn replay(dev: &dyn Device, sb: &mut Superblock) -> Result<u64> {
    let geo = Geometry::new(sb);
    let bs = geo.block_size as usize;
    let jstart = geo.journal_start;
    let jlen = geo.journal_blocks;
    let mut pos = sb.tail_pos;
    let mut seq = sb.tail_seq;
    let mut applied = 0u64;
    let read = |p: u64| -> Result<AlignedBuf> {
        let mut b = AlignedBuf::zeroed(bs);
        dev.read_at(&mut b, (jstart + p) * bs as u64)?;
        Ok(b)
    };
    'tx: loop {
        let mut p = pos;
        let mut crc = 0u32;
        let mut images: Vec<(u64, AlignedBuf)> = Vec::new();
        let mut count = 0u32;
        loop {
            let d = read(p)?;
            let ok = header::verify(
                &d,
                "journal descriptor",
                magic::JOURNAL_DESC,
                jstart + p,
                &sb.uuid,
            );
            if !matches!(ok, Ok(h) if h.lsn == seq) {
                break 'tx;
            }
            let Some((targets, last)) = journal::decode_desc(&d) else {
                break 'tx;
            };
            crc = crc32c::crc32c_append(crc, &d);
            count += 1;
            p = (p + 1) % jlen;
            for t in targets {
                let t = t & !journal::DATA_TARGET;
                if t >= geo.total_blocks || (t >= jstart && t < jstart + jlen) || t < 2 {
                    return Err(Error::corrupted(
                        "journal descriptor",
                        jstart + pos,
                        format!("transaction {seq} targets block {t}, outside the metadata area"),
                    ));
                }
                let img = read(p)?;
                crc = crc32c::crc32c_append(crc, &img);
                count += 1;
                p = (p + 1) % jlen;
                images.push((t, img));
                if count as u64 >= jlen {
                    break 'tx;
                }
            }
            if last {
                break;
            }
        }
        let c = read(p)?;
        match header::verify(
            &c,
            "journal commit",
            magic::JOURNAL_COMMIT,
            jstart + p,
            &sb.uuid,
        ) {
            Ok(h) if h.lsn == seq && journal::decode_commit(&c) == (count, crc) => {}
            _ => break 'tx,
        }
        for (t, img) in &images {
            dev.write_at(img, t * bs as u64)?;
        }
        applied += 1;
        pos = (p + 1) % jlen;
        seq += 1;
    }
    if applied > 0 || pos != sb.tail_pos {
        dev.flush()?;
        sb.tail_pos = pos;
        sb.tail_seq = seq;
        write_superblock(dev, sb)?;
    }
    Ok(applied)
}

//! The write-ahead journal of the metadata cache: group commit of the
//! running transaction (one sequential write and one flush for every
//! change since the last commit, whichever thread asked), checkpoint of
//! committed blocks to their homes, and replay after a crash.
//!
//! Durability order: journal images, commit block, flush; only then may a
//! checkpoint write the home copies; flush; only then does the superblock
//! move the tail past them.

use super::{write_superblock, Kind, Meta};
use crate::device::{AlignedBuf, Device, OverlayDevice};
use crate::error::{Error, Result};
use crate::format::superblock::Superblock;
use crate::format::{csum, data_crc, header, journal, magic};
use crate::geometry::Geometry;
use crate::runs::runs_by;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(super) struct InFlight {
    seq: u64,
    /// Metadata blocks and their images as sealed (shared with the
    /// cache until it changes them again, and with the write).
    blocks: Vec<(u64, Arc<AlignedBuf>)>,
    /// Checksum blocks left out of the image (their changes are implied
    /// by the data in it), with their contents as sealed.
    implied: Vec<(u64, Arc<AlignedBuf>)>,
    freed: Vec<(u64, u64)>,
    /// The write is followed by a flush: durable once it completes.
    flush: bool,
}

/// Most transactions written at once: their log writes go to the device
/// side by side (a direct overwrite waits for its own), completed in order.
pub const MAX_IN_FLIGHT: usize = 8;

/// Completion state of the journal writes in flight. Waiting on it needs
/// no other lock, so a writer never needs the caller's lock to finish.
/// Lock order: last, under the metadata lock; `state` is held only for
/// its own fields.
#[derive(Default)]
pub struct JournalIo {
    state: Mutex<IoState>,
    cv: Condvar,
}

#[derive(Default)]
pub(super) struct IoState {
    /// Sealed transactions whose write has not completed.
    pending: BTreeSet<u64>,
    /// Outcomes of completed writes, not yet reaped.
    done: BTreeMap<u64, std::result::Result<(), String>>,
    /// Completions so far.
    completions: u64,
}

impl JournalIo {
    /// Wait until no journal write is in flight.
    pub fn wait_idle(&self) {
        let mut st = self.state.lock();
        while !st.pending.is_empty() {
            self.cv.wait(&mut st);
        }
    }

    /// Completions so far: a ticket for `wait_after`.
    pub fn completions(&self) -> u64 {
        self.state.lock().completions
    }

    /// Wait until a write completes after `ticket` was taken (at once if
    /// one has, or none is in flight).
    pub fn wait_after(&self, ticket: u64) {
        let mut st = self.state.lock();
        while st.completions == ticket && !st.pending.is_empty() {
            self.cv.wait(&mut st);
        }
    }

    /// Transaction `seq`'s own write has completed without an error (and
    /// is not reaped yet: `Meta::written_seq` counts those).
    pub fn written_ok(&self, seq: u64) -> bool {
        matches!(self.state.lock().done.get(&seq), Some(Ok(())))
    }

    /// Wait until every transaction before `seq` is written (a flush then
    /// covers them).
    fn wait_before(&self, seq: u64) {
        let mut st = self.state.lock();
        while st.pending.range(..seq).next().is_some() {
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
    /// The journal image, a block each: descriptors and commit block,
    /// and the blocks' images shared with the cache (nothing is copied:
    /// one vectored write takes them where they lie).
    parts: Vec<Arc<AlignedBuf>>,
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
            let first = ((self.jlen - self.head_pos) as usize).min(self.parts.len());
            self.write_run(&self.parts[..first], self.at + self.head_pos * self.bs)?;
            if first < self.parts.len() {
                self.write_run(&self.parts[first..], self.at)?;
            }
            if self.flush {
                // The flush makes this transaction durable only if every
                // one before it is written too.
                self.io.wait_before(self.seq);
                self.dev.flush()?;
            }
            Ok(())
        })();
        let mut st = self.io.state.lock();
        st.pending.remove(&self.seq);
        st.done.insert(
            self.seq,
            r.map_err(|e| format!("transaction {}: {e}", self.seq)),
        );
        st.completions += 1;
        self.io.cv.notify_all();
    }

    /// Write `parts` one after another from byte `at` (one vectored
    /// write; the device splits it at the kernel's iovec limit).
    fn write_run(&self, parts: &[Arc<AlignedBuf>], at: u64) -> std::io::Result<()> {
        let bufs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        self.dev.write_vectored_at(&bufs, at)
    }
}

/// The crc32c of `blocks`, one after another.
fn crc_of(blocks: &[Arc<AlignedBuf>]) -> u32 {
    blocks
        .iter()
        .fold(0, |crc, b| crc32c::crc32c_append(crc, b))
}

#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct JournalStats {
    pub commits: u64,
    /// Commits written without a flush (direct overwrites that need only
    /// their data on the device); a later flush makes them durable.
    pub commits_unflushed: u64,
    /// Flushes issued for the journal: commits, checkpoints, and flushes
    /// that made unflushed commits durable; of them, the checkpoints'.
    pub flushes: u64,
    pub checkpoint_flushes: u64,
    /// Flushes issued for data written in place before the metadata
    /// pointing at it (`DataFlush`), and by fdatasync of such data.
    pub data_flushes: u64,
    pub blocks_logged: u64,
    /// Checksum blocks whose changes a transaction left to replay to
    /// derive from its logged data instead of imaging them.
    pub csum_blocks_implied: u64,
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
    /// Log fill when read: blocks between tail and head, of the log's.
    pub log_used_blocks: u64,
    pub log_blocks: u64,
    /// Metadata blocks read from the device (the metadata cache's
    /// misses), and the cache's eviction scans.
    pub meta_reads: u64,
    pub meta_evict_scans: u64,
}

/// A checkpoint's writes, done without the metadata lock.
pub struct CheckpointJob {
    dev: Arc<dyn Device>,
    bs: u64,
    /// (first home block, images of consecutive blocks) in block order;
    /// the images are shared with the cache (copied on its next change).
    runs: Vec<(u64, Vec<Arc<AlignedBuf>>)>,
    /// Some transaction is written but not flushed: flush before any
    /// home write.
    flush_first: bool,
    /// The superblock with the new tail.
    sb: Superblock,
    io: Arc<CheckpointIo>,
    ran: bool,
}

/// A job dropped without running (its thread did not start) ends its
/// checkpoint with an error instead of leaving it pending for ever.
impl Drop for CheckpointJob {
    fn drop(&mut self) {
        if !self.ran {
            self.io
                .finish(Err("the checkpoint's writes never ran".into()));
        }
    }
}

impl CheckpointJob {
    /// Write the images home (several writes at once when there are many),
    /// flush, then write the superblock with the new tail.
    pub fn run(mut self) {
        let r = (|| -> Result<Superblock> {
            if self.flush_first {
                self.dev.flush()?;
            }
            let lanes = self.runs.len().div_ceil(64).clamp(1, 8);
            let per = self.runs.len().div_ceil(lanes).max(1);
            let (dev, bs) = (&self.dev, self.bs);
            std::thread::scope(|sc| -> Result<()> {
                let lanes: Vec<_> = self
                    .runs
                    .chunks(per)
                    .map(|chunk| {
                        sc.spawn(move || -> std::io::Result<()> {
                            for (blk, imgs) in chunk {
                                // One gathered write per run, no copy.
                                let bufs: Vec<&[u8]> = imgs.iter().map(|i| &i[..]).collect();
                                dev.write_vectored_at(&bufs, blk * bs)?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                for l in lanes {
                    l.join().expect("checkpoint writer panicked")?;
                }
                Ok(())
            })?;
            self.dev.flush()?;
            write_superblock(&*self.dev, &mut self.sb)?;
            Ok(self.sb.clone())
        })();
        self.ran = true;
        self.io.finish(r.map_err(|e| e.to_string()));
    }
}

/// Completion of a checkpoint's writes. Lock order: last, like
/// `JournalIo`'s.
#[derive(Default)]
pub(super) struct CheckpointIo {
    done: Mutex<Option<std::result::Result<Superblock, String>>>,
    cv: Condvar,
}

impl CheckpointIo {
    fn finish(&self, r: std::result::Result<Superblock, String>) {
        *self.done.lock() = Some(r);
        self.cv.notify_all();
    }

    fn is_done(&self) -> bool {
        self.done.lock().is_some()
    }

    fn wait(&self) {
        let mut d = self.done.lock();
        while d.is_none() {
            self.cv.wait(&mut d);
        }
    }

    fn take(&self) -> std::result::Result<Superblock, String> {
        self.wait();
        self.done.lock().take().expect("waited")
    }
}

/// What a checkpoint in progress will retire when its writes are done.
pub(super) struct CheckpointState {
    /// It covers every transaction below this.
    upto_seq: u64,
    /// Transactions below this were written unflushed; its first flush
    /// made them durable.
    unflushed: Option<u64>,
    /// How many of `freed_committed` (the oldest) it makes reusable.
    freed: usize,
    blocks: u64,
    home_blocks: u64,
    home_writes: u64,
    io: Arc<CheckpointIo>,
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
        if n <= per {
            // One descriptor, which is also the commit.
            return (n + 1) as u64;
        }
        (n.div_ceil(per) + n + 1) as u64
    }

    /// The running transaction's blocks to image, and the checksum blocks
    /// it may leave out: those changed only by the checksums of data it
    /// logs, when the live log already holds an image of them that replay
    /// will apply first. "Live" counts from where the tail will be once a
    /// checkpoint in progress is done.
    fn tx_blocks(&self) -> (Vec<u64>, Vec<u64>) {
        let from = self.cp.as_ref().map_or(self.sb.tail_seq, |c| c.upto_seq);
        // The two sets are disjoint (`Meta::write` moves a block over).
        let mut blocks: Vec<u64> = self.running.iter().copied().collect();
        let mut implied = Vec::new();
        for b in &self.running_implied {
            if self.imaged_at.get(b).is_some_and(|s| *s >= from) {
                implied.push(*b);
            } else {
                blocks.push(*b);
            }
        }
        (blocks, implied)
    }

    /// The running transaction holds more than a quarter of the journal:
    /// long work commits at its next boundary, so that no transaction
    /// outgrows the journal.
    pub fn tx_filling(&self) -> bool {
        self.running_blocks() as u64 > self.geo.journal_blocks / 4
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
    /// `wait_io` completes it. Up to `MAX_IN_FLIGHT` sealed transactions
    /// are written at once; sealing one more waits for the oldest.
    pub fn seal(&mut self) -> Result<Option<SealedTx>> {
        self.seal_with(true)
    }

    /// `seal`, with or without the flush after the write: a transaction
    /// written without one is in the log (`written_seq`) but not durable
    /// (`done_seq`) until some later flush.
    pub fn seal_with(&mut self, flush: bool) -> Result<Option<SealedTx>> {
        loop {
            // The ticket first: a write completing after it wakes the wait.
            let ticket = self.io.completions();
            self.reap()?;
            if self.sealed.len() < MAX_IN_FLIGHT {
                break;
            }
            self.io.wait_after(ticket);
        }
        self.check_live()?;
        if self.running.is_empty() {
            self.running.append(&mut self.running_implied);
        }
        if self.running.is_empty() {
            self.freed_committed.append(&mut self.freed_running);
            return Ok(None);
        }
        let (mut blocks, mut implied) = self.tx_blocks();
        let need = self.tx_len(blocks.len());
        if need > self.journal_free() {
            self.stats.checkpoint_stalls += 1;
            self.checkpoint()?;
            // The log is empty now: no image left for replay to start from.
            (blocks, implied) = self.tx_blocks();
        }
        if self.tx_len(blocks.len()) > self.geo.journal_blocks - 1 {
            return Err(self.poison(format!(
                "transaction of {} blocks does not fit the {}-block journal",
                blocks.len(),
                self.geo.journal_blocks
            )));
        }
        let seq = self.head_seq;
        for b in &blocks {
            if self.geo.is_csum_block(*b) {
                self.imaged_at.insert(*b, seq);
            }
        }
        let implied: Vec<(u64, Arc<AlignedBuf>)> = implied
            .into_iter()
            .map(|b| {
                let c = self.cache.get_mut(&b).expect("running block not cached");
                header::stamp_lsn(c.bytes_mut(), seq);
                (b, c.data.clone())
            })
            .collect();
        self.stats.csum_blocks_implied += implied.len() as u64;
        let (parts, images) = self.build_transaction(&blocks);
        let tx = SealedTx {
            dev: self.dev.clone(),
            io: self.io.clone(),
            parts,
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
        for b in blocks.iter().chain(implied.iter().map(|(b, _)| b)) {
            *self.sealed_set.entry(*b).or_default() += 1;
        }
        self.sealed.push_back(InFlight {
            seq: tx.seq,
            blocks: blocks.into_iter().zip(images).collect(),
            implied,
            freed: std::mem::take(&mut self.freed_running),
            flush,
        });
        self.running.clear();
        self.running_implied.clear();
        self.running_data = 0;
        self.io.state.lock().pending.insert(tx.seq);
        Ok(Some(tx))
    }

    /// Complete the sealed transactions whose writes have finished, in
    /// order (one still being written holds back those after it).
    pub fn reap(&mut self) -> Result<()> {
        self.checkpoint_reap()?;
        while let Some(seq) = self.sealed.front().map(|t| t.seq) {
            let Some(r) = self.io.state.lock().done.remove(&seq) else {
                return Ok(());
            };
            self.finish(r)?;
        }
        Ok(())
    }

    /// Wait for every sealed transaction's write and complete them.
    pub fn wait_io(&mut self) -> Result<()> {
        self.io.wait_idle();
        self.reap()
    }

    /// Complete the oldest sealed transaction, whose write gave `r`.
    pub(super) fn finish(&mut self, r: std::result::Result<(), String>) -> Result<()> {
        let Some(tx) = self.sealed.pop_front() else {
            return Ok(());
        };
        if let Err(e) = r {
            return Err(self.poison(format!("journal commit failed: {e}")));
        }
        self.stats.commits += 1;
        if tx.flush {
            self.stats.flushes += 1;
        } else {
            self.stats.commits_unflushed += 1;
        }
        self.stats.blocks_logged += tx.blocks.len() as u64;
        for (b, img) in tx.blocks {
            self.committed(b, tx.seq, || img);
        }
        for (b, img) in tx.implied {
            self.committed(b, tx.seq, || img);
        }
        // The free is durable now. Blocks no journaled image can be
        // replayed over (data blocks, mostly) are reusable at once; the
        // rest wait for the checkpoint that retires their images.
        for (start, len) in tx.freed {
            let end = start + len;
            let imaged = self.checkpoint.range(start..end).next().is_some()
                || self.sealed_set.range(start..end).next().is_some()
                || self.running.range(start..end).next().is_some();
            // A transaction written without a flush is not durable yet:
            // its frees wait for the checkpoint (which flushes first).
            if imaged || !tx.flush {
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

    /// Block `b` of transaction `seq` is in the log: it waits for a
    /// checkpoint. Changed again (or dropped) since sealing, perhaps
    /// sealed again, it keeps its committed image (`img`: the one in the
    /// journal buffer, or, left out of it, the one taken at sealing).
    fn committed(&mut self, b: u64, seq: u64, img: impl FnOnce() -> Arc<AlignedBuf>) {
        let later = match self.sealed_set.get_mut(&b) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            _ => {
                self.sealed_set.remove(&b);
                false
            }
        };
        if later
            || self.running.contains(&b)
            || self.running_implied.contains(&b)
            || !self.cache.contains_key(&b)
        {
            self.frozen.insert(b, img());
        } else {
            self.frozen.remove(&b);
        }
        self.checkpoint.insert(b, seq);
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
        self.done_seq = self.done_seq.max(upto);
    }

    /// Changes made now go into the transaction with this number.
    pub fn running_seq(&self) -> u64 {
        self.head_seq
    }

    pub fn has_running(&self) -> bool {
        !self.running.is_empty()
    }

    /// Sealed transactions not yet completed.
    pub fn in_flight(&self) -> usize {
        self.sealed.len()
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
    /// images, commit block, a block each. Returns the image and each
    /// block's image (shared with the cache, not copied).
    pub(super) fn build_transaction(
        &mut self,
        blocks: &[u64],
    ) -> (Vec<Arc<AlignedBuf>>, Vec<Arc<AlignedBuf>>) {
        let bs = self.geo.block_size as usize;
        let seq = self.head_seq;
        let per = journal::targets_per_desc(bs);
        let jstart = self.geo.journal_start;
        let jlen = self.geo.journal_blocks;
        let mut parts = Vec::with_capacity(self.tx_len(blocks.len()) as usize);
        let mut images = Vec::with_capacity(blocks.len());
        let mut pos = self.head_pos;
        let mut targets = Vec::with_capacity(per);
        // One descriptor commits its images itself.
        let single = blocks.len() <= per;
        for (ci, chunk) in blocks.chunks(per).enumerate() {
            let last = (ci + 1) * per >= blocks.len();
            targets.clear();
            for b in chunk {
                let c = self.cache.get_mut(b).expect("running block not cached");
                if c.kind == Kind::Header {
                    header::stamp_lsn(c.bytes_mut(), seq);
                }
                if c.kind == Kind::Data {
                    targets.push(b | journal::DATA_TARGET);
                } else {
                    targets.push(*b);
                }
                images.push(c.data.clone());
            }
            let end = match (single, last) {
                (true, _) => journal::DescEnd::Committed(crc_of(&images)),
                (false, true) => journal::DescEnd::Last,
                (false, false) => journal::DescEnd::More,
            };
            let mut desc = AlignedBuf::for_overwrite(bs);
            journal::encode_desc(&mut desc, jstart + pos, self.uuid, seq, &targets, end);
            parts.push(Arc::new(desc));
            parts.extend_from_slice(&images[images.len() - chunk.len()..]);
            pos = (pos + 1 + chunk.len() as u64) % jlen;
        }
        if single {
            return (parts, images);
        }
        let nblocks = parts.len() as u32;
        // Every descriptor and image, in journal order.
        let mut commit = AlignedBuf::for_overwrite(bs);
        journal::encode_commit(
            &mut commit,
            jstart + pos,
            self.uuid,
            seq,
            nblocks,
            crc_of(&parts),
        );
        parts.push(Arc::new(commit));
        (parts, images)
    }

    /// Write every committed block home, then move the journal tail to the
    /// head, holding the caller's lock throughout (a background checkpoint
    /// in progress is waited for first). The extents freed by committed
    /// transactions are now safe to reuse (`freed_reusable`).
    pub fn checkpoint(&mut self) -> Result<()> {
        self.checkpoint_wait()?;
        self.wait_io()?;
        self.check_live()?;
        let (job, st) = self.checkpoint_prepare();
        job.run();
        self.checkpoint_reap_state(st)
    }

    /// Start a checkpoint of everything committed so far whose writes run
    /// without the caller's lock (`CheckpointJob::run`, on a thread of its
    /// own); writers go on filling the log meanwhile, and the next `reap`
    /// after the job is done moves the tail. None when one is already in
    /// progress or nothing is committed.
    pub fn checkpoint_begin(&mut self) -> Result<Option<CheckpointJob>> {
        self.checkpoint_reap()?;
        if self.cp.is_some() || self.checkpoint.is_empty() {
            return Ok(None);
        }
        self.wait_io()?;
        self.check_live()?;
        let (job, st) = self.checkpoint_prepare();
        self.cp = Some(st);
        Ok(Some(job))
    }

    /// Complete a background checkpoint whose writes are done.
    pub fn checkpoint_reap(&mut self) -> Result<()> {
        if self.cp.as_ref().is_some_and(|st| st.io.is_done()) {
            let st = self.cp.take().expect("checked");
            self.checkpoint_reap_state(st)?;
        }
        Ok(())
    }

    /// Wait for a background checkpoint's writes and complete it.
    fn checkpoint_wait(&mut self) -> Result<()> {
        if let Some(st) = self.cp.take() {
            st.io.wait();
            self.checkpoint_reap_state(st)?;
        }
        Ok(())
    }

    /// Lay out a checkpoint of every block committed so far (no
    /// transaction in flight): the home writes, sorted, up to 256
    /// consecutive blocks a write, and the superblock after.
    fn checkpoint_prepare(&mut self) -> (CheckpointJob, CheckpointState) {
        let blocks: Vec<u64> = self.checkpoint.keys().copied().collect();
        let bs = self.geo.block_size as usize;
        let (mut home_blocks, mut home_writes) = (0u64, 0u64);
        let mut runs = Vec::new();
        for Range { start: i, end: j } in runs_by(&blocks, 256, |a, b| *b == a + 1) {
            let data = blocks[i..j]
                .iter()
                .filter(|b| self.logged.contains(b))
                .count();
            if data > 0 {
                home_blocks += data as u64;
                home_writes += 1;
            }
            let imgs = blocks[i..j]
                .iter()
                .map(|b| match self.frozen.get(b) {
                    Some(f) => f.clone(),
                    None => self.cache[b].data.clone(),
                })
                .collect();
            runs.push((blocks[i], imgs));
        }
        let mut sb = self.sb.clone();
        sb.tail_pos = self.head_pos;
        sb.tail_seq = self.head_seq;
        let io = Arc::new(CheckpointIo::default());
        // Nothing goes home before its transaction is durable.
        let unflushed = (self.written_seq > self.done_seq).then_some(self.written_seq);
        let job = CheckpointJob {
            dev: self.dev.clone(),
            bs: bs as u64,
            runs,
            flush_first: unflushed.is_some(),
            sb,
            io: io.clone(),
            ran: false,
        };
        let st = CheckpointState {
            upto_seq: self.head_seq,
            unflushed,
            freed: self.freed_committed.len(),
            blocks: blocks.len() as u64,
            home_blocks,
            home_writes,
            io,
        };
        (job, st)
    }

    /// A checkpoint's writes are done: move the tail (the superblock is
    /// written), retire what it wrote home, free what waited for it.
    fn checkpoint_reap_state(&mut self, st: CheckpointState) -> Result<()> {
        let sb = match st.io.take() {
            Ok(sb) => sb,
            Err(e) => return Err(self.poison(format!("checkpoint failed: {e}"))),
        };
        // Its own and the superblock's, and one first for unflushed
        // transactions.
        let mut flushes = 2;
        if let Some(upto) = st.unflushed {
            self.mark_durable(upto);
            flushes += 1;
        }
        self.sb = sb;
        self.stats.checkpoints += 1;
        self.stats.flushes += flushes;
        self.stats.checkpoint_flushes += flushes;
        self.stats.blocks_checkpointed += st.blocks;
        self.stats.data_home_blocks += st.home_blocks;
        self.stats.data_home_writes += st.home_writes;
        // Blocks committed again since it began stay for the next one.
        let done: Vec<u64> = self
            .checkpoint
            .iter()
            .filter(|(_, seq)| **seq < st.upto_seq)
            .map(|(b, _)| *b)
            .collect();
        for b in done {
            self.checkpoint.remove(&b);
            self.frozen.remove(&b);
            // Logged data now home leaves the cache, unless a newer image
            // is running or being written.
            if !self.running.contains(&b)
                && !self.sealed_set.contains_key(&b)
                && self.logged.remove(&b)
            {
                self.cache.remove(&b);
            }
        }
        let freed: Vec<(u64, u64)> = self.freed_committed.drain(..st.freed).collect();
        self.freed_reusable.extend(freed);
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

/// `replay` without writing `dev`: into a memory overlay of it, returned
/// to read the recovered state through (fsck without repair, a
/// read-only mount). The next read-write mount replays the same.
pub fn replay_in_memory(
    dev: Arc<dyn Device>,
    sb: &mut Superblock,
) -> Result<(Arc<dyn Device>, u64)> {
    let overlay: Arc<dyn Device> = Arc::new(OverlayDevice::new(dev, sb.block_size as u64));
    let n = replay(&*overlay, sb)?;
    Ok((overlay, n))
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
    // The newest contents of each checksum block imaged so far, and those
    // changed since by checksums derived from logged data (written home
    // at the end).
    let mut csum_blocks: crate::u64map::U64Map<AlignedBuf> = Default::default();
    let mut derived: BTreeSet<u64> = BTreeSet::new();
    let read = |p: u64| -> Result<AlignedBuf> {
        let mut b = AlignedBuf::zeroed(bs);
        dev.read_at(&mut b, (jstart + p) * bs as u64)?;
        Ok(b)
    };
    'tx: loop {
        let mut p = pos;
        let mut crc = 0u32;
        // (home block, a data record, image)
        let mut images: Vec<(u64, bool, AlignedBuf)> = Vec::new();
        let mut count = 0u32;
        // A transaction of one descriptor that commits itself: the crc
        // its images must have, and theirs.
        let mut in_desc: Option<u32> = None;
        let mut img_crc = 0u32;
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
            let Some(desc) = journal::decode_desc(&d) else {
                break 'tx;
            };
            if desc.commit_crc.is_some() {
                if count > 0 {
                    // Only a transaction's only descriptor commits itself.
                    break 'tx;
                }
                in_desc = desc.commit_crc;
            }
            let (targets, last) = (desc.targets, desc.last);
            crc = crc32c::crc32c_append(crc, &d);
            count += 1;
            p = (p + 1) % jlen;
            for t in targets {
                let data = t & journal::DATA_TARGET != 0;
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
                img_crc = crc32c::crc32c_append(img_crc, &img);
                count += 1;
                p = (p + 1) % jlen;
                images.push((t, data, img));
                if count as u64 >= jlen {
                    break 'tx;
                }
            }
            if last || in_desc.is_some() {
                break;
            }
        }
        match in_desc {
            Some(want) => {
                if img_crc != want {
                    break 'tx;
                }
            }
            None => {
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
                p = (p + 1) % jlen;
            }
        }
        // Logged data implies its checksum, in the checksum blocks the
        // transaction does not image itself (an image carries them).
        let imaged: BTreeSet<u64> = images
            .iter()
            .filter(|(_, data, _)| !data)
            .map(|(t, _, _)| *t)
            .collect();
        for (t, _, img) in images.iter().filter(|(_, data, _)| *data) {
            let (cblk, idx) = geo.csum_loc(*t);
            if imaged.contains(&cblk) {
                continue;
            }
            let Some(c) = csum_blocks.get_mut(&cblk) else {
                return Err(Error::corrupted(
                    "journal descriptor",
                    jstart + pos,
                    format!(
                        "transaction {seq} logs data block {t} without an image of its \
                         checksum block {cblk} earlier in the log"
                    ),
                ));
            };
            csum::set(c, idx, data_crc(img));
            header::stamp_lsn(c, seq);
            derived.insert(cblk);
        }
        for (t, _, img) in images {
            dev.write_at(&img, t * bs as u64)?;
            if geo.is_csum_block(t) {
                derived.remove(&t);
                csum_blocks.insert(t, img);
            }
        }
        applied += 1;
        pos = p;
        seq += 1;
    }
    for cblk in derived {
        dev.write_at(&csum_blocks[&cblk], cblk * bs as u64)?;
    }
    // Transactions are written several at once, some without a flush, so
    // after a crash the log may hold whole transactions beyond the one
    // replay stopped at (a later one written, an earlier one torn). New
    // transactions must never carry their numbers: written over the torn
    // one, the next replay would find the old successor valid and apply
    // it. The sequence continues past every number in the log.
    let mut next = seq;
    if sb.flags & crate::format::superblock::FLAG_CLEAN == 0 {
        if let Some(top) = highest_lsn(dev, &geo, &sb.uuid)? {
            next = next.max(top + 1);
        }
    }
    if applied > 0 || pos != sb.tail_pos || next != seq {
        dev.flush()?;
        sb.tail_pos = pos;
        sb.tail_seq = next;
        write_superblock(dev, sb)?;
    }
    Ok(applied)
}

/// The highest transaction number of any descriptor or commit block in
/// the journal area, valid or not as a transaction.
pub(super) fn highest_lsn(
    dev: &dyn Device,
    geo: &Geometry,
    uuid: &[u8; 16],
) -> Result<Option<u64>> {
    let bs = geo.block_size as usize;
    let per_read = ((1usize << 20) / bs).max(1) as u64;
    let mut buf = AlignedBuf::zeroed(per_read as usize * bs);
    let mut top = None;
    let mut p = 0u64;
    while p < geo.journal_blocks {
        let n = per_read.min(geo.journal_blocks - p);
        let chunk = &mut buf[..n as usize * bs];
        dev.read_at(chunk, (geo.journal_start + p) * bs as u64)?;
        for (k, b) in chunk.chunks(bs).enumerate() {
            let at = geo.journal_start + p + k as u64;
            // One check a block: the magic picks which kind to verify.
            let m = header::BlockHeader::decode(b).magic;
            if m != magic::JOURNAL_DESC && m != magic::JOURNAL_COMMIT {
                continue;
            }
            if let Ok(h) = header::verify(b, "journal block", m, at, uuid) {
                top = top.max(Some(h.lsn));
            }
        }
        p += n;
    }
    Ok(top)
}

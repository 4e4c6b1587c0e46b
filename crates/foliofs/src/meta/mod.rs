//! The metadata buffer cache: metadata blocks are read, changed and
//! written back only through it; a changed block joins the running
//! transaction of the journal (`journal`), which writes it home. Also the
//! superblock's own reads and writes.
//!
//! Metadata blocks are changed only in this cache. Changed blocks join the
//! running transaction; `commit` writes their images to the journal with a
//! commit block and one flush (group commit: every change made since the
//! last commit goes in one transaction, whichever thread asked). Committed
//! blocks are written to their home addresses by `checkpoint`, which then
//! advances the journal tail in the superblock.
//!
//! Durability order: journal images, commit block, flush; only then may a
//! checkpoint write the home copies; flush; only then does the superblock
//! move the tail past them.
//!
//! A committed block changed again before its checkpoint keeps a frozen
//! copy of its committed image, so a checkpoint never writes uncommitted
//! changes home (jbd2 does the same with frozen buffers). Block contents
//! are shared, copied on write (`Arc`): freezing a block, sealing one left
//! out of its transaction and handing a checkpoint its images copy
//! nothing under the metadata lock; the next change of a shared block
//! copies it once.
//!
//! Freed blocks may still have images in the live journal, which replay
//! would write home again; they are therefore not reused until the
//! checkpoint after the commit that freed them (see `Alloc::free` and
//! `Alloc::take_freed`).
//!
//! Logged data implies its checksum: a checksum block changed only by the
//! checksums of data logged in the same transaction (`write_data`) is not
//! imaged again when the live journal already holds an image of it from
//! which replay can start (`imaged_at`); replay sets those checksums from
//! the logged data itself. A direct overwrite's transaction is then its
//! descriptor and its data, not also a checksum block per block written.

mod commit;
mod journal;

use crate::books::ScanFloor;
use crate::device::{AlignedBuf, Device};
use crate::error::{Error, Result};
use crate::format::superblock::Superblock;
use crate::format::{csum, data_crc, header, magic};
use crate::geometry::Geometry;
use crate::u64map::U64Map;
pub(crate) use commit::{Batch, GroupCommit, Journaled};
use journal::InFlight;
pub use journal::{
    replay, replay_in_memory, CheckpointJob, DataFlush, JournalIo, JournalStats, SealedTx,
    MAX_IN_FLIGHT,
};
use std::collections::BTreeSet;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A block with the common header, stamped at commit.
    Header,
    /// An inode-table block: each inode carries its own checksum.
    InodeTable,
    /// A data block of a file, logged by an overwrite (`write_data`): its
    /// newest image stays here until a checkpoint writes it home.
    Data,
}

struct Cached {
    data: Arc<AlignedBuf>,
    kind: Kind,
}

impl Cached {
    /// The contents to change: copied first if a frozen image, a sealed
    /// copy or a checkpoint still shares them.
    fn bytes_mut(&mut self) -> &mut [u8] {
        let data: &mut AlignedBuf = Arc::make_mut(&mut self.data);
        data
    }
}

pub struct Meta {
    pub dev: Arc<dyn Device>,
    pub geo: Geometry,
    pub uuid: [u8; 16],
    pub sb: Superblock,
    cache: U64Map<Cached>,
    running: BTreeSet<u64>,
    /// Checksum blocks changed in the running transaction only by the
    /// checksums of data logged in it (`write_data`); a block changed
    /// otherwise as well is in `running` instead.
    running_implied: BTreeSet<u64>,
    /// Checksum block -> the transaction that last logged its full image.
    imaged_at: U64Map<u64>,
    /// Metadata changes made so far (each write or create of a block).
    changes: u64,
    /// Committed blocks not yet home, with the transaction that last
    /// committed each.
    checkpoint: std::collections::BTreeMap<u64, u64>,
    /// A checkpoint whose writes run in the background.
    cp: Option<journal::CheckpointState>,
    frozen: U64Map<Arc<AlignedBuf>>,
    /// Data blocks whose newest contents are a logged image in this cache,
    /// not (yet) at home: readers take them from here.
    logged: BTreeSet<u64>,
    /// How many of the running transaction's blocks are data.
    running_data: usize,
    head_pos: u64,
    head_seq: u64,
    /// Blocks freed by the running transaction; then by committed ones
    /// that still have an image in the live journal (replay could write
    /// it over a new owner's data: reusable at the next checkpoint); then
    /// reusable, for the allocator to take back (`Alloc::take_freed`).
    pub freed_running: Vec<(u64, u64)>,
    pub freed_committed: Vec<(u64, u64)>,
    pub freed_reusable: Vec<(u64, u64)>,
    /// A change that must be durable before its call returns was made
    /// (an inode or directory with chattr +S or +D, or any directory
    /// while `sync_dirs`): the call commits (`Fs::settle`).
    pub sync_wanted: bool,
    /// Every directory's entries change synchronously (mount options
    /// `sync` and `dirsync`).
    pub sync_dirs: bool,
    shutdown: Option<String>,
    /// Called once when the file system shuts down (`Fs::on_shutdown`),
    /// under the metadata lock.
    pub on_shutdown: Option<Box<dyn Fn() + Send + Sync>>,
    cache_limit: usize,
    /// When the next eviction scan runs (cached blocks, logged data
    /// aside): half the limit past what a scan had to keep.
    evict_at: ScanFloor,
    pub stats: JournalStats,
    /// The sealed transactions being written, oldest first.
    sealed: std::collections::VecDeque<InFlight>,
    /// Blocks of the sealed transactions, and in how many of them.
    sealed_set: std::collections::BTreeMap<u64, u32>,
    /// Every transaction below this is durable (written and flushed).
    done_seq: u64,
    /// Every transaction below this is written to the log, perhaps not
    /// yet flushed (a commit that only needed its write, `seal_with`).
    written_seq: u64,
    io: Arc<JournalIo>,
    data_flush: Arc<DataFlush>,
}

impl Meta {
    pub fn new(dev: Arc<dyn Device>, sb: Superblock, cache_limit_bytes: u64) -> Self {
        let geo = Geometry::new(&sb);
        let head_seq = sb.tail_seq;
        Meta {
            dev,
            uuid: sb.uuid,
            head_pos: sb.tail_pos,
            head_seq: sb.tail_seq,
            cache_limit: (cache_limit_bytes / geo.block_size).max(256) as usize,
            evict_at: ScanFloor::new((cache_limit_bytes / geo.block_size).max(256)),
            geo,
            sb,
            cache: Default::default(),
            running: BTreeSet::new(),
            running_implied: BTreeSet::new(),
            imaged_at: Default::default(),
            changes: 0,
            checkpoint: Default::default(),
            cp: None,
            frozen: Default::default(),
            logged: BTreeSet::new(),
            running_data: 0,
            freed_running: Vec::new(),
            freed_committed: Vec::new(),
            freed_reusable: Vec::new(),
            sync_wanted: false,
            sync_dirs: false,
            shutdown: None,
            on_shutdown: None,
            stats: JournalStats::default(),
            sealed: Default::default(),
            sealed_set: Default::default(),
            done_seq: head_seq,
            written_seq: head_seq,
            io: Arc::new(JournalIo::default()),
            data_flush: Arc::new(DataFlush::default()),
        }
    }

    pub fn check_live(&self) -> Result<()> {
        match &self.shutdown {
            Some(why) => Err(Error::Shutdown(why.clone())),
            None => Ok(()),
        }
    }

    pub fn is_shutdown(&self) -> bool {
        self.shutdown.is_some()
    }

    /// Shut the file system down: every later change fails.
    pub fn poison(&mut self, why: String) -> Error {
        if self.shutdown.is_none() {
            log::error!("shutting down, no more changes until remounted: {why}");
            self.shutdown = Some(why.clone());
            if let Some(f) = &self.on_shutdown {
                f();
            }
        }
        Error::Shutdown(why)
    }

    pub(super) fn load(&mut self, blk: u64, kind: Kind) -> Result<()> {
        if self.cache.contains_key(&blk) {
            return Ok(());
        }
        if blk >= self.geo.total_blocks {
            return Err(Error::corrupted(
                "metadata pointer",
                blk,
                "past the end of the device",
            ));
        }
        let mut buf = AlignedBuf::zeroed(self.geo.block_size as usize);
        self.dev.read_at(&mut buf, blk * self.geo.block_size)?;
        self.stats.meta_reads += 1;
        self.evict_if_needed();
        self.cache.insert(
            blk,
            Cached {
                data: Arc::new(buf),
                kind,
            },
        );
        Ok(())
    }

    /// Read a header-carrying metadata block, verifying it on first load.
    pub fn read(&mut self, blk: u64, magic: u32, structure: &'static str) -> Result<&[u8]> {
        if !self.cache.contains_key(&blk) {
            self.load(blk, Kind::Header)?;
            let uuid = self.uuid;
            let c = &self.cache[&blk];
            if let Err(e) = header::verify(&c.data, structure, magic, blk, &uuid) {
                self.cache.remove(&blk);
                return Err(e);
            }
        }
        Ok(&self.cache[&blk].data)
    }

    /// Read an inode-table block (inodes verify themselves).
    pub fn read_itable(&mut self, blk: u64) -> Result<&[u8]> {
        self.load(blk, Kind::InodeTable)?;
        Ok(&self.cache[&blk].data)
    }

    /// Mutable access to a cached block; it joins the running transaction.
    /// The block must have been read (or created) first.
    /// Metadata changes made so far: an operation that fails after this
    /// moved has left a half-done change in the running transaction.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub fn write(&mut self, blk: u64) -> &mut [u8] {
        self.freeze_before_change(blk);
        self.running_implied.remove(&blk);
        self.running.insert(blk);
        self.block_mut(blk)
    }

    /// A block's first change in the running transaction: keep its
    /// committed image for a pending checkpoint (`frozen`).
    fn freeze_before_change(&mut self, blk: u64) {
        self.changes += 1;
        if self.checkpoint.contains_key(&blk)
            && !self.running.contains(&blk)
            && !self.running_implied.contains(&blk)
            && !self.frozen.contains_key(&blk)
        {
            let img = self.cache[&blk].data.clone();
            self.frozen.insert(blk, img);
        }
    }

    fn block_mut(&mut self, blk: u64) -> &mut [u8] {
        self.cache
            .get_mut(&blk)
            .expect("write to a block not in the cache")
            .bytes_mut()
    }

    /// Log a new image of data block `blk` (an overwrite) and set its
    /// checksum: it joins the running transaction like a metadata block,
    /// replay writes it home and sets the checksum from it, and until a
    /// checkpoint has, readers get it from `logged_range`.
    pub fn write_data(&mut self, blk: u64, img: &[u8]) -> Result<()> {
        let (cblk, idx) = self.geo.csum_loc(blk);
        self.read(cblk, magic::CSUM, "checksum block")?;
        self.freeze_before_change(cblk);
        if !self.running.contains(&cblk) {
            self.running_implied.insert(cblk);
        }
        csum::set(self.block_mut(cblk), idx, data_crc(img));
        self.logged.insert(blk);
        self.stats.data_blocks_logged += 1;
        if !self.running.contains(&blk) {
            self.running_data += 1;
        }
        if self.cache.contains_key(&blk) {
            debug_assert_eq!(self.cache[&blk].kind, Kind::Data, "block {blk}");
            self.write(blk).copy_from_slice(img);
        } else {
            // A block first logged: its image made from `img` at once.
            self.write_new(blk, AlignedBuf::copy_of(img), Kind::Data);
        }
        Ok(())
    }

    /// The logged images of data blocks in [start, start + len), in order:
    /// newer than what their home holds.
    pub fn logged_range(&self, start: u64, len: u64) -> impl Iterator<Item = (u64, &[u8])> {
        self.logged
            .range(start..start + len)
            .map(|b| (*b, &self.cache[b].data[..]))
    }

    /// Data blocks logged in the running transaction.
    pub fn running_data_blocks(&self) -> usize {
        self.running_data
    }

    /// A new block with zeroed contents, in the running transaction.
    pub fn create(&mut self, blk: u64, kind: Kind) -> &mut [u8] {
        self.changes += 1;
        if self.cache.contains_key(&blk) {
            let b = self.write(blk);
            b.fill(0);
            return b;
        }
        let zeroed = AlignedBuf::zeroed(self.geo.block_size as usize);
        self.write_new(blk, zeroed, kind)
    }

    /// Cache `img` as block `blk`, not cached before, and change it in the
    /// running transaction: made whole at once, not zeroed and then
    /// overwritten.
    fn write_new(&mut self, blk: u64, img: AlignedBuf, kind: Kind) -> &mut [u8] {
        self.evict_if_needed();
        let data = Arc::new(img);
        self.cache.insert(blk, Cached { data, kind });
        self.write(blk)
    }

    /// A block was freed: drop it from the cache and from the running
    /// transaction. Its older images may still sit in the journal; the
    /// allocator keeps the block out of use until the next checkpoint.
    pub fn forget(&mut self, blk: u64) {
        let was_running = self.running.remove(&blk);
        if was_running && self.logged.contains(&blk) {
            self.running_data -= 1;
            // Its checksum is no longer implied by an image in this
            // transaction: the checksum block must carry it itself.
            let cblk = self.geo.csum_loc(blk).0;
            if self.running_implied.remove(&cblk) {
                self.running.insert(cblk);
            }
        }
        if was_running || self.checkpoint.contains_key(&blk) {
            // Keep writing its committed image home if a checkpoint is
            // pending: harmless (the block is free) and simpler than revoking.
            if let Some(c) = self.cache.get(&blk) {
                if self.checkpoint.contains_key(&blk) && !self.frozen.contains_key(&blk) {
                    let img = c.data.clone();
                    self.frozen.insert(blk, img);
                }
            }
        }
        if self
            .cache
            .remove(&blk)
            .is_some_and(|c| c.kind == Kind::Data)
        {
            self.logged.remove(&blk);
        }
    }

    pub(super) fn evict_if_needed(&mut self) {
        // Logged data waits for its checkpoint; it does not count.
        if !self
            .evict_at
            .due((self.cache.len() - self.logged.len() + 1) as u64)
        {
            return;
        }
        self.stats.meta_evict_scans += 1;
        // Drop clean blocks: neither in the running transaction nor waiting
        // for a checkpoint. Half the cache goes at once to amortise the scan.
        let target = self.cache_limit / 2;
        let victims: Vec<u64> = self
            .cache
            .keys()
            .copied()
            .filter(|b| {
                !self.running.contains(b)
                    && !self.running_implied.contains(b)
                    && !self.checkpoint.contains_key(b)
                    && !self.sealed_set.contains_key(b)
            })
            .take(self.cache.len().saturating_sub(target))
            .collect();
        for b in victims {
            self.cache.remove(&b);
        }
        // If most could not go (a large unlink or untar keeps its blocks
        // until the checkpoint), the next scan waits for half the limit
        // more, not for the next block read.
        let (limit, left) = (
            self.cache_limit as u64,
            self.cache.len() - self.logged.len(),
        );
        self.evict_at.walked(limit, left as u64, limit / 2);
    }
}

/// Write the superblock to the slot after the current one and flush. The
/// two slots alternate, so a torn write leaves the other one intact.
pub fn write_superblock(dev: &dyn Device, sb: &mut Superblock) -> Result<()> {
    // From the disk, so any value: past u64::MAX it wraps, and the newer
    // slot is still the one a step ahead (`newer`).
    sb.generation = sb.generation.wrapping_add(1);
    let bs = sb.block_size as usize;
    let slot = sb.generation % 2;
    let mut buf = AlignedBuf::zeroed(bs);
    sb.encode(&mut buf, slot);
    dev.write_at(&buf, slot * bs as u64)?;
    dev.flush()?;
    Ok(())
}

/// Whether generation `a` is later than `b`, as serial numbers: at most
/// half the range ahead (the two slots' generations differ by one, across
/// a wrap too).
fn newer(a: u64, b: u64) -> bool {
    (a.wrapping_sub(b) as i64) > 0
}

/// Read both superblock slots; the valid one with the later generation
/// wins. Both invalid is an error naming the first slot's problem.
pub fn read_superblock(dev: &dyn Device) -> Result<Superblock> {
    let mut first = AlignedBuf::zeroed(512);
    dev.read_at(&mut first, 0)?;
    let mut best: Option<Superblock> = None;
    // The block size is in the superblock; slot 1 is one block further.
    let guess = Superblock::decode(&first, 0).map(|s| s.block_size).ok();
    let mut err = None;
    // A slot whose checksum holds at some size but whose contents are
    // refused (an unsupported version): that says more than the checksum
    // mismatches of the sizes it is not.
    let mut refused = None;
    // Whether any slot read carries the superblock magic: without it the
    // device is something other than foliofs, and a checksum mismatch
    // would misreport it as a damaged foliofs superblock.
    let mut magic_seen = false;
    let sizes: Vec<u64> = match guess {
        Some(bs) => vec![bs as u64],
        None => (9..=16).map(|s| 1u64 << s).collect(),
    };
    for bs in sizes {
        if bs * 2 > dev.len() {
            continue;
        }
        let mut buf = AlignedBuf::zeroed(bs as usize);
        for slot in 0..2u64 {
            dev.read_at(&mut buf, slot * bs)?;
            magic_seen |= header::BlockHeader::decode(&buf).magic == magic::SUPERBLOCK;
            match Superblock::decode(&buf, slot) {
                Ok(sb) if sb.block_size as u64 == bs => {
                    if best
                        .as_ref()
                        .is_none_or(|b| newer(sb.generation, b.generation))
                    {
                        best = Some(sb);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    if header::checksum_holds(&buf) {
                        refused.get_or_insert(e);
                    } else {
                        err.get_or_insert(e);
                    }
                }
            }
        }
        if best.is_some() {
            break;
        }
    }
    if best.is_none() && !magic_seen {
        return Err(Error::NotFoliofs);
    }
    best.ok_or_else(|| {
        refused
            .or(err)
            .unwrap_or_else(|| Error::corrupted("superblock", 0, "no valid superblock slot"))
    })
}

/// The superblock slots of block size `bs` that do not decode, each
/// with its error: a torn superblock write leaves one, and a repair
/// rewrites it.
pub fn damaged_superblock_slots(dev: &dyn Device, bs: u32) -> Result<Vec<Error>> {
    let mut buf = AlignedBuf::zeroed(bs as usize);
    let mut damaged = Vec::new();
    for slot in 0..2u64 {
        dev.read_at(&mut buf, slot * bs as u64)?;
        if let Err(e) = Superblock::decode(&buf, slot) {
            damaged.push(e);
        }
    }
    Ok(damaged)
}

/// The superblock from a copy mkfs wrote in another AG (agbno 0 and 1 of
/// every AG but the first), for a repair when both slots are damaged:
/// the device is scanned for the first block that decodes as a copy at
/// its own place (its header's block number, and an AG start or the block
/// after one by its geometry), so neither a superblock inside a file's
/// data nor one of an image stored in a file passes. Returns it and where
/// it was found.
///
/// A copy holds the journal position of mkfs's time, and replaying from
/// it could write old images over blocks reused since; so the journal is
/// not replayed: the tail is set past every transaction number in the
/// log, as after a crash, and what was committed but not checkpointed is
/// lost (the check that follows repairs what that leaves).
pub fn read_superblock_backup(dev: &dyn Device) -> Result<(Superblock, u64)> {
    const CHUNK: usize = 1 << 20;
    let mut buf = AlignedBuf::zeroed(CHUNK);
    let mut at = 0u64;
    while at < dev.len() {
        let n = (CHUNK as u64).min(dev.len() - at) as usize;
        dev.read_at(&mut buf[..n], at)?;
        for off in (0..n).step_by(512) {
            let pos = at + off as u64;
            let b = &buf[off..n];
            if b.len() < 512 || header::BlockHeader::decode(b).magic != magic::SUPERBLOCK {
                continue;
            }
            let bs = u32::from_le_bytes([b[52], b[53], b[54], b[55]]) as u64;
            if !(512..=65536).contains(&bs) || pos % bs != 0 || pos + bs > dev.len() {
                continue;
            }
            let mut block = AlignedBuf::zeroed(bs as usize);
            dev.read_at(&mut block, pos)?;
            let blk = pos / bs;
            let Ok(mut sb) = Superblock::decode(&block, blk) else {
                continue;
            };
            let ag = blk / sb.ag_blocks;
            if ag == 0 || ag >= sb.ag_count as u64 || blk % sb.ag_blocks > 1 {
                continue;
            }
            let geo = Geometry::new(&sb);
            let top = journal::highest_lsn(dev, &geo, &sb.uuid)?;
            sb.tail_pos = 0;
            sb.tail_seq = top.map_or(sb.tail_seq, |t| t.wrapping_add(1).max(sb.tail_seq));
            sb.flags &= !crate::format::superblock::FLAG_CLEAN;
            return Ok((sb, blk));
        }
        at += n as u64;
    }
    Err(Error::corrupted(
        "superblock",
        0,
        "no valid superblock slot and no copy in another AG",
    ))
}

/// The device must be at least as large as the file system it holds.
pub fn check_device_size(dev: &dyn Device, sb: &Superblock) -> Result<()> {
    let need = sb.total_blocks * sb.block_size as u64;
    if dev.len() < need {
        return Err(Error::corrupted(
            "superblock",
            0,
            format!("file system needs {need} bytes, device has {}", dev.len()),
        ));
    }
    Ok(())
}

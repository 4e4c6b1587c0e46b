//! Where everything is, derived from the superblock.
//!
//! Every AG starts with the same metadata run:
//! ```text
//! agbno 0, 1   superblock slots (AG 0) or copies (other AGs)
//! agbno 2      AG header
//! then         block bitmap, inode bitmap, checksum array, inode table
//! AG 0 only    the journal
//! then         data and tree blocks
//! ```

use crate::error::Result;
use crate::format::extent::Extent;
use crate::format::superblock::Superblock;
use crate::format::{bitmap, csum, inode::INODE_SIZE};

#[derive(Clone, Debug)]
pub struct Geometry {
    pub block_size: u64,
    pub total_blocks: u64,
    pub ag_blocks: u64,
    pub ag_count: u32,
    pub inodes_per_ag: u64,
    pub inodes_per_block: u64,
    pub bmap_blocks: u64,
    pub imap_blocks: u64,
    pub csum_blocks: u64,
    pub itable_blocks: u64,
    pub journal_start: u64,
    pub journal_blocks: u64,
    pub bits_per_bmap: u64,
    pub csums_per_block: u64,
}

pub const AGH_AGBNO: u64 = 2;

impl Geometry {
    pub fn new(sb: &Superblock) -> Self {
        Geometry {
            block_size: sb.block_size as u64,
            total_blocks: sb.total_blocks,
            ag_blocks: sb.ag_blocks,
            ag_count: sb.ag_count,
            inodes_per_ag: sb.inodes_per_ag as u64,
            inodes_per_block: (sb.block_size as u64 / INODE_SIZE as u64).max(1),
            bmap_blocks: sb.bmap_blocks as u64,
            imap_blocks: sb.imap_blocks as u64,
            csum_blocks: sb.csum_blocks as u64,
            itable_blocks: sb.itable_blocks as u64,
            journal_start: sb.journal_start,
            journal_blocks: sb.journal_blocks,
            bits_per_bmap: bitmap::bits_per_block(sb.block_size) as u64,
            csums_per_block: csum::entries_per_block(sb.block_size) as u64,
        }
    }

    pub fn ag_start(&self, ag: u32) -> u64 {
        ag as u64 * self.ag_blocks
    }
    /// Blocks in AG `ag` (the last one may be short).
    pub fn ag_len(&self, ag: u32) -> u64 {
        if ag + 1 == self.ag_count {
            self.total_blocks - self.ag_start(ag)
        } else {
            self.ag_blocks
        }
    }
    pub fn ag_of(&self, blk: u64) -> u32 {
        (blk / self.ag_blocks) as u32
    }
    pub fn agbno(&self, blk: u64) -> u64 {
        blk % self.ag_blocks
    }
    pub fn agh_blk(&self, ag: u32) -> u64 {
        self.ag_start(ag) + AGH_AGBNO
    }
    pub fn bmap_start(&self, ag: u32) -> u64 {
        self.ag_start(ag) + 3
    }
    pub fn imap_start(&self, ag: u32) -> u64 {
        self.bmap_start(ag) + self.bmap_blocks
    }
    pub fn csum_start(&self, ag: u32) -> u64 {
        self.imap_start(ag) + self.imap_blocks
    }
    /// Whether `blk` is one of the data-checksum blocks of its AG.
    pub fn is_csum_block(&self, blk: u64) -> bool {
        let start = self.csum_start(self.ag_of(blk));
        (start..start + self.csum_blocks).contains(&blk)
    }
    pub fn itable_start(&self, ag: u32) -> u64 {
        self.csum_start(ag) + self.csum_blocks
    }
    /// First AG block number after the fixed metadata (and the journal in AG 0).
    pub fn data_start_agbno(&self, ag: u32) -> u64 {
        let fixed = 3 + self.bmap_blocks + self.imap_blocks + self.csum_blocks + self.itable_blocks;
        if ag == 0 {
            fixed.max(self.journal_start + self.journal_blocks)
        } else {
            fixed
        }
    }

    /// (block, byte offset in block) of inode `ino`.
    pub fn inode_loc(&self, ino: u64) -> (u64, usize) {
        let ag = (ino / self.inodes_per_ag) as u32;
        let idx = ino % self.inodes_per_ag;
        let blk = self.itable_start(ag) + idx / self.inodes_per_block;
        (blk, (idx % self.inodes_per_block) as usize * INODE_SIZE)
    }
    pub fn inode_ag(&self, ino: u64) -> u32 {
        (ino / self.inodes_per_ag) as u32
    }
    pub fn max_ino(&self) -> u64 {
        self.ag_count as u64 * self.inodes_per_ag
    }

    /// (checksum block, index in block) for data block `blk`.
    pub fn csum_loc(&self, blk: u64) -> (u64, u32) {
        let ag = self.ag_of(blk);
        let agbno = self.agbno(blk);
        (
            self.csum_start(ag) + agbno / self.csums_per_block,
            (agbno % self.csums_per_block) as u32,
        )
    }

    /// (bitmap block, bit) for block `blk`.
    pub fn bmap_loc(&self, blk: u64) -> (u64, u32) {
        let ag = self.ag_of(blk);
        let agbno = self.agbno(blk);
        (
            self.bmap_start(ag) + agbno / self.bits_per_bmap,
            (agbno % self.bits_per_bmap) as u32,
        )
    }

    /// (inode bitmap block, bit) for inode `ino`.
    pub fn imap_loc(&self, ino: u64) -> (u64, u32) {
        let ag = self.inode_ag(ino);
        let idx = ino % self.inodes_per_ag;
        (
            self.imap_start(ag) + idx / self.bits_per_bmap,
            (idx % self.bits_per_bmap) as u32,
        )
    }

    /// True if `blk` is in the data area of its AG (where files and trees live).
    pub fn is_data_block(&self, blk: u64) -> bool {
        blk < self.total_blocks && self.agbno(blk) >= self.data_start_agbno(self.ag_of(blk))
    }

    /// Decode the extent of `ino` under `key` and check that it lies in
    /// one AG's data area.
    pub fn extent(&self, ino: u64, key: u64, v: &[u8]) -> Result<Extent> {
        let e = Extent::decode(ino, key, v)?;
        let last = e.pblk + e.len - 1;
        if !self.is_data_block(e.pblk)
            || !self.is_data_block(last)
            || self.ag_of(e.pblk) != self.ag_of(last)
        {
            return Err(e.outside(ino));
        }
        Ok(e)
    }
}

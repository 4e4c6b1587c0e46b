//! The superblock. Blocks 0 and 1 of AG 0 are two slots written alternately
//! (the later valid `generation` wins, as a serial number), so a torn
//! superblock write never loses the journal position. Blocks 0 and 1 of
//! every other AG hold copies written by mkfs.
//!
//! ```text
//! 0   header        48    magic FOLS, owner 0
//! 48  version       u32
//! 52  block_size    u32   512 .. 65536, a power of two
//! 56  total_blocks  u64
//! 64  ag_blocks     u64   blocks per AG (the last AG may be shorter)
//! 72  ag_count      u32
//! 76  inodes_per_ag u32
//! 80  inode_size    u32   512
//! 84  flags         u32   bit 0: cleanly unmounted
//! 88  journal_start u64   first journal block (in AG 0)
//! 96  journal_blocks u64
//! 104 tail_pos      u64   journal position (block offset) of the oldest live transaction
//! 112 tail_seq      u64   its sequence number
//! 120 generation    u64   slot generation
//! 128 root_ino      u64
//! 136 bmap_blocks   u32   block-bitmap blocks per AG
//! 140 imap_blocks   u32   inode-bitmap blocks per AG
//! 144 csum_blocks   u32   checksum blocks per AG
//! 148 itable_blocks u32   inode-table blocks per AG
//! 152 label         [32]  NUL-padded
//! 184 mkfs_time     u64   seconds since the epoch
//! 192 (zero to the end of the block)
//! ```

use super::header::{self, BlockHeader};
use super::*;
use crate::error::{Error, Result};

pub const SB_ENCODED_SIZE: usize = 192;
const _: () = assert!(SB_ENCODED_SIZE <= MIN_BLOCK_SIZE as usize);

pub const FLAG_CLEAN: u32 = 1;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub uuid: [u8; 16],
    pub version: u32,
    pub block_size: u32,
    pub total_blocks: u64,
    pub ag_blocks: u64,
    pub ag_count: u32,
    pub inodes_per_ag: u32,
    pub inode_size: u32,
    pub flags: u32,
    pub journal_start: u64,
    pub journal_blocks: u64,
    pub tail_pos: u64,
    pub tail_seq: u64,
    pub generation: u64,
    pub root_ino: u64,
    pub bmap_blocks: u32,
    pub imap_blocks: u32,
    pub csum_blocks: u32,
    pub itable_blocks: u32,
    pub label: [u8; 32],
    pub mkfs_time: u64,
}

impl Superblock {
    pub fn encode(&self, buf: &mut [u8], blkno: u64) {
        buf.fill(0);
        BlockHeader {
            magic: magic::SUPERBLOCK,
            blkno,
            uuid: self.uuid,
            owner: 0,
            lsn: self.tail_seq,
        }
        .encode(buf);
        put_u32(buf, 48, self.version);
        put_u32(buf, 52, self.block_size);
        put_u64(buf, 56, self.total_blocks);
        put_u64(buf, 64, self.ag_blocks);
        put_u32(buf, 72, self.ag_count);
        put_u32(buf, 76, self.inodes_per_ag);
        put_u32(buf, 80, self.inode_size);
        put_u32(buf, 84, self.flags);
        put_u64(buf, 88, self.journal_start);
        put_u64(buf, 96, self.journal_blocks);
        put_u64(buf, 104, self.tail_pos);
        put_u64(buf, 112, self.tail_seq);
        put_u64(buf, 120, self.generation);
        put_u64(buf, 128, self.root_ino);
        put_u32(buf, 136, self.bmap_blocks);
        put_u32(buf, 140, self.imap_blocks);
        put_u32(buf, 144, self.csum_blocks);
        put_u32(buf, 148, self.itable_blocks);
        buf[152..184].copy_from_slice(&self.label);
        put_u64(buf, 184, self.mkfs_time);
        header::stamp(buf);
    }

    /// Decode a superblock read from `blkno`. The UUID is not known yet, so
    /// it is taken from the block; the checksum and self-consistency of the
    /// geometry are checked instead.
    pub fn decode(buf: &[u8], blkno: u64) -> Result<Self> {
        const S: &str = "superblock";
        if buf.len() < 512 {
            return Err(Error::corrupted(S, blkno, "short read"));
        }
        let uuid: [u8; 16] = buf[16..32].try_into().unwrap();
        header::verify(buf, S, magic::SUPERBLOCK, blkno, &uuid)?;
        let sb = Superblock {
            uuid,
            version: get_u32(buf, 48),
            block_size: get_u32(buf, 52),
            total_blocks: get_u64(buf, 56),
            ag_blocks: get_u64(buf, 64),
            ag_count: get_u32(buf, 72),
            inodes_per_ag: get_u32(buf, 76),
            inode_size: get_u32(buf, 80),
            flags: get_u32(buf, 84),
            journal_start: get_u64(buf, 88),
            journal_blocks: get_u64(buf, 96),
            tail_pos: get_u64(buf, 104),
            tail_seq: get_u64(buf, 112),
            generation: get_u64(buf, 120),
            root_ino: get_u64(buf, 128),
            bmap_blocks: get_u32(buf, 136),
            imap_blocks: get_u32(buf, 140),
            csum_blocks: get_u32(buf, 144),
            itable_blocks: get_u32(buf, 148),
            label: buf[152..184].try_into().unwrap(),
            mkfs_time: get_u64(buf, 184),
        };
        sb.check(blkno)?;
        Ok(sb)
    }

    /// Geometry checks: everything later arithmetic relies on.
    pub fn check(&self, blkno: u64) -> Result<()> {
        let bad = |r: String| Err(Error::corrupted("superblock", blkno, r));
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&self.version) {
            return bad(format!("unsupported format version {}", self.version));
        }
        let bs = self.block_size;
        if !bs.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) {
            return bad(format!("bad block size {bs}"));
        }
        if self.inode_size != super::inode::INODE_SIZE as u32 || self.inode_size > bs.max(512) {
            return bad(format!("bad inode size {}", self.inode_size));
        }
        if self.ag_count == 0 || self.ag_blocks == 0 || self.ag_blocks > u32::MAX as u64 {
            return bad(format!(
                "bad AG geometry {} x {}",
                self.ag_count, self.ag_blocks
            ));
        }
        let span = (self.ag_count as u64 - 1) * self.ag_blocks;
        if span >= self.total_blocks || self.total_blocks > span + self.ag_blocks {
            return bad(format!(
                "{} AGs of {} blocks do not cover {} blocks",
                self.ag_count, self.ag_blocks, self.total_blocks
            ));
        }
        let meta = self.ag_meta_blocks();
        if meta >= self.ag_blocks || meta >= self.last_ag_blocks() {
            return bad(format!("AG metadata ({meta} blocks) does not fit in an AG"));
        }
        let ipb = (bs as u64 / self.inode_size as u64).max(1);
        if (self.itable_blocks as u64) * ipb < (self.inodes_per_ag as u64) {
            return bad("inode table too small for inodes_per_ag".into());
        }
        let bits = bitmap::bits_per_block(bs) as u64;
        if (self.bmap_blocks as u64) * bits < self.ag_blocks
            || (self.imap_blocks as u64) * bits < (self.inodes_per_ag as u64)
            || self.csum_blocks as u64 * (csum::entries_per_block(bs) as u64) < self.ag_blocks
        {
            return bad("bitmap or checksum region too small for the AG".into());
        }
        let jend = self.journal_start.checked_add(self.journal_blocks);
        if self.journal_blocks < 8 || jend.is_none_or(|e| e > self.last_ag_or_first_len()) {
            return bad("journal outside AG 0".into());
        }
        // mkfs puts the journal right after AG 0's fixed metadata: one
        // that overlaps it would write transactions over the bitmaps or
        // the inode table.
        if self.journal_start < meta {
            return bad(format!(
                "journal at block {} overlaps AG 0's metadata ({meta} blocks)",
                self.journal_start
            ));
        }
        if self.tail_pos >= self.journal_blocks {
            return bad(format!("journal tail {} past journal end", self.tail_pos));
        }
        if self.root_ino == 0 || self.root_ino >= self.ag_count as u64 * self.inodes_per_ag as u64 {
            return bad(format!("bad root inode {}", self.root_ino));
        }
        Ok(())
    }

    fn last_ag_or_first_len(&self) -> u64 {
        self.ag_blocks.min(self.total_blocks)
    }

    pub fn last_ag_blocks(&self) -> u64 {
        self.total_blocks - (self.ag_count as u64 - 1) * self.ag_blocks
    }

    /// Blocks of per-AG metadata at the start of every AG: two superblock
    /// slots, the AG header, bitmaps, checksums and the inode table.
    pub fn ag_meta_blocks(&self) -> u64 {
        3 + self.bmap_blocks as u64
            + self.imap_blocks as u64
            + self.csum_blocks as u64
            + self.itable_blocks as u64
    }

    pub fn label_str(&self) -> String {
        let end = self.label.iter().position(|&c| c == 0).unwrap_or(32);
        String::from_utf8_lossy(&self.label[..end]).into_owned()
    }
}

#[cfg(test)]
pub(crate) fn sample() -> Superblock {
    Superblock {
        uuid: [3; 16],
        version: FORMAT_VERSION,
        block_size: 4096,
        total_blocks: 4096,
        ag_blocks: 2048,
        ag_count: 2,
        inodes_per_ag: 256,
        inode_size: 512,
        flags: 0,
        journal_start: 100,
        journal_blocks: 64,
        tail_pos: 5,
        tail_seq: 77,
        generation: 2,
        root_ino: 1,
        bmap_blocks: 1,
        imap_blocks: 1,
        csum_blocks: 3,
        itable_blocks: 32,
        label: [0; 32],
        mkfs_time: 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let sb = sample();
        let mut b = vec![0; 4096];
        sb.encode(&mut b, 0);
        assert_eq!(Superblock::decode(&b, 0).unwrap(), sb);
    }

    #[test]
    fn flipped_byte_is_corruption() {
        let mut b = vec![0; 4096];
        sample().encode(&mut b, 0);
        for pos in [0, 4, 50, 60, 130, 190, 4000] {
            let mut c = b.clone();
            c[pos] ^= 1;
            assert!(matches!(
                Superblock::decode(&c, 0),
                Err(Error::Corrupted {
                    structure: "superblock",
                    ..
                })
            ));
        }
    }

    #[test]
    fn hostile_geometry_is_rejected_not_panicking() {
        let mut sb = sample();
        sb.ag_count = 0;
        let mut b = vec![0; 4096];
        sb.encode(&mut b, 0);
        assert!(Superblock::decode(&b, 0).is_err());
        let mut sb = sample();
        sb.block_size = 3000;
        sb.encode(&mut b, 0);
        assert!(Superblock::decode(&b, 0).is_err());
        let mut sb = sample();
        sb.tail_pos = 1000;
        sb.encode(&mut b, 0);
        assert!(Superblock::decode(&b, 0).is_err());
    }
}

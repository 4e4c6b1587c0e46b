//! The AG header: block 2 of every AG. Journaled like all metadata.
//!
//! ```text
//! 0   header       48   magic FAGH, owner = AG number
//! 48  agno         u32
//! 52  (pad)        u32
//! 56  blocks       u64  blocks in this AG
//! 64  free_blocks  u64  free blocks per the block bitmap
//! 72  free_inodes  u64  free inodes per the inode bitmap
//! 80  orphan_root  u64  AG 0 only: root of the orphan B+tree (0 = empty)
//! 88  (zero to the end of the block)
//! ```

use super::header::{self, BlockHeader};
use super::*;
use crate::error::{Error, Result};

pub const AGH_ENCODED_SIZE: usize = 88;
const _: () = assert!(AGH_ENCODED_SIZE <= MIN_BLOCK_SIZE as usize);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgHeader {
    pub agno: u32,
    pub blocks: u64,
    pub free_blocks: u64,
    pub free_inodes: u64,
    pub orphan_root: u64,
}

impl AgHeader {
    pub fn encode(&self, buf: &mut [u8], blkno: u64, uuid: [u8; 16]) {
        buf.fill(0);
        BlockHeader {
            magic: magic::AG_HEADER,
            blkno,
            uuid,
            owner: self.agno as u64,
            lsn: 0,
        }
        .encode(buf);
        put_u32(buf, 48, self.agno);
        put_u64(buf, 56, self.blocks);
        put_u64(buf, 64, self.free_blocks);
        put_u64(buf, 72, self.free_inodes);
        put_u64(buf, 80, self.orphan_root);
    }

    /// Decode an AG header whose checksum was already verified.
    pub fn decode(buf: &[u8], blkno: u64, expect_agno: u32) -> Result<Self> {
        let h = AgHeader {
            agno: get_u32(buf, 48),
            blocks: get_u64(buf, 56),
            free_blocks: get_u64(buf, 64),
            free_inodes: get_u64(buf, 72),
            orphan_root: get_u64(buf, 80),
        };
        if h.agno != expect_agno {
            return Err(Error::corrupted(
                "AG header",
                blkno,
                format!("claims AG {}, expected {expect_agno}", h.agno),
            ));
        }
        if h.free_blocks > h.blocks {
            return Err(Error::corrupted(
                "AG header",
                blkno,
                format!("{} free blocks of {}", h.free_blocks, h.blocks),
            ));
        }
        Ok(h)
    }

    pub fn read(buf: &[u8], blkno: u64, uuid: &[u8; 16], agno: u32) -> Result<Self> {
        header::verify(buf, "AG header", magic::AG_HEADER, blkno, uuid)?;
        Self::decode(buf, blkno, agno)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc() -> (AgHeader, Vec<u8>) {
        let h = AgHeader {
            agno: 3,
            blocks: 1000,
            free_blocks: 900,
            free_inodes: 12,
            orphan_root: 0,
        };
        let mut b = vec![0; 512];
        h.encode(&mut b, 3002, [1; 16]);
        header::stamp(&mut b);
        (h, b)
    }

    #[test]
    fn round_trip() {
        let (h, b) = enc();
        assert_eq!(AgHeader::read(&b, 3002, &[1; 16], 3).unwrap(), h);
    }

    #[test]
    fn flipped_byte_is_corruption() {
        let (_, b) = enc();
        for pos in [1, 50, 60, 70, 85, 300] {
            let mut c = b.clone();
            c[pos] ^= 4;
            assert!(AgHeader::read(&c, 3002, &[1; 16], 3).is_err());
        }
    }

    #[test]
    fn inconsistent_counts_are_corruption() {
        let mut h = enc().0;
        h.free_blocks = 5000;
        let mut b = vec![0; 512];
        h.encode(&mut b, 3002, [1; 16]);
        header::stamp(&mut b);
        assert!(AgHeader::read(&b, 3002, &[1; 16], 3).is_err());
    }
}

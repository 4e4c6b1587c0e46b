//! The common metadata block header.
//!
//! ```text
//! 0   magic   u32   structure type
//! 4   crc     u32   crc32c of the whole block, this field taken as zero
//! 8   blkno   u64   the block's own address: catches misdirected writes
//! 16  uuid    [16]  file system UUID: catches blocks of an older file system
//! 32  owner   u64   inode number for per-inode trees, AG number otherwise
//! 40  lsn     u64   journal sequence of the transaction that last wrote it
//! 48  (structure-specific)
//! ```

use super::{crc_with_hole, get_u32, get_u64, put_u32, put_u64};
use crate::error::{Error, Result};

pub const HEADER_SIZE: usize = 48;
const CRC_OFF: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    pub magic: u32,
    pub blkno: u64,
    pub uuid: [u8; 16],
    pub owner: u64,
    pub lsn: u64,
}

impl BlockHeader {
    pub fn encode(&self, buf: &mut [u8]) {
        put_u32(buf, 0, self.magic);
        put_u64(buf, 8, self.blkno);
        buf[16..32].copy_from_slice(&self.uuid);
        put_u64(buf, 32, self.owner);
        put_u64(buf, 40, self.lsn);
    }

    pub fn decode(buf: &[u8]) -> Self {
        BlockHeader {
            magic: get_u32(buf, 0),
            blkno: get_u64(buf, 8),
            uuid: buf[16..32].try_into().unwrap(),
            owner: get_u64(buf, 32),
            lsn: get_u64(buf, 40),
        }
    }
}

/// A zeroed per-AG array block (bitmap or checksum block): header with
/// owner `agno`, then at @48 the index of the first item it covers.
pub fn init_ag_array(
    block: &mut [u8],
    magic: u32,
    blkno: u64,
    uuid: [u8; 16],
    agno: u32,
    first: u64,
) {
    block.fill(0);
    BlockHeader {
        magic,
        blkno,
        uuid,
        owner: agno as u64,
        lsn: 0,
    }
    .encode(block);
    put_u64(block, 48, first);
}

/// Stamp the checksum of a block whose header and body are encoded.
pub fn stamp(buf: &mut [u8]) {
    let crc = crc_with_hole(buf, CRC_OFF);
    put_u32(buf, CRC_OFF, crc);
}

/// Set the journal sequence and stamp.
pub fn stamp_lsn(buf: &mut [u8], lsn: u64) {
    put_u64(buf, 40, lsn);
    stamp(buf);
}

/// Whether a block's stored checksum matches its contents (nothing else
/// checked).
pub fn checksum_holds(buf: &[u8]) -> bool {
    buf.len() >= 512 && get_u32(buf, CRC_OFF) == crc_with_hole(buf, CRC_OFF)
}

/// Verify checksum, then magic, address and UUID. Returns the header.
pub fn verify(
    buf: &[u8],
    structure: &'static str,
    magic: u32,
    blkno: u64,
    uuid: &[u8; 16],
) -> Result<BlockHeader> {
    if buf.len() < 512 {
        return Err(Error::corrupted(
            structure,
            blkno,
            "block shorter than 512 bytes",
        ));
    }
    let stored = get_u32(buf, CRC_OFF);
    let actual = crc_with_hole(buf, CRC_OFF);
    if stored != actual {
        return Err(Error::corrupted(
            structure,
            blkno,
            format!("checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"),
        ));
    }
    let h = BlockHeader::decode(buf);
    if h.magic != magic {
        return Err(Error::corrupted(
            structure,
            blkno,
            format!("bad magic {:#010x}, expected {magic:#010x}", h.magic),
        ));
    }
    if h.blkno != blkno {
        return Err(Error::corrupted(
            structure,
            blkno,
            format!("block claims to be at {} (misdirected write)", h.blkno),
        ));
    }
    if &h.uuid != uuid {
        return Err(Error::corrupted(
            structure,
            blkno,
            "belongs to another file system (UUID)",
        ));
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut b = vec![0u8; 4096];
        BlockHeader {
            magic: 0x1234_5678,
            blkno: 42,
            uuid: [7; 16],
            owner: 9,
            lsn: 3,
        }
        .encode(&mut b);
        b[100] = 0xAB;
        stamp(&mut b);
        b
    }

    #[test]
    fn round_trip() {
        let b = sample();
        let h = verify(&b, "test", 0x1234_5678, 42, &[7; 16]).unwrap();
        assert_eq!(h.owner, 9);
        assert_eq!(h.lsn, 3);
    }

    #[test]
    fn flipped_byte_is_corruption() {
        for pos in [0, 5, 9, 20, 40, 100, 4095] {
            let mut b = sample();
            b[pos] ^= 0x10;
            assert!(matches!(
                verify(&b, "test", 0x1234_5678, 42, &[7; 16]),
                Err(Error::Corrupted { addr: 42, .. })
            ));
        }
    }

    #[test]
    fn misdirected_and_foreign_blocks_are_caught() {
        let b = sample();
        let e = verify(&b, "test", 0x1234_5678, 43, &[7; 16]).unwrap_err();
        assert!(e.to_string().contains("misdirected"), "{e}");
        let e = verify(&b, "test", 0x1234_5678, 42, &[8; 16]).unwrap_err();
        assert!(e.to_string().contains("UUID"), "{e}");
        let e = verify(&b, "test", 0x1111_1111, 42, &[7; 16]).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
    }
}

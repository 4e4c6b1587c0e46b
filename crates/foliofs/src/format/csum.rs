//! Data checksum blocks: a flat per-AG array with one crc32c per block of
//! the AG, indexed by AG block number. A direct read of N blocks finds its
//! checksums in one or two of these blocks. The stored value 0 means "no
//! checksum": free blocks, unwritten blocks and blocks under an in-place
//! overwrite (see docs/FORMAT.md, "Overwrites and torn blocks").
//!
//! ```text
//! 0   header   48   magic FCSM, owner = AG number
//! 48  first    u64  AG block number of entry 0
//! 56  (pad)    8
//! 64  crcs     u32 each; 4 KiB blocks hold 1,008 entries (4 MiB of data)
//! ```

use super::*;

pub const ENTRIES_OFFSET: usize = 64;

pub const fn entries_per_block(block_size: u32) -> u32 {
    (block_size - ENTRIES_OFFSET as u32) / 4
}

#[inline]
pub fn get(block: &[u8], i: u32) -> u32 {
    get_u32(block, ENTRIES_OFFSET + 4 * i as usize)
}

#[inline]
pub fn set(block: &mut [u8], i: u32, crc: u32) {
    put_u32(block, ENTRIES_OFFSET + 4 * i as usize, crc)
}

pub fn init(block: &mut [u8], blkno: u64, uuid: [u8; 16], agno: u32, first: u64) {
    header::init_ag_array(block, magic::CSUM, blkno, uuid, agno, first);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::header;

    #[test]
    fn round_trip_and_flip() {
        let mut b = vec![0; 4096];
        init(&mut b, 5, [1; 16], 0, 0);
        set(&mut b, 0, 0xdead_beef);
        set(&mut b, entries_per_block(4096) - 1, 7);
        header::stamp(&mut b);
        header::verify(&b, "checksum block", magic::CSUM, 5, &[1; 16]).unwrap();
        assert_eq!(get(&b, 0), 0xdead_beef);
        assert_eq!(get(&b, 1007), 7);
        b[70] ^= 1;
        assert!(header::verify(&b, "checksum block", magic::CSUM, 5, &[1; 16]).is_err());
    }

    #[test]
    fn data_crc_never_uses_the_sentinel() {
        assert_ne!(data_crc(&[0u8; 4096]), 0);
        assert_eq!(data_crc(b"abc"), crc32c::crc32c(b"abc"));
    }
}

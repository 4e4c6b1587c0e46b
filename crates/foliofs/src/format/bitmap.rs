//! Bitmap blocks: the block bitmap (one bit per block of the AG, set = in
//! use) and the inode bitmap (one bit per inode of the AG). Same layout,
//! different magic.
//!
//! ```text
//! 0   header   48   magic FBMP or FIMP, owner = AG number
//! 48  first    u64  index of the first bit this block covers
//! 56  (pad)    8
//! 64  bits     bit i of byte j is item first + 8*j + i
//! ```

use super::*;

pub const BITS_OFFSET: usize = 64;

/// Bits one bitmap block holds: 4 KiB blocks hold 32,256 bits, so one
/// block covers 126 MiB of an AG.
pub const fn bits_per_block(block_size: u32) -> u32 {
    (block_size - BITS_OFFSET as u32) * 8
}

#[inline]
pub fn get_bit(block: &[u8], i: u32) -> bool {
    block[BITS_OFFSET + (i / 8) as usize] & (1 << (i % 8)) != 0
}

#[inline]
pub fn set_bit(block: &mut [u8], i: u32, v: bool) {
    let byte = &mut block[BITS_OFFSET + (i / 8) as usize];
    if v {
        *byte |= 1 << (i % 8);
    } else {
        *byte &= !(1 << (i % 8));
    }
}

pub fn init(block: &mut [u8], magic: u32, blkno: u64, uuid: [u8; 16], agno: u32, first: u64) {
    header::init_ag_array(block, magic, blkno, uuid, agno, first);
}

pub fn first(block: &[u8]) -> u64 {
    get_u64(block, 48)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::header;

    #[test]
    fn round_trip_and_flip() {
        let mut b = vec![0; 512];
        init(&mut b, magic::BLOCK_BITMAP, 9, [2; 16], 1, 0);
        set_bit(&mut b, 0, true);
        set_bit(&mut b, 100, true);
        set_bit(&mut b, bits_per_block(512) - 1, true);
        header::stamp(&mut b);
        header::verify(&b, "block bitmap", magic::BLOCK_BITMAP, 9, &[2; 16]).unwrap();
        assert!(get_bit(&b, 0) && get_bit(&b, 100) && !get_bit(&b, 101));
        assert!(get_bit(&b, bits_per_block(512) - 1));
        assert_eq!(bits_per_block(4096), 32256);
        let mut c = b.clone();
        c[BITS_OFFSET + 7] ^= 0x80;
        assert!(header::verify(&c, "block bitmap", magic::BLOCK_BITMAP, 9, &[2; 16]).is_err());
    }
}

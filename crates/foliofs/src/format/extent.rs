//! An extent of a file's data fork (inline in the inode or in its extent
//! B+tree). Key: first file block. Value (16 bytes): device block u64,
//! length u32, flags u32 (bit 0: unwritten, reads as zeros).

use crate::error::{Error, Result};

pub const EXT_UNWRITTEN: u32 = 1;
/// Longest extent: keeps `len` in a u32 with room to merge.
pub const MAX_EXTENT_LEN: u64 = 1 << 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub lblk: u64,
    pub pblk: u64,
    pub len: u64,
    pub unwritten: bool,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.lblk + self.len
    }
    /// The tree or inline value of this extent.
    pub fn value(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(16);
        v.extend_from_slice(&self.pblk.to_le_bytes());
        v.extend_from_slice(&(self.len as u32).to_le_bytes());
        v.extend_from_slice(&(if self.unwritten { EXT_UNWRITTEN } else { 0 }).to_le_bytes());
        v
    }
    /// Decode the extent of `ino` under `key`, checking what the value
    /// alone can tell (its size, a length, no overflow). Where it lies
    /// is the geometry's to check: `Geometry::extent`.
    pub fn decode(ino: u64, key: u64, v: &[u8]) -> Result<Self> {
        if v.len() != 16 {
            return Err(Error::corrupted(
                "extent",
                ino,
                format!("inode {ino}: extent value of {} bytes", v.len()),
            ));
        }
        let e = Extent {
            lblk: key,
            pblk: u64::from_le_bytes(v[..8].try_into().unwrap()),
            len: u32::from_le_bytes(v[8..12].try_into().unwrap()) as u64,
            unwritten: u32::from_le_bytes(v[12..16].try_into().unwrap()) & EXT_UNWRITTEN != 0,
        };
        if e.len == 0 || e.lblk.checked_add(e.len).is_none() || e.pblk.checked_add(e.len).is_none()
        {
            return Err(e.outside(ino));
        }
        Ok(e)
    }
    /// The error naming this extent of `ino` as outside the data area.
    pub fn outside(&self, ino: u64) -> Error {
        Error::corrupted(
            "extent",
            self.pblk,
            format!(
                "inode {ino}: extent at file block {} ({} blocks) outside the data area",
                self.lblk, self.len
            ),
        )
    }
}

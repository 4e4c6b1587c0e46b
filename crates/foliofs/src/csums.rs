//! The data-checksum store: one crc32c per data block, in the checksum
//! blocks of each AG (`format::csum`), changed through the journal like
//! any metadata. A data block's checksum sits at `Geometry::csum_loc`.
//! Lookups and updates go one pass over the checksum blocks that cover a
//! run of data blocks, so a 1 MiB direct read fetches its 256 checksums
//! from one or two blocks.

use crate::error::Result;
use crate::format::{csum, magic};
use crate::geometry::Geometry;
use crate::meta::Meta;

/// The checksum blocks covering data blocks [start, start + len): for each,
/// (checksum block, first index in it, how many, offset from `start`).
fn csum_spans(
    geo: &Geometry,
    start: u64,
    len: u64,
) -> impl Iterator<Item = (u64, u32, u64, u64)> + '_ {
    let per = geo.csums_per_block;
    let loc = move |b: u64| geo.csum_loc(b);
    let mut done = 0u64;
    std::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let (blk, idx) = loc(start + done);
        let n = (per - idx as u64).min(len - done);
        let at = done;
        done += n;
        Some((blk, idx, n, at))
    })
}

/// Set data checksums for `crcs.len()` blocks from `start`.
pub fn set_csums(meta: &mut Meta, start: u64, crcs: &[u32]) -> Result<()> {
    let geo = meta.geo.clone();
    for (blk, idx, n, at) in csum_spans(&geo, start, crcs.len() as u64) {
        meta.read(blk, magic::CSUM, "checksum block")?;
        let buf = meta.write(blk);
        for k in 0..n as usize {
            csum::set(buf, idx + k as u32, crcs[at as usize + k]);
        }
    }
    Ok(())
}

pub fn clear_csums(meta: &mut Meta, start: u64, len: u64) -> Result<()> {
    let geo = meta.geo.clone();
    for (blk, idx, n, _) in csum_spans(&geo, start, len) {
        let buf = meta.read(blk, magic::CSUM, "checksum block")?;
        if (0..n as u32).any(|k| csum::get(buf, idx + k) != 0) {
            let buf = meta.write(blk);
            for k in 0..n as u32 {
                csum::set(buf, idx + k, 0);
            }
        }
    }
    Ok(())
}

/// Read the stored checksums of `len` blocks from `start` (one pass over
/// the checksum blocks that cover them).
pub fn get_csums(meta: &mut Meta, start: u64, len: u64, out: &mut Vec<u32>) -> Result<()> {
    let geo = meta.geo.clone();
    for (blk, idx, n, _) in csum_spans(&geo, start, len) {
        let buf = meta.read(blk, magic::CSUM, "checksum block")?;
        out.extend((0..n as u32).map(|k| csum::get(buf, idx + k)));
    }
    Ok(())
}

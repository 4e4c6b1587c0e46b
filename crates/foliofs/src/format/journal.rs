//! Journal records. The journal is a circular region of AG 0. A transaction
//! is one or more descriptor blocks, each followed by the full images of the
//! metadata blocks it lists, then a commit block. The commit block's crc
//! covers every descriptor and image of the transaction, so a transaction
//! cut short by a crash fails verification and replay stops before it.
//!
//! Descriptor:
//! ```text
//! 0   header   48   magic FJDS, blkno = its device address, lsn = sequence
//! 48  count    u32  images following this descriptor
//! 52  flags    u32  bit 0: last descriptor of the transaction; bit 1:
//!                   committed here (no commit block: the transaction is
//!                   this descriptor and its images)
//! 56  data_crc u32  with bit 1: crc32c over the images, in order
//! 60  (pad)    4
//! 64  targets  count x u64: home address of each image, in order; bit 63
//!              set: the image is a data block (the overwrite log), not
//!              metadata
//! ```
//! Commit:
//! ```text
//! 0   header   48   magic FJCM, blkno = its device address, lsn = sequence
//! 48  blocks   u32  descriptor and image blocks in the transaction
//! 52  data_crc u32  crc32c over those blocks, in journal order
//! 56  (zero to the end of the block)
//! ```

use super::*;

pub const TARGETS_OFFSET: usize = 64;
pub const DESC_LAST: u32 = 1;
/// The descriptor is also the commit: its `data_crc` covers its images.
pub const DESC_COMMITTED: u32 = 2;
/// Set in a descriptor's target: the image is logged file data.
pub const DATA_TARGET: u64 = 1 << 63;

pub fn targets_per_desc(block_size: usize) -> usize {
    (block_size - TARGETS_OFFSET) / 8
}

/// Where a descriptor stands in its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DescEnd {
    /// More descriptors follow.
    More,
    /// The last descriptor; a commit block follows its images.
    Last,
    /// The only descriptor, and the commit too: `data_crc` over the
    /// images that follow it.
    Committed(u32),
}

/// Encode a descriptor and stamp its header checksum (once).
pub fn encode_desc(
    buf: &mut [u8],
    blkno: u64,
    uuid: [u8; 16],
    seq: u64,
    targets: &[u64],
    end: DescEnd,
) {
    assert!(targets.len() <= targets_per_desc(buf.len()));
    buf.fill(0);
    BlockHeader {
        magic: magic::JOURNAL_DESC,
        blkno,
        uuid,
        owner: 0,
        lsn: seq,
    }
    .encode(buf);
    put_u32(buf, 48, targets.len() as u32);
    let flags = match end {
        DescEnd::More => 0,
        DescEnd::Last => DESC_LAST,
        DescEnd::Committed(data_crc) => {
            put_u32(buf, 56, data_crc);
            DESC_LAST | DESC_COMMITTED
        }
    };
    put_u32(buf, 52, flags);
    for (i, t) in targets.iter().enumerate() {
        put_u64(buf, TARGETS_OFFSET + 8 * i, *t);
    }
    header::stamp(buf);
}

/// A decoded descriptor.
#[derive(Debug, PartialEq, Eq)]
pub struct Desc {
    pub targets: Vec<u64>,
    pub last: bool,
    /// Committed here: the crc its images must have.
    pub commit_crc: Option<u32>,
}

/// Decode a verified descriptor. None if the count is impossible for the
/// block size.
pub fn decode_desc(buf: &[u8]) -> Option<Desc> {
    let count = get_u32(buf, 48) as usize;
    if count > targets_per_desc(buf.len()) {
        return None;
    }
    let targets = (0..count)
        .map(|i| get_u64(buf, TARGETS_OFFSET + 8 * i))
        .collect();
    let flags = get_u32(buf, 52);
    Some(Desc {
        targets,
        last: flags & (DESC_LAST | DESC_COMMITTED) != 0,
        commit_crc: (flags & DESC_COMMITTED != 0).then(|| get_u32(buf, 56)),
    })
}

pub fn encode_commit(
    buf: &mut [u8],
    blkno: u64,
    uuid: [u8; 16],
    seq: u64,
    blocks: u32,
    data_crc: u32,
) {
    buf.fill(0);
    BlockHeader {
        magic: magic::JOURNAL_COMMIT,
        blkno,
        uuid,
        owner: 0,
        lsn: seq,
    }
    .encode(buf);
    put_u32(buf, 48, blocks);
    put_u32(buf, 52, data_crc);
    header::stamp(buf);
}

/// (blocks, data_crc) of a verified commit block.
pub fn decode_commit(buf: &[u8]) -> (u32, u32) {
    (get_u32(buf, 48), get_u32(buf, 52))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn desc_round_trip_and_flip() {
        let mut b = vec![0; 512];
        for (end, last, commit_crc) in [
            (DescEnd::More, false, None),
            (DescEnd::Last, true, None),
            (DescEnd::Committed(0xfeed), true, Some(0xfeed)),
        ] {
            b.fill(0xA5);
            encode_desc(&mut b, 10, [1; 16], 5, &[100, 200, 300], end);
            let h = header::verify(&b, "journal descriptor", magic::JOURNAL_DESC, 10, &[1; 16])
                .unwrap();
            assert_eq!(h.lsn, 5);
            let d = decode_desc(&b).unwrap();
            assert_eq!(
                (d.targets, d.last, d.commit_crc),
                (vec![100, 200, 300], last, commit_crc)
            );
            assert!(b[TARGETS_OFFSET + 24..].iter().all(|&x| x == 0));
        }
        b[70] ^= 1;
        assert!(
            header::verify(&b, "journal descriptor", magic::JOURNAL_DESC, 10, &[1; 16]).is_err()
        );
    }

    #[test]
    fn commit_round_trip_and_flip() {
        let mut b = vec![0; 512];
        encode_commit(&mut b, 11, [1; 16], 5, 4, 0xabc);
        header::verify(&b, "journal commit", magic::JOURNAL_COMMIT, 11, &[1; 16]).unwrap();
        assert_eq!(decode_commit(&b), (4, 0xabc));
        b[52] ^= 1;
        assert!(header::verify(&b, "journal commit", magic::JOURNAL_COMMIT, 11, &[1; 16]).is_err());
    }

    #[test]
    fn impossible_count_is_rejected() {
        let mut b = vec![0; 512];
        encode_desc(&mut b, 10, [1; 16], 5, &[1], DescEnd::More);
        put_u32(&mut b, 48, 10_000);
        assert!(decode_desc(&b).is_none());
    }
}

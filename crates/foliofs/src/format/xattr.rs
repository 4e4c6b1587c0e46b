//! An extended attribute's entries in the inode's xattr B+tree, keyed like
//! directory entries (name hash, 16-bit counter).
//!
//! A value may be up to 64 KiB (Linux's XATTR_SIZE_MAX); one tree entry
//! holds at most a leaf's worth (block size - 340 bytes), so a larger
//! value is split into fragments stored under free counters of the same
//! hash bucket:
//! - head: name length u8 (1..=255), name, the value's first bytes;
//! - continuation: 0u8, the head's counter u16, index u16 (from 1), then
//!   the next bytes of the value. Continuations are joined in index order.

/// Largest value (XATTR_SIZE_MAX).
pub const XATTR_VALUE_MAX: usize = 65536;

/// A continuation's header: marker, head counter, index.
pub const CONT_HEADER: usize = 5;

/// One decoded tree entry of an xattr tree.
#[derive(Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    Head {
        name: &'a [u8],
        data: &'a [u8],
    },
    Cont {
        head: u16,
        index: u16,
        data: &'a [u8],
    },
}

/// A head entry: the name and the value's first bytes.
pub fn head(name: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(1 + name.len() + data.len());
    v.push(name.len() as u8);
    v.extend_from_slice(name);
    v.extend_from_slice(data);
    v
}

/// Continuation `index` (from 1) of the value whose head has counter
/// `head`.
pub fn cont(head: u16, index: u16, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(CONT_HEADER + data.len());
    v.push(0);
    v.extend_from_slice(&head.to_le_bytes());
    v.extend_from_slice(&index.to_le_bytes());
    v.extend_from_slice(data);
    v
}

/// Decode one entry; `None` when it is malformed.
pub fn piece(v: &[u8]) -> Option<Piece<'_>> {
    match *v.first()? as usize {
        0 if v.len() >= CONT_HEADER => Some(Piece::Cont {
            head: u16::from_le_bytes([v[1], v[2]]),
            index: u16::from_le_bytes([v[3], v[4]]),
            data: &v[CONT_HEADER..],
        }),
        0 => None,
        nl if v.len() > nl => Some(Piece::Head {
            name: &v[1..1 + nl],
            data: &v[1 + nl..],
        }),
        _ => None,
    }
}

/// A continuation as (head's counter, index, data).
pub type Cont<'a> = (u16, u16, &'a [u8]);

/// Join the fragments of the value whose head has counter `head`:
/// `conts` are the bucket's continuations. Fails when an index is
/// missing or repeated or the value is too long.
pub fn assemble(
    first: &[u8],
    head: u16,
    conts: &[(u16, u16, &[u8])],
) -> std::result::Result<Vec<u8>, String> {
    let mut mine: Vec<_> = conts.iter().filter(|c| c.0 == head).collect();
    mine.sort_by_key(|c| c.1);
    let mut v = first.to_vec();
    for (i, c) in mine.iter().enumerate() {
        if c.1 as usize != i + 1 {
            return Err(format!("fragment {} where {} was expected", c.1, i + 1));
        }
        v.extend_from_slice(c.2);
    }
    if v.len() > XATTR_VALUE_MAX {
        return Err(format!(
            "value of {} bytes exceeds {XATTR_VALUE_MAX}",
            v.len()
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip() {
        assert_eq!(
            piece(&head(b"user.a", b"xyz")),
            Some(Piece::Head {
                name: b"user.a",
                data: b"xyz"
            })
        );
        assert_eq!(
            piece(&cont(513, 2, b"q")),
            Some(Piece::Cont {
                head: 513,
                index: 2,
                data: b"q"
            })
        );
    }

    #[test]
    fn pieces_decode_and_refuse_short_entries() {
        assert_eq!(
            piece(b"\x03abcxyz"),
            Some(Piece::Head {
                name: b"abc",
                data: b"xyz"
            })
        );
        assert_eq!(
            piece(&[0, 7, 0, 2, 0, 9]),
            Some(Piece::Cont {
                head: 7,
                index: 2,
                data: &[9]
            })
        );
        assert_eq!(piece(b"\x05ab"), None);
        assert_eq!(piece(&[0, 1]), None);
        assert_eq!(piece(&[]), None);
    }

    #[test]
    fn assembly_needs_every_fragment_in_order() {
        let conts: Vec<(u16, u16, &[u8])> = vec![(3, 2, b"cc"), (3, 1, b"bb"), (4, 1, b"zz")];
        assert_eq!(assemble(b"aa", 3, &conts).unwrap(), b"aabbcc");
        assert_eq!(assemble(b"aa", 5, &conts).unwrap(), b"aa");
        let gap: Vec<(u16, u16, &[u8])> = vec![(3, 2, b"cc")];
        assert!(assemble(b"aa", 3, &gap).is_err());
        let big = vec![0u8; XATTR_VALUE_MAX];
        let over: Vec<(u16, u16, &[u8])> = vec![(0, 1, b"x")];
        assert!(assemble(&big, 0, &over).is_err());
    }
}

//! B+tree nodes, shared by extent maps, directories, xattrs and the orphan
//! list. Keys are u64; values are variable-length byte strings (16 bytes for
//! extents, up to ~270 bytes for directory entries). Interior nodes hold
//! (first key of child, child block) pairs, with 8-byte values.
//!
//! ```text
//! 0   header     48   magic FBTR, owner = inode number (0 for the orphan tree)
//! 48  level      u16  0 = leaf
//! 50  nr         u16  entries in the node
//! 52  tree_type  u8   1 extents, 2 directory, 3 xattr, 4 orphans
//! 53  (pad)      11
//! 64  entries    nr x (key u64, vlen u16, value[vlen]), packed, ascending keys
//! ```

use super::*;
use crate::error::{Error, Result};

pub const ENTRIES_OFFSET: usize = 64;
pub const ENTRY_OVERHEAD: usize = 10;
/// Depth limit: even 512-byte blocks with the largest directory entries
/// (one per leaf, 44 children per interior node) reach 2^63 keys below 12.
pub const MAX_LEVELS: u16 = 12;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TreeType {
    Extents = 1,
    Dir = 2,
    Xattr = 3,
    Orphans = 4,
}

impl TreeType {
    pub fn name(self) -> &'static str {
        match self {
            TreeType::Extents => "extent tree node",
            TreeType::Dir => "directory tree node",
            TreeType::Xattr => "xattr tree node",
            TreeType::Orphans => "orphan tree node",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub level: u16,
    pub entries: Vec<(u64, Vec<u8>)>,
}

/// Bytes available for entries in one node.
pub fn capacity(block_size: usize) -> usize {
    block_size - ENTRIES_OFFSET
}

impl Node {
    pub fn encoded_len(&self) -> usize {
        self.entries
            .iter()
            .map(|(_, v)| ENTRY_OVERHEAD + v.len())
            .sum()
    }

    /// Encode into `buf`. The caller has checked that the node fits.
    pub fn encode(&self, buf: &mut [u8], blkno: u64, uuid: [u8; 16], owner: u64, tt: TreeType) {
        assert!(
            self.encoded_len() <= capacity(buf.len()),
            "btree node overflow"
        );
        buf.fill(0);
        BlockHeader {
            magic: magic::BTREE,
            blkno,
            uuid,
            owner,
            lsn: 0,
        }
        .encode(buf);
        put_u16(buf, 48, self.level);
        put_u16(buf, 50, self.entries.len() as u16);
        buf[52] = tt as u8;
        let mut p = ENTRIES_OFFSET;
        for (k, v) in &self.entries {
            put_u64(buf, p, *k);
            put_u16(buf, p + 8, v.len() as u16);
            buf[p + 10..p + 10 + v.len()].copy_from_slice(v);
            p += ENTRY_OVERHEAD + v.len();
        }
    }

    /// Decode a node whose checksum and header were verified, checking the
    /// structure: owner, type, level bound, entry bounds, key order.
    pub fn decode(buf: &[u8], blkno: u64, owner: u64, tt: TreeType) -> Result<Self> {
        let view = NodeView::parse(buf, blkno, owner, tt)?;
        let entries = view
            .entries()
            .map(|e| e.map(|(k, v)| (k, v.to_vec())))
            .collect::<Result<Vec<_>>>()?;
        Ok(Node {
            level: view.level,
            entries,
        })
    }
}

/// A node read in place: the header checked at once, each entry checked
/// as it is reached (bounds, key order, interior value length), nothing
/// copied. Lookups walk views; only a node being changed is decoded.
#[derive(Clone, Copy)]
pub struct NodeView<'a> {
    pub level: u16,
    /// Entries in the node.
    pub nr: usize,
    buf: &'a [u8],
    blkno: u64,
    tt: TreeType,
}

impl<'a> NodeView<'a> {
    /// Check the header of a node whose checksum was verified: owner,
    /// type, level bound, an interior node not empty.
    pub fn parse(buf: &'a [u8], blkno: u64, owner: u64, tt: TreeType) -> Result<Self> {
        let bad = |r: String| Err(Error::corrupted(tt.name(), blkno, r));
        let h = BlockHeader::decode(buf);
        if h.owner != owner {
            return bad(format!("owned by {}, expected {owner}", h.owner));
        }
        if buf[52] != tt as u8 {
            return bad(format!("tree type {}, expected {}", buf[52], tt as u8));
        }
        let level = get_u16(buf, 48);
        if level >= MAX_LEVELS {
            return bad(format!("level {level} too deep"));
        }
        let nr = get_u16(buf, 50) as usize;
        if level > 0 && nr == 0 {
            return bad("empty interior node".into());
        }
        Ok(NodeView {
            level,
            nr,
            buf,
            blkno,
            tt,
        })
    }

    /// The entries in order, each an error once the node is malformed.
    pub fn entries(&self) -> Entries<'a> {
        Entries {
            view: *self,
            i: 0,
            p: ENTRIES_OFFSET,
            prev: None,
        }
    }

    /// Interior entry `i`: its key and child value. Interior values are
    /// 8 bytes (`Entries` refuses others), so the entries sit at a fixed
    /// stride and one is read without walking those before it.
    pub fn interior_entry(&self, i: usize) -> Result<(u64, &'a [u8])> {
        let bad = |r: String| Err(Error::corrupted(self.tt.name(), self.blkno, r));
        debug_assert!(self.level > 0, "fixed stride only in interior nodes");
        if i >= self.nr {
            return bad(format!("no entry {i}"));
        }
        let p = ENTRIES_OFFSET + i * (ENTRY_OVERHEAD + 8);
        if p + ENTRY_OVERHEAD + 8 > self.buf.len() {
            return bad(format!("entry {i} runs past the block"));
        }
        let vlen = get_u16(self.buf, p + 8) as usize;
        if vlen != 8 {
            return bad(format!("interior entry {i} has value length {vlen}"));
        }
        Ok((get_u64(self.buf, p), &self.buf[p + 10..p + 18]))
    }

    /// Where `key` sits in the node, or would go.
    pub fn slot(&self, key: u64) -> Result<Slot> {
        let mut at = ENTRIES_OFFSET;
        let mut found = None;
        for e in self.entries() {
            let (k, value) = e?;
            let len = ENTRY_OVERHEAD + value.len();
            if found.is_none() {
                if k == key {
                    found = Some((at, Some(len)));
                } else if k > key {
                    found = Some((at, None));
                }
            }
            at += len;
        }
        let (pos, old) = found.unwrap_or((at, None));
        Ok(Slot {
            at: pos,
            old,
            end: at,
        })
    }
}

/// A key's place in an encoded node: the byte offset of its entry (or of
/// the entry it would go before), that entry's length when the key is
/// there, and where the entries end.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub at: usize,
    pub old: Option<usize>,
    pub end: usize,
}

impl Slot {
    /// Whether the node holds its entries with `value` put at this slot.
    pub fn fits(&self, block_size: usize, value: &[u8]) -> bool {
        self.end - self.old.unwrap_or(0) + ENTRY_OVERHEAD + value.len() <= block_size
    }

    /// Put (key, value) at this slot of the encoded node `buf`, in place,
    /// replacing the entry there if the key is present; the bytes after it
    /// move. The caller checked that it `fits`.
    pub fn put(&self, buf: &mut [u8], key: u64, value: &[u8]) {
        let old = self.old.unwrap_or(0);
        let new = ENTRY_OVERHEAD + value.len();
        buf.copy_within(self.at + old..self.end, self.at + new);
        if new < old {
            buf[self.end - (old - new)..self.end].fill(0);
        }
        put_u64(buf, self.at, key);
        put_u16(buf, self.at + 8, value.len() as u16);
        buf[self.at + 10..self.at + new].copy_from_slice(value);
        if self.old.is_none() {
            put_u16(buf, 50, get_u16(buf, 50) + 1);
        }
    }

    /// Take the entry at this slot (the key is present) out of the
    /// encoded node `buf`, in place, returning its value.
    pub fn take(&self, buf: &mut [u8]) -> Vec<u8> {
        let old = self.old.expect("a present key");
        let value = buf[self.at + 10..self.at + old].to_vec();
        buf.copy_within(self.at + old..self.end, self.at);
        buf[self.end - old..self.end].fill(0);
        put_u16(buf, 50, get_u16(buf, 50) - 1);
        value
    }
}

/// Iterator over a `NodeView`'s entries: (key, value).
pub struct Entries<'a> {
    view: NodeView<'a>,
    i: usize,
    p: usize,
    prev: Option<u64>,
}

impl<'a> Iterator for Entries<'a> {
    type Item = Result<(u64, &'a [u8])>;

    fn next(&mut self) -> Option<Self::Item> {
        let NodeView {
            level,
            nr,
            buf,
            blkno,
            tt,
        } = self.view;
        if self.i >= nr {
            return None;
        }
        let (i, p) = (self.i, self.p);
        // A malformed entry ends the walk after its error.
        self.i = nr;
        let bad = |r: String| Some(Err(Error::corrupted(tt.name(), blkno, r)));
        if p + ENTRY_OVERHEAD > buf.len() {
            return bad(format!("entry {i} runs past the block"));
        }
        let k = get_u64(buf, p);
        let vlen = get_u16(buf, p + 8) as usize;
        if p + ENTRY_OVERHEAD + vlen > buf.len() {
            return bad(format!("entry {i} value runs past the block"));
        }
        if level > 0 && vlen != 8 {
            return bad(format!("interior entry {i} has value length {vlen}"));
        }
        if self.prev.is_some_and(|prev| prev >= k) {
            return bad(format!("keys out of order at entry {i}"));
        }
        self.prev = Some(k);
        self.i = i + 1;
        self.p = p + ENTRY_OVERHEAD + vlen;
        Some(Ok((k, &buf[p + 10..p + 10 + vlen])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::header;

    fn sample() -> Node {
        Node {
            level: 0,
            entries: vec![(1, vec![1, 2, 3]), (5, vec![]), (900, vec![7; 40])],
        }
    }

    fn encode(n: &Node) -> Vec<u8> {
        let mut b = vec![0; 512];
        n.encode(&mut b, 33, [5; 16], 12, TreeType::Dir);
        header::stamp(&mut b);
        b
    }

    #[test]
    fn round_trip() {
        let b = encode(&sample());
        header::verify(&b, "dir", magic::BTREE, 33, &[5; 16]).unwrap();
        assert_eq!(Node::decode(&b, 33, 12, TreeType::Dir).unwrap(), sample());
    }

    #[test]
    fn in_place_edits_encode_as_a_whole_node_would() {
        // Insert before, between and after; replace longer and shorter;
        // take first, middle and last: the bytes equal a fresh encoding.
        let mut node = sample();
        let mut b = encode(&node);
        let edits: [(u64, Option<Vec<u8>>); 8] = [
            (0, Some(vec![9; 7])),
            (3, Some(vec![])),
            (2000, Some(vec![4; 20])),
            (5, Some(vec![6; 30])),
            (900, Some(vec![1])),
            (0, None),
            (5, None),
            (2000, None),
        ];
        for (key, value) in edits {
            let view = NodeView::parse(&b, 33, 12, TreeType::Dir).unwrap();
            let slot = view.slot(key).unwrap();
            let i = node.entries.partition_point(|(k, _)| *k < key);
            match value {
                Some(v) => {
                    assert!(slot.fits(b.len(), &v));
                    slot.put(&mut b, key, &v);
                    if node.entries.get(i).is_some_and(|(k, _)| *k == key) {
                        node.entries[i].1 = v;
                    } else {
                        node.entries.insert(i, (key, v));
                    }
                }
                None => {
                    let (_, old) = node.entries.remove(i);
                    assert_eq!(slot.take(&mut b), old);
                }
            }
            let mut want = vec![0; 512];
            node.encode(&mut want, 33, [5; 16], 12, TreeType::Dir);
            assert_eq!(b[48..], want[48..], "after editing key {key}");
        }
        let full = vec![0u8; 512 - ENTRIES_OFFSET];
        let slot = NodeView::parse(&b, 33, 12, TreeType::Dir)
            .unwrap()
            .slot(1)
            .unwrap();
        assert!(!slot.fits(512, &full), "a value that cannot fit is refused");
    }

    #[test]
    fn flipped_byte_is_corruption() {
        let b = encode(&sample());
        for pos in [1, 49, 52, 64, 75, 100, 511] {
            let mut c = b.clone();
            c[pos] ^= 8;
            assert!(header::verify(&c, "dir", magic::BTREE, 33, &[5; 16]).is_err());
        }
    }

    #[test]
    fn interior_entries_read_at_their_stride_agree_with_the_walk() {
        let node = Node {
            level: 1,
            entries: (0..20u64)
                .map(|i| (i * 10, (1000 + i).to_le_bytes().to_vec()))
                .collect(),
        };
        let b = encode(&node);
        let view = NodeView::parse(&b, 33, 12, TreeType::Dir).unwrap();
        for (i, e) in view.entries().enumerate() {
            let (k, v) = e.unwrap();
            assert_eq!(view.interior_entry(i).unwrap(), (k, v), "entry {i}");
        }
        assert!(view.interior_entry(20).is_err(), "past the count");
        // A value that is not 8 bytes, and a count that runs past the
        // block, are corruption, not a misread.
        let mut c = b.clone();
        put_u16(&mut c, ENTRIES_OFFSET + 3 * 18 + 8, 9);
        let view = NodeView::parse(&c, 33, 12, TreeType::Dir).unwrap();
        assert!(view.interior_entry(2).is_ok());
        assert!(view.interior_entry(3).is_err());
        let mut c = b.clone();
        put_u16(&mut c, 50, 30);
        let view = NodeView::parse(&c, 33, 12, TreeType::Dir).unwrap();
        assert!(
            view.interior_entry(29).is_err(),
            "entry 29 runs past the block"
        );
    }

    #[test]
    fn hostile_nodes_decode_to_errors() {
        // Valid checksum, broken structure: lengths past the block, keys out
        // of order, wrong owner, wrong type.
        let mut b = encode(&sample());
        put_u16(&mut b, 50, 400);
        assert!(Node::decode(&b, 33, 12, TreeType::Dir).is_err());
        let mut b = encode(&sample());
        put_u16(&mut b, ENTRIES_OFFSET + 8, 60000);
        assert!(Node::decode(&b, 33, 12, TreeType::Dir).is_err());
        let n = Node {
            level: 0,
            entries: vec![(5, vec![]), (5, vec![])],
        };
        assert!(Node::decode(&encode(&n), 33, 12, TreeType::Dir).is_err());
        assert!(Node::decode(&encode(&sample()), 33, 13, TreeType::Dir).is_err());
        assert!(Node::decode(&encode(&sample()), 33, 12, TreeType::Xattr).is_err());
    }
}

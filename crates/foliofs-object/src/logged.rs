//! The blocks in the WAL not yet folded into chunks, with how many of
//! them each chunk has: what a checkpoint would write is known without
//! walking them (`Logged::chunks`), so the checkpointer can weigh a fold
//! at every flush.

use bytes::Bytes;
use std::collections::btree_map::Range;
use std::collections::{BTreeMap, HashMap};

/// Block number -> its newest bytes in the WAL.
pub(crate) struct Logged {
    blocks: BTreeMap<u64, Bytes>,
    /// Chunk index -> blocks of it in `blocks` (never 0).
    per_chunk: HashMap<u64, u32>,
    chunk_blocks: u64,
}

impl Logged {
    pub(crate) fn new(chunk_blocks: u64) -> Logged {
        Logged {
            blocks: BTreeMap::new(),
            per_chunk: HashMap::new(),
            chunk_blocks,
        }
    }

    pub(crate) fn insert(&mut self, b: u64, d: Bytes) {
        if self.blocks.insert(b, d).is_none() {
            *self.per_chunk.entry(b / self.chunk_blocks).or_default() += 1;
        }
    }

    pub(crate) fn remove(&mut self, b: u64) {
        if self.blocks.remove(&b).is_some() {
            let idx = b / self.chunk_blocks;
            let n = self.per_chunk.get_mut(&idx).expect("counted at insert");
            *n -= 1;
            if *n == 0 {
                self.per_chunk.remove(&idx);
            }
        }
    }

    pub(crate) fn get(&self, b: u64) -> Option<&Bytes> {
        self.blocks.get(&b)
    }

    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The chunks that have blocks here: the chunk objects a checkpoint
    /// of them writes.
    pub(crate) fn chunks(&self) -> usize {
        self.per_chunk.len()
    }

    /// How many blocks of chunk `idx` are here.
    pub(crate) fn in_chunk(&self, idx: u64) -> u64 {
        self.per_chunk.get(&idx).map_or(0, |&n| u64::from(n))
    }

    pub(crate) fn range(&self, blocks: std::ops::Range<u64>) -> Range<'_, u64, Bytes> {
        self.blocks.range(blocks)
    }

    /// The blocks alone (what a checkpoint folds).
    pub(crate) fn blocks(&self) -> BTreeMap<u64, Bytes> {
        self.blocks.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_count_each_chunk_with_blocks_once() {
        let mut l = Logged::new(4);
        let d = Bytes::from_static(b"x");
        for b in [0, 1, 3, 9, 9, 17] {
            l.insert(b, d.clone());
        }
        assert_eq!((l.len(), l.chunks()), (5, 3));
        l.remove(9);
        assert_eq!((l.len(), l.chunks()), (4, 2));
        l.remove(9);
        l.remove(0);
        l.remove(1);
        assert_eq!((l.len(), l.chunks()), (2, 2));
        l.remove(3);
        l.remove(17);
        assert!(l.is_empty());
        assert_eq!(l.chunks(), 0);
    }
}

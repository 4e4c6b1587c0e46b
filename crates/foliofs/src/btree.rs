//! The on-disk B+tree: u64 keys, variable-length values, one tree per
//! inode fork (extents, directory entries, xattrs) plus the orphan list.
//!
//! Interior entries are (lower bound of the child's keys, child block). The
//! first entry's bound never rises above any key below it: when the first
//! child is removed, its bound passes to the next. Paths are explicit
//! stacks, never recursion, and depth is capped by `MAX_LEVELS`.
//! Nodes are split when their encoded bytes overflow and freed when empty;
//! a root with one child collapses.

use crate::alloc::Alloc;
use crate::error::{Error, Result};
use crate::format::btree_node::{capacity, Node, TreeType, MAX_LEVELS};
use crate::format::magic;
use crate::meta::{Kind, Meta};

/// Which tree: its owner (inode number, or 0), type, and the AG new nodes
/// should come from.
#[derive(Clone, Copy, Debug)]
pub struct Tree {
    pub owner: u64,
    pub tt: TreeType,
    pub ag: u32,
}

/// Largest value a leaf can hold for this block size.
pub fn max_value_len(block_size: u64) -> usize {
    // Two entries must fit a node after a split; one entry must fit alone.
    capacity(block_size as usize) - crate::format::btree_node::ENTRY_OVERHEAD
}

impl Tree {
    pub fn read(&self, meta: &mut Meta, blk: u64) -> Result<Node> {
        if !meta.geo.is_data_block(blk) {
            return Err(Error::corrupted(
                self.tt.name(),
                blk,
                "pointer outside the data area",
            ));
        }
        let buf = meta.read(blk, magic::BTREE, self.tt.name())?;
        Node::decode(buf, blk, self.owner, self.tt)
    }

    fn write(&self, meta: &mut Meta, blk: u64, node: &Node) {
        let uuid = meta.uuid;
        node.encode(meta.write(blk), blk, uuid, self.owner, self.tt);
    }

    fn new_node(&self, meta: &mut Meta, alloc: &mut Alloc, near: u64, node: &Node) -> Result<u64> {
        let blk = alloc.alloc_one(meta, self.ag, Some(near))?;
        meta.create(blk, Kind::Header);
        self.write(meta, blk, node);
        Ok(blk)
    }

    fn child(&self, node: &Node, idx: usize, blk: u64) -> Result<u64> {
        let v = &node.entries[idx].1;
        let c = u64::from_le_bytes(v[..8].try_into().unwrap());
        if c == blk {
            return Err(Error::corrupted(
                self.tt.name(),
                blk,
                "node points to itself",
            ));
        }
        Ok(c)
    }

    /// Index of the child to descend into for `key`.
    fn route(node: &Node, key: u64) -> usize {
        node.entries
            .partition_point(|(k, _)| *k <= key)
            .saturating_sub(1)
    }

    /// Descend to the leaf for `key`, returning the path of (block, node,
    /// child index) with the leaf last.
    fn descend(&self, meta: &mut Meta, root: u64, key: u64) -> Result<Vec<(u64, Node, usize)>> {
        let mut path: Vec<(u64, Node, usize)> = Vec::new();
        let mut blk = root;
        loop {
            let node = self.read(meta, blk)?;
            if let Some((_, parent, _)) = path.last() {
                if node.level + 1 != parent.level {
                    return Err(Error::corrupted(
                        self.tt.name(),
                        blk,
                        format!("level {} under level {}", node.level, parent.level),
                    ));
                }
            }
            if node.level == 0 {
                path.push((blk, node, 0));
                return Ok(path);
            }
            if path.len() as u16 >= MAX_LEVELS {
                return Err(Error::corrupted(self.tt.name(), blk, "tree too deep"));
            }
            let idx = Self::route(&node, key);
            let next = self.child(&node, idx, blk)?;
            path.push((blk, node, idx));
            blk = next;
        }
    }

    /// Leftmost (or rightmost) leaf below `blk`, appending to `path`.
    fn descend_edge(
        &self,
        meta: &mut Meta,
        mut blk: u64,
        right: bool,
        path: &mut Vec<(u64, Node, usize)>,
    ) -> Result<()> {
        loop {
            let node = self.read(meta, blk)?;
            if node.level == 0 {
                path.push((blk, node, 0));
                return Ok(());
            }
            if node.entries.is_empty() || path.len() as u16 >= MAX_LEVELS {
                return Err(Error::corrupted(
                    self.tt.name(),
                    blk,
                    "empty or too deep interior node",
                ));
            }
            let idx = if right { node.entries.len() - 1 } else { 0 };
            let next = self.child(&node, idx, blk)?;
            path.push((blk, node, idx));
            blk = next;
        }
    }

    /// The entry with the largest key <= `key`.
    pub fn find_le(&self, meta: &mut Meta, root: u64, key: u64) -> Result<Option<(u64, Vec<u8>)>> {
        if root == 0 {
            return Ok(None);
        }
        let mut path = self.descend(meta, root, key)?;
        let (_, leaf, _) = path.last().unwrap();
        let i = leaf.entries.partition_point(|(k, _)| *k <= key);
        if i > 0 {
            return Ok(Some(leaf.entries[i - 1].clone()));
        }
        // Everything in this leaf is larger: the answer is the last entry of
        // the previous leaf, if any.
        path.pop();
        while let Some((blk, node, idx)) = path.pop() {
            if idx > 0 {
                let c = self.child(&node, idx - 1, blk)?;
                path.push((blk, node, idx - 1));
                self.descend_edge(meta, c, true, &mut path)?;
                let (_, leaf, _) = path.last().unwrap();
                return Ok(leaf.entries.last().cloned());
            }
        }
        Ok(None)
    }

    /// Entries with keys >= `key`, in order, from one leaf (then the next
    /// leaves) until at least `min` are collected or the tree ends.
    pub fn scan(
        &self,
        meta: &mut Meta,
        root: u64,
        key: u64,
        min: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        if root == 0 {
            return Ok(out);
        }
        let mut path = self.descend(meta, root, key)?;
        loop {
            let (_, leaf, _) = path.pop().unwrap();
            out.extend(leaf.entries.into_iter().filter(|(k, _)| *k >= key));
            if out.len() >= min {
                return Ok(out);
            }
            // Up to the first ancestor with a right sibling, then down its left edge.
            loop {
                let Some((blk, node, idx)) = path.pop() else {
                    return Ok(out);
                };
                if idx + 1 < node.entries.len() {
                    let c = self.child(&node, idx + 1, blk)?;
                    path.push((blk, node, idx + 1));
                    self.descend_edge(meta, c, false, &mut path)?;
                    break;
                }
            }
        }
    }

    /// The first entry with key >= `key`.
    pub fn find_ge(&self, meta: &mut Meta, root: u64, key: u64) -> Result<Option<(u64, Vec<u8>)>> {
        Ok(self.scan(meta, root, key, 1)?.into_iter().next())
    }

    pub fn get(&self, meta: &mut Meta, root: u64, key: u64) -> Result<Option<Vec<u8>>> {
        Ok(self
            .find_le(meta, root, key)?
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v))
    }

    /// Insert or replace `key`.
    pub fn insert(
        &self,
        meta: &mut Meta,
        alloc: &mut Alloc,
        root: &mut u64,
        key: u64,
        value: &[u8],
    ) -> Result<()> {
        let cap = capacity(meta.geo.block_size as usize);
        assert!(
            value.len() <= max_value_len(meta.geo.block_size),
            "btree value too large"
        );
        if *root == 0 {
            let leaf = Node {
                level: 0,
                entries: vec![(key, value.to_vec())],
            };
            *root = self.new_node(meta, alloc, 0, &leaf)?;
            return Ok(());
        }
        let mut path = self.descend(meta, *root, key)?;
        let (mut blk, mut node, _) = path.pop().unwrap();
        match node.entries.binary_search_by_key(&key, |(k, _)| *k) {
            Ok(i) => node.entries[i].1 = value.to_vec(),
            Err(i) => node.entries.insert(i, (key, value.to_vec())),
        }
        loop {
            if node.encoded_len() <= cap {
                self.write(meta, blk, &node);
                return Ok(());
            }
            let pieces = split(&mut node, cap);
            self.write(meta, blk, &node);
            let mut seps = Vec::with_capacity(pieces.len());
            for piece in &pieces {
                let rblk = self.new_node(meta, alloc, blk, piece)?;
                seps.push((piece.entries[0].0, rblk.to_le_bytes().to_vec()));
            }
            match path.pop() {
                Some((pblk, mut parent, idx)) => {
                    for (k, sep) in seps.into_iter().enumerate() {
                        parent.entries.insert(idx + 1 + k, sep);
                    }
                    blk = pblk;
                    node = parent;
                }
                None => {
                    let mut new_root = Node {
                        level: node.level + 1,
                        entries: vec![(0, blk.to_le_bytes().to_vec())],
                    };
                    new_root.entries.extend(seps);
                    if new_root.level >= MAX_LEVELS {
                        return Err(Error::corrupted(
                            self.tt.name(),
                            blk,
                            "tree would exceed the depth limit",
                        ));
                    }
                    *root = self.new_node(meta, alloc, blk, &new_root)?;
                    return Ok(());
                }
            }
        }
    }

    /// Remove `key`; returns its value if it was there.
    pub fn remove(
        &self,
        meta: &mut Meta,
        alloc: &mut Alloc,
        root: &mut u64,
        key: u64,
    ) -> Result<Option<Vec<u8>>> {
        if *root == 0 {
            return Ok(None);
        }
        let mut path = self.descend(meta, *root, key)?;
        let (mut blk, mut node, _) = path.pop().unwrap();
        let Ok(i) = node.entries.binary_search_by_key(&key, |(k, _)| *k) else {
            return Ok(None);
        };
        let (_, old) = node.entries.remove(i);
        loop {
            if !node.entries.is_empty() {
                self.write(meta, blk, &node);
                break;
            }
            alloc.free(meta, blk, 1)?;
            match path.pop() {
                Some((pblk, mut parent, idx)) => {
                    let (bound, _) = parent.entries.remove(idx);
                    if idx == 0 {
                        if let Some(first) = parent.entries.first_mut() {
                            first.0 = bound;
                        }
                    }
                    blk = pblk;
                    node = parent;
                }
                None => {
                    *root = 0;
                    return Ok(Some(old));
                }
            }
        }
        // Collapse a root that has a single child.
        loop {
            let r = self.read(meta, *root)?;
            if r.level == 0 || r.entries.len() != 1 {
                break;
            }
            let c = self.child(&r, 0, *root)?;
            alloc.free(meta, *root, 1)?;
            *root = c;
        }
        Ok(Some(old))
    }

    /// Every node block of the tree (for freeing and for fsck), with depth
    /// checks. Calls `leaf` for each leaf's entries.
    pub fn walk(
        &self,
        meta: &mut Meta,
        root: u64,
        mut leaf: impl FnMut(u64, &Node) -> Result<()>,
    ) -> Result<Vec<u64>> {
        let mut blocks = Vec::new();
        if root == 0 {
            return Ok(blocks);
        }
        let mut stack = vec![(root, u16::MAX)];
        while let Some((blk, parent_level)) = stack.pop() {
            let node = self.read(meta, blk)?;
            if parent_level != u16::MAX && node.level + 1 != parent_level {
                return Err(Error::corrupted(
                    self.tt.name(),
                    blk,
                    format!("level {} under level {parent_level}", node.level),
                ));
            }
            blocks.push(blk);
            if blocks.len() as u64 > meta.geo.total_blocks {
                return Err(Error::corrupted(self.tt.name(), root, "tree has a cycle"));
            }
            if node.level == 0 {
                leaf(blk, &node)?;
            } else {
                for i in (0..node.entries.len()).rev() {
                    stack.push((self.child(&node, i, blk)?, node.level));
                }
            }
        }
        Ok(blocks)
    }

    /// Free every node of the tree.
    pub fn destroy(&self, meta: &mut Meta, alloc: &mut Alloc, root: &mut u64) -> Result<()> {
        for b in self.walk(meta, *root, |_, _| Ok(()))? {
            alloc.free(meta, b, 1)?;
        }
        *root = 0;
        Ok(())
    }
}

/// Split an overflowing node: `node` keeps the first piece, the rest are
/// returned. Two halves by bytes when both fit (the usual case), otherwise
/// greedy packing (large entries in small blocks).
fn split(node: &mut Node, cap: usize) -> Vec<Node> {
    use crate::format::btree_node::ENTRY_OVERHEAD;
    let sizes: Vec<usize> = node
        .entries
        .iter()
        .map(|(_, v)| ENTRY_OVERHEAD + v.len())
        .collect();
    let total: usize = sizes.iter().sum();
    let mut acc = 0;
    let mut at = sizes.len() - 1;
    for (i, s) in sizes.iter().enumerate() {
        acc += s;
        if acc * 2 >= total {
            at = i + 1;
            break;
        }
    }
    let at = at.clamp(1, sizes.len() - 1);
    let left: usize = sizes[..at].iter().sum();
    let mut cuts = Vec::new();
    if left <= cap && total - left <= cap {
        cuts.push(at);
    } else {
        let mut acc = 0;
        for (i, s) in sizes.iter().enumerate() {
            if acc + s > cap && i > 0 {
                cuts.push(i);
                acc = 0;
            }
            acc += s;
        }
    }
    let mut pieces = Vec::new();
    for &c in cuts.iter().rev() {
        pieces.push(Node {
            level: node.level,
            entries: node.entries.split_off(c),
        });
    }
    pieces.reverse();
    pieces
}

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
use crate::format::btree_node::{capacity, Node, NodeView, TreeType, MAX_LEVELS};
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

/// One step down the tree: an interior node (block, level, entries) and
/// the child taken.
#[derive(Clone, Copy)]
struct Step {
    blk: u64,
    level: u16,
    nr: usize,
    idx: usize,
}

impl Tree {
    /// A node's block, checked to be in the data area and verified.
    fn block<'m>(&self, meta: &'m mut Meta, blk: u64) -> Result<&'m [u8]> {
        if !meta.geo.is_data_block(blk) {
            return Err(Error::corrupted(
                self.tt.name(),
                blk,
                "pointer outside the data area",
            ));
        }
        meta.read(blk, magic::BTREE, self.tt.name())
    }

    /// A node decoded, to be changed.
    pub fn read(&self, meta: &mut Meta, blk: u64) -> Result<Node> {
        Node::decode(self.block(meta, blk)?, blk, self.owner, self.tt)
    }

    /// A node read in place, for lookups.
    fn view<'m>(&self, meta: &'m mut Meta, blk: u64) -> Result<NodeView<'m>> {
        NodeView::parse(self.block(meta, blk)?, blk, self.owner, self.tt)
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

    /// The child block an interior entry's value names, in node `blk`.
    fn child_ptr(&self, value: &[u8], blk: u64) -> Result<u64> {
        let c = u64::from_le_bytes(value[..8].try_into().unwrap());
        if c == blk {
            return Err(Error::corrupted(
                self.tt.name(),
                blk,
                "node points to itself",
            ));
        }
        Ok(c)
    }

    fn child(&self, node: &Node, idx: usize, blk: u64) -> Result<u64> {
        self.child_ptr(&node.entries[idx].1, blk)
    }

    /// Child `idx` of the interior node `v` at `blk`.
    fn child_of(&self, v: &NodeView, idx: usize, blk: u64) -> Result<u64> {
        self.child_ptr(v.interior_entry(idx)?.1, blk)
    }

    /// The child of interior `v` (at `blk`) to descend into for `key`:
    /// the last whose lower bound is <= `key`, else the first. A binary
    /// search over the fixed-stride entries; the bounds around the pick
    /// are checked to be in order (the rest are, if the node is sound:
    /// fsck walks them all).
    fn route(&self, v: &NodeView, key: u64, blk: u64) -> Result<(usize, u64)> {
        // The first entry in 1..nr whose bound is above `key`.
        let (mut lo, mut hi) = (1, v.nr);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if v.interior_entry(mid)?.0 > key {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let i = lo - 1;
        let (k, value) = v.interior_entry(i)?;
        if lo < v.nr && v.interior_entry(lo)?.0 <= k {
            return Err(Error::corrupted(
                self.tt.name(),
                blk,
                format!("keys out of order at entry {lo}"),
            ));
        }
        Ok((i, self.child_ptr(value, blk)?))
    }

    /// A node at level `level` (block `blk`) may sit under the last step.
    fn check_level(&self, path: &[Step], level: u16, blk: u64) -> Result<()> {
        if let Some(p) = path.last() {
            if level + 1 != p.level {
                return Err(Error::corrupted(
                    self.tt.name(),
                    blk,
                    format!("level {level} under level {}", p.level),
                ));
            }
        }
        if level > 0 && path.len() as u16 >= MAX_LEVELS {
            return Err(Error::corrupted(self.tt.name(), blk, "tree too deep"));
        }
        Ok(())
    }

    /// Descend to the leaf for `key`: the interior steps, root first, and
    /// the leaf's block. Nodes are read in place, none decoded.
    fn path_to(&self, meta: &mut Meta, root: u64, key: u64) -> Result<(Vec<Step>, u64)> {
        let mut path = Vec::new();
        let mut blk = root;
        loop {
            let v = self.view(meta, blk)?;
            self.check_level(&path, v.level, blk)?;
            if v.level == 0 {
                return Ok((path, blk));
            }
            let (idx, next) = self.route(&v, key, blk)?;
            path.push(Step {
                blk,
                level: v.level,
                nr: v.nr,
                idx,
            });
            blk = next;
        }
    }

    /// The leftmost (or rightmost) leaf below `blk`, the steps appended
    /// to `path`.
    fn edge(
        &self,
        meta: &mut Meta,
        mut blk: u64,
        right: bool,
        path: &mut Vec<Step>,
    ) -> Result<u64> {
        loop {
            let v = self.view(meta, blk)?;
            self.check_level(path, v.level, blk)?;
            if v.level == 0 {
                return Ok(blk);
            }
            let idx = if right { v.nr - 1 } else { 0 };
            let next = self.child_of(&v, idx, blk)?;
            path.push(Step {
                blk,
                level: v.level,
                nr: v.nr,
                idx,
            });
            blk = next;
        }
    }

    /// The leaf after (or before) the one `path` leads to, `path` moved
    /// to it; None at the tree's end.
    fn sibling(&self, meta: &mut Meta, path: &mut Vec<Step>, right: bool) -> Result<Option<u64>> {
        while let Some(s) = path.pop() {
            let idx = if right {
                (s.idx + 1 < s.nr).then_some(s.idx + 1)
            } else {
                s.idx.checked_sub(1)
            };
            if let Some(idx) = idx {
                let c = self.child_of(&self.view(meta, s.blk)?, idx, s.blk)?;
                path.push(Step { idx, ..s });
                return self.edge(meta, c, !right, path).map(Some);
            }
        }
        Ok(None)
    }

    /// The entry of leaf `leaf` with the largest key <= `key`.
    fn last_le(&self, meta: &mut Meta, leaf: u64, key: u64) -> Result<Option<(u64, Vec<u8>)>> {
        let mut best = None;
        for e in self.view(meta, leaf)?.entries() {
            let (k, value) = e?;
            if k > key {
                break;
            }
            best = Some((k, value));
        }
        Ok(best.map(|(k, v)| (k, v.to_vec())))
    }

    /// The entry with the largest key <= `key`.
    pub fn find_le(&self, meta: &mut Meta, root: u64, key: u64) -> Result<Option<(u64, Vec<u8>)>> {
        if root == 0 {
            return Ok(None);
        }
        let (mut path, leaf) = self.path_to(meta, root, key)?;
        if let Some(e) = self.last_le(meta, leaf, key)? {
            return Ok(Some(e));
        }
        // Everything in this leaf is larger: the answer is the last entry of
        // the previous leaf, if any.
        match self.sibling(meta, &mut path, false)? {
            Some(prev) => self.last_le(meta, prev, u64::MAX),
            None => Ok(None),
        }
    }

    /// The first `max` entries with keys >= `key`, in order (fewer at the
    /// tree's end).
    pub fn scan(
        &self,
        meta: &mut Meta,
        root: u64,
        key: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        self.scan_range(meta, root, key, u64::MAX, max)
    }

    /// The first `max` entries with keys in [lo, hi], in order (fewer
    /// when the range holds fewer). Only the entries returned are copied.
    pub fn scan_range(
        &self,
        meta: &mut Meta,
        root: u64,
        lo: u64,
        hi: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        if root == 0 {
            return Ok(out);
        }
        let (mut path, mut leaf) = self.path_to(meta, root, lo)?;
        loop {
            for e in self.view(meta, leaf)?.entries() {
                let (k, value) = e?;
                if k > hi {
                    return Ok(out);
                }
                if k >= lo {
                    if out.len() >= max {
                        return Ok(out);
                    }
                    out.push((k, value.to_vec()));
                }
            }
            match self.sibling(meta, &mut path, true)? {
                Some(next) => leaf = next,
                None => return Ok(out),
            }
        }
    }

    /// The first entry with key >= `key`.
    pub fn find_ge(&self, meta: &mut Meta, root: u64, key: u64) -> Result<Option<(u64, Vec<u8>)>> {
        Ok(self
            .scan_range(meta, root, key, u64::MAX, 1)?
            .into_iter()
            .next())
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
        let (mut path, mut blk) = self.path_to(meta, *root, key)?;
        // The usual case: the leaf has room, and takes the entry in place.
        let slot = self.view(meta, blk)?.slot(key)?;
        if slot.fits(meta.geo.block_size as usize, value) {
            slot.put(meta.write(blk), key, value);
            return Ok(());
        }
        let mut node = self.read(meta, blk)?;
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
                Some(step) => {
                    let mut parent = self.read(meta, step.blk)?;
                    for (k, sep) in seps.into_iter().enumerate() {
                        parent.entries.insert(step.idx + 1 + k, sep);
                    }
                    blk = step.blk;
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
        let (mut path, mut blk) = self.path_to(meta, *root, key)?;
        let leaf = self.view(meta, blk)?;
        let slot = leaf.slot(key)?;
        if slot.old.is_none() {
            return Ok(None);
        }
        if leaf.nr > 1 {
            // The leaf keeps entries: taken out in place.
            return Ok(Some(slot.take(meta.write(blk))));
        }
        let mut node = self.read(meta, blk)?;
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
                Some(step) => {
                    let mut parent = self.read(meta, step.blk)?;
                    let (bound, _) = parent.entries.remove(step.idx);
                    if step.idx == 0 {
                        if let Some(first) = parent.entries.first_mut() {
                            first.0 = bound;
                        }
                    }
                    blk = step.blk;
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
            let r = self.view(meta, *root)?;
            if r.level == 0 || r.nr != 1 {
                break;
            }
            let c = self.child_of(&r, 0, *root)?;
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

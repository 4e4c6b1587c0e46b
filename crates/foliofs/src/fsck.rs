//! The checker. It reads every structure (each read verifies checksum and
//! structure) and cross-references them: blocks used by files and trees
//! against the block bitmaps and AG counters, inodes against the inode
//! bitmaps, link counts against directory entries, the directory tree's
//! connectivity, the orphan list, and optionally every data checksum.
//!
//! Exit codes follow e2fsck: 0 clean, 1 errors corrected, 4 errors left
//! uncorrected, 8 operational error.

use crate::btree::Tree;
use crate::device::{AlignedBuf, Device};
use crate::error::{Error, Result};
use crate::format::ag_header::AgHeader;
use crate::format::btree_node::TreeType;
use crate::format::dirent as dir;
use crate::format::extent::Extent;
use crate::format::inode::{
    inline_len, DiskInode, FLAGS_KNOWN, FLAG_ORPHAN, INODE_SIZE, LITERAL_SIZE,
};
use crate::format::inode::{FileType, Fork, ForkFormat, Timespec};
use crate::format::superblock::Superblock;
use crate::format::{bitmap, csum, data_crc, magic};
use crate::fs::RENAME_NOREPLACE;
use crate::fs::{Fs, MountOptions};
use crate::meta::{self, Kind, Meta};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

#[derive(Clone, Debug, Default)]
pub struct FsckOptions {
    /// Fix what is safe to fix: bitmaps, counters, link counts, the
    /// orphan list, inodes that nothing reaches and nothing would ever
    /// free (they are freed), and directory entries: one naming a free
    /// inode, a directory's second name, the entry closing a loop (each
    /// removed), one of the wrong type. A file with links but no name, and
    /// a directory that no entry names, get the name `#<ino>` in
    /// /lost+found. An extent over blocks that another file or the fixed
    /// metadata claimed first, or a live tree's node, or outside the
    /// data area, is cut out of its file's map from the first such block
    /// with the extents after it, and the file is cut there (an
    /// unwritten one is dropped alone).
    pub repair: bool,
    /// Also read every data block and verify its checksum.
    pub check_data: bool,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Problem {
    pub structure: String,
    pub addr: u64,
    pub message: String,
    pub repaired: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub problems: Vec<Problem>,
    pub journal_replayed: u64,
    pub inodes_used: u64,
    pub directories: u64,
    pub blocks_used: u64,
    pub data_blocks_checked: u64,
    /// Written data blocks without a checksum (each is also a problem:
    /// the overwrite log leaves none).
    pub data_blocks_unverified: u64,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
    /// e2fsck-style exit code.
    pub fn exit_code(&self) -> i32 {
        if self.problems.is_empty() {
            0
        } else if self.problems.iter().all(|p| p.repaired) {
            1
        } else {
            4
        }
    }
}

struct Checker {
    meta: Meta,
    report: Report,
    repair: bool,
    /// Owner of each block (0 = fixed metadata), by block number.
    owner: HashMap<u64, u64>,
    /// Blocks claimed twice: never freed by a repair.
    shared: HashSet<u64>,
    /// For a repair, the nodes of every live inode's trees and of the
    /// orphan list that verify, each with its tree's owner, found before
    /// any inode claims its blocks (`find_nodes`): a node keeps its
    /// block against an extent of another file that points there.
    nodes: HashMap<u64, u64>,
    /// Blocks a repair freed with their inode: the space and checksum
    /// checks release them without naming each.
    freed: HashSet<u64>,
    /// Inodes with no links and no entries: only the orphan list frees
    /// them, and a repair of the list frees them itself.
    unlinked: Vec<u64>,
    /// The orphan tree's blocks.
    orphan_blocks: Vec<u64>,
    /// Inode bitmap blocks that did not read: named once, and a repair
    /// rebuilds them from the inodes (`check_inode`).
    imap_lost: HashSet<u64>,
    /// Repairs of directory entries, made through a mount once the rest
    /// is repaired, each with the index of the problem it fixes.
    entry_fixes: Vec<(EntryFix, usize)>,
    /// Entries that still read in a directory tree a repair dropped:
    /// (directory, name, inode). What they name is put back under its
    /// name once it is named in /lost+found (`fix_entries`).
    salvaged: Vec<(u64, Vec<u8>, u64)>,
    /// Blocks a repair gave to a rebuilt extent tree (`build_trees`):
    /// the space check marks them used without naming each.
    allocated: HashSet<u64>,
    /// Extent maps a repair rebuilds as trees once every inode has
    /// claimed its blocks.
    to_build: Vec<Build>,
    /// Where the search for a free block for a rebuilt tree resumes.
    free_from: u64,
    /// Directories that lost their name, each with the directory its
    /// record names as its parent, when the root reaches that one: a
    /// repair names it `#<ino>` there rather than in /lost+found.
    homes: HashMap<u64, u64>,
    /// Inodes a repair cleared (their slot did not decode), each with
    /// the problem that says so: one that directories name as their
    /// parent is made anew (`remake_dirs`).
    cleared: Vec<(u64, usize)>,
    /// Runs of written data blocks: (first block, count, inode, first
    /// file block), so `fsck --data` names each file and offset.
    written: Vec<(u64, u64, u64, u64)>,
    used: Vec<u64>,
    links: HashMap<u64, u32>,
    subdirs: HashMap<u64, u32>,
    parent_seen: HashMap<u64, u64>,
    inodes: HashMap<u64, (FileType, u32, u64, u32)>, // kind, nlink, parent, flags
    dirs: Vec<u64>,
    /// (directory, entry) pairs, checked once every inode is known.
    dirents: Vec<(u64, dir::Dirent)>,
}

impl Checker {
    fn push(&mut self, structure: &str, addr: u64, message: String, repaired: bool) {
        self.report.problems.push(Problem {
            structure: structure.to_string(),
            addr,
            message,
            repaired,
        });
    }

    fn problem(&mut self, structure: &str, addr: u64, message: String) {
        self.push(structure, addr, message, false);
    }

    /// Commit a repair's changes once they fill the transaction (as the
    /// engine's long work does), so that a large repair never outgrows
    /// the journal. Each step leaves the image no worse: at most blocks
    /// not yet given back.
    fn maybe_commit(&mut self) {
        if self.repair && self.meta.tx_filling() {
            if let Err(e) = self.meta.commit() {
                self.err(e);
            }
        }
    }

    /// A problem that a repair fixes (the caller fixes it when `repair`).
    fn fixed(&mut self, structure: &str, addr: u64, message: String) {
        self.push(structure, addr, message, self.repair);
    }

    /// A problem that `fix` repairs through a mount (`fix_entries`).
    fn entry_fix(&mut self, structure: &str, addr: u64, message: String, fix: EntryFix) {
        if self.repair {
            self.entry_fixes.push((fix, self.report.problems.len()));
        }
        self.fixed(structure, addr, message);
    }

    fn is_used(&self, b: u64) -> bool {
        self.used[(b / 64) as usize] & (1 << (b % 64)) != 0
    }

    /// Give block `b` back (a repair freed its owner), unless another
    /// owner claims it too; the space and checksum checks then release it
    /// without naming it.
    fn release(&mut self, b: u64) {
        if !self.shared.contains(&b) {
            self.owner.remove(&b);
            self.used[(b / 64) as usize] &= !(1 << (b % 64));
            self.freed.insert(b);
        }
    }

    fn err(&mut self, e: Error) {
        match e {
            Error::Corrupted {
                structure,
                addr,
                reason,
            } => self.problem(structure, addr, reason),
            Error::DataChecksum { ino, offset, addr } => self.problem(
                "data block",
                addr,
                format!("inode {ino} offset {offset}: checksum mismatch"),
            ),
            other => self.problem("device", 0, other.to_string()),
        }
    }

    /// Why blocks `blk..blk + len` cannot be claimed without a second
    /// owner: the first that lies past the device, is claimed already or
    /// is a node of a live tree (`nodes`), and why.
    fn taken(&self, blk: u64, len: u64) -> Option<(u64, String)> {
        for b in blk..blk.saturating_add(len) {
            if b >= self.meta.geo.total_blocks {
                return Some((b, format!("block {b} is past the end of the device")));
            }
            let why = match (self.owner.get(&b), self.nodes.get(&b)) {
                (Some(0), _) => format!("block {b} is fixed metadata"),
                (Some(prev), _) => format!("block {b} is claimed by inode {prev}"),
                (None, Some(0)) => format!("block {b} is a node of the orphan list"),
                (None, Some(n)) => format!("block {b} is a node of a tree of inode {n}"),
                (None, None) => continue,
            };
            return Some((b, why));
        }
        None
    }

    /// A block no one claims, for a rebuilt tree: in AG `ag`'s data area
    /// if it has one, else in the next AG's.
    fn free_block(&mut self, ag: u32) -> Option<u64> {
        let geo = &self.meta.geo;
        let start = geo.ag_start(ag).max(self.free_from);
        let total = geo.total_blocks;
        (start..total)
            .chain(0..start)
            .find(|&b| geo.is_data_block(b) && !self.is_used(b) && !self.shared.contains(&b))
            .inspect(|&b| self.free_from = b + 1)
    }

    fn claim(&mut self, blk: u64, len: u64, owner: u64, what: &str) {
        for b in blk..blk + len {
            if b >= self.meta.geo.total_blocks {
                self.problem(
                    what,
                    b,
                    format!("inode {owner}: block past the end of the device"),
                );
                return;
            }
            if let Some(prev) = self.owner.insert(b, owner) {
                self.shared.insert(b);
                self.problem(
                    what,
                    b,
                    format!(
                        "block claimed by inode {owner} and by {}",
                        if prev == 0 {
                            "fixed metadata".to_string()
                        } else {
                            format!("inode {prev}")
                        }
                    ),
                );
            }
            self.used[(b / 64) as usize] |= 1 << (b % 64);
        }
    }
}

/// The fields of `sb` that mkfs fixes for good (FORMAT.md, "Copies"):
/// the others zeroed.
fn mkfs_fixed(sb: &Superblock) -> Superblock {
    Superblock {
        flags: 0,
        tail_pos: 0,
        tail_seq: 0,
        generation: 0,
        version: 0,
        ..sb.clone()
    }
}

/// The superblock copies of AG 1 (agbno 0 and 1), found where `sb`'s
/// geometry puts them or, if none decodes there, by a scan (its
/// geometry may be what is wrong): when both decode at their own place,
/// agree with each other and disagree with `sb` in what mkfs fixed, the
/// first, its block, and the fields that differ. None with one AG (no
/// copies), or copies that do not decode or do not agree (nothing to
/// go by).
fn copies_disagree(dev: &dyn Device, sb: &Superblock) -> Result<Option<(Superblock, u64, String)>> {
    if sb.ag_count < 2 {
        return Ok(None);
    }
    let read = |blk: u64, bs: u32| -> Result<Option<Superblock>> {
        let at = blk.saturating_mul(bs as u64);
        if at.saturating_add(bs as u64) > dev.len() {
            return Ok(None);
        }
        let mut buf = AlignedBuf::zeroed(bs as usize);
        dev.read_at(&mut buf, at)?;
        Ok(Superblock::decode(&buf, blk).ok())
    };
    let first = match read(sb.ag_blocks, sb.block_size)? {
        Some(copy) => Some((copy, sb.ag_blocks)),
        None => meta::read_superblock_backup(dev).ok(),
    };
    let Some((copy, at)) = first else {
        return Ok(None);
    };
    let Some(second) = read(at + 1, copy.block_size)? else {
        return Ok(None);
    };
    let (a, b, mine) = (mkfs_fixed(&copy), mkfs_fixed(&second), mkfs_fixed(sb));
    if a != b || a == mine {
        return Ok(None);
    }
    let fields = [
        (
            "uuid",
            format!("{:x?}", mine.uuid),
            format!("{:x?}", a.uuid),
        ),
        (
            "block_size",
            mine.block_size.to_string(),
            a.block_size.to_string(),
        ),
        (
            "total_blocks",
            mine.total_blocks.to_string(),
            a.total_blocks.to_string(),
        ),
        (
            "ag_blocks",
            mine.ag_blocks.to_string(),
            a.ag_blocks.to_string(),
        ),
        (
            "ag_count",
            mine.ag_count.to_string(),
            a.ag_count.to_string(),
        ),
        (
            "inodes_per_ag",
            mine.inodes_per_ag.to_string(),
            a.inodes_per_ag.to_string(),
        ),
        (
            "inode_size",
            mine.inode_size.to_string(),
            a.inode_size.to_string(),
        ),
        (
            "journal_start",
            mine.journal_start.to_string(),
            a.journal_start.to_string(),
        ),
        (
            "journal_blocks",
            mine.journal_blocks.to_string(),
            a.journal_blocks.to_string(),
        ),
        (
            "root_ino",
            mine.root_ino.to_string(),
            a.root_ino.to_string(),
        ),
        (
            "bmap_blocks",
            mine.bmap_blocks.to_string(),
            a.bmap_blocks.to_string(),
        ),
        (
            "imap_blocks",
            mine.imap_blocks.to_string(),
            a.imap_blocks.to_string(),
        ),
        (
            "csum_blocks",
            mine.csum_blocks.to_string(),
            a.csum_blocks.to_string(),
        ),
        (
            "itable_blocks",
            mine.itable_blocks.to_string(),
            a.itable_blocks.to_string(),
        ),
        (
            "label",
            format!("{:?}", mine.label),
            format!("{:?}", a.label),
        ),
        (
            "mkfs_time",
            mine.mkfs_time.to_string(),
            a.mkfs_time.to_string(),
        ),
    ];
    let wrong: Vec<String> = fields
        .iter()
        .filter(|(_, m, c)| m != c)
        .map(|(name, m, c)| format!("{name} {m}, the copies {c}"))
        .collect();
    // The copy as read: its journal position is mkfs's, not taken.
    Ok(Some((copy, at, wrong.join("; "))))
}

/// Check the file system on `dev`. With `repair` off nothing is written:
/// a journal that needs replay is replayed into a memory overlay.
pub fn fsck(
    dev: Arc<dyn Device>,
    opts: &FsckOptions,
    mut progress: impl FnMut(u64, u64),
) -> Result<Report> {
    let mut sb_problems = Vec::new();
    let mut sb = match meta::read_superblock(&*dev) {
        Ok(mut sb) => {
            // One slot that does not decode is what a torn superblock
            // write leaves, by design: a check does not count it, and a
            // repair rewrites it (the next write goes to the slot after
            // the one in use: the damaged one, whichever it is).
            let damaged = match opts.repair {
                true => meta::damaged_superblock_slots(&*dev, sb.block_size)?,
                false => Vec::new(),
            };
            for e in damaged {
                let Error::Corrupted { addr, reason, .. } = e else {
                    return Err(e);
                };
                meta::write_superblock(&*dev, &mut sb)?;
                sb_problems.push((addr, format!("slot {addr}: {reason}; rewritten")));
            }
            if let Some((copy, at, wrong)) = copies_disagree(&*dev, &sb)? {
                // Behind a valid checksum: the copies, two that agree,
                // hold what mkfs fixed, and nothing rewrites those fields.
                let same_log = (sb.journal_start, sb.journal_blocks)
                    == (copy.journal_start, copy.journal_blocks)
                    && sb.tail_pos < copy.journal_blocks;
                let mut lost = "";
                sb = match same_log {
                    true => Superblock {
                        flags: sb.flags,
                        tail_pos: sb.tail_pos,
                        tail_seq: sb.tail_seq,
                        generation: sb.generation,
                        version: sb.version,
                        ..copy
                    },
                    // The slots' journal position came with the wrong
                    // journal: not replayed, as from a copy alone.
                    false => {
                        lost = " (the journal not replayed: its position was for another \
                                journal; what it held is lost)";
                        meta::read_superblock_backup(&*dev)?.0
                    }
                };
                let done = match opts.repair {
                    true => {
                        meta::write_superblock(&*dev, &mut sb)?;
                        meta::write_superblock(&*dev, &mut sb)?;
                        "; taken from the copies, both slots rewritten"
                    }
                    false => "",
                };
                let message = format!(
                    "fields fixed at mkfs differ from the copies at blocks {at} and {} \
                     ({wrong}){done}{lost}",
                    at + 1
                );
                sb_problems.push((0, message));
            }
            sb
        }
        Err(e @ Error::Corrupted { .. }) => {
            let Ok((mut sb, at)) = meta::read_superblock_backup(&*dev) else {
                return Err(e);
            };
            if opts.repair {
                meta::write_superblock(&*dev, &mut sb)?;
                meta::write_superblock(&*dev, &mut sb)?;
            }
            let message = match opts.repair {
                true => format!(
                    "{e}; both slots rewritten from the copy at block {at} \
                     (the journal not replayed: what it held is lost)"
                ),
                false => format!("{e}; the copy at block {at} is good"),
            };
            sb_problems.push((0, message));
            sb
        }
        Err(e) => return Err(e),
    };
    meta::check_device_size(&*dev, &sb)?;
    let (dev, replayed) = if opts.repair {
        let n = meta::replay(&*dev, &mut sb)?;
        // A repair writes transactions of this engine's format: like a
        // read-write mount, it raises an older version first (a copy's
        // too: mkfs wrote it, and nothing after rewrites it).
        if sb.version < crate::format::FORMAT_VERSION {
            sb.version = crate::format::FORMAT_VERSION;
            meta::write_superblock(&*dev, &mut sb)?;
        }
        (dev, n)
    } else {
        meta::replay_in_memory(dev, &mut sb)?
    };
    let meta = Meta::new(dev.clone(), sb, 256 << 20);
    let total = meta.geo.total_blocks;
    let mut c = Checker {
        meta,
        report: Report {
            journal_replayed: replayed,
            ..Default::default()
        },
        repair: opts.repair,
        owner: HashMap::new(),
        shared: HashSet::new(),
        nodes: HashMap::new(),
        freed: HashSet::new(),
        unlinked: Vec::new(),
        orphan_blocks: Vec::new(),
        imap_lost: HashSet::new(),
        entry_fixes: Vec::new(),
        salvaged: Vec::new(),
        allocated: HashSet::new(),
        to_build: Vec::new(),
        free_from: 0,
        homes: HashMap::new(),
        cleared: Vec::new(),
        written: Vec::new(),
        used: vec![0; total.div_ceil(64) as usize],
        links: HashMap::new(),
        subdirs: HashMap::new(),
        parent_seen: HashMap::new(),
        inodes: HashMap::new(),
        dirs: Vec::new(),
        dirents: Vec::new(),
    };
    for (addr, message) in sb_problems {
        c.fixed("superblock", addr, message);
    }
    let geo = c.meta.geo.clone();
    // Fixed metadata of every AG, and the journal.
    for ag in 0..geo.ag_count {
        c.claim(geo.ag_start(ag), geo.data_start_agbno(ag), 0, "AG metadata");
    }
    // Inodes.
    let slots = geo.max_ino();
    let mut imap_used = vec![false; slots as usize];
    for ag in 0..geo.ag_count {
        for i in 0..geo.imap_blocks {
            let blk = geo.imap_start(ag) + i;
            match c
                .meta
                .read(blk, magic::INODE_BITMAP, "inode bitmap")
                .map(|b| b.to_vec())
            {
                Ok(b) => {
                    for bit in 0..geo
                        .bits_per_bmap
                        .min(geo.inodes_per_ag.saturating_sub(i * geo.bits_per_bmap))
                    {
                        let idx = ag as u64 * geo.inodes_per_ag + i * geo.bits_per_bmap + bit;
                        imap_used[idx as usize] = bitmap::get_bit(&b, bit as u32);
                    }
                }
                Err(e) => {
                    c.imap_lost.insert(blk);
                    let first = i * geo.bits_per_bmap;
                    let (per_ag, from) = (geo.inodes_per_ag, "the inodes");
                    // Inode 0 is reserved; bits past the AG's inodes stay set.
                    let fixed = |i: u64| i >= per_ag || (ag == 0 && i == 0);
                    let ids = (magic::INODE_BITMAP, ag, first);
                    rebuild_bitmap(&mut c, e, blk, ids, fixed, from);
                }
            }
        }
    }
    // Inode 0 is reserved: its bit stays set, or the allocator could
    // hand it out (and the mount's free count would differ from ours).
    if !imap_used[0] && !c.imap_lost.contains(&geo.imap_start(0)) {
        let message = "reserved inode 0 is marked free".to_string();
        c.fixed("inode bitmap", geo.imap_start(0), message);
        if c.repair {
            if let Err(e) = set_imap(&mut c, 0, true) {
                c.err(e);
            }
        }
    }
    if c.repair {
        find_nodes(&mut c, &imap_used);
    }
    for ino in 1..slots {
        if ino % 4096 == 0 {
            progress(ino, slots);
        }
        check_inode(&mut c, ino, imap_used[ino as usize]);
    }
    progress(slots, slots);
    build_trees(&mut c);
    remake_dirs(&mut c);
    check_tree_and_links(&mut c);
    check_orphans(&mut c);
    check_space(&mut c);
    check_csum_blocks(&mut c);
    if opts.check_data {
        check_data(&mut c);
    }
    c.report.inodes_used = c.inodes.len() as u64;
    c.report.directories = c.dirs.len() as u64;
    c.report.blocks_used = c.used.iter().map(|w| w.count_ones() as u64).sum();
    if opts.repair && c.report.problems.iter().any(|p| p.repaired) {
        c.meta.commit()?;
        c.meta.checkpoint()?;
        if !c.entry_fixes.is_empty() {
            drop(c.meta);
            fix_entries(
                dev,
                &mut c.entry_fixes,
                &c.salvaged,
                &c.homes,
                &mut c.report,
            );
        }
    }
    Ok(c.report)
}

/// For a repair, every node of a live tree that verifies, found before
/// any inode claims a block (`Checker::nodes`): the trees of each inode
/// whose record decodes (or is a directory's kept, `sound_directory`)
/// and is in use, and the orphan list. A node that verifies is sure of
/// its block (its checksum, its own block number, its tree's owner and
/// type), where an extent pointing at it is only sure of its own
/// record: whichever inode is checked first, the node keeps the block.
fn find_nodes(c: &mut Checker, imap_used: &[bool]) {
    let geo = c.meta.geo.clone();
    let uuid = c.meta.uuid;
    let mut trees = Vec::new();
    for ino in 1..geo.max_ino() {
        let (blk, off) = geo.inode_loc(ino);
        let slot = match c.meta.read_itable(blk) {
            Ok(b) => b[off..off + INODE_SIZE].to_vec(),
            Err(_) => continue,
        };
        if DiskInode::is_blank(&slot) {
            continue;
        }
        let marked = imap_used.get(ino as usize).copied().unwrap_or(false);
        let d = match DiskInode::decode(&slot, ino, blk, &uuid) {
            Ok(d) => d,
            Err(_) => match mended_record(c, &slot, ino, blk, marked) {
                Some((d, ..)) => d,
                None => continue,
            },
        };
        let Some(kind) = FileType::from_mode(d.mode).filter(|_| d.mode != 0) else {
            continue;
        };
        // One whose fork does not decode is cleared, its trees with it.
        let Ok(fork) = d.decode_fork(blk) else {
            continue;
        };
        let ag = geo.inode_ag(ino);
        let tree = |tt| Tree { owner: ino, tt, ag };
        trees.push((tree(TreeType::Xattr), d.xattr_root));
        if let Fork::Tree = fork {
            let tt = match kind {
                FileType::Dir => TreeType::Dir,
                _ => TreeType::Extents,
            };
            trees.push((tree(tt), d.fork_root));
        }
    }
    if let Ok(h) = read_ag_header(c, 0) {
        let t = Tree {
            owner: 0,
            tt: TreeType::Orphans,
            ag: 0,
        };
        trees.push((t, h.orphan_root));
    }
    for (t, root) in trees {
        for b in node_blocks(c, &t, root) {
            c.nodes.insert(b, t.owner);
        }
    }
}

/// The blocks of tree `t` at `root` whose nodes verify, each visited
/// once (so a cycle ends): a node that does not read is passed over
/// with everything below it.
fn node_blocks(c: &mut Checker, t: &Tree, root: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(blk) = stack.pop() {
        if blk == 0 || !seen.insert(blk) {
            continue;
        }
        let Ok(node) = t.read(&mut c.meta, blk) else {
            continue;
        };
        out.push(blk);
        if node.level > 0 {
            for (_, v) in &node.entries {
                if let Some(child) = v.get(..8).and_then(|b| b.try_into().ok()) {
                    stack.push(u64::from_le_bytes(child));
                }
            }
        }
    }
    out
}

fn check_inode(c: &mut Checker, ino: u64, marked: bool) {
    let geo = c.meta.geo.clone();
    let (blk, off) = geo.inode_loc(ino);
    let uuid = c.meta.uuid;
    let slot = match c.meta.read_itable(blk) {
        Ok(b) => b[off..off + INODE_SIZE].to_vec(),
        Err(e) => return c.err(e),
    };
    let decoded = match DiskInode::is_blank(&slot) {
        true => None,
        false => match DiskInode::decode(&slot, ino, blk, &uuid) {
            Ok(d) => Some(d),
            Err(e) => match mended_record(c, &slot, ino, blk, marked) {
                Some((d, bytes, how)) => {
                    let Error::Corrupted { reason, .. } = e else {
                        return c.err(e);
                    };
                    c.fixed("inode", blk, format!("{reason}; {how}"));
                    if c.repair {
                        c.meta.write(blk)[off..off + INODE_SIZE].copy_from_slice(&bytes);
                        c.maybe_commit();
                    }
                    Some(d)
                }
                None => return clear_inode(c, ino, marked, e),
            },
        },
    };
    let in_use = decoded.as_ref().is_some_and(|d| d.mode != 0);
    if in_use != marked && c.imap_lost.contains(&geo.imap_loc(ino).0) {
        // Its bitmap block was unreadable and is rebuilt from the inodes
        // (named once, there).
        if c.repair {
            if let Err(e) = set_imap(c, ino, in_use) {
                c.err(e);
            }
        }
    } else if in_use != marked {
        c.fixed(
            "inode bitmap",
            geo.imap_loc(ino).0,
            format!(
                "inode {ino} is {} but marked {}",
                if in_use { "in use" } else { "free" },
                if marked { "in use" } else { "free" }
            ),
        );
        if c.repair {
            if let Err(e) = set_imap(c, ino, in_use) {
                c.err(e);
            }
        }
    }
    if !in_use {
        return;
    }
    let Some(d) = decoded.filter(|d| d.mode != 0) else {
        return;
    };
    let fork = match d.decode_fork(blk) {
        Ok(f) => f,
        Err(e) => return clear_inode(c, ino, true, e),
    };
    // decode_fork checked the type.
    let kind = FileType::from_mode(d.mode).unwrap_or(FileType::File);
    let ag = geo.inode_ag(ino);
    c.inodes.insert(ino, (kind, d.nlink, d.parent, d.flags));
    if d.flags & !FLAGS_KNOWN != 0 {
        // No version of the engine sets them: a repair clears them.
        c.fixed(
            "inode",
            blk,
            format!("inode {ino}: unknown flags {:#x}", d.flags & !FLAGS_KNOWN),
        );
        edit_inode(c, ino, |d| d.flags &= FLAGS_KNOWN);
    }
    if kind == FileType::Dir {
        c.dirs.push(ino);
    }
    // Xattr tree blocks.
    let xt = Tree {
        owner: ino,
        tt: TreeType::Xattr,
        ag,
    };
    let mut xattrs: Vec<(u64, Vec<u8>)> = Vec::new();
    match xt.walk(&mut c.meta, d.xattr_root, |_, n| {
        if n.level == 0 {
            xattrs.extend(n.entries.iter().cloned());
        }
        Ok(())
    }) {
        Ok(blocks) => {
            for &b in &blocks {
                c.claim(b, 1, ino, "xattr tree");
            }
            let wrong = check_xattrs(c, ino, d.xattr_root, &xattrs);
            if c.repair && !wrong.is_empty() {
                // Each named above; the tree goes, its blocks with it.
                for b in blocks {
                    c.release(b);
                }
                edit_inode(c, ino, |d| d.xattr_root = 0);
            }
        }
        Err(e) => drop_tree(c, ino, e, "its xattrs removed", |d| d.xattr_root = 0),
    }
    // Data fork entries.
    let mut entries: Vec<(u64, Vec<u8>)> = Vec::new();
    // The extent tree's blocks, if it read whole: a repair that rewrites
    // the map gives them back.
    let mut tree_blocks = Vec::new();
    // Whether a repair salvaged the map from a damaged tree or dropped
    // an extent from it: it is written anew once checked.
    let mut rewrite = false;
    let mut d = d;
    match &fork {
        Fork::Inline(v) => entries = v.clone(),
        Fork::Tree => {
            let t = Tree {
                owner: ino,
                tt: if kind == FileType::Dir {
                    TreeType::Dir
                } else {
                    TreeType::Extents
                },
                ag,
            };
            match t.walk(&mut c.meta, d.fork_root, |_, n| {
                entries.extend(n.entries.iter().cloned());
                Ok(())
            }) {
                Ok(blocks) => {
                    for &b in &blocks {
                        c.claim(b, 1, ino, t.tt.name());
                    }
                    tree_blocks = blocks;
                }
                Err(e) if kind == FileType::Dir => {
                    if c.repair {
                        for (k, v) in surviving_entries(c, &t, d.fork_root) {
                            if let Ok(de) = dir::decode(ino, k, &v) {
                                c.salvaged.push((ino, de.name, de.ino));
                            }
                        }
                    }
                    let lost = "its entries removed (what they named goes to /lost+found, \
                                put back under its name if its entry still read)";
                    return drop_tree(c, ino, e, lost, |d| {
                        (d.fork, d.fork_count, d.fork_root) = (ForkFormat::DirInline, 0, 0);
                    });
                }
                Err(e) if !c.repair => return c.err(e),
                Err(e) => match salvage_extents(c, &t, &d, e) {
                    // Checked below as the repair leaves them.
                    // (Its blocks, claimed by no one, go back with the
                    // space check.)
                    Some((kept, cut)) => {
                        d.size = d.size.min(cut);
                        rewrite = true;
                        entries = kept;
                    }
                    None => return,
                },
            }
        }
        Fork::Symlink(_) => {}
    }
    if kind == FileType::Dir {
        for (k, v) in entries {
            match dir::decode(ino, k, &v) {
                Ok(de) => {
                    *c.links.entry(de.ino).or_default() += 1;
                    if de.kind == FileType::Dir {
                        *c.subdirs.entry(ino).or_default() += 1;
                        // A second name is the tree check's to report.
                        c.parent_seen.entry(de.ino).or_insert(ino);
                    }
                    c.dirents.push((ino, de));
                }
                Err(e) => c.err(e),
            }
        }
        return;
    }
    let mut nblocks = 0;
    let mut prev_end = 0;
    let mut kept: Entries = Vec::new();
    let total = entries.len();
    for (i, (k, v)) in entries.into_iter().enumerate() {
        let after = total - i - 1;
        let e = match geo.extent(ino, k, &v) {
            Ok(e) => e,
            Err(Error::Corrupted { addr, reason, .. }) if c.repair => {
                cut_map(c, &mut d, &kept, after, (k, addr, 0), reason);
                return finish_map(c, d, kept, &tree_blocks);
            }
            Err(e) => {
                c.err(e);
                continue;
            }
        };
        let overlap = (e.lblk < prev_end).then(|| {
            format!(
                "inode {ino}: extent at file block {} overlaps the previous one",
                e.lblk
            )
        });
        if c.repair {
            // Behind valid checksums, the first claimant of a block keeps
            // it, and a node of a live tree keeps its block against any
            // extent (it verified as that tree's, at its own place: the
            // extent's data is not there). An unwritten extent goes alone
            // (the hole left reads as zeros, as it did); of a written one,
            // the blocks before the first taken one stay, and the map
            // from there on goes.
            let taken = match overlap {
                Some(why) => Some((e.pblk, why)),
                None => c.taken(e.pblk, e.len),
            };
            if let Some((at, why)) = taken {
                let reason = format!(
                    "inode {ino}: extent at file block {} ({} blocks at {}): {why}",
                    e.lblk, e.len, e.pblk
                );
                if e.unwritten {
                    let done =
                        "; an unwritten extent: dropped (its range reads as zeros, as it did)";
                    c.fixed("extent", e.pblk, format!("{reason}{done}"));
                    rewrite = true;
                    continue;
                }
                let head = at - e.pblk;
                if head > 0 {
                    let e = Extent { len: head, ..e };
                    c.claim(e.pblk, e.len, ino, "extent");
                    c.written.push((e.pblk, e.len, ino, e.lblk));
                    kept.push((k, e.value()));
                }
                cut_map(c, &mut d, &kept, after, (e.lblk, at, head), reason);
                return finish_map(c, d, kept, &tree_blocks);
            }
        } else if let Some(why) = overlap {
            c.problem("extent", e.pblk, why);
        }
        prev_end = e.end();
        nblocks += e.len;
        c.claim(e.pblk, e.len, ino, "extent");
        if !e.unwritten {
            c.written.push((e.pblk, e.len, ino, e.lblk));
        }
        kept.push((k, v));
    }
    match rewrite {
        true => finish_map(c, d, kept, &tree_blocks),
        false => check_nblocks(c, &d, nblocks),
    }
}

/// Inode `d`'s extent map was cut (`cut_map`) or salvaged from a damaged
/// tree (`salvage_extents`): a repair writes the `kept` extents as its
/// map and gives back the blocks of the extent tree it had
/// (`tree_blocks`, claimed when it was walked). The map is written
/// inline, as much of it as fits; the rest waits for a new tree built
/// once every inode has claimed its blocks (`build_trees`), and the
/// file stays cut where it ends until then.
fn finish_map(c: &mut Checker, d: DiskInode, mut kept: Entries, tree_blocks: &[u64]) {
    let (ino, mut size) = (d.ino, d.size);
    for &b in tree_blocks {
        c.release(b);
    }
    let mut fit = 0;
    while fit < kept.len() && inline_len(&kept[..=fit]) <= LITERAL_SIZE {
        fit += 1;
    }
    if fit < kept.len() {
        c.to_build.push(Build {
            ino,
            size: d.size,
            nblocks: kept.iter().map(|(_, v)| extent_len(v)).sum(),
            entries: kept.clone(),
            fit,
            problem: c.report.problems.len().saturating_sub(1),
        });
        let from = kept[fit].0;
        kept.truncate(fit);
        size = size.min(from.saturating_mul(c.meta.geo.block_size));
    }
    let nblocks = kept.iter().map(|(_, v)| extent_len(v)).sum();
    // Only the map's fields: the record on disk may have been repaired
    // since `d` was read (its flags, its xattrs).
    edit_inode(c, ino, |d| {
        (d.fork, d.fork_root, d.nblocks, d.size) = (ForkFormat::Extents, 0, nblocks, size);
        d.set_inline(&kept);
    });
}

/// An extent map too long for the inode, to be written as a tree: the
/// inode's size and block count with all of it, its extents, how many
/// of them the inode holds inline meanwhile, and the problem whose
/// repair this is.
struct Build {
    ino: u64,
    size: u64,
    nblocks: u64,
    entries: Entries,
    fit: usize,
    problem: usize,
}

/// Write each queued extent map (`finish_map`) as a new tree, in blocks
/// that no inode claims, and point its inode at it. Done once every
/// inode has claimed its blocks, so a new node never lands on a block a
/// file still holds. With no room, the inode keeps the extents that fit
/// inline and the file stays cut where they end (said on the problem's
/// line).
fn build_trees(c: &mut Checker) {
    for b in std::mem::take(&mut c.to_build) {
        match build_tree(c, b.ino, &b.entries) {
            Some(root) => edit_inode(c, b.ino, |d| {
                (d.fork, d.fork_root, d.size, d.nblocks) =
                    (ForkFormat::ExtentTree, root, b.size, b.nblocks);
                d.set_inline(&[]);
            }),
            None => {
                drop_claims(c, b.ino, &b.entries[b.fit..]);
                let p = &mut c.report.problems[b.problem];
                p.message += &format!(
                    "; no room for a tree of its {} extents: the {} that fit in the inode kept",
                    b.entries.len(),
                    b.fit
                );
            }
        }
    }
}

/// A new extent tree of inode `ino` holding `entries` (sorted), built
/// bottom up: leaves filled in key order, then each level of interior
/// nodes over the one below, to a single root. Its blocks are claimed
/// for `ino`. None when there are not enough free blocks (those taken
/// are given back).
fn build_tree(c: &mut Checker, ino: u64, entries: &Entries) -> Option<u64> {
    use crate::format::btree_node::{capacity, Node, ENTRY_OVERHEAD, MAX_LEVELS};
    let cap = capacity(c.meta.geo.block_size as usize);
    let mut taken = Vec::new();
    let mut level = 0u16;
    let mut below: Entries = entries.clone();
    loop {
        // Pack this level's entries into nodes, each as full as it goes.
        let mut nodes: Vec<Node> = Vec::new();
        let mut used = cap;
        for (k, v) in below {
            if used + ENTRY_OVERHEAD + v.len() > cap {
                nodes.push(Node {
                    level,
                    entries: Vec::new(),
                });
                used = 0;
            }
            used += ENTRY_OVERHEAD + v.len();
            nodes.last_mut()?.entries.push((k, v));
        }
        let mut above = Vec::with_capacity(nodes.len());
        for node in &nodes {
            let Some(blk) = c.free_block(c.meta.geo.inode_ag(ino)) else {
                for b in taken {
                    c.release(b);
                }
                return None;
            };
            taken.push(blk);
            c.claim(blk, 1, ino, TreeType::Extents.name());
            c.allocated.insert(blk);
            let uuid = c.meta.uuid;
            node.encode(
                c.meta.create(blk, Kind::Header),
                blk,
                uuid,
                ino,
                TreeType::Extents,
            );
            c.maybe_commit();
            above.push((node.entries[0].0, blk.to_le_bytes().to_vec()));
        }
        if let [(_, root)] = &above[..] {
            return root[..8].try_into().ok().map(u64::from_le_bytes);
        }
        if level + 1 >= MAX_LEVELS {
            for b in taken {
                c.release(b);
            }
            return None;
        }
        below = above;
        level += 1;
    }
}

/// The length (blocks) of an extent whose value decoded.
fn extent_len(v: &[u8]) -> u64 {
    u32::from_le_bytes(v[8..12].try_into().unwrap_or_default()) as u64
}

/// Give back what inode `ino` claimed for `extents` (they leave its map).
fn drop_claims(c: &mut Checker, ino: u64, extents: &[(u64, Vec<u8>)]) {
    for (k, v) in extents {
        let pblk = u64::from_le_bytes(v[..8].try_into().unwrap_or_default());
        for b in pblk..pblk + extent_len(v) {
            c.release(b);
        }
        c.written.retain(|w| !(w.2 == ino && w.3 == *k));
    }
}

/// Inode `d`'s extent map holds an extent that cannot stand (`reason`,
/// at file block `lblk`, from device block `addr`): out of the data
/// area, over another file's blocks or its own or a tree's node, or over
/// the previous extent. A repair keeps the `kept` extents before it, and
/// the extent's own `head` blocks before `addr` (already in `kept`), and
/// cuts the file where they end (`after` extents follow it), as for a damaged
/// tree: a hole in place of the rest would pass zeros off as the file's
/// data, and the extents past it could not be reached by reading
/// through.
fn cut_map(
    c: &mut Checker,
    d: &mut DiskInode,
    kept: &Entries,
    after: usize,
    (lblk, addr, head): (u64, u64, u64),
    reason: String,
) {
    let bs = c.meta.geo.block_size;
    let end = match kept.last() {
        Some((k, v)) => k + extent_len(v),
        None => 0,
    };
    // A hole before it stays (it reads as zeros, as it did).
    let cut = (lblk + head).max(end).saturating_mul(bs);
    let what = match (head, after) {
        (0, _) => format!("; cut out with the extents after it ({} in all)", after + 1),
        (_, 0) => format!("; its {head} blocks before block {addr} kept, the rest cut out"),
        _ => format!(
            "; its {head} blocks before block {addr} kept, the rest cut out with the \
             extents after it ({after} of them)"
        ),
    };
    let done = match d.size > cut {
        true => format!("{what}, the file cut at byte {cut}"),
        false => what,
    };
    c.fixed("extent", addr, format!("{reason}{done}"));
    d.size = d.size.min(cut);
}

/// The block count of inode `d` against the `nblocks` its extents map.
fn check_nblocks(c: &mut Checker, d: &DiskInode, nblocks: u64) {
    let (ino, blk) = (d.ino, c.meta.geo.inode_loc(d.ino).0);
    if nblocks != d.nblocks {
        c.fixed(
            "inode",
            blk,
            format!(
                "inode {ino}: block count {} but extents map {nblocks}",
                d.nblocks
            ),
        );
        edit_inode(c, ino, |d| d.nblocks = nblocks);
    }
}

/// Inode `ino`'s slot (`slot`, in block `blk`, `marked` in use) does
/// not decode: the record a repair keeps, its bytes to write back, and
/// what it did, if either rule below applies (else it is cleared).
/// One bit flipped is set back when flipping it alone makes the checksum
/// hold (`one_bit_back`), for a file's record or a directory's; else a
/// directory's record that fails only its checksum is kept if it is
/// otherwise sound (`sound_directory`).
fn mended_record(
    c: &Checker,
    slot: &[u8],
    ino: u64,
    blk: u64,
    marked: bool,
) -> Option<(DiskInode, Vec<u8>, String)> {
    let uuid = c.meta.uuid;
    if let Some((bytes, bit)) = one_bit_back(slot) {
        if let Ok(d) = DiskInode::decode(&bytes, ino, blk, &uuid) {
            if d.decode_fork(blk).is_ok() {
                let how = match c.repair {
                    true => "set back, the checksum holding with it",
                    false => "the checksum holds with it set back",
                };
                let how = format!("bit {} of byte {} flipped: {how}", bit % 8, bit / 8);
                return Some((d, bytes, how));
            }
        }
    }
    let d = sound_directory(c, slot, ino, blk, marked)?;
    let mut bytes = vec![0; INODE_SIZE];
    d.encode(&mut bytes, &uuid);
    let how = match c.repair {
        true => "a directory's record otherwise sound: kept, its checksum rewritten",
        false => "a directory's record otherwise sound",
    };
    Some((d, bytes, how.to_string()))
}

/// `record` (an inode slot) with the one bit set back whose flip alone
/// makes its checksum (crc32c at byte 4) hold, and that bit's index;
/// None if there is no such bit. CRC-32C tells every error of up to 5
/// bits in a 512-byte record from none (Hamming distance 6 at this
/// length), so two single bits never both make it hold, and a setting
/// back that makes it hold is wrong only if more than 4 bits were
/// damaged and the checksum still matches by chance: about 4,096 in
/// 2^32 (one chance a bit). A bit of the stored checksum itself is
/// found alike: its flip leaves the record whole.
fn one_bit_back(record: &[u8]) -> Option<(Vec<u8>, usize)> {
    let stored = u32::from_le_bytes(record.get(4..8)?.try_into().ok()?);
    let computed = crate::format::crc_with_hole(record, 4);
    let syndrome = stored ^ computed;
    if syndrome.count_ones() == 1 {
        let mut bytes = record.to_vec();
        bytes[4..8].copy_from_slice(&computed.to_le_bytes());
        return Some((bytes, 32 + syndrome.trailing_zeros() as usize));
    }
    let mut bytes = record.to_vec();
    for bit in (0..record.len() * 8).filter(|b| !(32..64).contains(b)) {
        bytes[bit / 8] ^= 1 << (bit % 8);
        if crate::format::crc_with_hole(&bytes, 4) == stored {
            return Some((bytes, bit));
        }
        bytes[bit / 8] ^= 1 << (bit % 8);
    }
    None
}

/// Inode `ino`'s slot (`slot`, in block `blk`, `marked` in use) fails
/// only its checksum and holds a directory whose every other field and
/// inline entry checks: kept, as e2fsck keeps an inode whose checksum
/// alone is wrong, for clearing it would send everything it names to
/// /lost+found. A bit flipped in what it points to is caught after: its
/// tree's nodes carry their own checksums and owner, the link checks
/// count every entry, and each entry's key is the hash of its name. A
/// file's record is never kept so: a flipped extent could pass another
/// file's or a free block off as its data.
fn sound_directory(
    c: &Checker,
    slot: &[u8],
    ino: u64,
    blk: u64,
    marked: bool,
) -> Option<DiskInode> {
    let mut copy = slot.to_vec();
    let crc = crate::format::crc_with_hole(&copy, 4);
    copy[4..8].copy_from_slice(&crc.to_le_bytes());
    let d = DiskInode::decode(&copy, ino, blk, &c.meta.uuid).ok()?;
    let fork = d.decode_fork(blk).ok()?;
    let sound = marked
        && FileType::from_mode(d.mode) == Some(FileType::Dir)
        && d.flags & !FLAGS_KNOWN == 0
        && match fork {
            Fork::Inline(entries) => entries.iter().all(|(k, v)| dir::decode(ino, *k, v).is_ok()),
            Fork::Tree => d.fork_root != 0,
            Fork::Symlink(_) => false,
        };
    sound.then_some(d)
}

/// Inode `ino`'s slot does not decode (`e`). A repair zeroes it and
/// clears its bit (if `marked`); the root is made anew, an empty
/// directory. What the inode owned is not known: its blocks are claimed
/// by no one, so the space check gives back those no other file claims;
/// the entries naming it are removed as entries of a free inode, and what
/// was below a directory is named in /lost+found by the link check.
fn clear_inode(c: &mut Checker, ino: u64, marked: bool, e: Error) {
    let Error::Corrupted {
        structure,
        addr,
        reason,
    } = e
    else {
        return c.err(e);
    };
    if !c.repair {
        return c.problem(structure, addr, reason);
    }
    let root = ino == c.meta.sb.root_ino;
    let done = match root {
        true => "; the root directory made anew, empty",
        false => "; cleared",
    };
    // Only a slot in use may come back (`remake_dirs`): a free one's
    // number may be that of a directory removed long ago, whose freed
    // leaves still verify. (A bitmap block that did not read says
    // nothing either way.)
    let imap_blk = c.meta.geo.imap_loc(ino).0;
    if root || marked || c.imap_lost.contains(&imap_blk) {
        c.cleared.push((ino, c.report.problems.len()));
    }
    c.fixed(structure, addr, format!("{reason}{done}"));
    let (blk, off) = c.meta.geo.inode_loc(ino);
    let uuid = c.meta.uuid;
    let slot = &mut c.meta.write(blk)[off..off + INODE_SIZE];
    if root {
        new_root(ino).encode(slot, &uuid);
        c.inodes.insert(ino, (FileType::Dir, 2, ino, 0));
        c.dirs.push(ino);
    } else {
        slot.fill(0);
    }
    if root || marked {
        if let Err(e) = set_imap(c, ino, root) {
            c.err(e);
        }
    }
    c.maybe_commit();
}

/// Inodes whose slot did not decode and that a repair cleared, but that
/// live directories name as their parent: each was a directory, and is
/// made anew, empty, as the root is. The entry naming it, if it still
/// reads, keeps its name; the directories below it, whose entries went
/// with it, are named `#<ino>` in it (their records name it); its files,
/// whose records name no parent, go to /lost+found.
fn remake_dirs(c: &mut Checker) {
    let parents: HashSet<u64> = c
        .inodes
        .iter()
        .filter(|(ino, (kind, _, parent, _))| *kind == FileType::Dir && *parent != **ino)
        .map(|(_, (_, _, parent, _))| *parent)
        .collect();
    let cleared = std::mem::take(&mut c.cleared);
    let mut found = old_dir_leaves(c, cleared.iter().map(|(ino, _)| *ino).collect());
    let root = c.meta.sb.root_ino;
    for (ino, at) in cleared {
        let entries = found.remove(&ino).unwrap_or_default();
        if !entries.is_empty() {
            let p = &mut c.report.problems[at];
            p.message += &format!(
                "; {} entries found in leaves of its old tree (named by the inodes they name, \
                 and put back under those names)",
                entries.len()
            );
            for (name, child) in entries {
                c.salvaged.push((ino, name, child));
            }
        } else if !parents.contains(&ino) || ino == root {
            continue;
        }
        if ino == root {
            // Made anew already (`clear_inode`).
            continue;
        }
        let (blk, off) = c.meta.geo.inode_loc(ino);
        let uuid = c.meta.uuid;
        let r = c.meta.read_itable(blk).map(drop);
        if let Err(e) = r.and_then(|()| {
            new_root(ino).encode(&mut c.meta.write(blk)[off..off + INODE_SIZE], &uuid);
            set_imap(c, ino, true)
        }) {
            c.err(e);
            continue;
        }
        c.inodes.insert(ino, (FileType::Dir, 2, ino, 0));
        c.dirs.push(ino);
        let p = &mut c.report.problems[at];
        p.message = p.message.replace(
            "; cleared",
            "; cleared, and made anew, an empty directory (directories name it as their parent, \
             or leaves of its tree name it as their owner)",
        );
        c.maybe_commit();
    }
}

/// The entries (name, inode) in directory-tree leaves that no inode
/// claims and whose header names one of `owners` (inodes a repair
/// cleared) as their owner: what a cleared directory held, if it was a
/// tree. Each leaf verifies (checksum, own block number, owner, type)
/// before it counts. A leaf freed long ago can still verify, so what it
/// names is only put back if that inode has lost its name (`put_back`
/// moves only what the repair named anew).
fn old_dir_leaves(c: &mut Checker, owners: HashSet<u64>) -> HashMap<u64, Vec<(Vec<u8>, u64)>> {
    let mut found: HashMap<u64, Vec<(Vec<u8>, u64)>> = HashMap::new();
    if owners.is_empty() {
        return found;
    }
    let geo = c.meta.geo.clone();
    let bs = geo.block_size as usize;
    // Read in runs of 256 blocks (1 MiB at 4 KiB) to look at headers.
    const RUN: u64 = 256;
    let mut buf = AlignedBuf::zeroed(bs * RUN as usize);
    let mut at = 0;
    while at < geo.total_blocks {
        let n = RUN.min(geo.total_blocks - at);
        let len = n as usize * bs;
        if c.meta.dev.read_at(&mut buf[..len], at * bs as u64).is_err() {
            at += n;
            continue;
        }
        for i in 0..n {
            let b = at + i;
            let block = &buf[i as usize * bs..(i as usize + 1) * bs];
            let h = crate::format::header::BlockHeader::decode(block);
            if h.magic != magic::BTREE
                || !owners.contains(&h.owner)
                || !geo.is_data_block(b)
                || c.is_used(b)
            {
                continue;
            }
            let t = Tree {
                owner: h.owner,
                tt: TreeType::Dir,
                ag: geo.ag_of(b),
            };
            let Ok(node) = t.read(&mut c.meta, b) else {
                continue;
            };
            if node.level != 0 {
                continue;
            }
            for (k, v) in node.entries {
                if let Ok(de) = dir::decode(h.owner, k, &v) {
                    found.entry(h.owner).or_default().push((de.name, de.ino));
                }
            }
        }
        at += n;
    }
    found
}

/// An empty root directory, as mkfs makes it (owned by root).
fn new_root(ino: u64) -> DiskInode {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let t = Timespec {
        sec: now.as_secs() as i64,
        nsec: now.subsec_nanos(),
    };
    DiskInode {
        mode: 0o040755,
        nlink: 2,
        parent: ino,
        atime: t,
        mtime: t,
        ctime: t,
        crtime: t,
        fork: ForkFormat::DirInline,
        generation: 1,
        ..DiskInode::new(ino)
    }
}

/// Bitmap block `blk` did not read (`e`). A repair writes it anew (`ids`:
/// magic, AG and first bit) with only the bits `fixed` names set (by
/// index in the AG); the checks after set the others, without naming
/// each.
fn rebuild_bitmap(
    c: &mut Checker,
    e: Error,
    blk: u64,
    ids: (u32, u32, u64),
    fixed: impl Fn(u64) -> bool,
    from: &str,
) {
    let Error::Corrupted {
        structure, reason, ..
    } = e
    else {
        return c.err(e);
    };
    if !c.repair {
        return c.problem(structure, blk, reason);
    }
    c.fixed(structure, blk, format!("{reason}; rebuilt from {from}"));
    let (magic, ag, first) = ids;
    let bits = c.meta.geo.bits_per_bmap;
    let uuid = c.meta.uuid;
    let b = c.meta.create(blk, Kind::Header);
    bitmap::init(b, magic, blk, uuid, ag, first);
    for i in 0..bits {
        if fixed(first + i) {
            bitmap::set_bit(b, i as u32, true);
        }
    }
    c.maybe_commit();
}

/// A tree of inode `ino` did not read whole (`e`): a repair drops it, as
/// `cut` leaves the inode (an empty directory, an empty file, no xattrs).
/// Its blocks are claimed by no one, so the space check gives back those
/// no other file claims; the files a directory named are named in
/// /lost+found by the link check.
fn drop_tree(c: &mut Checker, ino: u64, e: Error, lost: &str, cut: impl FnOnce(&mut DiskInode)) {
    let Error::Corrupted {
        structure,
        addr,
        reason,
    } = e
    else {
        return c.err(e);
    };
    if !c.repair {
        return c.problem(structure, addr, reason);
    }
    c.fixed(structure, addr, format!("inode {ino}: {reason}; {lost}"));
    edit_inode(c, ino, cut);
}

/// Tree or inline fork entries: (key, value).
type Entries = Vec<(u64, Vec<u8>)>;

/// A file's extent tree did not read whole (`e`): a repair keeps the
/// extents before the first that was lost (in a new tree if they do
/// not fit inline, `finish_map`) and cuts the file there, for a hole in place of what was lost would pass
/// zeros off as its data. Returns them and the size (bytes) to cut the
/// file to; None when the error is not corruption (it is named).
fn salvage_extents(c: &mut Checker, t: &Tree, d: &DiskInode, e: Error) -> Option<(Entries, u64)> {
    let Error::Corrupted {
        structure,
        addr,
        reason,
    } = e
    else {
        c.err(e);
        return None;
    };
    let (survivors, lost_from) = surviving_prefix(c, t, d.fork_root);
    let kept: Entries = survivors
        .into_iter()
        .take_while(|(k, _)| *k < lost_from)
        .collect();
    let bs = c.meta.geo.block_size;
    let cut = lost_from.saturating_mul(bs);
    let done = match (kept.is_empty(), d.size > cut) {
        (true, _) => "its data removed, left empty".to_string(),
        (false, true) => format!(
            "the {} extents before the damage kept, the file cut at byte {cut}",
            kept.len()
        ),
        (false, false) => format!("its {} extents kept", kept.len()),
    };
    let ino = d.ino;
    c.fixed(structure, addr, format!("inode {ino}: {reason}; {done}"));
    let cut = if kept.is_empty() { 0 } else { cut };
    Some((kept, cut))
}

/// The leaf entries of tree `t` at `root` that read, in key order, up to
/// the first node that does not: they and the lowest key that node (by
/// its parent's lower bound) could hold; every key from it on is lost.
/// u64::MAX when everything read.
fn surviving_prefix(c: &mut Checker, t: &Tree, root: u64) -> (Vec<(u64, Vec<u8>)>, u64) {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![(root, 0u64)];
    while let Some((blk, low)) = stack.pop() {
        let node = match seen.insert(blk) {
            true => t.read(&mut c.meta, blk).ok(),
            false => None,
        };
        let Some(node) = node else {
            return (out, low);
        };
        if node.level == 0 {
            out.extend(node.entries);
            continue;
        }
        for (k, v) in node.entries.iter().rev() {
            let child = v.get(..8).and_then(|b| b.try_into().ok());
            match child {
                Some(child) => stack.push((u64::from_le_bytes(child), *k)),
                None => return (out, *k),
            }
        }
    }
    (out, u64::MAX)
}

/// The leaf entries of tree `t` at `root` that still read, in key order:
/// a node that does not read is passed over with everything below it (a
/// repair's salvage). Each node is visited once, so a cycle ends.
fn surviving_entries(c: &mut Checker, t: &Tree, root: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(blk) = stack.pop() {
        if !seen.insert(blk) {
            continue;
        }
        let Ok(node) = t.read(&mut c.meta, blk) else {
            continue;
        };
        if node.level == 0 {
            out.extend(node.entries);
            continue;
        }
        for (_, v) in node.entries.iter().rev() {
            if let Some(child) = v.get(..8).and_then(|b| b.try_into().ok()) {
                stack.push(u64::from_le_bytes(child));
            }
        }
    }
    out
}

/// Every xattr entry decodes, every continuation belongs to a head in its
/// bucket, and every value joins whole (fragments 1..n, at most 64 KiB).
/// Returns the problems it named: a repair removes the inode's xattrs.
fn check_xattrs(c: &mut Checker, ino: u64, root: u64, entries: &[(u64, Vec<u8>)]) -> Vec<String> {
    let mut wrong = Vec::new();
    use crate::format::xattr::{assemble, piece, Cont, Piece};
    let mut heads = Vec::new();
    let mut conts: HashMap<u64, Vec<Cont>> = HashMap::new();
    for (k, v) in entries {
        match piece(v) {
            Some(Piece::Head { data, .. }) => heads.push((*k, data)),
            Some(Piece::Cont { head, index, data }) => conts
                .entry(k & !0xffff)
                .or_default()
                .push((head, index, data)),
            None => wrong.push(format!(
                "inode {ino}: malformed xattr entry under key {k:#x}"
            )),
        }
    }
    for (k, first) in &heads {
        let list = conts.get(&(k & !0xffff)).map_or(&[][..], |v| &v[..]);
        if let Err(why) = assemble(first, (k & 0xffff) as u16, list) {
            wrong.push(format!("inode {ino}: xattr {k:#x}: {why}"));
        }
    }
    for (bucket, list) in &conts {
        for (head, index, _) in list {
            if !heads.iter().any(|(k, _)| *k == bucket | *head as u64) {
                wrong.push(format!(
                    "inode {ino}: xattr fragment {index} has no head {head}"
                ));
            }
        }
    }
    for (i, message) in wrong.iter().enumerate() {
        // A repair removes them all with the first.
        let done = match i == 0 && c.repair {
            true => "; the inode's xattrs removed",
            false => "",
        };
        c.fixed("xattr", root, format!("{message}{done}"));
    }
    wrong
}

fn check_tree_and_links(c: &mut Checker) {
    let dirents = std::mem::take(&mut c.dirents);
    let has_entries: HashSet<u64> = dirents.iter().map(|(dir, _)| *dir).collect();
    let root = c.meta.sb.root_ino;
    // The directory entries naming each directory.
    let mut named: BTreeMap<u64, Vec<DirName>> = BTreeMap::new();
    for (dir, de) in &dirents {
        match c.inodes.get(&de.ino) {
            None => {
                let message = format!(
                    "directory {dir}: {:?} points to free inode {}",
                    String::from_utf8_lossy(&de.name),
                    de.ino
                );
                let fix = EntryFix::Remove {
                    dir: *dir,
                    name: de.name.clone(),
                    ino: de.ino,
                };
                c.entry_fix("directory entry", *dir, message, fix);
                if de.kind == FileType::Dir && c.repair {
                    unentered(c, *dir, de.ino);
                }
                continue;
            }
            Some(&(kind, ..)) if kind != de.kind => {
                let message = format!(
                    "directory {dir}: {:?} has type {:?}, inode {} is {:?}",
                    String::from_utf8_lossy(&de.name),
                    de.kind,
                    de.ino,
                    kind
                );
                if kind == FileType::Dir && c.repair {
                    // Counted as a directory's entry: below, the
                    // directory keeps one name, and this entry is given
                    // its type if it is the one kept, else removed.
                    let mistyped = Some(c.report.problems.len());
                    c.fixed("directory entry", *dir, message);
                    retyped(c, *dir, de.ino, de.kind, kind);
                    named.entry(de.ino).or_default().push(DirName {
                        dir: *dir,
                        name: de.name.clone(),
                        mistyped,
                    });
                    continue;
                }
                let fix = EntryFix::Retype {
                    dir: *dir,
                    name: de.name.clone(),
                };
                c.entry_fix("directory entry", *dir, message, fix);
                if c.repair {
                    // Counted as the repair leaves it.
                    retyped(c, *dir, de.ino, de.kind, kind);
                    continue;
                }
            }
            Some(_) => {}
        }
        if de.kind == FileType::Dir {
            named.entry(de.ino).or_default().push(DirName {
                dir: *dir,
                name: de.name.clone(),
                mistyped: None,
            });
        }
    }
    let mut children: HashMap<u64, Vec<u64>> = HashMap::new();
    for (child, mut entries) in named {
        if matches!(c.inodes.get(&child), Some((FileType::Dir, ..)))
            && (entries.len() > 1 || child == root)
        {
            one_name(c, child, &mut entries);
        }
        for DirName {
            dir,
            name,
            mistyped,
        } in entries
        {
            if let Some(problem) = mistyped {
                c.entry_fixes
                    .push((EntryFix::Retype { dir, name }, problem));
            }
            children.entry(dir).or_default().push(child);
        }
    }
    // Every directory reachable from the root, each exactly once.
    let mut seen: HashMap<u64, ()> = HashMap::new();
    let mut q = VecDeque::from([root]);
    while let Some(d) = q.pop_front() {
        if seen.insert(d, ()).is_some() {
            c.problem(
                "directory",
                d,
                format!("directory {d} reached twice (loop)"),
            );
            continue;
        }
        for ch in children.get(&d).cloned().unwrap_or_default() {
            q.push_back(ch);
        }
    }
    cut_loops(c, &seen, &dirents);
    let geo = c.meta.geo.clone();
    let inodes: Vec<(u64, (FileType, u32, u64, u32))> =
        c.inodes.iter().map(|(k, v)| (*k, *v)).collect();
    let links_read: HashMap<u64, u32> = inodes.iter().map(|(k, v)| (*k, v.1)).collect();
    for (ino, (kind, nlink, parent, flags)) in inodes {
        let blk = geo.inode_loc(ino).0;
        let found = c.links.get(&ino).copied().unwrap_or(0);
        if kind == FileType::Dir {
            if nlink == 0 && found == 0 && !has_entries.contains(&ino) {
                // Removed while open: empty, and freed at its last close
                // or by the next mount, if it is on the orphan list.
                c.unlinked.push(ino);
                if flags & FLAG_ORPHAN == 0 {
                    let message = format!("directory {ino} has no links and no orphan flag");
                    c.fixed("inode", blk, message);
                }
                continue;
            }
            // One with no links that is named or has entries is a live
            // directory with a wrong count (freeing it would lose its
            // tree): its count is set below, and its orphan flag, if any,
            // goes with the orphan list's repair. An unreachable one is
            // reachable again once the directory above it that no entry
            // names is named in /lost+found.
            let unreachable = ino != root && !seen.contains_key(&ino);
            let top = unreachable.then(|| detached_top(c, ino)).flatten();
            if unreachable {
                let message = format!("directory {ino} is not reachable from the root");
                match top {
                    Some(top) => {
                        let recorded = links_read.get(&top).copied().unwrap_or(0);
                        if let Some(home) = home_of(c, top, &seen, recorded) {
                            c.homes.insert(top, home);
                        }
                        c.entry_fix("directory", blk, message, EntryFix::Name { ino, top })
                    }
                    None => c.problem("directory", blk, message),
                }
            }
            let want = 2 + c.subdirs.get(&ino).copied().unwrap_or(0);
            if nlink != want {
                c.fixed(
                    "inode",
                    blk,
                    format!("directory {ino}: link count {nlink}, should be {want}"),
                );
                edit_inode(c, ino, |d| d.nlink = want);
            }
            let real_parent = if ino == root {
                root
            } else {
                c.parent_seen.get(&ino).copied().unwrap_or(0)
            };
            if parent != real_parent {
                let message =
                    format!("directory {ino}: parent {parent}, but it is listed in {real_parent}");
                if real_parent == 0 {
                    // One that a repair names in /lost+found (named above)
                    // takes lost+found as its parent.
                    if top != Some(ino) {
                        c.problem("inode", blk, message);
                    }
                } else {
                    c.fixed("inode", blk, message);
                    edit_inode(c, ino, |d| d.parent = real_parent);
                }
            }
        } else if nlink == 0 && found == 0 {
            // Freed at its last close, or by the next mount: unless it is
            // on the orphan list, nothing ever frees it.
            c.unlinked.push(ino);
            if flags & FLAG_ORPHAN == 0 {
                c.fixed(
                    "inode",
                    blk,
                    format!("inode {ino} has no links and no orphan flag"),
                );
            }
        } else if nlink != found {
            let message = format!("inode {ino}: link count {nlink}, but {found} directory entries");
            if found == 0 {
                // A file with no name: named in /lost+found.
                c.entry_fix("inode", blk, message, EntryFix::Name { ino, top: ino });
            } else {
                c.fixed("inode", blk, message);
                edit_inode(c, ino, |d| d.nlink = found);
            }
        }
    }
}

/// An entry naming a directory: in `dir`, as `name`; for a repair, the
/// problem it is if it has another type (the directory keeps one name,
/// given its type if it is this one, `one_name`).
struct DirName {
    dir: u64,
    name: Vec<u8>,
    mistyped: Option<usize>,
}

/// Directory `child` has `entries` (more than one, or any for the root): a
/// directory has one name, the root none. A repair keeps the entry in the
/// parent the directory records (or the first) and removes the others,
/// leaving `entries` as the repair leaves them; a check keeps them all.
/// An entry of the wrong type that is removed is its own problem's
/// repair.
fn one_name(c: &mut Checker, child: u64, entries: &mut Vec<DirName>) {
    let root = c.meta.sb.root_ino;
    let dirs: Vec<String> = entries.iter().map(|e| e.dir.to_string()).collect();
    let at = c.meta.geo.inode_loc(child).0;
    let message = match child == root {
        true => format!(
            "the root directory {root} has entries in {}",
            dirs.join(", ")
        ),
        false => format!("directory {child} has entries in {}", dirs.join(", ")),
    };
    if !c.repair {
        return c.problem("directory", at, message);
    }
    let recorded = c.inodes.get(&child).map(|i| i.2);
    let keep = (child != root).then(|| {
        entries
            .iter()
            .position(|e| Some(e.dir) == recorded)
            .unwrap_or(0)
    });
    let problem = c.report.problems.len();
    c.fixed("directory", at, message);
    let kept = keep.map(|k| entries.swap_remove(k));
    for e in entries.drain(..) {
        unentered(c, e.dir, child);
        let fix = EntryFix::Remove {
            dir: e.dir,
            name: e.name,
            ino: child,
        };
        c.entry_fixes.push((fix, e.mistyped.unwrap_or(problem)));
    }
    match kept {
        Some(e) => {
            c.parent_seen.insert(child, e.dir);
            entries.push(e);
        }
        None => {
            c.parent_seen.remove(&child);
        }
    }
}

/// Directory `dir`'s entry for directory `child` is to be removed (a
/// repair): counted without it.
fn unentered(c: &mut Checker, dir: u64, child: u64) {
    if let Some(n) = c.subdirs.get_mut(&dir) {
        *n = n.saturating_sub(1);
    }
    if let Some(n) = c.links.get_mut(&child) {
        *n = n.saturating_sub(1);
    }
}

/// Directories that the root does not reach and that reach only each
/// other, each the parent of the next: a repair removes the entry of the
/// lowest-numbered one, which then has no name and is named in
/// /lost+found with the others below it.
fn cut_loops(c: &mut Checker, seen: &HashMap<u64, ()>, dirents: &[(u64, dir::Dirent)]) {
    let root = c.meta.sb.root_ino;
    let mut lost: Vec<u64> = c
        .inodes
        .iter()
        .filter(|(ino, (kind, nlink, ..))| {
            *kind == FileType::Dir && *nlink > 0 && **ino != root && !seen.contains_key(ino)
        })
        .map(|(ino, _)| *ino)
        .collect();
    lost.sort_unstable();
    // Directories whose way up has been followed: each is walked once.
    let mut walked = HashSet::new();
    for d in lost {
        // Up from `d` until the way ends, meets one walked before, or
        // comes round.
        let mut path = vec![d];
        let mut on_path = HashSet::from([d]);
        let cycle = loop {
            if !walked.insert(path[path.len() - 1]) {
                break None;
            }
            let Some(&p) = c.parent_seen.get(&path[path.len() - 1]) else {
                break None;
            };
            if !on_path.insert(p) {
                let from = path.iter().position(|&x| x == p).unwrap_or(0);
                break Some(path[from..].to_vec());
            }
            path.push(p);
        };
        let Some(mut cycle) = cycle else { continue };
        cycle.sort_unstable();
        let m = cycle[0];
        let dirs: Vec<String> = cycle.iter().map(|d| d.to_string()).collect();
        let message = format!(
            "directories {} reach only each other (a loop)",
            dirs.join(", ")
        );
        let at = c.meta.geo.inode_loc(m).0;
        let Some(&parent) = c.parent_seen.get(&m) else {
            continue;
        };
        let entry = dirents
            .iter()
            .find(|(dir, de)| *dir == parent && de.ino == m && de.kind == FileType::Dir);
        match entry {
            Some((_, de)) if c.repair => {
                let fix = EntryFix::Remove {
                    dir: parent,
                    name: de.name.clone(),
                    ino: m,
                };
                c.entry_fix("directory", at, message, fix);
                unentered(c, parent, m);
                c.parent_seen.remove(&m);
            }
            _ => c.problem("directory", at, message),
        }
    }
}

/// Directory `dir`'s entry for `ino`, counted as a `was`, is to become a
/// `kind` (a repair): its directory counts and parent as the repair
/// leaves them.
fn retyped(c: &mut Checker, dir: u64, ino: u64, was: FileType, kind: FileType) {
    if was == FileType::Dir {
        if let Some(n) = c.subdirs.get_mut(&dir) {
            *n = n.saturating_sub(1);
        }
        if c.parent_seen.get(&ino) == Some(&dir) {
            c.parent_seen.remove(&ino);
        }
    }
    if kind == FileType::Dir {
        *c.subdirs.entry(dir).or_default() += 1;
        c.parent_seen.insert(ino, dir);
    }
}

/// The directory that directory `top`'s record names as its parent,
/// when `top` has links (`recorded`, its count before the repair set
/// it) and that is another live directory the root
/// reaches (`seen`): `top` is not above it, so naming `top` there makes
/// no loop.
fn home_of(c: &Checker, top: u64, seen: &HashMap<u64, ()>, recorded: u32) -> Option<u64> {
    let parent = c.inodes.get(&top)?.2;
    if recorded == 0 {
        // Removed while open, or its count is wrong too: /lost+found.
        return None;
    }
    let live = matches!(c.inodes.get(&parent), Some((FileType::Dir, ..)));
    (parent != top && live && seen.contains_key(&parent)).then_some(parent)
}

/// The directory above unreachable directory `d` that no entry names
/// (`d` itself, if none names it): naming it in /lost+found makes `d`
/// reachable. None when the way up loops or ends elsewhere. (Its link
/// count may be 0: a directory with entries is live all the same.)
/// (The root is below no directory once a repair has removed every entry
/// naming it, `one_name`.)
fn detached_top(c: &Checker, d: u64) -> Option<u64> {
    let mut at = d;
    let mut visited = HashSet::new();
    while let Some(&p) = c.parent_seen.get(&at) {
        if !visited.insert(at) {
            return None;
        }
        at = p;
    }
    let root = c.meta.sb.root_ino;
    match c.inodes.get(&at) {
        Some((FileType::Dir, ..)) if at != root => Some(at),
        _ => None,
    }
}

/// A repair of directory entries, made through a mount of the repaired
/// image by the engine's own directory code.
enum EntryFix {
    /// Remove entry `name` of `dir`, which names `ino`: a free inode, a
    /// directory's second name, or the entry that closes a loop.
    Remove { dir: u64, name: Vec<u8>, ino: u64 },
    /// Give entry `name` of `dir` the type of the inode it names.
    Retype { dir: u64, name: Vec<u8> },
    /// `ino` is reachable again once `top` (`ino` itself, or a directory
    /// above it), which has links but no entry, is named `#<top>` in
    /// /lost+found.
    Name { ino: u64, top: u64 },
}

/// Make `fixes` through a mount of the repaired image: entries are removed
/// and retyped first (a removed one may be lost+found's), then what lost
/// its name is named in /lost+found, made if missing. A failure leaves its problem
/// unrepaired, with the reason.
fn fix_entries(
    dev: Arc<dyn Device>,
    fixes: &mut [(EntryFix, usize)],
    salvaged: &[(u64, Vec<u8>, u64)],
    homes: &HashMap<u64, u64>,
    report: &mut Report,
) {
    let unrepaired = |report: &mut Report, at: usize, why: String| {
        let p = &mut report.problems[at];
        p.repaired = false;
        p.message += &format!("; left: {why}");
    };
    let fs = match Fs::mount(dev, MountOptions::default()) {
        Ok(fs) => fs,
        Err(e) => {
            for &(_, at) in fixes.iter() {
                unrepaired(report, at, format!("the mount to repair it failed: {e}"));
            }
            return;
        }
    };
    fixes.sort_by_key(|(fix, _)| matches!(fix, EntryFix::Name { .. }));
    let mut named: HashMap<u64, std::result::Result<String, String>> = HashMap::new();
    // Each inode named anew: the directory and name, and the problem
    // whose repair named it.
    let mut placed: HashMap<u64, (u64, Vec<u8>, usize)> = HashMap::new();
    for (fix, at) in fixes.iter() {
        let r = match fix {
            EntryFix::Remove { dir, name, ino } => fs
                .drop_entry(*dir, name, *ino)
                .map(|()| format!("; {:?} removed from {dir}", String::from_utf8_lossy(name)))
                .map_err(|e| e.to_string()),
            EntryFix::Retype { dir, name } => fs
                .retype_entry(*dir, name)
                .map(|()| "; given the inode's".to_string())
                .map_err(|e| e.to_string()),
            EntryFix::Name { ino, top } => {
                let path = named.entry(*top).or_insert_with(|| {
                    let name = fs.reconnect(*top).map_err(|e| e.to_string())?;
                    let shown = String::from_utf8_lossy(&name).into_owned();
                    let lf = fs
                        .lookup(fs.root_ino(), b"lost+found")
                        .map_err(|e| e.to_string())?;
                    // A directory whose record names a parent that the
                    // root reaches goes back below it (a rename, which
                    // sets its parent and the link counts); its name is
                    // lost with the entry.
                    let home = homes.get(top).and_then(|&home| {
                        fs.rename(lf.ino, &name, home, &name, RENAME_NOREPLACE)
                            .ok()
                            .map(|()| home)
                    });
                    let (dir, path) = match home {
                        Some(home) => (
                            home,
                            format!("{shown} in directory {home}, its parent by its record"),
                        ),
                        None => (lf.ino, format!("/lost+found/{shown}")),
                    };
                    placed.insert(*top, (dir, name, *at));
                    Ok(path)
                });
                match (path.clone(), ino == top) {
                    (Ok(path), true) => Ok(format!("; named {path}")),
                    (Ok(path), false) => Ok(format!("; now below {path}")),
                    (Err(why), _) => Err(why),
                }
            }
        };
        match r {
            Ok(done) => report.problems[*at].message += &done,
            Err(why) => unrepaired(report, *at, why),
        }
    }
    put_back(&fs, salvaged, &placed, report);
    if let Err(e) = fs.unmount() {
        report.problems.push(Problem {
            structure: "device".into(),
            addr: 0,
            message: format!("unmount after repairing directory entries: {e}"),
            repaired: false,
        });
    }
}

/// Put what a dropped directory tree named, now named anew (`placed`:
/// in /lost+found, or a directory in its recorded parent), back under
/// the names its entries that still read gave it (a rename, which keeps
/// its link count). One that cannot go back (the name is taken
/// meanwhile) stays where it was named, reachable: that is said on its
/// line.
fn put_back(
    fs: &Fs,
    salvaged: &[(u64, Vec<u8>, u64)],
    placed: &HashMap<u64, (u64, Vec<u8>, usize)>,
    report: &mut Report,
) {
    for (dir, name, ino) in salvaged {
        let Some((from, there, at)) = placed.get(ino) else {
            continue;
        };
        let shown = String::from_utf8_lossy(name);
        let done = match fs.rename(*from, there, *dir, name, RENAME_NOREPLACE) {
            Ok(()) => format!("; put back as {shown:?} in directory {dir}"),
            Err(e) => format!("; not put back as {shown:?} in directory {dir}: {e}"),
        };
        report.problems[*at].message += &done;
    }
}

/// The orphan list against the inodes' flags and links. Its repair
/// does what the next mount would: every inode with no links and no
/// entries is freed, and the list is left empty; an inode with links
/// keeps them and loses its orphan flag.
fn check_orphans(c: &mut Checker) {
    let blk = c.meta.geo.agh_blk(0);
    // A repair rebuilds an AG header that does not read (`check_space`),
    // with an empty list, and empties a list that does not read: what
    // the list held is freed here if nothing names it, as a repair of the
    // list does.
    let (root, header_lost) = match read_ag_header(c, 0) {
        Ok(h) => (h.orphan_root, false),
        Err(Error::Corrupted { .. }) if c.repair => (0, true),
        Err(e) => return c.err(e),
    };
    let t = Tree {
        owner: 0,
        tt: TreeType::Orphans,
        ag: 0,
    };
    let mut orphans = Vec::new();
    let mut list_lost = false;
    match t.walk(&mut c.meta, root, |_, n| {
        orphans.extend(n.entries.iter().map(|(k, _)| *k));
        Ok(())
    }) {
        Ok(blocks) => {
            for &b in &blocks {
                c.claim(b, 1, 0, "orphan tree");
            }
            c.orphan_blocks = blocks;
        }
        Err(Error::Corrupted {
            structure,
            addr,
            reason,
        }) if c.repair => {
            // Its blocks, claimed by no one, go back with the space check.
            orphans.clear();
            list_lost = true;
            let message = format!("{reason}; the list emptied, what it held freed if unnamed");
            c.fixed(structure, addr, message);
        }
        Err(e) => return c.err(e),
    }
    let before = c.report.problems.len();
    // Inodes that nothing would free (named by the link check).
    let lost = c
        .unlinked
        .iter()
        .any(|ino| c.inodes.get(ino).is_some_and(|i| i.3 & FLAG_ORPHAN == 0));
    let listed: HashSet<u64> = orphans.iter().copied().collect();
    let mut flagged: Vec<(u64, u32)> = c
        .inodes
        .iter()
        .filter(|(_, (_, _, _, flags))| flags & FLAG_ORPHAN != 0)
        .map(|(ino, (_, nlink, _, _))| (*ino, *nlink))
        .collect();
    flagged.sort_unstable();
    for &(ino, nlink) in &flagged {
        let at = c.meta.geo.inode_loc(ino).0;
        if !listed.contains(&ino) {
            c.fixed(
                "inode",
                at,
                format!("inode {ino} is flagged orphan but not on the orphan list"),
            );
        } else if nlink > 0 {
            c.fixed(
                "orphan list",
                blk,
                format!("lists inode {ino}, which has {nlink} links"),
            );
        }
    }
    for ino in orphans {
        match c.inodes.get(&ino) {
            None => c.fixed("orphan list", blk, format!("lists free inode {ino}")),
            Some((_, _, _, flags)) if flags & FLAG_ORPHAN == 0 => c.fixed(
                "orphan list",
                blk,
                format!("lists inode {ino}, which is not flagged orphan"),
            ),
            _ => {}
        }
    }
    let wrong = lost || header_lost || list_lost || c.report.problems.len() > before;
    if !(c.repair && wrong) {
        return;
    }
    for (ino, nlink) in flagged {
        if nlink > 0 {
            edit_inode(c, ino, |d| d.flags &= !FLAG_ORPHAN);
        }
    }
    let unlinked = std::mem::take(&mut c.unlinked);
    let emptied = free_inodes(c, &unlinked).and_then(|()| match header_lost {
        true => Ok(()),
        false => empty_orphan_list(c, blk),
    });
    if let Err(e) = emptied {
        c.err(e);
    }
}

/// AG `ag`'s header, read and verified.
fn read_ag_header(c: &mut Checker, ag: u32) -> Result<AgHeader> {
    let blk = c.meta.geo.agh_blk(ag);
    AgHeader::decode(c.meta.read(blk, magic::AG_HEADER, "AG header")?, blk, ag)
}

/// Rewrite inode `ino`'s record through `f` (a repair); the checks after
/// see the new link count, parent and flags.
fn edit_inode(c: &mut Checker, ino: u64, f: impl FnOnce(&mut DiskInode)) {
    if !c.repair {
        return;
    }
    let (blk, off) = c.meta.geo.inode_loc(ino);
    let uuid = c.meta.uuid;
    let r = c.meta.read_itable(blk).and_then(|b| {
        let mut d = DiskInode::decode(&b[off..off + INODE_SIZE], ino, blk, &uuid)?;
        f(&mut d);
        Ok(d)
    });
    match r {
        Ok(d) => {
            d.encode(&mut c.meta.write(blk)[off..off + INODE_SIZE], &uuid);
            if let Some(i) = c.inodes.get_mut(&ino) {
                (i.1, i.2, i.3) = (d.nlink, d.parent, d.flags);
            }
            c.maybe_commit();
        }
        Err(e) => c.err(e),
    }
}

/// Set inode `ino`'s bit in its inode bitmap.
fn set_imap(c: &mut Checker, ino: u64, used: bool) -> Result<()> {
    let (blk, bit) = c.meta.geo.imap_loc(ino);
    c.meta.read(blk, magic::INODE_BITMAP, "inode bitmap")?;
    bitmap::set_bit(c.meta.write(blk), bit, used);
    Ok(())
}

/// Free `inos` (a repair): each slot blank and its bit clear, and every
/// block only it owned released, for the space and checksum checks to
/// return to the bitmaps and counters.
fn free_inodes(c: &mut Checker, inos: &[u64]) -> Result<()> {
    let set: HashSet<u64> = inos.iter().copied().collect();
    for &ino in inos {
        let (blk, off) = c.meta.geo.inode_loc(ino);
        c.meta.read_itable(blk)?;
        c.meta.write(blk)[off..off + INODE_SIZE].fill(0);
        set_imap(c, ino, false)?;
        c.inodes.remove(&ino);
        c.maybe_commit();
    }
    let owned: Vec<u64> = c
        .owner
        .iter()
        .filter(|(_, owner)| set.contains(owner))
        .map(|(b, _)| *b)
        .collect();
    for b in owned {
        c.release(b);
    }
    c.written.retain(|(_, _, ino, _)| !set.contains(ino));
    Ok(())
}

/// Leave the orphan list empty (a repair), its blocks released.
fn empty_orphan_list(c: &mut Checker, hblk: u64) -> Result<()> {
    let mut h = AgHeader::decode(c.meta.read(hblk, magic::AG_HEADER, "AG header")?, hblk, 0)?;
    if h.orphan_root == 0 {
        return Ok(());
    }
    h.orphan_root = 0;
    let uuid = c.meta.uuid;
    h.encode(c.meta.write(hblk), hblk, uuid);
    for b in std::mem::take(&mut c.orphan_blocks) {
        c.release(b);
    }
    Ok(())
}

fn check_space(c: &mut Checker) {
    let repair = c.repair;
    let geo = c.meta.geo.clone();
    for ag in 0..geo.ag_count {
        let len = geo.ag_len(ag);
        let mut free = 0u64;
        for i in 0..geo.bmap_blocks {
            let blk = geo.bmap_start(ag) + i;
            let first = i * geo.bits_per_bmap;
            let (b, rebuilt) = match c
                .meta
                .read(blk, magic::BLOCK_BITMAP, "block bitmap")
                .map(|b| b.to_vec())
            {
                Ok(b) => (b, false),
                Err(e) if repair => {
                    // Bits past the AG's end stay set.
                    let ids = (magic::BLOCK_BITMAP, ag, first);
                    rebuild_bitmap(c, e, blk, ids, |b| b >= len, "the trees");
                    match c.meta.read(blk, magic::BLOCK_BITMAP, "block bitmap") {
                        Ok(b) => (b.to_vec(), true),
                        Err(e) => {
                            c.err(e);
                            continue;
                        }
                    }
                }
                Err(e) => {
                    c.err(e);
                    continue;
                }
            };
            let mut fixed = b.clone();
            let mut changed = false;
            for bit in 0..geo
                .bits_per_bmap
                .min(len.saturating_sub(i * geo.bits_per_bmap))
            {
                let global = geo.ag_start(ag) + i * geo.bits_per_bmap + bit;
                let on_disk = bitmap::get_bit(&b, bit as u32);
                let used = c.is_used(global);
                if !used {
                    free += 1;
                }
                let named = c.freed.contains(&global) || c.allocated.contains(&global);
                if on_disk != used && (rebuilt || named) {
                    // Rebuilt, freed by this repair with its owner, or
                    // given to a rebuilt tree: named there.
                    bitmap::set_bit(&mut fixed, bit as u32, used);
                    changed = true;
                } else if on_disk != used {
                    let msg = if used {
                        format!("block {global} is in use but marked free")
                    } else {
                        format!("block {global} is marked in use but nothing owns it (leaked)")
                    };
                    c.fixed("block bitmap", blk, msg);
                    bitmap::set_bit(&mut fixed, bit as u32, used);
                    changed = true;
                }
            }
            if repair && changed {
                c.meta.write(blk).copy_from_slice(&fixed);
                c.maybe_commit();
            }
        }
        let agh_blk = geo.agh_blk(ag);
        let free_inodes = (0..geo.inodes_per_ag)
            .filter(|i| {
                let ino = ag as u64 * geo.inodes_per_ag + i;
                ino != 0 && !c.inodes.contains_key(&ino)
            })
            .count() as u64;
        let h = match read_ag_header(c, ag) {
            Ok(h) => h,
            Err(Error::Corrupted { reason, .. }) if repair => {
                // Its counters are counted here; the orphan list it
                // rooted (AG 0) was emptied by the orphan check.
                let message = format!("{reason}; rebuilt from the bitmaps and inodes");
                c.fixed("AG header", agh_blk, message);
                let h = AgHeader {
                    agno: ag,
                    blocks: len,
                    free_blocks: free,
                    free_inodes,
                    orphan_root: 0,
                };
                let uuid = c.meta.uuid;
                h.encode(c.meta.create(agh_blk, Kind::Header), agh_blk, uuid);
                continue;
            }
            Err(e) => {
                c.err(e);
                continue;
            }
        };
        if h.blocks != len || h.free_blocks != free || h.free_inodes != free_inodes {
            c.fixed(
                "AG header",
                agh_blk,
                format!(
                    "AG {ag}: header says {} blocks, {} free, {} free inodes; counted {len}, {free}, {free_inodes}",
                    h.blocks, h.free_blocks, h.free_inodes
                ),
            );
            if repair {
                let h2 = AgHeader {
                    blocks: len,
                    free_blocks: free,
                    free_inodes,
                    ..h
                };
                let uuid = c.meta.uuid;
                h2.encode(c.meta.write(agh_blk), agh_blk, uuid);
            }
        }
    }
}

/// Every checksum block must verify, and free blocks carry no checksum.
fn check_csum_blocks(c: &mut Checker) {
    let geo = c.meta.geo.clone();
    for ag in 0..geo.ag_count {
        for i in 0..geo.csum_blocks {
            let blk = geo.csum_start(ag) + i;
            let first = i * geo.csums_per_block;
            let mut b = match c
                .meta
                .read(blk, magic::CSUM, "checksum block")
                .map(|b| b.to_vec())
            {
                Ok(b) => b,
                Err(Error::Corrupted { reason, .. }) if c.repair => {
                    match salvage_csums(c, blk, ag, first, reason) {
                        Ok(b) => b,
                        Err(e) => {
                            c.err(e);
                            continue;
                        }
                    }
                }
                Err(e) => {
                    c.err(e);
                    continue;
                }
            };
            let mut changed = false;
            for k in 0..geo.csums_per_block {
                let agbno = i * geo.csums_per_block + k;
                if agbno >= geo.ag_len(ag) {
                    break;
                }
                let global = geo.ag_start(ag) + agbno;
                let used = c.is_used(global);
                if !used && csum::get(&b, k as u32) != 0 {
                    // One a repair freed with its owner goes unnamed.
                    if !c.freed.contains(&global) {
                        c.fixed(
                            "checksum block",
                            blk,
                            format!("free block {global} has a checksum"),
                        );
                    }
                    csum::set(&mut b, k as u32, 0);
                    changed = true;
                }
            }
            if c.repair && changed {
                c.meta.write(blk).copy_from_slice(&b);
                c.maybe_commit();
            }
        }
    }
}

/// Checksum block `blk` (AG `ag`, from entry `first`) does not verify
/// (`reason`). A repair writes it anew with the entries as they stand:
/// a damaged header then costs nothing, and a damaged entry makes its
/// block fail its check (EIO, and `fsck --data` names it), never pass a
/// wrong block off as good. Recomputing the entries from the data would
/// bless whatever damage the data holds. Returns the new block.
fn salvage_csums(
    c: &mut Checker,
    blk: u64,
    ag: u32,
    first: u64,
    reason: String,
) -> Result<Vec<u8>> {
    let bs = c.meta.geo.block_size as usize;
    let mut old = AlignedBuf::zeroed(bs);
    c.meta.dev.read_at(&mut old, blk * bs as u64)?;
    let message = format!("{reason}; rebuilt, its entries kept");
    c.fixed("checksum block", blk, message);
    let uuid = c.meta.uuid;
    let b = c.meta.create(blk, Kind::Header);
    csum::init(b, blk, uuid, ag, first);
    b[csum::ENTRIES_OFFSET..].copy_from_slice(&old[csum::ENTRIES_OFFSET..]);
    let b = b.to_vec();
    c.maybe_commit();
    Ok(b)
}

fn check_data(c: &mut Checker) {
    let bs = c.meta.geo.block_size as usize;
    let mut written: Vec<(u64, u64, u64)> = std::mem::take(&mut c.written)
        .into_iter()
        .flat_map(|(p, n, ino, l)| (0..n).map(move |i| (p + i, ino, (l + i) * bs as u64)))
        .collect();
    written.sort_unstable();
    let mut buf = AlignedBuf::zeroed(bs);
    for (b, ino, offset) in written {
        let mut crc = Vec::new();
        if let Err(e) = crate::csums::get_csums(&mut c.meta, b, 1, &mut crc) {
            c.err(e);
            continue;
        }
        if crc[0] == 0 {
            c.report.data_blocks_unverified += 1;
            c.problem(
                "data block",
                b,
                format!(
                    "inode {ino} offset {offset}: written data block without a checksum \
                     (unverified)"
                ),
            );
            continue;
        }
        if let Err(e) = c.meta.dev.read_at(&mut buf, b * bs as u64) {
            c.err(e.into());
            continue;
        }
        c.report.data_blocks_checked += 1;
        if data_crc(&buf) != crc[0] {
            c.problem(
                "data block",
                b,
                format!("inode {ino} offset {offset}: data checksum mismatch"),
            );
        }
    }
}

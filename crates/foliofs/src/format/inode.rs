//! The on-disk inode: 512 bytes, self-describing (own magic, crc, number
//! and UUID, as XFS v5 dinodes), packed into inode-table blocks. A slot of
//! all zeros is an inode that was never used.
//!
//! ```text
//! 0   magic      u32  FINO
//! 4   crc        u32  crc32c of the 512 bytes, this field taken as zero
//! 8   ino        u64
//! 16  uuid       [16]
//! 32  mode       u32  file type and permission bits; 0 = free
//! 36  uid        u32
//! 40  gid        u32
//! 44  nlink      u32
//! 48  size       u64  bytes; only covers data already on the device
//! 56  nblocks    u64  blocks mapped (data and tree blocks)
//! 64  atime      i64 s + u32 ns
//! 76  mtime      i64 s + u32 ns
//! 88  ctime      i64 s + u32 ns
//! 100 crtime     i64 s + u32 ns
//! 112 generation u32
//! 116 flags      u32  bit 0: on the orphan list; bit 1: space was
//!                     preallocated by fallocate (kept past EOF); the
//!                     user's (chattr): bit 2 immutable, bit 3 append
//!                     only, bit 4 no dump, bit 5 no atime updates
//! 120 fork       u8   0 inline extents, 1 extent B+tree, 2 inline directory,
//!                     3 directory B+tree, 4 inline symlink target
//! 121 (pad)      u8
//! 122 fork_count u16  entries (or bytes, for symlinks) in the literal area
//! 124 rdev       u32  device number for device nodes
//! 128 xattr_root u64  root of the xattr B+tree, 0 = none
//! 136 parent     u64  directories: the parent directory
//! 144 fork_root  u64  root block when fork is a B+tree
//! 152 (reserved) 8
//! 160 literal    352  inline fork entries (fork_count of them: key u64,
//!                     value length u16, value; an extent's key and value
//!                     as `format::extent` (26 bytes each), a directory
//!                     entry's as `format::dirent`), or the symlink target
//!                     (fork_count bytes)
//! ```

use super::*;
use crate::error::{Error, Result};
use serde::Serialize;

pub const INODE_SIZE: usize = 512;
pub const LITERAL_OFFSET: usize = 160;
pub const LITERAL_SIZE: usize = INODE_SIZE - LITERAL_OFFSET;
const _: () = assert!(INODE_SIZE == 512);
const _: () = assert!(LITERAL_SIZE == 352);

pub const FLAG_ORPHAN: u32 = 1;
/// fallocate allocated space for this file: blocks past EOF are the
/// user's, not speculative, and are not trimmed on close.
pub const FLAG_PREALLOC: u32 = 2;
/// chattr +i: neither the inode nor its data nor (a directory) its
/// entries may change.
pub const FLAG_IMMUTABLE: u32 = 4;
/// chattr +a: data may only be appended; no other change to the inode,
/// and a directory's entries may be added, not removed.
pub const FLAG_APPEND: u32 = 8;
/// chattr +d: dump(8) skips the file (kept, not acted on).
pub const FLAG_NODUMP: u32 = 16;
/// chattr +A: reads do not update atime.
pub const FLAG_NOATIME: u32 = 32;
/// chattr +S: changes to the file, or to the directory and its entries,
/// are durable before the call that made them returns.
pub const FLAG_SYNC: u32 = 64;
/// chattr +D: changes to the directory's entries are durable before the
/// call returns.
pub const FLAG_DIRSYNC: u32 = 128;
/// Every flag an inode may carry.
pub const FLAGS_KNOWN: u32 = FLAG_ORPHAN
    | FLAG_PREALLOC
    | FLAG_IMMUTABLE
    | FLAG_APPEND
    | FLAG_NODUMP
    | FLAG_NOATIME
    | FLAG_SYNC
    | FLAG_DIRSYNC;

/// A node's type, from the S_IFMT bits of its mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum FileType {
    File,
    Dir,
    Symlink,
    CharDev,
    BlockDev,
    Fifo,
    Socket,
}

pub const S_IFMT: u32 = 0o170000;
pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;

impl FileType {
    pub fn from_mode(mode: u32) -> Option<Self> {
        Some(match mode & S_IFMT {
            0o100000 => FileType::File,
            0o040000 => FileType::Dir,
            0o120000 => FileType::Symlink,
            0o020000 => FileType::CharDev,
            0o060000 => FileType::BlockDev,
            0o010000 => FileType::Fifo,
            0o140000 => FileType::Socket,
            _ => return None,
        })
    }
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::File => 0o100000,
            FileType::Dir => 0o040000,
            FileType::Symlink => 0o120000,
            FileType::CharDev => 0o020000,
            FileType::BlockDev => 0o060000,
            FileType::Fifo => 0o010000,
            FileType::Socket => 0o140000,
        }
    }
    /// The d_type value stored in directory entries.
    pub fn dtype(self) -> u8 {
        match self {
            FileType::File => 8,
            FileType::Dir => 4,
            FileType::Symlink => 10,
            FileType::CharDev => 2,
            FileType::BlockDev => 6,
            FileType::Fifo => 1,
            FileType::Socket => 12,
        }
    }
    pub fn from_dtype(t: u8) -> Option<Self> {
        Some(match t {
            8 => FileType::File,
            4 => FileType::Dir,
            10 => FileType::Symlink,
            2 => FileType::CharDev,
            6 => FileType::BlockDev,
            1 => FileType::Fifo,
            12 => FileType::Socket,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Timespec {
    pub sec: i64,
    pub nsec: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ForkFormat {
    Extents = 0,
    ExtentTree = 1,
    DirInline = 2,
    DirTree = 3,
    Symlink = 4,
}

impl ForkFormat {
    fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => ForkFormat::Extents,
            1 => ForkFormat::ExtentTree,
            2 => ForkFormat::DirInline,
            3 => ForkFormat::DirTree,
            4 => ForkFormat::Symlink,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskInode {
    pub ino: u64,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u32,
    pub size: u64,
    pub nblocks: u64,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub crtime: Timespec,
    pub generation: u32,
    pub flags: u32,
    pub fork: ForkFormat,
    pub fork_count: u16,
    pub rdev: u32,
    pub xattr_root: u64,
    pub parent: u64,
    pub fork_root: u64,
    pub literal: [u8; LITERAL_SIZE],
}

impl DiskInode {
    pub fn new(ino: u64) -> Self {
        DiskInode {
            ino,
            mode: 0,
            uid: 0,
            gid: 0,
            nlink: 0,
            size: 0,
            nblocks: 0,
            atime: Timespec::default(),
            mtime: Timespec::default(),
            ctime: Timespec::default(),
            crtime: Timespec::default(),
            generation: 0,
            flags: 0,
            fork: ForkFormat::Extents,
            fork_count: 0,
            rdev: 0,
            xattr_root: 0,
            parent: 0,
            fork_root: 0,
            literal: [0; LITERAL_SIZE],
        }
    }

    pub fn encode(&self, buf: &mut [u8], uuid: &[u8; 16]) {
        assert_eq!(buf.len(), INODE_SIZE);
        buf.fill(0);
        put_u32(buf, 0, magic::INODE);
        put_u64(buf, 8, self.ino);
        buf[16..32].copy_from_slice(uuid);
        put_u32(buf, 32, self.mode);
        put_u32(buf, 36, self.uid);
        put_u32(buf, 40, self.gid);
        put_u32(buf, 44, self.nlink);
        put_u64(buf, 48, self.size);
        put_u64(buf, 56, self.nblocks);
        for (i, t) in [self.atime, self.mtime, self.ctime, self.crtime]
            .iter()
            .enumerate()
        {
            put_i64(buf, 64 + 12 * i, t.sec);
            put_u32(buf, 72 + 12 * i, t.nsec);
        }
        put_u32(buf, 112, self.generation);
        put_u32(buf, 116, self.flags);
        buf[120] = self.fork as u8;
        put_u16(buf, 122, self.fork_count);
        put_u32(buf, 124, self.rdev);
        put_u64(buf, 128, self.xattr_root);
        put_u64(buf, 136, self.parent);
        put_u64(buf, 144, self.fork_root);
        buf[LITERAL_OFFSET..].copy_from_slice(&self.literal);
        let crc = crc_with_hole(buf, 4);
        put_u32(buf, 4, crc);
    }

    /// True for a slot that was never written.
    pub fn is_blank(buf: &[u8]) -> bool {
        buf.iter().all(|&b| b == 0)
    }

    /// Decode and verify the inode `ino` found in block `blkno`.
    pub fn decode(buf: &[u8], ino: u64, blkno: u64, uuid: &[u8; 16]) -> Result<Self> {
        let bad = |r: String| Error::corrupted("inode", blkno, format!("inode {ino}: {r}"));
        if get_u32(buf, 0) != magic::INODE {
            return Err(bad("bad magic".into()));
        }
        let stored = get_u32(buf, 4);
        if stored != crc_with_hole(buf, 4) {
            return Err(bad("checksum mismatch".into()));
        }
        if get_u64(buf, 8) != ino {
            return Err(bad(format!("slot holds inode {}", get_u64(buf, 8))));
        }
        if &buf[16..32] != uuid {
            return Err(bad("belongs to another file system (UUID)".into()));
        }
        let fork = ForkFormat::from_u8(buf[120])
            .ok_or_else(|| bad(format!("bad fork format {}", buf[120])))?;
        let ts = |i: usize| Timespec {
            sec: get_i64(buf, 64 + 12 * i),
            nsec: get_u32(buf, 72 + 12 * i),
        };
        let d = DiskInode {
            ino,
            mode: get_u32(buf, 32),
            uid: get_u32(buf, 36),
            gid: get_u32(buf, 40),
            nlink: get_u32(buf, 44),
            size: get_u64(buf, 48),
            nblocks: get_u64(buf, 56),
            atime: ts(0),
            mtime: ts(1),
            ctime: ts(2),
            crtime: ts(3),
            generation: get_u32(buf, 112),
            flags: get_u32(buf, 116),
            fork,
            fork_count: get_u16(buf, 122),
            rdev: get_u32(buf, 124),
            xattr_root: get_u64(buf, 128),
            parent: get_u64(buf, 136),
            fork_root: get_u64(buf, 144),
            literal: buf[LITERAL_OFFSET..INODE_SIZE].try_into().unwrap(),
        };
        if d.ctime.nsec >= 1_000_000_000 || d.mtime.nsec >= 1_000_000_000 {
            return Err(bad("timestamp nanoseconds out of range".into()));
        }
        let max_count = match fork {
            ForkFormat::Extents => LITERAL_SIZE / EXTENT_SIZE,
            ForkFormat::Symlink => LITERAL_SIZE,
            ForkFormat::DirInline => LITERAL_SIZE / DIRENT_MIN,
            ForkFormat::ExtentTree | ForkFormat::DirTree => 0,
        };
        if d.fork_count as usize > max_count {
            return Err(bad(format!("fork count {} too large", d.fork_count)));
        }
        Ok(d)
    }
}

/// Size of an inline extent record.
pub const EXTENT_SIZE: usize = 24;
/// Smallest inline directory entry: key, ino, type, namelen, one byte.
pub const DIRENT_MIN: usize = 19;

/// The data fork: inline entries, a B+tree (root in `d.fork_root`), or an
/// inline symlink target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fork {
    Inline(Vec<(u64, Vec<u8>)>),
    Tree,
    Symlink(Vec<u8>),
}

/// Bytes inline entries take in the literal area (key u64, length u16,
/// value each).
pub fn inline_len(entries: &[(u64, Vec<u8>)]) -> usize {
    entries.iter().map(|(_, v)| 10 + v.len()).sum()
}

impl DiskInode {
    /// Pack `entries` into the literal area as inline fork entries (key
    /// u64, length u16, value), the rest zeroed; the caller checked that
    /// they fit. The fork's format is the caller's to set.
    pub fn set_inline(&mut self, entries: &[(u64, Vec<u8>)]) {
        self.literal = [0; LITERAL_SIZE];
        let mut at = 0;
        for (k, v) in entries {
            self.literal[at..at + 8].copy_from_slice(&k.to_le_bytes());
            self.literal[at + 8..at + 10].copy_from_slice(&(v.len() as u16).to_le_bytes());
            self.literal[at + 10..at + 10 + v.len()].copy_from_slice(v);
            at += 10 + v.len();
        }
        self.fork_count = entries.len() as u16;
    }

    /// The data fork the literal area holds, checked against the mode.
    pub fn decode_fork(&self, blk: u64) -> Result<Fork> {
        let bad = |r: &str| Error::corrupted("inode", blk, format!("inode {}: {r}", self.ino));
        let fork = match self.fork {
            ForkFormat::Extents | ForkFormat::DirInline => {
                let mut entries = Vec::with_capacity(self.fork_count as usize);
                let mut p = 0usize;
                for _ in 0..self.fork_count {
                    if p + 10 > LITERAL_SIZE {
                        return Err(bad("inline entries overrun the literal area"));
                    }
                    let k = get_u64(&self.literal, p);
                    let vlen = get_u16(&self.literal, p + 8) as usize;
                    if p + 10 + vlen > LITERAL_SIZE {
                        return Err(bad("inline entry overruns the literal area"));
                    }
                    if entries
                        .last()
                        .is_some_and(|(pk, _): &(u64, Vec<u8>)| *pk >= k)
                    {
                        return Err(bad("inline entries out of order"));
                    }
                    entries.push((k, self.literal[p + 10..p + 10 + vlen].to_vec()));
                    p += 10 + vlen;
                }
                Fork::Inline(entries)
            }
            ForkFormat::ExtentTree | ForkFormat::DirTree => Fork::Tree,
            ForkFormat::Symlink => Fork::Symlink(self.literal[..self.fork_count as usize].to_vec()),
        };
        let is_dir = self.mode & S_IFMT == 0o040000;
        let dir_fork = matches!(self.fork, ForkFormat::DirInline | ForkFormat::DirTree);
        if is_dir != dir_fork {
            return Err(bad("fork format does not match the file type"));
        }
        if FileType::from_mode(self.mode).is_none() {
            return Err(bad("bad file type in mode"));
        }
        Ok(fork)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DiskInode {
        let mut d = DiskInode::new(77);
        d.mode = 0o100644;
        d.nlink = 1;
        d.size = 12345;
        d.mtime = Timespec { sec: 10, nsec: 5 };
        d.fork_count = 2;
        d.literal[0] = 9;
        d.literal[351] = 8;
        d
    }

    #[test]
    fn round_trip() {
        let mut b = vec![0; INODE_SIZE];
        sample().encode(&mut b, &[4; 16]);
        assert_eq!(DiskInode::decode(&b, 77, 10, &[4; 16]).unwrap(), sample());
        assert!(!DiskInode::is_blank(&b));
        assert!(DiskInode::is_blank(&[0; INODE_SIZE]));
    }

    #[test]
    fn flipped_byte_is_corruption() {
        let mut b = vec![0; INODE_SIZE];
        sample().encode(&mut b, &[4; 16]);
        for pos in [0, 5, 8, 33, 50, 121, 200, 511] {
            let mut c = b.clone();
            c[pos] ^= 2;
            let e = DiskInode::decode(&c, 77, 10, &[4; 16]).unwrap_err();
            assert!(matches!(
                e,
                Error::Corrupted {
                    structure: "inode",
                    addr: 10,
                    ..
                }
            ));
        }
    }

    #[test]
    fn wrong_slot_is_corruption() {
        let mut b = vec![0; INODE_SIZE];
        sample().encode(&mut b, &[4; 16]);
        assert!(DiskInode::decode(&b, 78, 10, &[4; 16]).is_err());
    }
}

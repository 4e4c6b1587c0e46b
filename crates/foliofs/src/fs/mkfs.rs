//! Make a new file system.

use crate::device::{AlignedBuf, Device};
use crate::error::{Error, Result};
use crate::format::ag_header::AgHeader;
use crate::format::inode::{DiskInode, ForkFormat, INODE_SIZE};
use crate::format::superblock::Superblock;
use crate::format::{bitmap, csum, header, magic, FORMAT_VERSION, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
use crate::geometry::Geometry;

/// Open `image` to be formatted: own it (see `device::lock`), refuse one
/// that already holds a foliofs file system (`Error::Exists`) unless
/// `force`, before touching it; then set its size to `size` bytes when
/// given (creating the file; a block device keeps its own size). Without
/// `size` the image must exist (`Error::NotFound`).
pub fn open_for_mkfs(
    image: &std::path::Path,
    size: Option<u64>,
    force: bool,
) -> Result<crate::device::FileDevice> {
    use crate::device::FileDevice;
    if !image.exists() {
        if size.is_none() {
            return Err(Error::NotFound);
        }
        // Created empty: nothing that was there is touched.
        std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(image)?;
    }
    let mut dev = FileDevice::open(image, true)?;
    if !force && crate::meta::read_superblock(&dev).is_ok() {
        return Err(Error::Exists);
    }
    if let Some(size) = size {
        dev.set_len(size)?;
    }
    Ok(dev)
}

#[derive(Clone, Debug)]
pub struct MkfsOptions {
    pub block_size: u32,
    /// None: chosen from the size, like XFS (4 AGs when each gets at least
    /// 16 MiB, fewer on small devices, AGs capped at 1 TiB).
    pub ag_count: Option<u32>,
    /// Bytes of space per inode (ext4's bytes-per-inode); default 16 KiB.
    pub bytes_per_inode: u64,
    /// None: 1/16 of the device, between 64 blocks and 128 MiB.
    pub journal_blocks: Option<u64>,
    pub label: String,
    /// Use only this many bytes of the device (None: all of it).
    pub size: Option<u64>,
    /// The root directory's owner and group (mke2fs's `root_owner`);
    /// default 0:0. The CLI gives the user running mkfs.
    pub root_owner: (u32, u32),
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions {
            block_size: 4096,
            ag_count: None,
            bytes_per_inode: 16384,
            journal_blocks: None,
            label: String::new(),
            size: None,
            root_owner: (0, 0),
        }
    }
}

fn invalid(msg: String) -> Error {
    Error::Invalid(msg)
}

/// Compute the superblock for a device of `bytes` bytes.
pub fn plan(bytes: u64, o: &MkfsOptions) -> Result<Superblock> {
    let bs = o.block_size;
    if !bs.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) {
        return Err(invalid(format!(
            "block size {bs} must be a power of two from 512 to 65536"
        )));
    }
    if o.label.len() > 32 {
        return Err(invalid("label longer than 32 bytes".into()));
    }
    let total = bytes / bs as u64;
    if total < 256 {
        return Err(invalid(format!(
            "{bytes} bytes is too small: need at least 256 blocks of {bs} bytes"
        )));
    }
    let ag_count = match o.ag_count {
        Some(0) => return Err(invalid("AG count must be at least 1".into())),
        Some(n) => n as u64,
        None => {
            let by_min = (bytes / (16 << 20)).clamp(1, 4);
            by_min.max(bytes.div_ceil(1 << 40))
        }
    };
    let ag_blocks = total.div_ceil(ag_count);
    if ag_blocks > u32::MAX as u64 {
        return Err(invalid("AGs would exceed 2^32 blocks: use more AGs".into()));
    }
    // Drop a runt last AG that could not hold its own metadata.
    let mut ag_count = total.div_ceil(ag_blocks);
    let ipb = (bs as u64 / INODE_SIZE as u64).max(1);
    let inodes_per_ag = ((ag_blocks * bs as u64) / o.bytes_per_inode.max(1024))
        .max(64)
        .next_multiple_of(ipb)
        .min(u32::MAX as u64 - 64);
    let itable_blocks = inodes_per_ag / ipb;
    let bits = bitmap::bits_per_block(bs) as u64;
    let bmap_blocks = ag_blocks.div_ceil(bits);
    let imap_blocks = inodes_per_ag.div_ceil(bits);
    let csum_blocks = ag_blocks.div_ceil(csum::entries_per_block(bs) as u64);
    let meta = 3 + bmap_blocks + imap_blocks + csum_blocks + itable_blocks;
    let journal_blocks = o
        .journal_blocks
        // The log also holds small overwrites until a checkpoint writes
        // them home: a sixteenth of the device, 64 blocks to 128 MiB.
        .unwrap_or((total / 16).clamp(64, (128 << 20) / bs as u64));
    let mut total = total;
    let last = total - (ag_count - 1) * ag_blocks;
    if ag_count > 1 && last < meta + 64 {
        ag_count -= 1;
        total = ag_count * ag_blocks;
    }
    if meta + journal_blocks + 64 > ag_blocks.min(total) {
        return Err(invalid(format!(
            "AGs of {ag_blocks} blocks cannot hold {meta} metadata blocks, a {journal_blocks}-block journal and data: use fewer AGs or a larger device"
        )));
    }
    let mut label = [0u8; 32];
    label[..o.label.len()].copy_from_slice(o.label.as_bytes());
    let mut uuid = [0u8; 16];
    rand::Rng::fill(&mut rand::rng(), &mut uuid);
    let sb = Superblock {
        uuid,
        version: FORMAT_VERSION,
        block_size: bs,
        total_blocks: total,
        ag_blocks,
        ag_count: ag_count as u32,
        inodes_per_ag: inodes_per_ag as u32,
        inode_size: INODE_SIZE as u32,
        flags: crate::format::superblock::FLAG_CLEAN,
        journal_start: meta,
        journal_blocks,
        tail_pos: 0,
        tail_seq: 1,
        generation: 0,
        root_ino: 1,
        bmap_blocks: bmap_blocks as u32,
        imap_blocks: imap_blocks as u32,
        csum_blocks: csum_blocks as u32,
        itable_blocks: itable_blocks as u32,
        label,
        mkfs_time: crate::fs::clock::now_precise().sec as u64,
    };
    sb.check(0)?;
    Ok(sb)
}

/// Write a new, empty file system to `dev`. `progress` is called with
/// (AGs done, AG count).
pub fn mkfs(
    dev: &dyn Device,
    o: &MkfsOptions,
    mut progress: impl FnMut(u32, u32),
) -> Result<Superblock> {
    let bytes = o.size.unwrap_or(dev.len()).min(dev.len());
    let mut sb = plan(bytes, o)?;
    let geo = Geometry::new(&sb);
    let bs = geo.block_size as usize;
    let uuid = sb.uuid;
    let write = |blk: u64, buf: &[u8]| dev.write_at(buf, blk * bs as u64);
    let mut buf = AlignedBuf::zeroed(bs);
    for ag in 0..geo.ag_count {
        let len = geo.ag_len(ag);
        let data_start = geo.data_start_agbno(ag);
        // Block bitmap: the metadata run (and AG 0's journal) is in use;
        // bits past the AG's end count as used so they are never handed out.
        let (bmap, imap) = (geo.bmap_start(ag), geo.imap_start(ag));
        let mut write_bitmap = |start: u64, blocks: u64, magic: u32, used: &dyn Fn(u64) -> bool| {
            for i in 0..blocks {
                let first = i * geo.bits_per_bmap;
                bitmap::init(&mut buf, magic, start + i, uuid, ag, first);
                for bit in 0..geo.bits_per_bmap {
                    if used(first + bit) {
                        bitmap::set_bit(&mut buf, bit as u32, true);
                    }
                }
                header::stamp(&mut buf);
                write(start + i, &buf)?;
            }
            Ok::<(), Error>(())
        };
        write_bitmap(bmap, geo.bmap_blocks, magic::BLOCK_BITMAP, &|b| {
            b < data_start || b >= len
        })?;
        let used_inodes = if ag == 0 { 2 } else { 0 }; // inode 0 reserved, 1 = root
        write_bitmap(imap, geo.imap_blocks, magic::INODE_BITMAP, &|i| {
            i < used_inodes || i >= geo.inodes_per_ag
        })?;
        for i in 0..geo.csum_blocks {
            let blk = geo.csum_start(ag) + i;
            csum::init(&mut buf, blk, uuid, ag, i * geo.csums_per_block);
            header::stamp(&mut buf);
            write(blk, &buf)?;
        }
        // Inode table: zeroed slots are never-used inodes. At 16 KiB per
        // 512-byte inode the table is 1/32 of the device, written in 4 MiB
        // chunks.
        let chunk_blocks = ((4 << 20) / bs as u64).max(1);
        let zeros = AlignedBuf::zeroed(chunk_blocks as usize * bs);
        let mut b = 0;
        while b < geo.itable_blocks {
            let n = chunk_blocks.min(geo.itable_blocks - b);
            write(geo.itable_start(ag) + b, &zeros[..n as usize * bs])?;
            b += n;
        }
        if ag == 0 {
            // An old journal must not replay into the new file system: zero it.
            let mut b = 0;
            while b < geo.journal_blocks {
                let n = chunk_blocks.min(geo.journal_blocks - b);
                write(geo.journal_start + b, &zeros[..n as usize * bs])?;
                b += n;
            }
        }
        let agh = AgHeader {
            agno: ag,
            blocks: len,
            free_blocks: len - data_start,
            free_inodes: geo.inodes_per_ag - used_inodes,
            orphan_root: 0,
        };
        agh.encode(&mut buf, geo.agh_blk(ag), uuid);
        header::stamp(&mut buf);
        write(geo.agh_blk(ag), &buf)?;
        if ag > 0 {
            for slot in 0..2 {
                sb.encode(&mut buf, geo.ag_start(ag) + slot);
                write(geo.ag_start(ag) + slot, &buf)?;
            }
        }
        progress(ag + 1, geo.ag_count);
    }
    // The root directory: an empty inline directory.
    let t = crate::fs::clock::now_precise();
    let mut root = DiskInode::new(sb.root_ino);
    root.mode = 0o040755;
    (root.uid, root.gid) = o.root_owner;
    root.nlink = 2;
    root.parent = sb.root_ino;
    root.atime = t;
    root.mtime = t;
    root.ctime = t;
    root.crtime = t;
    root.fork = ForkFormat::DirInline;
    root.generation = 1;
    let (blk, off) = geo.inode_loc(sb.root_ino);
    dev.read_at(&mut buf, blk * bs as u64)?;
    root.encode(&mut buf[off..off + INODE_SIZE], &uuid);
    write(blk, &buf)?;
    dev.flush()?;
    // Superblock last: until it is written the device is not a file system.
    for slot in 0..2 {
        sb.generation = slot;
        sb.encode(&mut buf, slot);
        write(slot, &buf)?;
    }
    dev.flush()?;
    Ok(sb)
}

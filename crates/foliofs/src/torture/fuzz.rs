//! The fuzz targets' bodies (`fuzz/`, run with `cargo +nightly fuzz`),
//! here so that the test suite replays their saved inputs
//! (`fuzz/seeds/`, `tests/fuzz_seeds.rs`) on every run: a change that
//! makes one of them panic fails CI, not only the next fuzzing session.

use crate::device::{AlignedBuf, Device, MemDevice};
use crate::format::btree_node::{Node, TreeType};
use crate::format::header::{stamp, BlockHeader};
use crate::format::{ag_header::AgHeader, inode::DiskInode, journal, superblock::Superblock};
use crate::fs::Fs;
use crate::fs::{mkfs, Falloc, MkfsOptions, MountOptions, SetAttr};
use std::sync::{Arc, OnceLock};

/// Every on-disk decoder on arbitrary bytes, with the checksum re-stamped
/// so the structure checks behind it are reached: typed errors, never a
/// panic.
pub fn decode_metadata(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let size = if which & 0x80 != 0 { 4096 } else { 512 };
    let mut buf = vec![0u8; size];
    let n = rest.len().min(size);
    buf[..n].copy_from_slice(&rest[..n]);
    if which & 0x40 == 0 {
        stamp(&mut buf);
    }
    let h = BlockHeader::decode(&buf);
    match which % 8 {
        0 => {
            if let Ok(sb) = Superblock::decode(&buf, h.blkno) {
                let _ = crate::geometry::Geometry::new(&sb);
            }
        }
        1 => {
            let _ = AgHeader::decode(&buf, h.blkno, (h.owner & 0xffff) as u32);
        }
        2 => {
            let _ = DiskInode::decode(&buf[..512], h.owner, h.blkno, &h.uuid);
        }
        3..=6 => {
            let tt = [
                TreeType::Extents,
                TreeType::Dir,
                TreeType::Xattr,
                TreeType::Orphans,
            ][(which % 8 - 3) as usize];
            let _ = Node::decode(&buf, h.blkno, h.owner, tt);
        }
        _ => {
            let _ = journal::decode_desc(&buf);
            let _ = journal::decode_commit(&buf);
        }
    }
}

const BS: usize = 4096;

/// A small file system left mid-journal: files written and fsynced, some
/// of their blocks overwritten through the overwrite log, then dropped
/// without unmount so the mount replays the journal.
fn base() -> &'static Vec<u8> {
    static IMG: OnceLock<Vec<u8>> = OnceLock::new();
    IMG.get_or_init(|| {
        let dev = Arc::new(MemDevice::new(8 << 20));
        let o = MkfsOptions {
            block_size: BS as u32,
            ag_count: Some(2),
            journal_blocks: Some(32),
            ..Default::default()
        };
        mkfs(&*dev, &o, |_, _| {}).unwrap();
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        let root = fs.root_ino();
        let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
        for i in 0..20u8 {
            let f = fs.create(d.ino, &[b'f', b'0' + i], 0o644, 0, 0).unwrap();
            fs.write(f.ino, 0, &vec![i + 1; 3000 + i as usize * 500])
                .unwrap();
            fs.setxattr(f.ino, b"user.x", &[i; 40], 0).unwrap();
            fs.fsync(f.ino, false).unwrap();
        }
        // Whole-block overwrites of written blocks, fdatasynced: their
        // data goes into the journal as logged blocks, for replay to
        // write home (the same bytes, so reads check as above).
        for i in 4..9u8 {
            let f = fs.lookup(d.ino, &[b'f', b'0' + i]).unwrap();
            fs.write(f.ino, 0, &[i + 1; BS]).unwrap();
            fs.fsync(f.ino, true).unwrap();
        }
        drop(fs);
        dev.image()
    })
}

/// Mount (journal replay), read everything, fsck (data checksums too) and
/// repair an image with fuzzed patches over its metadata and journal:
/// typed errors and EIO, never a panic, never a read of bytes no file was
/// given; a repair that fixed every problem leaves an image that checks
/// clean and mounts.
pub fn mount_image(data: &[u8]) {
    let mut img = base().clone();
    // Patches: [block u8][offset u16][len u8][bytes...], in the first 256
    // blocks (superblock, AG headers, bitmaps, inodes, trees, journal).
    let mut rest = data;
    let mut restamp = Vec::new();
    while rest.len() >= 4 {
        let blk = rest[0] as usize;
        let off = u16::from_le_bytes([rest[1], rest[2]]) as usize % BS;
        let len = (rest[3] as usize).min(rest.len() - 4).min(BS - off);
        let at = blk * BS + off;
        img[at..at + len].copy_from_slice(&rest[4..4 + len]);
        if rest[3] & 0x80 != 0 {
            restamp.push(blk);
        }
        rest = &rest[4 + len..];
    }
    for blk in restamp {
        crate::format::header::stamp(&mut img[blk * BS..(blk + 1) * BS]);
    }
    let dev = Arc::new(MemDevice::from_image(img));
    if let Ok(fs) = Fs::mount(dev.clone(), MountOptions::default()) {
        let root = fs.root_ino();
        if let Ok(d) = fs.lookup(root, b"d") {
            if let Ok(list) = fs.readdir(d.ino, 0, 100) {
                for e in list {
                    if let Ok(a) = fs.lookup(d.ino, &e.name) {
                        let mut buf = vec![0u8; (a.size as usize).min(1 << 20)];
                        if let Ok(n) = fs.read(a.ino, 0, &mut buf) {
                            // Only the byte that file was given, or zeros.
                            let i = e.name.get(1).map_or(0, |c| c.wrapping_sub(b'0'));
                            assert!(
                                buf[..n].iter().all(|&b| b == 0 || b == i + 1) || e.name.len() != 2
                            );
                        }
                        let _ = fs.getxattr(a.ino, b"user.x");
                    }
                }
            }
        }
        let _ = fs.unmount();
    }
    // Every data block's checksum too, then a repair: neither may panic.
    let dev = dev as Arc<dyn Device>;
    let check = crate::fsck::FsckOptions {
        repair: false,
        check_data: true,
    };
    let _ = crate::fsck::fsck(dev.clone(), &check, |_, _| {});
    let repair = crate::fsck::FsckOptions {
        repair: true,
        check_data: false,
    };
    // A repair that says it fixed everything leaves nothing to find, and
    // an image that mounts.
    if let Ok(r) = crate::fsck::fsck(dev.clone(), &repair, |_, _| {}) {
        if r.exit_code() == 1 {
            let after = crate::fsck::fsck(dev.clone(), &Default::default(), |_, _| {});
            if let Ok(after) = after {
                assert!(
                    after.is_clean(),
                    "left after a repair that fixed {:?}: {:?}",
                    r.problems,
                    after.problems
                );
                match Fs::mount(dev, MountOptions::default()) {
                    Ok(fs) => {
                        let _ = fs.unmount();
                    }
                    Err(e) => panic!("a repaired image that checks clean does not mount: {e}"),
                }
            }
        }
    }
}

fn opts() -> MountOptions {
    MountOptions {
        cache_bytes: 1 << 20,
        dirty_limit_bytes: 256 << 10,
        writeback_interval_ms: 0,
        ..Default::default()
    }
}

/// Operation sequences against an in-memory model: each input is a
/// program of writes, reads, truncates, punches, direct I/O, fsyncs and
/// remounts on one file; every read must match the model and fsck must
/// stay clean.
pub fn ops_model(data: &[u8]) {
    let dev = Arc::new(MemDevice::new(8 << 20));
    let o = MkfsOptions {
        block_size: 4096,
        ag_count: Some(1),
        journal_blocks: Some(32),
        ..Default::default()
    };
    mkfs(&*dev, &o, |_, _| {}).unwrap();
    let mut fs = Fs::mount(dev.clone(), opts()).unwrap();
    let ino = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    let mut model: Vec<u8> = Vec::new();
    for (k, op) in data.chunks_exact(6).enumerate() {
        let off = u32::from_le_bytes([op[1], op[2], op[3], 0]) as u64 % (512 << 10);
        let len = (u16::from_le_bytes([op[4], op[5]]) as u64 % 70_000) + 1;
        match op[0] % 8 {
            0 | 1 => {
                let buf = vec![(k as u8) | 1; len as usize];
                fs.write(ino, off, &buf).unwrap();
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&buf);
            }
            2 => {
                let mut buf = vec![0xAAu8; len as usize];
                let n = fs.read(ino, off, &mut buf).unwrap();
                let want = model
                    .get(off as usize..)
                    .map_or(&[][..], |m| &m[..m.len().min(len as usize)]);
                assert_eq!(&buf[..n], want, "op {k}: read at {off}+{len}");
            }
            3 => {
                fs.setattr(
                    ino,
                    &SetAttr {
                        size: Some(off),
                        ..Default::default()
                    },
                )
                .unwrap();
                model.resize(off as usize, 0);
            }
            4 => {
                fs.fallocate(ino, Falloc::PunchHole, off, len).unwrap();
                let e = ((off + len) as usize).min(model.len());
                if (off as usize) < e {
                    model[off as usize..e].fill(0);
                }
            }
            5 => {
                let (o, l) = (off / 4096 * 4096, (len / 4096 + 1) * 4096);
                let mut b = AlignedBuf::zeroed(l as usize);
                b.fill((k as u8) | 0x80);
                fs.write_direct(ino, o, &b).unwrap();
                let end = (o + l) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[o as usize..end].copy_from_slice(&b);
            }
            6 => fs.fsync(ino, op[1] & 1 == 1).unwrap(),
            _ => {
                fs.unmount().unwrap();
                fs = Fs::mount(dev.clone(), opts()).unwrap();
            }
        }
        assert_eq!(
            fs.getattr(ino).unwrap().size,
            model.len() as u64,
            "op {k}: size"
        );
    }
    fs.unmount().unwrap();
    let r = crate::fsck::fsck(dev, &Default::default(), |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

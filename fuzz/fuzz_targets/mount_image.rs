//! Mount (journal replay), read everything, fsck (data checksums too) and
//! repair an image with fuzzed patches over its metadata and journal:
//! typed errors and EIO, never a panic, never a read of bytes no file was
//! given.
#![no_main]

use foliofs::device::{Device, MemDevice};
use foliofs::fs::{mkfs, MkfsOptions, MountOptions};
use foliofs::Fs;
use libfuzzer_sys::fuzz_target;
use std::sync::{Arc, OnceLock};

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

fuzz_target!(|data: &[u8]| {
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
        foliofs::format::header::stamp(&mut img[blk * BS..(blk + 1) * BS]);
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
    let check = foliofs::fsck::FsckOptions {
        repair: false,
        check_data: true,
    };
    let _ = foliofs::fsck::fsck(dev.clone(), &check, |_, _| {});
    let repair = foliofs::fsck::FsckOptions {
        repair: true,
        check_data: false,
    };
    let _ = foliofs::fsck::fsck(dev, &repair, |_, _| {});
});

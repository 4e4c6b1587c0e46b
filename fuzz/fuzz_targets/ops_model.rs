//! Operation sequences against an in-memory model: each input is a program
//! of writes, reads, truncates, punches, direct I/O, fsyncs and remounts on
//! one file; every read must match the model and fsck must stay clean.
#![no_main]

use foliofs::device::{AlignedBuf, MemDevice};
use foliofs::fs::{mkfs, Falloc, MkfsOptions, MountOptions, SetAttr};
use foliofs::Fs;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fn opts() -> MountOptions {
    MountOptions {
        cache_bytes: 1 << 20,
        dirty_limit_bytes: 256 << 10,
        writeback_interval_ms: 0,
        ..Default::default()
    }
}

fuzz_target!(|data: &[u8]| {
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
                let want = model.get(off as usize..).map_or(&[][..], |m| &m[..m.len().min(len as usize)]);
                assert_eq!(&buf[..n], want, "op {k}: read at {off}+{len}");
            }
            3 => {
                fs.setattr(ino, &SetAttr { size: Some(off), ..Default::default() }).unwrap();
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
        assert_eq!(fs.getattr(ino).unwrap().size, model.len() as u64, "op {k}: size");
    }
    fs.unmount().unwrap();
    let r = foliofs::fsck::fsck(dev, &Default::default(), |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
});

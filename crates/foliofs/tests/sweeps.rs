//! Sweeps over the faults a file system meets:
//! - device faults: the n-th read, write or flush and every later one
//!   fails, for n across a whole workload; nothing panics, after a remount
//!   fsck is clean and every acknowledged fsync is intact;
//! - ENOSPC: the file system is filled with each kind of write; ENOSPC
//!   comes from the call that asks for space, never later from writeback;
//!   fsck stays clean and deleting everything gives all space back;
//! - corruption: random bit flips anywhere in a written image, and in
//!   every data block; mount, fsck and reads never panic and never return
//!   wrong data.

use foliofs::device::{AlignedBuf, CrashDevice, MemDevice};
use foliofs::fs::*;
use foliofs::{Error, Fs};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod common;
use common::fsck_clean;

fn content(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| 1 + ((i * 97 + k as u64 * 13 + (k as u64 >> 12)) % 251) as u8)
        .collect()
}

fn fresh_image(bytes: u64) -> Vec<u8> {
    let mem = MemDevice::new(bytes);
    let o = MkfsOptions {
        block_size: 4096,
        ag_count: Some(2),
        journal_blocks: Some(64),
        ..Default::default()
    };
    mkfs(&mem, &o, |_, _| {}).unwrap();
    mem.image()
}

/// Files f0..f11, each written (buffered, direct, or both) and fsynced;
/// returns which fsyncs were acknowledged. Stops at the first error.
fn fault_workload(fs: &Fs, acked: &mut Vec<u64>) -> foliofs::Result<()> {
    let root = fs.root_ino();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0)?;
    for i in 0..12u64 {
        let f = fs.create(d.ino, format!("f{i}").as_bytes(), 0o644, 0, 0)?;
        let data = content(i, 5000 + i as usize * 3001);
        fs.write(f.ino, 0, &data)?;
        if i % 3 == 2 {
            let mut b = AlignedBuf::zeroed(8192);
            b.copy_from_slice(&data[..8192]);
            fs.write_direct(f.ino, 0, &b)?;
        }
        fs.setxattr(f.ino, b"user.i", &i.to_le_bytes(), 0)?;
        fs.fsync(f.ino, i % 2 == 0)?;
        acked.push(i);
        if i % 4 == 3 {
            fs.unlink(d.ino, format!("f{}", i - 2).as_bytes())?;
            acked.retain(|&x| x != i - 2);
            fs.sync()?;
        }
    }
    // Read everything back (through the device: the caches are small).
    for &i in acked.iter() {
        let ino = fs.lookup(d.ino, format!("f{i}").as_bytes())?.ino;
        let mut buf = vec![0u8; 5000 + i as usize * 3001];
        fs.read(ino, 0, &mut buf)?;
        assert!(buf == content(i, buf.len()), "f{i} read back wrong data");
    }
    Ok(())
}

/// Small caches, so metadata and data are read from the device often.
fn small_caches() -> MountOptions {
    MountOptions {
        meta_cache_bytes: 64 << 10,
        cache_bytes: 256 << 10,
        dirty_limit_bytes: 128 << 10,
        ..Default::default()
    }
}

/// Which device operation the sweep fails.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Read,
    Write,
    Flush,
}

fn fault_sweep(kind: Kind) -> usize {
    let base = fresh_image(24 << 20);
    // A clean run counts the operations of this kind.
    let dev = Arc::new(CrashDevice::new(base.clone()));
    dev.stop_recording();
    let (r0, w0, f0) = (dev.read_count(), dev.write_count(), dev.flush_count());
    let fs = Fs::mount(dev.clone(), small_caches()).unwrap();
    fault_workload(&fs, &mut Vec::new()).unwrap();
    fs.unmount().unwrap();
    let total = match kind {
        Kind::Read => dev.read_count() - r0,
        Kind::Write => dev.write_count() - w0,
        Kind::Flush => dev.flush_count() - f0,
    };
    let step = (total / 60).max(1);
    let mut runs = 0;
    for n in (0..total).step_by(step as usize) {
        let ctx = format!("{kind:?} fault from operation {n} of {total}");
        let dev = Arc::new(CrashDevice::new(base.clone()));
        dev.stop_recording();
        let at = match kind {
            Kind::Read => &dev.faults.fail_read_from,
            Kind::Write => &dev.faults.fail_write_from,
            Kind::Flush => &dev.faults.fail_flush_from,
        };
        let base_count = match kind {
            Kind::Read => dev.read_count(),
            Kind::Write => dev.write_count(),
            Kind::Flush => dev.flush_count(),
        };
        at.store(base_count + n, Ordering::SeqCst);
        let mut acked = Vec::new();
        let r = catch_unwind(AssertUnwindSafe(|| {
            if let Ok(fs) = Fs::mount(dev.clone(), small_caches()) {
                let _ = fault_workload(&fs, &mut acked);
                // The error reached the caller; unmount may fail too.
                let _ = fs.unmount();
            }
        }));
        assert!(r.is_ok(), "{ctx}: panicked");
        // Power back: the medium as the failed device left it.
        at.store(u64::MAX, Ordering::SeqCst);
        let img = Arc::new(MemDevice::from_image(dev.image()));
        let fs = Fs::mount(img.clone(), MountOptions::default())
            .unwrap_or_else(|e| panic!("{ctx}: remount: {e}"));
        let root = fs.root_ino();
        for &i in &acked {
            let d = fs
                .lookup(root, b"d")
                .unwrap_or_else(|e| panic!("{ctx}: d: {e}"));
            let a = fs
                .lookup(d.ino, format!("f{i}").as_bytes())
                .unwrap_or_else(|e| panic!("{ctx}: fsynced f{i} missing: {e}"));
            let want = content(i, 5000 + i as usize * 3001);
            let mut buf = vec![0; want.len() + 10];
            let got = fs.read(a.ino, 0, &mut buf).unwrap();
            assert!(
                got == want.len() && buf[..got] == want[..],
                "{ctx}: f{i} contents"
            );
            assert_eq!(
                fs.getxattr(a.ino, b"user.i").unwrap(),
                i.to_le_bytes(),
                "{ctx}"
            );
        }
        fs.unmount()
            .unwrap_or_else(|e| panic!("{ctx}: unmount: {e}"));
        fsck_clean(img, &ctx);
        runs += 1;
    }
    runs
}

#[test]
fn device_read_faults_anywhere() {
    assert!(fault_sweep(Kind::Read) >= 20);
}

#[test]
fn device_write_faults_anywhere() {
    assert!(fault_sweep(Kind::Write) >= 20);
}

#[test]
fn device_flush_faults_anywhere() {
    assert!(fault_sweep(Kind::Flush) >= 10);
}

/// Fill a small file system with one kind of write until ENOSPC.
fn fill(fs: &Fs, kind: &str, dir: u64) -> (u64, Error) {
    let mut made = 0u64;
    loop {
        let name = format!("{kind}-{made}");
        let r: foliofs::Result<()> = (|| match kind {
            "buffered" => {
                let f = fs.create(dir, name.as_bytes(), 0o644, 0, 0)?;
                for k in 0..64u64 {
                    fs.write(f.ino, k * 65536, &[7u8; 65536])?;
                }
                Ok(())
            }
            "appends" => {
                let f = fs.create(dir, name.as_bytes(), 0o644, 0, 0)?;
                fs.open(f.ino)?;
                let mut r = Ok(());
                for k in 0..200_000u64 {
                    if let Err(e) = fs.write(f.ino, k, &[3]) {
                        r = Err(e);
                        break;
                    }
                }
                fs.release(f.ino)?;
                r
            }
            "direct" => {
                let f = fs.create(dir, name.as_bytes(), 0o644, 0, 0)?;
                let b = AlignedBuf::zeroed(1 << 20);
                for k in 0..4u64 {
                    fs.write_direct(f.ino, k << 20, &b)?;
                }
                Ok(())
            }
            "fallocate" => {
                let f = fs.create(dir, name.as_bytes(), 0o644, 0, 0)?;
                fs.fallocate(f.ino, Falloc::Allocate { keep_size: false }, 0, 3 << 20)
            }
            "metadata" => {
                let d = fs.mkdir(dir, name.as_bytes(), 0o755, 0, 0)?;
                for k in 0..50 {
                    let f = fs.create(d.ino, format!("n{k:0>40}").as_bytes(), 0o644, 0, 0)?;
                    fs.setxattr(f.ino, b"user.big", &[1u8; 3000], 0)?;
                    fs.symlink(d.ino, format!("l{k:0>40}").as_bytes(), &[b'x'; 1000], 0, 0)?;
                }
                Ok(())
            }
            _ => unreachable!(),
        })();
        match r {
            Ok(()) => made += 1,
            Err(e) => return (made, e),
        }
        assert!(made < 100_000, "{kind}: never ran out of space");
    }
}

#[test]
fn enospc_from_every_kind_of_write() {
    for kind in ["buffered", "appends", "direct", "fallocate", "metadata"] {
        let dev = Arc::new(MemDevice::from_image(fresh_image(24 << 20)));
        let fs = Fs::mount(
            dev.clone(),
            MountOptions {
                dirty_limit_bytes: 2 << 20,
                ..Default::default()
            },
        )
        .unwrap();
        let root = fs.root_ino();
        let free0 = fs.statfs().unwrap().blocks_free;
        let d = fs.mkdir(root, b"fill", 0o755, 0, 0).unwrap();
        let (made, e) = fill(&fs, kind, d.ino);
        assert!(made > 0, "{kind}: nothing fitted");
        assert!(matches!(e, Error::NoSpace), "{kind}: {e}");
        // What was accepted is written back: no late ENOSPC (sync reports
        // any writeback error of the file system).
        fs.sync()
            .unwrap_or_else(|e| panic!("{kind}: a write was lost at writeback: {e}"));
        assert!(fs.shutdown_reason().is_none(), "{kind}");
        fs.check_invariants().unwrap();
        fs.unmount().unwrap();
        fsck_clean(dev.clone(), kind);
        // Delete everything: all space comes back.
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        let d = fs.lookup(root, b"fill").unwrap().ino;
        let mut names = Vec::new();
        let mut cookie = 0;
        loop {
            let b = fs.readdir(d, cookie, 64).unwrap();
            let Some(last) = b.last() else { break };
            cookie = last.cookie;
            names.extend(b.into_iter().filter(|e| e.name != b"." && e.name != b".."));
        }
        for e in names {
            if e.kind == FileType::Dir {
                let sub = fs.lookup(d, &e.name).unwrap().ino;
                for x in fs.readdir(sub, 0, 1000).unwrap() {
                    if x.name != b"." && x.name != b".." {
                        fs.unlink(sub, &x.name).unwrap();
                    }
                }
                fs.rmdir(d, &e.name).unwrap();
            } else {
                fs.unlink(d, &e.name).unwrap();
            }
        }
        fs.rmdir(root, b"fill").unwrap();
        fs.sync().unwrap();
        assert_eq!(
            fs.statfs().unwrap().blocks_free,
            free0,
            "{kind}: space not returned"
        );
        fs.unmount().unwrap();
        fsck_clean(dev, kind);
    }
}

/// An image with known files: (path, contents).
fn written_image() -> (Vec<u8>, Vec<(String, Vec<u8>)>) {
    let dev = Arc::new(MemDevice::from_image(fresh_image(16 << 20)));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let root = fs.root_ino();
    let mut files = Vec::new();
    for dname in ["a", "b"] {
        let d = fs.mkdir(root, dname.as_bytes(), 0o755, 0, 0).unwrap();
        for i in 0..40u64 {
            let name = format!("file-{i}");
            let f = fs.create(d.ino, name.as_bytes(), 0o644, 0, 0).unwrap();
            let data = content(i + dname.len() as u64 * 100, (i as usize % 7) * 9000 + 100);
            fs.write(f.ino, 0, &data).unwrap();
            fs.setxattr(f.ino, b"user.k", b"v", 0).unwrap();
            files.push((format!("{dname}/{name}"), data));
        }
    }
    fs.unmount().unwrap();
    (dev.image(), files)
}

/// Mount, read every file both ways, fsck: no panic, no wrong data.
/// Returns whether anything noticed the damage.
fn survey(img: Vec<u8>, files: &[(String, Vec<u8>)], ctx: &str) -> bool {
    let dev = Arc::new(MemDevice::from_image(img));
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut noticed = false;
        match Fs::mount(dev.clone(), MountOptions::default()) {
            Err(_) => noticed = true,
            Ok(fs) => {
                for (path, want) in files {
                    let Ok(ino) = fs.resolve(path) else {
                        noticed = true;
                        continue;
                    };
                    let mut buf = vec![0u8; want.len() + 100];
                    match fs.read(ino, 0, &mut buf) {
                        Ok(n) => assert!(
                            n == want.len() && buf[..n] == want[..],
                            "{ctx}: {path} read back wrong data"
                        ),
                        Err(_) => noticed = true,
                    }
                    let mut dbuf = AlignedBuf::zeroed(want.len().div_ceil(4096) * 4096);
                    match fs.read_direct(ino, 0, &mut dbuf) {
                        Ok(n) => assert!(
                            n == want.len() && dbuf[..n] == want[..],
                            "{ctx}: {path} direct read returned wrong data"
                        ),
                        Err(_) => noticed = true,
                    }
                }
                drop(fs);
            }
        }
        let opts = foliofs::fsck::FsckOptions {
            repair: false,
            check_data: true,
        };
        match foliofs::fsck::fsck(dev.clone(), &opts, |_, _| {}) {
            Ok(r) if r.is_clean() => {}
            _ => noticed = true,
        }
        noticed
    }));
    r.unwrap_or_else(|_| panic!("{ctx}: panicked"))
}

#[test]
fn bit_flips_anywhere_never_panic_or_return_wrong_data() {
    let (img, files) = written_image();
    let seed = std::env::var("FOLIOFS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3u64);
    let mut rng = SmallRng::seed_from_u64(seed);
    let blocks = img.len() / 4096;
    let mut noticed = 0;
    let trials = 300;
    for t in 0..trials {
        // Half the flips land in the first 600 blocks, where the
        // superblock, AG headers, bitmaps, inodes and this image's
        // metadata live; the rest anywhere.
        let blk = if t % 2 == 0 {
            rng.random_range(0..600.min(blocks))
        } else {
            rng.random_range(0..blocks)
        };
        let byte = rng.random_range(0..4096);
        let bit = rng.random_range(0..8);
        let mut bad = img.clone();
        bad[blk * 4096 + byte] ^= 1 << bit;
        if survey(
            bad,
            &files,
            &format!("seed {seed}: flip block {blk} byte {byte} bit {bit}"),
        ) {
            noticed += 1;
        }
    }
    eprintln!("{noticed} of {trials} random flips noticed; none panicked or returned wrong data");
}

#[test]
fn every_data_block_flip_is_an_error_not_wrong_data() {
    let (img, files) = written_image();
    let dev = Arc::new(MemDevice::from_image(img.clone()));
    let fs = Fs::mount(dev, MountOptions::default()).unwrap();
    let mut targets = Vec::new();
    for (path, _) in &files {
        let ino = fs.resolve(path).unwrap();
        for e in fs.extents(ino).unwrap() {
            for b in 0..e.blocks {
                targets.push((path.clone(), e.device_block + b));
            }
        }
    }
    drop(fs);
    assert!(targets.len() > 100);
    for (path, blk) in targets.iter().step_by(3) {
        let mut bad = img.clone();
        bad[*blk as usize * 4096 + 1234] ^= 0x10;
        assert!(
            survey(bad, &files, &format!("{path}: data block {blk}")),
            "{path}: a flipped data block {blk} went unnoticed"
        );
    }
}

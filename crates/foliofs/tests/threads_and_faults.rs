//! Many threads on one mounted file system; and a failed journal write
//! shutting the file system down.

use foliofs::device::{CrashDevice, MemDevice};
use foliofs::fs::*;
use foliofs::{Error, Fs};
use std::sync::atomic::Ordering;
use std::sync::Arc;

mod common;
use common::{crash_fs, fsck_clean};

#[test]
fn threads_share_one_file_system() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    mkfs(&*dev, &MkfsOptions::default(), |_, _| {}).unwrap();
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
    let root = fs.root_ino();
    let handles: Vec<_> = (0..4u8)
        .map(|t| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                let d = fs
                    .mkdir(root, format!("t{t}").as_bytes(), 0o755, 0, 0)
                    .unwrap();
                for i in 0..50u32 {
                    let f = fs
                        .create(d.ino, format!("f{i}").as_bytes(), 0o644, 0, 0)
                        .unwrap();
                    let data = vec![t.wrapping_mul(50).wrapping_add(i as u8); 10_000 + i as usize];
                    fs.write(f.ino, 0, &data).unwrap();
                    if i % 5 == 0 {
                        fs.fsync(f.ino, false).unwrap();
                    }
                    let mut back = vec![0; data.len()];
                    fs.read(f.ino, 0, &mut back).unwrap();
                    assert_eq!(back, data);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let fs = Arc::try_unwrap(fs).ok().unwrap();
    fs.unmount().unwrap();
    let r = fsck_clean(dev.clone(), "threads");
    assert_eq!(r.inodes_used, 1 + 4 + 200);
}

#[test]
fn failed_journal_flush_shuts_down_and_fsynced_data_survives() {
    let (dev, fs) = crash_fs(16 << 20);
    dev.stop_recording();
    let root = fs.root_ino();
    let f = fs.create(root, b"kept", 0o644, 0, 0).unwrap();
    fs.write(f.ino, 0, b"durable").unwrap();
    fs.fsync(f.ino, false).unwrap();
    let g = fs.create(root, b"lost", 0o644, 0, 0).unwrap();
    fs.write(g.ino, 0, b"never acknowledged").unwrap();
    dev.faults
        .fail_flush_from
        .store(dev.flush_count(), Ordering::SeqCst);
    assert!(fs.fsync(g.ino, false).is_err());
    // Poisoned: every later change fails, with the reason.
    assert!(matches!(
        fs.create(root, b"x", 0o644, 0, 0),
        Err(Error::Shutdown(_))
    ));
    assert!(fs.shutdown_reason().is_some());
    dev.faults.fail_flush_from.store(u64::MAX, Ordering::SeqCst);
    drop(fs);
    let dev2 = Arc::new(MemDevice::from_image(dev.image()));
    let fs = Fs::mount(dev2.clone(), MountOptions::default()).unwrap();
    let ino = fs.lookup(root, b"kept").unwrap().ino;
    let mut b = vec![0; 7];
    fs.read(ino, 0, &mut b).unwrap();
    assert_eq!(&b, b"durable");
    fs.unmount().unwrap();
    fsck_clean(dev2, "after the failed flush");
}

/// Large writes copy into their folios without the metadata lock while
/// writeback writes folios straight from their memory: a writer that
/// rewrites a folio under writeback must wait for it (stable pages), or
/// the checksum recorded would not match what reached the device, and a
/// crash before the block is written again would read it back as EIO.
/// Every flush point of the run must pass fsck with data checksums.
#[test]
fn large_writes_racing_writeback_keep_pages_stable() {
    const REGION: usize = 256 << 10;
    const REGIONS: usize = 2;
    let mem = MemDevice::new(16 << 20);
    mkfs(&mem, &MkfsOptions::default(), |_, _| {}).unwrap();
    let dev = Arc::new(CrashDevice::new(mem.image()));
    let opts = MountOptions {
        // Background writeback runs all the time.
        dirty_limit_bytes: 1 << 20,
        writeback_interval_ms: 1,
        dirty_expire_ms: 0,
        ..MountOptions::default()
    };
    let fs = Arc::new(Fs::mount(dev.clone(), opts).unwrap());
    let root = fs.root_ino();
    let inos: Vec<u64> = (0..2)
        .map(|i| {
            fs.create(root, format!("f{i}").as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino
        })
        .collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syncer = {
        let (fs, inos, stop) = (fs.clone(), inos.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) && n < 100 {
                fs.fsync(inos[n as usize % 2], n % 3 == 0).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(1));
                n += 1;
            }
            n
        })
    };
    let writers: Vec<_> = inos
        .iter()
        .map(|&ino| {
            let fs = fs.clone();
            std::thread::spawn(move || {
                // At least 400 writes, and on until writeback has run a
                // while (a loaded machine may run it rarely).
                let mut v = 0u32;
                while v < 400 || (fs.counters().writebacks < 50 && v < 20_000) {
                    v += 1;
                    let r = v as usize % REGIONS;
                    let mut buf = vec![(v % 251) as u8 + 1; REGION];
                    buf[..4].copy_from_slice(&v.to_le_bytes());
                    fs.write(ino, (r * REGION) as u64, &buf).unwrap();
                }
                v
            })
        })
        .collect();
    let last: Vec<u32> = writers.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::SeqCst);
    assert!(syncer.join().unwrap() > 0);
    let c = fs.counters();
    assert_eq!(c.csum_failures, 0);
    assert!(c.writebacks > 10, "writeback ran {} times", c.writebacks);
    let fs = Arc::try_unwrap(fs).ok().unwrap();
    fs.unmount().unwrap();
    // The device after each flush: every recorded checksum matches.
    let log = dev.log();
    let mut img = log.initial.clone();
    for (e, writes) in log.epochs.iter().enumerate() {
        for (off, data) in writes {
            img[*off as usize..*off as usize + data.len()].copy_from_slice(data);
        }
        fsck_clean(
            Arc::new(MemDevice::from_image(img.clone())),
            &format!("after flush {e} of {}", log.epochs.len()),
        );
    }
    // And the last writes are what the files hold.
    let fs = Fs::mount(
        Arc::new(MemDevice::from_image(img)),
        MountOptions::default(),
    )
    .unwrap();
    for (&ino, &n) in inos.iter().zip(&last) {
        let mut back = vec![0u8; REGION * REGIONS];
        assert_eq!(fs.read(ino, 0, &mut back).unwrap(), back.len());
        for r in 0..REGIONS {
            // The last write to region r.
            let v = n - ((n as usize + REGIONS - r) % REGIONS) as u32;
            let region = &back[r * REGION..(r + 1) * REGION];
            assert_eq!(region[..4], v.to_le_bytes(), "inode {ino} region {r}");
            assert!(region[4..].iter().all(|&b| b == (v % 251) as u8 + 1));
        }
    }
    fs.unmount().unwrap();
}

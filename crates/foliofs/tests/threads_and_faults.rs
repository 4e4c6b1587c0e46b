//! Many threads on one mounted file system; and a failed journal write
//! shutting the file system down.

use foliofs::device::MemDevice;
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

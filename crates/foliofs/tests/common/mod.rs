//! Helpers the integration tests share.
#![allow(dead_code)]

use foliofs::device::{CrashDevice, Device, MemDevice};
use foliofs::fs::{mkfs, MkfsOptions, MountOptions};
use foliofs::fsck::{fsck, FsckOptions, Report};
use foliofs::Fs;
use std::sync::Arc;

/// A number from the environment (seeds, run lengths), or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// fsck of the unmounted `dev`, data checksums included: it must be clean.
pub fn fsck_clean(dev: Arc<dyn Device>, ctx: &str) -> Report {
    let opts = FsckOptions {
        repair: false,
        check_data: true,
    };
    let r = fsck(dev, &opts, |_, _| {}).unwrap_or_else(|e| panic!("{ctx}: fsck: {e}"));
    assert!(r.is_clean(), "{ctx}: fsck: {:?}", r.problems);
    r
}

/// A fresh default file system of `bytes` on a crash-recording device,
/// mounted with default options.
pub fn crash_fs(bytes: u64) -> (Arc<CrashDevice>, Fs) {
    let mem = MemDevice::new(bytes);
    mkfs(&mem, &MkfsOptions::default(), |_, _| {}).unwrap();
    let dev = Arc::new(CrashDevice::new(mem.image()));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    (dev, fs)
}

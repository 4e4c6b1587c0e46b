//! Helpers the integration tests share.
#![allow(dead_code)]

use foliofs::device::Device;
use foliofs::fsck::{fsck, FsckOptions, Report};
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

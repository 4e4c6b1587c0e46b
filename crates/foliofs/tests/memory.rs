//! A writer that dirties 8x the dirty limit keeps the process's resident
//! memory under the cache limit plus a small slack: dirty throttling,
//! background writeback and eviction of clean folios together. This is the
//! only test in its binary, so the RSS measured is its own.

use foliofs::device::{Device, FileDevice};
use foliofs::fs::*;
use foliofs::Fs;
use std::sync::Arc;

#[test]
fn writer_dirtying_8x_the_limit_stays_within_memory_limits() {
    let dir = std::env::temp_dir().join(format!("foliofs-mem-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    let dev: Arc<dyn Device> = Arc::new(FileDevice::open(&path, true).unwrap());
    mkfs(&*dev, &MkfsOptions::default(), |_, _| {}).unwrap();
    let (limit, cache) = (8u64 << 20, 24u64 << 20);
    let opts = MountOptions {
        dirty_limit_bytes: limit,
        cache_bytes: cache,
        ..Default::default()
    };
    let fs = Fs::mount(dev.clone(), opts).unwrap();
    let a = fs.create(fs.root_ino(), b"big", 0o644, 0, 0).unwrap();
    let rss0 = rss_bytes();
    let chunk = vec![5u8; 1 << 20];
    let (mut max_dirty, mut max_cached, mut max_rss) = (0, 0, 0);
    for i in 0..((8 * limit) >> 20) {
        fs.write(a.ino, i << 20, &chunk).unwrap();
        let st = fs.cache_stats();
        max_dirty = max_dirty.max(st.dirty_bytes);
        max_cached = max_cached.max(st.cached_bytes);
        max_rss = max_rss.max(rss_bytes());
    }
    // Most of it went out in the background, before any fsync: all but
    // what may still be dirty (the limit and one write) and one writeback
    // job (4 MiB) under way.
    let c = fs.counters();
    assert!(
        c.bytes_written_back + limit + (5 << 20) >= 8 * limit,
        "{c:?}"
    );
    // Dirty data stays under the limit plus one write in flight; the cache
    // under its limit plus the folios pinned by writeback.
    assert!(
        max_dirty <= limit + (1 << 20),
        "dirty peaked at {max_dirty}"
    );
    assert!(
        max_cached <= cache + (4 << 20),
        "cache peaked at {max_cached}"
    );
    let grew = max_rss.saturating_sub(rss0);
    eprintln!(
        "dirty peak {max_dirty}, cache peak {max_cached}, RSS grew by {grew} (limits: dirty {limit}, cache {cache})"
    );
    assert!(grew <= cache + (16 << 20), "RSS grew by {grew} bytes");
    fs.unmount().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

fn rss_bytes() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

//! Crash consistency: a random workload runs on the crash-recording
//! device; then, for every flush epoch, images are built with a random
//! subset of that epoch's writes applied (some torn at sector granularity).
//! Each image must mount (replaying the journal), pass fsck, keep every
//! byte that a completed fsync/sync covered, and contain no byte the file
//! was never given.
//!
//! FOLIOFS_CRASH_STATES (default 1,200) and FOLIOFS_SEED control the run.

use foliofs::device::{AlignedBuf, CrashDevice, MemDevice};
use foliofs::fs::*;
use foliofs::Fs;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::Arc;

fn pattern(id: u64, off: u64, ver: u64) -> u8 {
    1 + ((id * 131 + ver * 37 + off * 7 + (off >> 9) * 3) % 255) as u8
}

/// A promise: after `flush` flushes, file `name` (identity `id`) holds
/// `data`, unless a later mutation of it started at or before the cut.
struct Promise {
    flush: u64,
    name: String,
    id: u64,
    data: Vec<u8>,
    next_mutation: u64,
}

struct History {
    promises: Vec<Promise>,
    /// For each name, every identity it ever had and their highest version.
    names: HashMap<String, Vec<(u64, u64)>>,
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The model side of a write: the file's bytes and its latest version.
fn record_write(data: &mut Vec<u8>, off: u64, buf: &[u8], ver: u64, ids: &mut [(u64, u64)]) {
    let end = off as usize + buf.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[off as usize..end].copy_from_slice(buf);
    ids.last_mut().unwrap().1 = ver;
}

fn workload(seed: u64, ops: usize) -> (Arc<CrashDevice>, History) {
    let mem = MemDevice::new(16 << 20);
    let o = MkfsOptions {
        block_size: 4096,
        ag_count: Some(2),
        journal_blocks: Some(64),
        ..Default::default()
    };
    mkfs(&mem, &o, |_, _| {}).unwrap();
    let dev = Arc::new(CrashDevice::new(mem.image()));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let root = fs.root_ino();
    let mut rng = SmallRng::seed_from_u64(seed);
    // name -> (id, version, model data)
    let mut live: HashMap<String, (u64, u64, Vec<u8>)> = HashMap::new();
    let mut hist = History {
        promises: Vec::new(),
        names: HashMap::new(),
    };
    let mut next_id = 1;
    let mut promise_of: HashMap<String, Vec<usize>> = HashMap::new();
    for _ in 0..ops {
        let name = format!("f{}", rng.random_range(0..8));
        let start = dev.flush_count();
        let mut mutated = true;
        match rng.random_range(0..100) {
            0..=14 if !live.contains_key(&name) => {
                fs.create(root, name.as_bytes(), 0o644, 0, 0).unwrap();
                live.insert(name.clone(), (next_id, 0, Vec::new()));
                hist.names
                    .entry(name.clone())
                    .or_default()
                    .push((next_id, 0));
                next_id += 1;
            }
            15..=54 if live.contains_key(&name) => {
                let (id, ver, data) = live.get_mut(&name).unwrap();
                *ver += 1;
                let off = if rng.random_bool(0.3) {
                    data.len() as u64
                } else {
                    rng.random_range(0..48_000)
                };
                let len = rng.random_range(1..20_000u64);
                let buf: Vec<u8> = (off..off + len).map(|o| pattern(*id, o, *ver)).collect();
                let ino = fs.lookup(root, name.as_bytes()).unwrap().ino;
                fs.write(ino, off, &buf).unwrap();
                record_write(data, off, &buf, *ver, hist.names.get_mut(&name).unwrap());
            }
            55..=69 if live.contains_key(&name) => {
                let ino = fs.lookup(root, name.as_bytes()).unwrap().ino;
                fs.fsync(ino, rng.random_bool(0.5)).unwrap();
                let (id, _, data) = &live[&name];
                promise_of
                    .entry(name.clone())
                    .or_default()
                    .push(hist.promises.len());
                hist.promises.push(Promise {
                    flush: dev.flush_count(),
                    name: name.clone(),
                    id: *id,
                    data: data.clone(),
                    next_mutation: u64::MAX,
                });
                mutated = false;
            }
            70..=74 => {
                fs.sync().unwrap();
                for (n, (id, _, data)) in &live {
                    promise_of
                        .entry(n.clone())
                        .or_default()
                        .push(hist.promises.len());
                    hist.promises.push(Promise {
                        flush: dev.flush_count(),
                        name: n.clone(),
                        id: *id,
                        data: data.clone(),
                        next_mutation: u64::MAX,
                    });
                }
                mutated = false;
            }
            75..=82 if live.contains_key(&name) => {
                let ino = fs.lookup(root, name.as_bytes()).unwrap().ino;
                let size = rng.random_range(0..60_000u64);
                fs.setattr(
                    ino,
                    &SetAttr {
                        size: Some(size),
                        ..Default::default()
                    },
                )
                .unwrap();
                live.get_mut(&name).unwrap().2.resize(size as usize, 0);
            }
            83..=88 if live.contains_key(&name) => {
                let ino = fs.lookup(root, name.as_bytes()).unwrap().ino;
                let off = rng.random_range(0..50_000u64);
                let len = rng.random_range(1..30_000u64);
                fs.fallocate(ino, Falloc::PunchHole, off, len).unwrap();
                let data = &mut live.get_mut(&name).unwrap().2;
                let e = ((off + len) as usize).min(data.len());
                if (off as usize) < e {
                    data[off as usize..e].fill(0);
                }
            }
            94..=99 if live.contains_key(&name) => {
                // Direct write: an overwrite under the shared lock when the
                // blocks are written, else an allocating/extending one.
                let (id, ver, data) = live.get_mut(&name).unwrap();
                *ver += 1;
                let off = rng.random_range(0..14u64) * 4096;
                let len = rng.random_range(1..5u64) * 4096;
                let mut buf = AlignedBuf::zeroed(len as usize);
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = pattern(*id, off + i as u64, *ver);
                }
                let ino = fs.lookup(root, name.as_bytes()).unwrap().ino;
                fs.write_direct(ino, off, &buf).unwrap();
                record_write(data, off, &buf, *ver, hist.names.get_mut(&name).unwrap());
            }
            89..=91 if live.contains_key(&name) => {
                fs.unlink(root, name.as_bytes()).unwrap();
                live.remove(&name);
            }
            92..=93 if live.contains_key(&name) => {
                // The last close trims speculative preallocation past EOF.
                let ino = fs.lookup(root, name.as_bytes()).unwrap().ino;
                fs.open(ino).unwrap();
                fs.release(ino).unwrap();
                mutated = false;
            }
            _ => mutated = false,
        }
        if mutated {
            for p in promise_of.remove(&name).unwrap_or_default() {
                hist.promises[p].next_mutation = start;
            }
        }
    }
    // Dropping without unmount is the power cut (Fs writes nothing on
    // drop); the last epoch stays unflushed, and cuts land in it too.
    drop(fs);
    (dev, hist)
}

fn check_image(image: Vec<u8>, cut: u64, hist: &History, ctx: &str) {
    let dev = Arc::new(MemDevice::from_image(image));
    let fs = Fs::mount(dev.clone(), MountOptions::default())
        .unwrap_or_else(|e| panic!("{ctx}: mount: {e}"));
    let root = fs.root_ino();
    // No byte the file was never given.
    for (name, ids) in &hist.names {
        let Ok(a) = fs.lookup(root, name.as_bytes()) else {
            continue;
        };
        let mut buf = vec![0; a.size as usize];
        let n = fs
            .read(a.ino, 0, &mut buf)
            .unwrap_or_else(|e| panic!("{ctx}: read {name}: {e}"));
        assert_eq!(n, buf.len());
        // The direct path reads the same bytes, checksums verified.
        let mut dbuf = AlignedBuf::zeroed((a.size as usize).div_ceil(4096) * 4096);
        let dn = fs
            .read_direct(a.ino, 0, &mut dbuf)
            .unwrap_or_else(|e| panic!("{ctx}: direct read {name}: {e}"));
        assert!(
            dn == n && dbuf[..n] == buf[..],
            "{ctx}: direct read of {name} differs"
        );
        for (off, &b) in buf.iter().enumerate() {
            if b == 0 {
                continue;
            }
            let ok = ids
                .iter()
                .any(|(id, maxv)| (1..=*maxv).any(|v| pattern(*id, off as u64, v) == b));
            assert!(ok, "{ctx}: {name} byte {off} = {b} was never written there");
        }
    }
    // Every promise that is due and not overtaken is kept exactly.
    let mut due: HashMap<&str, &Promise> = HashMap::new();
    for p in &hist.promises {
        if p.flush <= cut && p.next_mutation > cut {
            due.insert(&p.name, p);
        }
    }
    for (name, p) in due {
        let a = fs
            .lookup(root, name.as_bytes())
            .unwrap_or_else(|e| panic!("{ctx}: fsynced {name} (id {}) missing: {e}", p.id));
        assert_eq!(a.size, p.data.len() as u64, "{ctx}: size of fsynced {name}");
        let mut buf = vec![0; p.data.len()];
        fs.read(a.ino, 0, &mut buf).unwrap();
        assert!(buf == p.data, "{ctx}: contents of fsynced {name}");
    }
    fs.unmount()
        .unwrap_or_else(|e| panic!("{ctx}: unmount: {e}"));
    let r = foliofs::fsck::fsck(dev, &Default::default(), |_, _| {}).unwrap();
    assert!(r.is_clean(), "{ctx}: fsck: {:?}", r.problems);
}

#[test]
fn crash_at_every_flush_with_torn_writes() {
    let seed = env_u64("FOLIOFS_SEED", 7);
    let want = env_u64("FOLIOFS_CRASH_STATES", 1200);
    let mut states = 0u64;
    let mut round = 0;
    while states < want {
        let s = seed.wrapping_add(round * 1000);
        let (dev, hist) = workload(s, 400);
        let log = dev.log();
        let epochs = log.epochs.len() as u64;
        let per_epoch = (want / epochs).clamp(1, 8) as usize;
        let mut rng = SmallRng::seed_from_u64(s ^ 0xC0FFEE);
        log.for_each_cut(per_epoch, &mut rng, |e, img| {
            states += 1;
            check_image(
                img,
                e as u64,
                &hist,
                &format!("seed {s} cut after {e} flushes (state {states})"),
            );
        });
        round += 1;
    }
    assert!(states >= want);
    eprintln!("checked {states} crash states");
}

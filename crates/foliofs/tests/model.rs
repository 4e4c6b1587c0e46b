//! Random operations against an in-memory model; every read is compared.
//!
//! FOLIOFS_MODEL_OPS (default 100,000) and FOLIOFS_SEED control the run;
//! a failure prints the seed and the operation index to replay it.

use foliofs::device::MemDevice;
use foliofs::fs::*;
use foliofs::{Error, Fs};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;

mod common;
use common::{env_u64, fsck_clean};

const DIRS: [&str; 3] = ["", "a", "b"];
const MAX_OFF: u64 = 256 << 10;

struct Model {
    files: BTreeMap<(usize, String), Vec<u8>>,
}

fn run(seed: u64, ops: u64, block_size: u32) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let dev = Arc::new(MemDevice::new(96 << 20));
    let o = MkfsOptions {
        block_size,
        ..Default::default()
    };
    mkfs(&*dev, &o, |_, _| {}).unwrap();
    let mount = || {
        Fs::mount(
            dev.clone(),
            MountOptions {
                dirty_limit_bytes: 4 << 20,
                // A small cache, so clean folios are evicted; odd seeds
                // turn the folio knobs on.
                cache_bytes: 2 << 20,
                whole_folio_dirty: seed % 2 == 1,
                fixed_folio_bytes: (seed % 4 == 1).then_some(64 << 10),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let mut fs = mount();
    let root = fs.root_ino();
    fs.mkdir(root, b"a", 0o755, 0, 0).unwrap();
    fs.mkdir(root, b"b", 0o755, 0, 0).unwrap();
    let dir_ino = |fs: &Fs, d: usize| fs.resolve(DIRS[d]).unwrap();
    let mut m = Model {
        files: BTreeMap::new(),
    };
    for i in 0..ops {
        let ctx = format!("seed {seed} op {i} (block size {block_size})");
        // The delayed-allocation books balance (checked every 16 ops).
        if i % 16 == 0 {
            fs.check_invariants()
                .unwrap_or_else(|e| panic!("{ctx}: {e}"));
        }
        let d = rng.random_range(0..DIRS.len());
        let name = format!("f{}", rng.random_range(0..12));
        let key = (d, name.clone());
        let dino = dir_ino(&fs, d);
        let exists = m.files.contains_key(&key);
        match rng.random_range(0..100) {
            0..=7 => {
                let r = fs.create(dino, name.as_bytes(), 0o644, 0, 0);
                if exists {
                    assert!(matches!(r, Err(Error::Exists)), "{ctx}");
                } else {
                    r.unwrap();
                    m.files.insert(key, Vec::new());
                }
            }
            8..=37 if exists => {
                let ino = fs.lookup(dino, name.as_bytes()).unwrap().ino;
                let off = if rng.random_bool(0.3) {
                    m.files[&key].len() as u64
                } else {
                    rng.random_range(0..MAX_OFF)
                };
                let len = match rng.random_range(0..4) {
                    0 => rng.random_range(1..16),
                    1 => rng.random_range(1..600),
                    2 => rng.random_range(1..9000),
                    _ => rng.random_range(1..70_000),
                };
                let byte: u8 = rng.random_range(1..=255);
                let buf: Vec<u8> = (0..len).map(|j| byte.wrapping_add((j % 7) as u8)).collect();
                assert_eq!(fs.write(ino, off, &buf).unwrap(), buf.len(), "{ctx}");
                let f = m.files.get_mut(&key).unwrap();
                let end = off as usize + buf.len();
                if f.len() < end {
                    f.resize(end, 0);
                }
                f[off as usize..end].copy_from_slice(&buf);
            }
            38..=57 if exists => {
                let ino = fs.lookup(dino, name.as_bytes()).unwrap().ino;
                let f = &m.files[&key];
                let off = rng.random_range(0..=f.len() as u64 + 100);
                let len = rng.random_range(0..100_000usize);
                let mut buf = vec![0xEEu8; len];
                let n = fs.read(ino, off, &mut buf).unwrap();
                let want = if off as usize >= f.len() {
                    &[][..]
                } else {
                    &f[off as usize..(off as usize + len).min(f.len())]
                };
                assert_eq!(n, want.len(), "{ctx}: read length at {off}");
                assert!(buf[..n] == *want, "{ctx}: read mismatch at {off}+{len}");
                assert_eq!(fs.getattr(ino).unwrap().size, f.len() as u64, "{ctx}: size");
            }
            58..=64 if exists => {
                let ino = fs.lookup(dino, name.as_bytes()).unwrap().ino;
                let size = rng.random_range(0..MAX_OFF);
                fs.setattr(
                    ino,
                    &SetAttr {
                        size: Some(size),
                        ..Default::default()
                    },
                )
                .unwrap();
                m.files.get_mut(&key).unwrap().resize(size as usize, 0);
            }
            65..=71 if exists => {
                let ino = fs.lookup(dino, name.as_bytes()).unwrap().ino;
                let off = rng.random_range(0..MAX_OFF);
                let len = rng.random_range(1..80_000);
                let f = m.files.get_mut(&key).unwrap();
                let mode = match rng.random_range(0..4) {
                    0 => Falloc::PunchHole,
                    1 => Falloc::ZeroRange {
                        keep_size: rng.random_bool(0.5),
                    },
                    _ => Falloc::Allocate {
                        keep_size: rng.random_bool(0.5),
                    },
                };
                fs.fallocate(ino, mode, off, len).unwrap();
                let end = (off + len) as usize;
                match mode {
                    Falloc::PunchHole => {
                        let e = end.min(f.len());
                        if (off as usize) < e {
                            f[off as usize..e].fill(0);
                        }
                    }
                    Falloc::ZeroRange { keep_size } | Falloc::Allocate { keep_size } => {
                        if matches!(mode, Falloc::ZeroRange { .. }) {
                            let e = end.min(f.len());
                            if (off as usize) < e {
                                f[off as usize..e].fill(0);
                            }
                        }
                        if !keep_size && f.len() < end {
                            f.resize(end, 0);
                        }
                    }
                }
            }
            72..=76 if exists => {
                let nd = rng.random_range(0..DIRS.len());
                let nn = format!("f{}", rng.random_range(0..12));
                let nkey = (nd, nn.clone());
                let ndino = dir_ino(&fs, nd);
                let noreplace = rng.random_bool(0.3);
                let r = fs.rename(
                    dino,
                    name.as_bytes(),
                    ndino,
                    nn.as_bytes(),
                    if noreplace { RENAME_NOREPLACE } else { 0 },
                );
                if nkey == key && !noreplace {
                    r.unwrap();
                } else if noreplace && m.files.contains_key(&nkey) {
                    assert!(matches!(r, Err(Error::Exists)), "{ctx}");
                } else {
                    r.unwrap();
                    let data = m.files.remove(&key).unwrap();
                    m.files.insert(nkey, data);
                }
            }
            77..=80 if exists => {
                fs.unlink(dino, name.as_bytes()).unwrap();
                m.files.remove(&key);
            }
            81..=85 if exists => {
                let ino = fs.lookup(dino, name.as_bytes()).unwrap().ino;
                fs.fsync(ino, rng.random_bool(0.5)).unwrap();
            }
            86..=87 => fs.sync().unwrap(),
            88..=90 => {
                let mut names: Vec<String> = Vec::new();
                let mut cookie = 0;
                loop {
                    let b = fs.readdir(dino, cookie, 5).unwrap();
                    if b.is_empty() {
                        break;
                    }
                    cookie = b.last().unwrap().cookie;
                    names.extend(
                        b.into_iter()
                            .map(|e| String::from_utf8(e.name).unwrap())
                            .filter(|n| n.starts_with('f')),
                    );
                }
                names.sort();
                let want: Vec<String> = m
                    .files
                    .keys()
                    .filter(|(dd, _)| *dd == d)
                    .map(|(_, n)| n.clone())
                    .collect();
                assert_eq!(names, want, "{ctx}: readdir");
            }
            91 if i % 7 == 0 => {
                fs.unmount().unwrap();
                fs = mount();
            }
            92..=95 if exists => {
                let ino = fs.lookup(dino, name.as_bytes()).unwrap().ino;
                let f = &m.files[&key];
                let off = rng.random_range(0..=f.len() as u64);
                let h = fs.seek(ino, off, Whence::Hole).unwrap();
                if (off as usize) < f.len() {
                    let h = h.unwrap() as usize;
                    assert!(h >= off as usize && h <= f.len(), "{ctx}: SEEK_HOLE {h}");
                    if h < f.len() {
                        // A reported hole must read as zeros at its start.
                        assert_eq!(f[h], 0, "{ctx}: SEEK_HOLE at {h} points at data");
                    }
                    if let Some(dpos) = fs.seek(ino, off, Whence::Data).unwrap() {
                        assert!(
                            dpos as usize >= off as usize && (dpos as usize) < f.len(),
                            "{ctx}"
                        );
                        // Everything skipped over must be zeros.
                        assert!(
                            f[off as usize..dpos as usize].iter().all(|&b| b == 0),
                            "{ctx}: SEEK_DATA skipped data"
                        );
                    } else {
                        assert!(
                            f[off as usize..].iter().all(|&b| b == 0),
                            "{ctx}: ENXIO over data"
                        );
                    }
                }
            }
            _ => {}
        }
    }
    fs.unmount().unwrap();
    fsck_clean(dev.clone(), &format!("seed {seed}: after the run"));
    // And the data survives a final remount.
    let fs = mount();
    for ((d, name), data) in &m.files {
        let ino = fs.lookup(dir_ino(&fs, *d), name.as_bytes()).unwrap().ino;
        let mut buf = vec![0; data.len()];
        assert_eq!(fs.read(ino, 0, &mut buf).unwrap(), data.len());
        assert!(buf == *data, "seed {seed}: final contents of {name}");
    }
    let c = fs.cache_stats();
    assert!(c.cached_bytes <= 2 << 20, "cache over its limit: {c:?}");
    fs.unmount().unwrap();
}

#[test]
fn model_4k_blocks() {
    let seed = env_u64("FOLIOFS_SEED", 1);
    run(seed, env_u64("FOLIOFS_MODEL_OPS", 100_000), 4096);
}

#[test]
fn model_512_byte_blocks() {
    let seed = env_u64("FOLIOFS_SEED", 2);
    run(seed, env_u64("FOLIOFS_MODEL_OPS", 100_000) / 4, 512);
}

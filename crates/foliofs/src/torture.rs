//! The crash-consistency harness, shared by the test suite and
//! `foliofs torture crash`.
//!
//! A seeded random workload runs on the crash-recording device: creates,
//! buffered writes (delayed allocation, speculative preallocation),
//! direct writes (overwrites under the shared lock and allocating ones),
//! fsync, fdatasync, sync, truncate, punch, zero range, fallocate, rename,
//! unlink of closed and of open files (orphans written and fsynced after
//! the unlink), and last closes that trim preallocation. Then, for every
//! flush epoch, images are built with a random subset of that epoch's
//! writes applied, some torn at sector granularity (the power cut). Each
//! image must mount (replaying the journal), read back through the
//! buffered and the direct path with no checksum error, keep every byte a
//! completed fsync or sync covered, contain no byte its file was never
//! given, and pass fsck (no leaked or doubly used block).

pub mod fuzz;

use crate::device::{AlignedBuf, CrashDevice, MemDevice};
use crate::fs::Fs;
use crate::fs::{mkfs, Falloc, MkfsOptions, MountOptions, SetAttr};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::Arc;

/// The byte file identity `id` holds at `off` after its write `ver`.
fn pattern(id: u64, off: u64, ver: u64) -> u8 {
    1 + ((id * 131 + ver * 37 + off * 7 + (off >> 9) * 3) % 255) as u8
}

/// A promise: once `flush` device flushes have happened, name `name`
/// holds identity `id` with contents `data`, unless a mutation of that
/// name started at or before the cut (`next_mutation`).
struct Promise {
    flush: u64,
    name: String,
    id: u64,
    data: Vec<u8>,
    next_mutation: u64,
}

struct History {
    promises: Vec<Promise>,
    /// Every identity each name ever had.
    names: HashMap<String, Vec<u64>>,
    /// The highest write version of each identity.
    max_ver: HashMap<u64, u64>,
}

impl History {
    /// Promise that once `flush` flushes are durable, `name` holds what
    /// `l` holds now (indexed by name in `promise_of`).
    fn promise(
        &mut self,
        promise_of: &mut HashMap<String, Vec<usize>>,
        flush: u64,
        name: &str,
        l: &Live,
    ) {
        promise_of
            .entry(name.to_string())
            .or_default()
            .push(self.promises.len());
        self.promises.push(Promise {
            flush,
            name: name.to_string(),
            id: l.id,
            data: l.data.clone(),
            next_mutation: u64::MAX,
        });
    }
}

/// A failed crash state, with what replays it.
#[derive(Debug)]
pub struct CrashFailure {
    pub seed: u64,
    pub per_epoch: usize,
    pub message: String,
}

impl std::fmt::Display for CrashFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (replay: foliofs torture crash --seed {} --rounds 1 --per-epoch {}, or \
             FOLIOFS_SEED={} cargo test --release --test crash)",
            self.message, self.seed, self.per_epoch, self.seed
        )
    }
}

/// What one round of the harness did.
#[derive(Debug, Default, Clone, Copy)]
pub struct CrashRound {
    pub ops: usize,
    pub epochs: usize,
    pub states: u64,
}

struct Live {
    id: u64,
    ver: u64,
    data: Vec<u8>,
}

fn write_model(data: &mut Vec<u8>, off: u64, buf: &[u8]) {
    let end = off as usize + buf.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[off as usize..end].copy_from_slice(buf);
}

/// Run `ops` operations from `seed` on a fresh crash-recording device and
/// power-cut it (drop without unmount: the last epoch stays unflushed).
fn workload(seed: u64, ops: usize) -> (Arc<CrashDevice>, History) {
    let mem = MemDevice::new(16 << 20);
    let o = MkfsOptions {
        block_size: 4096,
        ag_count: Some(2),
        journal_blocks: Some(64),
        ..Default::default()
    };
    mkfs(&mem, &o, |_, _| {}).expect("mkfs of the in-memory device");
    let dev = Arc::new(CrashDevice::new(mem.image()));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).expect("mount of a fresh image");
    let root = fs.root_ino();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut live: HashMap<String, Live> = HashMap::new();
    let mut hist = History {
        promises: Vec::new(),
        names: HashMap::new(),
        max_ver: HashMap::new(),
    };
    let mut next_id = 1;
    let mut promise_of: HashMap<String, Vec<usize>> = HashMap::new();
    // Unlinked files still open: inode numbers.
    let mut orphans: Vec<u64> = Vec::new();
    let ino_of = |fs: &Fs, name: &str| fs.lookup(root, name.as_bytes()).expect("live name").ino;
    for _ in 0..ops {
        let name = format!("f{}", rng.random_range(0..8));
        let start = dev.flush_count();
        let exists = live.contains_key(&name);
        // Names whose earlier promises this operation overtakes.
        let mut mutated: Vec<String> = vec![name.clone()];
        match rng.random_range(0..120) {
            0..=14 if !exists => {
                fs.create(root, name.as_bytes(), 0o644, 0, 0)
                    .expect("create");
                live.insert(
                    name.clone(),
                    Live {
                        id: next_id,
                        ver: 0,
                        data: Vec::new(),
                    },
                );
                hist.names.entry(name.clone()).or_default().push(next_id);
                next_id += 1;
            }
            15..=54 if exists => {
                let l = live.get_mut(&name).expect("exists");
                l.ver += 1;
                let off = if rng.random_bool(0.3) {
                    l.data.len() as u64
                } else {
                    rng.random_range(0..48_000)
                };
                let len = rng.random_range(1..20_000u64);
                let buf: Vec<u8> = (off..off + len).map(|o| pattern(l.id, o, l.ver)).collect();
                fs.write(ino_of(&fs, &name), off, &buf).expect("write");
                write_model(&mut l.data, off, &buf);
                hist.max_ver.insert(l.id, l.ver);
            }
            55..=69 if exists => {
                fs.fsync(ino_of(&fs, &name), rng.random_bool(0.5))
                    .expect("fsync");
                hist.promise(&mut promise_of, dev.flush_count(), &name, &live[&name]);
                mutated.clear();
            }
            70..=74 => {
                fs.sync().expect("sync");
                for (n, l) in &live {
                    hist.promise(&mut promise_of, dev.flush_count(), n, l);
                }
                mutated.clear();
            }
            75..=82 if exists => {
                let size = rng.random_range(0..60_000u64);
                let set = SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                fs.setattr(ino_of(&fs, &name), &set).expect("truncate");
                live.get_mut(&name)
                    .expect("exists")
                    .data
                    .resize(size as usize, 0);
            }
            83..=88 if exists => {
                let off = rng.random_range(0..50_000u64);
                let len = rng.random_range(1..30_000u64);
                fs.fallocate(ino_of(&fs, &name), Falloc::PunchHole, off, len)
                    .expect("punch");
                let data = &mut live.get_mut(&name).expect("exists").data;
                let e = ((off + len) as usize).min(data.len());
                if (off as usize) < e {
                    data[off as usize..e].fill(0);
                }
            }
            89..=91 if exists => {
                fs.unlink(root, name.as_bytes()).expect("unlink");
                live.remove(&name);
            }
            92..=93 if exists => {
                // The last close trims speculative preallocation past EOF.
                let ino = ino_of(&fs, &name);
                fs.open(ino).expect("open");
                fs.release(ino).expect("release");
                mutated.clear();
            }
            94..=99 if exists => {
                // Direct write: an overwrite under the shared lock when the
                // blocks are written, else an allocating or extending one.
                let l = live.get_mut(&name).expect("exists");
                l.ver += 1;
                let off = rng.random_range(0..14u64) * 4096;
                let len = rng.random_range(1..5u64) * 4096;
                let mut buf = AlignedBuf::zeroed(len as usize);
                for (i, b) in buf.iter_mut().enumerate() {
                    *b = pattern(l.id, off + i as u64, l.ver);
                }
                fs.write_direct(ino_of(&fs, &name), off, &buf)
                    .expect("direct write");
                write_model(&mut l.data, off, &buf);
                hist.max_ver.insert(l.id, l.ver);
            }
            100..=104 if exists => {
                let to = format!("f{}", rng.random_range(0..8));
                if to != name {
                    fs.rename(root, name.as_bytes(), root, to.as_bytes(), 0)
                        .expect("rename");
                    let l = live.remove(&name).expect("exists");
                    hist.names.entry(to.clone()).or_default().push(l.id);
                    live.insert(to.clone(), l);
                    mutated.push(to);
                }
            }
            105..=109 if exists => {
                let off = rng.random_range(0..50_000u64);
                let len = rng.random_range(1..30_000u64);
                let keep_size = rng.random_bool(0.5);
                let zero = rng.random_bool(0.5);
                let mode = if zero {
                    Falloc::ZeroRange { keep_size }
                } else {
                    Falloc::Allocate { keep_size }
                };
                fs.fallocate(ino_of(&fs, &name), mode, off, len)
                    .expect("fallocate");
                let data = &mut live.get_mut(&name).expect("exists").data;
                let end = (off + len) as usize;
                if zero {
                    let e = end.min(data.len());
                    if (off as usize) < e {
                        data[off as usize..e].fill(0);
                    }
                }
                if !keep_size && data.len() < end {
                    data.resize(end, 0);
                }
            }
            110..=112 if exists && orphans.len() < 4 => {
                // Unlink while open: the inode lives on as an orphan.
                let ino = ino_of(&fs, &name);
                fs.open(ino).expect("open");
                fs.unlink(root, name.as_bytes())
                    .expect("unlink of an open file");
                live.remove(&name);
                orphans.push(ino);
            }
            113..=116 if !orphans.is_empty() => {
                let ino = orphans[rng.random_range(0..orphans.len())];
                let off = rng.random_range(0..40_000u64);
                let buf = vec![0xEEu8; rng.random_range(1..9000)];
                fs.write(ino, off, &buf).expect("write to an orphan");
                fs.fsync(ino, true).expect("fsync of an orphan");
                mutated.clear();
            }
            117..=119 if !orphans.is_empty() => {
                let ino = orphans.swap_remove(rng.random_range(0..orphans.len()));
                fs.release(ino).expect("last close of an orphan");
                mutated.clear();
            }
            _ => mutated.clear(),
        }
        for n in mutated {
            for p in promise_of.remove(&n).unwrap_or_default() {
                hist.promises[p].next_mutation = start;
            }
        }
    }
    // Dropping without unmount is the power cut (Fs writes nothing on
    // drop); the last epoch stays unflushed, and cuts land in it too.
    drop(fs);
    (dev, hist)
}

macro_rules! check {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// Check one crash image, cut after `cut` flushes.
fn check_image(image: Vec<u8>, cut: u64, hist: &History) -> Result<(), String> {
    let dev = Arc::new(MemDevice::from_image(image));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).map_err(|e| format!("mount: {e}"))?;
    let root = fs.root_ino();
    // No byte the file was never given, read the same through both paths.
    for (name, ids) in &hist.names {
        let Ok(a) = fs.lookup(root, name.as_bytes()) else {
            continue;
        };
        let mut buf = vec![0; a.size as usize];
        let n = fs
            .read(a.ino, 0, &mut buf)
            .map_err(|e| format!("read {name}: {e}"))?;
        check!(n == buf.len(), "read {name}: {n} of {} bytes", buf.len());
        let mut dbuf = AlignedBuf::zeroed((a.size as usize).div_ceil(4096) * 4096);
        let dn = fs
            .read_direct(a.ino, 0, &mut dbuf)
            .map_err(|e| format!("direct read {name}: {e}"))?;
        check!(
            dn == n && dbuf[..n] == buf[..],
            "direct read of {name} differs from the buffered read"
        );
        for (off, &b) in buf.iter().enumerate() {
            if b == 0 {
                continue;
            }
            let ok = ids.iter().any(|id| {
                let maxv = hist.max_ver.get(id).copied().unwrap_or(0);
                (1..=maxv).any(|v| pattern(*id, off as u64, v) == b)
            });
            check!(ok, "{name} byte {off} = {b} was never written there");
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
            .map_err(|e| format!("fsynced {name} (id {}) missing: {e}", p.id))?;
        check!(
            a.size == p.data.len() as u64,
            "size of fsynced {name}: {} != {}",
            a.size,
            p.data.len()
        );
        let mut buf = vec![0; p.data.len()];
        fs.read(a.ino, 0, &mut buf)
            .map_err(|e| format!("read of fsynced {name}: {e}"))?;
        check!(buf == p.data, "contents of fsynced {name} differ");
    }
    fs.unmount().map_err(|e| format!("unmount: {e}"))?;
    // Every data checksum too: no written block is left unverified.
    let opts = crate::fsck::FsckOptions {
        repair: false,
        check_data: true,
    };
    let r = crate::fsck::fsck(dev, &opts, |_, _| {}).map_err(|e| format!("fsck: {e}"))?;
    check!(r.is_clean(), "fsck: {:?}", r.problems);
    check!(
        r.data_blocks_unverified == 0,
        "{} unverified data blocks",
        r.data_blocks_unverified
    );
    Ok(())
}

/// One round: the workload of `ops` operations from `seed`, then up to
/// `per_epoch` crash images per flush epoch, each checked. `on_state` is
/// called after each state.
pub fn crash_round(
    seed: u64,
    ops: usize,
    per_epoch: usize,
    mut on_state: impl FnMut(),
) -> Result<CrashRound, CrashFailure> {
    let fail = |message: String| CrashFailure {
        seed,
        per_epoch,
        message,
    };
    let (dev, hist) = std::panic::catch_unwind(|| workload(seed, ops)).map_err(|p| {
        fail(format!(
            "seed {seed}: the workload panicked: {}",
            panic_text(&p)
        ))
    })?;
    let log = dev.log();
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xC0FFEE);
    let mut states = 0u64;
    let mut first: Option<String> = None;
    log.for_each_cut(per_epoch, &mut rng, |e, img| {
        if first.is_some() {
            return;
        }
        states += 1;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check_image(img, e as u64, &hist)
        }))
        .unwrap_or_else(|p| Err(format!("panicked: {}", panic_text(&p))));
        if let Err(m) = r {
            first = Some(format!(
                "seed {seed}, cut after {e} flushes (state {states}): {m}"
            ));
        }
        on_state();
    });
    match first {
        Some(m) => Err(fail(m)),
        None => Ok(CrashRound {
            ops,
            epochs: log.epochs.len(),
            states,
        }),
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

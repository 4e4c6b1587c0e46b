//! The corruption campaign: a populated image damaged by seed (single
//! bytes flipped, whole blocks zeroed, 512-byte sectors torn), in its
//! metadata and anywhere; `fsck --repair` must leave it checking clean,
//! the mount must work, and every file must read back whole or fail with
//! a checksum error (EIO), never with another file's bytes.
//!
//! `FOLIOFS_CORRUPTION_SEEDS` sets how many seeds run (200 by default,
//! about a minute in a release build); `FOLIOFS_CORRUPTION_SEED` runs one.

use foliofs::device::{Device, MemDevice};
use foliofs::format::magic;
use foliofs::fs::*;
use foliofs::fsck::{fsck, FsckOptions, Report};
use foliofs::{Error, Fs};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

const BS: usize = 4096;

/// What a file's bytes are: byte `i` of file `n` is `fill(n, i)`, so a
/// block read from another file never passes for this one's.
fn fill(n: u32, i: usize) -> u8 {
    (n.wrapping_mul(31) as usize + i / 7) as u8 | 1
}

struct Populated {
    bytes: Vec<u8>,
    /// Every file's path and its number (its bytes are `fill(n, ..)`).
    files: Vec<(Vec<Vec<u8>>, u32, usize)>,
    /// Blocks holding metadata (a header magic or a used inode), where
    /// half the damage goes.
    meta_blocks: Vec<u64>,
}

/// 48 MiB, two AGs: directories of small and middling files (inline and
/// tree directories, inline and tree extent maps), a 6 MiB file written
/// in pieces, xattrs small and large, symlinks short and long.
fn populated() -> &'static Populated {
    static IMG: OnceLock<Populated> = OnceLock::new();
    IMG.get_or_init(|| {
        let dev = Arc::new(MemDevice::new(48 << 20));
        let o = MkfsOptions {
            block_size: BS as u32,
            ag_count: Some(2),
            ..Default::default()
        };
        mkfs(&*dev, &o, |_, _| {}).unwrap();
        let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
        let root = fs.root_ino();
        let mut files = Vec::new();
        let mut n = 0u32;
        let mut write = |fs: &Fs, dir: u64, path: Vec<Vec<u8>>, len: usize| {
            n += 1;
            let a = fs.create(dir, path.last().unwrap(), 0o644, 0, 0).unwrap();
            let data: Vec<u8> = (0..len).map(|i| fill(n, i)).collect();
            // In pieces with gaps in time, so extents interleave.
            for (k, chunk) in data.chunks(3 * BS).enumerate() {
                fs.write(a.ino, (k * 3 * BS) as u64, chunk).unwrap();
            }
            if n % 3 == 0 {
                fs.setxattr(a.ino, b"user.tag", &[n as u8; 30], 0).unwrap();
            }
            if n % 17 == 0 {
                fs.setxattr(a.ino, b"user.big", &vec![n as u8; 9000], 0)
                    .unwrap();
            }
            files.push((path, n, len));
        };
        for d in 0..6 {
            let dname = format!("dir{d}").into_bytes();
            let dir = fs.mkdir(root, &dname, 0o755, 0, 0).unwrap().ino;
            let count = [4, 40, 120, 12, 60, 8][d];
            for f in 0..count {
                let name = format!("file-{f:03}-{}", "x".repeat(f % 40)).into_bytes();
                let len = [0, 100, 4096, 5000, 20_000, 70_000][(f + d) % 6];
                write(&fs, dir, vec![dname.clone(), name], len);
            }
            let sub = fs.mkdir(dir, b"sub", 0o755, 0, 0).unwrap().ino;
            for f in 0..10 {
                let name = format!("s{f}").into_bytes();
                write(&fs, sub, vec![dname.clone(), b"sub".to_vec(), name], 9000);
            }
            fs.symlink(dir, b"short", b"../dir0", 0, 0).unwrap();
            fs.symlink(dir, b"long", &[b'a'; 600], 0, 0).unwrap();
        }
        write(&fs, root, vec![b"big".to_vec()], 6 << 20);
        fs.unmount().unwrap();
        let bytes = dev.image();
        let sb = foliofs::meta::read_superblock(&*dev).unwrap();
        let geo = foliofs::geometry::Geometry::new(&sb);
        let mut meta_blocks = Vec::new();
        let magics = [
            magic::SUPERBLOCK,
            magic::AG_HEADER,
            magic::BLOCK_BITMAP,
            magic::INODE_BITMAP,
            magic::CSUM,
            magic::BTREE,
            magic::JOURNAL_DESC,
            magic::JOURNAL_COMMIT,
        ];
        for b in 0..geo.total_blocks {
            let blk = &bytes[b as usize * BS..(b as usize + 1) * BS];
            let m = u32::from_le_bytes(blk[..4].try_into().unwrap());
            let itable = (0..geo.ag_count).any(|ag| {
                let s = geo.itable_start(ag);
                (s..s + geo.itable_blocks).contains(&b)
            });
            if magics.contains(&m) || (itable && blk.iter().any(|&x| x != 0)) {
                meta_blocks.push(b);
            }
        }
        Populated {
            bytes,
            files,
            meta_blocks,
        }
    })
}

/// Damage `img` by `seed`: a few changes, each a flipped byte, a zeroed
/// block or a torn sector (one 512-byte sector of the block left as
/// zeros, as if the write of the block stopped there), half of them in
/// metadata blocks.
fn damage(img: &mut [u8], meta_blocks: &[u64], seed: u64) -> Vec<String> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let blocks = (img.len() / BS) as u64;
    let mut done = Vec::new();
    for _ in 0..rng.random_range(1..=12) {
        let b = if rng.random_bool(0.5) {
            meta_blocks[rng.random_range(0..meta_blocks.len())]
        } else {
            rng.random_range(0..blocks)
        } as usize;
        let at = b * BS;
        match rng.random_range(0..10) {
            0 => {
                img[at..at + BS].fill(0);
                done.push(format!("zeroed block {b}"));
            }
            1 => {
                let s = rng.random_range(0..BS / 512) * 512;
                img[at + s..at + s + 512].fill(0);
                done.push(format!("tore sector {s} of block {b}"));
            }
            _ => {
                let off = rng.random_range(0..BS);
                img[at + off] ^= 1 << rng.random_range(0..8);
                done.push(format!("flipped byte {off} of block {b}"));
            }
        }
    }
    done
}

#[derive(Default, Debug)]
struct Tally {
    images: u64,
    unclean: Vec<u64>,
    unmountable: Vec<u64>,
    files_kept: u64,
    files_lost: u64,
    files_eio: u64,
    /// Data blocks whose checksum fails after the repair (`fsck --data`),
    /// and those left without one (their checksum block was zeroed).
    blocks_flagged: u64,
    blocks_unverified: u64,
}

/// Walk the mounted tree: every regular file found by its path reads back
/// whole, or fails with a checksum or corruption error; a read that
/// succeeds returns the file's own bytes.
fn read_back(fs: &Fs, p: &Populated, t: &mut Tally, seed: u64) {
    let by_path: HashMap<&Vec<Vec<u8>>, (u32, usize)> = p
        .files
        .iter()
        .map(|(path, n, len)| (path, (*n, *len)))
        .collect();
    for (path, &(n, len)) in &by_path {
        let mut at = fs.root_ino();
        let found = path.iter().all(|name| match fs.lookup(at, name) {
            Ok(a) => {
                at = a.ino;
                true
            }
            Err(_) => false,
        });
        let Ok(a) = fs.getattr(at).map_err(|_| ()).and_then(|a| match found {
            true => Ok(a),
            false => Err(()),
        }) else {
            t.files_lost += 1;
            continue;
        };
        let mut buf = vec![0u8; len];
        match fs.read(a.ino, 0, &mut buf) {
            Ok(got) => {
                let whole = got == len && a.size == len as u64;
                let own = buf[..got].iter().enumerate().all(|(i, &b)| b == fill(n, i));
                // A file whose map a repair cut reads short or holes
                // (zeros); never another file's bytes.
                let foreign = buf[..got]
                    .iter()
                    .enumerate()
                    .any(|(i, &b)| b != 0 && b != fill(n, i));
                assert!(
                    !foreign,
                    "seed {seed}: {:?} returned bytes it was never given",
                    path.iter()
                        .map(|n| String::from_utf8_lossy(n))
                        .collect::<Vec<_>>()
                );
                if whole && own {
                    t.files_kept += 1;
                } else {
                    t.files_lost += 1;
                }
            }
            Err(Error::DataChecksum { .. }) | Err(Error::Corrupted { .. }) => t.files_eio += 1,
            Err(e) => panic!("seed {seed}: read of inode {}: {e}", a.ino),
        }
    }
}

fn check(dev: &Arc<MemDevice>, repair: bool) -> foliofs::Result<Report> {
    check_with(dev, repair, false)
}

fn check_with(dev: &Arc<MemDevice>, repair: bool, check_data: bool) -> foliofs::Result<Report> {
    let opts = FsckOptions { repair, check_data };
    fsck(dev.clone() as Arc<dyn Device>, &opts, |_, _| {})
}

fn run(seed: u64, t: &mut Tally) {
    let p = populated();
    let mut img = p.bytes.clone();
    let what = damage(&mut img, &p.meta_blocks, seed);
    let dev = Arc::new(MemDevice::from_image(img));
    t.images += 1;
    let repaired = check(&dev, true);
    let after = check(&dev, false);
    match &after {
        Ok(r) if r.is_clean() => {}
        _ => {
            if std::env::var_os("FOLIOFS_CORRUPTION_VERBOSE").is_some() {
                eprintln!("seed {seed}: {what:?}");
                match &repaired {
                    Ok(r) => eprintln!("  repair: {:#?}", r.problems),
                    Err(e) => eprintln!("  repair failed: {e}"),
                }
                match &after {
                    Ok(r) => eprintln!("  left: {:#?}", r.problems),
                    Err(e) => eprintln!("  check failed: {e}"),
                }
            }
            t.unclean.push(seed);
            return;
        }
    }
    // What is left for `fsck --data` is data blocks only, each named.
    let data = check_with(&dev, false, true).unwrap();
    for p in &data.problems {
        assert_eq!(p.structure, "data block", "seed {seed}: {p:?}");
    }
    t.blocks_unverified += data.data_blocks_unverified;
    t.blocks_flagged += data.problems.len() as u64 - data.data_blocks_unverified;
    match Fs::mount(dev.clone(), MountOptions::default()) {
        Ok(fs) => {
            read_back(&fs, p, t, seed);
            fs.unmount().unwrap();
            // Reading changed nothing that a check could object to.
            let again = check(&dev, false).unwrap();
            assert!(again.is_clean(), "seed {seed}: {:?}", again.problems);
        }
        Err(e) => {
            eprintln!("seed {seed}: mount after repair: {e}");
            t.unmountable.push(seed);
        }
    }
}

#[test]
fn repair_leaves_every_damaged_image_clean() {
    let seeds: Vec<u64> = match std::env::var("FOLIOFS_CORRUPTION_SEED") {
        Ok(s) => vec![s.parse().unwrap()],
        Err(_) => {
            let n = std::env::var("FOLIOFS_CORRUPTION_SEEDS")
                .map(|s| s.parse().unwrap())
                .unwrap_or(200);
            (0..n).collect()
        }
    };
    let mut t = Tally::default();
    for &seed in &seeds {
        run(seed, &mut t);
    }
    eprintln!(
        "campaign: {} images, {} left unclean, {} unmountable; files kept {}, lost {}, \
         EIO {}; data blocks flagged by checksum {}, left unverified {}",
        t.images,
        t.unclean.len(),
        t.unmountable.len(),
        t.files_kept,
        t.files_lost,
        t.files_eio,
        t.blocks_flagged,
        t.blocks_unverified
    );
    assert!(t.unclean.is_empty() && t.unmountable.is_empty(), "{t:?}");
}

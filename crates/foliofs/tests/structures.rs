//! The structures under the engine, each against a model: the B+tree
//! (splits, merges and deletes of random keys and value sizes), the
//! journal (replay of every prefix of the device's writes), and the
//! delayed-allocation books through writes, writeback and close.

use foliofs::alloc::Alloc;
use foliofs::btree::Tree;
use foliofs::device::{CrashDevice, Device, MemDevice};
use foliofs::format::btree_node::TreeType;
use foliofs::fs::{mkfs, MkfsOptions, MountOptions};
use foliofs::meta::{self, Kind, Meta};
use foliofs::Fs;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;

mod common;

/// A fresh file system's metadata layer on `dev`.
fn metadata(dev: Arc<dyn Device>) -> (Meta, Alloc) {
    let sb = meta::read_superblock(&*dev).unwrap();
    let mut m = Meta::new(dev, sb, 64 << 20);
    let a = Alloc::load(&mut m).unwrap();
    (m, a)
}

fn formatted(bytes: u64, block_size: u32) -> MemDevice {
    let mem = MemDevice::new(bytes);
    let opts = MkfsOptions {
        block_size,
        // Small, so a dozen transactions fill it and checkpoint.
        journal_blocks: Some(128),
        ..Default::default()
    };
    mkfs(&mem, &opts, |_, _| {}).unwrap();
    mem
}

const TREE: Tree = Tree {
    owner: 77,
    tt: TreeType::Xattr,
    ag: 0,
};

/// Every entry of the tree, in order.
fn entries(m: &mut Meta, root: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let batch = TREE.scan(m, root, from, 1).unwrap();
        let Some(last) = batch.last().map(|(k, _)| *k) else {
            return out;
        };
        out.extend(batch);
        if last == u64::MAX {
            return out;
        }
        from = last + 1;
    }
}

#[test]
fn btree_against_a_model() {
    // 512-byte blocks: a node holds a few entries, so the tree grows
    // several levels deep and splits and merges all the time.
    let dev: Arc<dyn Device> = Arc::new(formatted(32 << 20, 512));
    let (mut m, mut a) = metadata(dev);
    let max = foliofs::btree::max_value_len(512);
    let mut rng = SmallRng::seed_from_u64(19);
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut root = 0u64;
    let mut deepest = 0;
    for i in 0..20_000u32 {
        let key = rng.random_range(0..3000u64) * 7;
        if rng.random_bool(0.6) {
            let len = rng.random_range(0..=max);
            let v: Vec<u8> = (0..len).map(|j| (j as u32 ^ i) as u8).collect();
            TREE.insert(&mut m, &mut a, &mut root, key, &v).unwrap();
            model.insert(key, v);
        } else {
            let got = TREE.remove(&mut m, &mut a, &mut root, key).unwrap();
            assert_eq!(got, model.remove(&key), "remove {key} at op {i}");
        }
        let probe = rng.random_range(0..3000u64) * 7;
        assert_eq!(
            TREE.get(&mut m, root, probe).unwrap(),
            model.get(&probe).cloned(),
            "get {probe} at op {i}"
        );
        // Between keys: the answer may sit in the previous leaf.
        let between = probe + 3;
        assert_eq!(
            TREE.find_le(&mut m, root, between).unwrap(),
            model
                .range(..=between)
                .next_back()
                .map(|(k, v)| (*k, v.clone())),
            "find_le {between} at op {i}"
        );
        if i % 100 == 0 {
            // A bounded scan returns the range and nothing past it.
            let lo = rng.random_range(0..21_000u64);
            let hi = lo + rng.random_range(0..2_000u64);
            let want: Vec<_> = model.range(lo..=hi).map(|(k, v)| (*k, v.clone())).collect();
            let got = TREE.scan_range(&mut m, root, lo, hi, usize::MAX).unwrap();
            assert!(got == want, "scan_range [{lo}, {hi}] differs at op {i}");
        }
        if i % 500 == 0 {
            let all: Vec<_> = model.iter().map(|(k, v)| (*k, v.clone())).collect();
            assert!(entries(&mut m, root) == all, "scan differs at op {i}");
            // walk checks every level and pointer.
            let blocks = TREE.walk(&mut m, root, |_, _| Ok(())).unwrap();
            deepest = deepest.max(blocks.len());
            let le = TREE.find_le(&mut m, root, probe).unwrap().map(|(k, _)| k);
            assert_eq!(le, model.range(..=probe).next_back().map(|(k, _)| *k));
        }
    }
    assert!(deepest > 50, "the tree never grew past {deepest} nodes");
    // Empty it: every node is given back.
    for k in model.keys().copied().collect::<Vec<_>>() {
        TREE.remove(&mut m, &mut a, &mut root, k).unwrap();
    }
    assert_eq!(root, 0, "an empty tree has no root");
}

#[test]
fn journal_replay_of_every_prefix() {
    let mem = formatted(16 << 20, 4096);
    let dev = Arc::new(CrashDevice::new(mem.image()));
    let (mut m, mut a) = metadata(dev.clone());
    // After each commit: the tree's root, its entries, and how many
    // device writes had been issued.
    let mut states = vec![(0u64, Vec::new(), dev.write_count())];
    let mut root = 0u64;
    let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for t in 0..12u64 {
        for k in 0..40u64 {
            let key = (k * 13 + t * 5) % 200;
            if (k + t) % 4 == 0 {
                TREE.remove(&mut m, &mut a, &mut root, key).unwrap();
                model.remove(&key);
            } else {
                let v = vec![t as u8; 100 + (k as usize * 37) % 900];
                TREE.insert(&mut m, &mut a, &mut root, key, &v).unwrap();
                model.insert(key, v);
            }
        }
        m.commit().unwrap();
        let all = model.iter().map(|(k, v)| (*k, v.clone())).collect();
        states.push((root, all, dev.write_count()));
    }
    assert!(m.stats.checkpoints > 0, "the journal never filled");
    drop(m);
    // Every prefix of the writes, in order: replay gives the state of the
    // last transaction all of whose writes are in the prefix, checkpoints
    // (home writes, then the superblock's new tail) included.
    let log = dev.log();
    let writes: Vec<&(u64, Vec<u8>)> = log.epochs.iter().flatten().collect();
    assert_eq!(writes.len() as u64, states.last().unwrap().2 - states[0].2);
    let first = states[0].2;
    for n in 0..=writes.len() {
        let mut img = log.initial.clone();
        for (off, data) in &writes[..n] {
            img[*off as usize..*off as usize + data.len()].copy_from_slice(data);
        }
        let want = states
            .iter()
            .rposition(|s| s.2 - first <= n as u64)
            .unwrap();
        let d = Arc::new(MemDevice::from_image(img));
        let mut sb = meta::read_superblock(&*d).unwrap();
        // A checkpoint (the journal fills after a few transactions here)
        // moves the tail, so replay applies only what came after it.
        let replayed = meta::replay(&*d, &mut sb).unwrap();
        assert!(
            replayed <= want as u64,
            "{replayed} replayed from {n} writes"
        );
        let (mut m2, _) = metadata(d);
        let (root, want_entries, _) = &states[want];
        assert!(
            entries(&mut m2, *root) == *want_entries,
            "after {n} writes the tree is not transaction {want}'s"
        );
    }
}

#[test]
fn delalloc_books_balance_through_writes_writeback_and_close() {
    let dev = Arc::new(formatted(64 << 20, 4096));
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let root = fs.root_ino();
    let free0 = fs.statfs().unwrap().blocks_free;
    let (a, f) = fs
        .create(root, b"appends", 0o644, 0, 0)
        .and_then(|a| fs.open_file(a.ino))
        .unwrap();
    for i in 0..20_000u64 {
        fs.write(a.ino, i, &[i as u8]).unwrap();
        if i % 4096 == 0 {
            fs.check_invariants().unwrap();
        }
    }
    let c = fs.counters();
    assert!(c.prealloc_reserved > 0, "appends reserved no preallocation");
    let held = free0 - fs.statfs().unwrap().blocks_free;
    assert!(held >= 5, "20,000 bytes of delayed data hold {held} blocks");
    fs.fsync_file(&f, false).unwrap();
    fs.check_invariants().unwrap();
    fs.release_file(f).unwrap();
    fs.check_invariants().unwrap();
    // Closed: the file holds its 5 blocks and nothing past EOF.
    let at = fs.getattr(a.ino).unwrap();
    assert_eq!(at.allocated, 5 * 4096, "blocks past EOF after close");
    assert_eq!(
        fs.statfs().unwrap().blocks_free,
        free0 - 5,
        "after close only the file's own blocks are held"
    );
    fs.unlink(root, b"appends").unwrap();
    fs.sync().unwrap();
    fs.check_invariants().unwrap();
    assert_eq!(fs.statfs().unwrap().blocks_free, free0, "space given back");
    fs.unmount().unwrap();
    common::fsck_clean(dev, "after the appends");
}

#[test]
fn inodes_are_handed_out_lowest_free_first_also_after_frees() {
    let dev: Arc<dyn Device> = Arc::new(formatted(32 << 20, 4096));
    let (mut m, mut a) = metadata(dev);
    let first: Vec<u64> = (0..300)
        .map(|_| a.alloc_inode(&mut m, 1).unwrap())
        .collect();
    assert!(
        first.windows(2).all(|w| w[1] == w[0] + 1),
        "in order: {first:?}"
    );
    // Freed out of order: taken again lowest first, then past the end.
    for i in [250, 40, 41, 7] {
        a.free_inode(&mut m, first[i]).unwrap();
    }
    let again: Vec<u64> = (0..5).map(|_| a.alloc_inode(&mut m, 1).unwrap()).collect();
    let want = [first[7], first[40], first[41], first[250], first[299] + 1];
    assert_eq!(again, want);
}

#[test]
fn a_metadata_cache_full_of_changed_blocks_is_not_scanned_on_every_read() {
    // A cache of 256 blocks holding 400 changed ones (a large unlink or
    // untar before its commit): none can go, and reads go on past it.
    let dev: Arc<dyn Device> = Arc::new(formatted(64 << 20, 4096));
    let sb = meta::read_superblock(&*dev).unwrap();
    let mut m = Meta::new(dev, sb, 1 << 20);
    let data = m.geo.ag_start(1) + m.geo.data_start_agbno(1);
    for b in data..data + 400 {
        m.create(b, Kind::Header);
    }
    let ipb = m.geo.block_size / foliofs::format::inode::INODE_SIZE as u64;
    let reads0 = m.stats.meta_reads;
    let mut blocks = std::collections::BTreeSet::new();
    for ino in (1..m.geo.max_ino()).step_by(ipb as usize).take(300) {
        let (blk, _) = m.geo.inode_loc(ino);
        m.read_itable(blk).unwrap();
        blocks.insert(blk);
    }
    assert_eq!(m.stats.meta_reads - reads0, blocks.len() as u64);
    assert_eq!(blocks.len(), 300);
    // 700 blocks cached past a limit of 256: a scan at 256, then one per
    // 128 blocks more (5 in all), not one per block.
    let scans = m.stats.meta_evict_scans;
    assert!(
        (1..=5).contains(&scans),
        "{scans} eviction scans for 700 blocks cached"
    );
}

/// Transactions are written several at once, so a crash can leave a later
/// one whole behind a lost one. Replay stops at the lost one; the
/// transaction written next in its place must not make the stranded
/// successor look like its own successor: the sequence continues past
/// every number in the log.
#[test]
fn a_transaction_stranded_behind_a_lost_one_is_never_replayed() {
    let mem = Arc::new(formatted(16 << 20, 4096));
    let dev: Arc<dyn Device> = mem.clone();
    let bs = 4096usize;
    let home = |blk: u64| {
        let mut b = vec![0u8; bs];
        dev.read_at(&mut b, blk * bs as u64).unwrap();
        b[0]
    };
    let (mut m, _a) = metadata(dev.clone());
    m.set_clean(false).unwrap();
    let (x, y) = (m.geo.total_blocks - 20, m.geo.total_blocks - 10);
    // A: durable.
    m.write_data(x, &vec![1u8; bs]).unwrap();
    m.commit().unwrap();
    // B and C sealed; only C reaches the device.
    m.write_data(x, &vec![2u8; bs]).unwrap();
    let b = m.seal_with(false).unwrap().unwrap();
    m.write_data(y, &vec![3u8; bs]).unwrap();
    let c = m.seal_with(false).unwrap().unwrap();
    c.write();
    drop(b);
    drop(m);
    // The crash: replay applies A and stops at the missing B.
    let mut sb = meta::read_superblock(&*dev).unwrap();
    assert_eq!(meta::replay(&*dev, &mut sb).unwrap(), 1);
    assert_eq!((home(x), home(y)), (1, 0));
    // D, shaped like B, is written where B would have been; crash again.
    let (mut m, _a) = metadata(dev.clone());
    m.write_data(x, &vec![4u8; bs]).unwrap();
    m.commit().unwrap();
    drop(m);
    let mut sb = meta::read_superblock(&*dev).unwrap();
    assert_eq!(
        meta::replay(&*dev, &mut sb).unwrap(),
        1,
        "C was replayed after D"
    );
    assert_eq!((home(x), home(y)), (4, 0));
}

/// An image of the previous format (version 1) mounts and is raised to
/// the current one before this engine's first transaction (whose
/// checksum records a version 1 engine would not replay); a version from
/// the future is refused with a message naming it.
#[test]
fn a_version_1_image_is_raised_at_mount_and_a_newer_one_refused() {
    use foliofs::format::{FORMAT_VERSION, OLDEST_FORMAT_VERSION};
    let dev: Arc<dyn Device> = Arc::new(formatted(16 << 20, 4096));
    let set_version = |v: u32| {
        let mut sb = meta::read_superblock(&*dev).unwrap();
        sb.version = v;
        // Both slots (each write takes the other): a slot that does not
        // decode loses to the other.
        meta::write_superblock(&*dev, &mut sb).unwrap();
        meta::write_superblock(&*dev, &mut sb).unwrap();
    };
    set_version(OLDEST_FORMAT_VERSION);
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    assert_eq!(
        meta::read_superblock(&*dev).unwrap().version,
        FORMAT_VERSION,
        "raised while mounted"
    );
    fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap();
    fs.unmount().unwrap();
    common::fsck_clean(dev.clone(), "after the raise");
    set_version(FORMAT_VERSION + 1);
    let e = Fs::mount(dev.clone(), MountOptions::default())
        .err()
        .expect("a newer format mounted");
    assert!(
        e.to_string().contains(&format!(
            "unsupported format version {}",
            FORMAT_VERSION + 1
        )),
        "{e}"
    );
}

//! Chunks a flush holds whole go to the store once, as chunk objects of
//! their own that the flush's WAL object names: they read back before
//! and after the machine is lost, keep their order with blocks the WAL
//! wrote around them, become the manifest's at a checkpoint without a
//! PUT, and are deleted only once neither the WAL nor a snapshot names
//! them.

mod common;

use common::{cut_store, manifest, SIZE};
use foliofs::device::Device;
use foliofs_object::layout::{flushed_seq, pair_of};
use foliofs_object::{
    collect_garbage, take_snapshot, InMemory, ObjectDevice, ObjectOptions, ObjectStore, Path,
};
use futures::TryStreamExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const BLOCK: u64 = 4096;
/// Blocks per chunk of these images (256 KiB chunks).
const CHUNK_BLOCKS: u64 = 64;

fn opts() -> ObjectOptions {
    ObjectOptions {
        // Checkpoints only when a test asks.
        checkpoint_bytes: 1 << 40,
        chunk_bytes: CHUNK_BLOCKS * BLOCK,
        retry: std::time::Duration::ZERO,
        ..Default::default()
    }
}

fn takeover() -> ObjectOptions {
    ObjectOptions {
        takeover: true,
        ..opts()
    }
}

fn img() -> Path {
    Path::from("img")
}

/// Block `b` as round `round` writes it.
fn block(b: u64, round: u8) -> Vec<u8> {
    let mut d = vec![round; BLOCK as usize];
    d[..8].copy_from_slice(&b.to_le_bytes());
    d
}

/// Write blocks [from, to) as round `round` (not flushed).
fn write(dev: &ObjectDevice, from: u64, to: u64, round: u8) {
    for b in from..to {
        dev.write_at(&block(b, round), b * BLOCK).unwrap();
    }
}

/// Each (block, round) reads back as written.
fn expect(dev: &ObjectDevice, blocks: &[(u64, u8)]) {
    let mut got = vec![0; BLOCK as usize];
    for &(b, round) in blocks {
        dev.read_at(&mut got, b * BLOCK).unwrap();
        assert!(got == block(b, round), "block {b}: not round {round}");
    }
}

/// A new image at `img` in a store of its own, open for writing.
fn fresh() -> (Arc<dyn ObjectStore>, ObjectDevice) {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dev = ObjectDevice::create(store.clone(), img(), SIZE, opts()).unwrap();
    (store, dev)
}

/// The machine is lost: another takes the image over, and each (block,
/// round) of `want` reads back there.
fn taken_over(dev: ObjectDevice, store: &Arc<dyn ObjectStore>, want: &[(u64, u8)]) -> ObjectDevice {
    drop(dev);
    let dev = ObjectDevice::open(store.clone(), img(), takeover()).unwrap();
    expect(&dev, want);
    dev
}

/// The chunk objects under `img`: (index, version).
fn chunk_objects(store: &Arc<dyn ObjectStore>) -> Vec<(u64, u64)> {
    let metas: Vec<_> =
        futures::executor::block_on(store.list(Some(&img().child("chunk"))).try_collect()).unwrap();
    let mut v: Vec<_> = metas.iter().filter_map(|m| pair_of(&m.location)).collect();
    v.sort_unstable();
    v
}

#[test]
fn a_flush_puts_whole_chunks_once_and_its_wal_object_names_them() {
    let (store, dev) = fresh();
    // Chunks 2 and 3 whole, one block of chunk 0.
    write(&dev, 2 * CHUNK_BLOCKS, 4 * CHUNK_BLOCKS, 1);
    write(&dev, 5, 6, 1);
    dev.flush().unwrap();
    let st = dev.stats();
    assert_eq!(st.chunks_flushed, 2, "{st:?}");
    assert_eq!(st.chunk_puts, 0, "no checkpoint ran: {st:?}");
    assert!(
        st.wal_bytes < 2 * BLOCK + 100,
        "the WAL object holds the one block and names the chunks: {st:?}"
    );
    let flushed: Vec<_> = chunk_objects(&store)
        .into_iter()
        .filter(|&(_, v)| flushed_seq(v).is_some())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(flushed, vec![2, 3]);
    let written = [(2 * CHUNK_BLOCKS, 1), (4 * CHUNK_BLOCKS - 1, 1), (5, 1)];
    expect(&dev, &written);
    let dev = taken_over(dev, &store, &written);
    expect(&dev, &[(3 * CHUNK_BLOCKS + 7, 1)]);
    // The checkpoint names the flushed chunks as they are.
    dev.checkpoint_now().unwrap();
    let st = dev.stats();
    assert_eq!(
        st.chunk_puts, 1,
        "only chunk 0 (its one block) is PUT: {st:?}"
    );
    let m = manifest(&store, st.manifest);
    for idx in [2, 3] {
        assert!(
            m.chunks
                .get(&idx)
                .is_some_and(|&v| flushed_seq(v).is_some()),
            "chunk {idx}: {:?}",
            m.chunks
        );
    }
    dev.close().unwrap();
    let dev = ObjectDevice::open(store, img(), opts()).unwrap();
    expect(&dev, &written);
    dev.close().unwrap();
}

#[test]
fn blocks_the_wal_wrote_around_a_flushed_chunk_keep_their_order() {
    let (store, dev) = fresh();
    let c = CHUNK_BLOCKS;
    // Round 1: two blocks of chunk 1 through the WAL; round 2: chunk 1
    // whole; round 3: one block of it through the WAL again.
    write(&dev, c + 3, c + 5, 1);
    dev.flush().unwrap();
    write(&dev, c, 2 * c, 2);
    dev.flush().unwrap();
    write(&dev, c + 4, c + 5, 3);
    dev.flush().unwrap();
    let want = [(c, 2), (c + 3, 2), (c + 4, 3), (2 * c - 1, 2)];
    expect(&dev, &want);
    let dev = taken_over(dev, &store, &want);
    // Folded onto the flushed chunk, read back from the store.
    dev.checkpoint_now().unwrap();
    let st = dev.stats();
    assert_eq!((st.chunk_puts, st.chunk_gets), (1, 1), "{st:?}");
    expect(&dev, &want);
    dev.close().unwrap();
    let dev = ObjectDevice::open(store.clone(), img(), opts()).unwrap();
    expect(&dev, &want);
    dev.close().unwrap();
    // The flushed version was folded: only the checkpoint's is left.
    let versions: Vec<_> = chunk_objects(&store)
        .into_iter()
        .filter(|&(i, _)| i == 1)
        .collect();
    assert_eq!(versions.len(), 1, "{versions:?}");
}

#[test]
fn garbage_is_what_neither_the_wal_nor_a_snapshot_names() {
    let (store, dev) = fresh();
    let c = CHUNK_BLOCKS;
    write(&dev, 0, 2 * c, 1);
    dev.flush().unwrap();
    // Named by the WAL only: a full sweep keeps them.
    collect_garbage(store.clone(), &img()).unwrap();
    assert_eq!(chunk_objects(&store).len(), 2);
    // A snapshot of this moment, then chunk 0 written whole again and
    // chunk 1 folded, and a checkpoint that sweeps.
    let at = take_snapshot(store.clone(), &img()).unwrap();
    write(&dev, 0, c, 2);
    write(&dev, c + 1, c + 2, 2);
    dev.flush().unwrap();
    dev.checkpoint_now().unwrap();
    expect(&dev, &[(0, 2), (c, 1), (c + 1, 2)]);
    // The snapshot reads round 1 through the WAL it keeps.
    let snap = ObjectDevice::open(
        store.clone(),
        img(),
        ObjectOptions {
            read_only: true,
            snapshot: Some(at),
            ..opts()
        },
    )
    .unwrap();
    expect(&snap, &[(0, 1), (c - 1, 1), (c, 1), (c + 1, 1)]);
    snap.close().unwrap();
    foliofs_object::forget_snapshot(store.clone(), &img(), at).unwrap();
    collect_garbage(store.clone(), &img()).unwrap();
    // What is left: chunk 0 of round 2, and the checkpoint's chunk 1.
    let left = chunk_objects(&store);
    assert_eq!(left.len(), 2, "{left:?}");
    dev.close().unwrap();
    let dev = ObjectDevice::open(store, img(), opts()).unwrap();
    expect(&dev, &[(0, 2), (c - 1, 2), (c, 1), (c + 1, 2)]);
    dev.close().unwrap();
}

/// The store cut after every number of PUTs while whole chunks are
/// flushed: what the last successful flush made durable reads back on
/// another machine, and nothing a failed flush began is read.
#[test]
fn a_cut_between_a_flushed_chunk_and_its_wal_object_loses_nothing_flushed() {
    let c = CHUNK_BLOCKS;
    let mut cut_at = 0;
    loop {
        let (inner, left, store) = cut_store();
        let dev = ObjectDevice::create(store, img(), SIZE, opts()).unwrap();
        left.store(cut_at, Ordering::SeqCst);
        // Round r writes chunks r and r + 1 whole and one block of
        // chunk 10; the last round that flushed is what must be there.
        let mut flushed = 0u8;
        for round in 1..=4u8 {
            let first = u64::from(round) * c;
            write(&dev, first, first + 2 * c, round);
            write(&dev, 10 * c + 1, 10 * c + 2, round);
            if dev.flush().is_err() {
                break;
            }
            flushed = round;
        }
        let whole = flushed == 4;
        drop(dev);
        let inner: Arc<dyn ObjectStore> = inner;
        let dev = ObjectDevice::open(inner, img(), takeover()).unwrap();
        if flushed > 0 {
            let r = flushed;
            let first = u64::from(r) * c;
            expect(&dev, &[(first, r), (first + 2 * c - 1, r), (10 * c + 1, r)]);
            // Chunk r - 1 + 1 = r is this round's; chunk r - 1 (if any)
            // keeps the round before's first chunk.
            if r > 1 {
                expect(&dev, &[(first - c, r - 1)]);
            }
        }
        dev.close().unwrap();
        if whole {
            assert!(cut_at >= 12, "4 flushes of 3 PUTs each: {cut_at}");
            break;
        }
        cut_at += 1;
    }
}

/// A flush the bound on held writes asks for PUTs the chunks it holds
/// whole and leaves a streaming writer's part-written chunks for a later
/// flush, which finds them whole: they go to the store once, never
/// through the WAL and again into a chunk. Scattered blocks, which make
/// no chunk whole, all go as before, so the bound still holds.
#[test]
fn a_flush_for_the_bound_leaves_part_written_chunks_for_a_later_one() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let c = CHUNK_BLOCKS;
    let bounded = ObjectOptions {
        pending_bytes: 4 * c * BLOCK,
        ..opts()
    };
    let dev = ObjectDevice::create(store.clone(), img(), SIZE, bounded.clone()).unwrap();
    let before = dev.stats();
    // Two streams, a block at a time in turn: one from the middle of
    // chunk 0, one from the start of chunk 100. At 4 chunks held, chunks
    // 1, 100 and 101 are whole; half of chunk 0 and of chunk 2 is not.
    let (a, b) = (c / 2, 100 * c);
    let n = 3 * c;
    for i in 0..n {
        write(&dev, a + i, a + i + 1, 1);
        write(&dev, b + i, b + i + 1, 1);
    }
    let st = dev.stats();
    assert_eq!(
        st.wal_puts - before.wal_puts,
        1,
        "one flush for the bound: {st:?}"
    );
    assert_eq!(st.chunks_flushed, 3, "chunks 1, 100, 101: {st:?}");
    assert!(
        st.wal_bytes - before.wal_bytes < BLOCK,
        "its WAL object names the chunks and holds no block: {st:?}"
    );
    // What it left stays readable, and goes at the next flush.
    let written: Vec<(u64, u8)> = (0..n).flat_map(|i| [(a + i, 1), (b + i, 1)]).collect();
    expect(&dev, &written);
    dev.flush().unwrap();
    let st = dev.stats();
    assert_eq!(
        st.chunks_flushed, 5,
        "chunk 2 and chunk 102 whole by then: {st:?}"
    );
    drop(dev);
    let again = ObjectOptions {
        takeover: true,
        ..bounded
    };
    let dev = ObjectDevice::open(store.clone(), img(), again.clone()).unwrap();
    expect(&dev, &written);

    // Two blocks in each of 128 chunks: none whole, so the flush for the
    // bound takes them all.
    let before = dev.stats();
    let scattered: Vec<(u64, u8)> = (0..4 * c)
        .map(|i| (110 * c + (i / 2) * c + (i % 2) * 7, 2))
        .collect();
    for &(blk, round) in &scattered {
        write(&dev, blk, blk + 1, round);
    }
    let st = dev.stats();
    assert_eq!(st.wal_puts - before.wal_puts, 1, "{st:?}");
    assert!(
        st.wal_bytes - before.wal_bytes >= 4 * c * BLOCK,
        "every scattered block in the WAL object: {st:?}"
    );
    drop(dev);
    let dev = ObjectDevice::open(store, img(), again).unwrap();
    expect(&dev, &scattered);
    dev.close().unwrap();
}

/// A chunk written in order across two flushes (an fsync part-way
/// through it) goes whole as an object at the flush that completes it,
/// from the WAL's blocks of it and the flush's own, when that flush PUTs
/// chunks anyway; the WAL's are then older than it, and no checkpoint
/// folds them. A flush that would PUT no chunk otherwise stays one PUT.
#[test]
fn a_flush_completes_a_chunk_the_wal_holds_part_of() {
    let (store, dev) = fresh();
    let c = CHUNK_BLOCKS;
    let (first, small) = (5 * c, 9 * c);
    write(&dev, first, first + 40, 1);
    write(&dev, small, small + 40, 1);
    dev.flush().unwrap();
    let st = dev.stats();
    assert_eq!(st.chunks_flushed, 0, "{st:?}");
    assert!(st.wal_bytes >= 80 * BLOCK, "{st:?}");
    // The rest of chunk 5, one block of the WAL's part of it again, and
    // chunk 7 whole.
    write(&dev, first + 40, first + c, 1);
    write(&dev, first + 3, first + 4, 2);
    write(&dev, 7 * c, 8 * c, 1);
    dev.flush().unwrap();
    let mid = dev.stats();
    assert_eq!(mid.chunks_flushed, 2, "chunks 5 and 7: {mid:?}");
    assert!(
        mid.wal_bytes - st.wal_bytes < BLOCK,
        "the second WAL object names the chunks and holds no block: {mid:?}"
    );
    // The rest of chunk 9 alone: in the WAL, not a chunk PUT.
    write(&dev, small + 40, small + c, 1);
    dev.flush().unwrap();
    let end = dev.stats();
    assert_eq!(end.chunks_flushed, 2, "{end:?}");
    assert_eq!(end.wal_puts - mid.wal_puts, 1, "{end:?}");
    assert!(end.wal_bytes - mid.wal_bytes >= (c - 40) * BLOCK, "{end:?}");
    let mut written: Vec<(u64, u8)> = (first..first + c)
        .map(|b| (b, if b == first + 3 { 2 } else { 1 }))
        .collect();
    written.extend((7 * c..8 * c).chain(small..small + c).map(|b| (b, 1)));
    expect(&dev, &written);
    // The WAL replays to the same blocks.
    let dev = taken_over(dev, &store, &written);
    dev.checkpoint_now().unwrap();
    let st = dev.stats();
    assert_eq!(st.chunk_puts, 1, "only chunk 9 is folded: {st:?}");
    dev.close().unwrap();
    let dev = ObjectDevice::open(store, img(), opts()).unwrap();
    expect(&dev, &written);
    dev.close().unwrap();
}

/// A chunk a flush fills with zeros where the image holds nothing yet
/// is not PUT: it reads as zeros already, here and after the machine is
/// lost. One that held data is PUT, zeros and all.
#[test]
fn zeros_over_nothing_are_not_put() {
    let (store, dev) = fresh();
    let c = CHUNK_BLOCKS;
    let zeros = vec![0u8; (c * BLOCK) as usize];
    write(&dev, 6 * c, 7 * c, 1);
    dev.flush().unwrap();
    dev.write_at(&zeros, 3 * c * BLOCK).unwrap();
    dev.write_at(&zeros, 6 * c * BLOCK).unwrap();
    write(&dev, 4 * c, 5 * c, 1);
    dev.flush().unwrap();
    let st = dev.stats();
    assert_eq!(st.chunks_flushed, 3, "chunk 6 twice, chunk 4: {st:?}");
    let indexes: Vec<u64> = chunk_objects(&store).iter().map(|&(i, _)| i).collect();
    assert!(!indexes.contains(&3), "{indexes:?}");
    assert!(indexes.contains(&4) && indexes.contains(&6), "{indexes:?}");
    let dev = taken_over(dev, &store, &[(4 * c, 1), (5 * c - 1, 1)]);
    let mut got = vec![1u8; zeros.len()];
    for idx in [3, 6] {
        dev.read_at(&mut got, idx * c * BLOCK).unwrap();
        assert!(got == zeros, "chunk {idx} reads as zeros");
    }
    dev.close().unwrap();
}

//! Read-ahead of chunks: a cold sequential read of an image (a fresh
//! device, nothing cached) gets every chunk after the first from a fetch
//! made ahead, each once, and reads the right bytes; reads that jump
//! about, or read-ahead off, fetch only what they read; a read spanning
//! chunks fetches them beside each other.

use foliofs::device::{AlignedBuf, Device};
use foliofs::{Fs, MkfsOptions, MountOptions};
use foliofs_object::{InMemory, ObjectDevice, ObjectOptions, ObjectStore, Path};
use std::sync::Arc;

/// 16 chunks of 4 MiB.
const SIZE: u64 = 64 << 20;
const CHUNKS: u64 = SIZE / (4 << 20);
const MIB: usize = 1 << 20;

/// MiB `m` of the image: every byte says where it is.
fn mib(m: u64) -> Vec<u8> {
    (0..MIB as u64)
        .map(|k| (((m << 20) | k).wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

/// An image whose every chunk is in the store (written, then folded by
/// the close).
fn written_image() -> Arc<dyn ObjectStore> {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dev =
        ObjectDevice::create(store.clone(), Path::from("img"), SIZE, Default::default()).unwrap();
    for m in 0..SIZE >> 20 {
        dev.write_at(&mib(m), m << 20).unwrap();
    }
    dev.close().unwrap();
    assert_eq!(dev.stats().chunks, CHUNKS);
    store
}

fn cold(store: Arc<dyn ObjectStore>, read_ahead_chunks: usize) -> ObjectDevice {
    let opts = ObjectOptions {
        read_only: true,
        read_ahead_chunks,
        ..Default::default()
    };
    ObjectDevice::open(store, Path::from("img"), opts).unwrap()
}

fn read_mib(dev: &ObjectDevice, m: u64) {
    let mut got = vec![0; MIB];
    dev.read_at(&mut got, m << 20).unwrap();
    assert!(got == mib(m), "MiB {m}");
}

#[test]
fn a_cold_sequential_read_fetches_the_next_chunks_ahead() {
    let dev = cold(written_image(), 4);
    for m in 0..SIZE >> 20 {
        read_mib(&dev, m);
    }
    let st = dev.stats();
    // The first read starts nothing (no read before it); the second
    // goes on from it and every chunk after the first comes from a
    // fetch made ahead. Each chunk is fetched once.
    assert_eq!(st.chunks_read_ahead, CHUNKS - 1, "{st:?}");
    assert_eq!(st.chunk_gets, CHUNKS, "{st:?}");
}

#[test]
fn reads_that_jump_or_read_ahead_off_fetch_only_what_they_read() {
    let store = written_image();
    let dev = cold(store.clone(), 4);
    // Every other chunk, backwards: never where the last read ended.
    for c in (0..CHUNKS).rev().step_by(2) {
        read_mib(&dev, c * 4 + 1);
    }
    let st = dev.stats();
    assert_eq!(st.chunks_read_ahead, 0, "{st:?}");
    assert_eq!(st.chunk_gets, CHUNKS / 2, "{st:?}");

    let dev = cold(store, 0);
    for m in 0..SIZE >> 20 {
        read_mib(&dev, m);
    }
    let st = dev.stats();
    assert_eq!(st.chunks_read_ahead, 0, "{st:?}");
    assert_eq!(st.chunk_gets, CHUNKS, "{st:?}");
}

/// A file read through the engine with 1 MiB direct reads: its data
/// reads are interleaved with reads of the blocks holding its checksums,
/// and its extents may lie a few blocks apart; its chunks are read ahead
/// all the same, and it reads back as written.
#[test]
fn a_file_read_through_the_engine_is_read_ahead() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dev = ObjectDevice::create(
        store.clone(),
        Path::from("img"),
        256 << 20,
        Default::default(),
    )
    .unwrap();
    let dev = Arc::new(dev);
    foliofs::mkfs(&*dev, &MkfsOptions::default(), |_, _| {}).unwrap();
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    let ino = fs.create(fs.root_ino(), b"f", 0o644, 0, 0).unwrap().ino;
    let file_mib = 64;
    let mut buf = AlignedBuf::zeroed(MIB);
    for m in 0..file_mib {
        buf.copy_from_slice(&mib(m));
        fs.write_direct(ino, m << 20, &buf).unwrap();
    }
    fs.unmount().unwrap();
    dev.close().unwrap();

    let dev = Arc::new(cold(store, 4));
    let ro = MountOptions {
        read_only: true,
        ..Default::default()
    };
    let fs = Fs::mount(dev.clone(), ro).unwrap();
    for m in 0..file_mib {
        assert_eq!(fs.read_direct(ino, m << 20, &mut buf).unwrap(), MIB);
        assert!(buf[..] == mib(m)[..], "MiB {m}");
    }
    fs.unmount().unwrap();
    let st = dev.stats();
    // 16 or 17 chunks of data: all but the file's first (and one where
    // its extents part) fetched ahead; no chunk fetched twice.
    assert!(st.chunks_read_ahead >= 14, "{st:?}");
    assert!(st.chunk_gets <= st.chunks, "{st:?}");
}

/// A read that spans chunks the cache lacks fetches those after its first
/// beside it (through the read-ahead), even as a device's very first
/// read; with read-ahead off, it fetches them in turn.
#[test]
fn a_read_spanning_chunks_fetches_them_together() {
    let store = written_image();
    for (depth, ahead) in [(4, 3), (0, 0)] {
        let dev = cold(store.clone(), depth);
        // MiB 3 to 12: chunks 0 to 3.
        let mut got = vec![0; 10 * MIB];
        dev.read_at(&mut got, 3 << 20).unwrap();
        for (k, m) in (3..13).enumerate() {
            assert!(got[k * MIB..(k + 1) * MIB] == mib(m)[..], "MiB {m}");
        }
        let st = dev.stats();
        assert_eq!(st.chunk_gets, 4, "read-ahead {depth}: {st:?}");
        assert_eq!(st.chunks_read_ahead, ahead, "read-ahead {depth}: {st:?}");
    }
}

//! Readers' leases on the crate's in-memory store: a read-only open of
//! the live image keeps reading the files of its moment while the writer
//! checkpoints many times and `gc` runs; once it closes (or its lease
//! expires), a sweep deletes what only it kept. A checkpoint between a
//! reader's look and its lease makes it lease the newer manifest; a
//! snapshot dropped while it is open stays readable until it closes.

mod common;

use common::{manifest, mkfs_with, small_checkpoints, BeforePut};
use foliofs::{Fs, MountOptions};
use foliofs_object::layout::{chunk_key, lease_key, manifest_key, Lease, Writer};
use foliofs_object::{
    collect_garbage, forget_snapshot, leases, take_snapshot, InMemory, ObjectDevice, ObjectOptions,
    ObjectStore, Path,
};
use object_store::PutPayload;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn reader() -> ObjectOptions {
    ObjectOptions {
        read_only: true,
        // Two chunks (the least it keeps): the files' chunks are fetched
        // when read, not at the open.
        cache_bytes: 0,
        ..Default::default()
    }
}

fn mkfs(store: Arc<dyn ObjectStore>) -> Arc<ObjectDevice> {
    mkfs_with(store, small_checkpoints())
}

/// 12 files of 600-odd KiB: 7 MiB, over chunks beyond the first.
const FILES: usize = 12;

fn content(i: usize, round: u8) -> Vec<u8> {
    (0..600_000 + i * 4097)
        .map(|k| (k * 31 + i) as u8 ^ round)
        .collect()
}

fn write_all(fs: &Fs, round: u8) {
    for i in 0..FILES {
        let name = format!("f{i}");
        let ino = match fs.lookup(fs.root_ino(), name.as_bytes()) {
            Ok(a) => a.ino,
            Err(_) => {
                fs.create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)
                    .unwrap()
                    .ino
            }
        };
        fs.write(ino, 0, &content(i, round)).unwrap();
        fs.fsync(ino, false).unwrap();
    }
}

/// Every file through `dev` has the bytes of `round`, and fsck finds it
/// clean.
fn check(dev: &Arc<ObjectDevice>, round: u8) {
    let fs = Fs::mount(
        dev.clone(),
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    for i in 0..FILES {
        let a = fs
            .lookup(fs.root_ino(), format!("f{i}").as_bytes())
            .unwrap();
        let mut got = vec![0; a.size as usize];
        assert_eq!(fs.read(a.ino, 0, &mut got).unwrap(), got.len());
        assert!(got == content(i, round), "f{i} is not round {round}");
    }
    fs.unmount().unwrap();
    let r = foliofs::fsck::fsck(dev.clone(), &Default::default(), |_, _| {}).unwrap();
    assert!(r.is_clean(), "{:?}", r.problems);
}

fn exists(store: &Arc<dyn ObjectStore>, key: &Path) -> bool {
    futures::executor::block_on(store.head(key)).is_ok()
}

/// The chunk keys manifest `id` names.
fn chunks_of(store: &Arc<dyn ObjectStore>, id: u64) -> Vec<Path> {
    manifest(store, id)
        .chunks
        .iter()
        .map(|(&i, &v)| chunk_key(&Path::from("img"), i, v))
        .collect()
}

/// A reader opens the live image; the writer rewrites every file and
/// checkpoints many times, and gc runs: the reader's manifest and chunks
/// are all still there and it reads the files of its moment, fsck
/// clean. After it closes, gc deletes them; an expired lease keeps
/// nothing and gc deletes it too.
#[test]
fn a_readers_lease_keeps_its_objects_until_it_closes() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let prefix = Path::from("img");
    let dev = mkfs(store.clone());
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    write_all(&fs, 0);

    let r = Arc::new(ObjectDevice::open(store.clone(), prefix.clone(), reader()).unwrap());
    let m = r.stats().manifest;
    let held = chunks_of(&store, m);
    let listed = leases(store.clone(), &prefix).unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(Some(&listed[0].key), r.stats().lease.as_ref());
    assert_eq!(listed[0].manifest, m);
    assert_eq!(listed[0].wal_end, Some(r.stats().next_wal), "what it read");

    let before = dev.stats().checkpoints;
    for round in 1..4 {
        write_all(&fs, round);
        dev.checkpoint_now().unwrap();
        collect_garbage(store.clone(), &prefix).unwrap();
    }
    assert!(
        dev.stats().checkpoints >= before + 3,
        "the writer checkpointed: {:?}",
        dev.stats()
    );
    let swept = collect_garbage(store.clone(), &prefix).unwrap();
    assert_eq!(swept.leases, 1, "{swept:?}");
    let replaced: Vec<&Path> = held
        .iter()
        .filter(|k| !chunks_of(&store, dev.stats().manifest).contains(k))
        .collect();
    assert!(
        !replaced.is_empty(),
        "the writer replaced the reader's chunks"
    );
    assert!(exists(&store, &manifest_key(&prefix, m)));
    for k in &held {
        assert!(exists(&store, k), "{k} kept for the reader");
    }
    check(&r, 0);

    r.close().unwrap();
    assert!(r.stats().lease.is_none());
    assert!(leases(store.clone(), &prefix).unwrap().is_empty());
    // A reader that died long ago: its lease keeps nothing.
    let dead = lease_key(&prefix, "gone-1-0");
    let lease = Lease {
        format: 1,
        manifest: m,
        wal_start: 1,
        wal_end: None,
        holder: Writer {
            host: "gone".into(),
            pid: 1,
            since: 0,
            at: None,
        },
        expires: 1,
    };
    futures::executor::block_on(store.put(&dead, PutPayload::from(lease.encode()))).unwrap();
    let swept = collect_garbage(store.clone(), &prefix).unwrap();
    assert_eq!(swept.leases, 0, "{swept:?}");
    assert!(!exists(&store, &dead), "the expired lease is deleted");
    assert!(!exists(&store, &manifest_key(&prefix, m)));
    for k in replaced {
        assert!(!exists(&store, k), "{k} swept once the reader closed");
    }
    drop(r);

    // The writer's image is whole, and a new reader sees round 3.
    let r = Arc::new(ObjectDevice::open(store.clone(), prefix.clone(), reader()).unwrap());
    check(&r, 3);
    drop(r);
    assert!(
        leases(store.clone(), &prefix).unwrap().is_empty(),
        "dropped, not closed: the lease is deleted all the same"
    );
    fs.unmount().unwrap();
    dev.close().unwrap();
}

/// The writer checkpoints (deleting what the manifest before replaced)
/// after a reader has read the newest manifest and before its lease is
/// there: the reader finds the newer manifest and leases that one, and
/// reads whole while the writer goes on.
#[test]
fn a_checkpoint_between_a_readers_look_and_its_lease_makes_it_lease_again() {
    let inner = Arc::new(InMemory::new());
    let store: Arc<dyn ObjectStore> = inner.clone();
    let prefix = Path::from("img");
    let dev = mkfs(store.clone());
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
    write_all(&fs, 0);
    let seen = dev.stats().manifest;
    let (writer, folds) = (fs.clone(), dev.clone());
    let checkpointed = Arc::new(AtomicU64::new(0));
    let hook = parking_lot::Mutex::new(Some({
        let checkpointed = checkpointed.clone();
        move || {
            write_all(&writer, 1);
            folds.checkpoint_now().unwrap();
            checkpointed.store(folds.stats().manifest, Ordering::SeqCst);
        }
    }));
    let hooked: Arc<dyn ObjectStore> = Arc::new(BeforePut::new(inner, move |location| {
        if location.as_ref().contains("/lease/") {
            if let Some(hook) = hook.lock().take() {
                std::thread::spawn(hook).join().unwrap();
            }
        }
        Ok(())
    }));
    let r = Arc::new(ObjectDevice::open(hooked, prefix.clone(), reader()).unwrap());
    assert!(dev.stats().manifest > seen, "the hook checkpointed");
    // Leased again at that checkpoint's manifest or a later one (the
    // engine's own background work may flush, and a checkpoint follow,
    // before the reader looks again).
    let leased = r.stats().manifest;
    assert!(
        leased >= checkpointed.load(Ordering::SeqCst) && leased <= dev.stats().manifest,
        "leased again at manifest {leased}: {:?}",
        dev.stats()
    );
    let listed = leases(store.clone(), &prefix).unwrap();
    assert_eq!(listed.len(), 1, "one lease, rewritten: {listed:?}");
    assert_eq!(listed[0].manifest, r.stats().manifest);
    write_all(&fs, 2);
    collect_garbage(store.clone(), &prefix).unwrap();
    check(&r, 1);
    r.close().unwrap();
    Arc::try_unwrap(fs).ok().unwrap().unmount().unwrap();
    dev.close().unwrap();
}

/// A snapshot open holds a lease too: the snapshot deleted and swept
/// while it is open, it reads whole; closed, the next sweep deletes its
/// objects.
#[test]
fn a_snapshot_deleted_while_open_stays_readable_until_closed() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let prefix = Path::from("img");
    let dev = mkfs(store.clone());
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    write_all(&fs, 0);
    let at = take_snapshot(store.clone(), &prefix).unwrap();
    let r = Arc::new(
        ObjectDevice::open(
            store.clone(),
            prefix.clone(),
            ObjectOptions {
                snapshot: Some(at),
                ..reader()
            },
        )
        .unwrap(),
    );
    let listed = leases(store.clone(), &prefix).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].wal_end, Some(at));
    let held = chunks_of(&store, r.stats().manifest);
    write_all(&fs, 1);
    forget_snapshot(store.clone(), &prefix, at).unwrap();
    collect_garbage(store.clone(), &prefix).unwrap();
    check(&r, 0);
    r.close().unwrap();
    collect_garbage(store.clone(), &prefix).unwrap();
    let now = chunks_of(&store, dev.stats().manifest);
    for k in held.iter().filter(|k| !now.contains(k)) {
        assert!(!exists(&store, k), "{k} swept once the snapshot closed");
    }
    fs.unmount().unwrap();
    dev.close().unwrap();
}

/// A store that refuses the lease (read-only credentials, a replica
/// down): the reader opens and reads all the same, without one.
#[test]
fn a_lease_refused_by_the_store_does_not_stop_a_reader() {
    let inner = Arc::new(InMemory::new());
    let store: Arc<dyn ObjectStore> = inner.clone();
    let prefix = Path::from("img");
    let dev = mkfs(store.clone());
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    write_all(&fs, 0);
    let refusing: Arc<dyn ObjectStore> = Arc::new(BeforePut::new(inner, |location| {
        if location.as_ref().contains("/lease/") {
            return Err(object_store::Error::PermissionDenied {
                path: location.to_string(),
                source: "read-only credentials".into(),
            });
        }
        Ok(())
    }));
    let r = Arc::new(ObjectDevice::open(refusing, prefix.clone(), reader()).unwrap());
    assert!(leases(store.clone(), &prefix).unwrap().is_empty());
    check(&r, 0);
    r.close().unwrap();
    fs.unmount().unwrap();
    dev.close().unwrap();
}

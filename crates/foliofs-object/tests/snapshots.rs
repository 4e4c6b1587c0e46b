//! Snapshots and the sweep on the crate's in-memory store: a snapshot
//! reads exactly the files of its moment while the writer goes on and
//! checkpoints; no sweep removes what a kept snapshot reads, and a sweep
//! removes what nothing keeps, a fenced writer's orphans included.

mod common;

use common::{manifest, mkfs_with, small_checkpoints, BeforePut};
use foliofs::device::Device;
use foliofs::{Fs, MountOptions};
use foliofs_object::layout::manifest_key;
use foliofs_object::{
    collect_garbage, forget_snapshot, snapshots, take_snapshot, InMemory, ObjectDevice,
    ObjectError, ObjectOptions, ObjectStore, Path,
};
use futures::TryStreamExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn mkfs(store: Arc<dyn ObjectStore>) -> Arc<ObjectDevice> {
    mkfs_with(store, small_checkpoints())
}

fn content(i: usize, round: u8) -> Vec<u8> {
    (0..5000 + i * 777)
        .map(|k| (k * 31 + i) as u8 ^ round)
        .collect()
}

fn write_fsync(fs: &Fs, name: &str, data: &[u8]) {
    let ino = match fs.lookup(fs.root_ino(), name.as_bytes()) {
        Ok(a) => a.ino,
        Err(_) => {
            fs.create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)
                .unwrap()
                .ino
        }
    };
    fs.write(ino, 0, data).unwrap();
    fs.fsync(ino, false).unwrap();
}

fn open_snapshot(store: &Arc<dyn ObjectStore>, at: u64) -> Result<ObjectDevice, ObjectError> {
    ObjectDevice::open(
        store.clone(),
        Path::from("img"),
        ObjectOptions {
            read_only: true,
            snapshot: Some(at),
            ..Default::default()
        },
    )
}

/// The files in the root of snapshot `at`, with their bytes, and fsck
/// finds it clean.
fn files_of(store: &Arc<dyn ObjectStore>, at: u64) -> Vec<(String, Vec<u8>)> {
    let dev = Arc::new(open_snapshot(store, at).unwrap());
    assert_eq!(dev.stats().snapshot, Some(at));
    assert_eq!(dev.stats().next_wal, at, "no WAL past the snapshot is read");
    let fs = Fs::mount(
        dev.clone(),
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mut out = Vec::new();
    for e in fs.readdir(fs.root_ino(), 0, 10_000).unwrap() {
        let name = String::from_utf8(e.name.clone()).unwrap();
        if name == "." || name == ".." || name == "lost+found" {
            continue;
        }
        let a = fs.lookup(fs.root_ino(), &e.name).unwrap();
        let mut got = vec![0; a.size as usize];
        let n = fs.read(a.ino, 0, &mut got).unwrap();
        assert_eq!(n, got.len(), "{name}");
        out.push((name, got));
    }
    fs.unmount().unwrap();
    let r = foliofs::fsck::fsck(dev, &Default::default(), |_, _| {}).unwrap();
    assert!(r.is_clean(), "fsck of snapshot {at}: {:?}", r.problems);
    out.sort();
    out
}

fn expect(files: &[(usize, u8)]) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = files
        .iter()
        .map(|&(i, r)| (format!("f{i}"), content(i, r)))
        .collect();
    v.sort();
    v
}

fn keys(store: &Arc<dyn ObjectStore>, dir: &str) -> Vec<String> {
    futures::executor::block_on(async {
        let l: Vec<_> = store
            .list(Some(&Path::from(format!("img/{dir}"))))
            .try_collect()
            .await
            .unwrap();
        let mut v: Vec<String> = l.into_iter().map(|m| m.location.to_string()).collect();
        v.sort();
        v
    })
}

/// A snapshot taken while the writer holds the image has every file
/// fsynced before it, and keeps reading exactly those while the writer
/// overwrites, removes and adds files and checkpoints many times, and
/// after it closes. Writes to the snapshot are refused.
#[test]
fn a_snapshot_reads_its_moment_while_the_writer_goes_on() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let dev = mkfs(store.clone());
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    for i in 0..8 {
        write_fsync(&fs, &format!("f{i}"), &content(i, 0));
    }
    let at = take_snapshot(store.clone(), &Path::from("img")).unwrap();
    let moment = expect(&(0..8).map(|i| (i, 0)).collect::<Vec<_>>());
    assert_eq!(files_of(&store, at), moment);

    let before = dev.stats().checkpoints;
    for i in 0..8 {
        write_fsync(&fs, &format!("f{i}"), &content(i, 1));
    }
    dev.checkpoint_now().unwrap();
    fs.unlink(fs.root_ino(), b"f0").unwrap();
    for i in 8..40 {
        write_fsync(&fs, &format!("f{i}"), &content(i, 1));
    }
    dev.checkpoint_now().unwrap();
    fs.sync().unwrap();
    dev.checkpoint_now().unwrap();
    assert!(
        dev.stats().checkpoints >= before + 3,
        "the writer checkpointed: {:?}",
        dev.stats()
    );
    assert_eq!(files_of(&store, at), moment, "while the writer goes on");

    let snap = open_snapshot(&store, at).unwrap();
    let e = snap.write_at(&[1; 4096], 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let rw = ObjectDevice::open(
        store.clone(),
        Path::from("img"),
        ObjectOptions {
            snapshot: Some(at),
            ..Default::default()
        },
    );
    assert!(rw.is_err(), "a snapshot opens read-only only");

    fs.unmount().unwrap();
    dev.close().unwrap();
    assert_eq!(files_of(&store, at), moment, "after the writer closed");
    let listed = snapshots(store.clone(), &Path::from("img")).unwrap();
    assert_eq!(listed.iter().map(|s| s.at).collect::<Vec<_>>(), vec![at]);
    match open_snapshot(&store, at + 1000) {
        Err(ObjectError::NoSnapshot { at: n, .. }) => assert_eq!(n, at + 1000),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a snapshot never taken opened"),
    }
}

/// Two snapshots at two moments, the writer's checkpoints between and
/// after them, then full sweeps: each snapshot still reads its own
/// files. A snapshot dropped and swept leaves only what the newest
/// manifest names; the image reads whole.
#[test]
fn a_sweep_keeps_what_snapshots_read_and_deletes_the_rest() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let prefix = Path::from("img");
    let dev = mkfs(store.clone());
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    for i in 0..20 {
        write_fsync(&fs, &format!("f{i}"), &content(i, 0));
    }
    let first = take_snapshot(store.clone(), &prefix).unwrap();
    for i in 0..20 {
        write_fsync(&fs, &format!("f{i}"), &content(i, 1));
    }
    let second = take_snapshot(store.clone(), &prefix).unwrap();
    assert!(second > first);
    for i in 0..20 {
        write_fsync(&fs, &format!("f{i}"), &content(i, 2));
    }
    let swept = collect_garbage(store.clone(), &prefix).unwrap();
    assert_eq!(swept.snapshots, 2);
    let old = expect(&(0..20).map(|i| (i, 0)).collect::<Vec<_>>());
    let mid = expect(&(0..20).map(|i| (i, 1)).collect::<Vec<_>>());
    assert_eq!(files_of(&store, first), old);
    assert_eq!(files_of(&store, second), mid);

    fs.unmount().unwrap();
    dev.close().unwrap();
    // Both snapshots keep chunk versions the newest manifest replaced.
    let latest = dev.stats().manifest;
    let now = manifest(&store, latest);
    let chunks = keys(&store, "chunk");
    assert!(
        chunks.len() > now.chunks.len(),
        "the snapshots keep replaced chunks: {chunks:?}"
    );
    collect_garbage(store.clone(), &prefix).unwrap();
    assert_eq!(files_of(&store, first), old);
    assert_eq!(files_of(&store, second), mid);

    forget_snapshot(store.clone(), &prefix, first).unwrap();
    forget_snapshot(store.clone(), &prefix, second).unwrap();
    assert!(forget_snapshot(store.clone(), &prefix, second).is_err());
    let swept = collect_garbage(store.clone(), &prefix).unwrap();
    assert!(swept.deleted > 0, "{swept:?}");
    // What is left is what the newest manifest names, and the one
    // before it.
    let mut want: Vec<String> = now
        .chunks
        .iter()
        .map(|(i, v)| format!("img/chunk/{i:010}-{v:020}"))
        .collect();
    want.sort();
    assert_eq!(keys(&store, "chunk"), want);
    assert_eq!(
        keys(&store, "manifest"),
        vec![
            manifest_key(&prefix, latest - 1).to_string(),
            manifest_key(&prefix, latest).to_string()
        ]
    );
    let wal = keys(&store, "wal");
    assert!(wal.is_empty(), "the WAL was folded at close: {wal:?}");
    assert!(keys(&store, "snapshot").is_empty());
    assert!(open_snapshot(&store, first).is_err());

    let dev = Arc::new(ObjectDevice::open(store.clone(), prefix, Default::default()).unwrap());
    let fs = Fs::mount(dev.clone(), MountOptions::default()).unwrap();
    for i in 0..20 {
        let a = fs
            .lookup(fs.root_ino(), format!("f{i}").as_bytes())
            .unwrap();
        let mut got = vec![0; a.size as usize];
        fs.read(a.ino, 0, &mut got).unwrap();
        assert!(got == content(i, 2), "f{i}");
    }
    fs.unmount().unwrap();
    dev.close().unwrap();
}

/// A writer fenced in the middle of a checkpoint leaves the chunks it
/// wrote after the fence: nothing reads them, and a sweep deletes them
/// (even while the new writer holds the image), leaving its image whole.
#[test]
fn a_fenced_writers_orphans_are_swept() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let prefix = Path::from("img");
    let a = mkfs(store.clone());
    let base = 3000 * 4096;
    for k in 0..32u64 {
        a.write_at(&[k as u8 + 1; 4096], base + k * 4096 * 1024 / 4)
            .unwrap();
    }
    a.flush().unwrap();
    let b = ObjectDevice::open(
        store.clone(),
        prefix.clone(),
        ObjectOptions {
            takeover: true,
            ..small_checkpoints()
        },
    )
    .unwrap();
    let claim = b.stats().manifest;
    // A's close checkpoints: its chunks go out, then its manifest is
    // found taken by B's claim.
    let e = a.close().unwrap_err();
    assert!(e.to_string().contains("fenced"), "{e}");
    let orphans: Vec<String> = keys(&store, "chunk")
        .into_iter()
        .filter(|k| k.ends_with(&format!("-{claim:020}")))
        .collect();
    assert!(!orphans.is_empty(), "the fenced checkpoint left chunks");
    let swept = collect_garbage(store.clone(), &prefix).unwrap();
    assert!(swept.deleted >= orphans.len() as u64, "{swept:?}");
    let left = keys(&store, "chunk");
    assert!(
        orphans.iter().all(|o| !left.contains(o)),
        "orphans swept: {left:?}"
    );
    // B reads what A flushed before the fence, writes on, and closes.
    let mut got = vec![0; 4096];
    for k in 0..32u64 {
        b.read_at(&mut got, base + k * 4096 * 1024 / 4).unwrap();
        assert_eq!(got, vec![k as u8 + 1; 4096], "block {k}");
    }
    b.write_at(&[99; 4096], base).unwrap();
    b.close().unwrap();
    collect_garbage(store.clone(), &prefix).unwrap();
    let c = ObjectDevice::open(store, prefix, Default::default()).unwrap();
    c.read_at(&mut got, base).unwrap();
    assert_eq!(got, vec![99; 4096]);
    c.read_at(&mut got, base + 4096 * 1024 / 4).unwrap();
    assert_eq!(got, vec![2; 4096]);
}

/// The writer checkpoints (and deletes the WAL it folded) after a
/// snapshot has looked at the image and before its marker is there: the
/// snapshot finds the newer manifest, drops that marker and is taken
/// again, holding everything flushed by then, and opens whole.
#[test]
fn a_checkpoint_between_a_snapshots_look_and_its_marker_retakes_it() {
    let inner = Arc::new(InMemory::new());
    let writer_store: Arc<dyn ObjectStore> = inner.clone();
    let dev = mkfs(writer_store.clone());
    let fs = Arc::new(Fs::mount(dev.clone(), MountOptions::default()).unwrap());
    for i in 0..8 {
        write_fsync(&fs, &format!("f{i}"), &content(i, 0));
    }
    let checkpoints = dev.stats().checkpoints;
    let (writer, folds) = (fs.clone(), dev.clone());
    // Before the snapshot's marker is written: the writer goes on and
    // checkpoints.
    let checkpointed = Arc::new(AtomicU64::new(0));
    let hook = parking_lot::Mutex::new(Some({
        let checkpointed = checkpointed.clone();
        move || {
            for i in 8..40 {
                write_fsync(&writer, &format!("f{i}"), &content(i, 0));
            }
            folds.checkpoint_now().unwrap();
            checkpointed.store(folds.stats().manifest, Ordering::SeqCst);
        }
    }));
    let hooked: Arc<dyn ObjectStore> = Arc::new(BeforePut::new(inner, move |location| {
        if location.as_ref().contains("/snapshot/") {
            if let Some(hook) = hook.lock().take() {
                std::thread::spawn(hook).join().unwrap();
            }
        }
        Ok(())
    }));
    let at = take_snapshot(hooked, &Path::from("img")).unwrap();
    assert!(
        dev.stats().checkpoints > checkpoints,
        "the hook checkpointed: {:?}",
        dev.stats()
    );
    let listed = snapshots(writer_store.clone(), &Path::from("img")).unwrap();
    assert_eq!(
        listed.iter().map(|s| s.at).collect::<Vec<_>>(),
        vec![at],
        "the marker from before the checkpoint was dropped"
    );
    // Taken again at that checkpoint's manifest or a later one (the
    // engine's own background work may flush, and a checkpoint follow,
    // before the retake looks: CI on 7544dc2, the machine loaded).
    let retaken = listed[0].manifest;
    assert!(
        retaken >= checkpointed.load(Ordering::SeqCst) && retaken <= dev.stats().manifest,
        "the marker names manifest {retaken}: {:?}",
        dev.stats()
    );
    let all = expect(&(0..40).map(|i| (i, 0)).collect::<Vec<_>>());
    assert_eq!(files_of(&writer_store, at), all);
    Arc::try_unwrap(fs).ok().unwrap().unmount().unwrap();
    dev.close().unwrap();
    assert_eq!(files_of(&writer_store, at), all);
}

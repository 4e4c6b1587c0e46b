//! Snapshots, and the sweep that deletes what nothing keeps.
//!
//! A snapshot is the image as of one WAL number `at`: the chunks of a
//! manifest `M` and the WAL objects from `M.wal_start` up to `at` (not
//! included), which is exactly what a writer had flushed when the
//! snapshot was taken. A manifest alone would lag that by up to a
//! checkpoint's worth of WAL (64 MiB), and only the writer can write a
//! manifest. Its marker, `snapshot/AT-M`, is created only if absent and
//! never changed; `URL@AT` names the snapshot.
//!
//! What keeps an object from a sweep: the newest manifest (its chunks,
//! the WAL from its `wal_start` on, it and the one before it), chunk
//! versions newer than the newest manifest (a checkpoint writes its
//! chunks before its manifest), every marker (its manifest, that
//! manifest's chunks, and its WAL range) and every fresh reader's lease
//! (the same, see `lease`). Everything else under the
//! prefix is garbage: WAL and chunks a checkpoint replaced, manifests
//! older than the one before the newest, the chunks of a checkpoint cut
//! before its manifest, and those a fenced writer wrote after its fence
//! (their version is the number of the claim that fenced it, which names
//! no chunk of its own). A chunk a flush wrote whole (its version
//! `FLUSHED | seq`) is kept while WAL `seq` may be read (from the newest
//! manifest's `wal_start` on, or in a kept range) or a kept manifest
//! names it; one whose flush failed before its WAL object was written is
//! garbage once `wal_start` has passed its number.
//!
//! Why a marker taken beside a live writer is safe: a checkpoint lists the
//! markers only after it has created its manifest, and deletes only what
//! that manifest replaced. Taking a snapshot creates its marker and then
//! checks that `M` is still the newest manifest: if it is, every later
//! checkpoint lists after the marker was made and keeps what it holds;
//! if one does, the marker is deleted and taken again from the newer
//! manifest. A full sweep (`foliofs gc`) reads the newest manifest before
//! it lists the markers, so it too sees every marker whose manifest is
//! older than the one it read.

use crate::layout::{
    flushed_seq, manifest_key, pair_of, snapshot_key, Lease, Manifest, SnapshotMarker, FENCE_BYTES,
    OBJECT_FORMAT,
};
use crate::lease;
use crate::markers::{markers, SnapshotInfo};
use crate::store::{
    create_mode, image_manifest, is_not_found, newest_manifest, now_secs, runtime, this_writer,
    wal_numbers,
};
use crate::ObjectError;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// What one sweep did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Swept {
    /// Objects under the prefix it looked at.
    pub objects: u64,
    pub deleted: u64,
    pub deleted_bytes: u64,
    /// Snapshot markers found (each keeping its objects).
    pub snapshots: u64,
    /// Fresh readers' leases found (each keeping its objects); expired
    /// ones are deleted and counted in `deleted`.
    pub leases: u64,
}

/// One thing that keeps a manifest, its chunks and a WAL range from
/// every sweep: a snapshot marker or a fresh lease.
#[derive(Clone, Debug)]
pub(crate) struct Hold {
    pub manifest: u64,
    /// [start, end).
    pub wal: (u64, u64),
    /// What holds, for messages.
    pub what: String,
}

/// What keeps objects under `prefix`: the snapshot markers, then the
/// leases (listed in that order: see `lease`), and the leases expired by
/// `now` (which keep nothing).
pub(crate) struct Holders {
    pub snapshots: Vec<SnapshotInfo>,
    pub leases: Vec<(Path, Lease)>,
    pub expired: Vec<Path>,
}

impl Holders {
    pub(crate) async fn list(
        store: &dyn ObjectStore,
        prefix: &Path,
        now: u64,
    ) -> Result<Holders, ObjectError> {
        let snapshots = markers(store, prefix).await?;
        let (leases, expired): (Vec<_>, Vec<_>) = lease::list(store, prefix)
            .await?
            .into_iter()
            .partition(|(_, l)| l.expires > now);
        Ok(Holders {
            snapshots,
            leases,
            expired: expired.into_iter().map(|(k, _)| k).collect(),
        })
    }

    pub(crate) fn holds(&self) -> Vec<Hold> {
        let snaps = self.snapshots.iter().map(|s| Hold {
            manifest: s.manifest,
            wal: (s.wal_start, s.at),
            what: format!("snapshot {}", s.at),
        });
        let leases = self.leases.iter().map(|(key, l)| Hold {
            manifest: l.manifest,
            wal: l.wal(),
            what: format!("the reader of lease {key}"),
        });
        snaps.chain(leases).collect()
    }
}

/// What kept snapshots hold: no sweep deletes it.
#[derive(Debug, Default)]
pub(crate) struct Kept {
    pub manifests: BTreeSet<u64>,
    /// (chunk index, version).
    pub chunks: HashSet<(u64, u64)>,
    /// WAL ranges [start, end).
    pub wal: Vec<(u64, u64)>,
}

impl Kept {
    pub fn wal(&self, seq: u64) -> bool {
        self.wal.iter().any(|&(a, b)| (a..b).contains(&seq))
    }
}

/// What `holds` keep. Their manifests' chunk maps come from `cache` when
/// there (a manifest never changes), and the cache keeps only theirs.
pub(crate) async fn kept(
    store: &dyn ObjectStore,
    prefix: &Path,
    holds: &[Hold],
    cache: &mut HashMap<u64, BTreeMap<u64, u64>>,
) -> Result<Kept, ObjectError> {
    let mut k = Kept::default();
    for s in holds {
        k.manifests.insert(s.manifest);
        k.wal.push(s.wal);
        if let Entry::Vacant(slot) = cache.entry(s.manifest) {
            let key = manifest_key(prefix, s.manifest);
            match store.get(&key).await {
                Ok(r) => {
                    slot.insert(Manifest::decode(&key, &r.bytes().await?)?.chunks);
                }
                Err(e) if is_not_found(&e) => {
                    log::warn!("{key}: gone, so {} cannot be read", s.what);
                    continue;
                }
                Err(e) => return Err(e.into()),
            }
        }
        k.chunks
            .extend(cache[&s.manifest].iter().map(|(&i, &v)| (i, v)));
    }
    cache.retain(|m, _| k.manifests.contains(m));
    Ok(k)
}

/// Keep the image as it is now, everything flushed so far, as a snapshot;
/// its number (`URL@N`).
pub(crate) async fn take(store: &dyn ObjectStore, prefix: &Path) -> Result<u64, ObjectError> {
    loop {
        let (id, m) = image_manifest(store, prefix).await?;
        // The WAL as flushed: numbers from wal_start on with no gap.
        let mut at = m.wal_start;
        for s in wal_numbers(store, prefix, m.wal_start).await? {
            if s != at {
                break;
            }
            at += 1;
        }
        let key = snapshot_key(prefix, at, id);
        let marker = SnapshotMarker {
            format: OBJECT_FORMAT,
            wal_start: m.wal_start,
            taken: now_secs(),
            host: this_writer(&None).host,
        };
        // Already there: the same moment from the same manifest, taken
        // before; checked as a new one is.
        let ours = match store
            .put_opts(&key, PutPayload::from(marker.encode()), create_mode())
            .await
        {
            Ok(_) => true,
            Err(object_store::Error::AlreadyExists { .. }) => false,
            Err(e) => return Err(e.into()),
        };
        // The newest manifest, by listing: a manifest after `id` may be
        // deleted already, by a later checkpoint, but the newest never is.
        if newest_manifest(store, prefix).await? == Some(id) {
            return Ok(at);
        }
        // A checkpoint or claim came between: it may have swept what the
        // marker was to keep before the marker was there.
        if ours {
            match store.delete(&key).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Drop snapshot `at` (every marker of it): what only it kept is garbage
/// for the next sweep.
pub(crate) async fn drop_snapshot(
    store: &dyn ObjectStore,
    prefix: &Path,
    at: u64,
) -> Result<(), ObjectError> {
    let mine: Vec<_> = markers(store, prefix)
        .await?
        .into_iter()
        .filter(|s| s.at == at)
        .collect();
    if mine.is_empty() {
        return Err(ObjectError::NoSnapshot {
            prefix: prefix.to_string(),
            at,
        });
    }
    for s in mine {
        match store.delete(&snapshot_key(prefix, s.at, s.manifest)).await {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Delete every object under `prefix` that neither the newest manifest
/// nor a snapshot nor a fresh lease keeps (see the module's comment),
/// and the expired leases. Safe beside a live writer and live readers
/// (of the image as of their open, or of a snapshot).
pub(crate) async fn sweep(store: &dyn ObjectStore, prefix: &Path) -> Result<Swept, ObjectError> {
    let (id, latest) = image_manifest(store, prefix).await?;
    let holders = Holders::list(store, prefix, now_secs()).await?;
    let kept = kept(store, prefix, &holders.holds(), &mut HashMap::new()).await?;
    let all: Vec<_> = store.list(Some(prefix)).try_collect().await?;
    let mut swept = Swept {
        snapshots: holders.snapshots.len() as u64,
        leases: holders.leases.len() as u64,
        ..Default::default()
    };
    for meta in all {
        swept.objects += 1;
        let Some(parts) = meta.location.prefix_match(prefix) else {
            continue;
        };
        let parts: Vec<String> = parts.map(|p| p.as_ref().to_string()).collect();
        let [dir, name] = &parts[..] else {
            continue;
        };
        let number = || name.parse::<u64>().ok();
        let garbage = match dir.as_str() {
            "manifest" => number().is_some_and(|k| k + 1 < id && !kept.manifests.contains(&k)),
            "wal" => number()
                .is_some_and(|s| s < latest.wal_start && !kept.wal(s) && meta.size != FENCE_BYTES),
            "chunk" => pair_of(&meta.location).is_some_and(|(i, v)| {
                let unnamed = latest.chunks.get(&i) != Some(&v) && !kept.chunks.contains(&(i, v));
                match flushed_seq(v) {
                    // A flush's: the WAL from `wal_start` on may name it
                    // (or its try failed, which a later sweep sees).
                    Some(seq) => unnamed && seq < latest.wal_start && !kept.wal(seq),
                    None => unnamed && v <= id,
                }
            }),
            "lease" => holders.expired.contains(&meta.location),
            _ => false,
        };
        if garbage {
            match store.delete(&meta.location).await {
                Ok(()) => {}
                Err(e) if is_not_found(&e) => continue,
                Err(e) => return Err(e.into()),
            }
            swept.deleted += 1;
            swept.deleted_bytes += meta.size;
        }
    }
    Ok(swept)
}

/// Keep the image under `prefix` as it is now (everything flushed) as a
/// snapshot, and return its number: open it with
/// `ObjectOptions { read_only: true, snapshot: Some(n), .. }`, or mount
/// `URL@n`.
pub fn take_snapshot(store: Arc<dyn ObjectStore>, prefix: &Path) -> Result<u64, ObjectError> {
    runtime()?.block_on(take(&*store, prefix))
}

/// The snapshots kept under `prefix`, oldest first.
pub fn snapshots(
    store: Arc<dyn ObjectStore>,
    prefix: &Path,
) -> Result<Vec<SnapshotInfo>, ObjectError> {
    runtime()?.block_on(markers(&*store, prefix))
}

/// Drop snapshot `at`, so that a sweep may delete what only it kept.
pub fn forget_snapshot(
    store: Arc<dyn ObjectStore>,
    prefix: &Path,
    at: u64,
) -> Result<(), ObjectError> {
    runtime()?.block_on(drop_snapshot(&*store, prefix, at))
}

/// Delete what nothing keeps under `prefix` (`foliofs gc`).
pub fn collect_garbage(store: Arc<dyn ObjectStore>, prefix: &Path) -> Result<Swept, ObjectError> {
    runtime()?.block_on(sweep(&*store, prefix))
}

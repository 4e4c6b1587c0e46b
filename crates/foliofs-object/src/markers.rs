//! Reading the snapshot markers: what snapshots there are, and the
//! manifest a snapshot is read from. Below both the sweep (`keep`, which
//! keeps what they name) and the readers' leases (`lease`, which lease a
//! snapshot's manifest before reading it).

use crate::layout::{manifest_key, pair_of, Damaged, Manifest, SnapshotMarker};
use crate::store::is_not_found;
use crate::ObjectError;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStore;

/// A kept snapshot, as its marker names it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SnapshotInfo {
    /// Its number (`URL@at`): the first WAL number it does not hold.
    pub at: u64,
    /// The manifest whose chunks it reads.
    pub manifest: u64,
    /// The first WAL number it reads.
    pub wal_start: u64,
    /// Seconds since the epoch when it was taken.
    pub taken: u64,
    pub host: String,
}

/// Every snapshot marker under `prefix`, read, in order.
pub(crate) async fn markers(
    store: &dyn ObjectStore,
    prefix: &Path,
) -> Result<Vec<SnapshotInfo>, ObjectError> {
    let dir = prefix.child("snapshot");
    let metas: Vec<_> = store.list(Some(&dir)).try_collect().await?;
    let mut out = Vec::with_capacity(metas.len());
    for meta in metas {
        let Some((at, manifest)) = pair_of(&meta.location) else {
            continue;
        };
        let bytes = match store.get(&meta.location).await {
            Ok(r) => r.bytes().await?,
            // Dropped between the list and the read.
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e.into()),
        };
        let m = SnapshotMarker::decode(&meta.location, &bytes)?;
        out.push(SnapshotInfo {
            at,
            manifest,
            wal_start: m.wal_start,
            taken: m.taken,
            host: m.host,
        });
    }
    out.sort_by_key(|s| (s.at, s.manifest));
    Ok(out)
}

/// Snapshot `at`'s manifest (the newest of its markers whose manifest is
/// there), with its number.
pub(crate) async fn snapshot_manifest(
    store: &dyn ObjectStore,
    prefix: &Path,
    at: u64,
) -> Result<(u64, Manifest), ObjectError> {
    let mine: Vec<_> = markers(store, prefix)
        .await?
        .into_iter()
        .filter(|s| s.at == at)
        .collect();
    let mut gone = None;
    for s in mine.iter().rev() {
        let key = manifest_key(prefix, s.manifest);
        match store.get(&key).await {
            Ok(r) => return Ok((s.manifest, Manifest::decode(&key, &r.bytes().await?)?)),
            Err(e) if is_not_found(&e) => gone = Some(key),
            Err(e) => return Err(e.into()),
        }
    }
    match gone {
        Some(key) => Err(Damaged {
            key: key.to_string(),
            what: format!("missing: snapshot {at} is read from it"),
        }
        .into()),
        None => Err(ObjectError::NoSnapshot {
            prefix: prefix.to_string(),
            at,
        }),
    }
}

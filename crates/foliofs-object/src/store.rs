//! The image's plain requests to its store, which the device, the
//! snapshots and the leases all make: the runtime they run on, the
//! newest manifest, the WAL numbers present, a create-if-absent PUT, and
//! the name a writer or reader goes by. Everything above imports this;
//! this imports only the layout.

use crate::layout::{manifest_key, number_of, Manifest, Writer};
use crate::ObjectError;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions};
use std::io;

pub(crate) fn runtime() -> io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("foliofs-object")
        .enable_all()
        .build()
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub(crate) fn this_writer(at: &Option<String>) -> Writer {
    let mut name = [0u8; 256];
    // SAFETY: gethostname writes at most the given length into the buffer.
    let host = if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0 {
        let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
        String::from_utf8_lossy(&name[..end]).into_owned()
    } else {
        "unknown".into()
    };
    Writer {
        host,
        pid: std::process::id(),
        since: now_secs(),
        at: at.clone(),
    }
}

pub(crate) fn create_mode() -> PutOptions {
    PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    }
}

/// The newest manifest under `prefix`, with its number.
pub(crate) async fn latest_manifest(
    store: &dyn ObjectStore,
    prefix: &Path,
) -> Result<Option<(u64, Manifest)>, ObjectError> {
    let Some(id) = newest_manifest(store, prefix).await? else {
        return Ok(None);
    };
    let key = manifest_key(prefix, id);
    let bytes = store.get(&key).await?.bytes().await?;
    Ok(Some((id, Manifest::decode(&key, &bytes)?)))
}

/// The newest manifest under `prefix`, with its number; no manifest is
/// no image there.
pub(crate) async fn image_manifest(
    store: &dyn ObjectStore,
    prefix: &Path,
) -> Result<(u64, Manifest), ObjectError> {
    latest_manifest(store, prefix)
        .await?
        .ok_or_else(|| ObjectError::NoImage {
            prefix: prefix.to_string(),
        })
}

/// The WAL numbers present from `from` on, in order.
pub(crate) async fn wal_numbers(
    store: &dyn ObjectStore,
    prefix: &Path,
    from: u64,
) -> Result<Vec<u64>, ObjectError> {
    let dir = prefix.child("wal");
    let metas: Vec<_> = store.list(Some(&dir)).try_collect().await?;
    let mut seqs: Vec<u64> = metas
        .iter()
        .filter_map(|m| number_of(&m.location))
        .filter(|&s| s >= from)
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

pub(crate) fn is_not_found(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::NotFound { .. })
}

/// The number of the newest manifest under `prefix`, without reading it.
pub(crate) async fn newest_manifest(
    store: &dyn ObjectStore,
    prefix: &Path,
) -> Result<Option<u64>, ObjectError> {
    let metas: Vec<_> = store
        .list(Some(&prefix.child("manifest")))
        .try_collect()
        .await?;
    Ok(metas.iter().filter_map(|m| number_of(&m.location)).max())
}

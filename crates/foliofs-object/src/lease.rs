//! Readers' leases: what a read-only open reads is kept from every sweep
//! while it is open.
//!
//! A read-only open of the image as of now reads manifest M, then the
//! WAL from M's `wal_start` on, and fetches M's chunks as the engine asks
//! for them, for as long as it is open. Meanwhile the writer's
//! checkpoints replace M's chunks and fold the WAL, and a checkpoint's
//! sweep or `foliofs gc` would delete them under the reader. A lease,
//! `lease/HOST-PID-NANOS`, names what the open reads; every sweep keeps
//! what a fresh lease names exactly as it keeps what a snapshot marker
//! names (`keep`).
//!
//! Why a lease taken beside a live writer is safe (the argument of
//! `keep::take`): the lease is written before anything is read, naming
//! the newest manifest M; then the manifest list is read again. If M is
//! still the newest, every checkpoint after M creates its manifest after
//! the lease was there, and lists the leases after that: it keeps M's
//! objects. A `foliofs gc` reads the newest manifest before it lists the
//! leases, so one that missed the lease read M or older, and keeps what M
//! names. If a newer manifest is there, its checkpoint may have listed
//! before the lease was written and deleted M's replaced chunks: the
//! lease is written again, naming the newer one. A snapshot's lease
//! checks that the snapshot's marker is still there after it is written,
//! so that `foliofs snapshot --delete` and a sweep cannot take the
//! snapshot from under a reader either (sweeps list markers before
//! leases).
//!
//! A lease lives `LEASE_LIFE_SECS` and is renewed every
//! `LEASE_RENEW_SECS` from the device's runtime: a reader that dies
//! leaves a lease that keeps nothing after two minutes, and `foliofs gc`
//! deletes it. Expiry is judged by the sweeper's clock against the
//! holder's, so the two must agree to well within the 90 s between the
//! last renewal a live holder makes and its lease's end. A reader whose
//! renewals fail for longer than that (the store unreachable) may find
//! its chunks swept when the store returns: its reads fail, naming the
//! missing key; they never return other data.
//!
//! A lease that cannot be written at all (read-only credentials, a store
//! refusing writes: SeaweedFS with a replica down) does not stop the
//! open: it reads without one, as a warning says, at that risk, and the
//! renewals go on trying to write it.

use crate::layout::{lease_key, snapshot_key, Lease, Manifest, Writer, OBJECT_FORMAT};
use crate::markers::snapshot_manifest;
use crate::store::{image_manifest, is_not_found, newest_manifest, now_secs, this_writer};
use crate::ObjectError;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Seconds a lease keeps its objects after it was last written.
pub const LEASE_LIFE_SECS: u64 = 120;

/// Seconds between two renewals: three may fail in a row before a live
/// reader's lease runs out.
pub const LEASE_RENEW_SECS: u64 = 30;

/// Times a lease is written again because a checkpoint came between it
/// and the look after it; a writer checkpointing faster than a reader
/// can list and PUT wins after that many and the open fails.
const LEASE_TRIES: usize = 64;

/// A lease found under the prefix (`foliofs stat`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LeaseInfo {
    pub key: String,
    pub manifest: u64,
    pub wal_start: u64,
    pub wal_end: Option<u64>,
    pub holder: Writer,
    pub expires: u64,
}

/// Every lease under `prefix`, read, with its key.
pub(crate) async fn list(
    store: &dyn ObjectStore,
    prefix: &Path,
) -> Result<Vec<(Path, Lease)>, ObjectError> {
    let metas: Vec<_> = store
        .list(Some(&prefix.child("lease")))
        .try_collect()
        .await?;
    let mut out = Vec::with_capacity(metas.len());
    for meta in metas {
        let bytes = match store.get(&meta.location).await {
            Ok(r) => r.bytes().await?,
            // Released between the list and the read.
            Err(e) if is_not_found(&e) => continue,
            Err(e) => return Err(e.into()),
        };
        let lease = Lease::decode(&meta.location, &bytes)?;
        out.push((meta.location, lease));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// A lease this process holds: written, renewed from the device's
/// runtime, deleted at `release`.
pub(crate) struct Held {
    store: Arc<dyn ObjectStore>,
    key: Path,
    /// The lease as last written; the renewal task rewrites it.
    lease: Arc<Mutex<Lease>>,
    renewal: Option<tokio::task::JoinHandle<()>>,
    /// The store refused it at the open: the open does not wait on it
    /// again (each refusal costs the client's retries, up to 30 s); the
    /// renewals go on trying.
    refused: bool,
}

/// A key no other lease has: this host, pid, the time, and a count
/// within the process.
fn fresh_key(prefix: &Path, holder: &Writer) -> Path {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    lease_key(
        prefix,
        &format!("{}-{}-{nanos:x}-{n}", holder.host, holder.pid),
    )
}

async fn put(store: &dyn ObjectStore, key: &Path, lease: &Lease) -> Result<(), ObjectError> {
    store
        .put(key, PutPayload::from(lease.encode()))
        .await
        .map(drop)
        .map_err(ObjectError::from)
}

impl Held {
    fn new(store: Arc<dyn ObjectStore>, prefix: &Path, mount_point: &Option<String>) -> Held {
        let holder = this_writer(mount_point);
        Held {
            key: fresh_key(prefix, &holder),
            store,
            lease: Arc::new(Mutex::new(Lease {
                format: OBJECT_FORMAT,
                manifest: 0,
                wal_start: 0,
                wal_end: None,
                holder,
                expires: 0,
            })),
            renewal: None,
            refused: false,
        }
    }

    /// Write the lease as it now reads `manifest` and the WAL from
    /// `wal_start` to `wal_end`.
    async fn write(
        &self,
        manifest: u64,
        wal_start: u64,
        wal_end: Option<u64>,
    ) -> Result<(), ObjectError> {
        let lease = {
            let mut l = self.lease.lock();
            l.manifest = manifest;
            l.wal_start = wal_start;
            l.wal_end = wal_end;
            l.expires = now_secs() + LEASE_LIFE_SECS;
            l.clone()
        };
        put(&*self.store, &self.key, &lease).await
    }

    /// Lease the newest manifest under `prefix` and the WAL after it, and
    /// read that manifest (see the module's comment).
    pub(crate) async fn newest(
        store: Arc<dyn ObjectStore>,
        prefix: &Path,
        mount_point: &Option<String>,
    ) -> Result<(Held, u64, Manifest), ObjectError> {
        let mut held = Held::new(store.clone(), prefix, mount_point);
        for _ in 0..LEASE_TRIES {
            let (id, m) = image_manifest(&*store, prefix).await?;
            if let Err(e) = held.write(id, m.wal_start, None).await {
                held.unwritten(&e);
                return Ok((held, id, m));
            }
            if newest_manifest(&*store, prefix).await? == Some(id) {
                return Ok((held, id, m));
            }
        }
        held.delete().await;
        Err(ObjectError::Invalid(format!(
            "{prefix}: the writer checkpointed {LEASE_TRIES} times while a reader's \
             lease was written; try again"
        )))
    }

    /// Lease snapshot `at` (its manifest and its WAL), and read its
    /// manifest.
    pub(crate) async fn snapshot(
        store: Arc<dyn ObjectStore>,
        prefix: &Path,
        at: u64,
        mount_point: &Option<String>,
    ) -> Result<(Held, u64, Manifest), ObjectError> {
        let mut held = Held::new(store.clone(), prefix, mount_point);
        for _ in 0..LEASE_TRIES {
            let (id, m) = match snapshot_manifest(&*store, prefix, at).await {
                Ok(found) => found,
                Err(e) => {
                    held.delete().await;
                    return Err(e);
                }
            };
            if let Err(e) = held.write(id, m.wal_start, Some(at)).await {
                held.unwritten(&e);
                return Ok((held, id, m));
            }
            // The marker still there: whatever sweeps next sees it or
            // this lease.
            match store.head(&snapshot_key(prefix, at, id)).await {
                Ok(_) => return Ok((held, id, m)),
                Err(e) if is_not_found(&e) => continue,
                Err(e) => {
                    held.delete().await;
                    return Err(e.into());
                }
            }
        }
        held.delete().await;
        Err(ObjectError::NoSnapshot {
            prefix: prefix.to_string(),
            at,
        })
    }

    fn unwritten(&mut self, e: &ObjectError) {
        self.refused = true;
        log::warn!(
            "{}: lease not written ({e}); reading without one: a checkpoint or \
             foliofs gc may delete what this reader reads (a read then fails \
             naming the object)",
            self.key
        );
    }

    /// The open's replay found the WAL's end: keep only what it read.
    pub(crate) async fn read_to(&self, wal_end: u64) {
        if self.refused {
            self.lease.lock().wal_end = Some(wal_end);
            return;
        }
        let (manifest, wal_start) = {
            let l = self.lease.lock();
            (l.manifest, l.wal_start)
        };
        if let Err(e) = self.write(manifest, wal_start, Some(wal_end)).await {
            // The lease written before keeps more than this: no harm.
            log::warn!("{}: lease not narrowed to the WAL read ({e})", self.key);
        }
    }

    /// Renew the lease every `LEASE_RENEW_SECS` on `rt` until released.
    pub(crate) fn renew_on(&mut self, rt: &tokio::runtime::Runtime) {
        self.renew_every(rt, std::time::Duration::from_secs(LEASE_RENEW_SECS));
    }

    fn renew_every(&mut self, rt: &tokio::runtime::Runtime, every: std::time::Duration) {
        let (store, key, lease) = (self.store.clone(), self.key.clone(), self.lease.clone());
        self.renewal = Some(rt.spawn(async move {
            let mut failing = false;
            loop {
                tokio::time::sleep(every).await;
                let l = {
                    let mut l = lease.lock();
                    l.expires = now_secs() + LEASE_LIFE_SECS;
                    l.clone()
                };
                match put(&*store, &key, &l).await {
                    Ok(()) if failing => {
                        log::info!("{key}: lease renewed again");
                        failing = false;
                    }
                    Ok(()) => {}
                    Err(e) => {
                        if !failing {
                            log::warn!(
                                "{key}: lease not renewed ({e}); what this reader reads \
                                 may be swept {LEASE_LIFE_SECS} s after the last renewal"
                            );
                        }
                        failing = true;
                    }
                }
            }
        }));
    }

    pub(crate) fn key(&self) -> &Path {
        &self.key
    }

    async fn delete(&self) {
        match self.store.delete(&self.key).await {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => log::warn!(
                "{}: lease not deleted ({e}); it keeps nothing after it expires",
                self.key
            ),
        }
    }

    /// Stop renewing and delete the lease: what it kept is garbage for
    /// the next sweep.
    pub(crate) fn release(mut self, rt: &tokio::runtime::Runtime) {
        let task = self.renewal.take();
        rt.block_on(async {
            // Cancelled before the delete, so that no renewal lands after.
            if let Some(task) = task {
                task.abort();
                let _ = task.await;
            }
            self.delete().await
        });
    }
}

/// The leases under `prefix` (`foliofs stat`), expired ones included.
pub fn leases(store: Arc<dyn ObjectStore>, prefix: &Path) -> Result<Vec<LeaseInfo>, ObjectError> {
    let found = crate::store::runtime()?.block_on(list(&*store, prefix))?;
    Ok(found
        .into_iter()
        .map(|(key, l)| LeaseInfo {
            key: key.to_string(),
            manifest: l.manifest,
            wal_start: l.wal_start,
            wal_end: l.wal_end,
            holder: l.holder,
            expires: l.expires,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use std::time::Duration;

    /// The renewals rewrite the lease (even one a sweep deleted), and stop
    /// at release, which deletes it for good.
    #[test]
    fn renewals_rewrite_the_lease_until_it_is_released() {
        let rt = crate::store::runtime().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let mut held = Held::new(store.clone(), &Path::from("img"), &None);
        rt.block_on(held.write(3, 7, Some(9))).unwrap();
        let key = held.key().clone();
        let listed = rt.block_on(list(&*store, &Path::from("img"))).unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((listed[0].1.manifest, listed[0].1.wal()), (3, (7, 9)));
        assert!(listed[0].1.expires >= now_secs() + LEASE_LIFE_SECS - 1);

        held.renew_every(&rt, Duration::from_millis(20));
        rt.block_on(store.delete(&key)).unwrap();
        let back = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            rt.block_on(store.head(&key)).is_ok()
        });
        assert!(back, "a renewal wrote the lease again");
        held.release(&rt);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            rt.block_on(store.head(&key)).is_err(),
            "released: gone for good"
        );
    }
}

//! Images in object storage (`s3://BUCKET/PREFIX`, `file:///DIR`): the
//! CLI's way to the `foliofs-object` device, with its errors for people.

use anyhow::{anyhow, bail, Result};
use foliofs_object::{
    open_url, open_url_with, split_snapshot, ObjectDevice, ObjectError, ObjectOptions,
};
use foliofs_object::{ObjectStore, Path as Prefix};
use std::path::Path;
use std::sync::Arc;

/// The URL an image argument names, if it names an object image.
pub(crate) fn url_of(image: &Path) -> Option<&str> {
    image.to_str().filter(|s| foliofs_object::is_url(s))
}

fn for_people(url: &str, e: ObjectError) -> anyhow::Error {
    anyhow!("{url}: {e}")
}

/// Make a new image of `size` bytes at `url` (never over an existing one),
/// open for writing with `opts` (cache directory, durability).
pub(crate) fn create(url: &str, size: u64, opts: &ObjectOptions) -> Result<ObjectDevice> {
    if let (_, Some(n)) = split_snapshot(url) {
        return Err(anyhow!(
            "{url}: names snapshot {n}: make an image at a URL without @"
        ));
    }
    let (store, prefix) =
        open_url_with(url, opts.profile.as_deref()).map_err(|e| for_people(url, e))?;
    ObjectDevice::create(store, prefix, size, opts.clone()).map_err(|e| for_people(url, e))
}

/// Open the image at `url`: read-only without claiming it, or claimed for
/// writing (refused while its manifest names a writer, unless
/// `given.takeover`), with `given`'s cache directory and durability.
/// `URL@N` opens snapshot N, read-only only.
pub(crate) fn open(
    url: &str,
    read_only: bool,
    mount_point: Option<&Path>,
    given: &ObjectOptions,
) -> Result<ObjectDevice> {
    let (base, snapshot) = split_snapshot(url);
    if let (Some(n), false) = (snapshot, read_only) {
        return Err(anyhow!(
            "{url}: snapshot {n} opens read-only only (mount it with -o ro)"
        ));
    }
    let (store, prefix) =
        open_url_with(base, given.profile.as_deref()).map_err(|e| for_people(url, e))?;
    let opts = ObjectOptions {
        read_only,
        mount_point: mount_point.map(|p| p.display().to_string()),
        snapshot,
        ..given.clone()
    };
    ObjectDevice::open(store, prefix, opts).map_err(|e| for_people(url, e))
}

/// For `foliofs stat URL`: what the mounts of the image on this machine
/// report of it (its writer's WAL lag and cache directory are known only
/// to the writer's daemon).
pub(crate) fn live_mounts(url: &str) {
    for m in foliofs::device::lock::fuse_mounts() {
        if m.source != url {
            continue;
        }
        let Some(dev) = crate::status::read_counters(&m.mount_point)
            .ok()
            .and_then(|c| c.get("device").cloned())
        else {
            continue;
        };
        let n = |k: &str| dev.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        let durability = dev
            .get("durability")
            .and_then(|d| d.as_str())
            .unwrap_or("object");
        print!(
            "mounted here on {}{}: durability={durability}, WAL lag {}",
            m.mount_point.display(),
            if m.read_only { " (ro)" } else { "" },
            crate::status::bytes(n("unshipped_bytes")),
        );
        match dev.get("cache_dir").filter(|c| c.is_object()) {
            Some(c) => {
                let c = |k: &str| c.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
                println!(
                    ", cache_dir {} of {}",
                    crate::status::bytes(c("chunk_bytes") + c("wal_bytes")),
                    crate::status::bytes(c("limit_bytes"))
                );
            }
            None => println!(", no cache_dir"),
        }
    }
}

/// `foliofs umount` of an object image: wait until the daemon's close
/// has written a manifest that names no writer (clean), or its process
/// is gone (not clean: the next mount needs takeover and replays). The
/// store is reached with `profile` where the environment says nothing.
pub(crate) fn wait_closed(
    url: &str,
    profile: Option<&str>,
    wait: std::time::Duration,
) -> Result<bool> {
    let (store, prefix) = open_url_with(url, profile).map_err(|e| for_people(url, e))?;
    let until = std::time::Instant::now() + wait;
    loop {
        let (writer, _) =
            foliofs_object::holder(store.clone(), &prefix).map_err(|e| for_people(url, e))?;
        let Some(w) = writer else {
            return Ok(true);
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(w.pid as i32, 0) } == 0;
        if !alive || std::time::Instant::now() > until {
            return Ok(false);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The image URL (without a snapshot) and its store, for the commands on
/// snapshots and garbage.
fn store_of(url: &str) -> Result<(Arc<dyn ObjectStore>, Prefix)> {
    let (base, _) = split_snapshot(url);
    open_url(base).map_err(|e| for_people(url, e))
}

/// `foliofs snapshot URL`: keep the image as it is now (everything its
/// writer has flushed) and print `URL@N`.
pub(crate) fn snapshot(url: &str) -> Result<()> {
    let (base, at) = split_snapshot(url);
    if let Some(n) = at {
        bail!("{url}: names snapshot {n}: take a snapshot of the URL without @");
    }
    let (store, prefix) = store_of(url)?;
    let n = foliofs_object::take_snapshot(store, &prefix).map_err(|e| for_people(url, e))?;
    println!("{base}@{n}");
    Ok(())
}

/// `foliofs snapshot --delete URL@N`: drop the snapshot, then sweep what
/// only it kept.
pub(crate) fn delete_snapshot(url: &str) -> Result<()> {
    let (_, Some(n)) = split_snapshot(url) else {
        bail!("{url}: name the snapshot to delete as URL@N (foliofs stat URL lists them)");
    };
    let (store, prefix) = store_of(url)?;
    foliofs_object::forget_snapshot(store.clone(), &prefix, n).map_err(|e| for_people(url, e))?;
    let swept = foliofs_object::collect_garbage(store, &prefix).map_err(|e| for_people(url, e))?;
    println!(
        "{url}: dropped; {} objects ({} bytes) no longer kept were deleted",
        swept.deleted, swept.deleted_bytes
    );
    Ok(())
}

/// `foliofs gc URL`: delete the objects that neither the newest manifest
/// nor a snapshot keeps.
pub(crate) fn gc(url: &str, json: bool) -> Result<()> {
    let (store, prefix) = store_of(url)?;
    let swept = foliofs_object::collect_garbage(store, &prefix).map_err(|e| for_people(url, e))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&swept)?);
    } else {
        println!(
            "{url}: {} objects, {} deleted ({} bytes); {} snapshot markers and {} readers' \
             leases keep theirs",
            swept.objects, swept.deleted, swept.deleted_bytes, swept.snapshots, swept.leases
        );
    }
    Ok(())
}

/// The readers' leases at `url` but `own` (the one `foliofs stat` holds
/// itself while it looks), for `foliofs stat`.
pub(crate) fn leases(url: &str, own: Option<&str>) -> Result<Vec<foliofs_object::LeaseInfo>> {
    let (store, prefix) = store_of(url)?;
    let mut v = foliofs_object::leases(store, &prefix).map_err(|e| for_people(url, e))?;
    v.retain(|l| Some(l.key.as_str()) != own);
    Ok(v)
}

/// The snapshots kept at `url`, for `foliofs stat`.
pub(crate) fn snapshots(url: &str) -> Result<Vec<foliofs_object::SnapshotInfo>> {
    let (store, prefix) = store_of(url)?;
    let mut v = foliofs_object::snapshots(store, &prefix).map_err(|e| for_people(url, e))?;
    // One snapshot may have markers from two manifests (taken twice at
    // one moment): list it once, as it opens, from the newest.
    v.reverse();
    v.dedup_by_key(|s| s.at);
    v.reverse();
    Ok(v)
}

//! `ObjectDevice`: the engine's `Device` over an object store.
//!
//! Writes collect in memory until a flush; a flush PUTs them as one WAL
//! object, created only if absent at the next WAL number (one PUT per
//! flush, shared by every fsync that commits together). Blocks in the
//! WAL are read from memory until a checkpoint folds them into new chunk
//! objects and a new manifest. Reads of other blocks fetch their chunk,
//! checked against its checksum, into a bounded cache.
//!
//! A flush that holds every block of a chunk (a large copy, a file
//! written in order) PUTs that chunk as an object of its own first, at
//! `flushed_version(seq)`, `FLUSH_PUTS` in flight, and its WAL object only
//! names it: those bytes go to the store once, not into the WAL and
//! again into a chunk. The chunk then stands for the image's until a
//! checkpoint names it in a manifest (with no PUT, unless the WAL wrote
//! blocks of it since).
//!
//! One writer, by fencing (SlateDB's manifest protocol): opening for
//! writing creates the next manifest with a higher epoch, then a fence at
//! the next free WAL number. The writer it replaces finds its next WAL
//! number or manifest taken: it is fenced, and every later write and
//! flush fails (EIO). A writer never overwrites an object, so nothing a
//! fenced writer does is ever read.
//!
//! Reads that go on sequentially fetch the next chunks ahead (see
//! `readahead`).
//!
//! A checkpointer thread folds the WAL into chunks once
//! `checkpoint_bytes` of it have gathered, while flushes go on: a flush
//! waits for it only when it has fallen two checkpoints behind. With
//! `durability=local`, a shipper thread PUTs the local WAL (see below).
//!
//! Locks: `flushing` (one flush at a time, held across its PUT; with
//! durability=local across its append, its sync made after) and
//! `checkpointing` (one checkpoint at a time, held across its PUTs) are
//! taken before `state` (held only to look up or move blocks, never
//! across a request), and never together except by close (`flushing`
//! first). The read-ahead's own lock is taken alone.

use crate::layout::{
    chunk_key, flushed_seq, flushed_version, manifest_key, number_of, wal_key, Chunk, Damaged,
    Manifest, WalRecord, Writer, BLOCK, CHUNK_BLOCKS, CHUNK_BLOCKS_RANGE, FENCE_BYTES,
    OBJECT_FORMAT,
};
use crate::local::{CacheDir, CacheUse, Durability};
use crate::logged::Logged;
use crate::pool;
use crate::readahead::ReadAhead;
use crate::store::{
    create_mode, image_manifest, latest_manifest, now_secs, runtime, this_writer, wal_numbers,
};
use crate::{keep, lease, ObjectError};
use bytes::Bytes;
use foliofs::device::Device;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Chunk objects a checkpoint PUTs at once.
const CHECKPOINT_PUTS: usize = 4;

/// Chunk objects a flush keeps in flight (`Core::flush_chunks`): W4 on
/// an object image ran at 129 and 132 MiB/s with 8, 107 with 4 (in
/// groups of 4, each waiting for its slowest: 109 and 113), SeaweedFS on
/// the same 2 cores.
const FLUSH_PUTS: usize = 8;

/// A fold is put off while the chunk objects it would write come to more
/// than this many times the WAL it folds (a random writer's blocks, a few
/// in each chunk), until `ObjectOptions::sparse_fold`.
const FOLD_COST_MAX: u64 = 2;

/// The longest a checkpointer waits after a failed checkpoint before it
/// tries again.
const CHECKPOINT_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// With durability=local, how long a local record waits for others to
/// ship with it, and how many bytes of them ship at once without waiting
/// (a quarter of `wal_lag_max` if that is less): one PUT for the records
/// of 100 ms rather than one for each (W1's fdatasyncs come some 3,000 a
/// second), each block's newest version in it once. The store lags that
/// much more, within what durability=local promises (`wal_lag_max`).
const SHIP_LINGER: std::time::Duration = std::time::Duration::from_millis(100);
const SHIP_BATCH: u64 = 8 << 20;

/// With durability=local, how long flushes go to the store after the
/// local WAL failed one before it is tried again.
const LOCAL_WAL_PAUSE: std::time::Duration = std::time::Duration::from_secs(5);

/// How an object device is opened.
#[derive(Clone, Debug)]
pub struct ObjectOptions {
    /// Open without claiming: nothing is written, writes fail (EROFS).
    pub read_only: bool,
    /// Claim the image even if its manifest names a writer (one that
    /// died, or one to be fenced).
    pub takeover: bool,
    /// Bytes of chunks kept in memory.
    pub cache_bytes: u64,
    /// WAL bytes after which a flush folds the WAL into chunks.
    pub checkpoint_bytes: u64,
    /// A WAL whose fold would write more than twice its bytes in chunks
    /// (a random writer's: a few blocks in each of many chunks) is folded
    /// only at this many times `checkpoint_bytes`, its chunks having
    /// gathered more of their blocks by then (1: at `checkpoint_bytes`
    /// always). The WAL not yet folded is held in memory; flushes wait
    /// once it is one `checkpoint_bytes` past this (the checkpointer has
    /// fallen behind).
    pub sparse_fold: u64,
    /// Bytes written and not yet flushed after which a write flushes
    /// them itself: a large copy between two of the engine's flushes
    /// is held in memory only this far (twice this while another flush
    /// is uploading).
    pub pending_bytes: u64,
    /// How long a request that fails for a passing cause (the server
    /// unreachable or answering 5xx) is tried again before its flush
    /// fails (EIO).
    pub retry: std::time::Duration,
    /// Where the writer mounts the image, recorded in its claim so that a
    /// refused mount elsewhere names it.
    pub mount_point: Option<String>,
    /// Open this snapshot (read-only): its manifest's chunks and its WAL,
    /// never the WAL after it, nothing claimed.
    pub snapshot: Option<u64>,
    /// A local directory for fetched chunks and (with
    /// `Durability::Local`) the WAL before it ships; one per image.
    pub cache_dir: Option<std::path::PathBuf>,
    /// Bytes of chunks and WAL the cache directory holds at most.
    pub cache_size: u64,
    /// When a flush returns (see `Durability`).
    pub durability: Durability,
    /// With `Durability::Local`: flushes wait while more than this many
    /// bytes are durable only locally.
    pub wal_lag_max: u64,
    /// Chunks fetched ahead of a sequential read at a time (0: off); at
    /// most half the chunks `cache_bytes` holds. 8 by measurement: a cold
    /// read from SeaweedFS ran 0.67-0.72 of the server's GETs with 8,
    /// 0.53-0.65 with 4 and 0.59-0.64 with 16 (docs/BENCH.md).
    pub read_ahead_chunks: usize,
    /// For a new image (`create`): the bytes of each chunk object, a power
    /// of two from 256 KiB to 64 MiB. An image opened keeps its own.
    pub chunk_bytes: u64,
    /// The AWS shared files' profile an `s3://` URL's credentials,
    /// region and endpoint come from where the environment has none
    /// (`open_url_with`; the device itself does not read it).
    pub profile: Option<String>,
}

impl Default for ObjectOptions {
    fn default() -> Self {
        ObjectOptions {
            read_only: false,
            takeover: false,
            cache_bytes: 256 << 20,
            checkpoint_bytes: 64 << 20,
            sparse_fold: 3,
            pending_bytes: 64 << 20,
            retry: std::time::Duration::from_secs(120),
            mount_point: None,
            snapshot: None,
            cache_dir: None,
            cache_size: 4 << 30,
            durability: Durability::Object,
            wal_lag_max: 64 << 20,
            read_ahead_chunks: 8,
            chunk_bytes: CHUNK_BLOCKS * BLOCK,
            profile: None,
        }
    }
}

/// What an object device has done (`foliofs stat`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ObjectStats {
    pub epoch: u64,
    pub manifest: u64,
    pub next_wal: u64,
    pub wal_puts: u64,
    pub wal_bytes: u64,
    pub chunk_gets: u64,
    /// Of `chunk_gets`, chunks fetched ahead of a sequential read.
    pub chunks_read_ahead: u64,
    /// Chunk objects checkpoints wrote.
    pub chunk_puts: u64,
    /// Chunk objects flushes wrote whole, their bytes not in the WAL.
    pub chunks_flushed: u64,
    pub checkpoints: u64,
    /// Bytes in the WAL not yet folded into chunks.
    pub unfolded_bytes: u64,
    /// Chunk objects the manifest names (the rest of the device is zeros).
    pub chunks: u64,
    /// Chunks held in memory (at most `cache_bytes` of them).
    pub chunks_held: u64,
    /// Bytes of each chunk object (the image's, chosen when it was made).
    pub chunk_bytes: u64,
    /// The writer the manifest names (None after a clean close).
    pub writer: Option<Writer>,
    pub fenced: Option<String>,
    /// Why the last checkpoint failed, until one succeeds (the WAL keeps
    /// everything meanwhile; flushes fail only once the WAL not folded
    /// reaches its bound).
    pub checkpoint_failed: Option<String>,
    /// The snapshot open, if one is.
    pub snapshot: Option<u64>,
    pub durability: Durability,
    /// Bytes flushed to the local WAL and not yet in the store.
    pub unshipped_bytes: u64,
    /// With durability=local: flushes that went to the store because
    /// the local WAL could not take them (its disk full, say).
    pub flushes_past_local_wal: u64,
    pub cache_dir: Option<CacheUse>,
    /// The lease a read-only open holds (see `lease`).
    pub lease: Option<String>,
}

/// The chunks a flush makes whole (`Core::whole_chunks`).
struct Whole {
    chunks: Vec<u64>,
    /// The blocks of them the WAL holds and the flush does not.
    from_wal: BTreeMap<u64, Block>,
}

/// What a flush to the store takes of `pending`.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Take {
    /// Everything: a flush the engine asked for.
    All,
    /// The chunks held whole, if the rest is small (`whole_part`): a
    /// flush the bound on `pending` asked for.
    WholeChunks,
}

/// One block's bytes: a view of the buffer its write was copied into
/// once (`write_blocks`), or of a WAL object's.
type Block = Bytes;

struct State {
    manifest_id: u64,
    manifest: Manifest,
    next_wal: u64,
    /// Written since the last flush began.
    pending: BTreeMap<u64, Block>,
    /// Being PUT by the flush in progress.
    in_flight: BTreeMap<u64, Block>,
    /// In the WAL, not yet in chunks.
    logged: Logged,
    /// Chunk index -> the version a flush wrote whole since the manifest
    /// (`flushed_version`): it stands for the manifest's, and `logged`
    /// holds only blocks written after it.
    flushed: BTreeMap<u64, u64>,
    /// Flushed versions replaced by a later flush or folded by a
    /// checkpoint before a manifest named them: garbage once the WAL
    /// naming them is (the next checkpoint's sweep).
    superseded: Vec<(u64, u64)>,
    /// Chunks held in memory, by index.
    chunks: HashMap<u64, Held>,
    tick: u64,
    stats: ObjectStats,
    /// With `Durability::Local`: flushed to the local WAL, not yet in the
    /// store, each block's newest version with its local record.
    unshipped: BTreeMap<u64, (u64, Block)>,
    /// The local records waiting to ship, oldest first.
    to_ship: VecDeque<Shipment>,
    /// Waiting for `to_ship` to empty (close, a flush past the local
    /// WAL): the shipper does not linger.
    ship_waiters: usize,
    unshipped_bytes: u64,
    /// With `Durability::Local`: the local WAL failed a flush; until
    /// then flushes go to the store instead (`flush_past_local`).
    local_wal_paused_until: Option<std::time::Instant>,
    /// The background threads are to stop (the device closes or is
    /// dropped).
    stopping: bool,
}

/// A chunk held in memory (`State::chunks`).
struct Held {
    version: u64,
    data: Chunk,
    /// The tick of its last use (least recently used out first).
    used: u64,
    /// The cache directory has (or was given) a copy: fetched from the
    /// store or read from there. One this writer made, a checkpoint's or
    /// a flush's, is written there only when it leaves memory or at close
    /// (`Core::save_chunks`): most are replaced before either, and every
    /// copy written is a write to the local disk a flush may be waiting
    /// on.
    on_disk: bool,
}

/// Chunks that left memory with no copy in the cache directory:
/// (index, version, blocks).
type Unsaved = Vec<(u64, u64, Chunk)>;

/// One local WAL record on its way to the store.
#[derive(Clone)]
struct Shipment {
    record: u64,
    queued: std::time::Instant,
    blocks: Vec<(u64, Block)>,
}

/// Chunk `idx` is `version`, written whole by a flush, in the WAL's
/// blocks, flushed chunks and replaced flushed versions (a device's, or
/// a replay's): the blocks of it in the WAL before are older than it.
fn chunk_flushed(
    logged: &mut Logged,
    flushed: &mut BTreeMap<u64, u64>,
    superseded: &mut Vec<(u64, u64)>,
    idx: u64,
    version: u64,
    chunk_blocks: u64,
) {
    let first = idx * chunk_blocks;
    let older: Vec<u64> = logged
        .range(first..first + chunk_blocks)
        .map(|(&b, _)| b)
        .collect();
    for b in older {
        logged.remove(b);
    }
    if let Some(was) = flushed.insert(idx, version).filter(|&v| v != version) {
        superseded.push((idx, was));
    }
}

impl State {
    /// Bytes in the WAL not yet folded into chunks (held in memory).
    fn unfolded_bytes(&self) -> u64 {
        self.logged.len() as u64 * BLOCK
    }

    /// The version of chunk `idx` the image holds: one a flush wrote
    /// since the manifest, else the manifest's (None: zeros).
    fn chunk_version(&self, idx: u64) -> Option<u64> {
        self.flushed
            .get(&idx)
            .or_else(|| self.manifest.chunks.get(&idx))
            .copied()
    }

    /// Chunk `idx` is `version`, written whole by a flush: the blocks of
    /// it in the WAL before are older than it.
    fn chunk_flushed(&mut self, idx: u64, version: u64, chunk_blocks: u64) {
        chunk_flushed(
            &mut self.logged,
            &mut self.flushed,
            &mut self.superseded,
            idx,
            version,
            chunk_blocks,
        );
    }

    /// The WAL a replay would read, in bytes: what `logged` holds and the
    /// chunks flushes wrote. A checkpoint is due when it reaches
    /// `checkpoint_bytes`.
    fn wal_span_bytes(&self, chunk_bytes: u64) -> u64 {
        self.unfolded_bytes() + self.flushed.len() as u64 * chunk_bytes
    }

    fn block(&self, b: u64) -> Option<&Block> {
        self.pending
            .get(&b)
            .or_else(|| self.in_flight.get(&b))
            .or_else(|| self.unshipped.get(&b).map(|(_, d)| d))
            .or_else(|| self.logged.get(b))
    }
}

/// A foliofs image in an object store, as the engine's block device.
pub struct ObjectDevice {
    core: Arc<Core>,
    /// The background threads (the checkpointer; with
    /// `Durability::Local`, the shipper), until close or drop.
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// The device, shared with its background threads.
struct Core {
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// The prefix as messages name it.
    name: String,
    len: u64,
    /// Blocks in each chunk object (the manifest's).
    chunk_blocks: u64,
    opts: ObjectOptions,
    epoch: u64,
    /// One flush at a time, held across its PUT.
    flushing: Mutex<()>,
    /// One checkpoint at a time (the checkpointer's, or close's), held
    /// across its PUTs and sweep.
    checkpointing: Mutex<()>,
    /// The chunk maps of the manifests snapshots are read from, by
    /// manifest number (a manifest never changes). Taken under
    /// `checkpointing`, never with `state`.
    kept_manifests: Mutex<HashMap<u64, BTreeMap<u64, u64>>>,
    state: Mutex<State>,
    /// Signalled when `state` moves on: records shipped, WAL logged, a
    /// checkpoint done or failed, the device fenced or stopping. Flushes
    /// waiting on `wal_lag_max` or on checkpoints, close, and the
    /// checkpointer wait on it. Not at every flush: the threads that
    /// wait here have nothing to do with one.
    changed: Condvar,
    /// The shipper waits here (with `state`): signalled when a record is
    /// queued for it with nothing queued before, when what is queued
    /// reaches a batch, when someone waits for it, and at stop. Between
    /// those it sleeps until its linger is over, however many flushes
    /// come (a wakeup for each was a fifth of W1's time on 2 cores).
    ship_due: Condvar,
    /// `Durability::Local` only for a writer (it has a cache directory).
    durability: Durability,
    disk: Option<Arc<CacheDir>>,
    /// Set when the background threads are to stop: a PUT being retried
    /// gives up (what the shipper held stays in the local WAL).
    stop: AtomicBool,
    ahead: ReadAhead,
    /// A read-only open's lease, until close or drop. Taken alone, never
    /// with `flushing` or `state`.
    lease: Mutex<Option<lease::Held>>,
}

fn eio(what: impl std::fmt::Display) -> io::Error {
    io::Error::other(what.to_string())
}

/// The cache directory `opts` names, open for the image under `prefix`;
/// `Durability::Local` needs one.
fn open_cache(
    store: &dyn ObjectStore,
    prefix: &Path,
    opts: &ObjectOptions,
) -> Result<Option<Arc<CacheDir>>, ObjectError> {
    let Some(dir) = &opts.cache_dir else {
        if opts.durability == Durability::Local && !opts.read_only {
            return Err(ObjectError::Invalid(
                "durability=local keeps the WAL in a cache_dir: give one".into(),
            ));
        }
        return Ok(None);
    };
    let identity = format!("{store}/{prefix}");
    Ok(Some(Arc::new(CacheDir::open(
        dir,
        opts.cache_size,
        &identity,
    )?)))
}

/// Ship what the local WAL held when its writer stopped without closing
/// (`records`, all of one earlier run), as one WAL object at the next free
/// number: each block's newest local version. Some of these records may
/// have shipped already (the writer stopped between a PUT and deleting
/// them); nothing shipped is newer than them, so the image ends where the
/// local WAL did. They are dropped if another writer has claimed the
/// image since (their epoch is not the manifest's), or took the number.
async fn ship_leftovers(
    store: &dyn ObjectStore,
    prefix: &Path,
    manifest: &Manifest,
    records: Vec<WalRecord>,
) -> Result<(), ObjectError> {
    let bytes: usize = records
        .iter()
        .map(|r| r.blocks.len() * BLOCK as usize)
        .sum();
    let epoch = records.last().map_or(0, |r| r.epoch);
    if records.iter().any(|r| r.epoch != manifest.epoch) {
        log::warn!(
            "{prefix}: the local WAL held {bytes} bytes flushed at epoch {epoch}; the image \
             was claimed at epoch {} since: they are dropped (durability=local)",
            manifest.epoch
        );
        return Ok(());
    }
    let mut newest: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for rec in records {
        newest.extend(rec.blocks);
    }
    let list: Vec<(u64, &[u8])> = newest.iter().map(|(&b, d)| (b, &d[..])).collect();
    let present = wal_numbers(store, prefix, manifest.wal_start).await?;
    let seq = present.last().map_or(manifest.wal_start, |s| s + 1);
    let body = WalRecord::encode(epoch, seq, &list, &[]);
    match store
        .put_opts(&wal_key(prefix, seq), PutPayload::from(body), create_mode())
        .await
    {
        Ok(_) => log::info!(
            "{prefix}: shipped the {bytes} bytes the local WAL held from the last run as WAL {seq}"
        ),
        Err(object_store::Error::AlreadyExists { .. }) => log::warn!(
            "{prefix}: WAL {seq} was taken by another writer: the {bytes} bytes the local \
             WAL held are dropped (durability=local)"
        ),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

/// The WAL numbers from `from` on that hold a fence (no blocks): kept for
/// good, because a writer fenced by one may yet try its number, and must
/// find it taken however long it was stopped.
async fn fence_numbers(
    store: &dyn ObjectStore,
    prefix: &Path,
    from: u64,
) -> Result<std::collections::BTreeSet<u64>, ObjectError> {
    let metas: Vec<_> = store.list(Some(&prefix.child("wal"))).try_collect().await?;
    Ok(metas
        .iter()
        .filter(|m| m.size == FENCE_BYTES)
        .filter_map(|m| number_of(&m.location))
        .filter(|&s| s >= from)
        .collect())
}

/// "; epoch E by WRITER" for the writer that holds the image now, for the
/// message of a writer fenced by it (empty if it cannot be read).
async fn holder_note(store: &dyn ObjectStore, prefix: &Path) -> String {
    latest_manifest(store, prefix)
        .await
        .ok()
        .flatten()
        .and_then(|(_, m)| m.writer.map(|w| format!("; epoch {} by {w}", m.epoch)))
        .unwrap_or_default()
}

/// The writer the newest manifest under `prefix` names (None after a
/// clean close), with its epoch: a look that claims nothing.
pub fn holder(
    store: Arc<dyn ObjectStore>,
    prefix: &Path,
) -> Result<(Option<Writer>, u64), ObjectError> {
    let rt = runtime()?;
    let (_, m) = rt.block_on(image_manifest(&*store, prefix))?;
    Ok((m.writer, m.epoch))
}

impl ObjectDevice {
    /// Make a new image of `len` bytes under `prefix`: its first
    /// manifest, created only if none is there (an existing image is an
    /// error, never overwritten). The device is open for writing.
    pub fn create(
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        len: u64,
        opts: ObjectOptions,
    ) -> Result<ObjectDevice, ObjectError> {
        let rt = runtime()?;
        let len = len / BLOCK * BLOCK;
        if len == 0 {
            return Err(ObjectError::Invalid(
                "an image needs at least one block".into(),
            ));
        }
        let chunk_blocks = opts.chunk_bytes / BLOCK;
        if opts.chunk_bytes % BLOCK != 0 || !crate::layout::chunk_blocks_ok(chunk_blocks) {
            return Err(ObjectError::Invalid(format!(
                "chunk size {}: a power of two from {} KiB to {} MiB",
                opts.chunk_bytes,
                (CHUNK_BLOCKS_RANGE.start() * BLOCK) >> 10,
                (CHUNK_BLOCKS_RANGE.end() * BLOCK) >> 20
            )));
        }
        let manifest = Manifest {
            format: OBJECT_FORMAT,
            len,
            block: BLOCK,
            chunk_blocks,
            epoch: 1,
            writer: Some(this_writer(&opts.mount_point)),
            wal_start: 1,
            chunks: BTreeMap::new(),
        };
        let disk = open_cache(&*store, &prefix, &opts)?;
        rt.block_on(async {
            if let Some((id, _)) = latest_manifest(&*store, &prefix).await? {
                return Err(ObjectError::Exists {
                    key: manifest_key(&prefix, id).to_string(),
                });
            }
            let key = manifest_key(&prefix, 1);
            match store
                .put_opts(&key, PutPayload::from(manifest.encode()), create_mode())
                .await
            {
                Err(object_store::Error::AlreadyExists { .. }) => Err(ObjectError::Exists {
                    key: key.to_string(),
                }),
                r => r.map(drop).map_err(ObjectError::from),
            }
        })?;
        if let Some(d) = &disk {
            // Whatever it held was of an image no longer there.
            d.clear_chunks();
            d.clear_wal()?;
        }
        Ok(Self::assemble(
            rt,
            store,
            prefix,
            opts,
            disk,
            (1, manifest),
            Replayed {
                next: 1,
                logged: Logged::new(chunk_blocks),
                flushed: BTreeMap::new(),
                superseded: Vec::new(),
            },
        ))
    }

    /// Open the image under `prefix`: for writing, claim it (refused if
    /// its manifest names a writer, unless `takeover`), fence the writer
    /// before, and replay the WAL after the last checkpoint; read-only,
    /// replay without claiming (the image as of this moment); with
    /// `opts.snapshot` (read-only only), that snapshot's manifest and its
    /// WAL up to the snapshot, never past it (see `keep`).
    pub fn open(
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        opts: ObjectOptions,
    ) -> Result<ObjectDevice, ObjectError> {
        let rt = runtime()?;
        let disk = open_cache(&*store, &prefix, &opts)?;
        // A reader leases what it reads before it reads it (see `lease`).
        let mut held = None;
        let opened = rt.block_on(async {
            if let Some(at) = opts.snapshot {
                image_manifest(&*store, &prefix).await?;
                if !opts.read_only {
                    return Err(ObjectError::Invalid(format!(
                        "snapshot {at} opens read-only"
                    )));
                }
                let (l, id, manifest) =
                    lease::Held::snapshot(store.clone(), &prefix, at, &opts.mount_point).await?;
                held = Some(l);
                // Every WAL number up to the snapshot, and none after.
                let r = replay(&*store, &prefix, &manifest, Some(at)).await?;
                return Ok((id, manifest, r));
            }
            if opts.read_only {
                let (l, id, manifest) =
                    lease::Held::newest(store.clone(), &prefix, &opts.mount_point).await?;
                let l = held.insert(l);
                let r = replay(&*store, &prefix, &manifest, None).await?;
                l.read_to(r.next).await;
                return Ok((id, manifest, r));
            }
            let (mut id, mut manifest) = image_manifest(&*store, &prefix).await?;
            if let Some(d) = &disk {
                let records = d.leftover_wal(manifest.len / BLOCK);
                if !records.is_empty() && (manifest.writer.is_none() || opts.takeover) {
                    ship_leftovers(&*store, &prefix, &manifest, records).await?;
                    d.clear_wal()?;
                    (id, manifest) = image_manifest(&*store, &prefix).await?;
                }
            }
            // Claim: the next manifest, created only if absent, with a
            // higher epoch. Losing the race to another claim (or to the
            // old writer's checkpoint) means reading the newer one.
            loop {
                if let (Some(w), false) = (&manifest.writer, opts.takeover) {
                    return Err(ObjectError::Held {
                        key: manifest_key(&prefix, id).to_string(),
                        writer: w.clone(),
                        epoch: manifest.epoch,
                    });
                }
                let mut claim = manifest.clone();
                claim.epoch += 1;
                // Its WAL may name chunks its flushes wrote (format 2):
                // an older foliofs refuses the image rather than misread it.
                claim.format = OBJECT_FORMAT;
                claim.writer = Some(this_writer(&opts.mount_point));
                let key = manifest_key(&prefix, id + 1);
                match store
                    .put_opts(&key, PutPayload::from(claim.encode()), create_mode())
                    .await
                {
                    Ok(_) => {
                        id += 1;
                        manifest = claim;
                        break;
                    }
                    Err(object_store::Error::AlreadyExists { .. }) => {
                        (id, manifest) = latest_manifest(&*store, &prefix)
                            .await?
                            .expect("a manifest was there");
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            // Fence: our epoch at the first free WAL number. The writer
            // before us finds it taken at its next flush.
            let present = wal_numbers(&*store, &prefix, manifest.wal_start).await?;
            let mut fence = present.last().map_or(manifest.wal_start, |s| s + 1);
            loop {
                let bytes = WalRecord::encode(manifest.epoch, fence, &[], &[]);
                match store
                    .put_opts(
                        &wal_key(&prefix, fence),
                        PutPayload::from(bytes),
                        create_mode(),
                    )
                    .await
                {
                    Ok(_) => break,
                    Err(object_store::Error::AlreadyExists { .. }) => fence += 1,
                    Err(e) => return Err(e.into()),
                }
            }
            let mut r = replay(&*store, &prefix, &manifest, Some(fence)).await?;
            r.next = fence + 1;
            Ok::<_, ObjectError>((id, manifest, r))
        });
        let (id, manifest, replayed) = match opened {
            Ok(o) => o,
            Err(e) => {
                if let Some(l) = held {
                    l.release(&rt);
                }
                return Err(e);
            }
        };
        let next_wal = replayed.next;
        if let Some(w) = manifest.writer.as_ref().filter(|_| !opts.read_only) {
            log::info!(
                "{}: claimed at epoch {} by {w} (manifest {id}, WAL from {next_wal})",
                if prefix.as_ref().is_empty() {
                    "object image"
                } else {
                    prefix.as_ref()
                },
                manifest.epoch
            );
        }
        let dev = Self::assemble(rt, store, prefix, opts, disk, (id, manifest), replayed);
        if let Some(mut l) = held {
            l.renew_on(&dev.core.rt);
            dev.core.state.lock().stats.lease = Some(l.key().to_string());
            *dev.core.lease.lock() = Some(l);
        }
        Ok(dev)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        rt: tokio::runtime::Runtime,
        store: Arc<dyn ObjectStore>,
        prefix: Path,
        opts: ObjectOptions,
        disk: Option<Arc<CacheDir>>,
        (manifest_id, manifest): (u64, Manifest),
        replayed: Replayed,
    ) -> ObjectDevice {
        let Replayed {
            next: next_wal,
            logged,
            flushed,
            superseded,
        } = replayed;
        let unfolded = logged.len() as u64 * BLOCK;
        let snapshot = opts.snapshot;
        let durability = match opts.read_only {
            true => Durability::Object,
            false => opts.durability,
        };
        let chunk_blocks = manifest.chunk_blocks;
        let ahead = ReadAhead::new(opts.read_ahead_chunks, cache_chunks(&opts, chunk_blocks));
        let read_only = opts.read_only;
        if let Some(d) = disk.as_ref().filter(|_| durability == Durability::Local) {
            d.make_spare();
        }
        let core = Arc::new(Core {
            rt,
            store,
            name: match prefix.as_ref() {
                "" => "the object image".into(),
                p => format!("object image {p}"),
            },
            prefix,
            len: manifest.len,
            chunk_blocks,
            epoch: manifest.epoch,
            opts,
            flushing: Mutex::new(()),
            checkpointing: Mutex::new(()),
            kept_manifests: Mutex::new(HashMap::new()),
            ahead,
            lease: Mutex::new(None),
            state: Mutex::new(State {
                manifest_id,
                next_wal,
                pending: BTreeMap::new(),
                in_flight: BTreeMap::new(),
                logged,
                flushed,
                superseded,
                chunks: HashMap::new(),
                tick: 0,
                stats: ObjectStats {
                    snapshot,
                    epoch: manifest.epoch,
                    manifest: manifest_id,
                    next_wal,
                    unfolded_bytes: unfolded,
                    durability,
                    ..Default::default()
                },
                manifest,
                unshipped: BTreeMap::new(),
                to_ship: VecDeque::new(),
                ship_waiters: 0,
                unshipped_bytes: 0,
                local_wal_paused_until: None,
                stopping: false,
            }),
            changed: Condvar::new(),
            ship_due: Condvar::new(),
            durability,
            disk,
            stop: AtomicBool::new(false),
        });
        let mut threads = Vec::new();
        if !read_only {
            threads.push(core.start("foliofs-checkpoint", Core::checkpointer));
        }
        if durability == Durability::Local {
            threads.push(core.start("foliofs-ship", Core::shipper));
        }
        ObjectDevice {
            core,
            threads: Mutex::new(threads),
        }
    }

    /// What the device has done so far.
    pub fn stats(&self) -> ObjectStats {
        self.core.stats()
    }

    /// Flush, fold the WAL into chunks and write a manifest that names no
    /// writer: the next open needs no takeover. The device writes nothing
    /// more.
    pub fn close(&self) -> io::Result<()> {
        let core = &self.core;
        if core.opts.read_only {
            core.release_lease();
            return Ok(());
        }
        core.flush()?;
        let _f = core.flushing.lock();
        core.wait_shipped();
        self.stop_threads();
        core.check_fenced()?;
        if let Some(d) = core
            .disk
            .as_ref()
            .filter(|_| core.durability == Durability::Local)
        {
            d.clear_wal()?;
        }
        let _c = core.checkpointing.lock();
        core.checkpoint(true).map_err(io::Error::from)?;
        // The chunks this writer made and still holds, for the next
        // mount from this cache directory.
        let unsaved = {
            let mut s = core.state.lock();
            s.stats.fenced = Some("closed".into());
            let s = &*s;
            s.chunks
                .iter()
                .filter(|&(&idx, held)| !held.on_disk && s.chunk_version(idx) == Some(held.version))
                .map(|(&idx, held)| (idx, held.version, held.data.clone()))
                .collect::<Unsaved>()
        };
        core.save_chunks(unsaved);
        Ok(())
    }

    /// Fold the WAL flushed so far into chunks and a new manifest now,
    /// rather than when `checkpoint_bytes` of it have gathered; returns
    /// once the manifest is in the store.
    pub fn checkpoint_now(&self) -> io::Result<()> {
        if self.core.opts.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        let _c = self.core.checkpointing.lock();
        self.core.check_fenced()?;
        self.core.checkpoint(false).map_err(io::Error::from)
    }

    /// Stop the background threads and wait for them: a checkpoint in
    /// progress finishes; a PUT being retried gives up.
    fn stop_threads(&self) {
        {
            let mut s = self.core.state.lock();
            s.stopping = true;
            self.core.stop.store(true, Ordering::Relaxed);
        }
        self.core.changed.notify_all();
        self.core.ship_due.notify_all();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ObjectDevice {
    /// Without `close`: what has not shipped stays in the local WAL, as
    /// if the machine had stopped here. A reader's lease goes.
    fn drop(&mut self) {
        self.stop_threads();
        self.core.release_lease();
    }
}

impl Core {
    fn start(self: &Arc<Core>, name: &str, run: fn(&Core)) -> std::thread::JoinHandle<()> {
        let core = self.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run(&core))
            .expect("a thread can be started")
    }

    fn stats(&self) -> ObjectStats {
        let s = self.state.lock();
        let mut st = s.stats.clone();
        st.manifest = s.manifest_id;
        st.next_wal = s.next_wal;
        st.unfolded_bytes = s.unfolded_bytes();
        st.chunks = s.manifest.chunks.len() as u64;
        st.chunks_held = s.chunks.len() as u64;
        st.chunk_bytes = self.chunk_blocks * BLOCK;
        st.writer = s.manifest.writer.clone();
        st.unshipped_bytes = s.unshipped_bytes;
        drop(s);
        st.cache_dir = self.disk.as_ref().map(|d| d.usage());
        st.chunks_read_ahead = self.ahead.used();
        st
    }

    /// Delete a reader's lease: what it kept is garbage for the next
    /// sweep.
    fn release_lease(&self) {
        if let Some(l) = self.lease.lock().take() {
            l.release(&self.rt);
        }
        self.state.lock().stats.lease = None;
    }

    fn check_fenced(&self) -> io::Result<()> {
        match &self.state.lock().stats.fenced {
            Some(why) => Err(eio(format!("{}: {why}", self.name))),
            None => Ok(()),
        }
    }

    /// Chunk `idx` at `version` if memory holds it (marked used).
    fn held(&self, idx: u64, version: u64) -> Option<Chunk> {
        let mut s = self.state.lock();
        s.tick += 1;
        let tick = s.tick;
        let held = s.chunks.get_mut(&idx).filter(|h| h.version == version)?;
        held.used = tick;
        Some(held.data.clone())
    }

    /// The blocks of chunk `idx` at `version`, from the cache or the store.
    fn chunk(&self, idx: u64, version: u64) -> io::Result<Chunk> {
        if let Some(data) = self.held(idx, version) {
            return Ok(data);
        }
        self.chunk_not_held(idx, version)
    }

    /// Chunk `idx` at `version`, which memory does not hold: from the
    /// cache directory or the store, then held.
    fn chunk_not_held(&self, idx: u64, version: u64) -> io::Result<Chunk> {
        let key = chunk_key(&self.prefix, idx, version);
        let len = self.chunk_len(idx);
        let (data, fetched) = match self.chunk_from_disk(&key, idx, version) {
            Some(data) => (data, 0),
            None => {
                // A fetch made ahead has verified its blocks already.
                let data = match self.ahead.take(&self.rt, idx, version) {
                    Some(chunk) => chunk,
                    None => {
                        let bytes = self.retrying(&key, || {
                            pool::get(&*self.store, &key, Chunk::object_len(len))
                        })?;
                        Chunk::decode(&key, idx, bytes, len).map_err(ObjectError::from)?
                    }
                };
                if let Some(d) = &self.disk {
                    d.keep_chunk(idx, version, &data);
                }
                (data, 1)
            }
        };
        let mut s = self.state.lock();
        s.stats.chunk_gets += fetched;
        if s.chunk_version(idx) == Some(version) {
            let used = s.tick;
            let on_disk = self.disk.is_some();
            let held = Held {
                version,
                data: data.clone(),
                used,
                on_disk,
            };
            s.chunks.insert(idx, held);
            let unsaved = self.trim_cache(&mut s);
            drop(s);
            self.save_chunks(unsaved);
        }
        Ok(data)
    }

    /// Blocks `at..` of chunk `idx` at `version` into `dst`: from memory;
    /// else from the cache directory's copy, those blocks alone, each
    /// checked (a random reader's 4 KiB costs 4 KiB, not the chunk's 4 MiB
    /// read, checked and held, and another chunk sent out of memory for
    /// it); else the whole chunk, fetched (and then held).
    fn chunk_run(&self, idx: u64, version: u64, at: usize, dst: &mut [u8]) -> io::Result<()> {
        let bs = BLOCK as usize;
        let data = match self.held(idx, version) {
            Some(data) => data,
            None => {
                let len = self.chunk_len(idx);
                if let Some(d) = &self.disk {
                    if d.chunk_blocks(idx, version, len, at, dst) {
                        return Ok(());
                    }
                }
                self.chunk_not_held(idx, version)?
            }
        };
        dst.copy_from_slice(&data.blocks()[at * bs..at * bs + dst.len()]);
        Ok(())
    }

    /// Chunk (`idx`, `version`) from the cache directory, if it has a copy
    /// that passes its check (one that does not is dropped).
    fn chunk_from_disk(&self, key: &Path, idx: u64, version: u64) -> Option<Chunk> {
        let disk = self.disk.as_ref()?;
        let bytes = Bytes::from(disk.chunk(idx, version, self.chunk_len(idx))?);
        match Chunk::decode(key, idx, bytes, self.chunk_len(idx)) {
            Ok(data) => Some(data),
            Err(e) => {
                log::warn!("cache_dir copy of {e}: dropped, fetched again");
                disk.forget_chunk(idx, version);
                None
            }
        }
    }

    fn chunk_len(&self, idx: u64) -> usize {
        let start = idx * self.chunk_blocks * BLOCK;
        (self.len - start).min(self.chunk_blocks * BLOCK) as usize
    }

    /// Chunks out of memory, least recently used first, down to
    /// `cache_bytes`; those the cache directory should have and has not,
    /// for `save_chunks` once `state` is let go.
    #[must_use]
    fn trim_cache(&self, s: &mut State) -> Unsaved {
        let limit = cache_chunks(&self.opts, self.chunk_blocks);
        let mut unsaved = Vec::new();
        while s.chunks.len() > limit {
            let oldest = s
                .chunks
                .iter()
                .min_by_key(|(_, held)| held.used)
                .map(|(&i, _)| i)
                .expect("not empty");
            let held = s.chunks.remove(&oldest).expect("just found");
            if !held.on_disk && self.disk.is_some() && s.chunk_version(oldest) == Some(held.version)
            {
                unsaved.push((oldest, held.version, held.data));
            }
        }
        unsaved
    }

    /// Copies of chunks into the cache directory (`Held::on_disk`),
    /// encoded as their objects are.
    fn save_chunks(&self, chunks: Unsaved) {
        let Some(d) = &self.disk else {
            return;
        };
        for (idx, version, data) in chunks {
            d.keep_chunk(idx, version, &data);
        }
    }

    /// `op` until it succeeds or fails for good (see `retry_for`).
    fn retrying<T, F, Fut>(&self, what: &Path, op: F) -> object_store::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = object_store::Result<T>>,
    {
        retry_for(
            self.rt.handle(),
            &self.name,
            self.opts.retry,
            None,
            what,
            op,
        )
    }

    /// `flush_wal` until it is done or fails for good.
    fn flush_to_store(&self, take: Take) -> io::Result<()> {
        loop {
            match self.flush_wal(take) {
                Ok(()) => return Ok(()),
                Err(ObjectError::Retry) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// PUT what was written since the last flush (or, for
    /// `Take::WholeChunks`, what of it `whole_part` takes) as the next WAL
    /// object; chunks it holds whole go first as objects of their own,
    /// which the WAL object names (`flush_chunks`).
    fn flush_wal(&self, take: Take) -> Result<(), ObjectError> {
        let (seq, blocks, whole, zeros) = {
            let mut s = self.state.lock();
            if let Some(why) = &s.stats.fenced {
                return Err(ObjectError::Fenced(why.clone()));
            }
            if s.pending.is_empty() {
                return Ok(());
            }
            let (taken, mut whole) = match take {
                Take::All => {
                    let taken = std::mem::take(&mut s.pending);
                    let whole = self.whole_chunks(&taken, &s.logged, take);
                    (taken, whole)
                }
                Take::WholeChunks => self.whole_part(&mut s),
            };
            s.in_flight = taken.clone();
            let zeros = self.zeros_over_nothing(&s, &taken, &mut whole);
            (s.next_wal, taken, whole, zeros)
        };
        // Not in the WAL: written again by the next flush, behind
        // anything written since. Chunks it PUT are named by no record:
        // garbage (`foliofs gc`), or written over by this writer's next
        // try at this number.
        let put_back = || {
            let mut s = self.state.lock();
            let back = std::mem::take(&mut s.in_flight);
            for (b, d) in back {
                s.pending.entry(b).or_insert(d);
            }
        };
        let whole = match self.flush_chunks(seq, &blocks, whole) {
            Ok(w) => w,
            Err(e) => {
                put_back();
                return Err(e.into());
            }
        };
        let whole_idx: std::collections::BTreeSet<u64> = whole.iter().map(|w| w.0).collect();
        let in_whole = |b: u64| {
            whole_idx.contains(&(b / self.chunk_blocks)) || zeros.contains(&(b / self.chunk_blocks))
        };
        let list: Vec<(u64, &[u8])> = blocks
            .iter()
            .filter(|(&b, _)| !in_whole(b))
            .map(|(&b, d)| (b, &d[..]))
            .collect();
        let idxs: Vec<u64> = whole_idx.iter().copied().collect();
        let body = Bytes::from(WalRecord::encode(self.epoch, seq, &list, &idxs));
        let n = body.len() as u64;
        let key = wal_key(&self.prefix, seq);
        let r = self.retrying(&key, || {
            self.store
                .put_opts(&key, PutPayload::from(body.clone()), create_mode())
        });
        if let Err(e) = r {
            put_back();
            return match e {
                object_store::Error::AlreadyExists { .. } => Err(self.taken(&key, seq)),
                e => Err(e.into()),
            };
        }
        let mut s = self.state.lock();
        let done = std::mem::take(&mut s.in_flight);
        let version = flushed_version(seq);
        s.tick += 1;
        let tick = s.tick;
        for (idx, data) in &whole {
            s.chunk_flushed(*idx, version, self.chunk_blocks);
            let held = Held {
                version,
                data: data.clone(),
                used: tick,
                on_disk: false,
            };
            s.chunks.insert(*idx, held);
        }
        for (b, d) in done.into_iter().filter(|(b, _)| !in_whole(*b)) {
            s.logged.insert(b, d);
        }
        s.next_wal = seq + 1;
        s.stats.wal_puts += 1;
        s.stats.wal_bytes += n;
        s.stats.chunks_flushed += whole.len() as u64;
        let unsaved = self.trim_cache(&mut s);
        drop(s);
        self.save_chunks(unsaved);
        Ok(())
    }

    /// The chunks `whole` says `blocks` (a flush's) makes whole, PUT as
    /// objects at `flushed_version(seq)`, `FLUSH_PUTS` in flight; their
    /// indexes and blocks. Only this writer PUTs keys of this number: a
    /// writer that fenced it wrote its fence there (no chunks), and
    /// writes its own chunks at later numbers.
    fn flush_chunks(
        &self,
        seq: u64,
        blocks: &BTreeMap<u64, Block>,
        whole: Whole,
    ) -> object_store::Result<Vec<(u64, Chunk)>> {
        let version = flushed_version(seq);
        let mut out = Vec::with_capacity(whole.chunks.len());
        let bodies: Vec<(u64, Path, Chunk)> = whole
            .chunks
            .iter()
            .map(|&idx| {
                let first = idx * self.chunk_blocks;
                let range = first..first + self.chunk_blocks;
                let mut parts: Vec<(&u64, &Block)> = blocks
                    .range(range.clone())
                    .chain(whole.from_wal.range(range))
                    .collect();
                parts.sort_unstable_by_key(|&(b, _)| *b);
                let chunk = Chunk::build(idx, self.chunk_len(idx), |v| {
                    for (_, d) in parts {
                        v.extend_from_slice(d);
                    }
                });
                (idx, chunk_key(&self.prefix, idx, version), chunk)
            })
            .collect();
        if let Some(first) = bodies.first() {
            // `FLUSH_PUTS` in flight all the time, not in groups that each
            // wait for their slowest. Retried whole: the keys are this
            // number's, this writer's alone.
            retry_for(
                self.rt.handle(),
                &self.name,
                self.opts.retry,
                None,
                &first.1,
                || {
                    futures::stream::iter(bodies.iter().map(|(_, key, chunk)| {
                        self.store
                            .put(key, PutPayload::from(chunk.object().clone()))
                    }))
                    .buffer_unordered(FLUSH_PUTS)
                    .try_collect::<Vec<_>>()
                },
            )?;
        }
        for (idx, _, chunk) in bodies {
            out.push((idx, chunk));
        }
        Ok(out)
    }

    /// The chunks `blocks` holds whole, or makes whole with the blocks of
    /// them the WAL holds (`logged`): a file written in order and flushed
    /// part-way through a chunk (an fsync) completes it at a later flush.
    /// The WAL's complete a chunk only in a flush that PUTs chunks anyway
    /// (one holding some whole, or one for the bound, `take`): a small
    /// fsync's flush stays one PUT, and its chunk is folded later.
    fn whole_chunks(&self, blocks: &BTreeMap<u64, Block>, logged: &Logged, take: Take) -> Whole {
        let mut per_chunk: BTreeMap<u64, u64> = BTreeMap::new();
        for &b in blocks.keys() {
            *per_chunk.entry(b / self.chunk_blocks).or_default() += 1;
        }
        let need = |idx: u64| self.chunk_len(idx) as u64 / BLOCK;
        let mut whole = Whole {
            chunks: per_chunk
                .iter()
                .filter(|&(&idx, &n)| n == need(idx))
                .map(|(&idx, _)| idx)
                .collect(),
            from_wal: BTreeMap::new(),
        };
        if whole.chunks.is_empty() && take == Take::All {
            return whole;
        }
        for (idx, n) in per_chunk {
            if n < need(idx) && n + logged.in_chunk(idx) >= need(idx) {
                let first = idx * self.chunk_blocks;
                let older: Vec<(u64, Block)> = logged
                    .range(first..first + self.chunk_blocks)
                    .filter(|(b, _)| !blocks.contains_key(b))
                    .map(|(&b, d)| (b, d.clone()))
                    .collect();
                if n + older.len() as u64 == need(idx) {
                    whole.from_wal.extend(older);
                    whole.chunks.push(idx);
                }
            }
        }
        whole.chunks.sort_unstable();
        whole
    }

    /// The chunks of `whole` that `blocks` fills with zeros where the
    /// image holds nothing yet (no version, no blocks in the WAL), taken
    /// out of it: such a chunk already reads as zeros, so nothing of it
    /// is PUT or logged. A new file system's journal and inode tables
    /// are mostly that (`foliofs mkfs` of 100 GiB PUT 3.4 GiB of them).
    fn zeros_over_nothing(
        &self,
        s: &State,
        blocks: &BTreeMap<u64, Block>,
        whole: &mut Whole,
    ) -> std::collections::BTreeSet<u64> {
        let zeros: std::collections::BTreeSet<u64> = whole
            .chunks
            .iter()
            .copied()
            .filter(|&idx| {
                let first = idx * self.chunk_blocks;
                s.chunk_version(idx).is_none()
                    && s.logged.in_chunk(idx) == 0
                    && blocks
                        .range(first..first + self.chunk_blocks)
                        .all(|(_, d)| d.iter().all(|&x| x == 0))
            })
            .collect();
        whole.chunks.retain(|idx| !zeros.contains(idx));
        zeros
    }

    /// For a flush the bound on `pending` asked for: the blocks of the
    /// chunks `pending` holds whole, taken out of it. The rest stays for
    /// a later flush, which may find their chunks whole too, rather than
    /// going to the WAL now and again into a chunk at the checkpoint
    /// that folds them. All of `pending`, as for any other flush, when
    /// what would stay is more than half the bound (a random writer's
    /// blocks): what stays is then at most that.
    /// With the chunks the blocks taken make whole: the same for all of
    /// `pending` as for the part taken.
    fn whole_part(&self, s: &mut State) -> (BTreeMap<u64, Block>, Whole) {
        let whole = self.whole_chunks(&s.pending, &s.logged, Take::WholeChunks);
        let idxs: std::collections::BTreeSet<u64> = whole.chunks.iter().copied().collect();
        let (taken, staying): (BTreeMap<u64, Block>, BTreeMap<u64, Block>) =
            std::mem::take(&mut s.pending)
                .into_iter()
                .partition(|(b, _)| idxs.contains(&(b / self.chunk_blocks)));
        if idxs.is_empty() || 2 * staying.len() as u64 * BLOCK > self.opts.pending_bytes {
            let mut all = taken;
            all.extend(staying);
            return (all, whole);
        }
        s.pending = staying;
        (taken, whole)
    }

    /// WAL number `seq` was there when this writer meant to create it:
    /// our own PUT whose answer was lost (its epoch is ours: its blocks
    /// are durable), or another writer's fence (fenced).
    fn taken(&self, key: &Path, seq: u64) -> ObjectError {
        let dev = (
            self.len / BLOCK,
            self.len.div_ceil(self.chunk_blocks * BLOCK),
        );
        match self
            .rt
            .block_on(taken_by(&*self.store, key, self.epoch, dev))
        {
            TakenBy::Us(rec) => {
                let mut s = self.state.lock();
                // Its chunks hold what this try PUT at the number: the
                // same blocks or later ones, all still in `pending`.
                for idx in rec.chunks {
                    s.chunks.remove(&idx);
                    s.chunk_flushed(idx, flushed_version(seq), self.chunk_blocks);
                }
                for (b, d) in rec.blocks {
                    s.logged.insert(b, d.into());
                }
                s.next_wal = seq + 1;
                ObjectError::Retry
            }
            TakenBy::LosingClaim => {
                self.state.lock().next_wal = seq + 1;
                ObjectError::Retry
            }
            TakenBy::Another(why) => self.fence(format!("fenced: WAL {seq} {why}")),
        }
    }

    /// Stop writing for good, naming who took the image where it can.
    fn fence(&self, why: String) -> ObjectError {
        let holder = self.rt.block_on(holder_note(&*self.store, &self.prefix));
        let why = format!("{why}{holder}");
        log::error!("{}: {why}: writing nothing more", self.name);
        self.state.lock().stats.fenced = Some(why.clone());
        ObjectError::Fenced(why)
    }

    /// There is WAL to fold and `checkpoint_bytes` of it, and folding it
    /// writes no more than `FOLD_COST_MAX` times that in chunks, or there
    /// is `sparse_fold` times as much (the checkpointer starts one).
    fn checkpoint_due(&self, s: &State) -> bool {
        let chunk_bytes = self.chunk_blocks * BLOCK;
        let span = s.wal_span_bytes(chunk_bytes);
        let writes = s.logged.chunks() as u64 * chunk_bytes;
        !(s.logged.is_empty() && s.flushed.is_empty())
            && span >= self.opts.checkpoint_bytes
            && (writes <= FOLD_COST_MAX * span || span >= self.latest_fold())
    }

    /// The WAL at which a fold is due however spread its blocks are
    /// (`ObjectOptions::sparse_fold`).
    fn latest_fold(&self) -> u64 {
        self.opts.sparse_fold.max(1) * self.opts.checkpoint_bytes
    }

    /// The checkpointer thread: whenever `checkpoint_bytes` of WAL have
    /// gathered, fold them (flushes go on meanwhile). A checkpoint that
    /// fails is tried again after a pause; the WAL holds everything until
    /// one succeeds.
    fn checkpointer(&self) {
        let mut pause = std::time::Duration::ZERO;
        loop {
            {
                let mut s = self.state.lock();
                let until = std::time::Instant::now() + pause;
                while !s.stopping && std::time::Instant::now() < until {
                    self.changed.wait_until(&mut s, until);
                }
                while !s.stopping && s.stats.fenced.is_none() && !self.checkpoint_due(&s) {
                    self.changed.wait(&mut s);
                }
                if s.stopping || s.stats.fenced.is_some() {
                    return;
                }
            }
            let done = {
                let _c = self.checkpointing.lock();
                self.checkpoint(false)
            };
            let mut s = self.state.lock();
            match done {
                Ok(()) => pause = std::time::Duration::ZERO,
                Err(_) if s.stopping => return,
                Err(e) => {
                    if s.stats.fenced.is_none() {
                        log::warn!("{}: checkpoint failed ({e}); trying again", self.name);
                    }
                    s.stats.checkpoint_failed = Some(e.to_string());
                    pause =
                        (pause * 2).clamp(std::time::Duration::from_secs(1), CHECKPOINT_PAUSE_MAX);
                }
            }
            drop(s);
            self.changed.notify_all();
        }
    }

    /// Fold the WAL into new chunk objects and write the next manifest
    /// (naming no writer when `closing`), then delete what it replaced.
    /// Called with `checkpointing` held; flushes go on meanwhile.
    fn checkpoint(&self, closing: bool) -> Result<(), ObjectError> {
        // The WAL number taken with the blocks folded: the shipper may
        // move more into `logged` meanwhile, for the next checkpoint.
        // Chunks flushes wrote are named by the manifest as they are,
        // unless the WAL wrote blocks of them since (folded onto them).
        let (id, mut next, folded, flushed, superseded, next_wal) = {
            let mut s = self.state.lock();
            (
                s.manifest_id,
                s.manifest.clone(),
                s.logged.blocks(),
                s.flushed.clone(),
                std::mem::take(&mut s.superseded),
                s.next_wal,
            )
        };
        let new_id = id + 1;
        let old = next.clone();
        let base = |idx: u64| flushed.get(&idx).or_else(|| old.chunks.get(&idx)).copied();
        let mut by_chunk: BTreeMap<u64, Vec<(u64, &Block)>> = BTreeMap::new();
        for (&b, d) in &folded {
            by_chunk
                .entry(b / self.chunk_blocks)
                .or_default()
                .push((b, d));
        }
        let mut made = Vec::new();
        let chunks: Vec<_> = by_chunk.iter().collect();
        // A few chunk PUTs in flight at once: one at a time, a checkpoint
        // of 64 MiB of WAL is 16 PUTs of 4 MiB end to end, in the path of
        // the flush that triggers it.
        for group in chunks.chunks(CHECKPOINT_PUTS) {
            let mut bodies = Vec::with_capacity(group.len());
            for &(&idx, blocks) in group {
                // A chunk the WAL covers whole is not read back first.
                let whole = blocks.len() as u64 * BLOCK == self.chunk_len(idx) as u64;
                let old = match base(idx) {
                    Some(v) if !whole => Some(self.chunk(idx, v)?),
                    _ => None,
                };
                let len = self.chunk_len(idx);
                let chunk = Chunk::build(idx, len, |v| {
                    let head = v.len();
                    match &old {
                        Some(old) => v.extend_from_slice(old.blocks()),
                        None => v.resize(head + len, 0),
                    }
                    for (b, d) in blocks {
                        let at = head + ((b % self.chunk_blocks) * BLOCK) as usize;
                        v[at..at + BLOCK as usize].copy_from_slice(d);
                    }
                });
                bodies.push((idx, chunk_key(&self.prefix, idx, new_id), chunk));
            }
            // Retried as a group: a chunk key is this checkpoint's own,
            // so PUTting it again is harmless.
            let group_key = &bodies[0].1;
            retry_for(
                self.rt.handle(),
                &self.name,
                self.opts.retry,
                (!closing).then_some(&self.stop),
                group_key,
                || {
                    futures::future::try_join_all(bodies.iter().map(|(_, key, chunk)| {
                        self.store
                            .put(key, PutPayload::from(chunk.object().clone()))
                    }))
                },
            )?;
            for (idx, _, chunk) in bodies {
                next.chunks.insert(idx, new_id);
                made.push((idx, chunk));
            }
        }
        for (&idx, &v) in &flushed {
            if !by_chunk.contains_key(&idx) {
                next.chunks.insert(idx, v);
            }
        }
        next.wal_start = next_wal;
        next.format = OBJECT_FORMAT;
        if closing {
            next.writer = None;
        }
        let key = manifest_key(&self.prefix, new_id);
        let body = Bytes::from(next.encode());
        match self.retrying(&key, || {
            self.store
                .put_opts(&key, PutPayload::from(body.clone()), create_mode())
        }) {
            Ok(_) => {}
            Err(object_store::Error::AlreadyExists { .. }) => {
                return Err(self.fence(format!("fenced: manifest {new_id} was claimed")));
            }
            Err(e) => {
                self.state.lock().superseded.extend(superseded);
                return Err(e.into());
            }
        }
        // Flushed versions folded here (the WAL wrote blocks of them
        // after): replaced, as the superseded ones are.
        let mut dropped = superseded;
        dropped.extend(
            flushed
                .iter()
                .filter(|(i, v)| next.chunks.get(i) != Some(v))
                .map(|(&i, &v)| (i, v)),
        );
        {
            let mut s = self.state.lock();
            s.manifest_id = new_id;
            s.manifest = next.clone();
            // The manifest names them now (or what was folded onto them);
            // a flush after the checkpoint began keeps its newer one.
            for (idx, v) in &flushed {
                if s.flushed.get(idx) == Some(v) {
                    s.flushed.remove(idx);
                }
            }
            s.tick += 1;
            let tick = s.tick;
            s.stats.chunk_puts += made.len() as u64;
            s.stats.checkpoints += 1;
            s.stats.checkpoint_failed = None;
            for (idx, data) in made {
                if s.chunk_version(idx) == Some(new_id) {
                    let held = Held {
                        version: new_id,
                        data,
                        used: tick,
                        on_disk: false,
                    };
                    s.chunks.insert(idx, held);
                }
            }
            for (b, d) in &folded {
                // The same bytes, not a later write of the block: `folded`
                // holds them, so no other buffer can be at their address.
                if s.logged
                    .get(*b)
                    .is_some_and(|cur| cur.as_ptr() == d.as_ptr())
                {
                    s.logged.remove(*b);
                }
            }
            let unsaved = self.trim_cache(&mut s);
            drop(s);
            self.save_chunks(unsaved);
        }
        self.sweep_replaced(id, &old, &next, &dropped);
        Ok(())
    }

    /// After manifest `id + 1` (`next`) replaced `id` (`old`): delete what
    /// no manifest from now on names (the folded WAL, the chunk versions
    /// replaced, manifests before the previous one) and no snapshot or
    /// reader's lease keeps. The markers and leases are listed only now,
    /// after the new manifest was created: a snapshot taken (or a lease
    /// written) from `id` or before checked that no manifest after its
    /// own existed once its marker was there, so it is in this list (see
    /// `keep`, `lease`). If they cannot be listed, nothing is deleted:
    /// `foliofs gc` sweeps it later.
    fn sweep_replaced(&self, id: u64, old: &Manifest, next: &Manifest, dropped: &[(u64, u64)]) {
        let kept = {
            let mut cache = self.kept_manifests.lock();
            self.rt.block_on(async {
                let holders = keep::Holders::list(&*self.store, &self.prefix, now_secs()).await?;
                keep::kept(&*self.store, &self.prefix, &holders.holds(), &mut cache).await
            })
        };
        let kept = match kept {
            Ok(k) => k,
            Err(e) => {
                log::warn!(
                    "{}: snapshots and leases not listed ({e}): nothing deleted after manifest {}",
                    self.name,
                    id + 1
                );
                return;
            }
        };
        let fences = self
            .rt
            .block_on(fence_numbers(&*self.store, &self.prefix, old.wal_start));
        let fences = match fences {
            Ok(f) => f,
            Err(e) => {
                log::warn!("{}: WAL not listed ({e}): nothing deleted", self.name);
                return;
            }
        };
        let mut gone: Vec<Path> = (old.wal_start..next.wal_start)
            .filter(|&seq| !kept.wal(seq) && !fences.contains(&seq))
            .map(|seq| wal_key(&self.prefix, seq))
            .collect();
        for (idx, v) in &old.chunks {
            if next.chunks.get(idx) != Some(v) && !kept.chunks.contains(&(*idx, *v)) {
                gone.push(chunk_key(&self.prefix, *idx, *v));
            }
        }
        // Chunks flushes wrote that no manifest names: kept while the WAL
        // naming them is (a snapshot or a reader reads them through it).
        for &(idx, v) in dropped {
            let named = flushed_seq(v).is_some_and(|seq| kept.wal(seq));
            if !named && !kept.chunks.contains(&(idx, v)) {
                gone.push(chunk_key(&self.prefix, idx, v));
            }
        }
        if id > 1 && !kept.manifests.contains(&(id - 1)) {
            gone.push(manifest_key(&self.prefix, id - 1));
        }
        for key in gone {
            match self.rt.block_on(self.store.delete(&key)) {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => log::warn!("{key}: not deleted ({e}); left as garbage"),
            }
        }
    }
}

/// `durability=local`: a flush appends what was written since the last
/// one to the local WAL and returns once it is synced there; one shipper
/// thread PUTs the local records in order, each batch of them as the next
/// WAL object, and only then are their blocks in `logged`, for the next
/// checkpoint to fold. Writers wait while more than `wal_lag_max` bytes
/// are unshipped. A shipper fenced, or failing past the retry window,
/// stops the device writing (as a failed flush does): the local WAL stays
/// for the next open from this cache directory, which ships it first.
impl Core {
    /// Called with `flushing` held.
    fn flush_local(&self) -> io::Result<()> {
        let disk = self
            .disk
            .as_ref()
            .expect("durability=local has a cache_dir");
        let record = {
            let _f = self.flushing.lock();
            match self.append_local(disk)? {
                Some(record) => record,
                None => return Ok(()),
            }
        };
        // Outside `flushing`: the next flush appends meanwhile.
        if let Err(e) = disk.sync_wal(record) {
            let _f = self.flushing.lock();
            return self.flush_past_local(disk, Some(e));
        }
        let mut s = self.state.lock();
        // Durable here; the writer waits only for the lag to shrink.
        while s.unshipped_bytes > self.opts.wal_lag_max && s.stats.fenced.is_none() {
            self.changed.wait(&mut s);
        }
        match &s.stats.fenced {
            Some(why) => Err(eio(format!("{}: {why}", self.name))),
            None => Ok(()),
        }
    }

    /// The blocks written since the last flush appended to the local WAL
    /// (not synced yet: `CacheDir::sync_wal`) and queued to ship; their
    /// record, or None if there were none or they went to the store
    /// instead (`flush_past_local`). Called with `flushing` held.
    fn append_local(&self, disk: &CacheDir) -> io::Result<Option<u64>> {
        let blocks = {
            let mut s = self.state.lock();
            if let Some(why) = &s.stats.fenced {
                return Err(eio(format!("{}: {why}", self.name)));
            }
            if s.pending.is_empty() {
                return Ok(None);
            }
            if s.local_wal_paused_until
                .is_some_and(|t| std::time::Instant::now() < t)
            {
                drop(s);
                return self.flush_past_local(disk, None).map(|()| None);
            }
            let taken = std::mem::take(&mut s.pending);
            s.in_flight = taken.clone();
            taken
        };
        let list: Vec<(u64, &[u8])> = blocks.iter().map(|(&b, d)| (b, &d[..])).collect();
        let appended = disk.append_wal(self.epoch, &list);
        let mut s = self.state.lock();
        let back = std::mem::take(&mut s.in_flight);
        let record = match appended {
            Ok(r) => r,
            Err(e) => {
                for (b, d) in back {
                    s.pending.entry(b).or_insert(d);
                }
                drop(s);
                return self.flush_past_local(disk, Some(e)).map(|()| None);
            }
        };
        if s.local_wal_paused_until.take().is_some() {
            log::info!("{}: flushes go to the local WAL again", self.name);
        }
        s.unshipped_bytes += blocks.len() as u64 * BLOCK;
        for (&b, d) in &blocks {
            s.unshipped.insert(b, (record, d.clone()));
        }
        s.to_ship.push_back(Shipment {
            queued: std::time::Instant::now(),
            record,
            blocks: blocks.into_iter().collect(),
        });
        if s.to_ship.len() == 1 || s.unshipped_bytes >= self.ship_batch() {
            self.ship_due.notify_one();
        }
        Ok(Some(record))
    }

    /// The local WAL could not take a flush (`error`: its disk full even
    /// after the chunk copies made room, or failing): the flush goes to
    /// the store itself, as with durability=object, which promises more
    /// than the user asked. It goes behind every local record, which
    /// must have shipped first, and the local WAL is emptied before it,
    /// so that nothing there ships again on top of it at the next open.
    /// Flushes go this way for `LOCAL_WAL_PAUSE` before the local WAL is
    /// tried again (a new segment is written whole before a record), and
    /// without `error` (not tried) meanwhile.
    fn flush_past_local(&self, disk: &CacheDir, error: Option<io::Error>) -> io::Result<()> {
        {
            let mut s = self.state.lock();
            if let Some(e) = &error {
                if s.local_wal_paused_until.is_none() {
                    log::warn!(
                        "{}: the local WAL in the cache_dir was not written ({e}): flushes \
                         wait for the store instead until it can be",
                        self.name
                    );
                }
                s.local_wal_paused_until = Some(std::time::Instant::now() + LOCAL_WAL_PAUSE);
            }
            s.stats.flushes_past_local_wal += 1;
            self.wait_shipped_in(&mut s);
            if let Some(why) = &s.stats.fenced {
                return Err(eio(format!("{}: {why}", self.name)));
            }
        }
        disk.clear_wal().map_err(|e| {
            eio(format!(
                "{}: the local WAL in the cache_dir could not be emptied for a flush past it \
                 ({e})",
                self.name
            ))
        })?;
        // Its zeros are room the disk may lack.
        disk.drop_spare();
        self.flush_to_store(Take::All)
    }

    /// Wait until every local record has shipped and no checkpoint is
    /// due or running (`Device::settle`). An error if the device is
    /// fenced or its checkpoints fail.
    fn settle(&self) -> io::Result<()> {
        if self.opts.read_only {
            return Ok(());
        }
        let mut s = self.state.lock();
        if self.durability == Durability::Local {
            self.wait_shipped_in(&mut s);
        }
        loop {
            if let Some(why) = s
                .stats
                .fenced
                .as_ref()
                .or(s.stats.checkpoint_failed.as_ref())
            {
                return Err(eio(format!("{}: {why}", self.name)));
            }
            if !self.checkpoint_due(&s) {
                break;
            }
            self.changed.wait(&mut s);
        }
        drop(s);
        // The checkpoint that took the WAL, if one is running.
        drop(self.checkpointing.lock());
        Ok(())
    }

    /// Wait until everything flushed locally has shipped (close).
    fn wait_shipped(&self) {
        let mut s = self.state.lock();
        self.wait_shipped_in(&mut s);
    }

    /// Wait, `state` held as `s`, until every local record has shipped or
    /// the device is fenced; the shipper does not linger meanwhile.
    fn wait_shipped_in(&self, s: &mut parking_lot::MutexGuard<'_, State>) {
        s.ship_waiters += 1;
        self.ship_due.notify_one();
        while !s.to_ship.is_empty() && s.stats.fenced.is_none() {
            self.changed.wait(s);
        }
        s.ship_waiters -= 1;
    }

    /// The shipper thread: PUT what waits in the local WAL, in order.
    fn shipper(&self) {
        let disk = self
            .disk
            .as_ref()
            .expect("durability=local has a cache_dir");
        while let Some((seq, batch)) = self.next_batch() {
            let last = batch.last().map_or(0, |r| r.record);
            match self.ship(seq, &batch) {
                Ok(0) => {
                    self.state.lock().next_wal = seq + 1;
                    continue;
                }
                Ok(n) => {
                    // Their local copies go before the state says they
                    // shipped: a flush past the local WAL waits for that,
                    // then empties it, with no delete of ours to come.
                    disk.shipped(last);
                    self.shipped(seq, batch, n);
                }
                Err(_) if self.stop.load(Ordering::Relaxed) => return,
                Err(why) => {
                    log::error!("{}: {why}: writing nothing more", self.name);
                    self.state.lock().stats.fenced = Some(why);
                    self.changed.notify_all();
                    return;
                }
            }
        }
    }

    /// Every record waiting, with the WAL number they ship as; None once
    /// told to stop.
    /// They wait for `SHIP_LINGER` after the oldest was queued unless
    /// `SHIP_BATCH` of them are there or someone waits for them.
    fn next_batch(&self) -> Option<(u64, Vec<Shipment>)> {
        let batch = self.ship_batch();
        let mut s = self.state.lock();
        loop {
            if s.stopping {
                return None;
            }
            let Some(first) = s.to_ship.front() else {
                self.ship_due.wait(&mut s);
                continue;
            };
            let due = first.queued + SHIP_LINGER;
            if s.ship_waiters > 0 || s.unshipped_bytes >= batch || std::time::Instant::now() >= due
            {
                return Some((s.next_wal, s.to_ship.iter().cloned().collect()));
            }
            self.ship_due.wait_until(&mut s, due);
        }
    }

    /// What the shipper PUTs without waiting out its linger.
    fn ship_batch(&self) -> u64 {
        SHIP_BATCH.min(self.opts.wal_lag_max / 4)
    }

    /// PUT the batch as WAL `seq`: each block's newest version in it.
    /// Ok(bytes PUT), or Ok(0) if `seq` held a losing claim's fence: the
    /// batch goes to the next number.
    fn ship(&self, seq: u64, batch: &[Shipment]) -> Result<u64, String> {
        let mut newest: BTreeMap<u64, &Block> = BTreeMap::new();
        for r in batch {
            newest.extend(r.blocks.iter().map(|(b, d)| (*b, d)));
        }
        let list: Vec<(u64, &[u8])> = newest.iter().map(|(&b, d)| (b, &d[..])).collect();
        let body = Bytes::from(WalRecord::encode(self.epoch, seq, &list, &[]));
        let n = body.len() as u64;
        let key = wal_key(&self.prefix, seq);
        let r = retry_for(
            self.rt.handle(),
            &self.name,
            self.opts.retry,
            Some(&self.stop),
            &key,
            || {
                self.store
                    .put_opts(&key, PutPayload::from(body.clone()), create_mode())
            },
        );
        match r {
            Ok(_) => Ok(n),
            Err(object_store::Error::AlreadyExists { .. }) => {
                // Only this writer writes at its epoch: a record of it
                // there is this very PUT, its answer lost (retried whole).
                match self.rt.block_on(taken_by(
                    &*self.store,
                    &key,
                    self.epoch,
                    (u64::MAX, u64::MAX),
                )) {
                    TakenBy::Us(_) => Ok(n),
                    TakenBy::LosingClaim => Ok(0),
                    TakenBy::Another(why) => {
                        let holder = self.rt.block_on(holder_note(&*self.store, &self.prefix));
                        Err(format!(
                            "fenced: WAL {seq} {why}{holder}; what was flushed only to the \
                             local WAL since is not in the image"
                        ))
                    }
                }
            }
            Err(e) => Err(format!(
                "the local WAL could not ship (WAL {seq}: {e}); it stays in the cache_dir \
                 and ships when the image is mounted from it again"
            )),
        }
    }

    /// The batch is in the store: its blocks move to `logged`.
    fn shipped(&self, seq: u64, batch: Vec<Shipment>, bytes: u64) {
        let mut s = self.state.lock();
        for Shipment { record, blocks, .. } in batch {
            let front = s.to_ship.pop_front().expect("the batch was queued");
            debug_assert_eq!(front.record, record);
            for (b, d) in blocks {
                if s.unshipped.get(&b).is_some_and(|(r, _)| *r == record) {
                    s.unshipped.remove(&b);
                }
                s.logged.insert(b, d);
                s.unshipped_bytes -= BLOCK;
            }
        }
        s.next_wal = seq + 1;
        s.stats.wal_puts += 1;
        s.stats.wal_bytes += bytes;
        drop(s);
        self.changed.notify_all();
    }
}

/// Who holds a WAL number a writer of `epoch` found taken.
enum TakenBy {
    /// This writer: its own PUT whose answer was lost (its blocks are
    /// durable).
    Us(WalRecord),
    /// The fence of a claim that raced this writer's and lost: its writer
    /// found our fence below its own and writes nothing, so the number is
    /// stepped over.
    LosingClaim,
    /// Another writer (or a record that cannot be read): this one is
    /// fenced. Says what was found.
    Another(String),
}

async fn taken_by(
    store: &dyn ObjectStore,
    key: &Path,
    epoch: u64,
    (dev_blocks, dev_chunks): (u64, u64),
) -> TakenBy {
    let read = async {
        let bytes = store.get(key).await?.bytes().await?;
        Ok::<_, ObjectError>(WalRecord::decode(key, &bytes, dev_blocks, dev_chunks)?)
    };
    match read.await {
        Ok(rec) if rec.epoch == epoch => TakenBy::Us(rec),
        Ok(rec) if rec.epoch < epoch && rec.blocks.is_empty() && rec.chunks.is_empty() => {
            TakenBy::LosingClaim
        }
        Ok(rec) => TakenBy::Another(format!(
            "was written at epoch {} (this writer's is {epoch})",
            rec.epoch
        )),
        Err(e) => TakenBy::Another(format!("is another writer's ({e})")),
    }
}

/// `op` until it succeeds, or fails for a cause that trying again cannot
/// change (a conditional PUT that lost, an object not there), or `window`
/// has passed: the store may be restarting; or `stop` is set.
fn retry_for<T, F, Fut>(
    rt: &tokio::runtime::Handle,
    name: &str,
    window: std::time::Duration,
    stop: Option<&AtomicBool>,
    what: &Path,
    mut op: F,
) -> object_store::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = object_store::Result<T>>,
{
    let until = std::time::Instant::now() + window;
    let mut pause = std::time::Duration::from_millis(100);
    let mut warned = false;
    loop {
        match rt.block_on(op()) {
            Err(
                e @ (object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }
                | object_store::Error::NotFound { .. }
                | object_store::Error::NotImplemented
                | object_store::Error::NotSupported { .. }
                | object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }),
            ) => return Err(e),
            Err(e)
                if std::time::Instant::now() < until
                    && !stop.is_some_and(|s| s.load(Ordering::Relaxed)) =>
            {
                if !warned {
                    log::warn!("{name}: {what}: {e}; trying again for up to {window:?}");
                    warned = true;
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_secs(5));
            }
            r => {
                if warned && r.is_ok() {
                    log::info!("{name}: {what}: done after the store came back");
                }
                return r;
            }
        }
    }
}

/// What the WAL after a manifest holds.
struct Replayed {
    /// The first WAL number not read.
    next: u64,
    /// Blocks, each its newest.
    logged: Logged,
    /// Chunks flushes wrote whole (index -> version), each its newest.
    flushed: BTreeMap<u64, u64>,
    /// Flushed versions a later one replaced.
    superseded: Vec<(u64, u64)>,
}

/// The WAL objects after `manifest`'s checkpoint, in order, up to
/// `fence` (a claim's own fence), or to the first number missing.
async fn replay(
    store: &dyn ObjectStore,
    prefix: &Path,
    manifest: &Manifest,
    fence: Option<u64>,
) -> Result<Replayed, ObjectError> {
    let mut logged = Logged::new(manifest.chunk_blocks);
    let mut flushed = BTreeMap::new();
    let mut superseded = Vec::new();
    let chunk_bytes = manifest.chunk_blocks * BLOCK;
    let dev_chunks = manifest.len.div_ceil(chunk_bytes);
    let mut seq = manifest.wal_start;
    let present = wal_numbers(store, prefix, seq).await?;
    let end = fence.unwrap_or(u64::MAX);
    for s in present {
        if s != seq || s >= end {
            break;
        }
        let key = wal_key(prefix, s);
        let bytes = store.get(&key).await?.bytes().await?;
        let rec = WalRecord::decode(&key, &bytes, manifest.len / BLOCK, dev_chunks)?;
        if rec.seq != s {
            return Err(Damaged {
                key: key.to_string(),
                what: format!("holds WAL {} of epoch {}", rec.seq, rec.epoch),
            }
            .into());
        }
        if rec.epoch > manifest.epoch && fence.is_some() {
            // Another claim, of a higher epoch, fenced before ours: it
            // goes on (it skips our fence), we write nothing.
            return Err(ObjectError::Fenced(format!(
                "claimed at the same moment by another writer (epoch {} fenced at WAL {s}, \
                 before this claim of epoch {}): that one goes on",
                rec.epoch, manifest.epoch
            )));
        }
        for idx in rec.chunks {
            chunk_flushed(
                &mut logged,
                &mut flushed,
                &mut superseded,
                idx,
                flushed_version(s),
                manifest.chunk_blocks,
            );
        }
        for (b, d) in rec.blocks {
            logged.insert(b, Block::from(d));
        }
        seq += 1;
    }
    if let Some(f) = fence {
        if seq != f {
            return Err(Damaged {
                key: wal_key(prefix, seq).to_string(),
                what: format!("missing: the WAL runs to {f}"),
            }
            .into());
        }
    }
    Ok(Replayed {
        next: seq,
        logged,
        flushed,
        superseded,
    })
}

/// Chunks the cache holds.
fn cache_chunks(opts: &ObjectOptions, chunk_blocks: u64) -> usize {
    (opts.cache_bytes / (chunk_blocks * BLOCK)).max(2) as usize
}

fn check_io(len: u64, offset: u64, n: usize) -> io::Result<()> {
    if offset.checked_add(n as u64).is_none_or(|end| end > len) {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("I/O of {n} bytes at {offset} is past the device end {len}"),
        ));
    }
    Ok(())
}

impl Core {
    /// For I/O of `n` bytes at `offset` that is not in whole blocks (the
    /// superblock's 512-byte probe): the whole blocks it lies in, read,
    /// with where the bytes start in them.
    fn around(&self, offset: u64, n: usize) -> io::Result<Option<(u64, Vec<u8>, usize)>> {
        let start = offset / BLOCK * BLOCK;
        let end = (offset + n as u64).div_ceil(BLOCK) * BLOCK;
        if (start, end) == (offset, offset + n as u64) {
            return Ok(None);
        }
        let mut whole = vec![0; (end - start) as usize];
        self.read_blocks(&mut whole, start)?;
        Ok(Some((start, whole, (offset - start) as usize)))
    }
}

impl Device for ObjectDevice {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.core.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.core.write_at(buf, offset)
    }

    fn flush(&self) -> io::Result<()> {
        self.core.flush()
    }

    fn settle(&self) -> io::Result<()> {
        self.core.settle()
    }

    fn len(&self) -> u64 {
        self.core.len
    }
}

impl Core {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_io(self.len, offset, buf.len())?;
        match self.around(offset, buf.len())? {
            None => self.read_blocks(buf, offset),
            Some((_, whole, at)) => {
                buf.copy_from_slice(&whole[at..at + buf.len()]);
                Ok(())
            }
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_io(self.len, offset, buf.len())?;
        match self.around(offset, buf.len())? {
            None => self.write_blocks(buf, offset),
            Some((start, mut whole, at)) => {
                whole[at..at + buf.len()].copy_from_slice(buf);
                self.write_blocks(&whole, start)
            }
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.flush_taking(Take::All)
    }

    /// A flush, of what `take` says if the WAL is in the store.
    fn flush_taking(&self, take: Take) -> io::Result<()> {
        if self.opts.read_only {
            return Ok(());
        }
        // A local flush holds `flushing` for its append only (see
        // `flush_local`).
        let _f = if self.durability == Durability::Local {
            self.flush_local()?;
            None
        } else {
            let f = self.flushing.lock();
            self.flush_to_store(take)?;
            Some(f)
        };
        // The checkpointer folds the WAL in the background; a flush waits
        // only when the WAL not yet folded (held in memory) is a whole
        // `checkpoint_bytes` past the latest a fold is due.
        let mut s = self.state.lock();
        if self.checkpoint_due(&s) {
            self.changed.notify_all();
        }
        while !s.logged.is_empty()
            && s.unfolded_bytes() >= self.latest_fold() + self.opts.checkpoint_bytes
        {
            if let Some(why) = s
                .stats
                .fenced
                .as_ref()
                .or(s.stats.checkpoint_failed.as_ref())
            {
                return Err(eio(format!(
                    "{}: the WAL is not being folded into chunks: {why}",
                    self.name
                )));
            }
            self.changed.wait(&mut s);
        }
        Ok(())
    }
}

impl Core {
    /// Whole blocks from `offset`.
    fn read_blocks(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let first = offset / BLOCK;
        let bs = BLOCK as usize;
        self.read_ahead(first, first + (buf.len() / bs) as u64);
        let mut i = 0;
        while i < buf.len() / bs {
            let b = first + i as u64;
            // Blocks written since the last checkpoint, else the chunk.
            let version = {
                let s = self.state.lock();
                if let Some(d) = s.block(b) {
                    buf[i * bs..(i + 1) * bs].copy_from_slice(d);
                    i += 1;
                    continue;
                }
                s.chunk_version(b / self.chunk_blocks)
            };
            let idx = b / self.chunk_blocks;
            // The rest of this chunk's run in one go.
            let run = ((idx + 1) * self.chunk_blocks - b).min((buf.len() / bs - i) as u64) as usize;
            // A checkpoint that replaces the chunk meanwhile (folding
            // blocks of the run out of the WAL, and perhaps deleting the
            // version asked for) sends the run round again.
            let replaced = || self.state.lock().chunk_version(idx) != version;
            match version {
                None => buf[i * bs..(i + run) * bs].fill(0),
                Some(v) => {
                    let at = (b % self.chunk_blocks) as usize;
                    match self.chunk_run(idx, v, at, &mut buf[i * bs..(i + run) * bs]) {
                        Ok(()) => {}
                        Err(_) if replaced() => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
            // Blocks of the run written meanwhile win over the chunk.
            let s = self.state.lock();
            if s.chunk_version(idx) != version {
                continue;
            }
            for k in 0..run {
                if let Some(d) = s.block(b + k as u64) {
                    buf[(i + k) * bs..(i + k + 1) * bs].copy_from_slice(d);
                }
            }
            drop(s);
            i += run;
        }
        Ok(())
    }

    /// Before a read of blocks `first..end`: fetch the chunks after its
    /// first that it spans itself, beside each other rather than one
    /// after the other; and, if it went on from the read before, the
    /// chunks after it (see `readahead`). Only those the cache lacks, and
    /// only with read-ahead on.
    fn read_ahead(&self, first: u64, end: u64) {
        let next = self.ahead.after_read(first, end, self.chunk_blocks);
        if end > first {
            let (a, z) = (first / self.chunk_blocks, (end - 1) / self.chunk_blocks);
            self.fetch_ahead(a + 1..z + 1);
        }
        self.fetch_ahead(next);
    }

    /// Start fetching chunks `range` that neither memory nor the cache
    /// directory holds (within the read-ahead's depth).
    fn fetch_ahead(&self, range: std::ops::Range<u64>) {
        if range.is_empty() {
            return;
        }
        let wanted: Vec<(u64, u64)> = {
            let s = self.state.lock();
            range
                .filter_map(|idx| Some((idx, s.chunk_version(idx)?)))
                .filter(|(idx, v)| s.chunks.get(idx).is_none_or(|c| c.version != *v))
                .collect()
        };
        // What the cache directory holds is read from there, not fetched.
        let on_disk = |idx: u64, v: u64| self.disk.as_ref().is_some_and(|d| d.has_chunk(idx, v));
        for (idx, v) in wanted.into_iter().filter(|&(idx, v)| !on_disk(idx, v)) {
            let key = chunk_key(&self.prefix, idx, v);
            self.ahead
                .start(&self.rt, &self.store, key, idx, v, self.chunk_len(idx));
        }
    }

    /// Whole blocks at `offset`, into the next flush.
    fn write_blocks(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.opts.read_only {
            return Err(io::Error::from_raw_os_error(libc::EROFS));
        }
        // One copy and one allocation for the write, outside the lock;
        // each block a view of it, which keeps the whole copy until the
        // block is folded or written again (docs/DESIGN.md, "Copies of a
        // block's bytes").
        let bs = BLOCK as usize;
        let all = pool::copy(buf);
        let mut s = self.state.lock();
        if let Some(why) = &s.stats.fenced {
            return Err(eio(format!("{}: {why}", self.name)));
        }
        for k in 0..buf.len() / bs {
            s.pending
                .insert(offset / BLOCK + k as u64, all.slice(k * bs..(k + 1) * bs));
        }
        let held = s.pending.len() as u64 * BLOCK;
        drop(s);
        if held < self.opts.pending_bytes {
            return Ok(());
        }
        // While another flush uploads, writers go on up to twice the
        // bound rather than queue behind it: the next flush takes all.
        if held < 2 * self.opts.pending_bytes && self.flushing.is_locked() {
            return Ok(());
        }
        // Sooner than asked, as a disk's cache may write back: what the
        // device holds durable early breaks no ordering the engine relies
        // on (it orders by its flushes). So this flush may also leave
        // blocks for a later one, in any order.
        self.flush_taking(Take::WholeChunks)
    }
}

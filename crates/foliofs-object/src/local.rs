//! The cache directory (`cache_dir`): chunks fetched from the store,
//! kept on local disk within `cache_size`, and, with `durability=local`,
//! the WAL made durable here before it ships.
//!
//! Layout of the directory:
//!
//! ```text
//! lock              flock()ed while a device has the directory open
//! image             the store and prefix the directory caches (one image)
//! chunks/IDX-VER    a chunk object as fetched (its own checksum inside),
//!                   then a crc32c of each of its blocks
//! wal/SEGMENT       local WAL records, appended: each a WalRecord
//!                   (epoch, local record number, blocks, crc32c)
//! wal/spare         the next segment, made ahead (zeros, synced; made
//!                   as wal/spare.tmp, renamed when whole)
//! ```
//!
//! A chunk file is a copy of an immutable object: it is checked again
//! every time it is read, and one that fails is deleted and fetched
//! again. Read whole, it is the object's own check (`Chunk::decode`); a
//! run of its blocks is read alone (a random reader's 4 KiB, not the
//! chunk's 4 MiB), each block checked against the table after the
//! object, made from blocks that had passed the object's check. It is
//! written to a temporary name and renamed,
//! never synced: after a crash it is there whole or not at all, or it
//! fails its check.
//!
//! A WAL segment is appended to and synced (`fdatasync`) before a flush
//! returns; a new segment's directory entry is synced too. A record is
//! written from the blocks as the device holds them (a vectored write:
//! no copy of them is made for it). A new segment is the spare a thread
//! made ahead while the last one filled, renamed, where the disk has
//! room for one. The append is
//! made in order under the device's `flushing`, the sync after it, so
//! that the next flush writes its record while this one's sync waits on
//! the disk (as the engine's own writes overlap its flushes on an image
//! file); one sync runs at a time, and one covers every record written
//! before it began. A sync that fails poisons the local WAL: no record is
//! acknowledged from it, nor appended to it, until it is cleared (a
//! failed `fdatasync` reports its error once, and to one caller, and a
//! replay stops at the first bad record). A record cut by a crash fails
//! its checksum and ends the log (it was never acknowledged). Segments
//! are deleted once every record in them has shipped; a crash between
//! the PUT and the delete leaves records that
//! shipped, and the next open ships what is left again as one WAL object:
//! each block's newest local version, which no shipped record is newer
//! than (see `ObjectDevice::open`).
//!
//! Locks: `index` is a leaf (taken under the device's `state` never the
//! other way round, and under `synced`); WAL appends are made under the
//! device's `flushing`, syncs outside it.

use crate::layout::{Chunk, WalRecord, BLOCK, CHUNK_HEAD, CHUNK_TAIL};
use crate::ObjectError;
use object_store::path::Path;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// When a flush returns: once its blocks are in a WAL object in the
/// store, or once they are in the local WAL (shipped in order behind it,
/// writers waiting when more than `wal_lag_max` is unshipped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    #[default]
    Object,
    Local,
}

impl std::str::FromStr for Durability {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "object" => Ok(Durability::Object),
            "local" => Ok(Durability::Local),
            _ => Err(format!("durability={s}: object or local")),
        }
    }
}

/// A segment is closed and a new one begun past this many bytes, so
/// that shipped records leave the disk in steps of about this much.
const SEGMENT_BYTES: u64 = 16 << 20;

/// The next segment, made ahead (`CacheDir::make_spare`), and the name
/// it is made under until it is whole.
const SPARE: &str = "spare";
const SPARE_TMP: &str = "spare.tmp";

/// A spare is made ahead only where the local disk has this much free.
const SPARE_ROOM: u64 = 8 * SEGMENT_BYTES;

/// The header of a WAL record: magic, epoch, seq, block count.
const RECORD_HEADER: usize = 32;

/// Bytes of a chunk copy's table for `len` bytes of blocks: a crc32c of
/// each block, after the object.
fn table_len(len: usize) -> usize {
    len / BLOCK as usize * 4
}

/// What the directory holds, by name.
struct Index {
    /// (chunk, version) -> (bytes, last use).
    chunks: HashMap<(u64, u64), (u64, u64)>,
    chunk_bytes: u64,
    tick: u64,
    /// Segment number -> (the last record in it, its bytes).
    segments: BTreeMap<u64, (u64, u64)>,
    /// The segment appended to, open.
    current: Option<(u64, Arc<File>)>,
    /// Segments filled since the last sync, with their last record: the
    /// next sync covers them too.
    unsynced: Vec<(u64, Arc<File>)>,
    /// A sync failed: nothing more is appended or acknowledged until
    /// `clear_wal`.
    failed: bool,
    next_record: u64,
    hits: u64,
}

impl Index {
    /// The open segment, its last record `last`, is appended to no more:
    /// it waits in `unsynced` for the next sync, and `next` (if any) is
    /// the one appended to.
    fn leave_segment(&mut self, next: Option<(u64, Arc<File>)>, last: u64) {
        if let Some((_, old)) = std::mem::replace(&mut self.current, next) {
            self.unsynced.push((last, old));
        }
    }
}

/// The spare segment: whole on disk (`ready`), or being made.
#[derive(Default)]
struct Spare {
    ready: bool,
    maker: Option<std::thread::JoinHandle<()>>,
}

/// A cache directory, open (and locked) for one device.
pub(crate) struct CacheDir {
    root: PathBuf,
    /// Held for the flock.
    _lock: File,
    limit: u64,
    index: Mutex<Index>,
    /// Every record up to this one is durable; held across a sync, so
    /// that syncs run one at a time (see the module's comment).
    synced: Mutex<u64>,
    /// Tests: the next sync fails as a failed `fdatasync` does.
    #[cfg(test)]
    fail_sync: AtomicBool,
    /// The last chunk copy failed (the local disk full, say).
    copies_failing: AtomicBool,
    spare: Arc<Mutex<Spare>>,
}

impl Drop for CacheDir {
    /// Not before the spare being made is whole (or failed): nothing of
    /// this open writes to the directory once its lock is let go.
    fn drop(&mut self) {
        self.wait_spare();
    }
}

/// What the cache directory holds (`foliofs stat`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct CacheUse {
    pub dir: String,
    pub limit_bytes: u64,
    pub chunk_bytes: u64,
    pub chunks: u64,
    pub wal_bytes: u64,
    /// Reads from the directory instead of the store (a chunk whole, or
    /// a run of its blocks).
    pub hits: u64,
}

fn invalid(root: &std::path::Path, why: impl std::fmt::Display) -> ObjectError {
    ObjectError::Invalid(format!("cache_dir {}: {why}", root.display()))
}

/// The local disk (or the user's quota on it) is full.
fn out_of_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// What an append or a sync gets once a sync of the local WAL failed.
fn poisoned() -> io::Error {
    io::Error::other("a sync of the local WAL failed: it takes no more records until cleared")
}

fn sync_dir(dir: &std::path::Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Bytes free to an unprivileged user on the file system of `path`.
fn free_bytes(path: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: a zeroed statvfs is a valid out-parameter; `p` is a
    // NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(p.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

/// A new file at `path` of `SEGMENT_BYTES` zeros, synced (its directory
/// entry not).
fn zeroed(path: &std::path::Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .create_new(true)
        .read(true)
        .write(true)
        .open(path)?;
    let zeros = vec![0u8; 1 << 20];
    for k in 0..SEGMENT_BYTES / zeros.len() as u64 {
        file.write_all_at(&zeros, k * zeros.len() as u64)?;
    }
    file.sync_all()?;
    Ok(file)
}

impl CacheDir {
    /// Open `root` (made if absent) as the cache of the image `identity`
    /// names, at most `limit` bytes of chunks and WAL. Refused while
    /// another device has it open, or if it caches another image.
    pub(crate) fn open(
        root: &std::path::Path,
        limit: u64,
        identity: &str,
    ) -> Result<CacheDir, ObjectError> {
        let io_err = |e: io::Error| invalid(root, e);
        for sub in ["chunks", "wal"] {
            fs::create_dir_all(root.join(sub)).map_err(io_err)?;
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(root.join("lock"))
            .map_err(io_err)?;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(invalid(root, "in use by another mount of this machine"));
        }
        let id_path = root.join("image");
        match fs::read_to_string(&id_path) {
            Ok(held) if held.trim_end() == identity => {}
            Ok(held) => {
                return Err(invalid(
                    root,
                    format!(
                        "caches {} (not {identity}): give each image its own cache_dir",
                        held.trim_end()
                    ),
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::write(&id_path, format!("{identity}\n")).map_err(io_err)?;
            }
            Err(e) => return Err(io_err(e)),
        }
        let mut index = Index {
            chunks: HashMap::new(),
            chunk_bytes: 0,
            tick: 0,
            segments: BTreeMap::new(),
            current: None,
            unsynced: Vec::new(),
            failed: false,
            next_record: 1,
            hits: 0,
        };
        // Chunks by age, oldest first, so that the oldest go first.
        let mut found = Vec::new();
        for entry in fs::read_dir(root.join("chunks")).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let name = entry.file_name();
            let pair = name.to_str().and_then(|n| {
                let (i, v) = n.split_once('-')?;
                Some((i.parse::<u64>().ok()?, v.parse::<u64>().ok()?))
            });
            let meta = entry.metadata().map_err(io_err)?;
            match pair {
                Some(pair) => found.push((meta.modified().ok(), pair, meta.len())),
                // A temporary file a crash left.
                None => drop(fs::remove_file(entry.path())),
            }
        }
        found.sort();
        for (_, pair, len) in found {
            index.tick += 1;
            index.chunks.insert(pair, (len, index.tick));
            index.chunk_bytes += len;
        }
        let mut spare = Spare::default();
        for entry in fs::read_dir(root.join("wal")).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let name = entry.file_name();
            if let Some(n) = name.to_str().and_then(|n| n.parse().ok()) {
                let len = entry.metadata().map_err(io_err)?.len();
                index.segments.insert(n, (0, len));
            } else if name == SPARE {
                // Renamed only when whole: the next segment.
                spare.ready = true;
            } else if name == SPARE_TMP {
                // Half made when a crash came.
                fs::remove_file(entry.path()).map_err(io_err)?;
            }
        }
        Ok(CacheDir {
            root: root.to_path_buf(),
            _lock: lock,
            limit,
            index: Mutex::new(index),
            synced: Mutex::new(0),
            #[cfg(test)]
            fail_sync: AtomicBool::new(false),
            copies_failing: AtomicBool::new(false),
            spare: Arc::new(Mutex::new(spare)),
        })
    }

    pub(crate) fn usage(&self) -> CacheUse {
        let ix = self.index.lock();
        CacheUse {
            dir: self.root.display().to_string(),
            limit_bytes: self.limit,
            chunk_bytes: ix.chunk_bytes,
            chunks: ix.chunks.len() as u64,
            wal_bytes: ix.segments.values().map(|&(_, n)| n).sum(),
            hits: ix.hits,
        }
    }

    fn chunk_path(&self, idx: u64, version: u64) -> PathBuf {
        self.root.join("chunks").join(format!("{idx}-{version}"))
    }

    /// Marks chunk copy (`idx`, `version`) used; false if there is none.
    fn touch(&self, idx: u64, version: u64) -> bool {
        let mut ix = self.index.lock();
        ix.tick += 1;
        let tick = ix.tick;
        match ix.chunks.get_mut(&(idx, version)) {
            Some(c) => {
                c.1 = tick;
                true
            }
            None => false,
        }
    }

    /// The bytes of chunk object (`idx`, `version`), `len` bytes of
    /// blocks, if the directory has them (unchecked: the caller decodes
    /// them).
    pub(crate) fn chunk(&self, idx: u64, version: u64, len: usize) -> Option<Vec<u8>> {
        if !self.touch(idx, version) {
            return None;
        }
        let object = CHUNK_HEAD + len + CHUNK_TAIL;
        match fs::read(self.chunk_path(idx, version)) {
            Ok(mut bytes) if bytes.len() == object + table_len(len) => {
                bytes.truncate(object);
                self.index.lock().hits += 1;
                Some(bytes)
            }
            // Gone, or not a copy with its table (one an older foliofs
            // made): fetched again.
            _ => {
                self.forget_chunk(idx, version);
                None
            }
        }
    }

    /// Blocks `first..` of chunk copy (`idx`, `version`), `len` bytes of
    /// blocks, into `dst` (whole blocks), each checked against its entry
    /// in the copy's table. False if there is no copy or a block fails its
    /// check (the copy is then dropped, to be fetched again).
    pub(crate) fn chunk_blocks(
        &self,
        idx: u64,
        version: u64,
        len: usize,
        first: usize,
        dst: &mut [u8],
    ) -> bool {
        if !self.touch(idx, version) {
            return false;
        }
        let bs = BLOCK as usize;
        let n = dst.len() / bs;
        let mut table = vec![0u8; 4 * n];
        let read = File::open(self.chunk_path(idx, version)).and_then(|f| {
            f.read_exact_at(dst, (CHUNK_HEAD + first * bs) as u64)?;
            let at = CHUNK_HEAD + len + CHUNK_TAIL + 4 * first;
            f.read_exact_at(&mut table, at as u64)
        });
        let bad = match read {
            // Deleted meanwhile (the version replaced), or without its
            // table (a copy an older foliofs made): only a miss.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::UnexpectedEof
                ) =>
            {
                self.forget_chunk(idx, version);
                return false;
            }
            Err(_) => true,
            Ok(()) => (0..n).any(|k| {
                let want = u32::from_le_bytes(table[4 * k..4 * k + 4].try_into().expect("4 bytes"));
                crc32c::crc32c(&dst[k * bs..(k + 1) * bs]) != want
            }),
        };
        if bad {
            log::warn!(
                "cache_dir {}: chunk {idx} version {version}: blocks {first}..{} unreadable or \
                 failing their check: dropped, fetched again",
                self.root.display(),
                first + n
            );
            self.forget_chunk(idx, version);
            return false;
        }
        self.index.lock().hits += 1;
        true
    }

    /// Whether the directory has a copy of chunk object (`idx`, `version`).
    pub(crate) fn has_chunk(&self, idx: u64, version: u64) -> bool {
        self.index.lock().chunks.contains_key(&(idx, version))
    }

    /// Keep a copy of chunk object (`idx`, `version`), evicting the least
    /// recently used chunks beyond the limit. A copy that cannot be made
    /// (the local disk full) is only a cache miss later.
    pub(crate) fn keep_chunk(&self, idx: u64, version: u64, chunk: &Chunk) {
        let path = self.chunk_path(idx, version);
        let tmp = self
            .root
            .join("chunks")
            .join(format!("tmp.{idx}-{version}"));
        let table: Vec<u8> = chunk
            .blocks()
            .chunks(BLOCK as usize)
            .flat_map(|b| crc32c::crc32c(b).to_le_bytes())
            .collect();
        let bytes = chunk.object().len() + table.len();
        let written = File::create(&tmp).and_then(|mut f| {
            use std::io::Write;
            f.write_all(chunk.object())?;
            f.write_all(&table)
        });
        if let Err(e) = written.and_then(|()| fs::rename(&tmp, &path)) {
            let _ = fs::remove_file(&tmp);
            // Said once while it goes on (a full disk fails every copy).
            if !self.copies_failing.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "cache_dir {}: chunks not kept on the local disk ({e}): read from the \
                     store instead",
                    self.root.display()
                );
            }
            return;
        }
        if self.copies_failing.swap(false, Ordering::Relaxed) {
            log::info!("cache_dir {}: chunks kept again", self.root.display());
        }
        let mut ix = self.index.lock();
        ix.tick += 1;
        let tick = ix.tick;
        if let Some((old, _)) = ix.chunks.insert((idx, version), (bytes as u64, tick)) {
            ix.chunk_bytes -= old;
        }
        ix.chunk_bytes += bytes as u64;
        self.evict(&mut ix);
    }

    /// Drop a chunk copy that is gone or failed its check.
    pub(crate) fn forget_chunk(&self, idx: u64, version: u64) {
        let mut ix = self.index.lock();
        if let Some((n, _)) = ix.chunks.remove(&(idx, version)) {
            ix.chunk_bytes -= n;
        }
        drop(ix);
        let _ = fs::remove_file(self.chunk_path(idx, version));
    }

    /// Chunks, least recently used first, until chunks and WAL fit the
    /// limit. The WAL is never evicted: it is bounded by `wal_lag_max`.
    fn evict(&self, ix: &mut Index) {
        let wal: u64 = ix.segments.values().map(|&(_, n)| n).sum();
        let over = (ix.chunk_bytes + wal).saturating_sub(self.limit);
        if over > 0 {
            self.drop_chunks(ix, over);
        }
    }

    /// Delete chunk copies, least recently used first, until `want`
    /// bytes of them are gone or none is left; the bytes deleted. The
    /// limit's eviction and the local WAL's room on a full disk both come
    /// here (one sort for however many go, not a scan for each).
    fn drop_chunks(&self, ix: &mut Index, want: u64) -> u64 {
        let mut by_use: Vec<((u64, u64), u64, u64)> = ix
            .chunks
            .iter()
            .map(|(&k, &(n, used))| (k, n, used))
            .collect();
        by_use.sort_unstable_by_key(|&(_, _, used)| used);
        let mut freed = 0;
        for ((idx, version), n, _) in by_use {
            if freed >= want {
                break;
            }
            ix.chunks.remove(&(idx, version));
            ix.chunk_bytes -= n;
            freed += n;
            let _ = fs::remove_file(self.chunk_path(idx, version));
        }
        freed
    }

    /// Forget every chunk (a new image at this URL).
    pub(crate) fn clear_chunks(&self) {
        let mut ix = self.index.lock();
        for (idx, version) in ix.chunks.keys().copied().collect::<Vec<_>>() {
            let _ = fs::remove_file(self.chunk_path(idx, version));
        }
        ix.chunks.clear();
        ix.chunk_bytes = 0;
    }

    fn segment_path(&self, n: u64) -> PathBuf {
        self.root.join("wal").join(format!("{n:020}"))
    }

    /// The records the local WAL holds from an earlier run, in order: up
    /// to the first that is cut or damaged (never acknowledged, or the
    /// local disk lost it: the log says which).
    pub(crate) fn leftover_wal(&self, dev_blocks: u64) -> Vec<WalRecord> {
        let segments: Vec<u64> = self.index.lock().segments.keys().copied().collect();
        let mut records = Vec::new();
        for n in segments {
            let path = self.segment_path(n);
            let bytes = match fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    log::error!(
                        "{}: not read ({e}); the local WAL ends before it",
                        path.display()
                    );
                    return records;
                }
            };
            let key = Path::from(path.display().to_string());
            let mut at = 0;
            while at < bytes.len() {
                let rest = &bytes[at..];
                let len = rest
                    .get(24..RECORD_HEADER)
                    .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
                    .and_then(|count| count.checked_mul(8 + BLOCK))
                    .and_then(|n| n.checked_add(RECORD_HEADER as u64 + 4))
                    .filter(|&n| n <= rest.len() as u64);
                // A local record names no chunks (0: one that did is refused).
                let rec =
                    len.map(|len| WalRecord::decode(&key, &rest[..len as usize], dev_blocks, 0));
                match (len, rec) {
                    (Some(len), Some(Ok(rec))) => {
                        records.push(rec);
                        at += len as usize;
                    }
                    // The zeros a segment was made with: its end.
                    _ if rest.len() >= 8 && rest[..8] == [0u8; 8] => break,
                    _ => {
                        log::warn!(
                            "{}: the local WAL ends at byte {at} (a record cut by a crash, \
                             never acknowledged, or damaged)",
                            path.display()
                        );
                        return records;
                    }
                }
            }
        }
        records
    }

    /// Delete the whole local WAL (shipped, or found superseded).
    pub(crate) fn clear_wal(&self) -> io::Result<()> {
        let mut synced = self.synced.lock();
        let mut ix = self.index.lock();
        *synced = 0;
        ix.current = None;
        ix.unsynced.clear();
        ix.failed = false;
        for n in std::mem::take(&mut ix.segments).into_keys() {
            fs::remove_file(self.segment_path(n))?;
        }
        ix.next_record = 1;
        sync_dir(&self.root.join("wal"))
    }

    /// Append a record of `blocks` at `epoch`; returns its local number,
    /// durable once `sync_wal` of it returns. The local disk full, the
    /// chunk copies make room first (least recently used first): they are
    /// only a cache, the WAL is what a flush waits for.
    pub(crate) fn append_wal(&self, epoch: u64, blocks: &[(u64, &[u8])]) -> io::Result<u64> {
        let mut ix = self.index.lock();
        let (head, crc) = WalRecord::head(epoch, ix.next_record, blocks, &[]);
        let body: Vec<&[u8]> = std::iter::once(&head[..])
            .chain(blocks.iter().map(|&(_, d)| d))
            .chain(std::iter::once(&crc[..]))
            .collect();
        let len = body.iter().map(|p| p.len() as u64).sum::<u64>();
        match self.append_record(&mut ix, &body, len) {
            Err(e) if out_of_space(&e) && !ix.chunks.is_empty() => {
                let freed = self.drop_chunks(&mut ix, SEGMENT_BYTES + len);
                log::warn!(
                    "cache_dir {}: the local disk is full ({e}): {} MiB of chunk copies \
                     dropped for the local WAL",
                    self.root.display(),
                    freed >> 20
                );
                self.append_record(&mut ix, &body, len)
            }
            r => r,
        }
    }

    /// Append `body` (its parts in order, `len` bytes), the encoded
    /// record `ix.next_record`.
    fn append_record(&self, ix: &mut Index, body: &[&[u8]], len: u64) -> io::Result<u64> {
        if ix.failed {
            return Err(poisoned());
        }
        let record = ix.next_record;
        // A record that does not fit what is left of the segment starts
        // the next one (one larger than a segment has one to itself).
        let full = ix
            .current
            .as_ref()
            .and_then(|(n, _)| ix.segments.get(n))
            .is_none_or(|&(_, used)| used > 0 && used + len > SEGMENT_BYTES);
        if full {
            let n = ix.segments.keys().next_back().map_or(1, |n| n + 1);
            let file = self.next_segment(n).inspect_err(|_| {
                // Half made (the disk full): the next try makes it again.
                let _ = fs::remove_file(self.segment_path(n));
            })?;
            ix.segments.insert(n, (record, 0));
            ix.leave_segment(Some((n, Arc::new(file))), record - 1);
            self.make_spare();
        }
        let n = ix.current.as_ref().expect("a segment is open").0;
        let at = ix.segments.get(&n).map_or(0, |&(_, used)| used);
        let (_, file) = ix.current.as_ref().expect("a segment is open");
        if let Err(e) = foliofs::device::write_all_vectored_at(file, body, at) {
            // What the segment holds past its last good record is not
            // known: the next record goes to a new one. The records
            // before it are still to be synced.
            ix.leave_segment(None, record - 1);
            return Err(e);
        }
        let seg = ix.segments.get_mut(&n).expect("the open segment is listed");
        *seg = (record, seg.1 + len);
        ix.next_record += 1;
        Ok(record)
    }

    /// Make record `record` durable, and with it every record written
    /// before the sync begins: at once if a sync since covered it. An
    /// error if a sync failed since it was appended (see the module's
    /// comment); after `clear_wal`, what it cleared had shipped.
    pub(crate) fn sync_wal(&self, record: u64) -> io::Result<()> {
        let mut synced = self.synced.lock();
        if *synced >= record {
            return Ok(());
        }
        let (files, target) = {
            let ix = self.index.lock();
            if ix.failed {
                return Err(poisoned());
            }
            let mut files: Vec<Arc<File>> = ix.unsynced.iter().map(|(_, f)| f.clone()).collect();
            files.extend(ix.current.as_ref().map(|(_, f)| f.clone()));
            (files, ix.next_record - 1)
        };
        for f in &files {
            if let Err(e) = self.sync_segment(f) {
                let mut ix = self.index.lock();
                ix.failed = true;
                ix.current = None;
                return Err(e);
            }
        }
        *synced = target;
        self.index
            .lock()
            .unsynced
            .retain(|&(last, _)| last > target);
        Ok(())
    }

    /// `fdatasync` of a WAL segment (in tests, failing when told to).
    fn sync_segment(&self, f: &File) -> io::Result<()> {
        #[cfg(test)]
        if self.fail_sync.swap(false, Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        f.sync_data()
    }

    /// Segment `n`, filled with zeros and synced with its directory entry:
    /// records are then written over the zeros, so that syncing one
    /// writes its data only, not the file's size and extents (the host
    /// file system's journal) every time; a zero where a record's magic
    /// would be ends the segment. The spare made ahead (`make_spare`) if
    /// it is ready, else made here.
    fn next_segment(&self, n: u64) -> io::Result<File> {
        let path = self.segment_path(n);
        let file = match self.take_spare() {
            Some(file) => {
                fs::rename(self.root.join("wal").join(SPARE), &path)?;
                file
            }
            None => zeroed(&path)?,
        };
        sync_dir(&self.root.join("wal"))?;
        Ok(file)
    }

    /// The spare segment, open, if one is ready (none is being made).
    fn take_spare(&self) -> Option<File> {
        let mut spare = self.spare.lock();
        if !std::mem::take(&mut spare.ready) {
            return None;
        }
        let path = self.root.join("wal").join(SPARE);
        match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => Some(file),
            Err(e) => {
                log::warn!(
                    "{}: not opened ({e}): a segment is made instead",
                    path.display()
                );
                None
            }
        }
    }

    /// Start making the next segment ahead of need, on a thread of its
    /// own, unless one is ready or being made: `wal/spare`, filled with
    /// zeros as `wal/spare.tmp`, synced, and renamed when whole. A flush
    /// that fills a segment then takes it (a rename) rather than writing
    /// 16 MiB of zeros and waiting for their sync. One that cannot be
    /// made (the local disk full) is only made later, in the flush. A
    /// writer's open makes the first.
    pub(crate) fn make_spare(&self) {
        let mut spare = self.spare.lock();
        if spare.ready || spare.maker.as_ref().is_some_and(|m| !m.is_finished()) {
            return;
        }
        let wal = self.root.join("wal");
        // Not where its zeros could take the room a flush's record needs.
        if free_bytes(&wal).is_none_or(|free| free < SPARE_ROOM) {
            return;
        }
        let state = self.spare.clone();
        let made = std::thread::Builder::new()
            .name("foliofs-wal-spare".into())
            .spawn(move || {
                let tmp = wal.join(SPARE_TMP);
                let made = zeroed(&tmp).and_then(|_| fs::rename(&tmp, wal.join(SPARE)));
                if let Err(e) = &made {
                    let _ = fs::remove_file(&tmp);
                    log::debug!("{}: no spare segment made ahead ({e})", wal.display());
                }
                state.lock().ready = made.is_ok();
            });
        match made {
            Ok(maker) => spare.maker = Some(maker),
            Err(e) => log::debug!("no thread to make a spare segment ahead ({e})"),
        }
    }

    /// Wait for the spare being made, if one is (taken out of the lock
    /// first: the maker takes it to say it is done).
    fn wait_spare(&self) {
        let maker = self.spare.lock().maker.take();
        if let Some(maker) = maker {
            let _ = maker.join();
        }
    }

    /// Wait for the spare being made, if one is, and delete it: the local
    /// WAL emptied for a flush past it (its disk full, say). A local WAL
    /// emptied otherwise (shipped at close) keeps its spare for the next
    /// mount's first flush.
    pub(crate) fn drop_spare(&self) {
        self.wait_spare();
        if std::mem::take(&mut self.spare.lock().ready) {
            let _ = fs::remove_file(self.root.join("wal").join(SPARE));
        }
    }

    /// Every record up to `record` has shipped: delete the segments that
    /// hold nothing after it, but the one appended to (kept for the next
    /// records; what shipped in it ships again, harmlessly, if the writer
    /// stops before a close clears it).
    pub(crate) fn shipped(&self, record: u64) {
        let mut ix = self.index.lock();
        let done: Vec<u64> = ix
            .segments
            .iter()
            .filter(|(_, &(last, _))| last <= record)
            .map(|(&n, _)| n)
            .collect();
        for n in done {
            if ix.current.as_ref().is_some_and(|(c, _)| *c == n) {
                continue;
            }
            ix.segments.remove(&n);
            if let Err(e) = fs::remove_file(self.segment_path(n)) {
                log::warn!("{}: not deleted ({e})", self.segment_path(n).display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(test: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("foliofs-cachedir-{test}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn the_local_wal_survives_reopening_up_to_a_cut_record() {
        let root = dir("wal");
        let block = vec![7u8; BLOCK as usize];
        {
            let c = CacheDir::open(&root, 1 << 30, "img").unwrap();
            assert_eq!(c.append_wal(3, &[(1, &block)]).unwrap(), 1);
            assert_eq!(c.append_wal(3, &[(2, &block), (5, &block)]).unwrap(), 2);
            c.sync_wal(1).unwrap();
            c.sync_wal(2).unwrap();
        }
        // A third record cut half-way by a crash, over the segment's zeros.
        let seg = root.join("wal").join(format!("{:020}", 1));
        let used = WalRecord::encode(3, 1, &[(1, &block)], &[]).len()
            + WalRecord::encode(3, 2, &[(2, &block), (5, &block)], &[]).len();
        let whole = WalRecord::encode(3, 3, &[(9, &block)], &[]);
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.write_all_at(&whole[..whole.len() / 2], used as u64)
            .unwrap();
        drop(f);
        let c = CacheDir::open(&root, 1 << 30, "img").unwrap();
        let recs = c.leftover_wal(16);
        assert_eq!(recs.len(), 2);
        assert_eq!(recs[1].blocks.len(), 2);
        assert_eq!((recs[1].epoch, recs[1].seq), (3, 2));
        assert!(CacheDir::open(&root, 1 << 30, "img").is_err(), "locked");
        c.clear_wal().unwrap();
        assert!(c.leftover_wal(16).is_empty());
        drop(c);
        assert!(CacheDir::open(&root, 1 << 30, "other").is_err());
        fs::remove_dir_all(&root).unwrap();
    }

    /// A failed sync acknowledges nothing it covered, and the WAL takes
    /// no more records until it is cleared; what an earlier sync made
    /// durable stays acknowledged.
    #[test]
    fn a_failed_sync_poisons_the_local_wal_until_it_is_cleared() {
        let root = dir("poison");
        let block = vec![7u8; BLOCK as usize];
        let c = CacheDir::open(&root, 1 << 30, "img").unwrap();
        let r1 = c.append_wal(3, &[(1, &block)]).unwrap();
        c.sync_wal(r1).unwrap();
        let r2 = c.append_wal(3, &[(2, &block)]).unwrap();
        let r3 = c.append_wal(3, &[(3, &block)]).unwrap();
        c.fail_sync.store(true, Ordering::SeqCst);
        assert!(c.sync_wal(r2).is_err());
        // r3 was written before the failed sync began: its error may
        // have been reported there and nowhere else.
        assert!(c.sync_wal(r3).is_err(), "a record the failed sync covered");
        assert!(
            c.append_wal(3, &[(4, &block)]).is_err(),
            "appended after a failure"
        );
        c.sync_wal(r1).unwrap();
        c.clear_wal().unwrap();
        let r = c.append_wal(3, &[(5, &block)]).unwrap();
        c.sync_wal(r).unwrap();
        assert_eq!(c.leftover_wal(16).len(), 1);
        drop(c);
        fs::remove_dir_all(&root).unwrap();
    }

    /// Records appended while no sync runs are made durable by one: the
    /// later ones' syncs find them covered. Across a new segment too.
    #[test]
    fn one_sync_covers_every_record_written_before_it() {
        let root = dir("cover");
        let blocks: Vec<(u64, Vec<u8>)> = (0..1100)
            .map(|b| (b, vec![b as u8; BLOCK as usize]))
            .collect();
        let list: Vec<(u64, &[u8])> = blocks.iter().map(|(b, d)| (*b, &d[..])).collect();
        let c = CacheDir::open(&root, 1 << 30, "img").unwrap();
        // Four records of 4.3 MiB: the fourth starts a second segment.
        let recs: Vec<u64> = (0..4).map(|_| c.append_wal(3, &list).unwrap()).collect();
        assert_eq!(
            c.index.lock().unsynced.len(),
            1,
            "the first segment, filled"
        );
        c.sync_wal(recs[3]).unwrap();
        assert!(c.index.lock().unsynced.is_empty());
        c.fail_sync.store(true, Ordering::SeqCst);
        for &r in &recs {
            c.sync_wal(r).unwrap();
        }
        assert!(c.fail_sync.load(Ordering::SeqCst), "no sync was needed");
        c.fail_sync.store(false, Ordering::SeqCst);
        assert_eq!(c.leftover_wal(4096).len(), 4);
        drop(c);
        fs::remove_dir_all(&root).unwrap();
    }

    /// Segment `n`'s inode, or the spare's (None).
    fn inode(root: &std::path::Path, n: Option<u64>) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let name = n.map_or(SPARE.to_string(), |n| format!("{n:020}"));
        fs::metadata(root.join("wal").join(name)).unwrap().ino()
    }

    /// A record of more blocks than one vectored write takes, each in a
    /// buffer of its own, reads back whole; the segment after the first
    /// is the spare made ahead, and so is the next one after a reopen,
    /// which deletes a spare a crash left half made.
    #[test]
    fn records_are_written_from_their_blocks_into_segments_made_ahead() {
        let root = dir("spare");
        let blocks: Vec<(u64, Vec<u8>)> = (0..1500)
            .map(|b| (b * 3, vec![(b % 251) as u8; BLOCK as usize]))
            .collect();
        let list: Vec<(u64, &[u8])> = blocks.iter().map(|(b, d)| (*b, &d[..])).collect();
        let c = CacheDir::open(&root, 1 << 30, "img").unwrap();
        let r1 = c.append_wal(4, &list[..10]).unwrap();
        c.wait_spare();
        let spare = inode(&root, None);
        // 5.9 MiB each: the third does not fit what the first left.
        let r2 = c.append_wal(4, &list).unwrap();
        let r3 = c.append_wal(4, &list).unwrap();
        let r4 = c.append_wal(4, &list).unwrap();
        c.sync_wal(r4).unwrap();
        assert_eq!((r1, r2, r3, r4), (1, 2, 3, 4));
        assert_eq!(inode(&root, Some(2)), spare, "segment 2 is the spare");
        let recs = c.leftover_wal(4500);
        assert_eq!(recs.len(), 4);
        assert_eq!(recs[0].blocks.len(), 10);
        for rec in &recs[1..] {
            assert_eq!(rec.epoch, 4);
            assert_eq!(rec.blocks.len(), blocks.len());
            for ((b, d), (rb, rd)) in blocks.iter().zip(&rec.blocks) {
                assert_eq!((b, d), (rb, rd));
            }
        }
        c.wait_spare();
        drop(c);
        // A crash left a spare being made beside the whole one.
        fs::write(root.join("wal").join(SPARE_TMP), b"half").unwrap();
        let spare = inode(&root, None);
        let c = CacheDir::open(&root, 1 << 30, "img").unwrap();
        assert!(!root.join("wal").join(SPARE_TMP).exists());
        assert_eq!(c.leftover_wal(4500).len(), 4, "the spare holds no record");
        let last = c.index.lock().segments.keys().next_back().copied().unwrap();
        let r = c.append_wal(5, &list[..1]).unwrap();
        c.sync_wal(r).unwrap();
        assert_eq!(
            inode(&root, Some(last + 1)),
            spare,
            "the next segment is the spare"
        );
        assert_eq!(c.leftover_wal(4500).len(), 5);
        // Emptied, the local WAL keeps its spare; made room, not.
        c.wait_spare();
        c.clear_wal().unwrap();
        let left = || fs::read_dir(root.join("wal")).unwrap().count();
        assert_eq!(left(), 1);
        c.drop_spare();
        assert_eq!(left(), 0);
        // Prepared for a writer, the first segment is made ahead too.
        c.make_spare();
        c.wait_spare();
        let spare = inode(&root, None);
        let r = c.append_wal(6, &list[..1]).unwrap();
        assert_eq!(inode(&root, Some(1)), spare);
        c.sync_wal(r).unwrap();
        drop(c);
        fs::remove_dir_all(&root).unwrap();
    }

    /// A chunk of two blocks, each filled with its own byte.
    fn chunk(idx: u64, fill: u8) -> Chunk {
        Chunk::build(idx, 2 * BLOCK as usize, |v| {
            v.extend((0..2 * BLOCK as usize).map(|i| fill ^ (i / BLOCK as usize) as u8))
        })
    }

    #[test]
    fn chunks_beyond_the_limit_go_oldest_first() {
        let root = dir("chunks");
        let len = 2 * BLOCK as usize;
        let copy = CHUNK_HEAD + len + CHUNK_TAIL + table_len(len);
        let c = CacheDir::open(&root, 3 * copy as u64, "img").unwrap();
        c.keep_chunk(0, 1, &chunk(0, 1));
        c.keep_chunk(1, 1, &chunk(1, 2));
        assert!(c.chunk(0, 1, len).is_some()); // 0 is now newer than 1
        c.keep_chunk(2, 1, &chunk(2, 3));
        c.keep_chunk(3, 1, &chunk(3, 4));
        assert!(c.chunk(1, 1, len).is_none());
        assert_eq!(c.chunk(0, 1, len).unwrap(), &chunk(0, 1).object()[..]);
        assert_eq!(c.usage().chunk_bytes, 3 * copy as u64);
        drop(c);
        let c = CacheDir::open(&root, 3 * copy as u64, "img").unwrap();
        assert_eq!(c.usage().chunks, 3);
        drop(c);
        fs::remove_dir_all(&root).unwrap();
    }

    /// A run of a copy's blocks is read alone and checked block by block:
    /// a block changed on the disk fails, and the copy is dropped.
    #[test]
    fn a_run_of_blocks_is_read_from_a_copy_and_checked() {
        let root = dir("runs");
        let len = 2 * BLOCK as usize;
        let c = CacheDir::open(&root, 1 << 20, "img").unwrap();
        let made = chunk(5, 7);
        c.keep_chunk(5, 9, &made);
        let mut got = vec![0; BLOCK as usize];
        assert!(c.chunk_blocks(5, 9, len, 1, &mut got));
        assert_eq!(got, made.blocks()[BLOCK as usize..]);
        let mut both = vec![0; len];
        assert!(c.chunk_blocks(5, 9, len, 0, &mut both));
        assert_eq!(both, made.blocks());
        assert!(!c.chunk_blocks(5, 8, len, 0, &mut both), "no such version");
        // One byte of block 1 changed on the disk: block 0 still reads,
        // block 1 fails, and then the copy is gone.
        let f = OpenOptions::new()
            .write(true)
            .open(c.chunk_path(5, 9))
            .unwrap();
        f.write_all_at(&[0xff], (CHUNK_HEAD + BLOCK as usize + 100) as u64)
            .unwrap();
        assert!(c.chunk_blocks(5, 9, len, 0, &mut got));
        assert!(!c.chunk_blocks(5, 9, len, 1, &mut got));
        assert!(!c.has_chunk(5, 9));
        assert!(c.chunk(5, 9, len).is_none());
        // A copy without its table (as an older foliofs made them): a
        // miss, read whole or in part, and dropped.
        for whole in [false, true] {
            c.keep_chunk(6, 1, &made);
            fs::write(c.chunk_path(6, 1), made.object()).unwrap();
            match whole {
                false => assert!(!c.chunk_blocks(6, 1, len, 1, &mut got)),
                true => assert!(c.chunk(6, 1, len).is_none()),
            }
            assert!(!c.has_chunk(6, 1));
        }
        drop(c);
        fs::remove_dir_all(&root).unwrap();
    }
}

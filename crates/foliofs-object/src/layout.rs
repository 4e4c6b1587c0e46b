//! The image's objects under its prefix, and their bytes.
//!
//! ```text
//! PREFIX/manifest/00000000000000000007   JSON: geometry, writer epoch and
//!                                        host, first WAL number not folded
//!                                        into chunks, the chunk versions
//! PREFIX/wal/00000000000000000042        blocks written between two
//!                                        flushes, or a writer's fence
//! PREFIX/chunk/0000000012-00000000000000000007
//!                                        CHUNK_BLOCKS blocks of the device,
//!                                        as of manifest 7
//! PREFIX/chunk/0000000012-04611686018427387946
//!                                        the same, written whole by the
//!                                        flush of WAL 42 (FLUSHED | 42)
//! PREFIX/snapshot/00000000000000000042-00000000000000000007
//!                                        a kept snapshot: the image as of
//!                                        WAL 42 (not included), read from
//!                                        manifest 7 and the WAL after it
//! PREFIX/lease/HOST-PID-NANOS               a reader's lease: what one open
//!                                        reads (a manifest, its chunks, a
//!                                        WAL range), kept until it expires
//! ```
//!
//! Manifests and WAL objects are created only if absent (a conditional
//! PUT): two writers can never both write one number, which is what
//! fences the one that lost. Chunk keys carry the manifest that made
//! them, so a chunk is never overwritten either; or, for a chunk a flush
//! wrote whole (`FLUSHED`), the WAL number of that flush, whose record
//! names it. Only the writer that creates that WAL number writes such a
//! chunk and is read: a writer fenced at number N wrote its chunks for N
//! or before, and its successor writes its own only after its fence. Every WAL object and
//! chunk ends with a crc32c of all its other bytes; a manifest is JSON
//! checked field by field. Numbers are zero-padded so that keys list in
//! order.

use bytes::Bytes;
use object_store::path::Path;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Bytes of one device block as the object device keeps them.
pub const BLOCK: u64 = 4096;

/// Blocks in one chunk object of a new image unless told otherwise
/// (4 MiB). Each image's manifest names its own (`chunk_blocks`).
pub const CHUNK_BLOCKS: u64 = 1024;

/// The chunk sizes an image may have, in blocks: powers of two from
/// 256 KiB to 64 MiB.
pub const CHUNK_BLOCKS_RANGE: std::ops::RangeInclusive<u64> = 64..=16384;

/// Whether `blocks` is a chunk size an image may have.
pub fn chunk_blocks_ok(blocks: u64) -> bool {
    blocks.is_power_of_two() && CHUNK_BLOCKS_RANGE.contains(&blocks)
}

/// The object format this crate writes: 2 since flushes write whole
/// chunks (`FLUSHED` versions, WAL records naming them). It reads 1 too.
pub const OBJECT_FORMAT: u32 = 2;

/// The bit of a chunk version that marks a chunk written whole by a
/// flush; the rest of the version is that flush's WAL number. Manifest
/// numbers never reach it.
pub const FLUSHED: u64 = 1 << 62;

/// The version of a chunk written whole by the flush of WAL `seq`.
pub fn flushed_version(seq: u64) -> u64 {
    FLUSHED | seq
}

/// The WAL number of a chunk version a flush wrote (None: a
/// checkpoint's).
pub fn flushed_seq(version: u64) -> Option<u64> {
    (version & FLUSHED != 0).then_some(version & !FLUSHED)
}

const WAL_MAGIC: &[u8; 8] = b"FOLIOWAL";
/// A WAL record that also names chunks its flush wrote whole.
const WAL_MAGIC_CHUNKS: &[u8; 8] = b"FOLIOWL2";
const CHUNK_MAGIC: &[u8; 8] = b"FOLIOCHK";

/// What an object's bytes failed to be, naming the object.
#[derive(Debug)]
pub struct Damaged {
    pub key: String,
    pub what: String,
}

impl std::fmt::Display for Damaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "object {}: {}", self.key, self.what)
    }
}

fn damaged(key: &Path, what: impl Into<String>) -> Damaged {
    Damaged {
        key: key.to_string(),
        what: what.into(),
    }
}

pub fn manifest_key(prefix: &Path, id: u64) -> Path {
    prefix.child("manifest").child(format!("{id:020}"))
}

pub fn wal_key(prefix: &Path, seq: u64) -> Path {
    prefix.child("wal").child(format!("{seq:020}"))
}

pub fn chunk_key(prefix: &Path, idx: u64, version: u64) -> Path {
    prefix
        .child("chunk")
        .child(format!("{idx:010}-{version:020}"))
}

/// The marker keeping snapshot `at` (the first WAL number it does not
/// hold), read from manifest `manifest`.
pub fn snapshot_key(prefix: &Path, at: u64, manifest: u64) -> Path {
    prefix
        .child("snapshot")
        .child(format!("{at:020}-{manifest:020}"))
}

/// The lease of one reader; `id` names it uniquely (host, pid, time).
pub fn lease_key(prefix: &Path, id: &str) -> Path {
    prefix.child("lease").child(id)
}

/// The two numbers of a chunk key (index, manifest) or a snapshot key
/// (WAL end, manifest).
pub fn pair_of(key: &Path) -> Option<(u64, u64)> {
    let (a, b) = key.filename()?.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// The number at the end of a manifest or WAL key.
pub fn number_of(key: &Path) -> Option<u64> {
    key.filename()?.parse().ok()
}

/// The writer holding the image, as its manifest names it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Writer {
    pub host: String,
    pub pid: u32,
    /// Seconds since the epoch when it claimed the image.
    pub since: u64,
    /// Where it is mounted, if it is a mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

impl std::fmt::Display for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "host {} pid {}", self.host, self.pid)?;
        match &self.at {
            Some(at) => write!(f, " (mounted on {at})"),
            None => Ok(()),
        }
    }
}

/// One manifest: the image as of its checkpoint, and who writes it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// Device size in bytes.
    pub len: u64,
    pub block: u64,
    pub chunk_blocks: u64,
    /// Raised by every claim; a WAL object of a lower epoch written after
    /// a higher one's fence cannot exist.
    pub epoch: u64,
    /// The writer that claimed the image, or none after a clean close.
    pub writer: Option<Writer>,
    /// The first WAL number whose blocks are not in the chunks.
    pub wal_start: u64,
    /// Chunk index -> the manifest that wrote its object. A chunk not
    /// listed is all zeros.
    pub chunks: BTreeMap<u64, u64>,
}

/// `what` (a JSON object of this layout) from the bytes at `key`, refused
/// when its object format is newer than this foliofs reads.
fn decode_json<T: serde::de::DeserializeOwned>(
    key: &Path,
    bytes: &[u8],
    what: &str,
    format: impl Fn(&T) -> u32,
) -> Result<T, Damaged> {
    let v: T =
        serde_json::from_slice(bytes).map_err(|e| damaged(key, format!("not {what}: {e}")))?;
    let f = format(&v);
    if f > OBJECT_FORMAT {
        return Err(damaged(
            key,
            format!("made by a newer foliofs (object format {f}, this one reads {OBJECT_FORMAT})"),
        ));
    }
    Ok(v)
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a manifest serialises")
    }

    pub fn decode(key: &Path, bytes: &[u8]) -> Result<Manifest, Damaged> {
        let m: Manifest = decode_json(key, bytes, "a manifest", |m: &Manifest| m.format)?;
        if m.block != BLOCK || !chunk_blocks_ok(m.chunk_blocks) || m.len % BLOCK != 0 || m.len == 0
        {
            return Err(damaged(
                key,
                format!(
                    "geometry not readable here: {} bytes, blocks of {}, chunks of {} blocks",
                    m.len, m.block, m.chunk_blocks
                ),
            ));
        }
        let chunks = m.len.div_ceil(BLOCK * m.chunk_blocks);
        if let Some((&idx, _)) = m.chunks.iter().find(|(&i, _)| i >= chunks) {
            return Err(damaged(key, format!("chunk {idx} past the device end")));
        }
        Ok(m)
    }
}

/// A snapshot marker's bytes (JSON). The key names the snapshot (the
/// first WAL number it does not hold) and the manifest it is read from;
/// the marker keeps that manifest, its chunks and the WAL from
/// `wal_start` to the snapshot from every sweep.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotMarker {
    pub format: u32,
    /// The manifest's `wal_start`, so that a sweep knows which WAL the
    /// marker keeps even if the manifest is gone.
    pub wal_start: u64,
    /// Seconds since the epoch when it was taken.
    pub taken: u64,
    /// The host that took it.
    pub host: String,
}

impl SnapshotMarker {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a marker serialises")
    }

    pub fn decode(key: &Path, bytes: &[u8]) -> Result<SnapshotMarker, Damaged> {
        let m = decode_json(key, bytes, "a snapshot marker", |m: &SnapshotMarker| {
            m.format
        })?;
        let (at, _) = pair_of(key).ok_or_else(|| damaged(key, "not a snapshot key"))?;
        if m.wal_start > at {
            return Err(damaged(
                key,
                format!("its WAL starts at {} past its end {at}", m.wal_start),
            ));
        }
        Ok(m)
    }
}

/// The size of a WAL object that holds no blocks: a new writer's fence.
/// Fences are never deleted: a writer fenced by one, stopped for any
/// time, still finds its next WAL number taken.
pub const FENCE_BYTES: u64 = 36;
/// A reader's lease (JSON): while it is fresh, no sweep deletes the
/// manifest it names, that manifest's chunks and the WAL from
/// `wal_start` to `wal_end`, as if it were a snapshot marker. The holder
/// rewrites it (a plain PUT of its own key) with a later `expires`
/// while it is open, and deletes it when it closes; a lease past
/// `expires` keeps nothing and `foliofs gc` deletes it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Lease {
    pub format: u32,
    pub manifest: u64,
    /// The first WAL number it reads.
    pub wal_start: u64,
    /// The first WAL number it does not read; none while it may read
    /// every number from `wal_start` on (an open of the image as of now,
    /// before its replay has found the WAL's end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_end: Option<u64>,
    /// Who reads (host, pid, since when, mount point).
    pub holder: Writer,
    /// Seconds since the epoch after which it keeps nothing.
    pub expires: u64,
}

impl Lease {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a lease serialises")
    }

    pub fn decode(key: &Path, bytes: &[u8]) -> Result<Lease, Damaged> {
        let l = decode_json(key, bytes, "a lease", |l: &Lease| l.format)?;
        if let Some(end) = l.wal_end.filter(|&e| e < l.wal_start) {
            return Err(damaged(
                key,
                format!("its WAL starts at {} past its end {end}", l.wal_start),
            ));
        }
        Ok(l)
    }

    /// The WAL numbers it keeps, [start, end).
    pub fn wal(&self) -> (u64, u64) {
        (self.wal_start, self.wal_end.unwrap_or(u64::MAX))
    }
}

/// A WAL object: the blocks one flush made durable, or a new writer's
/// fence (no blocks), and the chunks the flush wrote whole (their
/// objects, at `flushed_version(seq)`, were in the store before it).
#[derive(Debug, PartialEq, Eq)]
pub struct WalRecord {
    pub epoch: u64,
    pub seq: u64,
    /// (device block, its bytes), in block order.
    pub blocks: Vec<(u64, Vec<u8>)>,
    /// Chunk indexes written whole, in order.
    pub chunks: Vec<u64>,
}

impl WalRecord {
    /// magic, epoch, seq, count, then the block numbers, then the
    /// blocks, then crc32c of everything before it. A record naming
    /// chunks (`chunks` not empty) has its own magic and, after the
    /// count, the number of chunks and, after the block numbers, their
    /// indexes; one naming none is as format 1 wrote it (a fence keeps
    /// its `FENCE_BYTES`).
    pub fn encode(epoch: u64, seq: u64, blocks: &[(u64, &[u8])], chunks: &[u64]) -> Vec<u8> {
        let (head, crc) = WalRecord::head(epoch, seq, blocks, chunks);
        let mut v = Vec::with_capacity(head.len() + blocks.len() * BLOCK as usize + crc.len());
        v.extend_from_slice(&head);
        for (_, data) in blocks {
            v.extend_from_slice(data);
        }
        v.extend_from_slice(&crc);
        v
    }

    /// The record `encode` makes, but for its blocks: what comes before
    /// them (magic to the chunk indexes), and the crc32c after them. The
    /// local WAL writes the three parts as they are (one vectored write,
    /// no copy of the blocks).
    pub fn head(
        epoch: u64,
        seq: u64,
        blocks: &[(u64, &[u8])],
        chunks: &[u64],
    ) -> (Vec<u8>, [u8; 4]) {
        let mut v = Vec::with_capacity(40 + blocks.len() * 8 + chunks.len() * 8);
        v.extend_from_slice(if chunks.is_empty() {
            WAL_MAGIC
        } else {
            WAL_MAGIC_CHUNKS
        });
        v.extend_from_slice(&epoch.to_le_bytes());
        v.extend_from_slice(&seq.to_le_bytes());
        v.extend_from_slice(&(blocks.len() as u64).to_le_bytes());
        if !chunks.is_empty() {
            v.extend_from_slice(&(chunks.len() as u64).to_le_bytes());
        }
        for (b, _) in blocks {
            v.extend_from_slice(&b.to_le_bytes());
        }
        for c in chunks {
            v.extend_from_slice(&c.to_le_bytes());
        }
        let crc = blocks.iter().fold(crc32c::crc32c(&v), |crc, (_, data)| {
            debug_assert_eq!(data.len() as u64, BLOCK);
            crc32c::crc32c_append(crc, data)
        });
        (v, crc.to_le_bytes())
    }

    /// The record at `key`, checked: `dev_chunks` chunks of
    /// `dev_blocks` blocks in all.
    pub fn decode(
        key: &Path,
        bytes: &[u8],
        dev_blocks: u64,
        dev_chunks: u64,
    ) -> Result<WalRecord, Damaged> {
        let named = bytes.len() >= 44 && &bytes[..8] == WAL_MAGIC_CHUNKS;
        if bytes.len() < 36 || !(named || &bytes[..8] == WAL_MAGIC) {
            return Err(damaged(key, "not a WAL object (bad magic or too short)"));
        }
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        let crc = u32::from_le_bytes(tail.try_into().expect("4 bytes"));
        if crc32c::crc32c(body) != crc {
            return Err(damaged(key, "checksum mismatch (torn or changed)"));
        }
        let word = |at: usize| u64::from_le_bytes(body[at..at + 8].try_into().expect("8 bytes"));
        let (epoch, seq, count) = (word(8), word(16), word(24));
        let (nchunks, head) = if named { (word(32), 40) } else { (0, 32) };
        let want = count
            .checked_mul(8 + BLOCK)
            .zip(nchunks.checked_mul(8))
            .and_then(|(a, b)| a.checked_add(b))
            .and_then(|n| n.checked_add(head))
            .filter(|&n| n == body.len() as u64);
        if want.is_none() {
            return Err(damaged(
                key,
                format!(
                    "{count} blocks and {nchunks} chunks do not fit its {} bytes",
                    body.len()
                ),
            ));
        }
        let head = head as usize;
        let chunks_at = head + count as usize * 8;
        let data_at = chunks_at + nchunks as usize * 8;
        let mut blocks = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            let b = word(head + i * 8);
            if b >= dev_blocks {
                return Err(damaged(key, format!("block {b} past the device end")));
            }
            let at = data_at + i * BLOCK as usize;
            blocks.push((b, body[at..at + BLOCK as usize].to_vec()));
        }
        let mut chunks = Vec::with_capacity(nchunks as usize);
        for i in 0..nchunks as usize {
            let c = word(chunks_at + i * 8);
            if c >= dev_chunks {
                return Err(damaged(key, format!("chunk {c} past the device end")));
            }
            chunks.push(c);
        }
        Ok(WalRecord {
            epoch,
            seq,
            blocks,
            chunks,
        })
    }
}

/// A chunk object: magic, chunk index, the blocks, crc32c.
///
/// Held as the object's own bytes, checked: the blocks are a view of
/// them (`blocks`), and the same bytes go to the store and the cache
/// directory as they are (`object`). A chunk fetched is the response's
/// buffer; one made is built in place (`Chunk::build`). No copy of the
/// blocks is made between the object and the reader's buffer.
#[derive(Clone, Debug)]
pub struct Chunk(Bytes);

pub(crate) const CHUNK_HEAD: usize = 16;
pub(crate) const CHUNK_TAIL: usize = 4;

impl Chunk {
    /// The bytes of the object of a chunk with `len` bytes of blocks.
    pub fn object_len(len: usize) -> usize {
        CHUNK_HEAD + len + CHUNK_TAIL
    }

    /// Chunk `idx` of `len` bytes of blocks: `fill` appends exactly
    /// those bytes (and may then change them in place, past the head).
    pub fn build(idx: u64, len: usize, fill: impl FnOnce(&mut Vec<u8>)) -> Chunk {
        let mut v = crate::pool::vec(Chunk::object_len(len));
        v.extend_from_slice(CHUNK_MAGIC);
        v.extend_from_slice(&idx.to_le_bytes());
        fill(&mut v);
        assert_eq!(
            v.len(),
            CHUNK_HEAD + len,
            "chunk {idx}: blocks of another length"
        );
        let crc = crc32c::crc32c(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        Chunk(crate::pool::bytes(v))
    }

    /// The chunk object `bytes` at `key`, checked to be chunk `idx` with
    /// `len` bytes of blocks.
    pub fn decode(key: &Path, idx: u64, bytes: Bytes, len: usize) -> Result<Chunk, Damaged> {
        if bytes.len() != Chunk::object_len(len) || &bytes[..8] != CHUNK_MAGIC {
            return Err(damaged(
                key,
                format!(
                    "not a chunk of {len} bytes ({} bytes, or bad magic)",
                    bytes.len()
                ),
            ));
        }
        let (body, tail) = bytes.split_at(bytes.len() - CHUNK_TAIL);
        if crc32c::crc32c(body) != u32::from_le_bytes(tail.try_into().expect("4 bytes")) {
            return Err(damaged(key, "checksum mismatch (torn or changed)"));
        }
        if u64::from_le_bytes(body[8..16].try_into().expect("8 bytes")) != idx {
            return Err(damaged(key, format!("holds another chunk than {idx}")));
        }
        Ok(Chunk(bytes))
    }

    /// Its blocks.
    pub fn blocks(&self) -> &[u8] {
        &self.0[CHUNK_HEAD..self.0.len() - CHUNK_TAIL]
    }

    /// The whole object, as the store and the cache directory keep it.
    pub fn object(&self) -> &Bytes {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_has_its_own_size() {
        assert_eq!(WalRecord::encode(7, 9, &[], &[]).len() as u64, FENCE_BYTES);
        let one = vec![0; BLOCK as usize];
        assert!(WalRecord::encode(7, 9, &[(1, &one)], &[]).len() as u64 > FENCE_BYTES);
        assert!(WalRecord::encode(7, 9, &[], &[3]).len() as u64 > FENCE_BYTES);
    }

    #[test]
    fn wal_records_round_trip_and_damage_is_named() {
        let key = wal_key(&Path::from("img"), 3);
        let a = vec![1u8; BLOCK as usize];
        let b = vec![2u8; BLOCK as usize];
        let bytes = WalRecord::encode(2, 3, &[(5, &a), (9, &b)], &[]);
        let r = WalRecord::decode(&key, &bytes, 100, 2).unwrap();
        assert_eq!((r.epoch, r.seq), (2, 3));
        assert_eq!(r.blocks, vec![(5, a.clone()), (9, b.clone())]);
        assert!(r.chunks.is_empty());
        let mut torn = bytes.clone();
        torn[40] ^= 1;
        let e = WalRecord::decode(&key, &torn, 100, 2).unwrap_err();
        assert!(
            e.to_string().contains("img/wal/00000000000000000003"),
            "{e}"
        );
        assert!(WalRecord::decode(&key, &bytes[..bytes.len() - 1], 100, 2).is_err());
        assert!(
            WalRecord::decode(&key, &bytes, 9, 2).is_err(),
            "block 9 of 9"
        );
        // A record naming chunks a flush wrote whole.
        let named = WalRecord::encode(2, 3, &[(5, &a)], &[0, 1]);
        let r = WalRecord::decode(&key, &named, 100, 2).unwrap();
        assert_eq!((r.blocks, r.chunks), (vec![(5, a)], vec![0, 1]));
        let e = WalRecord::decode(&key, &named, 100, 1).unwrap_err();
        assert!(e.to_string().contains("chunk 1 past"), "{e}");
        let mut torn = named.clone();
        torn[50] ^= 1;
        assert!(WalRecord::decode(&key, &torn, 100, 2).is_err());
        let only = WalRecord::encode(2, 3, &[], &[1]);
        assert_eq!(
            WalRecord::decode(&key, &only, 100, 2).unwrap().chunks,
            vec![1]
        );
    }

    #[test]
    fn flushed_versions_name_their_wal_number_and_no_manifest() {
        assert_eq!(flushed_seq(flushed_version(42)), Some(42));
        assert_eq!(flushed_seq(7), None);
        let key = chunk_key(&Path::from("img"), 12, flushed_version(42));
        assert_eq!(key.as_ref(), "img/chunk/0000000012-04611686018427387946");
        assert_eq!(pair_of(&key), Some((12, flushed_version(42))));
    }

    #[test]
    fn chunks_round_trip_and_reject_another_index() {
        let key = chunk_key(&Path::from("img"), 4, 1);
        let data = vec![7u8; 8192];
        let bytes = Chunk::build(4, data.len(), |v| v.extend_from_slice(&data))
            .object()
            .clone();
        assert_eq!(
            Chunk::decode(&key, 4, bytes.clone(), 8192)
                .unwrap()
                .blocks(),
            data
        );
        assert!(Chunk::decode(&key, 5, bytes.clone(), 8192).is_err());
        assert!(Chunk::decode(&key, 4, bytes.slice(1..), 8192).is_err());
        let mut torn = bytes.to_vec();
        torn[100] ^= 1;
        assert!(Chunk::decode(&key, 4, Bytes::from(torn), 8192).is_err());
    }

    #[test]
    fn snapshot_markers_round_trip_and_name_their_numbers() {
        let key = snapshot_key(&Path::from("img"), 42, 7);
        assert_eq!(
            key.as_ref(),
            "img/snapshot/00000000000000000042-00000000000000000007"
        );
        assert_eq!(pair_of(&key), Some((42, 7)));
        assert_eq!(pair_of(&chunk_key(&Path::from("img"), 3, 9)), Some((3, 9)));
        let m = SnapshotMarker {
            format: OBJECT_FORMAT,
            wal_start: 40,
            taken: 1,
            host: "h".into(),
        };
        assert_eq!(SnapshotMarker::decode(&key, &m.encode()).unwrap(), m);
        let late = SnapshotMarker {
            wal_start: 43,
            ..m.clone()
        };
        let e = SnapshotMarker::decode(&key, &late.encode()).unwrap_err();
        assert!(e.to_string().contains("snapshot/"), "{e}");
        assert!(SnapshotMarker::decode(&key, b"[").is_err());
    }

    #[test]
    fn leases_round_trip_and_refuse_a_backward_range() {
        let key = lease_key(&Path::from("img"), "h-1-ff");
        assert_eq!(key.as_ref(), "img/lease/h-1-ff");
        let l = Lease {
            format: OBJECT_FORMAT,
            manifest: 7,
            wal_start: 40,
            wal_end: None,
            holder: Writer {
                host: "h".into(),
                pid: 1,
                since: 5,
                at: Some("/mnt".into()),
            },
            expires: 125,
        };
        assert_eq!(Lease::decode(&key, &l.encode()).unwrap(), l);
        assert_eq!(l.wal(), (40, u64::MAX));
        let read = Lease {
            wal_end: Some(42),
            ..l.clone()
        };
        assert_eq!(Lease::decode(&key, &read.encode()).unwrap().wal(), (40, 42));
        let backward = Lease {
            wal_end: Some(39),
            ..l.clone()
        };
        let e = Lease::decode(&key, &backward.encode()).unwrap_err();
        assert!(e.to_string().contains("lease/h-1-ff"), "{e}");
        let newer = Lease {
            format: OBJECT_FORMAT + 1,
            ..l
        };
        let e = Lease::decode(&key, &newer.encode()).unwrap_err();
        assert!(e.to_string().contains("newer"), "{e}");
        assert!(Lease::decode(&key, b"{").is_err());
    }

    #[test]
    fn manifests_from_a_newer_format_are_refused() {
        let key = manifest_key(&Path::from("img"), 1);
        let mut m = Manifest {
            format: OBJECT_FORMAT,
            len: 64 << 20,
            block: BLOCK,
            chunk_blocks: CHUNK_BLOCKS,
            epoch: 1,
            writer: None,
            wal_start: 1,
            chunks: BTreeMap::new(),
        };
        assert!(Manifest::decode(&key, &m.encode()).is_ok());
        m.format += 1;
        let e = Manifest::decode(&key, &m.encode()).unwrap_err();
        assert!(e.to_string().contains("newer"), "{e}");
        assert!(Manifest::decode(&key, b"{").is_err());
    }
}

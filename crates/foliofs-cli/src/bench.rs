//! `foliofs bench`: the seed workloads on the engine, in A/B pairs (the
//! technique on, then its knob off) alternated round by round in one run,
//! with the raw image file read and written with O_DIRECT beside them.
//!
//! W1 (per-block dirty tracking in large folios), W2 (large checksummed
//! direct reads), W3 (shared inode lock for direct overwrites), W4
//! (parallel writeback by AG) and W5 (speculative preallocation for tiny
//! appends); each workload is a function that returns an `Outcome`,
//! printed as a table or as JSON.

use anyhow::{bail, Context, Result};
use comfy_table::Table;
use foliofs::device::{AlignedBuf, Device, FileDevice};
use foliofs::{DioLock, Fs, MkfsOptions, MountOptions};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Workloads: W1, W2, W3, W4, W5 or all.
    #[arg(default_value = "all")]
    pub workloads: Vec<String>,
    /// Image file to build the test file system in (made anew, removed
    /// afterwards unless --keep).
    #[arg(long, default_value = "foliofs-bench.img")]
    pub image: PathBuf,
    /// Size of each workload's file in MiB.
    #[arg(long, default_value_t = 1024)]
    pub file_mib: u64,
    /// A/B rounds.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds per measured pass.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Thread counts for W3.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub threads: Vec<usize>,
    /// Also run each access pattern on the raw image file with O_DIRECT.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub raw: bool,
    #[arg(long)]
    pub json: bool,
    /// Print the tables as Markdown (for docs/BENCH-RESULTS.md).
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
    /// Run the workloads through system calls on these directories
    /// instead (kernel file systems, a foliofs FUSE mount): each target
    /// is a variant, compared with the first. Repeat for several.
    #[arg(long, value_name = "DIR")]
    pub target: Vec<PathBuf>,
    /// Write a chart per workload (SVG and PNG) into this directory.
    #[arg(long, value_name = "DIR")]
    pub chart: Option<PathBuf>,
    /// Keep the image file.
    #[arg(long)]
    pub keep: bool,
}

/// One measured series: a value per round.
#[derive(Serialize, Clone, Debug)]
pub struct Series {
    pub name: String,
    pub unit: String,
    pub values: Vec<f64>,
}

/// A ratio between two series, per round.
#[derive(Serialize, Clone, Debug)]
pub struct Ratio {
    pub what: String,
    pub values: Vec<f64>,
    pub seed: String,
}

#[derive(Serialize, Clone, Debug)]
pub struct Outcome {
    pub id: String,
    pub title: String,
    pub series: Vec<Series>,
    pub ratios: Vec<Ratio>,
    pub notes: Vec<String>,
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return 0.0;
    }
    s[s.len() / 2]
}

fn spread(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

pub(crate) fn ratio(what: &str, a: &[f64], b: &[f64], seed: &str) -> Ratio {
    Ratio {
        what: what.into(),
        values: a.iter().zip(b).map(|(x, y)| x / y.max(1e-9)).collect(),
        seed: seed.into(),
    }
}

/// A fresh file system on the bench image, big enough for `file_mib`.
fn fresh_fs(args: &BenchArgs) -> Result<(Arc<FileDevice>, Fs)> {
    let size = ((args.file_mib + args.file_mib / 8 + 256) << 20).max(512 << 20);
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&args.image)
        .with_context(|| format!("cannot create {}", args.image.display()))?;
    f.set_len(size)?;
    drop(f);
    let dev = Arc::new(FileDevice::open(&args.image, true)?);
    if !dev.is_direct() {
        bail!(
            "{} does not support O_DIRECT (tmpfs?): put --image on a disk",
            args.image.display()
        );
    }
    // Written in full once, so the image behaves like a device: a first
    // write into a sparse image file makes the host file system allocate
    // (and, for O_DIRECT, convert unwritten extents), which a device never
    // does and which only the first writer of a range would pay.
    let zeros = AlignedBuf::zeroed(8 << 20);
    let mut at = 0;
    while at < size {
        let n = (size - at).min(zeros.len() as u64) as usize;
        dev.write_at(&zeros[..n], at)?;
        at += n as u64;
    }
    dev.flush()?;
    foliofs::mkfs(&*dev, &MkfsOptions::default(), |_, _| {})?;
    let fs = Fs::mount(dev.clone(), MountOptions::default())?;
    Ok((dev, fs))
}

/// Block `b`'s content in every bench file: the same bytes whoever writes
/// them, so raw passes may write over the file without breaking its
/// checksums.
pub(crate) fn fill(buf: &mut [u8], first_block: u64, bs: usize) {
    for (i, blk) in buf.chunks_mut(bs).enumerate() {
        let b = first_block + i as u64;
        for (k, w) in blk.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&(b.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ k as u64).to_le_bytes());
        }
    }
}

/// Create `name` holding `mib` MiB written with 1 MiB direct writes.
fn make_file(fs: &Fs, name: &str, mib: u64, pb: &ProgressBar) -> Result<u64> {
    let bs = fs.block_size() as usize;
    let ino = fs.create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)?.ino;
    let mut buf = AlignedBuf::zeroed(1 << 20);
    pb.set_message(format!("writing {name}"));
    for m in 0..mib {
        fill(&mut buf, (m << 20) / bs as u64, bs);
        fs.write_direct(ino, m << 20, &buf)?;
    }
    fs.sync()?;
    Ok(ino)
}

/// Device byte ranges (offset, len) holding the file, in file order.
fn file_ranges(fs: &Fs, ino: u64) -> Result<Vec<(u64, u64)>> {
    let bs = fs.block_size();
    Ok(fs
        .extents(ino)?
        .into_iter()
        .map(|e| (e.device_block * bs, e.blocks * bs))
        .collect())
}

fn open_raw(args: &BenchArgs) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&args.image)
        .with_context(|| format!("cannot open {} with O_DIRECT", args.image.display()))
}

pub(crate) fn progress(total: u64) -> ProgressBar {
    progress_in(total, "passes")
}

/// A progress bar counting `unit`.
pub(crate) fn progress_in(total: u64, unit: &str) -> ProgressBar {
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(&format!(
            "{{msg:>24}} [{{bar:30}}] {{pos}}/{{len}} {unit} ({{elapsed}})"
        ))
        .unwrap()
        .progress_chars("=> "),
    );
    pb
}

/// W1: two jobs, each a file written and read into the cache (large
/// folios), then random 4 KiB buffered overwrites, each followed by
/// fdatasync. Per-block dirty tracking vs whole-folio dirty tracking at
/// 64 KiB folios (remounted with the knob for each pass).
pub fn w1(args: &BenchArgs) -> Result<Outcome> {
    let jobs = 2usize;
    let mib = (args.file_mib / 4).max(1);
    let mut variants = vec!["per-block dirty", "whole-folio dirty, 64 KiB folios"];
    if args.raw {
        // The device's own price for the bytes: the same random blocks
        // written with O_DIRECT, 4 KiB or the whole 64 KiB around them,
        // each followed by fdatasync (rated in 4 KiB app writes).
        variants.push("raw O_DIRECT, 4 KiB + fdatasync");
        variants.push("raw O_DIRECT, 64 KiB + fdatasync");
    }
    let nv = variants.len();
    let pb = progress((args.rounds * nv) as u64);
    let (dev, fs) = fresh_fs(args)?;
    let mut inos = Vec::new();
    let mut ranges = Vec::new();
    for j in 0..jobs {
        let ino = make_file(&fs, &format!("w1-{j}"), mib, &pb)?;
        ranges.push(Arc::new(file_ranges(&fs, ino)?));
        inos.push(ino);
    }
    fs.unmount()?;
    let bs = 4096u64;
    let mut mibs = vec![Vec::new(); nv];
    let mut amp = vec![Vec::new(); 2];
    let mut largest = [0u64; 2];
    // Every pass writes the same random blocks for the same seed.
    let blocks = (mib << 20) / bs;
    let next_block = move |rng: &mut u64| {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng % blocks
    };
    for round in 0..args.rounds {
        for k in 0..nv {
            let v = (k + round) % nv;
            pb.set_message(format!("W1 {}", variants[v]));
            if v >= 2 {
                // Unmounted: block b always holds fill(b), so writing
                // it again leaves the file system as it was.
                let unit = if v == 2 { bs } else { 16 * bs };
                let ops = run_threads(jobs, args.seconds, |t, stop, count| {
                    let ranges = ranges[t].clone();
                    let raw = open_raw(args);
                    move || -> Result<()> {
                        let raw = raw?;
                        let mut rng = 0x2545_F491u64 ^ ((t as u64 + 7) * 0x9E37);
                        let mut buf = AlignedBuf::zeroed(unit as usize);
                        while !stop.load(Ordering::Relaxed) {
                            let b = next_block(&mut rng) / (unit / bs) * (unit / bs);
                            fill(&mut buf, b, bs as usize);
                            raw_write_at(&raw, &ranges, b * bs, &buf)?;
                            raw.sync_data()?;
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(())
                    }
                })?;
                mibs[v].push(ops * bs as f64 / (1 << 20) as f64);
                pb.inc(1);
                continue;
            }
            let mut o = MountOptions::default();
            if v == 1 {
                o.whole_folio_dirty = true;
                o.fixed_folio_bytes = Some(64 << 10);
            }
            let fs = Arc::new(Fs::mount(dev.clone(), o)?);
            // pre_read: every file into the cache.
            let mut buf = vec![0u8; 1 << 20];
            for &ino in &inos {
                for m in 0..mib {
                    fs.read(ino, m << 20, &mut buf)?;
                }
            }
            largest[v] = largest[v].max(fs.cache_stats().largest_folio_bytes);
            let c0 = fs.counters();
            let ops = run_threads(jobs, args.seconds, |t, stop, count| {
                let (fs, ino) = (fs.clone(), inos[t]);
                move || -> Result<()> {
                    let mut rng = 0x2545_F491u64 ^ ((t as u64 + 7) * 0x9E37);
                    let mut buf = vec![0u8; bs as usize];
                    while !stop.load(Ordering::Relaxed) {
                        let b = next_block(&mut rng);
                        fill(&mut buf, b, bs as usize);
                        fs.write(ino, b * bs, &buf)?;
                        fs.fsync(ino, true)?;
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                }
            })?;
            let c = fs.counters();
            let app = (c.bytes_written_app - c0.bytes_written_app).max(1);
            amp[v].push((c.bytes_written_back - c0.bytes_written_back) as f64 / app as f64);
            mibs[v].push(ops * bs as f64 / (1 << 20) as f64);
            match Arc::try_unwrap(fs) {
                Ok(fs) => fs.unmount()?,
                Err(_) => bail!("file system still in use after W1"),
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let mut series = variant_series(
        &variants[..2],
        &[
            ("", "MiB/s", &mibs),
            ("device bytes / app bytes", "ratio", &amp),
        ],
    );
    for v in 2..nv {
        series.extend(variant_series(
            &variants[v..v + 1],
            &[("", "MiB/s", &mibs[v..v + 1])],
        ));
    }
    let mut ratios = vec![
        ratio(
            "per-block / whole-folio (MiB/s)",
            &mibs[0],
            &mibs[1],
            "28 -> 452 MB/s (16x)",
        ),
        ratio(
            "whole-folio / per-block (device bytes written)",
            &amp[1],
            &amp[0],
            "target >= 10",
        ),
    ];
    if args.raw {
        ratios.push(ratio(
            "raw 4 KiB / raw 64 KiB per fdatasync (MiB/s)",
            &mibs[2],
            &mibs[3],
            "the device's price for 16x the bytes",
        ));
        ratios.push(ratio(
            "per-block / raw 4 KiB (MiB/s)",
            &mibs[0],
            &mibs[2],
            "",
        ));
    }
    Ok(Outcome {
        id: "W1".into(),
        title: format!(
            "{jobs} jobs x {mib} MiB cached files, random 4 KiB buffered overwrites + fdatasync"
        ),
        series,
        ratios,
        notes: vec![format!(
            "largest folio after the pre-read: {} KiB per-block run, {} KiB whole-folio run",
            largest[0] >> 10,
            largest[1] >> 10
        )],
    })
}

/// W2: sequential 1 MiB direct reads at queue depth 1, checksums verified;
/// the request cap at 256 blocks vs 1 block, and the raw file.
pub fn w2(args: &BenchArgs) -> Result<Outcome> {
    let variants: Vec<&str> = if args.raw {
        vec!["cap 256 blocks", "cap 1 block", "raw O_DIRECT"]
    } else {
        vec!["cap 256 blocks", "cap 1 block"]
    };
    let pb = progress((args.rounds * 2) as u64);
    let (_dev, fs) = fresh_fs(args)?;
    let ino = make_file(&fs, "w2", args.file_mib, &pb)?;
    let ranges = file_ranges(&fs, ino)?;
    let raw = open_raw(args)?;
    let size = args.file_mib << 20;
    let mut buf = AlignedBuf::zeroed(1 << 20);
    let mut values = vec![Vec::new(); variants.len()];
    let c0 = fs.counters();
    // Passes alternate: cap 256 (with the raw file interleaved request by
    // request, so both see the same device moment), then cap 1.
    for round in 0..args.rounds {
        for k in 0..2 {
            let cap1 = (k + round) % 2 == 1;
            pb.set_message(format!("W2 {}", if cap1 { "cap 1" } else { "cap 256" }));
            fs.set_dio_max_blocks(if cap1 { 1 } else { 256 });
            let t = Instant::now();
            let mut spent = [Duration::ZERO; 2];
            let mut bytes = 0u64;
            let mut pos = 0u64;
            let mut i = 0u64;
            while t.elapsed().as_secs_f64() < args.seconds && bytes < 4 * size {
                // One sequential stream whose MiBs are read in turn by the
                // engine and by the raw file, the engine first on even
                // steps and second on odd ones.
                let both = args.raw && !cap1;
                let order: &[usize] = match (both, i % 2) {
                    (false, _) => &[0],
                    (true, 0) => &[0, 1],
                    (true, _) => &[1, 0],
                };
                for (j, &who) in order.iter().enumerate() {
                    let at = (pos + j as u64 * buf.len() as u64) % size;
                    let r = Instant::now();
                    if who == 0 {
                        let n = fs.read_direct(ino, at, &mut buf)?;
                        if n != buf.len() {
                            bail!("short direct read at {at}: {n}");
                        }
                    } else {
                        raw_read_at(&raw, &ranges, at, &mut buf)?;
                    }
                    spent[who] += r.elapsed();
                }
                bytes += buf.len() as u64;
                pos = (pos + order.len() as u64 * buf.len() as u64) % size;
                i += 1;
            }
            let mibs = |d: Duration| bytes as f64 / (1 << 20) as f64 / d.as_secs_f64();
            if cap1 {
                values[1].push(mibs(spent[0]));
            } else {
                values[0].push(mibs(spent[0]));
                if args.raw {
                    values[2].push(mibs(spent[1]));
                }
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let c = fs.counters();
    let verified = (c.dio_read_bytes - c0.dio_read_bytes) / fs.block_size();
    if c.csum_failures != 0 {
        bail!("{} checksum failures during W2", c.csum_failures);
    }
    fs.unmount()?;
    let series: Vec<Series> = variants
        .iter()
        .zip(&values)
        .map(|(n, v)| Series {
            name: n.to_string(),
            unit: "MiB/s".into(),
            values: v.clone(),
        })
        .collect();
    let mut ratios = vec![ratio(
        "cap 256 / cap 1",
        &values[0],
        &values[1],
        "65 -> 196 MiB/s (3x)",
    )];
    if args.raw {
        ratios.push(ratio(
            "cap 256 / raw device",
            &values[0],
            &values[2],
            "target >= 0.9",
        ));
    }
    Ok(Outcome {
        id: "W2".into(),
        title: format!(
            "sequential 1 MiB direct reads, QD1, {} MiB file, checksums verified",
            args.file_mib
        ),
        series,
        ratios,
        notes: vec![format!(
            "{verified} blocks verified against their checksums, 0 failures"
        )],
    })
}

/// Read the file's bytes at file offset `pos` straight from the image
/// (the same device ranges the engine reads).
fn raw_read_at(raw: &File, ranges: &[(u64, u64)], pos: u64, buf: &mut [u8]) -> Result<()> {
    for (dev_off, r) in device_pieces(ranges, pos, buf.len()) {
        raw.read_exact_at(&mut buf[r], dev_off)?;
    }
    Ok(())
}

/// Write the file's bytes at file offset `pos` straight into the image.
fn raw_write_at(raw: &File, ranges: &[(u64, u64)], pos: u64, buf: &[u8]) -> Result<()> {
    for (dev_off, r) in device_pieces(ranges, pos, buf.len()) {
        raw.write_all_at(&buf[r], dev_off)?;
    }
    Ok(())
}

/// Where file bytes [pos, pos + len) lie on the device: (device offset,
/// range of the buffer) per piece, given the file's device ranges.
fn device_pieces(
    ranges: &[(u64, u64)],
    pos: u64,
    len: usize,
) -> Vec<(u64, std::ops::Range<usize>)> {
    let mut out = Vec::new();
    let mut file_off = 0u64;
    let mut done = 0usize;
    for &(dev_off, rlen) in ranges {
        if done == len {
            break;
        }
        let want = pos + done as u64;
        if want >= file_off + rlen {
            file_off += rlen;
            continue;
        }
        let inside = want - file_off;
        let n = ((rlen - inside) as usize).min(len - done);
        out.push((dev_off + inside, done..done + n));
        done += n;
        file_off += rlen;
    }
    out
}

/// W3: threads of 4 KiB direct random reads and overwrites, 50/50,
/// synchronous; shared-overwrite lock vs exclusive, and the raw file.
pub fn w3(args: &BenchArgs) -> Result<Outcome> {
    let mut variants = vec!["shared overwrite", "exclusive"];
    if args.raw {
        variants.push("raw O_DIRECT");
    }
    let pb = progress((args.rounds * variants.len() * args.threads.len()) as u64);
    let (_dev, fs) = fresh_fs(args)?;
    let ino = make_file(&fs, "w3", args.file_mib, &pb)?;
    let fs = Arc::new(fs);
    let bs = fs.block_size();
    let blocks = (args.file_mib << 20) / bs;
    // Device address of every file block, for the raw pattern.
    let mut map = Vec::with_capacity(blocks as usize);
    for (off, len) in file_ranges(&fs, ino)? {
        map.extend((0..len / bs).map(|k| off + k * bs));
    }
    let map = Arc::new(map);
    let raw = Arc::new(open_raw(args)?);
    let mut series = Vec::new();
    let mut ratios = Vec::new();
    let c0 = fs.counters();
    for &threads in &args.threads {
        let mut values = vec![Vec::new(); variants.len()];
        for round in 0..args.rounds {
            for k in 0..variants.len() {
                let v = (k + round) % variants.len();
                pb.set_message(format!("W3 {threads}t {}", variants[v]));
                fs.set_dio_lock(if v == 1 {
                    DioLock::Exclusive
                } else {
                    DioLock::SharedOverwrite
                });
                let ops = run_threads(threads, args.seconds, |t, stop, count| {
                    let (fs, raw, map) = (fs.clone(), raw.clone(), map.clone());
                    move || -> Result<()> {
                        let mut rng = 0x9E37_79B9u64 ^ ((t as u64 + 1) * 0x1000_0001);
                        let mut buf = AlignedBuf::zeroed(bs as usize);
                        while !stop.load(Ordering::Relaxed) {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            let b = (rng >> 1) % blocks;
                            let write = rng & 1 == 1;
                            if write {
                                fill(&mut buf, b, bs as usize);
                            }
                            match (v, write) {
                                (2, false) => raw.read_exact_at(&mut buf, map[b as usize])?,
                                (2, true) => raw.write_all_at(&buf, map[b as usize])?,
                                (_, false) => {
                                    fs.read_direct(ino, b * bs, &mut buf)?;
                                }
                                (_, true) => {
                                    fs.write_direct(ino, b * bs, &buf)?;
                                }
                            }
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(())
                    }
                })?;
                values[v].push(ops);
                pb.inc(1);
            }
        }
        for (n, vals) in variants.iter().zip(&values) {
            series.push(Series {
                name: format!("{}, {n}", plural(threads, "thread")),
                unit: "IOPS".into(),
                values: vals.clone(),
            });
        }
        ratios.push(ratio(
            &format!("{}: shared / exclusive", plural(threads, "thread")),
            &values[0],
            &values[1],
            if threads >= 8 {
                "up to +140% at 24 threads; target >= 1.5 at 8"
            } else {
                "up to +140% at 24 threads"
            },
        ));
        if args.raw {
            ratios.push(ratio(
                &format!("{}: shared / raw device", plural(threads, "thread")),
                &values[0],
                &values[2],
                "",
            ));
        }
    }
    pb.finish_and_clear();
    let c = fs.counters();
    if c.csum_failures != 0 {
        bail!("{} checksum failures during W3", c.csum_failures);
    }
    let notes = vec![
        format!(
            "lock waits: shared {} ({:.1} ms), exclusive {} ({:.1} ms)",
            c.lock_shared_waits - c0.lock_shared_waits,
            (c.lock_shared_wait_ns - c0.lock_shared_wait_ns) as f64 / 1e6,
            c.lock_exclusive_waits - c0.lock_exclusive_waits,
            (c.lock_exclusive_wait_ns - c0.lock_exclusive_wait_ns) as f64 / 1e6,
        ),
        format!(
            "journal commits {} for {} direct overwrites (group commit)",
            c.journal.commits - c0.journal.commits,
            (c.dio_overwrites_shared + c.dio_writes_exclusive)
                - (c0.dio_overwrites_shared + c0.dio_writes_exclusive),
        ),
    ];
    match Arc::try_unwrap(fs) {
        Ok(fs) => fs.unmount()?,
        Err(_) => bail!("file system still in use after W3"),
    }
    Ok(Outcome {
        id: "W3".into(),
        title: format!(
            "4 KiB direct random read/overwrite 50/50, synchronous, {} MiB file",
            args.file_mib
        ),
        series,
        ratios,
        notes,
    })
}

/// MiB/s of `n` threads each filling 1 MiB buffers as the W4 writers do
/// and copying them into memory already mapped (as a page cache that
/// recycles its pages has it), `mib` MiB per thread: the CPU work a
/// buffered write path cannot avoid, without any file system or device.
fn copy_rate(n: usize, mib: u64) -> Result<f64> {
    let pages: Vec<Vec<AlignedBuf>> = (0..n)
        .map(|_| (0..mib).map(|_| AlignedBuf::zeroed(1 << 20)).collect())
        .collect();
    let t = Instant::now();
    let handles: Vec<_> = pages
        .into_iter()
        .map(|mut pages| {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                for (m, page) in pages.iter_mut().enumerate() {
                    fill(&mut buf, ((m as u64) << 20) / 4096, 4096);
                    page.copy_from_slice(&buf);
                }
                pages
            })
        })
        .collect();
    let mut kept = Vec::new();
    for h in handles {
        kept.push(
            h.join()
                .map_err(|_| anyhow::anyhow!("copy thread panicked"))?,
        );
    }
    let rate = (n as u64 * mib) as f64 / t.elapsed().as_secs_f64();
    drop(kept);
    Ok(rate)
}

/// W4: N files in N directories (one per AG), N writers of 1 MiB
/// buffered sequential writes, `file_mib` MiB in all, fsync at the end;
/// one writeback context per AG vs one context, and the raw file written
/// sequentially with 1 MiB O_DIRECT writes over the same device ranges.
pub fn w4(args: &BenchArgs) -> Result<Outcome> {
    let mut variants = vec!["one context per AG", "one context"];
    if args.raw {
        variants.push("raw O_DIRECT");
        // What any buffered write must do before the device sees a byte:
        // the writers' data copied into memory (no file system).
        variants.push("fill + copy into mapped memory, no I/O");
    }
    let pb = progress((args.rounds * 2) as u64);
    let (_dev, fs) = fresh_fs(args)?;
    let fs = Arc::new(fs);
    let ags = fs.ag_usage().len();
    let n = ags.min(foliofs::fs::MAX_WB_CONTEXTS);
    let per_file = (args.file_mib / n as u64).max(1);
    let root = fs.root_ino();
    let per_ag = fs.superblock().inodes_per_ag as u64;
    let mut dirs = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..n {
        let d = fs.mkdir(root, format!("w4-{i}").as_bytes(), 0o755, 0, 0)?;
        seen.insert(d.ino / per_ag);
        dirs.push(d.ino);
    }
    let raw = Arc::new(open_raw(args)?);
    let mut values = vec![Vec::new(); variants.len()];
    let mut extents = vec![Vec::new(); 2];
    // One pass of the N writers, each creating its file in its directory:
    // the files' inodes and the seconds it took, the fsyncs included.
    let pass = || -> Result<(Vec<u64>, f64)> {
        let t = Instant::now();
        let handles: Vec<_> = dirs
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                let fs = fs.clone();
                std::thread::spawn(move || -> Result<u64> {
                    let name = format!("f{i}");
                    let ino = fs.create(d, name.as_bytes(), 0o644, 0, 0)?.ino;
                    let mut buf = vec![0u8; 1 << 20];
                    for m in 0..per_file {
                        fill(&mut buf, (m << 20) / 4096, 4096);
                        fs.write(ino, m << 20, &buf)?;
                    }
                    fs.fsync(ino, false)?;
                    Ok(ino)
                })
            })
            .collect();
        let mut inos = Vec::new();
        for h in handles {
            inos.push(
                h.join()
                    .map_err(|_| anyhow::anyhow!("W4 writer panicked"))??,
            );
        }
        Ok((inos, t.elapsed().as_secs_f64()))
    };
    let unlink_all = || -> Result<()> {
        for (i, &d) in dirs.iter().enumerate() {
            fs.unlink(d, format!("f{i}").as_bytes())?;
        }
        Ok(fs.sync()?)
    };
    // The first pass maps the folio memory fresh (the kernel zeroes every
    // page); later passes reuse it, as a long-running mount does. Measured
    // apart, so the rounds compare the steady state with the raw device.
    pb.set_message("W4 first pass");
    fs.set_writeback_contexts(n);
    let first_pass = (per_file * n as u64) as f64 / pass()?.1;
    unlink_all()?;
    for round in 0..args.rounds {
        for k in 0..2 {
            let v = (k + round) % 2;
            pb.set_message(format!("W4 {}", variants[v]));
            fs.set_writeback_contexts(if v == 0 { n } else { 1 });
            let (inos, took) = pass()?;
            values[v].push((per_file * n as u64) as f64 / took);
            let mut ranges = Vec::new();
            let mut ext = 0usize;
            for &ino in &inos {
                let r = file_ranges(&fs, ino)?;
                ext += r.len();
                ranges.extend(r);
            }
            extents[v].push(ext as f64 / n as f64);
            if args.raw && v == 0 {
                // The same bytes over the same device ranges, one stream.
                let mut buf = AlignedBuf::zeroed(1 << 20);
                fill(&mut buf, 0, 4096);
                let t = Instant::now();
                let mut bytes = 0u64;
                for &(off, len) in &ranges {
                    let mut at = 0;
                    while at < len {
                        let k = (len - at).min(buf.len() as u64) as usize;
                        raw.write_all_at(&buf[..k], off + at)?;
                        at += k as u64;
                        bytes += k as u64;
                    }
                }
                raw.sync_data()?;
                values[2].push(bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64());
                values[3].push(copy_rate(n, per_file)?);
            }
            unlink_all()?;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let st = fs.writeback_stats();
    let mapped = fs.counters().folio_bytes_mapped;
    match Arc::try_unwrap(fs) {
        Ok(fs) => fs.unmount()?,
        Err(_) => bail!("file system still in use after W4"),
    }
    let mut series: Vec<Series> = variants
        .iter()
        .zip(&values)
        .map(|(name, v)| Series {
            name: name.to_string(),
            unit: "MiB/s".into(),
            values: v.clone(),
        })
        .collect();
    series.extend(variant_series(
        &variants[..2],
        &[("extents per file", "extents", &extents)],
    ));
    let mut ratios = vec![
        ratio(
            "per AG / one context (MiB/s)",
            &values[0],
            &values[1],
            "243 -> 759 MiB/s (+212%)",
        ),
        ratio(
            "per AG / one context (extents per file)",
            &extents[0],
            &extents[1],
            "extents unchanged (target <= 1)",
        ),
    ];
    if args.raw {
        ratios.push(ratio(
            "per AG / raw 1 MiB writes",
            &values[0],
            &values[2],
            "target >= 0.8",
        ));
        ratios.push(ratio(
            "fill + copy / raw 1 MiB writes",
            &values[3],
            &values[2],
            "CPU ceiling of a buffered path",
        ));
    }
    Ok(Outcome {
        id: "W4".into(),
        title: format!(
            "{n} writers x {per_file} MiB in {n} directories ({} AGs), 1 MiB buffered writes, fsync at end",
            seen.len()
        ),
        series,
        ratios,
        notes: vec![
            format!(
                "bytes written back per context over the run: {}",
                st.iter()
                    .map(|c| format!("{} MiB", c.bytes >> 20))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            format!(
                "first pass (not in the rounds), one context per AG: {first_pass:.0} MiB/s; it maps the folio memory fresh: {} MiB mapped for {} MiB written in all, later passes reuse freed folios",
                mapped >> 20,
                (args.rounds as u64 * 2 + 1) * per_file * n as u64
            ),
        ],
    })
}

/// W5: 1-byte appends to a new file until 64 MiB or the time limit, then
/// close; whole-block mapping with speculative preallocation vs mapping by
/// write length (remounted with the knob for each pass).
pub fn w5(args: &BenchArgs) -> Result<Outcome> {
    let variants = ["whole-block mapping + prealloc", "mapping by write length"];
    let limit = 64u64 << 20;
    let secs = (args.seconds * 5.0).min(10.0);
    let pb = progress((args.rounds * 2) as u64);
    let (dev, fs) = fresh_fs(args)?;
    fs.unmount()?;
    let mut rate = vec![Vec::new(); 2];
    let mut lookups = vec![Vec::new(); 2];
    let mut extents = vec![Vec::new(); 2];
    let mut post_eof = vec![Vec::new(); 2];
    for round in 0..args.rounds {
        for k in 0..2 {
            let v = (k + round) % 2;
            pb.set_message(format!("W5 {}", variants[v]));
            let o = MountOptions {
                map_by_write_length: v == 1,
                ..Default::default()
            };
            let fs = Fs::mount(dev.clone(), o)?;
            let name = format!("w5-{round}-{v}");
            let ino = fs.create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)?.ino;
            fs.open(ino)?;
            let c0 = fs.counters();
            let t = Instant::now();
            let mut n = 0u64;
            while n < limit {
                fs.write(ino, n, &[(n % 251) as u8])?;
                n += 1;
                if n % 65536 == 0 && t.elapsed().as_secs_f64() > secs {
                    break;
                }
            }
            let took = t.elapsed().as_secs_f64();
            let c = fs.counters();
            fs.release(ino)?;
            let ext = fs.extents(ino)?;
            let mapped: u64 = ext.iter().map(|e| e.blocks).sum();
            rate[v].push(n as f64 / took);
            lookups[v].push((c.mapping_lookups - c0.mapping_lookups) as f64 / n as f64);
            extents[v].push(ext.len() as f64);
            post_eof[v].push(mapped.saturating_sub(n.div_ceil(fs.block_size())) as f64);
            fs.unlink(fs.root_ino(), name.as_bytes())?;
            fs.unmount()?;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let series = variant_series(
        &variants,
        &[
            ("", "appends/s", &rate),
            ("mapping lookups per append", "lookups", &lookups),
            ("extents after close", "extents", &extents),
            ("blocks past EOF after close", "blocks", &post_eof),
        ],
    );
    Ok(Outcome {
        id: "W5".into(),
        title: format!("1-byte appends to a new file, 64 MiB or {secs:.0} s, then close"),
        series,
        ratios: vec![ratio(
            "whole-block / write-length (appends/s)",
            &rate[0],
            &rate[1],
            "aim7 -13.6% from the regression",
        )],
        notes: vec![format!(
            "mapping lookups per append: {:.5} whole-block vs {:.3} by write length (target <= 0.01)",
            median(&lookups[0]),
            median(&lookups[1])
        )],
    })
}

/// Per variant, one series per metric (label, unit, values per variant),
/// named "variant" for an empty label, else "variant: label".
fn variant_series(variants: &[&str], metrics: &[(&str, &str, &[Vec<f64>])]) -> Vec<Series> {
    let mut out = Vec::new();
    for (v, name) in variants.iter().enumerate() {
        for (label, unit, values) in metrics {
            out.push(Series {
                name: if label.is_empty() {
                    name.to_string()
                } else {
                    format!("{name}: {label}")
                },
                unit: unit.to_string(),
                values: values[v].clone(),
            });
        }
    }
    out
}

pub(crate) fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Run `threads` workers for `secs` seconds; returns operations per second.
pub(crate) fn run_threads<F, W>(threads: usize, secs: f64, make: F) -> Result<f64>
where
    F: Fn(usize, Arc<AtomicBool>, Arc<AtomicU64>) -> W,
    W: FnOnce() -> Result<()> + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|i| std::thread::spawn(make(i, stop.clone(), count.clone())))
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let mut r = Ok(());
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => r = Err(e),
            Err(_) => bail!("a benchmark thread panicked"),
        }
    }
    r?;
    Ok(count.load(Ordering::Relaxed) as f64 / t.elapsed().as_secs_f64())
}

pub fn run(args: &BenchArgs) -> Result<Vec<Outcome>> {
    if args.rounds == 0 || args.file_mib == 0 || args.seconds <= 0.0 {
        bail!("--rounds, --file-mib and --seconds must be positive");
    }
    let mut which: Vec<String> = args.workloads.iter().map(|w| w.to_uppercase()).collect();
    if which.iter().any(|w| w == "ALL") {
        which = ["W1", "W2", "W3", "W4", "W5"].map(String::from).to_vec();
    }
    for w in &which {
        if !["W1", "W2", "W3", "W4", "W5"].contains(&w.as_str()) {
            bail!("unknown workload {w}: choose W1, W2, W3, W4, W5 or all");
        }
    }
    if !args.target.is_empty() {
        return crate::target::run(args, &which);
    }
    let mut out = Vec::new();
    for w in &which {
        let r = match w.as_str() {
            "W1" => w1(args),
            "W2" => w2(args),
            "W3" => w3(args),
            "W4" => w4(args),
            "W5" => w5(args),
            _ => unreachable!("checked above"),
        };
        let r = r.with_context(|| format!("workload {w}"));
        if !args.keep {
            let _ = std::fs::remove_file(&args.image);
        }
        out.push(r?);
    }
    Ok(out)
}

/// A figure with as many decimals as its size needs.
fn num(x: f64) -> String {
    match x.abs() {
        a if a >= 100.0 || a == 0.0 => format!("{x:.0}"),
        a if a >= 1.0 => format!("{x:.2}"),
        _ => format!("{x:.5}"),
    }
}

pub fn print(outcomes: &[Outcome], markdown: bool) {
    for o in outcomes {
        println!("{}: {}", o.id, o.title);
        if markdown {
            println!();
        }
        let mut t = Table::new();
        if markdown {
            t.load_style(comfy_table::presets::ASCII_MARKDOWN);
        }
        t.set_header(vec!["variant", "median", "min", "max", "unit"]);
        for s in &o.series {
            let (lo, hi) = spread(&s.values);
            t.add_row(vec![
                s.name.clone(),
                num(median(&s.values)),
                num(lo),
                num(hi),
                s.unit.clone(),
            ]);
        }
        println!("{t}");
        if markdown {
            println!();
        }
        let mut t = Table::new();
        if markdown {
            t.load_style(comfy_table::presets::ASCII_MARKDOWN);
        }
        t.set_header(vec!["ratio", "median", "min", "max", "seed"]);
        for r in &o.ratios {
            let (lo, hi) = spread(&r.values);
            t.add_row(vec![
                r.what.clone(),
                format!("{:.2}", median(&r.values)),
                format!("{lo:.2}"),
                format!("{hi:.2}"),
                r.seed.clone(),
            ]);
        }
        println!("{t}");
        if markdown {
            println!();
        }
        for n in &o.notes {
            println!("{}{n}", if markdown { "- " } else { "  " });
        }
        println!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_ratios() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (1.0, 3.0));
        let r = ratio("a/b", &[4.0, 9.0], &[2.0, 3.0], "");
        assert_eq!(r.values, vec![2.0, 3.0]);
    }
}

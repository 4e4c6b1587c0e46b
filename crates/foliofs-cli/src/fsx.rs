//! `foliofs torture fsx`: an exerciser in the spirit of fsx. Long random
//! sequences of operations on one file (sub-block, unaligned and large
//! buffered reads and writes, O_DIRECT reads and writes, truncate up and
//! down, punch hole, zero range, fallocate, fsync, SEEK_DATA/SEEK_HOLE,
//! remount or reopen) against an in-memory model; every read, every size
//! and every data/hole answer is checked (a hole must hold only zeros).
//!
//! It runs on the engine (an image file, remounted and checked by fsck
//! along the way) or through system calls on a file in any directory (a
//! foliofs FUSE mount, or a kernel file system for comparison). Seeded: a
//! failure prints its seed, operation number and the operations before
//! it, and `--seed S --ops N` replays it.

use anyhow::{bail, Context, Result};
use foliofs::device::{AlignedBuf, FileDevice};
use foliofs::fs::{Falloc, SetAttr, Whence};
use foliofs::{Fs, MkfsOptions, MountOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Largest file offset an operation touches.
const MAX_LEN: u64 = 1 << 20;
const DIO: u64 = 4096;

/// What the exerciser runs against.
trait Subject {
    fn write(&mut self, off: u64, data: &[u8]) -> Result<()>;
    fn read(&mut self, off: u64, buf: &mut [u8]) -> Result<usize>;
    fn write_direct(&mut self, off: u64, data: &AlignedBuf) -> Result<()>;
    fn read_direct(&mut self, off: u64, buf: &mut AlignedBuf) -> Result<usize>;
    fn truncate(&mut self, size: u64) -> Result<()>;
    /// Ok(false): the file system does not support this mode.
    fn fallocate(&mut self, mode: Falloc, off: u64, len: u64) -> Result<bool>;
    fn fsync(&mut self, datasync: bool) -> Result<()>;
    fn size(&mut self) -> Result<u64>;
    /// SEEK_DATA (`data`) or SEEK_HOLE from `off`; None for ENXIO.
    fn seek(&mut self, off: u64, data: bool) -> Result<Option<u64>>;
    /// Remount (engine) or close and reopen (system calls).
    fn cycle(&mut self) -> Result<()>;
    fn finish(self: Box<Self>) -> Result<()>;
}

/// The engine on an image file, with a small cache so folios are evicted.
struct Engine {
    image: PathBuf,
    fs: Option<Arc<Fs>>,
    ino: u64,
    /// One of several threads' files on one mount: a cycle is an fsync
    /// and a check of the books, and the caller unmounts at the end.
    shared: bool,
}

fn engine_options() -> MountOptions {
    MountOptions {
        cache_bytes: 4 << 20,
        dirty_limit_bytes: 2 << 20,
        ..Default::default()
    }
}

/// A fresh image with a mounted file system.
fn engine_mount(image: &Path) -> Result<Fs> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(image)
        .with_context(|| format!("cannot create {}", image.display()))?;
    f.set_len(64 << 20)?;
    drop(f);
    let dev = Arc::new(FileDevice::open(image, true)?);
    foliofs::mkfs(&*dev, &MkfsOptions::default(), |_, _| {})?;
    Ok(Fs::mount(dev, engine_options())?)
}

/// Unmount and fsck the image (data checksums included).
fn unmount_and_check(fs: Arc<Fs>, image: &Path) -> Result<()> {
    match Arc::try_unwrap(fs) {
        Ok(fs) => fs.unmount()?,
        Err(_) => bail!("the file system is still in use at unmount"),
    }
    let dev = Arc::new(FileDevice::open(image, false)?);
    let opts = foliofs::fsck::FsckOptions {
        repair: false,
        check_data: true,
    };
    let r = foliofs::fsck::fsck(dev, &opts, |_, _| {})?;
    if !r.is_clean() {
        bail!("fsck after unmount: {:?}", r.problems);
    }
    Ok(())
}

impl Engine {
    /// File `name` on `fs`, mounted from `image`.
    fn on(fs: Arc<Fs>, image: &Path, name: &str, shared: bool) -> Result<Engine> {
        let ino = fs.create(fs.root_ino(), name.as_bytes(), 0o644, 0, 0)?.ino;
        Ok(Engine {
            image: image.to_path_buf(),
            fs: Some(fs),
            ino,
            shared,
        })
    }

    fn fs(&self) -> &Fs {
        self.fs.as_ref().expect("mounted between cycles")
    }
}

impl Subject for Engine {
    fn write(&mut self, off: u64, data: &[u8]) -> Result<()> {
        let n = self.fs().write(self.ino, off, data)?;
        if n != data.len() {
            bail!("short write: {n} of {}", data.len());
        }
        Ok(())
    }
    fn read(&mut self, off: u64, buf: &mut [u8]) -> Result<usize> {
        Ok(self.fs().read(self.ino, off, buf)?)
    }
    fn write_direct(&mut self, off: u64, data: &AlignedBuf) -> Result<()> {
        let n = self.fs().write_direct(self.ino, off, data)?;
        if n != data.len() {
            bail!("short direct write: {n} of {}", data.len());
        }
        Ok(())
    }
    fn read_direct(&mut self, off: u64, buf: &mut AlignedBuf) -> Result<usize> {
        Ok(self.fs().read_direct(self.ino, off, buf)?)
    }
    fn truncate(&mut self, size: u64) -> Result<()> {
        let set = SetAttr {
            size: Some(size),
            ..Default::default()
        };
        self.fs().setattr(self.ino, &set)?;
        Ok(())
    }
    fn fallocate(&mut self, mode: Falloc, off: u64, len: u64) -> Result<bool> {
        self.fs().fallocate(self.ino, mode, off, len)?;
        Ok(true)
    }
    fn fsync(&mut self, datasync: bool) -> Result<()> {
        Ok(self.fs().fsync(self.ino, datasync)?)
    }
    fn size(&mut self) -> Result<u64> {
        Ok(self.fs().getattr(self.ino)?.size)
    }
    fn seek(&mut self, off: u64, data: bool) -> Result<Option<u64>> {
        let w = if data { Whence::Data } else { Whence::Hole };
        Ok(self.fs().seek(self.ino, off, w)?)
    }
    fn cycle(&mut self) -> Result<()> {
        self.fs().check_invariants()?;
        if self.shared {
            return Ok(self.fs().fsync(self.ino, false)?);
        }
        let fs = self.fs.take().expect("mounted between cycles");
        unmount_and_check(fs, &self.image)?;
        let dev = Arc::new(FileDevice::open(&self.image, true)?);
        self.fs = Some(Arc::new(Fs::mount(dev, engine_options())?));
        Ok(())
    }
    fn finish(mut self: Box<Self>) -> Result<()> {
        let fs = self.fs.take().expect("mounted between cycles");
        if !self.shared {
            unmount_and_check(fs, &self.image)?;
            std::fs::remove_file(&self.image)?;
        }
        Ok(())
    }
}

/// A file in a directory, through system calls: one buffered descriptor
/// and one O_DIRECT descriptor, as two programs sharing the file would.
struct Syscalls {
    path: PathBuf,
    buffered: File,
    direct: File,
}

impl Syscalls {
    fn open(path: &Path, create: bool) -> Result<(File, File)> {
        let buffered = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(create)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let direct = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .with_context(|| format!("cannot open {} with O_DIRECT", path.display()))?;
        Ok((buffered, direct))
    }
}

impl Subject for Syscalls {
    fn write(&mut self, off: u64, data: &[u8]) -> Result<()> {
        Ok(self.buffered.write_all_at(data, off)?)
    }
    fn read(&mut self, off: u64, buf: &mut [u8]) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.buffered.read_at(&mut buf[done..], off + done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        Ok(done)
    }
    fn write_direct(&mut self, off: u64, data: &AlignedBuf) -> Result<()> {
        Ok(self.direct.write_all_at(data, off)?)
    }
    fn read_direct(&mut self, off: u64, buf: &mut AlignedBuf) -> Result<usize> {
        Ok(self.direct.read_at(buf, off)?)
    }
    fn truncate(&mut self, size: u64) -> Result<()> {
        Ok(self.buffered.set_len(size)?)
    }
    fn fallocate(&mut self, mode: Falloc, off: u64, len: u64) -> Result<bool> {
        let keep = libc::FALLOC_FL_KEEP_SIZE;
        let flags = match mode {
            Falloc::PunchHole => libc::FALLOC_FL_PUNCH_HOLE | keep,
            Falloc::ZeroRange { keep_size } => {
                libc::FALLOC_FL_ZERO_RANGE | if keep_size { keep } else { 0 }
            }
            Falloc::Allocate { keep_size } => {
                if keep_size {
                    keep
                } else {
                    0
                }
            }
        };
        // SAFETY: a valid descriptor; fallocate reads no memory.
        let r = unsafe {
            libc::fallocate(
                self.buffered.as_raw_fd(),
                flags,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
        if r == 0 {
            return Ok(true);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            return Ok(false);
        }
        Err(e).context("fallocate")
    }
    fn fsync(&mut self, datasync: bool) -> Result<()> {
        if datasync {
            self.buffered.sync_data()?;
        } else {
            self.buffered.sync_all()?;
        }
        Ok(())
    }
    fn size(&mut self) -> Result<u64> {
        Ok(self.buffered.metadata()?.len())
    }
    fn seek(&mut self, off: u64, data: bool) -> Result<Option<u64>> {
        let whence = if data {
            libc::SEEK_DATA
        } else {
            libc::SEEK_HOLE
        };
        // SAFETY: a valid descriptor; lseek reads no memory.
        let r = unsafe { libc::lseek(self.buffered.as_raw_fd(), off as libc::off_t, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        Err(e).context("lseek")
    }
    fn cycle(&mut self) -> Result<()> {
        let (b, d) = Syscalls::open(&self.path, false)?;
        self.buffered = b;
        self.direct = d;
        Ok(())
    }
    fn finish(self: Box<Self>) -> Result<()> {
        self.buffered.sync_all()?;
        std::fs::remove_file(&self.path)?;
        Ok(())
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct FsxArgs {
    /// Operations per run.
    #[arg(long, default_value_t = 100_000)]
    pub ops: u64,
    /// First seed (default: from the clock); runs use seed, seed+1, ...
    #[arg(long)]
    pub seed: Option<u64>,
    /// Runs, each with its own seed.
    #[arg(long, default_value_t = 1)]
    pub runs: u64,
    /// Run through system calls on a file in this directory (a mounted
    /// foliofs, or any file system) instead of on the engine.
    #[arg(long, value_name = "DIR")]
    pub target: Option<PathBuf>,
    /// Threads, each with its own file and seed (seed, seed+1, ...), on
    /// one mount at once: a stress run of separate files sharing the
    /// file system's locks, caches, allocator and journal.
    #[arg(long, default_value_t = 1)]
    pub threads: u64,
    /// No O_DIRECT operations (for a mount whose page cache is not
    /// coherent with direct I/O, such as FUSE with writeback_cache).
    #[arg(long)]
    pub buffered_only: bool,
    /// Image file for the engine runs (made anew, removed afterwards).
    #[arg(long, default_value = "foliofs-fsx.img")]
    pub image: PathBuf,
}

/// What a run did, for the summary.
#[derive(Default, Debug)]
pub struct Tally {
    pub ops: u64,
    pub reads_checked: u64,
    pub bytes_checked: u64,
    pub cycles: u64,
    pub unsupported: u64,
}

fn pattern(seed: u64, op: u64, len: usize) -> Vec<u8> {
    let mut x = seed ^ op.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The model side of a write.
fn model_write(model: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if model.len() < end {
        model.resize(end, 0);
    }
    model[off as usize..end].copy_from_slice(data);
}

fn check_read(model: &[u8], off: u64, got: &[u8], n: usize, what: &str) -> Result<()> {
    let want = if off as usize >= model.len() {
        &[][..]
    } else {
        &model[off as usize..(off as usize + got.len()).min(model.len())]
    };
    if n != want.len() {
        bail!(
            "{what} at {off}+{}: {n} bytes, the model has {}",
            got.len(),
            want.len()
        );
    }
    if let Some(i) = (0..n).find(|&i| got[i] != want[i]) {
        bail!(
            "{what} at {off}+{}: byte {} is {:#04x}, the model has {:#04x}",
            got.len(),
            off + i as u64,
            got[i],
            want[i]
        );
    }
    Ok(())
}

/// A SEEK_DATA/SEEK_HOLE answer against the model: past the end, ENXIO;
/// SEEK_DATA may skip only zeros, and finds nothing only if nothing but
/// zeros follows; SEEK_HOLE lands at the end or in a block of zeros.
fn check_seek(model: &[u8], off: u64, data: bool, got: Option<u64>) -> Result<()> {
    let size = model.len() as u64;
    let what = if data { "SEEK_DATA" } else { "SEEK_HOLE" };
    let zeros = |a: u64, b: u64| model[a as usize..b as usize].iter().all(|&x| x == 0);
    let ok = match (off >= size, got) {
        (true, None) => true,
        (true, Some(_)) => false,
        (false, None) => data && zeros(off, size),
        (false, Some(p)) if p < off || p > size => false,
        (false, Some(p)) if data => p < size && zeros(off, p),
        (false, Some(p)) => zeros(p, (p / DIO + 1).saturating_mul(DIO).min(size)),
    };
    if !ok {
        bail!("{what} from {off} answered {got:?}: wrong for a file of {size} bytes as the model has it (a hole holds only zeros)");
    }
    Ok(())
}

/// One run: `ops` operations from `seed`.
fn run_one(
    subject: &mut dyn Subject,
    seed: u64,
    ops: u64,
    buffered_only: bool,
    tally: &mut Tally,
) -> Result<()> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut model: Vec<u8> = Vec::new();
    let mut log: VecDeque<String> = VecDeque::new();
    let mut unsupported = [false; 3];
    for op in 0..ops {
        let r = step(
            subject,
            &mut rng,
            &mut model,
            (seed, op, buffered_only),
            &mut log,
            &mut unsupported,
            tally,
        );
        if let Err(e) = r {
            let recent: Vec<String> = log.iter().cloned().collect();
            bail!(
                "seed {seed}, operation {op}: {e:#}\nlast operations:\n  {}\nreplay: --seed {seed} --ops {}",
                recent.join("\n  "),
                op + 1
            );
        }
        tally.ops += 1;
    }
    // The whole file, once more, at the end.
    let mut buf = vec![0u8; model.len()];
    let n = subject.read(0, &mut buf)?;
    check_read(&model, 0, &buf, n, &format!("seed {seed}: final read"))?;
    Ok(())
}

fn step(
    s: &mut dyn Subject,
    rng: &mut SmallRng,
    model: &mut Vec<u8>,
    (seed, op, buffered_only): (u64, u64, bool),
    log: &mut VecDeque<String>,
    unsupported: &mut [bool; 3],
    tally: &mut Tally,
) -> Result<()> {
    let size = model.len() as u64;
    let mut note = |msg: String| {
        if log.len() == 16 {
            log.pop_front();
        }
        log.push_back(format!("{op}: {msg}"));
    };
    let mut pick = rng.random_range(0..100);
    if buffered_only && (45..=60).contains(&pick) {
        pick -= 20;
    }
    match pick {
        0..=24 => {
            let off = if rng.random_bool(0.2) {
                size
            } else {
                rng.random_range(0..MAX_LEN)
            };
            let len = match rng.random_range(0..4) {
                0 => rng.random_range(1..16),
                1 => rng.random_range(1..4096),
                2 => rng.random_range(1..20_000),
                _ => rng.random_range(1..200_000),
            }
            .min((MAX_LEN - off) as usize)
            .max(1);
            note(format!("write {off}+{len}"));
            let data = pattern(seed, op, len);
            s.write(off, &data)?;
            model_write(model, off, &data);
        }
        25..=44 => {
            let off = rng.random_range(0..=size + 5000);
            let len = rng.random_range(1..150_000usize);
            note(format!("read {off}+{len}"));
            let mut buf = vec![0xA5u8; len];
            let n = s.read(off, &mut buf)?;
            check_read(model, off, &buf, n, "read")?;
            tally.reads_checked += 1;
            tally.bytes_checked += n as u64;
        }
        45..=52 => {
            let off = rng.random_range(0..MAX_LEN / DIO) * DIO;
            let len = (rng.random_range(1..=16u64) * DIO).min(MAX_LEN - off) as usize;
            note(format!("direct write {off}+{len}"));
            let mut buf = AlignedBuf::zeroed(len);
            buf.copy_from_slice(&pattern(seed, op, len));
            s.write_direct(off, &buf)?;
            model_write(model, off, &buf);
        }
        53..=60 => {
            let off = rng.random_range(0..=(size + DIO) / DIO) * DIO;
            let len = (rng.random_range(1..=32u64) * DIO) as usize;
            note(format!("direct read {off}+{len}"));
            let mut buf = AlignedBuf::zeroed(len);
            buf.fill(0x5A);
            let n = s.read_direct(off, &mut buf)?;
            check_read(model, off, &buf, n, "direct read")?;
            tally.reads_checked += 1;
            tally.bytes_checked += n as u64;
        }
        61..=68 => {
            let new = if rng.random_bool(0.5) {
                rng.random_range(0..=size)
            } else {
                rng.random_range(0..MAX_LEN)
            };
            note(format!("truncate {size} -> {new}"));
            s.truncate(new)?;
            model.resize(new as usize, 0);
        }
        69..=80 => {
            let off = rng.random_range(0..MAX_LEN);
            let len = rng.random_range(1..=(MAX_LEN - off).min(150_000));
            let (mode, k) = match rng.random_range(0..3) {
                0 => (Falloc::PunchHole, 0),
                1 => (
                    Falloc::ZeroRange {
                        keep_size: rng.random_bool(0.5),
                    },
                    1,
                ),
                _ => (
                    Falloc::Allocate {
                        keep_size: rng.random_bool(0.5),
                    },
                    2,
                ),
            };
            if unsupported[k] {
                return Ok(());
            }
            note(format!("fallocate {mode:?} {off}+{len}"));
            if !s.fallocate(mode, off, len)? {
                unsupported[k] = true;
                tally.unsupported += 1;
                return Ok(());
            }
            let end = (off + len) as usize;
            let zero = |m: &mut Vec<u8>| {
                let e = end.min(m.len());
                if (off as usize) < e {
                    m[off as usize..e].fill(0);
                }
            };
            match mode {
                Falloc::PunchHole => zero(model),
                Falloc::ZeroRange { keep_size } => {
                    zero(model);
                    if !keep_size && model.len() < end {
                        model.resize(end, 0);
                    }
                }
                Falloc::Allocate { keep_size } => {
                    if !keep_size && model.len() < end {
                        model.resize(end, 0);
                    }
                }
            }
        }
        81..=89 => {
            let data = rng.random_bool(0.5);
            note(if data { "fdatasync" } else { "fsync" }.to_string());
            s.fsync(data)?;
        }
        90 if rng.random_range(0..4) == 0 => {
            note("remount/reopen".into());
            s.cycle()?;
            tally.cycles += 1;
        }
        91..=94 => {
            let off = rng.random_range(0..=size + 5000);
            let data = rng.random_bool(0.5);
            note(format!("seek {} {off}", if data { "data" } else { "hole" }));
            let got = s.seek(off, data)?;
            check_seek(model, off, data, got)?;
        }
        _ => {
            // Read the whole file back.
            note("read all".into());
            let mut buf = vec![0xC3u8; model.len()];
            let n = s.read(0, &mut buf)?;
            check_read(model, 0, &buf, n, "whole-file read")?;
            tally.reads_checked += 1;
            tally.bytes_checked += n as u64;
        }
    }
    let got = s.size()?;
    if got != model.len() as u64 {
        bail!(
            "size is {got} after the operation, the model has {}",
            model.len()
        );
    }
    Ok(())
}

/// Run `args.runs` rounds of `args.threads` seeds each; the summary on
/// success, the failing seed and its operations on failure.
pub fn run(args: &FsxArgs) -> Result<Tally> {
    if args.ops == 0 || args.runs == 0 || args.threads == 0 {
        bail!("--ops, --runs and --threads must be positive");
    }
    if let Some(dir) = &args.target {
        if !dir.is_dir() {
            bail!("--target {}: not a directory", dir.display());
        }
    }
    let first = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1)
    });
    let threads = args.threads;
    let pb = crate::bench::progress_in(args.runs * threads * args.ops, "operations");
    let mut tally = Tally::default();
    for round in 0..args.runs {
        let seeds: Vec<u64> = (0..threads).map(|t| first + round * threads + t).collect();
        pb.set_message(format!(
            "fsx seeds {}..={}",
            seeds[0],
            seeds[seeds.len() - 1]
        ));
        let mut engine = match &args.target {
            Some(_) => None,
            None => Some(Arc::new(engine_mount(&args.image)?)),
        };
        let mut subjects: Vec<Box<dyn Subject + Send>> = Vec::new();
        for &seed in &seeds {
            subjects.push(match (&args.target, &engine) {
                (Some(dir), _) => {
                    let path = dir.join(format!("fsx.{seed}"));
                    let (buffered, direct) = Syscalls::open(&path, true)?;
                    Box::new(Syscalls {
                        path,
                        buffered,
                        direct,
                    })
                }
                // One thread owns the mount (it remounts); several share it.
                (None, Some(fs)) if threads > 1 => Box::new(Engine::on(
                    fs.clone(),
                    &args.image,
                    &format!("fsx.{seed}"),
                    true,
                )?),
                (None, _) => {
                    let fs = engine.take().expect("mounted above");
                    Box::new(Engine::on(fs, &args.image, &format!("fsx.{seed}"), false)?)
                }
            });
        }
        let results: Vec<Result<Tally>> = std::thread::scope(|sc| {
            let handles: Vec<_> = subjects
                .into_iter()
                .zip(&seeds)
                .map(|(mut subject, &seed)| {
                    let pb = &pb;
                    sc.spawn(move || -> Result<Tally> {
                        let mut t = Tally::default();
                        run_one(subject.as_mut(), seed, args.ops, args.buffered_only, &mut t)?;
                        subject
                            .finish()
                            .with_context(|| format!("seed {seed}: after the run"))?;
                        pb.inc(t.ops);
                        Ok(t)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("an fsx thread panicked")))
                })
                .collect()
        });
        for r in results {
            let t = r?;
            tally.ops += t.ops;
            tally.reads_checked += t.reads_checked;
            tally.bytes_checked += t.bytes_checked;
            tally.cycles += t.cycles;
            tally.unsupported += t.unsupported;
        }
        if let Some(fs) = engine {
            fs.check_invariants()?;
            unmount_and_check(fs, &args.image)
                .with_context(|| format!("seeds {seeds:?}: after the run"))?;
            std::fs::remove_file(&args.image)?;
        }
    }
    pb.finish_and_clear();
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_checked_byte_by_byte_and_by_length() {
        let model = vec![1u8, 2, 3, 4];
        assert!(check_read(&model, 1, &[2, 3, 4, 9], 3, "read").is_ok());
        let e = check_read(&model, 1, &[2, 7, 4, 0], 3, "read").unwrap_err();
        assert!(e.to_string().contains("byte 2 is 0x07"), "{e}");
        assert!(check_read(&model, 1, &[2, 3, 4, 0], 4, "read").is_err());
        assert!(check_read(&model, 9, &[0; 4], 0, "read").is_ok());
        assert!(check_read(&model, 9, &[0; 4], 1, "read").is_err());
    }
}

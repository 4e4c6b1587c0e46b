//! `foliofs bench --target DIR ...`: the W1-W5 access patterns through
//! ordinary system calls on directories (a kernel XFS/ext4/btrfs mount, a
//! foliofs FUSE mount), so every file system runs identical code. The
//! targets are the variants: alternated round by round in one run, each
//! compared with the first.

use super::args::BenchArgs;
use super::report::{fill, median, plural, progress, ratio, run_threads, Outcome, Ratio, Series};
use super::w6::{file_count, tree, w6_pass, PHASES};
use anyhow::{bail, Context, Result};
use foliofs::device::AlignedBuf;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

/// A short name for a target: its last path component.
fn label(dir: &Path) -> String {
    dir.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| dir.display().to_string())
}

/// Each target's working directory (`DIR/foliofs-bench`), made anew.
fn work_dirs(args: &BenchArgs) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for t in &args.target {
        if !t.is_dir() {
            bail!("--target {}: not a directory", t.display());
        }
        let d = t.join("foliofs-bench");
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).with_context(|| format!("cannot create {}", d.display()))?;
        out.push(d);
    }
    Ok(out)
}

fn open_rw(path: &Path, direct: bool) -> Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    o.open(path).with_context(|| {
        format!(
            "cannot open {}{}",
            path.display(),
            if direct { " with O_DIRECT" } else { "" }
        )
    })
}

/// Write `mib` MiB of the bench pattern to `path` and make it durable.
fn make_file(path: &Path, mib: u64) -> Result<()> {
    let f = open_rw(path, false)?;
    f.set_len(0)?;
    let mut buf = vec![0u8; 1 << 20];
    for m in 0..mib {
        fill(&mut buf, (m << 20) / 4096, 4096);
        f.write_all_at(&buf, m << 20)?;
    }
    f.sync_all()?;
    Ok(())
}

/// The series (one per target) and ratios of every target against the
/// first for one metric.
fn per_target(
    names: &[String],
    what: &str,
    unit: &str,
    values: &[Vec<f64>],
    seed: &str,
) -> (Vec<Series>, Vec<Ratio>) {
    let series = names
        .iter()
        .zip(values)
        .map(|(n, v)| Series {
            name: if what.is_empty() {
                n.clone()
            } else {
                format!("{n}: {what}")
            },
            unit: unit.into(),
            values: v.clone(),
        })
        .collect();
    let ratios = (1..names.len())
        .map(|i| {
            let w = if what.is_empty() { unit } else { what };
            ratio(
                &format!("{} / {} ({w})", names[0], names[i]),
                &values[0],
                &values[i],
                seed,
            )
        })
        .collect();
    (series, ratios)
}

/// Run `pass(target index, dir)` for every target, in an order that
/// rotates each round.
fn rounds(
    args: &BenchArgs,
    id: &str,
    dirs: &[PathBuf],
    names: &[String],
    mut pass: impl FnMut(usize, &Path) -> Result<()>,
) -> Result<()> {
    let pb = progress((args.rounds * dirs.len()) as u64);
    for round in 0..args.rounds {
        for k in 0..dirs.len() {
            let t = (k + round) % dirs.len();
            pb.set_message(format!("{id} {}", names[t]));
            pass(t, &dirs[t]).with_context(|| format!("{id} on {}", dirs[t].display()))?;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    Ok(())
}

/// W1's files in `dir`: `jobs` files of `mib` MiB.
pub(super) fn w1_files(dir: &Path, jobs: usize, mib: u64) -> Result<()> {
    for j in 0..jobs {
        make_file(&dir.join(format!("w1-{j}")), mib)?;
    }
    Ok(())
}

/// One W1 pass on `dir` (files from `w1_files`): read into the cache,
/// then random 4 KiB overwrites each followed by fdatasync. Returns the
/// overwrites done.
pub(super) fn w1_pass(args: &BenchArgs, dir: &Path, jobs: usize, mib: u64) -> Result<f64> {
    let files: Vec<Arc<File>> = (0..jobs)
        .map(|j| open_rw(&dir.join(format!("w1-{j}")), false).map(Arc::new))
        .collect::<Result<_>>()?;
    let mut buf = vec![0u8; 1 << 20];
    for f in &files {
        for m in 0..mib {
            f.read_exact_at(&mut buf, m << 20)?;
        }
    }
    run_threads(jobs, args.seconds, |j, stop, count| {
        let f = files[j].clone();
        move || -> Result<()> {
            let mut rng = 0x2545_F491u64 ^ ((j as u64 + 7) * 0x9E37);
            let mut buf = vec![0u8; 4096];
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let b = rng % ((mib << 20) / 4096);
                fill(&mut buf, b, 4096);
                f.write_all_at(&buf, b * 4096)?;
                f.sync_data()?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
    })
}

/// W1: two cached files, random 4 KiB overwrites each followed by
/// fdatasync.
fn w1(args: &BenchArgs, dirs: &[PathBuf], names: &[String]) -> Result<Outcome> {
    let jobs = 2usize;
    let mib = (args.file_mib / 4).max(1);
    for d in dirs {
        w1_files(d, jobs, mib)?;
    }
    let mut mibs = vec![Vec::new(); dirs.len()];
    rounds(args, "W1", dirs, names, |t, dir| {
        let ops = w1_pass(args, dir, jobs, mib)?;
        mibs[t].push(ops * 4096.0 / (1 << 20) as f64);
        Ok(())
    })?;
    let (series, ratios) = per_target(names, "", "MiB/s", &mibs, "");
    Ok(Outcome {
        id: "W1".into(),
        title: format!("{jobs} jobs x {mib} MiB cached files, random 4 KiB overwrites + fdatasync (system calls)"),
        series,
        ratios,
        notes: vec![],
    })
}

/// W2: sequential 1 MiB O_DIRECT reads at queue depth 1.
fn w2(args: &BenchArgs, dirs: &[PathBuf], names: &[String]) -> Result<Outcome> {
    for d in dirs {
        make_file(&d.join("w2"), args.file_mib)?;
    }
    let size = args.file_mib << 20;
    let mut whole = super::report::huge_buf(1 << 20);
    let buf = &mut whole[..1 << 20];
    let mut mibs = vec![Vec::new(); dirs.len()];
    rounds(args, "W2", dirs, names, |t, dir| {
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(dir.join("w2"))
            .context("O_DIRECT open")?;
        let start = Instant::now();
        let mut bytes = 0u64;
        while start.elapsed().as_secs_f64() < args.seconds && bytes < 4 * size {
            f.read_exact_at(buf, bytes % size)?;
            bytes += buf.len() as u64;
        }
        mibs[t].push(bytes as f64 / (1 << 20) as f64 / start.elapsed().as_secs_f64());
        Ok(())
    })?;
    let (series, ratios) = per_target(names, "", "MiB/s", &mibs, "");
    Ok(Outcome {
        id: "W2".into(),
        title: format!(
            "sequential 1 MiB O_DIRECT reads, QD1, {} MiB file (system calls)",
            args.file_mib
        ),
        series,
        ratios,
        notes: vec![],
    })
}

/// W3's file in `dir`.
pub(super) fn w3_file(dir: &Path, mib: u64) -> Result<()> {
    make_file(&dir.join("w3"), mib)
}

/// One W3 pass on `dir` (file from `w3_file`): `threads` threads of 4 KiB
/// O_DIRECT random reads and overwrites, 50/50. Returns the operations.
pub(super) fn w3_pass(args: &BenchArgs, dir: &Path, threads: usize) -> Result<f64> {
    let blocks = (args.file_mib << 20) / 4096;
    let f = Arc::new(open_rw(&dir.join("w3"), true)?);
    run_threads(threads, args.seconds, |i, stop, count| {
        let f = f.clone();
        move || -> Result<()> {
            let mut rng = 0x9E37_79B9u64 ^ ((i as u64 + 1) * 0x1000_0001);
            let mut buf = AlignedBuf::zeroed(4096);
            while !stop.load(Ordering::Relaxed) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let b = (rng >> 1) % blocks;
                if rng & 1 == 1 {
                    fill(&mut buf, b, 4096);
                    f.write_all_at(&buf, b * 4096)?;
                } else {
                    f.read_exact_at(&mut buf, b * 4096)?;
                }
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
    })
}

/// W3: threads of 4 KiB O_DIRECT random reads and overwrites, 50/50.
fn w3(args: &BenchArgs, dirs: &[PathBuf], names: &[String]) -> Result<Outcome> {
    for d in dirs {
        w3_file(d, args.file_mib)?;
    }
    let mut series = Vec::new();
    let mut ratios = Vec::new();
    for &threads in &args.threads {
        let mut iops = vec![Vec::new(); dirs.len()];
        rounds(args, &format!("W3 {threads}t"), dirs, names, |t, dir| {
            iops[t].push(w3_pass(args, dir, threads)?);
            Ok(())
        })?;
        let (s, r) = per_target(names, &plural(threads, "thread"), "IOPS", &iops, "");
        series.extend(s);
        ratios.extend(r);
    }
    Ok(Outcome {
        id: "W3".into(),
        title: format!(
            "4 KiB O_DIRECT random read/overwrite 50/50, {} MiB file (system calls)",
            args.file_mib
        ),
        series,
        ratios,
        notes: vec![],
    })
}

/// W4: four writers, each a file in its own directory, 1 MiB buffered
/// writes, fsync at the end. Each target first takes one pass unmeasured,
/// as the engine's own W4 does (`w4.rs`): the first pass after a
/// mount maps its cache memory fresh, which on a machine that hands free
/// memory back to its host (free page reporting) faults every page in
/// from the host.
fn w4(args: &BenchArgs, dirs: &[PathBuf], names: &[String]) -> Result<Outcome> {
    let n = 4usize;
    let per_file = (args.file_mib / n as u64).max(1);
    let pass = |dir: &Path| -> Result<f64> {
        let start = Instant::now();
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let d = dir.join(format!("w4-{i}"));
                std::thread::spawn(move || -> Result<()> {
                    std::fs::create_dir_all(&d)?;
                    let f = open_rw(&d.join("file"), false)?;
                    f.set_len(0)?;
                    let mut buf = vec![0u8; 1 << 20];
                    for m in 0..per_file {
                        fill(&mut buf, (m << 20) / 4096, 4096);
                        f.write_all_at(&buf, m << 20)?;
                    }
                    f.sync_all()?;
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow::anyhow!("W4 writer panicked"))??;
        }
        let mib_s = (per_file * n as u64) as f64 / start.elapsed().as_secs_f64();
        for i in 0..n {
            std::fs::remove_file(dir.join(format!("w4-{i}/file")))?;
        }
        Ok(mib_s)
    };
    for dir in dirs {
        pass(dir).with_context(|| format!("W4 warm-up on {}", dir.display()))?;
    }
    let mut mibs = vec![Vec::new(); dirs.len()];
    rounds(args, "W4", dirs, names, |t, dir| {
        mibs[t].push(pass(dir)?);
        Ok(())
    })?;
    let (series, ratios) = per_target(names, "", "MiB/s", &mibs, "");
    Ok(Outcome {
        id: "W4".into(),
        title: format!("{n} writers x {per_file} MiB in {n} directories, 1 MiB buffered writes, fsync at end, after one pass unmeasured (system calls)"),
        series,
        ratios,
        notes: vec![],
    })
}

/// W5: 1-byte appends to a new file until 64 MiB or the time limit, then
/// close; the space the file holds past its end afterwards.
fn w5(args: &BenchArgs, dirs: &[PathBuf], names: &[String]) -> Result<Outcome> {
    let limit = 64u64 << 20;
    let secs = (args.seconds * 5.0).min(10.0);
    let mut rate = vec![Vec::new(); dirs.len()];
    let mut past_eof = vec![Vec::new(); dirs.len()];
    rounds(args, "W5", dirs, names, |t, dir| {
        let path = dir.join("w5");
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        let start = Instant::now();
        let mut n = 0u64;
        while n < limit {
            f.write_all_at(&[(n % 251) as u8], n)?;
            n += 1;
            if n % 65536 == 0 && start.elapsed().as_secs_f64() > secs {
                break;
            }
        }
        rate[t].push(n as f64 / start.elapsed().as_secs_f64());
        f.sync_all()?;
        drop(f);
        let m = std::fs::metadata(&path)?;
        past_eof[t].push(
            (m.blocks() * 512).saturating_sub(m.len().next_multiple_of(4096)) as f64 / 4096.0,
        );
        std::fs::remove_file(&path)?;
        Ok(())
    })?;
    let (mut series, ratios) = per_target(names, "", "appends/s", &rate, "");
    series.extend(
        per_target(
            names,
            "4 KiB blocks past EOF after close",
            "blocks",
            &past_eof,
            "",
        )
        .0,
    );
    Ok(Outcome {
        id: "W5".into(),
        title: format!(
            "1-byte appends to a new file, 64 MiB or {secs:.0} s, then close (system calls)"
        ),
        series,
        ratios,
        notes: vec![format!(
            "median appends per second: {}",
            names
                .iter()
                .zip(&rate)
                .map(|(n, r)| format!("{n} {:.0}", median(r)))
                .collect::<Vec<_>>()
                .join(", ")
        )],
    })
}

/// W6: the metadata tree through system calls; "cold" after the kernel's
/// caches are dropped (root), "warm" right after.
fn w6(args: &BenchArgs, dirs: &[PathBuf], names: &[String]) -> Result<Outcome> {
    let entries = tree(file_count(args));
    let mut rates = vec![vec![Vec::new(); PHASES.len()]; dirs.len()];
    let mut dropped = true;
    rounds(args, "W6", dirs, names, |t, dir| {
        let (r, d) = w6_pass(dir, &entries)?;
        dropped &= d;
        for (k, v) in r.into_iter().enumerate() {
            rates[t][k].push(v);
        }
        Ok(())
    })?;
    let mut series = Vec::new();
    let mut ratios = Vec::new();
    for (k, phase) in PHASES.iter().enumerate() {
        let per: Vec<Vec<f64>> = rates.iter().map(|r| r[k].clone()).collect();
        let (s, r) = per_target(names, phase, "entries/s", &per, "");
        series.extend(s);
        ratios.extend(r);
    }
    let mut notes = Vec::new();
    if !dropped {
        notes.push("could not drop the kernel's caches (not root): cold = warm".into());
    }
    Ok(Outcome {
        id: "W6".into(),
        title: format!(
            "metadata: a tree of {} entries created, stat-ed, listed, renamed, removed",
            entries.len()
        ),
        series,
        ratios,
        notes,
    })
}

/// Free bytes of the file system holding `dir`.
fn free_bytes(dir: &Path) -> Result<u64> {
    let s = crate::mount::statvfs(dir).with_context(|| format!("statvfs {}", dir.display()))?;
    Ok(s.f_bavail * s.f_frsize)
}

/// `cp SRC DST`, then fsync DST: the seconds both took.
fn cp_durable(src: &Path, dst: &Path) -> Result<f64> {
    let start = Instant::now();
    let st = std::process::Command::new("cp")
        .arg("--")
        .arg(src)
        .arg(dst)
        .status()
        .context("cannot run cp")?;
    if !st.success() {
        bail!("cp {} {}: {st}", src.display(), dst.display());
    }
    File::open(dst)?.sync_all()?;
    Ok(start.elapsed().as_secs_f64())
}

/// Leave `path` out of the kernel's page cache (written back already), so
/// that the next read of it comes from its file system: the copy back
/// measures the file system, not memory. (A FUSE mount's daemon keeps
/// what its own cache holds: that is part of the file system.)
fn uncache(path: &Path) -> Result<()> {
    let f = File::open(path)?;
    // SAFETY: a valid descriptor; advice only.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(())
}

/// CP: what most users do first with a new file system, with the `cp` of
/// coreutils: copy one large file onto each target from a scratch
/// directory beside --image (the source in the page cache, as a file
/// just made is), fsync the copy; then copy it back off into the scratch
/// directory, out of the page cache first, and fsync that copy.
fn cp(args: &BenchArgs, dirs: &[PathBuf], names: &[String]) -> Result<Outcome> {
    let scratch = match args.image.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let src = scratch.join("foliofs-bench-cp.src");
    let back = scratch.join("foliofs-bench-cp.back");
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&back);
    // Room for the copy on every target (a tenth spare), and for the
    // source and the copy back in the scratch directory.
    let mut room = free_bytes(&scratch)? / 2;
    for d in dirs {
        room = room.min(free_bytes(d)? / 10 * 9);
    }
    let mib = args.cp_mib.min(room >> 20);
    if mib == 0 {
        bail!(
            "no room for CP's file on the targets or in {}",
            scratch.display()
        );
    }
    make_file(&src, mib)?;
    let mut onto = vec![Vec::new(); dirs.len()];
    let mut off = vec![Vec::new(); dirs.len()];
    // One copy onto a target and back off it: the seconds each way.
    let pass = |dir: &Path| -> Result<(f64, f64)> {
        let dst = dir.join("cp-file");
        let s_onto = cp_durable(&src, &dst)?;
        let got = std::fs::metadata(&dst)?.len();
        if got != mib << 20 {
            bail!(
                "the copy on {} holds {got} bytes of {}",
                dir.display(),
                mib << 20
            );
        }
        uncache(&dst)?;
        let s_off = cp_durable(&dst, &back)?;
        std::fs::remove_file(&back)?;
        std::fs::remove_file(&dst)?;
        Ok((s_onto, s_off))
    };
    // Unmeasured, as a warm-up: each measured copy then follows another
    // one. The first after the source is made copies into memory that
    // has not been written since it was freed; on a virtual machine that
    // hands free memory back to its host (free page reporting, as this
    // project's test machine does) each of its pages then faults in from
    // the host, and the first target ran at half the speed of the same
    // copy a pass later (foliofs onto 466 then 907 MiB/s, XFS at 1127 and
    // 1189 after it).
    let warm = pass(&dirs[0]);
    let r = warm.and_then(|_| {
        rounds(args, "CP", dirs, names, |t, dir| {
            let (s_onto, s_off) = pass(dir)?;
            onto[t].push(mib as f64 / s_onto);
            off[t].push(mib as f64 / s_off);
            Ok(())
        })
    });
    let _ = std::fs::remove_file(&src);
    let _ = std::fs::remove_file(&back);
    r?;
    let (mut series, mut ratios) = per_target(names, "onto", "MiB/s", &onto, "");
    let (s2, r2) = per_target(names, "off", "MiB/s", &off, "");
    series.extend(s2);
    ratios.extend(r2);
    Ok(Outcome {
        id: "CP".into(),
        title: format!(
            "cp of a {mib} MiB file onto the file system and back off it, each copy fsynced (system calls)"
        ),
        series,
        ratios,
        notes: vec![format!("scratch directory: {}", scratch.display())],
    })
}

/// The chosen workloads on every `--target`.
pub fn run(args: &BenchArgs, which: &[String]) -> Result<Vec<Outcome>> {
    let dirs = work_dirs(args)?;
    let mut names: Vec<String> = args.target.iter().map(|t| label(t)).collect();
    if (1..names.len()).any(|i| names[..i].contains(&names[i])) {
        names = args
            .target
            .iter()
            .map(|t| t.display().to_string())
            .collect();
    }
    let mut out = Vec::new();
    for w in which {
        let r = match w.as_str() {
            "W1" => w1(args, &dirs, &names),
            "W2" => w2(args, &dirs, &names),
            "W3" => w3(args, &dirs, &names),
            "W4" => w4(args, &dirs, &names),
            "W5" => w5(args, &dirs, &names),
            "W6" => w6(args, &dirs, &names),
            "CP" => cp(args, &dirs, &names),
            _ => unreachable!("checked by the caller"),
        };
        for d in &dirs {
            let _ = std::fs::remove_dir_all(d);
            std::fs::create_dir(d)?;
        }
        out.push(r.with_context(|| format!("workload {w}"))?);
    }
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
    }
    Ok(out)
}

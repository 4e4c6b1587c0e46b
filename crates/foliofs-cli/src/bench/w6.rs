//! W6, metadata: a tree of small files and directories, shaped like an
//! unpacked documentation and source tree and generated the same every run,
//! is created (as tar would: mkdir, create, write, close; then sync),
//! stat-ed cold (after a remount, or dropped kernel caches) and warm,
//! listed, renamed and removed; entries per second for each phase.

use super::args::BenchArgs;
use super::engine::fresh_fs;
use super::report::{progress, ratio, Outcome, Series};
use anyhow::{Context, Result};
use foliofs::fs::{listing, FileType};
use foliofs::{Fs, MountOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::time::Instant;

/// One entry of the tree: its path below the tree's root ('/'-separated),
/// and a file's size (None for a directory). Parents come first.
pub(super) struct Entry {
    pub path: String,
    pub size: Option<usize>,
}

/// The phases, in the order they run.
pub(super) const PHASES: [&str; 6] = [
    "create + sync",
    "stat cold",
    "stat warm",
    "readdir",
    "rename",
    "remove + sync",
];

/// The tree: 60 directories of 4 subdirectories each, and `files` files
/// spread over them, most under 2 KiB, some up to 64 KiB.
pub(super) fn tree(files: usize) -> Vec<Entry> {
    let mut rng = SmallRng::seed_from_u64(6);
    let mut out = Vec::new();
    let mut dirs = Vec::new();
    for d in 0..60 {
        out.push(Entry {
            path: format!("d{d:02}"),
            size: None,
        });
        for s in 0..4 {
            let p = format!("d{d:02}/s{s}");
            out.push(Entry {
                path: p.clone(),
                size: None,
            });
            dirs.push(p);
        }
    }
    for i in 0..files {
        let size = match rng.random_range(0..10) {
            0..6 => rng.random_range(0..2048),
            6..9 => rng.random_range(2048..16384),
            _ => rng.random_range(16384..65536),
        };
        let dir = &dirs[i % dirs.len()];
        out.push(Entry {
            path: format!("{dir}/file-{i:05}.txt"),
            size: Some(size),
        });
    }
    out
}

/// How many files a run makes: 6,000 (fewer for a tiny --file-mib).
pub(super) fn file_count(args: &BenchArgs) -> usize {
    (args.file_mib as usize * 400).min(6000)
}

/// The content of a file of the tree.
pub(super) fn content(i: usize, size: usize) -> Vec<u8> {
    (0..size).map(|k| b'a' + ((k + i) % 26) as u8).collect()
}

fn split(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(k) => (&path[..k], &path[k + 1..]),
        None => ("", path),
    }
}

/// W6 on the engine: each phase's entries per second.
pub fn w6(args: &BenchArgs) -> Result<Outcome> {
    let entries = tree(file_count(args));
    let vs = args.vs_dir()?;
    let pb = progress(args.rounds as u64 * (1 + vs.is_some() as u64));
    let (dev, fs) = fresh_fs(args)?;
    let mut rates = vec![Vec::new(); PHASES.len()];
    // `--vs`: the same phases through system calls, alternated with the
    // engine's (first in odd rounds).
    let mut kernel = vec![Vec::new(); PHASES.len()];
    let mut dropped = true;
    let mut kernel_pass = |round: usize| -> Result<()> {
        if let Some((dir, name)) = &vs {
            dev.settle()?;
            pb.set_message(format!("W6 round {} {name}", round + 1));
            let (r, d) = w6_pass(dir, &entries)?;
            dropped &= d;
            for (k, v) in r.into_iter().enumerate() {
                kernel[k].push(v);
            }
            pb.inc(1);
        }
        Ok(())
    };
    let mut fs = Some(fs);
    for round in 0..args.rounds {
        // Not the last round's background work (see W1).
        dev.settle()?;
        if round % 2 == 1 {
            kernel_pass(round)?;
        }
        pb.set_message(format!("W6 round {}", round + 1));
        let f = fs.take().expect("mounted");
        let root = f
            .mkdir(f.root_ino(), format!("w6-{round}").as_bytes(), 0o755, 0, 0)?
            .ino;
        let mut inos: HashMap<&str, u64> = HashMap::new();
        let ino_of = |inos: &HashMap<&str, u64>, p: &str| {
            if p.is_empty() {
                root
            } else {
                inos[p]
            }
        };
        // Create, as tar does, and make it durable.
        let t = Instant::now();
        for (i, e) in entries.iter().enumerate() {
            let (dir, name) = split(&e.path);
            let parent = ino_of(&inos, dir);
            let ino = match e.size {
                None => f.mkdir(parent, name.as_bytes(), 0o755, 0, 0)?.ino,
                Some(n) => {
                    let (a, of) = f
                        .create(parent, name.as_bytes(), 0o644, 0, 0)
                        .and_then(|a| f.open_file(a.ino))?;
                    f.write(a.ino, 0, &content(i, n))?;
                    f.release_file(of)?;
                    a.ino
                }
            };
            inos.insert(&e.path, ino);
        }
        f.sync()?;
        rates[0].push(entries.len() as f64 / t.elapsed().as_secs_f64());
        // Stat cold (a fresh mount: nothing cached) and warm.
        f.unmount()?;
        let f = Fs::mount(dev.clone(), MountOptions::default())?;
        for phase in [1, 2] {
            let t = Instant::now();
            for e in &entries {
                let (dir, name) = split(&e.path);
                let a = f.lookup(ino_of(&inos, dir), name.as_bytes())?;
                let dir_entry = a.kind == FileType::Dir;
                anyhow::ensure!(dir_entry == e.size.is_none(), "{}: wrong type", e.path);
            }
            rates[phase].push(entries.len() as f64 / t.elapsed().as_secs_f64());
        }
        // List every directory.
        let t = Instant::now();
        let mut listed = 0usize;
        for e in entries.iter().filter(|e| e.size.is_none()) {
            listing(
                0,
                |c| f.readdir(inos[e.path.as_str()], c, 128),
                |d| {
                    listed += 1;
                    (false, d.cookie)
                },
            )?;
        }
        rates[3].push(listed as f64 / t.elapsed().as_secs_f64());
        // Rename every file within its directory.
        let t = Instant::now();
        let files: Vec<&Entry> = entries.iter().filter(|e| e.size.is_some()).collect();
        for e in &files {
            let (dir, name) = split(&e.path);
            let p = ino_of(&inos, dir);
            f.rename(p, name.as_bytes(), p, format!("{name}.r").as_bytes(), 0)?;
        }
        rates[4].push(files.len() as f64 / t.elapsed().as_secs_f64());
        // Remove it all, deepest first, and make that durable.
        let t = Instant::now();
        for e in entries.iter().rev() {
            let (dir, name) = split(&e.path);
            let p = ino_of(&inos, dir);
            match e.size {
                Some(_) => f.unlink(p, format!("{name}.r").as_bytes())?,
                None => f.rmdir(p, name.as_bytes())?,
            }
        }
        f.rmdir(f.root_ino(), format!("w6-{round}").as_bytes())?;
        f.sync()?;
        rates[5].push(entries.len() as f64 / t.elapsed().as_secs_f64());
        fs = Some(f);
        pb.inc(1);
        if round % 2 == 0 {
            kernel_pass(round)?;
        }
    }
    pb.finish_and_clear();
    fs.take().expect("mounted").unmount().context("unmount")?;
    let mut series: Vec<Series> = PHASES
        .iter()
        .zip(&rates)
        .map(|(p, v)| Series {
            name: format!("engine: {p}"),
            unit: "entries/s".into(),
            values: v.clone(),
        })
        .collect();
    let mut ratios = Vec::new();
    let mut notes = Vec::new();
    if let Some((_, name)) = &vs {
        for (k, p) in PHASES.iter().enumerate() {
            series.push(Series {
                name: format!("{name}: {p}"),
                unit: "entries/s".into(),
                values: kernel[k].clone(),
            });
            ratios.push(ratio(
                &format!("engine / {name} ({p})"),
                &rates[k],
                &kernel[k],
                "target >= 1.0",
            ));
        }
        if !dropped {
            notes.push(format!(
                "could not drop the kernel's caches (not root): {name}'s stat cold = warm"
            ));
        }
    }
    notes.push(
        "against kernel file systems and the FUSE mount: --target DIR (the same phases through system calls)".into(),
    );
    Ok(Outcome {
        id: "W6".into(),
        title: format!(
            "metadata: a tree of {} directories and {} small files, created, stat-ed, listed, renamed, removed",
            entries.iter().filter(|e| e.size.is_none()).count(),
            entries.iter().filter(|e| e.size.is_some()).count()
        ),
        series,
        ratios,
        notes,
    })
}

/// Make `dir`'s file system durable: syncfs, and on a foliofs mount also
/// the daemon's own sync (`foliofs_fuse::sync_mount`), which Linux's
/// syncfs does not reach, so that every target's "sync" means the same.
fn syncfs(dir: &Path) -> Result<()> {
    foliofs_fuse::sync_mount(&File::open(dir)?)
        .with_context(|| format!("sync of {}", dir.display()))?;
    Ok(())
}

/// One W6 round through system calls in `dir` (the tree made in
/// `dir/w6` and removed again): entries per second for each phase, and
/// whether the kernel's caches could be dropped before "stat cold"
/// (root only; otherwise cold = warm).
pub(super) fn w6_pass(dir: &Path, entries: &[Entry]) -> Result<([f64; PHASES.len()], bool)> {
    let root = dir.join("w6");
    let mut r = [0f64; PHASES.len()];
    let timed = |n: usize, f: &mut dyn FnMut() -> Result<()>| {
        let t0 = Instant::now();
        f()?;
        Ok::<f64, anyhow::Error>(n as f64 / t0.elapsed().as_secs_f64())
    };
    std::fs::create_dir(&root)?;
    r[0] = timed(entries.len(), &mut || {
        for (i, e) in entries.iter().enumerate() {
            let p = root.join(&e.path);
            match e.size {
                None => std::fs::create_dir(&p)?,
                Some(n) => std::fs::write(&p, content(i, n))?,
            }
        }
        syncfs(&root)
    })?;
    let dropped = std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok();
    for phase in [1, 2] {
        r[phase] = timed(entries.len(), &mut || {
            for e in entries {
                let m = std::fs::symlink_metadata(root.join(&e.path))?;
                anyhow::ensure!(m.is_dir() == e.size.is_none(), "{}: wrong type", e.path);
            }
            Ok(())
        })?;
    }
    let mut listed = 0;
    let t0 = Instant::now();
    for e in entries.iter().filter(|e| e.size.is_none()) {
        listed += std::fs::read_dir(root.join(&e.path))?.count();
    }
    r[3] = listed as f64 / t0.elapsed().as_secs_f64();
    let files = entries.iter().filter(|e| e.size.is_some()).count();
    r[4] = timed(files, &mut || {
        for e in entries.iter().filter(|e| e.size.is_some()) {
            let p = root.join(&e.path);
            std::fs::rename(&p, p.with_extension("txt.r"))?;
        }
        Ok(())
    })?;
    r[5] = timed(entries.len(), &mut || {
        for e in entries.iter().rev() {
            let p = root.join(&e.path);
            match e.size {
                Some(_) => std::fs::remove_file(p.with_extension("txt.r"))?,
                None => std::fs::remove_dir(&p)?,
            }
        }
        std::fs::remove_dir(&root)?;
        syncfs(dir)
    })?;
    Ok((r, dropped))
}

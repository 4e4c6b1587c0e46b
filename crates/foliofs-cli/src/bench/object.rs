//! The object runner (`--image s3://BUCKET/PREFIX`): the workloads on an
//! object image (durability=object: a flush is one WAL PUT; or as
//! `--object-options` says, e.g. durability=local), and in the
//! same run the server's own floor, against which the issue sets its
//! targets: the median latency of a create-if-absent PUT of 4 KiB (W1's
//! fdatasyncs/s against 1 / that latency), the throughput of 8 MiB PUTs
//! with 4 in flight (W4 against it) and of 8 MiB GETs with 4 in flight (a
//! cold read of a `file_mib` file from an empty cache against it, read-ahead
//! of chunks on and off).
//!
//! A run never touches an image already at the URL: it works under a
//! prefix of its own below it, `PREFIX/foliofs-bench-<unix seconds>-<pid>`,
//! each workload's image at `<run>/w1` .., the floor's objects at
//! `<run>/floor`, the cold read's image at `<run>/cold`, and deletes
//! each when done with it (all of them are left with --keep). The raw
//! O_DIRECT passes are left out: an object image has no raw device.

use super::args::BenchArgs;
use super::cpu::{cpus, shares, Cores, Span};
use super::report::{fill, make_file, median, progress, ratio, Outcome, Series};
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use foliofs::device::{AlignedBuf, Device};
use foliofs::{Fs, MkfsOptions, MountOptions};
use foliofs_object::{open_url, ObjectDevice, ObjectOptions, ObjectStats, ObjectStore, Path};
use futures::{StreamExt, TryStreamExt};
use object_store::{PutMode, PutOptions, PutPayload};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The object devices the running workload made (`fresh_fs`), for what
/// it wrote to the store (`written_note`).
static MADE: Mutex<Vec<Arc<ObjectDevice>>> = Mutex::new(Vec::new());

/// Create-if-absent PUTs of 4 KiB per round, one at a time.
const SMALL_PUTS: usize = 100;
/// The large objects' size and how many are in flight.
const BIG: usize = 8 << 20;
const IN_FLIGHT: usize = 4;
/// Chunks the cold read fetches ahead (the device's default).
const READ_AHEAD: usize = 8;

pub(super) fn run(args: &BenchArgs, url: &str, which: &[String]) -> Result<Vec<Outcome>> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let run_url = format!(
        "{}/foliofs-bench-{secs}-{}",
        url.trim_end_matches('/'),
        std::process::id()
    );
    let (store, run_prefix) = open_url(&run_url).map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let at = |name: &str| {
        let mut a = args.clone();
        a.raw = false;
        a.image = format!("{run_url}/{name}").into();
        a
    };
    // Each image's cache directory is DIR/NAME (see `object_options`).
    let cache_dir = given_options(args)?.cache_dir;
    let done = |name: &str| -> Result<()> {
        if !args.keep {
            rt.block_on(delete_under(&*store, &run_prefix.child(name)))?;
            if let Some(dir) = &cache_dir {
                let _ = std::fs::remove_dir_all(dir.join(name));
            }
        }
        Ok(())
    };
    let mut out = Vec::new();
    let mut runs = Vec::new();
    for w in which {
        let name = w.to_lowercase();
        let span = Span::start();
        let r = super::workload(w, &at(&name));
        runs.push((w.to_uppercase(), span.cores()));
        let made = std::mem::take(&mut *MADE.lock().unwrap_or_else(|e| e.into_inner()));
        let written = written_note(&made);
        drop(made);
        done(&name)?;
        let mut r = r?;
        r.notes.extend(written);
        out.push(r);
    }
    let r = against_floor(
        args,
        &at("cold"),
        &rt,
        &*store,
        &run_prefix.child("floor"),
        &out,
        &runs,
    );
    done("cold")?;
    done("floor")?;
    out.push(r.context("the server's floor and the cold read")?);
    if let Some(o) = out.last_mut() {
        o.notes.push(if args.keep {
            format!("everything the run made is kept under {run_url}")
        } else {
            format!("everything the run made under {run_url} was deleted")
        });
    }
    Ok(out)
}

/// A fresh object image of `size` bytes at `url` (refused if one is
/// there), with a file system on it, mounted.
pub(super) fn fresh_fs(url: &str, size: u64, args: &BenchArgs) -> Result<(Arc<dyn Device>, Fs)> {
    let (dev, fs) = fresh_object_fs(url, size, &object_options(args, url)?)?;
    MADE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(dev.clone());
    Ok((dev, fs))
}

/// What the devices of a workload wrote to the store, its passes
/// together: the WAL, and the chunks (checkpoints' and whole ones
/// flushes wrote), against the blocks the WAL carried.
fn written_note(made: &[Arc<ObjectDevice>]) -> Option<String> {
    let stats: Vec<ObjectStats> = made.iter().map(|d| d.stats()).collect();
    let sum = |f: fn(&ObjectStats) -> u64| stats.iter().map(f).sum::<u64>();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let (wal, chunk) = (sum(|s| s.wal_bytes), stats.first()?.chunk_bytes);
    let folded = sum(|s| s.chunk_puts) * chunk;
    Some(format!(
        "written to the store, its passes together: WAL {:.0} MiB in {} PUTs; {} checkpoints, {} chunk objects ({:.0} MiB, {:.2} x the WAL); {} chunks flushed whole",
        mib(wal),
        sum(|s| s.wal_puts),
        sum(|s| s.checkpoints),
        sum(|s| s.chunk_puts),
        mib(folded),
        folded as f64 / wal.max(1) as f64,
        sum(|s| s.chunks_flushed),
    ))
}

/// The object options `--object-options` gives, for the image at `url`:
/// a cache directory of its own below the one given.
fn object_options(args: &BenchArgs, url: &str) -> Result<ObjectOptions> {
    let mut opts = given_options(args)?;
    if let Some(dir) = opts.cache_dir.take() {
        opts.cache_dir = Some(dir.join(cache_name(url)));
    }
    Ok(opts)
}

/// The options `--object-options` gives, as given.
fn given_options(args: &BenchArgs) -> Result<ObjectOptions> {
    let mut opts = ObjectOptions::default();
    if let Some(list) = &args.object_options {
        let rest = opts
            .take_from(list)
            .map_err(|e| anyhow::anyhow!("--object-options {e}"))?;
        if !rest.is_empty() {
            bail!(
                "--object-options: {rest}: not an object image's option ({})",
                foliofs_object::MOUNT_OPTIONS
            );
        }
    }
    Ok(opts)
}

/// The directory below `cache_dir` an image of the run caches in.
fn cache_name(url: &str) -> String {
    url.trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or("image")
        .to_string()
}

fn fresh_object_fs(url: &str, size: u64, opts: &ObjectOptions) -> Result<(Arc<ObjectDevice>, Fs)> {
    let dev = Arc::new(crate::object::create(url, size, opts)?);
    foliofs::mkfs(&*dev, &MkfsOptions::default(), |_, _| {})?;
    dev.flush()?;
    let fs = Fs::mount(dev.clone(), MountOptions::default())?;
    Ok((dev, fs))
}

/// Delete every object under `prefix`.
async fn delete_under(store: &dyn ObjectStore, prefix: &Path) -> Result<()> {
    let keys: Vec<Path> = store
        .list(Some(prefix))
        .map_ok(|m| m.location)
        .try_collect()
        .await?;
    futures::stream::iter(keys)
        .map(|k| async move {
            match store.delete(&k).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(e),
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// The server's floor in one round, with the cores in use during its
/// large PUTs and GETs.
struct Floor {
    put_ms: f64,
    put_mibs: f64,
    get_mibs: f64,
    put_cores: Cores,
    get_cores: Cores,
}

/// The floor, measured with objects under `dir` (deleted after).
async fn floor(store: &dyn ObjectStore, dir: &Path, big_objects: usize) -> Result<Floor> {
    let small = Bytes::from(vec![0x5a; 4096]);
    let mut ms = Vec::with_capacity(SMALL_PUTS);
    for i in 0..SMALL_PUTS {
        let create = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let t = Instant::now();
        store
            .put_opts(
                &dir.child(format!("small-{i}")),
                small.clone().into(),
                create,
            )
            .await?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut big = vec![0u8; BIG];
    fill(&mut big, 0, 4096);
    let big = Bytes::from(big);
    let keys: Vec<Path> = (0..big_objects)
        .map(|i| dir.child(format!("big-{i}")))
        .collect();
    let mib = (big_objects * BIG) as f64 / (1 << 20) as f64;
    let (t, span) = (Instant::now(), Span::start());
    futures::stream::iter(&keys)
        .map(|k| store.put(k, PutPayload::from(big.clone())))
        .buffer_unordered(IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await?;
    let put_mibs = mib / t.elapsed().as_secs_f64();
    let put_cores = span.cores();
    let (t, span) = (Instant::now(), Span::start());
    let lens: Vec<usize> = futures::stream::iter(&keys)
        .map(|k| async move { store.get(k).await?.bytes().await.map(|b| b.len()) })
        .buffer_unordered(IN_FLIGHT)
        .try_collect()
        .await?;
    let get_mibs = mib / t.elapsed().as_secs_f64();
    let get_cores = span.cores();
    if lens.iter().any(|&n| n != BIG) {
        bail!("a GET of an 8 MiB object came back short: {lens:?}");
    }
    delete_under(store, dir).await?;
    Ok(Floor {
        put_ms: median(&ms),
        put_mibs,
        get_mibs,
        put_cores,
        get_cores,
    })
}

/// MiB/s of a sequential read of the file `ino` (`mib` MiB, 1 MiB direct
/// reads) on the image at `url` opened afresh, read-only: a second
/// machine's empty cache. With the device's counters after it and the
/// cores in use during the reads.
fn cold_read(
    url: &str,
    ino: u64,
    mib: u64,
    read_ahead_chunks: usize,
) -> Result<(f64, ObjectStats, Cores)> {
    let (store, prefix) = open_url(url).map_err(|e| anyhow::anyhow!("{url}: {e}"))?;
    let opts = ObjectOptions {
        read_only: true,
        read_ahead_chunks,
        ..Default::default()
    };
    let dev = Arc::new(ObjectDevice::open(store, prefix, opts)?);
    let fs = Fs::mount(
        dev.clone(),
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )?;
    let mut buf = AlignedBuf::zeroed(1 << 20);
    let (t, span) = (Instant::now(), Span::start());
    for m in 0..mib {
        let n = fs.read_direct(ino, m << 20, &mut buf)?;
        if n != buf.len() {
            bail!("short read of the cold file at MiB {m}: {n} bytes");
        }
    }
    let rate = mib as f64 / t.elapsed().as_secs_f64();
    let cores = span.cores();
    // The engine verified every block's checksum; the last MiB is also
    // compared with what was written.
    let mut want = vec![0u8; 1 << 20];
    fill(&mut want, ((mib - 1) << 20) / 4096, 4096);
    if buf[..] != want[..] {
        bail!("the cold file's last MiB reads back wrong");
    }
    fs.unmount()?;
    Ok((rate, dev.stats(), cores))
}

/// The floor and the cold read, alternated round by round, with W1's
/// and W4's figures from `done` set against them; `runs`, the cores in
/// use during each workload's run.
fn against_floor(
    args: &BenchArgs,
    cold: &BenchArgs,
    rt: &tokio::runtime::Runtime,
    store: &dyn ObjectStore,
    floor_dir: &Path,
    done: &[Outcome],
    runs: &[(String, Cores)],
) -> Result<Outcome> {
    let url = crate::object::url_of(&cold.image).expect("an object image");
    let mib = args.file_mib;
    let pb = progress((args.rounds * 3) as u64);
    // The file to read cold: written, the device closed (its WAL folded
    // into chunks), every round on a new device.
    let (dev, fs) = fresh_object_fs(
        url,
        ((mib + mib / 8 + 256) << 20).max(512 << 20),
        &ObjectOptions::default(),
    )?;
    let ino = make_file(&fs, "cold", mib, &pb)?;
    fs.unmount()?;
    dev.close()?;
    drop(dev);
    let big_objects = ((args.file_mib / 32) as usize).max(8);
    let mut put_ms = Vec::new();
    let mut ops = Vec::new();
    let mut put = Vec::new();
    let mut get = Vec::new();
    let mut cold_mibs = vec![Vec::new(); 2];
    let mut stats = vec![ObjectStats::default(); 2];
    let (mut put_cores, mut get_cores, mut cold_cores) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        pb.set_message("server floor");
        let f = rt.block_on(floor(store, floor_dir, big_objects))?;
        put_ms.push(f.put_ms);
        ops.push(1e3 / f.put_ms);
        put.push(f.put_mibs);
        get.push(f.get_mibs);
        put_cores.push(f.put_cores);
        get_cores.push(f.get_cores);
        pb.inc(1);
        for k in 0..2 {
            let v = (k + round) % 2;
            pb.set_message(format!("cold read {}", ["read-ahead", "no read-ahead"][v]));
            let (rate, st, cores) = cold_read(url, ino, mib, [READ_AHEAD, 0][v])?;
            cold_mibs[v].push(rate);
            stats[v] = st;
            if v == 0 {
                cold_cores.push(cores);
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let s = |name: &str, unit: &str, values: &[f64]| Series {
        name: name.into(),
        unit: unit.into(),
        values: values.to_vec(),
    };
    let mut series = vec![
        s("server: 4 KiB create-if-absent PUT, median", "ms", &put_ms),
        s("server: 1 / that latency", "PUTs/s", &ops),
        s("server: 8 MiB PUTs, 4 in flight", "MiB/s", &put),
        s("server: 8 MiB GETs, 4 in flight", "MiB/s", &get),
        s(
            &format!("cold read, read-ahead {READ_AHEAD} chunks"),
            "MiB/s",
            &cold_mibs[0],
        ),
        s("cold read, no read-ahead", "MiB/s", &cold_mibs[1]),
    ];
    let mut ratios = Vec::new();
    // W1's MiB/s are 4 KiB writes, each followed by fdatasync.
    if let Some(w1) = figure(done, "W1", "per-block dirty") {
        let syncs: Vec<f64> = w1.iter().map(|m| m * 256.0).collect();
        ratios.push(ratio(
            "W1 fdatasyncs/s / (1 / PUT latency)",
            &syncs,
            &ops,
            "target >= 0.8",
        ));
        series.push(s("W1 per-block dirty", "fdatasyncs/s", &syncs));
    }
    if let Some(w4) = figure(done, "W4", "one context per AG") {
        ratios.push(ratio("W4 / 8 MiB PUTs", &w4, &put, "target >= 0.8"));
        series.push(s("W4 one context per AG", "MiB/s", &w4));
    }
    ratios.push(ratio(
        "cold read / 8 MiB GETs",
        &cold_mibs[0],
        &get,
        "target >= 0.8",
    ));
    ratios.push(ratio(
        "cold read, read-ahead / none",
        &cold_mibs[0],
        &cold_mibs[1],
        "",
    ));
    let counted = |st: &ObjectStats| {
        format!(
            "{} chunk GETs, {} of them fetched ahead",
            st.chunk_gets, st.chunks_read_ahead
        )
    };
    Ok(Outcome {
        id: "OBJ".into(),
        title: format!(
            "object image, {}: the server's floor; W1, W4 and a cold read of a {mib} MiB file against it",
            match &args.object_options {
                Some(list) => list.clone(),
                None => "durability=object".into(),
            }
        ),
        series,
        ratios,
        notes: vec![
            format!(
                "floor per round: {SMALL_PUTS} create-if-absent PUTs of 4 KiB one at a time, then {big_objects} objects of 8 MiB PUT and GOT with 4 in flight"
            ),
            format!(
                "cold read: 1 MiB direct reads at queue depth 1 on a device opened afresh each round (empty cache); last round: read-ahead {}; none {}",
                counted(&stats[0]),
                counted(&stats[1])
            ),
            cores_note(&put_cores, &get_cores, &cold_cores, runs),
            "no raw O_DIRECT columns: an object image has no raw device".into(),
        ],
    })
}

/// How the machine's cores were shared while the floor and the
/// workloads ran (medians of the rounds; a workload's run whole, its
/// files made included).
fn cores_note(put: &[Cores], get: &[Cores], cold: &[Cores], runs: &[(String, Cores)]) -> String {
    let med = |v: &[Cores]| Cores {
        own: median(&v.iter().map(|c| c.own).collect::<Vec<_>>()),
        rest: v
            .iter()
            .map(|c| c.rest)
            .collect::<Option<Vec<_>>>()
            .map(|r| median(&r)),
    };
    let mut parts = vec![
        format!("8 MiB PUTs {}", shares(&med(put))),
        format!("8 MiB GETs {}", shares(&med(get))),
        format!("cold read with read-ahead {}", shares(&med(cold))),
    ];
    parts.extend(runs.iter().map(|(w, c)| format!("{w} run {}", shares(c))));
    format!(
        "cores in use, this process + the rest of the machine (the server, if it runs here), of {}: {}",
        cpus(),
        parts.join("; ")
    )
}

/// The values of series `name` in workload `id`'s outcome, if it ran.
fn figure(done: &[Outcome], id: &str, name: &str) -> Option<Vec<f64>> {
    let o = done.iter().find(|o| o.id == id)?;
    Some(o.series.iter().find(|s| s.name == name)?.values.clone())
}

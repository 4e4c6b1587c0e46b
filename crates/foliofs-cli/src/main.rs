//! The `foliofs` command: mkfs, fsck, stat, mount, bench, torture.

mod bench;
mod chart;
mod fsx;
mod generate;
mod logging;
mod mount;
mod object;
mod status;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use foliofs::device::FileDevice;
use foliofs::fsck::{fsck, FsckOptions};
use foliofs::{Fs, MkfsOptions, MountOptions};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "foliofs",
    version,
    about = "a userspace file system engine: make, check, mount and measure foliofs images",
    long_about = "foliofs keeps a crash-safe POSIX file system, with per-block data \
                  checksums and a write-ahead journal, in an image file or on a block \
                  device, and mounts it with FUSE (over io_uring where the kernel offers \
                  it). Each subcommand has its own page: foliofs-mkfs(1), foliofs-mount(1), \
                  foliofs-stat(1) ...; mount(8) and /etc/fstab use mount.fuse.foliofs(1)."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum TortureCmd {
    /// fsx-style exerciser: random reads, writes (buffered and O_DIRECT),
    /// truncates, fallocates, fsyncs and remounts of one file against an
    /// in-memory model, on the engine or through system calls on a
    /// directory (--target).
    Fsx(fsx::FsxArgs),
    /// Crash consistency: random workloads on a crash-recording device,
    /// power cut after every flush with dropped, reordered and torn
    /// writes; every state is remounted, read both ways and fscked.
    Crash {
        /// Stop after this many crash states.
        #[arg(long, default_value_t = 10_000)]
        states: u64,
        /// Or after this many rounds (one workload and its cuts each).
        #[arg(long)]
        rounds: Option<u64>,
        /// First seed (default: from the clock); round r uses seed + r.
        #[arg(long)]
        seed: Option<u64>,
        /// Operations per workload.
        #[arg(long, default_value_t = 400)]
        ops: usize,
        /// Crash images per flush epoch.
        #[arg(long, default_value_t = 6)]
        per_epoch: usize,
    },
}

#[derive(Subcommand)]
enum Cmd {
    /// Make a file system on an image file (created if --size is given) or a block device.
    Mkfs {
        /// The image file or block device.
        image: PathBuf,
        /// Size, e.g. 1G, 512M (creates or resizes a regular file).
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// Block size in bytes, a power of two from 512 to 65536.
        #[arg(long, default_value_t = 4096)]
        block_size: u32,
        /// Allocation groups (default: from the size).
        #[arg(long)]
        ag_count: Option<u32>,
        /// Journal (log) size in blocks (default: 1/16 of the device, 64 blocks to 128 MiB).
        #[arg(long)]
        journal_blocks: Option<u64>,
        /// A label of up to 32 bytes.
        #[arg(long, default_value = "")]
        label: String,
        /// Owner and group of the root directory (default: the user running
        /// mkfs, so that an image a user makes is theirs to fill).
        #[arg(long, value_name = "UID:GID", value_parser = parse_owner)]
        root_owner: Option<(u32, u32)>,
        /// Overwrite an existing foliofs file system.
        #[arg(short, long)]
        force: bool,
        /// For an object image: the size of its chunk objects, a power of
        /// two from 256K to 64M (default 4M).
        #[arg(long, value_parser = parse_size)]
        chunk_size: Option<u64>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check a file system. Exit code 0 clean, 1 corrected, 4 uncorrected, 8 operational error.
    Fsck {
        /// The image file or block device.
        image: PathBuf,
        /// Fix what is safe to fix (bitmaps, counters, link counts, the orphan
        /// list, inodes nothing reaches or frees, directory entries naming
        /// free inodes, a second name or a loop, or of the wrong type;
        /// files and directories that lost their names go to /lost+found);
        /// replays the journal in place.
        #[arg(long)]
        repair: bool,
        /// Also verify every data block's checksum.
        #[arg(long)]
        data: bool,
        /// Check without owning the image, even while it is mounted (results
        /// may then be stale); never writes.
        #[arg(short = 'n', long = "read-only", conflicts_with = "repair")]
        read_only: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Mount a file system with FUSE (in the background unless -f). Exit 32 on failure.
    Mount {
        /// The image file or block device.
        image: PathBuf,
        /// The mount point, a directory.
        dir: PathBuf,
        /// Mount options, comma-separated (see below, or mount.fuse.foliofs(1)).
        #[arg(short = 'o', value_name = "OPTIONS", long_help = generate::MOUNT_OPTIONS_HELP)]
        options: Vec<String>,
        /// Stay in the foreground (messages on stderr).
        #[arg(short, long)]
        foreground: bool,
    },
    /// Unmount a foliofs mount and wait until its daemon has written everything
    /// and left the image clean. Exit 0 when clean, 32 otherwise.
    Umount {
        /// The mount point.
        dir: PathBuf,
    },
    /// Make everything written to the foliofs mounts holding PATHs durable:
    /// the kernel's cached writes go to the daemon (syncfs), then the daemon
    /// writes back and commits. (Linux does not pass sync(1) on to a FUSE
    /// daemon.)
    Sync {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Run the seed workloads in A/B pairs on a fresh image (W1..W5, W6 metadata, or all).
    Bench(bench::BenchArgs),
    /// Write man pages and bash, zsh and fish completions under DIR (man/,
    /// completions/), made from these definitions (scripts/setup.sh and
    /// scripts/package.sh install them).
    #[command(hide = true)]
    Generate { dir: PathBuf },
    /// Reliability harnesses: long seeded runs that check every result.
    Torture {
        #[command(subcommand)]
        cmd: TortureCmd,
    },
    /// Keep an object image as it is now (everything its writer has
    /// flushed) as a snapshot, and print URL@N: mount that read-only on any
    /// machine while the writer goes on. With --delete, drop snapshot
    /// URL@N and delete what only it kept.
    Snapshot {
        /// The object image (s3://BUCKET/PREFIX, file:///DIR), or URL@N with --delete.
        url: String,
        /// Drop the snapshot URL@N.
        #[arg(long)]
        delete: bool,
    },
    /// Delete the objects of an object image that neither its newest
    /// manifest nor a snapshot keeps: WAL and chunks replaced by
    /// checkpoints, dropped snapshots, and what a fenced writer or a cut
    /// checkpoint left. Safe while the image is mounted.
    Gc {
        /// The object image (s3://BUCKET/PREFIX, file:///DIR).
        url: String,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the superblock, AG usage, counters, or a file's attributes and extent map.
    Stat {
        /// The image file or block device (not mounted: a mounted one
        /// takes --mount).
        #[arg(required_unless_present = "mount")]
        image: Option<PathBuf>,
        /// A path inside the file system.
        path: Option<String>,
        /// Print JSON (with --mount: every counter of the daemon).
        #[arg(long)]
        json: bool,
        /// Show the status of the foliofs mounted on DIR instead: transport,
        /// space, I/O with rates, cache, writeback, journal, errors (all
        /// counters with --json).
        #[arg(long, value_name = "DIR", conflicts_with_all = ["image", "path"])]
        mount: Option<PathBuf>,
        /// With --mount: show it again every SECONDS, rates over the last
        /// interval (as vmstat does), until interrupted.
        #[arg(long, value_name = "SECONDS", requires = "mount", value_parser = parse_interval)]
        watch: Option<f64>,
        /// With --watch: stop after N pages.
        #[arg(long, value_name = "N", requires = "watch", value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
}

use foliofs::fs::parse_size;

/// A refresh interval in seconds: positive, at most a day.
fn parse_interval(s: &str) -> std::result::Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.1 && *v <= 86_400.0)
        .ok_or_else(|| format!("'{s}': want seconds between 0.1 and 86400"))
}

/// `UID:GID`, both numeric.
fn parse_owner(s: &str) -> std::result::Result<(u32, u32), String> {
    let bad = || format!("'{s}': want UID:GID, both numbers (e.g. 1000:1000)");
    let (u, g) = s.split_once(':').ok_or_else(bad)?;
    Ok((u.parse().map_err(|_| bad())?, g.parse().map_err(|_| bad())?))
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:>8} [{bar:40}] {pos}/{len} ({eta})")
            .unwrap()
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

pub(crate) fn open(image: &Path, writable: bool) -> Result<Arc<FileDevice>> {
    Ok(Arc::new(
        FileDevice::open(image, writable).map_err(|e| open_error(image, e))?,
    ))
}

/// An error opening an image, for people: a busy image already names
/// itself and its holder.
pub(crate) fn open_error(image: &Path, e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::ResourceBusy {
        anyhow::anyhow!("{e}")
    } else {
        anyhow::anyhow!("cannot open {}: {e}", image.display())
    }
}

fn mkfs_cmd(
    image: &Path,
    size: Option<u64>,
    chunk_size: Option<u64>,
    o: MkfsOptions,
    force: bool,
    json: bool,
) -> Result<()> {
    let (dev, object): (Arc<dyn foliofs::device::Device>, _) = match object::url_of(image) {
        Some(url) => {
            if force {
                bail!("{url}: --force: an object image is never overwritten; delete its objects first");
            }
            let Some(size) = size else {
                bail!("{url}: give --size for a new object image");
            };
            let mut opts = foliofs_object::ObjectOptions::default();
            if let Some(bytes) = chunk_size {
                opts.chunk_bytes = bytes;
            }
            let dev = Arc::new(object::create(url, size, &opts)?);
            (dev.clone(), Some(dev))
        }
        None if chunk_size.is_some() => {
            bail!(
                "--chunk-size is for object images (s3://BUCKET/PREFIX); {} is a file",
                image.display()
            )
        }
        None => {
            let dev = match foliofs::fs::open_for_mkfs(image, size, force) {
                Err(foliofs::Error::Exists) => bail!(
                    "{} already holds a foliofs file system: use --force to overwrite it",
                    image.display()
                ),
                Err(foliofs::Error::NotFound) => bail!(
                    "{} does not exist: give --size to create an image file",
                    image.display()
                ),
                Err(foliofs::Error::Io(e)) => return Err(open_error(image, e)),
                r => r.with_context(|| format!("cannot prepare {}", image.display()))?,
            };
            (Arc::new(dev), None)
        }
    };
    let pb = bar(0, "mkfs");
    let sb = foliofs::mkfs(&*dev, &o, |done, total| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
    })?;
    pb.finish_and_clear();
    if let Some(o) = object {
        o.close()?;
    }
    let size = sb.total_blocks * sb.block_size as u64;
    if json {
        println!(
            "{}",
            json!({"image": image, "bytes": size, "block_size": sb.block_size, "blocks": sb.total_blocks,
                   "ag_count": sb.ag_count, "ag_blocks": sb.ag_blocks, "inodes": sb.inodes_per_ag as u64 * sb.ag_count as u64,
                   "journal_blocks": sb.journal_blocks, "uuid": hex(&sb.uuid)})
        );
    } else {
        println!(
            "{}: {} bytes, {} blocks of {}, {} AGs of {} blocks, {} inodes, journal {} blocks, uuid {}",
            image.display(),
            size,
            sb.total_blocks,
            sb.block_size,
            sb.ag_count,
            sb.ag_blocks,
            sb.inodes_per_ag as u64 * sb.ag_count as u64,
            sb.journal_blocks,
            hex(&sb.uuid)
        );
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn fsck_cmd(image: &Path, repair: bool, data: bool, read_only: bool, json: bool) -> Result<i32> {
    let mut object = None;
    let dev: Arc<dyn foliofs::device::Device> = if let Some(url) = object::url_of(image) {
        let d = Arc::new(object::open(url, !repair, None, &Default::default())?);
        object = Some(d.clone());
        d
    } else if read_only {
        // Look without owning: warn when someone else has the image.
        if let Ok(Some(h)) = foliofs::device::lock::probe(image) {
            log::warn!(
                "{} is in use by {h}: it may change while it is checked, so \
                 problems reported may be stale",
                image.display()
            );
        }
        Arc::new(
            FileDevice::open_with(
                image,
                &foliofs::device::DeviceOptions {
                    writable: false,
                    lock: false,
                    ..Default::default()
                },
            )
            .map_err(|e| open_error(image, e))?,
        )
    } else {
        open(image, repair)?
    };
    let pb = bar(0, "inodes");
    let r = fsck(
        dev,
        &FsckOptions {
            repair,
            check_data: data,
        },
        |done, total| {
            pb.set_length(total);
            pb.set_position(done);
        },
    )
    .with_context(|| format!("{}", image.display()))?;
    pb.finish_and_clear();
    if let Some(o) = object {
        o.close()?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        for p in &r.problems {
            println!(
                "{}{} at block {}: {}",
                if p.repaired { "fixed: " } else { "" },
                p.structure,
                p.addr,
                p.message
            );
        }
        println!(
            "{}: {} problems, {} inodes, {} directories, {} blocks in use{}{}",
            image.display(),
            r.problems.len(),
            r.inodes_used,
            r.directories,
            r.blocks_used,
            if r.journal_replayed > 0 {
                format!(", {} journal transactions replayed", r.journal_replayed)
            } else {
                String::new()
            },
            if data {
                format!(", {} data blocks verified", r.data_blocks_checked)
            } else {
                String::new()
            },
        );
    }
    Ok(r.exit_code())
}

fn stat_cmd(image: &Path, path: Option<&str>, json: bool) -> Result<()> {
    let dev: Arc<dyn foliofs::device::Device> = match object::url_of(image) {
        Some(url) => {
            // The image as of now, without claiming it.
            let d = object::open(url, true, None, &Default::default())?;
            let st = d.stats();
            let snaps = object::snapshots(url)?;
            let leases = object::leases(url, st.lease.as_deref())?;
            if json && path.is_none() {
                println!(
                    "{}",
                    serde_json::to_string_pretty(
                        &json!({"object": st, "snapshots": snaps, "leases": leases})
                    )?
                );
            } else if !json {
                if let Some(n) = st.snapshot {
                    println!("snapshot {n}: read-only, the WAL read up to {n}");
                }
                println!(
                    "object image {url}: manifest {}, writer epoch {}, {}; WAL {} bytes past \
                     the last checkpoint (next WAL {}); {} chunk objects of {} KiB",
                    st.manifest,
                    st.epoch,
                    match &st.writer {
                        Some(w) => format!("held by {w}"),
                        None => "closed cleanly".into(),
                    },
                    st.unfolded_bytes,
                    st.next_wal,
                    st.chunks,
                    st.chunk_bytes >> 10,
                );
                let base = foliofs_object::split_snapshot(url).0;
                object::live_mounts(base);
                if snaps.is_empty() {
                    println!("no snapshots");
                }
                for s in &snaps {
                    println!(
                        "snapshot {base}@{}: manifest {} and WAL {}..{}, taken {} on {}",
                        s.at,
                        s.manifest,
                        s.wal_start,
                        s.at,
                        humantime::format_rfc3339_seconds(
                            std::time::UNIX_EPOCH + std::time::Duration::from_secs(s.taken)
                        ),
                        s.host
                    );
                }
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let live = leases.iter().filter(|l| l.expires > now).count();
                println!(
                    "{live} live readers' leases{}",
                    if live < leases.len() {
                        format!(" ({} expired, for foliofs gc)", leases.len() - live)
                    } else {
                        String::new()
                    }
                );
                for l in &leases {
                    println!(
                        "lease {}: {} reads manifest {} and WAL {}..{}, {} {}",
                        l.key,
                        l.holder,
                        l.manifest,
                        l.wal_start,
                        l.wal_end.map_or("".into(), |e| e.to_string()),
                        if l.expires > now {
                            "expires"
                        } else {
                            "expired"
                        },
                        humantime::format_rfc3339_seconds(
                            std::time::UNIX_EPOCH + std::time::Duration::from_secs(l.expires)
                        ),
                    );
                }
            }
            Arc::new(d)
        }
        None => open(image, false)
            .map_err(|e| e.context("a mounted image's counters: foliofs stat --mount DIR"))?,
    };
    let fs = Fs::mount(
        dev,
        MountOptions {
            read_only: true,
            ..Default::default()
        },
    )
    .with_context(|| format!("{}", image.display()))?;
    let sb = fs.superblock();
    if let Some(p) = path {
        let ino = fs
            .resolve(p)
            .with_context(|| format!("{p}: not found in {}", image.display()))?;
        let attr = fs.getattr(ino)?;
        let extents = fs.extents(ino)?;
        if json {
            println!(
                "{}",
                serde_json::to_string_pretty(
                    &json!({"path": p, "attr": attr, "extents": extents})
                )?
            );
        } else {
            // lsattr's letters for the flags set.
            let flags: String = [
                (foliofs::fs::FL_SYNC, 'S'),
                (foliofs::fs::FL_DIRSYNC, 'D'),
                (foliofs::fs::FL_IMMUTABLE, 'i'),
                (foliofs::fs::FL_APPEND, 'a'),
                (foliofs::fs::FL_NODUMP, 'd'),
                (foliofs::fs::FL_NOATIME, 'A'),
            ]
            .iter()
            .filter(|(f, _)| attr.flags & f != 0)
            .map(|(_, c)| *c)
            .collect();
            println!(
                "{p}: inode {} {:?} size {} mode {:o} links {} uid {} gid {}{}",
                ino,
                attr.kind,
                attr.size,
                attr.perm,
                attr.nlink,
                attr.uid,
                attr.gid,
                if flags.is_empty() {
                    String::new()
                } else {
                    format!(" flags {flags}")
                }
            );
            println!("{} extents:", extents.len());
            for e in &extents {
                println!(
                    "  offset {:>12}  device block {:>10}  blocks {:>8}{}",
                    e.offset,
                    e.device_block,
                    e.blocks,
                    if e.unwritten { "  unwritten" } else { "" }
                );
            }
        }
        return Ok(());
    }
    let ags = fs.ag_usage();
    let st = fs.statfs()?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "uuid": hex(&sb.uuid), "label": sb.label_str(), "block_size": sb.block_size, "blocks": sb.total_blocks,
                "ag_count": sb.ag_count, "ag_blocks": sb.ag_blocks, "journal_blocks": sb.journal_blocks,
                "clean": sb.flags & foliofs::format::superblock::FLAG_CLEAN != 0, "statfs": st, "ags": ags,
                "counters": fs.counters(),
            }))?
        );
    } else {
        println!(
            "uuid {}  label {:?}  block size {}  {} blocks  {} AGs  journal {} blocks  {}",
            hex(&sb.uuid),
            sb.label_str(),
            sb.block_size,
            sb.total_blocks,
            sb.ag_count,
            sb.journal_blocks,
            if sb.flags & foliofs::format::superblock::FLAG_CLEAN != 0 {
                "clean"
            } else {
                "not cleanly unmounted"
            }
        );
        println!(
            "free {} of {} data blocks, {} of {} inodes",
            st.blocks_free, st.blocks, st.files_free, st.files
        );
        for a in ags {
            println!(
                "  AG {:>3}: {:>10} blocks, {:>8} metadata, {:>10} free ({:.1}% used), {:>8} of {} inodes free",
                a.agno,
                a.blocks,
                a.metadata_blocks,
                a.free_blocks,
                100.0 * (a.blocks - a.free_blocks) as f64 / a.blocks as f64,
                a.free_inodes,
                a.inodes
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let ready = mount::ready_fd();
    let argv0 = std::env::args().next().unwrap_or_default();
    if argv0.rsplit('/').next() == Some("mount.fuse.foliofs") {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let r = mount::helper_args(&args).and_then(|(img, dir, opts, fg)| {
            mount_cmd(&img, &dir, &mount::helper_defaults(opts), fg, ready)
        });
        return finish(r.map(|()| 0), MOUNT_FAILED);
    }
    let cli = Cli::parse();
    if !matches!(cli.cmd, Cmd::Mount { .. }) {
        let _ = logging::init(&logging::Sink::Stderr, log::LevelFilter::Warn);
        // Output into a pipe closed early (`foliofs stat IMG | head -1`)
        // ends the command quietly, as it ends cat or ls, instead of a
        // panic. Not for a mount: its daemon writes to the ready pipe of
        // a spawner that may be gone.
        // SAFETY: restoring a signal's default action has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let fail = match cli.cmd {
        Cmd::Mount { .. } | Cmd::Umount { .. } => MOUNT_FAILED,
        _ => 8,
    };
    let r = match cli.cmd {
        Cmd::Mkfs {
            image,
            size,
            block_size,
            ag_count,
            journal_blocks,
            label,
            root_owner,
            force,
            chunk_size,
            json,
        } => mkfs_cmd(
            &image,
            size,
            chunk_size,
            MkfsOptions {
                block_size,
                ag_count,
                journal_blocks,
                label,
                // SAFETY: getuid and getgid have no preconditions.
                root_owner: root_owner.unwrap_or(unsafe { (libc::getuid(), libc::getgid()) }),
                ..Default::default()
            },
            force,
            json,
        )
        .map(|_| 0),
        Cmd::Fsck {
            image,
            repair,
            data,
            read_only,
            json,
        } => fsck_cmd(&image, repair, data, read_only, json),
        Cmd::Umount { dir } => mount::umount(&dir),
        Cmd::Snapshot { url, delete: false } => object::snapshot(&url).map(|_| 0),
        Cmd::Snapshot { url, delete: true } => object::delete_snapshot(&url).map(|_| 0),
        Cmd::Gc { url, json } => object::gc(&url, json).map(|_| 0),
        Cmd::Generate { dir } => {
            generate::write(<Cli as clap::CommandFactory>::command(), &dir).map(|files| {
                for f in files {
                    println!("{}", f.display());
                }
                0
            })
        }
        Cmd::Sync { paths } => paths.iter().try_for_each(|p| sync_mount(p)).map(|_| 0),
        Cmd::Stat {
            mount: Some(dir),
            json,
            watch,
            count,
            ..
        } => status::run(&dir, json, watch, count).map(|_| 0),
        Cmd::Stat {
            image, path, json, ..
        } => stat_cmd(&image.expect("clap requires it"), path.as_deref(), json).map(|_| 0),
        Cmd::Mount {
            image,
            dir,
            options,
            foreground,
        } => mount_cmd(&image, &dir, &options, foreground, ready).map(|_| 0),
        Cmd::Torture {
            cmd: TortureCmd::Fsx(args),
        } => fsx::run(&args).map(|t| {
            println!(
                "fsx: {} operations, {} reads checked ({} MiB), {} remounts/reopens, {} unsupported modes skipped, 0 failures",
                t.ops,
                t.reads_checked,
                t.bytes_checked >> 20,
                t.cycles,
                t.unsupported
            );
            0
        }),
        Cmd::Torture {
            cmd:
                TortureCmd::Crash {
                    states,
                    rounds,
                    seed,
                    ops,
                    per_epoch,
                },
        } => torture_crash(states, rounds, seed, ops, per_epoch),
        Cmd::Bench(args) => bench::run(&args).and_then(|out| {
            if let Some(dir) = &args.chart {
                for f in chart::write(dir, &out)? {
                    eprintln!("chart: {}", f.display());
                }
            }
            if args.json {
                println!("{}", serde_json::to_string_pretty(&out)?);
            } else {
                bench::print(&out, args.markdown);
            }
            Ok(0)
        }),
    };
    finish(r, fail)
}

/// mount(8)'s exit code for a failed mount; umount(8) uses it too.
const MOUNT_FAILED: u8 = 32;

/// `foliofs torture crash`: rounds of the crash harness until `states`
/// states (or `rounds` rounds) are checked.
fn torture_crash(
    states: u64,
    rounds: Option<u64>,
    seed: Option<u64>,
    ops: usize,
    per_epoch: usize,
) -> Result<i32> {
    if states == 0 || ops == 0 || per_epoch == 0 || rounds == Some(0) {
        bail!("--states, --rounds, --ops and --per-epoch must be positive");
    }
    let first = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1)
    });
    let pb = bench::progress_in(rounds.map_or(states, |_| 0), "crash states");
    let (mut done, mut epochs, mut r) = (0u64, 0usize, 0u64);
    while rounds.map_or(done < states, |n| r < n) {
        let s = first.wrapping_add(r);
        pb.set_message(format!("seed {s}"));
        let round = foliofs::torture::crash_round(s, ops, per_epoch, || pb.inc(1))
            .map_err(|f| anyhow::anyhow!("crash state failed: {f}"))?;
        done += round.states;
        epochs += round.epochs;
        r += 1;
    }
    pb.finish_and_clear();
    println!(
        "crash: {done} states from {r} rounds (seeds {first}..={}), {} operations, {epochs} flush epochs, 0 failures",
        first.wrapping_add(r - 1),
        r * ops as u64
    );
    Ok(0)
}

/// The exit code: the command's own, or `fail` after printing the error.
fn finish(r: Result<i32>, fail: u8) -> ExitCode {
    match r {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("foliofs: {e:#}");
            ExitCode::from(fail)
        }
    }
}

fn mount_cmd(
    image: &Path,
    dir: &Path,
    options: &[String],
    foreground: bool,
    ready: Option<std::os::fd::OwnedFd>,
) -> Result<()> {
    if mount::is_remount(options) {
        return mount::remount(dir, options);
    }
    let mut o = mount::parse_options(options)?;
    if object::url_of(image).is_some() {
        o.object_image();
    }
    // A daemon (started by `spawn`, holding the ready pipe) logs to
    // syslog, or without it to a file of its own; in the foreground, to
    // stderr; -o log=FILE wins over all.
    let sink = match &o.log_file {
        Some(f) => logging::Sink::File(f.clone()),
        None if foreground && ready.is_some() => logging::daemon_sink(None, dir),
        None => logging::Sink::Stderr,
    };
    let level = if foreground {
        o.log_level
    } else {
        log::LevelFilter::Warn
    };
    match logging::init(&sink, level) {
        // The socket went away since the spawner looked: the default file;
        // where that cannot be written either (the spawner said so), the
        // mount still goes on, its messages on stderr (the spawner's null).
        Err(_)
            if sink == logging::Sink::Syslog || matches!(sink, logging::Sink::DefaultFile(_)) =>
        {
            let fallback = logging::default_sink(dir);
            if sink == fallback || logging::init(&fallback, level).is_err() {
                logging::init(&logging::Sink::Stderr, level)?;
            }
        }
        r => r?,
    }
    if foreground {
        mount::serve(image, dir, &o, ready)
    } else {
        mount::spawn(image, dir, options, &o)
    }
}

/// `foliofs sync PATH`: syncfs on PATH's file system, then the daemon's
/// own sync (FOLIOFS_IOC_SYNC), which Linux's syncfs does not reach.
fn sync_mount(path: &Path) -> Result<()> {
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    match foliofs_fuse::sync_mount(&f) {
        Ok(true) => Ok(()),
        Ok(false) => bail!(
            "{} is not on a foliofs mount (its file system was synced with syncfs)",
            path.display()
        ),
        Err(e) => bail!("sync of the file system holding {}: {e}", path.display()),
    }
}

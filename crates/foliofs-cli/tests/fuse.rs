//! foliofs mounted with FUSE, used by real programs: tar, git, sqlite3,
//! cp -a, fio (buffered and O_DIRECT, verify=crc32c), PostgreSQL through a
//! killed daemon, plus the namespace
//! through system calls, permissions as another user, the mount helper and
//! SIGTERM. Every test unmounts and runs fsck on the image afterwards.
//!
//! Needs /dev/fuse and root (mount(2)); without them the tests say so and
//! pass, unless FOLIOFS_REQUIRE_FUSE=1 (CI), where they fail.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_foliofs");

/// Whether FUSE tests can run here; panics when they must but cannot.
fn fuse_ready(tools: &[&str]) -> bool {
    let required = std::env::var("FOLIOFS_REQUIRE_FUSE").is_ok_and(|v| v == "1");
    let mut missing: Vec<String> = Vec::new();
    if !Path::new("/dev/fuse").exists() {
        missing.push("/dev/fuse".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        missing.push("root".into());
    }
    for t in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            missing.push((*t).into());
        }
    }
    if missing.is_empty() {
        return true;
    }
    assert!(
        !required,
        "FOLIOFS_REQUIRE_FUSE=1 but missing: {}",
        missing.join(", ")
    );
    eprintln!("SKIPPED: FUSE test needs {}", missing.join(", "));
    false
}

fn is_mounted(dir: &Path) -> bool {
    let canon = dir.canonicalize().unwrap_or(dir.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(canon.to_str().unwrap()))
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A fresh image mounted in the foreground by a child process; unmounted
/// (lazily, if a test failed) when dropped.
struct Mounted {
    img: PathBuf,
    dir: PathBuf,
    child: Option<Child>,
}

impl Mounted {
    fn new(name: &str, opts: &str) -> Mounted {
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuse-{name}"));
        let _ = Command::new("umount")
            .arg("-l")
            .arg(base.join("mnt"))
            .status();
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("mnt")).unwrap();
        let img = base.join("fs.img");
        run(Command::new(BIN)
            .args(["mkfs", "--size", "1G"])
            .arg(&img)
            .stdout(Stdio::null()));
        let mut m = Mounted {
            img,
            dir: base.join("mnt"),
            child: None,
        };
        m.mount(opts);
        m
    }

    fn mount(&mut self, opts: &str) {
        let mut cmd = Command::new(BIN);
        cmd.args(["mount", "-f"]).arg(&self.img).arg(&self.dir);
        let opts = with_suite_options(opts);
        if !opts.is_empty() {
            cmd.args(["-o", &opts]);
        }
        self.child = Some(cmd.spawn().unwrap());
        let dir = self.dir.clone();
        wait_for("mount", || is_mounted(&dir));
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.join(p)
    }

    /// Unmount, wait for the server to exit cleanly, and fsck the image.
    fn unmount_and_check(&mut self) {
        run(Command::new("umount").arg(&self.dir));
        let st = self.child.take().unwrap().wait().unwrap();
        assert!(st.success(), "mount process exited with {st}");
        fsck(&self.img);
    }

    /// SIGKILL the daemon and wait until the kernel sees the mount dead
    /// (over rings it lets go of the connection a moment after the process
    /// is gone: the rings are torn down from a work queue).
    fn kill_daemon(&mut self) {
        let mut child = self.child.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        // statfs, not stat: the kernel may answer stat of the root from
        // attributes it still holds.
        wait_for("the dead mount", || {
            statvfs(&self.dir).err().and_then(|e| e.raw_os_error()) == Some(libc::ENOTCONN)
        });
    }

    /// `foliofs umount` of the dead mount: detached, exit 32, and the
    /// message that the next mount replays the journal.
    fn detach_dead(&self) {
        let out = Command::new(BIN)
            .arg("umount")
            .arg(&self.dir)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(32), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("replays its journal"));
        assert!(!is_mounted(&self.dir));
    }

    fn remount(&mut self, opts: &str) {
        self.unmount_and_check();
        self.mount(opts);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.dir)
                .stderr(Stdio::null())
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn fsck(img: &Path) {
    let out = Command::new(BIN).arg("fsck").arg(img).output().unwrap();
    assert!(
        out.status.success(),
        "fsck: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run a command; panic with its output unless it succeeds.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sh(dir: &Path, script: &str) -> String {
    run(Command::new("bash")
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

#[test]
fn namespace_through_system_calls() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("namespace", "");
    let f = m.path("a");
    std::fs::write(&f, b"hello, world").unwrap();
    assert_eq!(std::fs::read(&f).unwrap(), b"hello, world");
    std::fs::create_dir(m.path("d")).unwrap();
    for i in 0..1000 {
        std::fs::write(m.path(&format!("d/f{i:04}")), i.to_string()).unwrap();
    }
    let mut names: Vec<_> = std::fs::read_dir(m.path("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names.len(), 1000);
    assert_eq!(names[7], "f0007");
    std::fs::rename(&f, m.path("d/moved")).unwrap();
    std::fs::hard_link(m.path("d/moved"), m.path("link")).unwrap();
    assert_eq!(std::fs::metadata(m.path("link")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("d/moved", m.path("sym")).unwrap();
    assert_eq!(std::fs::read(m.path("sym")).unwrap(), b"hello, world");
    // rename(2) flags.
    let (a, b) = (cstr(&m.path("link")), cstr(&m.path("sym")));
    // SAFETY: valid NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EEXIST)
    );
    // SAFETY: as above.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    assert_eq!(r, 0);
    assert!(std::fs::symlink_metadata(m.path("link"))
        .unwrap()
        .is_symlink());
    // Xattrs through setfattr/getfattr-style calls.
    let p = cstr(&m.path("d/moved"));
    let (n, v) = (CString::new("user.color").unwrap(), b"blue");
    // SAFETY: valid pointers and lengths.
    assert_eq!(
        unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), 4, 0) },
        0
    );
    let mut buf = [0u8; 16];
    // SAFETY: buf is writable for its length.
    let got = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), 16) };
    assert_eq!(&buf[..got as usize], b"blue");
    // Sparse file: SEEK_DATA / SEEK_HOLE, punch.
    let sparse = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path("sparse"))
        .unwrap();
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(&[1u8; 8192], 1 << 20).unwrap();
    use std::os::fd::AsRawFd;
    let fd = sparse.as_raw_fd();
    // SAFETY: fd is open.
    unsafe {
        assert_eq!(libc::lseek(fd, 0, libc::SEEK_DATA), 1 << 20);
        assert_eq!(libc::lseek(fd, 1 << 20, libc::SEEK_HOLE), (1 << 20) + 8192);
        assert_eq!(
            libc::fallocate(
                fd,
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                1 << 20,
                4096
            ),
            0
        );
    }
    let mut b = [9u8; 4];
    sparse.read_exact_at(&mut b, (1 << 20) + 4094).unwrap();
    assert_eq!(b, [0, 0, 1, 1]);
    // An unlinked open file stays readable until closed.
    std::fs::remove_file(m.path("sparse")).unwrap();
    sparse.read_exact_at(&mut b, (1 << 20) + 4096).unwrap();
    assert_eq!(b, [1; 4]);
    drop(sparse);
    // statfs and the counters view.
    let st = statvfs(&m.dir).unwrap();
    assert!(st.0 > 0 && st.1 > 0 && st.1 <= st.0);
    let v = counters(&m.dir);
    assert!(v["bytes_written_app"].as_u64().unwrap() >= 12 + 8192);
    m.remount("");
    assert_eq!(std::fs::read(m.path("link")).unwrap(), b"hello, world");
    assert_eq!(std::fs::read_to_string(m.path("d/f0999")).unwrap(), "999");
    assert!(!m.path("sparse").exists());
    m.unmount_and_check();
}

/// (blocks, free blocks, blocks ordinary writes may still take) of the
/// file system at `dir`.
fn statvfs(dir: &Path) -> std::io::Result<(u64, u64, u64)> {
    let p = cstr(dir);
    // SAFETY: zeroed statvfs is a valid out-parameter.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: p is NUL-terminated, s is writable.
    match unsafe { libc::statvfs(p.as_ptr(), &mut s) } {
        0 => Ok((s.f_blocks, s.f_bfree, s.f_bavail)),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[test]
fn tar_round_trip_of_a_source_tree() {
    if !fuse_ready(&["tar", "diff"]) {
        return;
    }
    // With readdirplus (off by default): tar's walk lists with attributes.
    let mut m = Mounted::new("tar", "readdirplus");
    let src = repo_root().join("crates").canonicalize().unwrap();
    let dir = m.dir.clone();
    sh(
        &dir,
        &format!(
            "tar -C {src} -cf - --exclude=target . | tar -xf - -C {dir}/ && \
             tar -C {dir} -cf {dir}/../again.tar . && mkdir {dir}/x && \
             tar -C {dir}/x -xf {dir}/../again.tar --exclude=./x && \
             diff -r --exclude=x {src} {dir} && diff -r {src} {dir}/x",
            src = src.display(),
            dir = dir.display()
        ),
    );
    m.remount("");
    sh(
        &dir,
        &format!("diff -r {} {}/x", src.display(), dir.display()),
    );
    m.unmount_and_check();
}

#[test]
fn git_init_add_commit_fsck() {
    if !fuse_ready(&["git"]) {
        return;
    }
    let mut m = Mounted::new("git", "");
    let src = repo_root()
        .join("crates/foliofs/src")
        .canonicalize()
        .unwrap();
    sh(
        &m.dir,
        &format!(
            "cp -r {} src && git init -q . && git add -A && \
             git -c user.name=t -c user.email=t@t commit -qm one && \
             echo change >> src/lib.rs && git -c user.name=t -c user.email=t@t commit -qam two && \
             git gc -q && git fsck --full --strict && test $(git rev-list --count HEAD) = 2",
            src.display()
        ),
    );
    m.remount("");
    sh(
        &m.dir,
        "git fsck --full --strict && git status --porcelain | wc -l | grep -qx 0",
    );
    m.unmount_and_check();
}

#[test]
fn sqlite_integrity_after_heavy_writes() {
    if !fuse_ready(&["sqlite3"]) {
        return;
    }
    let mut m = Mounted::new("sqlite", "");
    let script = "PRAGMA journal_mode=WAL; CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT, n INT); \
        WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<50000) \
        INSERT INTO t(v, n) SELECT hex(randomblob(64)), x FROM c; \
        CREATE INDEX i ON t(v); UPDATE t SET v = hex(randomblob(80)) WHERE n % 3 = 0; \
        DELETE FROM t WHERE n % 7 = 0; VACUUM; PRAGMA wal_checkpoint(TRUNCATE);";
    sh(&m.dir, &format!("sqlite3 db '{script}' >/dev/null"));
    let out = sh(
        &m.dir,
        "sqlite3 db 'PRAGMA integrity_check; SELECT count(*) FROM t;'",
    );
    assert_eq!(out.trim(), "ok\n42858");
    m.remount("");
    let out = sh(
        &m.dir,
        "sqlite3 db 'PRAGMA integrity_check; SELECT count(*) FROM t;'",
    );
    assert_eq!(out.trim(), "ok\n42858");
    m.unmount_and_check();
}

#[test]
fn cp_a_keeps_modes_times_and_xattrs() {
    if !fuse_ready(&["cp", "getfattr", "setfattr"]) {
        return;
    }
    let mut m = Mounted::new("cpa", "");
    let src = m.dir.parent().unwrap().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    sh(
        &src,
        "printf data > a && chmod 0751 a && printf x > sub/b && chmod 0600 sub/b && \
         ln -s a sym && setfattr -n user.k -v v1 a && setfattr -n user.big -v $(head -c 2000 /dev/zero | tr '\\0' z) sub/b && \
         touch -d '2001-02-03 04:05:06.123456789' a && chmod 0700 sub",
    );
    sh(&m.dir, &format!("cp -a {}/. .", src.display()));
    for p in ["a", "sub", "sub/b", "sym"] {
        let (s, d) = (
            std::fs::symlink_metadata(src.join(p)).unwrap(),
            std::fs::symlink_metadata(m.path(p)).unwrap(),
        );
        assert_eq!(s.permissions().mode(), d.permissions().mode(), "{p}");
        assert_eq!(
            (s.mtime(), s.mtime_nsec()),
            (d.mtime(), d.mtime_nsec()),
            "{p}"
        );
    }
    let dump = |d: &Path| sh(d, "getfattr -d -R . 2>/dev/null | sort");
    assert_eq!(dump(&src), dump(&m.dir));
    assert!(dump(&m.dir).contains("user.k=\"v1\""));
    m.unmount_and_check();
}

#[test]
fn fio_buffered_and_direct_with_verify() {
    if !fuse_ready(&["fio"]) {
        return;
    }
    let mut m = Mounted::new("fio", "");
    // The W1 seed job (smaller), buffered, verified.
    sh(
        &m.dir,
        "fio --name=w1 --ioengine=psync --rw=randwrite --bs=4k --size=32M --numjobs=2 \
         --fdatasync=1 --verify=crc32c --do_verify=1 --group_reporting --output-format=terse >/dev/null",
    );
    // The W2/W3 style jobs, O_DIRECT, verified.
    sh(
        &m.dir,
        "fio --name=w2 --ioengine=psync --rw=write --bs=1M --size=64M --direct=1 \
         --verify=crc32c --do_verify=1 --output-format=terse >/dev/null && \
         fio --name=w3 --ioengine=psync --rw=randrw --bs=4k --size=16M --direct=1 --thread \
         --numjobs=4 --verify=crc32c --do_verify=1 --group_reporting --output-format=terse >/dev/null",
    );
    let v = counters(&m.dir);
    assert!(v["dio_reads"].as_u64().unwrap() > 0, "{v}");
    assert!(v["dio_writes"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["csum_failures"].as_u64(), Some(0));
    // Four threads overwriting one file with O_DIRECT, on a fresh mount
    // (fresh counters): the kernel passes the writes on in parallel
    // (FOPEN_PARALLEL_DIRECT_WRITES) and the engine runs them side by
    // side under the shared lock.
    m.remount("");
    sh(
        &m.dir,
        "fio --name=par --filename=par --ioengine=psync --rw=randwrite --bs=4k --size=8M \
         --direct=1 --thread --numjobs=4 --time_based --runtime=2 --output-format=terse >/dev/null",
    );
    let peak = counters(&m.dir)["dio_overwrites_peak"].as_u64().unwrap();
    assert!(
        peak >= 2,
        "direct overwrites of one file one at a time (peak {peak})"
    );
    // One thread with eight asynchronous writes in flight (libaio): with
    // FUSE_ASYNC_DIO the kernel sends them without waiting for each.
    m.remount("");
    sh(
        &m.dir,
        "fio --name=aio --filename=aio --ioengine=libaio --iodepth=8 --rw=randwrite --bs=4k \
         --size=8M --direct=1 --time_based --runtime=2 --output-format=terse >/dev/null",
    );
    let peak = counters(&m.dir)["dio_overwrites_peak"].as_u64().unwrap();
    assert!(
        peak >= 2,
        "asynchronous direct writes one at a time (peak {peak})"
    );
    m.unmount_and_check();
}

#[test]
fn fsx_through_the_mount_against_a_model() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("fsx", "");
    // Buffered and O_DIRECT descriptors on one file, truncates, fallocate
    // modes, fsyncs and reopens; every read checked against the model.
    let out = run(Command::new(BIN)
        .args([
            "torture", "fsx", "--ops", "15000", "--runs", "2", "--seed", "41", "--target",
        ])
        .arg(&m.dir));
    assert!(out.contains("30000 operations"), "{out}");
    assert!(
        out.contains("0 unsupported"),
        "every fallocate mode works: {out}"
    );
    // Four files at once, four threads.
    let out = run(Command::new(BIN)
        .args([
            "torture",
            "fsx",
            "--ops",
            "5000",
            "--threads",
            "4",
            "--seed",
            "51",
            "--target",
        ])
        .arg(&m.dir));
    assert!(out.contains("20000 operations"), "{out}");
    m.remount("");
    m.unmount_and_check();
}

/// fsx on a nearly full mount: 12 MiB left, less than the mount keeps
/// for the kernel's cached writes, so fsx's files are opened uncached
/// (the low-space path) on buffered and O_DIRECT descriptions alike;
/// every read still matches the model and no write fails for lack of
/// room it was promised.
#[test]
fn fsx_through_a_nearly_full_mount() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("fsx-full", "");
    let avail = statvfs(&m.dir).unwrap().2 * 4096;
    ballast(&m.path("ballast"), avail - (12 << 20));
    let out = run(Command::new(BIN)
        .args([
            "torture",
            "fsx",
            "--ops",
            "5000",
            "--threads",
            "4",
            "--seed",
            "61",
            "--target",
        ])
        .arg(&m.dir));
    assert!(out.contains("20000 operations"), "{out}");
    assert!(counters(&m.dir)["fuse_uncached_opens"].as_u64().unwrap() >= 4);
    m.unmount_and_check();
}

/// Each thread of process `pid`: its name and scheduling policy (field
/// 41 of /proc/PID/task/TID/stat; the fields from 3 follow the name).
fn thread_policies(pid: u32) -> Vec<(String, i32)> {
    let mut v = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(stat) = std::fs::read_to_string(t.unwrap().path().join("stat")) else {
            continue;
        };
        let (comm, rest) = stat.rsplit_once(')').unwrap();
        let policy: i32 = rest.split_whitespace().nth(38).unwrap().parse().unwrap();
        v.push((comm.to_string() + ")", policy));
    }
    v
}

/// A large file read cold through the mount (the kernel's read-ahead:
/// large requests of blocks the daemon holds no folio of) goes from the
/// image to the kernel past the daemon's cache, checked, and reads back
/// what was written; with `-o drop_behind=off` it fills the daemon's
/// cache as before.
#[test]
fn cold_reads_of_a_large_file_go_past_the_daemons_cache() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("read-past-cache", "");
    let data: Vec<u8> = (0..32u32 << 20).map(|i| (i / 4096 % 251) as u8).collect();
    std::fs::write(m.path("big"), &data).unwrap();
    for opts in ["", "drop_behind=off"] {
        m.remount(opts);
        let back = std::fs::read(m.path("big")).unwrap();
        assert!(back == data, "{opts:?}: the file reads back wrong");
        let c = counters(&m.dir);
        let past = c["uncached_read_bytes"].as_u64().unwrap();
        let cached = c["cached_bytes"].as_u64().unwrap();
        if opts.is_empty() {
            assert!(
                past >= 24 << 20,
                "{past} bytes of 32 MiB read past the cache"
            );
            assert!(cached < 8 << 20, "{cached} bytes cached after a cold read");
        } else {
            assert_eq!(past, 0, "read past the cache with drop_behind=off");
            assert!(
                cached >= 24 << 20,
                "{cached} bytes cached with drop_behind=off"
            );
        }
    }
    m.unmount_and_check();
}

/// A 1 MiB write() from a buffer that does not start on a page (glibc's
/// malloc puts a large one 16 bytes into its mapping) reaches the
/// engine as one request, not as 1 MiB less 16 bytes and then 16 bytes,
/// once `fs.fuse.max_pages_limit` lets the mount ask for 257 pages
/// (`scripts/fuse-uring.sh` and `scripts/test.sh` raise it as root); the
/// bytes read back. Over an uncached description (`-o direct_writes`),
/// where the kernel sends each write() as it comes.
#[test]
fn unaligned_megabyte_writes_reach_the_engine_whole() {
    if !fuse_ready(&[]) {
        return;
    }
    use std::os::unix::fs::FileExt;
    let limit = "/proc/sys/fs/fuse/max_pages_limit";
    let want = foliofs_fuse::max_pages();
    let have = std::fs::read_to_string(limit)
        .ok()
        .and_then(|v| v.trim().parse::<u16>().ok());
    let Some(have) = have else {
        eprintln!("SKIPPED: no {limit} (before Linux 6.13 a request spans at most 256 pages)");
        return;
    };
    if have < want && std::fs::write(limit, want.to_string()).is_err() {
        eprintln!("SKIPPED: {limit} is below {want} and not writable here");
        return;
    }
    let mut m = Mounted::new("unaligned-writes", "direct_writes");
    // 8 MiB of data at byte 16 of a page-aligned allocation.
    let mib = 1usize << 20;
    let mut whole = vec![0u8; 8 * mib + 2 * 4096];
    let skip = whole.as_ptr().align_offset(4096) + 16;
    let data = &mut whole[skip..skip + 8 * mib];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (i / 4096 % 251) as u8;
    }
    assert_eq!(data.as_ptr() as usize % 4096, 16);
    let f = std::fs::File::create(m.path("f")).unwrap();
    let before = counters(&m.dir)["fuse_uncached_writes"].as_u64().unwrap();
    for (i, c) in data.chunks(mib).enumerate() {
        f.write_all_at(c, (i * mib) as u64).unwrap();
    }
    let writes = counters(&m.dir)["fuse_uncached_writes"].as_u64().unwrap() - before;
    assert_eq!(writes, 8, "8 writes of 1 MiB came as {writes} requests");
    f.sync_all().unwrap();
    drop(f);
    m.remount("direct_writes");
    assert!(
        std::fs::read(m.path("f")).unwrap() == data,
        "the file reads back other bytes"
    );
}

/// `-o direct_writes`: a file opened for writing bypasses the kernel's
/// page cache, so what was written is in the engine when write() returns
/// and no page of it is cached in the kernel, whose st_blksize is 1 MiB
/// (a whole request: `cp` sizes its writes by it); it reads back, through the
/// cache, an O_DIRECT description and after a remount. Without the option
/// the kernel caches the written pages.
#[test]
fn direct_writes_bypass_the_kernels_page_cache() {
    if !fuse_ready(&[]) {
        return;
    }
    use std::fs::{File, OpenOptions};
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i / 4096 % 253) as u8).collect();
    // Pages of `f` in the kernel's page cache (mincore over a mapping of
    // the writer's own description: a new open could drop them).
    let resident = |f: &File| -> usize {
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a read-only shared mapping of an open file, unmapped
        // below; mincore writes one byte per page into `v`.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let mut v = vec![0u8; len.div_ceil(4096)];
            assert_eq!(libc::mincore(p, len, v.as_mut_ptr()), 0);
            libc::munmap(p, len);
            v.iter().filter(|b| **b & 1 != 0).count()
        }
    };
    let mut m = Mounted::new("direct-writes", "");
    for (opts, direct) in [("direct_writes", true), ("", false)] {
        m.remount(opts);
        let before = counters(&m.dir)["bytes_written_app"].as_u64().unwrap();
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(m.path("f"))
            .unwrap();
        for chunk in data.chunks(1 << 20) {
            f.write_all(chunk).unwrap();
        }
        let arrived = counters(&m.dir)["bytes_written_app"].as_u64().unwrap() - before;
        let cached = resident(&f);
        let blksize = f.metadata().unwrap().blksize();
        if direct {
            assert_eq!(
                blksize,
                1 << 20,
                "the preferred I/O size is a whole request"
            );
            assert_eq!(arrived, data.len() as u64, "{opts:?}: writes held back");
            assert_eq!(cached, 0, "{opts:?}: {cached} pages cached by the kernel");
        } else {
            assert_eq!(blksize, 4096);
            assert!(cached > 0, "no page cached with the writeback cache");
        }
        f.sync_all().unwrap();
        drop(f);
        assert!(std::fs::read(m.path("f")).unwrap() == data, "{opts:?}");
        let mut back = foliofs::device::AlignedBuf::zeroed(data.len());
        let d = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(m.path("f"))
            .unwrap();
        d.read_exact_at(&mut back, 0).unwrap();
        assert!(back[..] == data[..], "{opts:?}: O_DIRECT read");
    }
    m.remount("");
    assert!(std::fs::read(m.path("f")).unwrap() == data);
    m.unmount_and_check();
}

/// The mount's counters (`foliofs stat --mount`).
fn counters(dir: &Path) -> serde_json::Value {
    let out = run(Command::new(BIN)
        .args(["stat", "--json", "--mount"])
        .arg(dir));
    serde_json::from_str(&out).unwrap()
}

/// FUSE over io_uring: with the kernel's `fuse.enable_uring` on, a mount
/// serves its requests from the rings (`io_uring=on`, the default), and
/// from /dev/fuse with `io_uring=off`; files read back the same either way.
/// Quick replies go out from SCHED_IDLE unless `idle_reply=off`, and no
/// ring thread stays there, even while its CPU is kept busy.
#[test]
fn requests_go_through_rings_when_the_kernel_offers_them() {
    if !fuse_ready(&[]) {
        return;
    }
    let param = "/sys/module/fuse/parameters/enable_uring";
    if std::fs::read_to_string(param).map_or(true, |s| s.trim() != "Y") {
        eprintln!("SKIPPED: {param} is not Y (scripts/test.sh turns it on as root)");
        return;
    }
    let mut m = Mounted::new("uring", "io_uring=on");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(m.path("f"), &data).unwrap();
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::rename(m.path("f"), m.path("d/g")).unwrap();
    let served = counters(&m.dir)["fuse_ring_requests"].as_u64().unwrap();
    assert!(served > 0, "no request came through the rings");
    // Quick replies go out from SCHED_IDLE (root has CAP_SYS_NICE), and
    // every ring thread is back in SCHED_OTHER after each.
    for _ in 0..100 {
        std::fs::metadata(m.path("d/g")).unwrap();
        std::fs::read_dir(m.path("d")).unwrap().for_each(drop);
    }
    let idle = counters(&m.dir)["fuse_idle_replies"].as_u64().unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert!(idle > 0, "no reply was sent from SCHED_IDLE");
    }
    // A thread left in SCHED_IDLE while its CPU stays busy is put back
    // by the watchdog: here the caller, on the ring thread's CPU and in
    // SCHED_FIFO, spins after each reply until no ring thread is in
    // SCHED_IDLE (at most 3 s), so the ring thread cannot run there to
    // leave it itself. (A watchdog that shares that CPU runs in the
    // kernel's real-time throttling window, 50 ms of each second.)
    let pid = m.child.as_ref().unwrap().id();
    let idle_rings = move || {
        thread_policies(pid)
            .iter()
            .filter(|(c, p)| c.contains("fuse-ring") && *p == libc::SCHED_IDLE)
            .count()
    };
    // SAFETY: sysconf, sched_setaffinity and sched_setscheduler on this
    // thread with valid arguments.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if unsafe { libc::geteuid() } == 0 && cpus >= 2 {
        let before = counters(&m.dir)["fuse_idle_rescues"].as_u64().unwrap();
        let g = m.path("d/g");
        std::thread::spawn(move || {
            let c = std::ffi::CString::new(g.as_os_str().as_encoded_bytes()).unwrap();
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                assert_eq!(
                    libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
                    0
                );
                // SCHED_FIFO before the request: woken by the reply, this
                // thread preempts the ring thread at once.
                let fifo = libc::sched_param { sched_priority: 1 };
                assert_eq!(libc::sched_setscheduler(0, libc::SCHED_FIFO, &fifo), 0);
                for _ in 0..10 {
                    let mut sx: libc::statx = std::mem::zeroed();
                    let flags = libc::AT_STATX_FORCE_SYNC;
                    assert_eq!(
                        libc::statx(libc::AT_FDCWD, c.as_ptr(), flags, 0x7ff, &mut sx),
                        0
                    );
                    let t = Instant::now();
                    while idle_rings() > 0 && t.elapsed() < Duration::from_secs(3) {}
                }
                let other = libc::sched_param { sched_priority: 0 };
                assert_eq!(libc::sched_setscheduler(0, libc::SCHED_OTHER, &other), 0);
            }
        })
        .join()
        .unwrap();
        let rescued = counters(&m.dir)["fuse_idle_rescues"].as_u64().unwrap() - before;
        assert!(rescued > 0, "no ring thread was taken out of SCHED_IDLE");
    }
    // A thread may be between a reply and its next run for a moment
    // (its CPU busy elsewhere), never for long: each is back within the
    // wait's 20 s.
    let rings = thread_policies(pid)
        .iter()
        .filter(|(c, _)| c.contains("fuse-ring"))
        .count();
    assert!(rings > 0, "no ring thread found in /proc/{pid}/task");
    wait_for("every daemon thread in SCHED_OTHER", || {
        thread_policies(pid)
            .iter()
            .all(|(_, p)| *p == libc::SCHED_OTHER)
    });
    m.remount("io_uring=on,idle_reply=off");
    std::fs::read_dir(m.path("d")).unwrap().for_each(drop);
    std::fs::metadata(m.path("d/g")).unwrap();
    assert_eq!(counters(&m.dir)["fuse_idle_replies"].as_u64(), Some(0));
    m.remount("io_uring=off");
    assert_eq!(std::fs::read(m.path("d/g")).unwrap(), data);
    assert_eq!(counters(&m.dir)["fuse_ring_requests"].as_u64(), Some(0));
    m.remount("io_uring=on");
    assert_eq!(std::fs::read(m.path("d/g")).unwrap(), data);
    m.unmount_and_check();
}

/// With the kernel's write cache, the kernel flushes a file's times after
/// it renames or removes it (a SETATTR by inode number); the engine keeps
/// an inode the kernel still knows until the kernel forgets it, so those
/// flushes succeed and syncfs reports no writeback error.
#[test]
fn syncfs_after_files_are_written_renamed_and_removed() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("syncfs", "");
    let d = m.path("d");
    std::fs::create_dir(&d).unwrap();
    // syncfs reports writeback errors since the descriptor's open.
    let syncfs = |f: &std::fs::File, round: usize| {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor.
        let r = unsafe { libc::syncfs(f.as_raw_fd()) };
        assert_eq!(
            r,
            0,
            "round {round}: syncfs: {}",
            std::io::Error::last_os_error()
        );
    };
    for round in 0..3 {
        let f = std::fs::File::open(m.path("")).unwrap();
        syncfs(&f, round);
        for i in 0..200 {
            std::fs::write(d.join(format!("f{i}")), format!("{round} {i}")).unwrap();
        }
        // The kernel forgets the inodes (as root): the rename and remove
        // below meet them again through lookups.
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
        for i in 0..200 {
            std::fs::rename(d.join(format!("f{i}")), d.join(format!("g{i}"))).unwrap();
        }
        for i in 0..200 {
            std::fs::remove_file(d.join(format!("g{i}"))).unwrap();
        }
        syncfs(&f, round);
    }
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
    m.unmount_and_check();
}

#[test]
fn permissions_for_another_user() {
    if !fuse_ready(&["runuser"]) {
        return;
    }
    let mut m = Mounted::new("perm", "allow_other");
    std::fs::set_permissions(&m.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    write_with_mode(&m.path("rootfile"), b"secret", 0o644);
    std::fs::create_dir(m.path("private")).unwrap();
    std::fs::set_permissions(m.path("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(m.path("private/x"), b"x").unwrap();
    let d = m.dir.display().to_string();
    assert!(as_nobody(&format!("cat {d}/rootfile")).status.success());
    assert!(!as_nobody(&format!("echo x >> {d}/rootfile"))
        .status
        .success());
    assert!(!as_nobody(&format!("ls {d}/private")).status.success());
    assert!(!as_nobody(&format!("cat {d}/private/x")).status.success());
    assert!(!as_nobody(&format!("touch {d}/newfile")).status.success());
    assert_eq!(std::fs::read(m.path("rootfile")).unwrap(), b"secret");
    m.unmount_and_check();
}

/// As on a kernel file system, a write or truncate by an unprivileged
/// user and any chown take set-user-ID, set-group-ID (when
/// group-executable) and the file capability from a regular file; the
/// mount does it itself (FUSE_HANDLE_KILLPRIV_V2), so the kernel does not
/// ask for security.capability before each write. Cached writes, direct
/// writes and truncates each checked.
#[test]
fn suid_sgid_and_capabilities_go_on_write_truncate_and_chown() {
    if !fuse_ready(&[
        "runuser",
        "setfattr",
        "getfattr",
        "dd",
        "fallocate",
        "mkfifo",
        "mknod",
    ]) {
        return;
    }
    let mut m = Mounted::new("killpriv", "");
    std::fs::set_permissions(&m.dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let d = m.dir.display().to_string();
    let mode = |f: &str| std::fs::metadata(m.path(f)).unwrap().permissions().mode() & 0o7777;
    // A file capability (version 2, CAP_NET_BIND_SERVICE permitted).
    let cap = "0x0100000200040000000000000000000000000000";
    let direct = "dd if=/dev/zero of={p} bs=4096 count=1 oflag=direct conv=notrunc status=none";
    // (Without a capability the kernel asks nothing before a direct
    // write: the mode it caches must still change, xfstests generic/355.)
    for (f, how, with_cap) in [
        ("cached", "printf x >> {p}", true),
        ("direct", direct, true),
        ("direct-no-capability", direct, false),
        ("truncated", "truncate -s 1 {p}", true),
    ] {
        let p = m.path(f);
        write_with_mode(&p, &[0u8; 4096], 0o6775);
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o6777)).unwrap();
        if with_cap {
            run(Command::new("setfattr")
                .args(["-n", "security.capability", "-v", cap])
                .arg(&p));
        }
        assert_eq!(mode(f), 0o6777, "{f}");
        let out = as_nobody(&how.replace("{p}", &format!("{d}/{f}")));
        assert!(out.status.success(), "{f}: {out:?}");
        assert_eq!(
            mode(f),
            0o0777,
            "{f}: set-ID bits after an unprivileged {f} write"
        );
        let got = Command::new("getfattr")
            .args(["-n", "security.capability"])
            .arg(&p)
            .output()
            .unwrap();
        assert!(!got.status.success(), "{f}: the capability stays");
    }
    // fallocate by a caller outside the file's group takes set-user-ID,
    // and set-group-ID without group-execute too (xfstests 683-685).
    let p = m.path("fallocated");
    write_with_mode(&p, &[0u8; 4096], 0o6666);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o6666)).unwrap();
    let out = as_nobody(&format!("fallocate -l 65536 {d}/fallocated"));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(mode("fallocated"), 0o0666, "set-ID bits after fallocate");
    // Root writing keeps them (CAP_FSETID); chown takes them even from root.
    let p = m.path("chowned");
    write_with_mode(&p, b"x", 0o6775);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o6775)).unwrap();
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(&p)
        .unwrap()
        .write_all(b"y")
        .unwrap();
    assert_eq!(mode("chowned"), 0o6775);
    std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
    assert_eq!(mode("chowned"), 0o0775);
    // And from a FIFO or a device node, as Linux's chown takes them from
    // any file but a directory (pjdfstest chown/00.t).
    for (f, make) in [("fifo", "mkfifo {p}"), ("null", "mknod {p} c 1 3")] {
        let p = m.path(f);
        sh(&m.dir, &make.replace("{p}", &p.display().to_string()));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o6775)).unwrap();
        assert_eq!(mode(f), 0o6775, "{f}");
        std::os::unix::fs::chown(&p, Some(65534), Some(65533)).unwrap();
        assert_eq!(mode(f), 0o0775, "{f}: set-ID bits after chown");
    }
    m.unmount_and_check();
}

#[test]
fn helper_daemon_and_sigterm() {
    if !fuse_ready(&[]) {
        return;
    }
    let m = Mounted::new("helper", "");
    let (img, dir) = (m.img.clone(), m.dir.clone());
    let mut m = m;
    m.unmount_and_check();
    drop(m);
    // The mount.fuse.foliofs name, as mount(8) calls it; it daemonizes.
    let helper = dir.parent().unwrap().join("mount.fuse.foliofs");
    let _ = std::fs::remove_file(&helper);
    std::os::unix::fs::symlink(BIN, &helper).unwrap();
    run(Command::new(&helper)
        .arg(&img)
        .arg(&dir)
        .args(["-o", "rw,noauto,_netdev"]));
    assert!(is_mounted(&dir));
    // Run by root, the helper mounts dev,suid as mount(8) does a kernel
    // file system (mount(8) does not pass those defaults on).
    // SAFETY: statvfs fills the struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cstr(&dir).as_ptr(), &mut st) }, 0);
    assert_eq!(st.f_flag & (libc::ST_NODEV | libc::ST_NOSUID), 0);
    std::fs::write(dir.join("kept"), b"through SIGTERM").unwrap();
    // Find the daemon by its command line and stop it with SIGTERM.
    let pid = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let s = String::from_utf8_lossy(&c);
                s.contains("--foreground") && s.contains(img.to_str().unwrap())
            })
        })
        .expect("mount daemon");
    // SAFETY: sending a signal to a process we started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    wait_for("daemon exit", || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    assert!(!is_mounted(&dir));
    fsck(&img);
    // Bad options fail loudly and mount nothing.
    let out = Command::new(&helper)
        .arg(&img)
        .arg(&dir)
        .args(["-o", "bogus"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mount option"));
    assert!(!is_mounted(&dir));
    let mut m2 = Mounted {
        img,
        dir,
        child: None,
    };
    m2.mount("ro");
    assert_eq!(std::fs::read(m2.path("kept")).unwrap(), b"through SIGTERM");
    assert!(std::fs::write(m2.path("nope"), b"x").is_err());
    m2.unmount_and_check();
}

/// `foliofs mount IMG DIR` (daemonized): returns once the mount is up.
/// The suite's options for every mount (FOLIOFS_FUSE_OPTS, e.g.
/// `io_uring=off` to run the tests over /dev/fuse), before the test's own,
/// which win.
fn with_suite_options(opts: &str) -> String {
    let suite = std::env::var("FOLIOFS_FUSE_OPTS").unwrap_or_default();
    [suite.as_str(), opts]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(",")
}

fn mount_daemon(img: &Path, dir: &Path, opts: &str) {
    let mut cmd = Command::new(BIN);
    cmd.arg("mount").arg(img).arg(dir);
    let opts = with_suite_options(opts);
    if !opts.is_empty() {
        cmd.args(["-o", &opts]);
    }
    run(&mut cmd);
    assert!(is_mounted(dir));
}

fn write_with_mode(p: &Path, data: &[u8], mode: u32) {
    std::fs::write(p, data).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn as_nobody(script: &str) -> std::process::Output {
    Command::new("runuser")
        .args(["-u", "nobody", "--", "sh", "-c", script])
        .current_dir("/")
        .output()
        .unwrap()
}

#[test]
fn one_owner_per_image() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("owner", "");
    let other = m.dir.parent().unwrap().join("mnt2");
    std::fs::create_dir_all(&other).unwrap();
    let canon_dir = m.dir.canonicalize().unwrap();
    // A second mount: refused at once, exit 32, naming image and holder.
    let out = Command::new(BIN)
        .arg("mount")
        .arg(&m.img)
        .arg(&other)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(32), "second mount: {err}");
    assert!(
        err.contains("in use by pid") && err.contains(&canon_dir.display().to_string()),
        "{err}"
    );
    assert!(!is_mounted(&other));
    // fsck of the mounted image: refused, exit 8; mkfs too.
    let out = Command::new(BIN).arg("fsck").arg(&m.img).output().unwrap();
    assert_eq!(out.status.code(), Some(8));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by pid"));
    let out = Command::new(BIN)
        .args(["mkfs", "-f"])
        .arg(&m.img)
        .output()
        .unwrap();
    assert!(!out.status.success());
    // fsck -n runs, with a warning that its results may be stale.
    let out = Command::new(BIN)
        .args(["fsck", "-n"])
        .arg(&m.img)
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("stale"));
    std::fs::write(m.path("still"), b"here").unwrap();
    m.unmount_and_check();
    // Once unmounted, the image is free again.
    m.mount("");
    assert_eq!(std::fs::read(m.path("still")).unwrap(), b"here");
    m.unmount_and_check();
}

/// What scripts and test suites do: umount(8), then mount at once.
/// umount(8), tried again for up to a second while the kernel says the
/// mount is busy: one CI run saw EBUSY right after the files written into
/// it were closed (not seen again in local runs). A mount that stays busy
/// still fails the test.
fn umount_retrying_busy(dir: &Path) {
    for _ in 0..20 {
        let out = Command::new("umount").arg(dir).output().unwrap();
        if out.status.success() {
            return;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("busy"), "umount {}: {err}", dir.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("umount {}: still busy after 1 s", dir.display());
}

#[test]
fn umount_then_mount_at_once_200_cycles() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("cycle", "");
    m.unmount_and_check();
    let (img, dir) = (m.img.clone(), m.dir.clone());
    mount_daemon(&img, &dir, "");
    for i in 0..200u32 {
        let files: Vec<(PathBuf, Vec<u8>)> = (0..4u32)
            .map(|j| {
                let data: Vec<u8> = (0..20_000 + 997 * j)
                    .map(|k| (k.wrapping_mul(31) ^ i ^ (j << 3)) as u8)
                    .collect();
                (dir.join(format!("d{i}-f{j}")), data)
            })
            .collect();
        std::fs::create_dir(dir.join(format!("sub{i}"))).unwrap();
        for (p, d) in &files {
            std::fs::write(p, d).unwrap();
        }
        umount_retrying_busy(&dir);
        mount_daemon(&img, &dir, "");
        for (p, d) in &files {
            assert_eq!(&std::fs::read(p).unwrap(), d, "cycle {i}: {}", p.display());
            std::fs::remove_file(p).unwrap();
        }
        std::fs::remove_dir(dir.join(format!("sub{i}"))).unwrap();
    }
    // `foliofs umount` returns only when the daemon has finished: fsck at
    // once finds a clean image.
    run(Command::new(BIN).arg("umount").arg(&dir));
    assert!(!is_mounted(&dir));
    fsck(&img);
    let out = Command::new(BIN).arg("umount").arg(&dir).output().unwrap();
    assert!(!out.status.success(), "umount of what is not mounted fails");
}

#[test]
fn root_mount_serves_other_users_by_default() {
    if !fuse_ready(&["runuser"]) {
        return;
    }
    // No allow_other given: a root mount allows other users (the kernel
    // checks permissions); noallow_other turns that off.
    let mut m = Mounted::new("others", "");
    std::fs::set_permissions(&m.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    write_with_mode(&m.path("open"), b"readable", 0o644);
    write_with_mode(&m.path("closed"), b"secret", 0o600);
    let d = m.dir.display().to_string();
    let out = as_nobody(&format!("cat {d}/open"));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"readable");
    assert!(!as_nobody(&format!("cat {d}/closed")).status.success());
    m.remount("noallow_other");
    assert!(!as_nobody(&format!("cat {d}/open")).status.success());
    m.unmount_and_check();
}

#[test]
fn xattr_of_64k_through_setfattr_and_a_remount() {
    if !fuse_ready(&["setfattr", "getfattr", "base64"]) {
        return;
    }
    let mut m = Mounted::new("xattr64k", "");
    let f = m.path("f");
    std::fs::write(&f, b"x").unwrap();
    let value: Vec<u8> = (0..65536u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let b64 = |v: &[u8]| {
        let mut c = Command::new("base64")
            .arg("-w0")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        c.stdin.take().unwrap().write_all(v).unwrap();
        String::from_utf8(c.wait_with_output().unwrap().stdout).unwrap()
    };
    let set = |name: &str, v: &[u8]| {
        Command::new("setfattr")
            .args(["-n", name, "-v", &format!("0s{}", b64(v))])
            .arg(&f)
            .output()
            .unwrap()
    };
    let get = |name: &str| {
        let out = Command::new("getfattr")
            .args(["--only-values", "-n", name])
            .arg(&f)
            .output()
            .unwrap();
        assert!(out.status.success(), "getfattr {name}: {out:?}");
        out.stdout
    };
    let same = |got: Vec<u8>, want: &[u8]| {
        assert!(
            got == want,
            "value of {} bytes read back as {} bytes, or differs",
            want.len(),
            got.len()
        )
    };
    assert!(set("user.big", &value).status.success());
    assert!(set("user.small", b"tiny").status.success());
    same(get("user.big"), &value);
    // One byte over XATTR_SIZE_MAX is refused (by the kernel or by us).
    let mut over = value.clone();
    over.push(1);
    assert!(!set("user.over", &over).status.success());
    // Shrink and grow again: no fragment of the old value survives.
    assert!(set("user.big", &value[..5000]).status.success());
    same(get("user.big"), &value[..5000]);
    assert!(set("user.big", &value).status.success());
    m.remount("");
    same(get("user.big"), &value);
    same(get("user.small"), b"tiny");
    let names = run(Command::new("getfattr")
        .args(["-d", "-m", "user\\."])
        .arg(&f));
    assert!(names.contains("user.big") && names.contains("user.small") && !names.contains("over"));
    run(Command::new("setfattr").args(["-x", "user.big"]).arg(&f));
    m.unmount_and_check();
}

#[test]
fn replaced_by_rename_while_open() {
    if !fuse_ready(&[]) {
        return;
    }
    use std::io::{Read, Seek};
    let mut m = Mounted::new("rename-open", "");
    std::fs::write(m.path("a"), b"new contents").unwrap();
    std::fs::write(m.path("b"), vec![7u8; 300_000]).unwrap();
    let mut f = std::fs::File::open(m.path("b")).unwrap();
    let ino = f.metadata().unwrap().ino();
    std::fs::rename(m.path("a"), m.path("b")).unwrap();
    // The descriptor still has the replaced file: fstat and read work.
    let st = f.metadata().unwrap();
    assert_eq!((st.ino(), st.len(), st.nlink()), (ino, 300_000, 0));
    let mut all = Vec::new();
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut all).unwrap();
    assert_eq!(all, vec![7u8; 300_000]);
    assert_eq!(std::fs::read(m.path("b")).unwrap(), b"new contents");
    // The same for a directory replaced while open.
    std::fs::create_dir(m.path("d1")).unwrap();
    std::fs::create_dir(m.path("d2")).unwrap();
    let d = std::fs::File::open(m.path("d2")).unwrap();
    std::fs::rename(m.path("d1"), m.path("d2")).unwrap();
    assert!(d.metadata().unwrap().is_dir());
    drop(d);
    drop(f);
    // Freed at last close: fsck (in unmount_and_check) finds no leak,
    // and the space is back.
    m.unmount_and_check();
}

#[test]
fn atime_follows_relatime_noatime_and_strictatime() {
    if !fuse_ready(&[]) {
        return;
    }
    let atime = |p: &Path| {
        let st = std::fs::metadata(p).unwrap();
        (st.atime(), st.atime_nsec())
    };
    let set_times = |p: &Path, a: i64, mt: i64| {
        let ts = [
            libc::timespec {
                tv_sec: a,
                tv_nsec: 0,
            },
            libc::timespec {
                tv_sec: mt,
                tv_nsec: 0,
            },
        ];
        // SAFETY: a valid path and two timespecs.
        let r = unsafe { libc::utimensat(libc::AT_FDCWD, cstr(p).as_ptr(), ts.as_ptr(), 0) };
        assert_eq!(r, 0);
    };
    // A plain read, as cat does: the kernel may hold the file's pages.
    let read = |p: &Path| std::fs::read(p).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut m = Mounted::new("atime", "");
    let f = m.path("f");
    std::fs::write(&f, b"data").unwrap();
    // A new file's first read updates its atime (xfstests generic/003):
    // its pages are in the kernel's cache from the write, and the atime
    // the create stamped is not after the mtime the kernel stamped.
    let a0 = atime(&f);
    std::thread::sleep(Duration::from_millis(1100));
    read(&f);
    assert!(atime(&f) > a0, "the first read of a new file updates atime");
    // relatime: atime older than mtime is updated by a read...
    set_times(&f, now - 100, now - 50);
    read(&f);
    let a1 = atime(&f);
    assert!(a1.0 >= now - 1, "relatime updates a stale atime: {a1:?}");
    // ...but a recent atime newer than mtime and ctime is left alone.
    set_times(&f, now - 10, now - 3600);
    // (utimensat set ctime to now, so atime is older than ctime: read
    // once to settle, a clock tick later so the new atime is after the
    // ctime, then check the next read keeps it.)
    std::thread::sleep(Duration::from_millis(50));
    read(&f);
    let a2 = atime(&f);
    std::thread::sleep(Duration::from_millis(1100));
    read(&f);
    assert_eq!(atime(&f), a2, "relatime leaves a fresh atime");
    // An atime a day old is updated even when newer than mtime.
    set_times(&f, now - 2 * 86400, now - 3 * 86400);
    std::thread::sleep(Duration::from_millis(1100));
    read(&f);
    assert!(atime(&f).0 >= now, "a day-old atime is updated");
    m.remount("noatime");
    set_times(&f, now - 100, now - 50);
    read(&f);
    assert_eq!(atime(&f).0, now - 100, "noatime never updates");
    m.remount("strictatime");
    read(&f);
    let s1 = atime(&f);
    assert!(s1.0 >= now);
    std::thread::sleep(Duration::from_millis(1100));
    read(&f);
    assert!(atime(&f) > s1, "strictatime updates on every read");
    m.unmount_and_check();
}

#[test]
fn posix_acls_are_enforced_and_inherited() {
    if !fuse_ready(&["runuser", "setfacl", "getfacl", "setpriv"]) {
        return;
    }
    let mut m = Mounted::new("acl", "");
    std::fs::set_permissions(&m.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = m.path("secret");
    std::fs::write(&f, b"for nobody").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cat = format!("cat {}", f.display());
    assert!(!as_nobody(&cat).status.success(), "0600: nobody is refused");
    run(Command::new("setfacl").args(["-m", "u:nobody:r"]).arg(&f));
    let out = as_nobody(&cat);
    assert!(
        out.status.success(),
        "a named-user entry grants read: {out:?}"
    );
    assert_eq!(out.stdout, b"for nobody");
    // The mask shows as the group bits, and limits the named entry.
    assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o640);
    run(Command::new("setfacl").args(["-m", "m::-"]).arg(&f));
    assert!(!as_nobody(&cat).status.success(), "the mask denies");
    // chmod moves the mask, as on ext4.
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
    assert!(
        as_nobody(&cat).status.success(),
        "chmod g+r restores the mask"
    );
    // A default ACL is inherited, with no umask applied.
    let d = m.path("shared");
    std::fs::create_dir(&d).unwrap();
    run(Command::new("setfacl")
        .args(["-d", "-m", "u:nobody:rwx"])
        .arg(&d));
    run(Command::new("sh").args([
        "-c",
        &format!(
            "umask 077 && echo x > {0}/new && mkdir {0}/sub",
            d.display()
        ),
    ]));
    let acl = run(Command::new("getfacl").arg(d.join("new")));
    assert!(acl.contains("user:nobody:rwx\t#effective:rw-"), "{acl}");
    assert_eq!(
        std::fs::metadata(d.join("new")).unwrap().mode() & 0o777,
        0o664,
        "the default ACL, not the umask, decides"
    );
    let sub = run(Command::new("getfacl").arg(d.join("sub")));
    assert!(sub.contains("default:user:nobody:rwx"), "{sub}");
    let w = as_nobody(&format!("echo more >> {}/new", d.display()));
    assert!(w.status.success(), "{w:?}");
    m.remount("");
    assert!(as_nobody(&cat).status.success(), "ACLs survive a remount");
    // An access ACL set by its owner from outside the file's group takes
    // set-group-ID; from inside, it stays (xfstests generic/375).
    let t = m.path("sgid");
    std::fs::write(&t, b"").unwrap();
    std::os::unix::fs::chown(&t, Some(100), Some(100)).unwrap();
    for (gid, kept) in [("100", true), ("101", false)] {
        std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o2755)).unwrap();
        run(Command::new("setpriv")
            .args(["--reuid", "100", "--regid", gid, "--clear-groups"])
            .args(["setfacl", "-m", "u::rwx,g::rwx,o::rwx"])
            .arg(&t));
        let mode = std::fs::metadata(&t).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode & 0o2000 != 0, kept, "gid {gid}: mode {mode:o}");
    }
    m.unmount_and_check();
}

#[test]
fn a_flipped_data_byte_is_logged_with_inode_offset_and_address() {
    if !fuse_ready(&[]) {
        return;
    }
    use std::io::{Read, Seek, Write};
    let mut m = Mounted::new("csumlog", "");
    let log = m.dir.parent().unwrap().join("daemon.log");
    let marker = b"foliofs-flip-me!";
    let block: Vec<u8> = marker.iter().copied().cycle().take(4096).collect();
    let mut data = vec![0x5au8; 8192];
    data.extend_from_slice(&block);
    std::fs::write(m.path("victim"), &data).unwrap();
    let ino = std::fs::metadata(m.path("victim")).unwrap().ino();
    m.unmount_and_check();
    // Find the third block on the device and flip one of its bytes.
    let mut img = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&m.img)
        .unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut addr = None;
    let mut pos = 0u64;
    while addr.is_none() {
        let n = img.read(&mut buf).unwrap();
        assert!(n > 0, "data block not found in the image");
        addr = (0..n / 4096)
            .find(|i| buf[i * 4096..(i + 1) * 4096] == block[..])
            .map(|i| pos / 4096 + i as u64);
        pos += n as u64;
    }
    let addr = addr.unwrap();
    img.seek(std::io::SeekFrom::Start(addr * 4096 + 100))
        .unwrap();
    img.write_all(b"X").unwrap();
    drop(img);
    m.mount(&format!("log={}", log.display()));
    let e = std::fs::read(m.path("victim")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    let text = std::fs::read_to_string(&log).unwrap();
    let want = format!("inode {ino} offset 8192 device block {addr}");
    let lines: Vec<_> = text.lines().filter(|l| l.contains(&want)).collect();
    assert!(!lines.is_empty(), "no log line with {want:?} in:\n{text}");
    assert!(lines[0].contains("checksum"), "{}", lines[0]);
    drop(m);
}

/// A killed daemon leaves a dead mount: mount refuses it with a hint,
/// `foliofs umount` detaches it and says so (exit 32), and the next mount
/// replays the journal with every fsynced byte.
#[test]
fn a_killed_daemon_is_cleaned_up_by_foliofs_umount() {
    if !fuse_ready(&[]) {
        return;
    }
    use std::io::Write;
    let mut m = Mounted::new("killed", "");
    let mut f = std::fs::File::create(m.path("kept")).unwrap();
    f.write_all(b"fsynced before the kill").unwrap();
    f.sync_all().unwrap();
    drop(f);
    // The root's attributes fresh in the kernel: stat of the dead mount
    // will succeed from them, statfs will not.
    std::fs::metadata(&m.dir).unwrap();
    m.kill_daemon();
    assert!(std::fs::metadata(&m.dir).is_ok());
    let out = Command::new(BIN)
        .arg("mount")
        .arg(&m.img)
        .arg(&m.dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(32));
    assert!(String::from_utf8_lossy(&out.stderr).contains("dead FUSE mount"));
    m.detach_dead();
    m.mount("");
    assert_eq!(
        std::fs::read(m.path("kept")).unwrap(),
        b"fsynced before the kill"
    );
    m.unmount_and_check();
}

/// sync(1) stops at the kernel on a FUSE mount (Linux sends FUSE_SYNCFS
/// to virtiofs only); `foliofs sync PATH` also has the daemon write back
/// and commit, so what was written survives the daemon being killed
/// right after.
#[test]
fn foliofs_sync_makes_writes_survive_a_killed_daemon() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("sync", "");
    let content =
        |i: usize| -> Vec<u8> { (0..50_000 + i * 977).map(|k| (k * 7 + i) as u8).collect() };
    std::fs::create_dir(m.path("d")).unwrap();
    for i in 0..30 {
        std::fs::write(m.path(&format!("d/f{i}")), content(i)).unwrap();
    }
    std::fs::rename(m.path("d/f0"), m.path("renamed")).unwrap();
    let out = Command::new(BIN)
        .arg("sync")
        .arg(m.path("d/f1"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    m.kill_daemon();
    m.detach_dead();
    m.mount("");
    assert_eq!(std::fs::read(m.path("renamed")).unwrap(), content(0));
    for i in 1..30 {
        assert_eq!(
            std::fs::read(m.path(&format!("d/f{i}"))).unwrap(),
            content(i),
            "d/f{i}"
        );
    }
    // Not a foliofs mount: a clear message and a failure.
    let out = Command::new(BIN)
        .arg("sync")
        .arg(env!("CARGO_TARGET_TMPDIR"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not on a foliofs mount"),
        "{out:?}"
    );
    m.unmount_and_check();
}

/// A direct read into a private mapping of the file itself, while a
/// cached description is open for writing (xfstests generic/647): the
/// fault fills the page through the O_DIRECT handle and holds it locked,
/// so the fill must not wait for the kernel to drop that page. It hung
/// for good before reads told fills (no lock owner) from direct reads.
#[test]
fn direct_read_into_a_mapping_of_the_same_file() {
    if !fuse_ready(&["python3"]) {
        return;
    }
    let m = Mounted::new("mmapfault", "");
    let script = r#"import mmap, os, sys
p = sys.argv[1]; ps = 4096
buf = mmap.mmap(-1, ps); buf.write(b'b' * ps)
fd = os.open(p, os.O_CREAT | os.O_TRUNC | os.O_WRONLY | os.O_DIRECT, 0o666)
assert os.pwritev(fd, [buf], ps) == ps
os.close(fd)
keep = os.open(p, os.O_RDWR)  # a cached description open for writing
fd = os.open(p, os.O_RDWR | os.O_DIRECT)
m = mmap.mmap(fd, 2 * ps, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
# A direct read into a private mapping of the file itself: the fault
# fills page 0 through the O_DIRECT handle.
assert os.preadv(fd, [memoryview(m)[0:ps]], ps) == ps
assert m[0:ps] == b'b' * ps, "read"
# A direct write from the mapping.
assert os.pwritev(fd, [memoryview(m)[ps:2 * ps]], 0) == ps
os.close(fd); os.close(keep)
with open(p, 'rb') as f:
    assert f.read() == b'b' * (2 * ps), "written"
print("ok")
"#;
    python_within(script, &m.path("f"), Duration::from_secs(30));
}

/// Run a Python `script` on `arg`; it must succeed within `limit`. A hang
/// is stuck in the kernel until the daemon goes: on failure the caller's
/// `Mounted` drop kills the daemon.
fn python_within(script: &str, arg: &Path, limit: Duration) {
    let mut child = Command::new("python3")
        .args(["-c", script])
        .arg(arg)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < limit, "hung");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");
}

/// Direct reads past the engine's end of file, short of the kernel's
/// (cached writes beyond a hole, not yet written back), from more threads
/// than a ring queue has, all on CPU 0 so that their requests share one
/// queue: each read has the kernel write back first (`kernel_drop`), and
/// that writeback must find a thread to serve it. With the waits counted
/// across the queues and the invalidations made from CPU 0, the last free
/// thread of queue 0 waited for a wait while the writeback sat behind it:
/// after 2 s it went on without, and a read came back empty. Then again
/// with two threads per queue (two /dev/fuse workers), and with one:
/// fewer than the reads, so threads are added as the last free one would
/// wait.
#[test]
fn direct_reads_past_the_end_from_one_cpu_all_see_the_cached_size() {
    if !fuse_ready(&["python3"]) {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("SKIP: needs two CPUs (a queue other than CPU 0's)");
        return;
    }
    let mut m = Mounted::new("dropqueue", "");
    let script = r#"import mmap, os, sys, threading
d = sys.argv[1]; chunk = 65536
os.sched_setaffinity(0, {0})  # threads made after this inherit it
errors = []
def job(i):
    p = os.path.join(d, "f%d" % i)
    cached = os.open(p, os.O_CREAT | os.O_RDWR, 0o666)
    direct = os.open(p, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, chunk)
    for r in range(30):
        hole = 2 * r * chunk
        # The kernel's size moves past the hole; the engine's stays before it.
        os.pwrite(cached, bytes([65 + i]) * 4096, hole + chunk)
        buf.seek(0); buf.write(b"x" * chunk)
        n = os.preadv(direct, [buf], hole)
        if n != chunk or buf[:] != bytes(chunk):
            errors.append("file %d round %d: %d bytes" % (i, r, n))
            return
    os.close(direct); os.close(cached)
threads = [threading.Thread(target=job, args=(i,)) for i in range(6)]
for t in threads: t.start()
for t in threads: t.join()
assert not errors, errors
print("ok")
"#;
    // One thread (per queue) at first: each wait makes the thread that
    // serves the writeback.
    for (opts, added) in [
        ("", false),
        ("threads=2,ring_depth=2", true),
        ("threads=1,ring_depth=1", true),
    ] {
        m.remount(opts);
        for i in 0..6 {
            let _ = std::fs::remove_file(m.path(&format!("f{i}")));
        }
        python_within(script, &m.dir, Duration::from_secs(120));
        let c = counters(&m.dir);
        assert!(
            c["fuse_kernel_drops"].as_u64().unwrap() >= 6,
            "{opts}: the reads waited for the kernel's writeback: {c}"
        );
        assert_eq!(c["fuse_kernel_drops_skipped"], 0, "{opts}: {c}");
        if added {
            assert!(c["fuse_threads_added"].as_u64().unwrap() > 0, "{opts}: {c}");
        }
        for i in 0..6 {
            let len = std::fs::metadata(m.path(&format!("f{i}"))).unwrap().len();
            assert_eq!(len, 59 * 65536 + 4096, "{opts}: f{i}");
        }
    }
    m.unmount_and_check();
}

/// Device files work on a mount made with `-o dev` and not on one made
/// without (nodev, the default, as libfuse's); `suid` and `noexec` reach
/// the mount's flags too (xfstests generic/184 and 434 need `dev`).
#[test]
fn dev_suid_and_noexec_mount_options() {
    if !fuse_ready(&[]) {
        return;
    }
    let flags = |dir: &Path| {
        // SAFETY: statvfs fills the struct it is given.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::statvfs(cstr(dir).as_ptr(), &mut st) }, 0);
        st.f_flag
    };
    let mknull = |p: &Path| {
        // SAFETY: a valid path; 1:3 is /dev/null's device number.
        let r =
            unsafe { libc::mknod(cstr(p).as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
    };
    let mut m = Mounted::new("devopts", "");
    let f = flags(&m.dir);
    assert!(
        f & libc::ST_NODEV != 0 && f & libc::ST_NOSUID != 0,
        "defaults"
    );
    mknull(&m.path("null"));
    let e = std::fs::write(m.path("null"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES), "nodev");
    m.remount("dev,suid,noexec");
    let f = flags(&m.dir);
    assert_eq!(f & (libc::ST_NODEV | libc::ST_NOSUID), 0);
    assert!(f & libc::ST_NOEXEC != 0);
    std::fs::write(m.path("null"), b"into the null device").unwrap();
    assert_eq!(std::fs::metadata(m.path("null")).unwrap().len(), 0);
    m.unmount_and_check();
}

/// File handles (name_to_handle_at, open_by_handle_at; NFS exports use
/// them) still open their file after the kernel has forgotten it, and
/// after a remount; a removed file's handle is stale (xfstests
/// generic/426, 467, 477).
#[test]
fn file_handles_survive_dropped_caches_and_a_remount() {
    if !fuse_ready(&[]) {
        return;
    }
    // struct file_handle with room for the handle: bytes, type, handle.
    #[repr(C)]
    struct Handle {
        bytes: u32,
        kind: i32,
        data: [u8; 120],
    }
    let handle_of = |p: &Path| {
        let mut h = Handle {
            bytes: 120,
            kind: 0,
            data: [0; 120],
        };
        let mut mount_id = 0;
        // SAFETY: a valid path and a handle buffer of the size it says.
        let r = unsafe {
            libc::name_to_handle_at(
                libc::AT_FDCWD,
                cstr(p).as_ptr(),
                (&mut h as *mut Handle).cast(),
                &mut mount_id,
                0,
            )
        };
        assert_eq!(
            r,
            0,
            "name_to_handle_at: {}",
            std::io::Error::last_os_error()
        );
        h
    };
    let open_by = |dir: &Path, h: &mut Handle| -> std::io::Result<Vec<u8>> {
        let d = std::fs::File::open(dir).unwrap();
        // SAFETY: a directory on the mount and a handle name_to_handle_at made.
        // O_CLOEXEC: a program another test starts meanwhile must not
        // inherit the descriptor and keep the mount busy at its unmount.
        let fd = unsafe {
            libc::open_by_handle_at(
                std::os::fd::AsRawFd::as_raw_fd(&d),
                (h as *mut Handle).cast(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor just opened, owned here.
        let mut f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut out)?;
        Ok(out)
    };
    let drop_caches = || std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    let mut m = Mounted::new("handles", "");
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::write(m.path("d/kept"), b"found by its handle").unwrap();
    std::fs::write(m.path("d/gone"), b"removed").unwrap();
    let mut kept = handle_of(&m.path("d/kept"));
    let mut gone = handle_of(&m.path("d/gone"));
    drop_caches();
    assert_eq!(open_by(&m.dir, &mut kept).unwrap(), b"found by its handle");
    std::fs::remove_file(m.path("d/gone")).unwrap();
    drop_caches();
    let e = open_by(&m.dir, &mut gone).unwrap_err();
    assert_eq!(
        e.raw_os_error(),
        Some(libc::ESTALE),
        "a removed file's handle"
    );
    m.remount("");
    assert_eq!(open_by(&m.dir, &mut kept).unwrap(), b"found by its handle");
    m.unmount_and_check();
}

/// RENAME_WHITEOUT leaves a whiteout (a character device 0:0, mode 0) at
/// the old name, and so the mount can be overlayfs's upper layer: a file
/// of the lower layer removed through the overlay stays hidden, and one
/// renamed keeps its contents (xfstests generic/078, 631).
#[test]
fn whiteouts_and_an_overlayfs_upper_layer() {
    if !fuse_ready(&[]) {
        return;
    }
    let m = Mounted::new("whiteout", "");
    std::fs::write(m.path("a"), b"moved").unwrap();
    // SAFETY: valid paths; RENAME_WHITEOUT is 4.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cstr(&m.path("a")).as_ptr(),
            libc::AT_FDCWD,
            cstr(&m.path("b")).as_ptr(),
            4,
        )
    };
    assert_eq!(r, 0, "renameat2: {}", std::io::Error::last_os_error());
    let w = std::fs::symlink_metadata(m.path("a")).unwrap();
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    assert!(w.file_type().is_char_device());
    assert_eq!((w.rdev(), w.mode() & 0o7777), (0, 0));
    assert_eq!(std::fs::read(m.path("b")).unwrap(), b"moved");
    // overlayfs with its upper and work directories on the mount.
    let base = m.dir.parent().unwrap().to_path_buf();
    let (lower, merged) = (base.join("lower"), base.join("merged"));
    let _ = Command::new("umount").arg(&merged).status();
    for d in [&lower, &merged] {
        let _ = std::fs::remove_dir_all(d);
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::create_dir(m.path("upper")).unwrap();
    std::fs::create_dir(m.path("work")).unwrap();
    std::fs::write(lower.join("removed"), b"lower").unwrap();
    std::fs::write(lower.join("renamed"), b"lower data").unwrap();
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        m.path("upper").display(),
        m.path("work").display()
    );
    run(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(&merged));
    let r = (|| -> std::io::Result<()> {
        std::fs::remove_file(merged.join("removed"))?;
        std::fs::rename(merged.join("renamed"), merged.join("new-name"))?;
        Ok(())
    })();
    let listed: Vec<String> = std::fs::read_dir(&merged)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let moved = std::fs::read(merged.join("new-name"));
    run(Command::new("umount").arg(&merged));
    r.unwrap();
    assert!(
        !listed.iter().any(|n| n == "removed" || n == "renamed"),
        "{listed:?}"
    );
    assert_eq!(moved.unwrap(), b"lower data");
    // The upper layer on the mount holds the whiteouts.
    let w = std::fs::symlink_metadata(m.path("upper/removed")).unwrap();
    assert!(w.file_type().is_char_device() && w.rdev() == 0);
}

/// O_DIRECT in 512-byte sectors, as Linux's own file systems take it:
/// reads and writes that do not cover whole blocks go through the
/// engine's page cache (they failed with EINVAL), read back the same
/// through both paths, and an fsynced one survives a killed daemon.
#[test]
fn direct_io_in_512_byte_sectors() {
    if !fuse_ready(&[]) {
        return;
    }
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let mut m = Mounted::new("dio512", "");
    let p = m.path("f");
    let mut model: Vec<u8> = (0..65536u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&p, &model).unwrap();
    // A 4096-aligned buffer, as O_DIRECT callers use.
    let layout = std::alloc::Layout::from_size_align(8192, 4096).unwrap();
    // SAFETY: a non-zero size; freed below with the same layout.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    // SAFETY: ptr points to 8192 bytes owned here until dealloc.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, 8192) };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p)
        .unwrap();
    for (i, (off, len)) in [(512u64, 1536usize), (4096 + 3584, 1024), (40960, 4608)]
        .into_iter()
        .enumerate()
    {
        for (k, b) in buf[..len].iter_mut().enumerate() {
            *b = (i * 31 + k) as u8;
        }
        assert_eq!(f.write_at(&buf[..len], off).unwrap(), len);
        model[off as usize..off as usize + len].copy_from_slice(&buf[..len]);
        buf[..len].fill(0);
        assert_eq!(f.read_at(&mut buf[..len], off).unwrap(), len);
        assert_eq!(&buf[..len], &model[off as usize..off as usize + len]);
    }
    // Whole blocks through the direct path see the sector writes.
    assert_eq!(f.read_at(&mut buf[..8192], 4096).unwrap(), 8192);
    assert_eq!(&buf[..8192], &model[4096..12288]);
    f.sync_all().unwrap();
    drop(f);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
    assert_eq!(std::fs::read(&p).unwrap(), model);
    m.kill_daemon();
    m.detach_dead();
    m.mount("");
    assert_eq!(std::fs::read(&p).unwrap(), model, "after a killed daemon");
    m.unmount_and_check();
}

/// O_DIRECT not in whole 512-byte sectors fails with EINVAL, as on
/// Linux's own file systems (and through the C ABI): an offset or a
/// length off the sector, for reads and writes alike, leaving the file
/// as it was.
#[test]
fn direct_io_off_the_sector_is_einval() {
    if !fuse_ready(&[]) {
        return;
    }
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let mut m = Mounted::new("diosector", "");
    let p = m.path("f");
    let model: Vec<u8> = (0..16384u32).map(|i| (i * 13 % 251) as u8).collect();
    std::fs::write(&p, &model).unwrap();
    let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
    // SAFETY: a non-zero size; freed below with the same layout.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    // SAFETY: ptr points to 4096 bytes owned here until dealloc.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, 4096) };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&p)
        .unwrap();
    for (off, len) in [(100u64, 512usize), (512, 100), (4096 + 1, 4096), (0, 4095)] {
        let e = f.write_at(&buf[..len], off).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "write {off}+{len}");
        let e = f.read_at(&mut buf[..len], off).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "read {off}+{len}");
    }
    // Whole sectors still go.
    assert_eq!(f.read_at(&mut buf[..1024], 512).unwrap(), 1024);
    assert_eq!(&buf[..1024], &model[512..1536]);
    drop(f);
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
    assert_eq!(std::fs::read(&p).unwrap(), model, "nothing written");
    m.unmount_and_check();
}

/// Directory offsets (d_off, telldir) are seekable file offsets: every
/// one is positive, lseek takes it, and seekdir to it resumes the listing
/// at the entry that followed it (xfstests generic/257 and 637; offsets
/// at or past 2^63 were negative and lseek refused them).
#[test]
fn directory_offsets_are_seekable() {
    if !fuse_ready(&[]) {
        return;
    }
    let m = Mounted::new("diroff", "");
    let d = m.path("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..600 {
        std::fs::write(d.join(format!("entry-{i}")), b"").unwrap();
    }
    // SAFETY: a valid path; the stream is closed below.
    let dir = unsafe { libc::opendir(cstr(&d).as_ptr()) };
    assert!(!dir.is_null());
    // (offset after the entry, the entry's name), in listing order.
    let mut listed: Vec<(i64, Vec<u8>)> = Vec::new();
    loop {
        // SAFETY: an open stream; the entry is read before the next call.
        let e = unsafe { libc::readdir64(dir) };
        if e.is_null() {
            break;
        }
        // SAFETY: readdir64 returned a valid entry with a NUL-ended name.
        let (name, off) = unsafe {
            (
                std::ffi::CStr::from_ptr((*e).d_name.as_ptr())
                    .to_bytes()
                    .to_vec(),
                (*e).d_off,
            )
        };
        assert!(
            off > 0,
            "d_off of {:?} is {off}",
            String::from_utf8_lossy(&name)
        );
        listed.push((off, name));
    }
    assert_eq!(listed.len(), 602, "600 entries, . and ..");
    // SAFETY: an open stream.
    let fd = unsafe { libc::dirfd(dir) };
    for i in (0..listed.len() - 1).rev().step_by(7) {
        let (off, _) = &listed[i];
        // SAFETY: an open descriptor.
        assert_eq!(unsafe { libc::lseek64(fd, *off, libc::SEEK_SET) }, *off);
        // SAFETY: an open stream and an offset telldir could return.
        unsafe { libc::seekdir(dir, *off as libc::c_long) };
        // SAFETY: as above.
        let e = unsafe { libc::readdir64(dir) };
        assert!(!e.is_null());
        // SAFETY: a valid entry.
        let name = unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_bytes() };
        assert_eq!(name, listed[i + 1].1, "the entry after offset {off}");
    }
    // SAFETY: an open stream, closed once.
    unsafe { libc::closedir(dir) };
}

/// `mount -o remount,ro` (the helper, as mount(8) calls it): refused
/// while a file is open for writing; then writes fail with EROFS, reads
/// go on, and what was written is durable: it survives the daemon being
/// killed. `remount,rw` makes the mount writable again.
#[test]
fn remount_read_only_makes_writes_durable_and_refuses_new_ones() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("remount", "");
    let helper = m.dir.parent().unwrap().join("mount.fuse.foliofs");
    let _ = std::fs::remove_file(&helper);
    std::os::unix::fs::symlink(BIN, &helper).unwrap();
    let remount = |opts: &str| {
        Command::new(&helper)
            .arg(&m.img)
            .arg(&m.dir)
            .args(["-o", opts])
            .output()
            .unwrap()
    };
    let ro = |dir: &Path| {
        let out = run(Command::new("findmnt").args(["-no", "OPTIONS"]).arg(dir));
        out.split(',').any(|o| o.trim() == "ro")
    };
    std::fs::write(m.path("first"), b"written before remount,ro").unwrap();
    let writer = std::fs::File::create(m.path("open")).unwrap();
    let out = remount("remount,ro");
    assert!(!out.status.success(), "remount,ro with a writer open");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("open for writing"),
        "{out:?}"
    );
    assert!(!ro(&m.dir));
    drop(writer);
    let out = remount("remount,ro");
    assert!(out.status.success(), "{out:?}");
    assert!(ro(&m.dir));
    let e = std::fs::write(m.path("second"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    assert_eq!(
        std::fs::read(m.path("first")).unwrap(),
        b"written before remount,ro"
    );
    // Back to read-write, a change, and read-only again.
    let out = remount("remount,rw");
    assert!(out.status.success(), "{out:?}");
    assert!(!ro(&m.dir));
    std::fs::write(m.path("second"), b"written after remount,rw").unwrap();
    std::fs::rename(m.path("first"), m.path("first-renamed")).unwrap();
    // An option that is not one fails and changes nothing.
    let out = remount("remount,ro,bogus");
    assert!(!out.status.success());
    assert!(!ro(&m.dir));
    assert!(remount("remount,ro").status.success());
    m.kill_daemon();
    m.detach_dead();
    m.mount("");
    assert_eq!(
        std::fs::read(m.path("first-renamed")).unwrap(),
        b"written before remount,ro"
    );
    assert_eq!(
        std::fs::read(m.path("second")).unwrap(),
        b"written after remount,rw"
    );
    assert!(!m.path("first").exists());
    m.unmount_and_check();
}

/// PostgreSQL's programs (Debian keeps them off PATH), the newest version.
fn postgres_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| Some(e.ok()?.path().join("bin")))
        .filter(|d| d.join("postgres").exists())
        .collect();
    dirs.sort();
    dirs.pop()
}

/// SIGKILL `pid` and its children, and wait until they are gone (reaped).
fn kill_tree(pid: i32) {
    let children = |p: i32| -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
            .filter(|c| {
                std::fs::read_to_string(format!("/proc/{c}/stat")).is_ok_and(|st| {
                    // pid (comm) state ppid ...: comm may hold spaces.
                    st.rsplit_once(") ")
                        .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<i32>().ok())
                        == Some(p)
                })
            })
            .collect()
    };
    let mut all = vec![pid];
    all.extend(children(pid));
    for &p in &all {
        // SAFETY: kill has no memory preconditions.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    wait_for("the killed processes to go", || {
        // Reaped too: PostgreSQL takes a zombie's pid for a live server.
        all.iter()
            .all(|p| !Path::new(&format!("/proc/{p}")).exists())
    });
}

fn as_postgres(script: &str) -> String {
    run(Command::new("runuser")
        .args(["-u", "postgres", "--", "sh", "-ec", script])
        .current_dir("/"))
}

/// A database on the mount, the daemon killed under a pgbench run: every
/// commit pgbench saw acknowledged is there after the remount and
/// PostgreSQL's own recovery, the bank's balances add up (each
/// transaction whole or absent), and amcheck and the page checksums
/// (initdb -k) find nothing wrong.
#[test]
fn postgres_keeps_every_acknowledged_commit_through_a_killed_daemon() {
    let bin = postgres_bin();
    let pg_ctl = bin.as_ref().map_or("pg_ctl (PostgreSQL)".into(), |b| {
        b.join("pg_ctl").display().to_string()
    });
    if !fuse_ready(&["runuser", &pg_ctl]) {
        return;
    }
    let bin = bin.unwrap().display().to_string();
    let mut m = Mounted::new("postgres", "");
    // The socket, the run's logs and pgbench's per-transaction log live
    // beside the mount, not on it: they must outlive the daemon.
    let side = m.dir.parent().unwrap().join("side").display().to_string();
    let data = m.path("pg").display().to_string();
    sh(
        &m.dir,
        &format!("mkdir {side} {data} && chown postgres {side} {data}"),
    );
    let conn = format!("-h {side} -p 5491");
    let start = format!(
        "{bin}/pg_ctl start -w -D {data}/db -l {side}/server.log \
         -o \"-c listen_addresses='' -k {side} -p 5491\""
    );
    as_postgres(&format!("{bin}/initdb -k -A trust -D {data}/db >/dev/null"));
    as_postgres(&start);
    as_postgres(&format!(
        "{bin}/pgbench {conn} -q -i -s 2 postgres 2>/dev/null
         {bin}/psql {conn} -qc 'create table acks (id bigserial primary key, client int)' postgres
         echo 'insert into acks (client) values (:client_id);' > {side}/ack.sql"
    ));
    // Half the transactions the bank's (tpcb-like), half an insert each.
    let bench = Command::new("runuser")
        .args(["-u", "postgres", "--", "sh", "-c"])
        .arg(format!(
            "cd {side} && {bin}/pgbench {conn} -n -c 4 -j 2 -T 120 -l --log-prefix={side}/acked \
             -b tpcb-like -f {side}/ack.sql postgres > {side}/pgbench.out 2>&1"
        ))
        .spawn()
        .unwrap();
    let postmaster: i32 = std::fs::read_to_string(format!("{data}/db/postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_secs(6));
    m.kill_daemon();
    let mut bench = bench;
    bench.wait().unwrap();
    // The postmaster and its backends die of their files being gone;
    // make sure of it before the restart looks for them.
    kill_tree(postmaster);
    // One line per transaction pgbench saw committed: client, number,
    // time, script (1: the insert), ...
    let (mut acked, mut inserts) = (0usize, 0usize);
    for e in std::fs::read_dir(&side).unwrap() {
        let p = e.unwrap().path();
        if p.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("acked.")
        {
            for l in std::fs::read_to_string(&p).unwrap().lines() {
                acked += 1;
                inserts += (l.split(' ').nth(3) == Some("1")) as usize;
            }
        }
    }
    assert!(
        inserts > 200,
        "too few acknowledged inserts ({inserts} of {acked}) before the kill: {}",
        std::fs::read_to_string(format!("{side}/pgbench.out")).unwrap_or_default()
    );
    m.detach_dead();
    m.mount("");
    as_postgres(&start);
    let q = |sql: &str| as_postgres(&format!("{bin}/psql {conn} -Atc \"{sql}\" postgres"));
    let rows: usize = q("select count(*) from acks").trim().parse().unwrap();
    assert!(
        rows >= inserts,
        "{rows} rows, {inserts} inserts acknowledged"
    );
    let sums = q("select (select sum(abalance) from pgbench_accounts), \
         (select sum(bbalance) from pgbench_branches), \
         (select sum(tbalance) from pgbench_tellers), \
         (select coalesce(sum(delta), 0) from pgbench_history)");
    let sums: Vec<&str> = sums.trim().split('|').collect();
    assert!(sums.iter().all(|s| *s == sums[0]), "balances {sums:?}");
    q("create extension if not exists amcheck");
    as_postgres(&format!(
        "{bin}/pg_amcheck {conn} -d postgres --heapallindexed >{side}/amcheck.out"
    ));
    let log = std::fs::read_to_string(format!("{side}/server.log")).unwrap();
    assert!(log.contains("redo done"), "no recovery in the log:\n{log}");
    assert!(!log.contains("checksum"), "a page checksum failed:\n{log}");
    as_postgres(&format!("{bin}/pg_ctl stop -w -D {data}/db"));
    // pg_ctl returns once the postmaster's pid file is gone; its last
    // processes may still be closing files on the mount for a moment.
    wait_for("PostgreSQL to let go of the mount", || {
        !std::fs::read_dir("/proc").unwrap().any(|e| {
            let Some(pid) = e.ok() else { return false };
            let cwd = std::fs::read_link(pid.path().join("cwd"));
            let fds = std::fs::read_dir(pid.path().join("fd"));
            cwd.is_ok_and(|c| c.starts_with(&m.dir))
                || fds.is_ok_and(|mut fds| {
                    fds.any(|f| {
                        f.ok()
                            .and_then(|f| std::fs::read_link(f.path()).ok())
                            .is_some_and(|t| t.starts_with(&m.dir))
                    })
                })
        })
    });
    m.unmount_and_check();
}

/// mkfs gives the root directory to the user who runs it (or to
/// `--root-owner`): an image a user makes is theirs to fill.
#[test]
fn mkfs_gives_the_root_directory_to_its_user() {
    if !fuse_ready(&["runuser"]) {
        return;
    }
    let mut m = Mounted::new("root-owner", "");
    m.unmount_and_check();
    let img = m.img.display().to_string();
    let id = |flag: &str| -> u32 {
        run(Command::new("id").args([flag, "nobody"]))
            .trim()
            .parse()
            .unwrap()
    };
    let (uid, gid) = (id("-u"), id("-g"));
    std::os::unix::fs::chown(&m.img, Some(uid), Some(gid)).unwrap();
    let out = as_nobody(&format!("{BIN} mkfs --force {img}"));
    assert!(out.status.success(), "{out:?}");
    m.mount("");
    let md = std::fs::metadata(&m.dir).unwrap();
    assert_eq!((md.uid(), md.gid()), (uid, gid));
    let d = m.dir.display();
    let out = as_nobody(&format!("echo mine > {d}/f && mkdir {d}/sub"));
    assert!(out.status.success(), "{out:?}");
    m.unmount_and_check();
    run(Command::new(BIN).args(["mkfs", "--force", "--root-owner", "1234:5678", &img]));
    m.mount("");
    let md = std::fs::metadata(&m.dir).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    m.unmount_and_check();
    let out = Command::new(BIN)
        .args(["mkfs", "--force", "--root-owner", "nobody", &img])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("want UID:GID"),
        "{out:?}"
    );
    fsck(&m.img);
}

/// Where /dev/fuse is root's alone, a user's mount says so before it
/// touches the image (fusermount3 opens the device with the user's rights
/// too, so there is nothing to fall back on).
#[test]
fn a_user_who_may_not_open_dev_fuse_is_told_why() {
    if !fuse_ready(&["runuser"]) {
        return;
    }
    let mode = std::fs::metadata("/dev/fuse").unwrap().permissions().mode();
    if mode & 0o006 == 0o006 {
        eprintln!("SKIPPED: /dev/fuse is open to every user on this machine");
        return;
    }
    let mut m = Mounted::new("user-mount", "");
    m.unmount_and_check();
    sh(&m.dir, "chown -R nobody: .. && chmod 755 ..");
    let out = as_nobody(&format!(
        "{BIN} mount {} {}",
        m.img.display(),
        m.dir.display()
    ));
    assert_eq!(out.status.code(), Some(32), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("only root may mount FUSE"),
        "{out:?}"
    );
    assert!(!is_mounted(&m.dir));
    fsck(&m.img);
}

/// A write the file system has no room for fails in write(2), as on a
/// kernel file system, not only at fsync or close: the kernel's write
/// cache takes writes without asking, and a loop writing to a full mount
/// used to go on for ever. Files opened for writing while the free space
/// does not cover what the kernel may cache (`cache_floor`) bypass the
/// kernel's cache.
#[test]
fn enospc_reaches_write_when_the_mount_is_full() {
    use std::io::Write;
    if !fuse_ready(&["fallocate"]) {
        return;
    }
    // A floor set here, so the file opened below is opened uncached
    // whatever the kernel's dirty limit on this machine.
    let mut m = Mounted::new("enospc", "cache_floor=256M");
    std::fs::write(m.path("early"), b"plenty of room").unwrap();
    assert_eq!(counters(&m.dir)["fuse_uncached_opens"], 0);
    // Leave about 150 MiB of the 1 GiB.
    let (blocks, _, _) = statvfs(&m.dir).unwrap();
    ballast(&m.path("fill"), blocks * 4096 - (150 << 20));
    let mut f = std::fs::File::create(m.path("last")).unwrap();
    let chunk = vec![7u8; 1 << 20];
    let mut written = 0u64;
    let err = loop {
        match f.write(&chunk) {
            Ok(n) => written += n as u64,
            Err(e) => break e,
        }
        assert!(
            written < 1 << 30,
            "wrote {written} bytes to a 1 GiB file system"
        );
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(written > 100 << 20, "only {written} bytes before ENOSPC");
    // What write() took is there and durable.
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(std::fs::metadata(m.path("last")).unwrap().len(), written);
    assert!(counters(&m.dir)["fuse_uncached_opens"].as_u64().unwrap() >= 1);
    std::fs::remove_file(m.path("fill")).unwrap();
    m.remount("");
    let back = std::fs::read(m.path("last")).unwrap();
    assert_eq!(back.len() as u64, written);
    assert!(back.iter().all(|&b| b == 7));
    m.unmount_and_check();
}

/// A file opened for writing while space was plentiful keeps the
/// kernel's write cache; when the disk fills, its write(2) fails with
/// ENOSPC (the gate at the GETATTR the kernel sends first), and every
/// byte a write(2) took is there after fsync and a remount. Before, the
/// writeback that found room for part of a request replied with a short
/// count, which the kernel takes as all written: fsync returned 0 and the
/// rest was gone after the remount (SQLite's database came back
/// malformed).
#[test]
fn a_full_disk_fails_cached_writes_in_write_and_loses_nothing() {
    use std::io::Write;
    if !fuse_ready(&["fallocate"]) {
        return;
    }
    let mut m = Mounted::new("full-cached", "");
    let mut f = std::fs::File::create(m.path("f")).unwrap();
    assert_eq!(counters(&m.dir)["fuse_uncached_opens"], 0);
    // 40 MiB left for ordinary writes beside the space kept for the
    // kernel's cache.
    let avail = statvfs(&m.dir).unwrap().2 * 4096;
    ballast(&m.path("ballast"), avail - (40 << 20));
    let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + i / 4093) as u8).collect();
    let mut written = 0u64;
    let err = loop {
        match f.write(&chunk) {
            Ok(n) => written += n as u64,
            Err(e) => break e,
        }
        assert!(written < 1 << 30, "wrote {written} bytes to a full mount");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(written >= 40 << 20, "only {written} bytes before ENOSPC");
    f.sync_all().unwrap();
    drop(f);
    assert!(counters(&m.dir)["fuse_enospc_gated"].as_u64().unwrap() >= 1);
    assert_eq!(counters(&m.dir)["fuse_uncached_opens"], 0);
    m.remount("");
    let back = std::fs::read(m.path("f")).unwrap();
    assert_eq!(back.len() as u64, written, "bytes write(2) took are gone");
    for (i, c) in back.chunks(1 << 20).enumerate() {
        assert!(c == &chunk[..c.len()], "MiB {i} differs");
    }
    // Freed space lets writing go on without a remount.
    std::fs::remove_file(m.path("ballast")).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.path("f"))
        .unwrap();
    f.write_all(&chunk).unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.unmount_and_check();
}

/// With no space kept for the kernel's cache (`cache_floor=0`), writes
/// through it are taken beyond what the disk holds and their writeback
/// fails: fsync reports it (ENOSPC), and the kernel's refused pages are
/// dropped (once the failed writeback's reply is out), so reads show
/// what the file holds, not the refused bytes: the same as after a
/// remount, but for the size, which the kernel keeps as its own until it
/// forgets the inode (zeros past the file's end, as on ext4, whose
/// failed writeback leaves its in-memory size too).
#[test]
fn a_failed_writeback_is_reported_and_leaves_no_phantom_data() {
    use std::io::{Read, Write};
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("phantom", "cache_floor=0");
    let mut f = std::fs::File::create(m.path("f")).unwrap();
    let old: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8 | 1).collect();
    f.write_all(&old).unwrap();
    f.sync_all().unwrap();
    let avail = statvfs(&m.dir).unwrap().2 * 4096;
    ballast(&m.path("ballast"), avail - (1 << 20));
    // 8 MiB more than the disk holds, all taken by the kernel's cache.
    let new = vec![0xeeu8; 8 << 20];
    f.write_all(&new).unwrap();
    let e = f.sync_all().unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
    drop(f);
    // The drops run after the failed writeback's reply.
    std::thread::sleep(Duration::from_millis(500));
    let mut seen = Vec::new();
    std::fs::File::open(m.path("f"))
        .unwrap()
        .read_to_end(&mut seen)
        .unwrap();
    assert!(seen.len() >= old.len());
    assert!(seen[..old.len()] == old[..], "durable data damaged");
    m.remount("");
    let back = std::fs::read(m.path("f")).unwrap();
    assert!(back[..old.len()] == old[..]);
    // Not all of it fits. (The size may reach the end: the kernel's
    // writeback requests run in any order, and the last one may be
    // among those that found room, leaving a hole before it.)
    let landed = back[old.len()..].iter().filter(|&&b| b == 0xee).count();
    assert!(landed < new.len(), "every refused byte reached the disk");
    // What the cache showed after the failure is what the disk has, and
    // zeros past it. (The size it showed is the kernel's, or the disk's
    // once the kernel refetched the attributes.)
    assert!(seen.len() >= back.len(), "reads lost bytes the disk has");
    assert!(seen[..back.len()] == back[..], "reads differ from the disk");
    assert!(
        seen[back.len()..].iter().all(|&b| b == 0),
        "refused bytes still read back"
    );
    m.unmount_and_check();
}

/// A file of `len` allocated bytes at `path`, made through an O_DIRECT
/// description: not one the kernel caches writes for, which would have
/// the mount keep space for them beside it (`cache_floor`).
fn ballast(path: &Path, len: u64) {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap();
    // SAFETY: a valid descriptor; fallocate has no memory arguments.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len as i64) };
    assert_eq!(r, 0, "fallocate {len}: {}", std::io::Error::last_os_error());
}

/// linkat(2) of an open file by its /proc/self/fd link, as programs name
/// an O_TMPFILE file.
fn link_fd(fd: i32, to: &Path) -> std::io::Result<()> {
    let from = CString::new(format!("/proc/self/fd/{fd}")).unwrap();
    let to = cstr(to);
    // SAFETY: both paths are NUL-terminated.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn o_tmpfile_is_unnamed_until_linked_and_goes_with_its_last_close() {
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    if !fuse_ready(&["python3"]) {
        return;
    }
    let mut m = Mounted::new("tmpfile", "");
    std::fs::create_dir(m.path("d")).unwrap();
    let tmp = |excl: bool| {
        let mut o = std::fs::OpenOptions::new();
        o.read(true).write(true).mode(0o640);
        o.custom_flags(libc::O_TMPFILE | if excl { libc::O_EXCL } else { 0 });
        o.open(m.path("d")).unwrap()
    };
    // Unnamed and writable; linkat names it, with its data.
    let mut f = tmp(false);
    let data = vec![5u8; 3 << 20];
    f.write_all(&data).unwrap();
    let st = f.metadata().unwrap();
    assert_eq!(
        (st.nlink(), st.mode() & 0o7777, st.len()),
        (0, 0o640, 3 << 20)
    );
    assert_eq!(std::fs::read_dir(m.path("d")).unwrap().count(), 0);
    link_fd(f.as_raw_fd(), &m.path("d/named")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    f.seek(std::io::SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, data);
    drop(f);
    // O_EXCL: never linkable (the kernel says ENOENT).
    let f = tmp(true);
    let e = link_fd(f.as_raw_fd(), &m.path("d/excl")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    drop(f);
    // One never named takes its space with it at close.
    let mut f = tmp(false);
    f.write_all(&vec![6u8; 64 << 20]).unwrap();
    f.sync_all().unwrap();
    let (_, during, _) = statvfs(&m.dir).unwrap();
    drop(f);
    wait_for("the closed tmpfile's 64 MiB back", || {
        statvfs(&m.dir).unwrap().1 > during + (60 << 20) / 4096
    });
    // A program that uses it: Python's tempfile.TemporaryFile opens
    // O_TMPFILE on Linux.
    let d = m.path("d").display().to_string();
    let out = sh(
        &m.dir,
        &format!(
            "python3 -c 'import tempfile,os; f=tempfile.TemporaryFile(dir=\"{d}\"); \
             f.write(b\"x\"*100000); f.seek(0); print(len(f.read()), os.fstat(f.fileno()).st_nlink, len(os.listdir(\"{d}\")))'"
        ),
    );
    assert_eq!(out.trim(), "100000 0 1");
    m.remount("");
    assert_eq!(std::fs::read(m.path("d/named")).unwrap(), data);
    let names: Vec<_> = std::fs::read_dir(m.path("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("named")]);
    m.unmount_and_check();
}

/// FS_IOC_GETFLAGS / FS_IOC_SETFLAGS on `p` (chattr's ioctls).
fn inode_flags(p: &Path, set: Option<u32>) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(p)?;
    let mut v: libc::c_int = set.unwrap_or(0) as libc::c_int;
    let cmd = if set.is_some() {
        libc::FS_IOC_SETFLAGS
    } else {
        libc::FS_IOC_GETFLAGS
    };
    // SAFETY: both ioctls take a pointer to an int.
    if unsafe { libc::ioctl(f.as_raw_fd(), cmd, &mut v) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v as u32)
}

/// chattr +i and +a through the mount: the kernel forwards the flags
/// (FUSE_IOCTL), the daemon refuses what they forbid, opens included
/// (the kernel does not know a FUSE file's flags), writes the kernel
/// cached before +i still reach the file, and the flags survive a
/// remount.
#[test]
fn chattr_immutable_and_append_only_through_the_mount() {
    if !fuse_ready(&[]) {
        return;
    }
    let eperm = |r: std::io::Result<()>, what: &str| {
        let e = r.err().unwrap_or_else(|| panic!("{what}: allowed"));
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{what}: {e}");
    };
    use std::os::unix::fs::FileExt;
    let (imm, app) = (foliofs::fs::FL_IMMUTABLE, foliofs::fs::FL_APPEND);
    let mut m = Mounted::new("chattr", "");
    let f = m.path("f");
    std::fs::write(&f, b"before").unwrap();
    // A write the kernel caches, then +i while it is still cached.
    let mut w = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
    let old = std::fs::OpenOptions::new().write(true).open(&f).unwrap();
    w.write_all(b", cached").unwrap();
    inode_flags(&f, Some(imm)).unwrap();
    assert_eq!(inode_flags(&f, None).unwrap() & (imm | app), imm);
    drop(w);
    // A write through a description open before +i: refused, if not at
    // once (the kernel caches it without knowing the flag), then at its
    // writeback, which fsync reports; either way the file does not
    // change, and readers do not see the refused bytes.
    // (A reader open throughout reads the kernel's pages.)
    let reader = std::fs::File::open(&f).unwrap();
    if old.write_at(b"X", 0).is_ok() {
        eperm(old.sync_all(), "fsync of a write after +i");
    }
    drop(old);
    let want = b"before, cached";
    let read = || {
        let mut buf = vec![0; 64];
        let n = reader.read_at(&mut buf, 0).unwrap();
        buf.truncate(n);
        buf
    };
    let mut tries = 0;
    while read() != want && tries < 100 {
        std::thread::sleep(Duration::from_millis(20));
        tries += 1;
    }
    assert_eq!(read(), want);
    drop(reader);
    assert_eq!(std::fs::read(&f).unwrap(), want);
    let open_w = |append: bool| {
        std::fs::OpenOptions::new()
            .write(true)
            .append(append)
            .open(&f)
            .map(drop)
    };
    eperm(open_w(false), "open for writing");
    eperm(open_w(true), "open for appending");
    eperm(std::fs::remove_file(&f), "unlink");
    eperm(std::fs::rename(&f, m.path("g")), "rename");
    eperm(std::fs::hard_link(&f, m.path("h")), "link");
    eperm(
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)),
        "chmod",
    );
    std::fs::write(m.path("other"), b"x").unwrap();
    eperm(std::fs::rename(m.path("other"), &f), "rename over");
    assert_eq!(std::fs::read(&f).unwrap(), b"before, cached");

    m.remount("");
    assert_eq!(std::fs::read(&f).unwrap(), b"before, cached");
    assert_eq!(inode_flags(&f, None).unwrap() & (imm | app), imm);
    inode_flags(&f, Some(app)).unwrap();
    eperm(open_w(false), "open for writing, append-only");
    open_w(true).unwrap();
    let mut a = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
    a.write_all(b", appended").unwrap();
    a.sync_all().unwrap();
    drop(a);
    eperm(
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&f)
            .map(drop),
        "O_TRUNC, append-only",
    );
    eperm(std::fs::remove_file(&f), "unlink, append-only");
    assert_eq!(std::fs::read(&f).unwrap(), b"before, cached, appended");
    let past = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1000);
    eperm(
        std::fs::File::open(&f).unwrap().set_times(
            std::fs::FileTimes::new()
                .set_accessed(past)
                .set_modified(past),
        ),
        "utimes with times, append-only",
    );

    // A directory: +a takes new names, keeps old ones.
    let d = m.path("d");
    std::fs::create_dir(&d).unwrap();
    std::fs::write(d.join("old"), b"1").unwrap();
    // chattr moves the change time, and stat sees it at once (of a
    // directory: the kernel keeps a regular file's ctime as its own
    // while it caches writes, and does not move it for chattr).
    let ctime = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.ctime(), m.ctime_nsec())
    };
    let c0 = ctime(&d);
    std::thread::sleep(Duration::from_millis(50));
    inode_flags(&d, Some(app)).unwrap();
    assert!(ctime(&d) > c0, "ctime after chattr +a");
    std::fs::write(d.join("new"), b"2").unwrap();
    eperm(
        std::fs::remove_file(d.join("old")),
        "unlink in +a directory",
    );
    inode_flags(&d, Some(0)).unwrap();
    inode_flags(&f, Some(0)).unwrap();
    std::fs::remove_file(d.join("old")).unwrap();
    std::fs::remove_file(&f).unwrap();
    std::fs::write(m.path("nodump"), b"").unwrap();
    inode_flags(&m.path("nodump"), Some(foliofs::fs::FL_NODUMP)).unwrap();
    m.unmount_and_check();
    let out = run(Command::new(BIN).arg("stat").arg(&m.img).arg("/nodump"));
    assert!(out.contains(" flags d\n"), "foliofs stat: {out}");
}

/// chattr +S and +D, and the `sync` mount option (at mount and by
/// remount), through the mount:
/// what they make synchronous survives the daemon's death (SIGKILL: the
/// engine's memory and the kernel's cached writes are gone) while the
/// file is still open, so the write must have reached the engine and
/// been committed before it returned. New files take +S from their
/// directory; lsattr's letters in `foliofs stat`.
#[test]
fn synchronous_updates_through_the_mount() {
    if !fuse_ready(&[]) {
        return;
    }
    let (sync, dirsync) = (foliofs::fs::FL_SYNC, foliofs::fs::FL_DIRSYNC);
    let mut m = Mounted::new("syncflags", "");
    std::fs::create_dir(m.path("s")).unwrap();
    std::fs::create_dir(m.path("d")).unwrap();
    inode_flags(&m.path("s"), Some(sync)).unwrap();
    inode_flags(&m.path("d"), Some(dirsync)).unwrap();
    let mut f = std::fs::File::create(m.path("s/f")).unwrap();
    assert_eq!(inode_flags(&m.path("s/f"), None).unwrap() & sync, sync);
    f.write_all(b"synchronous").unwrap();
    // +D: the name is durable at once, the data is not.
    let mut g = std::fs::File::create(m.path("d/name")).unwrap();
    g.write_all(b"cached").unwrap();
    m.kill_daemon();
    drop((f, g));
    m.detach_dead();
    m.mount("");
    assert_eq!(std::fs::read(m.path("s/f")).unwrap(), b"synchronous");
    assert_eq!(std::fs::metadata(m.path("d/name")).unwrap().len(), 0);
    assert_eq!(inode_flags(&m.path("d"), None).unwrap(), dirsync);
    m.unmount_and_check();
    let out = run(Command::new(BIN).arg("stat").arg(&m.img).arg("/s/f"));
    assert!(out.contains(" flags S\n"), "foliofs stat: {out}");

    // -o sync: every write, through the kernel's cache too.
    m.mount("sync");
    let mut f = std::fs::File::create(m.path("t")).unwrap();
    f.write_all(b"written through").unwrap();
    m.kill_daemon();
    drop(f);
    m.detach_dead();
    m.mount("");
    assert_eq!(std::fs::read(m.path("t")).unwrap(), b"written through");

    // `mount -o remount,sync` (the helper, as mount(8) calls it) on a
    // live mount: the kernel's flag and the engine's change. mount(8)
    // finds the helper by the type the mount table shows.
    let fstype = run(Command::new("findmnt").args(["-no", "FSTYPE"]).arg(&m.dir));
    assert_eq!(fstype.trim(), "fuse.foliofs");
    let helper = m.dir.parent().unwrap().join("mount.fuse.foliofs");
    let _ = std::fs::remove_file(&helper);
    std::os::unix::fs::symlink(BIN, &helper).unwrap();
    // Remount with `opts`; whether the mount table shows sync after.
    let (img, dir) = (m.img.clone(), m.dir.clone());
    let remount = |opts: &str| {
        let out = Command::new(&helper)
            .arg(&img)
            .arg(&dir)
            .args(["-o", opts])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let shown = run(Command::new("findmnt").args(["-no", "OPTIONS"]).arg(&dir));
        shown.split(',').any(|o| o.trim() == "sync")
    };
    assert!(remount("remount,sync"));
    let mut f = std::fs::File::create(m.path("u")).unwrap();
    f.write_all(b"after remount,sync").unwrap();
    // The kernel alone would make only the write durable (by an fsync).
    std::fs::create_dir(m.path("v")).unwrap();
    m.kill_daemon();
    drop(f);
    m.detach_dead();
    m.mount("");
    assert_eq!(std::fs::read(m.path("u")).unwrap(), b"after remount,sync");
    assert!(m.path("v").is_dir(), "remount,sync: a mkdir was lost");
    m.unmount_and_check();
    // `mount -o remount,async` of a sync mount: mount(8) passes the
    // mount's options back without `sync` (and the kernel's own ones).
    m.mount("sync");
    assert!(!remount(
        "rw,relatime,remount,user_id=0,group_id=0,allow_other"
    ));
    let d = std::fs::File::open(&m.dir).unwrap();
    let mut mode = 0u32;
    // SAFETY: the command writes a u32 through the pointer.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&d),
            foliofs_fuse::FOLIOFS_IOC_GET_SYNC_MODE as _,
            &mut mode,
        )
    };
    assert_eq!((r, mode), (0, 0), "the engine is still sync");
    drop(d);
    m.unmount_and_check();
}

/// FS_IOC_SHUTDOWN (xfstests' godown) through the mount: the log is
/// flushed, later changes fail with EIO, and after umount and mount what
/// was fsynced is there and fsck is clean; a non-root caller is refused.
#[test]
fn shutdown_ioctl_through_the_mount() {
    if !fuse_ready(&[]) {
        return;
    }
    use std::os::fd::AsRawFd;
    let shutdown = |dir: &Path| {
        let d = std::fs::File::open(dir).unwrap();
        let mut flag: u32 = 1; // XFS_FSOP_GOING_FLAGS_LOGFLUSH
                               // SAFETY: the ioctl reads a u32 through the pointer.
        if unsafe { libc::ioctl(d.as_raw_fd(), 0x8004_587d, &mut flag) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    let mut m = Mounted::new("shutdown", "");
    let mut f = std::fs::File::create(m.path("kept")).unwrap();
    f.write_all(b"fsynced").unwrap();
    f.sync_all().unwrap();
    std::fs::create_dir(m.path("dir")).unwrap();
    let d = m.dir.display().to_string();
    let out = as_nobody(&format!(
        "python3 -c 'import fcntl,os; fcntl.ioctl(os.open(\"{d}\", os.O_RDONLY), 0x8004587d, b\"\\1\\0\\0\\0\")'"
    ));
    assert!(!out.status.success(), "a user shut the mount down");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Operation not permitted"));
    drop(f);
    shutdown(&m.dir).unwrap();
    let e = std::fs::write(m.path("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    run(Command::new("umount").arg(&m.dir));
    let st = m.child.take().unwrap().wait().unwrap();
    // The image is left for the next mount to replay, as after a crash.
    assert_eq!(st.code(), Some(32), "the daemon after a shutdown: {st}");
    // A read-only mount replays the journal into memory (xfstests 417,
    // 646): the image is left for the next read-write mount to replay.
    m.mount("ro");
    assert_eq!(std::fs::read(m.path("kept")).unwrap(), b"fsynced");
    assert!(m.path("dir").is_dir(), "the read-only mount lost a mkdir");
    run(Command::new("umount").arg(&m.dir));
    assert!(m.child.take().unwrap().wait().unwrap().success());
    m.mount("");
    assert_eq!(std::fs::read(m.path("kept")).unwrap(), b"fsynced");
    assert!(m.path("dir").is_dir(), "the flushed log lost a mkdir");
    m.unmount_and_check();
}

/// statx(2) with STATX_BTIME through `path`.
fn statx(path: &Path) -> libc::statx {
    // SAFETY: statx fills the struct it is given; the path is a C string.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            cstr(path).as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut sx,
        )
    };
    assert_eq!(r, 0, "statx: {}", std::io::Error::last_os_error());
    sx
}

/// The birth time reaches statx (FUSE_STATX): a file's stays when it is
/// written, survives a remount, and a device node's number comes through
/// statx's major and minor.
#[test]
fn statx_reports_the_birth_time() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("statx", "");
    let f = m.path("f");
    std::fs::write(&f, b"first").unwrap();
    let born = statx(&f);
    assert!(born.stx_mask & libc::STATX_BTIME != 0, "no birth time");
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(&f, b"second").unwrap();
    let sx = statx(&f);
    let t = |t: libc::statx_timestamp| (t.tv_sec, t.tv_nsec);
    assert_eq!(t(sx.stx_btime), t(born.stx_btime));
    assert!(t(sx.stx_mtime) > t(sx.stx_btime), "mtime not after birth");
    let dev = m.path("dev");
    // SAFETY: a valid path; 259:70000 needs the wide device number form.
    let r = unsafe {
        libc::mknod(
            cstr(&dev).as_ptr(),
            libc::S_IFCHR | 0o600,
            libc::makedev(259, 70000),
        )
    };
    assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
    let d = statx(&dev);
    assert_eq!((d.stx_rdev_major, d.stx_rdev_minor), (259, 70000));
    m.remount("");
    assert_eq!(t(statx(&f).stx_btime), t(born.stx_btime));
    m.unmount_and_check();
}

/// A loop device over an image file, detached when dropped.
struct Loop(String);

impl Loop {
    /// None (with a message) where loop devices cannot be made.
    fn new(img: &Path) -> Option<Loop> {
        let out = Command::new("losetup")
            .args(["-f", "--show", "--direct-io=on"])
            .arg(img)
            .output();
        match out {
            Ok(o) if o.status.success() => {
                Some(Loop(String::from_utf8_lossy(&o.stdout).trim().to_string()))
            }
            Ok(o) => {
                eprintln!(
                    "skipped: no loop device: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("skipped: losetup: {e}");
                None
            }
        }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// FIBMAP (filefrag's fallback; Linux asks the daemon on a block device
/// only): each of `file`'s blocks is on `dev` where the mapping says,
/// holding `data` (the file's contents, made durable).
fn check_fibmap(file: &Path, dev: &str, data: &[u8]) {
    let f = std::fs::File::open(file).unwrap();
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    let mut bsz: libc::c_int = 0;
    // SAFETY: FIGETBSZ writes one int.
    assert_eq!(unsafe { libc::ioctl(fd, 2, &mut bsz) }, 0, "FIGETBSZ");
    let bsz = bsz as usize;
    let mut devf = std::fs::File::open(dev).unwrap();
    let blocks = data.len().div_ceil(bsz);
    for b in [0, 1, 7, blocks / 2, blocks - 1] {
        let mut at = b as libc::c_int;
        // SAFETY: FIBMAP reads and writes one int.
        assert_eq!(unsafe { libc::ioctl(fd, 1, &mut at) }, 0, "FIBMAP");
        assert!(at > 0, "block {b} of {} maps to nothing", file.display());
        let mut got = vec![0u8; bsz];
        std::io::Seek::seek(&mut devf, std::io::SeekFrom::Start(at as u64 * bsz as u64)).unwrap();
        std::io::Read::read_exact(&mut devf, &mut got).unwrap();
        let want = &data[b * bsz..((b + 1) * bsz).min(data.len())];
        assert_eq!(&got[..want.len()], want, "block {b} at device block {at}");
    }
}

/// A block device mounted by root is a fuseblk mount: the kernel claims
/// the device (a second claim is refused) and passes syncfs(2) and
/// sync(1) on to the daemon (FUSE_SYNCFS), so what they covered survives
/// a killed daemon, as on a kernel file system, and FIBMAP finds the
/// file's blocks on the device. (On an image file, Linux
/// keeps sync from a FUSE server; `foliofs sync` is the way there.)
#[test]
fn sync_reaches_the_daemon_of_a_block_device_mount() {
    if !fuse_ready(&[]) || unsafe { libc::geteuid() } != 0 {
        return;
    }
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuse-fuseblk");
    let _ = Command::new("umount")
        .arg("-l")
        .arg(base.join("mnt"))
        .status();
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(base.join("mnt")).unwrap();
    let file = base.join("backing.img");
    std::fs::File::create(&file)
        .unwrap()
        .set_len(512 << 20)
        .unwrap();
    let Some(lo) = Loop::new(&file) else {
        return;
    };
    run(Command::new(BIN)
        .arg("mkfs")
        .arg(&lo.0)
        .stdout(Stdio::null()));
    let mut m = Mounted {
        img: PathBuf::from(&lo.0),
        dir: base.join("mnt"),
        child: None,
    };
    m.mount("");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        mountinfo
            .lines()
            .any(|l| l.contains(&format!(" - fuseblk.foliofs {} ", lo.0))),
        "not a fuseblk mount:\n{mountinfo}"
    );
    let busy = Command::new(BIN).arg("fsck").arg(&lo.0).output().unwrap();
    assert!(!busy.status.success(), "fsck opened a mounted device");
    let data: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    std::fs::write(m.path("synced"), &data).unwrap();
    std::fs::create_dir(m.path("dir")).unwrap();
    let d = std::fs::File::open(&m.dir).unwrap();
    // SAFETY: a valid open descriptor.
    assert_eq!(
        unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&d)) },
        0
    );
    drop(d);
    check_fibmap(&m.path("synced"), &lo.0, &data);
    m.kill_daemon();
    let _ = Command::new("umount").arg("-l").arg(&m.dir).status();
    m.mount("");
    assert_eq!(std::fs::read(m.path("synced")).unwrap(), data);
    assert!(m.path("dir").is_dir());
    m.unmount_and_check();
}

/// `foliofs stat --mount` is a page for people naming the transport the
/// mount really got (the rings whenever the kernel has them switched on
/// and the suite did not turn them off), `--json` for programs, and
/// `--watch` pages with rates over each interval; bad intervals are
/// refused.
#[test]
fn stat_mount_reads_as_a_status_page() {
    if !fuse_ready(&[]) {
        return;
    }
    let mut m = Mounted::new("status", "");
    std::fs::write(m.path("f"), vec![7u8; 3 << 20]).unwrap();
    let stat = |args: &[&str]| {
        Command::new(BIN)
            .args(["stat", "--mount"])
            .arg(&m.dir)
            .args(args)
            .output()
            .unwrap()
    };
    let page = run(Command::new(BIN).args(["stat", "--mount"]).arg(&m.dir));
    let rings_on = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
        .is_ok_and(|v| v.trim() == "Y")
        && !with_suite_options("").contains("io_uring=off");
    let want = if rings_on {
        "  transport    FUSE over io_uring"
    } else {
        "  transport    /dev/fuse"
    };
    assert!(page.contains(want), "want '{want}' in:\n{page}");
    for section in [
        "\nI/O ",
        "\ncache\n",
        "\nwriteback\n",
        "\njournal\n",
        "\nerrors\n",
    ] {
        assert!(page.contains(section), "{section:?} in:\n{page}");
    }
    assert!(
        page.lines()
            .any(|l| l.contains("written by programs") && l.contains("3.0 MiB")),
        "{page}"
    );
    let json: serde_json::Value = serde_json::from_str(&run(Command::new(BIN)
        .args(["stat", "--json", "--mount"])
        .arg(&m.dir)))
    .unwrap();
    assert_eq!(
        json["fuse_transport"],
        if rings_on { "io_uring" } else { "/dev/fuse" }
    );
    assert!(json["bytes_written_app"].as_u64().unwrap() >= 3 << 20);
    let out = stat(&["--watch", "0.2", "--count", "2"]);
    let pages = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{pages}");
    assert_eq!(pages.matches("foliofs on ").count(), 2, "{pages}");
    assert!(pages.contains("per second, last 0s"), "{pages}");
    for bad in [&["--watch", "0"][..], &["--count", "2"], &["--watch", "x"]] {
        let out = stat(bad);
        assert!(!out.status.success(), "{bad:?} accepted");
        assert!(!out.stderr.is_empty(), "{bad:?}: no message");
    }
    let out = Command::new(BIN)
        .args(["stat", "--mount", "/"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(8));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a foliofs mount root"));
    m.unmount_and_check();
}

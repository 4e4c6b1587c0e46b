//! foliofs mounted with FUSE, used by real programs: tar, git, sqlite3,
//! cp -a, fio (buffered and O_DIRECT, verify=crc32c), plus the namespace
//! through system calls, permissions as another user, the mount helper and
//! SIGTERM. Every test unmounts and runs fsck on the image afterwards.
//!
//! Needs /dev/fuse and root (mount(2)); without them the tests say so and
//! pass, unless FOLIOFS_REQUIRE_FUSE=1 (CI), where they fail.

use std::ffi::CString;
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
        if !opts.is_empty() {
            cmd.args(["-o", opts]);
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
    let st = nix_statvfs(&m.dir);
    assert!(st.0 > 0 && st.1 > 0 && st.1 <= st.0);
    let counters = run(Command::new(BIN).args(["stat", "--mount"]).arg(&m.dir));
    let v: serde_json::Value = serde_json::from_str(&counters).unwrap();
    assert!(v["bytes_written_app"].as_u64().unwrap() >= 12 + 8192);
    m.remount("");
    assert_eq!(std::fs::read(m.path("link")).unwrap(), b"hello, world");
    assert_eq!(std::fs::read_to_string(m.path("d/f0999")).unwrap(), "999");
    assert!(!m.path("sparse").exists());
    m.unmount_and_check();
}

/// (blocks, free blocks) of the file system at `dir`.
fn nix_statvfs(dir: &Path) -> (u64, u64) {
    let p = cstr(dir);
    // SAFETY: zeroed statvfs is a valid out-parameter.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: p is NUL-terminated, s is writable.
    assert_eq!(unsafe { libc::statvfs(p.as_ptr(), &mut s) }, 0);
    (s.f_blocks, s.f_bfree)
}

#[test]
fn tar_round_trip_of_a_source_tree() {
    if !fuse_ready(&["tar", "diff"]) {
        return;
    }
    let mut m = Mounted::new("tar", "");
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
    let counters = run(Command::new(BIN).args(["stat", "--mount"]).arg(&m.dir));
    let v: serde_json::Value = serde_json::from_str(&counters).unwrap();
    assert!(v["dio_reads"].as_u64().unwrap() > 0, "{counters}");
    assert!(v["dio_writes"].as_u64().unwrap() > 0, "{counters}");
    assert_eq!(v["csum_failures"].as_u64(), Some(0));
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

#[test]
fn permissions_for_another_user() {
    if !fuse_ready(&["runuser"]) {
        return;
    }
    let mut m = Mounted::new("perm", "allow_other");
    std::fs::set_permissions(&m.dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(m.path("rootfile"), b"secret").unwrap();
    std::fs::set_permissions(m.path("rootfile"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::create_dir(m.path("private")).unwrap();
    std::fs::set_permissions(m.path("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(m.path("private/x"), b"x").unwrap();
    let as_nobody = |script: &str| {
        Command::new("runuser")
            .args(["-u", "nobody", "--", "sh", "-c", script])
            .current_dir("/")
            .output()
            .unwrap()
    };
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

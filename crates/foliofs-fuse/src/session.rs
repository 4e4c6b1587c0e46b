//! The FUSE session of one mount: it makes the adapter and the parts it
//! shares with the request threads, mounts, and `serve`s until the file
//! system is unmounted. `serve` owns every request thread: the /dev/fuse
//! loops (fuser's), the io_uring rings (`uring`), the threads added while
//! the session runs (`threads::Spawn`), and the end of the session, when
//! no more are added and those added are joined before the file system
//! goes.
//!
//! A request travels: a /dev/fuse loop or a ring thread reads it, fuser
//! parses it and calls the `Filesystem` method of `FuseFs` (lib.rs), which
//! translates it for the engine, keeps the kernel's cache coherent
//! (`coherence`) and replies.

use crate::coherence::KernelCache;
use crate::space::SpaceGate;
use crate::threads::{Drops, SpawnSlot, Transport};
use crate::{uring, FuseFs, FuseOptions, MAX_WRITE};
use foliofs::Fs;
use fuser::{Config, RawDispatcher, SessionUnmounter};
use parking_lot::Mutex;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How the session serves requests.
#[derive(Clone, Copy, Debug)]
pub struct Serve {
    /// Threads serving /dev/fuse (`-o threads`).
    pub threads: usize,
    /// Serving threads per CPU queue over rings (`-o ring_depth`).
    pub ring_depth: usize,
    /// Replies to quick requests sent from SCHED_IDLE (`-o idle_reply`,
    /// `uring::IdleReply`).
    pub idle_reply: bool,
}

/// A mounted file system, not yet served.
pub struct Session {
    session: fuser::Session<FuseFs>,
    transport: Arc<Transport>,
    spawn: SpawnSlot,
    serve: Serve,
}

impl Session {
    /// Mount `fs` on `dir` with fuser's `config` (its mount options) and
    /// do the kernel's INIT: the adapter is made here, with what it
    /// shares with the request threads passed in.
    pub fn mount(
        fs: Arc<Fs>,
        dir: &Path,
        mut config: Config,
        o: FuseOptions,
        serve: Serve,
    ) -> io::Result<Session> {
        config.n_threads = Some(serve.threads);
        let queues = uring::possible_cpus().unwrap_or(1);
        let spawn = SpawnSlot::default();
        let drops = Arc::new(Drops::new(
            serve.threads,
            serve.ring_depth,
            queues,
            spawn.clone(),
        ));
        let transport = Arc::new(Transport::default());
        let t = transport.clone();
        // The adapter is made with the session's notifier, once the
        // session has its channel to the kernel.
        let session = fuser::Session::new_with_notifier(dir, &config, |notifier| {
            let writeback_cache = o.cache.writeback_cache;
            let kernel = KernelCache::new(writeback_cache, notifier.clone(), drops, t.clone());
            let floor = o.cache.cache_floor;
            let space = SpaceGate::new(fs.clone(), floor, Some(dir.to_path_buf()), notifier);
            FuseFs::new(fs, o, kernel, space, t)
        })?;
        Ok(Session {
            session,
            transport,
            spawn,
            serve,
        })
    }

    /// Whether the kernel agreed to FUSE over io_uring at INIT.
    pub fn over_rings(&self) -> bool {
        self.transport.rings()
    }

    /// What unmounts the file system from another thread (a signal's),
    /// which ends `serve`.
    pub fn unmounter(&mut self) -> SessionUnmounter {
        self.session.unmount_callable()
    }

    /// Serve requests until the file system is unmounted: the /dev/fuse
    /// loops, and the rings if the kernel agreed to them. Returns once
    /// every request thread has ended; the file system (`FuseFs`) is
    /// destroyed by then.
    pub fn serve(self) -> io::Result<()> {
        let Session {
            session,
            transport,
            spawn,
            serve,
        } = self;
        let rings = transport.rings();
        session.run_with_transport(|d| {
            let mut threads = Vec::new();
            let mut added = None;
            if rings {
                let payload = MAX_WRITE as usize + (64 << 10);
                let started = uring::start(
                    d.clone(),
                    serve.ring_depth,
                    payload,
                    serve.idle_reply,
                    transport.clone(),
                );
                match started {
                    Ok(t) => {
                        threads = t;
                        added = Some(Arc::new(AddedRings::new(d.clone(), transport, payload)));
                    }
                    Err(e) => log::error!("FUSE over io_uring: {e}; serving /dev/fuse only"),
                }
            }
            // More threads when the last free one would wait for the
            // kernel's writeback (`threads::Spawn`), until the session
            // ends: the closure holds the dispatcher, which holds the
            // file system.
            let loops = d.clone();
            let late = added.clone();
            spawn.set(Box::new(move |queue| match (queue, &late) {
                (Some(q), Some(rings)) => rings.spawn(q),
                // A /dev/fuse loop would not serve that queue.
                (Some(_), None) => false,
                (None, _) => loops.spawn_loop().is_ok(),
            }));
            match end_of_session(d, spawn.clone(), added) {
                Ok(t) => threads.push(t),
                Err(e) => {
                    log::warn!("no threads added on demand: {e}");
                    spawn.clear();
                }
            }
            threads
        })
    }
}

/// The thread that ends the session's additions: once the /dev/fuse
/// loops have ended it empties the spawn slot (which holds the
/// dispatcher, and so the file system) and joins the ring threads added.
fn end_of_session(
    d: RawDispatcher<FuseFs>,
    spawn: SpawnSlot,
    added: Option<Arc<AddedRings>>,
) -> io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("foliofs-spawn-end".into())
        .spawn(move || {
            d.wait_closed();
            spawn.clear();
            if let Some(rings) = added {
                rings.join();
            }
        })
}

/// Ring threads made while the session runs, for a queue whose threads
/// would all be busy otherwise (`KernelCache::kernel_drop`). `join` them
/// once the session has ended: none starts after.
struct AddedRings {
    d: RawDispatcher<FuseFs>,
    transport: Arc<Transport>,
    payload: usize,
    /// None once joined. Lock order: taken under `SpawnSlot`'s lock (a
    /// `Spawn` runs there); nothing is taken under it, and it is let go
    /// before waiting for the new thread's registration.
    threads: Mutex<Option<Vec<JoinHandle<()>>>>,
}

impl AddedRings {
    fn new(d: RawDispatcher<FuseFs>, transport: Arc<Transport>, payload: usize) -> Self {
        AddedRings {
            d,
            transport,
            payload,
            threads: Mutex::new(Some(Vec::new())),
        }
    }

    /// Start one more thread serving one more entry of queue `qid`; true
    /// once the entry is registered, so that the next request queued
    /// there finds it.
    fn spawn(&self, qid: usize) -> bool {
        let mut g = self.threads.lock();
        let Some(threads) = g.as_mut() else {
            return false;
        };
        let r = uring::add_thread(&self.d, &self.transport, qid, threads.len(), self.payload);
        let registered = match r {
            Ok((t, registered)) => {
                threads.push(t);
                registered
            }
            Err(e) => {
                log::warn!("FUSE ring {qid}: cannot add a thread: {e}");
                return false;
            }
        };
        drop(g);
        registered.recv_timeout(Duration::from_secs(1)).is_ok()
    }

    /// Join the threads started, once the session has ended (they end
    /// with it).
    fn join(&self) {
        let threads = self.threads.lock().take().unwrap_or_default();
        for t in threads {
            let _ = t.join();
        }
    }
}

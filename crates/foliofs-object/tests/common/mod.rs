//! What the object tests share: an in-memory store that asks a hook
//! before each PUT, to cut the store off or to run something at a chosen
//! moment of the protocol; a new image with a file system on it; a
//! manifest read back. (Each test file uses some of them.)
#![allow(dead_code)]

use async_trait::async_trait;
use foliofs::device::Device;
use foliofs::{Fs, MkfsOptions};
use foliofs_object::layout::{manifest_key, Manifest};
use foliofs_object::{InMemory, ObjectDevice, ObjectOptions, ObjectStore, Path};
use futures::stream::BoxStream;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, PutMultipartOptions,
    PutOptions, PutPayload, PutResult,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The images the tests make: 64 MiB, at `img`.
pub const SIZE: u64 = 64 << 20;

/// A new image at `img` with a file system on it, flushed, open for
/// writing with `opts`.
pub fn mkfs_with(store: Arc<dyn ObjectStore>, opts: ObjectOptions) -> Arc<ObjectDevice> {
    let dev = ObjectDevice::create(store, Path::from("img"), SIZE, opts).unwrap();
    foliofs::mkfs(&dev, &MkfsOptions::default(), |_, _| {}).unwrap();
    dev.flush().unwrap();
    Arc::new(dev)
}

/// Files `f{i}` for i in `files`, each written with `content(i)` and
/// fsynced.
pub fn write_files(fs: &Fs, files: std::ops::Range<usize>, content: fn(usize) -> Vec<u8>) {
    for i in files {
        let f = fs
            .create(fs.root_ino(), format!("f{i}").as_bytes(), 0o644, 0, 0)
            .unwrap();
        fs.write(f.ino, 0, &content(i)).unwrap();
        fs.fsync(f.ino, false).unwrap();
    }
}

/// Every file `f{i}` for i in `files` reads back as `content(i)`, and
/// fsck finds the image clean.
pub fn verify_files(
    dev: Arc<ObjectDevice>,
    files: std::ops::Range<usize>,
    content: fn(usize) -> Vec<u8>,
) {
    let fs = Fs::mount(dev.clone(), foliofs::MountOptions::default()).unwrap();
    for i in files {
        let a = fs
            .lookup(fs.root_ino(), format!("f{i}").as_bytes())
            .unwrap_or_else(|e| panic!("f{i}: {e}"));
        let want = content(i);
        let mut got = vec![0; want.len()];
        let n = fs.read(a.ino, 0, &mut got).unwrap();
        assert_eq!(n, want.len(), "f{i} length");
        assert!(got == want, "f{i} content");
    }
    fs.unmount().unwrap();
    let r = foliofs::fsck::fsck(dev, &Default::default(), |_, _| {}).unwrap();
    assert!(r.is_clean(), "fsck: {:?}", r.problems);
}

/// Checkpoints every 256 KiB of WAL, 8 MiB of chunks in memory.
pub fn small_checkpoints() -> ObjectOptions {
    ObjectOptions {
        checkpoint_bytes: 256 << 10,
        cache_bytes: 8 << 20,
        ..Default::default()
    }
}

/// Manifest `id` of the image at `img`.
pub fn manifest(store: &Arc<dyn ObjectStore>, id: u64) -> Manifest {
    let key = manifest_key(&Path::from("img"), id);
    futures::executor::block_on(async {
        let b = store.get(&key).await.unwrap().bytes().await.unwrap();
        Manifest::decode(&key, &b).unwrap()
    })
}

type Before = Box<dyn Fn(&Path) -> object_store::Result<()> + Send + Sync>;

/// `inner`, with `before` asked about every PUT (a whole object or a
/// multipart upload) before it reaches the store: an error fails it.
pub struct BeforePut {
    inner: Arc<InMemory>,
    before: Before,
}

impl BeforePut {
    pub fn new(
        inner: Arc<InMemory>,
        before: impl Fn(&Path) -> object_store::Result<()> + Send + Sync + 'static,
    ) -> BeforePut {
        BeforePut {
            inner,
            before: Box::new(before),
        }
    }
}

impl std::fmt::Debug for BeforePut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforePut")
    }
}

impl std::fmt::Display for BeforePut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforePut")
    }
}

#[async_trait]
impl ObjectStore for BeforePut {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        (self.before)(location)?;
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        (self.before)(location)?;
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        self.inner.get_opts(location, options).await
    }
    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        self.inner.delete(location).await
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy(from, to).await
    }
    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.inner.copy_if_not_exists(from, to).await
    }
}

/// A hook for `BeforePut` that lets `left` more PUTs through and fails
/// every one after (the machine cut off from the store, at any point of
/// the protocol).
pub fn cut(left: &AtomicU64) -> object_store::Result<()> {
    match left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        true => Ok(()),
        false => Err(object_store::Error::Generic {
            store: "cut",
            source: "the store is out of reach".into(),
        }),
    }
}

/// A store that `left` PUTs reach (all until it is set), then none
/// (`cut`): the store itself, to read what got there, and the hooked one
/// to write through.
pub fn cut_store() -> (Arc<InMemory>, Arc<AtomicU64>, Arc<BeforePut>) {
    let inner = Arc::new(InMemory::new());
    let left = Arc::new(AtomicU64::new(u64::MAX));
    let store = Arc::new(BeforePut::new(inner.clone(), {
        let left = left.clone();
        move |_| cut(&left)
    }));
    (inner, left, store)
}

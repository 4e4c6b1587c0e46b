//! foliofs-object: a foliofs image kept in S3-compatible object storage
//! (or any store the `object_store` crate reaches), as one more `Device`
//! for the engine. The engine, its format and its checksums are unchanged
//! above it; this crate keeps the async runtime and HTTP out of the
//! engine's.
//!
//! ```no_run
//! use foliofs_object::{open_url, ObjectDevice, ObjectOptions};
//! use std::sync::Arc;
//! let (store, prefix) = open_url("s3://bucket/images/db")?;
//! let dev = Arc::new(ObjectDevice::open(store, prefix, ObjectOptions::default())?);
//! let fs = foliofs::Fs::mount(dev.clone(), foliofs::MountOptions::default())?;
//! // ...
//! fs.unmount()?;
//! dev.close()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! A snapshot (`foliofs snapshot`, `take_snapshot`) opens read-only on
//! any machine while the writer goes on:
//!
//! ```no_run
//! use foliofs_object::{open_url, split_snapshot, ObjectDevice, ObjectOptions};
//! let (url, at) = split_snapshot("s3://bucket/images/db@42");
//! let (store, prefix) = open_url(url)?;
//! let opts = ObjectOptions { read_only: true, snapshot: at, ..Default::default() };
//! let dev = ObjectDevice::open(store, prefix, opts)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The object layout is in `layout`; the protocol (claim, fence, WAL,
//! checkpoint) in `device`; snapshots and the sweep of garbage in `keep`;
//! readers' leases in `lease`.

mod device;
pub mod keep;
pub mod layout;
pub mod lease;

pub use device::{holder, ObjectDevice, ObjectOptions, ObjectStats};
pub use keep::{collect_garbage, forget_snapshot, snapshots, take_snapshot, SnapshotInfo, Swept};
pub use lease::{leases, LeaseInfo};
pub use object_store::memory::InMemory;
pub use object_store::path::Path;
pub use object_store::ObjectStore;

use layout::{Damaged, Writer};
use std::sync::Arc;

/// Why an object image could not be made, opened or written.
#[derive(Debug)]
pub enum ObjectError {
    /// Another writer holds the image (its manifest names it).
    Held {
        key: String,
        writer: Writer,
        epoch: u64,
    },
    /// mkfs found an image already there.
    Exists {
        key: String,
    },
    /// No manifest under the prefix.
    NoImage {
        prefix: String,
    },
    /// No marker of this snapshot under the prefix.
    NoSnapshot {
        prefix: String,
        at: u64,
    },
    /// An object's bytes are not what they must be.
    Damaged(Damaged),
    /// Another writer claimed the image: this one writes nothing more.
    Fenced(String),
    /// The store refused or failed a request (after its retries).
    Store(object_store::Error),
    /// A URL or option that does not parse.
    Invalid(String),
    Io(std::io::Error),
    /// A WAL number this writer meant to create held its own earlier
    /// write (a PUT whose answer was lost): flush again.
    #[doc(hidden)]
    Retry,
}

impl std::fmt::Display for ObjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ObjectError::Held { key, writer, epoch } => write!(
                f,
                "the image is held by {writer} since {} (epoch {epoch}, {key}); \
                 mount with -o takeover if that writer is gone",
                humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(writer.since)
                )
            ),
            ObjectError::Exists { key } => {
                write!(f, "an image is already there ({key}); nothing was changed")
            }
            ObjectError::NoImage { prefix } => {
                write!(f, "no foliofs image under {prefix} (no manifest)")
            }
            ObjectError::NoSnapshot { prefix, at } => {
                write!(
                    f,
                    "no snapshot {at} under {prefix} (foliofs stat lists them)"
                )
            }
            ObjectError::Damaged(d) => write!(f, "{d}"),
            ObjectError::Fenced(why) => write!(f, "{why}"),
            ObjectError::Store(e) => write!(f, "object store: {e}"),
            ObjectError::Invalid(s) => write!(f, "{s}"),
            ObjectError::Io(e) => write!(f, "{e}"),
            ObjectError::Retry => write!(f, "flush again"),
        }
    }
}

impl std::error::Error for ObjectError {}

impl From<object_store::Error> for ObjectError {
    fn from(e: object_store::Error) -> Self {
        ObjectError::Store(e)
    }
}

impl From<Damaged> for ObjectError {
    fn from(d: Damaged) -> Self {
        ObjectError::Damaged(d)
    }
}

impl From<std::io::Error> for ObjectError {
    fn from(e: std::io::Error) -> Self {
        ObjectError::Io(e)
    }
}

impl From<ObjectError> for std::io::Error {
    fn from(e: ObjectError) -> Self {
        match e {
            ObjectError::Io(e) => e,
            e => std::io::Error::other(e.to_string()),
        }
    }
}

/// True if `s` names an object image (`s3://`, `gs://`, `az://`,
/// `file://` or `memory://`) rather than an image file.
pub fn is_url(s: &str) -> bool {
    [
        "s3://",
        "s3a://",
        "gs://",
        "az://",
        "abfs://",
        "file://",
        "memory://",
    ]
    .iter()
    .any(|p| s.starts_with(p))
}

/// A URL without its snapshot (`URL@N`), and the snapshot's number.
pub fn split_snapshot(url: &str) -> (&str, Option<u64>) {
    match url.rsplit_once('@') {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) => {
            match n.parse() {
                Ok(n) => (base, Some(n)),
                Err(_) => (url, None),
            }
        }
        _ => (url, None),
    }
}

/// The store and prefix a URL names. Endpoint and credentials come from
/// the standard variables (`AWS_ENDPOINT` or `AWS_ENDPOINT_URL`,
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_DEFAULT_REGION` or
/// `AWS_REGION`, `AWS_ALLOW_HTTP`); `file:///DIR/PREFIX` keeps the image
/// in a directory (a shared file system).
pub fn open_url(url: &str) -> Result<(Arc<dyn ObjectStore>, Path), ObjectError> {
    if let (_, Some(n)) = split_snapshot(url) {
        return Err(ObjectError::Invalid(format!(
            "{url}: names snapshot {n}: open the URL before the @ with ObjectOptions::snapshot"
        )));
    }
    let parsed = url::Url::parse(url)
        .map_err(|e| ObjectError::Invalid(format!("{url}: not a URL ({e})")))?;
    let bad = |why: &str| ObjectError::Invalid(format!("{url}: {why}"));
    let prefix = Path::from(parsed.path().trim_matches('/'));
    match parsed.scheme() {
        "s3" | "s3a" => {
            let bucket = parsed.host_str().ok_or_else(|| bad("no bucket"))?;
            let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
            if std::env::var_os("AWS_DEFAULT_REGION").is_none()
                && std::env::var_os("AWS_REGION").is_none()
            {
                b = b.with_region("us-east-1");
            }
            b = b.with_retry(object_store::RetryConfig {
                max_retries: 8,
                retry_timeout: std::time::Duration::from_secs(30),
                ..Default::default()
            });
            Ok((Arc::new(b.build()?), prefix))
        }
        "file" => {
            let dir = std::path::Path::new(parsed.path());
            std::fs::create_dir_all(dir)
                .map_err(|e| bad(&format!("cannot make {}: {e}", dir.display())))?;
            let fs = object_store::local::LocalFileSystem::new_with_prefix(dir)?;
            Ok((Arc::new(fs), Path::from("")))
        }
        "memory" => Ok((Arc::new(InMemory::new()), prefix)),
        other => Err(bad(&format!(
            "objects of {other}:// are not supported here"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::split_snapshot;

    #[test]
    fn snapshot_urls_split() {
        assert_eq!(split_snapshot("s3://b/img@42"), ("s3://b/img", Some(42)));
        assert_eq!(split_snapshot("s3://b/img"), ("s3://b/img", None));
        assert_eq!(split_snapshot("s3://b/im@g"), ("s3://b/im@g", None));
        assert_eq!(split_snapshot("s3://b/img@"), ("s3://b/img@", None));
        assert!(super::open_url("memory:///img@3").is_err());
    }
}

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
//! The object layout is in `layout`; the plain requests every part makes
//! (the newest manifest, the WAL numbers, a create-if-absent PUT) in
//! `store`; the protocol (claim, fence, WAL, checkpoint) in `device`;
//! snapshots and the sweep of garbage in `keep`; readers' leases in
//! `lease`; the cache directory and the local WAL in `local`.

mod aws_files;
mod device;
pub mod keep;
pub mod layout;
pub mod lease;
mod local;
mod logged;
mod markers;
mod pool;
mod readahead;
mod store;
mod timed;

pub use device::{holder, ObjectDevice, ObjectOptions, ObjectStats};
pub use keep::{collect_garbage, forget_snapshot, snapshots, take_snapshot, Swept};
pub use lease::{leases, LeaseInfo};
pub use local::{CacheUse, Durability};
pub use markers::SnapshotInfo;
pub use object_store::memory::InMemory;
pub use object_store::path::Path;
pub use object_store::ObjectStore;

use layout::{Damaged, Writer};
use object_store::ClientConfigKey;
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
            ObjectError::Store(e) => match s3_error(&e.to_string()) {
                Some(said) => write!(f, "object store: {said}"),
                None => write!(f, "object store: {e}"),
            },
            ObjectError::Invalid(s) => write!(f, "{s}"),
            ObjectError::Io(e) => write!(f, "{e}"),
            ObjectError::Retry => write!(f, "flush again"),
        }
    }
}

impl std::error::Error for ObjectError {}

/// What an S3 error answer inside a store error's text says
/// (`<Code>NoSuchBucket</Code><Message>...</Message>`), with what to
/// check: the server's words rather than the whole request.
fn s3_error(text: &str) -> Option<String> {
    // With no keys anywhere, object_store asks the EC2 instance metadata
    // service, and off EC2 its refusal is all the error says.
    if text.contains("169.254.169.254") {
        return Some(
            "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or put them \
             in ~/.aws/credentials (a profile chosen with -o profile=NAME or AWS_PROFILE), or \
             run where an instance role gives them (the instance metadata service did not \
             answer)"
                .into(),
        );
    }
    let tag = |name: &str| {
        let open = format!("<{name}>");
        let start = text.find(&open)? + open.len();
        let len = text[start..].find(&format!("</{name}>"))?;
        Some(&text[start..start + len])
    };
    let code = tag("Code")?;
    let hint = match code {
        "InvalidAccessKeyId" | "SignatureDoesNotMatch" | "AccessDenied" => {
            " (check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the ~/.aws/credentials \
             profile)"
        }
        "NoSuchBucket" => " (make the bucket first)",
        _ => "",
    };
    Some(format!("{code}: {}{hint}", tag("Message").unwrap_or("")))
}

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
    open_url_with(url, None)
}

/// `open_url`, an `s3://` URL's missing settings taken from the AWS
/// shared files' profile `profile` (else `AWS_PROFILE`, else `default`;
/// see `aws_files`).
pub fn open_url_with(
    url: &str,
    profile: Option<&str>,
) -> Result<(Arc<dyn ObjectStore>, Path), ObjectError> {
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
            // What the environment leaves unsaid, from the shared files.
            let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty());
            let p = aws_files::profile(profile)?;
            if !set("AWS_ACCESS_KEY_ID") {
                if let (Some(id), Some(secret)) = (p.access_key_id, p.secret_access_key) {
                    b = b.with_access_key_id(id).with_secret_access_key(secret);
                    if let Some(token) = p.session_token {
                        b = b.with_token(token);
                    }
                }
            }
            if !set("AWS_DEFAULT_REGION") && !set("AWS_REGION") {
                b = b.with_region(p.region.as_deref().unwrap_or("us-east-1"));
            }
            if !set("AWS_ENDPOINT") && !set("AWS_ENDPOINT_URL") {
                if let Some(endpoint) = p.endpoint_url {
                    // An http:// endpoint written down is meant.
                    if endpoint.starts_with("http://") && !set("AWS_ALLOW_HTTP") {
                        b = b.with_allow_http(true);
                    }
                    b = b.with_endpoint(endpoint);
                }
            }
            let b = b.with_retry(retry_config());
            let timeout = object_store::aws::AmazonS3ConfigKey::Client(ClientConfigKey::Timeout);
            let store = timed("S3", "AWS_TIMEOUT", b.clone().build()?, || {
                b.with_config(timeout, timed::LONG).build()
            })?;
            Ok((store, prefix))
        }
        // Credentials from GOOGLE_SERVICE_ACCOUNT (a key file) or
        // GOOGLE_APPLICATION_CREDENTIALS.
        "gs" => {
            let bucket = parsed.host_str().ok_or_else(|| bad("no bucket"))?;
            let b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(bucket)
                .with_retry(retry_config());
            let timeout = object_store::gcp::GoogleConfigKey::Client(ClientConfigKey::Timeout);
            let store = timed("GCS", "GOOGLE_TIMEOUT", b.clone().build()?, || {
                b.with_config(timeout, timed::LONG).build()
            })?;
            Ok((store, prefix))
        }
        // az://CONTAINER/PREFIX; the account and its key from
        // AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or the
        // other AZURE_* variables object_store reads).
        "az" | "abfs" => {
            let container = parsed.host_str().ok_or_else(|| bad("no container"))?;
            let b = object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_container_name(container)
                .with_retry(retry_config());
            let timeout = object_store::azure::AzureConfigKey::Client(ClientConfigKey::Timeout);
            let store = timed("Azure", "AZURE_TIMEOUT", b.clone().build()?, || {
                b.with_config(timeout, timed::LONG).build()
            })?;
            Ok((store, prefix))
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

/// `quick`, with large PUTs and GETs through the second client `long`
/// makes under deadlines sized to them (`timed`); as it is where the
/// user set the client's timeout (`var`).
fn timed<S: ObjectStore>(
    name: &'static str,
    var: &str,
    quick: S,
    long: impl FnOnce() -> object_store::Result<S>,
) -> Result<Arc<dyn ObjectStore>, ObjectError> {
    if std::env::var_os(var).is_some() {
        return Ok(Arc::new(quick));
    }
    Ok(Arc::new(timed::Timed::new(
        name,
        Arc::new(quick),
        Arc::new(long()?),
    )))
}

/// The mount options of an object image, as the CLI, /etc/fstab and the
/// C ABI take them.
pub const MOUNT_OPTIONS: &str =
    "takeover, cache_dir=DIR, cache_size=SIZE, durability=object|local, wal_lag_max=SIZE, \
     profile=NAME";

impl ObjectOptions {
    /// Take the mount option `k[=v]` if it is one of `MOUNT_OPTIONS`
    /// (false if it is not); a bad value is an error naming it.
    pub fn set(&mut self, k: &str, v: Option<&str>) -> Result<bool, String> {
        let size = |v: &str| foliofs::fs::parse_size(v).map_err(|e| format!("{k}={v}: {e}"));
        match (k, v) {
            ("takeover", None) => self.takeover = true,
            ("cache_dir", Some(d)) if !d.is_empty() => {
                self.cache_dir =
                    Some(std::path::absolute(d).map_err(|e| format!("cache_dir={d}: {e}"))?);
            }
            ("cache_size", Some(v)) => self.cache_size = size(v)?,
            ("wal_lag_max", Some(v)) => self.wal_lag_max = size(v)?,
            ("durability", Some(v)) => self.durability = v.parse()?,
            ("profile", Some(v)) if !v.is_empty() => self.profile = Some(v.to_string()),
            // For a new image only (`foliofs mkfs --chunk-size`, `bench
            // --object-options`): an image opened keeps its own.
            ("chunk_size", Some(v)) => self.chunk_bytes = size(v)?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Split the object image's options off a comma-separated list; the
    /// rest, in order, for the engine.
    pub fn take_from(&mut self, list: &str) -> Result<String, String> {
        let mut rest = Vec::new();
        for opt in list.split(',').filter(|s| !s.is_empty()) {
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            if !self.set(k, v)? {
                rest.push(opt);
            }
        }
        Ok(rest.join(","))
    }
}

/// How a request to the store is tried again: each rides out a server
/// restarting (SeaweedFS answers 500 for a second or two after it
/// listens), up to 16 tries over about 45 s, pauses doubling to 4 s. A
/// flush tries again beyond that (`ObjectOptions::retry`). 503 SlowDown
/// and other 5xx are retried; 4xx are not.
fn retry_config() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 16,
        retry_timeout: std::time::Duration::from_secs(60),
        backoff: object_store::BackoffConfig {
            init_backoff: std::time::Duration::from_millis(100),
            max_backoff: std::time::Duration::from_secs(4),
            base: 2.0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::split_snapshot;

    #[test]
    fn an_s3_error_answer_is_told_in_its_own_words() {
        let text = "Error performing GET http://h/b?list-type=2 in 1ms - Server returned \
                    non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?><Error>\
                    <Code>NoSuchBucket</Code><Message>The specified bucket does not \
                    exist</Message></Error>";
        assert_eq!(
            super::s3_error(text).unwrap(),
            "NoSuchBucket: The specified bucket does not exist (make the bucket first)"
        );
        assert_eq!(super::s3_error("connection refused"), None);
        let imds =
            "Generic S3 error: Error performing PUT http://169.254.169.254/latest/api/token \
                    in 2ms - Server returned non-2xx status code: 403 Forbidden";
        assert!(super::s3_error(imds)
            .unwrap()
            .starts_with("no AWS credentials"));
    }

    #[test]
    fn every_scheme_parses_and_a_missing_account_is_named() {
        assert!(matches!(
            super::open_url("ftp://x/y"),
            Err(super::ObjectError::Invalid(_))
        ));
        assert!(matches!(
            super::open_url("not a url"),
            Err(super::ObjectError::Invalid(_))
        ));
        // Without an account the Azure builder says what is missing.
        if std::env::var_os("AZURE_STORAGE_ACCOUNT_NAME").is_none() {
            let e = super::open_url("az://container/img").expect_err("no account");
            assert!(e.to_string().to_lowercase().contains("account"), "{e}");
        }
        assert!(super::open_url("memory:///img").is_ok());
    }

    #[test]
    fn object_options_split_off_the_engines() {
        let mut o = super::ObjectOptions::default();
        let rest = o
            .take_from("ro,takeover,cache_dir=/c,cache_size=2G,durability=local,sync")
            .unwrap();
        assert_eq!(rest, "ro,sync");
        assert!(o.takeover);
        assert_eq!(o.cache_dir.as_deref(), Some(std::path::Path::new("/c")));
        assert_eq!(o.cache_size, 2 << 30);
        assert_eq!(o.durability, super::Durability::Local);
        assert!(o.take_from("durability=often").is_err());
        assert!(o.take_from("wal_lag_max=lots").is_err());
    }

    #[test]
    fn snapshot_urls_split() {
        assert_eq!(split_snapshot("s3://b/img@42"), ("s3://b/img", Some(42)));
        assert_eq!(split_snapshot("s3://b/img"), ("s3://b/img", None));
        assert_eq!(split_snapshot("s3://b/im@g"), ("s3://b/im@g", None));
        assert_eq!(split_snapshot("s3://b/img@"), ("s3://b/img@", None));
        assert!(super::open_url("memory:///img@3").is_err());
    }
}

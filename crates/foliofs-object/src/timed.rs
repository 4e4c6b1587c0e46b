//! Deadlines sized to what a request carries.
//!
//! object_store's HTTP client gives every request 30 s from connecting
//! to the end of its body, AWS's advice for latency-sensitive requests.
//! An object image PUTs WAL objects of up to 128 MiB (twice
//! `pending_bytes`) and chunk objects eight at a time: over a link slower
//! than about 35 Mbit/s such a PUT never finished within the bound, every
//! try timed out after sending most of it, the flush failed once its
//! retries ran out, and the file system shut down (measured through a
//! 1.5 MB/s proxy: 100 MiB of scattered writes, fsync EIO after 7
//! minutes). A fast link and a dead server are told apart by how long
//! the bytes take, not by one bound for all.
//!
//! `Timed` sends small requests through the client as configured. A PUT
//! of more than `SMALL_PUT` goes through a second client without the
//! 30 s bound, under a deadline of `BASE` plus, at `FLOOR_RATE`, the
//! bytes of every large PUT in flight when it starts, its own included:
//! they share the link (a flush's eight 4 MiB chunks: 286 s each; a
//! 128 MiB WAL object alone: 17.6 min). A GET goes
//! through the second client too: its answer must begin within `BASE`,
//! and its body may take as long as it keeps arriving, failing after
//! `BASE` without a byte (one timer per body, moved at most once a
//! second, not one per piece). A deadline missed is a passing failure, tried
//! again like a connection refused. Where the user set the client's
//! timeout (`AWS_TIMEOUT`, `GOOGLE_TIMEOUT`, `AZURE_TIMEOUT`), both
//! clients keep it.

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What every request may take before its bytes count: the client's own
/// bound, and the longest a GET's body may pause.
pub(crate) const BASE: Duration = Duration::from_secs(30);
/// The slowest the large PUTs in flight may go together (1 Mbit/s).
const FLOOR_RATE: u64 = 128 << 10;
/// PUTs up to this size keep the client's own bound (manifests, fences,
/// leases, markers, the WAL of a small flush).
const SMALL_PUT: usize = 1 << 20;
/// The second client's bound, which the deadlines above stay within.
pub(crate) const LONG: &str = "24h";

/// A store's requests under deadlines sized to them (see the module).
#[derive(Debug)]
pub(crate) struct Timed {
    name: &'static str,
    /// The client as configured (30 s for every request).
    quick: Arc<dyn ObjectStore>,
    /// The same store through a client bounded at `LONG`.
    long: Arc<dyn ObjectStore>,
    /// Bytes of the large PUTs in flight.
    sending: AtomicU64,
}

impl Timed {
    pub(crate) fn new(
        name: &'static str,
        quick: Arc<dyn ObjectStore>,
        long: Arc<dyn ObjectStore>,
    ) -> Timed {
        Timed {
            name,
            quick,
            long,
            sending: AtomicU64::new(0),
        }
    }

    fn late(&self, what: String) -> object_store::Error {
        object_store::Error::Generic {
            store: self.name,
            source: what.into(),
        }
    }
}

/// The deadline of a PUT that starts with `sending` bytes of large PUTs
/// in flight, its own included.
fn put_deadline(sending: u64) -> Duration {
    BASE + Duration::from_secs(sending / FLOOR_RATE)
}

/// A large PUT's bytes, counted in `Timed::sending` while it lasts.
struct Sending<'a>(&'a AtomicU64, u64);

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::Relaxed);
    }
}

impl std::fmt::Display for Timed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.quick)
    }
}

#[async_trait]
impl ObjectStore for Timed {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let n = payload.content_length();
        if n <= SMALL_PUT {
            return self.quick.put_opts(location, payload, opts).await;
        }
        let n64 = n as u64;
        let deadline = put_deadline(self.sending.fetch_add(n64, Ordering::Relaxed) + n64);
        let _counted = Sending(&self.sending, n64);
        tokio::time::timeout(deadline, self.long.put_opts(location, payload, opts))
            .await
            .unwrap_or_else(|_| {
                Err(self.late(format!(
                    "PUT {location}: {} MiB not sent within {deadline:?} (the link to the \
                     store is slower than {} KiB/s for what is in flight, or the store \
                     stopped answering)",
                    n >> 20,
                    FLOOR_RATE >> 10
                )))
            })
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.quick.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let mut r = tokio::time::timeout(BASE, self.long.get_opts(location, options))
            .await
            .unwrap_or_else(|_| {
                Err(self.late(format!("GET {location}: no answer within {BASE:?}")))
            })?;
        if let GetResultPayload::Stream(body) = r.payload {
            r.payload = GetResultPayload::Stream(paced(self.name, location.clone(), body, BASE));
        }
        Ok(r)
    }

    async fn delete(&self, location: &Path) -> object_store::Result<()> {
        self.quick.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.quick.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.quick.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.quick.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> object_store::Result<()> {
        self.quick.copy_if_not_exists(from, to).await
    }
}

/// `body`, failing once `bound` passes without a byte of it.
fn paced(
    name: &'static str,
    location: Path,
    body: BoxStream<'static, object_store::Result<bytes::Bytes>>,
    bound: Duration,
) -> BoxStream<'static, object_store::Result<bytes::Bytes>> {
    Paced {
        name,
        location,
        body: Some(body),
        bound,
        idle: Box::pin(tokio::time::sleep(bound)),
        armed: tokio::time::Instant::now(),
    }
    .boxed()
}

/// A GET's body under an idle bound (see `paced`).
struct Paced {
    name: &'static str,
    location: Path,
    /// None once the bound has failed it.
    body: Option<BoxStream<'static, object_store::Result<bytes::Bytes>>>,
    bound: Duration,
    idle: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// When `idle` was last set, `bound` before it fires.
    armed: tokio::time::Instant,
}

impl futures::Stream for Paced {
    type Item = object_store::Result<bytes::Bytes>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::future::Future;
        use std::task::Poll;
        let this = &mut *self;
        let Some(body) = this.body.as_mut() else {
            return Poll::Ready(None);
        };
        match body.poll_next_unpin(cx) {
            Poll::Ready(item) => {
                // The timer moves once a thirtieth of the bound has
                // passed (a second of 30), not for every piece.
                let now = tokio::time::Instant::now();
                if now.duration_since(this.armed) > this.bound / 30 {
                    this.armed = now;
                    this.idle.as_mut().reset(now + this.bound);
                }
                Poll::Ready(item)
            }
            Poll::Pending => match this.idle.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.body = None;
                    Poll::Ready(Some(Err(object_store::Error::Generic {
                        store: this.name,
                        source: format!(
                            "GET {}: no byte of its body for {:?}",
                            this.location, this.bound
                        )
                        .into(),
                    })))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_put_may_take_what_is_in_flight_at_the_floor_rate() {
        assert_eq!(put_deadline(4 << 20), Duration::from_secs(62));
        assert_eq!(put_deadline(32 << 20), Duration::from_secs(286));
        assert_eq!(put_deadline(128 << 20), Duration::from_secs(30 + 1024));
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
    }

    #[test]
    fn a_body_that_keeps_coming_may_take_longer_than_its_idle_bound() {
        let bound = Duration::from_millis(60);
        let pieces = futures::stream::unfold(0, |n| async move {
            if n == 20 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
            Some((Ok(bytes::Bytes::from(vec![n as u8; 10])), n + 1))
        })
        .boxed();
        let got: Vec<_> = runtime().block_on(async {
            paced("test", Path::from("k"), pieces, bound)
                .collect::<Vec<_>>()
                .await
        });
        assert_eq!(got.len(), 20, "300 ms of pieces under a 60 ms bound");
        assert!(got.iter().all(|r| r.is_ok()));
    }

    #[test]
    fn a_body_that_stops_fails_after_its_idle_bound() {
        let bound = Duration::from_millis(60);
        let stalls = futures::stream::once(async { Ok(bytes::Bytes::from_static(b"first")) })
            .chain(futures::stream::pending())
            .boxed();
        let t = std::time::Instant::now();
        let got: Vec<_> = runtime().block_on(async {
            paced("test", Path::from("k"), stalls, bound)
                .collect::<Vec<_>>()
                .await
        });
        assert_eq!(got.len(), 2, "the piece, then the error, then the end");
        assert!(got[0].is_ok());
        let e = got[1].as_ref().unwrap_err().to_string();
        assert!(e.contains("no byte of its body"), "{e}");
        assert!(t.elapsed() >= bound);
    }
}

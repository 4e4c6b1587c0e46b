//! The engine's books: counters of pinned, reserved, cached and in-flight
//! things, each decremented only through `take`, which stops a debug build
//! at the first entry that would go below zero (naming the book), instead
//! of letting it wrap into an enormous count that fails far away.

use std::fmt::Display;
use std::ops::SubAssign;

/// Take `n` from book `what` (`c`), which must hold at least `n`.
#[track_caller]
pub(crate) fn take<T: Copy + PartialOrd + SubAssign + Display>(c: &mut T, n: T, what: &str) {
    debug_assert!(*c >= n, "{what}: taking {n} from {c}");
    *c -= n;
}

/// Take `n` from book `what`, stopping at zero in a release build where a
/// shortfall is tolerated (the count is an estimate); a debug build still
/// stops at it.
#[track_caller]
pub(crate) fn take_clamped(c: &mut u64, n: u64, what: &str) {
    debug_assert!(*c >= n, "{what}: taking {n} from {c}");
    *c = c.saturating_sub(n);
}

/// When a cache past its limit next walks its entries to shrink: at the
/// limit, or, after a walk that had to keep most of them (dirty, changed,
/// open: pinned), `margin` past what it kept, so that each walk is paid
/// for by that many insertions rather than by the next one. The metadata
/// cache, the inodes in memory and the page cache each keep one.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ScanFloor {
    next: u64,
}

impl ScanFloor {
    pub(crate) fn new(limit: u64) -> Self {
        ScanFloor { next: limit }
    }

    /// Whether a cache that would hold `after` must walk first.
    pub(crate) fn due(&self, after: u64) -> bool {
        after > self.next
    }

    /// A walk left `left` in a cache of `limit`: the next is due past the
    /// limit, or past `margin` more than it left.
    pub(crate) fn walked(&mut self, limit: u64, left: u64, margin: u64) {
        self.next = limit.max(left + margin);
    }
}

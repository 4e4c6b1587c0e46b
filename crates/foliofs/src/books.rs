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

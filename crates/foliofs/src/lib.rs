//! foliofs: a userspace file system engine.

pub mod device;
pub mod error;
pub mod format;

pub use error::{Error, Result};

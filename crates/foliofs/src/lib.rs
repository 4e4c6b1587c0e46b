//! foliofs: a userspace file system engine.
//!
//! ```no_run
//! use foliofs::{device::FileDevice, Fs, MkfsOptions, MountOptions};
//! use std::sync::Arc;
//! let dev = Arc::new(FileDevice::open("fs.img".as_ref(), true)?);
//! foliofs::mkfs(&*dev, &MkfsOptions::default(), |_, _| {})?;
//! let fs = Fs::mount(dev, MountOptions::default())?;
//! let f = fs.create(fs.root_ino(), b"hello", 0o644, 0, 0)?;
//! fs.write(f.ino, 0, b"hello, world")?;
//! fs.fsync(f.ino, false)?;
//! fs.unmount()?;
//! # Ok::<(), foliofs::Error>(())
//! ```

pub mod alloc;
pub(crate) mod books;
pub mod btree;
pub mod csums;
pub mod device;
pub mod error;
pub mod format;
pub mod fs;
pub mod fsck;
pub mod geometry;
pub mod meta;
mod runs;
pub mod torture;
mod u64map;

pub use error::{Error, Result};

pub use fs::{mkfs, DioLock, Fs, MkfsOptions, MountOptions};

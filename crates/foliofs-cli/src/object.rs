//! Images in object storage (`s3://BUCKET/PREFIX`, `file:///DIR`): the
//! CLI's way to the `foliofs-object` device, with its errors for people.

use anyhow::{anyhow, Result};
use foliofs_object::{open_url, ObjectDevice, ObjectError, ObjectOptions};
use std::path::Path;

/// The URL an image argument names, if it names an object image.
pub(crate) fn url_of(image: &Path) -> Option<&str> {
    image.to_str().filter(|s| foliofs_object::is_url(s))
}

fn for_people(url: &str, e: ObjectError) -> anyhow::Error {
    anyhow!("{url}: {e}")
}

/// Make a new image of `size` bytes at `url` (never over an existing one).
pub(crate) fn create(url: &str, size: u64) -> Result<ObjectDevice> {
    let (store, prefix) = open_url(url).map_err(|e| for_people(url, e))?;
    ObjectDevice::create(store, prefix, size, ObjectOptions::default())
        .map_err(|e| for_people(url, e))
}

/// Open the image at `url`: read-only without claiming it, or claimed for
/// writing (refused while its manifest names a writer, unless `takeover`).
pub(crate) fn open(
    url: &str,
    read_only: bool,
    takeover: bool,
    mount_point: Option<&Path>,
) -> Result<ObjectDevice> {
    let (store, prefix) = open_url(url).map_err(|e| for_people(url, e))?;
    let opts = ObjectOptions {
        read_only,
        takeover,
        mount_point: mount_point.map(|p| p.display().to_string()),
        ..Default::default()
    };
    ObjectDevice::open(store, prefix, opts).map_err(|e| for_people(url, e))
}

/// `foliofs umount` of an object image: wait until the daemon's close
/// has written a manifest that names no writer (clean), or its process
/// is gone (not clean: the next mount needs takeover and replays).
pub(crate) fn wait_closed(url: &str, wait: std::time::Duration) -> Result<bool> {
    let (store, prefix) = open_url(url).map_err(|e| for_people(url, e))?;
    let until = std::time::Instant::now() + wait;
    loop {
        let (writer, _) =
            foliofs_object::holder(store.clone(), &prefix).map_err(|e| for_people(url, e))?;
        let Some(w) = writer else {
            return Ok(true);
        };
        // SAFETY: kill with signal 0 only checks that the process exists.
        let alive = unsafe { libc::kill(w.pid as i32, 0) } == 0;
        if !alive || std::time::Instant::now() > until {
            return Ok(false);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

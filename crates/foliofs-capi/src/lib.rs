//! The C ABI of the foliofs engine (`include/foliofs.h`): mount an image,
//! open files by path, pread/pwrite (buffered or O_DIRECT, O_APPEND),
//! fsync, fallocate, directory listings, links, attributes, inode flags,
//! extended attributes, statfs and shutdown.
//!
//! Every function returns 0 or a count on success and a negative errno on
//! failure, with the message kept per thread for `foliofs_last_error`.
//! No Rust panic crosses the boundary: one becomes -EIO.

use foliofs::device::FileDevice;
use foliofs::fs::{listing, Attr, Falloc, FileType, OpenFile, SetAttr, TimeSet, Timespec};
use foliofs::{Error, Fs, MkfsOptions, MountOptions};
use foliofs_object::{ObjectDevice, ObjectError, ObjectOptions};
use parking_lot::RwLock;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// A failure: its errno and message.
struct Fail(i32, String);

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail(e.errno(), e.to_string())
    }
}

fn fail(errno: i32, msg: impl Into<String>) -> Fail {
    Fail(errno, msg.into())
}

/// Run `f`, turning an error or a panic into a negative errno.
fn call(f: impl FnOnce() -> Result<i64, Fail>) -> i64 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(n)) => n,
        Ok(Err(Fail(errno, msg))) => {
            set_error(msg);
            -(errno as i64)
        }
        Err(_) => {
            set_error("foliofs panicked; the file system may need fsck".into());
            -(libc::EIO as i64)
        }
    }
}

fn call_int(f: impl FnOnce() -> Result<i64, Fail>) -> c_int {
    call(f) as c_int
}

/// # Safety
/// `p` is NULL or a NUL-terminated string.
unsafe fn cstr<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(fail(libc::EINVAL, format!("{what} is NULL")));
    }
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| fail(libc::EINVAL, format!("{what} is not UTF-8")))
}

struct Handle {
    file: OpenFile,
    direct: bool,
    writable: bool,
    /// O_APPEND: every write goes to the end of the file.
    append: bool,
}

/// A mounted file system and its open files.
pub struct Foliofs {
    fs: Fs,
    handles: RwLock<HashMap<i64, Arc<Handle>>>,
    next: AtomicI64,
    /// An object image's device, closed after the unmount.
    object: Option<Arc<ObjectDevice>>,
}

/// An object store's error as a failure: EBUSY while another writer
/// holds the image, EEXIST for mkfs over one, ENOENT where there is none,
/// EINVAL for a URL or option that does not parse, EIO otherwise.
fn object_fail(url: &str, e: ObjectError) -> Fail {
    let errno = match &e {
        ObjectError::Held { .. } => libc::EBUSY,
        ObjectError::Exists { .. } => libc::EEXIST,
        ObjectError::NoImage { .. } | ObjectError::NoSnapshot { .. } => libc::ENOENT,
        ObjectError::Invalid(_) => libc::EINVAL,
        _ => libc::EIO,
    };
    fail(errno, format!("{url}: {e}"))
}

/// The device an object image URL names (`URL@N`: snapshot N, read-only).
fn open_object(url: &str, opts: ObjectOptions) -> Result<Arc<ObjectDevice>, Fail> {
    let (base, snapshot) = foliofs_object::split_snapshot(url);
    let (store, prefix) = foliofs_object::open_url_with(base, opts.profile.as_deref())
        .map_err(|e| object_fail(url, e))?;
    let opts = ObjectOptions { snapshot, ..opts };
    let dev = ObjectDevice::open(store, prefix, opts).map_err(|e| object_fail(url, e))?;
    Ok(Arc::new(dev))
}

impl Foliofs {
    fn handle(&self, fh: i64) -> Result<Arc<Handle>, Fail> {
        self.handles
            .read()
            .get(&fh)
            .cloned()
            .ok_or_else(|| fail(libc::EBADF, format!("no open file handle {fh}")))
    }

    /// `handle`, refused unless it was opened for writing.
    fn writable(&self, fh: i64) -> Result<Arc<Handle>, Fail> {
        let h = self.handle(fh)?;
        if !h.writable {
            return Err(fail(
                libc::EBADF,
                format!("handle {fh} is not open for writing"),
            ));
        }
        Ok(h)
    }

    /// The parent directory's inode and the last name of `path`.
    fn parent<'p>(&self, path: &'p str) -> Result<(u64, &'p str), Fail> {
        let path = path.trim_end_matches('/');
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        if name.is_empty() || name == "." || name == ".." {
            return Err(fail(libc::EINVAL, format!("{path:?} names no file")));
        }
        Ok((self.fs.resolve(dir)?, name))
    }
}

/// # Safety
/// `fs` is NULL or a pointer from `foliofs_mount` not yet unmounted.
unsafe fn get<'a>(fs: *mut Foliofs) -> Result<&'a Foliofs, Fail> {
    // SAFETY: the caller passes a live handle or NULL.
    unsafe { fs.as_ref() }.ok_or_else(|| fail(libc::EINVAL, "file system handle is NULL"))
}

/// Run `op` on the inode `path` names, with the file system and the path
/// (for messages); its result as `call` gives it.
///
/// # Safety
/// `fs` is NULL or live; `path` is NULL or a NUL-terminated string.
unsafe fn at_path(
    fs: *mut Foliofs,
    path: *const c_char,
    op: impl FnOnce(&Foliofs, u64, &str) -> Result<i64, Fail>,
) -> i64 {
    call(|| {
        // SAFETY: per the contract above.
        let (f, path) = unsafe { (get(fs)?, cstr(path, "path")?) };
        op(f, f.fs.resolve(path)?, path)
    })
}

fn stat_of(a: &Attr) -> FoliofsStat {
    let ts = |(sec, nsec): (i64, u32)| FoliofsTime { sec, nsec };
    FoliofsStat {
        ino: a.ino,
        size: a.size,
        allocated: a.allocated,
        mode: a.kind.mode_bits() | a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        flags: a.flags,
        rdev: a.rdev,
        atime: ts(a.atime),
        mtime: ts(a.mtime),
        ctime: ts(a.ctime),
        btime: ts(a.crtime),
    }
}

/// `struct foliofs_time`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct FoliofsTime {
    pub sec: i64,
    pub nsec: u32,
}

/// `struct foliofs_stat`.
#[repr(C)]
#[derive(Default)]
pub struct FoliofsStat {
    pub ino: u64,
    pub size: u64,
    pub allocated: u64,
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub flags: u32,
    pub rdev: u32,
    pub atime: FoliofsTime,
    pub mtime: FoliofsTime,
    pub ctime: FoliofsTime,
    pub btime: FoliofsTime,
}

/// `struct foliofs_statfs`.
#[repr(C)]
#[derive(Default)]
pub struct FoliofsStatfs {
    pub block_size: u32,
    pub name_max: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub blocks_avail: u64,
    pub files: u64,
    pub files_free: u64,
}

/// Copy `bytes` to the caller's `buf` of `len` bytes when they fit (a
/// call with `len` 0 asks for the size): the size either way, or ERANGE
/// when `len` is too small, as getxattr(2) and listxattr(2) do.
///
/// # Safety
/// `buf` holds `len` writable bytes, or `len` is 0.
unsafe fn copy_out(bytes: &[u8], buf: *mut c_void, len: usize) -> Result<i64, Fail> {
    if len == 0 {
        return Ok(bytes.len() as i64);
    }
    if len < bytes.len() {
        return Err(fail(
            libc::ERANGE,
            format!("{} bytes do not fit a {len}-byte buffer", bytes.len()),
        ));
    }
    if buf.is_null() {
        return Err(fail(libc::EFAULT, "buffer is NULL"));
    }
    // SAFETY: the caller gives `len` writable bytes at `buf`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len()) };
    Ok(bytes.len() as i64)
}

/// # Safety
/// `image` is a NUL-terminated path.
#[no_mangle]
pub unsafe extern "C" fn foliofs_mkfs(image: *const c_char, size: u64, force: c_int) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let name = unsafe { cstr(image, "image") }?;
        if foliofs_object::is_url(name) {
            if size == 0 {
                return Err(fail(
                    libc::EINVAL,
                    format!("{name}: a new object image needs a size"),
                ));
            }
            let (store, prefix) =
                foliofs_object::open_url(name).map_err(|e| object_fail(name, e))?;
            let dev = ObjectDevice::create(store, prefix, size, ObjectOptions::default())
                .map_err(|e| object_fail(name, e))?;
            foliofs::mkfs(&dev, &MkfsOptions::default(), |_, _| {})?;
            dev.close()
                .map_err(|e| fail(libc::EIO, format!("{name}: {e}")))?;
            return Ok(0);
        }
        let path = Path::new(name);
        let dev = match foliofs::fs::open_for_mkfs(path, (size > 0).then_some(size), force != 0) {
            Err(Error::Exists) => {
                return Err(fail(
                    libc::EEXIST,
                    format!("{} already holds a foliofs file system", path.display()),
                ))
            }
            r => r?,
        };
        foliofs::mkfs(&dev, &MkfsOptions::default(), |_, _| {})?;
        Ok(0)
    })
}

/// # Safety
/// `image` is a NUL-terminated path; `options` is NULL or a NUL-terminated
/// string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_mount(
    image: *const c_char,
    options: *const c_char,
) -> *mut Foliofs {
    let mut out = std::ptr::null_mut();
    call(|| {
        // SAFETY: per the contract above.
        let name = unsafe { cstr(image, "image") }?;
        let list = if options.is_null() {
            ""
        } else {
            // SAFETY: per the contract above.
            unsafe { cstr(options, "options") }?
        };
        // An object image's own options (takeover, cache_dir, ...) first.
        let mut object_opts = ObjectOptions::default();
        let list = match foliofs_object::is_url(name) {
            true => object_opts
                .take_from(list)
                .map_err(|e| fail(libc::EINVAL, e))?,
            false => list.to_string(),
        };
        let opts = MountOptions::parse(&list).map_err(|e| fail(libc::EINVAL, e))?;
        let (dev, object): (Arc<dyn foliofs::device::Device>, _) = if foliofs_object::is_url(name) {
            object_opts.read_only = opts.read_only;
            let d = open_object(name, object_opts)?;
            (d.clone(), Some(d))
        } else {
            let d = FileDevice::open(Path::new(name), !opts.read_only)
                .map_err(|e| fail(e.raw_os_error().unwrap_or(libc::EIO), e.to_string()))?;
            (Arc::new(d), None)
        };
        let fs = Fs::mount(dev, opts)?;
        out = Box::into_raw(Box::new(Foliofs {
            fs,
            handles: RwLock::new(HashMap::new()),
            next: AtomicI64::new(0),
            object,
        }));
        Ok(0)
    });
    out
}

/// # Safety
/// `fs` comes from `foliofs_mount` and is not used again.
#[no_mangle]
pub unsafe extern "C" fn foliofs_unmount(fs: *mut Foliofs) -> c_int {
    call_int(|| {
        if fs.is_null() {
            return Err(fail(libc::EINVAL, "file system handle is NULL"));
        }
        // SAFETY: the caller gives up the handle.
        let b = unsafe { Box::from_raw(fs) };
        let Foliofs {
            fs,
            handles,
            object,
            ..
        } = *b;
        for (_, h) in handles.into_inner() {
            if let Ok(h) = Arc::try_unwrap(h) {
                fs.release_file(h.file)?;
            }
        }
        fs.unmount()?;
        // An object image: the WAL folded and a manifest naming no writer.
        if let Some(d) = object {
            d.close().map_err(|e| fail(libc::EIO, e.to_string()))?;
        }
        Ok(0)
    })
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_open(
    fs: *mut Foliofs,
    path: *const c_char,
    flags: c_int,
    mode: u32,
) -> i64 {
    call(|| {
        // SAFETY: per the contract above.
        let (f, path) = unsafe { (get(fs)?, cstr(path, "path")?) };
        let direct = flags & libc::O_DIRECT != 0;
        let append = flags & libc::O_APPEND != 0;
        let (dir, name) = f.parent(path)?;
        let ino = match f.fs.lookup(dir, name.as_bytes()) {
            Ok(_) if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 => {
                return Err(fail(libc::EEXIST, format!("{path} exists")))
            }
            Ok(a) => a.ino,
            Err(Error::NotFound) if flags & libc::O_CREAT != 0 => {
                // SAFETY: getuid/getgid cannot fail.
                let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
                f.fs.create(dir, name.as_bytes(), mode & 0o7777, uid, gid)?
                    .ino
            }
            Err(e) => return Err(e.into()),
        };
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let (attr, file) = f.fs.open_file(ino)?;
        if attr.kind == FileType::Symlink {
            f.fs.release_file(file)?;
            return Err(fail(
                libc::ELOOP,
                format!("{path} is a symbolic link (paths are not followed through links)"),
            ));
        }
        if attr.kind == FileType::Dir && writable {
            f.fs.release_file(file)?;
            return Err(fail(libc::EISDIR, format!("{path} is a directory")));
        }
        if flags & libc::O_TRUNC != 0 && writable && attr.size != 0 {
            let set = SetAttr {
                size: Some(0),
                ..Default::default()
            };
            if let Err(e) = f.fs.setattr(ino, &set) {
                f.fs.release_file(file)?;
                return Err(e.into());
            }
        }
        let fh = f.next.fetch_add(1, Ordering::Relaxed);
        let h = Handle {
            file,
            direct,
            writable,
            append,
        };
        f.handles.write().insert(fh, Arc::new(h));
        Ok(fh)
    })
}

/// # Safety
/// `fs` is live.
#[no_mangle]
pub unsafe extern "C" fn foliofs_close(fs: *mut Foliofs, fh: i64) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let f = unsafe { get(fs) }?;
        let h = f
            .handles
            .write()
            .remove(&fh)
            .ok_or_else(|| fail(libc::EBADF, format!("no open file handle {fh}")))?;
        // A call still running on the handle keeps it; it is released
        // with the file system then.
        if let Ok(h) = Arc::try_unwrap(h) {
            f.fs.release_file(h.file)?;
        }
        Ok(0)
    })
}

/// The file system and handle of a pread/pwrite; None for a zero-length
/// request.
///
/// # Safety
/// `fs` is NULL or live.
unsafe fn io_target<'a>(
    fs: *mut Foliofs,
    fh: i64,
    buf_null: bool,
    len: usize,
    write: bool,
) -> Result<Option<(&'a Foliofs, Arc<Handle>)>, Fail> {
    // SAFETY: per the contract above.
    let f = unsafe { get(fs) }?;
    let h = if write {
        f.writable(fh)?
    } else {
        f.handle(fh)?
    };
    if len == 0 {
        return Ok(None);
    }
    if buf_null {
        return Err(fail(libc::EFAULT, "buffer is NULL"));
    }
    Ok(Some((f, h)))
}

/// The unit of O_DIRECT requests: the logical sector of the disks Linux's
/// own file systems sit on.
const DIRECT_IO_SECTOR: u64 = 512;

/// Whether a request on a handle takes the engine's direct path, by the
/// kernel's rule for O_DIRECT on its own file systems over a disk of
/// 512-byte sectors, which the FUSE mount follows too: an offset, a
/// length or a buffer not in whole sectors is refused (EINVAL); whole
/// blocks of the engine in a buffer aligned as its direct path wants
/// (min(block size, 4096) bytes) take that path; other whole sectors go
/// through the engine's page cache, which is coherent with it. Requests
/// on other handles (`direct` false) take the page cache.
fn direct_path(fs: &Fs, direct: bool, offset: u64, buf: &[u8]) -> Result<bool, Fail> {
    if !direct {
        return Ok(false);
    }
    let (len, addr) = (buf.len() as u64, buf.as_ptr() as u64);
    if (offset | len | addr) % DIRECT_IO_SECTOR != 0 {
        return Err(fail(
            libc::EINVAL,
            format!(
                "O_DIRECT needs an offset, a length and a buffer in whole \
                 {DIRECT_IO_SECTOR}-byte sectors (offset {offset}, length {len})"
            ),
        ));
    }
    let bs = fs.block_size();
    Ok(offset % bs == 0 && len % bs == 0 && addr % bs.min(4096) == 0)
}

/// # Safety
/// `fs` is live; `buf` holds `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn foliofs_pread(
    fs: *mut Foliofs,
    fh: i64,
    buf: *mut c_void,
    len: usize,
    offset: u64,
) -> i64 {
    call(|| {
        // SAFETY: per the contract above.
        let Some((f, h)) = (unsafe { io_target(fs, fh, buf.is_null(), len, false) })? else {
            return Ok(0);
        };
        // SAFETY: the caller gives `len` writable bytes at `buf`.
        let b = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
        let n = if direct_path(&f.fs, h.direct, offset, b)? {
            f.fs.read_direct(h.file.ino, offset, b)?
        } else {
            f.fs.read(h.file.ino, offset, b)?
        };
        Ok(n as i64)
    })
}

/// # Safety
/// `fs` is live; `buf` holds `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn foliofs_pwrite(
    fs: *mut Foliofs,
    fh: i64,
    buf: *const c_void,
    len: usize,
    offset: u64,
) -> i64 {
    call(|| {
        // SAFETY: per the contract above.
        let Some((f, h)) = (unsafe { io_target(fs, fh, buf.is_null(), len, true) })? else {
            return Ok(0);
        };
        // SAFETY: the caller gives `len` readable bytes at `buf`.
        let b = unsafe { std::slice::from_raw_parts(buf as *const u8, len) };
        let n = match (h.direct, h.append) {
            (true, true) => f.fs.append_direct(h.file.ino, b)?.1,
            (false, true) => f.fs.append(h.file.ino, b)?.1,
            (_, false) if direct_path(&f.fs, h.direct, offset, b)? => {
                f.fs.write_direct(h.file.ino, offset, b)?
            }
            (_, false) => f.fs.write(h.file.ino, offset, b)?,
        };
        Ok(n as i64)
    })
}

/// # Safety
/// `fs` is live.
#[no_mangle]
pub unsafe extern "C" fn foliofs_fsync(fs: *mut Foliofs, fh: i64, datasync: c_int) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let f = unsafe { get(fs) }?;
        let h = f.handle(fh)?;
        f.fs.fsync_file(&h.file, datasync != 0)?;
        Ok(0)
    })
}

/// # Safety
/// `fs` is live.
#[no_mangle]
pub unsafe extern "C" fn foliofs_ftruncate(fs: *mut Foliofs, fh: i64, size: u64) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let f = unsafe { get(fs) }?;
        let h = f.handle(fh)?;
        let set = SetAttr {
            size: Some(size),
            ..Default::default()
        };
        f.fs.setattr(h.file.ino, &set)?;
        Ok(0)
    })
}

/// # Safety
/// `fs` is live; `st` points to a `struct foliofs_stat`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_fstat(fs: *mut Foliofs, fh: i64, st: *mut FoliofsStat) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let f = unsafe { get(fs) }?;
        let a = f.fs.getattr(f.handle(fh)?.file.ino)?;
        // SAFETY: the caller gives a writable struct or NULL.
        let st = unsafe { st.as_mut() }.ok_or_else(|| fail(libc::EFAULT, "stat is NULL"))?;
        *st = stat_of(&a);
        Ok(0)
    })
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string; `st` points to a
/// `struct foliofs_stat`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_stat(
    fs: *mut Foliofs,
    path: *const c_char,
    st: *mut FoliofsStat,
) -> c_int {
    let op = |f: &Foliofs, ino, _: &str| {
        let a = f.fs.getattr(ino)?;
        // SAFETY: the caller gives a writable struct or NULL.
        let st = unsafe { st.as_mut() }.ok_or_else(|| fail(libc::EFAULT, "stat is NULL"))?;
        *st = stat_of(&a);
        Ok(0)
    };
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) as c_int }
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_mkdir(fs: *mut Foliofs, path: *const c_char, mode: u32) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let (f, path) = unsafe { (get(fs)?, cstr(path, "path")?) };
        let (dir, name) = f.parent(path)?;
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        f.fs.mkdir(dir, name.as_bytes(), mode & 0o7777, uid, gid)?;
        Ok(0)
    })
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_unlink(fs: *mut Foliofs, path: *const c_char) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let (f, path) = unsafe { (get(fs)?, cstr(path, "path")?) };
        let (dir, name) = f.parent(path)?;
        f.fs.unlink(dir, name.as_bytes())?;
        Ok(0)
    })
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_rmdir(fs: *mut Foliofs, path: *const c_char) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let (f, path) = unsafe { (get(fs)?, cstr(path, "path")?) };
        let (dir, name) = f.parent(path)?;
        f.fs.rmdir(dir, name.as_bytes())?;
        Ok(0)
    })
}

/// # Safety
/// `fs` is live; `from` and `to` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn foliofs_rename(
    fs: *mut Foliofs,
    from: *const c_char,
    to: *const c_char,
) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let (f, from, to) = unsafe { (get(fs)?, cstr(from, "from")?, cstr(to, "to")?) };
        let (d1, n1) = f.parent(from)?;
        let (d2, n2) = f.parent(to)?;
        f.fs.rename(d1, n1.as_bytes(), d2, n2.as_bytes(), 0)?;
        Ok(0)
    })
}

/// # Safety
/// `fs` is live.
#[no_mangle]
pub unsafe extern "C" fn foliofs_sync(fs: *mut Foliofs) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        unsafe { get(fs) }?.fs.sync()?;
        Ok(0)
    })
}

/// `foliofs_readdir`'s callback: the caller's context, the entry's name
/// (NUL-terminated), inode number and type (a `DT_*` value); non-zero
/// stops the listing.
pub type DirentCb =
    unsafe extern "C" fn(ctx: *mut c_void, name: *const c_char, ino: u64, kind: u32) -> c_int;

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string; `cb` is a function
/// taking `ctx`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_readdir(
    fs: *mut Foliofs,
    path: *const c_char,
    cb: Option<DirentCb>,
    ctx: *mut c_void,
) -> i64 {
    let op = |f: &Foliofs, ino, _: &str| {
        let cb = cb.ok_or_else(|| fail(libc::EINVAL, "callback is NULL"))?;
        let mut seen = 0i64;
        let mut bad_name = false;
        listing(
            0,
            |c| f.fs.readdir(ino, c, 128),
            |e| {
                let Ok(name) = CString::new(e.name) else {
                    bad_name = true;
                    return (true, e.cookie);
                };
                seen += 1;
                // SAFETY: the caller's callback, with its own context.
                let stop = unsafe { cb(ctx, name.as_ptr(), e.ino, e.kind.dtype() as u32) } != 0;
                (stop, e.cookie)
            },
        )?;
        if bad_name {
            return Err(fail(libc::EIO, "a directory entry's name holds a NUL"));
        }
        Ok(seen)
    };
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) }
}

/// # Safety
/// `fs` is live.
#[no_mangle]
pub unsafe extern "C" fn foliofs_fallocate(
    fs: *mut Foliofs,
    fh: i64,
    mode: c_int,
    offset: u64,
    len: u64,
) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let f = unsafe { get(fs) }?;
        let h = f.writable(fh)?;
        f.fs.fallocate(h.file.ino, Falloc::from_linux(mode)?, offset, len)?;
        Ok(0)
    })
}

/// # Safety
/// `fs` is live; `st` points to a `struct foliofs_statfs`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_statfs(fs: *mut Foliofs, st: *mut FoliofsStatfs) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let s = unsafe { get(fs) }?.fs.statfs()?;
        // SAFETY: the caller gives a writable struct or NULL.
        let st = unsafe { st.as_mut() }.ok_or_else(|| fail(libc::EFAULT, "statfs is NULL"))?;
        *st = FoliofsStatfs {
            block_size: s.block_size,
            name_max: s.name_max,
            blocks: s.blocks,
            blocks_free: s.blocks_free,
            blocks_avail: s.blocks_avail,
            files: s.files,
            files_free: s.files_free,
        };
        Ok(0)
    })
}

/// # Safety
/// `fs` is live; `target` and `path` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn foliofs_symlink(
    fs: *mut Foliofs,
    target: *const c_char,
    path: *const c_char,
) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let (f, target, path) = unsafe { (get(fs)?, cstr(target, "target")?, cstr(path, "path")?) };
        let (dir, name) = f.parent(path)?;
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        f.fs.symlink(dir, name.as_bytes(), target.as_bytes(), uid, gid)?;
        Ok(0)
    })
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string; `buf` holds `len`
/// writable bytes.
#[no_mangle]
pub unsafe extern "C" fn foliofs_readlink(
    fs: *mut Foliofs,
    path: *const c_char,
    buf: *mut c_char,
    len: usize,
) -> i64 {
    let op = |f: &Foliofs, ino, path: &str| {
        if f.fs.getattr(ino)?.kind != FileType::Symlink {
            return Err(fail(libc::EINVAL, format!("{path} is not a symbolic link")));
        }
        let target = f.fs.readlink(ino)?;
        if buf.is_null() || len == 0 {
            return Err(fail(libc::EINVAL, "readlink needs a buffer"));
        }
        // As readlink(2): truncated to the buffer, no NUL added.
        let n = target.len().min(len);
        // SAFETY: the caller gives `len` writable bytes at `buf`.
        unsafe { std::ptr::copy_nonoverlapping(target.as_ptr(), buf as *mut u8, n) };
        Ok(n as i64)
    };
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) }
}

/// # Safety
/// `fs` is live; `from` and `to` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn foliofs_link(
    fs: *mut Foliofs,
    from: *const c_char,
    to: *const c_char,
) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        let (f, from, to) = unsafe { (get(fs)?, cstr(from, "from")?, cstr(to, "to")?) };
        let ino = f.fs.resolve(from)?;
        let (dir, name) = f.parent(to)?;
        f.fs.link(ino, dir, name.as_bytes())?;
        Ok(0)
    })
}

/// Apply `set` to the inode at `path`.
///
/// # Safety
/// `fs` is NULL or live; `path` is NULL or a NUL-terminated string.
unsafe fn setattr_path(fs: *mut Foliofs, path: *const c_char, set: SetAttr) -> c_int {
    let op = |f: &Foliofs, ino, _: &str| Ok(f.fs.setattr(ino, &set).map(|_| 0)?);
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) as c_int }
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_chmod(fs: *mut Foliofs, path: *const c_char, mode: u32) -> c_int {
    let set = SetAttr {
        mode: Some(mode & 0o7777),
        ..Default::default()
    };
    // SAFETY: per the contract above.
    unsafe { setattr_path(fs, path, set) }
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_chown(
    fs: *mut Foliofs,
    path: *const c_char,
    uid: u32,
    gid: u32,
) -> c_int {
    let keep = |id: u32| (id != u32::MAX).then_some(id);
    let (uid, gid) = (keep(uid), keep(gid));
    let set = SetAttr {
        uid,
        gid,
        // As chown(2) on Linux, for every caller: set-user-ID and
        // set-group-ID (when group-executable) go.
        kill_priv: uid.is_some() || gid.is_some(),
        ..Default::default()
    };
    // SAFETY: per the contract above.
    unsafe { setattr_path(fs, path, set) }
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string; `times` is NULL or
/// two `struct timespec`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_utimens(
    fs: *mut Foliofs,
    path: *const c_char,
    times: *const libc::timespec,
) -> c_int {
    let pick = |t: Option<&libc::timespec>| match t {
        None => Ok(Some(TimeSet::Now)),
        Some(t) if t.tv_nsec == libc::UTIME_NOW => Ok(Some(TimeSet::Now)),
        Some(t) if t.tv_nsec == libc::UTIME_OMIT => Ok(None),
        Some(t) if (0..1_000_000_000).contains(&t.tv_nsec) => Ok(Some(TimeSet::At(Timespec {
            sec: t.tv_sec,
            nsec: t.tv_nsec as u32,
        }))),
        Some(t) => Err(fail(
            libc::EINVAL,
            format!("{} is not a nanosecond count", t.tv_nsec),
        )),
    };
    let op = |f: &Foliofs, ino, _: &str| {
        // SAFETY: the caller gives two timespecs or NULL.
        let (a, m) = match times.is_null() {
            true => (None, None),
            false => unsafe { (times.as_ref(), times.add(1).as_ref()) },
        };
        let set = SetAttr {
            atime: pick(a)?,
            mtime: pick(m)?,
            ..Default::default()
        };
        Ok(f.fs.setattr(ino, &set).map(|_| 0)?)
    };
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) as c_int }
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string; `flags` points to a
/// `uint32_t`.
#[no_mangle]
pub unsafe extern "C" fn foliofs_get_flags(
    fs: *mut Foliofs,
    path: *const c_char,
    flags: *mut u32,
) -> c_int {
    let op = |f: &Foliofs, ino, _: &str| {
        let a = f.fs.getattr(ino)?;
        // SAFETY: the caller gives a writable u32 or NULL.
        *unsafe { flags.as_mut() }.ok_or_else(|| fail(libc::EFAULT, "flags is NULL"))? = a.flags;
        Ok(0)
    };
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) as c_int }
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn foliofs_set_flags(
    fs: *mut Foliofs,
    path: *const c_char,
    flags: u32,
) -> c_int {
    // The program that mounted the image holds it: it may set immutable
    // and append-only, as CAP_LINUX_IMMUTABLE would.
    let op = |f: &Foliofs, ino, _: &str| Ok(f.fs.set_flags(ino, flags, true).map(|_| 0)?);
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) as c_int }
}

/// # Safety
/// `fs` is live; `path` and `name` are NUL-terminated strings; `buf`
/// holds `len` writable bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn foliofs_getxattr(
    fs: *mut Foliofs,
    path: *const c_char,
    name: *const c_char,
    buf: *mut c_void,
    len: usize,
) -> i64 {
    let op = |f: &Foliofs, ino, _: &str| {
        // SAFETY: per the contract above.
        let v =
            f.fs.getxattr(ino, unsafe { cstr(name, "name") }?.as_bytes())?;
        // SAFETY: per the contract above.
        unsafe { copy_out(&v, buf, len) }
    };
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) }
}

/// # Safety
/// `fs` is live; `path` and `name` are NUL-terminated strings; `value`
/// holds `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn foliofs_setxattr(
    fs: *mut Foliofs,
    path: *const c_char,
    name: *const c_char,
    value: *const c_void,
    len: usize,
    flags: c_int,
) -> c_int {
    let op = |f: &Foliofs, ino, _: &str| {
        // SAFETY: per the contract above.
        let name = unsafe { cstr(name, "name") }?;
        let v = match (value.is_null(), len) {
            (_, 0) => &[][..],
            (true, _) => return Err(fail(libc::EFAULT, "value is NULL")),
            // SAFETY: the caller gives `len` readable bytes at `value`.
            (false, _) => unsafe { std::slice::from_raw_parts(value as *const u8, len) },
        };
        f.fs.setxattr(ino, name.as_bytes(), v, flags as u32)?;
        Ok(0)
    };
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) as c_int }
}

/// # Safety
/// `fs` is live; `path` is a NUL-terminated string; `buf` holds `len`
/// writable bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn foliofs_listxattr(
    fs: *mut Foliofs,
    path: *const c_char,
    buf: *mut c_char,
    len: usize,
) -> i64 {
    let op = |f: &Foliofs, ino, _: &str| {
        let mut list = Vec::new();
        for n in f.fs.listxattr(ino)? {
            list.extend_from_slice(&n);
            list.push(0);
        }
        // SAFETY: per the contract above.
        unsafe { copy_out(&list, buf.cast(), len) }
    };
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) }
}

/// # Safety
/// `fs` is live; `path` and `name` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn foliofs_removexattr(
    fs: *mut Foliofs,
    path: *const c_char,
    name: *const c_char,
) -> c_int {
    let op = |f: &Foliofs, ino, _: &str| {
        // SAFETY: per the contract above.
        f.fs.removexattr(ino, unsafe { cstr(name, "name") }?.as_bytes())?;
        Ok(0)
    };
    // SAFETY: per the contract above.
    unsafe { at_path(fs, path, op) as c_int }
}

/// # Safety
/// `fs` is live.
#[no_mangle]
pub unsafe extern "C" fn foliofs_shutdown(fs: *mut Foliofs, flush_log: c_int) -> c_int {
    call_int(|| {
        // SAFETY: per the contract above.
        unsafe { get(fs) }?.fs.shutdown(flush_log != 0)?;
        Ok(0)
    })
}

/// # Safety
/// `fs` is live; `buf` holds `len` writable bytes (or `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn foliofs_counters_json(
    fs: *mut Foliofs,
    buf: *mut c_char,
    len: usize,
) -> i64 {
    call(|| {
        // SAFETY: per the contract above.
        let f = unsafe { get(fs) }?;
        let json = serde_json::to_vec(&f.fs.counters())
            .map_err(|e| fail(libc::EIO, format!("counters: {e}")))?;
        if len > json.len() && !buf.is_null() {
            // SAFETY: the caller gives `len` writable bytes at `buf`.
            let out = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
            out[..json.len()].copy_from_slice(&json);
            out[json.len()] = 0;
        }
        Ok(json.len() as i64 + 1)
    })
}

#[no_mangle]
pub extern "C" fn foliofs_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> CString {
        CString::new(s).unwrap()
    }

    /// A fresh directory under the temp dir and the image path in it.
    fn scratch(name: &str) -> (std::path::PathBuf, CString) {
        let dir = std::env::temp_dir().join(format!("foliofs-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = c(dir.join("c.img").to_str().unwrap());
        (dir, img)
    }

    fn last_error() -> String {
        // SAFETY: the pointer is this thread's NUL-terminated message.
        unsafe { CStr::from_ptr(foliofs_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    unsafe extern "C" fn collect(
        ctx: *mut c_void,
        name: *const c_char,
        _ino: u64,
        _kind: u32,
    ) -> c_int {
        // SAFETY: the test passes its Vec as the context; the name is
        // NUL-terminated.
        unsafe {
            (*(ctx as *mut Vec<String>)).push(CStr::from_ptr(name).to_string_lossy().into());
        }
        0
    }

    /// A listing longer than one batch of the engine's readdir names every
    /// entry once.
    #[test]
    fn a_long_listing_names_every_entry_once() {
        let (dir, img) = scratch("capi-ls");
        // SAFETY: every pointer below is a live CString, Vec or handle.
        unsafe {
            assert_eq!(foliofs_mkfs(img.as_ptr(), 64 << 20, 0), 0);
            let fs = foliofs_mount(img.as_ptr(), std::ptr::null());
            assert!(!fs.is_null(), "{}", last_error());
            assert_eq!(foliofs_mkdir(fs, c("big").as_ptr(), 0o755), 0);
            for i in 0..700 {
                let p = c(&format!("big/entry-{i}"));
                let fh = foliofs_open(fs, p.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
                assert!(fh >= 0, "{}", last_error());
                assert_eq!(foliofs_close(fs, fh), 0);
            }
            let mut names: Vec<String> = Vec::new();
            let n = foliofs_readdir(
                fs,
                c("big").as_ptr(),
                Some(collect),
                (&mut names as *mut Vec<String>).cast(),
            );
            assert_eq!(n, 702, "{}", last_error());
            names.sort();
            names.dedup();
            assert_eq!(names.len(), 702);
            assert!(names.iter().any(|n| n == "entry-699"));
            assert_eq!(foliofs_unmount(fs), 0);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// O_DIRECT by the kernel's rule, as through the FUSE mount: whole
    /// 512-byte sectors are served (whole blocks by the direct path, the
    /// rest by the page cache, coherent with it), anything off the sector
    /// (offset, length or buffer) is EINVAL and changes nothing.
    #[test]
    fn direct_io_in_sectors_and_off_them() {
        let (dir, img) = scratch("capi-dio");
        // SAFETY: every pointer below is a live CString, buffer or handle,
        // and every length within its buffer.
        unsafe {
            assert_eq!(foliofs_mkfs(img.as_ptr(), 64 << 20, 0), 0);
            let fs = foliofs_mount(img.as_ptr(), std::ptr::null());
            assert!(!fs.is_null(), "{}", last_error());
            let path = c("f");
            let flags = libc::O_RDWR | libc::O_CREAT | libc::O_DIRECT;
            let fh = foliofs_open(fs, path.as_ptr(), flags, 0o644);
            assert!(fh >= 0, "{}", last_error());
            let mut model = vec![0u8; 16384];
            let mut buf = foliofs::device::AlignedBuf::zeroed(8192);
            for (i, b) in buf.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            // Whole blocks: the direct path.
            assert_eq!(foliofs_pwrite(fs, fh, buf.as_ptr().cast(), 8192, 0), 8192);
            model[..8192].copy_from_slice(&buf[..8192]);
            // Whole sectors, not whole blocks: served, not EINVAL.
            for (off, len) in [(512u64, 1024usize), (8192 + 3584, 1024)] {
                buf[..len].fill(off as u8 | 1);
                let n = foliofs_pwrite(fs, fh, buf.as_ptr().cast(), len, off);
                assert_eq!(n, len as i64, "{}", last_error());
                model[off as usize..off as usize + len].copy_from_slice(&buf[..len]);
            }
            let n = foliofs_pread(fs, fh, buf.as_mut_ptr().add(512).cast(), 1536, 2048);
            assert_eq!(n, 1536, "{}", last_error());
            assert_eq!(&buf[512..2048], &model[2048..3584]);
            // Off the sector: EINVAL, for reads and writes alike.
            for (at, len, off) in [(0, 512, 100u64), (0, 100, 512), (1, 4096, 0)] {
                let p = buf.as_mut_ptr().add(at);
                let n = foliofs_pwrite(fs, fh, p.cast(), len, off);
                assert_eq!(n, -(libc::EINVAL as i64), "write {at} {len} {off}");
                let n = foliofs_pread(fs, fh, p.cast(), len, off);
                assert_eq!(n, -(libc::EINVAL as i64), "read {at} {len} {off}");
            }
            assert_eq!(foliofs_fsync(fs, fh, 0), 0);
            let n = foliofs_pread(fs, fh, buf.as_mut_ptr().cast(), 8192, 8192);
            assert_eq!(n, 4608, "{}", last_error());
            assert_eq!(&buf[..4608], &model[8192..12800]);
            let n = foliofs_pread(fs, fh, buf.as_mut_ptr().cast(), 8192, 0);
            assert_eq!(n, 8192);
            assert_eq!(&buf[..8192], &model[..8192]);
            assert_eq!(foliofs_close(fs, fh), 0);
            assert_eq!(foliofs_unmount(fs), 0);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn files_through_the_c_abi() {
        let (dir, img) = scratch("capi");
        // SAFETY: every pointer below is a live CString, buffer or handle.
        unsafe {
            assert_eq!(
                foliofs_mkfs(img.as_ptr(), 64 << 20, 0),
                0,
                "{}",
                last_error()
            );
            assert_eq!(foliofs_mkfs(img.as_ptr(), 64 << 20, 0), -libc::EEXIST);
            assert!(last_error().contains("already holds"));
            let bad = foliofs_mount(img.as_ptr(), c("wb_contexts=99").as_ptr());
            assert!(bad.is_null());
            assert!(last_error().contains("wb_contexts"), "{}", last_error());
            let fs = foliofs_mount(img.as_ptr(), c("dirty_limit=8M").as_ptr());
            assert!(!fs.is_null(), "{}", last_error());
            assert_eq!(foliofs_mkdir(fs, c("d").as_ptr(), 0o755), 0);
            let path = c("d/f");
            assert_eq!(
                foliofs_open(fs, path.as_ptr(), libc::O_RDWR, 0),
                -(libc::ENOENT as i64)
            );
            let fh = foliofs_open(fs, path.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o644);
            assert!(fh >= 0, "{}", last_error());
            let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
            let n = foliofs_pwrite(fs, fh, data.as_ptr().cast(), data.len(), 7);
            assert_eq!(n, data.len() as i64);
            assert_eq!(foliofs_fsync(fs, fh, 1), 0);
            let mut back = vec![0u8; data.len() + 50];
            let n = foliofs_pread(fs, fh, back.as_mut_ptr().cast(), back.len(), 7);
            assert_eq!(n, data.len() as i64);
            assert_eq!(&back[..data.len()], &data[..]);
            let mut st = FoliofsStat::default();
            assert_eq!(foliofs_fstat(fs, fh, &mut st), 0);
            assert_eq!(st.size, data.len() as u64 + 7);
            assert_eq!(st.mode, libc::S_IFREG | 0o644);
            // O_DIRECT: aligned reads of what the buffered write left.
            let dh = foliofs_open(fs, path.as_ptr(), libc::O_RDONLY | libc::O_DIRECT, 0);
            let mut al = foliofs::device::AlignedBuf::zeroed(8192);
            assert_eq!(foliofs_pread(fs, dh, al.as_mut_ptr().cast(), 8192, 0), 8192);
            assert_eq!(&al[7..8192], &data[..8192 - 7]);
            assert_eq!(
                foliofs_pread(fs, dh, back.as_mut_ptr().add(1).cast(), 4096, 0),
                -(libc::EINVAL as i64)
            );
            assert_eq!(
                foliofs_pwrite(fs, dh, al.as_ptr().cast(), 4096, 0),
                -(libc::EBADF as i64)
            );
            assert_eq!(foliofs_close(fs, dh), 0);
            assert_eq!(foliofs_close(fs, dh), -libc::EBADF);
            assert_eq!(foliofs_ftruncate(fs, fh, 10), 0);
            assert_eq!(foliofs_stat(fs, path.as_ptr(), &mut st), 0);
            assert_eq!(st.size, 10);
            assert_eq!(foliofs_rename(fs, path.as_ptr(), c("g").as_ptr()), 0);
            assert_eq!(
                foliofs_open(
                    fs,
                    c("g").as_ptr(),
                    libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                    0o600
                ),
                -(libc::EEXIST as i64)
            );
            let need = foliofs_counters_json(fs, std::ptr::null_mut(), 0);
            let mut js = vec![0u8; need as usize];
            assert_eq!(
                foliofs_counters_json(fs, js.as_mut_ptr().cast(), js.len()),
                need
            );
            let v: serde_json::Value = serde_json::from_slice(&js[..need as usize - 1]).unwrap();
            assert!(v["bytes_written_app"].as_u64().unwrap() >= data.len() as u64);
            // Left open: unmount closes it.
            assert_eq!(foliofs_unmount(fs), 0, "{}", last_error());
            let fs = foliofs_mount(img.as_ptr(), std::ptr::null());
            assert!(!fs.is_null(), "{}", last_error());
            let fh = foliofs_open(fs, c("g").as_ptr(), libc::O_RDONLY, 0);
            let n = foliofs_pread(fs, fh, back.as_mut_ptr().cast(), back.len(), 0);
            assert_eq!(n, 10);
            assert_eq!(&back[7..10], &data[..3]);
            assert_eq!(foliofs_unlink(fs, c("g").as_ptr()), 0);
            assert_eq!(foliofs_rmdir(fs, c("d").as_ptr()), 0);
            assert_eq!(foliofs_unmount(fs), 0);
        }
        let dev = FileDevice::open(&dir.join("c.img"), false).unwrap();
        let opts = foliofs::fsck::FsckOptions {
            repair: false,
            check_data: true,
        };
        let report = foliofs::fsck::fsck(Arc::new(dev), &opts, |_, _| {}).unwrap();
        assert!(report.is_clean(), "{report:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

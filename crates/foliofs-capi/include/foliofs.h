/* foliofs C ABI: the engine as a library (libfoliofs.so / libfoliofs.a).
 *
 * Every call returns 0 or a byte count on success and a negative errno on
 * failure; foliofs_last_error() then describes it (per thread). Paths are
 * inside the file system, '/'-separated, relative to its root, and are not
 * followed through symbolic links (as with O_NOFOLLOW). A foliofs handle
 * may be used by many threads at once. There are no permission checks:
 * the program that mounted the image owns everything in it. */
#ifndef FOLIOFS_H
#define FOLIOFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct foliofs foliofs;

/* Format IMAGE (created or grown to SIZE bytes if SIZE > 0). Refuses an
 * image that already holds a file system unless FORCE. IMAGE may be an
 * object image URL (s3://BUCKET/PREFIX, file:///DIR; endpoint and
 * credentials from the AWS_* environment): SIZE is needed, and an
 * existing one is never overwritten (-EEXIST). */
int foliofs_mkfs(const char *image, uint64_t size, int force);

/* Mount IMAGE; OPTIONS is NULL or a comma-separated list as for
 * `foliofs mount -o` (dirty_limit=64M,page_cache=1G,wb_contexts=4,
 * prealloc=off,dio_cap=256,dio_lock=shared|exclusive,ro). NULL on error.
 * IMAGE may be an object image URL (URL@N: a snapshot, with ro), with
 * its own options too: takeover, cache_dir=DIR, cache_size=SIZE,
 * durability=object|local, wal_lag_max=SIZE. A writer's mount is NULL
 * while another writer holds the image (foliofs_last_error names it). */
foliofs *foliofs_mount(const char *image, const char *options);

/* Write everything back, mark the file system clean and free FS (also when
 * it fails). Open files are closed. */
int foliofs_unmount(foliofs *fs);

/* Open PATH with open(2) flags (O_RDONLY/O_WRONLY/O_RDWR, O_CREAT, O_EXCL,
 * O_TRUNC, O_DIRECT, O_APPEND: every write goes to the end of the file,
 * whatever its offset, and appends from many threads never overlap; with
 * O_DIRECT the size must then be a whole number of blocks, else -EINVAL);
 * returns a file handle >= 0. A symbolic link is refused with -ELOOP. */
int64_t foliofs_open(foliofs *fs, const char *path, int flags, uint32_t mode);
int foliofs_close(foliofs *fs, int64_t fh);

/* pread/pwrite. With O_DIRECT, as on Linux's own file systems over a disk of
 * 512-byte sectors (and through the FUSE mount): BUF, LEN and OFFSET in whole
 * sectors, else -EINVAL. Whole blocks with BUF aligned to min(block size,
 * 4096) take the engine's direct path; other whole sectors its page cache,
 * coherent with it. */
int64_t foliofs_pread(foliofs *fs, int64_t fh, void *buf, size_t len, uint64_t offset);
int64_t foliofs_pwrite(foliofs *fs, int64_t fh, const void *buf, size_t len, uint64_t offset);

/* Durable when 0: a writeback error since this handle's last fsync is
 * reported once (as Linux does per open file description). */
int foliofs_fsync(foliofs *fs, int64_t fh, int datasync);
int foliofs_ftruncate(foliofs *fs, int64_t fh, uint64_t size);

/* FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE (with KEEP_SIZE) and
 * FALLOC_FL_ZERO_RANGE, as fallocate(2); 0 allocates. */
int foliofs_fallocate(foliofs *fs, int64_t fh, int mode, uint64_t offset, uint64_t len);

struct foliofs_time {
    int64_t sec;
    uint32_t nsec;
};

struct foliofs_stat {
    uint64_t ino;
    uint64_t size;
    uint64_t allocated; /* bytes of device space */
    uint32_t mode;      /* S_IFMT | permission bits */
    uint32_t nlink;
    uint32_t uid;
    uint32_t gid;
    uint32_t flags;     /* FS_*_FL, as foliofs_get_flags */
    uint32_t rdev;
    struct foliofs_time atime, mtime, ctime, btime;
};
int foliofs_fstat(foliofs *fs, int64_t fh, struct foliofs_stat *st);
int foliofs_stat(foliofs *fs, const char *path, struct foliofs_stat *st);

int foliofs_mkdir(foliofs *fs, const char *path, uint32_t mode);
int foliofs_unlink(foliofs *fs, const char *path);
int foliofs_rmdir(foliofs *fs, const char *path);
int foliofs_rename(foliofs *fs, const char *from, const char *to);
int foliofs_symlink(foliofs *fs, const char *target, const char *path);
/* As readlink(2): the target's bytes, truncated to LEN, no NUL added. */
int64_t foliofs_readlink(foliofs *fs, const char *path, char *buf, size_t len);
/* A new name TO for the file at FROM. */
int foliofs_link(foliofs *fs, const char *from, const char *to);

/* Every entry of directory PATH ("" is the root), "." and ".." first:
 * CB(CTX, name, inode, DT_* type) for each until CB returns non-zero.
 * Returns the number of entries passed to CB. */
typedef int (*foliofs_dirent_cb)(void *ctx, const char *name, uint64_t ino, uint32_t type);
int64_t foliofs_readdir(foliofs *fs, const char *path, foliofs_dirent_cb cb, void *ctx);

int foliofs_chmod(foliofs *fs, const char *path, uint32_t mode);
/* (uint32_t)-1 keeps the owner or group; a change takes set-user-ID and
 * set-group-ID away, as chown(2). */
int foliofs_chown(foliofs *fs, const char *path, uint32_t uid, uint32_t gid);
/* As utimensat(2): TIMES NULL sets both to now; UTIME_NOW, UTIME_OMIT. */
int foliofs_utimens(foliofs *fs, const char *path, const struct timespec times[2]);

/* chattr's flags, FS_*_FL values: FS_IMMUTABLE_FL, FS_APPEND_FL,
 * FS_NODUMP_FL, FS_NOATIME_FL, FS_SYNC_FL, FS_DIRSYNC_FL (directories);
 * other flags are refused (-EOPNOTSUPP). The engine enforces them. */
int foliofs_get_flags(foliofs *fs, const char *path, uint32_t *flags);
int foliofs_set_flags(foliofs *fs, const char *path, uint32_t flags);

/* Extended attributes, as getxattr(2) and friends: LEN 0 asks for the
 * size, a short buffer fails with -ERANGE; FLAGS XATTR_CREATE or
 * XATTR_REPLACE; listxattr gives NUL-terminated names one after another. */
int64_t foliofs_getxattr(foliofs *fs, const char *path, const char *name, void *buf, size_t len);
int foliofs_setxattr(foliofs *fs, const char *path, const char *name, const void *value,
                     size_t len, int flags);
int64_t foliofs_listxattr(foliofs *fs, const char *path, char *buf, size_t len);
int foliofs_removexattr(foliofs *fs, const char *path, const char *name);

struct foliofs_statfs {
    uint32_t block_size;
    uint32_t name_max;
    uint64_t blocks, blocks_free, blocks_avail; /* in block_size units */
    uint64_t files, files_free;
};
int foliofs_statfs(foliofs *fs, struct foliofs_statfs *st);

int foliofs_sync(foliofs *fs);
/* Stop as a crash would (FS_IOC_SHUTDOWN): with FLUSH_LOG the journal's
 * running transaction is committed first; cached data is not written
 * back. Every later change fails with -EIO; foliofs_unmount still frees FS
 * and the next mount replays the journal. */
int foliofs_shutdown(foliofs *fs, int flush_log);

/* The engine's counters as JSON into BUF (NUL-terminated); returns the
 * length it needs, so a call with LEN 0 asks for the size. */
int64_t foliofs_counters_json(foliofs *fs, char *buf, size_t len);

/* The message of this thread's last error ("" if none). */
const char *foliofs_last_error(void);

#ifdef __cplusplus
}
#endif
#endif

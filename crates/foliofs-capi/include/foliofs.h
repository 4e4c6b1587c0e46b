/* foliofs C ABI: the engine as a library (libfoliofs.so / libfoliofs.a).
 *
 * Every call returns 0 or a byte count on success and a negative errno on
 * failure; foliofs_last_error() then describes it (per thread). Paths are
 * inside the file system, '/'-separated, relative to its root. A foliofs
 * handle may be used by many threads at once. */
#ifndef FOLIOFS_H
#define FOLIOFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct foliofs foliofs;

/* Format IMAGE (created or grown to SIZE bytes if SIZE > 0). Refuses an
 * image that already holds a file system unless FORCE. */
int foliofs_mkfs(const char *image, uint64_t size, int force);

/* Mount IMAGE; OPTIONS is NULL or a comma-separated list as for
 * `foliofs mount -o` (dirty_limit=64M,page_cache=1G,wb_contexts=4,
 * prealloc=off,dio_cap=256,dio_lock=shared|exclusive,ro). NULL on error. */
foliofs *foliofs_mount(const char *image, const char *options);

/* Write everything back, mark the file system clean and free FS (also when
 * it fails). Open files are closed. */
int foliofs_unmount(foliofs *fs);

/* Open PATH with open(2) flags (O_RDONLY/O_WRONLY/O_RDWR, O_CREAT, O_EXCL,
 * O_TRUNC, O_DIRECT, O_APPEND is not supported); returns a file handle >= 0. */
int64_t foliofs_open(foliofs *fs, const char *path, int flags, uint32_t mode);
int foliofs_close(foliofs *fs, int64_t fh);

/* pread/pwrite. With O_DIRECT, BUF, LEN and OFFSET must be block aligned. */
int64_t foliofs_pread(foliofs *fs, int64_t fh, void *buf, size_t len, uint64_t offset);
int64_t foliofs_pwrite(foliofs *fs, int64_t fh, const void *buf, size_t len, uint64_t offset);

/* Durable when 0: a writeback error since this handle's last fsync is
 * reported once (as Linux does per open file description). */
int foliofs_fsync(foliofs *fs, int64_t fh, int datasync);
int foliofs_ftruncate(foliofs *fs, int64_t fh, uint64_t size);

struct foliofs_stat {
    uint64_t ino;
    uint64_t size;
    uint64_t allocated; /* bytes of device space */
    uint32_t mode;      /* S_IFMT | permission bits */
    uint32_t nlink;
};
int foliofs_fstat(foliofs *fs, int64_t fh, struct foliofs_stat *st);
int foliofs_stat(foliofs *fs, const char *path, struct foliofs_stat *st);

int foliofs_mkdir(foliofs *fs, const char *path, uint32_t mode);
int foliofs_unlink(foliofs *fs, const char *path);
int foliofs_rmdir(foliofs *fs, const char *path);
int foliofs_rename(foliofs *fs, const char *from, const char *to);
int foliofs_sync(foliofs *fs);

/* The engine's counters as JSON into BUF (NUL-terminated); returns the
 * length it needs, so a call with LEN 0 asks for the size. */
int64_t foliofs_counters_json(foliofs *fs, char *buf, size_t len);

/* The message of this thread's last error ("" if none). */
const char *foliofs_last_error(void);

#ifdef __cplusplus
}
#endif
#endif

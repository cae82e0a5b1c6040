/*
 * zsrc: the decompressed text of a gzip or zstd file, streamed. A file's
 * name says which it is (".gz", ".zst"), its first bytes must agree; gzip
 * members and zstd frames may be concatenated (zstd's skippable frames are
 * skipped), and a stream that ends inside a member or a frame, corrupt data
 * and bytes after the last member or frame are errors naming the file and
 * the compressed offset reached. An empty file is an empty text.
 *
 * Decompression runs on a thread of its own, ahead of the reader by a
 * bounded ring of buffers (a few MiB whatever the file), so that a prepare
 * validates records while the next ones are decompressed. The raw bytes
 * read are handed to the reader too, in order and on the reader's thread,
 * each before the text decompressed from it: a file's fingerprint is that
 * of its compressed bytes.
 */
#ifndef ESD_ZSRC_H
#define ESD_ZSRC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "util.h"

enum zsrc_kind {
    ZSRC_PLAIN = 0,
    ZSRC_GZIP,
    ZSRC_ZSTD,
};

/* What a file name says: ".gz" gzip, ".zst" zstd (any case), else plain. */
enum zsrc_kind zsrc_kind_of_name(const char *name);

/* "gzip" or "zstd" (the manifest's word); NULL for plain. */
const char *zsrc_kind_name(enum zsrc_kind kind);

struct zsrc;

/*
 * Starts decompressing fd, which stays the caller's (it must stay open
 * until zsrc_free), as kind (not ZSRC_PLAIN); name is shown in messages.
 * Aborts if the thread cannot be started.
 */
struct zsrc *zsrc_new(int fd, enum zsrc_kind kind, const char *name);

/*
 * Copies up to n bytes of the text into buf. Before any text, every raw
 * byte read so far from the file is passed, in order, to on_raw (may be
 * NULL) and counted in *raw_done. Returns the number of bytes copied (> 0),
 * 0 at the end of a complete stream, or a negative errno with err set
 * ("a.jsonl.gz: truncated gzip stream at byte 1234", "… corrupt zstd data
 * at byte 56: …", "… not a gzip file: …", "cannot read …"); the same
 * error again on every later call.
 */
ssize_t zsrc_read(struct zsrc *z, char *buf, size_t n, void (*on_raw)(void *, const char *, size_t),
                  void *ctx, uint64_t *raw_done, struct esd_err *err);

/*
 * A guess at the size of the text of the file at path (size bytes, kind
 * not ZSRC_PLAIN), from what the format says of it without decompressing:
 * a gzip file's last member's ISIZE (its text modulo 2^32), a zstd file's
 * first frame's content size. Exact for a file of one member or one frame
 * (what gzip and zstd write), too small for more; 0 for an empty file; -1
 * when there is no guess (the size is not recorded, the file cannot be
 * read). A prepare in one pass takes it for the text's size and checks it.
 */
int64_t zsrc_text_guess(const char *path, enum zsrc_kind kind, uint64_t size);

/* Stops the thread and frees z (NULL-safe); fd is not closed. */
void zsrc_free(struct zsrc *z);

#endif

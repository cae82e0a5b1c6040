/*
 * zsrc: one producer thread reads the file and decompresses it into a ring
 * of fixed entries, each a copy of the raw bytes just read (RAW) or a
 * buffer of text (TEXT), which the reader's thread drains in order. The
 * producer stops at the first error, which the reader sees once it has
 * taken every entry before it: the text before a fault is still read, so
 * that the reader's line count names the line reached.
 */
#include "zsrc.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

/* Entries of ENT_BYTES: the text a thread switch moves; raw reads of
 * IN_BYTES. Memory: ENTRIES * ENT_BYTES + IN_BYTES, and the decoders'
 * windows: 32 KiB for gzip, a zstd frame's own (zstd's default limit,
 * 128 MiB, that of `zstd --long`; zstd -3 writes 2 MiB). */
enum { ENTRIES = 6, ENT_BYTES = 1 << 20, IN_BYTES = 256 << 10, ZSTD_SLICE = 64 << 10 };

enum ent_type { ENT_RAW, ENT_TEXT };

struct ent {
    enum ent_type type;
    size_t len;
    char *data;
};

struct zsrc {
    int fd;
    enum zsrc_kind kind;
    char *name;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ent ent[ENTRIES];
    unsigned long long head; /* next entry the producer fills */
    unsigned long long tail; /* next entry the reader takes */
    size_t pos;              /* bytes of the tail entry already taken */
    bool done;               /* the producer has finished: status says how */
    bool stop;               /* the reader has gone: the producer ends */
    int status;
    struct esd_err perr; /* the producer's error, final once done */
    /* the producer's own */
    char *in;
    size_t in_len, in_pos;
    uint64_t raw_total; /* raw bytes read */
    struct ent *fill;   /* the text entry being filled, or NULL */
};

enum zsrc_kind
zsrc_kind_of_name(const char *name)
{
    size_t n = strlen(name);

    if (n >= 3 && !strcasecmp(name + n - 3, ".gz"))
        return ZSRC_GZIP;
    if (n >= 4 && !strcasecmp(name + n - 4, ".zst"))
        return ZSRC_ZSTD;
    return ZSRC_PLAIN;
}

const char *
zsrc_kind_name(enum zsrc_kind kind)
{
    switch (kind) {
    case ZSRC_GZIP:
        return "gzip";
    case ZSRC_ZSTD:
        return "zstd";
    default:
        return NULL;
    }
}

/* ---- the producer ---- */

/* Waits for a free entry; NULL when the reader stopped. */
static struct ent *
ent_get(struct zsrc *z, enum ent_type type)
{
    struct ent *e;

    pthread_mutex_lock(&z->mu);
    while (z->head - z->tail == ENTRIES && !z->stop)
        pthread_cond_wait(&z->cv, &z->mu);
    e = z->stop ? NULL : &z->ent[z->head % ENTRIES];
    pthread_mutex_unlock(&z->mu);
    if (e) {
        e->type = type;
        e->len = 0;
    }
    return e;
}

static void
ent_put(struct zsrc *z)
{
    pthread_mutex_lock(&z->mu);
    z->head++;
    pthread_cond_broadcast(&z->cv);
    pthread_mutex_unlock(&z->mu);
}

/* Publishes the text entry being filled, if it holds anything. */
static void
text_flush(struct zsrc *z)
{
    /* (an empty one is not published: its slot is simply taken again) */
    if (z->fill && z->fill->len > 0)
        ent_put(z);
    z->fill = NULL;
}

/* The text entry to decompress into (its free room is what follows len);
 * NULL when the reader stopped. */
static struct ent *
text_room(struct zsrc *z)
{
    if (z->fill && z->fill->len == ENT_BYTES)
        text_flush(z);
    if (!z->fill)
        z->fill = ent_get(z, ENT_TEXT);
    return z->fill;
}

/*
 * Reads more raw bytes after the unread ones (moved to the front), and
 * queues a copy of them for the reader before the text made of them.
 * Returns 1 when bytes were read, 0 at end of file, -ECANCELED when the
 * reader stopped, or a negative errno with z->perr set.
 */
static int
refill(struct zsrc *z)
{
    size_t keep = z->in_len - z->in_pos;
    struct ent *e;
    ssize_t got;

    memmove(z->in, z->in + z->in_pos, keep);
    z->in_pos = 0;
    z->in_len = keep;
    do
        got = read(z->fd, z->in + keep, IN_BYTES - keep);
    while (got < 0 && errno == EINTR);
    if (got < 0)
        return err_sys(&z->perr, -errno, "cannot read %s", z->name);
    if (got == 0)
        return 0;
    /* the text so far first: the reader sees raw and text in file order */
    text_flush(z);
    if (!(e = ent_get(z, ENT_RAW)))
        return -ECANCELED;
    memcpy(e->data, z->in + keep, (size_t)got);
    e->len = (size_t)got;
    ent_put(z);
    z->in_len += (size_t)got;
    z->raw_total += (uint64_t)got;
    return 1;
}

/* Offset in the file of the next unread raw byte. */
static uint64_t
at(const struct zsrc *z)
{
    return z->raw_total - (z->in_len - z->in_pos);
}

/* Whether the avail bytes at p (fewer than the magic's length at the end
 * of the file) are, or begin, a gzip member's or a zstd frame's magic. */
static bool
magic_ok(enum zsrc_kind kind, const unsigned char *p, size_t avail)
{
    /* zstd's frame, then its skippable frames (0x184D2A50 to 0x184D2A5F) */
    static const unsigned char gz[] = { 0x1f, 0x8b }, zf[] = { 0x28, 0xb5, 0x2f, 0xfd },
                               zs[] = { 0x50, 0x2a, 0x4d, 0x18 };
    size_t n = kind == ZSRC_GZIP ? 2 : 4;

    if (avail > n)
        avail = n;
    if (kind == ZSRC_GZIP)
        return !memcmp(p, gz, avail);
    if (!memcmp(p, zf, avail))
        return true;
    return (p[0] & 0xf0) == zs[0] && !memcmp(p + 1, zs + 1, avail - 1);
}

/*
 * At a member's or frame's start: 1 when its magic is there (or the file
 * ends inside it), 0 at a clean end of the file, a negative errno with
 * z->perr set otherwise ("not a gzip file", trailing garbage).
 */
static int
member_start(struct zsrc *z, bool first)
{
    size_t want = z->kind == ZSRC_GZIP ? 2 : 4, avail;
    const char *what = z->kind == ZSRC_GZIP ? "gzip member" : "zstd frame";
    int r = 1;

    while (r == 1 && z->in_len - z->in_pos < want)
        if ((r = refill(z)) < 0)
            return r;
    avail = z->in_len - z->in_pos;
    if (avail == 0)
        return 0;
    if (magic_ok(z->kind, (const unsigned char *)z->in + z->in_pos, avail))
        return 1; /* a short one is truncated: the decoder finds the end first */
    if (first)
        return err_set(&z->perr, -EINVAL, "%s: not a %s file: its first bytes are not %s's magic",
                       z->name, zsrc_kind_name(z->kind), zsrc_kind_name(z->kind));
    return err_set(&z->perr, -EINVAL, "%s: trailing garbage after the last %s at byte %llu",
                   z->name, what, (unsigned long long)at(z));
}

/*
 * Before a step of either decompressor: outside a member (frame), the next
 * one begun (member_start); inside one whose output did not fill, more
 * input read. 1 to go on, 0 at the end of the file between members, or a
 * negative errno with z->perr set (a file that ends inside one: truncated).
 */
static int
step_in(struct zsrc *z, bool *inside, bool *first, bool full, const char *kind)
{
    int r;

    if (!*inside) {
        if ((r = member_start(z, *first)) <= 0)
            return r;
        *inside = true;
        *first = false;
    } else if (z->in_pos == z->in_len && !full) {
        if ((r = refill(z)) < 0)
            return r;
        if (r == 0)
            return err_set(&z->perr, -EINVAL, "%s: truncated %s stream at byte %llu", z->name, kind,
                           (unsigned long long)z->raw_total);
    }
    return 1;
}

static int
run_gzip(struct zsrc *z)
{
    z_stream s;
    bool inside = false, first = true, full = false;
    int r = 0, zr;

    memset(&s, 0, sizeof(s));
    /* 16 + MAX_WBITS: the gzip wrapper only, neither zlib's nor raw */
    if (inflateInit2(&s, 16 + MAX_WBITS) != Z_OK)
        return err_set(&z->perr, -ENOMEM, "cannot decompress %s: out of memory", z->name);
    for (;;) {
        struct ent *e;

        if ((r = step_in(z, &inside, &first, full, "gzip")) <= 0)
            break;
        if (!(e = text_room(z))) {
            r = -ECANCELED;
            break;
        }
        s.next_in = (unsigned char *)z->in + z->in_pos;
        s.avail_in = (unsigned)(z->in_len - z->in_pos);
        s.next_out = (unsigned char *)e->data + e->len;
        s.avail_out = (unsigned)(ENT_BYTES - e->len);
        zr = inflate(&s, Z_NO_FLUSH);
        z->in_pos = z->in_len - s.avail_in;
        e->len = ENT_BYTES - s.avail_out;
        full = s.avail_out == 0;
        if (zr == Z_STREAM_END) {
            /* the next member, if any: a new header and trailer */
            inflateReset(&s);
            inside = full = false;
        } else if (zr == Z_MEM_ERROR) {
            r = err_set(&z->perr, -ENOMEM, "cannot decompress %s: out of memory", z->name);
            break;
        } else if (zr != Z_OK && zr != Z_BUF_ERROR) {
            r = err_set(&z->perr, -EINVAL, "%s: corrupt gzip data at byte %llu: %s", z->name,
                        (unsigned long long)at(z), s.msg ? s.msg : "invalid stream");
            break;
        }
    }
    inflateEnd(&s);
    return r;
}

static int
run_zstd(struct zsrc *z)
{
    ZSTD_DCtx *d = ZSTD_createDCtx();
    bool inside = false, first = true, full = false;
    int r = 0;

    if (!d)
        return err_set(&z->perr, -ENOMEM, "cannot decompress %s: out of memory", z->name);
    for (;;) {
        ZSTD_inBuffer in;
        ZSTD_outBuffer out;
        struct ent *e;
        size_t zr;

        if ((r = step_in(z, &inside, &first, full, "zstd")) <= 0)
            break;
        if (!(e = text_room(z))) {
            r = -ECANCELED;
            break;
        }
        /* in slices: an error leaves in.pos where it was, so the offset
         * named is the end of the slice the fault was found in */
        in.src = z->in;
        in.size = z->in_len - z->in_pos < ZSTD_SLICE ? z->in_len : z->in_pos + ZSTD_SLICE;
        in.pos = z->in_pos;
        out.dst = e->data;
        out.size = ENT_BYTES;
        out.pos = e->len;
        zr = ZSTD_decompressStream(d, &out, &in);
        z->in_pos = in.pos;
        e->len = out.pos;
        full = out.pos == out.size;
        if (ZSTD_isError(zr)) {
            r = err_set(
                &z->perr, ZSTD_getErrorCode(zr) == ZSTD_error_memory_allocation ? -ENOMEM : -EINVAL,
                "%s: corrupt zstd data at byte %llu: %s", z->name,
                (unsigned long long)(z->raw_total - (z->in_len - in.size)), ZSTD_getErrorName(zr));
            break;
        }
        /* 0: the frame is decoded and flushed; the next starts afresh */
        if (zr == 0)
            inside = full = false;
    }
    ZSTD_freeDCtx(d);
    return r;
}

static void *
zsrc_main(void *arg)
{
    struct zsrc *z = arg;
    int r = z->kind == ZSRC_GZIP ? run_gzip(z) : run_zstd(z);

    /* the text before a fault too: the reader's line count then names
     * the line the fault is in */
    if (r != -ECANCELED)
        text_flush(z);
    pthread_mutex_lock(&z->mu);
    z->status = r < 0 ? r : 0;
    z->done = true;
    pthread_cond_broadcast(&z->cv);
    pthread_mutex_unlock(&z->mu);
    return NULL;
}

/* ---- the reader's side ---- */

struct zsrc *
zsrc_new(int fd, enum zsrc_kind kind, const char *name)
{
    struct zsrc *z = xcalloc(1, sizeof(*z));

    z->fd = fd;
    z->kind = kind;
    z->name = xstrdup(name);
    z->in = xmalloc(IN_BYTES);
    for (int i = 0; i < ENTRIES; i++)
        z->ent[i].data = xmalloc(ENT_BYTES);
    pthread_mutex_init(&z->mu, NULL);
    pthread_cond_init(&z->cv, NULL);
    if (pthread_create(&z->thread, NULL, zsrc_main, z) != 0) {
        fprintf(stderr, "esd: cannot start the decompression thread\n");
        abort();
    }
    return z;
}

ssize_t
zsrc_read(struct zsrc *z, char *buf, size_t n, void (*on_raw)(void *, const char *, size_t),
          void *ctx, uint64_t *raw_done, struct esd_err *err)
{
    size_t got = 0;

    pthread_mutex_lock(&z->mu);
    while (got < n) {
        struct ent *e;

        if (z->tail == z->head) {
            /* something to return: return it rather than wait */
            if (got > 0 || z->done)
                break;
            pthread_cond_wait(&z->cv, &z->mu);
            continue;
        }
        e = &z->ent[z->tail % ENTRIES];
        pthread_mutex_unlock(&z->mu);
        if (e->type == ENT_RAW) {
            /* raw bytes come before the text made of them: none may be
             * in buf yet when they are passed on */
            if (got > 0) {
                pthread_mutex_lock(&z->mu);
                break;
            }
            if (on_raw)
                on_raw(ctx, e->data, e->len);
            *raw_done += e->len;
            z->pos = e->len;
        } else {
            size_t k = e->len - z->pos < n - got ? e->len - z->pos : n - got;

            memcpy(buf + got, e->data + z->pos, k);
            z->pos += k;
            got += k;
        }
        pthread_mutex_lock(&z->mu);
        if (z->pos == e->len) {
            z->pos = 0;
            z->tail++;
            pthread_cond_broadcast(&z->cv);
        }
    }
    if (got == 0 && z->done && z->tail == z->head && z->status < 0) {
        pthread_mutex_unlock(&z->mu);
        err_set(err, z->status, "%s", z->perr.msg);
        return z->status;
    }
    pthread_mutex_unlock(&z->mu);
    return (ssize_t)got;
}

void
zsrc_free(struct zsrc *z)
{
    if (!z)
        return;
    pthread_mutex_lock(&z->mu);
    z->stop = true;
    pthread_cond_broadcast(&z->cv);
    pthread_mutex_unlock(&z->mu);
    pthread_join(z->thread, NULL);
    pthread_mutex_destroy(&z->mu);
    pthread_cond_destroy(&z->cv);
    for (int i = 0; i < ENTRIES; i++)
        free(z->ent[i].data);
    free(z->in);
    free(z->name);
    free(z);
}

int64_t
zsrc_text_guess(const char *path, enum zsrc_kind kind, uint64_t size)
{
    unsigned char b[18]; /* ZSTD_FRAMEHEADERSIZE_MAX, a static-only name */
    int64_t guess = -1;
    struct stat st;
    ssize_t got;
    int fd;

    if (size == 0)
        return 0;
    /* (a link to a file as the reader follows it; a FIFO never waited on) */
    if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)) < 0)
        return -1;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != size) {
        close(fd);
        return -1;
    }
    if (kind == ZSRC_GZIP) {
        /* a member is at least 18 bytes: a 10-byte header, 8 of trailer */
        if (size >= 18 && pread(fd, b, 4, (off_t)(size - 4)) == 4)
            guess = (int64_t)b[0] | (int64_t)b[1] << 8 | (int64_t)b[2] << 16 | (int64_t)b[3] << 24;
    } else if (kind == ZSRC_ZSTD && (got = pread(fd, b, sizeof(b), 0)) > 0) {
        unsigned long long n = ZSTD_getFrameContentSize(b, (size_t)got);

        if (n != ZSTD_CONTENTSIZE_UNKNOWN && n != ZSTD_CONTENTSIZE_ERROR && n <= INT64_MAX)
            guess = (int64_t)n;
    }
    close(fd);
    return guess;
}

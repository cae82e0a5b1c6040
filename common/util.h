/*
 * util: the small pieces every module of libesd uses: the caller-owned error
 * struct, aborting allocators for small internal allocations, a growable byte
 * buffer, string lists and Python-compatible timestamps.
 *
 * Conventions (see STYLE.md): functions return 0 or a negative errno and
 * write ret_* out-parameters only on success; a message for the operator
 * goes into a struct esd_err owned by the caller.
 */
#ifndef ESD_UTIL_H
#define ESD_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define ESD_ERR_MAX 2048

/* An error message for the operator. code is the negative errno returned. */
struct esd_err {
    int code;
    char msg[ESD_ERR_MAX];
};

/*
 * Formats a message into err (if not NULL) and returns code, which must be a
 * negative errno, so that callers can write `return err_set(err, -EINVAL, …)`.
 */
int err_set(struct esd_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int err_setv(struct esd_err *err, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
/* Like err_set, appending ": <strerror(-code)>". */
int err_sys(struct esd_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void err_clear(struct esd_err *err);

/*
 * Whether a failure with the negative errno code belongs to the place it
 * happened, not to what was being done: storage that is full, broken or
 * gone (ENOSPC, EDQUOT, EIO, EROFS, ESTALE, ENOLCK, ETIMEDOUT), resources
 * of the node (ENOMEM, EMFILE, ENFILE, EAGAIN, EBUSY, EWOULDBLOCK), a stop
 * (EINTR, ECANCELED). Doing the same again elsewhere or later may succeed,
 * so such a failure counts as infrastructure, never against a shard's or
 * a job's own retries.
 */
bool err_transient(int code);

/* Allocators for small, internally sized allocations: abort on failure. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t m);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A growable byte buffer; always NUL-terminated after any append. */
struct buf {
    char *p;
    size_t len;
    size_t cap;
};
void buf_init(struct buf *b);
void buf_free(struct buf *b);
void buf_reset(struct buf *b);
void buf_reserve(struct buf *b, size_t extra);
void buf_append(struct buf *b, const void *data, size_t n);
void buf_putc(struct buf *b, char c);
void buf_puts(struct buf *b, const char *s);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_vprintf(struct buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Hands the buffer's storage to the caller (free() it); b is reset. */
char *buf_steal(struct buf *b);

/* A list of owned strings. */
struct strv {
    char **v;
    size_t n;
    size_t cap;
};
void strv_init(struct strv *s);
void strv_free(struct strv *s);
void strv_push(struct strv *s, const char *str);
void strv_push_owned(struct strv *s, char *str);
bool strv_contains(const struct strv *s, const char *str);
void strv_sort(struct strv *s);
/* Appends the blank-separated words of str (no quoting). */
void strv_split(struct strv *s, const char *str);

/*
 * Current time as Python's datetime.now(timezone.utc).isoformat():
 * "2026-11-29T10:27:36.401432+00:00", fraction omitted when zero.
 * out must hold 40 bytes. ret_epoch (may be NULL) gets the same instant.
 */
void time_iso_now(char out[40], double *ret_epoch);
void time_iso_format(const struct timespec *ts, char out[40]);
/* Seconds on CLOCK_MONOTONIC. */
double time_mono(void);
/* The wall clock, in seconds since the epoch. */
double time_wall(void);

/* 32 lower-case hex characters from getrandom(), like uuid4().hex. */
void rand_hex32(char out[33]);

/* Parses a positive/non-negative decimal integer as Python int() would
 * for plain digits (optional surrounding whitespace, optional +). */
int parse_int(const char *s, long long min, long long max, long long *ret);

/* Appends Python's repr() of the str s[0..n) (UTF-8): quotes chosen as
 * Python chooses them, backslash escapes for quotes, backslashes and
 * control characters. */
void py_repr_str(const char *s, size_t n, struct buf *out);

/* Human-readable size ("1.5 GiB") and duration ("1h02m"), into out. */
void fmt_size(uint64_t bytes, char out[32]);
void fmt_duration(double secs, char out[32]);

/*
 * Escaping for people and logs. Everything a job file, a peer node, a
 * processor or a client wrote is shown through these, so that no byte of it
 * can move the cursor, change colours, set a terminal's title, or start a
 * new line in a log or a table.
 *
 * str_escape appends s[0..n) to out with these bytes written as "\xNN"
 * (lower-case hex): the C0 controls (newline and tab included), DEL, each
 * byte of a C1 control U+0080..U+009F (its UTF-8 form C2 80..C2 9F), and
 * every byte that is not part of well-formed UTF-8 (stray continuation
 * bytes, overlong forms, surrogates, above U+10FFFF, a truncated sequence).
 * Printable ASCII and every other well-formed character are kept. A
 * backslash is kept too: the escape is then idempotent (text escaped by
 * common/ or esd and escaped again by esctl reads the same), at the cost
 * that a literal "\x1b" in the input looks like an escaped ESC; what
 * matters here is that nothing acts on a terminal, not reversibility.
 */
void str_escape(const char *s, size_t n, struct buf *out);
/* Like str_escape, but newline and tab pass unchanged (text that is meant
 * to have lines, such as a process.log shown on a terminal). */
void str_escape_lines(const char *s, size_t n, struct buf *out);
/* str_escape of the NUL-terminated s into a new string (caller frees). */
char *str_escape_dup(const char *s);
/* True when str_escape would copy s[0..n) unchanged: well-formed UTF-8
 * with no C0, DEL or C1 control. */
bool str_clean(const char *s, size_t n);

#endif

/*
 * sha256: SHA-256 behind one small API, so the rest of libesd never sees
 * OpenSSL: on the CPU's SHA extensions where it has them, else OpenSSL's
 * EVP.
 */
#ifndef ESD_SHA256_H
#define ESD_SHA256_H

#include <stdbool.h>
#include <stddef.h>

#include "util.h"

#define SHA256_HEX_LEN 64

struct sha256 {
    void *ctx; /* the digest in flight (sha256.c), or NULL */
};

/* Starts a digest. Aborts if OpenSSL cannot allocate a context. */
void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t len);
/*
 * The same as sha256_update(a, pa, na) then sha256_update(b, pb, nb), two
 * independent digests (of the same bytes or not) at about the cost of one
 * where the CPU has SHA extensions: their blocks are interleaved.
 */
void sha256_update2(struct sha256 *a, const void *pa, size_t na, struct sha256 *b, const void *pb,
                    size_t nb);
/*
 * Whether a pipeline (common/pipeline.h) of nthreads is faster with two
 * digests of the same bytes in one stage (sha256_update2: less CPU time)
 * than in two (two threads, but one digest alone is then the longest
 * stage): on up to 3 threads, where the CPU has SHA extensions (without
 * them a pair costs what two do, and two stages share it out).
 */
bool sha256_pair_pays(unsigned nthreads);
/* Finishes the digest into 64 lower-case hex chars + NUL; frees the context. */
void sha256_final(struct sha256 *s, char hex[SHA256_HEX_LEN + 1]);
/* Releases a digest that will not be finished (NULL-safe, idempotent). */
void sha256_abort(struct sha256 *s);

/*
 * Whether digests run on the CPU's SHA extensions (x86-64 SHA-NI) rather
 * than OpenSSL's code: on 1 uses them where the CPU has them, 0 never, -1
 * leaves the choice as it is (the CPU's, by default). For tests: digests
 * in flight keep the way they began.
 */
bool sha256_accel(int on);

/* Digest of a buffer. */
void sha256_buf(const void *data, size_t len, char hex[SHA256_HEX_LEN + 1]);
/* Digest of a whole file's bytes. */
int sha256_file(const char *path, char hex[SHA256_HEX_LEN + 1], struct esd_err *err);

#endif

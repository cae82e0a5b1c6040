/*
 * sha256: SHA-256 through OpenSSL's EVP interface behind one small API, so
 * the rest of libesd never sees OpenSSL.
 */
#ifndef ESD_SHA256_H
#define ESD_SHA256_H

#include <stddef.h>

#include "util.h"

#define SHA256_HEX_LEN 64

struct sha256 {
    void *ctx; /* EVP_MD_CTX */
};

/* Starts a digest. Aborts if OpenSSL cannot allocate a context. */
void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t len);
/* Finishes the digest into 64 lower-case hex chars + NUL; frees the context. */
void sha256_final(struct sha256 *s, char hex[SHA256_HEX_LEN + 1]);
/* Releases a digest that will not be finished (NULL-safe, idempotent). */
void sha256_abort(struct sha256 *s);

/* Digest of a buffer. */
void sha256_buf(const void *data, size_t len, char hex[SHA256_HEX_LEN + 1]);
/* Digest of a whole file's bytes. */
int sha256_file(const char *path, char hex[SHA256_HEX_LEN + 1], struct esd_err *err);

#endif

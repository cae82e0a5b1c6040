/*
 * sha256: OpenSSL EVP SHA-256 behind a four-function API.
 */
#include "sha256.h"

#include "fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void
sha256_init(struct sha256 *s)
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();

    if (!ctx || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
        fprintf(stderr, "esd: cannot initialise SHA-256\n");
        abort();
    }
    s->ctx = ctx;
}

void
sha256_update(struct sha256 *s, const void *data, size_t len)
{
    if (len && EVP_DigestUpdate(s->ctx, data, len) != 1) {
        fprintf(stderr, "esd: SHA-256 update failed\n");
        abort();
    }
}

void
sha256_final(struct sha256 *s, char hex[SHA256_HEX_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;

    if (EVP_DigestFinal_ex(s->ctx, md, &n) != 1 || n != 32) {
        fprintf(stderr, "esd: SHA-256 final failed\n");
        abort();
    }
    for (unsigned int i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    hex[SHA256_HEX_LEN] = '\0';
    sha256_abort(s);
}

void
sha256_abort(struct sha256 *s)
{
    EVP_MD_CTX_free(s->ctx);
    s->ctx = NULL;
}

void
sha256_buf(const void *data, size_t len, char hex[SHA256_HEX_LEN + 1])
{
    struct sha256 s;

    sha256_init(&s);
    sha256_update(&s, data, len);
    sha256_final(&s, hex);
}

int
sha256_file(const char *path, char hex[SHA256_HEX_LEN + 1], struct esd_err *err)
{
    enum { CHUNK = 1 << 20 };
    struct sha256 s;
    char *chunk;
    int fd, r = 0;

    /* (a FIFO or a device named by a job file is refused, not waited on) */
    fd = fs_open_file(path, O_RDONLY, 0, NULL, err);
    if (fd < 0)
        return fd;
    chunk = xmalloc(CHUNK);
    sha256_init(&s);
    for (;;) {
        ssize_t n = read(fd, chunk, CHUNK);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = err_sys(err, -errno, "cannot read %s", path);
            break;
        }
        if (n == 0)
            break;
        sha256_update(&s, chunk, (size_t)n);
    }
    if (r == 0)
        sha256_final(&s, hex);
    else
        sha256_abort(&s);
    free(chunk);
    close(fd);
    return r;
}

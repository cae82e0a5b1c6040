/*
 * sha256: SHA-256 behind a small API.
 *
 * Where the CPU has the SHA extensions (x86-64's SHA-NI: AMD since Zen,
 * Intel since Ice Lake), the compression runs here, on those
 * instructions; elsewhere, and under a tool that hides them (valgrind),
 * OpenSSL's EVP does the work. The reason to do it here: one stream is
 * bound by the latency of sha256rnds2, not by its throughput, so two
 * independent streams interleaved block by block (sha256_update2) cost
 * little more than one. Prepare and merge hash the same bytes twice (each
 * shard's digest and the whole stream's, each result's and the output's):
 * measured on a Zen 4, one stream runs at 1.8 GB/s and two interleaved at
 * 1.6 GB/s each, as OpenSSL's one does.
 */
#include "sha256.h"

#include "fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHANI_CODE 1
#endif

/* A digest in flight: this file's state, or OpenSSL's context. */
struct sha_state {
    uint32_t h[8];
    uint64_t total; /* bytes hashed */
    unsigned char buf[64];
    size_t nbuf;
    EVP_MD_CTX *evp; /* without the extensions */
};

static const uint32_t IV[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };

/* -1 not known yet, 0 no, 1 yes; sha256_accel may force it */
static int accel = -1;

#ifdef HAVE_SHANI_CODE
static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

#define SHANI __attribute__((target("sha,sse4.1,ssse3")))

/* The state as the instructions want it: ABEF and CDGH. */
SHANI static inline void
state_load(const uint32_t h[8], __m128i *abef, __m128i *cdgh)
{
    __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)(const void *)h), 0xB1);
    __m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)(const void *)(h + 4)), 0x1B);

    *abef = _mm_alignr_epi8(dcba, efgh, 8);
    *cdgh = _mm_blend_epi16(efgh, dcba, 0xF0);
}

SHANI static inline void
state_store(uint32_t h[8], __m128i abef, __m128i cdgh)
{
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B), dchg = _mm_shuffle_epi32(cdgh, 0xB1);

    _mm_storeu_si128((__m128i *)(void *)h, _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)(void *)(h + 4), _mm_alignr_epi8(dchg, feba, 8));
}

/* Message words w[g] of rounds 4g..4g+3, from the 16 bytes at p (g < 4)
 * or from the four groups before (w holds them, g mod 4). */
#define SCHED(w, p, g)                                                                            \
    ((g) < 4 ? _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(const void *)((p) + 16 * (g))), \
                                bswap)                                                            \
             : _mm_sha256msg2_epu32(                                                              \
                   _mm_add_epi32(_mm_sha256msg1_epu32(w[(g)&3], w[((g) + 1) & 3]),                \
                                 _mm_alignr_epi8(w[((g) + 3) & 3], w[((g) + 2) & 3], 4)),         \
                   w[((g) + 3) & 3]))

/* Four rounds with the message words m (K added). */
#define ROUNDS4(abef, cdgh, m)                                                \
    do {                                                                      \
        cdgh = _mm_sha256rnds2_epu32(cdgh, abef, m);                          \
        abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(m, 0x0E)); \
    } while (0)

SHANI static void
blocks1(uint32_t h[8], const unsigned char *p, size_t n)
{
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i abef, cdgh;

    state_load(h, &abef, &cdgh);
    for (; n; n--, p += 64) {
        __m128i abef0 = abef, cdgh0 = cdgh, w[4];

#pragma GCC unroll 16
        for (int g = 0; g < 16; g++) {
            __m128i m;

            w[g & 3] = SCHED(w, p, g);
            m = _mm_add_epi32(w[g & 3],
                              _mm_loadu_si128((const __m128i *)(const void *)(K + 4 * g)));
            ROUNDS4(abef, cdgh, m);
        }
        abef = _mm_add_epi32(abef, abef0);
        cdgh = _mm_add_epi32(cdgh, cdgh0);
    }
    state_store(h, abef, cdgh);
}

/* n blocks of p into h and n of q into g, interleaved: each stream's
 * rounds wait on their own results, the other's fill the wait. */
SHANI static void
blocks2(uint32_t h[8], const unsigned char *p, uint32_t g8[8], const unsigned char *q, size_t n)
{
    const __m128i bswap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
    __m128i a_abef, a_cdgh, b_abef, b_cdgh;

    state_load(h, &a_abef, &a_cdgh);
    state_load(g8, &b_abef, &b_cdgh);
    for (; n; n--, p += 64, q += 64) {
        __m128i a0 = a_abef, a1 = a_cdgh, b0 = b_abef, b1 = b_cdgh, w[4], v[4];

#pragma GCC unroll 16
        for (int g = 0; g < 16; g++) {
            __m128i k = _mm_loadu_si128((const __m128i *)(const void *)(K + 4 * g)), m, mm;

            w[g & 3] = SCHED(w, p, g);
            v[g & 3] = SCHED(v, q, g);
            m = _mm_add_epi32(w[g & 3], k);
            mm = _mm_add_epi32(v[g & 3], k);
            ROUNDS4(a_abef, a_cdgh, m);
            ROUNDS4(b_abef, b_cdgh, mm);
        }
        a_abef = _mm_add_epi32(a_abef, a0);
        a_cdgh = _mm_add_epi32(a_cdgh, a1);
        b_abef = _mm_add_epi32(b_abef, b0);
        b_cdgh = _mm_add_epi32(b_cdgh, b1);
    }
    state_store(h, a_abef, a_cdgh);
    state_store(g8, b_abef, b_cdgh);
}

static bool
cpu_has_shani(void)
{
    unsigned a, b, c, d;

    /* SSSE3 and SSE4.1 (leaf 1, ecx bits 9 and 19), SHA (leaf 7, ebx 29) */
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 9)) || !(c & (1u << 19)))
        return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 29));
}
#else
static void
blocks1(uint32_t h[8], const unsigned char *p, size_t n)
{
    (void)h, (void)p, (void)n;
    abort();
}

static void
blocks2(uint32_t h[8], const unsigned char *p, uint32_t g8[8], const unsigned char *q, size_t n)
{
    (void)h, (void)p, (void)g8, (void)q, (void)n;
    abort();
}

static bool
cpu_has_shani(void)
{
    return false;
}
#endif

static bool
use_accel(void)
{
    int a = __atomic_load_n(&accel, __ATOMIC_RELAXED);

    if (a < 0) {
        a = cpu_has_shani();
        __atomic_store_n(&accel, a, __ATOMIC_RELAXED);
    }
    return a;
}

bool
sha256_accel(int on)
{
    if (on >= 0)
        __atomic_store_n(&accel, on && cpu_has_shani(), __ATOMIC_RELAXED);
    return use_accel();
}

bool
sha256_pair_pays(unsigned nthreads)
{
    return nthreads <= 3 && use_accel();
}

void
sha256_init(struct sha256 *s)
{
    struct sha_state *st = xcalloc(1, sizeof(*st));

    if (use_accel()) {
        memcpy(st->h, IV, sizeof(IV));
    } else if (!(st->evp = EVP_MD_CTX_new()) ||
               EVP_DigestInit_ex(st->evp, EVP_sha256(), NULL) != 1) {
        fprintf(stderr, "esd: cannot initialise SHA-256\n");
        abort();
    }
    s->ctx = st;
}

/* Tops up st's partial block from *p; a full one is compressed. */
static void
fill(struct sha_state *st, const unsigned char **p, size_t *n)
{
    size_t k;

    if (!st->nbuf || !*n)
        return;
    k = 64 - st->nbuf < *n ? 64 - st->nbuf : *n;
    memcpy(st->buf + st->nbuf, *p, k);
    st->nbuf += k;
    *p += k;
    *n -= k;
    if (st->nbuf == 64) {
        blocks1(st->h, st->buf, 1);
        st->nbuf = 0;
    }
}

/* Compresses the whole blocks of *p (st's partial block empty). */
static void
whole(struct sha_state *st, const unsigned char **p, size_t *n)
{
    if (*n < 64)
        return;
    blocks1(st->h, *p, *n / 64);
    *p += *n & ~(size_t)63;
    *n &= 63;
}

/* Keeps what is left of p, less than a block. */
static void
keep(struct sha_state *st, const unsigned char *p, size_t n)
{
    if (!n) /* (p may then be NULL, which memcpy may not be given) */
        return;
    memcpy(st->buf + st->nbuf, p, n);
    st->nbuf += n;
}

static void
evp_update(struct sha_state *st, const void *data, size_t len)
{
    if (len && EVP_DigestUpdate(st->evp, data, len) != 1) {
        fprintf(stderr, "esd: SHA-256 update failed\n");
        abort();
    }
}

void
sha256_update(struct sha256 *s, const void *data, size_t len)
{
    struct sha_state *st = s->ctx;
    const unsigned char *p = data;

    if (st->evp) {
        evp_update(st, data, len);
        return;
    }
    st->total += len;
    fill(st, &p, &len);
    whole(st, &p, &len);
    keep(st, p, len);
}

void
sha256_update2(struct sha256 *a, const void *pa, size_t na, struct sha256 *b, const void *pb,
               size_t nb)
{
    struct sha_state *x = a->ctx, *y = b->ctx;
    const unsigned char *p = pa, *q = pb;
    size_t k;

    if (x->evp || y->evp) {
        sha256_update(a, pa, na);
        sha256_update(b, pb, nb);
        return;
    }
    x->total += na;
    y->total += nb;
    fill(x, &p, &na);
    fill(y, &q, &nb);
    k = na < nb ? na / 64 : nb / 64;
    if (k) {
        blocks2(x->h, p, y->h, q, k);
        p += 64 * k, na -= 64 * k;
        q += 64 * k, nb -= 64 * k;
    }
    /* one of them has less than a block left: the other goes on alone (a
     * partial block is left only where its input ran out) */
    whole(x, &p, &na);
    whole(y, &q, &nb);
    keep(x, p, na);
    keep(y, q, nb);
}

void
sha256_final(struct sha256 *s, char hex[SHA256_HEX_LEN + 1])
{
    static const char digits[] = "0123456789abcdef";
    struct sha_state *st = s->ctx;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;

    if (st->evp) {
        if (EVP_DigestFinal_ex(st->evp, md, &n) != 1 || n != 32) {
            fprintf(stderr, "esd: SHA-256 final failed\n");
            abort();
        }
    } else {
        uint64_t bits = st->total * 8;
        unsigned char pad[128] = { 0x80 };
        size_t npad = st->nbuf < 56 ? 56 - st->nbuf : 120 - st->nbuf;

        const unsigned char *p = pad;
        size_t left = npad + 8;

        for (int i = 0; i < 8; i++)
            pad[npad + (size_t)i] = (unsigned char)(bits >> (56 - 8 * i));
        /* the partial block completed, and one more when its length
         * did not fit: left is then 64, else 0 */
        fill(st, &p, &left);
        if (left)
            blocks1(st->h, p, 1);
        for (int i = 0; i < 8; i++) {
            md[4 * i] = (unsigned char)(st->h[i] >> 24);
            md[4 * i + 1] = (unsigned char)(st->h[i] >> 16);
            md[4 * i + 2] = (unsigned char)(st->h[i] >> 8);
            md[4 * i + 3] = (unsigned char)st->h[i];
        }
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
    struct sha_state *st = s->ctx;

    if (st)
        EVP_MD_CTX_free(st->evp);
    free(st);
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

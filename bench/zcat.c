/*
 * zcat: the decompressor alone, the baseline of bench/compressed: a gzip
 * (every member) or zstd (every frame) file decompressed with zlib or
 * libzstd, as prepare's reader links them, the text counted and dropped.
 * Single-threaded, no copy, no output: what a pass over the file costs at
 * least.
 *
 *   zcat gzip|zstd FILE      prints the text's size in bytes
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

enum { IN = 256 << 10, OUT = 1 << 20 };

static unsigned char in[IN], out[OUT];

static int
gunzip(int fd, unsigned long long *text)
{
    z_stream s;
    ssize_t got;
    int zr = Z_OK;

    memset(&s, 0, sizeof(s));
    if (inflateInit2(&s, 16 + MAX_WBITS) != Z_OK)
        return -1;
    while ((got = read(fd, in, IN)) > 0) {
        s.next_in = in;
        s.avail_in = (unsigned)got;
        while (s.avail_in > 0) {
            s.next_out = out;
            s.avail_out = OUT;
            zr = inflate(&s, Z_NO_FLUSH);
            *text += OUT - s.avail_out;
            if (zr == Z_STREAM_END)
                inflateReset(&s);
            else if (zr != Z_OK && zr != Z_BUF_ERROR)
                return -1;
        }
    }
    inflateEnd(&s);
    return got < 0 ? -1 : 0;
}

static int
unzstd(int fd, unsigned long long *text)
{
    ZSTD_DCtx *d = ZSTD_createDCtx();
    ssize_t got;

    while ((got = read(fd, in, IN)) > 0) {
        ZSTD_inBuffer i = { in, (size_t)got, 0 };

        while (i.pos < i.size) {
            ZSTD_outBuffer o = { out, OUT, 0 };
            size_t zr = ZSTD_decompressStream(d, &o, &i);

            if (ZSTD_isError(zr))
                return -1;
            *text += o.pos;
        }
    }
    ZSTD_freeDCtx(d);
    return got < 0 ? -1 : 0;
}

int
main(int argc, char **argv)
{
    unsigned long long text = 0;
    int fd, r;

    if (argc != 3 || (strcmp(argv[1], "gzip") && strcmp(argv[1], "zstd"))) {
        fprintf(stderr, "usage: zcat gzip|zstd FILE\n");
        return 2;
    }
    if ((fd = open(argv[2], O_RDONLY | O_CLOEXEC)) < 0) {
        perror(argv[2]);
        return 2;
    }
    r = !strcmp(argv[1], "gzip") ? gunzip(fd, &text) : unzstd(fd, &text);
    close(fd);
    if (r < 0) {
        fprintf(stderr, "zcat: %s: cannot decompress\n", argv[2]);
        return 1;
    }
    printf("%llu\n", text);
    return 0;
}

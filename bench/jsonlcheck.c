/*
 * jsonlcheck: the record validator alone, the baseline of prepare's and
 * merge's per-record work. The file is read into memory and split into
 * records first (not timed), and a first pass takes a digest of every
 * verdict (fault, offset, members; not timed either); then jsonl_check
 * runs over every record ROUNDS times and the best round's CPU seconds are
 * printed with the digest, so that two builds can be compared for speed
 * and for identical results.
 *
 *   jsonlcheck members|plain FILE [ROUNDS [MAX_BYTES]]
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jsonl.h"

static double
cpu_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* FNV-1a over the words of a verdict */
static unsigned long long
mix(unsigned long long h, unsigned long long v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        h = (h ^ (v & 0xff)) * 0x100000001b3ull;
    return h;
}

static unsigned long long
digest(const struct jsonl_record *rec, int r)
{
    unsigned long long h = 0xcbf29ce484222325ull;

    h = mix(h, (unsigned long long)r);
    h = mix(h, rec->fault);
    h = mix(h, rec->fault_off);
    h = mix(h, rec->nmembers);
    h = mix(h, rec->obj_open);
    h = mix(h, rec->obj_close);
    for (size_t i = 0; i < rec->nmembers; i++) {
        const struct jsonl_member *m = &rec->members[i];
        h = mix(h, m->key_off);
        h = mix(h, m->key_len);
        h = mix(h, m->val_off);
        h = mix(h, m->val_len);
        h = mix(h, m->key_escaped);
    }
    return h;
}

int
main(int argc, char **argv)
{
    struct jsonl_record rec;
    struct stat st;
    size_t n, nrec = 0, cap = 1 << 20, *off;
    unsigned long long dig = 0, bad = 0;
    double best = -1;
    long rounds = argc > 3 ? strtol(argv[3], NULL, 10) : 5;
    char *p;
    int fd;

    if (argc < 3 || argc > 5 || (strcmp(argv[1], "members") && strcmp(argv[1], "plain")) ||
        rounds < 1) {
        fprintf(stderr, "usage: jsonlcheck members|plain FILE [ROUNDS [MAX_BYTES]]\n");
        return 2;
    }
    if ((fd = open(argv[2], O_RDONLY | O_CLOEXEC)) < 0 || fstat(fd, &st) < 0) {
        perror(argv[2]);
        return 2;
    }
    n = (size_t)st.st_size;
    if (argc > 4 && strtoull(argv[4], NULL, 10) < n)
        n = strtoull(argv[4], NULL, 10);
    p = malloc(n ? n : 1);
    off = malloc(cap * sizeof(*off));
    if (!p || !off)
        return 2;
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, p + got, n - got);
        if (k <= 0) {
            fprintf(stderr, "jsonlcheck: cannot read %s: %s\n", argv[2],
                    k < 0 ? strerror(errno) : "short file");
            return 2;
        }
        got += (size_t)k;
    }
    close(fd);
    /* off[k]: start of record k; off[nrec]: one past the last one's "\n" */
    off[nrec++] = 0;
    for (char *q = p, *e = p + n, *nl; q < e && (nl = memchr(q, '\n', (size_t)(e - q)));
         q = nl + 1) {
        if (nrec == cap && !(off = realloc(off, (cap *= 2) * sizeof(*off))))
            return 2;
        off[nrec++] = (size_t)(nl + 1 - p);
    }
    nrec--;
    jsonl_record_init(&rec, !strcmp(argv[1], "members"));
    for (size_t i = 0; i < nrec; i++) {
        int r = jsonl_check(&rec, p + off[i], off[i + 1] - off[i] - 1, NULL);

        dig = mix(dig, digest(&rec, r));
        bad += r != 0;
    }
    for (long k = 0; k < rounds; k++) {
        double t0 = cpu_now(), t;

        for (size_t i = 0; i < nrec; i++)
            (void)jsonl_check(&rec, p + off[i], off[i + 1] - off[i] - 1, NULL);
        t = cpu_now() - t0;
        if (best < 0 || t < best)
            best = t;
    }
    printf("%s: %zu records, %llu refused, digest %016llx, best of %ld: %.3f s CPU, %.0f MB/s\n",
           argv[1], nrec, bad, dig, rounds, best, best > 0 ? (double)off[nrec] / best / 1e6 : 0);
    jsonl_record_free(&rec);
    free(off);
    free(p);
    return 0;
}

/*
 * hashq: a single consumer thread draining a ring of fixed-size slots, each
 * holding a copy of the bytes and the digest context to feed them to.
 */
#include "hashq.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

enum { SLOTS = 8, SLOT_BYTES = 1 << 20 };

struct slot {
    void (*fn)(void *ctx, const char *data, size_t len);
    void *ctx;
    size_t len;
    char *data;
};

struct hashq {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct slot slot[SLOTS];
    unsigned long long head; /* next slot to fill */
    unsigned long long tail; /* next slot to hash */
    bool stop;
    struct slot *filling; /* partially filled slot at head, or NULL */
};

static void *
hashq_main(void *arg)
{
    struct hashq *q = arg;

    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (q->tail == q->head && !q->stop)
            pthread_cond_wait(&q->cv, &q->mu);
        if (q->tail == q->head && q->stop)
            break;
        struct slot *sl = &q->slot[q->tail % SLOTS];
        pthread_mutex_unlock(&q->mu);
        sl->fn(sl->ctx, sl->data, sl->len);
        pthread_mutex_lock(&q->mu);
        q->tail++;
        pthread_cond_broadcast(&q->cv);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

struct hashq *
hashq_new(void)
{
    struct hashq *q = xcalloc(1, sizeof(*q));

    for (int i = 0; i < SLOTS; i++)
        q->slot[i].data = xmalloc(SLOT_BYTES);
    pthread_mutex_init(&q->mu, NULL);
    pthread_cond_init(&q->cv, NULL);
    if (pthread_create(&q->thread, NULL, hashq_main, q) != 0) {
        fprintf(stderr, "esd: cannot start the hashing thread\n");
        abort();
    }
    return q;
}

/* Publishes the slot being filled. Called with the mutex held. */
static void
flush_locked(struct hashq *q)
{
    if (q->filling) {
        q->filling = NULL;
        q->head++;
        pthread_cond_broadcast(&q->cv);
    }
}

static void
apply_sha(void *ctx, const char *data, size_t len)
{
    sha256_update(ctx, data, len);
}

void
hashq_update(struct hashq *q, struct sha256 *s, const void *data, size_t len)
{
    hashq_run(q, apply_sha, s, data, len);
}

void
hashq_run(struct hashq *q, void (*fn)(void *ctx, const char *data, size_t len), void *ctx,
          const void *data, size_t len)
{
    const char *p = data;

    pthread_mutex_lock(&q->mu);
    while (len > 0) {
        struct slot *sl = q->filling;

        /* Small updates to the same consumer share a slot. */
        if (sl && (sl->fn != fn || sl->ctx != ctx || sl->len == SLOT_BYTES))
            flush_locked(q), sl = NULL;
        if (!sl) {
            while (q->head - q->tail >= SLOTS)
                pthread_cond_wait(&q->cv, &q->mu);
            sl = q->filling = &q->slot[q->head % SLOTS];
            sl->fn = fn;
            sl->ctx = ctx;
            sl->len = 0;
        }
        size_t n = SLOT_BYTES - sl->len < len ? SLOT_BYTES - sl->len : len;
        /* The slot is not visible to the consumer until flushed. */
        pthread_mutex_unlock(&q->mu);
        memcpy(sl->data + sl->len, p, n);
        pthread_mutex_lock(&q->mu);
        sl->len += n;
        p += n;
        len -= n;
    }
    pthread_mutex_unlock(&q->mu);
}

void
hashq_sync(struct hashq *q)
{
    pthread_mutex_lock(&q->mu);
    flush_locked(q);
    while (q->tail != q->head)
        pthread_cond_wait(&q->cv, &q->mu);
    pthread_mutex_unlock(&q->mu);
}

void
hashq_free(struct hashq *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    flush_locked(q);
    q->stop = true;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
    pthread_join(q->thread, NULL);
    for (int i = 0; i < SLOTS; i++)
        free(q->slot[i].data);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q);
}

/*
 * notify: the systemd contract in one place: READY=1 once the
 * configuration is loaded and the socket listens, STATUS= with a one-line
 * summary, RELOADING=1/READY=1 around SIGHUP, STOPPING=1, WATCHDOG=1 every
 * half of WATCHDOG_USEC, and the socket handed over by socket activation.
 * Without NOTIFY_SOCKET every call is a no-op.
 */
#ifndef ESD_NOTIFY_H
#define ESD_NOTIFY_H

#include <stdbool.h>

#include <ev.h>

/* Starts the watchdog timer if systemd asked for one. */
void notify_init(struct ev_loop *loop);
void notify_fini(void);

void notify_ready(void);
void notify_reloading(void);
void notify_stopping(void);
/* STATUS=..., sent only when it changed. */
void notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Whether an environment entry ("NAME=value") is systemd's word to esd
 * alone (NOTIFY_SOCKET, WATCHDOG_*, LISTEN_*), to be kept from children:
 * a processor that speaks sd_notify must not speak for esd. */
bool notify_env_private(const char *entry);

/* The listening AF_UNIX socket passed by socket activation, or -1. */
int notify_listen_fd(void);

/* A test-only switch (esd --test-hang-watchdog): stop sending WATCHDOG=1
 * while the loop keeps running, so that systemd's watchdog kill can be
 * tested. */
void notify_test_stop_watchdog(void);

#endif

/*
 * notify: sd_notify(3), sd_watchdog_enabled(3), sd_listen_fds(3).
 */
#include "notify.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include <systemd/sd-daemon.h>

#include "log.h"

static ev_timer watchdog;
static struct ev_loop *notify_loop;
static char last_status[512];
static bool watchdog_stopped;

static void
notify_watchdog_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)w;
    (void)revents;
    if (!watchdog_stopped)
        sd_notify(0, "WATCHDOG=1");
}

void
notify_init(struct ev_loop *loop)
{
    uint64_t usec = 0;

    notify_loop = loop;
    if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
        double every = (double)usec / 2e6;

        ev_timer_init(&watchdog, notify_watchdog_cb, every, every);
        ev_timer_start(loop, &watchdog);
        log_debug(NULL, "watchdog: WATCHDOG=1 every %.1f s", every);
    }
}

void
notify_fini(void)
{
    if (notify_loop && ev_is_active(&watchdog))
        ev_timer_stop(notify_loop, &watchdog);
}

void
notify_ready(void)
{
    sd_notify(0, "READY=1");
}

void
notify_reloading(void)
{
    sd_notify(0, "RELOADING=1");
}

void
notify_stopping(void)
{
    sd_notify(0, "STOPPING=1");
}

void
notify_status(const char *fmt, ...)
{
    char status[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(status, sizeof(status), fmt, ap);
    va_end(ap);
    if (!strcmp(status, last_status))
        return;
    snprintf(last_status, sizeof(last_status), "%s", status);
    sd_notifyf(0, "STATUS=%s", status);
}

int
notify_listen_fd(void)
{
    int n = sd_listen_fds(1);

    for (int i = 0; i < n; i++)
        if (sd_is_socket_unix(SD_LISTEN_FDS_START + i, SOCK_STREAM, 1, NULL, 0) > 0)
            return SD_LISTEN_FDS_START + i;
    return -1;
}

void
notify_test_stop_watchdog(void)
{
    watchdog_stopped = true;
}

bool
notify_env_private(const char *entry)
{
    static const char *const names[] = { "NOTIFY_SOCKET=", "WATCHDOG_USEC=", "WATCHDOG_PID=",
                                         "LISTEN_FDS=",    "LISTEN_PID=",    "LISTEN_FDNAMES=" };

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strncmp(entry, names[i], strlen(names[i])))
            return true;
    return false;
}

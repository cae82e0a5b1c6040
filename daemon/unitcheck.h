/*
 * unitcheck: `esd --check-config` as the service will run, not as whoever
 * typed it: the unit's User= (root switches to it before the file is
 * loaded) and the unit's sandbox, read from systemd (systemctl show:
 * ProtectSystem=, ProtectHome=, PrivateTmp=, ReadWritePaths=,
 * ReadOnlyPaths=, InaccessiblePaths=, StateDirectory=, RuntimeDirectory=,
 * drop-ins included), checked for the paths esd itself uses: the
 * processor, ray.command, metrics.path and spool_dir.
 */
#ifndef ESD_UNITCHECK_H
#define ESD_UNITCHECK_H

#include <stdbool.h>

#include "config.h"
#include "util.h"

struct unit_sandbox {
    char *unit;           /* "esd.service" */
    char *user;           /* User=; NULL: root */
    char *protect_system; /* ProtectSystem=: no, yes, full, strict */
    char *protect_home;   /* ProtectHome=: no, yes, read-only, tmpfs */
    bool private_tmp;     /* PrivateTmp= */
    struct strv rw;       /* ReadWritePaths=, /var/lib/<StateDirectory>, /run/<RuntimeDirectory> */
    struct strv ro;       /* ReadOnlyPaths= */
    struct strv hidden;   /* InaccessiblePaths= */
};

/*
 * The sandbox of unit as systemd has loaded it. Returns 0, -ENOENT when
 * systemd does not run here or knows no such unit (err says which), or
 * another negative errno.
 */
int unit_sandbox_load(const char *unit, struct unit_sandbox *ret, struct esd_err *err);
void unit_sandbox_free(struct unit_sandbox *sb);

/*
 * Why the unit's esd cannot use path (a resolved absolute path): see and
 * run it, or with write, create files in it; with the fix (the drop-in to
 * add). NULL when it can. Caller frees.
 */
char *unit_sandbox_why(const struct unit_sandbox *sb, const char *path, bool write);

/* Become user (its groups too): for root only. */
int unitcheck_become(const char *user, struct esd_err *err);

/*
 * Checks, as the current user and, if sb is not NULL, under its sandbox,
 * that the processor and (ray.mode persistent) ray.command are
 * executables, and that metrics.path's and spool_dir's directories can be
 * written. Each problem is pushed onto problems as one line.
 */
void unitcheck_paths(const struct esd_conf *c, const struct unit_sandbox *sb,
                     struct strv *problems);

#endif

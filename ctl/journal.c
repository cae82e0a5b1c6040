/*
 * journal: `esctl logs DIR` without --shard shows what esd on this node
 * logged about the job, and its processor's output: its journal entries
 * carry ESD_JOB=<basename>@<8 hex digits of the directory's key>
 * (manifest_log_id, unique even when two jobs share a basename), which
 * journalctl selects. esctl execs journalctl, so that --follow, paging
 * and the journal's own permissions behave as journalctl's do.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "esctl.h"
#include "manifest.h"
#include "pypath.h"

int
journal_show(struct call *c)
{
    struct manifest m;
    struct esd_err err;
    char *dir = NULL, *match, *esc, *id, lines[32];
    const char *argv[9];
    int n = 0, r;

    if ((r = pypath_resolve_cli(c->str[O_JOB_DIR], &dir, &err)) < 0 ||
        (r = manifest_load(dir, &m, &err)) < 0) {
        free(dir);
        return render_error(c, "failed", err.msg, EXIT_ERROR);
    }
    manifest_free(&m);
    id = manifest_log_id(dir);
    free(dir);
    /* esd's log escapes the field's value (daemon/log.c): match it so */
    esc = str_escape_dup(id);
    free(id);
    match = xasprintf("ESD_JOB=%s", esc);
    free(esc);
    argv[n++] = "journalctl";
    argv[n++] = "--no-pager";
    argv[n++] = "-o";
    argv[n++] = "short-iso";
    if (c->set[O_FOLLOW])
        argv[n++] = "--follow";
    if (c->set[O_LINES]) {
        snprintf(lines, sizeof(lines), "%lld", c->num[O_LINES]);
        argv[n++] = "-n";
        argv[n++] = lines;
    }
    argv[n++] = match;
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    execvp(argv[0], (char *const *)(uintptr_t)argv);
    r = errno;
    free(match);
    if (r == ENOENT)
        out_error("journalctl is not installed on this node, so esd's journal cannot be read "
                  "here; esctl logs %s --shard ID shows a shard's process.log",
                  c->str[O_JOB_DIR]);
    else
        out_error("cannot run journalctl: %s", strerror(r));
    return EXIT_ERROR;
}

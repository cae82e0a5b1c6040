/*
 * ctl: the control socket (DESIGN.md "Control protocol"): one JSON object
 * per line over a SOCK_STREAM UNIX socket. Request
 * {"v":1,"id":N,"cmd":"…","args":{…}}; reply {"v":1,"id":N,"ok":true,
 * "result":{…}} or {"v":1,"id":N,"ok":false,"error":{"code":"…",
 * "message":"…"}}. This version answers "ping" and "status"; the full
 * command set and its authorisation come with the control-protocol work.
 * Limits: 1 MiB a message, 64 connections, 60 s idle.
 */
#ifndef ESD_CTL_H
#define ESD_CTL_H

#include <cjson/cJSON.h>
#include <ev.h>

#include "config.h"
#include "util.h"

/*
 * Listens on activated_fd (socket activation) or creates c->socket_path
 * (its directory created, mode 0660, any stale socket replaced) before
 * READY=1. Returns 0 or a negative errno with err set.
 */
int ctl_init(struct ev_loop *loop, const struct esd_conf *c, int activated_fd,
             struct esd_err *err);

/* The daemon's status for the "status" command (the caller owns it). */
void ctl_set_status(cJSON *(*fn)(void));

/* Closes every connection and the socket (the path is removed unless it
 * came from socket activation). */
void ctl_fini(void);

/* Test only: closes connections idle for secs instead of PROTO_IDLE_SECS
 * (applies to connections accepted later). */
void ctl_test_set_idle(double secs);

#endif

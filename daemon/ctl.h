/*
 * ctl: the control socket (ARCHITECTURE.md "Control protocol"): one JSON object
 * per line over a SOCK_STREAM UNIX socket. Request
 * {"v":1,"id":N,"cmd":"…","args":{…}}; reply {"v":1,"id":N,"ok":true,
 * "result":{…}} or {"v":1,"id":N,"ok":false,"error":{"code":"…",
 * "message":"…"}}. The commands, their arguments and who may run them
 * come from the table in common/cmds.c, their handlers are in
 * daemon/ctlcmd.c (ctl.c is the server); common/proto.h has the rest.
 */
#ifndef ESD_CTL_H
#define ESD_CTL_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <cjson/cJSON.h>
#include <ev.h>

#include "config.h"
#include "proto.h"
#include "util.h"

/*
 * Listens on activated_fd (socket activation) or creates c->socket_path
 * (its directory created, mode 0660, any stale socket replaced) before
 * READY=1. Returns 0 or a negative errno with err set.
 */
int ctl_init(struct ev_loop *loop, const struct esd_conf *c, int activated_fd, struct esd_err *err);

/* The daemon's status for the "status" command (the caller owns it). */
void ctl_set_status(cJSON *(*fn)(void));
/* How the "reload" command reloads esd.yaml: 0, or a negative errno with
 * err set when the file is refused (the running configuration stays). */
void ctl_set_reload(int (*fn)(struct esd_err *err));

/* A reloaded configuration: the control group is looked up again. */
void ctl_reconfigure(const struct esd_conf *c);
/* Closes every connection and the socket (the path is removed unless it
 * came from socket activation). */
void ctl_fini(void);

/*
 * The share (common/proto.h "Fair shares") a peer with these credentials
 * and supplementary groups counts against: class root (uid 0), service (a
 * member of the control group, or esd's own uid) or other; keyed by its uid
 * if the user database knows the uid (getpwuid_r), else by
 * PROTO_SHARE_POOL. Looks the uid up, so it may read /etc/passwd or ask
 * NSS; called once per accepted connection.
 */
struct proto_share ctl_peer_share(const struct ucred *cred, const gid_t *groups, size_t ngroups);

/* Test only: closes connections idle for secs instead of PROTO_IDLE_SECS
 * (applies to connections accepted later). */
void ctl_test_set_idle(double secs);
/*
 * Test and fuzz entry: the reply esd would give peer (with its groups)
 * for one request line, without a socket. Operations that would run in a
 * child are answered "internal" instead. The caller owns the reply; NULL
 * never happens here.
 */
cJSON *ctl_test_answer(const struct ucred *peer, const gid_t *groups, size_t ngroups,
                       const char *line, size_t len);

#endif

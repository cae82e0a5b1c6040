/*
 * config: esd's configuration, /etc/esd/esd.yaml, read with libyaml through
 * one key table (name, type, offset, default, check). Unknown keys and bad
 * values are errors naming the file and line. SIGHUP parses into a new
 * struct and the daemon swaps it in only if that succeeded.
 */
#ifndef ESD_CONFIG_H
#define ESD_CONFIG_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "util.h"

#define ESD_CONFIG_DEFAULT "/etc/esd/esd.yaml"

enum ray_mode {
    RAY_PERSISTENT,  /* a node-local head kept running by esd */
    RAY_PER_ATTEMPT, /* --ray_address local: Ray started by every attempt */
    RAY_OFF,         /* no Ray (tests, processors that do not use it) */
};

enum log_target {
    LOG_TARGET_AUTO, /* journald under systemd, stderr otherwise */
    LOG_TARGET_JOURNAL,
    LOG_TARGET_STDERR,
};

/* Log levels, syslog's numbers. */
enum {
    LOG_LVL_ERR = 3,
    LOG_LVL_WARNING = 4,
    LOG_LVL_NOTICE = 5,
    LOG_LVL_INFO = 6,
    LOG_LVL_DEBUG = 7
};

/* metrics.path auto: this directory's esd.prom when it exists (Debian's
 * prometheus-node-exporter reads its textfile collector's files there). */
#define METRICS_AUTO_DIR "/var/lib/prometheus/node-exporter"

struct esd_conf {
    char *path;                     /* the file it was read from (NULL: defaults only) */
    char *node_name;                /* node_name; default the host name made a file name */
    long slots;                     /* slots: attempts run at once; default 1 */
    long threads;                   /* threads: of prepare and merge; 0 (default): the CPUs */
    long lease_secs;                /* lease_secs: default 60 */
    long poll_interval_secs;        /* poll_interval_secs: idle poll, jittered; default 20 */
    struct strv processor;          /* processor: command words (a string split on blanks, or
                                a list); empty: dj-process, or python <root>/tools/
                                process_data.py with data_juicer.root */
    char *dj_root;                  /* data_juicer.root: a Data-Juicer checkout; NULL */
    char *dj_python;                /* data_juicer.python: default "python3" */
    bool allow_version_mismatch;    /* data_juicer.allow_version_mismatch: default false */
    bool dj_warm;                   /* data_juicer.warm: default true */
    bool claim_ahead;               /* claim_ahead: default true */
    enum ray_mode ray_mode;         /* ray.mode: persistent (default), per-attempt, off */
    char *ray_command;              /* ray.command: default "ray" */
    long ray_port;                  /* ray.port: default 6380 */
    char *ray_temp_dir;             /* ray.temp_dir: default <state_dir>/ray */
    struct strv ray_args;           /* ray.args: extra arguments of `ray start` (list) */
    long ray_num_gpus;              /* ray.num_gpus: GPUs the head offers; -1 (default): counted
                                from CUDA_VISIBLE_DEVICES or /dev/nvidia<N> (ray.c) */
    long ray_start_timeout_secs;    /* ray.start_timeout_secs: a head not ready by then is
                                    killed and restarted; default 120 */
    char *state_dir;                /* state_dir: default /var/lib/esd */
    char *socket_path;              /* socket: default /run/esd/esd.sock */
    char *socket_group;             /* socket_group: default "esd" */
    int socket_mode;                /* socket_mode: 0600, 0660 (default) or 0666 */
    char *spool_dir;                /* spool_dir: shared job registrations; NULL */
    long node_status_interval_secs; /* node_status_interval_secs: how often this node's
                                       <spool_dir>/nodes/<node>.json is rewritten; 30 */
    long retention_secs;            /* retention_secs: ended jobs leave the registry; 0: never */
    bool shared_fs_check;           /* shared_fs_check: submit --everywhere refuses node-local file
                                systems; default true (false: tests, one machine) */
    long attempt_timeout_secs;      /* attempt_timeout_secs: 0 = none */
    struct strv attempt_env;        /* attempt_env: the variables of esd's environment that attempts
                                get (NAME, or NAME* for a prefix); default: locale, TZ, GPU
                                selection, Hugging Face endpoint, proxies */
    long attempt_kill_grace_secs;   /* attempt_kill_grace_secs: default 10 */
    long drain_timeout_secs;        /* drain_timeout_secs: default 60 */
    long helper_timeout_secs;       /* helper_timeout_secs: default 21600 */
    long max_infra_failures;        /* max_infra_failures: default 10 */
    enum log_target log_target;     /* log.target: auto (default), journal, stderr */
    char *metrics_path;             /* metrics.path: textfile-collector file; NULL: none */
    long metrics_interval_secs;     /* metrics.interval_secs: default 15 */
    int log_level;                  /* log.level: err, warning, notice, info (default), debug */
    bool run_mode; /* not a key: esd run, one job of the caller's own (oneshot.c) */
};

/* Fills c with the defaults (node_name from the host name). */
void config_defaults(struct esd_conf *c);

/*
 * Reads path over the defaults. On error (unreadable file, invalid YAML,
 * unknown key, wrong type, value out of range) err names the file and
 * line ("esd.yaml:7: unknown key 'slot'; did you mean 'slots'?") and *ret
 * is untouched. The caller frees *ret with config_free.
 */
int config_load(const char *path, struct esd_conf *ret, struct esd_err *err);
void config_free(struct esd_conf *c);

/* The effective configuration as a JSON object (esctl config). */
cJSON *config_json(const struct esd_conf *c);

/* Every key of the table with its type, default and help, for
 * `esd --help-config`: prints "key<TAB>type<TAB>default<TAB>help" lines on
 * stdout, in table order. */
void config_print_keys(void);

/* The key table for tests (the man page and sample must name every key):
 * how many keys, and the dotted name of key i ("ray.mode"; NULL past the
 * end). Static strings. */
size_t config_nkeys(void);
const char *config_key_name(size_t i);

#endif

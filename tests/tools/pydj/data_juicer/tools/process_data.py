"""A TEST STAND-IN for Data-Juicer's tools/process_data.py (dj-process),
NOT Data-Juicer: what esd-dj (daemon/esd-dj.py) runs for an attempt, fast,
for the tests of esd's warm processor (tests/integration/warm.sh).

main() takes exactly the flags esd passes (common/attempt.c
attempt_prepare; spec 8.4), each once with a value, "--flag value" or
"--flag=value": --config --dataset_path --export_path --executor_type
(must be "ray") --ray_address --work_dir --job_id --event_log_dir
--checkpoint_dir --partition_dir; anything else is exit 2. Then, as the
real one, it makes a core/executor/ray_executor.RayExecutor (esd-dj's
claim-ahead gate waits in its __init__) and calls its run(), which does
the work below (work()). The recipe is not applied: the rows are copied
byte for byte. --export_path becomes a directory of two part files named
as Ray names them,
    <uuid>_<uuid>_000000.json   the first ceil(n/2) rows of --dataset_path
    <uuid>_<uuid>_000001.json   the rest (not written when empty)
the same two random uuids for both, so that their order by name is the
input order.

Before that, once the attempt really runs, it writes a probe,
probe-<pid>.json, into the attempt directory (the parent of
--export_path): what the attempt's process is (argv, environment, working
directory, credentials, process group and session, parent, cgroup, open
descriptors and their targets, signal mask and dispositions, umask,
rlimits), and whether it is a fork of esd-dj's warm processor (its command
line is `esd-dj --warm`).

Control files, in <root>/control/ (root: the directory holding
data_juicer/, i.e. data_juicer.root):
  mode         what the attempt does after the probe: "ok" (also when
               missing), "hang" (waits until the file says something
               else, then goes on with that), "hang N" (the same in the
               shard's attempt N only; ok in the others), "sleep S" (S
               seconds, then ok), "exit N" (exit status N, no output),
               "crash" (SIGKILL of itself, no output)
  warm-thread  while it exists, importing this module in a warm processor
               starts a Python thread, which esd-dj must refuse to fork
               from ("threads after the imports")
"""
import json
import os
import resource
import signal
import sys
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONTROL = os.path.join(ROOT, "control")
FLAGS = ("config", "dataset_path", "export_path", "executor_type", "ray_address", "work_dir",
         "job_id", "event_log_dir", "checkpoint_dir", "partition_dir")


def _cmdline(pid="self"):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return None


def _in_warm_processor():
    cmd = _cmdline() or []
    return len(cmd) >= 2 and cmd[-1] == "--warm"


if _in_warm_processor() and os.path.exists(os.path.join(CONTROL, "warm-thread")):
    threading.Thread(target=threading.Event().wait, name="pydj-marker", daemon=True).start()


def _control(name):
    try:
        with open(os.path.join(CONTROL, name)) as f:
            return f.read().strip()
    except OSError:
        return None


def _status():
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return out


def _cgroup():
    """The cgroup v2 path of this process ("0::/..."), or None."""
    try:
        with open("/proc/self/cgroup") as f:
            return next((l.strip() for l in f if l.startswith("0::")), None)
    except OSError:
        return None


def _disposition(h):
    if h == signal.SIG_DFL:
        return "SIG_DFL"
    if h == signal.SIG_IGN:
        return "SIG_IGN"
    if h is None:
        return "None"
    return getattr(h, "__qualname__", repr(h))


def probe(attempt_dir):
    """Writes probe-<pid>.json into attempt_dir (atomically); returns it."""
    pid = os.getpid()
    fd_dir = "/proc/self/fd"
    fds = {}
    listing = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in os.listdir(listing):
            n = int(name)
            if n == listing:
                continue
            try:
                fds[n] = os.readlink("%s/%d" % (fd_dir, n))
            except OSError:
                pass  # closed meanwhile
    finally:
        os.close(listing)
    mask = os.umask(0)
    os.umask(mask)
    st = _status()
    ppid = os.getppid()
    try:
        import ray.data

        preserve = ray.data.DataContext.get_current().execution_options.preserve_order
    except Exception as e:  # (recorded, not fatal)
        preserve = "%s: %s" % (type(e).__name__, e)
    limits = {}
    for k in sorted(dir(resource)):
        if k.startswith("RLIMIT_"):
            limits[k] = list(resource.getrlimit(getattr(resource, k)))
    p = {
        "pid": pid,
        "ppid": ppid,
        "cmdline": _cmdline(),
        "forked": _in_warm_processor(),
        "argv": sys.argv,
        "environ": dict(os.environ),
        "cwd": os.getcwd(),
        "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "egid": os.getegid(),
        "groups": sorted(os.getgroups()),
        "pgid": os.getpgid(0),
        "sid": os.getsid(0),
        "fds": {str(k): v for k, v in sorted(fds.items())},
        "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "SigBlk": st.get("SigBlk"), "SigIgn": st.get("SigIgn"), "SigCgt": st.get("SigCgt"),
        "dispositions": {n: _disposition(signal.getsignal(getattr(signal, n)))
                         for n in ("SIGINT", "SIGPIPE", "SIGTERM", "SIGCHLD")},
        "umask": mask,
        "rlimits": limits,
        "cgroup": _cgroup(),
        "threads": threading.active_count(),
        "preserve_order": preserve,
    }
    path = os.path.join(attempt_dir, "probe-%d.json" % pid)
    with open(path + ".tmp", "w") as f:
        json.dump(p, f, indent=1, sort_keys=True)
    os.rename(path + ".tmp", path)
    return path


def _args(argv):
    got = {}
    it = iter(argv)
    for a in it:
        name, eq, value = a.partition("=")
        if not name.startswith("--") or name[2:] not in FLAGS:
            raise ValueError("unknown argument %r" % a)
        if not eq:
            value = next(it, None)
            if value is None:
                raise ValueError("%s needs a value" % name)
        if name[2:] in got or not value:
            raise ValueError("%s repeated or empty" % name)
        got[name[2:]] = value
    missing = [f for f in FLAGS if f not in got]
    if missing:
        raise ValueError("missing --%s" % ", --".join(missing))
    if got["executor_type"] != "ray":
        raise ValueError("--executor_type must be ray")
    return got


def main():
    try:
        a = _args(sys.argv[1:])
    except ValueError as e:
        print("pydj: %s" % e, file=sys.stderr)
        return 2
    from data_juicer.core.executor import ray_executor

    return ray_executor.RayExecutor(a).run()


def work(a):
    """The attempt's work, in RayExecutor.run(): the probe, the mode, the
    output."""
    export = a["export_path"]
    where = probe(os.path.dirname(export))
    print("pydj: probe %s" % where, flush=True)
    # (the attempt directory's name starts with the attempt's number)
    number = int(os.path.basename(os.path.dirname(export)).split("-")[0])
    mode = _control("mode") or "ok"
    while mode == "hang" or mode == "hang %d" % number:
        time.sleep(0.02)
        mode = _control("mode") or "ok"
    if mode.startswith("hang "):
        mode = "ok"
    word, _, arg = mode.partition(" ")
    if word == "sleep":
        time.sleep(float(arg))
    elif word == "exit":
        print("pydj: exit %s as told" % arg, file=sys.stderr, flush=True)
        return int(arg)
    elif word == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    for d in ("work_dir", "event_log_dir"):
        os.makedirs(a[d], exist_ok=True)
    with open(a["dataset_path"], "rb") as f:
        rows = [r if r.endswith(b"\n") else r + b"\n" for r in f.read().splitlines(keepends=True)]
    half = (len(rows) + 1) // 2
    os.makedirs(export)
    stem = "%s_%s" % (uuid.uuid4().hex, uuid.uuid4().hex)
    for i, part in enumerate((rows[:half], rows[half:])):
        if part:
            with open(os.path.join(export, "%s_%06d.json" % (stem, i)), "wb") as f:
                f.write(b"".join(part))
    print("pydj: %d rows into %s" % (len(rows), export), flush=True)
    print("pydj: done", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""esd-dj: Data-Juicer's process_data for one esd attempt, with the input
order kept.

esd runs it on the interpreter of Data-Juicer's own dj-process (the
"#!" line of the script), or on data_juicer.python with a checkout's
data_juicer.root first on PYTHONPATH, instead of dj-process itself:

    <python> esd-dj --config ... --dataset_path ... (the flags of spec 8.4)

It is dj-process with one difference: Ray Data keeps the order of the
shard's blocks (DataContext.execution_options.preserve_order), so the
files Ray writes, sorted by name as esd materialises them (their names
carry the write task's index, zero-padded to six digits; esd sorts a
longer index by number), hold the shard's rows in input order, and two
runs of one job give the same bytes. Without it a shard's first rows are
in whichever block finished first. Nothing else is needed: every operator
of the plan (reads, map_batches, filters, actor pools, the write) hands
its outputs on in the order of its task indices, which follow its inputs'
order (Ray 2.60, MapOperator's ReorderingBundleQueue), and Data-Juicer's
own partitioned executor sets the same flag for the same reason.


With --warm it is the warm processor instead (serve() below): it imports
Data-Juicer and Ray once and then forks one child per attempt, which runs
exactly what an exec'd esd-dj runs (run()), in about no time.
"""
import sys


def keep_order():
    """Ray Data keeps the order of blocks from here on (every Dataset made
    in this process copies the context current when it is made)."""
    import ray.data

    ctx = ray.data.DataContext.get_current()
    ctx.execution_options.preserve_order = True
    # (in process.log: what an audit of the attempt looks for)
    print("esd-dj: Ray Data preserve_order is on", file=sys.stderr, flush=True)


PREWARM_WORKERS_MAX = 4
# how long an attempt whose slot is free waits for its prewarmed workers
PREWARM_WAIT_SECS = 60.0


def _prewarm_workers():
    """While it waits for its slot: has Ray start this attempt's workers
    and import Data-Juicer in them, which the first tasks of its pipeline
    would otherwise wait for (seconds). One task a CPU of the head, at most
    PREWARM_WORKERS_MAX, of no CPU (the running attempt's tasks do not hold
    them up), each keeping its worker a second after its imports (so that
    the next goes to another worker). Returns the tasks' refs (empty when
    none could be started: whatever goes wrong here only costs the time it
    saves)."""
    try:
        import ray

        @ray.remote(num_cpus=0)
        def warm():
            import time

            import data_juicer.core.data.ray_dataset  # noqa: F401
            import data_juicer.ops  # noqa: F401

            time.sleep(1.0)

        n = int(ray.cluster_resources().get("CPU", 1))
        return [warm.remote() for _ in range(max(1, min(n, PREWARM_WORKERS_MAX)))]
    except Exception as e:
        print("esd-dj: no Ray worker prewarmed (%s: %s)" % (type(e).__name__, e),
              file=sys.stderr)
        sys.stderr.flush()
        return []


def _prewarmed(refs):
    """Waits (PREWARM_WAIT_SECS at most) until the prewarmed workers are
    idle: a task of the pipeline that came while they still import would
    have Ray start one more worker, cold, and that costs more than the
    wait (seconds of CPU on a node whose next attempt prewarms too). It is
    the wait for its Ray workers the pipeline has anyway, cold: it is in
    Data-Juicer's "Running executor" time, as that one is; process.log
    says how long it was."""
    if not refs:
        return
    import time

    t0 = time.monotonic()
    try:
        import ray

        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PREWARM_WAIT_SECS)
        print("esd-dj: %d of %d prewarmed Ray workers ready after a wait of %.2f s"
              % (len(ready), len(refs), time.monotonic() - t0), file=sys.stderr)
    except Exception as e:
        print("esd-dj: the prewarmed Ray workers failed (%s: %s)" % (type(e).__name__, e),
              file=sys.stderr)
    sys.stderr.flush()


def _gate_before_running(fd):
    """Claim-ahead: once Data-Juicer has read its configuration and made
    its Ray executor (connected to the head), have Ray start its workers
    and wait for one byte on fd before it runs; end of file: exit. The
    wait for the slot falls in Data-Juicer's "Initializing executor" time,
    the wait for the workers (_prewarmed) in its "Running executor"."""
    import os
    from data_juicer.core.executor import ray_executor

    made = ray_executor.RayExecutor.__init__

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self._esd_prewarming = _prewarm_workers()
        go = os.read(fd, 1)
        os.close(fd)
        if go != b"r":
            print("esd-dj: esd did not start the attempt: giving it up", file=sys.stderr)
            sys.stderr.flush()
            os._exit(75)

    ran = ray_executor.RayExecutor.run

    def run(self, *args, **kwargs):
        _prewarmed(getattr(self, "_esd_prewarming", None))
        return ran(self, *args, **kwargs)

    ray_executor.RayExecutor.__init__ = init
    ray_executor.RayExecutor.run = run


def run(argv, gate_fd=None):
    """One attempt: Data-Juicer's process_data main with argv as its
    command line. Returns the exit status dj-process would have."""
    keep_order()
    from data_juicer.tools.process_data import main

    if gate_fd is not None:
        _gate_before_running(gate_fd)
    sys.argv = ["dj-process"] + list(argv)
    try:
        rc = main()
    except SystemExit as e:
        rc = e.code
    if rc is None:
        return 0
    if isinstance(rc, int):
        return rc
    print(rc, file=sys.stderr)
    return 1


# ---- the warm processor ----
#
# esd starts `<python> esd-dj --warm` as the attempts' user, with the
# attempts' environment and working directory (those of the job), its
# standard input a SOCK_SEQPACKET socket to esd, its output esd's log.
# Messages are JSON objects, one a packet:
#   warm -> esd   {"ready": true, "pid": P, "secs": S, "threads": T}
#                 or {"ready": false, "error": "..."} (and it exits)
#   esd -> warm   {"id": N, "argv": [...], "env": ["K=V", ...], "cwd": "...",
#                  "keeper": [esd, --esd-keeper, grace_ms, esd_pid]}
#                 with three descriptors (SCM_RIGHTS): the attempt's output
#                 pipe, the keeper's report pipe and a "go" pipe; with
#                 "gate": true a fourth, the gate (claim-ahead: A waits for
#                 one byte on it, as descriptor 3, once its Ray executor is
#                 made, before it runs)
#   C -> esd      {"id": N, "pid": C}, sent by the fork itself: esd reads the
#                 sender's pid and uid that the kernel attaches (SO_PASSCRED)
#   warm -> esd   {"id": N, "error": "..."} when it could not fork
# C, the fork, leads a process group of its own and is a child subreaper;
# it waits for one byte on the go pipe (esd has put it in the attempt's
# cgroup then; end of file: give up), forks the attempt A into its group
# and execs esd's keeper (spawn_keeper_adopted), which reports A's end on
# the report pipe and kills whatever A left, as for an exec'd attempt.
# A has the attempt's environment, working directory, standard streams
# and argv, nothing else of the warm processor's (descriptors closed,
# signals unblocked), and dies with its keeper (PR_SET_PDEATHSIG).
#
# What must not happen before the fork, because a forked child cannot
# inherit it: threads of Python's (threading), a Ray connection
# (ray.init starts threads and sockets), CUDA (an initialised context
# does not survive fork), and a seeded generator of Ray's random ids
# (object, task and actor class ids: a process's first use seeds it, from
# the OS, and a fork copies it: two attempts' drivers would draw the same
# ids, and the second's ray.init fails in Ray's WarmupStore). Importing
# Data-Juicer and Ray does none of it but the last, which @ray.remote
# classes made at import do; they take their ids from the OS here
# (_import_all). The warm processor checks all of it, the ids by drawing
# one in each of two forks, and refuses to serve otherwise. (NumPy's
# OpenBLAS pool and pyarrow's jemalloc thread are native threads that
# both libraries rebuild in a forked child; NumPy's global generator is
# reseeded in A, Python's random reseeds itself. A fork keeps its
# parent's string hash seed, where an exec'd Python draws a new one
# unless PYTHONHASHSEED is set.)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
MAX_PACKET = 1 << 20


def _prctl(option, arg):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, arg, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(%d)" % option)


class _ActorClassIDsFromTheOS:
    """Ray's ActorClassID for the imports, with its random ids from the
    OS: every @ray.remote class made at import (Ray's own, Data-Juicer's)
    takes one, and Ray's C++ generator of random ids, seeded once a process
    and thread at its first use, would be seeded here and the same in every
    fork (two attempts' drivers would then make the same object ids)."""

    def __init__(self, real):
        self._real = real

    def from_random(self):
        import os

        return self._real(os.urandom(self._real.size()))

    def __call__(self, *args, **kwargs):
        return self._real(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _import_all():
    """Imports what an attempt needs, Ray's random ids left unseeded."""
    try:
        import ray.actor as actor

        real = actor.ActorClassID
        actor.ActorClassID = _ActorClassIDsFromTheOS(real)
    except (ImportError, AttributeError):
        actor = None  # (another Ray: _forks_share_ids() judges it)
    try:
        keep_order()
        import data_juicer.tools.process_data  # noqa: F401
        import data_juicer.core.executor.ray_executor  # noqa: F401
    finally:
        if actor is not None:
            actor.ActorClassID = real


def _forks_share_ids():
    """Whether two forks of this process would draw the same random ids
    from Ray (its generator seeded before the fork): two forks each draw
    one; None when they differ, or when the imports did not load Ray's
    core (a fork that loads it seeds its own)."""
    import os

    if "ray._raylet" not in sys.modules:
        return None

    drawn = []
    for _ in range(2):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                from ray._raylet import ObjectID

                os.write(w, ObjectID.from_random().binary())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            drawn.append(f.read())
        os.waitpid(pid, 0)
    if len(drawn[0]) == 0 or drawn[0] == drawn[1]:
        return "Ray's random ids are seeded before the fork (two forks drew %s)" % (
            "nothing" if not drawn[0] else "the same id")
    return None


def _not_forkable():
    """Why this process must not fork attempts, or None."""
    import threading

    if threading.active_count() != 1:
        return "%d Python threads after the imports (%s)" % (
            threading.active_count(), ", ".join(t.name for t in threading.enumerate()))
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return "Ray is initialised after the imports"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "CUDA is initialised after the imports"
    return _forks_share_ids()


# {name: (its value at exec, its value after the imports)} of what differs
_ENV_CHANGES = {}


def _env_changes():
    """What differs between the environment this process was exec'd with
    and os.environ now (None: unset)."""
    import os

    with open("/proc/self/environ", "rb") as f:
        first = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
    first = {os.fsdecode(k): os.fsdecode(v) for k, v in first.items()}
    now = dict(os.environ)
    return {k: (first.get(k), now.get(k)) for k in set(first) | set(now)
            if first.get(k) != now.get(k)}


def _send(sock, obj):
    import json

    sock.send(json.dumps(obj).encode())


def _attempt(req, out_w, keeper_pid, gate_r):
    """In A: become the attempt and run it; never returns."""
    import os
    import signal

    rc = 127
    try:
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != keeper_pid:
            os._exit(127)
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        if gate_r is not None:
            # (descriptor 3 until it opens: then 0, 1 and 2 alone)
            os.dup2(gate_r, 3)
            os.closerange(4, 1 << 20)
        else:
            os.closerange(3, 1 << 20)
        os.environ.clear()
        for e in req["env"]:
            k, sep, v = e.partition("=")
            if sep and k:
                os.environ[k] = v
        # what Python's start (LC_CTYPE's coercion) and the imports (Ray's
        # RAY_CLIENT_MODE) did to the environment, as an exec'd esd-dj has it
        for k, (was, now) in _ENV_CHANGES.items():
            if os.environ.get(k) == was:
                if now is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = now
        os.chdir(req["cwd"])
        # NumPy's global generator, seeded from the OS at its import (here:
        # the warm processor's, the same in every fork), as an exec'd one
        # has it; Python's random reseeds itself in a fork
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        # the dispositions of a Python just started (the keeper's are
        # the defaults)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        rc = run(req["argv"], 3 if gate_r is not None else None)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        rc = 1
    try:
        # loguru's queued sinks (Data-Juicer's enqueue=True) write from
        # threads of their own: their last lines first
        loguru = sys.modules.get("loguru")
        if loguru is not None:
            loguru.logger.remove()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        # (not through Python's exit: the warm processor's atexit
        # handlers and buffers are not the attempt's)
        os._exit(rc)


def _child(sock, req, fds):
    """In C: say who it is, wait for go, fork A, become its keeper; never
    returns."""
    import os
    import signal
    import struct

    out_w, rep_w, go_r = fds[:3]
    gate_r = fds[3] if len(fds) > 3 else None
    try:
        os.setpgid(0, 0)
        _send(sock, {"id": req.get("id"), "pid": os.getpid()})
        sock.close()
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        # (blocked until the keeper reads them from a signalfd)
        signal.pthread_sigmask(signal.SIG_SETMASK, signal.valid_signals())
        for s in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT):
            signal.signal(s, signal.SIG_DFL)
        if os.read(go_r, 1) != b"g":
            os._exit(0)
        os.close(go_r)
        me = os.getpid()
        a = os.fork()
        if a == 0:
            os.close(rep_w)
            _attempt(req, out_w, me, gate_r)
        os.close(out_w)
        if gate_r is not None:
            os.close(gate_r)
        os.set_inheritable(rep_w, True)
        keeper = [str(x) for x in req["keeper"]] + [str(a), str(rep_w)]
        try:
            os.execv(keeper[0], keeper)
        except OSError as e:
            os.write(rep_w, struct.pack("=ii", 3, e.errno or 5))  # REP_SETUP_FAILED
            os.kill(a, signal.SIGKILL)
    except BaseException:
        pass
    os._exit(0)


def _reap():
    """Reaps the forks that ended (keepers, once their attempt is over)."""
    import os

    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def serve():
    """The warm processor's loop (see above)."""
    import json
    import os
    import select
    import socket
    import struct
    import time

    sock = socket.socket(fileno=0)
    t0 = time.monotonic()
    try:
        _import_all()
        why = _not_forkable()
        _ENV_CHANGES.update(_env_changes())
    except BaseException as e:
        why = "cannot import Data-Juicer and Ray: %s: %s" % (type(e).__name__, e)
    if why:
        _send(sock, {"ready": False, "error": why})
        return 1
    threads = len(os.listdir("/proc/self/task"))
    _send(sock, {"ready": True, "pid": os.getpid(), "secs": time.monotonic() - t0,
                 "threads": threads})
    print("esd-dj: warm after %.1f s (%d threads), pid %d" % (time.monotonic() - t0, threads,
                                                             os.getpid()), flush=True)
    fdsize = socket.CMSG_SPACE(4 * 4)  # (three descriptors, or four with a gate)
    while True:
        # (a look every few seconds: the keepers that ended are reaped
        # even while no request comes)
        if not select.select([sock], [], [], 5.0)[0]:
            _reap()
            continue
        try:
            msg, anc, _, _ = sock.recvmsg(MAX_PACKET, fdsize)
        except InterruptedError:
            continue
        fds = []
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                n = len(data) // 4
                fds += list(struct.unpack("=%di" % n, data[:n * 4]))
        _reap()
        if not msg:
            return 0  # esd closed its end: stop
        rid = None
        try:
            req = json.loads(msg)
            rid = req.get("id")
            if (len(fds) != (4 if req.get("gate") else 3) or
                    not isinstance(req.get("argv"), list) or
                    not isinstance(req.get("env"), list) or
                    not isinstance(req.get("cwd"), str) or
                    not isinstance(req.get("keeper"), list) or len(req["keeper"]) != 4):
                raise ValueError("a request needs argv, env, cwd, keeper and its descriptors")
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                _child(sock, req, fds)
        except Exception as e:
            _send(sock, {"id": rid, "error": "%s: %s" % (type(e).__name__, e)})
        finally:
            for fd in fds:
                os.close(fd)


if __name__ == "__main__":
    if sys.argv[1:] == ["--warm"]:
        sys.exit(serve())
    sys.exit(run(sys.argv[1:]))

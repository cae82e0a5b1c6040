#!/usr/bin/env python3
"""esd benchmarks. Every figure is a ratio against a baseline measured in
the same run on the same bytes (one `openssl dgst -sha256` pass), because
these machines are shared and noisy; each command runs --runs times and
the fastest run counts. Peak RSS is that of the measured process alone
(wait4), not of this script.

  bench.py prepare   prepare 16 shards from a deterministic 256 MiB JSONL
  bench.py merge     merge the finished job of the same size
  bench.py prepare-many
                     prepare 100,000 shards (--many, BENCH_MANY_SHARDS) and 16
                     shards of the same 256 MiB (BENCH_MANY_SIZE; the input of
                     bench.py prepare, 2.6 KiB a shard), at most 2 runs
                     (BENCH_MANY_RUNS); the ratio is
                     the time of the first over the second: the per-shard
                     cost of prepare (create, write, close, digest, manifest
                     entry, sync) against its per-byte cost

prepare and merge run with --threads 1, with --threads 2 and with the
default (every CPU available), and print the ratio and throughput of each.

Targets (issue 18, on 2 cores, of the default): prepare <= 2.0, merge <= 1.5;
peak RSS < 64 MiB; (issue 12) prepare-many <= 2.0. Exit status is 0 unless
BENCH_STRICT=1 and a target is missed.

prepare-many makes every run's job in a new directory and removes them all
at the end: on ext4, the inodes of 100,000 files removed just before are
stepped over one by one by the next creations for a minute or more (the
allocator spares recently freed inodes), which would measure the removal.
Two runs take about a minute on a two-core machine."""
import argparse
import os
import shutil
import subprocess
import sys
import time

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = {"prepare": 2.0, "merge": 1.5, "prepare-many": 2.0}
THREADS = (1, 2, 0)  # --threads 1, 2, and none: the CPUs available
RSS_LIMIT_MIB = 64


def run(argv, cwd=None, ret_cpu=None):
    """Runs argv; returns (seconds, peak RSS in KiB); appends its CPU seconds
    (user and system) to ret_cpu if given."""
    t0 = time.perf_counter()
    pid = os.posix_spawnp(argv[0], argv, os.environ) if cwd is None else None
    if pid is None:
        raise RuntimeError("cwd unsupported")
    _, status, usage = os.wait4(pid, 0)
    secs = time.perf_counter() - t0
    if ret_cpu is not None:
        ret_cpu.append(usage.ru_utime + usage.ru_stime)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit("bench: %s exited with %d" % (" ".join(argv), code))
    return secs, usage.ru_maxrss


def best(argv, runs, before=None, ret_cpu=None):
    times, rss = [], 0
    for _ in range(runs):
        if before:
            before()
        secs, kib = run(argv, ret_cpu=ret_cpu)
        times.append(secs)
        rss = max(rss, kib)
    return min(times), rss


def dataset(workdir, size):
    """The deterministic input, generated once per size and cached."""
    cache = os.path.join(TOP, "build", "bench")
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, "input-%d.jsonl" % size)
    if not os.path.exists(path):
        print("bench: generating %d MiB of JSONL (cached in %s)" % (size >> 20, cache))
        tmp = path + ".tmp"
        subprocess.run([sys.executable, os.path.join(TOP, "bench", "genjsonl.py"),
                        "--output", tmp, "--size", str(size)], check=True)
        os.rename(tmp, path)
    return path


def prepare_many(a, work):
    """The prepare-many figure: N shards against 16 of the same bytes."""
    data = dataset(work, a.size)
    recipe = os.path.join(work, "recipe.yaml")
    with open(recipe, "w") as f:
        f.write("executor_type: ray\nprocess:\n  - whitespace_normalization_mapper:\n")
    times = {16: [], a.many: []}
    cpu = {16: [], a.many: []}
    rss = 0
    for i in range(a.runs):
        for n in (16, a.many):
            job = os.path.join(work, "job-%d-%d" % (n, i))
            secs, kib = run([a.esctl, "prepare", "--local", "--config", recipe, "--dataset-path",
                             data, "--job-dir", job, "--num-shards", str(n)], ret_cpu=cpu[n])
            times[n].append(secs)
            rss = max(rss, kib)
    few, many = min(times[16]), min(times[a.many])
    ratio = many / few
    target = TARGETS["prepare-many"]
    ok = ratio <= target and rss / 1024 < RSS_LIMIT_MIB
    print("bench prepare-many: %d MiB, %d vs 16 shards, in %s" % (a.size >> 20, a.many, work))
    print("  esctl prepare --local, 16 shards:    %.3f s" % few)
    print("  esctl prepare --local, %d shards: %.3f s (%.1f us a shard more)"
          % (a.many, many, (many - few) / (a.many - 16) * 1e6))
    print("  CPU (user+system): %.3f s and %.3f s, ratio %.2f (less noisy where CPU is shared)"
          % (min(cpu[16]), min(cpu[a.many]), min(cpu[a.many]) / min(cpu[16])))
    print("  ratio: %.2f (target <= %.1f)   peak RSS: %.1f MiB (limit %d)   %s"
          % (ratio, target, rss / 1024, RSS_LIMIT_MIB, "PASS" if ok else "MISS"))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["prepare", "merge", "prepare-many"])
    ap.add_argument("--esctl", default=os.environ.get("ESCTL", os.path.join(TOP, "esctl")))
    ap.add_argument("--size", type=int, default=None,
                    help="input bytes (BENCH_SIZE: 256 MiB; BENCH_MANY_SIZE: 64 MiB)")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--many", type=int, default=int(os.environ.get("BENCH_MANY_SHARDS", 100000)))
    ap.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS", 3)))
    ap.add_argument("--dir", default=os.environ.get("BENCH_DIR"))
    a = ap.parse_args()
    if a.size is None:
        a.size = int(os.environ.get("BENCH_MANY_SIZE", 256 << 20) if a.what == "prepare-many"
                     else os.environ.get("BENCH_SIZE", 256 << 20))
    if a.what == "prepare-many":
        a.runs = int(os.environ.get("BENCH_MANY_RUNS", min(a.runs, 2)))

    work = a.dir or os.path.join(os.environ.get("TMPDIR", "/tmp"), "esd-bench-%d" % os.getpid())
    os.makedirs(work, exist_ok=True)
    try:
        if a.what == "prepare-many":
            ok = prepare_many(a, work)
            return 1 if not ok and os.environ.get("BENCH_STRICT") == "1" else 0
        data = dataset(work, a.size)
        recipe = os.path.join(work, "recipe.yaml")
        with open(recipe, "w") as f:
            f.write("executor_type: ray\nprocess:\n  - whitespace_normalization_mapper:\n"
                    "  - text_length_filter:\n      min_len: 1\n")
        job = os.path.join(work, "job")
        prep = [a.esctl, "prepare", "--local", "--config", recipe, "--dataset-path", data,
                "--job-dir", job, "--num-shards", str(a.shards)]

        def clean():
            shutil.rmtree(job, ignore_errors=True)

        base, _ = best(["openssl", "dgst", "-sha256", data], a.runs)
        if a.what == "merge":
            clean()
            run(prep)
            subprocess.run([sys.executable, os.path.join(TOP, "tests", "tools", "fake-finish"),
                            "--job-dir", job, "--all", "--hostname", "bench"],
                           check=True, stdout=subprocess.DEVNULL)
            out = os.path.join(work, "merged.jsonl")

            def clean_out():
                # a fresh output each run, as a finished job is merged once
                if os.path.exists(out):
                    os.unlink(out)
        # --threads 1, 2 and the default (every CPU available); the target
        # is the default's
        secs, cpu, rss = {}, {}, 0
        for t in THREADS:
            opt = ["--threads", str(t)] if t else []
            cpu[t] = []
            if a.what == "prepare":
                secs[t], kib = best(prep + opt, a.runs, before=clean, ret_cpu=cpu[t])
            else:
                secs[t], kib = best([a.esctl, "merge", "--local", "--job-dir", job, "--output",
                                     out] + opt, a.runs, before=clean_out, ret_cpu=cpu[t])
            rss = max(rss, kib)
        target = TARGETS[a.what]
        ratio = secs[0] / base
        rss_mib = rss / 1024
        ok = ratio <= target and rss_mib < RSS_LIMIT_MIB
        print("bench %s: %d MiB, %d shards, in %s" % (a.what, a.size >> 20, a.shards, work))
        print("  baseline openssl dgst -sha256: %.3f s (%.0f MB/s)" % (base, a.size / base / 1e6))
        # CPU time (user+system, the least of the runs): what the work costs,
        # less noisy than the wall time where the CPUs are shared
        for t in THREADS:
            print("  esctl %s --local %-13s %.3f s  ratio %.2f  %4.0f MB/s  CPU %.2f s"
                  % (a.what, "--threads %d:" % t if t else
                     "(%d CPUs):" % len(os.sched_getaffinity(0)),
                     secs[t], secs[t] / base, a.size / secs[t] / 1e6, min(cpu[t])))
        print("  ratio: %.2f (target <= %.1f)   peak RSS: %.1f MiB (limit %d)   %s"
              % (ratio, target, rss_mib, RSS_LIMIT_MIB, "PASS" if ok else "MISS"))
        if not ok and os.environ.get("BENCH_STRICT") == "1":
            return 1
        return 0
    finally:
        if not a.dir:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

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


def run(argv):
    """One attempt: Data-Juicer's process_data main with argv as its
    command line. Returns the exit status dj-process would have."""
    keep_order()
    from data_juicer.tools.process_data import main

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


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))

/*
 * oneshot: `esd run`, one job in the foreground, started identically on
 * every node of a scheduler's job (PAI-DLC, Slurm, mpirun, torchrun, a
 * Kubernetes Indexed Job). The nodes of one submission (its run id) meet
 * in the reference's coordination directory next to the job,
 * <parent>/.<job>.dlc-coordination/<first 20 hex of sha256(run id)>/:
 * one node, elected by an O_EXCL lock with a lease, prepares; every node
 * works the job with the daemon's engine (the same claims, leases,
 * attempts, node-local Ray and slots); one node, elected the same way,
 * merges; every node exits with the code recorded there (0 merged, 2
 * failed). An elected node that stops renewing its lock is taken over
 * after its lease. Under a launcher that starts several ranks a host, only
 * the lowest local rank works; the others wait for the same result.
 */
#ifndef ESD_ONESHOT_H
#define ESD_ONESHOT_H

/* esd run ARGS (argv[0] is "run"): returns the exit code. */
int oneshot_main(int argc, char **argv);

#endif

/*
 * Thread names and priorities. A named thread shows up as such in top -H,
 * perf and /proc/PID/task/TID/comm; a background thread (pruning)
 * yields the CPU and the disk to the threads that answer requests.
 */
#include "config.h"

#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/util.h"

/* From linux/ioprio.h, which glibc does not wrap. */
#define IOPRIO_CLASS_SHIFT 13
#define IOPRIO_CLASS_BE 2
#define IOPRIO_WHO_PROCESS 1

void
thread_name(const char *name)
{
	char n[16];

	/* the kernel keeps 15 bytes; PR_SET_NAME names the calling thread */
	snprintf(n, sizeof(n), "%s", name);
	(void)prctl(PR_SET_NAME, n, 0, 0, 0);
}

void
thread_background(const char *name)
{
#ifdef __linux__
	pid_t tid = (pid_t)syscall(SYS_gettid);

	/* best effort: a failure leaves the thread at normal priority */
	(void)setpriority(PRIO_PROCESS, (id_t)tid, 10);
	(void)syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, (int)tid,
	    (IOPRIO_CLASS_BE << IOPRIO_CLASS_SHIFT) | 7);
#endif
	thread_name(name);
}

/*
 * The process's own series, as Prometheus client libraries export them
 * (process_*: memory, CPU, descriptors, start time), and the memory
 * SQLite holds, read from /proc and the C library when /metrics is
 * rendered. Linux; on a system without /proc the /proc-based series read
 * 0.
 */
#include "config.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <sqlite3.h>

#include "util/util.h"

static double start_time;

/* Field i (0: total size, 1: resident) of /proc/self/statm, in bytes. */
static double
statm(int i)
{
	unsigned long v[2] = { 0, 0 };
	FILE *f = fopen("/proc/self/statm", "re");
	long page = sysconf(_SC_PAGESIZE);

	if (f == NULL)
		return 0;
	if (fscanf(f, "%lu %lu", &v[0], &v[1]) != 2)
		v[0] = v[1] = 0;
	fclose(f);
	return (double)v[i] * (double)(page > 0 ? page : 4096);
}

static double
resident(void *arg)
{
	(void)arg;
	return statm(1);
}

static double
virtual(void *arg)
{
	(void)arg;
	return statm(0);
}

static double
cpu(void *arg)
{
	struct rusage ru;

	(void)arg;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
	    ((double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_usec) / 1e6;
}

/* Open descriptors, the one reading the directory aside. */
static double
open_fds(void *arg)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	long n = 0;

	(void)arg;
	if (d == NULL)
		return 0;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return (double)(n > 0 ? n - 1 : 0);
}

static double
max_fds(void *arg)
{
	struct rlimit rl;

	(void)arg;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
		return 0;
	return (double)rl.rlim_cur;
}

static double
started(void *arg)
{
	(void)arg;
	return start_time;
}

static double
sqlite_memory(void *arg)
{
	(void)arg;
	return (double)sqlite3_memory_used();
}

/*
 * When the process started, in seconds since the epoch: now, less the
 * time since its start in clock ticks after boot (field 22 of
 * /proc/self/stat) and the time since boot (/proc/uptime), both on the
 * same clock (btime in /proc/stat is not, once the wall clock was set or
 * in a time namespace); now when they cannot be read.
 */
static double
process_start(void)
{
	char buf[1024], *p;
	unsigned long long ticks = 0;
	double now = (double)now_unix_ms() / 1000.0, up = -1, age;
	long hz = sysconf(_SC_CLK_TCK);
	FILE *f;
	size_t n;
	int i;

	if ((f = fopen("/proc/self/stat", "re")) == NULL)
		return now;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	/* the name, in parentheses, may hold anything: after its end */
	if ((p = strrchr(buf, ')')) == NULL)
		return now;
	/* the space before each of fields 3 to 22 (the start) */
	for (i = 3; i <= 22 && p != NULL; i++)
		p = strchr(p + 1, ' ');
	if (p == NULL || sscanf(p, " %llu", &ticks) != 1 || hz <= 0)
		return now;
	if ((f = fopen("/proc/uptime", "re")) == NULL)
		return now;
	if (fscanf(f, "%lf", &up) != 1)
		up = -1;
	fclose(f);
	age = up - (double)ticks / (double)hz;
	return up < 0 || age < 0 ? now : now - age;
}

/* Register the process's series. */
void
metrics_process_register(void)
{
	start_time = process_start();
	metrics_describe("process_cpu_seconds_total", METRIC_COUNTER,
	    "User and system CPU time spent, in seconds.");
	metrics_describe("process_resident_memory_bytes", METRIC_GAUGE,
	    "Resident memory size, in bytes.");
	metrics_describe("process_virtual_memory_bytes", METRIC_GAUGE,
	    "Virtual memory size, in bytes.");
	metrics_describe("process_open_fds", METRIC_GAUGE,
	    "Open file descriptors.");
	metrics_describe("process_max_fds", METRIC_GAUGE,
	    "The limit on open file descriptors (RLIMIT_NOFILE).");
	metrics_describe("process_start_time_seconds", METRIC_GAUGE,
	    "Start time of the process, in seconds since the epoch.");
	metrics_describe("diverge_sqlite_memory_bytes", METRIC_GAUGE,
	    "Heap memory SQLite holds (page caches, statements), in bytes.");
	metrics_gauge_fn("process_cpu_seconds_total", "", cpu, NULL);
	metrics_gauge_fn("process_resident_memory_bytes", "", resident, NULL);
	metrics_gauge_fn("process_virtual_memory_bytes", "", virtual, NULL);
	metrics_gauge_fn("process_open_fds", "", open_fds, NULL);
	metrics_gauge_fn("process_max_fds", "", max_fds, NULL);
	metrics_gauge_fn("process_start_time_seconds", "", started, NULL);
	metrics_gauge_fn("diverge_sqlite_memory_bytes", "", sqlite_memory,
	    NULL);
}

/*
 * bench/store_bench: throughput and latency of the embedded store with
 * durable writes (WAL, synchronous=FULL, group commit), 64 threads:
 * create, get, status updates across 64 objects, and watch delivery.
 *
 *   bench/store_bench [--threads 64] [--seconds 5] [--dir DIR]
 *
 * Prints ops/s, p50 and p99 per phase and the status-update rate against
 * the 20,000/s target. Run on purpose; not part of make check.
 */
#include "config.h"

#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "k8s/k8s.h"
#include "util/util.h"

static struct k8s_api *api;
static int nthreads = 64;
static int seconds = 5;
static volatile int running;

struct worker {
	int id;
	int phase;
	int64_t *lat_us;
	size_t n, cap;
	int errors;
};

static void
record(struct worker *w, int64_t us)
{
	if (w->n == w->cap) {
		w->cap = w->cap ? w->cap * 2 : 4096;
		w->lat_us = xrealloc(w->lat_us, w->cap * sizeof(int64_t));
	}
	w->lat_us[w->n++] = us;
}

static int64_t
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void *
run(void *arg)
{
	struct worker *w = arg;
	struct k8s_status st = { 0 };
	char name[64];
	int i = 0;

	snprintf(name, sizeof(name), "bench-%d", w->id);
	while (running) {
		int64_t t0 = now_us();
		json_t *o = NULL, *p;
		int rc;

		switch (w->phase) {
		case 0:	/* create */
			snprintf(name, sizeof(name), "c-%d-%d", w->id, i);
			p = json_pack("{s:{s:s},s:{s:s}}", "metadata", "name",
			    name, "spec", "objective", "bench");
			rc = k8s_create(api, &K8S_AGENTTASK, "bench", p, &o,
			    &st);
			json_decref(p);
			break;
		case 1:	/* get */
			rc = k8s_get(api, &K8S_AGENTTASK, "bench", name, &o,
			    &st);
			break;
		default:	/* status update */
			p = json_pack("{s:{s:i,s:s}}", "status", "iteration",
			    i, "phase", "Active");
			rc = k8s_patch(api, &K8S_AGENTTASK, "bench", name, 1, p,
			    &o, &st);
			json_decref(p);
		}
		json_decref(o);
		k8s_status_release(&st);
		if (rc < 0)
			w->errors++;
		else
			record(w, now_us() - t0);
		i++;
	}
	return NULL;
}

static int
cmp64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

struct watcher {
	struct k8s_api *api;
	struct k8s_watch *w;
	uint64_t events;
	unsigned relists;	/* fell out of the window: 410, relist */
	int64_t lag_max_us;
};

static void *
watch_run(void *arg)
{
	struct watcher *wt = arg;
	struct k8s_event ev;
	struct k8s_status st = { 0 };

	while (running) {
		int rc = k8s_watch_next(wt->w, 200, &ev, &st);

		if (rc == 1) {
			wt->events++;
			json_decref(ev.object);
		} else if (rc == K8S_EGONE) {
			/* as a client does: list, and watch on from there */
			struct k8s_list_opts lo = { NULL, NULL, NULL };
			json_t *list = NULL;

			k8s_status_release(&st);
			if (k8s_list(wt->api, &K8S_AGENTTASK, "bench", NULL,
			    &list, &st) < 0)
				break;
			lo.resource_version = json_string_value(json_object_get(
			    json_object_get(list, "metadata"), "resourceVersion"));
			k8s_watch_free(wt->w);
			wt->w = NULL;
			rc = k8s_watch(wt->api, &K8S_AGENTTASK, "bench", &lo,
			    &wt->w, &st);
			json_decref(list);
			if (rc < 0)
				break;
			wt->relists++;
		} else if (rc < 0) {
			fprintf(stderr, "watch: %s\n", st.message);
			k8s_status_release(&st);
			break;
		}
	}
	return NULL;
}

static double
phase(const char *label, int which, struct watcher *wt)
{
	struct worker *ws = xcalloc((size_t)nthreads, sizeof(*ws));
	pthread_t *t = xcalloc((size_t)nthreads, sizeof(*t));
	pthread_t wth;
	int64_t *all, t0, elapsed;
	size_t total = 0, k = 0;
	int i, errors = 0;
	double rate;

	running = 1;
	if (wt != NULL)
		pthread_create(&wth, NULL, watch_run, wt);
	t0 = now_us();
	for (i = 0; i < nthreads; i++) {
		ws[i].id = i;
		ws[i].phase = which;
		pthread_create(&t[i], NULL, run, &ws[i]);
	}
	sleep((unsigned)seconds);
	running = 0;
	for (i = 0; i < nthreads; i++) {
		pthread_join(t[i], NULL);
		total += ws[i].n;
		errors += ws[i].errors;
	}
	elapsed = now_us() - t0;
	if (wt != NULL)
		pthread_join(wth, NULL);
	all = xmalloc((total ? total : 1) * sizeof(int64_t));
	for (i = 0; i < nthreads; i++) {
		memcpy(all + k, ws[i].lat_us, ws[i].n * sizeof(int64_t));
		k += ws[i].n;
		free(ws[i].lat_us);
	}
	qsort(all, total, sizeof(int64_t), cmp64);
	rate = (double)total * 1e6 / (double)elapsed;
	printf("%-16s %10.0f ops/s  p50 %7.2f ms  p99 %7.2f ms  errors %d\n",
	    label, rate, total ? (double)all[total / 2] / 1000.0 : 0.0,
	    total ? (double)all[total * 99 / 100] / 1000.0 : 0.0, errors);
	if (wt != NULL)
		printf("%-16s %10.0f events/s delivered to one watcher "
		    "(%llu events; it fell behind the 10,000-event window and "
		    "relisted %u times)\n", "watch",
		    (double)wt->events * 1e6 / (double)elapsed,
		    (unsigned long long)wt->events, wt->relists);
	free(all);
	free(ws);
	free(t);
	return rate;
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "threads", required_argument, NULL, 't' },
		{ "seconds", required_argument, NULL, 's' },
		{ "dir", required_argument, NULL, 'd' },
		{ NULL, 0, NULL, 0 }
	};
	char tmpl[] = "/tmp/diverge-store-bench-XXXXXX";
	const char *dir = NULL;
	char *path, *cause = NULL;
	struct k8s_list_opts lo = { NULL, NULL, NULL };
	struct k8s_status st = { 0 };
	struct watcher wt;
	double rate;
	int ch, i;

	while ((ch = getopt_long(argc, argv, "t:s:d:", opts, NULL)) != -1) {
		switch (ch) {
		case 't':
			nthreads = (int)strtol(optarg, NULL, 10);
			break;
		case 's':
			seconds = (int)strtol(optarg, NULL, 10);
			break;
		case 'd':
			dir = optarg;
			break;
		default:
			fprintf(stderr, "usage: store_bench [--threads N] "
			    "[--seconds S] [--dir DIR]\n");
			return 2;
		}
	}
	if (nthreads < 1 || nthreads > 1024 || seconds < 1 || seconds > 600) {
		fprintf(stderr, "store_bench: threads 1..1024, seconds "
		    "1..600\n");
		return 2;
	}
	util_json_init();
	log_setup(LOG_ERROR, 0);
	if (dir == NULL)
		dir = mkdtemp(tmpl);
	path = xasprintf("%s/diverge.db", dir);
	if (k8s_embedded_open(&api, path, NULL, &cause) < 0) {
		fprintf(stderr, "store_bench: %s\n", cause);
		return 1;
	}
	printf("embedded store, %d threads, %d s per phase, durable writes "
	    "(WAL, synchronous=FULL), %ld cores\n", nthreads, seconds,
	    sysconf(_SC_NPROCESSORS_ONLN));
	phase("create", 0, NULL);
	/* the 64 objects of the next phases */
	for (i = 0; i < nthreads; i++) {
		json_t *p = json_pack("{s:{s:s},s:{s:s}}", "metadata", "name",
		    "x", "spec", "objective", "bench");
		char name[32];

		snprintf(name, sizeof(name), "bench-%d", i);
		json_object_set_new(json_object_get(p, "metadata"), "name",
		    json_string(name));
		k8s_create(api, &K8S_AGENTTASK, "bench", p, NULL, &st);
		k8s_status_release(&st);
		json_decref(p);
	}
	phase("get", 1, NULL);
	memset(&wt, 0, sizeof(wt));
	wt.api = api;
	lo.resource_version = "0";
	if (k8s_watch(api, &K8S_AGENTTASK, "bench", &lo, &wt.w, &st) < 0) {
		fprintf(stderr, "store_bench: watch: %s\n", st.message);
		return 1;
	}
	rate = phase("status update", 2, &wt);
	k8s_watch_free(wt.w);
	printf("\nstatus updates: %.0f/s against the 20,000/s target: "
	    "%.2fx (%s)\n", rate, rate / 20000.0, rate >= 20000 ? "PASS" :
	    "MISS");
	printf("writes committed: %llu\n",
	    (unsigned long long)k8s_embedded_write_count(api));
	k8s_api_free(api);
	free(path);
	return 0;
}

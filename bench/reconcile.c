/*
 * bench/reconcile: latency of the embedded AgentTask reconciler, with its
 * watches and workers running on the embedded store (durable writes).
 *
 *   bench/reconcile [--tasks 1000] [--inflight 1] [--workers 4] [--dir DIR]
 *
 * For each task: create it, and measure
 *   create-to-children: from the create call to the task's status showing
 *     Provisioning, which the reconciler writes after every child (token
 *     Secret and index entry, Environment, Sandbox, NetworkPolicy);
 *   Ready-to-Active: a player thread acts as the agent-sandbox controller
 *     and writes Ready=True on each new Sandbox; from that write to the
 *     task's status showing Active.
 * Up to --inflight tasks are in progress at once. Prints the median and
 * p99 of both against the 50 ms target. Run on purpose; not in make check.
 */
#include "config.h"

#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "controller/controller.h"
#include "k8s/k8s.h"
#include "meter/meter.h"
#include "util/util.h"

#define NS "bench"
#define TARGET_US 50000

struct sample {
	int64_t created, provisioning, ready, active;
};

static struct k8s_api *api;
static struct sample *samples;
static int ntasks = 1000;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int done_count;
static volatile int running = 1;

static int64_t
now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int
task_index(const char *name)
{
	if (name == NULL || name[0] != 'b')
		return -1;
	return (int)strtol(name + 1, NULL, 10);
}

/* Watch the tasks: note Provisioning and Active. */
static void *
task_watch(void *arg)
{
	struct k8s_watch *w = NULL;
	struct k8s_status st = { 0 };

	(void)arg;
	if (k8s_watch(api, &K8S_AGENTTASK, NS, NULL, &w, &st) < 0) {
		fprintf(stderr, "reconcile: task watch: %s\n", st.message);
		exit(1);
	}
	while (running) {
		struct k8s_event ev;
		const char *phase;
		int i, rc;

		memset(&ev, 0, sizeof(ev));
		rc = k8s_watch_next(w, 100, &ev, &st);
		if (rc < 0) {
			fprintf(stderr, "reconcile: task watch broke: %s\n",
			    st.message);
			exit(1);
		}
		if (rc == 0)
			continue;
		i = task_index(k8s_meta_str(ev.object, "name"));
		phase = json_string_value(json_object_get(json_object_get(
		    ev.object, "status"), "phase"));
		if (i >= 0 && i < ntasks && phase != NULL) {
			int64_t t = now_us();

			pthread_mutex_lock(&mu);
			if (strcmp(phase, "Provisioning") == 0 &&
			    samples[i].provisioning == 0)
				samples[i].provisioning = t;
			if (strcmp(phase, "Active") == 0 &&
			    samples[i].active == 0) {
				samples[i].active = t;
				done_count++;
				pthread_cond_broadcast(&cv);
			}
			pthread_mutex_unlock(&mu);
		}
		json_decref(ev.object);
	}
	k8s_watch_free(w);
	return NULL;
}

/* Play the agent-sandbox controller: Ready=True on each new Sandbox. */
static void *
player(void *arg)
{
	struct k8s_watch *w = NULL;
	struct k8s_status st = { 0 };

	(void)arg;
	if (k8s_watch(api, &K8S_SANDBOX, NS, NULL, &w, &st) < 0) {
		fprintf(stderr, "reconcile: sandbox watch: %s\n", st.message);
		exit(1);
	}
	while (running) {
		struct k8s_event ev;
		char ts[32];
		json_t *status;
		int i, rc;

		memset(&ev, 0, sizeof(ev));
		rc = k8s_watch_next(w, 100, &ev, &st);
		if (rc < 0) {
			fprintf(stderr, "reconcile: sandbox watch broke: %s\n",
			    st.message);
			exit(1);
		}
		if (rc == 0)
			continue;
		i = task_index(k8s_meta_str(ev.object, "name"));
		if (ev.type != K8S_ADDED || i < 0 || i >= ntasks) {
			json_decref(ev.object);
			continue;
		}
		time_rfc3339(now_unix(), ts);
		status = json_pack("{s:[{s:s,s:s,s:s,s:s,s:I,s:s}],s:[s]}",
		    "conditions", "type", "Ready", "status", "True", "reason",
		    "DependenciesReady", "message", "Pod is Ready",
		    "observedGeneration", (json_int_t)k8s_meta_int(ev.object,
		    "generation"), "lastTransitionTime", ts, "podIPs",
		    "10.1.0.1");
		json_object_set_new(ev.object, "status", status);
		if (k8s_update_status(api, &K8S_SANDBOX, NS, k8s_meta_str(
		    ev.object, "name"), ev.object, NULL, &st) < 0) {
			fprintf(stderr, "reconcile: sandbox status: %s\n",
			    st.message);
			exit(1);
		}
		pthread_mutex_lock(&mu);
		samples[i].ready = now_us();
		pthread_mutex_unlock(&mu);
		json_decref(ev.object);
	}
	k8s_watch_free(w);
	return NULL;
}

static int
cmp64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return x < y ? -1 : x > y;
}

static void
report(const char *what, int64_t *v, int n)
{
	int64_t p50, p99;

	qsort(v, (size_t)n, sizeof(*v), cmp64);
	p50 = v[n / 2];
	p99 = v[(n * 99 + 99) / 100 - 1];
	printf("%-20s median %7.2f ms  p99 %7.2f ms  max %7.2f ms  "
	    "(target p99 < %d ms: %s)\n", what, p50 / 1000.0, p99 / 1000.0,
	    v[n - 1] / 1000.0, TARGET_US / 1000, p99 < TARGET_US ? "met" :
	    "MISSED");
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "tasks", required_argument, NULL, 't' },
		{ "inflight", required_argument, NULL, 'i' },
		{ "workers", required_argument, NULL, 'w' },
		{ "dir", required_argument, NULL, 'd' },
		{ NULL, 0, NULL, 0 }
	};
	struct controller_config cc;
	struct meter_config mc;
	struct controller *ctl = NULL;
	struct meter *meter = NULL;
	struct config cfg;
	struct k8s_embedded_config ec = { 100000, 3600, (size_t)1 << 30 };
	unsigned char key[MACAROON_KEY_LEN];
	char tmpl[] = "/tmp/diverge-bench-reconcile-XXXXXX";
	char *dir = NULL, *path, *cause = NULL;
	pthread_t tw, pl;
	int inflight = 1, workers = 4, c, i, n;
	int64_t *a, *b, t0;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			ntasks = (int)strtol(optarg, NULL, 10);
			break;
		case 'i':
			inflight = (int)strtol(optarg, NULL, 10);
			break;
		case 'w':
			workers = (int)strtol(optarg, NULL, 10);
			break;
		case 'd':
			dir = optarg;
			break;
		default:
			fprintf(stderr, "usage: bench/reconcile [--tasks N] "
			    "[--inflight N] [--workers N] [--dir DIR]\n");
			return 2;
		}
	}
	if (ntasks < 1 || inflight < 1 || workers < 1)
		return 2;
	util_json_init();
	log_setup(LOG_ERROR, 0);
	if (dir == NULL && (dir = mkdtemp(tmpl)) == NULL) {
		perror("mkdtemp");
		return 1;
	}
	path = xasprintf("%s/diverge.db", dir);
	if (k8s_embedded_open(&api, path, &ec, &cause) < 0) {
		fprintf(stderr, "reconcile: %s\n", cause);
		return 1;
	}
	config_defaults(&cfg);
	cfg.preview.url_template = xstrdup("https://preview.example.com/"
	    "?_diverge_env={env}");
	random_bytes(key, sizeof(key));
	memset(&mc, 0, sizeof(mc));
	mc.store = api;
	mc.root_key = key;
	mc.location = cfg.meter.public_url;
	mc.default_budget_usd_micro = cfg.defaults.budget_usd_micro;
	mc.default_budget_tokens = cfg.defaults.budget_tokens;
	if (meter_new(&meter, &mc, &cause) < 0) {
		fprintf(stderr, "reconcile: %s\n", cause);
		return 1;
	}
	memset(&cc, 0, sizeof(cc));
	cc.store = api;
	cc.meter = meter;
	cc.cfg = &cfg;
	cc.workers = workers;
	samples = xcalloc((size_t)ntasks, sizeof(*samples));
	pthread_create(&tw, NULL, task_watch, NULL);
	pthread_create(&pl, NULL, player, NULL);
	if (controller_start(&ctl, &cc, &cause) < 0) {
		fprintf(stderr, "reconcile: %s\n", cause);
		return 1;
	}
	t0 = now_us();
	for (i = 0; i < ntasks; i++) {
		struct k8s_status st = { 0 };
		char name[32];
		json_t *task;

		pthread_mutex_lock(&mu);
		while (i - done_count >= inflight)
			pthread_cond_wait(&cv, &mu);
		pthread_mutex_unlock(&mu);
		snprintf(name, sizeof(name), "b%d", i);
		task = json_pack("{s:s,s:s,s:{s:s},s:{s:s,s:{s:s,s:s,s:s},"
		    "s:i,s:[s]}}", "apiVersion", "divergedev.com/v1alpha1",
		    "kind", "AgentTask", "metadata", "name", name, "spec",
		    "objective", "benchmark the reconciler", "repository",
		    "url", "https://github.com/o/r", "baseBranch", "main",
		    "workingBranch", "diverge/bench", "maxIterations", 5,
		    "capabilities", "claude-*");
		pthread_mutex_lock(&mu);
		samples[i].created = now_us();
		pthread_mutex_unlock(&mu);
		if (k8s_create(api, &K8S_AGENTTASK, NS, task, NULL, &st) < 0) {
			fprintf(stderr, "reconcile: create: %s\n", st.message);
			return 1;
		}
		json_decref(task);
	}
	pthread_mutex_lock(&mu);
	while (done_count < ntasks)
		pthread_cond_wait(&cv, &mu);
	pthread_mutex_unlock(&mu);
	printf("%d tasks, %d in flight, %d workers: %.2f s (%.0f tasks/s)\n",
	    ntasks, inflight, workers, (now_us() - t0) / 1e6,
	    ntasks / ((now_us() - t0) / 1e6));
	running = 0;
	controller_stop(ctl);
	pthread_join(tw, NULL);
	pthread_join(pl, NULL);
	a = xcalloc((size_t)ntasks, sizeof(*a));
	b = xcalloc((size_t)ntasks, sizeof(*b));
	for (i = n = 0; i < ntasks; i++) {
		a[n] = samples[i].provisioning - samples[i].created;
		b[n] = samples[i].active - samples[i].ready;
		n++;
	}
	report("create-to-children", a, n);
	report("Ready-to-Active", b, n);
	free(a);
	free(b);
	free(samples);
	meter_free(meter);
	k8s_api_free(api);
	config_release(&cfg);
	free(path);
	return 0;
}

/*
 * bench/jdump: the store's JSON writer (util/jdump.c) against jansson's
 * json_dumps(JSON_COMPACT) on the same documents, in the same run: time
 * per document and the ratio. Prints only; no target.
 *
 * usage: bench/jdump [FILE.json ...]
 * (default: an AgentTask as the store keeps it, and a 13 KB webhook)
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "util/util.h"

static const char task[] =
    "{\"apiVersion\":\"divergedev.com/v1alpha1\",\"kind\":\"AgentTask\","
    "\"metadata\":{\"name\":\"t-7\",\"namespace\":\"bench\",\"uid\":"
    "\"5b8e1f0c-3a1d-4c52-9d3e-2f6a7b8c9d0e\",\"resourceVersion\":\"4711\","
    "\"generation\":1,\"creationTimestamp\":\"2026-11-30T06:00:00Z\","
    "\"labels\":{\"divergedev.com/repo\":\"myorg.checkout\"},"
    "\"annotations\":{\"divergedev.com/provider\":\"github\","
    "\"divergedev.com/project\":\"myorg/checkout\","
    "\"divergedev.com/pr-number\":\"42\"}},\"spec\":{\"objective\":"
    "\"make the checkout endpoint stop doing N+1 queries\",\"budgetUSD\":"
    "\"10.00\",\"maxIterations\":50,\"baseBranch\":\"main\"},\"status\":{"
    "\"phase\":\"Active\",\"run\":1,\"tokensConsumed\":123400,\"costUSD\":"
    "\"1.234000\",\"iteration\":7,\"lastMeterRequestIds\":[\"r-1\",\"r-2\","
    "\"r-3\",\"r-4\",\"r-5\",\"r-6\",\"r-7\",\"r-8\"],\"tokenId\":"
    "\"tok-5b8e1f0c\",\"conditions\":[{\"type\":\"SandboxReady\",\"status\":"
    "\"True\",\"reason\":\"DependenciesReady\",\"message\":\"\","
    "\"lastTransitionTime\":\"2026-11-30T06:00:01Z\"}]}}";

static double
mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static double
per_doc_us(const json_t *v, int fast, int n)
{
	double t0 = mono_us();
	int i;

	for (i = 0; i < n; i++) {
		char *s = fast ? json_dump_compact(v, NULL) :
		    json_dumps(v, JSON_COMPACT);

		free(s);
	}
	return (mono_us() - t0) / n;
}

static void
run(const char *name, const json_t *v)
{
	char *a = json_dumps(v, JSON_COMPACT), *b = json_dump_compact(v, NULL);
	int n = 200000000 / (int)(strlen(a) + 64);
	double slow, fast;

	if (strcmp(a, b) != 0) {
		fprintf(stderr, "jdump: %s: the outputs differ\n", name);
		exit(1);
	}
	slow = per_doc_us(v, 0, n);
	fast = per_doc_us(v, 1, n);
	printf("%-40s %7zu bytes  json_dumps %8.2f us  jdump %8.2f us  "
	    "%.2fx\n", name, strlen(a), slow, fast, slow / fast);
	free(a);
	free(b);
}

int
main(int argc, char **argv)
{
	json_error_t e;
	json_t *v;
	int i;

	util_json_init();
	if (argc > 1) {
		for (i = 1; i < argc; i++) {
			v = json_load_file(argv[i], 0, &e);
			if (v == NULL) {
				fprintf(stderr, "jdump: %s: %s\n", argv[i],
				    e.text);
				return 1;
			}
			run(argv[i], v);
			json_decref(v);
		}
		return 0;
	}
	v = json_loads(task, 0, &e);
	run("AgentTask (as stored)", v);
	json_decref(v);
	v = json_load_file("tests/data/webhooks/github/"
	    "go-playground--pull-request-issue-comment.json", 0, &e);
	if (v != NULL) {
		run("GitHub issue_comment webhook", v);
		json_decref(v);
	}
	return 0;
}

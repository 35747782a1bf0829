/*
 * Micro benchmark of redact() as log_vkv uses it: six secrets registered
 * (a webhook secret, two SCM tokens, a kube token, the macaroon root key
 * and a proxy password), then the short values of typical log lines
 * (a delivery id, a repo, a task name, a message, a URL, an upstream
 * error) redacted over and over. Prints the mean time per value, over
 * all of them and for each; it asserts nothing, the figures are to be
 * compared between builds of the same machine.
 *
 * usage: redact_bench [rounds]   (default 200000)
 */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/util.h"

static const char *const secrets[] = {
	"whsec-6f1c0e2b9d8a7f3e4c5b6a7d8e9f0a1b",
	"ghp_R8xq2Lm0vZ7kT4nB9cW1yH6jF3sD5aP0gE2u",
	"glpat-Zx81mQpL0vNw7Rk2TcYh",
	"kube-tok-7Hq2Vn9Lm4Xc8Rb1Tz6Ws3Pk",
	"5e3f9a0c7b1d2e4f6a8c0e2f4a6b8d0c1e3f5a7b9d1f3e5a7c9e1f3a5b7d9f1e",
	"pr0xy-Passw0rd!",
};

static const char *const values[] = {
	"9f7c1e20-3b4a-11ef-8a5d-0242ac120002",	/* a delivery id */
	"myorg/checkout",
	"fix-pr-42",
	"webhook accepted",
	"https://api.github.com/repos/myorg/checkout/issues/42/comments",
	"HTTP 403: Resource not accessible by integration",
};

static double
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Mean ns of one redact() of v over rounds. */
static double
time_value(const char *v, size_t rounds)
{
	double t0;
	size_t i;

	t0 = now_ns();
	for (i = 0; i < rounds; i++)
		free(redact(v));
	return (now_ns() - t0) / (double)rounds;
}

int
main(int argc, char **argv)
{
	size_t i, rounds = 200000;
	double t, total = 0;

	if (argc > 1) {
		rounds = strtoul(argv[1], NULL, 10);
		if (rounds == 0)
			rounds = 200000;
	}
	for (i = 0; i < ARRAY_SIZE(secrets); i++)
		redact_secret_add(secrets[i], strlen(secrets[i]));
	for (i = 0; i < ARRAY_SIZE(values); i++)	/* warm up */
		time_value(values[i], rounds / 10 + 1);
	printf("redact_bench: %zu secrets, %zu values, rounds=%zu\n",
	    ARRAY_SIZE(secrets), ARRAY_SIZE(values), rounds);
	for (i = 0; i < ARRAY_SIZE(values); i++) {
		t = time_value(values[i], rounds);
		total += t;
		printf("%8.1f ns  %s\n", t, values[i]);
	}
	printf("%8.1f ns  mean per value\n", total / ARRAY_SIZE(values));
	redact_secrets_clear();
	return 0;
}

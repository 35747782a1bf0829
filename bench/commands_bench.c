/*
 * Micro benchmark of commands_parse(): the time to parse a realistic
 * 64 KB comment (prose, code fences, quotes, HTML comments, inline code
 * and a few commands), over many runs. Prints the median and the 99th
 * percentile and their ratio to the 1 ms target; exits 1 when the median
 * misses the target.
 *
 * usage: commands_bench [runs]   (default 1000)
 */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "scm/commands.h"
#include "util/util.h"

#define BODY_SIZE 65536
#define TARGET_NS 1000000.0

static const char *const parts[] = {
	"Thanks for the patch! I had a look at the checkout flow and the "
	"query count is still growing with the cart size. See the trace "
	"below; `CartItem.load` runs once per line item.\n\n",
	"```python\nfor item in cart.items:\n    item.product.load()  # N+1\n"
	"/diverge pause\n```\n\n",
	"> /diverge fix something else entirely\n> quoted from the last "
	"review, not a command\n\n",
	"<!-- reviewer checklist\n/diverge budget +$500\n- [ ] tests\n-->\n",
	"Some *emphasis*, a [link](https://example.com/a?b=c) and a list:\n"
	"- first `item`\n- second item with `/diverge status` in code\n"
	"  1. nested\n\n",
	"    indented code block\n    /diverge pause\n\n",
	"~~~diff\n- old line\n+ new line\n~~~\n\n",
	"Plain paragraph text that goes on for a while so that the body "
	"has the shape of a long review comment, with punctuation, numbers "
	"like 42 and 3.14, and an <b>inline</b> tag.\n\n",
};

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static char *
build_body(size_t *len)
{
	struct buf b;
	size_t i = 0;

	buf_init(&b, BODY_SIZE);
	buf_addstr(&b, "/diverge status\n\n");
	while (b.len < BODY_SIZE - 512) {
		if (b.len > BODY_SIZE / 2 && b.len < BODY_SIZE / 2 + 600)
			buf_addstr(&b, "/diverge guide prefer one query with a "
			    "join over prefetching\nin a loop\n\n");
		buf_addstr(&b, parts[i++ % ARRAY_SIZE(parts)]);
	}
	buf_addstr(&b, "/diverge budget +$5 1M\n");
	while (b.len < BODY_SIZE)
		buf_add(&b, b.len % 64 == 63 ? "\n" : "x", 1);
	*len = b.len;
	return buf_detach(&b, NULL);
}

static double
now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int
main(int argc, char **argv)
{
	struct cmd_result r;
	size_t len, i, runs = 1000, lines = 1;
	double *t, t0, median, p99;
	char *body, *cause = NULL;

	if (argc > 1) {
		runs = strtoul(argv[1], NULL, 10);
		if (runs == 0)
			runs = 1000;
	}
	if (commands_init(&cause) < 0) {
		fprintf(stderr, "commands_bench: %s\n", cause);
		free(cause);
		return 2;
	}
	body = build_body(&len);
	for (i = 0; i < len; i++)
		lines += body[i] == '\n';
	/* the body must parse to its three commands */
	if (commands_parse(body, len, NULL, &r) != 0 || r.error != NULL ||
	    r.ncmds != 3) {
		fprintf(stderr, "commands_bench: unexpected parse: %s\n",
		    r.error != NULL ? r.error : "wrong command count");
		return 2;
	}
	commands_result_release(&r);
	for (i = 0; i < 20; i++) {	/* warm up */
		commands_parse(body, len, NULL, &r);
		commands_result_release(&r);
	}
	t = xcalloc(runs, sizeof(*t));
	for (i = 0; i < runs; i++) {
		t0 = now_ns();
		commands_parse(body, len, NULL, &r);
		t[i] = now_ns() - t0;
		commands_result_release(&r);
	}
	qsort(t, runs, sizeof(*t), cmp_double);
	median = runs % 2 ? t[runs / 2] : (t[runs / 2 - 1] + t[runs / 2]) / 2;
	p99 = t[(runs * 99 + 99) / 100 - 1];
	printf("commands_bench: body=%zu bytes lines=%zu runs=%zu\n", len,
	    lines, runs);
	printf("median=%.1f us p99=%.1f us min=%.1f us max=%.1f us\n",
	    median / 1e3, p99 / 1e3, t[0] / 1e3, t[runs - 1] / 1e3);
	printf("target=1000 us median/target=%.3f p99/target=%.3f %s\n",
	    median / TARGET_NS, p99 / TARGET_NS,
	    median <= TARGET_NS ? "ok" : "MISSED");
	free(t);
	free(body);
	return median <= TARGET_NS ? 0 : 1;
}

/* Small helpers shared by the unit tests. */
#ifndef DIVERGE_TESTUTIL_H
#define DIVERGE_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

/* Read $top_srcdir/rel into a new NUL-terminated buffer; aborts if absent. */
static inline char *
test_read_file(const char *rel, size_t *len)
{
	const char *top = getenv("top_srcdir");
	char *path = xasprintf("%s/%s", top ? top : ".", rel);
	FILE *f = fopen(path, "rb");
	struct buf b;
	char chunk[8192];
	size_t n;

	if (f == NULL) {
		fprintf(stderr, "# cannot open %s\n", path);
		abort();
	}
	buf_init(&b, 64u << 20);
	while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
		buf_add(&b, chunk, n);
	fclose(f);
	free(path);
	if (b.data == NULL)
		buf_add(&b, "", 0);
	return buf_detach(&b, len);
}

#endif

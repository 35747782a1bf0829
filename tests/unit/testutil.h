/* Small helpers shared by the unit tests. */
#ifndef DIVERGE_TESTUTIL_H
#define DIVERGE_TESTUTIL_H

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "util/util.h"

/* ---- temporary directories, removed when the test program exits ---- */

static char **test_tmpdirs;
static size_t test_ntmpdirs;
static pid_t test_tmpdirs_pid;
static pthread_mutex_t test_tmpdirs_mu = PTHREAD_MUTEX_INITIALIZER;

/* rm -r path (no symbolic link followed). */
static void
test_rm_tree(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	struct stat st;

	if (d == NULL) {
		remove(path);
		return;
	}
	while ((e = readdir(d)) != NULL) {
		char *p;

		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		p = xasprintf("%s/%s", path, e->d_name);
		if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
			test_rm_tree(p);
		else
			unlink(p);
		free(p);
	}
	closedir(d);
	rmdir(path);
}

static void
test_tmpdirs_remove(void)
{
	size_t i;

	/* a forked child exits too: only the program that made them */
	if (getpid() != test_tmpdirs_pid || getenv("DIVERGE_KEEP_TMP"))
		return;
	for (i = 0; i < test_ntmpdirs; i++) {
		test_rm_tree(test_tmpdirs[i]);
		free(test_tmpdirs[i]);
	}
	free(test_tmpdirs);
	test_tmpdirs = NULL;
	test_ntmpdirs = 0;
}

/*
 * A new directory /tmp/diverge-<what>-XXXXXX, removed with everything in
 * it when the program exits (kept with DIVERGE_KEEP_TMP set): the tests'
 * databases reach gigabytes, and a suite run must not leave them behind.
 */
static inline char *
test_tmpdir(const char *what)
{
	char *d = xasprintf("/tmp/diverge-%s-XXXXXX", what);

	if (mkdtemp(d) == NULL) {
		fprintf(stderr, "# mkdtemp %s failed\n", d);
		abort();
	}
	pthread_mutex_lock(&test_tmpdirs_mu);
	if (test_tmpdirs_pid == 0) {
		test_tmpdirs_pid = getpid();
		atexit(test_tmpdirs_remove);
	}
	test_tmpdirs = xrealloc(test_tmpdirs, (test_ntmpdirs + 1) *
	    sizeof(*test_tmpdirs));
	test_tmpdirs[test_ntmpdirs++] = xstrdup(d);
	pthread_mutex_unlock(&test_tmpdirs_mu);
	return d;
}

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

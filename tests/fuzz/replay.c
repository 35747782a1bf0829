/*
 * Replays a fuzz target's seed corpus as a TAP test when the build has no
 * libFuzzer: every file of $top_srcdir/tests/fuzz/corpus/<target>/ (and any
 * paths given as arguments) is fed to LLVMFuzzerTestOneInput once. A crash
 * or sanitizer report fails the test.
 */
#include "config.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int
run_file(const char *path, int n)
{
	FILE *f = fopen(path, "rb");
	struct buf b;
	char chunk[65536];
	size_t got;

	if (f == NULL) {
		printf("not ok %d - %s: cannot open\n", n, path);
		return -1;
	}
	buf_init(&b, 64u << 20);
	while ((got = fread(chunk, 1, sizeof(chunk), f)) > 0)
		if (buf_add(&b, chunk, got) < 0)
			break;
	fclose(f);
	LLVMFuzzerTestOneInput((const uint8_t *)(b.data ? b.data : ""),
	    b.len);
	buf_release(&b);
	printf("ok %d - %s\n", n, strrchr(path, '/') ? strrchr(path, '/') + 1 :
	    path);
	fflush(stdout);
	return 0;
}

static int
cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int
main(int argc, char **argv)
{
	const char *top = getenv("top_srcdir");
	const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 :
	    argv[0];
	char **files = NULL;
	size_t nfiles = 0, i;
	int failed = 0;
	char *dir;
	DIR *d;
	struct dirent *e;

	if (strncmp(name, "lt-", 3) == 0)
		name += 3;
	if (strncmp(name, "fuzz_", 5) == 0)
		name += 5;
	for (i = 1; i < (size_t)argc; i++) {
		files = xrealloc(files, (nfiles + 1) * sizeof(*files));
		files[nfiles++] = xstrdup(argv[i]);
	}
	if (argc == 1) {
		dir = xasprintf("%s/tests/fuzz/corpus/%s", top ? top : ".",
		    name);
		d = opendir(dir);
		if (d == NULL) {
			printf("1..0 # SKIP no corpus at %s\n", dir);
			free(dir);
			return 0;
		}
		while ((e = readdir(d)) != NULL) {
			if (e->d_name[0] == '.')
				continue;
			files = xrealloc(files, (nfiles + 1) * sizeof(*files));
			files[nfiles++] = xasprintf("%s/%s", dir, e->d_name);
		}
		closedir(d);
		free(dir);
	}
	qsort(files, nfiles, sizeof(*files), cmp);
	printf("1..%zu\n", nfiles);
	for (i = 0; i < nfiles; i++) {
		if (run_file(files[i], (int)i + 1) < 0)
			failed = 1;
		free(files[i]);
	}
	free(files);
	return failed;
}

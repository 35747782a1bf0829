/* Allocation that aborts on failure (tmux, git). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "util/util.h"

static void
oom(size_t n)
{
	fprintf(stderr, "fatal: out of memory allocating %zu bytes\n", n);
	abort();
}

/* Allocate n bytes or abort. */
void *
xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (p == NULL)
		oom(n);
	return p;
}

/* Allocate zeroed memory or abort. */
void *
xcalloc(size_t nmemb, size_t size)
{
	void *p = calloc(nmemb ? nmemb : 1, size ? size : 1);

	if (p == NULL)
		oom(nmemb * size);
	return p;
}

/* Resize or abort. */
void *
xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);

	if (q == NULL)
		oom(n);
	return q;
}

/* Duplicate a string or abort. */
char *
xstrdup(const char *s)
{
	return xstrndup(s, strlen(s));
}

/* Duplicate n bytes as a string or abort. */
char *
xstrndup(const char *s, size_t n)
{
	char *p = xmalloc(n + 1);

	memcpy(p, s, n);
	p[n] = '\0';
	return p;
}

/* vasprintf or abort. */
char *
xvasprintf(const char *fmt, va_list ap)
{
	va_list aq;
	int n;
	char *p;

	va_copy(aq, ap);
	n = vsnprintf(NULL, 0, fmt, aq);
	va_end(aq);
	if (n < 0)
		oom(0);
	p = xmalloc((size_t)n + 1);
	vsnprintf(p, (size_t)n + 1, fmt, ap);
	return p;
}

/* asprintf or abort. */
char *
xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *p;

	va_start(ap, fmt);
	p = xvasprintf(fmt, ap);
	va_end(ap);
	return p;
}

static void *
json_xmalloc(size_t n)
{
	return xmalloc(n);
}

/* Make jansson allocate through xmalloc. */
void
util_json_init(void)
{
	json_set_alloc_funcs(json_xmalloc, free);
}

/*
 * ThreadSanitizer builds (./configure --enable-tsan) carry their own
 * settings, so that every binary (diverged, diverge, each test) gets them
 * without TSAN_OPTIONS:
 *
 *  - jansson's json_incref() and json_decref() (inline, in jansson.h)
 *    read the reference count plainly, to pass over the static values
 *    that are never freed, before they change it atomically. A value
 *    shared between threads (the store publishes its objects that way)
 *    makes TSan report that read as a race with the other thread's
 *    atomic change. It is not one: the count of a shared value is never
 *    the static mark. Freeing a value another thread still uses would be
 *    hidden too, when it goes through json_decref: ASan (CI) catches it.
 *  - The crash tests fork a child that starts threads of its own;
 *    TSan kills such a child unless told otherwise (die_after_fork).
 */
#if defined(__SANITIZE_THREAD__)
#define DIVERGE_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DIVERGE_TSAN 1
#endif
#endif
#ifdef DIVERGE_TSAN
const char *__tsan_default_suppressions(void);
const char *__tsan_default_options(void);

const char *
__tsan_default_suppressions(void)
{
	return "race:json_incref\nrace:json_decref\n";
}

const char *
__tsan_default_options(void)
{
	return "die_after_fork=0:second_deadlock_stack=1";
}
#endif

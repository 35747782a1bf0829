/*
 * A small Prometheus registry: families declared once, series keyed by
 * their preformatted label set. A mutex guards everything; the number of
 * series is small (routes x codes, providers x reasons). The one
 * exception is a histogram its owner keeps (struct metrics_hist): a hot
 * path updates it with atomics alone, the registry only reads it when
 * rendering.
 */
#include "config.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

static const double buckets[] = {
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
	1, 2.5, 5, 10
};
#define NBUCKETS ARRAY_SIZE(buckets)

struct series {
	struct series *next;
	char *labels;
	double value;		/* counter, gauge, or histogram sum */
	uint64_t count;		/* histogram */
	uint64_t *bucket;	/* histogram: one per bound of its family */
	double (*fn)(void *);
	void *arg;
	struct metrics_hist *hist;	/* kept by its owner, or NULL */
};

struct family {
	struct family *next;
	const char *name;
	const char *help;
	char *owned_name;	/* set when the family was never declared */
	enum metric_type type;
	const double *bounds;	/* histogram: upper bounds, ascending */
	size_t nbounds;
	struct series *series;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct family *families;

static struct family *
family_get(const char *name)
{
	struct family *f;

	for (f = families; f != NULL; f = f->next)
		if (strcmp(f->name, name) == 0)
			return f;
	return NULL;
}

/* Declare a family once, in the order of the first declarations. */
static void
describe(const char *name, enum metric_type type, const char *help,
    const double *bounds, size_t nbounds)
{
	struct family *f, **tail;

	pthread_mutex_lock(&lock);
	if (family_get(name) == NULL) {
		f = xcalloc(1, sizeof(*f));
		f->name = name;
		f->help = help;
		f->type = type;
		f->bounds = bounds;
		f->nbounds = nbounds;
		for (tail = &families; *tail != NULL; tail = &(*tail)->next)
			;
		*tail = f;
	}
	pthread_mutex_unlock(&lock);
}

/* Declare a histogram family with its own bounds (idempotent). */
void
metrics_describe_buckets(const char *name, const char *help,
    const double *bounds, size_t nbounds)
{
	describe(name, METRIC_HISTOGRAM, help, bounds, nbounds);
}

/* Declare a family (idempotent). */
void
metrics_describe(const char *name, enum metric_type type, const char *help)
{
	describe(name, type, help, buckets, NBUCKETS);
}

/* The series of a family (made when new); *fout its family. */
static struct series *
series_get(const char *name, const char *labels, enum metric_type type,
    struct family **fout)
{
	struct family *f = family_get(name);
	struct series *s;

	if (f == NULL) {
		f = xcalloc(1, sizeof(*f));
		f->owned_name = xstrdup(name);
		f->name = f->owned_name;
		f->help = "";
		f->type = type;
		f->bounds = buckets;
		f->nbounds = NBUCKETS;
		f->next = families;
		families = f;
	}
	if (fout != NULL)
		*fout = f;
	for (s = f->series; s != NULL; s = s->next)
		if (strcmp(s->labels, labels) == 0)
			return s;
	s = xcalloc(1, sizeof(*s));
	s->labels = xstrdup(labels);
	s->bucket = xcalloc(f->nbounds ? f->nbounds : 1, sizeof(*s->bucket));
	s->next = f->series;
	f->series = s;
	return s;
}

/* Add v to a counter. */
void
metrics_inc(const char *name, const char *labels, double v)
{
	pthread_mutex_lock(&lock);
	series_get(name, labels, METRIC_COUNTER, NULL)->value += v;
	pthread_mutex_unlock(&lock);
}

/* Start counters at 0 (see util.h). */
void
metrics_zero(const char *name, const char *const *labelsets)
{
	for (; *labelsets != NULL; labelsets++)
		metrics_inc(name, *labelsets, 0);
}

/* Set a gauge. */
void
metrics_set(const char *name, const char *labels, double v)
{
	pthread_mutex_lock(&lock);
	series_get(name, labels, METRIC_GAUGE, NULL)->value = v;
	pthread_mutex_unlock(&lock);
}

/* Observe a histogram sample. */
void
metrics_observe(const char *name, const char *labels, double v)
{
	struct family *f;
	struct series *s;
	size_t i;

	pthread_mutex_lock(&lock);
	s = series_get(name, labels, METRIC_HISTOGRAM, &f);
	s->value += v;
	s->count++;
	for (i = 0; i < f->nbounds; i++)
		if (v <= f->bounds[i])
			s->bucket[i]++;
	pthread_mutex_unlock(&lock);
}

/* Add a sample to an owner's histogram: atomics only (see util.h). */
void
metrics_hist_observe(struct metrics_hist *h, double v)
{
	uint64_t old, new;
	double sum;
	size_t i;

	for (i = 0; i < h->nbounds && v > h->bounds[i]; i++)
		;
	atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
	/* no atomic add for a double: swap its bits until no one else did */
	old = atomic_load_explicit(&h->sum_bits, memory_order_relaxed);
	do {
		memcpy(&sum, &old, sizeof(sum));
		sum += v;
		memcpy(&new, &sum, sizeof(new));
	} while (!atomic_compare_exchange_weak_explicit(&h->sum_bits, &old,
	    new, memory_order_relaxed, memory_order_relaxed));
}

/* The samples of an owner's histogram so far. */
uint64_t
metrics_hist_count(struct metrics_hist *h)
{
	uint64_t n = 0;
	size_t i;

	for (i = 0; i <= h->nbounds; i++)
		n += atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
	return n;
}

/* Render h as the series labels of the histogram family name. */
void
metrics_hist_register(const char *name, const char *labels,
    struct metrics_hist *h)
{
	pthread_mutex_lock(&lock);
	series_get(name, labels, METRIC_HISTOGRAM, NULL)->hist = h;
	pthread_mutex_unlock(&lock);
}

/* A metrics_gauge_fn reader of an atomic_uint_fast64_t (util.h). */
double
metrics_read_atomic(void *arg)
{
	return (double)atomic_load_explicit((atomic_uint_fast64_t *)arg,
	    memory_order_relaxed);
}

/* A gauge computed when rendered. */
void
metrics_gauge_fn(const char *name, const char *labels, double (*fn)(void *),
    void *arg)
{
	struct series *s;

	pthread_mutex_lock(&lock);
	s = series_get(name, labels, METRIC_GAUGE, NULL);
	s->fn = fn;
	s->arg = arg;
	pthread_mutex_unlock(&lock);
}

static const char *
type_name(enum metric_type t)
{
	switch (t) {
	case METRIC_COUNTER:
		return "counter";
	case METRIC_GAUGE:
		return "gauge";
	default:
		return "histogram";
	}
}

/*
 * An owner's histogram, read into s (whose bucket array it may replace):
 * cumulative buckets, and the count their total, so that +Inf and _count
 * agree however the owner races with this read.
 */
static void
hist_snapshot(struct series *s, const double **bounds, size_t *nbounds)
{
	struct metrics_hist *h = s->hist;
	uint64_t bits, n = 0;
	size_t i;

	*bounds = h->bounds;
	*nbounds = h->nbounds;
	s->bucket = xrealloc(s->bucket, (h->nbounds + 1) *
	    sizeof(*s->bucket));
	for (i = 0; i <= h->nbounds; i++) {
		n += atomic_load_explicit(&h->bucket[i], memory_order_relaxed);
		s->bucket[i] = n;
	}
	s->count = n;
	bits = atomic_load_explicit(&h->sum_bits, memory_order_relaxed);
	memcpy(&s->value, &bits, sizeof(s->value));
}

/*
 * A sample value as the exposition format spells it: Go's ParseFloat
 * takes "NaN", "+Inf" and "-Inf", not C's "nan", "-nan" or "inf".
 */
static const char *
fmt_value(char out[32], double v)
{
	if (isnan(v))
		return "NaN";
	if (isinf(v))
		return v > 0 ? "+Inf" : "-Inf";
	snprintf(out, 32, "%.17g", v);
	return out;
}

/* HELP text: a backslash and a line break escaped, as the format says. */
static int
render_help(struct buf *b, const struct family *f)
{
	const char *p;
	int r = buf_printf(b, "# HELP %s ", f->name);

	for (p = f->help; *p != '\0' && r == 0; p++)
		r = *p == '\\' ? buf_add(b, "\\\\", 2) :
		    *p == '\n' ? buf_add(b, "\\n", 2) :
		    buf_add(b, p, 1);
	return r | buf_add(b, "\n", 1);
}

static int
render_series(struct buf *b, const struct family *f, struct series *s)
{
	const char *sep = s->labels[0] ? "," : "";
	const double *bounds = f->bounds;
	size_t i, nbounds = f->nbounds;
	char num[32];
	int r = 0;

	if (f->type != METRIC_HISTOGRAM) {
		double v = s->fn != NULL ? s->fn(s->arg) : s->value;

		if (s->labels[0])
			return buf_printf(b, "%s{%s} %s\n", f->name,
			    s->labels, fmt_value(num, v));
		return buf_printf(b, "%s %s\n", f->name, fmt_value(num, v));
	}
	if (s->hist != NULL)
		hist_snapshot(s, &bounds, &nbounds);
	for (i = 0; i < nbounds && r == 0; i++)
		r = buf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", f->name,
		    s->labels, sep, bounds[i],
		    (unsigned long long)s->bucket[i]);
	r |= buf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", f->name,
	    s->labels, sep, (unsigned long long)s->count);
	if (s->labels[0]) {
		r |= buf_printf(b, "%s_sum{%s} %s\n", f->name, s->labels,
		    fmt_value(num, s->value));
		r |= buf_printf(b, "%s_count{%s} %llu\n", f->name, s->labels,
		    (unsigned long long)s->count);
	} else {
		r |= buf_printf(b, "%s_sum %s\n", f->name,
		    fmt_value(num, s->value));
		r |= buf_printf(b, "%s_count %llu\n", f->name,
		    (unsigned long long)s->count);
	}
	return r;
}

/* Render all families in the Prometheus text exposition format. */
int
metrics_render(struct buf *b)
{
	struct family *f;
	struct series *s;
	int r = 0;

	pthread_mutex_lock(&lock);
	for (f = families; f != NULL && r == 0; f = f->next) {
		if (f->help[0])
			r |= render_help(b, f);
		r |= buf_printf(b, "# TYPE %s %s\n", f->name,
		    type_name(f->type));
		for (s = f->series; s != NULL && r == 0; s = s->next)
			r |= render_series(b, f, s);
	}
	pthread_mutex_unlock(&lock);
	return r ? -1 : 0;
}

/* Escape a label value. */
char *
metrics_label_escape(const char *s)
{
	struct buf b;

	buf_init(&b, 4096);
	for (; *s; s++) {
		if (*s == '\\')
			buf_addstr(&b, "\\\\");
		else if (*s == '"')
			buf_addstr(&b, "\\\"");
		else if (*s == '\n')
			buf_addstr(&b, "\\n");
		else if (buf_add(&b, s, 1) < 0)
			break;
	}
	if (b.data == NULL)
		return xstrdup("");
	return buf_detach(&b, NULL);
}

/* Drop every series and family (tests only; not thread-safe w.r.t. use). */
void
metrics_reset(void)
{
	struct family *f, *fn;
	struct series *s, *sn;

	pthread_mutex_lock(&lock);
	for (f = families; f != NULL; f = fn) {
		fn = f->next;
		for (s = f->series; s != NULL; s = sn) {
			sn = s->next;
			free(s->bucket);
			free(s->labels);
			free(s);
		}
		free(f->owned_name);
		free(f);
	}
	families = NULL;
	pthread_mutex_unlock(&lock);
}

/* Clocks and time formatting. */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/util.h"

/* The time ms from now on clock clk, for pthread_cond_timedwait. */
void
time_deadline(clockid_t clk, int64_t ms, struct timespec *ts)
{
	clock_gettime(clk, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (ms % 1000) * 1000000;
	if (ts->tv_nsec >= 1000000000) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000;
	}
}

/* A condition variable whose deadlines are monotonic. */
void
time_cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t ca;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(cv, &ca);
	pthread_condattr_destroy(&ca);
}

/* Monotonic clock in milliseconds. */
int64_t
now_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Monotonic microseconds, to time what takes less than a millisecond. */
int64_t
now_mono_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Wall clock in seconds. */
int64_t
now_unix(void)
{
	return (int64_t)time(NULL);
}

/* Wall clock in milliseconds. */
int64_t
now_unix_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* 0000-01-01T00:00:00Z and 9999-12-31T23:59:59Z: RFC 3339's years */
#define RFC3339_MIN_S INT64_C(-62167219200)
#define RFC3339_MAX_S INT64_C(253402300799)

/*
 * Format unix seconds as RFC 3339 UTC, clamped to the four-digit years
 * RFC 3339 has (and time_parse_rfc3339 reads back): a time past them is
 * written as the last second there is, never from a struct tm gmtime_r
 * could not fill.
 */
void
time_rfc3339(int64_t unix_s, char out[32])
{
	time_t t = (time_t)(unix_s < RFC3339_MIN_S ? RFC3339_MIN_S :
	    unix_s > RFC3339_MAX_S ? RFC3339_MAX_S : unix_s);
	struct tm tm;

	memset(&tm, 0, sizeof(tm));
	gmtime_r(&t, &tm);
	/* (the modulos only tell the compiler the widths: all are in range) */
	snprintf(out, 32, "%04u-%02u-%02uT%02u:%02u:%02uZ",
	    (unsigned)(tm.tm_year + 1900) % 10000u,
	    (unsigned)(tm.tm_mon + 1) % 100u, (unsigned)tm.tm_mday % 100u,
	    (unsigned)tm.tm_hour % 100u, (unsigned)tm.tm_min % 100u,
	    (unsigned)tm.tm_sec % 100u);
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant). */
static int64_t
days_from_civil(int64_t y, int64_t m, int64_t d)
{
	int64_t era, yoe, doy, doe;

	y -= m <= 2;
	era = (y >= 0 ? y : y - 399) / 400;
	yoe = y - era * 400;
	doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
	doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
	return era * 146097 + doe - 719468;
}

static int
digits(const char *s, int n, int64_t *out)
{
	int64_t v = 0;
	int i;

	for (i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (s[i] - '0');
	}
	*out = v;
	return 0;
}

/*
 * RFC 3339 ("2026-01-02T03:04:05Z", "...05.123+02:00") into seconds since
 * the epoch. Fractions are dropped; the day must exist in its month.
 */
int
time_parse_rfc3339(const char *s, int64_t *out)
{
	static const int mdays[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31,
	    30, 31 };
	int64_t y, mo, d, h, mi, se, oh, om, t;
	int leap;

	if (s == NULL || strlen(s) < 20 || s[4] != '-' || s[7] != '-' ||
	    (s[10] != 'T' && s[10] != 't') || s[13] != ':' || s[16] != ':' ||
	    digits(s, 4, &y) < 0 || digits(s + 5, 2, &mo) < 0 ||
	    digits(s + 8, 2, &d) < 0 || digits(s + 11, 2, &h) < 0 ||
	    digits(s + 14, 2, &mi) < 0 || digits(s + 17, 2, &se) < 0)
		return -1;
	if (mo < 1 || mo > 12 || h > 23 || mi > 59 || se > 60)
		return -1;
	leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
	if (d < 1 || d > mdays[mo - 1] + (mo == 2 && leap))
		return -1;
	t = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se;
	s += 19;
	if (*s == '.') {
		if (s[1] < '0' || s[1] > '9')
			return -1;
		for (s++; *s >= '0' && *s <= '9'; s++)
			;
	}
	if (*s == 'Z' || *s == 'z') {
		s++;
	} else if (*s == '+' || *s == '-') {
		if (digits(s + 1, 2, &oh) < 0 || s[3] != ':' ||
		    digits(s + 4, 2, &om) < 0 || oh > 23 || om > 59)
			return -1;
		t += (*s == '+' ? -1 : 1) * (oh * 3600 + om * 60);
		s += 6;
	} else {
		return -1;
	}
	if (*s != '\0')
		return -1;
	*out = t;
	return 0;
}

/* A duration the way kubectl prints ages (apimachinery HumanDuration). */
void
time_human_duration(int64_t s, char out[32])
{
	int64_t m, h, d;

	if (s < -1) {
		snprintf(out, 32, "<invalid>");
		return;
	}
	if (s < 0)
		s = 0;
	m = s / 60;
	h = s / 3600;
	d = h / 24;
	if (s < 120)
		snprintf(out, 32, "%" PRId64 "s", s);
	else if (m < 10 && s % 60 != 0)
		snprintf(out, 32, "%" PRId64 "m%" PRId64 "s", m, s % 60);
	else if (m < 180)
		snprintf(out, 32, "%" PRId64 "m", m);
	else if (h < 8 && m % 60 != 0)
		snprintf(out, 32, "%" PRId64 "h%" PRId64 "m", h, m % 60);
	else if (h < 48)
		snprintf(out, 32, "%" PRId64 "h", h);
	else if (h < 24 * 8 && h % 24 != 0)
		snprintf(out, 32, "%" PRId64 "d%" PRId64 "h", d, h % 24);
	else if (h < 24 * 365 * 2)
		snprintf(out, 32, "%" PRId64 "d", d);
	else if (h < 24 * 365 * 8 && d % 365 != 0)
		snprintf(out, 32, "%" PRId64 "y%" PRId64 "d", d / 365,
		    d % 365);
	else
		snprintf(out, 32, "%" PRId64 "y", d / 365);
}

/* Exponential backoff: base doubled `doublings` times, at most max. */
int64_t
backoff_delay_ms(int64_t base, int64_t max, unsigned doublings)
{
	int64_t d = base;

	while (doublings-- > 0 && d < max)
		d *= 2;
	return d > max ? max : d;
}

/* Equal jitter: half of d fixed, half random, so retries spread out. */
int64_t
backoff_jitter_ms(int64_t d)
{
	uint32_t rnd = 0;

	if (random_bytes(&rnd, sizeof(rnd)) < 0)
		rnd = (uint32_t)now_mono_ms();
	return d / 2 + (int64_t)(rnd % (uint32_t)(d / 2 + 1));
}

/* Sleep, resuming after signals. */
void
sleep_ms(int64_t ms)
{
	struct timespec ts;

	if (ms <= 0)
		return;
	ts.tv_sec = ms / 1000;
	ts.tv_nsec = (ms % 1000) * 1000000;
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

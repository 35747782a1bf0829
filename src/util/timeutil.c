/* Clocks and time formatting. */
#include "config.h"

#include <errno.h>
#include <time.h>

#include "util/util.h"

/* Monotonic clock in milliseconds. */
int64_t
now_mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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

/* Format unix seconds as RFC 3339 UTC. */
void
time_rfc3339(int64_t unix_s, char out[32])
{
	time_t t = (time_t)unix_s;
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
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

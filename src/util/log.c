/* One line per event, key=value text or JSON, to stderr. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

static enum log_level log_min = LOG_INFO;
static int log_json;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static const char *level_names[] = { "debug", "info", "warn", "error" };

/* Choose level and format. */
void
log_setup(enum log_level level, int json)
{
	log_min = level;
	log_json = json;
}

/* Map a level name to its value. */
int
log_level_parse(const char *s)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(level_names); i++)
		if (strcmp(s, level_names[i]) == 0)
			return (int)i;
	if (strcmp(s, "warning") == 0)
		return LOG_WARN;
	return -1;
}

/* Whether a line at this level would be written. */
int
log_enabled(enum log_level level)
{
	return level >= log_min;
}

static void
add_json_string(struct buf *b, const char *s)
{
	const unsigned char *p;

	buf_addstr(b, "\"");
	for (p = (const unsigned char *)s; *p; p++) {
		switch (*p) {
		case '"':
			buf_addstr(b, "\\\"");
			break;
		case '\\':
			buf_addstr(b, "\\\\");
			break;
		case '\n':
			buf_addstr(b, "\\n");
			break;
		case '\r':
			buf_addstr(b, "\\r");
			break;
		case '\t':
			buf_addstr(b, "\\t");
			break;
		default:
			if (*p < 0x20 || *p == 0x7f)
				buf_printf(b, "\\u%04x", *p);
			else
				buf_add(b, p, 1);
		}
	}
	buf_addstr(b, "\"");
}

static void
add_text_value(struct buf *b, const char *s)
{
	const unsigned char *p;
	int quote = *s == '\0';

	for (p = (const unsigned char *)s; *p && !quote; p++)
		if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' ||
		    *p == 0x7f)
			quote = 1;
	if (!quote) {
		buf_addstr(b, s);
		return;
	}
	/* the JSON string escape is also an unambiguous quoting for text */
	add_json_string(b, s);
}

/* Write one event line. */
void
log_vkv(enum log_level level, const char *msg, va_list ap)
{
	struct buf b;
	char ts[32];
	int64_t ms = now_unix_ms();
	const char *k, *v;

	if (level < log_min)
		return;
	buf_init(&b, 64 * 1024);
	time_rfc3339(ms / 1000, ts);
	/* add milliseconds before the Z */
	ts[19] = '\0';
	if (log_json) {
		buf_printf(&b, "{\"ts\":\"%s.%03dZ\",\"level\":\"%s\",\"msg\":",
		    ts, (int)(ms % 1000), level_names[level]);
		add_json_string(&b, msg);
	} else {
		buf_printf(&b, "ts=%s.%03dZ level=%s msg=", ts,
		    (int)(ms % 1000), level_names[level]);
		add_text_value(&b, msg);
	}
	while ((k = va_arg(ap, const char *)) != NULL) {
		v = va_arg(ap, const char *);
		if (v == NULL)
			v = "-";
		if (log_json) {
			buf_addstr(&b, ",");
			add_json_string(&b, k);
			buf_addstr(&b, ":");
			add_json_string(&b, v);
		} else {
			buf_printf(&b, " %s=", k);
			add_text_value(&b, v);
		}
	}
	buf_addstr(&b, log_json ? "}\n" : "\n");
	if (b.data != NULL) {
		pthread_mutex_lock(&log_lock);
		fwrite(b.data, 1, b.len, stderr);
		fflush(stderr);
		pthread_mutex_unlock(&log_lock);
	}
	buf_release(&b);
}

/* Write one event line with NULL-terminated key/value pairs. */
void
log_kv(enum log_level level, const char *msg, ...)
{
	va_list ap;

	va_start(ap, msg);
	log_vkv(level, msg, ap);
	va_end(ap);
}

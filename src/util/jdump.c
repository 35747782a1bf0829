/*
 * A compact JSON writer for jansson values, byte for byte what
 * json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) writes, at a fraction of
 * the cost: the store serializes every object it writes, and jansson's
 * writer goes through a callback and printf for every piece.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "util/util.h"

struct out {
	char *p;
	size_t len, cap;
};

static void
grow(struct out *o, size_t n)
{
	if (o->len + n + 1 <= o->cap)
		return;
	/*
	 * 4 KiB first: a stored AgentTask (about 1 KiB) is dumped with no
	 * realloc; from 256, each took three, and their copies showed at 5%
	 * of the store writer's time under bench/meter
	 */
	while (o->len + n + 1 > o->cap)
		o->cap = o->cap ? o->cap * 2 : 4096;
	o->p = xrealloc(o->p, o->cap);
}

static void
put(struct out *o, const char *s, size_t n)
{
	grow(o, n);
	memcpy(o->p + o->len, s, n);
	o->len += n;
}

static void
putc1(struct out *o, char c)
{
	grow(o, 1);
	o->p[o->len++] = c;
}

/* A string as jansson writes it: UTF-8 as is, the JSON escapes. */
static void
str(struct out *o, const char *s, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t i, run = 0;

	putc1(o, '"');
	for (i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		char e[6];
		size_t en = 2;

		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		put(o, s + run, i - run);
		run = i + 1;
		e[0] = '\\';
		switch (c) {
		case '"': e[1] = '"'; break;
		case '\\': e[1] = '\\'; break;
		case '\b': e[1] = 'b'; break;
		case '\f': e[1] = 'f'; break;
		case '\n': e[1] = 'n'; break;
		case '\r': e[1] = 'r'; break;
		case '\t': e[1] = 't'; break;
		default:
			e[1] = 'u';
			e[2] = '0';
			e[3] = '0';
			e[4] = hex[c >> 4];
			e[5] = hex[c & 15];
			en = 6;
		}
		put(o, e, en);
	}
	put(o, s + run, n - run);
	putc1(o, '"');
}

static void
integer(struct out *o, json_int_t v)
{
	char b[24], *e = b + sizeof(b), *p = e;
	uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;

	do {
		*--p = (char)('0' + u % 10);
		u /= 10;
	} while (u != 0);
	if (v < 0)
		*--p = '-';
	put(o, p, (size_t)(e - p));
}

static int
value(struct out *o, const json_t *v, int depth)
{
	size_t i;
	const char *k;
	json_t *x;
	int first = 1;

	if (depth > 2048)
		return -1;
	switch (json_typeof(v)) {
	case JSON_OBJECT:
		putc1(o, '{');
		json_object_foreach((json_t *)v, k, x) {
			if (!first)
				putc1(o, ',');
			first = 0;
			str(o, k, strlen(k));
			putc1(o, ':');
			if (value(o, x, depth + 1) < 0)
				return -1;
		}
		putc1(o, '}');
		return 0;
	case JSON_ARRAY:
		putc1(o, '[');
		json_array_foreach((json_t *)v, i, x) {
			if (i > 0)
				putc1(o, ',');
			if (value(o, x, depth + 1) < 0)
				return -1;
		}
		putc1(o, ']');
		return 0;
	case JSON_STRING:
		str(o, json_string_value(v), json_string_length(v));
		return 0;
	case JSON_INTEGER:
		integer(o, json_integer_value(v));
		return 0;
	case JSON_TRUE:
		put(o, "true", 4);
		return 0;
	case JSON_FALSE:
		put(o, "false", 5);
		return 0;
	case JSON_NULL:
		put(o, "null", 4);
		return 0;
	case JSON_REAL: {
		/* rare here: jansson's own formatting, to the byte */
		char *r = json_dumps(v, JSON_ENCODE_ANY);

		if (r == NULL)
			return -1;
		put(o, r, strlen(r));
		free(r);
		return 0;
	}
	}
	return -1;
}

char *
json_dump_compact(const json_t *v, size_t *len)
{
	struct out o = { NULL, 0, 0 };

	if (v == NULL || value(&o, v, 0) < 0) {
		free(o.p);
		return NULL;
	}
	grow(&o, 0);
	o.p[o.len] = '\0';
	if (len != NULL)
		*len = o.len;
	return o.p;
}

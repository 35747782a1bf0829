/*
 * jscan: a validating, allocation-free JSON scanner for hot paths. One
 * pass checks that the whole text is RFC 8259 JSON (strict grammar, valid
 * UTF-8, paired surrogates, bounded depth) and records where the values
 * of a few dotted object paths ("comment.user.login") are. Values inside
 * arrays are never matched. It exists because webhook intake must look at
 * a dozen fields of a 10-25 KB payload many thousand times a second, and
 * building a full tree for that costs an order of magnitude more.
 */
#ifndef DIVERGE_JSCAN_H
#define DIVERGE_JSCAN_H

#include <stddef.h>
#include <stdint.h>

enum jtype {
	JT_ABSENT = 0,
	JT_NULL,
	JT_FALSE,
	JT_TRUE,
	JT_NUMBER,
	JT_STRING,
	JT_OBJECT,
	JT_ARRAY
};

#define JSCAN_MAX_FIELDS 64
#define JSCAN_MAX_PATH 8

/* One requested path and, after jscan(), where its value is. */
struct jfield {
	const char *path;	/* dotted, set by the caller */
	enum jtype type;	/* JT_ABSENT when not found */
	const char *start;	/* the value's text; for strings, inside the
				 * quotes (still escaped) */
	size_t len;
	int count;		/* times seen (> 1: a duplicate key) */
};

/*
 * Scan text (len bytes) as one JSON document, filling fields (n <=
 * JSCAN_MAX_FIELDS, each path at most JSCAN_MAX_PATH components).
 * max_depth bounds nesting: the document's value is at depth 0, and a
 * value deeper than max_depth is refused (max_depth + 1 nested arrays or
 * objects pass, one more does not). Returns 0, or -1 with *err set to a
 * static message when the text is not valid JSON.
 */
int jscan(const char *text, size_t len, struct jfield *fields, size_t n,
    int max_depth, const char **err);

/* The field named path in fields (or NULL). */
const struct jfield *jscan_get(const struct jfield *fields, size_t n,
    const char *path);

/*
 * Decode a JT_STRING value into a new NUL-terminated string (*outlen
 * bytes). A string containing U+0000 fails (-1): C strings cannot hold it.
 */
int jscan_string(const struct jfield *f, char **out, size_t *outlen);

/* A JT_NUMBER that is an integer fitting int64 (no fraction/exponent). */
int jscan_int(const struct jfield *f, int64_t *out);

/*
 * Append s as a JSON string literal (quotes included) to b. Control
 * characters, quotes and backslashes are escaped; other bytes are copied
 * (the caller passes valid UTF-8). Returns buf_add's result.
 */
struct buf;
int jscan_escape(struct buf *b, const char *s);

#endif

/* Bounded growable buffers. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util/util.h"

/* Initialise an empty buffer that never grows beyond max bytes. */
void
buf_init(struct buf *b, size_t max)
{
	b->data = NULL;
	b->len = 0;
	b->cap = 0;
	b->max = max;
}

/* Free the buffer's memory; it is empty and reusable afterwards. */
void
buf_release(struct buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = 0;
	b->cap = 0;
}

/* Empty the buffer, keeping its memory. */
void
buf_reset(struct buf *b)
{
	b->len = 0;
	if (b->data != NULL)
		b->data[0] = '\0';
}

/* Append n bytes; -1 when the result would exceed the maximum. */
int
buf_add(struct buf *b, const void *p, size_t n)
{
	size_t need;

	if (n > b->max || b->len > b->max - n)
		return -1;
	need = b->len + n + 1;
	if (need > b->cap) {
		size_t cap = b->cap ? b->cap : 256;

		while (cap < need)
			cap *= 2;
		if (cap > b->max + 1)
			cap = b->max + 1;
		b->data = xrealloc(b->data, cap);
		b->cap = cap;
	}
	if (n > 0)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	b->data[b->len] = '\0';
	return 0;
}

/* Append a string. */
int
buf_addstr(struct buf *b, const char *s)
{
	return buf_add(b, s, strlen(s));
}

/* Append formatted text. */
int
buf_printf(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	char *s, small[256];
	int ret, n;

	/* most lines are short: no allocation for them */
	va_start(ap, fmt);
	n = vsnprintf(small, sizeof(small), fmt, ap);
	va_end(ap);
	if (n < 0)
		return -1;
	if ((size_t)n < sizeof(small))
		return buf_add(b, small, (size_t)n);
	va_start(ap, fmt);
	s = xvasprintf(fmt, ap);
	va_end(ap);
	ret = buf_addstr(b, s);
	free(s);
	return ret;
}

/* Hand the contents to the caller and leave the buffer empty. */
char *
buf_detach(struct buf *b, size_t *len_out)
{
	char *p = b->data;

	if (len_out != NULL)
		*len_out = b->len;
	b->data = NULL;
	b->len = 0;
	b->cap = 0;
	return p;
}

size_t
utf8_cut(const char *s, size_t len, size_t max)
{
	size_t i;

	if (len <= max)
		return len;
	i = max;
	while (i > 0 && ((unsigned char)s[i] & 0xc0) == 0x80)
		i--;
	return i;
}

/*
 * The length of the valid UTF-8 sequence at p (n bytes left) and its code
 * point in *cp: 1 for ASCII, 0 when the bytes there are not UTF-8
 * (overlong, surrogate, past U+10FFFF, cut short) or n is 0.
 */
size_t
utf8_next(const unsigned char *p, size_t n, uint32_t *cp)
{
	size_t len, i;
	uint32_t c;

	if (n == 0)
		return 0;
	if (p[0] < 0x80) {
		*cp = p[0];
		return 1;
	}
	if (p[0] >= 0xc2 && p[0] <= 0xdf) {
		len = 2;
		c = p[0] & 0x1f;
	} else if (p[0] >= 0xe0 && p[0] <= 0xef) {
		len = 3;
		c = p[0] & 0x0f;
	} else if (p[0] >= 0xf0 && p[0] <= 0xf4) {
		len = 4;
		c = p[0] & 0x07;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		c = c << 6 | (p[i] & 0x3f);
	}
	if ((len == 3 && c < 0x800) || (len == 4 && c < 0x10000) ||
	    c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
		return 0;
	*cp = c;
	return len;
}

/* utf8_next without the code point. */
size_t
utf8_valid_len(const unsigned char *p, size_t n)
{
	uint32_t cp;

	return utf8_next(p, n, &cp);
}

size_t
utf8_put(uint32_t cp, char *o)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
	o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

int
streq(const char *a, const char *b)
{
	return a != NULL && b != NULL && strcmp(a, b) == 0;
}

int
media_type_is(const char *ct, const char *want)
{
	size_t n = strlen(want);

	if (ct == NULL)
		return 0;
	while (*ct == ' ' || *ct == '\t')
		ct++;
	return strncasecmp(ct, want, n) == 0 && (ct[n] == '\0' ||
	    ct[n] == ';' || ct[n] == ' ' || ct[n] == '\t');
}

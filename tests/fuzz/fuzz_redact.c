/*
 * Fuzz target for the redactor (util/redact.c), which reads upstream
 * error messages, plugin stderr and everything logged: any bytes. Input:
 * the secrets to register, separated by 0x01, then a NUL, then the text
 * (to its next NUL); no NUL: all text, nothing registered. Besides
 * crashes and sanitizer reports it checks the contract: the copy is NULL
 * (nothing to hide) or no longer than the worst case, no registered
 * secret is left in it, nor REDACT_FRAG_LEN bytes of one of
 * REDACT_FRAG_SECRET bytes or more.
 */
#include "config.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x) do { if (!(x)) abort(); } while (0)
#define MAX_SECRETS 4

/* The value as registered: trimmed of white space (see keep_forms). */
static void
trimmed(const char *v, size_t len, const char **out, size_t *outlen)
{
	while (len > 0 && isspace((unsigned char)*v)) {
		v++;
		len--;
	}
	while (len > 0 && isspace((unsigned char)v[len - 1]))
		len--;
	*out = v;
	*outlen = len;
}

/*
 * Whether s of len can be checked for in the copy: one that holds a
 * bracket, or is "redacted", may be made up by the "[redacted]" put in.
 */
static int
checkable(const char *s, size_t len)
{
	return len >= REDACT_MIN_LEN && memchr(s, '[', len) == NULL &&
	    memchr(s, ']', len) == NULL && memchr(s, '\0', len) == NULL &&
	    !(len == 8 && memcmp(s, "redacted", 8) == 0);
}

static int
contains(const char *hay, const char *s, size_t len)
{
	size_t n = strlen(hay), i;

	for (i = 0; i + len <= n; i++)
		if (memcmp(hay + i, s, len) == 0)
			return 1;
	return 0;
}

/*
 * Whether hay holds a run of REDACT_FRAG_LEN bytes of s: checked for a
 * one-line value (the fragments of a multi-line one are its lines').
 */
static int
contains_fragment(const char *hay, const char *s, size_t len)
{
	size_t i;

	if (len < REDACT_FRAG_SECRET || memchr(s, '\n', len) != NULL)
		return 0;
	for (i = 0; i + REDACT_FRAG_LEN <= len; i++)
		if (contains(hay, s + i, REDACT_FRAG_LEN))
			return 1;
	return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *d = (const char *)data, *nul, *p, *end, *sep, *v;
	const char *sv[MAX_SECRETS];
	size_t sl[MAX_SECRETS], ns = 0, len, i;
	char *text, *out;

	redact_secrets_clear();
	nul = memchr(d, '\0', size);
	if (nul != NULL) {
		for (p = d, end = nul; p <= end && ns < MAX_SECRETS;
		    p = sep + 1) {
			sep = memchr(p, '\x01', (size_t)(end - p));
			if (sep == NULL)
				sep = end;
			redact_secret_add(p, (size_t)(sep - p));
			trimmed(p, (size_t)(sep - p), &sv[ns], &sl[ns]);
			ns++;
		}
		text = xstrndup(nul + 1, size - (size_t)(nul + 1 - d));
	} else {
		text = xstrndup(d, size);
	}
	out = redact(text);
	if (out != NULL) {
		CHECK(strlen(out) <= strlen(text) * (sizeof(REDACTED) - 1));
		for (i = 0; i < ns; i++) {
			v = sv[i];
			len = sl[i];
			if (checkable(v, len))
				CHECK(!contains(out, v, len) &&
				    !contains_fragment(out, v, len));
		}
	} else {
		/* nothing hidden: no registered secret was in the text */
		for (i = 0; i < ns; i++)
			if (checkable(sv[i], sl[i]))
				CHECK(!contains(text, sv[i], sl[i]) &&
				    !contains_fragment(text, sv[i], sl[i]));
	}
	free(out);
	free(text);
	return 0;
}

/*
 * Fuzz target for the sticky comment's renderer (notifier/render.c),
 * which puts text from people (objective, guidance) and from the agent and
 * the sandbox (status reason and message, branch, preview URL) into a
 * comment on the PR/MR. Input: one byte of flags (phase, queued, internal
 * marks, a small body limit), one byte for that limit, then the fields
 * separated by NUL: reason, name, objective, branch, message, guidance,
 * preview URL, preview environment, login. The fields may be any bytes,
 * invalid UTF-8 too.
 *
 * Besides crashes and sanitizer reports it checks the contract of
 * DESIGN.md section 9. Of each field escaped alone: valid UTF-8; inline,
 * one line without a raw '<', every '@' defused, no reference sigil,
 * autolink or Markdown special left live; as a block, a code fence that
 * no line inside closes, no line starting with a slash (a /diverge
 * command, a GitLab quick action) and no marker. Of the whole body: under
 * the limit, valid UTF-8, the marker once and first, no line starting
 * with a slash, fences balanced, no HTML but our own outside them, no
 * live mention.
 */
#include "config.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "k8s/k8s.h"
#include "notifier/notifier.h"
#include "scm/scm.h"
#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x) do { if (!(x)) abort(); } while (0)
#define ZWSP "\xe2\x80\x8b"
#define NFIELDS 9

enum { F_REASON, F_NAME, F_OBJECTIVE, F_BRANCH, F_MESSAGE, F_GUIDANCE,
    F_PREVIEW, F_ENV, F_LOGIN };

static int
valid_utf8(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, k;
	uint32_t cp;

	while (i < n) {
		k = utf8_next(p + i, n - i, &cp);
		if (k == 0 || cp == 0)
			return 0;
		i += k;
	}
	return 1;
}

/* Every '@' is followed by a zero-width space. */
static int
mentions_defused(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (s[i] == '@' && (n - i < 4 || memcmp(s + i + 1, ZWSP,
		    3) != 0))
			return 0;
	return 1;
}

/* Whether some line (split at LF and CR) starts, after blanks, with c. */
static int
line_starts_with(const char *s, size_t n, char c)
{
	size_t i;
	int start = 1;

	for (i = 0; i < n; i++) {
		if (s[i] == '\n' || s[i] == '\r')
			start = 1;
		else if (start && s[i] == c)
			return 1;
		else if (s[i] != ' ' && s[i] != '\t')
			start = 0;
	}
	return 0;
}

static size_t
count(const char *s, size_t n, const char *what)
{
	size_t k = strlen(what), i, c = 0;

	for (i = 0; i + k <= n; i++)
		if (memcmp(s + i, what, k) == 0)
			c++;
	return c;
}

/*
 * The text of inline Markdown as the hosts see it after parsing, the
 * string their reference and autolink filters run on: our entities and
 * backslash escapes undone. Checks on the way that every Markdown
 * special is escaped.
 */
static char *
decoded(const char *s, size_t n)
{
	static const struct {
		const char *ent;
		char c;
	} ents[] = { { "&amp;", '&' }, { "&lt;", '<' }, { "&gt;", '>' },
	    { "&#36;", '$' } };
	struct buf b;
	size_t i, k;
	int hit;

	buf_init(&b, 16u << 20);
	buf_add(&b, "", 0);
	for (i = 0; i < n; i++) {
		if (s[i] == '\\') {
			CHECK(i + 1 < n && ispunct((unsigned char)s[i + 1]));
			buf_add(&b, s + i + 1, 1);
			i++;
			continue;
		}
		if (s[i] == '&') {
			hit = 0;
			for (k = 0; k < ARRAY_SIZE(ents) && !hit; k++)
				if (strncmp(s + i, ents[k].ent,
				    strlen(ents[k].ent)) == 0) {
					buf_add(&b, &ents[k].c, 1);
					i += strlen(ents[k].ent) - 1;
					hit = 1;
				}
			CHECK(hit);
			continue;
		}
		/* Markdown specials come escaped, '$' as an entity */
		CHECK(s[i] != '\0' && strchr("`*_[]()|#~!$<>", s[i]) == NULL);
		buf_add(&b, s + i, 1);
	}
	return buf_detach(&b, NULL);
}

/* One field escaped inline. */
static void
check_inline(const char *s, size_t n, size_t cap)
{
	struct buf b;
	char *t;
	size_t i, tl;

	buf_init(&b, 16u << 20);
	notifier_escape_inline(&b, s, n, cap);
	buf_add(&b, "", 0);
	CHECK(valid_utf8(b.data, b.len));
	CHECK(memchr(b.data, '\n', b.len) == NULL);
	CHECK(memchr(b.data, '\r', b.len) == NULL);
	CHECK(memchr(b.data, '<', b.len) == NULL);
	CHECK(mentions_defused(b.data, b.len));
	/* an escape expands a byte to 9 at most, plus the ellipsis */
	CHECK(b.len <= 9 * (n < cap ? n : cap) + 3);
	t = decoded(b.data, b.len);
	tl = strlen(t);
	for (i = 0; i < tl; i++) {
		unsigned char c = (unsigned char)t[i], next = (unsigned char)
		    t[i + 1];

		/*
		 * a reference: #12 !12 ~bug ~"a b" %v1 &7 $3, GitLab's
		 * [work_item:12]
		 */
		if (strchr("#!~%&$[", c) != NULL)
			CHECK(!isalnum(next) && next != '"');
		/* an autolink: scheme:// or www. */
		if (c == ':')
			CHECK(strncmp(t + i + 1, "//", 2) != 0);
		if (strncasecmp(t + i, "www.", 4) == 0)
			CHECK(0);
		/* GH-12 */
		if ((i == 0 || !isalnum((unsigned char)t[i - 1])) &&
		    strncasecmp(t + i, "gh-", 3) == 0)
			CHECK(!isdigit((unsigned char)t[i + 3]));
	}
	free(t);
	buf_release(&b);
}

/* One field as a block: a fence nothing inside closes, inert lines. */
static void
check_block(const char *s, size_t n, size_t cap)
{
	struct buf b;
	size_t fence = 0, i, run = 0, end;

	buf_init(&b, 16u << 20);
	notifier_escape_block(&b, s, n, cap);
	buf_add(&b, "", 0);
	CHECK(valid_utf8(b.data, b.len));
	CHECK(mentions_defused(b.data, b.len));
	CHECK(!line_starts_with(b.data, b.len, '/'));
	CHECK(!webhook_has_command_line(b.data, b.len));
	CHECK(count(b.data, b.len, "<!--") == 0);
	CHECK(count(b.data, b.len, "\r") == 0);
	while (fence < b.len && b.data[fence] == '`')
		fence++;
	CHECK(fence >= 3);
	CHECK(strncmp(b.data + fence, "text\n", 5) == 0);
	/* the last line is the closing fence, of the same length */
	CHECK(b.len > fence + 5 + fence && b.data[b.len - 1] == '\n');
	end = b.len - 1 - fence;
	CHECK(b.data[end - 1] == '\n');
	for (i = end; i < b.len - 1; i++)
		CHECK(b.data[i] == '`');
	for (i = fence + 5; i < end; i++) {
		run = b.data[i] == '`' ? run + 1 : 0;
		CHECK(run < fence);
	}
	/* an escape adds 3 bytes to a byte at most, plus the ellipsis */
	CHECK(end - (fence + 5) <= 4 * (n < cap ? n : cap) + 1 + 20);
	buf_release(&b);
}

static int
blank(const char *s, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t')
			return 0;
	return 1;
}

/*
 * The body without our links' destinations ("](http...)"; the '@' of a
 * URL there is no mention), and without the fenced code blocks unless
 * fenced is set; the fences are checked balanced.
 */
static char *
outside_ok(const char *s, size_t n, int fenced, int *ok)
{
	struct buf b;
	size_t i = 0, open = 0, k, j, ls, le;
	char ch = 0;
	int fence;

	buf_init(&b, 16u << 20);
	buf_add(&b, "", 0);
	while (i < n) {
		ls = i;
		le = ls;
		while (le < n && s[le] != '\n')
			le++;
		for (j = ls; j < le && j - ls < 3 && s[j] == ' '; j++)
			;
		fence = 0;
		if (j < le && (s[j] == '`' || s[j] == '~')) {
			for (k = 0; j + k < le && s[j + k] == s[j]; k++)
				;
			if (k >= 3 && open == 0 && (s[j] != '`' ||
			    memchr(s + j + k, '`', le - j - k) == NULL)) {
				open = k;
				ch = s[j];
				fence = 1;
			} else if (open && s[j] == ch && k >= open &&
			    blank(s + j + k, le - j - k)) {
				open = 0;
				fence = 1;
			}
		}
		if (!fence && open == 0) {
			for (j = ls; j < le; j++) {
				if (le - j >= 6 && memcmp(s + j, "](http",
				    6) == 0) {
					buf_add(&b, "](", 2);
					while (j < le && s[j] != ')')
						j++;
					if (j == le) {
						*ok = 0;
						break;
					}
				}
				buf_add(&b, s + j, 1);
			}
			buf_add(&b, "\n", 1);
		} else if (fenced) {
			buf_add(&b, s + ls, le - ls + (le < n));
		}
		i = le + 1;
	}
	if (open != 0)
		*ok = 0;
	return buf_detach(&b, NULL);
}

static char *
outside(const char *s, size_t n, int fenced)
{
	int ok = 1;
	char *out = outside_ok(s, n, fenced, &ok);

	CHECK(ok);
	return out;
}

/*
 * Whether every line of out (the body outside fences) starts as one of
 * ours does: untrusted text starts no line there (no heading, quote, list,
 * table, HTML block or link definition of its own).
 */
static int
lines_ours(const char *out)
{
	static const char *const starts[] = { NOTIFIER_MARKER, "### ",
	    "**Diverge agent task** ", "**Objective**", "- **Branch:** ",
	    "- **Iteration:** ", "- **Spend:** ", "- **Preview:** ",
	    "**Message:** ", "**Latest guidance**",
	    "(set in an internal note)", "**Commands:** ", "<sub>Updated ",
	    "\xe2\x80\xa6 (truncated)", NULL };
	const char *line, *nl;
	size_t i;

	for (line = out; *line; line = nl + 1) {
		nl = strchr(line, '\n');
		CHECK(nl != NULL);
		if (nl == line)
			continue;
		for (i = 0; starts[i] != NULL; i++)
			if (strncmp(line, starts[i], strlen(starts[i])) == 0)
				break;
		if (starts[i] == NULL)
			return 0;
	}
	return 1;
}

/* The whole body. */
static void
check_body(const char *body, size_t len, size_t max)
{
	char *out, *text;
	const char *p;

	CHECK(body != NULL && strlen(body) == len);
	CHECK(len <= max && len < NOTIFIER_MAX_BODY);
	CHECK(valid_utf8(body, len));
	if (max >= 200) {
		CHECK(strncmp(body, NOTIFIER_MARKER "\n",
		    strlen(NOTIFIER_MARKER) + 1) == 0);
		CHECK(count(body, len, NOTIFIER_MARKER) == 1);
	}
	CHECK(count(body, len, "<!--") <= 1);
	CHECK(!line_starts_with(body, len, '/'));
	CHECK(!webhook_has_command_line(body, len));
	text = outside(body, len, 1);
	CHECK(mentions_defused(text, strlen(text)));
	free(text);
	out = outside(body, len, 0);
	/*
	 * HTML: the marker, the time of the update; nothing else (and the
	 * placeholders of the commands, in code spans)
	 */
	for (p = out; (p = strchr(p, '<')) != NULL; p++)
		CHECK((p == out && strncmp(p, NOTIFIER_MARKER,
		    strlen(NOTIFIER_MARKER)) == 0) || strncmp(p, "<sub>",
		    5) == 0 || strncmp(p, "</sub>", 6) == 0 ||
		    strncmp(p, "<hint>`", 7) == 0 ||
		    strncmp(p, "<objective>`", 12) == 0);
	CHECK(strstr(out, "://") == NULL);
	CHECK(lines_ours(out));
	free(out);
}

/* Lines outside fences opening minus lines closing a <details> block. */
static long
details_open(const char *s)
{
	const char *line;
	long open = 0;

	for (line = s; *line; line = strchr(line, '\n') + 1) {
		if (strncasecmp(line, "<details", 8) == 0)
			open++;
		else if (strncasecmp(line, "</details>", 10) == 0 && open > 0)
			open--;
		if (strchr(line, '\n') == NULL)
			break;
	}
	return open;
}

/*
 * A text cut by notifier_truncate: within the limit, on a character
 * boundary, and no fence or <details> block that the text closed left
 * open by the cut.
 */
static void
check_truncate(const char *s, size_t n, size_t max)
{
	char *t = xstrndup(s, n), *in, *out;
	size_t len = notifier_truncate(t, n, max);
	int ok = 1;

	CHECK(len <= (n > max ? max : n) && strlen(t) == len);
	if (valid_utf8(s, n))
		CHECK(valid_utf8(t, len));
	in = outside_ok(s, n, 0, &ok);
	if (ok && details_open(in) == 0 && n > max) {
		out = outside(t, len, 0);
		CHECK(details_open(out) == 0);
		free(out);
	}
	free(in);
	free(t);
}

static const char *const phases[] = { "Pending", "Provisioning", "Active",
    "Pausing", "Paused", "Completed", "Failed", NULL };

/* A JSON string of the field, as is: invalid UTF-8 reaches render too. */
static json_t *
str(const char *s, size_t n)
{
	return json_stringn_nocheck(s, n);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *f[NFIELDS] = { 0 }, *p, *end, *nul;
	size_t fl[NFIELDS] = { 0 }, i, len, max = 0;
	struct notifier_render_opts o = { -1, -1, -1, NULL, 0 };
	unsigned int flags;
	json_t *task, *meta, *ann, *status, *spec;
	char *body, *purl = NULL, *login = NULL;

	if (size < 2)
		return 0;
	flags = data[0];
	if (flags & 0x20)
		max = 100 + (size_t)data[1] * 40;
	p = (const char *)data + 2;
	end = (const char *)data + size;
	for (i = 0; i < NFIELDS && p <= end; i++) {
		nul = memchr(p, '\0', (size_t)(end - p));
		if (nul == NULL)
			nul = end;
		f[i] = p;
		fl[i] = (size_t)(nul - p);
		p = nul + 1;
	}
	for (i = 0; i < NFIELDS; i++)
		if (f[i] == NULL)
			f[i] = "";

	/* each field alone */
	check_inline(f[F_REASON], fl[F_REASON], NOTIFIER_CAP_SHORT);
	check_inline(f[F_MESSAGE], fl[F_MESSAGE], NOTIFIER_CAP_MESSAGE);
	check_block(f[F_OBJECTIVE], fl[F_OBJECTIVE], NOTIFIER_CAP_OBJECTIVE);
	check_block(f[F_GUIDANCE], fl[F_GUIDANCE], NOTIFIER_CAP_GUIDANCE);
	check_block(f[F_MESSAGE], fl[F_MESSAGE], 64);
	if (memchr(f[F_OBJECTIVE], '\r', fl[F_OBJECTIVE]) == NULL)
		check_truncate(f[F_OBJECTIVE], fl[F_OBJECTIVE], 40 +
		    (size_t)data[1] * 8);

	/* the task */
	task = json_object();
	meta = json_object();
	ann = json_object();
	status = json_object();
	spec = json_object();
	json_object_set_new(meta, "name", str(f[F_NAME], fl[F_NAME]));
	json_object_set_new(ann, "divergedev.com/guidance",
	    str(f[F_GUIDANCE], fl[F_GUIDANCE]));
	if (flags & 0x08)
		json_object_set_new(ann, K8S_TASK_ANNOTATION_INTERNAL,
		    json_string("true"));
	if (flags & 0x10)
		json_object_set_new(ann, K8S_TASK_ANNOTATION_INTERNAL_GUIDANCE,
		    json_string("true"));
	json_object_set_new(meta, "annotations", ann);
	json_object_set_new(task, "metadata", meta);
	json_object_set_new(spec, "objective", str(f[F_OBJECTIVE],
	    fl[F_OBJECTIVE]));
	json_object_set_new(spec, "repository", json_pack("{s:o}",
	    "workingBranch", str(f[F_BRANCH], fl[F_BRANCH])));
	json_object_set_new(spec, "maxIterations", json_integer(flags & 1));
	json_object_set_new(task, "spec", spec);
	if ((flags & 7) < 7)
		json_object_set_new(status, "phase", json_string(
		    phases[flags & 7]));
	json_object_set_new(status, "reason", (flags & 0x40) ?
	    json_string("Queued") : str(f[F_REASON], fl[F_REASON]));
	json_object_set_new(status, "message", str(f[F_MESSAGE],
	    fl[F_MESSAGE]));
	json_object_set_new(status, "previewUrl", str(f[F_PREVIEW],
	    fl[F_PREVIEW]));
	json_object_set_new(status, "previewEnvironment", str(f[F_ENV],
	    fl[F_ENV]));
	json_object_set_new(status, "costUSD", json_string("1.5"));
	json_object_set_new(task, "status", status);

	o.max_bytes = max;
	o.now = (flags & 0x80) ? 1796000000 : -1;
	body = notifier_render(task, &o, &len);
	check_body(body, len, max ? max : NOTIFIER_MAX_BODY);
	free(body);

	/* the preview URL given by the caller */
	purl = xstrndup(f[F_PREVIEW], fl[F_PREVIEW]);
	o.preview_url = purl;
	o.max_bytes = 0;
	body = notifier_render(task, &o, &len);
	check_body(body, len, NOTIFIER_MAX_BODY);
	free(body);

	/* the comment at the end of a run */
	login = xstrndup(f[F_LOGIN], fl[F_LOGIN]);
	body = notifier_render_final(task, login, flags & 1);
	len = strlen(body);
	CHECK(valid_utf8(body, len));
	CHECK(strchr(body, '\n') == body + len - 1);
	CHECK(strchr(body, '<') == NULL);
	CHECK(!line_starts_with(body, len, '/'));
	/* the one live mention: who started the run, a plausible login */
	if (body[0] == '@') {
		CHECK(fl[F_LOGIN] > 0 && strchr(body, ' ') == body + 1 +
		    fl[F_LOGIN]);
		for (i = 0; i < fl[F_LOGIN]; i++)
			CHECK(isalnum((unsigned char)login[i]) ||
			    strchr("-_.", login[i]) != NULL);
		CHECK(mentions_defused(body + 1, len - 1));
	} else {
		CHECK(mentions_defused(body, len));
	}
	free(body);

	free(login);
	free(purl);
	json_decref(task);
	return 0;
}

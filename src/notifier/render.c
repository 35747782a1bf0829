/*
 * render: the sticky comment's body, a pure function of the task.
 *
 * Everything that came from people (objective, guidance) or from the agent
 * and the sandbox (status.message, reason) is untrusted: it is escaped so
 * that it renders as plain text, never as Markdown, HTML, a mention, our
 * marker or a /diverge command, and it is capped.
 */
#include <config.h>

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <openssl/sha.h>

#include "k8s/k8s.h"
#include "notifier/notifier.h"
#include "util/util.h"

#define ZWSP "\xe2\x80\x8b"
#define REPLACEMENT "\xef\xbf\xbd"
#define ELLIPSIS "\xe2\x80\xa6"
/* Working buffers: untrusted input is capped far below this. */
#define BUF_MAX (1024 * 1024)
#define TRUNC_NOTE "\n\n" ELLIPSIS " (truncated)\n"

/*
 * Characters that never reach the body: controls, bidi controls (the
 * embeddings, overrides and isolates of Trojan Source, and the marks LRM,
 * RLM, ALM), and invisible ones that carry text a reader cannot see: the
 * Unicode tags (U+E0000..E007F, "ASCII smuggling" that language models
 * read, other agents among them), zero-width space, word joiner and
 * invisible operators, BOM, Mongolian vowel separator and interlinear
 * annotation marks. ZWNJ and ZWJ stay: scripts and emoji need them.
 */
static int
dropped(uint32_t cp)
{
	if (cp < 0x20 && cp != '\n' && cp != '\t')
		return 1;
	return cp == 0x7f || (cp >= 0x80 && cp <= 0x9f) || cp == 0x61c ||
	    cp == 0x180e || cp == 0x200b || cp == 0x200e || cp == 0x200f ||
	    (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2060 && cp <= 0x2064) ||
	    (cp >= 0x2066 && cp <= 0x2069) || cp == 0xfeff ||
	    (cp >= 0xfff9 && cp <= 0xfffb) || (cp >= 0xe0000 && cp <= 0xe007f);
}

/*
 * Valid UTF-8 without dropped characters (CR removed, tabs kept), at most
 * cap source bytes; *cut set when the cap was reached.
 */
static void
sanitize(struct buf *out, const char *s, size_t len, size_t cap, int *cut)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, n;
	uint32_t cp;

	*cut = 0;
	while (i < len) {
		n = utf8_next(p + i, len - i, &cp);
		if (i + (n ? n : 1) > cap) {
			*cut = 1;
			break;
		}
		if (n == 0) {
			buf_addstr(out, REPLACEMENT);
			i++;
			continue;
		}
		if (!dropped(cp))
			buf_add(out, p + i, n);
		i += n;
	}
}

/*
 * Whether the character after clean->data[i], a reference sigil (GitHub:
 * #12; GitLab: #12 !12 ~label %milestone &epic $snippet, with a quoted
 * name too), would make a reference: a letter, digit or quote.
 */
static int
reference_follows(const struct buf *clean, size_t i)
{
	unsigned char n;

	if (i + 1 >= clean->len)
		return 0;
	n = (unsigned char)clean->data[i + 1];
	return isalnum(n) || n == '"';
}

void
notifier_escape_inline(struct buf *b, const char *s, size_t len, size_t cap)
{
	struct buf clean;
	size_t i;
	int cut;
	char c;

	buf_init(&clean, BUF_MAX);
	sanitize(&clean, s, len, cap, &cut);
	for (i = 0; i < clean.len; i++) {
		c = clean.data[i];
		switch (c) {
		case '\n':
		case '\t':
			buf_add(b, " ", 1);
			break;
		case '<':
			buf_addstr(b, "&lt;");
			break;
		case '>':
			buf_addstr(b, "&gt;");
			break;
		case '&':
			buf_addstr(b, "&amp;");
			if (reference_follows(&clean, i))
				buf_addstr(b, ZWSP);
			break;
		case '$':
			/*
			 * An entity, not a delimiter: $...$ is math on both
			 * hosts (\Huge, \color), and GitHub ignores \$
			 */
			buf_addstr(b, "&#36;");
			if (reference_follows(&clean, i))
				buf_addstr(b, ZWSP);
			break;
		case '%':
			buf_add(b, "%", 1);
			if (reference_follows(&clean, i))
				buf_addstr(b, ZWSP);
			break;
		case '@':
			buf_addstr(b, "@" ZWSP);
			break;
		case 'g':
		case 'G':
			/* nor GH-123, GitHub's other issue reference */
			buf_add(b, &c, 1);
			if ((i == 0 || !isalnum((unsigned char)
			    clean.data[i - 1])) && clean.len - i > 3 &&
			    strncasecmp(clean.data + i, "gh-", 3) == 0 &&
			    isdigit((unsigned char)clean.data[i + 3])) {
				buf_add(b, clean.data + i + 1, 1);
				buf_addstr(b, ZWSP);
				i++;
			}
			break;
		case ':':
			/* no autolink: http:// and the like stay text */
			buf_add(b, ":", 1);
			if (clean.len - i > 2 && clean.data[i + 1] == '/' &&
			    clean.data[i + 2] == '/')
				buf_addstr(b, ZWSP);
			break;
		case 'w':
		case 'W':
			/* nor www.example (GFM's extended autolink) */
			buf_add(b, &c, 1);
			if (clean.len - i > 3 && strncasecmp(clean.data + i,
			    "www.", 4) == 0) {
				buf_add(b, clean.data + i + 1, 2);
				buf_addstr(b, ZWSP);
				i += 2;
			}
			break;
		case '#': case '~': case '!': case '[':
			/*
			 * The hosts link references in the rendered text, so
			 * the backslash alone does not stop #12, org/repo#12,
			 * !12, ~label or GitLab's [work_item:12] and [epic:3]
			 * from becoming links and "mentioned in" entries on
			 * other issues, epics and merge requests
			 */
			buf_add(b, "\\", 1);
			buf_add(b, &c, 1);
			if (reference_follows(&clean, i))
				buf_addstr(b, ZWSP);
			break;
		case '\\': case '`': case '*': case '_': case ']':
		case '(': case ')': case '|':
			buf_add(b, "\\", 1);
			buf_add(b, &c, 1);
			break;
		default:
			buf_add(b, &c, 1);
		}
	}
	if (cut)
		buf_addstr(b, ELLIPSIS);
	buf_release(&clean);
}

/*
 * Whether line (n bytes) starts, after blanks, with a slash: a /diverge
 * command, or a GitLab quick action (/close, /merge), which GitLab would
 * run with the bot's rights.
 */
static int
command_line(const char *line, size_t n)
{
	size_t i = 0;

	while (i < n && (line[i] == ' ' || line[i] == '\t'))
		i++;
	return i < n && line[i] == '/';
}

void
notifier_escape_block(struct buf *b, const char *s, size_t len, size_t cap)
{
	struct buf clean, body;
	size_t i, start, run = 0, longest = 0, fence;
	int cut;

	buf_init(&clean, BUF_MAX);
	buf_init(&body, BUF_MAX);
	sanitize(&clean, s, len, cap, &cut);
	for (start = 0; start < clean.len; start = i + 1) {
		const char *line = clean.data + start;
		const char *nl = memchr(line, '\n', clean.len - start);
		size_t n = nl ? (size_t)(nl - line) : clean.len - start, j;

		i = start + n;
		if (command_line(line, n))
			buf_addstr(&body, ZWSP);
		for (j = 0; j < n; j++) {
			if (line[j] == '@')
				buf_addstr(&body, "@" ZWSP);
			else if (line[j] == '<' && n - j >= 4 &&
			    memcmp(line + j, "<!--", 4) == 0)
				buf_addstr(&body, "<" ZWSP);
			else
				buf_add(&body, line + j, 1);
		}
		buf_add(&body, "\n", 1);
	}
	if (cut)
		buf_addstr(&body, ELLIPSIS " (truncated)\n");
	for (i = 0; i < body.len; i++) {
		run = body.data[i] == '`' ? run + 1 : 0;
		if (run > longest)
			longest = run;
	}
	fence = longest >= 3 ? longest + 1 : 3;
	for (i = 0; i < fence; i++)
		buf_add(b, "`", 1);
	buf_addstr(b, "text\n");
	if (body.len > 0)
		buf_add(b, body.data, body.len);
	for (i = 0; i < fence; i++)
		buf_add(b, "`", 1);
	buf_add(b, "\n", 1);
	buf_release(&clean);
	buf_release(&body);
}

/*
 * A line opening or closing a fence: its character and length, or 0;
 * *bare set when only blanks follow the fence, as they must on a closing
 * one (```text inside a fence is text). A run of backticks followed by
 * another backtick on the line is no fence at all (``` a`b is a code
 * span), as CommonMark has it.
 */
static size_t
fence_of(const char *line, size_t n, char *ch, int *bare)
{
	size_t i = 0, k = 0, j;

	while (i < n && i < 3 && line[i] == ' ')
		i++;
	if (i >= n || (line[i] != '`' && line[i] != '~'))
		return 0;
	*ch = line[i];
	while (i + k < n && line[i + k] == *ch)
		k++;
	if (*ch == '`' && memchr(line + i + k, '`', n - i - k) != NULL)
		return 0;
	for (j = i + k; j < n && (line[j] == ' ' || line[j] == '\t'); j++)
		;
	*bare = j == n;
	return k >= 3 ? k : 0;
}

size_t
notifier_truncate(char *s, size_t len, size_t max)
{
	size_t note = strlen(TRUNC_NOTE), cut, start, open_at = SIZE_MAX;
	size_t fence_len = 0, details = 0, details_at = SIZE_MAX;
	char fence_ch = 0, ch;
	int bare;

	if (len <= max)
		return len;
	if (max < note) {
		cut = utf8_cut(s, len, max);
		s[cut] = '\0';
		return cut;
	}
	cut = utf8_cut(s, len, max - note);
	/* whole lines only */
	while (cut > 0 && s[cut - 1] != '\n')
		cut--;
	for (start = 0; start < cut; ) {
		const char *nl = memchr(s + start, '\n', cut - start);
		size_t n = nl ? (size_t)(nl - (s + start)) : cut - start, k;

		k = fence_of(s + start, n, &ch, &bare);
		if (fence_len == 0 && k > 0) {
			fence_len = k;
			fence_ch = ch;
			open_at = start;
		} else if (fence_len > 0 && k >= fence_len && ch == fence_ch &&
		    bare) {
			fence_len = 0;
			open_at = SIZE_MAX;
		} else if (fence_len == 0 && n >= 8 &&
		    strncasecmp(s + start, "<details", 8) == 0) {
			if (details++ == 0)
				details_at = start;
		} else if (fence_len == 0 && n >= 10 &&
		    strncasecmp(s + start, "</details>", 10) == 0 &&
		    details > 0) {
			if (--details == 0)
				details_at = SIZE_MAX;
		}
		start += n + 1;
	}
	if (open_at < cut)
		cut = open_at;
	if (details > 0 && details_at < cut)
		cut = details_at;
	memcpy(s + cut, TRUNC_NOTE, note);
	s[cut + note] = '\0';
	return cut + note;
}

void
notifier_hash(const char *s, size_t len, char out[65])
{
	unsigned char md[SHA256_DIGEST_LENGTH];

	SHA256((const unsigned char *)s, len, md);
	hex_encode(md, sizeof(md), out);
	out[64] = '\0';
}

/* ---- fields ---- */

static const char *
jstr2(const json_t *o, const char *a, const char *b)
{
	const json_t *v = json_object_get(json_object_get(o, a), b);

	return json_is_string(v) ? json_string_value(v) : NULL;
}

/*
 * Whether the task's annotation mark is "true": its objective
 * (K8S_TASK_ANNOTATION_INTERNAL) or guidance came from a GitLab internal
 * note; the status comment is public, so it does not show the text.
 */
static int
internal_mark(const json_t *task, const char *mark)
{
	const char *v = json_string_value(json_object_get(json_object_get(
	    json_object_get(task, "metadata"), "annotations"), mark));

	return v != NULL && strcmp(v, "true") == 0;
}

static int64_t
jint2(const json_t *o, const char *a, const char *b)
{
	const json_t *v = json_object_get(json_object_get(o, a), b);

	if (json_is_integer(v))
		return json_integer_value(v);
	if (json_is_string(v))
		return strtoll(json_string_value(v), NULL, 10);
	return 0;
}

/* A decimal USD string ("5.00", "0.022500") in micro-USD; -1 if bad. */
static int64_t
parse_micro(const char *s)
{
	int64_t v = 0, frac = 0;
	int digits = 0, d = 0;

	if (s == NULL || *s == '\0')
		return -1;
	for (; *s >= '0' && *s <= '9'; s++, digits++) {
		if (v > INT64_MAX / 10 / 1000000 - 1)
			return -1;
		v = v * 10 + (*s - '0');
	}
	if (*s == '.') {
		for (s++; *s >= '0' && *s <= '9'; s++, d++)
			if (d < 6)
				frac = frac * 10 + (*s - '0');
	}
	if (*s != '\0' || (digits == 0 && d == 0))
		return -1;
	for (; d < 6; d++)
		frac *= 10;
	return v * 1000000 + frac;
}

/* $12.35: micro-USD rounded to cents, with thousands separators. */
static void
add_usd(struct buf *b, int64_t micro)
{
	int64_t cents = (micro + 5000) / 10000;

	buf_add(b, "$", 1);
	{
		char d[32];
		int n = snprintf(d, sizeof(d), "%" PRId64, cents / 100), i;

		for (i = 0; i < n; i++) {
			if (i > 0 && (n - i) % 3 == 0)
				buf_add(b, ",", 1);
			buf_add(b, d + i, 1);
		}
	}
	buf_printf(b, ".%02d", (int)(cents % 100));
}

static void
add_count(struct buf *b, int64_t v)
{
	char d[32];
	int n = snprintf(d, sizeof(d), "%" PRId64, v < 0 ? 0 : v), i;

	for (i = 0; i < n; i++) {
		if (i > 0 && (n - i) % 3 == 0)
			buf_add(b, ",", 1);
		buf_add(b, d + i, 1);
	}
}

/* A URL made safe as a Markdown link destination; NULL if not http(s). */
static char *
safe_url(const char *u)
{
	static const char ok[] = "-._~:/?#@!$&*+,;=%";
	struct buf b;
	const unsigned char *p;

	if (u == NULL || (strncmp(u, "https://", 8) != 0 &&
	    strncmp(u, "http://", 7) != 0))
		return NULL;
	buf_init(&b, 8192);
	for (p = (const unsigned char *)u; *p; p++) {
		if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		    (*p >= '0' && *p <= '9') || strchr(ok, *p) != NULL)
			buf_add(&b, p, 1);
		else
			buf_printf(&b, "%%%02X", *p);
	}
	return buf_detach(&b, NULL);
}

/*
 * The magic link (?_diverge_env=<env>) and the exit link
 * (?_diverge_env=clear) of a preview URL.
 */
static void
preview_links(const char *url, const char *env, char **magic, char **exit)
{
	const char *q = strstr(url, "_diverge_env=");
	struct buf b;

	if (q == NULL) {
		const char *sep = strchr(url, '?') ? "&" : "?";

		*magic = env != NULL ? xasprintf("%s%s_diverge_env=%s", url,
		    sep, env) : xstrdup(url);
		*exit = xasprintf("%s%s_diverge_env=clear", url, sep);
		return;
	}
	*magic = xstrdup(url);
	buf_init(&b, BUF_MAX);
	q += strlen("_diverge_env=");
	buf_add(&b, url, (size_t)(q - url));
	buf_addstr(&b, "clear");
	q += strcspn(q, "&#");
	buf_addstr(&b, q);
	*exit = buf_detach(&b, NULL);
}

static const char *
badge(const char *phase, int queued)
{
	if (queued)
		return "\xe2\x8f\xb3 Queued";
	if (strcmp(phase, "Provisioning") == 0 || strcmp(phase, "Active") == 0)
		return "\xf0\x9f\x9a\x80 Running";
	if (strcmp(phase, "Pausing") == 0)
		return "\xe2\x8f\xb8\xef\xb8\x8f Pausing";
	if (strcmp(phase, "Paused") == 0)
		return "\xe2\x8f\xb8\xef\xb8\x8f Paused";
	if (strcmp(phase, "Completed") == 0)
		return "\xe2\x9c\x85 Completed";
	if (strcmp(phase, "Failed") == 0)
		return "\xe2\x9d\x8c Failed";
	return "\xe2\x8f\xb3 Pending";
}

static int
is_phase(const char *phase, const char *a)
{
	return strcmp(phase, a) == 0;
}

static void
add_commands(struct buf *b, const char *phase, int queued)
{
	const char *live[] = { "/diverge guide <hint>", "/diverge pause",
	    "/diverge budget +$5", "/diverge status", NULL };
	const char *paused[] = { "/diverge resume", "/diverge resume +$5",
	    "/diverge budget +$5", "/diverge status", NULL };
	const char *done[] = { "/diverge fix <objective>", "/diverge status",
	    "/diverge help", NULL };
	const char *pending[] = { "/diverge pause", "/diverge status",
	    NULL };
	const char **v;
	int i;

	if (queued)
		v = pending;
	else if (is_phase(phase, "Provisioning") || is_phase(phase, "Active"))
		v = live;
	else if (is_phase(phase, "Pausing") || is_phase(phase, "Paused"))
		v = paused;
	else if (is_phase(phase, "Completed") || is_phase(phase, "Failed"))
		v = done;
	else
		v = pending;
	buf_addstr(b, "**Commands:** ");
	for (i = 0; v[i] != NULL; i++)
		buf_printf(b, "%s`%s`", i ? " \xc2\xb7 " : "", v[i]);
	buf_addstr(b, "\n\n");
}

char *
notifier_render(const json_t *task, const struct notifier_render_opts *opts,
    size_t *len)
{
	struct notifier_render_opts def = { -1, -1, -1, NULL, 0 };
	const json_t *spec = json_object_get(task, "spec");
	const char *phase, *s, *name;
	char *magic = NULL, *exitl = NULL, *u = NULL;
	int64_t run, it, maxit, cost, budget, tok, btok;
	size_t max, n;
	int queued;
	struct buf b;
	char *out;

	if (opts == NULL)
		opts = &def;
	max = opts->max_bytes ? opts->max_bytes : NOTIFIER_MAX_BODY;
	buf_init(&b, BUF_MAX);
	phase = jstr2(task, "status", "phase");
	if (phase == NULL)
		phase = "Pending";
	name = jstr2(task, "metadata", "name");
	buf_addstr(&b, NOTIFIER_MARKER "\n");
	queued = k8s_task_queued(task, NULL);
	buf_printf(&b, "### %s", badge(phase, queued));
	if (is_phase(phase, "Provisioning"))
		buf_addstr(&b, " (provisioning)");
	s = jstr2(task, "status", "reason");
	if (s != NULL && *s && !queued) {
		buf_addstr(&b, " \xe2\x80\x94 ");
		notifier_escape_inline(&b, s, strlen(s), NOTIFIER_CAP_SHORT);
	}
	buf_addstr(&b, "\n\n");

	run = jint2(task, "status", "run");
	buf_addstr(&b, "**Diverge agent task** ");
	notifier_escape_inline(&b, name ? name : "", name ? strlen(name) : 0,
	    NOTIFIER_CAP_SHORT);
	buf_printf(&b, " \xc2\xb7 run %" PRId64 "\n\n", run > 0 ? run : 1);

	s = jstr2(task, "spec", "objective");
	if (internal_mark(task, K8S_TASK_ANNOTATION_INTERNAL))
		s = "(set in an internal note)";
	buf_addstr(&b, "**Objective**\n\n");
	notifier_escape_block(&b, s ? s : "", s ? strlen(s) : 0,
	    NOTIFIER_CAP_OBJECTIVE);
	buf_add(&b, "\n", 1);

	s = json_string_value(json_object_get(json_object_get(spec,
	    "repository"), "workingBranch"));
	if (s != NULL && *s) {
		buf_addstr(&b, "- **Branch:** ");
		notifier_escape_inline(&b, s, strlen(s), NOTIFIER_CAP_SHORT);
		buf_add(&b, "\n", 1);
	}
	it = jint2(task, "status", "iteration");
	maxit = jint2(task, "spec", "maxIterations");
	buf_printf(&b, "- **Iteration:** %" PRId64, it);
	if (maxit > 0)
		buf_printf(&b, " / %" PRId64 "\n", maxit);
	else
		buf_addstr(&b, " (no limit)\n");

	cost = parse_micro(jstr2(task, "status", "costUSD"));
	budget = opts->budget_usd_micro;
	if (budget < 0) {
		budget = parse_micro(json_string_value(json_object_get(spec,
		    "budgetUSD")));
		if (budget <= 0)
			budget = -1;
	}
	buf_addstr(&b, "- **Spend:** ");
	add_usd(&b, cost > 0 ? cost : 0);
	if (budget > 0) {
		buf_addstr(&b, " of ");
		add_usd(&b, budget);
	} else if (budget == 0)
		buf_addstr(&b, " (no USD limit)");
	buf_addstr(&b, " USD \xc2\xb7 ");
	tok = jint2(task, "status", "tokensConsumed");
	btok = opts->budget_tokens;
	if (btok < 0) {
		btok = jint2(task, "spec", "budgetTokens");
		if (btok <= 0)
			btok = -1;
	}
	add_count(&b, tok);
	if (btok > 0) {
		buf_addstr(&b, " of ");
		add_count(&b, btok);
		buf_addstr(&b, " tokens\n");
	} else if (btok == 0)
		buf_addstr(&b, " tokens (no token limit)\n");
	else
		buf_addstr(&b, " tokens\n");

	s = opts->preview_url ? opts->preview_url :
	    jstr2(task, "status", "previewUrl");
	if (s != NULL && *s) {
		preview_links(s, jstr2(task, "status", "previewEnvironment"),
		    &magic, &exitl);
		u = safe_url(magic);
		if (u != NULL) {
			buf_printf(&b, "- **Preview:** [open the preview](%s)",
			    u);
			free(u);
			u = safe_url(exitl);
			buf_printf(&b, " \xc2\xb7 [leave the preview](%s)\n",
			    u);
		}
	}
	buf_add(&b, "\n", 1);

	s = jstr2(task, "status", "message");
	if (s != NULL && *s && queued && strncmp(s, K8S_TASK_QUEUE_WAIT,
	    strlen(K8S_TASK_QUEUE_WAIT)) == 0) {
		/*
		 * not its place, which moves whenever a task is admitted:
		 * every queued task's comment would be rewritten then
		 */
		buf_printf(&b, "**Message:** %s%s (its place: "
		    "`/diverge status`)\n\n", K8S_TASK_QUEUE_WAIT,
		    is_phase(phase, "Paused") ? " to resume" : "");
	} else if (s != NULL && *s) {
		/* it may quote an upstream error; no token goes to a PR */
		char *r = redact(s);

		if (r != NULL)
			s = r;
		buf_addstr(&b, "**Message:** ");
		notifier_escape_inline(&b, s, strlen(s), NOTIFIER_CAP_MESSAGE);
		buf_addstr(&b, "\n\n");
		free(r);
	}
	s = json_string_value(json_object_get(json_object_get(
	    json_object_get(task, "metadata"), "annotations"),
	    "divergedev.com/guidance"));
	if (s != NULL && *s && !is_phase(phase, "Completed") &&
	    !is_phase(phase, "Failed")) {
		buf_addstr(&b, "**Latest guidance**\n\n");
		if (internal_mark(task, K8S_TASK_ANNOTATION_INTERNAL_GUIDANCE))
			buf_addstr(&b, "(set in an internal note)\n");
		else
			notifier_escape_block(&b, s, strlen(s),
			    NOTIFIER_CAP_GUIDANCE);
		buf_add(&b, "\n", 1);
	}
	add_commands(&b, phase, queued);
	if (opts->now >= 0) {
		char ts[32];

		time_rfc3339(opts->now, ts);
		buf_printf(&b, "<sub>Updated %s</sub>\n", ts);
	}
	free(magic);
	free(exitl);
	free(u);
	out = buf_detach(&b, &n);
	if (out == NULL) {
		out = xstrdup("");
		n = 0;
	}
	n = notifier_truncate(out, n, max);
	if (len != NULL)
		*len = n;
	return out;
}

/* Whether s looks like a GitHub login or GitLab username. */
static int
plausible_login(const char *s)
{
	size_t i;

	if (s == NULL || *s == '\0' || strlen(s) > 100)
		return 0;
	for (i = 0; s[i]; i++) {
		char c = s[i];

		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		    (c >= '0' && c <= '9') || c == '-' || c == '_' ||
		    (c == '.' && i > 0)))
			return 0;
	}
	return 1;
}

char *
notifier_render_final(const json_t *task, const char *login, int followed)
{
	const char *phase = jstr2(task, "status", "phase");
	const char *name = jstr2(task, "metadata", "name");
	const char *reason = jstr2(task, "status", "reason");
	int64_t run = jint2(task, "status", "run");
	int ok = phase != NULL && strcmp(phase, "Completed") == 0;
	struct buf b;

	buf_init(&b, BUF_MAX);
	if (plausible_login(login))
		buf_printf(&b, "@%s ", login);
	buf_printf(&b, "%s Diverge agent task ", ok ? "\xe2\x9c\x85" :
	    "\xe2\x9d\x8c");
	notifier_escape_inline(&b, name ? name : "", name ? strlen(name) : 0,
	    NOTIFIER_CAP_SHORT);
	buf_printf(&b, " (run %" PRId64 ") %s", run > 0 ? run : 1,
	    ok ? "completed" : "failed");
	if (!ok && reason != NULL && *reason) {
		buf_addstr(&b, ": ");
		notifier_escape_inline(&b, reason, strlen(reason),
		    NOTIFIER_CAP_SHORT);
	}
	if (followed)
		buf_addstr(&b, ". The status comment above has the details.\n");
	else
		buf_addstr(&b, ". The status comment above follows another "
		    "task of this pull request; `/diverge status` lists them "
		    "all.\n");
	return buf_detach(&b, NULL);
}

/*
 * The sticky comment's renderer: golden bodies for each phase and for
 * hostile input (tests/data/notifier/NAME.md; NOTIFIER_UPDATE_GOLDEN=1
 * rewrites them), and the properties every body must have: under the
 * limit, valid UTF-8, one marker, no command line, no live mention, code
 * fences closed.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "notifier/notifier.h"
#include "scm/scm.h"
#include "testutil.h"
#include "util/util.h"

#define NOW INT64_C(1796000000)	/* 2026-11-29T...Z, fixed */

static json_t *
load_task(const char *name)
{
	char *rel = xasprintf("tests/data/notifier/%s.json", name);
	char *text = test_read_file(rel, NULL);
	json_error_t err;
	json_t *j = json_loads(text, 0, &err);

	if (j == NULL)
		fail_msg("%s: %s", rel, err.text);
	free(rel);
	free(text);
	return j;
}

/* Compare body with the golden file NAME.md (or rewrite it). */
static void
golden(const char *name, const char *body)
{
	char *rel = xasprintf("tests/data/notifier/%s.md", name);
	char *want;

	if (getenv("NOTIFIER_UPDATE_GOLDEN") != NULL) {
		const char *top = getenv("top_srcdir");
		char *path = xasprintf("%s/%s", top ? top : ".", rel);
		FILE *f = fopen(path, "wb");

		assert_non_null(f);
		fwrite(body, 1, strlen(body), f);
		fclose(f);
		free(path);
	}
	want = test_read_file(rel, NULL);
	if (strcmp(want, body) != 0) {
		fprintf(stderr, "# %s differs; got:\n%s\n", rel, body);
		fail_msg("%s differs from the rendering", rel);
	}
	free(want);
	free(rel);
}

static int
valid_utf8(const char *s, size_t n)
{
	json_t *j = json_stringn(s, n);	/* jansson validates UTF-8 */

	if (j == NULL)
		return 0;
	json_decref(j);
	return 1;
}

/*
 * Whether only blanks follow on the line, as they must after a closing
 * fence (```text inside a fence is text).
 */
static int
bare_after(const char *p)
{
	p += strspn(p, " \t");
	return *p == '\n' || *p == '\0';
}

/*
 * Whether the run of k fence characters at p may open a fence: three or
 * more, and no backtick after backticks on the line (``` a`b is a code
 * span).
 */
static int
may_open(const char *p, size_t k)
{
	const char *nl = strchr(p + k, '\n');
	size_t n = nl ? (size_t)(nl - (p + k)) : strlen(p + k);

	return k >= 3 && (*p != '`' || memchr(p + k, '`', n) == NULL);
}

/* Lines opening or closing a fence of backticks or tildes. */
static int
fences_balanced(const char *s)
{
	const char *line = s, *nl;
	size_t open = 0, k, i;
	char ch = 0;

	for (; *line; line = nl ? nl + 1 : line + strlen(line)) {
		nl = strchr(line, '\n');
		for (i = 0; i < 3 && line[i] == ' '; i++)
			;
		if (line[i] != '`' && line[i] != '~') {
			if (nl == NULL)
				break;
			continue;
		}
		for (k = 0; line[i + k] == line[i]; k++)
			;
		if (k >= 3) {
			if (open == 0 && may_open(line + i, k)) {
				open = k;
				ch = line[i];
			} else if (open && line[i] == ch && k >= open &&
			    bare_after(line + i + k))
				open = 0;
		}
		if (nl == NULL)
			break;
	}
	return open == 0;
}

/*
 * The body outside fenced code blocks (where HTML renders as text), a new
 * string.
 */
static char *
outside_fences(const char *s)
{
	struct buf b;
	const char *line, *nl;
	size_t open = 0, k, i;
	char ch = 0;
	int fence;

	buf_init(&b, 1u << 20);
	buf_add(&b, "", 0);
	for (line = s; *line; line = nl ? nl + 1 : line + strlen(line)) {
		nl = strchr(line, '\n');
		for (i = 0; i < 3 && line[i] == ' '; i++)
			;
		fence = 0;
		if (line[i] == '`' || line[i] == '~') {
			for (k = 0; line[i + k] == line[i]; k++)
				;
			if (open == 0 && may_open(line + i, k)) {
				open = k;
				ch = line[i];
				fence = 1;
			} else if (k >= open && open && line[i] == ch &&
			    bare_after(line + i + k)) {
				open = 0;
				fence = 1;
			}
		}
		if (!fence && open == 0)
			buf_add(&b, line, nl ? (size_t)(nl - line) + 1 :
			    strlen(line));
		if (nl == NULL)
			break;
	}
	return buf_detach(&b, NULL);
}

/* The properties every body has. */
static void
check_body(const char *body, size_t len, size_t max)
{
	const char *p, *m;
	size_t markers = 0;
	char *out;

	assert_int_equal(strlen(body), len);
	assert_true(len <= max);
	assert_true(valid_utf8(body, len));
	assert_true(fences_balanced(body));
	for (m = body; (m = strstr(m, NOTIFIER_MARKER)) != NULL; m++)
		markers++;
	assert_int_equal(markers, 1);
	assert_memory_equal(body, NOTIFIER_MARKER, strlen(NOTIFIER_MARKER));
	assert_false(webhook_has_command_line(body, len));
	/* nor a GitLab quick action */
	for (p = body; p != NULL; p = strchr(p, '\n')) {
		p += *p == '\n';
		while (*p == ' ' || *p == '\t')
			p++;
		assert_true(*p != '/');
	}
	for (p = body; (p = strchr(p, '@')) != NULL; p++)
		assert_memory_equal(p + 1, "\xe2\x80\x8b", 3);
	out = outside_fences(body);
	assert_null(strstr(out, "<img"));
	assert_null(strstr(out, "<script"));
	assert_null(strstr(out, "</details"));
	free(out);
}

static void
render_golden(const char *name, json_t *task)
{
	struct notifier_render_opts o = { NOW, -1, -1, NULL, 0 };
	size_t len;
	char *body = notifier_render(task, &o, &len);

	check_body(body, len, NOTIFIER_MAX_BODY);
	golden(name, body);
	free(body);
}

static void
test_active(void **state)
{
	json_t *t = load_task("active");

	(void)state;
	render_golden("active", t);
	json_decref(t);
}

static void
test_paused(void **state)
{
	json_t *t = load_task("paused");

	(void)state;
	render_golden("paused", t);
	json_decref(t);
}

/*
 * A task waiting for a slot (controller.max_active_tasks): Queued; the
 * same for a paused one waiting to resume. Its place, which moves each
 * time a task is admitted, is not in the comment: every queued task's
 * comment would be rewritten then (a write to GitHub or GitLab each,
 * against the bot's rate limits), though the phase did not change.
 */
static void
test_queued(void **state)
{
	json_t *t = load_task("queued");
	size_t len;
	char *body, *moved;

	(void)state;
	render_golden("queued", t);
	body = notifier_render(t, NULL, &len);
	json_object_set_new(json_object_get(t, "status"), "message",
	    json_string("waiting for a free slot: 2 of 3 tasks are running; "
	    "0 queued ahead"));
	moved = notifier_render(t, NULL, NULL);
	assert_string_equal(moved, body);
	free(moved);
	free(body);
	json_object_set_new(json_object_get(t, "status"), "phase",
	    json_string("Paused"));
	json_object_set_new(json_object_get(t, "status"), "message",
	    json_string("waiting for a free slot to resume: 3 of 3 tasks are "
	    "running; 0 queued ahead"));
	body = notifier_render(t, NULL, &len);
	check_body(body, len, NOTIFIER_MAX_BODY);
	assert_non_null(strstr(body, "### \xe2\x8f\xb3 Queued\n"));
	assert_non_null(strstr(body, "**Message:** waiting for a free slot "
	    "to resume (its place: `/diverge status`)\n"));
	assert_null(strstr(body, "queued ahead"));
	assert_non_null(strstr(body, "`/diverge pause`"));
	assert_null(strstr(body, "/diverge resume"));
	free(body);
	/* the reason alone makes no queue: a paused task is paused */
	json_object_set_new(json_object_get(t, "status"), "reason",
	    json_string("Suspended"));
	body = notifier_render(t, NULL, &len);
	assert_null(strstr(body, "Queued"));
	assert_non_null(strstr(body, "### \xe2\x8f\xb8\xef\xb8\x8f Paused "
	    "\xe2\x80\x94 Suspended\n"));
	free(body);
	json_decref(t);
}

static void
test_completed(void **state)
{
	json_t *t = load_task("completed");
	char *fin;

	(void)state;
	render_golden("completed", t);
	fin = notifier_render_final(t, "alice", 1);
	golden("completed-final", fin);
	free(fin);
	/* the sticky comment follows another task of the PR */
	fin = notifier_render_final(t, "alice", 0);
	assert_non_null(strstr(fin, "@alice "));
	assert_null(strstr(fin, "has the details"));
	assert_non_null(strstr(fin, "follows another task"));
	assert_non_null(strstr(fin, "`/diverge status`"));
	free(fin);
	json_decref(t);
}

static json_t *
cmp_task(const char *ns, const char *name, const char *created,
    const char *phase)
{
	json_t *t = json_pack("{s:{s:s,s:s}}", "metadata", "namespace", ns,
	    "name", name);

	if (created != NULL)
		json_object_set_new(json_object_get(t, "metadata"),
		    "creationTimestamp", json_string(created));
	if (phase != NULL)
		json_object_set_new(t, "status", json_pack("{s:s}", "phase",
		    phase));
	return t;
}

/* Both orders of a pair agree: a first (an antisymmetric order). */
static void
assert_first(const json_t *a, const json_t *b)
{
	assert_true(notifier_task_cmp(a, b) < 0);
	assert_true(notifier_task_cmp(b, a) > 0);
}

/*
 * The task the sticky comment follows: live before finished, then the
 * newest, and for two tasks made in the same second (creationTimestamp
 * has a resolution of 1 s) a choice that does not depend on the order
 * the tasks are listed in, so the comment does not flip between them.
 */
static void
test_task_cmp(void **state)
{
	const char *s1 = "2026-11-29T10:00:01Z", *s2 = "2026-11-29T10:00:02Z";
	json_t *fix = cmp_task("team-a", "fix-pr-42", s1, "Active");
	json_t *hand = cmp_task("team-a", "hand-42", s1, "Active");
	json_t *other_ns = cmp_task("team-b", "a", s1, "Active");
	json_t *newer = cmp_task("team-a", "zz", s2, "Active");
	json_t *done = cmp_task("team-a", "aa", s2, "Completed");
	json_t *failed = cmp_task("team-a", "ab", s2, "Failed");
	json_t *unrec = cmp_task("team-a", "ac", s2, NULL);
	json_t *nots = cmp_task("team-a", "ad", NULL, "Active");

	(void)state;
	/* the same second: by namespace, then name, in either order */
	assert_first(fix, hand);
	assert_first(hand, other_ns);
	assert_first(fix, other_ns);
	/* the newer live task first, whatever its name */
	assert_first(newer, fix);
	/* a live task before a finished or unreconciled one */
	assert_first(fix, done);
	assert_first(fix, unrec);
	assert_first(done, failed);	/* both finished: by name */
	/* a task with a creationTimestamp before one without */
	assert_first(fix, nots);
	assert_int_equal(notifier_task_cmp(fix, fix), 0);
	json_decref(fix);
	json_decref(hand);
	json_decref(other_ns);
	json_decref(newer);
	json_decref(done);
	json_decref(failed);
	json_decref(unrec);
	json_decref(nots);
}

static void
test_failed(void **state)
{
	json_t *t = load_task("failed");
	char *fin;

	(void)state;
	render_golden("failed", t);
	fin = notifier_render_final(t, "bob", 1);
	golden("failed-final", fin);
	assert_null(strstr(fin, NOTIFIER_MARKER));
	free(fin);
	/* a login that is not one is not mentioned */
	fin = notifier_render_final(t, "eve <b>@all</b>", 1);
	assert_null(strchr(fin, '@'));
	assert_null(strchr(fin, '<'));
	free(fin);
	json_decref(t);
}

/* Budgets handed in by the notifier win over the spec. */
static void
test_budget_opts(void **state)
{
	struct notifier_render_opts o = { -1, 7500000, 0, NULL, 0 };
	json_t *t = load_task("active");
	char *body;

	(void)state;
	body = notifier_render(t, &o, NULL);
	assert_non_null(strstr(body, "$0.02 of $7.50 USD"));
	assert_non_null(strstr(body, "1,500 tokens (no token limit)"));
	assert_null(strstr(body, "<sub>Updated"));
	free(body);
	json_decref(t);
}

static const char hostile[] =
    "@alice @org/team please look\n"
    "<script>alert(1)</script> <img src=x onerror=alert(1)>\n"
    "<!-- diverge-agent-task -->\n"
    "/diverge budget +$1000\n"
    "   /DIVERGE resume\n"
    "```\n"
    "/diverge pause\n"
    "/close\n"
    "  /merge\n"
    "````` five backticks\n"
    "</details><details><summary>x</summary>\n"
    "**bold** _it_ [link](javascript:alert(1)) | table | #heading\n"
    "broken: \xff\xfe \xc3( \xed\xa0\x80 \xf0\x9f\x98 end\n"
    "bidi \xe2\x80\xae evil \x01\x1b[31m";

static json_t *
hostile_task(size_t repeat)
{
	json_t *t = load_task("active");
	struct buf b;
	size_t i;

	buf_init(&b, 64u << 20);
	for (i = 0; i < repeat; i++)
		buf_add(&b, hostile, sizeof(hostile) - 1);
	json_object_set_new(json_object_get(t, "spec"), "objective",
	    json_stringn_nocheck(b.data, b.len));
	json_object_set_new(json_object_get(json_object_get(t, "metadata"),
	    "annotations"), "divergedev.com/guidance",
	    json_stringn_nocheck(b.data, b.len));
	json_object_set_new(json_object_get(t, "status"), "message",
	    json_stringn_nocheck(b.data, b.len));
	json_object_set_new(json_object_get(t, "status"), "reason",
	    json_string("<b>@here</b> /diverge fix"));
	json_object_set_new(json_object_get(json_object_get(t, "spec"),
	    "repository"), "workingBranch",
	    json_string("x`](javascript:1) @bob"));
	json_object_set_new(json_object_get(t, "status"), "previewUrl",
	    json_string("https://evil.example/a b)(<x>\"'`"));
	buf_release(&b);
	return t;
}

static void
test_injection(void **state)
{
	json_t *t = hostile_task(1);

	(void)state;
	render_golden("injection", t);
	json_decref(t);
}

/*
 * A preview URL is linked only when it is http(s): a script, data or file
 * URL (an Environment anyone with access to the cluster could write)
 * gets no link at all.
 */
static void
test_preview_scheme(void **state)
{
	static const struct {
		const char *url;
		int linked;
	} cases[] = {
		{ "javascript:alert(1)", 0 },
		{ "JavaScript:alert(1)//https://ok.example/", 0 },
		{ "data:text/html,<script>x</script>", 0 },
		{ "file:///etc/passwd", 0 },
		{ "//ok.example/", 0 },
		{ "https://ok.example/app", 1 },
		{ "http://ok.example:8080/", 1 },
	};
	struct notifier_render_opts o = { NOW, -1, -1, NULL, 0 };
	json_t *t = hostile_task(1);
	size_t i, len;
	char *body;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		json_object_set_new(json_object_get(t, "status"), "previewUrl",
		    json_string(cases[i].url));
		body = notifier_render(t, &o, &len);
		if ((strstr(body, "open the preview") != NULL) !=
		    cases[i].linked)
			fail_msg("%s: linked %d", cases[i].url,
			    !cases[i].linked);
		if (cases[i].linked)
			assert_true(strstr(body, "](https://ok.example/") !=
			    NULL || strstr(body, "](http://ok.example:") !=
			    NULL);
		free(body);
	}
	json_decref(t);
}

/* A 100 KB objective, guidance and message: capped, under the limit. */
static void
test_huge(void **state)
{
	json_t *t = hostile_task(100 * 1024 / (sizeof(hostile) - 1) + 1);
	struct notifier_render_opts o = { NOW, -1, -1, NULL, 0 };
	size_t len;
	char *body;

	(void)state;
	assert_true(strlen(json_string_value(json_object_get(
	    json_object_get(t, "spec"), "objective"))) >= 100 * 1024);
	body = notifier_render(t, &o, &len);
	check_body(body, len, NOTIFIER_MAX_BODY);
	assert_non_null(strstr(body, "(truncated)"));
	golden("huge", body);
	free(body);
	json_decref(t);
}

/* Tight limits cut the body on whole lines, outside any fence. */
static void
test_small_limits(void **state)
{
	json_t *t = hostile_task(20);
	size_t max, len;
	char *body;

	(void)state;
	for (max = 120; max < 9000; max += 97) {
		struct notifier_render_opts o = { NOW, -1, -1, NULL, max };

		body = notifier_render(t, &o, &len);
		check_body(body, len, max);
		free(body);
	}
	json_decref(t);
}

static void
test_truncate(void **state)
{
	struct buf b;
	char *s;
	size_t len, n, i;

	(void)state;
	buf_init(&b, 1u << 20);
	buf_addstr(&b, "head \xc3\xa9\xc3\xa9\n<details>\n<summary>s</summary>"
	    "\n\n");
	buf_addstr(&b, "````text\n");
	for (i = 0; i < 2000; i++)
		buf_addstr(&b, "\xe2\x82\xac line with euro\n");
	buf_addstr(&b, "````\n</details>\n");
	s = buf_detach(&b, &len);
	n = notifier_truncate(s, len, 5000);
	assert_true(n <= 5000);
	assert_int_equal(strlen(s), n);
	assert_true(valid_utf8(s, n));
	assert_true(fences_balanced(s));
	assert_null(strstr(s, "<details>"));
	assert_non_null(strstr(s, "(truncated)"));
	free(s);

	/* a short text is left alone */
	s = xstrdup("short");
	assert_int_equal(notifier_truncate(s, 5, 100), 5);
	assert_string_equal(s, "short");
	free(s);
}

/*
 * head, a line too long to keep, then tail, cut to max bytes by
 * notifier_truncate: a new string, checked for length and fences.
 */
static char *
cut_at_long_line(const char *head, const char *tail, size_t max)
{
	struct buf b;
	char *s;
	size_t len, n, i;

	buf_init(&b, 1u << 16);
	buf_addstr(&b, head);
	for (i = 0; i < 200; i++)
		buf_add(&b, "x", 1);
	buf_addstr(&b, "\n");
	buf_addstr(&b, tail);
	s = buf_detach(&b, &len);
	n = notifier_truncate(s, len, max);
	assert_int_equal(n, strlen(s));
	assert_true(fences_balanced(s));
	return s;
}

/*
 * A fence's line with an info string (```text) inside the fence does not
 * close it: the cut goes before the fence, not after that line.
 */
static void
test_truncate_fence_info(void **state)
{
	char *s;

	(void)state;
	s = cut_at_long_line("head\n```\nabc\n```text\nmore\n",
	    "```\ntail\n", 60);
	assert_string_equal(s, "head\n\n\n\xe2\x80\xa6 (truncated)\n");
	free(s);
}

/*
 * Backticks with a backtick after them on the line make a code span, not
 * a fence: the fence opened below it, closed before the cut, stays whole.
 */
static void
test_truncate_fence_backtick_info(void **state)
{
	char *s;

	(void)state;
	s = cut_at_long_line("a\n``` x`y\n```\ncode\n```\n", "", 60);
	assert_string_equal(s, "a\n``` x`y\n```\ncode\n```\n\n\n"
	    "\xe2\x80\xa6 (truncated)\n");
	free(s);
}

static void
test_utf8_cut(void **state)
{
	/* a, e acute, euro sign, an emoji: 1, 2, 3 and 4 bytes */
	const char *s = "a\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80";

	(void)state;
	assert_int_equal(utf8_cut(s, 10, 100), 10);
	assert_int_equal(utf8_cut(s, 10, 1), 1);
	assert_int_equal(utf8_cut(s, 10, 2), 1);
	assert_int_equal(utf8_cut(s, 10, 3), 3);
	assert_int_equal(utf8_cut(s, 10, 5), 3);
	assert_int_equal(utf8_cut(s, 10, 6), 6);
	assert_int_equal(utf8_cut(s, 10, 9), 6);
	assert_int_equal(utf8_cut(s, 10, 0), 0);
}

static void
test_escape_inline(void **state)
{
	const char *s;
	struct buf b;

	(void)state;
	buf_init(&b, 1u << 16);
	notifier_escape_inline(&b, "a*b <c> @d\ne", 12, 100);
	assert_string_equal(b.data, "a\\*b &lt;c&gt; @\xe2\x80\x8b" "d e");
	buf_reset(&b);
	notifier_escape_inline(&b, "abcdef", 6, 3);
	assert_string_equal(b.data, "abc\xe2\x80\xa6");
	/* URLs stay text: no GFM autolink (scheme:// or www.) */
	buf_reset(&b);
	notifier_escape_inline(&b, "log in: https://evil.example/x or "
	    "WWW.evil.example, a:b", 55, 100);
	assert_string_equal(b.data, "log in: https:\xe2\x80\x8b//evil.example/x "
	    "or WWW\xe2\x80\x8b.evil.example, a:b");
	/*
	 * No math ($...$ renders LaTeX on both hosts, and GitHub does not
	 * honour \$) and no reference: the hosts link #12, org/repo#12,
	 * GH-12, !12, ~bug, ~"a b", %v1, &3 and $4 in the rendered text,
	 * backslash or not, and record a "mentioned in" on the target
	 */
	buf_reset(&b);
	s = "$\\Huge\\color{red}\\text{LGTM}$ $5 of $ 6";
	notifier_escape_inline(&b, s, strlen(s), 100);
	assert_string_equal(b.data, "&#36;\\\\Huge\\\\color{red}\\\\text{LGTM}"
	    "&#36; &#36;\xe2\x80\x8b" "5 of &#36; 6");
	buf_reset(&b);
	s = "#12 o/r#3 GH-4 gh-5 !6 ~bug ~\"a b\" %v1 &7 ahGH-8 # x";
	notifier_escape_inline(&b, s, strlen(s), 100);
	assert_string_equal(b.data, "\\#\xe2\x80\x8b" "12 o/r\\#\xe2\x80\x8b" "3 "
	    "GH\xe2\x80\x8b-4 gh\xe2\x80\x8b-5 \\!\xe2\x80\x8b" "6 "
	    "\\~\xe2\x80\x8b" "bug \\~\xe2\x80\x8b\"a b\" %\xe2\x80\x8b" "v1 "
	    "&amp;\xe2\x80\x8b" "7 ahGH-8 \\# x");
	/*
	 * nor GitLab's bracketed references (18.2): [work_item:12] and
	 * [epic:g/p/3] are issues and epics, "mentioned in" like #12
	 */
	buf_reset(&b);
	s = "[work_item:12] [epic:g/p/3] [vulnerability:4] [x] [ y";
	notifier_escape_inline(&b, s, strlen(s), 100);
	assert_string_equal(b.data, "\\[\xe2\x80\x8bwork\\_item:12\\] "
	    "\\[\xe2\x80\x8b" "epic:g/p/3\\] \\[\xe2\x80\x8bvulnerability:4\\] "
	    "\\[\xe2\x80\x8bx\\] \\[ y");
	buf_release(&b);
}

/*
 * Invisible text never reaches the body: Unicode tags spelling "ignore"
 * (read by language models, shown by no one), bidi marks, zero-width
 * space, word joiner, BOM; inline and in a block. ZWJ stays (emoji).
 */
static void
test_invisible(void **state)
{
	static const char s[] = "a\xf3\xa0\x81\xa9\xf3\xa0\x81\xa7\xf3\xa0\x81\xae"
	    "\xf3\xa0\x81\xaf\xf3\xa0\x81\xb2\xf3\xa0\x81\xa5" "b\xe2\x80\x8e"
	    "c\xe2\x80\x8f" "d\xd8\x9c" "e\xe2\x80\x8b" "f\xe2\x81\xa0"
	    "g\xef\xbb\xbf" "h\xe1\xa0\x8e" "i\xef\xbf\xb9" "j "
	    "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb";
	struct buf b;

	(void)state;
	buf_init(&b, 1u << 16);
	notifier_escape_inline(&b, s, sizeof(s) - 1, 1000);
	assert_string_equal(b.data, "abcdefghij "
	    "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb");
	buf_reset(&b);
	notifier_escape_block(&b, s, sizeof(s) - 1, 1000);
	assert_string_equal(b.data, "```text\nabcdefghij "
	    "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb\n```\n");
	buf_release(&b);
}

/*
 * Each range of dropped characters, at both of its ends, and the
 * characters just outside it, which stay: an off-by-one at either end
 * would let a C1 control, a bidi override or the last Unicode tag through.
 */
static void
test_invisible_bounds(void **state)
{
	static const uint32_t dropped[][2] = {
		{ 0x01, 0x08 }, { 0x0b, 0x1f }, { 0x7f, 0x9f }, { 0x61c, 0x61c },
		{ 0x180e, 0x180e }, { 0x200b, 0x200b }, { 0x200e, 0x200f },
		{ 0x202a, 0x202e }, { 0x2060, 0x2064 }, { 0x2066, 0x2069 },
		{ 0xfeff, 0xfeff }, { 0xfff9, 0xfffb }, { 0xe0000, 0xe007f },
	};
	static const uint32_t kept[] = {
		0xa0, 0x61b, 0x61d, 0x180d, 0x180f, 0x200a, 0x200c, 0x200d,
		0x2010, 0x2029, 0x202f, 0x205f, 0x2065, 0x206a, 0xfefe, 0xfff8,
		0xfffc, 0xdffff, 0xe0080,
	};
	char ch[8], in[16];
	struct buf b;
	size_t i, e;

	(void)state;
	buf_init(&b, 1u << 16);
	for (i = 0; i < ARRAY_SIZE(dropped); i++)
		for (e = 0; e < 2; e++) {
			ch[utf8_put(dropped[i][e], ch)] = '\0';
			snprintf(in, sizeof(in), "x%sy", ch);
			buf_reset(&b);
			notifier_escape_inline(&b, in, strlen(in), 100);
			if (strcmp(b.data, "xy") != 0)
				fail_msg("U+%04X kept", (unsigned)dropped[i][e]);
		}
	for (i = 0; i < ARRAY_SIZE(kept); i++) {
		ch[utf8_put(kept[i], ch)] = '\0';
		snprintf(in, sizeof(in), "x%sy", ch);
		buf_reset(&b);
		notifier_escape_inline(&b, in, strlen(in), 100);
		if (strcmp(b.data, in) != 0)
			fail_msg("U+%04X dropped", (unsigned)kept[i]);
	}
	buf_release(&b);
}

static void
test_fence_longer_than_content(void **state)
{
	struct buf b;

	(void)state;
	buf_init(&b, 1u << 16);
	notifier_escape_block(&b, "x ``````` y", 11, 100);
	assert_memory_equal(b.data, "````````text\n", 13);
	assert_true(fences_balanced(b.data));
	buf_release(&b);
}

/*
 * The edges of inline escaping: a tab is a space like a newline, a
 * reference sigil right before the last character (#1, !2, &3 ending the
 * text) and GH-4 ending the text are defused all the same, and a pipe
 * does not start a table cell.
 */
static void
test_escape_inline_edges(void **state)
{
	const char *s;
	struct buf b;

	(void)state;
	buf_init(&b, 1u << 16);
	notifier_escape_inline(&b, "a\tb", 3, 100);
	assert_string_equal(b.data, "a b");
	buf_reset(&b);
	notifier_escape_inline(&b, "#1", 2, 100);
	assert_string_equal(b.data, "\\#\xe2\x80\x8b" "1");
	buf_reset(&b);
	notifier_escape_inline(&b, "see !2", 6, 100);
	assert_string_equal(b.data, "see \\!\xe2\x80\x8b" "2");
	buf_reset(&b);
	notifier_escape_inline(&b, "&3", 2, 100);
	assert_string_equal(b.data, "&amp;\xe2\x80\x8b" "3");
	buf_reset(&b);
	s = "fixes GH-4";
	notifier_escape_inline(&b, s, strlen(s), 100);
	assert_string_equal(b.data, "fixes GH\xe2\x80\x8b-4");
	buf_reset(&b);
	s = "GH-4";
	notifier_escape_inline(&b, s, strlen(s), 100);
	assert_string_equal(b.data, "GH\xe2\x80\x8b-4");
	buf_reset(&b);
	notifier_escape_inline(&b, "a|b", 3, 100);
	assert_string_equal(b.data, "a\\|b");
	buf_release(&b);
}

/*
 * A line of a block that starts with a slash after tabs (a GitLab quick
 * action, a /diverge command) is made inert like one after spaces, an
 * HTML comment opener is broken, and a fence of three backticks inside
 * does not close the block.
 */
static void
test_escape_block_edges(void **state)
{
	struct buf b;

	(void)state;
	buf_init(&b, 1u << 16);
	notifier_escape_block(&b, "x\n\t/close\n \t/diverge pause", 26, 100);
	assert_string_equal(b.data, "```text\nx\n\xe2\x80\x8b\t/close\n"
	    "\xe2\x80\x8b \t/diverge pause\n```\n");
	assert_false(webhook_has_command_line(b.data, b.len));
	buf_reset(&b);
	notifier_escape_block(&b, "a <!--", 6, 100);
	assert_string_equal(b.data, "```text\na <\xe2\x80\x8b!--\n```\n");
	/* a run of exactly three backticks inside: a fence of four */
	buf_reset(&b);
	notifier_escape_block(&b, "a\n```\nb", 7, 100);
	assert_string_equal(b.data, "````text\na\n```\nb\n````\n");
	assert_true(fences_balanced(b.data));
	buf_release(&b);
}

/* A body of exactly max bytes is left alone; one byte more is cut. */
static void
test_truncate_exact(void **state)
{
	char *s;

	(void)state;
	s = xstrdup("line one\nline two\nline three\n");
	assert_int_equal(notifier_truncate(s, strlen(s), strlen(s)),
	    strlen("line one\nline two\nline three\n"));
	assert_string_equal(s, "line one\nline two\nline three\n");
	assert_true(notifier_truncate(s, strlen(s), strlen(s) - 1) <
	    strlen("line one\nline two\nline three\n"));
	assert_non_null(strstr(s, "(truncated)"));
	free(s);
}

/*
 * Backticks indented by four spaces are an indented code line, not a
 * fence: nothing is left open, the cut stays after them.
 */
static void
test_truncate_indented_backticks(void **state)
{
	char *s;

	(void)state;
	s = cut_at_long_line("a\n    ```\nb\n", "", 60);
	assert_string_equal(s, "a\n    ```\nb\n\n\n"
	    "\xe2\x80\xa6 (truncated)\n");
	free(s);
}

/*
 * A fence of backticks is not closed by a line of tildes: it is still
 * open at the cut, so the cut goes before it.
 */
static void
test_truncate_fence_char(void **state)
{
	char *s;

	(void)state;
	s = cut_at_long_line("a\n```\ncode\n~~~\nmore\n", "```\n", 60);
	assert_string_equal(s, "a\n\n\n\xe2\x80\xa6 (truncated)\n");
	free(s);
}

/*
 * The badge and the commands of each phase: Pausing is not Pending, and
 * a paused or pausing task offers resume, not guide; a provisioning task
 * says so.
 */
static void
test_phases(void **state)
{
	json_t *t = load_task("active");
	size_t len;
	char *body;

	(void)state;
	json_object_set_new(json_object_get(t, "status"), "phase",
	    json_string("Pausing"));
	body = notifier_render(t, NULL, &len);
	check_body(body, len, NOTIFIER_MAX_BODY);
	assert_non_null(strstr(body, "### \xe2\x8f\xb8\xef\xb8\x8f "
	    "Pausing\n"));
	assert_non_null(strstr(body, "`/diverge resume`"));
	assert_null(strstr(body, "/diverge guide"));
	free(body);
	json_object_set_new(json_object_get(t, "status"), "phase",
	    json_string("Provisioning"));
	body = notifier_render(t, NULL, &len);
	check_body(body, len, NOTIFIER_MAX_BODY);
	assert_non_null(strstr(body, "### \xf0\x9f\x9a\x80 Running "
	    "(provisioning)\n"));
	assert_non_null(strstr(body, "`/diverge guide <hint>`"));
	free(body);
	json_decref(t);
}

/*
 * status.message may quote an upstream error: a token in it never
 * reaches the comment.
 */
static void
test_message_redacted(void **state)
{
	static const char tok[] = "ghp_0123456789abcdefghijABCDEFGHIJ012345";
	json_t *t = load_task("active");
	char *body, *msg;

	(void)state;
	msg = xasprintf("push failed: https://x-access-token:%s@github.com/"
	    "o/r said: bad credentials %s", tok, tok);
	json_object_set_new(json_object_get(t, "status"), "message",
	    json_string(msg));
	body = notifier_render(t, NULL, NULL);
	assert_non_null(strstr(body, "**Message:** push failed"));
	assert_null(strstr(body, "ghp_"));
	assert_null(strstr(body, "0123456789abcdef"));
	assert_non_null(strstr(body, "redacted"));
	free(body);
	free(msg);
	json_decref(t);
}

/* A finished task shows no guidance: it has nothing left to guide. */
static void
test_finished_no_guidance(void **state)
{
	static const char *const phases[] = { "Completed", "Failed" };
	json_t *t = load_task("active");
	size_t i;
	char *body;

	(void)state;
	body = notifier_render(t, NULL, NULL);
	assert_non_null(strstr(body, "**Latest guidance**"));
	free(body);
	for (i = 0; i < ARRAY_SIZE(phases); i++) {
		json_object_set_new(json_object_get(t, "status"), "phase",
		    json_string(phases[i]));
		body = notifier_render(t, NULL, NULL);
		assert_null(strstr(body, "Latest guidance"));
		assert_null(strstr(body, "Keep the public API stable"));
		free(body);
	}
	json_decref(t);
}

/*
 * The exit link of a preview URL that carries the environment already
 * keeps what follows it (another parameter, a fragment).
 */
static void
test_preview_exit_link(void **state)
{
	struct notifier_render_opts o = { -1, -1, -1, NULL, 0 };
	json_t *t = load_task("active");
	char *body;

	(void)state;
	o.preview_url = "https://p.example/app?_diverge_env=e1#top";
	body = notifier_render(t, &o, NULL);
	assert_non_null(strstr(body, "[open the preview]"
	    "(https://p.example/app?_diverge_env=e1#top)"));
	assert_non_null(strstr(body, "[leave the preview]"
	    "(https://p.example/app?_diverge_env=clear#top)\n"));
	free(body);
	o.preview_url = "https://p.example/app?_diverge_env=e1&x=1";
	body = notifier_render(t, &o, NULL);
	assert_non_null(strstr(body, "[leave the preview]"
	    "(https://p.example/app?_diverge_env=clear&x=1)\n"));
	free(body);
	json_decref(t);
}

/*
 * The finished-run comment gives the reason of a failure only, and
 * mentions only what can be a login (not one starting with a dot).
 */
static void
test_final_edges(void **state)
{
	json_t *t = load_task("completed");
	char *fin;

	(void)state;
	json_object_set_new(json_object_get(t, "status"), "reason",
	    json_string("Succeeded"));
	fin = notifier_render_final(t, "alice", 1);
	assert_null(strstr(fin, "Succeeded"));
	assert_non_null(strstr(fin, "completed. The status comment"));
	free(fin);
	fin = notifier_render_final(t, ".alice", 1);
	assert_null(strchr(fin, '@'));
	free(fin);
	fin = notifier_render_final(t, "a.lice", 1);
	assert_non_null(strstr(fin, "@a.lice "));
	free(fin);
	json_decref(t);
}

static void
test_hash(void **state)
{
	char h[65];

	(void)state;
	notifier_hash("abc", 3, h);
	assert_string_equal(h, "ba7816bf8f01cfea414140de5dae2223"
	    "b00361a396177a9cb410ff61f20015ad");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_active),
		cmocka_unit_test(test_paused),
		cmocka_unit_test(test_queued),
		cmocka_unit_test(test_completed),
		cmocka_unit_test(test_failed),
		cmocka_unit_test(test_task_cmp),
		cmocka_unit_test(test_budget_opts),
		cmocka_unit_test(test_injection),
		cmocka_unit_test(test_huge),
		cmocka_unit_test(test_small_limits),
		cmocka_unit_test(test_truncate),
		cmocka_unit_test(test_truncate_fence_info),
		cmocka_unit_test(test_truncate_fence_backtick_info),
		cmocka_unit_test(test_utf8_cut),
		cmocka_unit_test(test_escape_inline),
		cmocka_unit_test(test_invisible),
		cmocka_unit_test(test_invisible_bounds),
		cmocka_unit_test(test_preview_scheme),
		cmocka_unit_test(test_fence_longer_than_content),
		cmocka_unit_test(test_hash),
		cmocka_unit_test(test_escape_inline_edges),
		cmocka_unit_test(test_escape_block_edges),
		cmocka_unit_test(test_truncate_exact),
		cmocka_unit_test(test_truncate_indented_backticks),
		cmocka_unit_test(test_truncate_fence_char),
		cmocka_unit_test(test_phases),
		cmocka_unit_test(test_message_redacted),
		cmocka_unit_test(test_finished_no_guidance),
		cmocka_unit_test(test_preview_exit_link),
		cmocka_unit_test(test_final_edges),
	};

	util_json_init();
	return cmocka_run_group_tests(tests, NULL, NULL);
}

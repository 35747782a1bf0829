/*
 * The /diverge grammar: a table of comment bodies and what they must
 * parse to, then a few properties (help text, roles, threads, limits).
 *
 * Each table row is one TAP test. expect is either the rendering of the
 * commands, "LINE:name" with "=text" for fix/guide and " $USD_MICRO tTOKENS"
 * for budget/resume, joined by " | " ("" when there is none), or "E:" or
 * "H:" (an error, a help result) followed by a part of the message.
 */
#include "config.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "scm/commands.h"
#include "util/util.h"

#define MB 1000000

struct tcase {
	const char *name;
	const char *body;	/* NUL-terminated unless blen is set */
	const char *expect;
	size_t blen;		/* body length when it holds NUL bytes */
	char *(*build)(size_t *len);	/* builds the body instead */
	struct cmd_limits lim;	/* zero: defaults */
};

/* ---- builders of large or binary bodies ---- */

static char *
repeat(const char *unit, size_t times, const char *tail, size_t *len)
{
	size_t ul = strlen(unit), tl = strlen(tail), i;
	char *s = xmalloc(ul * times + tl + 1);

	for (i = 0; i < times; i++)
		memcpy(s + i * ul, unit, ul);
	memcpy(s + ul * times, tail, tl + 1);
	*len = ul * times + tl;
	return s;
}

static char *
text_of(char c, size_t n, const char *head, const char *tail, size_t *len)
{
	size_t hl = strlen(head), tl = strlen(tail);
	char *s = xmalloc(hl + n + tl + 1);

	memcpy(s, head, hl);
	memset(s + hl, c, n);
	memcpy(s + hl + n, tail, tl + 1);
	*len = hl + n + tl;
	return s;
}

static char *
b_fix_4000(size_t *len)
{
	return text_of('a', 4000, "/diverge fix ", "", len);
}

static char *
b_fix_4001(size_t *len)
{
	return text_of('a', 4001, "/diverge fix ", "", len);
}

static char *
b_guide_2000(size_t *len)
{
	return text_of('g', 2000, "/diverge guide ", "\n", len);
}

static char *
b_guide_2001(size_t *len)
{
	return text_of('g', 2001, "/diverge guide ", "\n", len);
}

static char *
b_fix_trailing_blanks(size_t *len)
{
	return text_of(' ', 100000, "/diverge fix ok", "\n", len);
}

static char *
b_status_trailing_blanks(size_t *len)
{
	return text_of(' ', MB, "/diverge status", "", len);
}

/* 1 MB of prose, quotes and code, then a command on the last line. */
static char *
b_1mb_prose(size_t *len)
{
	return repeat("Some prose about the change, with `code` and <b>html"
	    "</b>.\n> a quote /diverge pause\n```\n/diverge pause\n```\n\n",
	    MB / 90, "/diverge status\n", len);
}

/* 1 MB on one line: an objective far too long. */
static char *
b_1mb_objective(size_t *len)
{
	return text_of('x', MB, "/diverge fix ", "", len);
}

/* 1 MB of backtick runs of every length, none closed: linear anyway. */
static char *
b_1mb_ticks(size_t *len)
{
	size_t n = 0, k = 1;
	char *s = xmalloc(MB + 64);

	while (n + k + 1 < MB) {
		memset(s + n, '`', k);
		n += k;
		s[n++] = ' ';
		k = k % 1400 + 1;
	}
	memcpy(s + n, "\n\n/diverge pause\n", 18);
	*len = n + 17;
	return s;
}

/* An HTML comment opened at the start of 1 MB that never closes. */
static char *
b_1mb_unclosed_comment(size_t *len)
{
	return repeat("<!-- /diverge pause\n/diverge status\n", MB / 36, "",
	    len);
}

/* 10,000 lines; the only command is on line 10,000. */
static char *
b_10k_lines(size_t *len)
{
	return repeat("just a line of text\n", 9999, "/diverge pause", len);
}

/* 10,000 identical status lines collapse into one. */
static char *
b_10k_status(size_t *len)
{
	return repeat("/diverge status\n", 10000, "", len);
}

/* 10,000 distinct guides: too many, refused quickly. */
static char *
b_10k_distinct(size_t *len)
{
	struct buf b;
	int i;

	buf_init(&b, 1u << 20);
	for (i = 0; i < 10000; i++)
		buf_printf(&b, "/diverge budget +%d\n", i % 900 + 1);
	*len = b.len;
	return buf_detach(&b, NULL);
}

/* A 10,000-line objective: too long. */
static char *
b_10k_objective(size_t *len)
{
	return repeat("more objective text\n", 10000, "", len);
}

static char *
b_10k_objective_cmd(size_t *len)
{
	size_t n;
	char *tail = b_10k_objective(&n), *s;

	s = xasprintf("/diverge fix start\n%s", tail);
	free(tail);
	*len = strlen(s);
	return s;
}

/* budget arguments of exactly 256 bytes ("1", blanks, "2M"), and 257 */
static char *
b_budget_args_256(size_t *len)
{
	return text_of(' ', 253, "/diverge budget 1", "2M", len);
}

static char *
b_budget_args_257(size_t *len)
{
	return text_of(' ', 254, "/diverge budget 1", "2M", len);
}

/* ---- the table ---- */

static const struct tcase cases[] = {
	/* command lines */
	{ "no command", "just a comment", "" , 0, NULL, { 0, 0, 0 } },
	{ "empty body", "", "", 0, NULL, { 0, 0, 0 } },
	{ "fix", "/diverge fix make it fast", "1:fix=make it fast", 0, NULL,
	    { 0, 0, 0 } },
	{ "keyword case", "/DIVERGE FIX Make It", "1:fix=Make It", 0, NULL,
	    { 0, 0, 0 } },
	{ "subcommand case", "/Diverge StAtUs", "1:status", 0, NULL,
	    { 0, 0, 0 } },
	{ "three spaces", "   /diverge status", "1:status", 0, NULL,
	    { 0, 0, 0 } },
	{ "four spaces", "    /diverge status", "", 0, NULL, { 0, 0, 0 } },
	{ "tab indent", "\t/diverge status", "", 0, NULL, { 0, 0, 0 } },
	{ "divergent", "/divergent fix x", "", 0, NULL, { 0, 0, 0 } },
	{ "diverge-x", "/diverge-x fix x", "", 0, NULL, { 0, 0, 0 } },
	{ "diverge: no blank", "/diverge:fix x", "", 0, NULL, { 0, 0, 0 } },
	{ "mid-line", "please /diverge fix x", "", 0, NULL, { 0, 0, 0 } },
	{ "tab separator", "/diverge\tstatus", "1:status", 0, NULL,
	    { 0, 0, 0 } },
	{ "line number", "hello\n\n/diverge status\nbye", "3:status", 0, NULL,
	    { 0, 0, 0 } },
	{ "crlf", "a\r\nb\r\n/diverge status\r\n", "3:status", 0, NULL,
	    { 0, 0, 0 } },
	{ "lone cr", "a\rb\r/diverge status", "3:status", 0, NULL,
	    { 0, 0, 0 } },
	{ "cr mix", "a\r\n\r/diverge pause\r", "3:pause", 0, NULL,
	    { 0, 0, 0 } },
	{ "crlf objective", "/diverge fix one\r\ntwo\r\n\r\nx",
	    "1:fix=one\ntwo", 0, NULL, { 0, 0, 0 } },
	/* help results */
	{ "bare", "/diverge", "H:`/diverge` needs a command", 0, NULL,
	    { 0, 0, 0 } },
	{ "bare blanks", "/diverge  \t ", "H:needs a command", 0, NULL,
	    { 0, 0, 0 } },
	{ "unknown", "/diverge frobnicate now",
	    "H:unknown command `frobnicate`", 0, NULL, { 0, 0, 0 } },
	{ "unknown not echoed", "/diverge f\xc3\xa9<b>", "H:unknown command",
	    0, NULL, { 0, 0, 0 } },
	{ "unknown prefix", "/diverge fixit", "H:unknown command `fixit`", 0,
	    NULL, { 0, 0, 0 } },
	{ "unknown among", "/diverge status\n/diverge foo",
	    "H:line 2: unknown command `foo`", 0, NULL, { 0, 0, 0 } },
	/* no-argument commands */
	{ "pause", "/diverge pause", "1:pause", 0, NULL, { 0, 0, 0 } },
	{ "status", "/diverge status  ", "1:status", 0, NULL, { 0, 0, 0 } },
	{ "help", "/diverge help", "1:help", 0, NULL, { 0, 0, 0 } },
	{ "status extra", "/diverge status now",
	    "E:`status` takes no arguments; usage: `/diverge status`", 0, NULL,
	    { 0, 0, 0 } },
	{ "pause extra", "/diverge pause please",
	    "E:usage: `/diverge pause`", 0, NULL, { 0, 0, 0 } },
	{ "help extra", "/diverge help me", "E:usage: `/diverge help`", 0,
	    NULL, { 0, 0, 0 } },
	{ "pause code arg", "/diverge pause `now`", "E:takes no arguments", 0,
	    NULL, { 0, 0, 0 } },
	{ "pause html comment", "/diverge pause <!-- because -->", "1:pause",
	    0, NULL, { 0, 0, 0 } },
	/* fix and guide */
	{ "fix required", "/diverge fix",
	    "E:`fix` needs an objective; usage: `/diverge fix <objective>`",
	    0, NULL, { 0, 0, 0 } },
	{ "fix blank", "/diverge fix   \n\nlater", "E:needs an objective", 0,
	    NULL, { 0, 0, 0 } },
	{ "fix multi-line", "/diverge fix first\nsecond\n\nafter blank",
	    "1:fix=first\nsecond", 0, NULL, { 0, 0, 0 } },
	{ "fix next line", "/diverge fix\nobjective below",
	    "1:fix=objective below", 0, NULL, { 0, 0, 0 } },
	{ "fix trimmed", "/diverge fix   spaced out \t\n", "1:fix=spaced out",
	    0, NULL, { 0, 0, 0 } },
	{ "fix indent kept", "/diverge fix a\n  - b\n      c",
	    "1:fix=a\n  - b\n      c", 0, NULL, { 0, 0, 0 } },
	{ "fix stops at command", "/diverge fix a\nb\n/diverge status",
	    "1:fix=a\nb | 3:status", 0, NULL, { 0, 0, 0 } },
	{ "fix stops at fence", "/diverge fix a\n```\ncode\n```",
	    "1:fix=a", 0, NULL, { 0, 0, 0 } },
	{ "fix stops at quote", "/diverge fix a\n> quoted\nb", "1:fix=a", 0,
	    NULL, { 0, 0, 0 } },
	{ "fix keeps code span", "/diverge fix make `foo()` fast",
	    "1:fix=make `foo()` fast", 0, NULL, { 0, 0, 0 } },
	{ "fix drops comment", "/diverge fix a <!-- hidden --> b",
	    "1:fix=a  b", 0, NULL, { 0, 0, 0 } },
	{ "fix comment swallows", "/diverge fix a <!--\n/diverge pause\n-->",
	    "1:fix=a", 0, NULL, { 0, 0, 0 } },
	{ "fix tab kept", "/diverge fix a\tb", "1:fix=a\tb", 0, NULL,
	    { 0, 0, 0 } },
	{ "fix utf-8", "/diverge fix caf\xc3\xa9 \xf0\x9f\x9a\x80",
	    "1:fix=caf\xc3\xa9 \xf0\x9f\x9a\x80", 0, NULL, { 0, 0, 0 } },
	{ "fix 4000", NULL, "1:fix=", 0, b_fix_4000, { 0, 0, 0 } },
	{ "fix 4001", NULL, "E:too long (at most 4000 bytes)", 0, b_fix_4001,
	    { 0, 0, 0 } },
	{ "fix trailing blanks", NULL, "1:fix=ok", 0, b_fix_trailing_blanks,
	    { 0, 0, 0 } },
	{ "guide", "/diverge guide use the v2 API", "1:guide=use the v2 API",
	    0, NULL, { 0, 0, 0 } },
	{ "guide required", "/diverge guide",
	    "E:`guide` needs a hint; usage: `/diverge guide <hint>`", 0, NULL,
	    { 0, 0, 0 } },
	{ "guide 2000", NULL, "1:guide=", 0, b_guide_2000, { 0, 0, 0 } },
	{ "guide 2001", NULL, "E:too long (at most 2000 bytes)", 0,
	    b_guide_2001, { 0, 0, 0 } },
	{ "control char", "/diverge fix a\x01z",
	    "E:must not contain control characters", 0, NULL, { 0, 0, 0 } },
	{ "del", "/diverge fix a\x7fz", "E:control characters", 0, NULL,
	    { 0, 0, 0 } },
	{ "c1 control", "/diverge fix a\xc2\x85z", "E:control characters", 0,
	    NULL, { 0, 0, 0 } },
	{ "nul byte", "/diverge fix a\0z", "E:control characters", 16, NULL,
	    { 0, 0, 0 } },
	{ "escape sequence", "/diverge guide \x1b[31mred",
	    "E:control characters", 0, NULL, { 0, 0, 0 } },
	{ "invalid utf-8", "/diverge fix a\xffz", "E:is not valid UTF-8", 0,
	    NULL, { 0, 0, 0 } },
	{ "overlong utf-8", "/diverge fix a\xc0\xafz", "E:not valid UTF-8", 0,
	    NULL, { 0, 0, 0 } },
	{ "surrogate", "/diverge fix a\xed\xa0\x80z", "E:not valid UTF-8", 0,
	    NULL, { 0, 0, 0 } },
	{ "truncated utf-8", "/diverge fix a\xe2\x82", "E:not valid UTF-8", 0,
	    NULL, { 0, 0, 0 } },
	{ "rlo", "/diverge fix approve \xe2\x80\xae""gnp.exe",
	    "E:bidirectional override", 0, NULL, { 0, 0, 0 } },
	{ "lre", "/diverge guide x\xe2\x80\xaay", "E:bidirectional", 0, NULL,
	    { 0, 0, 0 } },
	{ "rli isolate", "/diverge fix a\xe2\x81\xa7z\xe2\x81\xa9",
	    "E:bidirectional", 0, NULL, { 0, 0, 0 } },
	{ "rlo on line 2", "/diverge fix a\nb\xe2\x80\xae", "E:bidirectional",
	    0, NULL, { 0, 0, 0 } },
	{ "lrm kept", "/diverge fix a\xe2\x80\x8e" "b",
	    "1:fix=a\xe2\x80\x8e" "b", 0, NULL, { 0, 0, 0 } },
	{ "c1 control 0x9f", "/diverge fix a\xc2\x9fz", "E:control characters",
	    0, NULL, { 0, 0, 0 } },
	{ "nbsp is not a control", "/diverge fix a\xc2\xa0z",
	    "1:fix=a\xc2\xa0z", 0, NULL, { 0, 0, 0 } },
	{ "lri isolate alone", "/diverge fix a\xe2\x81\xa6z",
	    "E:bidirectional", 0, NULL, { 0, 0, 0 } },
	{ "pdi alone", "/diverge guide a\xe2\x81\xa9z", "E:bidirectional", 0,
	    NULL, { 0, 0, 0 } },
	{ "overlong 3-byte utf-8", "/diverge fix a\xe0\x83\xa9z",
	    "E:not valid UTF-8", 0, NULL, { 0, 0, 0 } },
	{ "overlong 4-byte utf-8", "/diverge fix a\xf0\x80\xa0\x80z",
	    "E:not valid UTF-8", 0, NULL, { 0, 0, 0 } },
	{ "above U+10FFFF", "/diverge fix a\xf4\x90\x80\x80z",
	    "E:not valid UTF-8", 0, NULL, { 0, 0, 0 } },
	/* fences */
	{ "backtick fence", "```\n/diverge pause\n```", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "tilde fence", "~~~\n/diverge pause\n~~~", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "fence info", "```sh\n/diverge pause\n```\n/diverge status",
	    "4:status", 0, NULL, { 0, 0, 0 } },
	{ "short closer", "````\n/diverge pause\n```\n/diverge fix x\n````",
	    "", 0, NULL, { 0, 0, 0 } },
	{ "other fence char", "~~~\n```\n/diverge pause\n~~~\n/diverge status",
	    "5:status", 0, NULL, { 0, 0, 0 } },
	{ "unclosed fence", "ok\n```\n/diverge pause\n\n/diverge status", "",
	    0, NULL, { 0, 0, 0 } },
	{ "closer with text", "```\n``` x\n/diverge pause\n```", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "indented fence is code", "    ```\n/diverge pause", "2:pause", 0,
	    NULL, { 0, 0, 0 } },
	{ "backtick in info", "``` a`b\n/diverge pause", "2:pause", 0, NULL,
	    { 0, 0, 0 } },
	{ "two tildes are no fence", "~~\n/diverge pause\n~~", "2:pause", 0,
	    NULL, { 0, 0, 0 } },
	{ "two backticks are no fence", "x\n\n``\n\n/diverge pause",
	    "5:pause", 0, NULL, { 0, 0, 0 } },
	{ "closer indented 4 does not close",
	    "```\n    ```\n/diverge pause\n```\n/diverge status", "5:status",
	    0, NULL, { 0, 0, 0 } },
	/* indented code */
	{ "indented comment opener", "    <!--\n/diverge pause", "2:pause", 0,
	    NULL, { 0, 0, 0 } },
	{ "indented code ends objective", "/diverge fix a\n\n    code",
	    "1:fix=a", 0, NULL, { 0, 0, 0 } },
	{ "indented lazy line", "text\n    /diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	/* inline code */
	{ "code span across lines", "see `\n/diverge pause\n` here", "", 0,
	    NULL, { 0, 0, 0 } },
	{ "double backtick span", "x ``a `\n/diverge pause\n`` y", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "long backtick span", "x `````\n/diverge pause\nz ````` y", "", 0,
	    NULL, { 0, 0, 0 } },
	{ "fence ends span", "x ````\n/diverge pause\n```` y\n/diverge help",
	    "2:pause", 0, NULL, { 0, 0, 0 } },
	{ "unmatched backtick", "a ` b\n/diverge pause", "2:pause", 0, NULL,
	    { 0, 0, 0 } },
	{ "span stops at quote", "a `b\n>\n/diverge pause\n`", "3:pause", 0,
	    NULL, { 0, 0, 0 } },
	{ "span stops at blank", "a `b\n\n/diverge pause\n`", "3:pause", 0,
	    NULL, { 0, 0, 0 } },
	{ "escaped backtick", "\\`a\n/diverge pause\n`", "2:pause", 0, NULL,
	    { 0, 0, 0 } },
	{ "code span at start", "`x`/diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	/* quotes */
	{ "quote", "> /diverge pause", "", 0, NULL, { 0, 0, 0 } },
	{ "quote indented", "   > /diverge pause", "", 0, NULL, { 0, 0, 0 } },
	{ "quote no space", ">/diverge pause", "", 0, NULL, { 0, 0, 0 } },
	{ "nested quote", "> > > /diverge pause\n> >\n/diverge status",
	    "3:status", 0, NULL, { 0, 0, 0 } },
	{ "quote with fence", "> ```\n> /diverge pause\n> ```", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "after quote and blank", "> earlier\n\n/diverge pause", "3:pause",
	    0, NULL, { 0, 0, 0 } },
	/* a line right after a quote's text continues the quote (lazily) */
	{ "lazy quote line", "> earlier\n/diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "lazy quote lines", "> someone said:\nplease run\n"
	    "/diverge budget +$1000\n\n/diverge status", "5:status", 0, NULL,
	    { 0, 0, 0 } },
	{ "lazy nested quote", "> > a\n/diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "lazy quote list item", "> - a\n/diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "lazy quote indented", "> a\n    x\n/diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "lazy quote comment", "> a\nb <!--\n\n/diverge pause\n-->", "", 0,
	    NULL, { 0, 0, 0 } },
	{ "lazy quote ends at blank", "> a\nb `x\n\n/diverge pause\n` c",
	    "4:pause", 0, NULL, { 0, 0, 0 } },
	{ "empty quote not lazy", ">\n/diverge pause", "2:pause", 0, NULL,
	    { 0, 0, 0 } },
	{ "quote fence not lazy", "> ```\n> x\n> ```\n/diverge pause",
	    "4:pause", 0, NULL, { 0, 0, 0 } },
	{ "fence ends lazy quote", "> a\n```\n/diverge pause\n```\n"
	    "/diverge status", "5:status", 0, NULL, { 0, 0, 0 } },
	/* GitLab's multi-line blockquote */
	{ "gitlab quote block", ">>>\n/diverge pause\n\n/diverge fix x\n>>>\n"
	    "/diverge status", "6:status", 0, NULL, { 0, 0, 0 } },
	{ "gitlab quote block long", ">>>>\n>>>\n/diverge pause\n>>>>",
	    "", 0, NULL, { 0, 0, 0 } },
	{ "gitlab quote block unclosed", "a\n\n  >>>  \n/diverge pause", "",
	    0, NULL, { 0, 0, 0 } },
	{ "gitlab quote block in list", "- >>>\n  /diverge pause\n  >>>\n"
	    "/diverge status", "4:status", 0, NULL, { 0, 0, 0 } },
	{ "gitlab quote block text", ">>> a\n\n/diverge pause", "3:pause", 0,
	    NULL, { 0, 0, 0 } },
	{ "two '>' are no quote block", ">>\n/diverge pause", "2:pause", 0,
	    NULL, { 0, 0, 0 } },
	/* HTML comments */
	{ "comment", "<!-- /diverge pause -->", "", 0, NULL, { 0, 0, 0 } },
	{ "multi-line comment",
	    "<!--\n/diverge pause\n-->\n/diverge status", "4:status", 0, NULL,
	    { 0, 0, 0 } },
	{ "unclosed comment", "/diverge status\n<!-- x\n/diverge pause",
	    "1:status", 0, NULL, { 0, 0, 0 } },
	{ "text after comment", "a <!-- b -->\n/diverge pause", "2:pause", 0,
	    NULL, { 0, 0, 0 } },
	{ "command after comment", "<!-- a --> /diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "comment opener in code", "`<!--`\n/diverge pause", "2:pause", 0,
	    NULL, { 0, 0, 0 } },
	{ "escaped comment opener", "\\<!--\n/diverge pause", "2:pause", 0,
	    NULL, { 0, 0, 0 } },
	{ "pr template",
	    "<!-- Use: /diverge fix <objective>\n/diverge fix example\n\n"
	    "/diverge pause\n-->\nreal text", "", 0, NULL, { 0, 0, 0 } },
	{ "comment in fence", "```\n<!--\n```\n/diverge pause", "4:pause", 0,
	    NULL, { 0, 0, 0 } },
	/* invisible characters and list items */
	{ "zero-width space", "\xe2\x80\x8b/diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "zero-width joiner", "\xe2\x80\x8d/diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "no-break space", "\xc2\xa0/diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "byte order mark", "\xef\xbb\xbf/diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "nbsp separator", "/diverge\xc2\xa0pause", "", 0, NULL,
	    { 0, 0, 0 } },
	{ "list item", "- /diverge pause", "", 0, NULL, { 0, 0, 0 } },
	{ "code in list item",
	    "- step:\n  ```\n  /diverge pause\n  ```\n/diverge status",
	    "5:status", 0, NULL, { 0, 0, 0 } },
	{ "fence on list marker", "- ```\n  /diverge pause\n  ```", "", 0,
	    NULL, { 0, 0, 0 } },
	{ "ordered list fence", "1. step\n   ~~~\n   /diverge pause\n   ~~~",
	    "", 0, NULL, { 0, 0, 0 } },
	{ "nested list fence",
	    "- a\n  - ```\n    /diverge pause\n    ```\n/diverge status",
	    "5:status", 0, NULL, { 0, 0, 0 } },
	{ "quote in list item", "- > /diverge pause", "", 0, NULL,
	    { 0, 0, 0 } },
	/* big bodies */
	{ "1 MB comment", NULL, "NONEMPTY", 0, b_1mb_prose, { 0, 0, 0 } },
	{ "1 MB objective", NULL, "E:too long", 0, b_1mb_objective,
	    { 0, 0, 0 } },
	{ "1 MB of backticks", NULL, "NONEMPTY", 0, b_1mb_ticks,
	    { 0, 0, 0 } },
	{ "1 MB unclosed comment", NULL, "", 0, b_1mb_unclosed_comment,
	    { 0, 0, 0 } },
	{ "1 MB trailing blanks", NULL, "1:status", 0,
	    b_status_trailing_blanks, { 0, 0, 0 } },
	{ "10,000 lines", NULL, "10000:pause", 0, b_10k_lines, { 0, 0, 0 } },
	{ "10,000 statuses", NULL, "1:status", 0, b_10k_status, { 0, 0, 0 } },
	{ "10,000 budgets", NULL, "E:too many commands", 0, b_10k_distinct,
	    { 0, 0, 0 } },
	{ "10,000-line objective", NULL, "E:too long", 0, b_10k_objective_cmd,
	    { 0, 0, 0 } },
	/* amounts */
	{ "usd +15", "/diverge budget +15", "1:budget $15000000 t0", 0, NULL,
	    { 0, 0, 0 } },
	{ "usd +15.00", "/diverge budget +15.00", "1:budget $15000000 t0", 0,
	    NULL, { 0, 0, 0 } },
	{ "usd +$15", "/diverge budget +$15", "1:budget $15000000 t0", 0,
	    NULL, { 0, 0, 0 } },
	{ "usd $15.5", "/diverge budget $15.5", "1:budget $15500000 t0", 0,
	    NULL, { 0, 0, 0 } },
	{ "usd 15.00usd", "/diverge budget 15.00usd", "1:budget $15000000 t0",
	    0, NULL, { 0, 0, 0 } },
	{ "usd 15USD", "/diverge budget 15USD", "1:budget $15000000 t0", 0,
	    NULL, { 0, 0, 0 } },
	{ "usd word", "/diverge budget 15 usd", "1:budget $15000000 t0", 0,
	    NULL, { 0, 0, 0 } },
	{ "usd word upper case", "/diverge budget 15 USD",
	    "1:budget $15000000 t0", 0, NULL, { 0, 0, 0 } },
	{ "unit word twice", "/diverge budget 15 usd usd",
	    "E:`usd` must follow a number", 0, NULL, { 0, 0, 0 } },
	{ "unit word after unit word", "/diverge budget 2 tokens tokens",
	    "E:`tokens` must follow a number", 0, NULL, { 0, 0, 0 } },
	{ "usd cents", "/diverge budget $0.07", "1:budget $70000 t0", 0, NULL,
	    { 0, 0, 0 } },
	{ "tokens plain", "/diverge budget 2000000", "1:budget $0 t2000000",
	    0, NULL, { 0, 0, 0 } },
	{ "tokens plus", "/diverge budget +2000000", "1:budget $0 t2000000",
	    0, NULL, { 0, 0, 0 } },
	{ "tokens 2M", "/diverge budget 2M", "1:budget $0 t2000000", 0, NULL,
	    { 0, 0, 0 } },
	{ "tokens 500k", "/diverge budget 500k", "1:budget $0 t500000", 0,
	    NULL, { 0, 0, 0 } },
	{ "tokens 500K", "/diverge budget 500K", "1:budget $0 t500000", 0,
	    NULL, { 0, 0, 0 } },
	{ "tokens 2m", "/diverge budget 2m", "1:budget $0 t2000000", 0, NULL,
	    { 0, 0, 0 } },
	{ "tokens commas", "/diverge budget 2,000,000",
	    "1:budget $0 t2000000", 0, NULL, { 0, 0, 0 } },
	{ "tokens word", "/diverge budget 2000 tokens", "1:budget $0 t2000",
	    0, NULL, { 0, 0, 0 } },
	{ "tokens 2M tokens", "/diverge budget 2M Tokens",
	    "1:budget $0 t2000000", 0, NULL, { 0, 0, 0 } },
	{ "lone 500 is usd", "/diverge budget 500", "1:budget $500000000 t0",
	    0, NULL, { 0, 0, 0 } },
	{ "lone 10000 is usd", "/diverge budget 10000",
	    "E:a bump is at most $1000.00 per command", 0, NULL,
	    { 0, 0, 0 } },
	{ "lone 10001 is tokens", "/diverge budget 10001",
	    "1:budget $0 t10001", 0, NULL, { 0, 0, 0 } },
	{ "usd and tokens", "/diverge budget +$15 2000000",
	    "1:budget $15000000 t2000000", 0, NULL, { 0, 0, 0 } },
	{ "two bare", "/diverge budget 15 20", "1:budget $15000000 t20", 0,
	    NULL, { 0, 0, 0 } },
	{ "bare then M", "/diverge budget 15 2M", "1:budget $15000000 t2000000",
	    0, NULL, { 0, 0, 0 } },
	{ "tokens then usd", "/diverge budget 2000000 $5",
	    "1:budget $5000000 t2000000", 0, NULL, { 0, 0, 0 } },
	{ "M then bare", "/diverge budget 2M 15", "E:two token amounts", 0,
	    NULL, { 0, 0, 0 } },
	{ "two usd", "/diverge budget $5 $6", "E:two USD amounts", 0, NULL,
	    { 0, 0, 0 } },
	{ "three amounts", "/diverge budget 1 2 3",
	    "E:at most one USD and one token amount", 0, NULL, { 0, 0, 0 } },
	{ "negative", "/diverge budget -5",
	    "E:a negative amount is not allowed; usage: "
	    "`/diverge budget [+$usd] [tokens]`", 0, NULL, { 0, 0, 0 } },
	{ "negative dollar", "/diverge resume $-5", "E:negative", 0, NULL,
	    { 0, 0, 0 } },
	{ "three decimals", "/diverge budget $1.234", "E:at most 2 decimals",
	    0, NULL, { 0, 0, 0 } },
	{ "zero usd", "/diverge budget $0.00", "E:more than zero", 0, NULL,
	    { 0, 0, 0 } },
	{ "zero tokens", "/diverge budget 0 tokens", "E:more than zero", 0,
	    NULL, { 0, 0, 0 } },
	{ "usd over cap", "/diverge budget $1000.01", "E:at most $1000.00", 0,
	    NULL, { 0, 0, 0 } },
	{ "tokens over cap", "/diverge budget 100000001 tokens",
	    "E:at most 100000000 tokens", 0, NULL, { 0, 0, 0 } },
	{ "usd at cap", "/diverge budget $1000", "1:budget $1000000000 t0", 0,
	    NULL, { 0, 0, 0 } },
	{ "tokens at cap", "/diverge budget 100M", "1:budget $0 t100000000",
	    0, NULL, { 0, 0, 0 } },
	{ "overflow", "/diverge budget 99999999999999999999999",
	    "E:too large", 0, NULL, { 0, 0, 0 } },
	{ "overflow usd", "/diverge budget $9223372036854775807",
	    "E:too large", 0, NULL, { 0, 0, 0 } },
	{ "overflow k", "/diverge budget 9000000000000000000k", "E:too large",
	    0, NULL, { 0, 0, 0 } },
	{ "budget needs amount", "/diverge budget",
	    "E:`budget` needs an amount; usage: "
	    "`/diverge budget [+$usd] [tokens]`", 0, NULL, { 0, 0, 0 } },
	{ "not an amount", "/diverge budget lots",
	    "E:`lots` is not an amount", 0, NULL, { 0, 0, 0 } },
	{ "bad grouping", "/diverge budget 1,00", "E:is not an amount", 0,
	    NULL, { 0, 0, 0 } },
	{ "four-digit group", "/diverge budget 1000,000",
	    "E:`1000,000` is not an amount", 0, NULL, { 0, 0, 0 } },
	{ "trailing text", "/diverge budget 15abc",
	    "E:`15abc` is not an amount", 0, NULL, { 0, 0, 0 } },
	{ "amount args 256 bytes", NULL, "1:budget $1000000 t2000000", 0,
	    b_budget_args_256, { 0, 0, 0 } },
	{ "amount args 257 bytes", NULL, "E:too many arguments; usage: "
	    "`/diverge budget [+$usd] [tokens]`", 0, b_budget_args_257,
	    { 0, 0, 0 } },
	{ "bare unit word", "/diverge budget tokens",
	    "E:`tokens` must follow a number", 0, NULL, { 0, 0, 0 } },
	{ "decimal with M", "/diverge budget 1.5M", "E:not both", 0, NULL,
	    { 0, 0, 0 } },
	{ "dollar with k", "/diverge budget $2k", "E:not both", 0, NULL,
	    { 0, 0, 0 } },
	{ "dollar tokens", "/diverge budget $5 tokens", "E:not both", 0, NULL,
	    { 0, 0, 0 } },
	{ "resume bump", "/diverge resume +$15 2M",
	    "1:resume $15000000 t2000000", 0, NULL, { 0, 0, 0 } },
	{ "resume no bump", "/diverge resume", "1:resume", 0, NULL,
	    { 0, 0, 0 } },
	{ "raised caps", "/diverge budget $2000 150M",
	    "1:budget $2000000000 t150000000", 0, NULL,
	    { 0, INT64_C(5000) * 1000000, INT64_C(200000000) } },
	{ "lowered caps", "/diverge budget $20", "E:at most $10.00", 0, NULL,
	    { 0, INT64_C(10) * 1000000, 0 } },
	/* per-comment rules */
	{ "five commands",
	    "/diverge status\n/diverge help\n/diverge guide a\n"
	    "/diverge budget +1\n/diverge budget +2",
	    "1:status | 2:help | 3:guide=a | 4:budget $1000000 t0 | "
	    "5:budget $2000000 t0", 0, NULL, { 0, 0, 0 } },
	{ "six commands",
	    "/diverge status\n/diverge help\n/diverge guide a\n"
	    "/diverge budget +1\n/diverge budget +2\n/diverge budget +3",
	    "E:too many commands: at most 5 per comment", 0, NULL,
	    { 0, 0, 0 } },
	{ "max commands 2", "/diverge status\n/diverge help\n/diverge pause",
	    "E:at most 2 per comment", 0, NULL, { 2, 0, 0 } },
	{ "duplicates collapse",
	    "/diverge status\n/diverge STATUS\n/diverge status\n"
	    "/diverge status\n/diverge status\n/diverge status\n"
	    "/diverge status", "1:status", 0, NULL, { 0, 0, 0 } },
	{ "duplicate fix", "/diverge fix a\n\n/diverge fix a", "1:fix=a", 0,
	    NULL, { 0, 0, 0 } },
	/* the configuration's 0 (a negative limit) turns a kind off */
	{ "usd raises off", "/diverge budget $5",
	    "E:USD budget raises are turned off here", 0, NULL, { 0, -1, 0 } },
	{ "usd raises off, tokens on", "/diverge budget 2M",
	    "1:budget $0 t2000000", 0, NULL, { 0, -1, 0 } },
	{ "token raises off", "/diverge resume 2M",
	    "E:token budget raises are turned off here", 0, NULL,
	    { 0, 0, -1 } },
	{ "token raises off, resume alone", "/diverge resume", "1:resume", 0,
	    NULL, { 0, 0, -1 } },
	{ "different token budgets", "/diverge budget 5M\n/diverge budget 6M",
	    "1:budget $0 t5000000 | 2:budget $0 t6000000", 0, NULL,
	    { 0, 0, 0 } },
	{ "fix with pause", "/diverge fix a\n\n/diverge pause",
	    "E:`fix` and `pause` cannot be in the same comment", 0, NULL,
	    { 0, 0, 0 } },
	{ "pause with resume", "/diverge pause\n/diverge resume +$5",
	    "E:`pause` and `resume` cannot be in the same comment", 0, NULL,
	    { 0, 0, 0 } },
	{ "two objectives", "/diverge fix a\n\n/diverge fix b",
	    "E:one `fix` objective per comment", 0, NULL, { 0, 0, 0 } },
	{ "two hints", "/diverge guide a\n/diverge guide b",
	    "E:one `guide` hint per comment", 0, NULL, { 0, 0, 0 } },
	{ "fix and status", "/diverge fix a\n\n/diverge status",
	    "1:fix=a | 3:status", 0, NULL, { 0, 0, 0 } },
	{ "error names line", "/diverge status\n/diverge budget -5",
	    "E:line 2: budget bumps only add", 0, NULL, { 0, 0, 0 } },
	{ "first error wins", "/diverge pause x\n/diverge budget -5",
	    "E:line 1: `pause` takes no arguments", 0, NULL, { 0, 0, 0 } },
	{ "help does not run with error", "/diverge help\n/diverge\n",
	    "H:line 2: `/diverge` needs a command", 0, NULL, { 0, 0, 0 } },
};

/* ---- running a case ---- */

static char *
render(const struct cmd_result *r)
{
	struct buf b;
	size_t i;

	buf_init(&b, 64u << 20);
	if (r->error != NULL) {
		buf_printf(&b, "%s:%s", r->help ? "H" : "E", r->error);
		return buf_detach(&b, NULL);
	}
	for (i = 0; i < r->ncmds; i++) {
		const struct cmd *c = &r->cmds[i];

		buf_printf(&b, "%s%u:%s", i ? " | " : "", c->line,
		    commands_kind_name(c->kind));
		if (c->text != NULL)
			buf_printf(&b, "=%s", c->text);
		if (c->kind == CMD_BUDGET || (c->kind == CMD_RESUME &&
		    (c->usd_micro || c->tokens)))
			buf_printf(&b, " $%lld t%lld", (long long)c->usd_micro,
			    (long long)c->tokens);
	}
	if (b.data == NULL)
		return xstrdup("");
	return buf_detach(&b, NULL);
}

static void
run_case(void **state)
{
	const struct tcase *t = *state;
	struct cmd_result r;
	const struct cmd_limits *lim = NULL;
	size_t len;
	char *body, *got;

	if (t->build != NULL)
		body = t->build(&len);
	else {
		len = t->blen ? t->blen : strlen(t->body);
		body = xmalloc(len + 1);
		memcpy(body, t->body, len + 1);
	}
	if (t->lim.max_commands || t->lim.max_bump_usd_micro ||
	    t->lim.max_bump_tokens)
		lim = &t->lim;
	assert_int_equal(commands_parse(body, len, lim, &r), 0);
	got = render(&r);
	if (strncmp(t->expect, "E:", 2) == 0 ||
	    strncmp(t->expect, "H:", 2) == 0) {
		if (strncmp(got, t->expect, 2) != 0 ||
		    strstr(got + 2, t->expect + 2) == NULL)
			fail_msg("'%s': expected %s, got %s", t->name,
			    t->expect, got);
	} else if (strcmp(t->expect, "NONEMPTY") == 0) {
		if (r.error != NULL || r.ncmds != 1)
			fail_msg("'%s': expected one command, got %s", t->name,
			    got);
	} else if (strcmp(t->expect, "1:fix=") == 0 ||
	    strcmp(t->expect, "1:guide=") == 0) {
		/* the built objective: compare the prefix and the length */
		if (strncmp(got, t->expect, strlen(t->expect)) != 0 ||
		    r.ncmds != 1 || strlen(r.cmds[0].text) !=
		    (r.cmds[0].kind == CMD_FIX ? COMMANDS_MAX_OBJECTIVE :
		    COMMANDS_MAX_HINT))
			fail_msg("'%s': expected a full-length text, got %.60s",
			    t->name, got);
	} else if (strcmp(got, t->expect) != 0) {
		fail_msg("'%s': expected [%s], got [%s]", t->name, t->expect,
		    got);
	}
	free(got);
	commands_result_release(&r);
	free(body);
}

/* ---- properties ---- */

/* Our own help reply must never parse as a command. */
static void
help_is_inert(void **state)
{
	char *md = commands_help_markdown();
	struct cmd_result r;
	size_t i;

	(void)state;
	assert_non_null(strstr(md, "| `/diverge fix` | `<objective>` | "
	    "write access |"));
	assert_non_null(strstr(md, "`/diverge budget` | `[+$usd] [tokens]` | "
	    "maintainer |"));
	assert_non_null(strstr(md, "write access (maintainer with a bump)"));
	assert_non_null(strstr(md, "`/diverge status` | | anyone |"));
	assert_non_null(strstr(md, "USD up to `10000` and tokens above"));
	for (i = 0; i < CMD_KIND_COUNT; i++) {
		char *row = xasprintf("| `/diverge %s` |",
		    commands_kind_name((enum cmd_kind)i));

		assert_non_null(strstr(md, row));
		free(row);
	}
	assert_int_equal(commands_parse(md, strlen(md), NULL, &r), 0);
	assert_null(r.error);
	assert_int_equal(r.ncmds, 0);
	commands_result_release(&r);
	free(md);
}

static void
names_and_roles(void **state)
{
	struct cmd c;

	(void)state;
	memset(&c, 0, sizeof(c));
	assert_string_equal(commands_kind_name(CMD_FIX), "fix");
	assert_string_equal(commands_kind_name(CMD_RESUME), "resume");
	assert_string_equal(commands_kind_name((enum cmd_kind)99), "unknown");
	c.kind = CMD_FIX;
	assert_int_equal(commands_required_role(&c), CMD_ROLE_WRITE);
	c.kind = CMD_GUIDE;
	assert_int_equal(commands_required_role(&c), CMD_ROLE_WRITE);
	c.kind = CMD_PAUSE;
	assert_int_equal(commands_required_role(&c), CMD_ROLE_WRITE);
	c.kind = CMD_BUDGET;
	assert_int_equal(commands_required_role(&c), CMD_ROLE_MAINTAIN);
	c.kind = CMD_RESUME;
	assert_int_equal(commands_required_role(&c), CMD_ROLE_WRITE);
	c.tokens = 5;
	assert_int_equal(commands_required_role(&c), CMD_ROLE_MAINTAIN);
	c.kind = CMD_STATUS;
	assert_int_equal(commands_required_role(&c), CMD_ROLE_ANYONE);
	c.kind = CMD_HELP;
	assert_int_equal(commands_required_role(&c), CMD_ROLE_ANYONE);
	/* a kind the table does not know needs the most, not the least */
	c.kind = CMD_KIND_COUNT;
	assert_int_equal(commands_required_role(&c), CMD_ROLE_MAINTAIN);
	assert_string_equal(commands_role_name(CMD_ROLE_MAINTAIN), "maintain");
}

/* line and source are those of the original body. */
static void
line_and_source(void **state)
{
	static const char body[] = "intro\r\n```\r\n/diverge pause\r\n```\r\n"
	    "  /diverge FIX the `thing`  \r\nsecond line\r\n";
	struct cmd_result r;
	char *big;
	size_t n;

	(void)state;
	assert_int_equal(commands_parse(body, strlen(body), NULL, &r), 0);
	assert_null(r.error);
	assert_int_equal(r.ncmds, 1);
	assert_int_equal(r.cmds[0].line, 5);
	assert_string_equal(r.cmds[0].source, "  /diverge FIX the `thing`  ");
	assert_string_equal(r.cmds[0].text, "the `thing`\nsecond line");
	commands_result_release(&r);

	/*
	 * The source is cut on a UTF-8 boundary: 301 bytes of command and
	 * blanks, 1300 three-byte characters, then blanks; byte 4200 is
	 * inside the last character, so the cut is at 301 + 3 * 1299.
	 */
	big = xmalloc(20000);
	memcpy(big, "/diverge fix ", 13);
	memset(big + 13, ' ', 288);
	for (n = 301; n < 301 + 3 * 1300; n += 3)
		memcpy(big + n, "\xe2\x82\xac", 3);
	memset(big + n, ' ', 6000);
	n += 6000;
	assert_int_equal(commands_parse(big, n, NULL, &r), 0);
	assert_null(r.error);
	assert_int_equal(r.ncmds, 1);
	assert_int_equal(strlen(r.cmds[0].text), 3 * 1300);
	assert_int_equal(strlen(r.cmds[0].source), 301 + 3 * 1299);
	commands_result_release(&r);
	free(big);
}

static void
bad_input(void **state)
{
	struct cmd_result r;
	char *cause = NULL;
	char *big;

	(void)state;
	assert_int_equal(commands_init(&cause), 0);
	assert_int_equal(commands_init(NULL), 0);
	assert_null(cause);
	assert_int_equal(commands_parse(NULL, 0, NULL, &r), 0);
	assert_int_equal(r.ncmds, 0);
	assert_null(r.error);
	commands_result_release(&r);
	assert_int_equal(commands_parse(NULL, 5, NULL, &r), -1);
	assert_null(r.error);
	big = xcalloc(COMMANDS_MAX_BODY + 1, 1);
	assert_int_equal(commands_parse(big, COMMANDS_MAX_BODY + 1, NULL, &r),
	    -1);
	commands_result_release(&r);
	commands_result_release(&r);	/* released twice is fine */
	free(big);
}

/* A 1 MB body parses in linear time: far below a second. */
static void
big_is_fast(void **state)
{
	struct cmd_result r;
	struct timespec a, b;
	size_t len;
	char *body = b_1mb_ticks(&len);
	double ms;

	(void)state;
	clock_gettime(CLOCK_MONOTONIC, &a);
	assert_int_equal(commands_parse(body, len, NULL, &r), 0);
	clock_gettime(CLOCK_MONOTONIC, &b);
	ms = (double)(b.tv_sec - a.tv_sec) * 1e3 +
	    (double)(b.tv_nsec - a.tv_nsec) / 1e6;
	assert_true(ms < 2000.0);
	assert_int_equal(r.ncmds, 1);
	commands_result_release(&r);
	free(body);
}

/* Threads share the compiled patterns and get the same answers. */
static void *
thread_main(void *arg)
{
	size_t i, k, len, *bad = arg;
	struct cmd_result r;
	char *got;

	for (k = 0; k < 20; k++)
		for (i = 0; i < ARRAY_SIZE(cases); i++) {
			const struct tcase *t = &cases[i];

			if (t->build != NULL || t->blen != 0 ||
			    t->lim.max_commands || t->lim.max_bump_tokens ||
			    t->lim.max_bump_usd_micro)
				continue;
			len = strlen(t->body);
			if (commands_parse(t->body, len, NULL, &r) != 0) {
				(*bad)++;
				continue;
			}
			got = render(&r);
			if (t->expect[0] != 'E' && t->expect[0] != 'H' &&
			    strcmp(got, t->expect) != 0)
				(*bad)++;
			free(got);
			commands_result_release(&r);
		}
	return NULL;
}

static void
threads(void **state)
{
	pthread_t th[4];
	size_t bad[4] = { 0 }, i;

	(void)state;
	for (i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&th[i], NULL, thread_main,
		    &bad[i]), 0);
	for (i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		assert_int_equal(bad[i], 0);
	}
}

/* Parse body; the result must be an error that is exactly msg. */
static void
expect_error(const char *body, const char *msg, int help)
{
	struct cmd_result r;

	assert_int_equal(commands_parse(body, strlen(body), NULL, &r), 0);
	assert_int_equal(r.ncmds, 0);
	assert_non_null(r.error);
	assert_string_equal(r.error, msg);
	assert_int_equal(r.help, help);
	commands_result_release(&r);
}

/*
 * Whole error messages: no "line N: " prefix with a single command line,
 * and an unknown word is echoed in a code span only when it is short and
 * cannot break out of that span.
 */
static void
exact_errors(void **state)
{
	(void)state;
	expect_error("/diverge pause x",
	    "`pause` takes no arguments; usage: `/diverge pause`", 0);
	expect_error("text\n/diverge budget -5\nmore",
	    "budget bumps only add: a negative amount is not allowed; usage: "
	    "`/diverge budget [+$usd] [tokens]`", 0);
	expect_error("/diverge status\n/diverge pause x",
	    "line 2: `pause` takes no arguments; usage: `/diverge pause`", 0);
	/* 32 bytes are echoed, 33 are not */
	expect_error("/diverge abcdefghijklmnopqrstuvwxyz012345",
	    "unknown command `abcdefghijklmnopqrstuvwxyz012345`", 1);
	expect_error("/diverge abcdefghijklmnopqrstuvwxyz0123456",
	    "unknown command", 1);
	/* a backtick would close the code span of the reply */
	expect_error("/diverge fo`o", "unknown command", 1);
	expect_error("/diverge budget 1`0", "cannot read the amount; usage: "
	    "`/diverge budget [+$usd] [tokens]`", 0);
}

/* resume with any bump, USD or tokens, needs a maintainer. */
static void
resume_bump_role(void **state)
{
	static const char *const bodies[] = {
		"/diverge resume +$5", "/diverge resume 2M",
		"/diverge resume $1 2M",
	};
	struct cmd_result r;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(bodies); i++) {
		assert_int_equal(commands_parse(bodies[i], strlen(bodies[i]),
		    NULL, &r), 0);
		assert_null(r.error);
		assert_int_equal(r.ncmds, 1);
		assert_int_equal(r.cmds[0].kind, CMD_RESUME);
		assert_int_equal(commands_required_role(&r.cmds[0]),
		    CMD_ROLE_MAINTAIN);
		commands_result_release(&r);
	}
	assert_int_equal(commands_parse("/diverge resume", 15, NULL, &r), 0);
	assert_int_equal(r.ncmds, 1);
	assert_int_equal(commands_required_role(&r.cmds[0]), CMD_ROLE_WRITE);
	commands_result_release(&r);
}

/* A body of exactly COMMANDS_MAX_BODY bytes is parsed, one more is not. */
static void
max_body(void **state)
{
	struct cmd_result r;
	char *big;

	(void)state;
	big = xmalloc(COMMANDS_MAX_BODY + 1);
	memset(big, ' ', COMMANDS_MAX_BODY + 1);
	memcpy(big, "/diverge status", 15);
	assert_int_equal(commands_parse(big, COMMANDS_MAX_BODY, NULL, &r), 0);
	assert_null(r.error);
	assert_int_equal(r.ncmds, 1);
	assert_int_equal(r.cmds[0].kind, CMD_STATUS);
	commands_result_release(&r);
	assert_int_equal(commands_parse(big, COMMANDS_MAX_BODY + 1, NULL, &r),
	    -1);
	commands_result_release(&r);
	free(big);
}

static void
table_size(void **state)
{
	(void)state;
	assert_true(ARRAY_SIZE(cases) >= 80);
}

int
main(void)
{
	static const struct CMUnitTest props[] = {
		cmocka_unit_test(table_size),
		cmocka_unit_test(help_is_inert),
		cmocka_unit_test(names_and_roles),
		cmocka_unit_test(line_and_source),
		cmocka_unit_test(bad_input),
		cmocka_unit_test(big_is_fast),
		cmocka_unit_test(exact_errors),
		cmocka_unit_test(resume_bump_role),
		cmocka_unit_test(max_body),
		cmocka_unit_test(threads),
	};
	struct CMUnitTest *tests;
	size_t n = ARRAY_SIZE(cases) + ARRAY_SIZE(props), i;
	int rc;

	tests = xcalloc(n, sizeof(*tests));
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		tests[i].name = cases[i].name;
		tests[i].test_func = run_case;
		tests[i].initial_state = (void *)&cases[i];
	}
	for (i = 0; i < ARRAY_SIZE(props); i++)
		tests[ARRAY_SIZE(cases) + i] = props[i];
	rc = _cmocka_run_group_tests("commands", tests, n, NULL, NULL);
	free(tests);
	return rc;
}

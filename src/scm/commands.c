/*
 * The /diverge slash-command grammar (DESIGN.md section 8).
 *
 * A parse goes through four steps, each linear in the size of the body:
 *
 *  1. normalize: CRLF and lone CR become LF (one line break each, so line
 *     numbers stay those the commenter sees);
 *  2. strip: a single pass over the lines, in the spirit of CommonMark,
 *     marks every byte that belongs to a fenced or indented code block, a
 *     blockquote line, an HTML comment or an inline code span. Nothing is
 *     deleted: a mask says what was stripped, so offsets and line numbers
 *     are those of the normalized body;
 *  3. match: a PCRE2 pattern, anchored at line starts, runs over a "view"
 *     of the body in which every stripped byte is replaced by a byte that
 *     cannot start or continue a command;
 *  4. interpret each /diverge line: subcommand, arguments (multi-line
 *     objectives, USD and token amounts), then the per-comment rules
 *     (duplicates, maximum count, conflicts).
 *
 * Arguments are read from the body with the block-level strips removed
 * but inline code spans kept: "/diverge fix make `frob()` faster" keeps
 * its code span in the objective, while an HTML comment on a command line
 * is not part of its arguments.
 */
#include "config.h"

#define PCRE2_CODE_UNIT_WIDTH 8

#include <pcre2.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "scm/commands.h"
#include "util/util.h"

/* What the mask says about a byte of the normalized body. */
#define M_KEEP 0	/* ordinary text */
#define M_BLOCK 1	/* code block, quote line, HTML comment: gone */
#define M_CODE 2	/* inline code: hidden from matching, kept in text */

/* The byte that replaces a stripped byte in the view (never whitespace). */
#define VIEW_HIDDEN '\x1a'

/* A lone bare amount up to this many dollars is USD, above it tokens. */
#define BARE_USD_MAX 10000

/* Longest subcommand word echoed back in an "unknown command" error. */
#define MAX_ECHO 32

/* Budget/resume arguments longer than this are refused unread. */
#define MAX_AMOUNT_ARGS 256

#define NONE ((size_t)-1)

enum cmd_args {
	ARGS_NONE = 0,		/* pause, status, help */
	ARGS_TEXT,		/* fix, guide: required text */
	ARGS_AMOUNTS,		/* resume: optional bumps */
	ARGS_AMOUNTS_REQUIRED,	/* budget: at least one bump */
};

/*
 * The one table of commands: the parser, the usage in error messages,
 * the default roles and the help text all come from it.
 */
static const struct cmd_entry {
	const char *name;
	enum cmd_kind kind;
	enum cmd_args args;
	const char *usage_args;	/* "" when none */
	enum cmd_role role;
	const char *who;	/* the role as the help table says it */
	const char *what;	/* one line, no '|', no command outside `` */
	size_t text_max;	/* ARGS_TEXT: most bytes after trimming */
} cmd_table[CMD_KIND_COUNT] = {
	{ "fix", CMD_FIX, ARGS_TEXT, "<objective>", CMD_ROLE_WRITE,
	    "write access",
	    "create or update this pull request's agent task with the "
	    "objective (the rest of the line and the non-blank lines "
	    "below it), re-run it if finished", COMMANDS_MAX_OBJECTIVE },
	{ "guide", CMD_GUIDE, ARGS_TEXT, "<hint>", CMD_ROLE_WRITE,
	    "write access",
	    "send a hint to the running agent, delivered on its next "
	    "meter heartbeat", COMMANDS_MAX_HINT },
	{ "budget", CMD_BUDGET, ARGS_AMOUNTS_REQUIRED, "[+$usd] [tokens]",
	    CMD_ROLE_MAINTAIN, "maintainer",
	    "add to the task's USD and/or token budget; pausing is "
	    "unchanged", 0 },
	{ "pause", CMD_PAUSE, ARGS_NONE, "", CMD_ROLE_WRITE, "write access",
	    "suspend the task: its token is revoked and its preview "
	    "hibernated", 0 },
	{ "resume", CMD_RESUME, ARGS_AMOUNTS, "[+$usd] [tokens]",
	    CMD_ROLE_WRITE, "write access (maintainer with a bump)",
	    "optionally add to the budget, then resume the paused task", 0 },
	{ "status", CMD_STATUS, ARGS_NONE, "", CMD_ROLE_ANYONE, "anyone",
	    "reply with a summary of this pull request's tasks and "
	    "previews", 0 },
	{ "help", CMD_HELP, ARGS_NONE, "", CMD_ROLE_ANYONE, "anyone",
	    "reply with this table", 0 },
};

/*
 * The patterns. A command line: at most 3 spaces, "/diverge" in any case
 * followed by a blank or the end of the line, then the subcommand word.
 * An amount: optional '+', optional '$', digits (grouped by commas or
 * not), optional decimals, optional suffix usd, k or m.
 */
static const char re_line_src[] =
    "^ {0,3}/diverge(?=[ \\t]|$)[ \\t]*([^ \\t\\n]*)";
static const char re_amount_src[] =
    "^(\\+?)(\\$?)([0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)"
    "(?:\\.([0-9]+))?(usd|k|m)?$";

static pthread_once_t re_once = PTHREAD_ONCE_INIT;
static pcre2_code *re_line;
static pcre2_code *re_amount;
static char *re_cause;

/* ------------------------------------------------------------ patterns */

static pcre2_code *
re_compile(const char *src, uint32_t flags)
{
	pcre2_compile_context *cc;
	pcre2_code *re;
	PCRE2_UCHAR msg[256];
	PCRE2_SIZE eoff;
	int err;

	cc = pcre2_compile_context_create(NULL);
	if (cc != NULL)
		pcre2_set_newline(cc, PCRE2_NEWLINE_LF);
	re = pcre2_compile((PCRE2_SPTR)src, PCRE2_ZERO_TERMINATED, flags,
	    &err, &eoff, cc);
	pcre2_compile_context_free(cc);
	if (re == NULL) {
		pcre2_get_error_message(err, msg, sizeof(msg));
		re_cause = xasprintf("commands: pattern '%s': %s at offset %zu",
		    src, (const char *)msg, (size_t)eoff);
		return NULL;
	}
	/* Without JIT support pcre2_match() interprets: slower, same result. */
	(void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
	return re;
}

static void
re_init_once(void)
{
	re_line = re_compile(re_line_src, PCRE2_CASELESS | PCRE2_MULTILINE);
	if (re_line == NULL)
		return;
	re_amount = re_compile(re_amount_src, PCRE2_CASELESS);
}

/* Compile the patterns once for the process. */
int
commands_init(char **cause)
{
	pthread_once(&re_once, re_init_once);
	if (re_line != NULL && re_amount != NULL)
		return 0;
	if (cause != NULL)
		*cause = xstrdup(re_cause != NULL ? re_cause :
		    "commands: cannot compile patterns");
	return -1;
}

/* ------------------------------------------------------------ helpers */

static int
is_blank(char c)
{
	return c == ' ' || c == '\t';
}

static int
is_digit(char c)
{
	return c >= '0' && c <= '9';
}

static int
is_ascii_punct(char c)
{
	return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') ||
	    (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}

/* Offset of the '\n' ending the line that holds i, or n. */
static size_t
line_end(const char *s, size_t n, size_t i)
{
	const char *p;

	if (i >= n)
		return n;
	p = memchr(s + i, '\n', n - i);
	return p != NULL ? (size_t)(p - s) : n;
}

/* Offset of the first "-->" at or after i, or NONE. */
static size_t
find_comment_end(const char *s, size_t n, size_t i)
{
	const char *p;

	while (i + 3 <= n) {
		p = memchr(s + i, '-', n - i);
		if (p == NULL)
			return NONE;
		i = (size_t)(p - s);
		if (i + 3 > n)
			return NONE;
		if (s[i + 1] == '-' && s[i + 2] == '>')
			return i;
		i++;
	}
	return NONE;
}

/* ------------------------------------------------------------ strip */

/* A maximal run of backticks. */
struct tick_run {
	uint32_t len;
	uint32_t pos;
};

struct strip {
	const char *s;		/* normalized body */
	size_t n;
	unsigned char *mask;	/* M_* per byte */
	char *view;		/* s with the stripped bytes hidden */
	struct tick_run *runs;	/* sorted by (len, pos) */
	size_t nruns;
	size_t brk;		/* cached result of para_end() */
};

static int
run_cmp(const void *a, const void *b)
{
	const struct tick_run *x = a, *y = b;

	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	if (x->pos != y->pos)
		return x->pos < y->pos ? -1 : 1;
	return 0;
}

/*
 * Index every backtick run, so that finding the closer of a code span is
 * a binary search instead of a scan (a scan per unmatched opener would be
 * quadratic on hostile input).
 */
static void
runs_index(struct strip *st)
{
	size_t i = 0, cap = 0, len;

	st->runs = NULL;
	st->nruns = 0;
	while (i < st->n) {
		const char *p = memchr(st->s + i, '`', st->n - i);

		if (p == NULL)
			break;
		i = (size_t)(p - st->s);
		len = 0;
		while (i + len < st->n && st->s[i + len] == '`')
			len++;
		if (st->nruns == cap) {
			cap = cap ? cap * 2 : 64;
			st->runs = xrealloc(st->runs, cap * sizeof(*st->runs));
		}
		st->runs[st->nruns].len = (uint32_t)len;
		st->runs[st->nruns].pos = (uint32_t)i;
		st->nruns++;
		i += len;
	}
	if (st->nruns > 1)
		qsort(st->runs, st->nruns, sizeof(*st->runs), run_cmp);
}

/* Start of the first run of exactly len backticks at or after from. */
static size_t
runs_find(const struct strip *st, size_t len, size_t from)
{
	size_t lo = 0, hi = st->nruns, mid;

	while (lo < hi) {
		mid = lo + (hi - lo) / 2;
		if (st->runs[mid].len < len ||
		    (st->runs[mid].len == len && st->runs[mid].pos < from))
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < st->nruns && st->runs[lo].len == len)
		return st->runs[lo].pos;
	return NONE;
}

/*
 * Does the line starting at ls end a paragraph: blank, or opening a fence
 * or a quote? A code span cannot reach past such a line.
 */
static int
is_break_line(const char *s, size_t ls, size_t le)
{
	size_t p, col = 0;

	for (p = ls; p < le && is_blank(s[p]); p++)
		col = s[p] == '\t' ? (col + 4) & ~(size_t)3 : col + 1;
	if (p == le)
		return 1;
	if (col > 3)
		return 0;
	if (s[p] == '>')
		return 1;
	return le - p >= 3 && (memcmp(s + p, "```", 3) == 0 ||
	    memcmp(s + p, "~~~", 3) == 0);
}

/*
 * Offset of the start of the first paragraph-breaking line after the line
 * ending at le, or n. The answer is cached: calls come with growing le,
 * so all the calls of a parse scan the body once.
 */
static size_t
para_end(struct strip *st, size_t le)
{
	size_t ls, e;

	if (st->brk != NONE && st->brk > le)
		return st->brk;
	ls = le + 1;
	while (ls < st->n) {
		e = line_end(st->s, st->n, ls);
		if (is_break_line(st->s, ls, e))
			break;
		ls = e + 1;
	}
	st->brk = ls < st->n ? ls : st->n;
	return st->brk;
}

/* Mark [from, to) as m and hide it in the view, line breaks excepted. */
static void
mask_set(struct strip *st, size_t from, size_t to, unsigned char m)
{
	const char *nl;

	if (to > st->n)
		to = st->n;
	if (from >= to)
		return;
	memset(st->mask + from, m, to - from);
	memset(st->view + from, VIEW_HIDDEN, to - from);
	while ((nl = memchr(st->s + from, '\n', to - from)) != NULL) {
		from = (size_t)(nl - st->s);
		st->view[from++] = '\n';
	}
}

/*
 * Length of a list marker at p ("-", "*", "+", "1." or "1)" and the blanks
 * after it), 0 when there is none.
 */
static size_t
list_marker(const char *s, size_t p, size_t le)
{
	size_t q = p, d = 0;

	if (q < le && (s[q] == '-' || s[q] == '*' || s[q] == '+')) {
		q++;
	} else {
		while (q < le && is_digit(s[q]) && d < 9) {
			q++;
			d++;
		}
		if (d == 0 || q >= le || (s[q] != '.' && s[q] != ')'))
			return 0;
		q++;
	}
	if (q < le && !is_blank(s[q]))
		return 0;
	while (q < le && is_blank(s[q]))
		q++;
	return q - p;
}

/*
 * If a fence opens at p, return its length and set *fc to its character.
 * A backtick fence's info string may not hold a backtick (CommonMark).
 */
static size_t
fence_open(const char *s, size_t p, size_t le, char *fc)
{
	size_t r = 0;
	char c;

	if (p >= le || (s[p] != '`' && s[p] != '~'))
		return 0;
	c = s[p];
	while (p + r < le && s[p + r] == c)
		r++;
	if (r < 3)
		return 0;
	if (c == '`' && memchr(s + p + r, '`', le - p - r) != NULL)
		return 0;
	*fc = c;
	return r;
}

/*
 * If GitLab's multi-line blockquote opens at p (">>>" or more '>', then
 * only blanks), return the number of '>'.
 */
static size_t
quote_fence_open(const char *s, size_t p, size_t le)
{
	size_t r = 0;

	while (p + r < le && s[p + r] == '>')
		r++;
	if (r < 3)
		return 0;
	for (p += r; p < le; p++)
		if (!is_blank(s[p]))
			return 0;
	return r;
}

/*
 * Does the quote line whose first '>' is at q leave a paragraph open? Its
 * text (after the nested '>' and list markers) is neither blank nor a
 * fence. The next lines then continue that paragraph "lazily" (CommonMark)
 * and are shown inside the quote, '>' or not. Other blocks (a heading, a
 * rule, HTML) count as paragraphs: stripping too much is the safe side.
 */
static int
quote_para(const char *s, size_t q, size_t le)
{
	size_t m;
	char fc;

	for (;;) {
		while (q < le && is_blank(s[q]))
			q++;
		if (q < le && s[q] == '>') {
			q++;
			continue;
		}
		m = list_marker(s, q, le);
		if (m == 0)
			break;
		q += m;
	}
	return q < le && fence_open(s, q, le, &fc) == 0;
}

/* Does the line [ls, le) close a fence of r characters c? */
static int
fence_closes(const char *s, size_t ls, size_t le, char c, size_t r,
    size_t max_indent)
{
	size_t p = ls, col = 0, k = 0;

	while (p < le && is_blank(s[p])) {
		col = s[p] == '\t' ? (col + 4) & ~(size_t)3 : col + 1;
		p++;
	}
	if (col > max_indent)
		return 0;
	while (p + k < le && s[p + k] == c)
		k++;
	if (k < r)
		return 0;
	for (p += k; p < le; p++)
		if (!is_blank(s[p]))
			return 0;
	return 1;
}

/* The bytes that can start inline syntax we strip. */
static const unsigned char inline_special[256] = {
	['\\'] = 1, ['`'] = 1, ['<'] = 1,
};

/*
 * Scan inline content from i to the end of its line, following code spans
 * and HTML comments onto later lines. Returns the offset of the end of the
 * line where the scan stopped; *content tells whether that line has text
 * left that is neither blank nor stripped.
 */
static size_t
strip_inline(struct strip *st, size_t i, int *content)
{
	const char *s = st->s;
	size_t n = st->n, le = line_end(s, n, i), len, close, end;
	size_t from = i;	/* where the text of the last line starts */
	int code = 0;		/* a code span ends on the last line */

	while (i < le) {
		while (i < le && !inline_special[(unsigned char)s[i]])
			i++;
		if (i >= le)
			break;
		if (s[i] == '\\') {
			/* "\`" or "\<" is literal text, never an opener */
			i += i + 1 < le && is_ascii_punct(s[i + 1]) ? 2 : 1;
			continue;
		}
		if (s[i] == '`') {
			for (len = 0; i + len < le && s[i + len] == '`'; len++)
				;
			close = runs_find(st, len, i + len);
			if (close == NONE || close >= para_end(st, le)) {
				/* no closer: the backticks are literal */
				i += len;
				continue;
			}
			mask_set(st, i, close + len, M_CODE);
			i = close + len;
			if (close > le) {
				le = line_end(s, n, i);
				from = i;
				code = 1;
			}
			continue;
		}
		if (n - i >= 4 && memcmp(s + i, "<!--", 4) == 0) {
			close = find_comment_end(s, n, i + 4);
			end = close == NONE ? n : close + 3;
			mask_set(st, i, end, M_BLOCK);
			if (end > le) {
				le = line_end(s, n, end);
				from = end;
				code = 0;
			}
			i = end;
			continue;
		}
		i++;
	}
	*content = code;
	for (; !code && from < le; from++)
		if (!is_blank(s[from]) && st->mask[from] != M_BLOCK) {
			*content = 1;
			break;
		}
	return le;
}

/*
 * Mark what is stripped before matching. Block structure is recognized
 * line by line: fences (also inside list items), blockquote lines (also
 * nested or inside list items) and the lines continuing a quote's text,
 * GitLab's ">>>" blockquotes, indented code (4 columns, not inside a
 * paragraph: an indented line right after text continues that text, as in
 * CommonMark). The rest goes through strip_inline().
 */
static void
strip_body(struct strip *st)
{
	const char *s = st->s;
	size_t n = st->n, pos = 0, ls, le, p, q, col, m, r, max_indent;
	int in_para = 0, in_quote = 0, content;
	char fc = 0;

	while (pos < n) {
		ls = pos;
		le = line_end(s, n, ls);
		for (p = ls, col = 0; p < le && is_blank(s[p]); p++)
			col = s[p] == '\t' ? (col + 4) & ~(size_t)3 : col + 1;
		if (p == le) {
			in_para = in_quote = 0;
			pos = le + 1;
			continue;
		}
		if (col >= 4 && !in_para && !in_quote) {
			/* indented code */
			mask_set(st, ls, le, M_BLOCK);
			pos = le + 1;
			continue;
		}
		if (col <= 3) {
			for (q = p;;) {
				if (s[q] == '>')
					break;
				m = list_marker(s, q, le);
				if (m == 0 || q + m >= le)
					break;
				q += m;
			}
			/*
			 * GitLab's multi-line blockquote, ">>>" to ">>>", is
			 * a fence of '>'.
			 */
			if ((r = quote_fence_open(s, q, le)) > 0) {
				fc = '>';
			} else if (q < le && s[q] == '>') {
				/* a quote line, whatever it holds */
				mask_set(st, ls, le, M_BLOCK);
				in_para = 0;
				in_quote = quote_para(s, q, le);
				pos = le + 1;
				continue;
			} else {
				r = fence_open(s, q, le, &fc);
			}
			if (r > 0) {
				/*
				 * Inside a list item the closer may be indented
				 * like the item's content.
				 */
				max_indent = q == p ? 3 : (q - ls) + 3;
				for (pos = le + 1; pos < n; pos = le + 1) {
					le = line_end(s, n, pos);
					if (fence_closes(s, pos, le, fc, r,
					    max_indent))
						break;
				}
				/* an unclosed fence runs to the end */
				mask_set(st, ls, le, M_BLOCK);
				in_para = in_quote = 0;
				pos = le + 1;
				continue;
			}
		}
		le = strip_inline(st, ls, &content);
		if (in_quote) {
			/*
			 * A lazy continuation line of the quote's paragraph
			 * (with the code spans and comments it opens) is
			 * shown inside the quote: stripped.
			 */
			mask_set(st, ls, le, M_BLOCK);
		}
		in_para = content;
		pos = le + 1;
	}
}

/* ------------------------------------------------------------ text */

/*
 * The text of [from, le) without the stripped blocks, trimmed on the
 * right and, if trim_left, on the left: sets *b and *e to the bounds.
 * Returns 0 when nothing is left.
 */
static int
text_bounds(const struct strip *st, size_t from, size_t le, int trim_left,
    size_t *b, size_t *e)
{
	size_t x = from, y = le;

	while (y > x && (st->mask[y - 1] == M_BLOCK || is_blank(st->s[y - 1])))
		y--;
	if (y == x)
		return 0;
	/* there is text: y - 1 is neither blank nor stripped */
	if (trim_left)
		while (x < y && (st->mask[x] == M_BLOCK || is_blank(st->s[x])))
			x++;
	*b = x;
	*e = y;
	return 1;
}

/* Append the bytes of [b, e) that are not stripped blocks. */
static int
text_append(const struct strip *st, size_t b, size_t e, struct buf *out)
{
	size_t k;

	while (b < e) {
		if (st->mask[b] == M_BLOCK) {
			b++;
			continue;
		}
		for (k = b; k < e && st->mask[k] != M_BLOCK; k++)
			;
		if (buf_add(out, st->s + b, k - b) < 0)
			return -1;
		b = k;
	}
	return 0;
}

/*
 * Check a fix objective or guide hint: valid UTF-8 without control
 * characters other than "\n" and "\t" (C0, DEL and C1 are refused), and
 * without the bidi embeddings, overrides and isolates U+202A..U+202E and
 * U+2066..U+2069. Those make text display in another order than it is
 * read and stored ("Trojan Source"); an objective is shown to people
 * in the status comment and acted on by an agent, so the two must agree.
 * The bidi marks LRM/RLM/ALM only nudge neutral characters and are kept.
 * Returns 0, or -1 with *why set to a message.
 */
static int
text_check(const char *text, size_t n, const char **why)
{
	const unsigned char *s = (const unsigned char *)text;
	size_t i = 0, k, j;
	uint32_t cp;

	while (i < n) {
		if (s[i] < 0x80) {
			if ((s[i] < 0x20 && s[i] != '\n' && s[i] != '\t') ||
			    s[i] == 0x7f)
				goto control;
			i++;
			continue;
		}
		if (s[i] >= 0xc2 && s[i] <= 0xdf) {
			k = 1;
			cp = s[i] & 0x1f;
		} else if (s[i] >= 0xe0 && s[i] <= 0xef) {
			k = 2;
			cp = s[i] & 0x0f;
		} else if (s[i] >= 0xf0 && s[i] <= 0xf4) {
			k = 3;
			cp = s[i] & 0x07;
		} else {
			goto invalid;
		}
		if (n - i <= k)
			goto invalid;
		for (j = 1; j <= k; j++) {
			if ((s[i + j] & 0xc0) != 0x80)
				goto invalid;
			cp = (cp << 6) | (s[i + j] & 0x3f);
		}
		if ((k == 2 && cp < 0x800) || (k == 3 && cp < 0x10000) ||
		    cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			goto invalid;
		if (cp <= 0x9f)
			goto control;
		if ((cp >= 0x202a && cp <= 0x202e) ||
		    (cp >= 0x2066 && cp <= 0x2069)) {
			*why = "must not contain bidirectional override, "
			    "embedding or isolate characters";
			return -1;
		}
		i += k + 1;
	}
	return 0;
invalid:
	*why = "is not valid UTF-8";
	return -1;
control:
	*why = "must not contain control characters";
	return -1;
}

/* ------------------------------------------------------------ parse */

struct parser {
	struct strip st;
	const struct cmd_limits *lim;
	struct cmd *cmds;
	size_t ncmds;
	size_t cap;
	char *error;
	int help;
	int multi;		/* more than one /diverge line: say which */
};

/* A /diverge line found by the pattern. */
struct cand {
	size_t ls, le;		/* the line */
	size_t word, wordlen;	/* the subcommand word */
	unsigned int line;
};

static void
cmd_release(struct cmd *c)
{
	free(c->text);
	free(c->source);
	memset(c, 0, sizeof(*c));
}

static void
fail(struct parser *ps, const struct cand *cd, int help, const char *fmt,
    ...) __attribute__((format(printf, 4, 5)));

/* Record the error for the commenter (the first one wins). */
static void
fail(struct parser *ps, const struct cand *cd, int help, const char *fmt,
    ...)
{
	va_list ap;
	char *msg;

	if (ps->error != NULL)
		return;
	va_start(ap, fmt);
	msg = xvasprintf(fmt, ap);
	va_end(ap);
	if (cd != NULL && ps->multi) {
		ps->error = xasprintf("line %u: %s", cd->line, msg);
		free(msg);
	} else {
		ps->error = msg;
	}
	ps->help = help;
}

static const struct cmd_entry *
lookup(const char *w, size_t n)
{
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cmd_table); i++)
		if (strlen(cmd_table[i].name) == n &&
		    strncasecmp(cmd_table[i].name, w, n) == 0)
			return &cmd_table[i];
	return NULL;
}

/* May w be echoed in a code span? Short, [A-Za-z0-9] and "-_.+$,". */
static int
echo_safe(const char *w, size_t n)
{
	size_t i;

	if (n == 0 || n > MAX_ECHO)
		return 0;
	for (i = 0; i < n; i++)
		if (!((w[i] >= 'a' && w[i] <= 'z') ||
		    (w[i] >= 'A' && w[i] <= 'Z') || is_digit(w[i]) ||
		    w[i] == '-' || w[i] == '_' || w[i] == '.' || w[i] == '+' ||
		    w[i] == '$' || w[i] == ','))
			return 0;
	return 1;
}

/* The objective of fix, the hint of guide: see the header. */
static int
parse_text(struct parser *ps, const struct cand *cd,
    const struct cmd_entry *e, size_t args, size_t bound, struct cmd *c)
{
	const struct strip *st = &ps->st;
	struct buf b;
	size_t x, y, ls, le;
	const char *why;
	int ret = -1;

	buf_init(&b, e->text_max);
	if (text_bounds(st, args, cd->le, 1, &x, &y) &&
	    text_append(st, x, y, &b) < 0)
		goto toolong;
	/* the non-blank lines below, up to the next /diverge line */
	for (ls = cd->le + 1; ls < bound; ls = le + 1) {
		le = line_end(st->s, st->n, ls);
		if (!text_bounds(st, ls, le, b.len == 0, &x, &y))
			break;
		if (b.len > 0 && buf_add(&b, "\n", 1) < 0)
			goto toolong;
		if (text_append(st, x, y, &b) < 0)
			goto toolong;
	}
	if (b.len == 0) {
		fail(ps, cd, 0, "`%s` needs %s; usage: `/diverge %s %s`",
		    e->name, e->kind == CMD_FIX ? "an objective" : "a hint",
		    e->name, e->usage_args);
		goto out;
	}
	if (text_check(b.data, b.len, &why) < 0) {
		fail(ps, cd, 0, "the %s of `%s` %s", e->kind == CMD_FIX ?
		    "objective" : "hint", e->name, why);
		goto out;
	}
	c->text = buf_detach(&b, NULL);
	ret = 0;
	goto out;
toolong:
	fail(ps, cd, 0, "the %s of `%s` is too long (at most %zu bytes)",
	    e->kind == CMD_FIX ? "objective" : "hint", e->name, e->text_max);
out:
	buf_release(&b);
	return ret;
}

/* One amount as written. */
struct amount {
	const char *w;		/* the word, not NUL-terminated */
	size_t wlen;
	int usd;		/* written as USD: '$', decimals or "usd" */
	int tok;		/* written as tokens: k, m or "tokens" */
	int unit_word;		/* a separate "usd"/"tokens" word followed */
	int64_t whole;		/* the integer part */
	int64_t cents;		/* 0..99 */
	int64_t mult;		/* 1, 1000 or 1000000 */
};

static int
word_is(const char *w, size_t n, const char *lit)
{
	return strlen(lit) == n && strncasecmp(w, lit, n) == 0;
}

/*
 * Read one amount word into *a. Returns 0, or -1 after fail(): the error
 * names the amount when it is safe to echo.
 */
static int
amount_read(struct parser *ps, const struct cand *cd, const char *usage,
    const char *w, size_t n, pcre2_match_data *md, struct amount *a)
{
	PCRE2_SIZE *ov;
	size_t i, p = 0, dn;
	int rc;

	memset(a, 0, sizeof(*a));
	a->w = w;
	a->wlen = n;
	while (p < n && (w[p] == '+' || w[p] == '$'))
		p++;
	if (p < n && w[p] == '-') {
		fail(ps, cd, 0, "budget bumps only add: a negative amount is "
		    "not allowed; usage: `%s`", usage);
		return -1;
	}
	rc = pcre2_match(re_amount, (PCRE2_SPTR)w, n, 0, 0, md, NULL);
	if (rc < 0) {
		if (echo_safe(w, n))
			fail(ps, cd, 0, "`%.*s` is not an amount; usage: `%s`",
			    (int)n, w, usage);
		else
			fail(ps, cd, 0, "cannot read the amount; usage: `%s`",
			    usage);
		return -1;
	}
	ov = pcre2_get_ovector_pointer(md);
	/* groups the match did not reach are unset */
	for (i = (size_t)rc; i < 6; i++)
		ov[2 * i] = ov[2 * i + 1] = PCRE2_UNSET;
	a->usd = ov[5] > ov[4] || ov[8] != PCRE2_UNSET;
	a->mult = 1;
	if (ov[10] != PCRE2_UNSET && ov[11] > ov[10]) {
		if (ov[11] - ov[10] == 3) {
			a->usd = 1;
		} else {
			a->tok = 1;
			a->mult = (w[ov[10]] == 'k' || w[ov[10]] == 'K') ?
			    1000 : 1000000;
		}
	}
	for (i = ov[6]; i < ov[7]; i++) {
		if (w[i] == ',')
			continue;
		if (a->whole > (INT64_MAX - 9) / 10)
			goto overflow;
		a->whole = a->whole * 10 + (w[i] - '0');
	}
	if (ov[8] != PCRE2_UNSET) {
		dn = ov[9] - ov[8];
		if (dn > 2) {
			fail(ps, cd, 0, "`%.*s`: at most 2 decimals (cents); "
			    "usage: `%s`", (int)(n > MAX_ECHO ? MAX_ECHO : n),
			    w, usage);
			return -1;
		}
		a->cents = (w[ov[8]] - '0') * 10;
		if (dn == 2)
			a->cents += w[ov[8] + 1] - '0';
	}
	return 0;
overflow:
	fail(ps, cd, 0, "the amount is too large; usage: `%s`", usage);
	return -1;
}

/*
 * budget and resume: at most two amounts, one in USD and one in tokens,
 * each optionally followed by the word "usd" or "tokens". See the help
 * text for how a bare number is read.
 */
static int
parse_amounts(struct parser *ps, const struct cand *cd,
    const struct cmd_entry *e, size_t args, struct cmd *c)
{
	const struct strip *st = &ps->st;
	struct amount am[2];
	struct buf b;
	pcre2_match_data *md = NULL;
	char *usage = NULL;
	const char *w;
	size_t x, y, i, k, na = 0;
	int64_t v, lim_usd, lim_tok;
	int ret = -1, is_usd;

	usage = xasprintf("/diverge %s %s", e->name, e->usage_args);
	buf_init(&b, MAX_AMOUNT_ARGS);
	if (text_bounds(st, args, cd->le, 1, &x, &y) &&
	    text_append(st, x, y, &b) < 0) {
		fail(ps, cd, 0, "too many arguments; usage: `%s`", usage);
		goto out;
	}
	md = pcre2_match_data_create_from_pattern(re_amount, NULL);
	if (md == NULL) {
		fail(ps, cd, 0, "out of memory");
		goto out;
	}
	for (i = 0; i < b.len; i = k) {
		for (; i < b.len && is_blank(b.data[i]); i++)
			;
		for (k = i; k < b.len && !is_blank(b.data[k]); k++)
			;
		if (k == i)
			break;
		w = b.data + i;
		if (word_is(w, k - i, "tokens") || word_is(w, k - i, "token") ||
		    word_is(w, k - i, "usd")) {
			if (na == 0 || am[na - 1].unit_word) {
				fail(ps, cd, 0, "`%.*s` must follow a number; "
				    "usage: `%s`", (int)(k - i), w, usage);
				goto out;
			}
			am[na - 1].unit_word = 1;
			if (w[0] == 'u' || w[0] == 'U')
				am[na - 1].usd = 1;
			else
				am[na - 1].tok = 1;
			continue;
		}
		if (na == 2) {
			fail(ps, cd, 0, "at most one USD and one token amount; "
			    "usage: `%s`", usage);
			goto out;
		}
		if (amount_read(ps, cd, usage, w, k - i, md, &am[na]) < 0)
			goto out;
		na++;
	}
	if (na == 0) {
		if (e->args == ARGS_AMOUNTS) {
			ret = 0;
			goto out;
		}
		fail(ps, cd, 0, "`%s` needs an amount; usage: `%s`", e->name,
		    usage);
		goto out;
	}
	lim_usd = ps->lim->max_bump_usd_micro;
	lim_tok = ps->lim->max_bump_tokens;
	for (i = 0; i < na; i++) {
		struct amount *a = &am[i];

		if (a->usd && a->tok) {
			fail(ps, cd, 0, "an amount is either USD (`$`, "
			    "decimals, `usd`) or tokens (`k`, `M`, `tokens`), "
			    "not both; usage: `%s`", usage);
			goto out;
		}
		if (a->usd)
			is_usd = 1;
		else if (a->tok)
			is_usd = 0;
		else if (na == 1)
			is_usd = a->whole <= BARE_USD_MAX;
		else if (i == 1)
			is_usd = 0;
		else	/* a bare first amount is what the second is not */
			is_usd = !am[1].usd;
		if (is_usd) {
			if (c->usd_micro != 0) {
				fail(ps, cd, 0, "two USD amounts; usage: `%s`",
				    usage);
				goto out;
			}
			if (a->whole > (INT64_MAX - 999999) / 1000000)
				goto toolarge;
			v = a->whole * 1000000 + a->cents * 10000;
			if (v == 0)
				goto zero;
			if (lim_usd < 0) {
				fail(ps, cd, 0, "USD budget raises are turned "
				    "off here");
				goto out;
			}
			if (v > lim_usd) {
				fail(ps, cd, 0, "a bump is at most "
				    "$%lld.%02lld per command",
				    (long long)(lim_usd / 1000000),
				    (long long)(lim_usd % 1000000 / 10000));
				goto out;
			}
			c->usd_micro = v;
		} else {
			if (c->tokens != 0) {
				fail(ps, cd, 0, "two token amounts; usage: "
				    "`%s`", usage);
				goto out;
			}
			if (a->whole > INT64_MAX / a->mult)
				goto toolarge;
			v = a->whole * a->mult;
			if (v == 0)
				goto zero;
			if (lim_tok < 0) {
				fail(ps, cd, 0, "token budget raises are turned "
				    "off here");
				goto out;
			}
			if (v > lim_tok) {
				fail(ps, cd, 0, "a bump is at most %lld tokens "
				    "per command", (long long)lim_tok);
				goto out;
			}
			c->tokens = v;
		}
	}
	ret = 0;
	goto out;
toolarge:
	fail(ps, cd, 0, "the amount is too large; usage: `%s`", usage);
	goto out;
zero:
	fail(ps, cd, 0, "a bump must be more than zero; usage: `%s`", usage);
out:
	pcre2_match_data_free(md);
	buf_release(&b);
	free(usage);
	return ret;
}

static int
cmd_equal(const struct cmd *a, const struct cmd *b)
{
	if (a->kind != b->kind || a->usd_micro != b->usd_micro ||
	    a->tokens != b->tokens)
		return 0;
	if (a->text == NULL || b->text == NULL)
		return a->text == b->text;
	return strcmp(a->text, b->text) == 0;
}

/* The line as written, cut to COMMANDS_MAX_SOURCE on a UTF-8 boundary. */
static char *
source_line(const struct strip *st, size_t ls, size_t le)
{
	return xstrndup(st->s + ls, utf8_cut(st->s + ls, le - ls,
	    COMMANDS_MAX_SOURCE));
}

/*
 * Interpret one /diverge line; bound is where the next one starts (a fix
 * objective stops there). Returns 0, or -1 once an error is recorded.
 */
static int
parse_one(struct parser *ps, const struct cand *cd, size_t bound)
{
	const char *w = ps->st.view + cd->word;
	const struct cmd_entry *e;
	struct cmd c;
	size_t args = cd->word + cd->wordlen, x, y, i;
	int ret = -1;

	memset(&c, 0, sizeof(c));
	if (cd->wordlen == 0) {
		fail(ps, cd, 1, "`/diverge` needs a command");
		goto out;
	}
	e = lookup(w, cd->wordlen);
	if (e == NULL) {
		if (echo_safe(w, cd->wordlen))
			fail(ps, cd, 1, "unknown command `%.*s`",
			    (int)cd->wordlen, w);
		else
			fail(ps, cd, 1, "unknown command");
		goto out;
	}
	c.kind = e->kind;
	switch (e->args) {
	case ARGS_NONE:
		if (text_bounds(&ps->st, args, cd->le, 1, &x, &y)) {
			fail(ps, cd, 0, "`%s` takes no arguments; usage: "
			    "`/diverge %s`", e->name, e->name);
			goto out;
		}
		break;
	case ARGS_TEXT:
		if (parse_text(ps, cd, e, args, bound, &c) < 0)
			goto out;
		break;
	case ARGS_AMOUNTS:
	case ARGS_AMOUNTS_REQUIRED:
		if (parse_amounts(ps, cd, e, args, &c) < 0)
			goto out;
		break;
	}
	for (i = 0; i < ps->ncmds; i++)
		if (cmd_equal(&ps->cmds[i], &c)) {
			/* identical commands collapse into the first */
			ret = 0;
			goto out;
		}
	if (ps->ncmds >= (size_t)ps->lim->max_commands) {
		fail(ps, NULL, 0, "too many commands: at most %d per comment",
		    ps->lim->max_commands);
		goto out;
	}
	if (ps->ncmds == ps->cap) {
		ps->cap = ps->cap ? ps->cap * 2 : 4;
		ps->cmds = xrealloc(ps->cmds, ps->cap * sizeof(*ps->cmds));
	}
	c.line = cd->line;
	c.source = source_line(&ps->st, cd->ls, cd->le);
	ps->cmds[ps->ncmds++] = c;
	memset(&c, 0, sizeof(c));	/* now owned by ps->cmds */
	ret = 0;
out:
	cmd_release(&c);
	return ret;
}

/*
 * Commands that cannot run together: fix with pause, pause with resume,
 * two different objectives or two different hints.
 */
static void
check_conflicts(struct parser *ps)
{
	size_t count[CMD_KIND_COUNT] = { 0 }, i;

	for (i = 0; i < ps->ncmds; i++)
		count[ps->cmds[i].kind]++;
	if (count[CMD_FIX] && count[CMD_PAUSE])
		fail(ps, NULL, 0, "`fix` and `pause` cannot be in the same "
		    "comment; nothing was run");
	else if (count[CMD_PAUSE] && count[CMD_RESUME])
		fail(ps, NULL, 0, "`pause` and `resume` cannot be in the same "
		    "comment; nothing was run");
	else if (count[CMD_FIX] > 1)
		fail(ps, NULL, 0, "one `fix` objective per comment; nothing "
		    "was run");
	else if (count[CMD_GUIDE] > 1)
		fail(ps, NULL, 0, "one `guide` hint per comment; nothing was "
		    "run");
}

/* Copy body into a new buffer with CRLF and lone CR turned into LF. */
static char *
normalize(const char *body, size_t len, size_t *n_out)
{
	char *s = xmalloc(len + 1);
	const char *cr;
	size_t i = 0, n = 0, k;

	while (i < len) {
		cr = memchr(body + i, '\r', len - i);
		k = cr != NULL ? (size_t)(cr - body) - i : len - i;
		memcpy(s + n, body + i, k);
		n += k;
		i += k;
		if (cr == NULL)
			break;
		s[n++] = '\n';
		i++;
		if (i < len && body[i] == '\n')
			i++;
	}
	s[n] = '\0';
	*n_out = n;
	return s;
}

/* Parse a comment body; see the header. */
int
commands_parse(const char *body, size_t len, const struct cmd_limits *lim,
    struct cmd_result *out)
{
	struct cmd_limits l = CMD_LIMITS_INIT;
	struct parser ps;
	struct cand cur, next;
	pcre2_match_data *md = NULL;
	PCRE2_SIZE *ov;
	char *s = NULL;
	size_t n = 0, i, off = 0, counted = 0;
	unsigned int line = 1;
	int ret = -1, rc, have = 0;

	memset(out, 0, sizeof(*out));
	memset(&ps, 0, sizeof(ps));
	if ((body == NULL && len > 0) || len > COMMANDS_MAX_BODY)
		goto out;
	if (commands_init(NULL) < 0)
		goto out;
	if (lim != NULL) {
		if (lim->max_commands > 0)
			l.max_commands = lim->max_commands;
		if (lim->max_bump_usd_micro != 0)
			l.max_bump_usd_micro = lim->max_bump_usd_micro;
		if (lim->max_bump_tokens != 0)
			l.max_bump_tokens = lim->max_bump_tokens;
	}
	ps.lim = &l;
	s = normalize(body != NULL ? body : "", len, &n);
	ps.st.s = s;
	ps.st.n = n;
	ps.st.mask = xcalloc(n + 1, 1);
	ps.st.view = xmalloc(n + 1);
	memcpy(ps.st.view, s, n + 1);
	ps.st.brk = NONE;
	runs_index(&ps.st);
	strip_body(&ps.st);

	md = pcre2_match_data_create_from_pattern(re_line, NULL);
	if (md == NULL)
		goto out;
	/*
	 * Each /diverge line is interpreted once the next one is known (a
	 * multi-line objective stops at the next command line).
	 */
	while (off <= n && ps.error == NULL) {
		rc = pcre2_match(re_line, (PCRE2_SPTR)ps.st.view, n, off, 0, md,
		    NULL);
		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (rc < 0)
			goto out;
		ov = pcre2_get_ovector_pointer(md);
		next.ls = ov[0];
		next.word = ov[2];
		next.wordlen = ov[3] - ov[2];
		next.le = line_end(s, n, ov[1]);
		for (; counted < next.ls; counted++) {
			const char *p = memchr(s + counted, '\n',
			    next.ls - counted);

			if (p == NULL) {
				counted = next.ls;
				break;
			}
			counted = (size_t)(p - s);
			line++;
		}
		next.line = line;
		if (have) {
			ps.multi = 1;
			parse_one(&ps, &cur, next.ls);
		}
		cur = next;
		have = 1;
		off = next.le + 1;
	}
	if (have && ps.error == NULL)
		parse_one(&ps, &cur, n);
	if (ps.error == NULL)
		check_conflicts(&ps);
	if (ps.error != NULL) {
		for (i = 0; i < ps.ncmds; i++)
			cmd_release(&ps.cmds[i]);
		free(ps.cmds);
		out->error = ps.error;
		out->help = ps.help;
	} else {
		out->cmds = ps.cmds;
		out->ncmds = ps.ncmds;
	}
	ps.cmds = NULL;
	ps.ncmds = 0;
	ps.error = NULL;	/* now owned by out */
	ret = 0;
out:
	if (ps.cmds != NULL) {
		for (i = 0; i < ps.ncmds; i++)
			cmd_release(&ps.cmds[i]);
		free(ps.cmds);
	}
	free(ps.error);
	pcre2_match_data_free(md);
	free(ps.st.view);
	free(ps.st.mask);
	free(ps.st.runs);
	free(s);
	return ret;
}

/* Free what a result owns. */
void
commands_result_release(struct cmd_result *out)
{
	size_t i;

	if (out == NULL)
		return;
	for (i = 0; i < out->ncmds; i++)
		cmd_release(&out->cmds[i]);
	free(out->cmds);
	free(out->error);
	memset(out, 0, sizeof(*out));
}

/* ------------------------------------------------------------ help */

/* The command reference, generated from cmd_table. */
char *
commands_help_markdown(void)
{
	struct buf b;
	size_t i;

	buf_init(&b, 16384);
	buf_addstr(&b, "**Diverge commands.** Write each one at the start of "
	    "its own line in a new comment (text in code, quotes and HTML "
	    "comments is ignored).\n\n"
	    "| command | arguments | who may run it | what it does |\n"
	    "| --- | --- | --- | --- |\n");
	for (i = 0; i < ARRAY_SIZE(cmd_table); i++) {
		const struct cmd_entry *e = &cmd_table[i];

		buf_printf(&b, "| `/diverge %s` |%s%s%s| %s | %s |\n",
		    e->name, e->usage_args[0] ? " `" : "", e->usage_args,
		    e->usage_args[0] ? "` " : " ", e->who, e->what);
	}
	buf_printf(&b, "\n"
	    "Amounts add to the budget, they never lower it. "
	    "USD: `+15`, `+15.00`, `+$15`, `$15.5`, `15.00usd`. "
	    "Tokens: `2000000`, `+2000000`, `2M`, `500k`, `2,000,000 tokens`. "
	    "A number with `$`, decimals or `usd` is USD; one with `k`, `M` "
	    "or `tokens` is tokens. A plain number in second place is tokens; "
	    "a plain number alone is USD up to `%d` and tokens above it. "
	    "Example: `/diverge resume +$15 2M`.\n\n"
	    "By default a comment holds at most %d commands and a bump is at "
	    "most `$%lld` and `%lldM` tokens. `fix` with `pause`, or `pause` "
	    "with `resume`, in one comment are refused as a whole.\n",
	    BARE_USD_MAX, CMD_LIMITS_DEFAULT_MAX_COMMANDS,
	    (long long)(CMD_LIMITS_DEFAULT_MAX_USD_MICRO / 1000000),
	    (long long)(CMD_LIMITS_DEFAULT_MAX_TOKENS / 1000000));
	return buf_detach(&b, NULL);
}

/* The JSON name of a kind. */
const char *
commands_kind_name(enum cmd_kind kind)
{
	if ((unsigned int)kind >= ARRAY_SIZE(cmd_table))
		return "unknown";
	return cmd_table[kind].name;
}

/* The default role needed to run c. */
enum cmd_role
commands_required_role(const struct cmd *c)
{
	if ((unsigned int)c->kind >= ARRAY_SIZE(cmd_table))
		return CMD_ROLE_MAINTAIN;
	if (c->kind == CMD_RESUME && (c->usd_micro > 0 || c->tokens > 0))
		return CMD_ROLE_MAINTAIN;
	return cmd_table[c->kind].role;
}

/* The name of a role. */
const char *
commands_role_name(enum cmd_role role)
{
	switch (role) {
	case CMD_ROLE_ANYONE:
		return "anyone";
	case CMD_ROLE_WRITE:
		return "write";
	case CMD_ROLE_MAINTAIN:
		return "maintain";
	}
	return "unknown";
}

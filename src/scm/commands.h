/*
 * commands: the /diverge slash-command grammar (DESIGN.md section 8).
 *
 * commands_parse() turns the body of a pull-request comment into a list of
 * commands, or into one error meant for the commenter. Nothing here looks
 * at who wrote the comment or what the commands will do: authorization
 * (commands_required_role() gives the defaults) and the task operations
 * live elsewhere.
 *
 * The grammar, in short:
 *
 *  - Before matching, fenced code blocks (``` and ~~~), indented code
 *    blocks, inline code spans, blockquotes and HTML comments are
 *    stripped; CRLF and lone CR count as one line break. A blockquote is
 *    its '>' lines, the lines that continue its text up to a blank line
 *    (shown inside the quote, '>' or not), and GitLab's ">>>" to ">>>"
 *    blocks. Stripping keeps the line structure, so line numbers are
 *    those of the original body.
 *  - A command line starts with "/diverge" after at most 3 spaces, in any
 *    case, followed by a space, a tab or the end of the line. Anything
 *    else before it (a tab, a no-break space, a zero-width character, a
 *    list marker) means the line is not a command.
 *  - Subcommands (case-insensitive): fix <objective>, guide <hint>,
 *    budget [+$usd] [tokens], pause, resume [+$usd] [tokens], status,
 *    help. "/diverge" alone or an unknown subcommand gives a help result.
 *
 * Every PCRE2 pattern is compiled once for the process and shared by all
 * threads; commands_parse() is thread-safe and reentrant.
 */
#ifndef DIVERGE_SCM_COMMANDS_H
#define DIVERGE_SCM_COMMANDS_H

#include <stddef.h>
#include <stdint.h>

/* The subcommands, in the order of the help table. */
enum cmd_kind {
	CMD_FIX = 0,
	CMD_GUIDE,
	CMD_BUDGET,
	CMD_PAUSE,
	CMD_RESUME,
	CMD_STATUS,
	CMD_HELP,
};
#define CMD_KIND_COUNT 7

/* Who may run a command by default, weakest first. */
enum cmd_role {
	CMD_ROLE_ANYONE = 0,
	CMD_ROLE_WRITE,		/* GitHub admin|maintain|write, GitLab >= 30 */
	CMD_ROLE_MAINTAIN,	/* GitHub admin|maintain, GitLab >= 40 */
};

/* Largest body commands_parse() accepts (GitLab allows 1,000,000 chars). */
#define COMMANDS_MAX_BODY (4u << 20)
/* Longest fix objective and guide hint, in bytes after trimming. */
#define COMMANDS_MAX_OBJECTIVE 4000
#define COMMANDS_MAX_HINT 2000
/* cmd.source is cut to at most this many bytes, on a UTF-8 boundary. */
#define COMMANDS_MAX_SOURCE 4200

/* One parsed command. */
struct cmd {
	enum cmd_kind kind;
	/*
	 * The fix objective or the guide hint: trimmed, valid UTF-8, lines
	 * joined by "\n", no control character but "\n" and "\t", no bidi
	 * embedding/override/isolate. NULL for the other kinds.
	 */
	char *text;
	/* budget/resume bumps; 0 when not given. Always >= 0. */
	int64_t usd_micro;
	int64_t tokens;
	/* 1-based line of the /diverge line in the original body. */
	unsigned int line;
	/* That line as written (without its line break), see MAX_SOURCE. */
	char *source;
};

/*
 * The outcome of a parse: either cmds/ncmds (possibly none: the comment
 * had no command, and nothing must be answered) or error, a short
 * lowercase message for the commenter (Markdown; any command or example
 * in it is inside a code span). When help is set, error explains what
 * was wrong with the /diverge line and the reply should append
 * commands_help_markdown().
 */
struct cmd_result {
	struct cmd *cmds;
	size_t ncmds;
	char *error;
	int help;
};

/*
 * Limits an operator may configure. A field of 0 means its default (so
 * does a negative max_commands); a negative max_bump_* turns that kind of
 * budget raise off (the configuration's 0). A NULL struct cmd_limits
 * pointer means all defaults.
 */
struct cmd_limits {
	int max_commands;		/* distinct commands per comment */
	int64_t max_bump_usd_micro;	/* largest USD bump per command */
	int64_t max_bump_tokens;	/* largest token bump per command */
};
#define CMD_LIMITS_DEFAULT_MAX_COMMANDS 5
#define CMD_LIMITS_DEFAULT_MAX_USD_MICRO (INT64_C(1000) * 1000000)
#define CMD_LIMITS_DEFAULT_MAX_TOKENS INT64_C(100000000)
#define CMD_LIMITS_INIT { CMD_LIMITS_DEFAULT_MAX_COMMANDS, \
	CMD_LIMITS_DEFAULT_MAX_USD_MICRO, CMD_LIMITS_DEFAULT_MAX_TOKENS }

/*
 * Compile the patterns (once per process, with JIT where available).
 * Calling it is optional: commands_parse() does it on first use; call it
 * at start to fail early. Thread-safe. Returns 0, or -1 with a new string
 * in *cause (the caller frees it) when PCRE2 refused a pattern.
 */
int commands_init(char **cause);

/*
 * Parse the comment body (len bytes, need not be NUL-terminated, may hold
 * any bytes) with the limits lim (NULL: defaults) into *out, which the
 * caller releases with commands_result_release() whatever happened.
 *
 * Returns 0 when *out holds the outcome: commands (in comment order, the
 * identical ones collapsed into the first), none, or one error for the
 * commenter (see struct cmd_result). Returns -1, with *out empty, when
 * the body cannot be looked at: body NULL with len > 0, len over
 * COMMANDS_MAX_BODY, or the patterns failed to compile. The caller should
 * then log and ignore the comment, not answer it.
 */
int commands_parse(const char *body, size_t len, const struct cmd_limits *lim,
    struct cmd_result *out);

/* Free what out owns and empty it; a released or zeroed result is fine. */
void commands_result_release(struct cmd_result *out);

/*
 * The command reference as Markdown, generated from the one table of
 * commands: a first line that is not a command, then a table of command,
 * arguments, who may run it by default and what it does, then how
 * amounts are written. Every command and example is inside a code span,
 * so that the reply can never parse as a command. Returns a new string.
 */
char *commands_help_markdown(void);

/* The JSON name of a kind ("fix", "guide", ...), "unknown" when invalid. */
const char *commands_kind_name(enum cmd_kind kind);

/*
 * Who may run c by default (DESIGN.md section 8): fix, guide, pause and
 * resume need write access, budget and a resume with a bump need
 * maintainer, status and help anyone.
 */
enum cmd_role commands_required_role(const struct cmd *c);

/* "anyone", "write" or "maintain", for logs and JSON. */
const char *commands_role_name(enum cmd_role role);

#endif

/*
 * diverge: the command-line client (DESIGN.md section 2, diverge(1)).
 *
 *   diverge token inspect TOKEN|-
 *
 * Exit status: 0 done, 1 refused (by the API, or the operation could not
 * be done: the message says why), 2 usage error.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "meter/meter.h"
#include "util/util.h"

#define EXIT_REFUSED 1
#define EXIT_USAGE 2

/* A token read from stdin is refused beyond this (it would be anyway). */
#define MAX_STDIN_TOKEN (MACAROON_MAX_TOKEN + 4096)

struct command;

/* A command: a group ("task", "token") and a verb. */
struct command {
	const char *group;
	const char *name;
	const char *args;	/* the synopsis after the verb */
	const char *about;	/* one line */
	const char *options;	/* its --help text, or NULL */
	int (*run)(const struct command *cmd, int argc, char **argv);
};

static const struct command commands[];

static const char *progname = "diverge";

/* ---- messages ---- */

static void
errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "diverge: <what>" on stderr. */
static void
errorf(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", progname);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

static void
print_synopsis(FILE *f, const struct command *cmd)
{
	fprintf(f, "usage: diverge %s %s%s%s\n", cmd->group, cmd->name,
	    cmd->args[0] != '\0' ? " " : "", cmd->args);
}

/* A usage error in cmd: the message, the synopsis, exit status 2. */
static int
usage_error(const struct command *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int
usage_error(const struct command *cmd, const char *fmt, ...)
{
	va_list ap;

	if (fmt != NULL) {
		fprintf(stderr, "%s: ", progname);
		va_start(ap, fmt);
		vfprintf(stderr, fmt, ap);
		va_end(ap);
		fputc('\n', stderr);
	}
	if (cmd != NULL) {
		print_synopsis(stderr, cmd);
		fprintf(stderr, "Try 'diverge %s %s --help' for more "
		    "information.\n", cmd->group, cmd->name);
	} else
		fprintf(stderr, "Try 'diverge --help' for more "
		    "information.\n");
	return EXIT_USAGE;
}

static int
command_help(const struct command *cmd)
{
	print_synopsis(stdout, cmd);
	printf("\n%s\n", cmd->about);
	if (cmd->options != NULL)
		printf("\n%s", cmd->options);
	return 0;
}

/* ---- token inspect ---- */

/* Read all of stdin into b (bounded); -1 with errno-based message. */
static int
read_stdin(struct buf *b)
{
	char chunk[4096];
	ssize_t n;

	for (;;) {
		n = read(STDIN_FILENO, chunk, sizeof(chunk));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			errorf("cannot read the token from stdin: %s",
			    strerror(errno));
			return -1;
		}
		if (n == 0)
			return 0;
		if (buf_add(b, chunk, (size_t)n) < 0) {
			errorf("token too large: more than %d bytes on stdin",
			    MAX_STDIN_TOKEN);
			return -1;
		}
	}
}

static const char token_inspect_options[] =
    "TOKEN is a serialized macaroon (V2 binary or V1, in any base64\n"
    "alphabet, padded or not); \"-\" reads it from stdin. Its version,\n"
    "identifier, location and caveats are printed one per line. Nothing\n"
    "is verified: the signature is not checked and the caveats are what\n"
    "the token claims.\n"
    "\n"
    "Options:\n"
    "  -h, --help     show this help\n";

/* diverge token inspect TOKEN|-: show a token's fields, unverified. */
static int
cmd_token_inspect(const struct command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 }
	};
	struct macaroon *m = NULL;
	struct buf in, out;
	const char *tok;
	char *cause = NULL;
	size_t len;
	int c, ret = EXIT_REFUSED;

	buf_init(&in, MAX_STDIN_TOKEN);
	buf_init(&out, 4 * MACAROON_MAX_TOKEN + 4096);
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'h':
			ret = command_help(cmd);
			goto out;
		default:
			ret = usage_error(cmd, NULL);
			goto out;
		}
	}
	if (argc - optind != 1) {
		ret = usage_error(cmd, argc - optind == 0 ? "a token is "
		    "required" : "one token at a time");
		goto out;
	}
	tok = argv[optind];
	len = strlen(tok);
	if (strcmp(tok, "-") == 0) {
		if (read_stdin(&in) < 0)
			goto out;
		tok = in.data != NULL ? in.data : "";
		len = in.len;
	}
	if (macaroon_inspect(tok, len, &m, &cause) != 0) {
		errorf("%s", cause != NULL ? cause : "malformed token");
		goto out;
	}
	if (macaroon_format(m, &out) < 0) {
		errorf("the token is too large to show");
		goto out;
	}
	fwrite(out.data, 1, out.len, stdout);
	ret = 0;
out:
	if (in.data != NULL)
		secure_wipe(in.data, in.len);
	buf_release(&in);
	buf_release(&out);
	macaroon_free(m);
	free(cause);
	return ret;
}

/* ---- the command table and main ---- */

static const struct command commands[] = {
	{ "token", "inspect", "TOKEN|-",
	    "Show a capability token's identifier, location and caveats, "
	    "without verifying it.", token_inspect_options,
	    cmd_token_inspect },
	{ NULL, NULL, NULL, NULL, NULL, NULL }
};

static void
main_usage(FILE *f)
{
	const struct command *cmd;

	fprintf(f, "usage: diverge [--version] [--help] COMMAND [ARGS]\n\n"
	    "Commands:\n");
	for (cmd = commands; cmd->group != NULL; cmd++)
		fprintf(f, "  %s %s %s\n", cmd->group, cmd->name, cmd->args);
	fprintf(f, "\nRun 'diverge GROUP COMMAND --help' for the options of "
	    "a command; see diverge(1).\n");
}

/* Whether name is a group of the table. */
static int
is_group(const char *name)
{
	const struct command *cmd;

	for (cmd = commands; cmd->group != NULL; cmd++)
		if (strcmp(cmd->group, name) == 0)
			return 1;
	return 0;
}

static void
group_usage(FILE *f, const char *group)
{
	const struct command *cmd;

	fprintf(f, "usage: diverge %s COMMAND [ARGS]\n\nCommands:\n", group);
	for (cmd = commands; cmd->group != NULL; cmd++)
		if (strcmp(cmd->group, group) == 0)
			fprintf(f, "  %-8s %s\n", cmd->name, cmd->about);
}

int
main(int argc, char **argv)
{
	const struct command *cmd;
	const char *group, *verb;

	util_json_init();
	log_setup(LOG_ERROR, 0);
	if (argc < 2) {
		main_usage(stderr);
		return EXIT_USAGE;
	}
	if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
	    strcmp(argv[1], "help") == 0) {
		main_usage(stdout);
		return 0;
	}
	if (strcmp(argv[1], "--version") == 0 ||
	    strcmp(argv[1], "version") == 0) {
		printf("diverge %s\n", PACKAGE_VERSION);
		return 0;
	}
	group = argv[1];
	if (group[0] == '-')
		return usage_error(NULL, "unknown option '%s'", group);
	if (!is_group(group))
		return usage_error(NULL, "unknown command '%s'", group);
	if (argc < 3 || strcmp(argv[2], "--help") == 0 ||
	    strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "help") == 0) {
		group_usage(argc < 3 ? stderr : stdout, group);
		return argc < 3 ? EXIT_USAGE : 0;
	}
	verb = argv[2];
	for (cmd = commands; cmd->group != NULL; cmd++)
		if (strcmp(cmd->group, group) == 0 &&
		    strcmp(cmd->name, verb) == 0)
			break;
	if (cmd->group == NULL) {
		errorf("unknown command '%s %s'", group, verb);
		group_usage(stderr, group);
		return EXIT_USAGE;
	}
	/* the verb is argv[0] of the command's own option parsing */
	optind = 0;
	return cmd->run(cmd, argc - 2, argv + 2);
}

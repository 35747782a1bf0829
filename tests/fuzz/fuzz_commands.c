/*
 * Fuzz target for the /diverge grammar: any bytes as a comment body.
 * Besides crashes and sanitizer reports it checks the contract: the
 * result is either commands or one error, every command is well formed
 * and within the limits, and no error we would post back parses as a
 * command (a bot must not be able to trigger itself).
 */
#include "config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "scm/commands.h"
#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x) do { if (!(x)) abort(); } while (0)

static int
text_ok(const char *t)
{
	const unsigned char *s = (const unsigned char *)t;

	for (; *s != '\0'; s++) {
		if ((*s < 0x20 && *s != '\n' && *s != '\t') || *s == 0x7f)
			return 0;
		/* U+202A..U+202E and U+2066..U+2069 */
		if (s[0] == 0xe2 && s[1] == 0x80 && s[2] >= 0xaa &&
		    s[2] <= 0xae)
			return 0;
		if (s[0] == 0xe2 && s[1] == 0x81 && s[2] >= 0xa6 &&
		    s[2] <= 0xa9)
			return 0;
	}
	return 1;
}

static char *help;

static void
check(const uint8_t *data, size_t size, const struct cmd_limits *lim,
    size_t max_commands, int64_t max_usd, int64_t max_tokens)
{
	struct cmd_result r, again;
	size_t i, lines = 1;
	char *reply;

	for (i = 0; i < size; i++)
		if (data[i] == '\n' || (data[i] == '\r' && (i + 1 == size ||
		    data[i + 1] != '\n')))
			lines++;
	CHECK(commands_parse((const char *)data, size, lim, &r) == 0);
	if (r.error != NULL) {
		CHECK(r.ncmds == 0 && r.cmds == NULL);
		CHECK(r.error[0] != '\0' && strchr(r.error, '\n') == NULL);
		/* what we would answer is inert */
		reply = xasprintf("%s\n\n%s", r.error, r.help ? help : "");
		CHECK(commands_parse(reply, strlen(reply), NULL, &again) == 0);
		CHECK(again.ncmds == 0 && again.error == NULL);
		commands_result_release(&again);
		free(reply);
	} else {
		CHECK(r.help == 0);
		CHECK(r.ncmds <= max_commands);
	}
	for (i = 0; i < r.ncmds; i++) {
		const struct cmd *c = &r.cmds[i];

		CHECK(c->line >= 1 && c->line <= lines);
		CHECK(i == 0 || c->line > r.cmds[i - 1].line);
		CHECK(c->source != NULL &&
		    strlen(c->source) <= COMMANDS_MAX_SOURCE);
		CHECK(strcmp(commands_kind_name(c->kind), "unknown") != 0);
		CHECK(c->usd_micro >= 0 && c->usd_micro <= max_usd);
		CHECK(c->tokens >= 0 && c->tokens <= max_tokens);
		if (c->kind == CMD_FIX || c->kind == CMD_GUIDE) {
			CHECK(c->text != NULL && c->text[0] != '\0');
			CHECK(strlen(c->text) <= (c->kind == CMD_FIX ?
			    COMMANDS_MAX_OBJECTIVE : COMMANDS_MAX_HINT));
			CHECK(text_ok(c->text));
		} else {
			CHECK(c->text == NULL);
		}
		if (c->kind == CMD_BUDGET)
			CHECK(c->usd_micro > 0 || c->tokens > 0);
		if (c->kind != CMD_BUDGET && c->kind != CMD_RESUME)
			CHECK(c->usd_micro == 0 && c->tokens == 0);
	}
	commands_result_release(&r);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct cmd_limits small = { 2, 5000000, 1000 };

	if (help == NULL) {
		struct cmd_result r;

		help = commands_help_markdown();
		CHECK(commands_parse(help, strlen(help), NULL, &r) == 0);
		CHECK(r.ncmds == 0 && r.error == NULL);
		commands_result_release(&r);
	}
	if (size > COMMANDS_MAX_BODY)
		return 0;
	check(data, size, NULL, CMD_LIMITS_DEFAULT_MAX_COMMANDS,
	    CMD_LIMITS_DEFAULT_MAX_USD_MICRO, CMD_LIMITS_DEFAULT_MAX_TOKENS);
	check(data, size, &small, 2, 5000000, 1000);
	return 0;
}

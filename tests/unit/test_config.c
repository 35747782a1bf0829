/*
 * Unit tests of the config module: defaults, a full file with every key,
 * one case per error with its exact "FILE:LINE: what" message, secrets,
 * durations, sizes and USD amounts.
 */
#include "config.h"

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config/config.h"
#include "util/util.h"

/* ---- helpers ---- */

static char *
data_path(const char *name)
{
	const char *top = getenv("top_srcdir");

	return xasprintf("%s/tests/data/config/%s", top ? top : ".", name);
}

/* Parse text that must be valid; fails the test with the cause if not. */
static void
parse_ok(struct config *c, const char *text)
{
	char *cause = NULL;

	if (config_parse(c, "t.yaml", text, strlen(text), &cause) != 0)
		fail_msg("unexpected error: %s", cause);
	assert_null(cause);
}

/*
 * Parse text that must fail with exactly msg, and check that the output
 * structure was not written.
 */
static void
parse_err_len(const char *text, size_t len, const char *msg)
{
	struct config c, saved;
	char *cause = NULL;

	memset(&c, 0xa5, sizeof(c));
	memcpy(&saved, &c, sizeof(c));
	assert_int_equal(config_parse(&c, "t.yaml", text, len, &cause), -1);
	assert_non_null(cause);
	assert_string_equal(cause, msg);
	assert_memory_equal(&c, &saved, sizeof(c));
	free(cause);
}

static void
parse_err(const char *text, const char *msg)
{
	parse_err_len(text, strlen(text), msg);
}

/* Write len bytes to a new temporary file; returns its path. */
static char *
temp_file(const void *data, size_t len)
{
	const char *dir = getenv("TMPDIR");
	char *path = xasprintf("%s/test_config.XXXXXX", dir ? dir : "/tmp");
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, len), (ssize_t)len);
	close(fd);
	return path;
}

/* ---- error cases, one cmocka test each ---- */

struct error_case {
	const char *name;
	const char *yaml;
	const char *msg;
};

static const struct error_case error_cases[] = {
	/* unknown and duplicate keys */
	{ "unknown top-level key", "lisen: 127.0.0.1:8080\n",
	  "t.yaml:1: unknown key 'lisen'" },
	{ "unknown nested key",
	  "github:\n  enabled: false\n  webhok_secrets: []\n",
	  "t.yaml:3: unknown key 'github.webhok_secrets'" },
	{ "unknown key three levels down", "github:\n  app:\n    idd: 1\n",
	  "t.yaml:3: unknown key 'github.app.idd'" },
	{ "unknown key in a repo rule",
	  "repos:\n  - match: a/*\n    namespace: x\n    nope: 1\n",
	  "t.yaml:4: unknown key 'repos[0].nope'" },
	{ "key names are case sensitive", "Listen: 127.0.0.1:8080\n",
	  "t.yaml:1: unknown key 'Listen'" },
	{ "duplicate top-level key",
	  "listen: 127.0.0.1:1\nstate_dir: /s\nlisten: 127.0.0.1:2\n",
	  "t.yaml:3: duplicate key 'listen'" },
	{ "duplicate key in a flow mapping",
	  "log: {level: info, level: debug}\n",
	  "t.yaml:1: duplicate key 'log.level'" },
	{ "duplicate section", "log: {}\nlog: {}\n",
	  "t.yaml:2: duplicate key 'log'" },
	{ "complex key", "? [a]\n: b\n",
	  "t.yaml:1: expected a scalar key, got a sequence" },
	{ "complex nested key", "log:\n  ? {a: b}\n  : c\n",
	  "t.yaml:2: 'log': expected a scalar key, got a mapping" },

	/* wrong types */
	{ "mapping where a scalar is expected", "listen: {host: a}\n",
	  "t.yaml:1: 'listen': expected a scalar, got a mapping" },
	{ "sequence where a mapping is expected", "github: [1]\n",
	  "t.yaml:1: 'github': expected a mapping, got a sequence" },
	{ "scalar where a mapping is expected", "log: text\n",
	  "t.yaml:1: 'log': expected a mapping, got 'text'" },
	{ "mapping where a sequence is expected", "repos: {match: x}\n",
	  "t.yaml:1: 'repos': expected a sequence, got a mapping" },
	{ "repo rule that is a scalar", "repos:\n  - github.com/a/*\n",
	  "t.yaml:2: 'repos[0]': expected a mapping, got 'github.com/a/*'" },
	{ "secret list given as a scalar hides it",
	  "github: {webhook_secrets: hunter2}\n",
	  "t.yaml:1: 'github.webhook_secrets': expected a sequence, "
	  "got a scalar" },
	{ "secret list item that is a mapping",
	  "github:\n  webhook_secrets:\n    - {a: b}\n",
	  "t.yaml:3: 'github.webhook_secrets[0]': expected a scalar, "
	  "got a mapping" },
	{ "top level sequence", "- a\n- b\n",
	  "t.yaml:1: expected a mapping at the top level, got a sequence" },
	{ "top level scalar", "hello\n",
	  "t.yaml:1: expected a mapping at the top level, got 'hello'" },

	/* bad values */
	{ "log.format xml", "log:\n  level: info\n  format: xml\n",
	  "t.yaml:3: 'log.format': expected text or json, got 'xml'" },
	{ "log.level", "log: {level: loud}\n",
	  "t.yaml:1: 'log.level': expected debug, info, warn or error, "
	  "got 'loud'" },
	{ "kubernetes.mode", "kubernetes:\n  mode: foo\n",
	  "t.yaml:2: 'kubernetes.mode': expected embedded, kubeconfig or "
	  "in-cluster, got 'foo'" },
	{ "leader election with the embedded store",
	  "kubernetes:\n  mode: embedded\n  leader_election:\n"
	  "    enabled: true\n",
	  "t.yaml:4: 'kubernetes.leader_election.enabled' is true but "
	  "'kubernetes.mode' is embedded: the embedded store has one daemon "
	  "by construction (its state directory is locked by the one process "
	  "that serves it), so there is nothing to elect; set kubernetes.mode "
	  "to kubeconfig or in-cluster, or leader_election.enabled to false" },
	{ "leader election by default with the embedded store",
	  "kubernetes: {leader_election: {enabled: true}}\n",
	  "t.yaml:1: 'kubernetes.leader_election.enabled' is true but "
	  "'kubernetes.mode' is embedded: the embedded store has one daemon "
	  "by construction (its state directory is locked by the one process "
	  "that serves it), so there is nothing to elect; set kubernetes.mode "
	  "to kubeconfig or in-cluster, or leader_election.enabled to false" },
	{ "lease_duration not above renew_deadline",
	  "kubernetes:\n  leader_election:\n    lease_duration: 10s\n",
	  "t.yaml:3: 'kubernetes.leader_election.lease_duration' (10s) must be "
	  "longer than 'kubernetes.leader_election.renew_deadline' (10s): a "
	  "leader gives up before its lease runs out" },
	{ "renew_deadline too close to retry_period",
	  "kubernetes:\n  leader_election:\n    renew_deadline: 2s\n"
	  "    retry_period: 1s700ms\n",
	  "t.yaml:4: 'kubernetes.leader_election.renew_deadline' (2s) must be "
	  "longer than 1.2 times 'kubernetes.leader_election.retry_period' "
	  "(1s700ms): a renewal is tried again within the deadline" },
	{ "lease_duration below a second",
	  "kubernetes:\n  leader_election: {lease_duration: 500ms}\n",
	  "t.yaml:2: 'kubernetes.leader_election.lease_duration': expected a "
	  "duration from 1s to 1h, got '500ms'" },
	{ "retry_period not a duration",
	  "kubernetes:\n  leader_election: {retry_period: 1.5s}\n",
	  "t.yaml:2: 'kubernetes.leader_election.retry_period': expected a "
	  "duration like 15s, 1s500ms or 250ms, got '1.5s'" },
	{ "lease_name not an object name",
	  "kubernetes:\n  leader_election: {lease_name: Diverged}\n",
	  "t.yaml:2: 'kubernetes.leader_election.lease_name': expected an "
	  "object name (lowercase letters, digits, '-' and '.', at most 253), "
	  "got 'Diverged'" },
	{ "listen without a port", "listen: 127.0.0.1\n",
	  "t.yaml:1: 'listen': expected host:port or [v6]:port, "
	  "got '127.0.0.1'" },
	{ "listen port out of range", "api:\n  listen: localhost:65536\n",
	  "t.yaml:2: 'api.listen': expected host:port or [v6]:port, "
	  "got 'localhost:65536'" },
	{ "listen with an unbracketed IPv6 address", "listen: ::1:8080\n",
	  "t.yaml:1: 'listen': expected host:port or [v6]:port, "
	  "got '::1:8080'" },
	{ "listen with an empty host", "listen: \":8080\"\n",
	  "t.yaml:1: 'listen': expected host:port or [v6]:port, "
	  "got ':8080'" },
	{ "listen with a bad IPv4 address", "listen: 300.1.1.1:80\n",
	  "t.yaml:1: 'listen': expected host:port or [v6]:port, "
	  "got '300.1.1.1:80'" },
	{ "listen with a bad IPv6 address", "listen: \"[::g]:80\"\n",
	  "t.yaml:1: 'listen': expected host:port or [v6]:port, "
	  "got '[::g]:80'" },
	{ "state_dir empty", "state_dir: \"\"\n",
	  "t.yaml:1: 'state_dir': must not be empty" },
	{ "namespace with capitals", "namespace: Default\n",
	  "t.yaml:1: 'namespace': expected a namespace name (lowercase "
	  "letters, digits and '-', at most 63), got 'Default'" },
	{ "long value is cut in the message",
	  "namespace: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaaaaaaaa\n",
	  "t.yaml:1: 'namespace': expected a namespace name (lowercase "
	  "letters, digits and '-', at most 63), got 'aaaaaaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...'" },
	{ "namespace of 64 bytes",
	  "namespace: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaaa\n",
	  "t.yaml:1: 'namespace': expected a namespace name (lowercase "
	  "letters, digits and '-', at most 63), got 'aaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa'" },
	{ "value cut before a UTF-8 sequence",
	  "namespace: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaa\xc3\xa9\xc3\xa9\n",
	  "t.yaml:1: 'namespace': expected a namespace name (lowercase "
	  "letters, digits and '-', at most 63), got 'aaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...'" },
	{ "DEL shown as '?'", "namespace: \"a\\x7fb\"\n",
	  "t.yaml:1: 'namespace': expected a namespace name (lowercase "
	  "letters, digits and '-', at most 63), got 'a?b'" },
	{ "lease_name of 254 bytes",
	  "kubernetes:\n  leader_election:\n    lease_name: aaaaaaaaaaa"
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "aaa\n",
	  "t.yaml:3: 'kubernetes.leader_election.lease_name': expected an "
	  "object name (lowercase letters, digits, '-' and '.', at most 253), "
	  "got 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	  "aaaaaaaaa...'" },
	{ "integer that overflows 64 bits",
	  "controller: {workers: 18446744073709551617}\n",
	  "t.yaml:1: 'controller.workers': expected an integer from 1 to 64, "
	  "got '18446744073709551617'" },
	{ "size that overflows 64 bits",
	  "http: {max_body_bytes: 17179869185GiB}\n",
	  "t.yaml:1: 'http.max_body_bytes': expected a size like 512KiB or "
	  "5MiB, got '17179869185GiB'" },
	{ "listen port of 6 digits", "listen: 127.0.0.1:000080\n",
	  "t.yaml:1: 'listen': expected host:port or [v6]:port, "
	  "got '127.0.0.1:000080'" },
	{ "listen host starting with '-'", "listen: -host:80\n",
	  "t.yaml:1: 'listen': expected host:port or [v6]:port, "
	  "got '-host:80'" },
	{ "meter.public_url with an empty host",
	  "meter: {public_url: \"https:///x\"}\n",
	  "t.yaml:1: 'meter.public_url': expected an http:// or https:// "
	  "URL, got 'https:///x'" },
	{ "renew_deadline exactly 1.2 times retry_period",
	  "kubernetes:\n  leader_election:\n    renew_deadline: 12s\n"
	  "    retry_period: 10s\n",
	  "t.yaml:4: 'kubernetes.leader_election.renew_deadline' (12s) must be "
	  "longer than 1.2 times 'kubernetes.leader_election.retry_period' "
	  "(10s): a renewal is tried again within the deadline" },
	{ "repo rule namespace",
	  "repos:\n  - {match: a/*, namespace: Team_A}\n",
	  "t.yaml:2: 'repos[0].namespace': expected a namespace name "
	  "(lowercase letters, digits and '-', at most 63), got 'Team_A'" },
	{ "repo rule without namespace",
	  "repos:\n  - {match: \"github.com/a/*\", namespace: a}\n"
	  "  - match: x/*\n",
	  "t.yaml:3: 'repos[1]': missing 'namespace'" },
	{ "repo rule without match", "repos:\n  -\n    namespace: a\n",
	  "t.yaml:3: 'repos[0]': missing 'match'" },
	{ "repo rule match with a space", "repos: [{match: \"a b\", "
	  "namespace: a}]\n",
	  "t.yaml:1: 'repos[0].match': expected a pattern like "
	  "github.com/org/*, got 'a b'" },
	/* repo_allowlist: a sequence of globs like repos[].match */
	{ "repo_allowlist as a scalar",
	  "github:\n  enabled: false\nrepo_allowlist: github.com/a/*\n",
	  "t.yaml:3: 'repo_allowlist': expected a sequence, got "
	  "'github.com/a/*'" },
	{ "repo_allowlist as a mapping", "repo_allowlist: {match: a/*}\n",
	  "t.yaml:1: 'repo_allowlist': expected a sequence, got a mapping" },
	{ "repo_allowlist entry that is a mapping",
	  "repo_allowlist:\n  - github.com/a/*\n  - {match: b/*}\n",
	  "t.yaml:3: 'repo_allowlist[1]': expected a scalar, got a mapping" },
	{ "repo_allowlist entry that is a sequence",
	  "repo_allowlist: [[github.com/a/*]]\n",
	  "t.yaml:1: 'repo_allowlist[0]': expected a scalar, got a sequence" },
	{ "repo_allowlist entry empty",
	  "repo_allowlist:\n  - github.com/a/*\n  - \"\"\n",
	  "t.yaml:3: 'repo_allowlist[1]': expected a pattern like "
	  "github.com/org/*, got ''" },
	{ "repo_allowlist entry null",
	  "repo_allowlist:\n  - github.com/a/*\n  - ~\n",
	  "t.yaml:3: 'repo_allowlist[1]': expected a pattern like "
	  "github.com/org/*, got '~'" },
	{ "repo_allowlist entry left blank",
	  "repo_allowlist:\n  -\n  - github.com/a/*\n",
	  "t.yaml:2: 'repo_allowlist[0]': expected a pattern like "
	  "github.com/org/*, got ''" },
	{ "repo_allowlist entry with a space",
	  "\nrepo_allowlist: [\"github.com/a b/*\"]\n",
	  "t.yaml:2: 'repo_allowlist[0]': expected a pattern like "
	  "github.com/org/*, got 'github.com/a b/*'" },
	{ "repo_allowlist entry with a control character",
	  "repo_allowlist:\n  - \"github.com/a\\tb\"\n",
	  "t.yaml:2: 'repo_allowlist[0]': expected a pattern like "
	  "github.com/org/*, got 'github.com/a?b'" },
	{ "repo_allowlist twice",
	  "repo_allowlist: [a/*]\nrepo_allowlist: [b/*]\n",
	  "t.yaml:2: duplicate key 'repo_allowlist'" },
	{ "controller.workers zero", "controller: {workers: 0}\n",
	  "t.yaml:1: 'controller.workers': expected an integer from 1 to "
	  "64, got '0'" },
	{ "controller.workers too many", "controller:\n  workers: 65\n",
	  "t.yaml:2: 'controller.workers': expected an integer from 1 to "
	  "64, got '65'" },
	{ "controller.workers negative", "controller:\n  workers: -1\n",
	  "t.yaml:2: 'controller.workers': expected an integer from 1 to "
	  "64, got '-1'" },
	{ "controller.workers text", "controller:\n  workers: four\n",
	  "t.yaml:2: 'controller.workers': expected an integer from 1 to "
	  "64, got 'four'" },
	{ "controller.max_active_tasks negative",
	  "controller:\n  max_active_tasks: -1\n",
	  "t.yaml:2: 'controller.max_active_tasks': expected an integer from "
	  "0 to 100000, got '-1'" },
	{ "controller.max_active_tasks too many",
	  "controller: {max_active_tasks: 100001}\n",
	  "t.yaml:1: 'controller.max_active_tasks': expected an integer from "
	  "0 to 100000, got '100001'" },
	{ "controller.max_active_tasks text",
	  "controller:\n  workers: 2\n  max_active_tasks: ten\n",
	  "t.yaml:3: 'controller.max_active_tasks': expected an integer from "
	  "0 to 100000, got 'ten'" },
	{ "controller.max_active_tasks a list",
	  "controller: {max_active_tasks: [2]}\n",
	  "t.yaml:1: 'controller.max_active_tasks': expected a scalar, got a "
	  "sequence" },
	{ "integer with a fraction", "http: {threads: 2.5}\n",
	  "t.yaml:1: 'http.threads': expected an integer from 1 to 256, "
	  "got '2.5'" },
	{ "defaults.budgetTokens negative", "defaults:\n  budgetTokens: -5\n",
	  "t.yaml:2: 'defaults.budgetTokens': expected an integer from 0 to "
	  "1000000000000, got '-5'" },
	{ "defaults.maxIterations zero", "defaults: {maxIterations: 0}\n",
	  "t.yaml:1: 'defaults.maxIterations': expected an integer from 1 "
	  "to 1000, got '0'" },
	{ "defaults.timeoutSeconds zero", "defaults: {timeoutSeconds: 0}\n",
	  "t.yaml:1: 'defaults.timeoutSeconds': expected an integer from 1 "
	  "to 604800, got '0'" },
	{ "defaults.budgetUSD with 7 decimals",
	  "defaults: {budgetUSD: \"5.0000001\"}\n",
	  "t.yaml:1: 'defaults.budgetUSD': expected a USD amount like 5.00 "
	  "(at most 6 decimals), got '5.0000001'" },
	{ "defaults.budgetUSD negative", "defaults:\n  budgetUSD: -5.00\n",
	  "t.yaml:2: 'defaults.budgetUSD': expected a USD amount like 5.00 "
	  "(at most 6 decimals), got '-5.00'" },
	{ "defaults.budgetUSD too large",
	  "defaults:\n  budgetUSD: \"1000000.01\"\n",
	  "t.yaml:2: 'defaults.budgetUSD': expected a USD amount from 0 to "
	  "1000000, got '1000000.01'" },
	{ "commands.max_bump_usd text", "commands: {max_bump_usd: lots}\n",
	  "t.yaml:1: 'commands.max_bump_usd': expected a USD amount like "
	  "5.00 (at most 6 decimals), got 'lots'" },
	{ "commands.max_per_comment", "commands: {max_per_comment: 101}\n",
	  "t.yaml:1: 'commands.max_per_comment': expected an integer from 1 "
	  "to 100, got '101'" },
	{ "commands.max_bump_tokens", "commands: {max_bump_tokens: -1}\n",
	  "t.yaml:1: 'commands.max_bump_tokens': expected an integer from 0 "
	  "to 1000000000000, got '-1'" },
	{ "capability with an inner star",
	  "defaults: {capabilities: [\"claude-*-x\"]}\n",
	  "t.yaml:1: 'defaults.capabilities[0]': expected a model name or a "
	  "prefix* pattern, got 'claude-*-x'" },
	{ "capability that is a sequence",
	  "defaults:\n  capabilities:\n    - gpt-4o\n    - [a]\n",
	  "t.yaml:4: 'defaults.capabilities[1]': expected a scalar, "
	  "got a sequence" },
	{ "preview.url_template without {env}",
	  "preview:\n  url_template: https://p.example.com/\n",
	  "t.yaml:2: 'preview.url_template': must contain {env}, "
	  "got 'https://p.example.com/'" },
	{ "preview.url_template not a URL",
	  "preview: {url_template: \"p.example.com/{env}\"}\n",
	  "t.yaml:1: 'preview.url_template': expected an http:// or https:// "
	  "URL, got 'p.example.com/{env}'" },
	{ "meter.public_url", "meter: {public_url: \"ftp://x\"}\n",
	  "t.yaml:1: 'meter.public_url': expected an http:// or https:// "
	  "URL, got 'ftp://x'" },
	{ "github.api_url without host",
	  "github:\n  api_url: https://\n",
	  "t.yaml:2: 'github.api_url': expected an http:// or https:// URL, "
	  "got 'https://'" },
	{ "bool", "github: {allow_forks: maybe}\n",
	  "t.yaml:1: 'github.allow_forks': expected true or false, "
	  "got 'maybe'" },
	{ "sandbox.uid root", "sandbox: {uid: 0}\n",
	  "t.yaml:1: 'sandbox.uid': expected an integer from 1 to "
	  "4294967294, got '0'" },
	{ "sandbox.workspace_size", "sandbox: {workspace_size: lots}\n",
	  "t.yaml:1: 'sandbox.workspace_size': expected a Kubernetes "
	  "quantity like 5Gi, got 'lots'" },
	{ "sandbox.warm_pool", "sandbox: {warm_pool: 2000}\n",
	  "t.yaml:1: 'sandbox.warm_pool': expected an integer from 0 to "
	  "1024, got '2000'" },
	{ "sandbox.audit_window bad unit", "sandbox: {audit_window: 1y}\n",
	  "t.yaml:1: 'sandbox.audit_window': expected a duration like 30s, "
	  "15m, 24h, 7d or 1h30m, got '1y'" },
	{ "controller.ttl_after_finished bad unit",
	  "controller:\n  ttl_after_finished: soon\n",
	  "t.yaml:2: 'controller.ttl_after_finished': expected a duration like "
	  "30s, 15m, 24h, 7d or 1h30m, got 'soon'" },
	{ "controller.ttl_after_finished too long",
	  "controller: {ttl_after_finished: 3651d}\n",
	  "t.yaml:1: 'controller.ttl_after_finished': expected a duration from "
	  "0s to 3650d, got '3651d'" },
	{ "controller.ttl_after_finished under the default audit window",
	  "controller:\n  workers: 2\n  ttl_after_finished: 1h\n",
	  "t.yaml:3: 'controller.ttl_after_finished' (1h) is shorter than "
	  "'sandbox.audit_window' (1d): deleting a finished task deletes its "
	  "Sandbox, which the audit window keeps" },
	{ "controller.ttl_after_finished under an hour",
	  "sandbox: {audit_window: 0s}\ncontroller:\n"
	  "  ttl_after_finished: 59m\n",
	  "t.yaml:3: 'controller.ttl_after_finished' is 0s (keep) or at least "
	  "1h: the pull request's comment reports the end of a task after it, "
	  "and a task deleted first leaves it at its last phase" },
	{ "controller.ttl_after_finished under a longer audit window",
	  "controller: {ttl_after_finished: 2d}\nsandbox:\n  uid: 1000\n"
	  "  audit_window: 2d1h\n",
	  "t.yaml:1: 'controller.ttl_after_finished' (2d) is shorter than "
	  "'sandbox.audit_window' (2d1h): deleting a finished task deletes "
	  "its Sandbox, which the audit window keeps" },
	{ "sandbox.audit_window too long",
	  "sandbox: {audit_window: 366d}\n",
	  "t.yaml:1: 'sandbox.audit_window': expected a duration from 0s to "
	  "365d, got '366d'" },
	{ "http.connection_timeout too long",
	  "http: {connection_timeout: 2h}\n",
	  "t.yaml:1: 'http.connection_timeout': expected a duration from 1s "
	  "to 1h, got '2h'" },
	{ "http.request_timeout zero",
	  "http:\n  request_timeout: 0s\n",
	  "t.yaml:2: 'http.request_timeout': expected a duration from 1s "
	  "to 1h, got '0s'" },
	{ "shutdown_timeout negative", "shutdown_timeout: -1\n",
	  "t.yaml:1: 'shutdown_timeout': expected a duration like 30s, 15m, "
	  "24h, 7d or 1h30m, got '-1'" },
	{ "inbox.retention units out of order",
	  "inbox:\n  retention: 30m1h\n",
	  "t.yaml:2: 'inbox.retention': expected a duration like 30s, 15m, "
	  "24h, 7d or 1h30m, got '30m1h'" },
	{ "http.max_body_bytes decimal unit",
	  "http: {max_body_bytes: 5MB}\n",
	  "t.yaml:1: 'http.max_body_bytes': expected a size like 512KiB or "
	  "5MiB, got '5MB'" },
	{ "http.max_header_bytes too large",
	  "http: {max_header_bytes: 2MiB}\n",
	  "t.yaml:1: 'http.max_header_bytes': expected a size from 1KiB to "
	  "1MiB, got '2MiB'" },
	{ "http.max_body_bytes too small", "http: {max_body_bytes: 100}\n",
	  "t.yaml:1: 'http.max_body_bytes': expected a size from 1KiB to "
	  "1GiB, got '100'" },
	{ "http.max_connections", "http: {max_connections: 70000}\n",
	  "t.yaml:1: 'http.max_connections': expected an integer from 1 to "
	  "65536, got '70000'" },
	{ "http.max_connections_per_ip", "http: {max_connections_per_ip: -1}\n",
	  "t.yaml:1: 'http.max_connections_per_ip': expected an integer from "
	  "0 to 65536, got '-1'" },
	{ "inbox.capacity zero", "inbox: {capacity: 0}\n",
	  "t.yaml:1: 'inbox.capacity': expected an integer from 1 to "
	  "1000000000, got '0'" },
	{ "inbox.workers", "inbox: {workers: 65}\n",
	  "t.yaml:1: 'inbox.workers': expected an integer from 1 to 64, "
	  "got '65'" },
	{ "inbox.max_attempts", "inbox: {max_attempts: 0}\n",
	  "t.yaml:1: 'inbox.max_attempts': expected an integer from 1 to "
	  "1000, got '0'" },

	/* secrets */
	{ "github.token literal", "github:\n  token: ghp_abcdef\n",
	  "t.yaml:2: 'github.token': secrets must be written as file:/path "
	  "or env:NAME, not inline" },
	{ "webhook secret literal",
	  "github:\n  webhook_secrets:\n    - file:/a\n    - hunter2\n",
	  "t.yaml:4: 'github.webhook_secrets[1]': secrets must be written as "
	  "file:/path or env:NAME, not inline" },
	{ "gitlab.signing_token literal",
	  "gitlab: {signing_token: whsec_abc}\n",
	  "t.yaml:1: 'gitlab.signing_token': secrets must be written as "
	  "file:/path or env:NAME, not inline" },
	{ "gitlab.token literal", "gitlab:\n\n  token: glpat-x\n",
	  "t.yaml:3: 'gitlab.token': secrets must be written as file:/path "
	  "or env:NAME, not inline" },
	{ "api.token literal", "api: {token: s3cret}\n",
	  "t.yaml:1: 'api.token': secrets must be written as file:/path or "
	  "env:NAME, not inline" },
	{ "github.app.private_key literal",
	  "github:\n  app:\n    id: 1\n    private_key: \"-----BEGIN\"\n",
	  "t.yaml:4: 'github.app.private_key': secrets must be written as "
	  "file:/path or env:NAME, not inline" },
	{ "gitlab webhook token empty item",
	  "gitlab: {webhook_tokens: [\"\"]}\n",
	  "t.yaml:1: 'gitlab.webhook_tokens[0]': empty secret reference" },
	{ "gitlab webhook token null item",
	  "gitlab:\n  webhook_tokens:\n    - env:A\n    -\n",
	  "t.yaml:4: 'gitlab.webhook_tokens[1]': empty secret reference" },
	{ "env: with a bad name", "api: {token: \"env:1X\"}\n",
	  "t.yaml:1: 'api.token': env: needs a variable name (letters, "
	  "digits and _)" },
	{ "file: without a path",
	  "github:\n  app: {id: 1, private_key: \"file:\"}\n",
	  "t.yaml:2: 'github.app.private_key': file: needs a path" },
	{ "secret given as a mapping", "github: {token: {file: /x}}\n",
	  "t.yaml:1: 'github.token': expected a scalar, got a mapping" },

	/* cross-key rules */
	{ "github enabled without webhook secrets",
	  "github:\n  api_url: https://ghe.example.com/api/v3\n"
	  "  enabled: true\n",
	  "t.yaml:3: 'github.enabled' is true but 'github.webhook_secrets' "
	  "is empty" },
	{ "github enabled with an empty list",
	  "github: {enabled: yes, webhook_secrets: []}\n",
	  "t.yaml:1: 'github.enabled' is true but 'github.webhook_secrets' "
	  "is empty" },
	{ "gitlab enabled without tokens",
	  "gitlab:\n  token: env:GL\n  enabled: true\n  signing_token: \"\"\n",
	  "t.yaml:3: 'gitlab.enabled' is true but 'gitlab.webhook_tokens' "
	  "and 'gitlab.signing_token' are empty" },
	{ "api off loopback without TLS", "api:\n  listen: 0.0.0.0:8081\n",
	  "t.yaml:2: 'api.listen' is not a loopback address but "
	  "'api.tls_cert' is not set" },
	{ "api off loopback without a token",
	  "api:\n  tls_cert: /c\n  listen: \"[::]:8081\"\n  tls_key: /k\n",
	  "t.yaml:3: 'api.listen' is not a loopback address but 'api.token' "
	  "is not set" },
	{ "api tls_cert without tls_key", "api: {tls_cert: /c}\n",
	  "t.yaml:1: 'api.tls_cert' is set but 'api.tls_key' is not" },
	{ "api tls_key without tls_cert", "\napi: {tls_key: /k}\n",
	  "t.yaml:2: 'api.tls_key' is set but 'api.tls_cert' is not" },
	{ "github app id without a key", "github:\n  app:\n    id: 12345\n",
	  "t.yaml:3: 'github.app.id' is set but 'github.app.private_key' is "
	  "not" },
	{ "github app key without an id",
	  "github:\n  app:\n    private_key: env:K\n",
	  "t.yaml:3: 'github.app.private_key' is set but 'github.app.id' is "
	  "not" },

	/* YAML syntax and structure */
	{ "unclosed flow sequence", "defaults:\n  capabilities: [a, b\n",
	  "t.yaml:3: syntax error: did not find expected ',' or ']' "
	  "while parsing a flow sequence" },
	{ "tab indentation", "log:\n\tlevel: info\n",
	  "t.yaml:2: syntax error: found character that cannot start any "
	  "token while scanning for the next token" },
	{ "bad indentation", "log:\n  level: info\n format: json\n",
	  "t.yaml:3: syntax error: did not find expected key while parsing "
	  "a block mapping" },
	{ "unterminated quote", "listen: \"127.0.0.1:8080\n",
	  "t.yaml:2: syntax error: found unexpected end of stream while "
	  "scanning a quoted scalar" },
	{ "invalid UTF-8", "listen: \"\xff\"\n",
	  "t.yaml:1: syntax error: invalid leading UTF-8 octet" },
	{ "control character", "log:\n  level: \x01\n",
	  "t.yaml:2: syntax error: control characters are not allowed" },
	{ "multiple documents",
	  "listen: 127.0.0.1:1\n---\nlisten: 127.0.0.1:2\n",
	  "t.yaml:2: multiple documents are not supported" },
	{ "alias", "log: &l {level: info}\nstate_dir: *l\n",
	  "t.yaml:2: aliases are not supported" },
	{ "nesting deeper than 16",
	  "x: [[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]\n",
	  "t.yaml:1: nesting deeper than 16 levels" },
};

static void
test_error_case(void **state)
{
	const struct error_case *ec = *state;

	parse_err(ec->yaml, ec->msg);
}

/* ---- bounds, built programmatically ---- */

static void
test_bound_sequence(void **state)
{
	struct buf b;
	struct config c;
	char *msg;
	int i;

	(void)state;
	buf_init(&b, 1 << 20);
	buf_addstr(&b, "defaults:\n  capabilities:\n");
	for (i = 0; i < 1024; i++)
		buf_addstr(&b, "    - m\n");
	parse_ok(&c, b.data);		/* 1024 items are fine */
	assert_int_equal(c.defaults.capabilities.n, 1024);
	config_release(&c);
	buf_addstr(&b, "    - m\n");
	msg = xasprintf("t.yaml:%d: sequence longer than 1024 items",
	    2 + 1025);
	parse_err(b.data, msg);
	free(msg);
	buf_release(&b);
}

static void
test_bound_mapping(void **state)
{
	struct buf b;
	int i;

	(void)state;
	buf_init(&b, 1 << 20);
	for (i = 0; i < 1025; i++)
		buf_printf(&b, "k%d: 1\n", i);
	parse_err(b.data, "t.yaml:1025: mapping with more than 1024 keys");
	buf_release(&b);
}

static void
test_bound_nesting(void **state)
{
	struct config c;

	(void)state;
	/* the top mapping and 15 sequences: 16 levels */
	parse_err("x: [[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]\n",
	    "t.yaml:1: unknown key 'x'");
	parse_err("\n\nx:\n - - - - - - - - - - - - - - - - 1\n",
	    "t.yaml:4: nesting deeper than 16 levels");
	parse_ok(&c, "repos:\n- {match: a, namespace: b}\n");
	config_release(&c);
}

static void
test_bound_scalar(void **state)
{
	struct buf b;
	struct config c;
	size_t i;

	(void)state;
	buf_init(&b, 1 << 20);
	buf_addstr(&b, "sandbox:\n  image: ");
	for (i = 0; i < 64 * 1024; i++)
		buf_addstr(&b, "a");
	buf_addstr(&b, "\n");
	parse_ok(&c, b.data);		/* exactly 64 KiB is fine */
	assert_int_equal(strlen(c.sandbox.image), 64 * 1024);
	config_release(&c);
	buf_reset(&b);
	buf_addstr(&b, "\nsandbox:\n  image: ");
	for (i = 0; i < 64 * 1024 + 1; i++)
		buf_addstr(&b, "a");
	buf_addstr(&b, "\n");
	parse_err(b.data, "t.yaml:3: scalar longer than 64 KiB");
	buf_release(&b);
}

static void
test_bound_file(void **state)
{
	struct buf b;
	struct config c;
	char *msg;

	(void)state;
	buf_init(&b, 2 << 20);
	/* 16-byte lines: 65536 of them are exactly 1 MiB */
	while (b.len < (1 << 20))
		buf_addstr(&b, "# comment line\n\n");
	parse_ok(&c, b.data);
	config_release(&c);
	buf_addstr(&b, "x");
	msg = xasprintf("t.yaml:%d: file larger than 1 MiB", 2 * 65536 + 1);
	parse_err(b.data, msg);
	free(msg);
	buf_release(&b);
}

static void
test_nul_in_scalar(void **state)
{
	(void)state;
	parse_err("sandbox: {image: \"a\\0b\"}\n",
	    "t.yaml:1: NUL byte in a scalar");
	/* a raw NUL byte in the text is a reader error */
	parse_err_len("listen: a\0b\n", 12,
	    "t.yaml:1: syntax error: control characters are not allowed");
}

/* ---- valid files ---- */

static void
check_defaults(const struct config *c)
{
	assert_string_equal(c->listen, "127.0.0.1:8080");
	assert_string_equal(c->state_dir, "./diverge-state");
	assert_string_equal(c->api.listen, "127.0.0.1:8081");
	assert_null(c->api.tls_cert);
	assert_null(c->api.tls_key);
	assert_null(c->api.token);
	assert_int_equal(c->log.level, LOG_INFO);
	assert_int_equal(c->log.json, 0);
	assert_int_equal(c->kubernetes.mode, KUBE_EMBEDDED);
	assert_string_equal(c->kubernetes.kubeconfig, "");
	assert_string_equal(c->kubernetes.context, "");
	assert_int_equal(c->kubernetes.leader_election.enabled, 0);
	assert_string_equal(c->kubernetes.leader_election.lease_name,
	    "diverged");
	assert_null(c->kubernetes.leader_election.namespace);
	assert_int_equal(c->kubernetes.leader_election.lease_duration_ms,
	    15000);
	assert_int_equal(c->kubernetes.leader_election.renew_deadline_ms,
	    10000);
	assert_int_equal(c->kubernetes.leader_election.retry_period_ms, 2000);
	assert_string_equal(c->namespace, "default");
	assert_string_equal(c->controller.namespace, "diverge-system");
	assert_int_equal(c->controller.workers, 4);
	assert_int_equal(c->controller.max_active_tasks, 0);
	assert_int_equal(c->controller.ttl_after_finished_s, 0);
	assert_string_equal(c->meter.public_url, "http://127.0.0.1:8080");
	assert_int_equal(c->github.enabled, 0);
	assert_string_equal(c->github.api_url, "https://api.github.com");
	assert_int_equal(c->github.webhook_secrets.n, 0);
	assert_null(c->github.token);
	assert_null(c->github.app.id);
	assert_null(c->github.app.private_key);
	assert_null(c->github.app.slug);
	assert_int_equal(c->github.allow_forks, 0);
	assert_null(c->github.ca_file);
	assert_int_equal(c->gitlab.enabled, 0);
	assert_string_equal(c->gitlab.api_url, "https://gitlab.com/api/v4");
	assert_int_equal(c->gitlab.webhook_tokens.n, 0);
	assert_null(c->gitlab.signing_token);
	assert_null(c->gitlab.token);
	assert_int_equal(c->gitlab.allow_forks, 0);
	assert_null(c->gitlab.ca_file);
	assert_null(c->repos);
	assert_int_equal(c->nrepos, 0);
	assert_null(c->repo_allowlist.v);
	assert_int_equal(c->repo_allowlist.n, 0);
	assert_int_equal(c->defaults.capabilities.n, 0);
	assert_int_equal(c->defaults.budget_usd_micro, 5000000);
	assert_int_equal(c->defaults.budget_tokens, 1000000);
	assert_int_equal(c->defaults.max_iterations, 5);
	assert_int_equal(c->defaults.timeout_seconds, 3600);
	assert_string_equal(c->sandbox.image,
	    "ghcr.io/divergedev/agent-runner:latest");
	assert_string_equal(c->sandbox.runtime_class, "");
	assert_int_equal(c->sandbox.uid, 64000);
	assert_string_equal(c->sandbox.workspace_size, "5Gi");
	assert_int_equal(c->sandbox.network_policy, 1);
	assert_int_equal(c->sandbox.audit_window_s, 86400);
	assert_int_equal(c->sandbox.warm_pool, 0);
	assert_null(c->preview.url_template);
	assert_int_equal(c->http.max_body_bytes, 5 * 1024 * 1024);
	assert_int_equal(c->http.max_connections, 1024);
	assert_int_equal(c->http.max_connections_per_ip, 0);
	assert_int_equal(c->http.connection_timeout_s, 30);
	assert_int_equal(c->http.request_timeout_s, 30);
	assert_int_equal(c->http.threads, 4);
	assert_int_equal(c->http.max_header_bytes, 32 * 1024);
	assert_int_equal(c->inbox.capacity, 1000000);
	assert_int_equal(c->inbox.workers, 2);
	assert_int_equal(c->inbox.max_attempts, 8);
	assert_int_equal(c->inbox.retention_s, 7 * 86400);
	assert_int_equal(c->commands.max_per_comment, 5);
	assert_int_equal(c->commands.max_bump_usd_micro, INT64_C(1000000000));
	assert_int_equal(c->commands.max_bump_tokens, 100000000);
	assert_int_equal(c->shutdown_timeout_s, 30);
}

static void
test_defaults(void **state)
{
	struct config c;

	(void)state;
	config_defaults(&c);
	assert_null(c.file);
	check_defaults(&c);
	config_release(&c);
}

/* Files without any key give the defaults. */
static void
test_empty_files(void **state)
{
	static const char *const texts[] = {
		"", "\n\n", "# only a comment\n", "---\n", "--- ~\n",
		"null\n", "{}\n", "---\n...\n", "%YAML 1.1\n---\n",
	};
	struct config c;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(texts); i++) {
		parse_ok(&c, texts[i]);
		assert_string_equal(c.file, "t.yaml");
		check_defaults(&c);
		config_release(&c);
	}
	/* a NULL text of length 0 too */
	assert_int_equal(config_parse(&c, "t.yaml", NULL, 0, NULL), 0);
	check_defaults(&c);
	config_release(&c);
}

/* A key written with no value (or ~, null) keeps its default. */
static void
test_null_values(void **state)
{
	struct config c;

	(void)state;
	parse_ok(&c, "listen:\nlog: ~\ngithub:\n  token: null\n"
	    "  webhook_secrets:\nrepos: ~\nrepo_allowlist:\nsandbox:\n"
	    "  uid: ~\n"
	    "kubernetes: {context: }\n");
	check_defaults(&c);
	config_release(&c);
}

static void
check_full(const struct config *c)
{
	assert_string_equal(c->listen, "0.0.0.0:9090");
	assert_string_equal(c->state_dir, "/var/lib/diverge");
	assert_string_equal(c->api.listen, "[::]:8443");
	assert_string_equal(c->api.tls_cert, "/etc/diverge/tls.crt");
	assert_string_equal(c->api.tls_key, "/etc/diverge/tls.key");
	assert_string_equal(c->api.token, "env:DIVERGE_API_TOKEN");
	assert_int_equal(c->log.level, LOG_DEBUG);
	assert_int_equal(c->log.json, 1);
	assert_int_equal(c->kubernetes.mode, KUBE_KUBECONFIG);
	assert_string_equal(c->kubernetes.kubeconfig, "/home/op/.kube/config");
	assert_string_equal(c->kubernetes.context, "prod");
	assert_int_equal(c->kubernetes.leader_election.enabled, 1);
	assert_string_equal(c->kubernetes.leader_election.lease_name,
	    "diverged-prod");
	assert_string_equal(c->kubernetes.leader_election.namespace,
	    "diverge-leases");
	assert_int_equal(c->kubernetes.leader_election.lease_duration_ms,
	    20000);
	assert_int_equal(c->kubernetes.leader_election.renew_deadline_ms,
	    12500);
	assert_int_equal(c->kubernetes.leader_election.retry_period_ms, 3000);
	assert_string_equal(c->namespace, "agents");
	assert_string_equal(c->controller.namespace, "diverge");
	assert_int_equal(c->controller.workers, 8);
	assert_int_equal(c->controller.max_active_tasks, 20);
	assert_int_equal(c->controller.ttl_after_finished_s, 30 * 86400);
	assert_string_equal(c->meter.public_url,
	    "https://diverge.example.com");
	assert_int_equal(c->github.enabled, 1);
	assert_string_equal(c->github.api_url,
	    "https://ghe.example.com/api/v3");
	assert_int_equal(c->github.webhook_secrets.n, 2);
	assert_string_equal(c->github.webhook_secrets.v[0],
	    "file:/etc/diverge/github-webhook-secret");
	assert_string_equal(c->github.webhook_secrets.v[1],
	    "env:GITHUB_WEBHOOK_SECRET_OLD");
	assert_string_equal(c->github.token, "file:/etc/diverge/github-token");
	assert_string_equal(c->github.app.id, "123456");
	assert_string_equal(c->github.app.private_key,
	    "file:/etc/diverge/app.pem");
	assert_string_equal(c->github.app.slug, "diverge-bot");
	assert_int_equal(c->github.allow_forks, 1);
	assert_string_equal(c->github.ca_file, "/etc/ssl/ghe-ca.pem");
	assert_int_equal(c->gitlab.enabled, 1);
	assert_string_equal(c->gitlab.api_url,
	    "https://gitlab.example.com/api/v4");
	assert_int_equal(c->gitlab.webhook_tokens.n, 1);
	assert_string_equal(c->gitlab.webhook_tokens.v[0],
	    "env:GITLAB_WEBHOOK_TOKEN");
	assert_string_equal(c->gitlab.signing_token,
	    "file:/etc/diverge/gitlab-signing");
	assert_string_equal(c->gitlab.token, "file:/etc/diverge/gitlab-token");
	assert_int_equal(c->gitlab.allow_forks, 0);
	assert_string_equal(c->gitlab.ca_file, "/etc/ssl/gitlab-ca.pem");
	assert_int_equal(c->nrepos, 2);
	assert_string_equal(c->repos[0].match, "github.com/myorg/*");
	assert_string_equal(c->repos[0].namespace, "team-a");
	assert_string_equal(c->repos[1].match, "gitlab.example.com/*");
	assert_string_equal(c->repos[1].namespace, "team-b");
	assert_int_equal(c->repo_allowlist.n, 2);
	assert_string_equal(c->repo_allowlist.v[0], "github.com/myorg/*");
	assert_string_equal(c->repo_allowlist.v[1],
	    "gitlab.example.com/Platform/*");
	assert_int_equal(c->defaults.capabilities.n, 2);
	assert_string_equal(c->defaults.capabilities.v[0], "claude-*");
	assert_string_equal(c->defaults.capabilities.v[1], "gpt-4o");
	assert_int_equal(c->defaults.budget_usd_micro, 12500000);
	assert_int_equal(c->defaults.budget_tokens, 2000000);
	assert_int_equal(c->defaults.max_iterations, 8);
	assert_int_equal(c->defaults.timeout_seconds, 7200);
	assert_string_equal(c->sandbox.image,
	    "registry.example.com/runner:1.2");
	assert_string_equal(c->sandbox.runtime_class, "gvisor");
	assert_int_equal(c->sandbox.uid, 65000);
	assert_string_equal(c->sandbox.workspace_size, "10Gi");
	assert_int_equal(c->sandbox.network_policy, 0);
	assert_int_equal(c->sandbox.audit_window_s, 12 * 3600);
	assert_int_equal(c->sandbox.warm_pool, 3);
	assert_string_equal(c->preview.url_template,
	    "https://preview.example.com/?_diverge_env={env}");
	assert_int_equal(c->http.max_body_bytes, 10 * 1024 * 1024);
	assert_int_equal(c->http.max_connections, 2048);
	assert_int_equal(c->http.max_connections_per_ip, 32);
	assert_int_equal(c->http.connection_timeout_s, 90);
	assert_int_equal(c->http.threads, 8);
	assert_int_equal(c->http.max_header_bytes, 64 * 1024);
	assert_int_equal(c->inbox.capacity, 5000);
	assert_int_equal(c->inbox.workers, 4);
	assert_int_equal(c->inbox.max_attempts, 10);
	assert_int_equal(c->inbox.retention_s, 3 * 86400);
	assert_int_equal(c->commands.max_per_comment, 3);
	assert_int_equal(c->commands.max_bump_usd_micro, 250500000);
	assert_int_equal(c->commands.max_bump_tokens, 5000000);
	assert_int_equal(c->shutdown_timeout_s, 150);
}

static void
test_full_file(void **state)
{
	struct config c;
	char *path = data_path("full.yaml"), *cause = NULL;

	(void)state;
	if (config_load(&c, path, &cause) != 0)
		fail_msg("%s", cause);
	assert_string_equal(c.file, path);
	check_full(&c);
	assert_int_equal(c.repos[0].line, 73);
	assert_int_equal(c.repos[1].line, 75);
	config_release(&c);
	free(path);
}

/* full.yaml with each from[i] replaced by to[i], parsed. */
static void
parse_full_with(struct config *c, const char *const *from,
    const char *const *to, size_t n)
{
	char *path = data_path("full.yaml"), *text, *at, *next;
	FILE *f = fopen(path, "r");
	size_t len, i;

	assert_non_null(f);
	text = xcalloc(1, 1 << 16);
	len = fread(text, 1, (1 << 16) - 1, f);
	assert_true(len > 0 && len < (1 << 16) - 1);
	fclose(f);
	for (i = 0; i < n; i++) {
		at = strstr(text, from[i]);
		if (at == NULL)
			fail_msg("full.yaml has no '%s'", from[i]);
		next = xasprintf("%.*s%s%s", (int)(at - text), text, to[i],
		    at + strlen(from[i]));
		free(text);
		text = next;
	}
	parse_ok(c, text);
	free(text);
	free(path);
}

/*
 * SIGHUP: the keys a reload leaves at their running values, named. None
 * for the same file, nor for what a reload applies (secret references,
 * repo_allowlist, log settings); exactly the changed ones, in the order
 * of the documentation, for a change of every other kind of value.
 */
static void
test_restart_keys(void **state)
{
	static const char *const reload_from[] = {
		"level: debug", "format: json", "file:/etc/diverge/github-token",
		"env:GITHUB_WEBHOOK_SECRET_OLD", "\"gitlab.example.com/Platform/*\"",
	};
	static const char *const reload_to[] = {
		"level: warn", "format: text", "file:/etc/diverge/token-2",
		"env:GITHUB_WEBHOOK_SECRET_NEW", "\"gitlab.example.com/Infra/*\"",
	};
	/* one of each kind of value: address, enum, string, namespace,
	 * integer, duration, URL, name, boolean, path, rules, list, amount,
	 * quantity, template, size */
	static const char *const from[] = {
		"listen: 0.0.0.0:9090", "mode: kubeconfig", "context: prod",
		"namespace: agents", "workers: 8", "ttl_after_finished: 30d",
		"public_url: https://diverge.example.com", "id: 123456",
		"allow_forks: true", "ca_file: /etc/ssl/ghe-ca.pem",
		"namespace: team-b", "gpt-4o]", "budgetUSD: \"12.50\"",
		"workspace_size: 10Gi", "?_diverge_env={env}",
		"max_body_bytes: 10MiB", "retry_period: 3s",
		"lease_name: diverged-prod",
	};
	static const char *const to[] = {
		"listen: 0.0.0.0:9091", "mode: in-cluster", "context: prod-2",
		"namespace: agents-2", "workers: 9", "ttl_after_finished: 31d",
		"public_url: https://meter.example.com", "id: 654321",
		"allow_forks: false", "ca_file: /etc/ssl/other-ca.pem",
		"namespace: team-c", "gpt-4.1]", "budgetUSD: \"12.51\"",
		"workspace_size: 20Gi", "?env={env}", "max_body_bytes: 11MiB",
		"retry_period: 2s500ms", "lease_name: diverged-2",
	};
	struct config a, b;
	char *keys;

	(void)state;
	parse_full_with(&a, NULL, NULL, 0);
	parse_full_with(&b, NULL, NULL, 0);
	assert_null(config_restart_keys(&a, &b));
	config_release(&b);

	parse_full_with(&b, reload_from, reload_to, ARRAY_SIZE(reload_from));
	assert_int_not_equal(a.log.level, b.log.level);
	assert_null(config_restart_keys(&a, &b));
	config_release(&b);

	parse_full_with(&b, from, to, ARRAY_SIZE(from));
	keys = config_restart_keys(&a, &b);
	assert_non_null(keys);
	assert_string_equal(keys, "listen,kubernetes.mode,kubernetes.context,"
	    "kubernetes.leader_election.lease_name,"
	    "kubernetes.leader_election.retry_period,namespace,controller.workers,controller.ttl_after_finished,"
	    "meter.public_url,github.app.id,github.allow_forks,"
	    "github.ca_file,repos,defaults.capabilities,defaults.budgetUSD,"
	    "sandbox.workspace_size,preview.url_template,"
	    "http.max_body_bytes");
	free(keys);
	config_release(&b);
	config_release(&a);
}

/*
 * repo_allowlist: absent, null or [] is every repository (no entry);
 * entries are kept as written (the match ignores case), in order, in
 * block or flow style, a number being its text as for repos[].match.
 */
static void
test_repo_allowlist(void **state)
{
	static const char *const empty[] = {
		"repo_allowlist: []\n", "repo_allowlist: ~\n",
		"repo_allowlist:\n", "github: {enabled: false}\n",
	};
	struct config c;
	struct config_strlist copy;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(empty); i++) {
		parse_ok(&c, empty[i]);
		assert_int_equal(c.repo_allowlist.n, 0);
		config_release(&c);
	}
	parse_ok(&c, "repo_allowlist:\n  - github.com/MyOrg/*\n"
	    "  - \"gitlab.example.com/group/sub/*\"\n"
	    "  - 'github.com/a/[bc]?'\n  - 12345\n");
	assert_int_equal(c.repo_allowlist.n, 4);
	assert_string_equal(c.repo_allowlist.v[0], "github.com/MyOrg/*");
	assert_string_equal(c.repo_allowlist.v[1],
	    "gitlab.example.com/group/sub/*");
	assert_string_equal(c.repo_allowlist.v[2], "github.com/a/[bc]?");
	assert_string_equal(c.repo_allowlist.v[3], "12345");
	/* a copy is deep and outlives the configuration */
	config_strlist_copy(&copy, &c.repo_allowlist);
	config_release(&c);
	assert_int_equal(copy.n, 4);
	assert_string_equal(copy.v[3], "12345");
	config_strlist_release(&copy);
	assert_int_equal(copy.n, 0);
	assert_null(copy.v);
	parse_ok(&c,
	    "repo_allowlist: [github.com/a/*, \"gitlab.com/b/*\"]\n");
	assert_int_equal(c.repo_allowlist.n, 2);
	assert_string_equal(c.repo_allowlist.v[1], "gitlab.com/b/*");
	config_release(&c);
}

/* The example of DESIGN.md section 12, verbatim. */
static void
test_design_example(void **state)
{
	struct config c;
	char *path = data_path("design.yaml"), *cause = NULL;

	(void)state;
	if (config_load(&c, path, &cause) != 0)
		fail_msg("%s", cause);
	assert_int_equal(c.github.enabled, 0);
	assert_int_equal(c.github.webhook_secrets.n, 1);
	assert_string_equal(c.gitlab.webhook_tokens.v[0],
	    "env:GITLAB_WEBHOOK_TOKEN");
	assert_null(c.gitlab.signing_token);
	assert_int_equal(c.nrepos, 1);
	assert_int_equal(c.repos[0].line, 26);
	assert_int_equal(c.defaults.budget_usd_micro, 5000000);
	assert_int_equal(c.sandbox.audit_window_s, 86400);
	assert_string_equal(c.sandbox.runtime_class, "");
	assert_string_equal(c.preview.url_template,
	    "https://preview.example.com/?_diverge_env={env}");
	config_release(&c);
	free(path);
}

static void
test_load_errors(void **state)
{
	struct config c, saved;
	char *path, *cause = NULL, *big, *msg;
	size_t i;

	(void)state;
	memset(&c, 0x5a, sizeof(c));
	assert_int_equal(config_load(&c, "/nonexistent/diverged.yaml",
	    &cause), -1);
	assert_string_equal(cause,
	    "/nonexistent/diverged.yaml: No such file or directory");
	free(cause);
	cause = NULL;

	path = data_path("bad-format.yaml");
	assert_int_equal(config_load(&c, path, &cause), -1);
	assert_non_null(strstr(cause, "bad-format.yaml:4: 'log.format': "
	    "expected text or json, got 'xml'"));
	assert_string_equal(cause + strlen(path), ":4: 'log.format': "
	    "expected text or json, got 'xml'");
	free(cause);
	free(path);
	cause = NULL;

	path = data_path("");		/* a directory */
	assert_int_equal(config_load(&c, path, &cause), -1);
	assert_non_null(strstr(cause, "Is a directory"));
	free(cause);
	free(path);
	cause = NULL;

	/* 1 MiB of 16-byte lines, and one byte more */
	big = xmalloc((1 << 20) + 1);
	for (i = 0; i < (1 << 20); i += 16)
		memcpy(big + i, "# comment line\n\n", 16);
	big[1 << 20] = 'x';
	path = temp_file(big, 1 << 20);
	assert_int_equal(config_load(&c, path, &cause), 0);
	config_release(&c);
	unlink(path);
	free(path);
	memset(&c, 0x5a, sizeof(c));
	memcpy(&saved, &c, sizeof(c));
	path = temp_file(big, (1 << 20) + 1);
	assert_int_equal(config_load(&c, path, &cause), -1);
	msg = xasprintf("%s:131073: file larger than 1 MiB", path);
	assert_string_equal(cause, msg);
	assert_memory_equal(&c, &saved, sizeof(c));
	unlink(path);
	free(msg);
	free(cause);
	free(path);
	free(big);
}

/* Booleans, sizes, USD and durations as written in a file. */
static void
test_value_forms(void **state)
{
	struct config c;

	(void)state;
	parse_ok(&c, "github: {enabled: on, webhook_secrets: [env:A], "
	    "allow_forks: True}\nsandbox: {network_policy: no}\n"
	    "http: {max_body_bytes: 512KiB, max_header_bytes: 4096, "
	    "connection_timeout: 1m, request_timeout: 10s}\n"
	    "defaults: {budgetUSD: 0.5}\ncommands: {max_bump_usd: \"20\"}\n"
	    "inbox: {retention: 86400}\nshutdown_timeout: 0\n");
	assert_int_equal(c.github.enabled, 1);
	assert_int_equal(c.github.allow_forks, 1);
	assert_int_equal(c.sandbox.network_policy, 0);
	assert_int_equal(c.http.max_body_bytes, 512 * 1024);
	assert_int_equal(c.http.max_header_bytes, 4096);
	assert_int_equal(c.http.connection_timeout_s, 60);
	assert_int_equal(c.http.request_timeout_s, 10);
	assert_int_equal(c.defaults.budget_usd_micro, 500000);
	assert_int_equal(c.commands.max_bump_usd_micro, 20000000);
	assert_int_equal(c.inbox.retention_s, 86400);
	assert_int_equal(c.shutdown_timeout_s, 0);
	config_release(&c);

	parse_ok(&c, "log: {level: warning, format: text}\n"
	    "kubernetes: {mode: in-cluster}\nsandbox: {uid: 4294967294, "
	    "workspace_size: \"1.5Gi\", audit_window: 0}\n"
	    "http: {max_body_bytes: 1GiB}\n");
	assert_int_equal(c.log.level, LOG_WARN);
	assert_int_equal(c.kubernetes.mode, KUBE_IN_CLUSTER);
	assert_int_equal(c.sandbox.uid, INT64_C(4294967294));
	assert_string_equal(c.sandbox.workspace_size, "1.5Gi");
	assert_int_equal(c.sandbox.audit_window_s, 0);
	assert_int_equal(c.http.max_body_bytes, INT64_C(1) << 30);
	config_release(&c);
}

/* The bounds of the ranges are inclusive, at both ends. */
static void
test_inclusive_bounds(void **state)
{
	struct config c;
	char *text;

	(void)state;
	text = xasprintf("controller: {workers: 1, max_active_tasks: 100000}\n"
	    "http: {max_body_bytes: 1KiB, max_header_bytes: 1MiB, "
	    "connection_timeout: 1h, request_timeout: 1s}\n"
	    "defaults: {budgetUSD: 1000000, maxIterations: 1000}\n"
	    "commands: {max_bump_usd: \"0\", max_per_comment: 100}\n"
	    "kubernetes:\n  leader_election:\n    lease_duration: 1h\n"
	    "    renew_deadline: 1s201ms\n    retry_period: 1s\n"
	    "    lease_name: %0253d\n"
	    "namespace: %063d\n", 0, 0);
	parse_ok(&c, text);
	free(text);
	assert_int_equal(c.controller.workers, 1);
	assert_int_equal(c.controller.max_active_tasks, 100000);
	assert_int_equal(c.http.max_body_bytes, 1024);
	assert_int_equal(c.http.max_header_bytes, 1024 * 1024);
	assert_int_equal(c.http.connection_timeout_s, 3600);
	assert_int_equal(c.http.request_timeout_s, 1);
	assert_int_equal(c.defaults.budget_usd_micro,
	    INT64_C(1000000) * 1000000);
	assert_int_equal(c.defaults.max_iterations, 1000);
	assert_int_equal(c.commands.max_bump_usd_micro, 0);
	assert_int_equal(c.commands.max_per_comment, 100);
	assert_int_equal(c.kubernetes.leader_election.lease_duration_ms,
	    3600 * 1000);
	assert_int_equal(c.kubernetes.leader_election.renew_deadline_ms, 1201);
	assert_int_equal(c.kubernetes.leader_election.retry_period_ms, 1000);
	assert_int_equal(strlen(c.kubernetes.leader_election.lease_name), 253);
	assert_int_equal(strlen(c.namespace), 63);
	config_release(&c);
	/* a task may be kept exactly as long as the audit window */
	parse_ok(&c, "controller: {ttl_after_finished: 2d}\n"
	    "sandbox: {audit_window: 48h}\n");
	assert_int_equal(c.controller.ttl_after_finished_s, 2 * 86400);
	assert_int_equal(c.sandbox.audit_window_s, 2 * 86400);
	config_release(&c);
}

static void
test_listen_forms(void **state)
{
	static const char *const good[] = {
		"127.0.0.1:8080", "0.0.0.0:0", "[::1]:80", "[::]:65535",
		"localhost:8080", "example.com:443", "my-host.local:1",
	};
	struct config c;
	char *text;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(good); i++) {
		text = xasprintf("listen: \"%s\"\n", good[i]);
		parse_ok(&c, text);
		assert_string_equal(c.listen, good[i]);
		config_release(&c);
		free(text);
	}
}

/* Loopback API listeners need nothing; others need TLS and a token. */
static void
test_api_listen(void **state)
{
	static const char *const loopback[] = {
		"127.0.0.1:8081", "127.9.9.9:1", "localhost:8081",
		"LocalHost:8081",
		"[::1]:8081", "[::ffff:127.0.0.1]:8081",
	};
	struct config c;
	char *text;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(loopback); i++) {
		text = xasprintf("api: {listen: \"%s\"}\n", loopback[i]);
		parse_ok(&c, text);
		config_release(&c);
		free(text);
	}
	parse_ok(&c, "api:\n  listen: 10.0.0.1:8081\n  tls_cert: /c\n"
	    "  tls_key: /k\n  token: file:/t\n");
	assert_string_equal(c.api.token, "file:/t");
	config_release(&c);
	parse_err("api: {listen: \"example.com:8081\"}\n", "t.yaml:1: "
	    "'api.listen' is not a loopback address but 'api.tls_cert' is "
	    "not set");
}

static void
test_providers(void **state)
{
	struct config c;

	(void)state;
	/* gitlab with only a signing token is enough */
	parse_ok(&c, "gitlab: {enabled: true, signing_token: env:SIGN}\n");
	assert_int_equal(c.gitlab.enabled, 1);
	assert_string_equal(c.gitlab.signing_token, "env:SIGN");
	config_release(&c);
	/* secrets without enabling is fine, "" unsets */
	parse_ok(&c, "github: {webhook_secrets: [\"file:rel/path\"], "
	    "token: \"\"}\ngitlab: {token: \"\"}\n");
	assert_int_equal(c.github.enabled, 0);
	assert_string_equal(c.github.webhook_secrets.v[0], "file:rel/path");
	assert_null(c.github.token);
	assert_null(c.gitlab.token);
	config_release(&c);
	/* an app with a numeric id */
	parse_ok(&c, "github:\n  enabled: true\n  webhook_secrets: [env:W]\n"
	    "  app: {id: 42, private_key: env:PEM}\n");
	assert_string_equal(c.github.app.id, "42");
	assert_null(c.github.app.slug);
	config_release(&c);
}

/*
 * The line of every secret reference is kept, so that an error resolving
 * it (a missing file, an unset variable) says FILE:LINE like the parser.
 */
static void
test_secret_lines(void **state)
{
	struct config c;

	(void)state;
	parse_ok(&c, "api: {token: env:API}\n"
	    "github:\n"
	    "  enabled: true\n"
	    "  webhook_secrets:\n"
	    "    - env:W0\n"
	    "    - file:/w1\n"
	    "  token: \"\"\n"
	    "  app: {id: 1, private_key: env:PEM}\n"
	    "gitlab: {signing_token: env:SIGN, webhook_tokens: [env:T0],\n"
	    "  token: env:GL}\n");
	assert_int_equal(config_key_line(&c, "api.token"), 1);
	assert_int_equal(config_key_line(&c, "github.webhook_secrets[0]"), 5);
	assert_int_equal(config_key_line(&c, "github.webhook_secrets[1]"), 6);
	assert_int_equal(config_key_line(&c, "github.token"), 0);	/* "" */
	assert_int_equal(config_key_line(&c, "github.app.private_key"), 8);
	assert_int_equal(config_key_line(&c, "gitlab.signing_token"), 9);
	assert_int_equal(config_key_line(&c, "gitlab.webhook_tokens[0]"), 9);
	assert_int_equal(config_key_line(&c, "gitlab.token"), 10);
	assert_int_equal(config_key_line(&c, "listen"), 0);
	config_release(&c);
}

/*
 * diverged's --listen, --api-listen and --state-dir get the checks of the
 * keys they replace: --check-config said "configuration ok" for any value
 * and the start then failed with exit status 1.
 */
static void
test_override(void **state)
{
	struct config c;
	char *cause = NULL;

	(void)state;
	config_defaults(&c);
	assert_int_equal(config_override(&c, "bogus", NULL, NULL, &cause), -1);
	assert_string_equal(cause, "--listen 'bogus': expected host:port or "
	    "[v6]:port");
	free(cause);
	assert_int_equal(config_override(&c, NULL, "127.0.0.1", NULL,
	    &cause), -1);
	assert_string_equal(cause, "--api-listen '127.0.0.1': expected "
	    "host:port, [v6]:port or off");
	free(cause);
	assert_int_equal(config_override(&c, NULL, "0.0.0.0:8081", NULL,
	    &cause), -1);
	assert_string_equal(cause, "--api-listen '0.0.0.0:8081': not a "
	    "loopback address but 'api.tls_cert' is not set");
	free(cause);
	assert_int_equal(config_override(&c, NULL, NULL, "", &cause), -1);
	assert_string_equal(cause, "--state-dir '': must not be empty");
	free(cause);
	/* nothing was changed by the refusals */
	assert_string_equal(c.listen, "127.0.0.1:8080");
	assert_string_equal(c.api.listen, "127.0.0.1:8081");
	assert_string_equal(c.state_dir, "./diverge-state");
	assert_int_equal(config_override(&c, "[::1]:0", "off", "/var/x",
	    &cause), 0);
	assert_string_equal(c.listen, "[::1]:0");
	assert_null(c.api.listen);
	assert_string_equal(c.state_dir, "/var/x");
	assert_int_equal(config_override(&c, NULL, "localhost:0", NULL,
	    &cause), 0);
	assert_string_equal(c.api.listen, "localhost:0");
	config_release(&c);
	/* off loopback with the TLS files but no token */
	parse_ok(&c, "api: {tls_cert: /c, tls_key: /k}\n");
	assert_int_equal(config_override(&c, NULL, "0.0.0.0:8081", NULL,
	    &cause), -1);
	assert_string_equal(cause, "--api-listen '0.0.0.0:8081': not a "
	    "loopback address but 'api.token' is not set");
	free(cause);
	cause = NULL;
	assert_string_equal(c.api.listen, "127.0.0.1:8081");
	config_release(&c);
	/* off loopback with the TLS files and the token of the file */
	parse_ok(&c, "api: {tls_cert: /c, tls_key: /k, token: env:T}\n");
	assert_int_equal(config_override(&c, NULL, "0.0.0.0:8081", NULL,
	    &cause), 0);
	assert_string_equal(c.api.listen, "0.0.0.0:8081");
	config_release(&c);
}

/* A successful parse replaces *out; the caller releases the old one. */
static void
test_reparse(void **state)
{
	struct config a, b;
	char *cause = NULL;

	(void)state;
	parse_ok(&a, "namespace: one\n");
	assert_int_equal(config_parse(&b, "u.yaml", "namespace: [\n", 12,
	    &cause), -1);
	free(cause);
	parse_ok(&b, "namespace: two\n");
	assert_string_equal(a.namespace, "one");
	assert_string_equal(b.namespace, "two");
	config_release(&a);
	config_release(&b);
}

/* ---- secrets ---- */

static void
secret_ok(const char *ref, const char *want, size_t wantlen)
{
	char *out = NULL, *cause = NULL;
	size_t len = 0;

	if (config_secret_read(ref, &out, &len, &cause) != 0)
		fail_msg("%s: %s", ref, cause);
	assert_int_equal(len, wantlen);
	assert_memory_equal(out, want, wantlen);
	assert_int_equal(out[len], '\0');
	secure_wipe(out, len);
	free(out);
}

static void
secret_err(const char *ref, const char *msg)
{
	char *out = (char *)0x1, *cause = NULL;
	size_t len = 77;

	assert_int_equal(config_secret_read(ref, &out, &len, &cause), -1);
	assert_ptr_equal(out, (char *)0x1);
	assert_int_equal(len, 77);
	assert_string_equal(cause, msg);
	free(cause);
}

static void
test_secret_file(void **state)
{
	static const struct {
		const char *content;
		size_t len;
		const char *want;
		size_t wantlen;
	} cases[] = {
		{ "s3cret", 6, "s3cret", 6 },
		{ "s3cret\n", 7, "s3cret", 6 },
		{ "s3cret\r\n", 8, "s3cret", 6 },
		{ "s3cret\n\n", 8, "s3cret\n", 7 },
		{ "two\nlines\n", 10, "two\nlines", 9 },
		{ "bin\0ary\n", 8, "bin\0ary", 7 },
		{ "s3cret\r", 7, "s3cret\r", 7 },
	};
	static const char *const empty[] = { "", "\n", "\r\n" };
	char *path, *ref, *msg;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		path = temp_file(cases[i].content, cases[i].len);
		ref = xasprintf("file:%s", path);
		secret_ok(ref, cases[i].want, cases[i].wantlen);
		unlink(path);
		free(ref);
		free(path);
	}

	/* empty, and empty once the newline is dropped */
	for (i = 0; i < ARRAY_SIZE(empty); i++) {
		path = temp_file(empty[i], strlen(empty[i]));
		ref = xasprintf("file:%s", path);
		msg = xasprintf("secret file '%s' is empty", path);
		secret_err(ref, msg);
		unlink(path);
		free(msg);
		free(ref);
		free(path);
	}

	secret_err("file:/nonexistent/secret",
	    "secret file '/nonexistent/secret': No such file or directory");
	secret_err("file:", "secret reference 'file:' has no path");
	secret_err("file:/", "secret file '/': not a regular file");
	/* a FIFO nobody writes to: refused at once, not waited on */
	{
		char fifo[] = "/tmp/diverge-fifo-XXXXXX";
		int fd = mkstemp(fifo);

		assert_true(fd >= 0);
		close(fd);
		unlink(fifo);
		assert_int_equal(mkfifo(fifo, 0600), 0);
		ref = xasprintf("file:%s", fifo);
		msg = xasprintf("secret file '%s': not a regular file", fifo);
		secret_err(ref, msg);
		unlink(fifo);
		free(msg);
		free(ref);
	}
}

static void
test_secret_file_size(void **state)
{
	char *big = xmalloc(64 * 1024 + 2), *path, *ref, *msg;

	(void)state;
	memset(big, 'k', 64 * 1024 + 2);
	big[64 * 1024] = '\n';
	path = temp_file(big, 64 * 1024 + 1);	/* 64 KiB and a newline */
	ref = xasprintf("file:%s", path);
	secret_ok(ref, big, 64 * 1024);
	unlink(path);
	free(ref);
	free(path);

	big[64 * 1024] = '\r';
	big[64 * 1024 + 1] = '\n';
	path = temp_file(big, 64 * 1024 + 2);	/* and a CRLF */
	ref = xasprintf("file:%s", path);
	secret_ok(ref, big, 64 * 1024);
	unlink(path);
	free(ref);
	free(path);

	big[64 * 1024] = 'k';
	path = temp_file(big, 64 * 1024 + 1);
	ref = xasprintf("file:%s", path);
	msg = xasprintf("secret file '%s' is larger than 64 KiB", path);
	secret_err(ref, msg);
	unlink(path);
	free(msg);
	free(ref);
	free(path);
	free(big);
}

static void
test_secret_env(void **state)
{
	char *out = NULL, *cause = NULL;

	(void)state;
	setenv("DIVERGE_TEST_SECRET", "hunter2\n", 1);
	secret_ok("env:DIVERGE_TEST_SECRET", "hunter2\n", 8);
	setenv("DIVERGE_TEST_EMPTY", "", 1);
	secret_err("env:DIVERGE_TEST_EMPTY",
	    "environment variable 'DIVERGE_TEST_EMPTY' is empty");
	unsetenv("DIVERGE_TEST_UNSET");
	secret_err("env:DIVERGE_TEST_UNSET",
	    "environment variable 'DIVERGE_TEST_UNSET' is not set");
	secret_err("env:", "secret reference 'env:' has no valid variable "
	    "name");
	secret_err("env:A-B", "secret reference 'env:' has no valid "
	    "variable name");
	/* a literal is refused without being quoted back */
	secret_err("hunter2", "secret reference must be file:/path or "
	    "env:NAME");
	secret_err("", "secret reference must be file:/path or env:NAME");
	secret_err(NULL, "secret reference must be file:/path or env:NAME");
	/* outlen may be NULL */
	assert_int_equal(config_secret_read("env:DIVERGE_TEST_SECRET", &out,
	    NULL, &cause), 0);
	assert_string_equal(out, "hunter2\n");
	free(out);
	unsetenv("DIVERGE_TEST_SECRET");
	unsetenv("DIVERGE_TEST_EMPTY");
}

/* An environment secret of 64 KiB is read, one byte more is not. */
static void
test_secret_env_size(void **state)
{
	char *big, *out = NULL, *cause = NULL;
	size_t len = 0;

	(void)state;
	big = xmalloc(64 * 1024 + 2);
	memset(big, 'x', 64 * 1024 + 1);
	big[64 * 1024] = '\0';
	setenv("DIVERGE_TEST_BIG", big, 1);
	assert_int_equal(config_secret_read("env:DIVERGE_TEST_BIG", &out,
	    &len, &cause), 0);
	assert_null(cause);
	assert_int_equal(len, 64 * 1024);
	free(out);
	out = NULL;
	big[64 * 1024] = 'x';
	big[64 * 1024 + 1] = '\0';
	setenv("DIVERGE_TEST_BIG", big, 1);
	assert_int_equal(config_secret_read("env:DIVERGE_TEST_BIG", &out,
	    &len, &cause), -1);
	assert_null(out);
	assert_string_equal(cause, "environment variable 'DIVERGE_TEST_BIG' "
	    "is larger than 64 KiB");
	free(cause);
	unsetenv("DIVERGE_TEST_BIG");
	free(big);
}

/* No error message of the parser ever contains a secret's value. */
static void
test_secret_not_echoed(void **state)
{
	static const char *const texts[] = {
		"github: {token: hunter2}\n",
		"github: {webhook_secrets: hunter2}\n",
		"github: {webhook_secrets: [hunter2]}\n",
		"gitlab: {webhook_tokens: [\"env:hunter2!\"]}\n",
		"api: {token: \"file\\0hunter2\"}\n",
		"github: {app: {id: 1, private_key: hunter2}}\n",
	};
	struct config c;
	char *cause = NULL;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(texts); i++) {
		assert_int_equal(config_parse(&c, "t.yaml", texts[i],
		    strlen(texts[i]), &cause), -1);
		assert_null(strstr(cause, "hunter2"));
		free(cause);
		cause = NULL;
	}
}

/* ---- durations, sizes, USD ---- */

static void
test_parse_duration(void **state)
{
	static const struct {
		const char *s;
		int64_t want;
	} cases[] = {
		{ "24h", 86400 }, { "30s", 30 }, { "7d", 604800 },
		{ "1h30m", 5400 }, { "90m", 5400 }, { "2d", 172800 },
		{ "1d2h3m4s", 93784 }, { "0", 0 }, { "0s", 0 },
		{ "3600", 3600 }, { "1", 1 }, { "1d1s", 86401 },
		{ "9223372036854775807", INT64_MAX },
		{ "", -1 }, { "h", -1 }, { "1h30", -1 }, { "30m1h", -1 },
		{ "1h1h", -1 }, { "-1s", -1 }, { "1.5h", -1 }, { "1y", -1 },
		{ " 1h", -1 }, { "1h ", -1 }, { "1H", -1 }, { "500ms", -1 },
		{ "+5s", -1 }, { "99999999999999999999s", -1 },
		{ "106751991167301d", -1 }, { "9223372036854775807s1s", -1 },
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		if (config_parse_duration(cases[i].s) != cases[i].want)
			fail_msg("duration '%s': got %" PRId64 ", want %"
			    PRId64, cases[i].s,
			    config_parse_duration(cases[i].s), cases[i].want);
	}
	assert_int_equal(config_parse_duration(NULL), -1);
}

static void
test_parse_duration_ms(void **state)
{
	static const struct {
		const char *s;
		int64_t want;
	} cases[] = {
		{ "15s", 15000 }, { "250ms", 250 }, { "1s500ms", 1500 },
		{ "2", 2000 }, { "0", 0 }, { "0ms", 0 }, { "1m1ms", 60001 },
		{ "1d", 86400000 }, { "1h30m", 5400000 },
		{ "", -1 }, { "ms", -1 }, { "1.5s", -1 }, { "500ms1s", -1 },
		{ "1s1s", -1 }, { "1msx", -1 }, { "1us", -1 }, { "-1ms", -1 },
		{ "1s500", -1 }, { "9223372036854775807", -1 },
		{ "9223372036854775807ms", INT64_MAX },
		{ "9223372036854776s", -1 },
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		if (config_parse_duration_ms(cases[i].s) != cases[i].want)
			fail_msg("duration '%s': got %" PRId64 ", want %"
			    PRId64, cases[i].s,
			    config_parse_duration_ms(cases[i].s),
			    cases[i].want);
	}
	assert_int_equal(config_parse_duration_ms(NULL), -1);
}

static void
test_parse_usd(void **state)
{
	static const struct {
		const char *s;
		int64_t want;
	} cases[] = {
		{ "5", 5000000 }, { "5.00", 5000000 }, { "0.5", 500000 },
		{ "0", 0 }, { "0.000001", 1 }, { "1234.567891", 1234567891 },
		{ "007.10", 7100000 }, { "9223372036854.775807", INT64_MAX },
		{ "", -1 }, { ".5", -1 }, { "5.", -1 }, { "-1", -1 },
		{ "+1", -1 }, { "5.0000001", -1 }, { "1e3", -1 },
		{ "$5", -1 }, { "5,00", -1 }, { "5 ", -1 }, { "5.0.0", -1 },
		{ "9223372036854.775808", -1 }, { "9999999999999999", -1 },
		{ "99999999999999999999999", -1 },
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		if (config_parse_usd(cases[i].s) != cases[i].want)
			fail_msg("usd '%s': got %" PRId64 ", want %" PRId64,
			    cases[i].s, config_parse_usd(cases[i].s),
			    cases[i].want);
	}
	assert_int_equal(config_parse_usd(NULL), -1);
}

static void
test_sizes(void **state)
{
	static const struct {
		const char *s;
		int64_t want;
	} cases[] = {
		{ "5MiB", 5 << 20 }, { "512KiB", 512 << 10 },
		{ "1GiB", 1 << 30 }, { "2048", 2048 }, { "2048B", 2048 },
		{ "64Ki", 64 << 10 }, { "2Mi", 2 << 20 },
	};
	struct config c;
	char *text;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		text = xasprintf("http: {max_body_bytes: %s}\n", cases[i].s);
		parse_ok(&c, text);
		assert_int_equal(c.http.max_body_bytes, cases[i].want);
		config_release(&c);
		free(text);
	}
	parse_err("http: {max_body_bytes: 5 MiB}\n", "t.yaml:1: "
	    "'http.max_body_bytes': expected a size like 512KiB or 5MiB, "
	    "got '5 MiB'");
	parse_err("http: {max_body_bytes: 99999999999GiB}\n", "t.yaml:1: "
	    "'http.max_body_bytes': expected a size like 512KiB or 5MiB, "
	    "got '99999999999GiB'");
}

/* ---- main: one group, the error table expanded into tests ---- */

int
main(void)
{
	static const struct CMUnitTest fixed[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_empty_files),
		cmocka_unit_test(test_null_values),
		cmocka_unit_test(test_full_file),
		cmocka_unit_test(test_restart_keys),
		cmocka_unit_test(test_design_example),
		cmocka_unit_test(test_repo_allowlist),
		cmocka_unit_test(test_load_errors),
		cmocka_unit_test(test_value_forms),
		cmocka_unit_test(test_inclusive_bounds),
		cmocka_unit_test(test_listen_forms),
		cmocka_unit_test(test_api_listen),
		cmocka_unit_test(test_providers),
		cmocka_unit_test(test_secret_lines),
		cmocka_unit_test(test_override),
		cmocka_unit_test(test_reparse),
		cmocka_unit_test(test_bound_sequence),
		cmocka_unit_test(test_bound_mapping),
		cmocka_unit_test(test_bound_nesting),
		cmocka_unit_test(test_bound_scalar),
		cmocka_unit_test(test_bound_file),
		cmocka_unit_test(test_nul_in_scalar),
		cmocka_unit_test(test_secret_file),
		cmocka_unit_test(test_secret_file_size),
		cmocka_unit_test(test_secret_env),
		cmocka_unit_test(test_secret_env_size),
		cmocka_unit_test(test_secret_not_echoed),
		cmocka_unit_test(test_parse_duration),
		cmocka_unit_test(test_parse_duration_ms),
		cmocka_unit_test(test_parse_usd),
		cmocka_unit_test(test_sizes),
	};
	size_t nfixed = ARRAY_SIZE(fixed), nerr = ARRAY_SIZE(error_cases);
	struct CMUnitTest *tests;
	size_t i;
	int rc;

	tests = xcalloc(nfixed + nerr, sizeof(*tests));
	memcpy(tests, fixed, sizeof(fixed));
	for (i = 0; i < nerr; i++) {
		tests[nfixed + i].name = error_cases[i].name;
		tests[nfixed + i].test_func = test_error_case;
		tests[nfixed + i].initial_state = (void *)&error_cases[i];
	}
	rc = _cmocka_run_group_tests("config", tests, nfixed + nerr, NULL,
	    NULL);
	free(tests);
	return rc;
}

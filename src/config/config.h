/*
 * config: the YAML configuration of diverged (DESIGN.md section 12).
 *
 * config_load() parses a file into a struct config; config_defaults()
 * fills the embedded-mode defaults used when there is no file at all.
 * Errors come back in *cause as "FILE:LINE: what" (the caller prefixes
 * "config: "). Secrets are never read by the parser: secret-valued keys keep
 * their reference ("file:/path" or "env:NAME") and config_secret_read()
 * resolves one when needed (at start and on SIGHUP).
 */
#ifndef DIVERGE_CONFIG_H
#define DIVERGE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

enum kube_mode { KUBE_EMBEDDED = 0, KUBE_KUBECONFIG, KUBE_IN_CLUSTER };

struct config_repo_rule {
	char *match;		/* glob on "host/owner/name" */
	char *namespace;
	int line;		/* where it was written, for later errors */
};

struct config_strlist {
	char **v;
	size_t n;
};

/* Where a key was written: "github.token", "github.webhook_secrets[0]". */
struct config_keyline {
	char *key;
	int line;
};

struct config {
	char *file;		/* path it was read from, NULL for defaults */

	char *listen;		/* host:port, [v6]:port; default 127.0.0.1:8080 */
	char *state_dir;	/* default ./diverge-state */

	struct {
		char *listen;	/* default 127.0.0.1:8081 */
		char *tls_cert;	/* file paths; required off loopback */
		char *tls_key;
		char *token;	/* secret ref; required off loopback */
	} api;

	struct {
		int level;	/* enum log_level */
		int json;	/* format: json */
	} log;

	struct {
		enum kube_mode mode;
		char *kubeconfig;	/* "" = $KUBECONFIG then ~/.kube/config */
		char *context;
		/*
		 * A coordination.k8s.io/v1 Lease elects the one process
		 * that runs the reconciler and the notifier (a cluster
		 * only); durations in milliseconds.
		 */
		struct {
			int enabled;		/* default 0 */
			char *lease_name;	/* default diverged */
			char *namespace;	/* NULL: controller.namespace */
			int64_t lease_duration_ms;	/* default 15s */
			int64_t renew_deadline_ms;	/* default 10s */
			int64_t retry_period_ms;	/* default 2s */
		} leader_election;
	} kubernetes;

	char *namespace;	/* default "default" */

	struct {
		char *namespace;	/* default diverge-system */
		int workers;		/* default 4, 1..64 */
		int enabled;		/* default 1: run the reconciler */
		int max_active_tasks;	/* 0..100000, default 0: no limit */
		/*
		 * A finished task (Completed, Failed) is deleted this long
		 * after status.completedAt, its children with it; 0, the
		 * default: kept. Never less than sandbox.audit_window.
		 */
		int64_t ttl_after_finished_s;
	} controller;

	struct {
		char *public_url;	/* default http://127.0.0.1:8080 */
	} meter;

	struct {
		int enabled;
		char *api_url;		/* default https://api.github.com */
		struct config_strlist webhook_secrets;	/* secret refs */
		char *token;		/* secret ref or NULL */
		struct {
			char *id;	/* app id or client id; NULL: no app */
			char *private_key;	/* secret ref (PEM) */
			char *slug;
		} app;
		int allow_forks;	/* default 0 */
		char *ca_file;
	} github;

	struct {
		int enabled;
		char *api_url;		/* default https://gitlab.com/api/v4 */
		struct config_strlist webhook_tokens;	/* secret refs */
		char *signing_token;	/* secret ref or NULL */
		char *token;		/* secret ref or NULL */
		int allow_forks;
		char *ca_file;
	} gitlab;

	struct config_repo_rule *repos;
	size_t nrepos;

	/*
	 * Globs on "host/owner/name" with the syntax and matching of
	 * repos[].match: only a repository matching one may run agents.
	 * Empty (the default): every repository may.
	 */
	struct config_strlist repo_allowlist;

	struct {
		struct config_strlist capabilities;
		int64_t budget_usd_micro;	/* budgetUSD "5.00" -> 5000000 */
		int64_t budget_tokens;		/* default 1000000 */
		int max_iterations;		/* default 5 */
		int timeout_seconds;		/* default 3600 */
	} defaults;

	struct {
		char *image;
		char *runtime_class;
		int64_t uid;			/* default 64000 */
		char *workspace_size;		/* Kubernetes quantity, 5Gi */
		int network_policy;		/* default 1 */
		int64_t audit_window_s;		/* duration, default 24h */
		int warm_pool;			/* default 0 */
	} sandbox;

	struct {
		char *url_template;	/* must contain {env} */
	} preview;

	/* additions beyond the contract keys */
	struct {
		int64_t max_body_bytes;		/* default 5 MiB */
		int max_connections;		/* default 1024 */
		int max_connections_per_ip;	/* default 0: no limit */
		int connection_timeout_s;	/* default 30 */
		int request_timeout_s;		/* default 30 */
		int threads;			/* default 4 */
		int64_t max_header_bytes;	/* default 32 KiB */
	} http;

	struct {
		int64_t capacity;		/* default 1,000,000 */
		int workers;			/* default 2 */
		int max_attempts;		/* default 8, then dead letter */
		int64_t retention_s;		/* default 7d */
	} inbox;

	struct {
		int max_per_comment;		/* default 5 */
		int64_t max_bump_usd_micro;	/* default $1000 */
		int64_t max_bump_tokens;	/* default 100M */
	} commands;

	int shutdown_timeout_s;			/* default 30 */

	/*
	 * The line of each secret reference, so that the errors of its
	 * resolution (at start, on SIGHUP) say FILE:LINE like the parser's.
	 */
	struct config_keyline *secret_lines;
	size_t nsecret_lines;
};

/* Fill c with the defaults (embedded mode, no providers). */
void config_defaults(struct config *c);

/*
 * Parse the YAML file at path over the defaults into *out. On error
 * returns -1 and sets *cause to "PATH:LINE: what" (caller frees);
 * *out is then untouched. Validates values and cross-key rules
 * (a provider enabled without any webhook secret/token is an error).
 */
int config_load(struct config *out, const char *path, char **cause);
/* The same on SIGHUP: a regular file only, never waiting on a pipe. */
int config_reload_file(struct config *out, const char *path,
    char **cause);

/*
 * Parse YAML text held in memory (name is used in messages); same
 * contract as config_load. For tests and fuzzing.
 */
int config_parse(struct config *out, const char *name, const char *text,
    size_t len, char **cause);

/*
 * The 1-based line of the file where key was written ("github.token",
 * "github.webhook_secrets[0]"); 0 when unknown (secret-valued keys only).
 */
int config_key_line(const struct config *c, const char *key);

/*
 * Apply diverged's command-line overrides of listen, api.listen ("off":
 * no API listener, NULL) and state_dir (NULL: not given) with the checks
 * the same keys get in a file, the rule of a non-loopback api.listen
 * included. On error returns -1, sets *cause to "--OPTION 'VALUE': what"
 * (caller frees) and leaves c untouched.
 */
int config_override(struct config *c, const char *listen,
    const char *api_listen, const char *state_dir, char **cause);

/*
 * The keys whose values differ between the running configuration and
 * next, a file read again on SIGHUP, that a reload does not apply (all
 * but secrets, repo_allowlist and log settings; diverged applies a change
 * of controller.max_active_tasks between two limits before asking):
 * dotted, in the order of the documentation, comma-separated
 * ("controller.workers,repos"); NULL when there are none. The caller
 * frees it.
 */
char *config_restart_keys(const struct config *running,
    const struct config *next);

/* Free everything c owns; c is then invalid until config_defaults. */
void config_release(struct config *c);

/* A deep copy of l into *out; free it with config_strlist_release. */
void config_strlist_copy(struct config_strlist *out,
    const struct config_strlist *l);
/* Free the strings of l and its array; l is then empty. */
void config_strlist_release(struct config_strlist *l);

/*
 * Resolve a secret reference "file:/path" or "env:NAME" into a new
 * NUL-terminated buffer (*out, *outlen); a single trailing newline of a
 * file is dropped. Errors name the reference's source but never the
 * secret's value. The caller wipes and frees *out.
 */
int config_secret_read(const char *ref, char **out, size_t *outlen,
    char **cause);

/* Parse "24h", "90m", "30s", "2d", "1h30m" into seconds; -1 if bad. */
int64_t config_parse_duration(const char *s);

/*
 * The same with milliseconds: a last "ms" unit ("1s500ms", "250ms"); a
 * bare number is seconds. The value in milliseconds; -1 if bad.
 */
int64_t config_parse_duration_ms(const char *s);

/*
 * Parse a decimal USD amount ("5", "5.00", "0.5") into micro-USD;
 * at most 6 decimals; -1 on bad syntax or overflow.
 */
int64_t config_parse_usd(const char *s);

#endif

/*
 * scm: everything about GitHub and GitLab: webhook signatures and
 * normalization (webhook.c), the durable inbox (inbox.c), the
 * slash-command grammar (commands.c, declared in scm/commands.h), and
 * which repository an event is about as the configuration names it
 * (repos.c: the repos rules and repo_allowlist).
 */
#ifndef DIVERGE_SCM_H
#define DIVERGE_SCM_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "scm/commands.h"

enum scm_provider { SCM_GITHUB = 1, SCM_GITLAB = 2 };

/* What a relevant delivery means, provider-neutrally. */
enum scm_event_kind {
	SCM_EV_NONE = 0,
	SCM_EV_COMMENT,		/* a comment created on a PR/MR */
	SCM_EV_CLOSED,		/* a PR/MR closed without merging */
	SCM_EV_MERGED,		/* a PR/MR merged */
	SCM_EV_PING
};

/*
 * One normalized webhook event. Strings are owned by the struct (NULL when
 * the payload lacks them); release with scm_event_release.
 */
struct scm_event {
	enum scm_provider provider;
	enum scm_event_kind kind;
	char *delivery;		/* provider delivery key (no prefix) */
	char *event_name;	/* X-GitHub-Event / X-Gitlab-Event */
	char *repo;		/* GitHub full_name; GitLab path_with_namespace */
	int64_t project_id;	/* GitLab project id (0 on GitHub) */
	int64_t repo_id;	/* GitHub repository id */
	int64_t number;		/* PR number / MR iid */
	int64_t comment_id;	/* comment / note id */
	char *comment_body;
	int review_comment;	/* GitHub pull_request_review_comment */
	char *author_login;
	int64_t author_id;
	char *author_type;	/* GitHub user.type ("User", "Bot") */
	char *author_hint;	/* GitHub author_association */
	char *head_ref;
	char *base_ref;
	char *clone_url;	/* the base repository's clone URL */
	char *head_clone_url;	/* the head repository's (fork) clone URL */
	int fork;		/* 1 fork, 0 same repo, -1 unknown */
	int64_t installation_id;	/* GitHub App installation, 0 if none */
	char *html_url;		/* the comment or PR/MR page */
	int internal;		/* a GitLab internal (confidential) note */
};

void scm_event_release(struct scm_event *ev);
const char *scm_provider_name(enum scm_provider p);
const char *scm_event_kind_name(enum scm_event_kind k);
/*
 * The inbox's stored form of an event: compact JSON, written and read
 * without building a tree (it is on the intake path). encode returns a new
 * string; decode fills *out (release it) or returns -1.
 */
char *scm_event_encode(const struct scm_event *ev);
int scm_event_decode(struct scm_event *out, const char *text, size_t len);

/* ---- repos.c: which repository, as the configuration names it ---- */

/*
 * The host repositories are named under in repos[].match and
 * repo_allowlist: the host of the provider's API URL url, github.com for
 * api.github.com, dflt when url names none. A new string.
 */
char *scm_repo_host(const char *url, const char *dflt);

/*
 * Whether glob (a repos[].match or repo_allowlist entry, fnmatch syntax)
 * matches "HOST/repo", repo being GitHub's full_name or GitLab's
 * path_with_namespace; both sides are compared in ASCII lower case.
 */
int scm_repo_match(const char *glob, const char *host, const char *repo);

/*
 * Whether repo of host matches one of the n globs (repo_allowlist); with
 * n 0 every repository is allowed, with a NULL repo or host none is.
 */
int scm_repo_allowed(const char *const *globs, size_t n, const char *host,
    const char *repo);

/* ---- webhook.c ---- */

/* The outcome of authenticating and classifying one delivery. */
enum webhook_verdict {
	WH_ACCEPT = 0,		/* relevant: store it, answer 202 */
	WH_IGNORE,		/* authenticated, irrelevant: 200 ignored */
	WH_UNAUTHORIZED,	/* 401 */
	WH_BAD_REQUEST,		/* 400 */
	WH_UNSUPPORTED		/* 415 */
};

/* The ignore reason of a delivery from a repository not allowed. */
#define WEBHOOK_NOT_ALLOWED "repository not allowed"

/* Looks a request header up, case-insensitively; NULL when absent. */
typedef const char *(*webhook_header_fn)(void *arg, const char *name);

/*
 * What a delivery is checked against: the secrets in force for
 * verification (values are raw bytes) and the repository allow-list.
 */
struct webhook_keys {
	const char **secrets;	/* GitHub webhook secrets / GitLab tokens */
	const size_t *secret_lens;
	size_t nsecrets;
	const unsigned char *signing_key;	/* GitLab whsec_ key, decoded */
	size_t signing_key_len;
	/* repo_allowlist globs (scm_repo_allowed); none: every repository */
	const char *const *allow;
	size_t nallow;
	const char *host;	/* of the repositories; required with allow */
};

/* Who the bot is, so its own comments are ignored (may be NULL). */
struct webhook_identity {
	const char *github_login;
	const char *gitlab_username;
	int64_t gitlab_user_id;
};

/*
 * GitHub X-Hub-Signature-256 check: "sha256=" and 64 lowercase hex digits
 * of HMAC-SHA256(secret, body), compared in constant time against every
 * secret. Returns 0 when one matches, -1 otherwise.
 */
int webhook_github_verify(const struct webhook_keys *keys, const char *header,
    const char *body, size_t len);

/*
 * GitLab X-Gitlab-Token check against every token, in constant time.
 */
int webhook_gitlab_verify_token(const struct webhook_keys *keys,
    const char *token);

/*
 * A Standard Webhooks timestamp is accepted this many seconds either side
 * of now.
 */
#define WEBHOOK_TIMESTAMP_WINDOW_S 300

/*
 * Standard Webhooks check: signature list ("v1,<b64> v1,<b64>") over
 * "<id>.<timestamp>.<body>", timestamp within WEBHOOK_TIMESTAMP_WINDOW_S
 * of now.
 * Returns 0 ok, -1 with *reason set.
 */
int webhook_standard_verify(const unsigned char *key, size_t keylen,
    const char *id, const char *timestamp, const char *signature,
    const char *body, size_t len, int64_t now, const char **reason);

/* Decode a "whsec_<base64>" signing token into raw key bytes. */
int webhook_signing_key_decode(const char *token, unsigned char **out,
    size_t *outlen);

/*
 * Authenticate and classify one delivery. provider selects the rules;
 * header() reads request headers; body is the raw request body. On
 * WH_ACCEPT and WH_IGNORE with an event, *out is filled (release it);
 * *reason is a static string explaining any non-accept verdict (or the
 * ignore reason). now is the wall clock (seconds), for timestamps. A
 * relevant event of a repository keys->allow does not allow is
 * WH_IGNORE, "repository not allowed" (WEBHOOK_NOT_ALLOWED).
 */
enum webhook_verdict webhook_handle(enum scm_provider provider,
    const struct webhook_keys *keys, const struct webhook_identity *self,
    webhook_header_fn header, void *header_arg, const char *body,
    size_t len, int64_t now, struct scm_event *out, const char **reason);

/*
 * Classify an already-authenticated JSON payload (the normalizer alone;
 * fuzzed). event is the provider's event header value, delivery the key.
 */
enum webhook_verdict webhook_normalize(enum scm_provider provider,
    const char *event, const char *delivery, const char *json, size_t len,
    const struct webhook_identity *self, struct scm_event *out,
    const char **reason);

/*
 * Whether text has a line starting with up to 3 spaces and "/diverge"
 * (case-insensitive) followed by whitespace or the end of the line: the
 * cheap prefilter before storage.
 */
int webhook_has_command_line(const char *text, size_t len);

/* ---- inbox.c: the durable delivery queue ---- */

struct inbox;
struct sqlite3;

/*
 * Shards: the inbox is spread over this many SQLite databases (the state
 * database and inbox-N.db beside it), each with its own writer, so that
 * their syncs run in parallel. Fixed: a delivery key's shard must not
 * change between runs.
 */
#define INBOX_SHARDS 4

/* The database file of shard i for the state database at path. */
char *inbox_shard_path(const char *path, int i);
/* The shard of a delivery key. */
int inbox_key_shard(const char *key);

/*
 * Finished entries, whose keys make a redelivery a duplicate, are kept at
 * least this long whatever the retention: a signed delivery's timestamp
 * may be up to WEBHOOK_TIMESTAMP_WINDOW_S ahead of our clock when it comes
 * and is accepted until WEBHOOK_TIMESTAMP_WINDOW_S after it, so a replay
 * verifies for twice the window after the first receipt; a minute more
 * for a clock stepped meanwhile.
 */
#define INBOX_REPLAY_KEEP_S (2 * WEBHOOK_TIMESTAMP_WINDOW_S + 60)

struct inbox_config {
	int64_t capacity;	/* pending entries; beyond: INBOX_FULL */
	int workers;
	int max_attempts;	/* then dead-lettered */
	int64_t retention_s;	/* finished entries kept this long, and
				 * INBOX_REPLAY_KEEP_S at least */
	int64_t backoff_base_ms;	/* first retry delay (default 1000) */
	int64_t backoff_max_ms;		/* cap (default 300000) */
	int hold;		/* tests: store but start no worker */
	int64_t wal_restart_frames;	/* rewind a WAL longer than this
					 * after its checkpoint (0: 4096) */
};

/* One entry handed to the handler. */
struct inbox_item {
	int64_t id;
	const char *key;	/* "github:<delivery>" */
	const char *provider;	/* "github" or "gitlab" */
	const struct scm_event *event;	/* the normalized event */
	int attempts;		/* previous failed attempts */
	int64_t received_ms;
	/*
	 * Set by the handler: run inside the transaction that marks the entry
	 * done, so the effect and the completion commit together. Returns 0
	 * or -1 (the transaction is then rolled back and the entry retried).
	 */
	int (*effect)(struct sqlite3 *db, const struct inbox_item *item,
	    void *arg);
	void *effect_arg;
	/*
	 * Set by a handler that returns INBOX_RETRY because it waits for a
	 * known time (a rate limit's reset; unix ms, 0: none): the next
	 * attempt is then at that time, at most INBOX_RETRY_AT_MAX_MS
	 * ahead, instead of after the backoff, and the attempt does not
	 * count against max_attempts while the entry is younger than
	 * INBOX_RETRY_AT_MAX_AGE_MS (a limit is not a failure of the work;
	 * one that lasts a day is).
	 */
	int64_t retry_at_ms;
	/*
	 * Set by a handler that returns INBOX_RETRY because a service it
	 * needs is unavailable for now (5xx, timeouts, transport): once the
	 * attempts reach max_attempts the entry is not dead-lettered but
	 * retried at the longest backoff, while it is younger than
	 * INBOX_RETRY_AT_MAX_AGE_MS (an outage is waited out; one that
	 * lasts a day is a failure).
	 */
	int transient;
};

#define INBOX_RETRY_AT_MAX_MS		((int64_t)3600 * 1000)
#define INBOX_RETRY_AT_MAX_AGE_MS	((int64_t)86400 * 1000)
/* the least wait between retries of an entry waiting out an outage */
#define INBOX_OUTAGE_RETRY_MIN_MS	((int64_t)15 * 1000)

enum { INBOX_DONE = 0, INBOX_RETRY = 1, INBOX_FAIL = -1 };

/*
 * The work done for each entry: returns INBOX_DONE, INBOX_RETRY (retry
 * with backoff) or INBOX_FAIL (dead-letter now). *cause may be set to a
 * message (freed by the inbox).
 */
struct inbox_handler {
	int (*handle)(void *arg, struct inbox_item *item, char **cause);
	void *arg;
};

enum inbox_put_result {
	INBOX_STORED = 0,
	INBOX_DUPLICATE,
	INBOX_FULL,
	INBOX_ERROR,
	/*
	 * The key was a dead letter's: the redelivery made it pending again
	 * (attempts from zero, next attempt now, its event the redelivery's),
	 * committed and synced like a put, and queued for the workers. Once
	 * only: a concurrent redelivery of the same key is a duplicate.
	 */
	INBOX_REQUEUED
};

/* Called from the writer thread once a put is settled. */
typedef void (*inbox_put_cb)(void *arg, enum inbox_put_result r);

/*
 * Open (creating) the inbox tables in the SQLite database at path (WAL,
 * synchronous=FULL). Returns 0, or -1 with *cause.
 */
int inbox_open(struct inbox **out, const char *path,
    const struct inbox_config *cfg, char **cause);
/* Start the writer and worker threads with handler h (copied). */
int inbox_start(struct inbox *ib, const struct inbox_handler *h,
    char **cause);
/*
 * Queue a delivery; cb runs (on the writer thread) after the entry is
 * durably committed, found to be a duplicate, found dead and requeued
 * (INBOX_REQUEUED), refused as full (a requeue takes room like a new
 * entry), or failed.
 * event_json is copied.
 */
void inbox_put_async(struct inbox *ib, const char *key, const char *provider,
    const char *event_json, inbox_put_cb cb, void *arg);
/* The same, waiting for the outcome. */
enum inbox_put_result inbox_put(struct inbox *ib, const char *key,
    const char *provider, const char *event_json);
/* Entries not yet done or dead. */
int64_t inbox_depth(struct inbox *ib);
/* Dead letters stored (state 2, all shards), until requeued or pruned. */
int64_t inbox_dead_letters(struct inbox *ib);
/* Whether writer and workers are running. */
int inbox_running(struct inbox *ib);
/*
 * Stop: refuse new puts (INBOX_ERROR), let workers finish the entries
 * they hold, commit everything queued, join the threads.
 */
void inbox_stop(struct inbox *ib);
void inbox_free(struct inbox *ib);

/*
 * The handler that records each normalized event in the table
 * handled_events (key, provider, kind, repo, number, comment_id, body,
 * count), in the completing transaction; body keeps the first KiB of the
 * comment (cut on a UTF-8 boundary), the whole of it staying in the inbox
 * entry until that is pruned. Used until command handling
 * plugs in, and by the durability tests.
 */
extern const struct inbox_handler inbox_record_handler;

/*
 * The record handler's effect alone (the audit trail of handled events),
 * for other handlers to set as their item's effect.
 */
int inbox_record_effect(struct sqlite3 *db, const struct inbox_item *item,
    void *arg);

/* ---- SCM API clients (client.c, github.c, gitlab.c) ---- */

struct config;
struct scm_client;

/* Errors of the clients: negative, with a message in *cause. */
enum scm_err {
	SCM_OK = 0,
	SCM_ENOTFOUND = -1,	/* 404 (after the retries a fresh event gets) */
	SCM_EFORBIDDEN = -2,	/* 403 that is not a rate limit */
	SCM_EUNAUTHORIZED = -3,	/* 401: bad token */
	SCM_EINVALID = -4,	/* 422 and other 4xx */
	SCM_ERATELIMITED = -5,	/* limited beyond the bounded wait: requeue */
	SCM_EUNAVAILABLE = -6,	/* 5xx or transport errors after retries */
	SCM_EINTERNAL = -7	/* a reply we cannot read */
};

/*
 * After a client call that returned SCM_ERATELIMITED: when the server
 * said the limit resets (Retry-After, else x-ratelimit-reset / GitLab's
 * RateLimit-Reset, else the client's own backoff), as unix ms; 0 after
 * any other outcome. Like errno, per thread: it describes the calling
 * thread's last call, so read it right after the call that failed.
 */
int64_t scm_ratelimit_reset_ms(void);

/* Which repository or project, as the webhook named it. */
struct scm_repo {
	const char *full_name;	/* GitHub owner/name; GitLab path */
	int64_t project_id;	/* GitLab numeric id (used in paths) */
	int64_t installation_id;	/* GitHub App installation, 0: none */
};

struct scm_pr {
	char *state;		/* open|closed (GitHub), opened|closed|merged */
	int merged;
	char *head_ref;
	char *base_ref;
	char *head_sha;
	char *clone_url;	/* the base repository */
	char *head_clone_url;	/* the head repository (a fork's) */
	int fork;		/* head repository differs from the base */
	char *author;
	char *html_url;
};

void scm_pr_release(struct scm_pr *pr);

struct scm_comment {
	int64_t id;
	char *author;		/* login / username */
	int64_t author_id;
	char *body;
	char *created_at;	/* as the API sends it */
	int system;		/* GitLab system note */
};

void scm_comments_free(struct scm_comment *v, size_t n);
void scm_comment_release(struct scm_comment *c);

enum scm_permission {
	SCM_PERM_NONE = 0,	/* no access, or not a member */
	SCM_PERM_READ,		/* GitHub read/triage; GitLab < 30 */
	SCM_PERM_WRITE,		/* GitHub write; GitLab developer (30) */
	SCM_PERM_MAINTAIN,	/* GitHub maintain/admin; GitLab >= 40 */
};

struct scm_ops {
	const char *name;	/* "github" or "gitlab" */
	/* The PR (GitHub) or MR (GitLab iid) number. */
	int (*get_pr)(struct scm_client *c, const struct scm_repo *repo,
	    int64_t number, struct scm_pr *out, char **cause);
	/* Every comment/note of the PR/MR, oldest first, every page. */
	int (*list_comments)(struct scm_client *c, const struct scm_repo *repo,
	    int64_t number, struct scm_comment **out, size_t *n,
	    char **cause);
	int (*create_comment)(struct scm_client *c,
	    const struct scm_repo *repo, int64_t number, const char *body,
	    int64_t *id_out, char **cause);
	/*
	 * An internal note, seen only by project members (GitLab: the
	 * note's "internal" flag); NULL for a provider without them.
	 */
	int (*create_internal_comment)(struct scm_client *c,
	    const struct scm_repo *repo, int64_t number, const char *body,
	    int64_t *id_out, char **cause);
	/*
	 * One comment or note of the PR/MR by id, into *out (to
	 * scm_comment_release): its author above all. SCM_ENOTFOUND when
	 * it is gone.
	 */
	int (*get_comment)(struct scm_client *c, const struct scm_repo *repo,
	    int64_t number, int64_t id, struct scm_comment *out,
	    char **cause);
	/* SCM_ENOTFOUND when the comment is gone (a person deleted it). */
	int (*update_comment)(struct scm_client *c,
	    const struct scm_repo *repo, int64_t number, int64_t id,
	    const char *body, char **cause);
	int (*delete_comment)(struct scm_client *c,
	    const struct scm_repo *repo, int64_t number, int64_t id,
	    char **cause);
	/*
	 * React to a comment: "eyes" or "confused" (GitHub reaction content,
	 * GitLab award emoji name). review: a GitHub pull request review
	 * comment (another endpoint). Reacting twice is not an error.
	 */
	int (*react)(struct scm_client *c, const struct scm_repo *repo,
	    int64_t number, int64_t comment_id, int review,
	    const char *reaction, char **cause);
	/* The author's access: GitHub by login, GitLab by user id. */
	int (*permission)(struct scm_client *c, const struct scm_repo *repo,
	    const char *login, int64_t user_id, enum scm_permission *out,
	    char **cause);
	/*
	 * Whether the author (GitLab: by user id) is a bot account: *out 1
	 * or 0. NULL for a provider whose webhooks already say so (GitHub's
	 * user.type), so that no call is made. GitLab: GET /users/:id,
	 * its "bot" field (true for access token bots and service
	 * accounts, whatever their name); SCM_ENOTFOUND for an unknown
	 * id, SCM_EINTERNAL for a reply without the field.
	 */
	int (*is_bot)(struct scm_client *c, const char *login,
	    int64_t user_id, int *out, char **cause);
	/*
	 * The bot's own identity as it posts where no installation id is
	 * known (the sticky comments): GET /user with the token, else (an
	 * App without a token) "<slug>[bot]".
	 */
	int (*whoami)(struct scm_client *c, char **login_out, int64_t *id_out,
	    char **cause);
	/*
	 * A file at a ref (NULL: the default branch); SCM_ENOTFOUND when
	 * absent.
	 */
	int (*read_file)(struct scm_client *c, const struct scm_repo *repo,
	    const char *ref, const char *path, char **data, size_t *len,
	    char **cause);
	/*
	 * SIGHUP: read the client's secrets again (same references, new
	 * values); -1 with *cause keeps the old ones. Adding or removing a
	 * credential needs a restart.
	 */
	int (*reload)(struct scm_client *c, const struct config *cfg,
	    char **cause);
	/* Keep the rate limits met in the file path (scm_http_keep_holds). */
	void (*keep_holds)(struct scm_client *c, const char *path);
	void (*free)(struct scm_client *c);
};

struct scm_who;

struct scm_client {
	const struct scm_ops *ops;
	/*
	 * The identity whoami gave, for every asker (scm_client_whoami);
	 * NULL (a client made elsewhere, as a test's): none kept.
	 */
	struct scm_who *who;
};

/*
 * The clients of cfg's enabled providers (NULL when a provider is
 * disabled). They read tokens and keys through config_secret_read and
 * re-read them on scm_client_reload. -1 with *cause.
 */
int scm_github_new(struct scm_client **out, const struct config *cfg,
    char **cause);
int scm_gitlab_new(struct scm_client **out, const struct config *cfg,
    char **cause);
void scm_client_free(struct scm_client *c);

/*
 * From the monotonic time mono_ms (now_mono_ms(); 0, the default: never)
 * every API call of every client gives up: a transfer under way is
 * aborted within about a second, a retry's wait ends, and a request not
 * yet sent is not sent. Such a call fails with SCM_EUNAVAILABLE, so the
 * work is requeued as for a server that is down. A stop sets it, so that
 * a slow API cannot hold the process past its shutdown timeout.
 */
void scm_give_up_at(int64_t mono_ms);
/*
 * Read the client's secrets again (NULL: nothing to do). Once they are,
 * the identity kept for scm_client_whoami is forgotten: the token may be
 * another user's.
 */
int scm_client_reload(struct scm_client *c, const struct config *cfg,
    char **cause);
/*
 * Who the bot is on c, as ops->whoami says (*login_out is the caller's;
 * id_out may be NULL), asked once for all its askers (the daemon, which
 * ignores the bot's own comments, and the notifier, which looks for its
 * sticky comment): the answer is kept until scm_client_reload, and a
 * caller asking while a whoami is under way waits for its answer instead
 * of sending another. fresh: an answer from after the call began (a
 * write refused: the token may be another user's). A failure is not
 * kept, so the next caller asks again. SCM_OK, or an SCM_E* with
 * *cause.
 */
int scm_client_whoami(struct scm_client *c, int fresh, char **login_out,
    int64_t *id_out, char **cause);
/*
 * Keep the rate limits c's credentials meet in state_dir (the file
 * ratelimits-<provider>.json), so that a restart does not forget them.
 */
void scm_client_keep_holds(struct scm_client *c, const char *state_dir);

/* ---- running the commands (actions.c) ---- */

struct k8s_api;
struct actions;

struct actions_config {
	const struct config *cfg;
	struct k8s_api *store;
	struct scm_client *github;	/* NULL: provider disabled */
	struct scm_client *gitlab;
	const char *db_path;		/* the state database */
	int dry_run;		/* parse and authorize, write nothing */
	/*
	 * Whether repository repo of provider, on host, is allowed when its
	 * event is handled (repo_allowlist as it is now: SIGHUP may narrow
	 * it after the event was stored). An event of one that is not is
	 * finished without any effect. NULL: every repository is allowed.
	 */
	int (*repo_allowed)(void *arg, enum scm_provider provider,
	    const char *host, const char *repo);
	void *repo_allowed_arg;
};

/*
 * The handler of the inbox: comments on PRs/MRs run their commands,
 * closed or merged PRs/MRs end their live tasks (DESIGN section 8).
 */
int actions_new(struct actions **out, const struct actions_config *ac,
    char **cause);
struct inbox_handler actions_handler(struct actions *a);
void actions_free(struct actions *a);

#endif

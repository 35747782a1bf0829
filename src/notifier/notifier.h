/*
 * notifier: the sticky status comment of an AgentTask on its PR/MR
 * (DESIGN.md section 9).
 *
 * A watch over AgentTasks feeds a work queue keyed by PR/MR (provider,
 * repository, number), so the updates of one PR/MR are serialized while
 * different ones proceed in parallel on a few worker threads. The work is
 * level-based: the comment is brought in line with the task whenever
 * status.phase differs from status.notifier.reportedPhase, or (at most
 * once per throttle period) when the rendered content changed; what was
 * reported is kept in status.notifier {commentId, reportedPhase, bodyHash}
 * so that a restart neither posts twice nor misses an update. A task
 * without status.phase (not reconciled yet) has no comment. When a run
 * ends (Completed, Failed) one short comment mentions who started it,
 * posted before reportedPhase records the phase: at least once. When
 * several tasks report to one PR/MR the comment follows one of them
 * (notifier_task_cmp); the others get their finished-run comment all the
 * same, recorded in their own reportedPhase.
 *
 * render.c holds the pure part: task JSON in, Markdown body out.
 */
#ifndef DIVERGE_NOTIFIER_H
#define DIVERGE_NOTIFIER_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct buf;
struct config;
struct k8s_api;
struct scm_client;

/* The marker that, with the bot's authorship, identifies the comment. */
#define NOTIFIER_MARKER "<!-- diverge-agent-task -->"
/* The whole body stays under this many bytes. */
#define NOTIFIER_MAX_BODY 60000
/* Caps, in bytes, on untrusted text before escaping. */
#define NOTIFIER_CAP_OBJECTIVE 4000
#define NOTIFIER_CAP_GUIDANCE 2000
#define NOTIFIER_CAP_MESSAGE 1000
#define NOTIFIER_CAP_SHORT 200

/* ---- render.c ---- */

struct notifier_render_opts {
	/*
	 * The wall clock (Unix seconds) printed as the time of the update,
	 * or -1 to leave the time out (the content that is hashed).
	 */
	int64_t now;
	/* Effective budgets: -1 unknown, 0 unlimited, else micro-USD. */
	int64_t budget_usd_micro;
	int64_t budget_tokens;	/* -1 unknown, 0 unlimited */
	/* Overrides status.previewUrl when not NULL. */
	const char *preview_url;
	/* The body limit in bytes; 0: NOTIFIER_MAX_BODY. */
	size_t max_bytes;
};

/*
 * The sticky comment's Markdown for task (an AgentTask object): the
 * marker, phase badge and reason, task name and run, objective, working
 * branch, iteration, spend against budget, preview links, the commands
 * that make sense in the phase and the time of the update. Text that
 * came from people or the agent is escaped and capped. Returns a new
 * NUL-terminated string of at most opts->max_bytes bytes (*len, when len
 * is not NULL, gets its length). Never fails.
 */
char *notifier_render(const json_t *task,
    const struct notifier_render_opts *opts, size_t *len);

/*
 * The short comment posted when a task completes or fails, mentioning
 * login (who started it; left out when it is not a plausible login).
 * followed: the sticky comment shows this task (else it shows another
 * task of the PR/MR, and the comment says so). A new string.
 */
char *notifier_render_final(const json_t *task, const char *login,
    int followed);

/*
 * Append s (len bytes, need not be NUL-terminated) to b as inline
 * Markdown that renders as plain text: invalid UTF-8 and control
 * characters replaced, newlines turned to spaces, HTML and Markdown
 * specials escaped, @mentions defused, at most cap source bytes (cut on
 * a character boundary, then an ellipsis).
 */
void notifier_escape_inline(struct buf *b, const char *s, size_t len,
    size_t cap);

/*
 * Append s as a fenced code block whose fence is longer than any
 * backtick run inside, with the marker broken, @mentions defused and
 * lines starting with a slash (/diverge, GitLab quick actions such as
 * /close) made inert; capped like notifier_escape_inline.
 */
void notifier_escape_block(struct buf *b, const char *s, size_t len,
    size_t cap);

/*
 * Cut a rendered body to at most max bytes: on a UTF-8 boundary, before
 * any code fence or <details> block left open, with a truncation note.
 * Returns the new length (the text is cut in place and NUL-terminated;
 * s must have room for len + 1 bytes).
 */
size_t notifier_truncate(char *s, size_t len, size_t max);

/* The lowercase hex SHA-256 of s (65 bytes with the NUL). */
void notifier_hash(const char *s, size_t len, char out[65]);

/* ---- task_notifier.c ---- */

struct notifier_config {
	struct k8s_api *store;		/* borrowed */
	struct scm_client *github;	/* borrowed; NULL: disabled */
	struct scm_client *gitlab;	/* borrowed; NULL: disabled */
	const struct config *cfg;	/* borrowed: defaults.* (budgets) */
	/*
	 * The bot's identity, to recognize its own comment (copied). NULL /
	 * 0: asked with whoami when first needed.
	 */
	const char *github_login;
	const char *gitlab_username;
	int64_t gitlab_user_id;
	int workers;			/* 0: 3 */
	int64_t throttle_ms;	/* 0: 30 s between content updates */
	int64_t resync_ms;		/* 0: 5 minutes */
	/*
	 * The wait before trying again a PR/MR whose provider refused the
	 * bot's writes (403, 401, 404: archived, locked, access lost); 0:
	 * 10 minutes. Status changes meanwhile do not shorten it.
	 */
	int64_t refused_ms;
};

struct notifier;

/*
 * Start the watch and the workers. What cfg points to must outlive the
 * notifier. 0, or -1 with a new message in *cause.
 */
int notifier_start(struct notifier **out, const struct notifier_config *cfg,
    char **cause);

/*
 * Stop the watch and the workers (updates in flight finish; the next
 * start picks up what is left from status.notifier), free. NULL is fine.
 */
void notifier_stop(struct notifier *n);

/*
 * The order of the tasks of one PR/MR for the sticky comment, which
 * follows the first: a live task (it has a phase that is neither
 * Completed nor Failed) before another, then the newer creationTimestamp
 * (a task with one before a task without), then, for the same second,
 * the smaller namespace, then the smaller name. Negative when task a
 * comes first, positive when b does, 0 only for the same namespace and
 * name.
 */
int notifier_task_cmp(const json_t *a, const json_t *b);

/*
 * The clients' tokens were reloaded (SIGHUP) and may be another user's:
 * the bot's identity is asked again before its comments are looked for.
 * A comment of the old identity that the provider refuses to edit (403)
 * is left as it is and a new one made. NULL is fine.
 */
void notifier_reload(struct notifier *n);

/* Comment updates and creations done so far, and failures. */
uint64_t notifier_updates(struct notifier *n, uint64_t *failures);

/* How many tasks the notifier tracks (knows the PR/MR of), for tests. */
size_t notifier_tracked(struct notifier *n);

#endif

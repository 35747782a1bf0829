/*
 * diverge: the command-line client (DESIGN.md section 2, diverge(1)).
 *
 *   diverge task init|create|list|status|logs|guide|pause|resume|budget
 *   diverge token inspect TOKEN|-
 *
 * It speaks to the resource API through the REST client (src/k8s/rest.c):
 * by default to the Kubernetes-compatible API of diverged's embedded store
 * (http://127.0.0.1:8081, or --server), or with --kubeconfig, --context or
 * --in-cluster to a real cluster. Both behave the same, except "task
 * logs": the sandbox pod's log through pods/log in a cluster, the task's
 * history through a watch on the embedded store (which has no pods).
 *
 * The operations that change a task (guide, pause, resume, budget) are
 * the shared ones of src/k8s/tasks.c, which the /diverge slash commands
 * use too.
 *
 * Exit status: 0 done, 1 refused (by the API, or the operation could not
 * be done: the message says why), 2 usage error. Messages go to stderr as
 * "diverge: <what>"; stdout has only the command's output, so that
 * "-o json" is safe to pipe.
 */
#include "config.h"

#include <sys/stat.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "config/config.h"
#include "k8s/k8s.h"
#include "meter/meter.h"
#include "util/util.h"

#define EXIT_REFUSED 1
#define EXIT_USAGE 2

#define DEFAULT_SERVER "http://127.0.0.1:8081"
#define AGENT_DIR ".diverge"
#define AGENT_FILE ".diverge/agent.yaml"

/* A token read from stdin is refused beyond this (it would be anyway). */
#define MAX_STDIN_TOKEN (MACAROON_MAX_TOKEN + 4096)
/* Largest .diverge/agent.yaml and .git/config read. */
#define MAX_SMALL_FILE (1024 * 1024)
/* Longest objective (the CRD's maxLength). */
#define MAX_OBJECTIVE 4000
/* Lines of "Recent transitions" in task status. */
#define MAX_TRANSITIONS 10
/* Bound of the text buffers (YAML output, lines). */
#define MAX_TEXT (256 * 1024 * 1024)
/* A watch that says nothing for this long ends a non-following logs. */
#define HISTORY_QUIET_MS 5000

/* ---- options and state ---- */

/* Options every API command takes (also before the command). */
struct opts {
	const char *server;
	const char *kubeconfig;
	const char *context;
	int in_cluster;
	const char *token_file;
	const char *ca_file;
	int insecure;
	const char *namespace;
	int verbose;
};

/* The connection, once open. */
struct conn {
	struct k8s_api *api;
	struct k8s_cluster cluster;
	int kube;		/* a real cluster, not diverged's store */
	const char *ns;		/* namespace of the command */
};

static struct opts O;
static struct conn C;
static int use_color;
static int64_t now_s;

/* A command: a group ("task", "token") and a verb. */
struct command {
	const char *group;
	const char *name;
	const char *args;	/* the synopsis after the verb */
	const char *about;	/* one line */
	const char *options;	/* its --help text */
	int api;		/* takes the connection options */
	int (*run)(const struct command *cmd, int argc, char **argv);
};

static const struct command commands[];

/* ---- messages ---- */

static void
errorf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* "diverge: <what>" on stderr. */
static void
errorf(const char *fmt, ...)
{
	va_list ap;

	fputs("diverge: ", stderr);
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
		fputs("diverge: ", stderr);
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

static const char connection_help[] =
    "Connection options (also accepted before the command):\n"
    "  -n, --namespace NS        the namespace (default: the kubeconfig\n"
    "                            context's, else \"default\")\n"
    "      --server URL          the API server (default: $DIVERGE_SERVER,\n"
    "                            else diverged at " DEFAULT_SERVER ")\n"
    "      --kubeconfig FILE     use a Kubernetes cluster through FILE\n"
    "      --context NAME        the kubeconfig context (implies a cluster)\n"
    "      --in-cluster          use the pod's service account\n"
    "      --token-file FILE     send the bearer token in FILE (https)\n"
    "      --certificate-authority FILE\n"
    "                            verify the server with this CA\n"
    "      --insecure-skip-tls-verify\n"
    "                            do not verify the server certificate\n"
    "  -v, --verbose             log the client's retries\n";

static int
command_help(const struct command *cmd)
{
	print_synopsis(stdout, cmd);
	printf("\n%s\n\n%s", cmd->about, cmd->options);
	printf("  -h, --help                show this help\n");
	if (cmd->api)
		printf("\n%s", connection_help);
	return 0;
}

/* ---- option parsing ---- */

enum {
	OPT_SERVER = 1000,
	OPT_KUBECONFIG,
	OPT_CONTEXT,
	OPT_IN_CLUSTER,
	OPT_TOKEN_FILE,
	OPT_CA_FILE,
	OPT_INSECURE,
	OPT_NAME,
	OPT_BUDGET,
	OPT_TOKENS,
	OPT_MAX_ITERATIONS,
	OPT_BASE_BRANCH,
	OPT_REPO,
	OPT_CAPABILITY,
	OPT_TOOL,
	OPT_DRAFT,
	OPT_FORCE
};

static const struct option conn_longopts[] = {
	{ "server", required_argument, NULL, OPT_SERVER },
	{ "kubeconfig", required_argument, NULL, OPT_KUBECONFIG },
	{ "context", required_argument, NULL, OPT_CONTEXT },
	{ "in-cluster", no_argument, NULL, OPT_IN_CLUSTER },
	{ "token-file", required_argument, NULL, OPT_TOKEN_FILE },
	{ "certificate-authority", required_argument, NULL, OPT_CA_FILE },
	{ "insecure-skip-tls-verify", no_argument, NULL, OPT_INSECURE },
	{ "namespace", required_argument, NULL, 'n' },
	{ "verbose", no_argument, NULL, 'v' },
	{ NULL, 0, NULL, 0 }
};

/* Take a connection option; 1 when c was one. */
static int
conn_opt(int c, const char *arg)
{
	switch (c) {
	case OPT_SERVER:
		O.server = arg;
		return 1;
	case OPT_KUBECONFIG:
		O.kubeconfig = arg;
		return 1;
	case OPT_CONTEXT:
		O.context = arg;
		return 1;
	case OPT_IN_CLUSTER:
		O.in_cluster = 1;
		return 1;
	case OPT_TOKEN_FILE:
		O.token_file = arg;
		return 1;
	case OPT_CA_FILE:
		O.ca_file = arg;
		return 1;
	case OPT_INSECURE:
		O.insecure = 1;
		return 1;
	case 'n':
		O.namespace = arg;
		return 1;
	case 'v':
		O.verbose = 1;
		return 1;
	default:
		return 0;
	}
}

/*
 * A command's option handler: 0 when taken, EXIT_USAGE after a message.
 * ctx is the command's.
 */
typedef int (*opt_fn)(const struct command *cmd, int c, const char *arg,
    void *ctx);

/*
 * Parse argv (argv[0] is the verb) with the command's own options (own,
 * shortopts) plus, for API commands, the connection options. Leaves the
 * operands at argv[optind..]. Returns 0, a positive exit status to end
 * with (help: 0 is returned as -1), or EXIT_USAGE.
 */
static int
parse_opts(const struct command *cmd, int argc, char **argv,
    const struct option *own, const char *shortopts, opt_fn fn, void *ctx,
    int *done)
{
	struct option *all;
	size_t n = 0, i, k = 0;
	char *shorts;
	int c, ret = 0;

	*done = 0;
	for (i = 0; own != NULL && own[i].name != NULL; i++)
		n++;
	for (i = 0; cmd->api && conn_longopts[i].name != NULL; i++)
		n++;
	all = xcalloc(n + 2, sizeof(*all));
	for (i = 0; own != NULL && own[i].name != NULL; i++)
		all[k++] = own[i];
	for (i = 0; cmd->api && conn_longopts[i].name != NULL; i++)
		all[k++] = conn_longopts[i];
	all[k].name = "help";
	all[k].has_arg = no_argument;
	all[k].val = 'h';
	/* ':' first: a missing value is reported as ':' */
	shorts = xasprintf(":%sh%s", shortopts, cmd->api ? "n:v" : "");
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, shorts, all, NULL)) != -1) {
		if (c == 'h') {
			command_help(cmd);
			*done = 1;
			ret = 0;
			goto out;
		}
		if (c == '?') {
			if (optopt != 0)
				ret = usage_error(cmd, "unknown option '-%c'",
				    optopt);
			else
				ret = usage_error(cmd, "unknown option '%s'",
				    argv[optind - 1]);
			goto out;
		}
		if (c == ':') {
			ret = usage_error(cmd, "option '%s' needs a value",
			    argv[optind - 1]);
			goto out;
		}
		if (cmd->api && conn_opt(c, optarg))
			continue;
		ret = fn != NULL ? fn(cmd, c, optarg, ctx) :
		    usage_error(cmd, NULL);
		if (ret != 0)
			goto out;
	}
out:
	free(shorts);
	free(all);
	if (ret != 0)
		*done = 1;
	return ret;
}

/* Check an -o value against a '|'-separated list. */
static int
output_ok(const char *o, const char *allowed)
{
	size_t n = strlen(o);
	const char *p = allowed, *e;

	while (*p != '\0') {
		e = strchr(p, '|');
		if (e == NULL)
			e = p + strlen(p);
		if ((size_t)(e - p) == n && strncmp(p, o, n) == 0)
			return 1;
		p = *e == '|' ? e + 1 : e;
	}
	return 0;
}

/* ---- the connection ---- */

/* The part of a transport error after "k8s: METHOD URL: ", or NULL. */
static const char *
transport_reason(const struct k8s_status *st)
{
	const char *m = st->message, *p;

	if (m == NULL || (st->err != K8S_EUNAVAILABLE &&
	    st->err != K8S_ETIMEOUT) || strncmp(m, "k8s: ", 5) != 0)
		return NULL;
	p = strchr(m + 5, ' ');
	if (p == NULL || (strncmp(p + 1, "http://", 7) != 0 &&
	    strncmp(p + 1, "https://", 8) != 0))
		return NULL;
	p = strstr(p + 1, ": ");
	return p != NULL ? p + 2 : NULL;
}

/*
 * The n bytes at s as text safe to print on a terminal, in *b (initialized
 * here, released by the caller) when they need a change: C0 and C1
 * controls, DEL and invalid UTF-8 become U+FFFD, newlines and tabs a
 * space (one line per field). Returns 1 when *b was filled, 0 when s is
 * safe as it is (*b untouched).
 */
static int
term_safe(struct buf *b, const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i, k;
	uint32_t cp;
	int dirty = 0;

	for (i = 0; i < n; i++)
		if (p[i] < 0x20 || p[i] == 0x7f || (p[i] == 0xc2 &&
		    i + 1 < n && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f))
			dirty = 1;
	if (!dirty)
		return 0;
	buf_init(b, n * 3 + 16);
	for (i = 0; i < n; i += k) {
		k = utf8_next(p + i, n - i, &cp);
		if (k == 0) {
			k = 1;
			cp = 0xfffd;
		}
		if (cp == '\n' || cp == '\t')
			buf_add(b, " ", 1);
		else if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) ||
		    cp == 0xfffd)
			buf_addstr(b, "\xef\xbf\xbd");
		else
			buf_add(b, p + i, k);
	}
	return 1;
}

/* A copy of s safe to print on a terminal (see term_safe), to free. */
static char *
term_safe_dup(const char *s)
{
	struct buf b;

	if (term_safe(&b, s, strlen(s)) == 0)
		return xstrdup(s);
	return b.data != NULL ? buf_detach(&b, NULL) : xstrdup("");
}

/* Report what the API (or the way to it) said; exit status 1. */
static int
api_fail(const struct k8s_status *st)
{
	const char *why = transport_reason(st), *m = st->message;
	char *safe;

	if (why != NULL) {
		errorf("cannot reach the API at %s: %s", C.cluster.server, why);
		return EXIT_REFUSED;
	}
	if (m != NULL && strncmp(m, "k8s: ", 5) == 0)
		m += 5;
	/* a Status carries the server's text (an admission webhook's) */
	if (m != NULL && m[0] != '\0') {
		safe = term_safe_dup(m);
		errorf("%s", safe);
	} else {
		safe = term_safe_dup(st->reason != NULL ? st->reason :
		    k8s_err_reason(st->err));
		errorf("the API refused the request (%s)", safe);
	}
	free(safe);
	if (st->maybe_done && (st->err == K8S_ETIMEOUT ||
	    st->err == K8S_EUNAVAILABLE || st->err == K8S_EINTERNAL))
		errorf("the server failed to answer: the change may have been "
		    "made all the same; check before trying again");
	return EXIT_REFUSED;
}

/*
 * Whether s can name an object or a namespace in a request path: what
 * the API server's path segment rule allows (not empty, not "." or "..",
 * no '/' or '%'). Anything else is a usage error, not a question for it.
 */
static int
segment_ok(const char *s)
{
	return s[0] != '\0' && strcmp(s, ".") != 0 && strcmp(s, "..") != 0 &&
	    strpbrk(s, "/%") == NULL;
}

/*
 * Open the connection the options describe. Returns 0, or an exit
 * status after a message.
 */
static int
conn_open(void)
{
	struct k8s_rest_config rc;
	const char *server;
	char *cause = NULL;
	int ret = EXIT_REFUSED;

	memset(&rc, 0, sizeof(rc));
	rc.connect_timeout_ms = 5000;
	rc.timeout_ms = 30000;
	rc.max_retries = 2;
	rc.max_retry_wait_ms = 5000;
	rc.deadline_ms = 60000;
	if (O.verbose)
		log_setup(LOG_INFO, 0);
	C.kube = O.kubeconfig != NULL || O.context != NULL || O.in_cluster;
	if (O.in_cluster && (O.kubeconfig != NULL || O.context != NULL)) {
		errorf("--in-cluster excludes --kubeconfig and --context");
		return EXIT_USAGE;
	}
	if (O.namespace != NULL && O.namespace[0] != '\0' &&
	    !segment_ok(O.namespace)) {
		errorf("-n '%s': a valid namespace is required", O.namespace);
		return EXIT_USAGE;
	}
	if (O.in_cluster) {
		if (k8s_incluster_load(&C.cluster, NULL, &cause) < 0)
			goto fail;
	} else if (C.kube) {
		if (k8s_kubeconfig_load(&C.cluster, O.kubeconfig, O.context,
		    &cause) < 0)
			goto fail;
	}
	server = O.server;
	if (server == NULL && !C.kube) {
		server = getenv("DIVERGE_SERVER");
		if (server == NULL || server[0] == '\0')
			server = DEFAULT_SERVER;
	}
	if (server != NULL) {
		if (strncmp(server, "http://", 7) != 0 &&
		    strncmp(server, "https://", 8) != 0) {
			errorf("--server '%s': not an http:// or https:// URL",
			    server);
			return EXIT_USAGE;
		}
		free(C.cluster.server);
		C.cluster.server = xstrdup(server);
	}
	if (O.token_file != NULL) {
		free(C.cluster.token);
		C.cluster.token = NULL;
		free(C.cluster.token_file);
		C.cluster.token_file = xstrdup(O.token_file);
	}
	/*
	 * As kubectl: a CA given turns verification back on, and
	 * --insecure-skip-tls-verify drops the kubeconfig's CA; both at once
	 * contradict each other.
	 */
	if (O.ca_file != NULL && O.insecure) {
		errorf("--certificate-authority and --insecure-skip-tls-verify "
		    "exclude each other");
		return EXIT_USAGE;
	}
	if (O.ca_file != NULL || O.insecure) {
		free(C.cluster.ca_file);
		free(C.cluster.ca_data);
		C.cluster.ca_data = NULL;
		C.cluster.ca_file = O.ca_file != NULL ? xstrdup(O.ca_file) :
		    NULL;
		C.cluster.insecure = O.insecure;
	}
	if (O.namespace != NULL && O.namespace[0] != '\0')
		C.ns = O.namespace;
	else if (C.cluster.namespace != NULL && C.cluster.namespace[0] != '\0')
		C.ns = C.cluster.namespace;
	else
		C.ns = "default";
	if (k8s_rest_open(&C.api, &C.cluster, &rc, &cause) < 0)
		goto fail;
	return 0;
fail:
	if (cause != NULL && strncmp(cause, "k8s: ", 5) == 0)
		errorf("%s", cause + 5);
	else
		errorf("%s", cause != NULL ? cause : "cannot open the API");
	free(cause);
	return ret;
}

static void
conn_close(void)
{
	k8s_api_free(C.api);
	C.api = NULL;
	k8s_cluster_release(&C.cluster);
}

/* ---- time ---- */

/* The age of an RFC 3339 time, or "<unknown>". */
static void
age_of(const char *ts, char out[32])
{
	int64_t t;

	if (time_parse_rfc3339(ts, &t) < 0)
		snprintf(out, 32, "<unknown>");
	else
		time_human_duration(now_s - t, out);
}

/*
 * The clock: DIVERGE_NOW (unix seconds, a testing aid that makes ages
 * reproducible) or the wall clock.
 */
static int
init_now(void)
{
	const char *e = getenv("DIVERGE_NOW");
	char *end;
	long long v;

	now_s = now_unix();
	if (e == NULL || e[0] == '\0')
		return 0;
	errno = 0;
	v = strtoll(e, &end, 10);
	if (errno != 0 || *end != '\0' || v < 0) {
		errorf("DIVERGE_NOW '%s' is not a number of seconds", e);
		return -1;
	}
	now_s = v;
	return 0;
}

/* ---- task fields ---- */

/* s, or "-" for a field the object lacks (never NULL to printf). */
static const char *
or_dash(const char *s)
{
	return s != NULL ? s : "-";
}

static const json_t *
jget(const json_t *o, const char *a, const char *b)
{
	const json_t *v = json_object_get(o, a);

	return b != NULL ? json_object_get(v, b) : v;
}

static const char *
jstr(const json_t *o, const char *a, const char *b)
{
	return json_string_value(jget(o, a, b));
}

static int64_t
jint(const json_t *o, const char *a, const char *b)
{
	return json_integer_value(jget(o, a, b));
}

/* status.costUSD in micro-USD (0 when absent or bad). */
static int64_t
task_cost(const json_t *task)
{
	const char *s = jstr(task, "status", "costUSD");
	int64_t v = s != NULL ? config_parse_usd(s) : 0;

	return v > 0 ? v : 0;
}

static int64_t
task_spec_usd(const json_t *task)
{
	const char *s = jstr(task, "spec", "budgetUSD");
	int64_t v = s != NULL ? config_parse_usd(s) : 0;

	return v > 0 ? v : 0;
}

static const char *
task_phase(const json_t *task)
{
	const char *p = jstr(task, "status", "phase");

	return p != NULL && p[0] != '\0' ? p : NULL;
}

static const char *
task_guidance(const json_t *task)
{
	return json_string_value(json_object_get(jget(task, "metadata",
	    "annotations"), K8S_TASK_ANNOTATION_GUIDANCE));
}

/* "$1.50" into out. */
static void
money(int64_t micro, char out[40])
{
	char s[32];

	k8s_task_format_usd(micro, s);
	snprintf(out, 40, "$%s", s);
}

/* ---- output: colour, tables, JSON, YAML ---- */

static const char *
phase_color(const char *phase)
{
	if (!use_color || phase == NULL)
		return NULL;
	if (strcmp(phase, "Active") == 0 || strcmp(phase, "Provisioning") == 0)
		return "\033[32m";
	if (strcmp(phase, "Pending") == 0)
		return "\033[36m";
	if (strcmp(phase, "Pausing") == 0 || strcmp(phase, "Paused") == 0)
		return "\033[33m";
	if (strcmp(phase, "Completed") == 0)
		return "\033[1;32m";
	if (strcmp(phase, "Failed") == 0)
		return "\033[31m";
	return NULL;
}

/* A table: cells row by row, a colour (or NULL) per cell. */
struct table {
	size_t ncols, nrows;
	char **cells;
	const char **colors;
};

static void
table_init(struct table *t, size_t ncols)
{
	memset(t, 0, sizeof(*t));
	t->ncols = ncols;
}

/* Add a row of ncols strings (copied). */
static void
table_row(struct table *t, const char *const *cells, const char *const *col)
{
	size_t i, base = t->nrows * t->ncols;

	t->cells = xrealloc(t->cells, (base + t->ncols) * sizeof(char *));
	t->colors = xrealloc(t->colors, (base + t->ncols) *
	    sizeof(const char *));
	for (i = 0; i < t->ncols; i++) {
		t->cells[base + i] = xstrdup(cells[i] != NULL ? cells[i] : "");
		t->colors[base + i] = col != NULL ? col[i] : NULL;
	}
	t->nrows++;
}

/* Width of s in terminal columns (UTF-8 continuation bytes skipped). */
static size_t
text_width(const char *s)
{
	size_t n = 0;

	for (; *s != '\0'; s++)
		if (((unsigned char)*s & 0xc0) != 0x80)
			n++;
	return n;
}

/* Print the table with columns 3 spaces apart, prefixed by indent. */
static void
table_print(const struct table *t, const char *indent)
{
	size_t *w = xcalloc(t->ncols, sizeof(size_t));
	size_t r, c, n;
	const char *cell, *col;

	for (r = 0; r < t->nrows; r++)
		for (c = 0; c < t->ncols; c++) {
			n = text_width(t->cells[r * t->ncols + c]);
			if (n > w[c])
				w[c] = n;
		}
	for (r = 0; r < t->nrows; r++) {
		fputs(indent, stdout);
		for (c = 0; c < t->ncols; c++) {
			cell = t->cells[r * t->ncols + c];
			col = t->colors[r * t->ncols + c];
			if (col != NULL)
				printf("%s%s\033[0m", col, cell);
			else
				fputs(cell, stdout);
			if (c + 1 < t->ncols)
				printf("%*s", (int)(w[c] - text_width(cell) +
				    3), "");
		}
		fputc('\n', stdout);
	}
	free(w);
}

static void
table_release(struct table *t)
{
	size_t i;

	for (i = 0; i < t->nrows * t->ncols; i++)
		free(t->cells[i]);
	free(t->cells);
	free(t->colors);
	memset(t, 0, sizeof(*t));
}

/*
 * Add the JSON text s, with what jansson leaves raw in its strings and
 * neither a terminal nor YAML should get raw written as \uXXXX: DEL, the
 * C1 controls (U+009B is a CSI) and U+FFFE, U+FFFF (YAML refuses all of
 * them unescaped). Such bytes are only ever inside a string there.
 */
static void
add_json_text(struct buf *b, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	for (; *p != '\0'; p++) {
		if (*p == 0x7f)
			buf_addstr(b, "\\u007f");
		else if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f)
			buf_printf(b, "\\u%04x", *++p);
		else if (p[0] == 0xef && p[1] == 0xbf && p[2] >= 0xbe) {
			buf_printf(b, "\\u%04x", 0xffc0 | (p[2] & 0x3f));
			p += 2;
		} else
			buf_add(b, p, 1);
	}
}

/* JSON for scripts: keys sorted, 2-space indent, one trailing newline. */
static void
print_json(const json_t *v)
{
	char *s = json_dumps(v, JSON_INDENT(2) | JSON_SORT_KEYS |
	    JSON_ENCODE_ANY);
	struct buf b;

	if (s == NULL)
		return;
	buf_init(&b, strlen(s) * 6 + 16);
	add_json_text(&b, s);
	buf_addstr(&b, "\n");
	if (b.data != NULL)
		fwrite(b.data, 1, b.len, stdout);
	buf_release(&b);
	free(s);
}

/* Whether s can be written as a plain YAML scalar and read back as is. */
static int
yaml_plain_ok(const char *s)
{
	static const char *const words[] = { "true", "false", "yes", "no",
		"on", "off", "y", "n", "null", "~" };
	size_t i, n = strlen(s);

	if (n == 0 || s[n - 1] == ' ' || s[n - 1] == ':')
		return 0;
	if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') ||
	    s[0] == '/'))
		return 0;
	for (i = 0; i < ARRAY_SIZE(words); i++)
		if (strcasecmp(s, words[i]) == 0)
			return 0;
	for (i = 0; i < n; i++) {
		char c = s[i];

		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		    (c >= '0' && c <= '9') || strchr("_./@+=-", c) != NULL)
			continue;
		if (c == ':' && s[i + 1] != ' ')
			continue;
		if (c == ' ' && s[i + 1] != ' ' && s[i + 1] != '#')
			continue;
		return 0;
	}
	return 1;
}

static void
yaml_scalar(struct buf *b, const json_t *v)
{
	char *s;

	if (json_is_string(v) && yaml_plain_ok(json_string_value(v))) {
		buf_addstr(b, json_string_value(v));
		return;
	}
	/* a JSON string is a YAML double-quoted scalar */
	s = json_dumps(v, JSON_ENCODE_ANY);
	add_json_text(b, s != NULL ? s : "null");
	free(s);
}

static void yaml_seq(struct buf *b, const json_t *a, int indent, int inl);

static int
yaml_block(const json_t *v)
{
	return (json_is_object(v) && json_object_size(v) > 0) ||
	    (json_is_array(v) && json_array_size(v) > 0);
}

static void
yaml_indent(struct buf *b, int n)
{
	buf_printf(b, "%*s", n, "");
}

static int
cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A mapping at column indent; the first key on the current line if inl. */
static void
yaml_map(struct buf *b, const json_t *o, int indent, int inl)
{
	const char **keys;
	size_t n = json_object_size(o), i = 0;
	const char *k;
	json_t *v, *ks;

	keys = xcalloc(n, sizeof(*keys));
	json_object_foreach((json_t *)o, k, v)
		keys[i++] = k;
	qsort(keys, n, sizeof(*keys), cmp_str);
	for (i = 0; i < n; i++) {
		v = json_object_get(o, keys[i]);
		if (i > 0 || !inl)
			yaml_indent(b, indent);
		ks = json_string(keys[i]);
		yaml_scalar(b, ks);
		json_decref(ks);
		buf_addstr(b, ":");
		if (json_is_object(v) && json_object_size(v) > 0) {
			buf_addstr(b, "\n");
			yaml_map(b, v, indent + 2, 0);
		} else if (json_is_array(v) && json_array_size(v) > 0) {
			buf_addstr(b, "\n");
			yaml_seq(b, v, indent, 0);
		} else {
			buf_addstr(b, " ");
			if (json_is_object(v))
				buf_addstr(b, "{}");
			else if (json_is_array(v))
				buf_addstr(b, "[]");
			else
				yaml_scalar(b, v);
			buf_addstr(b, "\n");
		}
	}
	free(keys);
}

/* A sequence at column indent; the first item on the current line if inl. */
static void
yaml_seq(struct buf *b, const json_t *a, int indent, int inl)
{
	size_t i;
	json_t *v;

	json_array_foreach(a, i, v) {
		if (i > 0 || !inl)
			yaml_indent(b, indent);
		buf_addstr(b, "- ");
		if (json_is_object(v) && yaml_block(v))
			yaml_map(b, v, indent + 2, 1);
		else if (json_is_array(v) && yaml_block(v))
			yaml_seq(b, v, indent + 2, 1);
		else {
			if (json_is_object(v))
				buf_addstr(b, "{}");
			else if (json_is_array(v))
				buf_addstr(b, "[]");
			else
				yaml_scalar(b, v);
			buf_addstr(b, "\n");
		}
	}
}

/* YAML for people: the JSON document in block style, keys sorted. */
static void
print_yaml(const json_t *v)
{
	struct buf b;

	buf_init(&b, MAX_TEXT);
	if (json_is_object(v) && yaml_block(v))
		yaml_map(&b, v, 0, 0);
	else if (json_is_array(v) && yaml_block(v))
		yaml_seq(&b, v, 0, 0);
	else {
		if (json_is_object(v))
			buf_addstr(&b, "{}");
		else if (json_is_array(v))
			buf_addstr(&b, "[]");
		else
			yaml_scalar(&b, v);
		buf_addstr(&b, "\n");
	}
	if (b.data != NULL)
		fwrite(b.data, 1, b.len, stdout);
	buf_release(&b);
}

/* ---- the repository: root, agent.yaml, origin ---- */

/* Whether path exists. */
static int
exists(const char *path)
{
	struct stat sb;

	return stat(path, &sb) == 0;
}

/*
 * The top of the repository holding the current directory (the nearest
 * directory with a .git), else the current directory. A new string.
 */
static char *
repo_root(void)
{
	char *cwd, *dir, *git, *slash;

	cwd = getcwd(NULL, 0);
	if (cwd == NULL)
		return xstrdup(".");
	dir = xstrdup(cwd);
	for (;;) {
		git = xasprintf("%s/.git", dir);
		if (exists(git)) {
			free(git);
			free(cwd);
			return dir;
		}
		free(git);
		slash = strrchr(dir, '/');
		if (slash == NULL || slash == dir)
			break;
		*slash = '\0';
	}
	free(dir);
	return cwd;
}

/* Read a small file into a new string; -1 with errno. */
static int
read_small(const char *path, char **out, size_t *len)
{
	struct buf b;
	char chunk[4096];
	ssize_t n;
	int fd, ret = -1, e = 0;

	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	buf_init(&b, MAX_SMALL_FILE);
	for (;;) {
		n = read(fd, chunk, sizeof(chunk));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			e = errno;
			goto out;
		}
		if (n == 0)
			break;
		if (buf_add(&b, chunk, (size_t)n) < 0) {
			e = EFBIG;
			goto out;
		}
	}
	*len = b.len;
	*out = b.data != NULL ? buf_detach(&b, NULL) : xstrdup("");
	ret = 0;
out:
	close(fd);
	buf_release(&b);
	if (ret < 0)
		errno = e;
	return ret;
}

/*
 * The url of remote "origin" in DIR/.git/config, or NULL (no such file,
 * a worktree, no origin).
 */
static char *
origin_url(const char *root)
{
	char *path = xasprintf("%s/.git/config", root), *text = NULL;
	char *line, *next, *url = NULL, *p, *e;
	size_t len;
	int in_origin = 0;

	if (read_small(path, &text, &len) < 0)
		goto out;
	for (line = text; line != NULL && url == NULL; line = next) {
		next = strchr(line, '\n');
		if (next != NULL)
			*next++ = '\0';
		for (p = line; *p == ' ' || *p == '\t'; p++)
			;
		if (*p == '[') {
			in_origin = strncmp(p, "[remote \"origin\"]", 17) == 0;
			continue;
		}
		if (!in_origin || strncmp(p, "url", 3) != 0)
			continue;
		for (p += 3; *p == ' ' || *p == '\t'; p++)
			;
		if (*p != '=')
			continue;
		for (p++; *p == ' ' || *p == '\t'; p++)
			;
		e = p + strlen(p);
		while (e > p && (e[-1] == ' ' || e[-1] == '\t' ||
		    e[-1] == '\r'))
			e--;
		if (e > p)
			url = xstrndup(p, (size_t)(e - p));
	}
out:
	free(text);
	free(path);
	return url;
}

/*
 * url without the credentials of its userinfo (a new string): all of it
 * ("https://alice:ghp_x@host/..." and "https://ghp_x@host/..." become
 * "https://host/..."), but for ssh, whose user name ("ssh://git@host/")
 * is no secret and says who to log in as: only its ":password" goes.
 * The scp-like form ("git@host:org/repo") has no password and is kept.
 * *stripped says whether anything was removed.
 */
static char *
url_without_credentials(const char *url, int *stripped)
{
	const char *sep = strstr(url, "://"), *auth, *end, *at, *colon;
	int ssh;

	*stripped = 0;
	if (sep == NULL)
		return xstrdup(url);
	auth = sep + 3;
	end = auth + strcspn(auth, "/?#");
	for (at = NULL, colon = auth; colon < end; colon++)
		if (*colon == '@')
			at = colon;	/* the last one ends the userinfo */
	if (at == NULL)
		return xstrdup(url);
	ssh = (size_t)(sep - url) >= 3 && strncasecmp(sep - 3, "ssh", 3) == 0;
	colon = memchr(auth, ':', (size_t)(at - auth));
	if (ssh && colon == NULL)
		return xstrdup(url);
	*stripped = 1;
	if (ssh)
		return xasprintf("%.*s%s", (int)(colon - url), url, at);
	return xasprintf("%.*s%s", (int)(auth - url), url, at + 1);
}

/* The scaffold of "diverge task init": the spec's example, explained. */
static const char agent_yaml_scaffold[] =
    "# .diverge/agent.yaml: defaults for the agent tasks of this "
    "repository.\n"
    "# \"diverge task create\" reads it; its flags override these "
    "values.\n"
    "# See diverge(1).\n"
    "version: \"1\"\n"
    "agent:\n"
    "  # Models the agent may call: exact names, or prefixes ending in "
    "'*'\n"
    "  # (\"claude-*\"). Any other model is refused by the meter.\n"
    "  capabilities:\n"
    "    - claude-3-7-sonnet\n"
    "    - gemini-2.5-pro\n"
    "  # Tools the agent may use in its sandbox (they go into its "
    "token).\n"
    "  allowedTools:\n"
    "    - git\n"
    "    - go\n"
    "    - npm\n"
    "    - pytest\n"
    "    - diverge_*\n"
    "  # USD budget of a task, a decimal string. When it is spent the "
    "task\n"
    "  # pauses; \"diverge task resume NAME --budget +5.00\" adds to it. "
    "A\n"
    "  # token budget may be set too: budgetTokens: 1000000.\n"
    "  budgetUSD: \"5.00\"\n"
    "  # Build-verify-fix iterations; 0 means no limit.\n"
    "  maxIterations: 5\n"
    "  # The branch the agent starts from, and its pull request's "
    "target.\n"
    "  baseBranch: main\n"
    "  sandbox:\n"
    "    # Where the agent runs: kubernetes-sigs/agent-sandbox.\n"
    "    provider: agent-sandbox\n"
    "    # Wall-clock limit of a task in seconds, paused time "
    "excluded.\n"
    "    timeoutSeconds: 3600\n";

static json_t *
obj_child(json_t *o, const char *key)
{
	json_t *c = json_object_get(o, key);

	if (!json_is_object(c)) {
		c = json_object();
		json_object_set_new(o, key, c);
	}
	return c;
}

/*
 * Read the agent.yaml at path into spec defaults (*out, a partial
 * AgentTask spec; empty when the file does not exist). 0, or -1 with
 * "FILE:LINE: what" in *cause.
 */
static int
agent_yaml_load(const char *path, json_t **out, char **cause)
{
	char *text = NULL;
	size_t len = 0;
	int ret;

	if (read_small(path, &text, &len) < 0) {
		if (errno == ENOENT) {
			*out = json_object();
			return 0;
		}
		*cause = xasprintf("%s: %s", path, errno == EFBIG ?
		    "too large" : strerror(errno));
		return -1;
	}
	ret = k8s_task_agent_yaml(path, text, len, out, cause);
	free(text);
	return ret;
}

/* ---- task init ---- */

struct init_args {
	int force;
};

static int
init_opt(const struct command *cmd, int c, const char *arg, void *ctx)
{
	struct init_args *a = ctx;

	(void)arg;
	if (c == OPT_FORCE || c == 'f') {
		a->force = 1;
		return 0;
	}
	return usage_error(cmd, NULL);
}

static const char task_init_options[] =
    "Writes .diverge/agent.yaml at the top of the repository that holds\n"
    "the current directory (the nearest directory with a .git; else the\n"
    "current directory): the defaults \"diverge task create\" uses, with\n"
    "comments. An existing file is kept unless --force is given.\n"
    "\n"
    "Options:\n"
    "  -f, --force               overwrite an existing file\n";

/* diverge task init: scaffold .diverge/agent.yaml. */
static int
cmd_task_init(const struct command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "force", no_argument, NULL, OPT_FORCE },
		{ NULL, 0, NULL, 0 }
	};
	struct init_args a = { 0 };
	char *root = NULL, *dir = NULL, *path = NULL, *tmp = NULL;
	size_t len = sizeof(agent_yaml_scaffold) - 1;
	int ret, done, fd;

	ret = parse_opts(cmd, argc, argv, longopts, "f", init_opt, &a, &done);
	if (done)
		return ret;
	if (optind < argc)
		return usage_error(cmd, "unexpected argument '%s'",
		    argv[optind]);
	ret = EXIT_REFUSED;
	root = repo_root();
	dir = xasprintf("%s/%s", root, AGENT_DIR);
	path = xasprintf("%s/%s", root, AGENT_FILE);
	if (exists(path) && !a.force) {
		errorf("%s already exists (use --force to overwrite it)",
		    path);
		goto out;
	}
	if (mkdir(dir, 0777) < 0 && errno != EEXIST) {
		errorf("cannot create %s: %s", dir, strerror(errno));
		goto out;
	}
	/* a whole file or none: write aside, then rename over */
	tmp = xasprintf("%s.tmp.%ld", path, (long)getpid());
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
	if (fd < 0 || write(fd, agent_yaml_scaffold, len) != (ssize_t)len ||
	    fsync(fd) < 0) {
		errorf("cannot write %s: %s", tmp, strerror(errno));
		if (fd >= 0) {
			(void)close(fd);
			(void)unlink(tmp);
		}
		goto out;
	}
	if (close(fd) < 0) {
		errorf("cannot write %s: %s", tmp, strerror(errno));
		(void)unlink(tmp);
		goto out;
	}
	if (rename(tmp, path) < 0) {
		errorf("cannot write %s: %s", path, strerror(errno));
		(void)unlink(tmp);
		goto out;
	}
	printf("wrote %s\n", path);
	ret = 0;
out:
	free(root);
	free(dir);
	free(path);
	free(tmp);
	return ret;
}

/* ---- task create ---- */

struct create_args {
	const char *name;
	const char *budget;
	const char *tokens;
	const char *max_iterations;
	const char *base_branch;
	const char *repo;
	json_t *capabilities;	/* array, or NULL when not given */
	json_t *tools;
	int draft;
	const char *output;
};

static int
create_opt(const struct command *cmd, int c, const char *arg, void *ctx)
{
	struct create_args *a = ctx;

	switch (c) {
	case OPT_NAME:
		a->name = arg;
		return 0;
	case OPT_BUDGET:
		a->budget = arg;
		return 0;
	case OPT_TOKENS:
		a->tokens = arg;
		return 0;
	case OPT_MAX_ITERATIONS:
		a->max_iterations = arg;
		return 0;
	case OPT_BASE_BRANCH:
		a->base_branch = arg;
		return 0;
	case OPT_REPO:
		a->repo = arg;
		return 0;
	case OPT_CAPABILITY:
		if (a->capabilities == NULL)
			a->capabilities = json_array();
		json_array_append_new(a->capabilities, json_string(arg));
		return 0;
	case OPT_TOOL:
		if (a->tools == NULL)
			a->tools = json_array();
		json_array_append_new(a->tools, json_string(arg));
		return 0;
	case OPT_DRAFT:
		a->draft = 1;
		return 0;
	case 'o':
		a->output = arg;
		return 0;
	default:
		return usage_error(cmd, NULL);
	}
}

/* A DNS-1123 label: what every object named after the task needs. */
static int
name_ok(const char *s)
{
	size_t i, n = strlen(s);

	if (n == 0 || n > 63)
		return 0;
	for (i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') ||
		    (s[i] >= '0' && s[i] <= '9') ||
		    (s[i] == '-' && i > 0 && i < n - 1)))
			return 0;
	return 1;
}

/* Whether s is blank. */
static int
blank(const char *s)
{
	for (; *s != '\0'; s++)
		if (*s != ' ' && *s != '\t' && *s != '\n' && *s != '\r')
			return 0;
	return 1;
}

/*
 * Create the task: a generated name is drawn again when taken, unless the
 * create was sent twice (an attempt answered 5xx, then AlreadyExists):
 * the name may be taken by this very create, and a new name would make a
 * second task.
 */
static int
create_task(json_t *task, const char *given_name, json_t **out,
    struct k8s_status *st)
{
	char name[K8S_TASK_NAME_MAX];
	json_t *meta = obj_child(task, "metadata"), *repo;
	char *wb;
	int attempt, ret = K8S_EINTERNAL;

	for (attempt = 0; attempt < 5; attempt++) {
		if (given_name == NULL)
			k8s_task_name_new(name);
		json_object_set_new(meta, "name", json_string(given_name ?
		    given_name : name));
		repo = json_object_get(json_object_get(task, "spec"),
		    "repository");
		if (json_is_object(repo) &&
		    json_object_get(repo, "url") != NULL) {
			wb = xasprintf("agent/%s", given_name ? given_name :
			    name);
			json_object_set_new(repo, "workingBranch",
			    json_string(wb));
			free(wb);
		}
		ret = k8s_create(C.api, &K8S_AGENTTASK, C.ns, task, out, st);
		if (ret != K8S_EEXISTS || given_name != NULL ||
		    st->maybe_done)
			break;
		k8s_status_release(st);
	}
	return ret;
}

static const char task_create_options[] =
    "Creates an AgentTask with OBJECTIVE and prints its name. Its spec\n"
    "starts from .diverge/agent.yaml at the top of the repository (when\n"
    "there is one; see \"diverge task init\"); the options override it.\n"
    "The repository URL defaults to the remote \"origin\" of the current\n"
    "git repository.\n"
    "\n"
    "Options:\n"
    "      --name NAME           the task's name (default: task-XXXXXX)\n"
    "      --budget USD          the USD budget, e.g. 5.00\n"
    "      --tokens N            the token budget, e.g. 2000000 or 2M\n"
    "      --max-iterations N    build-verify-fix iterations (0: no "
    "limit)\n"
    "      --base-branch B       the branch to start from\n"
    "      --repo URL            the repository (\"\" for none)\n"
    "      --capability MODEL    an allowed model (repeat; replaces the\n"
    "                            file's list)\n"
    "      --tool TOOL           an allowed tool (repeat; replaces the\n"
    "                            file's list)\n"
    "      --draft               open the pull request as a draft\n"
    "  -o, --output FORMAT       name (default), json or yaml\n";

/* diverge task create OBJECTIVE: create a task and print its name. */
static int
cmd_task_create(const struct command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "name", required_argument, NULL, OPT_NAME },
		{ "budget", required_argument, NULL, OPT_BUDGET },
		{ "tokens", required_argument, NULL, OPT_TOKENS },
		{ "max-iterations", required_argument, NULL,
		    OPT_MAX_ITERATIONS },
		{ "base-branch", required_argument, NULL, OPT_BASE_BRANCH },
		{ "repo", required_argument, NULL, OPT_REPO },
		{ "capability", required_argument, NULL, OPT_CAPABILITY },
		{ "tool", required_argument, NULL, OPT_TOOL },
		{ "draft", no_argument, NULL, OPT_DRAFT },
		{ "output", required_argument, NULL, 'o' },
		{ NULL, 0, NULL, 0 }
	};
	struct create_args a;
	struct k8s_status st = { 0 };
	json_t *spec = NULL, *task = NULL, *res = NULL, *repo;
	char *root = NULL, *path = NULL, *cause = NULL, *url = NULL, *end;
	char money_s[32];
	const char *objective;
	int64_t v;
	long long iters;
	int ret, done, stripped;

	memset(&a, 0, sizeof(a));
	a.output = "name";
	ret = parse_opts(cmd, argc, argv, longopts, "o:", create_opt, &a,
	    &done);
	if (done)
		goto out;
	ret = EXIT_USAGE;
	if (argc - optind != 1) {
		ret = usage_error(cmd, argc - optind == 0 ? "an objective is "
		    "required" : "one objective, quoted, is expected");
		goto out;
	}
	objective = argv[optind];
	if (blank(objective)) {
		ret = usage_error(cmd, "the objective is empty");
		goto out;
	}
	if (strlen(objective) > MAX_OBJECTIVE) {
		ret = usage_error(cmd, "the objective is too long: at most %d "
		    "bytes", MAX_OBJECTIVE);
		goto out;
	}
	if (!output_ok(a.output, "name|json|yaml")) {
		ret = usage_error(cmd, "-o %s: expected name, json or yaml",
		    a.output);
		goto out;
	}
	if (a.name != NULL && !name_ok(a.name)) {
		ret = usage_error(cmd, "--name '%s': a name is 1 to 63 "
		    "lowercase letters, digits or '-', starting and ending "
		    "with a letter or digit", a.name);
		goto out;
	}
	root = repo_root();
	path = xasprintf("%s/%s", root, AGENT_FILE);
	if (agent_yaml_load(path, &spec, &cause) < 0) {
		errorf("%s", cause);
		goto out;
	}
	json_object_set_new(spec, "objective", json_string(objective));
	if (a.budget != NULL) {
		if (k8s_task_parse_usd(a.budget, 0, &v, &cause) < 0) {
			ret = usage_error(cmd, "--budget %s", cause);
			goto out;
		}
		k8s_task_format_usd(v, money_s);
		json_object_set_new(spec, "budgetUSD", json_string(money_s));
	}
	if (a.tokens != NULL) {
		if (k8s_task_parse_tokens(a.tokens, 0, &v, &cause) < 0) {
			ret = usage_error(cmd, "--tokens %s", cause);
			goto out;
		}
		json_object_set_new(spec, "budgetTokens", json_integer(v));
	}
	if (a.max_iterations != NULL) {
		errno = 0;
		iters = strtoll(a.max_iterations, &end, 10);
		if (a.max_iterations[0] < '0' || a.max_iterations[0] > '9' ||
		    *end != '\0' || errno != 0 || iters > INT32_MAX) {
			ret = usage_error(cmd, "--max-iterations '%s': "
			    "expected a number, 0 for no limit",
			    a.max_iterations);
			goto out;
		}
		json_object_set_new(spec, "maxIterations",
		    json_integer(iters));
	}
	if (a.capabilities != NULL)
		json_object_set(spec, "capabilities", a.capabilities);
	if (a.tools != NULL)
		json_object_set(spec, "allowedTools", a.tools);
	if (a.draft)
		json_object_set_new(spec, "draftPR", json_true());
	if (a.base_branch != NULL)
		json_object_set_new(obj_child(spec, "repository"),
		    "baseBranch", json_string(a.base_branch));
	if (a.repo == NULL)
		url = origin_url(root);
	else if (a.repo[0] != '\0')
		url = xstrdup(a.repo);
	if (url != NULL) {
		/* a token in the task's spec is readable by all who list it */
		char *clean = url_without_credentials(url, &stripped);

		if (stripped)
			fprintf(stderr, "diverge: warning: the repository "
			    "URL's credentials are left out of the task\n");
		secure_wipe(url, strlen(url));
		free(url);
		url = clean;
		json_object_set_new(obj_child(spec, "repository"), "url",
		    json_string(url));
	}
	repo = json_object_get(spec, "repository");
	if (json_is_object(repo) && json_object_get(repo, "url") == NULL)
		/* a branch means nothing without a repository */
		json_object_del(spec, "repository");
	if (json_is_object(json_object_get(spec, "sandbox")) &&
	    json_object_get(json_object_get(spec, "sandbox"),
	    "provider") == NULL)
		json_object_set_new(json_object_get(spec, "sandbox"),
		    "provider", json_string("agent-sandbox"));

	ret = conn_open();
	if (ret != 0)
		goto out;
	task = json_pack("{s:s,s:s,s:{},s:O}", "apiVersion",
	    k8s_api_version(&K8S_AGENTTASK), "kind", K8S_AGENTTASK.kind,
	    "metadata", "spec", spec);
	if (create_task(task, a.name, &res, &st) < 0) {
		if (st.err == K8S_EEXISTS && st.maybe_done) {
			const char *n = k8s_meta_str(task, "name");

			errorf("task \"%s\" exists, but this create cannot "
			    "tell whether it made it: the server failed to "
			    "answer the first attempt, which may have created "
			    "it, and the retry found the name taken; check it "
			    "with \"diverge task status %s\"", n, n);
			ret = EXIT_REFUSED;
		} else
			ret = api_fail(&st);
		goto out;
	}
	if (strcmp(a.output, "json") == 0)
		print_json(res);
	else if (strcmp(a.output, "yaml") == 0)
		print_yaml(res);
	else
		printf("%s\n", or_dash(k8s_meta_str(res, "name")));
	ret = 0;
out:
	json_decref(a.capabilities);
	json_decref(a.tools);
	json_decref(spec);
	json_decref(task);
	json_decref(res);
	k8s_status_release(&st);
	free(root);
	free(path);
	free(cause);
	free(url);
	return ret;
}

/* ---- task list ---- */

struct list_args {
	int all;
	const char *output;
};

static int
list_opt(const struct command *cmd, int c, const char *arg, void *ctx)
{
	struct list_args *a = ctx;

	switch (c) {
	case 'A':
		a->all = 1;
		return 0;
	case 'o':
		a->output = arg;
		return 0;
	default:
		return usage_error(cmd, NULL);
	}
}

static int
cmp_tasks(const void *pa, const void *pb)
{
	const json_t *a = *(const json_t *const *)pa;
	const json_t *b = *(const json_t *const *)pb;
	const char *na = k8s_meta_str(a, "namespace");
	const char *nb = k8s_meta_str(b, "namespace");
	int c = strcmp(na != NULL ? na : "", nb != NULL ? nb : "");

	if (c != 0)
		return c;
	na = k8s_meta_str(a, "name");
	nb = k8s_meta_str(b, "name");
	return strcmp(na != NULL ? na : "", nb != NULL ? nb : "");
}

/* The items of a list, sorted, each with its apiVersion and kind. */
static json_t *
sorted_items(const json_t *list)
{
	const json_t *items = json_object_get(list, "items");
	json_t **v, *out = json_array(), *it;
	size_t i, n = json_array_size(items);

	v = xcalloc(n + 1, sizeof(*v));
	for (i = 0; i < n; i++)
		v[i] = json_array_get(items, i);
	qsort(v, n, sizeof(*v), cmp_tasks);
	for (i = 0; i < n; i++) {
		it = json_deep_copy(v[i]);
		if (json_object_get(it, "apiVersion") == NULL)
			json_object_set_new(it, "apiVersion", json_string(
			    k8s_api_version(&K8S_AGENTTASK)));
		if (json_object_get(it, "kind") == NULL)
			json_object_set_new(it, "kind",
			    json_string(K8S_AGENTTASK.kind));
		json_array_append_new(out, it);
	}
	free(v);
	return out;
}

/* "used/limit" with "-" for a limit the spec does not set. */
static void
used_of(const char *used, int64_t limit, int usd, char *out, size_t n)
{
	char l[40];

	if (limit <= 0)
		snprintf(l, sizeof(l), "-");
	else if (usd)
		money(limit, l);
	else
		snprintf(l, sizeof(l), "%" PRId64, limit);
	snprintf(out, n, "%s/%s", used, l);
}

static const char task_list_options[] =
    "Lists the AgentTasks of the namespace: NAME, PHASE, COST (spent of\n"
    "the USD budget), TOKENS (used of the token budget), ITERATION (of\n"
    "the maximum) and AGE. \"-\" stands for a budget the task's spec does\n"
    "not set (the token's or the configured default applies; for\n"
    "iterations: no limit).\n"
    "\n"
    "Options:\n"
    "  -A, --all-namespaces      list the tasks of every namespace\n"
    "  -o, --output FORMAT       table (default), json (an array of the\n"
    "                            objects, keys sorted) or yaml\n";

/*
 * Make the strings of v (in place, recursively) safe to print on a
 * terminal: status.message and the conditions carry what an agent or a
 * sandbox wrote, and an escape sequence there would run in the reader's
 * terminal (OSC 52 sets the clipboard, CSI 2J clears the screen, OSC 8
 * dresses a link): see term_safe. -o json and -o yaml escape them
 * (add_json_text) and are left alone.
 */
static void
term_clean(json_t *v)
{
	const char *key;
	json_t *child;
	size_t i;

	if (json_is_object(v)) {
		json_object_foreach(v, key, child)
			term_clean(child);
	} else if (json_is_array(v)) {
		json_array_foreach(v, i, child)
			term_clean(child);
	} else if (json_is_string(v)) {
		struct buf b;

		if (term_safe(&b, json_string_value(v),
		    json_string_length(v)) == 0)
			return;
		json_string_setn(v, b.data, b.len);
		buf_release(&b);
	}
}

/* diverge task list: the tasks of a namespace or all. */
static int
cmd_task_list(const struct command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "all-namespaces", no_argument, NULL, 'A' },
		{ "output", required_argument, NULL, 'o' },
		{ NULL, 0, NULL, 0 }
	};
	static const char *const head[] = { "NAMESPACE", "NAME", "PHASE",
		"COST", "TOKENS", "ITERATION", "AGE" };
	struct list_args a = { 0, "table" };
	struct k8s_status st = { 0 };
	struct table t;
	json_t *list = NULL, *items = NULL, *it;
	const char *cells[7], *colors[7], *phase;
	char cost[96], tokens[96], iter[96], age[32], used[40], queued[32];
	size_t i, off;
	int ret, done;

	table_init(&t, 6);
	ret = parse_opts(cmd, argc, argv, longopts, "Ao:", list_opt, &a,
	    &done);
	if (done)
		goto out;
	if (optind < argc) {
		ret = usage_error(cmd, "unexpected argument '%s'",
		    argv[optind]);
		goto out;
	}
	if (!output_ok(a.output, "table|json|yaml")) {
		ret = usage_error(cmd, "-o %s: expected table, json or yaml",
		    a.output);
		goto out;
	}
	if (a.all && O.namespace != NULL) {
		ret = usage_error(cmd, "-A and -n exclude each other");
		goto out;
	}
	ret = conn_open();
	if (ret != 0)
		goto out;
	if (k8s_list(C.api, &K8S_AGENTTASK, a.all ? NULL : C.ns, NULL, &list,
	    &st) < 0) {
		ret = api_fail(&st);
		goto out;
	}
	items = sorted_items(list);
	ret = 0;
	if (strcmp(a.output, "json") == 0) {
		print_json(items);
		goto out;
	}
	if (strcmp(a.output, "yaml") == 0) {
		print_yaml(items);
		goto out;
	}
	term_clean(items);
	if (json_array_size(items) == 0) {
		if (a.all)
			fprintf(stderr, "No tasks found.\n");
		else
			fprintf(stderr, "No tasks found in namespace %s.\n",
			    C.ns);
		goto out;
	}
	off = a.all ? 0 : 1;
	table_release(&t);
	table_init(&t, 7 - off);
	table_row(&t, head + off, NULL);
	json_array_foreach(items, i, it) {
		phase = task_phase(it);
		money(task_cost(it), used);
		used_of(used, task_spec_usd(it), 1, cost, sizeof(cost));
		snprintf(used, sizeof(used), "%" PRId64, jint(it, "status",
		    "tokensConsumed"));
		used_of(used, jint(it, "spec", "budgetTokens"), 0, tokens,
		    sizeof(tokens));
		snprintf(used, sizeof(used), "%" PRId64, jint(it, "status",
		    "iteration"));
		used_of(used, jint(it, "spec", "maxIterations"), 0, iter,
		    sizeof(iter));
		age_of(k8s_meta_str(it, "creationTimestamp"), age);
		cells[0] = k8s_meta_str(it, "namespace");
		cells[1] = k8s_meta_str(it, "name");
		cells[2] = phase != NULL ? phase : "-";
		if (k8s_task_queued(it, NULL)) {
			/* Pending or Paused */
			snprintf(queued, sizeof(queued), "%s (%s)", phase,
			    K8S_TASK_REASON_QUEUED);
			cells[2] = queued;
		}
		cells[3] = cost;
		cells[4] = tokens;
		cells[5] = iter;
		cells[6] = age;
		memset(colors, 0, sizeof(colors));
		colors[2] = phase_color(phase);
		table_row(&t, cells + off, colors + off);
	}
	table_print(&t, "");
out:
	table_release(&t);
	json_decref(list);
	json_decref(items);
	k8s_status_release(&st);
	return ret;
}

/* ---- task status ---- */

struct name_args {
	const char *output;
	int follow;
	const char *budget;
	const char *tokens;
};

static int
name_opt(const struct command *cmd, int c, const char *arg, void *ctx)
{
	struct name_args *a = ctx;

	switch (c) {
	case 'o':
		a->output = arg;
		return 0;
	case 'f':
		a->follow = 1;
		return 0;
	case OPT_BUDGET:
		a->budget = arg;
		return 0;
	case OPT_TOKENS:
		a->tokens = arg;
		return 0;
	default:
		return usage_error(cmd, NULL);
	}
}

/* A line of the status report: "Label:" padded, then the value. */
static void
field(const char *label, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
field(const char *label, const char *fmt, ...)
{
	va_list ap;

	printf("%s:%*s", label, (int)(14 - strlen(label)), "");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	fputc('\n', stdout);
}

static const char *
source_name(enum k8s_task_source s)
{
	switch (s) {
	case K8S_TASK_TOKEN:
		return ", from its token";
	case K8S_TASK_DEFAULT:
		return ", the default";
	default:
		return "";
	}
}

/* "$1.20 of $5.00 (24%)", "... (no limit)", "... over budget". */
static void
spend_line(const char *label, int64_t used, const struct k8s_task_limit *l,
    int usd)
{
	char u[40], lim[40];
	double pct;

	if (usd)
		money(used, u);
	else
		snprintf(u, sizeof(u), "%" PRId64, used);
	if (l->source == K8S_TASK_UNKNOWN) {
		field(label, "%s (budget: the configured default, not known "
		    "until the task has a token)", u);
		return;
	}
	if (l->value == 0) {
		field(label, "%s (no limit%s)", u, source_name(l->source));
		return;
	}
	if (usd)
		money(l->value, lim);
	else
		snprintf(lim, sizeof(lim), "%" PRId64, l->value);
	pct = floor((double)used * 100.0 / (double)l->value);
	field(label, "%s of %s (%.0f%%%s)%s", u, lim, pct,
	    source_name(l->source), used >= l->value ? ", budget spent" : "");
}

/* One entry of "Recent transitions". */
struct transition {
	int64_t at;
	char *what;
};

static int
cmp_transition(const void *pa, const void *pb)
{
	const struct transition *a = pa, *b = pb;

	return a->at < b->at ? -1 : a->at > b->at;
}

static void
add_transition(struct transition **v, size_t *n, const char *ts,
    char *what)
{
	int64_t at;

	if (time_parse_rfc3339(ts, &at) < 0) {
		free(what);
		return;
	}
	*v = xrealloc(*v, (*n + 1) * sizeof(**v));
	(*v)[*n].at = at;
	(*v)[*n].what = what;
	(*n)++;
}

static void
print_conditions(const json_t *task)
{
	static const char *const head[] = { "TYPE", "STATUS", "REASON", "AGE",
		"MESSAGE" };
	const json_t *conds = jget(task, "status", "conditions");
	const char *cells[5];
	struct table t;
	json_t *c;
	char age[32];
	size_t i;

	if (json_array_size(conds) == 0) {
		field("Conditions", "(none)");
		return;
	}
	printf("Conditions:\n");
	table_init(&t, 5);
	table_row(&t, head, NULL);
	json_array_foreach(conds, i, c) {
		age_of(jstr(c, "lastTransitionTime", NULL), age);
		cells[0] = jstr(c, "type", NULL);
		cells[1] = jstr(c, "status", NULL);
		cells[2] = jstr(c, "reason", NULL);
		cells[3] = age;
		cells[4] = jstr(c, "message", NULL);
		if (cells[2] == NULL || cells[2][0] == '\0')
			cells[2] = "-";
		table_row(&t, cells, NULL);
	}
	table_print(&t, "  ");
	table_release(&t);
}

static void
print_transitions(const json_t *task)
{
	const json_t *conds = jget(task, "status", "conditions");
	struct transition *v = NULL;
	struct table t;
	const char *cells[2], *reason, *phase = task_phase(task);
	char age[32];
	size_t n = 0, i;
	json_t *c;

	add_transition(&v, &n, jstr(task, "metadata", "creationTimestamp"),
	    xstrdup("created"));
	add_transition(&v, &n, jstr(task, "status", "startedAt"),
	    xstrdup("started"));
	json_array_foreach(conds, i, c) {
		reason = jstr(c, "reason", NULL);
		add_transition(&v, &n, jstr(c, "lastTransitionTime", NULL),
		    reason != NULL && reason[0] != '\0' ?
		    xasprintf("%s=%s (%s)", or_dash(jstr(c, "type", NULL)),
		    or_dash(jstr(c, "status", NULL)), reason) :
		    xasprintf("%s=%s", or_dash(jstr(c, "type", NULL)),
		    or_dash(jstr(c, "status", NULL))));
	}
	add_transition(&v, &n, jstr(task, "status", "completedAt"),
	    xasprintf("finished (%s)", phase != NULL ? phase : "-"));
	/* stable: equal times keep the order above */
	for (i = 0; i < n; i++)
		v[i].at = v[i].at * 64 + (int64_t)i;
	if (n > 0)
		qsort(v, n, sizeof(*v), cmp_transition);
	printf("Recent transitions:\n");
	table_init(&t, 2);
	for (i = n > MAX_TRANSITIONS ? n - MAX_TRANSITIONS : 0; i < n; i++) {
		time_human_duration(now_s - v[i].at / 64, age);
		cells[0] = age;
		cells[1] = v[i].what;
		table_row(&t, cells, NULL);
	}
	table_print(&t, "  ");
	table_release(&t);
	for (i = 0; i < n; i++)
		free(v[i].what);
	free(v);
}

/* What a person may do next, from the phase. */
static void
print_next(const json_t *task, const struct k8s_task_budgets *b)
{
	const char *name = or_dash(k8s_meta_str(task, "name"));
	const char *phase = task_phase(task);
	const char *reason = jstr(task, "status", "reason");
	const char *msg = jstr(task, "status", "message");
	int susp = json_is_true(jget(task, "spec", "suspended"));
	int spent = (b->usd.value > 0 && task_cost(task) >= b->usd.value) ||
	    (b->tokens.value > 0 &&
	    jint(task, "status", "tokensConsumed") >= b->tokens.value);

	if (phase != NULL && (strcmp(phase, "Completed") == 0 ||
	    strcmp(phase, "Failed") == 0)) {
		printf("Next:          finished; run it again with \"/diverge "
		    "fix\" on its pull request, or create a new task\n");
		return;
	}
	printf("Next:\n");
	if (!susp && k8s_task_queued(task, NULL)) {
		printf("  wait: it starts when a running task finishes or is "
		    "paused (controller.max_active_tasks)\n");
		printf("  diverge task pause %s    leave the queue\n", name);
		return;
	}
	if (susp || (phase != NULL && (strcmp(phase, "Paused") == 0 ||
	    strcmp(phase, "Pausing") == 0))) {
		if (msg != NULL && strcmp(msg, "max iterations exceeded") == 0)
			printf("  raise spec.maxIterations, then: diverge task "
			    "resume %s\n", name);
		else if (spent || (reason != NULL &&
		    strcmp(reason, "BudgetExceeded") == 0))
			printf("  diverge task resume %s --budget +USD "
			    "[--tokens N]    add to the budget and resume\n",
			    name);
		else
			printf("  diverge task resume %s\n", name);
		return;
	}
	printf("  diverge task logs %s -f\n", name);
	printf("  diverge task guide %s \"<hint>\"\n", name);
	printf("  diverge task pause %s\n", name);
	if (spent)
		printf("  diverge task budget %s --budget +USD [--tokens N]\n",
		    name);
}

/* The report of "task status": everything needed to decide. */
static void
print_status(const json_t *task)
{
	struct k8s_task_budgets b;
	const char *phase = task_phase(task), *col = phase_color(phase);
	const char *reason = jstr(task, "status", "reason");
	const char *msg = jstr(task, "status", "message");
	const char *s, *base, *work;
	int64_t max;
	char when[32];

	k8s_task_budgets(C.api, task, -1, -1, &b);
	field("Name", "%s", or_dash(k8s_meta_str(task, "name")));
	field("Namespace", "%s", or_dash(k8s_meta_str(task, "namespace")));
	printf("Phase:         %s%s%s", col != NULL ? col : "",
	    phase != NULL ? phase : "(not reported yet)",
	    col != NULL ? "\033[0m" : "");
	if (reason != NULL && reason[0] != '\0')
		printf(" (%s%s%s)", reason, msg != NULL && msg[0] != '\0' ?
		    ": " : "", msg != NULL ? msg : "");
	else if (msg != NULL && msg[0] != '\0')
		printf(" (%s)", msg);
	fputc('\n', stdout);
	if (json_is_true(jget(task, "spec", "suspended")))
		field("Suspended", "yes%s", phase != NULL &&
		    strcmp(phase, "Paused") == 0 ? "" :
		    " (pause requested)");
	field("Objective", "%s", or_dash(jstr(task, "spec", "objective")));
	s = jstr(jget(task, "spec", "repository"), "url", NULL);
	if (s != NULL) {
		field("Repository", "%s", s);
		base = jstr(jget(task, "spec", "repository"), "baseBranch",
		    NULL);
		work = jstr(jget(task, "spec", "repository"), "workingBranch",
		    NULL);
		if (base != NULL || work != NULL)
			field("Branch", "%s (from %s)", work != NULL ? work :
			    "-", base != NULL ? base : "-");
	}
	spend_line("Spend", task_cost(task), &b.usd, 1);
	spend_line("Tokens", jint(task, "status", "tokensConsumed"),
	    &b.tokens, 0);
	max = jint(task, "spec", "maxIterations");
	if (max > 0)
		field("Iteration", "%" PRId64 " of %" PRId64, jint(task,
		    "status", "iteration"), max);
	else
		field("Iteration", "%" PRId64 " (no limit)", jint(task,
		    "status", "iteration"));
	if (jint(task, "status", "run") > 0)
		field("Run", "%" PRId64, jint(task, "status", "run"));
	if (json_is_integer(jget(task, "status", "activeSeconds"))) {
		time_human_duration(jint(task, "status", "activeSeconds"),
		    when);
		field("Active for", "%s", when);
	}
	s = jstr(task, "status", "sandboxName");
	field("Sandbox", "%s", s != NULL && s[0] != '\0' ? s : "(none yet)");
	s = jstr(task, "status", "previewUrl");
	if (s == NULL)
		s = json_string_value(json_object_get(jget(task, "metadata",
		    "annotations"), "divergedev.com/preview-url"));
	field("Preview", "%s", s != NULL && s[0] != '\0' ? s : "(none)");
	s = task_guidance(task);
	if (s != NULL)
		field("Guidance", "%s", s);
	s = jstr(task, "status", "tokenId");
	if (s != NULL && s[0] != '\0')
		field("Token", "%s", s);
	age_of(jstr(task, "metadata", "creationTimestamp"), when);
	field("Created", "%s (%s ago)", or_dash(jstr(task, "metadata",
	    "creationTimestamp")), when);
	print_conditions(task);
	print_transitions(task);
	print_next(task, &b);
}

static const char task_status_options[] =
    "Shows a task: phase and reason, spend against the budgets (the\n"
    "spec's, else the caveats of the task's token), iteration, sandbox,\n"
    "preview URL, guidance, conditions, recent transitions, and the\n"
    "commands that make sense next.\n"
    "\n"
    "Options:\n"
    "  -o, --output FORMAT       table (default), json (the object as the\n"
    "                            API returns it, keys sorted) or yaml\n";

/* Read one task; 0, or an exit status after a message. */
static int
get_task(const char *name, json_t **out)
{
	struct k8s_status st = { 0 };
	int ret = 0;

	if (k8s_get(C.api, &K8S_AGENTTASK, C.ns, name, out, &st) < 0)
		ret = api_fail(&st);
	k8s_status_release(&st);
	return ret;
}

/* Check that exactly one operand, the task name, remains. */
static int
one_name(const struct command *cmd, int argc, char **argv, int extra)
{
	int n = argc - optind;

	if (n < 1)
		return usage_error(cmd, "a task name is required");
	if (n > 1 + extra)
		return usage_error(cmd, "unexpected argument '%s'",
		    argv[optind + 1 + extra]);
	if (n < 1 + extra)
		return usage_error(cmd, "%s", "a hint is required");
	if (!segment_ok(argv[optind]))
		return usage_error(cmd, "'%s': a valid task name is required",
		    argv[optind]);
	return 0;
}

/* diverge task status NAME: the report. */
static int
cmd_task_status(const struct command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "output", required_argument, NULL, 'o' },
		{ NULL, 0, NULL, 0 }
	};
	struct name_args a = { "table", 0, NULL, NULL };
	json_t *task = NULL;
	int ret, done;

	ret = parse_opts(cmd, argc, argv, longopts, "o:", name_opt, &a,
	    &done);
	if (done)
		return ret;
	ret = one_name(cmd, argc, argv, 0);
	if (ret != 0)
		return ret;
	if (!output_ok(a.output, "table|json|yaml"))
		return usage_error(cmd, "-o %s: expected table, json or yaml",
		    a.output);
	ret = conn_open();
	if (ret == 0)
		ret = get_task(argv[optind], &task);
	if (ret != 0)
		goto out;
	if (strcmp(a.output, "json") == 0)
		print_json(task);
	else if (strcmp(a.output, "yaml") == 0)
		print_yaml(task);
	else {
		term_clean(task);
		print_status(task);
	}
out:
	json_decref(task);
	return ret;
}

/* ---- task logs ---- */

/* Writes the body of a 2xx answer to stdout, keeps an error's. */
/* A piece of the pod's log, to stdout as it comes. */
static int
log_out(void *arg, const char *data, size_t len)
{
	(void)arg;
	if (fwrite(data, 1, len, stdout) != len)
		return -1;
	fflush(stdout);
	return 0;
}

/*
 * Stream the log of pod through the pods/log subresource, through the
 * REST client (its TLS, credentials and timeouts).
 */
static int
pod_log(const char *pod, int follow)
{
	struct k8s_status st = { 0 };
	char *ens = curl_easy_escape(NULL, C.ns, 0);
	char *epod = curl_easy_escape(NULL, pod, 0);
	char *path = xasprintf("/api/v1/namespaces/%s/pods/%s/log%s", ens,
	    epod, follow ? "?follow=true" : "");
	int ret = 0;

	if (k8s_rest_stream(C.api, path, follow ? 0 : 60000, log_out, NULL,
	    &st) < 0)
		ret = api_fail(&st);
	k8s_status_release(&st);
	curl_free(ens);
	curl_free(epod);
	free(path);
	return ret;
}

/* Kubernetes mode: the log of the task's sandbox pod. */
static int
logs_pod(const json_t *task, int follow)
{
	const char *name = or_dash(k8s_meta_str(task, "name"));
	const char *sb = jstr(task, "status", "sandboxName"), *pod;
	const char *phase = task_phase(task);
	json_t *sandbox = NULL;
	char *p;
	int ret;

	if (sb == NULL || sb[0] == '\0') {
		errorf("task \"%s\" has no sandbox yet (phase %s)", name,
		    phase != NULL ? phase : "not reported");
		return EXIT_REFUSED;
	}
	/* the pod agent-sandbox tracks, else the one named after it */
	pod = sb;
	if (k8s_get(C.api, &K8S_SANDBOX, C.ns, sb, &sandbox, NULL) == 0) {
		p = (char *)json_string_value(json_object_get(jget(sandbox,
		    "metadata", "annotations"), "agents.x-k8s.io/pod-name"));
		if (p != NULL && p[0] != '\0')
			pod = p;
	}
	ret = pod_log(pod, follow);
	json_decref(sandbox);
	return ret;
}

/* The state a history line is computed from. */
static int
str_changed(const char *a, const char *b)
{
	if (a == NULL || b == NULL)
		return a != b;
	return strcmp(a, b) != 0;
}

/* Append "; " between the parts of a line. */
static void
part(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2,
    3)));

static void
part(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	char *s;

	va_start(ap, fmt);
	s = xvasprintf(fmt, ap);
	va_end(ap);
	if (b->len > 0)
		buf_addstr(b, "; ");
	buf_addstr(b, s);
	free(s);
}

/* The creation line of a task, or with what "now:" its spec now. */
static void
created_line(const json_t *t, struct buf *b, const char *what)
{
	char m[40];

	part(b, "%s: \"%s\"", what, or_dash(jstr(t, "spec", "objective")));
	if (task_spec_usd(t) > 0) {
		money(task_spec_usd(t), m);
		part(b, "budget %s", m);
	}
	if (jint(t, "spec", "budgetTokens") > 0)
		part(b, "%" PRId64 " tokens", jint(t, "spec", "budgetTokens"));
	if (jint(t, "spec", "maxIterations") > 0)
		part(b, "%" PRId64 " iterations", jint(t, "spec",
		    "maxIterations"));
}

/* What changed from a to b, as one line (empty when nothing shown). */
static void
change_line(const json_t *a, const json_t *b, struct buf *out)
{
	const char *pa = task_phase(a), *pb = task_phase(b), *r, *m;
	int sa = json_is_true(jget(a, "spec", "suspended"));
	int sb = json_is_true(jget(b, "spec", "suspended"));
	char m1[40], m2[40];

	if (str_changed(pa, pb)) {
		r = jstr(b, "status", "reason");
		m = jstr(b, "status", "message");
		if (r != NULL && r[0] != '\0')
			part(out, "phase %s (%s%s%s)", pb != NULL ? pb : "-",
			    r, m != NULL && m[0] != '\0' ? ": " : "",
			    m != NULL ? m : "");
		else
			part(out, "phase %s", pb != NULL ? pb : "-");
	}
	if (sa != sb)
		part(out, sb ? "pause requested" : "resume requested");
	if (task_spec_usd(a) != task_spec_usd(b)) {
		money(task_spec_usd(a), m1);
		money(task_spec_usd(b), m2);
		part(out, "USD budget %s -> %s", task_spec_usd(a) > 0 ? m1 :
		    "-", task_spec_usd(b) > 0 ? m2 : "-");
	}
	if (jint(a, "spec", "budgetTokens") != jint(b, "spec",
	    "budgetTokens"))
		part(out, "token budget %" PRId64 " -> %" PRId64, jint(a,
		    "spec", "budgetTokens"), jint(b, "spec", "budgetTokens"));
	if (str_changed(task_guidance(a), task_guidance(b)) &&
	    task_guidance(b) != NULL)
		part(out, "guidance: \"%s\"", task_guidance(b));
	if (jint(a, "status", "run") != jint(b, "status", "run"))
		part(out, "run %" PRId64, jint(b, "status", "run"));
	if (task_cost(a) != task_cost(b) || jint(a, "status",
	    "tokensConsumed") != jint(b, "status", "tokensConsumed") ||
	    jint(a, "status", "iteration") != jint(b, "status",
	    "iteration")) {
		money(task_cost(b), m2);
		part(out, "iteration %" PRId64 ": %s spent, %" PRId64 " tokens",
		    jint(b, "status", "iteration"), m2, jint(b, "status",
		    "tokensConsumed"));
	}
}

/* A task as it was when created: no status, not suspended, no guidance. */
static json_t *
baseline_of(const json_t *t)
{
	json_t *b = json_deep_copy(t);

	json_object_del(b, "status");
	json_object_del(json_object_get(b, "spec"), "suspended");
	json_object_del(json_object_get(json_object_get(b, "metadata"),
	    "annotations"), K8S_TASK_ANNOTATION_GUIDANCE);
	return b;
}

/* Print one history line (nothing when empty). */
static void
emit_line(struct buf *b)
{
	if (b->len > 0) {
		printf("%s\n", b->data);
		fflush(stdout);
	}
	buf_reset(b);
}

/* A summary of a task's current state, for when history is missing. */
static void
state_line(const json_t *t, struct buf *b)
{
	json_t *base = baseline_of(t);

	change_line(base, t, b);
	if (b->len == 0)
		part(b, "phase %s", task_phase(t) != NULL ? task_phase(t) :
		    "-");
	json_decref(base);
}

/*
 * Embedded mode: the task's history from the store's watch window
 * (resourceVersion 1 on: every retained change), then, following, the
 * changes as they come. Without --follow it ends at the version read.
 */
static int
logs_history(const json_t *task, int follow)
{
	const char *name = or_dash(k8s_meta_str(task, "name"));
	struct k8s_list_opts lo;
	struct k8s_status st = { 0 };
	struct k8s_watch *w = NULL;
	struct k8s_event ev;
	struct buf line;
	json_t *prev = NULL, *cur = NULL;
	char *fsel = xasprintf("metadata.name=%s", name), rvs[32];
	int64_t upto = k8s_resource_version(task), rv = 1;
	int rc, ret = EXIT_REFUSED, gone = 0;

	buf_init(&line, MAX_TEXT);
	memset(&ev, 0, sizeof(ev));
	for (;;) {
		memset(&lo, 0, sizeof(lo));
		lo.field_selector = fsel;
		snprintf(rvs, sizeof(rvs), "%" PRId64, rv);
		lo.resource_version = rvs;
		if (k8s_watch(C.api, &K8S_AGENTTASK, C.ns, &lo, &w, &st) < 0) {
			ret = api_fail(&st);
			goto out;
		}
		for (;;) {
			if (prev == NULL && rv >= upto) {
				/* created at or before the start: no event */
				created_line(task, &line, "created");
				emit_line(&line);
				prev = json_deep_copy(task);
			}
			if (!follow && rv >= upto && prev != NULL) {
				ret = 0;
				goto out;
			}
			rc = k8s_watch_next(w, follow ? 60000 :
			    HISTORY_QUIET_MS, &ev, &st);
			if (rc == 0) {
				if (!follow) {
					ret = 0;
					goto out;
				}
				continue;
			}
			if (rc < 0)
				break;
			if (ev.type == K8S_BOOKMARK || ev.type == K8S_ERROR) {
				json_decref(ev.object);
				ev.object = NULL;
				continue;
			}
			rv = ev.rv > rv ? ev.rv : rv;
			cur = ev.object;
			ev.object = NULL;
			term_clean(cur);
			if (ev.type == K8S_DELETED) {
				printf("deleted\n");
				ret = 0;
				goto out;
			}
			if (prev == NULL && ev.type == K8S_ADDED && !gone) {
				created_line(cur, &line, "created");
			} else if (prev == NULL) {
				/* the creation is older than the window */
				if (!gone)
					created_line(cur, &line, "created");
				emit_line(&line);
				prev = baseline_of(cur);
				if (gone)
					state_line(cur, &line);
				else
					change_line(prev, cur, &line);
			} else
				change_line(prev, cur, &line);
			emit_line(&line);
			json_decref(prev);
			prev = cur;
			cur = NULL;
		}
		k8s_watch_free(w);
		w = NULL;
		if (rc != K8S_EGONE) {
			ret = api_fail(&st);
			goto out;
		}
		/* the window no longer holds it: say so, go on from now */
		k8s_status_release(&st);
		json_decref(cur);
		cur = NULL;
		if (get_task(name, &cur) != 0)
			goto out;
		if (prev == NULL) {
			printf("(the older history of \"%s\" is no longer "
			    "kept)\n", name);
			created_line(cur, &line, "now");
			emit_line(&line);
			prev = baseline_of(cur);
		}
		change_line(prev, cur, &line);
		emit_line(&line);
		json_decref(prev);
		prev = cur;
		cur = NULL;
		rv = k8s_resource_version(prev);
		upto = rv;
		gone = 1;
		if (!follow) {
			ret = 0;
			goto out;
		}
	}
out:
	k8s_watch_free(w);
	json_decref(ev.object);
	json_decref(prev);
	json_decref(cur);
	buf_release(&line);
	k8s_status_release(&st);
	free(fsel);
	return ret;
}

static const char task_logs_options[] =
    "In a Kubernetes cluster (--kubeconfig, --context, --in-cluster):\n"
    "the log of the task's sandbox pod, through the pods/log API. With\n"
    "diverged's embedded store (which runs no pods): the task's history\n"
    "as the store's watch window holds it, one line per change (phase,\n"
    "pause and resume, budgets, guidance, metered spend).\n"
    "\n"
    "Options:\n"
    "  -f, --follow              keep printing as it goes (until the task\n"
    "                            is deleted, or interrupted)\n";

/* diverge task logs NAME [-f]. */
static int
cmd_task_logs(const struct command *cmd, int argc, char **argv)
{
	static const struct option longopts[] = {
		{ "follow", no_argument, NULL, 'f' },
		{ NULL, 0, NULL, 0 }
	};
	struct name_args a = { NULL, 0, NULL, NULL };
	json_t *task = NULL;
	int ret, done;

	ret = parse_opts(cmd, argc, argv, longopts, "f", name_opt, &a,
	    &done);
	if (done)
		return ret;
	ret = one_name(cmd, argc, argv, 0);
	if (ret != 0)
		return ret;
	ret = conn_open();
	if (ret == 0)
		ret = get_task(argv[optind], &task);
	if (ret == 0 && !C.kube)
		term_clean(task);
	if (ret == 0)
		ret = C.kube ? logs_pod(task, a.follow) :
		    logs_history(task, a.follow);
	json_decref(task);
	return ret;
}

/* ---- guide, pause, resume, budget ---- */

static const char task_guide_options[] =
    "Sets the task's guidance (annotation divergedev.com/guidance): the\n"
    "agent receives it with the answer to its next metered LLM call. The\n"
    "hint replaces the previous one; at most 2000 bytes.\n"
    "\n"
    "Options:\n";

/* diverge task guide NAME HINT. */
static int
cmd_task_guide(const struct command *cmd, int argc, char **argv)
{
	struct k8s_status st = { 0 };
	char *cause = NULL;
	int ret, done;

	ret = parse_opts(cmd, argc, argv, NULL, "", NULL, NULL, &done);
	if (done)
		return ret;
	ret = one_name(cmd, argc, argv, 1);
	if (ret != 0)
		return ret;
	if (k8s_task_check_hint(argv[optind + 1], &cause) < 0) {
		ret = usage_error(cmd, "%s", cause);
		free(cause);
		return ret;
	}
	ret = conn_open();
	if (ret != 0)
		return ret;
	if (k8s_task_guide(C.api, C.ns, argv[optind], argv[optind + 1], NULL,
	    NULL, &st) < 0)
		ret = api_fail(&st);
	else
		printf("task \"%s\": guidance set; the agent gets it on its "
		    "next LLM call\n", argv[optind]);
	k8s_status_release(&st);
	return ret;
}

static const char task_pause_options[] =
    "Sets spec.suspended: the task goes through Pausing to Paused, its\n"
    "token is revoked, its sandbox suspended (the workspace is kept) and\n"
    "its preview hibernated. \"diverge task resume\" undoes it.\n"
    "\n"
    "Options:\n";

/* diverge task pause NAME. */
static int
cmd_task_pause(const struct command *cmd, int argc, char **argv)
{
	struct k8s_status st = { 0 };
	json_t *task = NULL;
	const char *phase;
	int ret, done;

	ret = parse_opts(cmd, argc, argv, NULL, "", NULL, NULL, &done);
	if (done)
		return ret;
	ret = one_name(cmd, argc, argv, 0);
	if (ret != 0)
		return ret;
	ret = conn_open();
	if (ret != 0)
		return ret;
	if (k8s_task_pause(C.api, C.ns, argv[optind], NULL, &task, &st) < 0)
		ret = api_fail(&st);
	else {
		phase = task_phase(task);
		if (phase != NULL && strcmp(phase, "Paused") == 0)
			printf("task \"%s\" is paused\n", argv[optind]);
		else
			printf("task \"%s\": pause requested (phase %s)\n",
			    argv[optind], phase != NULL ? phase : "-");
	}
	json_decref(task);
	k8s_status_release(&st);
	return ret;
}

/* Parse --budget and --tokens bumps; 0 or an exit status. */
static int
parse_bumps(const struct command *cmd, const struct name_args *a,
    struct k8s_task_bump *b)
{
	char *cause = NULL;
	int ret;

	memset(b, 0, sizeof(*b));
	b->default_usd_micro = -1;
	b->default_tokens = -1;
	if (a->budget != NULL && k8s_task_parse_usd(a->budget,
	    K8S_TASK_MAX_BUMP_USD_MICRO, &b->usd_micro, &cause) < 0) {
		ret = usage_error(cmd, "--budget %s", cause);
		free(cause);
		return ret;
	}
	if (a->tokens != NULL && k8s_task_parse_tokens(a->tokens,
	    K8S_TASK_MAX_BUMP_TOKENS, &b->tokens, &cause) < 0) {
		ret = usage_error(cmd, "--tokens %s", cause);
		free(cause);
		return ret;
	}
	return 0;
}

/* ", USD budget $20.00, token budget 3000000" for what was bumped. */
static void
bumped(const json_t *task, const struct k8s_task_bump *b, struct buf *out)
{
	char m[40];

	if (b->usd_micro > 0) {
		money(task_spec_usd(task), m);
		part(out, "USD budget now %s", m);
	}
	if (b->tokens > 0)
		part(out, "token budget now %" PRId64, jint(task, "spec",
		    "budgetTokens"));
}

/* Warn when a resumed task is still over a budget: it pauses again. */
static void
warn_spent(const json_t *task)
{
	struct k8s_task_budgets b;
	const char *name = or_dash(k8s_meta_str(task, "name"));
	char u[40], l[40];

	k8s_task_budgets(C.api, task, -1, -1, &b);
	if (b.usd.value > 0 && task_cost(task) >= b.usd.value) {
		money(task_cost(task), u);
		money(b.usd.value, l);
		fprintf(stderr, "diverge: warning: task \"%s\" has spent %s of "
		    "its %s budget and pauses again at its next LLM call; "
		    "add to it with --budget +USD\n", name, u, l);
	}
	if (b.tokens.value > 0 && jint(task, "status", "tokensConsumed") >=
	    b.tokens.value)
		fprintf(stderr, "diverge: warning: task \"%s\" has used %"
		    PRId64 " of its %" PRId64 " tokens and pauses again at its "
		    "next LLM call; add to them with --tokens N\n", name,
		    jint(task, "status", "tokensConsumed"), b.tokens.value);
}

static const char task_resume_options[] =
    "Optionally adds to the budgets, then clears spec.suspended, in one\n"
    "write: the task is provisioned again with a fresh token. Bumps add\n"
    "to the effective budget (the spec's, else the token's caveat) and\n"
    "write the sum into the spec; an unlimited budget stays unlimited.\n"
    "\n"
    "Options:\n"
    "      --budget +USD         add to the USD budget, e.g. +15.00\n"
    "      --tokens +N           add to the token budget, e.g. 2000000, "
    "2M\n";

/*
 * diverge task resume|budget NAME [--budget +USD] [--tokens N]: the
 * bumps, then the resume (which also clears spec.suspended) or the
 * budget write.
 */
static int
bump_task(const struct command *cmd, int argc, char **argv, int resume)
{
	static const struct option longopts[] = {
		{ "budget", required_argument, NULL, OPT_BUDGET },
		{ "tokens", required_argument, NULL, OPT_TOKENS },
		{ NULL, 0, NULL, 0 }
	};
	struct name_args a = { NULL, 0, NULL, NULL };
	struct k8s_status st = { 0 };
	struct k8s_task_bump b;
	struct buf line;
	json_t *task = NULL;
	int ret, done;

	buf_init(&line, MAX_TEXT);
	ret = parse_opts(cmd, argc, argv, longopts, "", name_opt, &a, &done);
	if (done)
		goto out;
	ret = one_name(cmd, argc, argv, 0);
	if (ret == 0 && !resume && a.budget == NULL && a.tokens == NULL)
		ret = usage_error(cmd, "--budget or --tokens is required");
	if (ret == 0)
		ret = parse_bumps(cmd, &a, &b);
	if (ret == 0)
		ret = conn_open();
	if (ret != 0)
		goto out;
	if ((resume ? k8s_task_resume : k8s_task_budget)(C.api, C.ns,
	    argv[optind], &b, NULL, &task, &st) < 0) {
		ret = api_fail(&st);
		goto out;
	}
	if (resume)
		part(&line, "task \"%s\": resume requested (phase %s)",
		    argv[optind], task_phase(task) != NULL ?
		    task_phase(task) : "-");
	bumped(task, &b, &line);
	if (resume) {
		printf("%s\n", line.data);
		warn_spent(task);
	} else {
		printf("task \"%s\": %s\n", argv[optind], line.data);
	}
out:
	buf_release(&line);
	json_decref(task);
	k8s_status_release(&st);
	return ret;
}

/* diverge task resume NAME [--budget +USD] [--tokens N]. */
static int
cmd_task_resume(const struct command *cmd, int argc, char **argv)
{
	return bump_task(cmd, argc, argv, 1);
}

static const char task_budget_options[] =
    "Adds to the task's effective USD and/or token budget (the spec's,\n"
    "else its token's caveat) and writes the sum into the spec; pausing\n"
    "is unchanged. An unlimited budget stays unlimited: its bump is\n"
    "refused. A task without a budget of its own and without a token yet\n"
    "cannot be bumped (the configured default is not known here).\n"
    "\n"
    "Options:\n"
    "      --budget +USD         add to the USD budget, e.g. +15.00\n"
    "      --tokens +N           add to the token budget, e.g. 2000000, "
    "2M\n";

/* diverge task budget NAME [--budget +USD] [--tokens N]. */
static int
cmd_task_budget(const struct command *cmd, int argc, char **argv)
{
	return bump_task(cmd, argc, argv, 0);
}

/* ---- token inspect ---- */

/* Read all of stdin into b (bounded); -1 after a message. */
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
    "the token claims. A malformed token exits with status 1.\n"
    "\n"
    "Options:\n";

/* diverge token inspect TOKEN|-: show a token's fields, unverified. */
static int
cmd_token_inspect(const struct command *cmd, int argc, char **argv)
{
	struct macaroon *m = NULL;
	struct buf in, out;
	const char *tok;
	char *cause = NULL;
	size_t len;
	int ret, done;

	buf_init(&in, MAX_STDIN_TOKEN);
	buf_init(&out, 4 * MACAROON_MAX_TOKEN + 4096);
	ret = parse_opts(cmd, argc, argv, NULL, "", NULL, NULL, &done);
	if (done)
		goto out;
	if (argc - optind != 1) {
		ret = usage_error(cmd, argc - optind == 0 ? "a token is "
		    "required" : "one token at a time");
		goto out;
	}
	ret = EXIT_REFUSED;
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
	{ "task", "init", "[--force]",
	    "Scaffold .diverge/agent.yaml in the current repository.",
	    task_init_options, 0, cmd_task_init },
	{ "task", "create", "\"OBJECTIVE\" [--name NAME] [--budget USD] "
	    "[--tokens N] [--max-iterations N] [--base-branch B] [--repo URL] "
	    "[--capability MODEL]... [--tool TOOL]... [--draft] "
	    "[-o name|json|yaml]",
	    "Create a task; its name is printed.",
	    task_create_options, 1, cmd_task_create },
	{ "task", "list", "[-n NS | -A] [-o table|json|yaml]",
	    "List tasks: phase, cost, tokens, iteration, age.",
	    task_list_options, 1, cmd_task_list },
	{ "task", "status", "NAME [-o table|json|yaml]",
	    "Show a task and what can be done next.",
	    task_status_options, 1, cmd_task_status },
	{ "task", "logs", "NAME [-f]",
	    "Show the sandbox log (Kubernetes) or the task's history.",
	    task_logs_options, 1, cmd_task_logs },
	{ "task", "guide", "NAME \"HINT\"",
	    "Send guidance to the running agent.",
	    task_guide_options, 1, cmd_task_guide },
	{ "task", "pause", "NAME",
	    "Pause a task (spec.suspended: true).",
	    task_pause_options, 1, cmd_task_pause },
	{ "task", "resume", "NAME [--budget +USD] [--tokens N]",
	    "Resume a paused task, optionally adding to its budget.",
	    task_resume_options, 1, cmd_task_resume },
	{ "task", "budget", "NAME [--budget +USD] [--tokens N]",
	    "Add to a task's budget.",
	    task_budget_options, 1, cmd_task_budget },
	{ "token", "inspect", "TOKEN|-",
	    "Show a capability token's identifier, location and caveats, "
	    "without verifying it.", token_inspect_options, 0,
	    cmd_token_inspect },
	{ NULL, NULL, NULL, NULL, NULL, 0, NULL }
};

static void
main_usage(FILE *f)
{
	const struct command *cmd;

	fprintf(f, "usage: diverge [CONNECTION OPTIONS] COMMAND [ARGS]\n"
	    "       diverge --version | --help\n\nCommands:\n");
	/* "token inspect" is one longer than the "task" lines */
	for (cmd = commands; cmd->group != NULL; cmd++)
		fprintf(f, "  %s %-*s %s\n", cmd->group,
		    (int)(13 - strlen(cmd->group)), cmd->name, cmd->about);
	fprintf(f, "\n%s\nRun 'diverge GROUP COMMAND --help' for a "
	    "command's options; see diverge(1).\n", connection_help);
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
	fprintf(f, "\nRun 'diverge %s COMMAND --help' for a command's "
	    "options.\n", group);
}

/* The connection options given before the command. */
static int
main_opts(int argc, char **argv)
{
	int c;

	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+:n:v", conn_longopts,
	    NULL)) != -1) {
		if (c == '?') {
			if (optopt != 0)
				return usage_error(NULL, "unknown option "
				    "'-%c'", optopt);
			return usage_error(NULL, "unknown option '%s'",
			    argv[optind - 1]);
		}
		if (c == ':')
			return usage_error(NULL, "option '%s' needs a value",
			    argv[optind - 1]);
		conn_opt(c, optarg);
	}
	return 0;
}

int
main(int argc, char **argv)
{
	const struct command *cmd;
	const char *group, *verb, *nc;
	int ret, i;

	util_json_init();
	log_setup(LOG_ERROR, 0);
	for (i = 1; i < argc && argv[i][0] == '-'; i++) {
		if (strcmp(argv[i], "--help") == 0 ||
		    strcmp(argv[i], "-h") == 0) {
			main_usage(stdout);
			return 0;
		}
		if (strcmp(argv[i], "--version") == 0) {
			printf("diverge %s\n", PACKAGE_VERSION);
			return 0;
		}
	}
	ret = main_opts(argc, argv);
	if (ret != 0)
		return ret;
	if (optind >= argc) {
		main_usage(stderr);
		return EXIT_USAGE;
	}
	if (init_now() < 0)
		return EXIT_USAGE;
	nc = getenv("NO_COLOR");
	use_color = isatty(STDOUT_FILENO) && (nc == NULL || nc[0] == '\0');
	group = argv[optind];
	if (strcmp(group, "help") == 0) {
		main_usage(stdout);
		return 0;
	}
	if (strcmp(group, "version") == 0) {
		printf("diverge %s\n", PACKAGE_VERSION);
		return 0;
	}
	if (!is_group(group))
		return usage_error(NULL, "unknown command '%s'", group);
	if (optind + 1 >= argc) {
		group_usage(stderr, group);
		return EXIT_USAGE;
	}
	verb = argv[optind + 1];
	if (strcmp(verb, "--help") == 0 || strcmp(verb, "-h") == 0 ||
	    strcmp(verb, "help") == 0) {
		group_usage(stdout, group);
		return 0;
	}
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
	ret = cmd->run(cmd, argc - optind - 1, argv + optind + 1);
	conn_close();
	if (fflush(stdout) != 0 || ferror(stdout)) {
		errorf("cannot write the output: %s", strerror(errno));
		return EXIT_REFUSED;
	}
	return ret;
}

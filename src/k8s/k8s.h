/*
 * k8s: one resource API over Kubernetes-style objects, with two backends
 * behind one ops table: the embedded SQLite store (embedded.c) and a REST
 * client for real API servers (rest.c, kubeconfig.c). The embedded store is
 * also served over HTTP as a small kube-apiserver (apiserver.c).
 *
 * Objects are jansson JSON objects shaped exactly as the Kubernetes API
 * sends them (apiVersion, kind, metadata, spec, status). Unless a comment
 * says otherwise, functions that take an object do not steal it, and
 * functions that return one through *out hand over a new reference.
 *
 * Every call returns 0 or a negative enum k8s_err; on error, when st is
 * not NULL, it is filled with the Kubernetes Status (release it with
 * k8s_status_release).
 */
#ifndef DIVERGE_K8S_H
#define DIVERGE_K8S_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* ---- resources ---- */

struct k8s_resource {
	const char *group;	/* "" for the core group */
	const char *version;
	const char *plural;
	const char *singular;
	const char *kind;
	const char *short_name;	/* or NULL */
	int namespaced;
	int has_status;		/* status subresource */
	/*
	 * The server tracks metadata.generation (1 on create, + 1 when
	 * anything but metadata and status changes): custom resources and
	 * NetworkPolicy; Secret and Lease have none, as on a cluster.
	 */
	int generation;
};

extern const struct k8s_resource K8S_AGENTTASK;	/* divergedev.com/v1alpha1 */
extern const struct k8s_resource K8S_ENVIRONMENT;
extern const struct k8s_resource K8S_SECRET;	/* v1 */
extern const struct k8s_resource K8S_SANDBOX;	/* agents.x-k8s.io/v1beta1 */
extern const struct k8s_resource K8S_SANDBOXCLAIM;
	/* extensions.agents.x-k8s.io/v1beta1 */
extern const struct k8s_resource K8S_NETWORKPOLICY; /* networking.k8s.io/v1 */
/* coordination.k8s.io/v1, for leader election: not in k8s_resources */
extern const struct k8s_resource K8S_LEASE;

/* The kinds the embedded store serves, NULL-terminated. */
extern const struct k8s_resource *const k8s_resources[];

/* Look a resource up by group, version and plural; NULL if unknown. */
const struct k8s_resource *k8s_resource_find(const char *group,
    const char *version, const char *plural);
/* "divergedev.com/v1alpha1" or "v1" for the core group (static buffer
 * owned by the resource table: valid for the program's life). */
const char *k8s_api_version(const struct k8s_resource *r);
/* "agenttasks.divergedev.com" or "secrets" (same lifetime). */
const char *k8s_qualified_plural(const struct k8s_resource *r);
/*
 * Whether r is a kind compiled into kube-apiserver (the core group and
 * *.k8s.io, but not the x-k8s.io of SIG projects' CRDs), not a custom
 * resource: strategic merge patches, and updates without a
 * resourceVersion (unconditional), are allowed for it.
 */
int k8s_resource_builtin(const struct k8s_resource *r);

/* ---- errors (Kubernetes Status) ---- */

enum k8s_err {
	K8S_OK = 0,
	K8S_ENOTFOUND = -1,	/* 404 NotFound */
	K8S_EEXISTS = -2,	/* 409 AlreadyExists */
	K8S_ECONFLICT = -3,	/* 409 Conflict (stale resourceVersion) */
	K8S_EINVALID = -4,	/* 422 Invalid */
	K8S_EGONE = -5,		/* 410 Expired / Gone */
	K8S_EUNAUTHORIZED = -6,	/* 401 */
	K8S_EFORBIDDEN = -7,	/* 403 */
	K8S_ETIMEOUT = -8,	/* 504 Timeout, or a client-side timeout */
	K8S_EBADREQUEST = -9,	/* 400 BadRequest */
	K8S_EUNAVAILABLE = -10,	/* transport failure, 503, 429 after retries */
	K8S_EINTERNAL = -11,	/* 500 and anything else */
	K8S_EUNSUPPORTED = -12	/* 415 UnsupportedMediaType, 405 */
};

struct k8s_status {
	enum k8s_err err;
	int code;		/* HTTP status */
	char *reason;		/* "NotFound", "Conflict", ... */
	char *message;		/* human-readable */
	json_t *details;	/* Status.details or NULL */
	/*
	 * Set by the REST client on a failed write when an attempt of it was
	 * answered 5xx or lost its answer: it may have taken effect anyway,
	 * so an AlreadyExists (create) or Conflict (update) after a retry
	 * may be the request's own doing. Never set by the embedded store.
	 */
	int maybe_done;
};

void k8s_status_release(struct k8s_status *st);
/* Fill st (if not NULL) and return err. message is copied. */
int k8s_status_set(struct k8s_status *st, enum k8s_err err,
    const char *message, json_t *details);
/* Build the error the apiserver would send for a resource and name. */
int k8s_error_notfound(struct k8s_status *st, const struct k8s_resource *r,
    const char *name);
int k8s_error_exists(struct k8s_status *st, const struct k8s_resource *r,
    const char *name);
int k8s_error_conflict(struct k8s_status *st, const struct k8s_resource *r,
    const char *name);
/*
 * DeleteOptions.preconditions against the object cur: 0 when uid and rv
 * (either may be NULL) match it, else the apiserver's 409 "Precondition
 * failed: ..." (K8S_ECONFLICT).
 */
int k8s_check_preconditions(struct k8s_status *st,
    const struct k8s_resource *r, const char *name, const json_t *cur,
    const char *uid, const char *rv);
/*
 * 422 for an update without metadata.resourceVersion of a kind that does
 * not allow unconditional updates (custom resources), worded as the
 * apiserver does: details.kind is the plural, as for the others.
 */
int k8s_error_rv_required(struct k8s_status *st,
    const struct k8s_resource *r, const char *name);
/* The Status JSON object for st (new reference). */
json_t *k8s_status_json(const struct k8s_status *st);
/* Parse a Status object (from a REST reply) into st; http code given. */
int k8s_status_from_json(struct k8s_status *st, int code, const json_t *j);
/* Map an HTTP status code and reason to the enum. */
enum k8s_err k8s_err_from_http(int code, const char *reason);
int k8s_err_http_code(enum k8s_err err);
const char *k8s_err_reason(enum k8s_err err);

/* ---- selectors ---- */

struct k8s_selector;
/*
 * Parse a label selector (=, ==, !=, in, notin, exists, !exists; comma
 * means AND). An empty or NULL string matches everything. -1 with *cause
 * on a syntax error.
 */
int k8s_selector_parse(const char *s, struct k8s_selector **out,
    char **cause);
/* Whether an object's metadata.labels match. */
int k8s_selector_match(const struct k8s_selector *sel, const json_t *obj);
void k8s_selector_free(struct k8s_selector *sel);
/*
 * Field selector: metadata.name and metadata.namespace with =, ==, !=.
 * Same contract as the label selector.
 */
int k8s_fieldsel_parse(const char *s, struct k8s_selector **out,
    char **cause);

/* ---- JSON helpers ---- */

/* RFC 7386 merge patch: a new object = target patched with patch. */
json_t *k8s_merge_patch(const json_t *target, const json_t *patch);
/* Convenience getters; NULL / 0 when absent. */
const char *k8s_meta_str(const json_t *obj, const char *field);
int64_t k8s_meta_int(const json_t *obj, const char *field);
/* metadata.resourceVersion as an integer (0 if absent or not a number). */
int64_t k8s_resource_version(const json_t *obj);

/*
 * Validate an object of a divergedev.com kind (other kinds: basic
 * metadata only) as the CRD schema does: required fields, types, ranges,
 * enums. On failure returns K8S_EINVALID with a Status whose message
 * names the field path, e.g. spec.objective: Required value.
 */
int k8s_validate(const struct k8s_resource *r, const json_t *obj,
    struct k8s_status *st);
/*
 * What an update of old into obj may not change, as the apiserver's
 * ObjectMeta update validation says: metadata.uid (when obj names one),
 * and no new finalizer on an object being deleted. 0, or K8S_EINVALID
 * with the 422 Status.
 */
int k8s_validate_update(const struct k8s_resource *r, const json_t *old,
    const json_t *obj, struct k8s_status *st);

/* ---- the API ---- */

struct k8s_api;
struct k8s_watch;

enum k8s_event_type {
	K8S_ADDED = 1,
	K8S_MODIFIED,
	K8S_DELETED,
	K8S_BOOKMARK,
	K8S_ERROR
};

struct k8s_event {
	enum k8s_event_type type;
	json_t *object;		/* owned by the caller after next() */
	int64_t rv;
};

const char *k8s_event_type_name(enum k8s_event_type t);

/*
 * DeleteOptions.propagationPolicy: what becomes of the dependents of a
 * deleted object (the objects whose metadata.ownerReferences name it).
 * Background (the default) and Foreground delete a dependent unless it
 * has another owner that still exists, which keeps it and loses only its
 * reference to the deleted one; Orphan keeps every dependent and removes
 * the reference.
 */
enum k8s_propagation {
	K8S_PROPAGATE_DEFAULT = 0,	/* the server's: Background */
	K8S_PROPAGATE_BACKGROUND,
	K8S_PROPAGATE_FOREGROUND,
	K8S_PROPAGATE_ORPHAN
};

/* "Background", "Foreground", "Orphan" ("Background" for the default). */
const char *k8s_propagation_name(enum k8s_propagation p);
/* The policy named s, exactly as the API spells it; -1 if none. */
int k8s_propagation_parse(const char *s, enum k8s_propagation *out);

/*
 * Options for list and watch. ns NULL = all namespaces (namespaced
 * resources). resource_version for watch: NULL or "0" = synthetic ADDED
 * for every current match, then changes; "N" = changes after N only.
 */
struct k8s_list_opts {
	const char *label_selector;
	const char *field_selector;
	const char *resource_version;
};

struct k8s_ops {
	const char *name;
	int (*get)(struct k8s_api *api, const struct k8s_resource *r,
	    const char *ns, const char *name, json_t **out,
	    struct k8s_status *st);
	/*
	 * *out = {"kind":"<Kind>List","apiVersion",...,"metadata":
	 * {"resourceVersion"},"items":[...]}, every item in one list. The
	 * REST backend reads it in chunks of 500 (limit, continue): one
	 * snapshot at the first page's resourceVersion.
	 */
	int (*list)(struct k8s_api *api, const struct k8s_resource *r,
	    const char *ns, const struct k8s_list_opts *opts, json_t **out,
	    struct k8s_status *st);
	/* name from obj.metadata.name (or generateName); ns from ns. */
	int (*create)(struct k8s_api *api, const struct k8s_resource *r,
	    const char *ns, const json_t *obj, json_t **out,
	    struct k8s_status *st);
	/*
	 * Replace spec and metadata (status changes ignored); 409 when obj's
	 * metadata.resourceVersion is stale. Without one, a custom resource
	 * gives 422 (CRDs allow no unconditional update) and a built-in kind
	 * (k8s_resource_builtin) is updated whatever its version.
	 */
	int (*update)(struct k8s_api *api, const struct k8s_resource *r,
	    const char *ns, const char *name, const json_t *obj,
	    json_t **out, struct k8s_status *st);
	/* The status subresource: only .status is taken from obj;
	 * resourceVersion as for update. */
	int (*update_status)(struct k8s_api *api, const struct k8s_resource *r,
	    const char *ns, const char *name, const json_t *obj,
	    json_t **out, struct k8s_status *st);
	/*
	 * RFC 7386 merge patch on the object (status ignored) or, with
	 * status != 0, on the status subresource (only .status applied). A
	 * metadata.resourceVersion in the patch makes it conditional (409).
	 */
	int (*patch)(struct k8s_api *api, const struct k8s_resource *r,
	    const char *ns, const char *name, int status, const json_t *patch,
	    json_t **out, struct k8s_status *st);
	/*
	 * Delete, the dependents as policy says; *out = the deleted object
	 * (may be NULL-ed by passing out NULL). uid and rv, when not NULL,
	 * are DeleteOptions.preconditions: the object must still have them,
	 * checked in the same step as the deletion, else K8S_ECONFLICT.
	 */
	int (*del)(struct k8s_api *api, const struct k8s_resource *r,
	    const char *ns, const char *name, enum k8s_propagation policy,
	    const char *uid, const char *rv, json_t **out,
	    struct k8s_status *st);
	/* Start a watch; events come from k8s_watch_next. */
	int (*watch)(struct k8s_api *api, const struct k8s_resource *r,
	    const char *ns, const struct k8s_list_opts *opts,
	    struct k8s_watch **out, struct k8s_status *st);
	/*
	 * Next event: 1 with *ev filled, 0 on timeout (no event within
	 * timeout_ms), or a negative error: K8S_EGONE when the watch fell
	 * behind the retained history (relist), others when the stream
	 * broke. After an error the watch is finished: free it.
	 */
	int (*watch_next)(struct k8s_watch *w, int timeout_ms,
	    struct k8s_event *ev, struct k8s_status *st);
	void (*watch_free)(struct k8s_watch *w);
	void (*free)(struct k8s_api *api);
};

/* A backend instance starts with its ops (and is allocated zeroed). */
struct k8s_api {
	const struct k8s_ops *ops;
	void *attached;			/* see k8s_api_attachment */
	void (*attached_free)(void *);
};

/* Watches start with their api. */
struct k8s_watch {
	struct k8s_api *api;
};

/* Dispatch helpers (same contracts as the ops). */
int k8s_get(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, json_t **out, struct k8s_status *st);
int k8s_list(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const struct k8s_list_opts *opts, json_t **out,
    struct k8s_status *st);
int k8s_create(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const json_t *obj, json_t **out, struct k8s_status *st);
int k8s_update(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, const json_t *obj, json_t **out,
    struct k8s_status *st);
int k8s_update_status(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, const json_t *obj, json_t **out,
    struct k8s_status *st);
int k8s_patch(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, int status, const json_t *patch,
    json_t **out, struct k8s_status *st);
/* k8s_delete: the default policy (Background); k8s_delete_policy: any. */
int k8s_delete(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, json_t **out, struct k8s_status *st);
int k8s_delete_policy(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, enum k8s_propagation policy,
    json_t **out, struct k8s_status *st);
/*
 * k8s_delete_policy with DeleteOptions.preconditions (either may be
 * NULL): only the object with that uid and resourceVersion, checked in
 * the same step, else K8S_ECONFLICT (the apiserver's "Precondition
 * failed: ..." message) and nothing deleted.
 */
int k8s_delete_if(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const char *name, enum k8s_propagation policy,
    const char *uid, const char *rv, json_t **out, struct k8s_status *st);
int k8s_watch(struct k8s_api *api, const struct k8s_resource *r,
    const char *ns, const struct k8s_list_opts *opts, struct k8s_watch **out,
    struct k8s_status *st);
int k8s_watch_next(struct k8s_watch *w, int timeout_ms, struct k8s_event *ev,
    struct k8s_status *st);
void k8s_watch_free(struct k8s_watch *w);
/* Free api, and its attachment first (NULL is fine). */
void k8s_api_free(struct k8s_api *api);
/*
 * What a user keeps with api for as long as api lives (there is one: the
 * controller's cache of the tasks that hold or want a slot, which must
 * not outlive the store it mirrors): made by make() on the first call,
 * under a lock, so every caller gets the same one; k8s_api_free gives it
 * to free_fn. Every caller passes the same make and free_fn.
 */
void *k8s_api_attachment(struct k8s_api *api, void *(*make)(void),
    void (*free_fn)(void *));

/* ---- embedded backend (embedded.c) ---- */

struct k8s_embedded_config {
	size_t watch_window_events;	/* default 10000 */
	int64_t watch_window_s;		/* default 3600 */
	/*
	 * the objects the window holds, as stored (serialized JSON; parsed,
	 * in memory, about ten times more): default 4 MiB
	 */
	size_t watch_window_bytes;
};

/*
 * Open the embedded store in the SQLite database at path (tables created
 * on first use; WAL; every write one transaction, committed in groups).
 */
int k8s_embedded_open(struct k8s_api **out, const char *path,
    const struct k8s_embedded_config *cfg, char **cause);
/* Writes committed since open (tests: idempotency counts). */
uint64_t k8s_embedded_write_count(struct k8s_api *api);

/*
 * Multi-object transactions (embedded only): fn runs on the store's
 * writer thread, inside the group-commit transaction, in a savepoint of
 * its own. Every k8s_txn_* call it makes commits together when fn returns
 * 0, and none of them does when it returns an error (fill st). fn must not
 * block, nor call the store through the other functions.
 * k8s_embedded_transact returns fn's result once the commit is durable.
 */
struct k8s_txn;
typedef int (*k8s_txn_fn)(struct k8s_txn *tx, void *arg,
    struct k8s_status *st);
int k8s_embedded_transact(struct k8s_api *api, k8s_txn_fn fn, void *arg,
    struct k8s_status *st);
/*
 * The same without waiting: done(done_arg, rc, st) is called once the
 * commit is durable (or failed), on the writer thread after the commit,
 * or at once when the store is stopping. done must be quick and must not
 * call the store. st is valid during the call only.
 */
typedef void (*k8s_txn_done_fn)(void *done_arg, int rc,
    struct k8s_status *st);
void k8s_embedded_transact_async(struct k8s_api *api, k8s_txn_fn fn,
    void *arg, k8s_txn_done_fn done, void *done_arg);
/* Whether api is the embedded backend. */
int k8s_is_embedded(const struct k8s_api *api);
/*
 * The embedded store's dry-run view (dryRun=All): reads as api; a write is
 * validated and answered as it would be, then rolled back (no event, no
 * new resourceVersion). It lives as long as api. NULL for another backend.
 */
struct k8s_api *k8s_embedded_dry_run(struct k8s_api *api);
/* Read one object in the transaction. */
int k8s_txn_get(struct k8s_txn *tx, const struct k8s_resource *r,
    const char *ns, const char *name, json_t **out, struct k8s_status *st);
/*
 * Read one object in the transaction without copying it: *out is shared
 * with the store, the caller must not change it and must json_decref it.
 */
int k8s_txn_peek(struct k8s_txn *tx, const struct k8s_resource *r,
    const char *ns, const char *name, json_t **out, struct k8s_status *st);
/*
 * Write obj whole (metadata, spec and status: no subresource rules): a
 * create when no such object exists (obj without resourceVersion), else
 * an update, conditional on obj's resourceVersion when it has one.
 * Validation and generation as for the other writes. obj is taken: the
 * caller's reference passes to the store, whatever the outcome. *out (may
 * be NULL) gets the stored object.
 */
int k8s_txn_put(struct k8s_txn *tx, const struct k8s_resource *r,
    const char *ns, json_t *obj, json_t **out, struct k8s_status *st);

/* ---- REST backend (rest.c, kubeconfig.c) ---- */

/* Where and how to reach an API server. */
struct k8s_cluster {
	char *server;		/* https://host:port[/prefix] */
	char *namespace;	/* the context's namespace or "default" */
	char *ca_file;		/* a file path, or NULL */
	char *ca_data;		/* PEM bytes, or NULL */
	int insecure;		/* insecure-skip-tls-verify */
	char *tls_server_name;
	/*
	 * proxy-url: every request to the server goes through this http://,
	 * https:// or socks5:// proxy (its credentials, if any, in it: wiped
	 * on release, never in a message), whatever HTTPS_PROXY and NO_PROXY
	 * say; NULL: the environment's proxy settings, as client-go's
	 * ProxyFromEnvironment.
	 */
	char *proxy_url;
	char *cert_file, *key_file;	/* client certificate paths */
	char *cert_data, *key_data;	/* client certificate PEM */
	char *token;		/* bearer token, or NULL */
	char *token_file;	/* re-read when it changes (rotation) */
	char *username, *password;
	/*
	 * An exec credential plugin (client.authentication.k8s.io, what
	 * EKS, GKE and AKS kubeconfigs use): the command and its arguments,
	 * and "NAME=value" additions to its environment, each NULL-
	 * terminated; exec_argv NULL when there is none. The REST client
	 * runs it for a token, keeps the token until it expires or the API
	 * server answers 401, and runs it again.
	 */
	char **exec_argv;
	char **exec_env;
	char *exec_api_version;
	char *exec_hint;		/* installHint, for a missing command */
	int exec_cluster_info;		/* provideClusterInfo */
};

void k8s_cluster_release(struct k8s_cluster *c);
/*
 * Run c's exec credential plugin (c->exec_argv set) for a token: *token
 * (the caller wipes and frees it) and *expiry (unix seconds; 0 when the
 * plugin gave none). A plugin still running after timeout_ms is killed.
 * -1 with *cause, which never holds the token. Each run counts in
 * diverge_kube_exec_plugin_runs_total{result}: ok, timeout (killed), or
 * error (any other failure).
 */
int k8s_exec_credential(const struct k8s_cluster *c, int64_t timeout_ms,
    char **token, int64_t *expiry, char **cause);
/*
 * For tests: nonzero makes k8s_exec_credential start its plugin as it
 * does where the C library has no posix_spawn_file_actions_addclosefrom_np
 * (glibc before 2.34): fork, close every descriptor above 2, exec; 2 does
 * so without close_range (a kernel before Linux 5.9).
 */
extern int k8s_exec_test_fork;
/* Free a NULL-terminated string vector (NULL is fine). */
void k8s_strv_free(char **v);
/* A deep copy of a NULL-terminated string vector (NULL for NULL). */
char **k8s_strv_dup(char *const *v);
/*
 * Whether s is a host name (letters, digits, '-' in labels of at most 63
 * between dots) or an IPv4 address: what tls-server-name may be. No port,
 * path, userinfo or space.
 */
int k8s_host_name_ok(const char *s);

/*
 * Check a proxy-url as client-go does: an http, https or socks5 URL (the
 * scheme in any case) naming a host. 0, or -1 with *why (to free) saying
 * what is wrong ("has no host", ...) without quoting the URL, which may
 * carry a password.
 */
int k8s_proxy_url_check(const char *url, char **why);

/*
 * Load a kubeconfig: paths is a ':'-separated list (KUBECONFIG syntax;
 * NULL or "" = $KUBECONFIG, then ~/.kube/config), context NULL or "" =
 * current-context. Relative file paths resolve against the file's
 * directory. An exec credential plugin is taken (not one that needs a
 * terminal); an auth-provider user gives a clear "not supported" error.
 * -1 with *cause naming the file and what is missing.
 */
int k8s_kubeconfig_load(struct k8s_cluster *out, const char *paths,
    const char *context, char **cause);

/*
 * In-cluster configuration: KUBERNETES_SERVICE_HOST/PORT, the service
 * account token (re-read on rotation), CA and namespace under root
 * (NULL = /var/run/secrets/kubernetes.io/serviceaccount).
 */
int k8s_incluster_load(struct k8s_cluster *out, const char *root,
    char **cause);

struct k8s_rest_config {
	int connect_timeout_ms;		/* default 5000 */
	int timeout_ms;			/* per attempt, default 30000 */
	int max_retries;		/* on 429/5xx/transport, default 4 */
	/*
	 * cap on one backoff wait (a Retry-After is waited in full when the
	 * call's deadline leaves room for it, else it ends the call)
	 */
	int64_t max_retry_wait_ms;
	/*
	 * One call in all, its attempts and the waits between them, default
	 * 60000: an attempt gets at most what is left, no wait is begun that
	 * would not leave time for another attempt, and a Retry-After longer
	 * than what is left ends the call with the answer's error at once,
	 * for the caller to requeue.
	 */
	int64_t deadline_ms;
};

/* A REST client for cluster c (copied). cfg may be NULL (defaults). */
int k8s_rest_open(struct k8s_api **out, const struct k8s_cluster *c,
    const struct k8s_rest_config *cfg, char **cause);
/*
 * GET path (from the server's root, query included) on a cluster's API and
 * hand the body to fn as it arrives (pods/log), with the client's TLS,
 * credentials and connect timeout; timeout_ms bounds the whole transfer
 * (0: none, for a followed log). fn returns 0 to go on. 0 on a 2xx, else
 * the error (the answer's Status, or the way there) in st. Counted in
 * diverge_kube_requests_total as a get of pods/log, its one use.
 */
typedef int (*k8s_stream_fn)(void *arg, const char *data, size_t len);
int k8s_rest_stream(struct k8s_api *api, const char *path,
    int64_t timeout_ms, k8s_stream_fn fn, void *arg, struct k8s_status *st);

/* ---- the embedded store over HTTP (apiserver.c) ---- */

struct k8s_apiserver;

struct k8s_apiserver_config {
	const char *listen;	/* host:port (port 0 = any) */
	const char *tls_cert;	/* PEM files; required off loopback */
	const char *tls_key;
	const char *token;	/* bearer token; required off loopback */
	int max_connections;
};

/*
 * Serve api (any backend; normally the embedded one) as a
 * Kubernetes-compatible REST API. -1 with *cause.
 */
int k8s_apiserver_start(struct k8s_apiserver **out, struct k8s_api *api,
    const struct k8s_apiserver_config *cfg, char **cause);
int k8s_apiserver_port(const struct k8s_apiserver *s);
/* Replace the bearer token of a server started with one (SIGHUP). */
int k8s_apiserver_set_token(struct k8s_apiserver *s, const char *token,
    char **cause);
void k8s_apiserver_stop(struct k8s_apiserver *s);

/* ---- AgentTask operations (tasks.c) ---- */

/*
 * What "diverge task guide|pause|resume|budget" and the /diverge slash
 * commands of the same names do to an AgentTask (DESIGN.md section 8), in
 * one place. Every write is optimistic: read the task, compute the
 * change, send it as a merge patch carrying the resourceVersion read, and
 * start again from a fresh read on 409 Conflict (at most
 * K8S_TASK_MAX_ATTEMPTS times), so a concurrent write (a meter charge, the
 * reconciler) is never lost. Each returns 0 with the task as stored in
 * *out (out may be NULL), or a negative enum k8s_err with st filled: the
 * API's Status, or one made here (K8S_EINVALID) naming what was refused.
 *
 * once, when not NULL, names the operation (a slash command: its comment
 * and its place there) so that it takes effect once however often it is
 * asked: the write that applies it also appends once to the task's
 * K8S_TASK_ANNOTATION_APPLIED (a space-separated list of the last
 * K8S_TASK_APPLIED_MAX ids, oldest first), and an operation whose id the
 * task already lists is not applied again: 1 with the task as it is in
 * *out, nothing written. An operation that changes nothing else is
 * recorded too. A write whose answer was lost and that met a Conflict
 * of its own making (st.maybe_done) is then read again rather than
 * failed: the list says whether it took effect. once: 1 to
 * K8S_TASK_MAX_ONCE printable ASCII characters, no spaces (else
 * K8S_EINVALID).
 */

#define K8S_TASK_ANNOTATION_GUIDANCE "divergedev.com/guidance"
#define K8S_TASK_ANNOTATION_APPLIED "divergedev.com/applied-commands"
/*
 * "true" when spec.objective came from a GitLab internal note, which only
 * project members may read: the public status comment does not show it.
 */
#define K8S_TASK_ANNOTATION_INTERNAL "divergedev.com/internal-objective"
/* "true" when the guidance annotation came from a GitLab internal note. */
#define K8S_TASK_ANNOTATION_INTERNAL_GUIDANCE \
	"divergedev.com/internal-guidance"
/* Operations a task remembers as applied, and the longest id. */
#define K8S_TASK_APPLIED_MAX 32
#define K8S_TASK_MAX_ONCE 64
/* Longest guidance hint, in bytes after trimming (as /diverge guide). */
#define K8S_TASK_MAX_HINT 2000
/* Reads and conditional writes of one operation before giving up. */
#define K8S_TASK_MAX_ATTEMPTS 20
/* Largest bumps one command may ask (the slash-command defaults). */
#define K8S_TASK_MAX_BUMP_USD_MICRO (INT64_C(1000) * 1000000)
#define K8S_TASK_MAX_BUMP_TOKENS INT64_C(100000000)
/* Longest name k8s_task_name_new() makes, with its NUL. */
#define K8S_TASK_NAME_MAX 16

/*
 * Where an effective budget comes from: the task's spec (a positive
 * budgetUSD/budgetTokens), the max_cost_usd/max_tokens caveat of the
 * task's capability token (Secret "<task>-token", key "token"), the
 * configured default the caller passed, or nowhere known.
 */
enum k8s_task_source {
	K8S_TASK_UNKNOWN = 0,
	K8S_TASK_SPEC,
	K8S_TASK_TOKEN,
	K8S_TASK_DEFAULT
};

/* One effective budget; value 0 with a known source means unlimited. */
struct k8s_task_limit {
	int64_t value;		/* micro-USD or tokens */
	enum k8s_task_source source;
};

struct k8s_task_budgets {
	struct k8s_task_limit usd;
	struct k8s_task_limit tokens;
};

/*
 * A budget change. usd_micro and tokens are added to the effective USD
 * and token budgets (0: that one is not bumped; never negative).
 * default_usd_micro and default_tokens are the configured defaults
 * (diverged.yaml "defaults") when the caller knows them, as diverged
 * does; -1 when it does not (the CLI): a task without a budget of its own
 * then takes it from its token's caveats, and a bump is refused when
 * there is no token to read (the task has not been provisioned yet).
 */
struct k8s_task_bump {
	int64_t usd_micro;
	int64_t tokens;
	int64_t default_usd_micro;
	int64_t default_tokens;
};

/*
 * The effective budgets of task (an AgentTask object), as the meter
 * computes them: the spec value when positive, else the token's caveat,
 * else the default. The token Secret is read through api only when the
 * spec lacks a budget; a Secret that is absent or cannot be read (403)
 * just leaves the token out. A token without the caveat was minted when
 * the default was 0: its budget is unlimited, unless the caller knows the
 * default now (default_* >= 0). Never fails; unknown parts are
 * K8S_TASK_UNKNOWN.
 */
void k8s_task_budgets(struct k8s_api *api, const json_t *task,
    int64_t default_usd_micro, int64_t default_tokens,
    struct k8s_task_budgets *out);

/*
 * Admission (controller.max_active_tasks): a task holds a slot while its
 * phase is Provisioning, Active or Pausing (it has, or is getting, a
 * running sandbox and a live token). One that waits for a slot stays
 * Pending, or Paused when it waits to resume, with status.reason
 * K8S_TASK_REASON_QUEUED and the status.message k8s_task_queue_message
 * makes.
 */
#define K8S_TASK_REASON_QUEUED "Queued"
/* How the status.message of a queued task starts. */
#define K8S_TASK_QUEUE_WAIT "waiting for a free slot"

/* Whether task (an AgentTask) holds a slot. */
int k8s_task_holds_slot(const json_t *task);
/*
 * Whether task is finished and settled: Completed or Failed, its spec
 * seen (status.observedGeneration = metadata.generation), no token live
 * (condition TokenIssued not True), not Stalled, not being deleted. A
 * pass over it writes nothing unless it or a child changes, which its
 * watches tell.
 */
int k8s_task_settled(const json_t *task);
/* Whether task has the condition Stalled, True (the controller's). */
int k8s_task_stalled(const json_t *task);
/*
 * Whether task would take a slot as soon as one is free: Pending (or
 * new) or Paused, not suspended, not being deleted; queued or not yet.
 */
int k8s_task_wants_slot(const json_t *task);
/*
 * Whether task waits for a slot (Pending or Paused, reason Queued).
 * *ahead (may be NULL) gets the number of tasks queued ahead of it as its
 * message says, or -1 when the message does not say.
 */
int k8s_task_queued(const json_t *task, int64_t *ahead);
/*
 * The status.message of a queued task (a new string): "waiting for a
 * free slot: RUNNING of LIMIT tasks are running; AHEAD queued ahead",
 * with "to resume" after "slot" for a paused task that waits to resume.
 */
char *k8s_task_queue_message(int64_t running, int64_t limit, int64_t ahead,
    int resume);

/*
 * Set the guidance annotation to hint (checked with k8s_task_check_hint;
 * the trimmed text is stored): the agent gets it on its next meter call.
 */
int k8s_task_guide(struct k8s_api *api, const char *ns, const char *name,
    const char *hint, const char *once, json_t **out, struct k8s_status *st);
/*
 * The same for guidance from a GitLab internal note (internal: 1), which
 * marks the task with K8S_TASK_ANNOTATION_INTERNAL_GUIDANCE; guidance
 * from anywhere else removes the mark.
 */
int k8s_task_guide_from(struct k8s_api *api, const char *ns,
    const char *name, const char *hint, int internal, const char *once,
    json_t **out, struct k8s_status *st);

/* spec.suspended = true; the reconciler pauses the task. Idempotent. */
int k8s_task_pause(struct k8s_api *api, const char *ns, const char *name,
    const char *once, json_t **out, struct k8s_status *st);

/*
 * Optionally bump the budgets (bump may be NULL or hold zeros), then
 * spec.suspended = false, in the same conditional write.
 */
int k8s_task_resume(struct k8s_api *api, const char *ns, const char *name,
    const struct k8s_task_bump *bump, const char *once, json_t **out,
    struct k8s_status *st);

/*
 * Add to the effective budgets and write the sums into spec.budgetUSD
 * and spec.budgetTokens; suspension is unchanged. At least one bump is
 * required. Refused (K8S_EINVALID, nothing written) when a bumped budget
 * is unlimited (it stays unlimited) or cannot be known, or the sum would
 * overflow.
 */
int k8s_task_budget(struct k8s_api *api, const char *ns, const char *name,
    const struct k8s_task_bump *bump, const char *once, json_t **out,
    struct k8s_status *st);

/*
 * Amounts as written on the command line, with the slash-command rules
 * (src/scm/commands.c): an optional leading '+' (bumps only add: a '-' is
 * refused), USD with an optional '$', at most 2 decimals, commas between
 * groups of 3 digits; tokens as an integer with an optional k (1,000) or
 * M (1,000,000) suffix, e.g. "2000000", "2M", "500k". Zero and amounts
 * over max (K8S_TASK_MAX_BUMP_*, or 0 for no limit) are refused. 0 with
 * *out set, or -1 with a new message in *cause.
 */
int k8s_task_parse_usd(const char *s, int64_t max, int64_t *out,
    char **cause);
int k8s_task_parse_tokens(const char *s, int64_t max, int64_t *out,
    char **cause);

/*
 * Whether hint may be sent as guidance: not empty after trimming, at
 * most K8S_TASK_MAX_HINT bytes, valid UTF-8 without control characters
 * other than newline and tab. 0, or -1 with a new message in *cause.
 */
int k8s_task_check_hint(const char *hint, char **cause);

/*
 * USD for people: micro-USD with 2 decimals when that is exact, else
 * with the significant decimals only ("5.00", "0.0225", "1.000001").
 */
void k8s_task_format_usd(int64_t micro, char out[32]);

/* A new task name, "task-" and 6 random lowercase letters or digits. */
void k8s_task_name_new(char out[K8S_TASK_NAME_MAX]);

/*
 * Read a .diverge/agent.yaml: text/len (need not be NUL-terminated), name
 * for messages. *out gets a new object with the AgentTask spec fields the
 * file sets, written as the API wants them: capabilities, allowedTools,
 * budgetUSD ("5.00"), budgetTokens, maxIterations, repository.baseBranch,
 * sandbox.{provider, timeoutSeconds, image, runtimeClassName}. The keys:
 * version (must be "1" when present) and agent.{capabilities,
 * allowedTools, budgetUSD, budgetTokens, maxIterations, baseBranch,
 * sandbox.{...}}, every one optional; one left empty or null is not set;
 * an empty text gives {}. Returns 0, or -1 with "NAME:LINE: what" in
 * *cause (a new string) for a YAML error, an unknown or duplicate key or
 * a bad value. The text may come from a pull request's repository: the
 * caller bounds len; the walk follows the fixed schema, so aliases can
 * neither loop nor multiply work.
 */
int k8s_task_agent_yaml(const char *name, const char *text, size_t len,
    json_t **out, char **cause);

#endif

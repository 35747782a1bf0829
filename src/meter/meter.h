/*
 * meter: macaroon capability tokens and their root key (DESIGN.md section
 * 7); the metering endpoint logic joins them here later.
 *
 * Tokens are standard macaroons, byte-compatible with libmacaroons,
 * go-macaroon, pymacaroons and the npm package "macaroon":
 *
 *	derived = HMAC-SHA256(key = "macaroons-key-generator", msg = root key)
 *	sig     = HMAC-SHA256(derived, identifier)
 *	sig     = HMAC-SHA256(sig, caveat)		for each caveat
 *
 * We emit the V2 binary format, base64url without padding. We read V2
 * binary and V1 (text packets), in any base64 alphabet, padded or not; a
 * zero-length location field (written by pymacaroons) is accepted and not
 * written back. The V2 JSON format is not read.
 *
 * Caveats we understand are first-party and written exactly "key = value"
 * (one space each side of '='), key one of: task_id, namespace, repo,
 * branch, tools, models, max_cost_usd, max_tokens, expires. Rules, all
 * failing closed:
 *
 *  - The key is [a-z][a-z0-9_]*, the value non-empty, without leading or
 *    trailing space and without control characters. Anything else, an
 *    unknown key, or a third-party caveat (one with a vid: we issue none)
 *    makes verification fail with "unknown caveat".
 *  - Several caveats with one key must all hold (the AND of macaroons: a
 *    holder may narrow a token, never widen it). Two task_id caveats with
 *    different values can never be met; several expires mean the
 *    earliest; the model must match every models caveat. For the keys
 *    whose value the caller extracts (repo, branch, tools, max_cost_usd,
 *    max_tokens) two different values make the token unusable
 *    ("caveat not met: <key>"): there is never a question of which one
 *    applies.
 *  - task_id and namespace must be present and equal the context's.
 *  - expires is RFC 3339 UTC, "2026-12-01T00:00:00Z" (fractional seconds
 *    are accepted and ignored; 'T' and 'Z' may be lowercase; an offset
 *    other than Z is refused). The token is good while
 *    now < expires + MACAROON_EXPIRES_LEEWAY.
 *  - models and tools are comma lists; entries are trimmed of spaces and
 *    empty entries are dropped, so "models = ," allows no model at all. A
 *    models entry ending in '*' is a prefix wildcard: "claude-*" matches
 *    "claude-3-7-sonnet" and "claude-"; "*" alone matches every non-empty
 *    model; a '*' anywhere else makes the caveat invalid. Anything else
 *    matches exactly (case-sensitive). An empty model never matches.
 *  - max_cost_usd is a decimal with at most 6 decimals ("5", "5.00",
 *    "0.000001"), read as micro-USD; max_tokens a decimal integer. Both
 *    fit in int64_t. These, repo, branch and tools are not checked by
 *    macaroon_verify() (the context does not carry them): the caller reads
 *    them with the accessors below.
 *  - A known key with a value that does not parse gives
 *    "caveat not met: <key>".
 *
 * Limits, checked before any HMAC work: an encoded token of at most
 * MACAROON_MAX_TOKEN bytes, at most MACAROON_MAX_CAVEATS caveats, and each
 * field within its MACAROON_MAX_* bound.
 *
 * All functions are thread-safe and reentrant. A struct macaroon is
 * immutable once made, so it may be read from several threads.
 */
#ifndef DIVERGE_METER_METER_H
#define DIVERGE_METER_METER_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

struct buf;

/* Length of our root keys and of every macaroon signature. */
#define MACAROON_KEY_LEN 32
#define MACAROON_SIG_LEN 32
/* Shortest root key macaroon_mint()/macaroon_verify() take. */
#define MACAROON_MIN_KEY_LEN 16

/* Limits (bytes unless said otherwise). */
#define MACAROON_MAX_TOKEN (16 * 1024)	/* encoded, as presented */
#define MACAROON_MAX_CAVEATS 64
#define MACAROON_MAX_IDENTIFIER 256
#define MACAROON_MAX_LOCATION 256	/* also a third-party caveat's */
#define MACAROON_MAX_CAVEAT 1024	/* a caveat id, also a vid */

/* Seconds an expired token is still accepted (clock skew). */
#define MACAROON_EXPIRES_LEEWAY 5

/*
 * Results of the functions below. The verification reasons form a fixed
 * set; macaroon_strerror() gives the text of each ("caveat not met: <key>"
 * comes from macaroon_verify()'s reason, naming the key).
 * MACAROON_EMODEL is "caveat not met: models" when everything else about
 * the token held, so that a caller may answer it differently (403 rather
 * than 401).
 */
enum macaroon_result {
	MACAROON_OK = 0,
	MACAROON_EMALFORMED = -1,	/* "malformed token" */
	MACAROON_ETOOLARGE = -2,	/* "token too large" */
	MACAROON_ETOOMANY = -3,		/* "too many caveats" */
	MACAROON_EBADSIG = -4,		/* "bad signature" */
	MACAROON_EEXPIRED = -5,		/* "expired" */
	MACAROON_EUNKNOWN = -6,		/* "unknown caveat" */
	MACAROON_ENOTMET = -7,		/* "caveat not met: <key>" */
	MACAROON_EMODEL = -8,		/* "caveat not met: models" */
	MACAROON_EINVAL = -9,		/* "invalid argument" (mint) */
};

/* A parsed macaroon (opaque). */
struct macaroon;

/*
 * What a request is about, for macaroon_verify().
 *
 * task_id and namespace are required: a token without task_id or
 * namespace caveats, or with other values, is refused (a NULL or empty
 * field here refuses every token). model is the model the request uses:
 * it must match every models caveat; NULL means the request uses no model
 * (e.g. /complete) and models caveats are then not checked, while ""
 * matches no models caveat. now is the wall clock in unix seconds.
 */
struct macaroon_context {
	const char *task_id;
	const char *namespace;
	const char *model;
	int64_t now;
};

/*
 * Mint a token: the V2 binary serialization, base64url without padding,
 * into *token_out (a new string, the caller frees it).
 *
 * key/keylen is the root key (MACAROON_KEY_LEN bytes for ours; any length
 * of at least MACAROON_MIN_KEY_LEN is taken, as the construction allows);
 * it is only read, and every key derived from it is wiped before return.
 * identifier is required (at most MACAROON_MAX_IDENTIFIER bytes); location
 * may be NULL or "" for none (it is then not written). caveats are
 * ncaveats first-party caveat strings, hashed as they are: nothing checks
 * their syntax here, the minter is responsible for writing "key = value".
 *
 * Returns 0, MACAROON_EINVAL (NULL argument, short key, empty caveat),
 * MACAROON_ETOOMANY or MACAROON_ETOOLARGE (a field or the token over its
 * limit). *cause (may be NULL) gets a new message on failure.
 */
int macaroon_mint(const unsigned char *key, size_t keylen,
    const char *identifier, const char *location,
    const char *const *caveats, size_t ncaveats, char **token_out,
    char **cause);

/*
 * Parse a token (token/len need not be NUL-terminated): base64 in either
 * alphabet, padded or not, of the V2 binary (first byte 0x02) or of V1
 * packets. Leading and trailing whitespace is ignored. Nothing is
 * verified: the result may be forged; use it only to show or to verify.
 *
 * Returns 0 with a new macaroon in *out (free it with macaroon_free()), or
 * MACAROON_ETOOLARGE (more than MACAROON_MAX_TOKEN bytes, which is checked
 * first; or a field over its bound), MACAROON_ETOOMANY (more than
 * MACAROON_MAX_CAVEATS caveats) or MACAROON_EMALFORMED. *cause (may be
 * NULL) then gets a new message that starts with macaroon_strerror() of
 * the result, e.g. "malformed token: signature is not 32 bytes".
 */
int macaroon_deserialize(const char *token, size_t len,
    struct macaroon **out, char **cause);

/*
 * The same as macaroon_deserialize(), named for "diverge token inspect":
 * it never verifies anything. Show the result with macaroon_format().
 */
int macaroon_inspect(const char *token, size_t len, struct macaroon **out,
    char **cause);

/*
 * Serialize m in the V2 binary format, base64url without padding, into
 * *token_out (a new string). An empty location is not written, so a
 * pymacaroons token with an empty location field comes back without it.
 * Returns 0, or MACAROON_ETOOLARGE if the result would exceed
 * MACAROON_MAX_TOKEN (possible only for a V1 input).
 */
int macaroon_serialize_v2(const struct macaroon *m, char **token_out);

/*
 * Verify m against the root key key/keylen and the request context ctx.
 * The checks, whose first failure is the result: the signature (computed
 * over every caveat, third-party ones included, and compared in constant
 * time) -> MACAROON_EBADSIG; every caveat known and well formed ->
 * MACAROON_EUNKNOWN; every known caveat's value valid, and one value
 * only for an extracted key -> MACAROON_ENOTMET; expires ->
 * MACAROON_EEXPIRED; task_id, then namespace -> MACAROON_ENOTMET; models
 * (when ctx->model is not NULL) -> MACAROON_EMODEL.
 *
 * Returns 0 when m is good for ctx. *reason (may be NULL) gets a static
 * string: "ok", or the reason from the fixed set ("bad signature",
 * "caveat not met: task_id", ...). The key is only read; the derived key
 * and every intermediate signature are wiped before return.
 */
int macaroon_verify(const unsigned char *key, size_t keylen,
    const struct macaroon *m, const struct macaroon_context *ctx,
    const char **reason);

/* The text of a result code ("ok", "malformed token", ...). */
const char *macaroon_strerror(int result);

/*
 * Write m for humans into b, one field per line: "version: 2",
 * "identifier: ...", "location: ..." ("(none)" when empty), then
 * "caveat: key = value" for each first-party caveat and
 * "third-party caveat: <id> (location <l>)" for the others (without the
 * parenthesis when the caveat has no location). Bytes that are not
 * printable ASCII or UTF-8 text (and '\') are written as \xNN. The
 * signature is not shown: with the other fields it is the token itself.
 * Returns 0, or -1 when b's maximum was reached.
 */
int macaroon_format(const struct macaroon *m, struct buf *b);

/* Free m (NULL is fine); its signature is wiped. */
void macaroon_free(struct macaroon *m);

/*
 * Accessors. Strings belong to m and are NUL-terminated; *len (may be
 * NULL) gets their length, since a V2 identifier may hold NUL bytes.
 */
/* The serialization m was read from: 1 or 2. */
int macaroon_version(const struct macaroon *m);
const char *macaroon_identifier(const struct macaroon *m, size_t *len);
/* "" when the token has no location. */
const char *macaroon_location(const struct macaroon *m, size_t *len);
/* The MACAROON_SIG_LEN raw bytes of the signature presented. */
const unsigned char *macaroon_signature(const struct macaroon *m);
size_t macaroon_caveat_count(const struct macaroon *m);
/* Caveat i's identifier (the predicate); NULL when i is out of range. */
const char *macaroon_caveat(const struct macaroon *m, size_t i,
    size_t *len);
/* 1 when caveat i is a third-party caveat (it has a vid), else 0. */
int macaroon_caveat_third_party(const struct macaroon *m, size_t i);

/*
 * Parsed caveats (meaningful after a successful macaroon_verify(); after
 * macaroon_inspect() they show what the token claims). The value of the
 * "key = value" caveat(s) for key, NULL when absent, malformed or given
 * different values.
 */
const char *macaroon_value(const struct macaroon *m, const char *key);
/*
 * max_cost_usd in micro-USD ("5.00" -> 5000000), max_tokens, and expires
 * in unix seconds (the earliest when there are several): 0 with *out set
 * when the caveat is present and valid, -1 otherwise (*out untouched).
 */
int macaroon_max_cost_usd(const struct macaroon *m, int64_t *out);
int macaroon_max_tokens(const struct macaroon *m, int64_t *out);
int macaroon_expires(const struct macaroon *m, int64_t *out);
/*
 * The entries of the models or tools caveat, as a NULL-terminated array
 * owned by m (empty for "models = ,"), or NULL when the caveat is absent,
 * invalid or given different values (macaroon_allows_model() checks every
 * models caveat).
 */
const char *const *macaroon_models(const struct macaroon *m);
const char *const *macaroon_tools(const struct macaroon *m);
/*
 * 1 when model is allowed by every models caveat of m (no such caveat
 * allows every non-empty model), else 0. The caveats must be valid.
 */
int macaroon_allows_model(const struct macaroon *m, const char *model);
/*
 * 1 when model matches one pattern: exact, or a prefix wildcard "claude-*"
 * ("*" alone matches every non-empty model); else 0. NULL or "" never
 * matches. For the meter's spec.capabilities check too.
 */
int macaroon_model_match(const char *pattern, const char *model);

/*
 * Root keys: 64 hex characters (either case), an optional single trailing
 * "\n" ignored, decoding to the MACAROON_KEY_LEN bytes of the HMAC key.
 * On success key is written; on failure it is untouched and *cause (may
 * be NULL) gets a new message naming the source and why, never the key:
 * "macaroon root key 'PATH': permissions 0644 are too open, expected 0600".
 * Every copy of the key text made here is wiped; the caller wipes key
 * (secure_wipe()) when done with it.
 */
/* Parse text/len, e.g. the "root-key" field of a Kubernetes Secret. */
int meter_root_key_parse(const char *text, size_t len,
    unsigned char key[MACAROON_KEY_LEN], char **cause);
/*
 * Load the key file at path: it must be a regular file without any group
 * or other permission bit (0600 or 0400).
 */
int meter_root_key_load_file(const char *path,
    unsigned char key[MACAROON_KEY_LEN], char **cause);
/*
 * Load the key file at path, or create it when it does not exist: 32
 * random bytes, hex-encoded with a newline, mode 0600. The new file is
 * written and fsynced under a temporary name (O_CREAT|O_EXCL) and then
 * linked into place, so a concurrent start or a crash never leaves a
 * partial key behind; the directory is fsynced too.
 */
int meter_root_key_ensure_file(const char *path,
    unsigned char key[MACAROON_KEY_LEN], char **cause);

/* ---- the meter (meter.c) ---- */

struct k8s_api;
struct meter;

struct meter_config {
	struct k8s_api *store;		/* borrowed; outlives the meter */
	const unsigned char *root_key;	/* MACAROON_KEY_LEN bytes, copied */
	const char *location;		/* written into minted tokens */
	int64_t default_budget_usd_micro;	/* when a task has none */
	int64_t default_budget_tokens;
	int max_conflict_retries;	/* REST backend, default 200 */
};

/* The revocation index Secret of each namespace, and its entries. */
#define METER_INDEX_SECRET "diverge-agenttask-tokens"

/* A meter answer: the HTTP status and a JSON body (a new string). */
struct meter_reply {
	int status;
	char *body;
	const char *reason;	/* a refusal's reason, static, for metrics */
};

void meter_reply_release(struct meter_reply *r);

/* Create the meter (the root key is copied and wiped on free). */
int meter_new(struct meter **out, const struct meter_config *cfg,
    char **cause);
void meter_free(struct meter *m);

/*
 * POST /api/v1/agenttask/meter: authorization is the Authorization header
 * (NULL when absent), body the raw request body. Applies DESIGN section 6
 * "Meter" in order and fills *out. Never fails: errors are replies.
 */
void meter_charge(struct meter *m, const char *authorization,
    const char *body, size_t len, struct meter_reply *out);

/*
 * The same without blocking the caller, for the embedded store
 * (meter_is_async): done(done_arg, reply) is called on the store's writer
 * thread once the charge is durable, or before meter_charge_async returns
 * when the request is refused before the store. done must reply quickly
 * and not keep the reply (it is released after done returns).
 */
typedef void (*meter_done_fn)(void *done_arg, struct meter_reply *reply);
int meter_is_async(const struct meter *m);
void meter_charge_async(struct meter *m, const char *authorization,
    const char *body, size_t len, meter_done_fn done, void *done_arg);

/* POST /api/v1/agenttask/complete: ends the task (idempotent). */
void meter_complete(struct meter *m, const char *authorization,
    const char *body, size_t len, struct meter_reply *out);

/*
 * Mint a token for task (an AgentTask object): a new identifier, caveats
 * from the task (task_id, namespace, repo, branch, tools, models,
 * max_cost_usd, max_tokens, expires), recorded "active" in the
 * namespace's index Secret (created when missing; optimistic concurrency).
 * *token_out and *id_out are new strings. 0, or a negative enum k8s_err
 * with *cause: the index write's as the API answered it (K8S_EFORBIDDEN
 * for RBAC or a quota, K8S_EINVALID for an admission webhook, ...),
 * K8S_EINTERNAL when the token could not be minted.
 */
int meter_issue_token(struct meter *m, const json_t *task, int64_t expires,
    char **token_out, char **id_out, char **cause);

/*
 * Mark token id revoked in the index of ns; absent ids are fine.
 * Idempotent. 0, or the index write's negative enum k8s_err with *cause,
 * as meter_issue_token().
 */
int meter_revoke_token(struct meter *m, const char *ns, const char *id,
    char **cause);

/*
 * Mark every token of the task named task in the index of ns revoked,
 * except keep (may be NULL): a task may hold several active tokens, the
 * live one and those it extended (they stay active until they expire).
 * Idempotent. Returns as meter_revoke_token().
 */
int meter_revoke_task_tokens(struct meter *m, const char *ns,
    const char *task, const char *keep, char **cause);

/*
 * Remove the index entries of ns whose task no longer exists or whose
 * token expired (expires + leeway in the past, from issuedAt's record).
 */
int meter_prune_index(struct meter *m, const char *ns, char **cause);
/* meter_prune_index() for every namespace that has an index. */
int meter_prune_all(struct meter *m, char **cause);

/*
 * Parse a JSON number text (negative is an error; "-0" is 0) as USD into
 * micro-USD, rounding half to even beyond 6 decimals. -1 when it is not a
 * number or over max_micro.
 */
int meter_parse_usd(const char *text, size_t len, int64_t max_micro,
    int64_t *out);

/* Format micro-USD with 6 decimals ("0.022500"). out has 32 bytes. */
void meter_format_usd(int64_t micro, char out[32]);

#endif

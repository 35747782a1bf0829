/*
 * A command-line face of the macaroon library, for the interop test
 * (tests/integration/test_macaroon_interop.py):
 *
 *   macaroon_tool mint KEYHEX ID LOCATION [CAVEAT...]
 *	prints the token (V2, base64url without padding)
 *   macaroon_tool verify KEYHEX TOKEN TASK NS MODEL NOW
 *	prints "ok" or the reason; exits 0 or 1. MODEL "-" means none.
 *   macaroon_tool inspect TOKEN
 *	prints the fields, unverified
 *   macaroon_tool signature TOKEN
 *	prints the signature in hex, unverified
 *
 * KEYHEX is the root key in hex, of any length the library takes. Exit
 * status 2 is a usage error.
 */
#include "config.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meter/meter.h"
#include "util/util.h"

static int
usage(void)
{
	fprintf(stderr, "usage: macaroon_tool mint KEYHEX ID LOCATION "
	    "[CAVEAT...]\n"
	    "       macaroon_tool verify KEYHEX TOKEN TASK NS MODEL NOW\n"
	    "       macaroon_tool inspect TOKEN\n"
	    "       macaroon_tool signature TOKEN\n");
	return 2;
}

static int
parse_key(const char *hex, unsigned char **key, size_t *keylen)
{
	size_t n = strlen(hex);

	*key = xmalloc(n / 2 + 1);
	if (hex_decode(hex, n, *key, keylen) < 0) {
		fprintf(stderr, "macaroon_tool: bad key hex\n");
		free(*key);
		*key = NULL;
		return -1;
	}
	return 0;
}

static int
cmd_mint(int argc, char **argv)
{
	unsigned char *key = NULL;
	size_t keylen = 0;
	char *token = NULL, *cause = NULL;
	int rc;

	if (argc < 5)
		return usage();
	if (parse_key(argv[2], &key, &keylen) < 0)
		return 2;
	rc = macaroon_mint(key, keylen, argv[3], argv[4],
	    (const char *const *)argv + 5, (size_t)(argc - 5), &token,
	    &cause);
	secure_wipe(key, keylen);
	free(key);
	if (rc != 0) {
		fprintf(stderr, "macaroon_tool: %s\n", cause);
		free(cause);
		return 1;
	}
	printf("%s\n", token);
	free(token);
	return 0;
}

static int
cmd_verify(int argc, char **argv)
{
	struct macaroon_context ctx;
	struct macaroon *m = NULL;
	unsigned char *key = NULL;
	size_t keylen = 0;
	const char *reason = NULL;
	char *cause = NULL, *end = NULL;
	int rc;

	if (argc != 8)
		return usage();
	ctx.task_id = argv[4];
	ctx.namespace = argv[5];
	ctx.model = strcmp(argv[6], "-") == 0 ? NULL : argv[6];
	ctx.now = (int64_t)strtoll(argv[7], &end, 10);
	if (end == argv[7] || *end != '\0')
		return usage();
	rc = macaroon_deserialize(argv[3], strlen(argv[3]), &m, &cause);
	if (rc != 0) {
		printf("%s\n", macaroon_strerror(rc));
		fprintf(stderr, "macaroon_tool: %s\n", cause);
		free(cause);
		return 1;
	}
	if (parse_key(argv[2], &key, &keylen) < 0) {
		macaroon_free(m);
		return 2;
	}
	rc = macaroon_verify(key, keylen, m, &ctx, &reason);
	secure_wipe(key, keylen);
	free(key);
	macaroon_free(m);
	printf("%s\n", reason);
	return rc == 0 ? 0 : 1;
}

static int
cmd_show(int argc, char **argv, int signature)
{
	struct macaroon *m = NULL;
	char *cause = NULL, hex[2 * MACAROON_SIG_LEN + 1];
	struct buf b;
	int rc;

	if (argc != 3)
		return usage();
	rc = macaroon_inspect(argv[2], strlen(argv[2]), &m, &cause);
	if (rc != 0) {
		fprintf(stderr, "macaroon_tool: %s\n", cause);
		free(cause);
		return 1;
	}
	if (signature) {
		hex_encode(macaroon_signature(m), MACAROON_SIG_LEN, hex);
		printf("%s\n", hex);
	} else {
		buf_init(&b, 1u << 20);
		if (macaroon_format(m, &b) == 0)
			fputs(b.data, stdout);
		buf_release(&b);
	}
	macaroon_free(m);
	return 0;
}

int
main(int argc, char **argv)
{
	if (argc < 2)
		return usage();
	if (strcmp(argv[1], "mint") == 0)
		return cmd_mint(argc, argv);
	if (strcmp(argv[1], "verify") == 0)
		return cmd_verify(argc, argv);
	if (strcmp(argv[1], "inspect") == 0)
		return cmd_show(argc, argv, 0);
	if (strcmp(argv[1], "signature") == 0)
		return cmd_show(argc, argv, 1);
	return usage();
}

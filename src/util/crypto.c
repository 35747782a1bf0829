/* HMAC, constant-time compare, wiping, hex and base64. */
#include "config.h"

#include <pthread.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "util/util.h"

/*
 * HMAC-SHA256 (RFC 2104) on OpenSSL's SHA-256. HMAC() fetches the digest
 * and builds a MAC context on every call, about 1 us, which is most of
 * the cost for the short messages of a macaroon chain (one HMAC per
 * caveat on every meter call); here the digest is fetched once and each
 * thread keeps one digest context: about 0.25 us. Keys longer than a
 * block are hashed first, as the RFC says.
 */
#define HMAC_BLOCK 64

static pthread_once_t hmac_once = PTHREAD_ONCE_INIT;
static pthread_key_t hmac_key;
static EVP_MD *hmac_md;

static void
hmac_ctx_free(void *p)
{
	EVP_MD_CTX_free(p);
}

static void
hmac_setup(void)
{
	hmac_md = EVP_MD_fetch(NULL, "SHA256", NULL);
	if (pthread_key_create(&hmac_key, hmac_ctx_free) != 0) {
		EVP_MD_free(hmac_md);
		hmac_md = NULL;
	}
}

static int
digest2(EVP_MD_CTX *x, const void *a, size_t alen, const void *b,
    size_t blen, unsigned char out[32])
{
	unsigned int n = 32;

	return EVP_DigestInit_ex2(x, hmac_md, NULL) == 1 &&
	    EVP_DigestUpdate(x, a, alen) == 1 &&
	    (blen == 0 || EVP_DigestUpdate(x, b, blen) == 1) &&
	    EVP_DigestFinal_ex(x, out, &n) == 1 ? 0 : -1;
}

void
hmac_sha256(const void *key, size_t keylen, const void *data, size_t len,
    unsigned char out[32])
{
	static const unsigned char empty[1];
	unsigned char pad[HMAC_BLOCK], inner[32];
	EVP_MD_CTX *x = NULL;
	size_t i;
	int ok;

	pthread_once(&hmac_once, hmac_setup);
	if (hmac_md != NULL && (x = pthread_getspecific(hmac_key)) == NULL &&
	    (x = EVP_MD_CTX_new()) != NULL &&
	    pthread_setspecific(hmac_key, x) != 0) {
		EVP_MD_CTX_free(x);
		x = NULL;
	}
	if (x == NULL) {
		unsigned int outlen = 32;

		HMAC(EVP_sha256(), key ? key : empty, (int)keylen,
		    data ? data : empty, len, out, &outlen);
		return;
	}
	memset(pad, 0, sizeof(pad));
	ok = 0;
	if (keylen > HMAC_BLOCK)
		ok = digest2(x, key, keylen, NULL, 0, pad);
	else if (keylen > 0)
		memcpy(pad, key, keylen);
	for (i = 0; i < HMAC_BLOCK; i++)
		pad[i] ^= 0x36;
	if (ok == 0)
		ok = digest2(x, pad, HMAC_BLOCK, data ? data : empty, len,
		    inner);
	for (i = 0; i < HMAC_BLOCK; i++)
		pad[i] ^= 0x36 ^ 0x5c;
	if (ok == 0)
		ok = digest2(x, pad, HMAC_BLOCK, inner, 32, out);
	OPENSSL_cleanse(pad, sizeof(pad));
	OPENSSL_cleanse(inner, sizeof(inner));
	if (ok != 0) {
		unsigned int outlen = 32;

		HMAC(EVP_sha256(), key ? key : empty, (int)keylen,
		    data ? data : empty, len, out, &outlen);
	}
}

/* Constant-time comparison of n bytes. */
int
ct_equal(const void *a, const void *b, size_t n)
{
	return CRYPTO_memcmp(a, b, n) == 0;
}

/* Wipe memory. */
void
secure_wipe(void *p, size_t n)
{
	if (p != NULL && n > 0)
		OPENSSL_cleanse(p, n);
}

/* Random bytes from OpenSSL's CSPRNG. */
int
random_bytes(void *buf, size_t n)
{
	return RAND_bytes(buf, (int)n) == 1 ? 0 : -1;
}

/* Lowercase hex. */
void
hex_encode(const unsigned char *in, size_t n, char *out)
{
	static const char digits[] = "0123456789abcdef";
	size_t i;

	for (i = 0; i < n; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * n] = '\0';
}

/* One hex digit's value, or -1. */
int
hex_digit(int c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Decode hex (either case); odd length or bad digits fail. */
int
hex_decode(const char *in, size_t inlen, unsigned char *out, size_t *outlen)
{
	size_t i;

	if (inlen % 2 != 0)
		return -1;
	for (i = 0; i < inlen / 2; i++) {
		int hi = hex_digit(in[2 * i]), lo = hex_digit(in[2 * i + 1]);

		if (hi < 0 || lo < 0)
			return -1;
		out[i] = (unsigned char)(hi << 4 | lo);
	}
	*outlen = inlen / 2;
	return 0;
}

/* Base64 in either alphabet. */
char *
base64_encode(const unsigned char *in, size_t n, int url, int pad)
{
	const char *alpha = url ?
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" :
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	char *out = xmalloc(4 * ((n + 2) / 3) + 1);
	size_t i, o = 0;

	for (i = 0; i + 2 < n; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 |
		    in[i + 2];

		out[o++] = alpha[v >> 18 & 63];
		out[o++] = alpha[v >> 12 & 63];
		out[o++] = alpha[v >> 6 & 63];
		out[o++] = alpha[v & 63];
	}
	if (i < n) {
		uint32_t v = (uint32_t)in[i] << 16;

		if (i + 1 < n)
			v |= (uint32_t)in[i + 1] << 8;
		out[o++] = alpha[v >> 18 & 63];
		out[o++] = alpha[v >> 12 & 63];
		if (i + 1 < n)
			out[o++] = alpha[v >> 6 & 63];
		else if (pad)
			out[o++] = '=';
		if (pad)
			out[o++] = '=';
	}
	out[o] = '\0';
	return out;
}

static int
b64val(char c)
{
	if (c >= 'A' && c <= 'Z')
		return c - 'A';
	if (c >= 'a' && c <= 'z')
		return c - 'a' + 26;
	if (c >= '0' && c <= '9')
		return c - '0' + 52;
	if (c == '+' || c == '-')
		return 62;
	if (c == '/' || c == '_')
		return 63;
	return -1;
}

/* Decode base64, standard or URL alphabet, with or without padding. */
int
base64_decode(const char *in, size_t n, unsigned char **out, size_t *outlen)
{
	unsigned char *o;
	size_t i, len = 0, pad = 0;
	uint32_t acc = 0;
	int bits = 0;

	while (n > 0 && in[n - 1] == '=' && pad < 2) {
		n--;
		pad++;
	}
	if (pad > 0 && (n + pad) % 4 != 0)
		return -1;
	if (n % 4 == 1)
		return -1;
	o = xmalloc(n * 3 / 4 + 2);
	for (i = 0; i < n; i++) {
		int v = b64val(in[i]);

		if (v < 0) {
			free(o);
			return -1;
		}
		acc = acc << 6 | (uint32_t)v;
		bits += 6;
		if (bits >= 8) {
			bits -= 8;
			o[len++] = (unsigned char)(acc >> bits & 0xff);
		}
	}
	/* leftover bits must be zero (canonical encoding) */
	if (bits > 0 && (acc & ((1u << bits) - 1)) != 0) {
		free(o);
		return -1;
	}
	o[len] = '\0';
	*out = o;
	*outlen = len;
	return 0;
}

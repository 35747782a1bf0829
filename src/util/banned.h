/*
 * Functions that are easy to misuse: a call becomes a compile error.
 * Included in every translation unit by the build (-include).
 */
#ifndef DIVERGE_BANNED_H
#define DIVERGE_BANNED_H

/*
 * The system headers first: with optimisation glibc defines some of these
 * functions inline, and the macros below must not rewrite those
 * definitions, only our calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BANNED(func) sorry_##func##_is_a_banned_function

#undef strcpy
#define strcpy(x, y) BANNED(strcpy)
#undef strcat
#define strcat(x, y) BANNED(strcat)
#undef strncpy
#define strncpy(x, y, n) BANNED(strncpy)
#undef sprintf
#define sprintf(...) BANNED(sprintf)
#undef vsprintf
#define vsprintf(...) BANNED(vsprintf)
#undef strtok
#define strtok(x, y) BANNED(strtok)
#undef gets
#define gets(x) BANNED(gets)
#undef atoi
#define atoi(x) BANNED(atoi)
#undef gmtime
#define gmtime(t) BANNED(gmtime)
#undef localtime
#define localtime(t) BANNED(localtime)

#endif

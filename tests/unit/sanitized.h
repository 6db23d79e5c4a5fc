/*
 * sanitized.h — LG_TEST_SLOW: 4 when the test is built under AddressSanitizer
 * (make test's second stage), else 1. A test of many random rounds runs
 * a quarter of them there, where each costs three to five times as much;
 * the rounds it drops are the fuzzers' to cover (scripts/fuzz-smoke).
 */
#ifndef LG_TEST_SANITIZED_H
#define LG_TEST_SANITIZED_H

#if defined(__SANITIZE_ADDRESS__)
#define LG_TEST_SLOW 4
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LG_TEST_SLOW 4
#endif
#endif
#ifndef LG_TEST_SLOW
#define LG_TEST_SLOW 1
#endif

#endif

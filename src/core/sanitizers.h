#pragma once
// Which sanitizer this translation unit is compiled under, for gcc
// (__SANITIZE_ADDRESS__, __SANITIZE_THREAD__) and clang (__has_feature) alike:
// KILN_ASAN / KILN_TSAN are defined to 1 under AddressSanitizer / ThreadSanitizer.
// Internal to kiln and its tests.

#if defined(__SANITIZE_ADDRESS__)
#define KILN_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define KILN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_TSAN 1
#endif
#endif

// Clang's thread-safety annotations (-Wthread-safety): which mutex guards a
// member, which a function needs held or must not hold. Under clang they are
// checked at compile time (`make test-thread-safety` builds with
// -Werror=thread-safety); under other compilers they expand to nothing.
//
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_) = 0;
//   void BumpLocked() REQUIRES(mu_);
//   void Bump() EXCLUDES(mu_);
#pragma once

#if defined(__clang__)
#define TCE_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define TCE_THREAD_ANNOTATION(x)
#endif

// Abseil's internal header (reached through gRPC's) defines some of the same
// names with the same attributes: whichever comes first stands.
#ifndef CAPABILITY
#define CAPABILITY(x) TCE_THREAD_ANNOTATION(capability(x))
#endif
#ifndef SCOPED_CAPABILITY
#define SCOPED_CAPABILITY TCE_THREAD_ANNOTATION(scoped_lockable)
#endif
#ifndef GUARDED_BY
#define GUARDED_BY(x) TCE_THREAD_ANNOTATION(guarded_by(x))
#endif
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) TCE_THREAD_ANNOTATION(pt_guarded_by(x))
#endif
#ifndef ACQUIRED_BEFORE
#define ACQUIRED_BEFORE(...) TCE_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#endif
#ifndef ACQUIRED_AFTER
#define ACQUIRED_AFTER(...) TCE_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#endif
#ifndef REQUIRES
#define REQUIRES(...) TCE_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#endif
#ifndef ACQUIRE
#define ACQUIRE(...) TCE_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#endif
#ifndef RELEASE
#define RELEASE(...) TCE_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#endif
#ifndef EXCLUDES
#define EXCLUDES(...) TCE_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#endif
#ifndef ASSERT_CAPABILITY
#define ASSERT_CAPABILITY(x) TCE_THREAD_ANNOTATION(assert_capability(x))
#endif
#ifndef RETURN_CAPABILITY
#define RETURN_CAPABILITY(x) TCE_THREAD_ANNOTATION(lock_returned(x))
#endif
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS TCE_THREAD_ANNOTATION(no_thread_safety_analysis)
#endif

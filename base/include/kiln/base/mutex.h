// Lock discipline the compiler checks: clang's thread-safety analysis (-Wthread-safety) over an
// annotated mutex, since libstdc++'s std::mutex carries no annotations. Under GCC the macros are
// empty and kiln::Mutex is a std::mutex; the ctest `lint_thread_safety` runs clang's analysis
// (syntax only) over the annotated sources.
//
//   class Table {
//     kiln::Mutex mu_;
//     std::map<int, int> rows_ KILN_GUARDED_BY(mu_);
//     void add_locked(int k) KILN_REQUIRES(mu_);   // the caller holds mu_
//    public:
//     void add(int k) { kiln::MutexLock lock(mu_); add_locked(k); }
//   };
//
// A condition variable waits on a MutexLock through std::condition_variable_any (its lock and
// unlock are the analysis's own, so the guarded state stays checked around the wait).
#pragma once

#include <mutex>
#include <shared_mutex>

#if defined(__clang__)
#define KILN_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KILN_THREAD_ANNOTATION(x)
#endif

#define KILN_CAPABILITY(name) KILN_THREAD_ANNOTATION(capability(name))
#define KILN_SCOPED_CAPABILITY KILN_THREAD_ANNOTATION(scoped_lockable)
#define KILN_GUARDED_BY(x) KILN_THREAD_ANNOTATION(guarded_by(x))
#define KILN_PT_GUARDED_BY(x) KILN_THREAD_ANNOTATION(pt_guarded_by(x))
#define KILN_REQUIRES(...) KILN_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define KILN_REQUIRES_SHARED(...) KILN_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define KILN_EXCLUDES(...) KILN_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define KILN_ACQUIRE(...) KILN_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define KILN_RELEASE(...) KILN_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define KILN_ACQUIRE_SHARED(...) KILN_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define KILN_RELEASE_SHARED(...) KILN_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define KILN_RELEASE_GENERIC(...) KILN_THREAD_ANNOTATION(release_generic_capability(__VA_ARGS__))
#define KILN_TRY_ACQUIRE(...) KILN_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define KILN_ACQUIRED_AFTER(...) KILN_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define KILN_ACQUIRED_BEFORE(...) KILN_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define KILN_RETURN_CAPABILITY(x) KILN_THREAD_ANNOTATION(lock_returned(x))
#define KILN_NO_THREAD_SAFETY_ANALYSIS KILN_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace kiln {

class KILN_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() KILN_ACQUIRE() { mu_.lock(); }
  void unlock() KILN_RELEASE() { mu_.unlock(); }
  bool try_lock() KILN_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  std::mutex mu_;
};

// Holds a Mutex for its scope. Also BasicLockable (unlock/lock again), for
// std::condition_variable_any::wait.
class KILN_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) KILN_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~MutexLock() KILN_RELEASE() {
    if (held_) mu_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void lock() KILN_ACQUIRE() {
    mu_.lock();
    held_ = true;
  }
  void unlock() KILN_RELEASE() {
    held_ = false;
    mu_.unlock();
  }

 private:
  Mutex& mu_;
  bool held_ = true;
};

// A reader-writer mutex: exclusive for writers, shared for readers.
class KILN_CAPABILITY("mutex") SharedMutex {
 public:
  SharedMutex() = default;
  SharedMutex(const SharedMutex&) = delete;
  SharedMutex& operator=(const SharedMutex&) = delete;

  void lock() KILN_ACQUIRE() { mu_.lock(); }
  void unlock() KILN_RELEASE() { mu_.unlock(); }
  void lock_shared() KILN_ACQUIRE_SHARED() { mu_.lock_shared(); }
  void unlock_shared() KILN_RELEASE_SHARED() { mu_.unlock_shared(); }

 private:
  std::shared_mutex mu_;
};

// Holds a SharedMutex exclusively for its scope.
class KILN_SCOPED_CAPABILITY WriterLock {
 public:
  explicit WriterLock(SharedMutex& mu) KILN_ACQUIRE(mu) : mu_(mu) { mu_.lock(); }
  ~WriterLock() KILN_RELEASE() { mu_.unlock(); }
  WriterLock(const WriterLock&) = delete;
  WriterLock& operator=(const WriterLock&) = delete;

 private:
  SharedMutex& mu_;
};

// Holds a SharedMutex shared for its scope.
class KILN_SCOPED_CAPABILITY ReaderLock {
 public:
  explicit ReaderLock(SharedMutex& mu) KILN_ACQUIRE_SHARED(mu) : mu_(mu) { mu_.lock_shared(); }
  ~ReaderLock() KILN_RELEASE() { mu_.unlock_shared(); }
  ReaderLock(const ReaderLock&) = delete;
  ReaderLock& operator=(const ReaderLock&) = delete;

 private:
  SharedMutex& mu_;
};

}  // namespace kiln

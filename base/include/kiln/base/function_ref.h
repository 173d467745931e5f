// FunctionRef<R(Args...)>: a non-owning reference to a callable, for parameters that are called
// during the call and never stored (C++26's std::function_ref). Unlike std::function it never
// allocates and costs one indirect call; the op path (Session::run_op) passes its builders this way.
// The referenced callable must outlive the FunctionRef: bind it to a parameter, not to a variable
// that outlives a temporary lambda.
#pragma once

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace kiln {

template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  // Any callable object (a lambda, a functor, a function pointer value): referred to, not copied.
  // Implicit, as std::function's constructor; enable_if (which tidy reads, unlike a requires-clause)
  // leaves copies to the copy constructor.
  template <class F, std::enable_if_t<!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> &&
                                          !std::is_function_v<std::remove_reference_t<F>> &&
                                          std::is_invocable_r_v<R, F&, Args...>,
                                      int> = 0>
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor)
      : target_{.object = const_cast<void*>(static_cast<const void*>(std::addressof(f)))},
        call_([](Target target, Args... args) -> R {
          return std::invoke(*static_cast<std::remove_reference_t<F>*>(target.object), std::forward<Args>(args)...);
        }) {}

  // A function named directly (it has no object address to refer to).
  template <class Fn, std::enable_if_t<std::is_function_v<Fn> && std::is_invocable_r_v<R, Fn&, Args...>, int> = 0>
  FunctionRef(Fn& fn) noexcept  // NOLINT(google-explicit-constructor)
      : target_{.function = reinterpret_cast<void (*)()>(&fn)}, call_([](Target target, Args... args) -> R {
          return std::invoke(reinterpret_cast<Fn*>(target.function), std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(target_, std::forward<Args>(args)...); }

 private:
  // A function pointer may not pass through void*: each kind keeps its own member.
  union Target {
    void* object;
    void (*function)();
  };
  Target target_;
  R (*call_)(Target, Args...);
};

}  // namespace kiln

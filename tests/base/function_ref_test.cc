// FunctionRef: calls what it refers to (lambdas with state, function pointers, mutable functors),
// forwards arguments without copies, converts results as std::function does, and refers rather
// than copies (the callable's state changes are seen by its owner).
#include <memory>
#include <string>
#include <utility>

#include <gtest/gtest.h>

#include "kiln/base/function_ref.h"

namespace kiln {
namespace {

int twice(int x) { return 2 * x; }
int call_with_seven(FunctionRef<int(int)> f) { return f(7); }

TEST(FunctionRef, CallsLambdasWithStateAndFunctionPointers) {
  int offset = 5;  // not const: the lambda must capture it (state of its own)
  EXPECT_EQ(call_with_seven([offset](int x) { return x + offset; }), 12);
  EXPECT_EQ(call_with_seven(twice), 14);
  EXPECT_EQ(call_with_seven(&twice), 14);
}

TEST(FunctionRef, RefersToTheCallableInsteadOfCopyingIt) {
  struct Counter {
    int calls = 0;
    int operator()(int x) { return x + ++calls; }
  } counter;
  FunctionRef<int(int)> ref(counter);
  EXPECT_EQ(ref(10), 11);
  EXPECT_EQ(ref(10), 12);
  EXPECT_EQ(counter.calls, 2);
}

TEST(FunctionRef, ForwardsMoveOnlyArgumentsAndConvertsTheResult) {
  auto take = [](std::unique_ptr<int> p) { return *p * 3; };
  FunctionRef<long(std::unique_ptr<int>)> ref(take);
  EXPECT_EQ(ref(std::make_unique<int>(4)), 12L);

  std::string seen;
  auto append = [&seen](const std::string& s) { seen += s; };
  FunctionRef<void(const std::string&)> sink(append);
  sink("ab");
  sink("cd");
  EXPECT_EQ(seen, "abcd");
}

TEST(FunctionRef, CopiesReferToTheSameCallable) {
  int calls = 0;
  auto bump = [&calls] { return ++calls; };
  FunctionRef<int()> a(bump);
  FunctionRef<int()> b = a;  // the copy constructor, not the converting one
  a();
  EXPECT_EQ(b(), 2);
}

}  // namespace
}  // namespace kiln

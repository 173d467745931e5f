// HandleContainer without errors: docs/spec/ir.md §10 and the vectors of §12.3.
#include "kiln/ir/handle_container.h"
#include "kiln/testing/status.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>

namespace kiln::ir {
namespace {

using Container = HandleContainer<std::string>;

TensorId tid(std::uint64_t v) { return TensorId(v); }
TensorIr t(std::uint64_t id, TensorStatus status) { return TensorIr{TensorId(id), Shape{2, 3}, status, dtypes::f32}; }

// ---- §12.3 items 1-4: fork ---------------------------------------------------------------------

TEST(HandleContainer, ForkClonesEntries) {  // §12.3.1
  Container c;
  c.register_handle(tid(1), "input_a");
  c.register_handle(tid(2), "input_b");
  Container f = c.fork();
  EXPECT_EQ(f.num_handles(), 2u);
  EXPECT_TRUE(f.has_handle(tid(1)));
  EXPECT_TRUE(f.has_handle(tid(2)));
  ASSERT_NE(f.get_handle_ref(tid(1)), nullptr);
  EXPECT_EQ(*f.get_handle_ref(tid(1)), "input_a");
  EXPECT_EQ(*f.get_handle_ref(tid(2)), "input_b");
}

TEST(HandleContainer, ForkIsIsolatedFromOriginal) {  // §12.3.2
  Container c;
  c.register_handle(tid(1), "input");
  Container f = c.fork();
  f.register_handle(tid(100), "out_a");
  f.register_handle(tid(101), "out_b");
  EXPECT_EQ(f.num_handles(), 3u);
  EXPECT_TRUE(f.has_handle(tid(100)));
  EXPECT_TRUE(f.has_handle(tid(101)));
  EXPECT_EQ(c.num_handles(), 1u);
  EXPECT_FALSE(c.has_handle(tid(100)));
  EXPECT_FALSE(c.has_handle(tid(101)));
}

TEST(HandleContainer, ForkMutationIsIsolated) {  // §12.3.3
  Container c;
  c.register_handle(tid(1), "original_value");
  Container f = c.fork();
  f.register_handle(tid(1), "modified_in_fork");
  EXPECT_EQ(*c.get_handle_ref(tid(1)), "original_value");
  EXPECT_EQ(*f.get_handle_ref(tid(1)), "modified_in_fork");
}

TEST(HandleContainer, DoubleFork) {  // §12.3.4
  Container c;
  c.register_handle(tid(1), "input");
  Container f1 = c.fork();
  Container f2 = f1.fork();
  f2.register_handle(tid(200), "deep");
  EXPECT_FALSE(f1.has_handle(tid(200)));
  EXPECT_FALSE(c.has_handle(tid(200)));
  EXPECT_TRUE(f2.has_handle(tid(200)));
  EXPECT_TRUE(f2.has_handle(tid(1)));
}

TEST(HandleContainer, ForkCarriesCounterAndRemovalsStayIsolated) {
  Container c;
  c.set_counter(42);
  c.register_handle(tid(1), "a");
  Container f = c.fork();
  EXPECT_EQ(f.counter(), 42u);
  f.set_counter(43);
  EXPECT_EQ(c.counter(), 42u);
  // Consuming in the fork does not consume in the original.
  auto h = f.get_handle(tid(1), TensorStatus::ReadWrite);
  KILN_ASSERT_OK(h);
  EXPECT_FALSE(f.has_handle(tid(1)));
  EXPECT_TRUE(c.has_handle(tid(1)));
}

// ---- §12.3 items 5-7: get_handle, free ---------------------------------------------------------

TEST(HandleContainer, GetHandleReadOnlyKeepsReadWriteRemoves) {  // §12.3.5
  Container c;
  c.register_handle(tid(1), "h");
  auto a = c.get_handle(tid(1), TensorStatus::ReadOnly);
  auto b = c.get_handle(tid(1), TensorStatus::ReadOnly);
  KILN_ASSERT_OK(a);
  KILN_ASSERT_OK(b);
  EXPECT_EQ(*a, "h");
  EXPECT_EQ(*b, "h");
  EXPECT_TRUE(c.has_handle(tid(1)));
  auto last = c.get_handle(tid(1), TensorStatus::ReadWrite);
  KILN_ASSERT_OK(last);
  EXPECT_EQ(*last, "h");
  EXPECT_FALSE(c.has_handle(tid(1)));
  EXPECT_EQ(c.num_handles(), 0u);
}

TEST(HandleContainer, FreeRemovesOnlyOnReadWrite) {  // §12.3.6
  Container c;
  c.register_handle(tid(1), "h");
  EXPECT_FALSE(c.free(t(1, TensorStatus::ReadOnly)));
  EXPECT_TRUE(c.has_handle(tid(1)));
  EXPECT_TRUE(c.free(t(1, TensorStatus::ReadWrite)));
  EXPECT_FALSE(c.has_handle(tid(1)));
  // Absent id: no-op.
  EXPECT_FALSE(c.free(t(9, TensorStatus::ReadWrite)));
  EXPECT_EQ(c.num_handles(), 0u);
}

TEST(HandleContainer, AbsentIdIsInvalidHandle) {  // §12.3.7 (fatal in Burn, an error value here)
  Container c;
  c.register_handle(tid(1), "h");
  for (TensorStatus s : {TensorStatus::ReadOnly, TensorStatus::ReadWrite}) {
    auto r = c.get_handle(tid(7), s);
    ASSERT_FALSE(r.ok());
    EXPECT_TRUE(r.is_invalid());
    EXPECT_FALSE(r.is_errored());
    EXPECT_EQ(r.tensor_error(), nullptr);
    EXPECT_EQ(r.error().code, ErrorCode::InvalidHandle);
    EXPECT_NE(r.error().message.find("TensorId(7)"), std::string::npos) << r.error().message;
  }
  EXPECT_EQ(c.num_handles(), 1u);
}

TEST(HandleContainer, NotInitStatusIsInvalidHandle) {  // §12.3.7
  Container c;
  c.register_handle(tid(1), "h");
  auto r = c.get_handle(tid(1), TensorStatus::NotInit);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.is_invalid());
  EXPECT_EQ(r.error().code, ErrorCode::InvalidHandle);
  EXPECT_NE(r.error().message.find("TensorId(1)"), std::string::npos) << r.error().message;
  // (K) nothing is removed by an invalid request.
  ASSERT_NE(c.get_handle_ref(tid(1)), nullptr);
  EXPECT_EQ(*c.get_handle_ref(tid(1)), "h");
}

TEST(HandleContainer, NotInitEntryIsInvalidHandle) {  // §10 "NotInit entry -> fatal"
  Container c;
  EXPECT_TRUE(c.register_not_init(tid(3)));
  EXPECT_TRUE(c.has_handle(tid(3)));
  EXPECT_EQ(c.get_handle_ref(tid(3)), nullptr);
  ASSERT_NE(c.entry(tid(3)), nullptr);
  EXPECT_EQ(c.entry(tid(3))->state(), HandleState::NotInit);
  for (TensorStatus s : {TensorStatus::ReadOnly, TensorStatus::ReadWrite}) {
    auto r = c.get_handle(tid(3), s);
    ASSERT_TRUE(r.is_invalid());
    EXPECT_EQ(r.error().code, ErrorCode::InvalidHandle);
    EXPECT_NE(r.error().message.find("TensorId(3)"), std::string::npos);
  }
  EXPECT_TRUE(c.has_handle(tid(3)));
  // A producer registering its output turns NotInit into Existing.
  c.register_handle(tid(3), "written");
  EXPECT_EQ(*c.get_handle_ref(tid(3)), "written");
}

TEST(HandleContainer, RegisterNotInitNeverDowngrades) {
  Container c;
  c.register_handle(tid(1), "h");
  EXPECT_FALSE(c.register_not_init(tid(1)));
  EXPECT_EQ(*c.get_handle_ref(tid(1)), "h");
  c.claim(tid(2), TensorError::make_root(ErrorCode::Execution, "boom"));
  EXPECT_FALSE(c.register_not_init(tid(2)));
  EXPECT_EQ(c.entry(tid(2))->state(), HandleState::Errored);
  EXPECT_EQ(c.errored(), 1u);
}

// ---- The rest of §10 ---------------------------------------------------------------------------

TEST(HandleContainer, RegisterOverwrites) {
  Container c;
  c.register_handle(tid(1), "a");
  c.register_handle(tid(1), "b");
  EXPECT_EQ(c.num_handles(), 1u);
  EXPECT_EQ(*c.get_handle_ref(tid(1)), "b");
  *c.get_handle_ref(tid(1)) = "c";  // the reference is the stored handle
  EXPECT_EQ(*std::as_const(c).get_handle_ref(tid(1)), "c");
}

TEST(HandleContainer, GetTensorHandleCarriesShapeAndFollowsStatus) {
  Container c;
  c.register_handle(tid(4), "buf");
  auto ro = c.get_tensor_handle(t(4, TensorStatus::ReadOnly));
  KILN_ASSERT_OK(ro);
  EXPECT_EQ(ro->handle, "buf");
  EXPECT_EQ(ro->shape, (Shape{2, 3}));
  EXPECT_TRUE(c.has_handle(tid(4)));
  auto rw = c.get_tensor_handle(t(4, TensorStatus::ReadWrite));
  KILN_ASSERT_OK(rw);
  EXPECT_EQ(rw->handle, "buf");
  EXPECT_FALSE(c.has_handle(tid(4)));
  auto missing = c.get_tensor_handle(t(4, TensorStatus::ReadOnly));
  ASSERT_TRUE(missing.is_invalid());
  EXPECT_EQ(missing.error().code, ErrorCode::InvalidHandle);
  Result<TensorHandle<std::string>> as_result = std::move(missing).to_result();
  EXPECT_FALSE(as_result.ok());
  EXPECT_EQ(as_result.error().code, ErrorCode::InvalidHandle);
}

TEST(HandleContainer, RemoveHandleReturnsTheEntryInAnyState) {
  Container c;
  c.register_handle(tid(1), "h");
  c.register_not_init(tid(2));
  auto e1 = c.remove_handle(tid(1));
  ASSERT_TRUE(e1.has_value());
  ASSERT_TRUE(e1->is_existing());
  EXPECT_EQ(*e1->handle(), "h");
  auto e2 = c.remove_handle(tid(2));
  ASSERT_TRUE(e2.has_value());
  EXPECT_TRUE(e2->is_not_init());
  EXPECT_FALSE(c.remove_handle(tid(3)).has_value());
  EXPECT_EQ(c.num_handles(), 0u);
}

TEST(HandleContainer, HandleIdsListsEveryEntryInOrder) {
  Container c;
  c.register_handle(tid(30), "x");
  c.register_handle(tid(10), "y");
  c.register_not_init(tid(20));
  c.claim(tid(5), TensorError::make_root(ErrorCode::Execution, "e"));
  EXPECT_EQ(c.handle_ids(), (std::vector<TensorId>{tid(5), tid(10), tid(20), tid(30)}));
  // Detecting new outputs after running on a fork (what autotune does with handle_ids).
  Container f = c.fork();
  f.register_handle(tid(40), "new");
  std::vector<TensorId> fresh;
  for (TensorId id : f.handle_ids())
    if (!c.has_handle(id)) fresh.push_back(id);
  EXPECT_EQ(fresh, std::vector<TensorId>{tid(40)});
}

TEST(HandleContainer, MovedContainerKeepsEntries) {
  Container c;
  c.register_handle(tid(1), "h");
  c.claim(tid(2), TensorError::make_root(ErrorCode::Execution, "e"));
  Container d = std::move(c);
  EXPECT_EQ(d.num_handles(), 2u);
  EXPECT_EQ(d.errored(), 1u);
  EXPECT_EQ(*d.get_handle_ref(tid(1)), "h");
}

TEST(HandleContainer, CopyIsOnlyThroughFork) {
  static_assert(!std::is_copy_constructible_v<Container>);
  static_assert(!std::is_copy_assignable_v<Container>);
  static_assert(std::is_nothrow_move_constructible_v<Container>);
  // The default instrument takes no room.
  static_assert(sizeof(HandleContainer<std::string>) == sizeof(std::unordered_map<TensorId, HandleEntry<std::string>>) +
                                                            sizeof(std::uint64_t) + sizeof(std::size_t));
  SUCCEED();
}

TEST(HandleLookup, MapPassesErrorsThrough) {
  auto found = HandleLookup<int>::found(3);
  auto mapped = std::move(found).map([](int v) { return std::to_string(v * 2); });
  KILN_ASSERT_OK(mapped);
  EXPECT_EQ(*mapped, "6");
  KILN_EXPECT_OK(mapped.status());

  TensorError e = TensorError::make_root(ErrorCode::ResourceExhausted, "oom");
  auto err = HandleLookup<int>::errored(e).map([](int v) { return v + 1; });
  ASSERT_TRUE(err.is_errored());
  EXPECT_TRUE(err.tensor_error()->same_root(e));
  EXPECT_EQ(err.error().code, ErrorCode::ResourceExhausted);
  EXPECT_FALSE(err.status().ok());

  auto inv = HandleLookup<int>::invalid(make_error(ErrorCode::InvalidHandle, "x")).map([](int v) { return v; });
  ASSERT_TRUE(inv.is_invalid());
  EXPECT_EQ(inv.error().message, "x");
}

}  // namespace
}  // namespace kiln::ir

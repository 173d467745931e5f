// Tests for the dependency-graph toolkit (docs/spec/fusion.md §12; vectors of §19.10).
#include "kiln/fusion/dag.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <random>
#include <set>
#include <vector>

namespace kiln::fusion {
namespace {

using ir::TensorId;

std::vector<TensorId> ids(std::initializer_list<std::uint64_t> values) {
  std::vector<TensorId> out;
  for (std::uint64_t v : values) out.emplace_back(v);
  return out;
}

// A node as §19.10 writes it: position / reads / produces / frees. "frees X" means the node
// reads X for the last time, so X goes into both read() and freed().
DagNode node(std::uint64_t position, std::initializer_list<std::uint64_t> reads,
             std::initializer_list<std::uint64_t> produces, std::initializer_list<std::uint64_t> frees = {}) {
  DagNode n;
  n.position = position;
  n.read = ids(reads);
  n.produced = ids(produces);
  for (std::uint64_t f : frees) {
    n.read.emplace_back(f);
    n.freed.emplace_back(f);
  }
  return n;
}

SubGraph set_of(std::initializer_list<std::size_t> members) {
  SubGraph s;
  for (std::size_t m : members) s.insert(m);
  return s;
}

using Order = std::optional<std::vector<std::size_t>>;
using Indices = std::vector<std::size_t>;

// ---------------------------------------------------------------------------------------------
// DagNode
// ---------------------------------------------------------------------------------------------

TEST(DagNodeTest, MembershipTests) {
  DagNode n = node(0, {1, 2}, {10}, {3});
  EXPECT_TRUE(n.reads(TensorId(1)));
  EXPECT_TRUE(n.reads(TensorId(3)));  // a freed id is also read
  EXPECT_FALSE(n.reads(TensorId(10)));
  EXPECT_TRUE(n.produces(TensorId(10)));
  EXPECT_FALSE(n.produces(TensorId(1)));
}

// ---------------------------------------------------------------------------------------------
// SubGraph (§19.10)
// ---------------------------------------------------------------------------------------------

TEST(SubGraphTest, InsertContainsLenIteration) {
  SubGraph s;
  EXPECT_TRUE(s.empty());
  s.insert(3);
  s.insert(70);
  EXPECT_TRUE(s.contains(3));
  EXPECT_TRUE(s.contains(70));
  EXPECT_FALSE(s.contains(4));
  EXPECT_FALSE(s.contains(1000));
  EXPECT_EQ(s.size(), 2u);
  EXPECT_FALSE(s.empty());
  EXPECT_EQ(s.to_vector(), (Indices{3, 70}));
}

TEST(SubGraphTest, SubtractKeepsCanonicalForm) {
  SubGraph s = set_of({2, 100});
  s.subtract(set_of({100}));
  EXPECT_EQ(s, set_of({2}));
  EXPECT_EQ(s, SubGraph::single(2));
  EXPECT_EQ(s.size(), 1u);

  SubGraph t = set_of({100});
  t.subtract(set_of({100}));
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(t, SubGraph());
}

TEST(SubGraphTest, Intersects) {
  EXPECT_TRUE(set_of({2, 65}).intersects(set_of({65})));
  EXPECT_FALSE(set_of({2, 65}).intersects(set_of({64})));
  EXPECT_FALSE(SubGraph().intersects(set_of({1})));
}

TEST(SubGraphTest, IntersectWith) {
  SubGraph s = set_of({2, 65});
  s.intersect_with(set_of({2}));
  EXPECT_EQ(s, set_of({2}));

  SubGraph t = set_of({2, 200});
  t.intersect_with(set_of({200, 300}));
  EXPECT_EQ(t, set_of({200}));
  t.intersect_with(set_of({1}));
  EXPECT_EQ(t, SubGraph());
}

TEST(SubGraphTest, UnionWith) {
  SubGraph s = set_of({1});
  s.union_with(set_of({130}));
  EXPECT_EQ(s.to_vector(), (Indices{1, 130}));
  s.union_with(SubGraph());
  EXPECT_EQ(s.to_vector(), (Indices{1, 130}));
}

TEST(SubGraphTest, MatchesStdSetOnRandomOperations) {
  std::mt19937 rng(12345);
  std::uniform_int_distribution<std::size_t> index(0, 300);
  std::uniform_int_distribution<int> count(0, 12);
  auto random_pair = [&]() {
    SubGraph g;
    std::set<std::size_t> s;
    const int n = count(rng);
    for (int k = 0; k < n; ++k) {
      // Bias toward small indices so the inline word is exercised as much as the vector.
      std::size_t i = index(rng);
      if (i % 2 == 0) i %= 64;
      g.insert(i);
      s.insert(i);
    }
    return std::pair{g, s};
  };
  auto to_subgraph = [](const std::set<std::size_t>& s) {
    SubGraph g;
    for (std::size_t i : s) g.insert(i);
    return g;
  };
  for (int iter = 0; iter < 500; ++iter) {
    auto [a, sa] = random_pair();
    auto [b, sb] = random_pair();
    EXPECT_EQ(a.size(), sa.size());
    EXPECT_EQ(a.to_vector(), Indices(sa.begin(), sa.end()));

    std::set<std::size_t> su = sa, si, sd;
    su.insert(sb.begin(), sb.end());
    std::set_intersection(sa.begin(), sa.end(), sb.begin(), sb.end(), std::inserter(si, si.end()));
    std::set_difference(sa.begin(), sa.end(), sb.begin(), sb.end(), std::inserter(sd, sd.end()));

    SubGraph u = a;
    u.union_with(b);
    SubGraph in = a;
    in.intersect_with(b);
    SubGraph d = a;
    d.subtract(b);
    // Structural equality with a set built from scratch proves the canonical form.
    EXPECT_EQ(u, to_subgraph(su));
    EXPECT_EQ(in, to_subgraph(si));
    EXPECT_EQ(d, to_subgraph(sd));
    EXPECT_EQ(a.intersects(b), !si.empty());
    EXPECT_EQ(in.empty(), si.empty());
  }
}

// ---------------------------------------------------------------------------------------------
// Dag (§19.10 items 1–5)
// ---------------------------------------------------------------------------------------------

TEST(DagTest, Item1NoEdgesFollowsPosition) {
  std::vector<DagNode> nodes{node(2, {200, 201}, {202}), node(0, {100, 101}, {102})};
  Dag dag(nodes);
  EXPECT_TRUE(dag.dependencies()[0].empty());
  EXPECT_TRUE(dag.dependencies()[1].empty());
  EXPECT_EQ(dag.topological_order(), Order(Indices{1, 0}));
  EXPECT_TRUE(dag.is_acyclic());
}

TEST(DagTest, Item2ReadAfterWrite) {
  std::vector<DagNode> nodes{node(0, {50}, {2}), node(5, {9}, {50})};
  Dag dag(nodes);
  EXPECT_EQ(dag.dependencies()[0], (Indices{1}));
  EXPECT_TRUE(dag.dependencies()[1].empty());
  EXPECT_EQ(dag.topological_order(), Order(Indices{1, 0}));
}

TEST(DagTest, Item3CycleHasNoOrder) {
  std::vector<DagNode> nodes{node(0, {200}, {100}), node(1, {100}, {200})};
  Dag dag(nodes);
  EXPECT_EQ(dag.dependencies()[0], (Indices{1}));
  EXPECT_EQ(dag.dependencies()[1], (Indices{0}));
  EXPECT_EQ(dag.topological_order(), std::nullopt);
  EXPECT_FALSE(dag.is_acyclic());
}

TEST(DagTest, Item4WriteAfterRead) {
  std::vector<DagNode> nodes{node(0, {100}, {2}), node(1, {}, {4}, {100})};
  Dag dag(nodes);
  EXPECT_TRUE(dag.dependencies()[0].empty());
  EXPECT_EQ(dag.dependencies()[1], (Indices{0}));
  EXPECT_EQ(dag.topological_order(), Order(Indices{0, 1}));
}

TEST(DagTest, Item5Diamond) {
  std::vector<DagNode> nodes{node(0, {1}, {10}), node(1, {10}, {11}), node(2, {10}, {12}), node(3, {11, 12}, {13})};
  Dag dag(nodes);
  EXPECT_EQ(dag.dependencies()[3], (Indices{1, 2}));
  EXPECT_EQ(dag.topological_order(), Order(Indices{0, 1, 2, 3}));
  Reachability r = dag.reachability();
  EXPECT_EQ(r.ancestors(3), set_of({0, 1, 2}));
  EXPECT_EQ(r.descendants(0), set_of({1, 2, 3}));
  EXPECT_TRUE(r.descendants(3).empty());
}

TEST(DagTest, PositionTieBrokenByIndex) {
  std::vector<DagNode> nodes{node(5, {}, {1}), node(3, {}, {2}), node(3, {}, {3}), node(0, {1}, {4})};
  Dag dag(nodes);
  // Node 3 depends on node 0, so it waits even though its position is smallest.
  EXPECT_EQ(dag.topological_order(), Order(Indices{1, 2, 0, 3}));
}

TEST(DagTest, EmptyGraph) {
  Dag dag(std::span<const DagNode>{});
  EXPECT_EQ(dag.topological_order(), Order(Indices{}));
  Reachability r = dag.reachability();
  // Indices the graph does not know are isolated nodes: nothing lies between them.
  EXPECT_TRUE(r.can_contract(set_of({0}), set_of({1})));
  EXPECT_FALSE(r.can_contract(SubGraph(), set_of({1})));
}

TEST(DagTest, SelfReadAndProduceIsNoSelfEdge) {
  // An in-place node (reads and produces id 0) does not depend on itself.
  std::vector<DagNode> nodes{node(0, {0}, {0})};
  Dag dag(nodes);
  EXPECT_TRUE(dag.dependencies()[0].empty());
  EXPECT_EQ(dag.topological_order(), Order(Indices{0}));
}

TEST(DagTest, DuplicateEdgesAreMerged) {
  // Node 1 reads two ids node 0 produces and frees one node 0 reads: one dependency.
  std::vector<DagNode> nodes{node(0, {7}, {1, 2}), node(1, {1, 2}, {3}, {7})};
  Dag dag(nodes);
  EXPECT_EQ(dag.dependencies()[1], (Indices{0}));
}

// Block-level dependency checks of §19.9 items 1–3, written directly as nodes.
TEST(DagTest, BlockDependencyVectors) {
  {  // B0={add(50,1,2)@0}, B1={add(9,8,50)@5}
    std::vector<DagNode> nodes{node(0, {50, 1}, {2}), node(5, {9, 8}, {50})};
    EXPECT_EQ(Dag(nodes).topological_order(), Order(Indices{1, 0}));
  }
  {  // B0={add(1,2,100)@0, add(200,3,101)@1}, B1={add(100,4,200)@2}
    std::vector<DagNode> nodes{node(0, {1, 2, 200, 3}, {100, 101}), node(2, {100, 4}, {200})};
    EXPECT_FALSE(Dag(nodes).is_acyclic());
  }
  {  // B0={add(100,1,2)@0}, B1={add_rw(100,3,4)@1}
    std::vector<DagNode> nodes{node(0, {100, 1}, {2}), node(1, {3}, {4}, {100})};
    EXPECT_EQ(Dag(nodes).topological_order(), Order(Indices{0, 1}));
  }
}

// ---------------------------------------------------------------------------------------------
// Reachability and can_contract (§19.10)
// ---------------------------------------------------------------------------------------------

TEST(ReachabilityTest, ThreeNodeChain) {
  // A(0; prod 100) → C(1; reads 100, prod 200) → B(2; reads 200, prod 300)
  std::vector<DagNode> nodes{node(0, {}, {100}), node(1, {100}, {200}), node(2, {200}, {300})};
  Reachability r = Dag(nodes).reachability();
  EXPECT_TRUE(r.can_contract(set_of({0}), set_of({1})));
  EXPECT_TRUE(r.can_contract(set_of({1}), set_of({2})));
  EXPECT_FALSE(r.can_contract(set_of({0}), set_of({2})));
  EXPECT_TRUE(r.can_contract(set_of({0, 1}), set_of({2})));
  EXPECT_FALSE(r.can_contract(SubGraph(), set_of({0})));
  EXPECT_FALSE(r.can_contract(set_of({0}), SubGraph()));
  EXPECT_FALSE(r.can_contract(SubGraph(), SubGraph()));

  EXPECT_EQ(r.ancestors(2), set_of({0, 1}));
  EXPECT_EQ(r.descendants(0), set_of({1, 2}));
  EXPECT_TRUE(r.ancestors(0).empty());
}

TEST(ReachabilityTest, FourNodeChain) {
  std::vector<DagNode> nodes{node(0, {}, {10}), node(1, {10}, {11}), node(2, {11}, {12}), node(3, {12}, {13})};
  Reachability r = Dag(nodes).reachability();
  EXPECT_FALSE(r.can_contract(set_of({0}), set_of({3})));
  EXPECT_FALSE(r.can_contract(set_of({0}), set_of({2})));
  EXPECT_TRUE(r.can_contract(set_of({2}), set_of({3})));
  EXPECT_TRUE(r.can_contract(set_of({0, 1, 2}), set_of({3})));
}

TEST(ReachabilityTest, CyclicGraphUsesFixpoint) {
  // 0 ↔ 1, and 2 reads what 1 produces.
  std::vector<DagNode> nodes{node(0, {200}, {100}), node(1, {100}, {200}), node(2, {200}, {300})};
  Dag dag(nodes);
  ASSERT_FALSE(dag.is_acyclic());
  Reachability r = dag.reachability();
  EXPECT_TRUE(r.can_contract(set_of({0}), set_of({1})));
  EXPECT_FALSE(r.can_contract(set_of({0}), set_of({2})));
  EXPECT_EQ(r.ancestors(2), set_of({0, 1}));
  EXPECT_TRUE(r.descendants(2).empty());
}

TEST(ReachabilityTest, SeventyNodeChainCrossesTheInlineWord) {
  std::vector<DagNode> nodes;
  for (std::uint64_t i = 0; i < 70; ++i) {
    DagNode n;
    n.position = i;
    if (i > 0) n.read.emplace_back(1000 + i - 1);
    n.produced.emplace_back(1000 + i);
    nodes.push_back(n);
  }
  Dag dag(nodes);
  Indices expected(70);
  for (std::size_t i = 0; i < 70; ++i) expected[i] = i;
  EXPECT_EQ(dag.topological_order(), Order(expected));
  Reachability r = dag.reachability();
  EXPECT_TRUE(r.can_contract(set_of({68}), set_of({69})));
  EXPECT_FALSE(r.can_contract(set_of({0}), set_of({69})));
  EXPECT_EQ(r.ancestors(69).size(), 69u);
  EXPECT_EQ(r.descendants(0).size(), 69u);
  EXPECT_TRUE(r.descendants(5).contains(69));
  EXPECT_TRUE(r.ancestors(65).contains(63));
  EXPECT_TRUE(r.ancestors(65).contains(64));
}

// ---------------------------------------------------------------------------------------------
// Execution-order validity (§12.5; lifetime vectors of §19.10)
// ---------------------------------------------------------------------------------------------

bool valid_in_order(const std::vector<DagNode>& nodes, const Indices& order) {
  std::vector<const DagNode*> ptrs;
  std::vector<DagNode> copies;
  for (std::size_t i : order) {
    ptrs.push_back(&nodes[i]);
    copies.push_back(nodes[i]);
  }
  const bool by_pointer = is_valid_execution_order(std::span<const DagNode* const>(ptrs));
  const bool by_value = is_valid_execution_order(std::span<const DagNode>(copies));
  EXPECT_EQ(by_pointer, by_value);
  return by_pointer;
}

TEST(LifetimeTest, FreeAfterLastRead) {
  std::vector<DagNode> nodes{node(0, {1}, {10}), node(1, {}, {11}, {10})};
  EXPECT_TRUE(valid_in_order(nodes, {0, 1}));
}

TEST(LifetimeTest, ReadBeforeProducer) {
  std::vector<DagNode> nodes{node(0, {1}, {10}), node(1, {10}, {11})};
  EXPECT_FALSE(valid_in_order(nodes, {1, 0}));
  EXPECT_TRUE(valid_in_order(nodes, {0, 1}));
}

TEST(LifetimeTest, ReadAfterFree) {
  std::vector<DagNode> nodes{node(0, {}, {10}, {1}), node(1, {1}, {11})};
  EXPECT_FALSE(valid_in_order(nodes, {0, 1}));
  EXPECT_TRUE(valid_in_order(nodes, {1, 0}));
}

TEST(LifetimeTest, ExternalReadsAreAssumedLive) {
  std::vector<DagNode> nodes{node(0, {1, 2, 3}, {10}), node(1, {1, 4}, {11}, {2})};
  EXPECT_TRUE(valid_in_order(nodes, {0, 1}));
  EXPECT_TRUE(valid_in_order(nodes, {}));
}

TEST(LifetimeTest, SubsetTreatsOtherProducersAsExternal) {
  std::vector<DagNode> nodes{node(0, {}, {10}), node(1, {10}, {11})};
  EXPECT_TRUE(valid_in_order(nodes, {1}));
}

TEST(LifetimeTest, InPlaceFirstReaderIsInvalid) {
  // Log(t0 → t0): reads and produces id 0; as the first reader of 0 it is invalid (§12.5 note).
  std::vector<DagNode> nodes{node(0, {0}, {0}), node(1, {0}, {2})};
  EXPECT_FALSE(valid_in_order(nodes, {0}));
  EXPECT_FALSE(valid_in_order(nodes, {0, 1}));
  EXPECT_FALSE(valid_in_order(nodes, {1, 0}));  // node 1 reads 0 before its producer
  // Once something else made id 0 alive, the in-place op is fine.
  std::vector<DagNode> with_producer{node(0, {}, {0}), node(1, {0}, {0})};
  EXPECT_TRUE(valid_in_order(with_producer, {0, 1}));
}

TEST(LifetimeTest, ProducingAFreedIdRevivesIt) {
  // Frees 5, then a later node produces 5 again: readers after it are fine.
  std::vector<DagNode> nodes{node(0, {}, {10}, {5}), node(1, {}, {5}), node(2, {5}, {11})};
  // 5 is produced somewhere, so node 0 reading it first is a read before its producer.
  EXPECT_FALSE(valid_in_order(nodes, {0, 1, 2}));
  std::vector<DagNode> revive{node(0, {}, {5}), node(1, {}, {10}, {5}), node(2, {}, {5}), node(3, {5}, {11})};
  EXPECT_TRUE(valid_in_order(revive, {0, 1, 2, 3}));
  EXPECT_FALSE(valid_in_order(revive, {0, 1, 3, 2}));  // read after free
}

// ---------------------------------------------------------------------------------------------
// Randomized checks
// ---------------------------------------------------------------------------------------------

// Arbitrary nodes over a small id pool: edges of every kind, cycles included.
std::vector<DagNode> random_nodes(std::mt19937& rng, std::size_t n, std::uint64_t pool) {
  std::uniform_int_distribution<std::uint64_t> id(0, pool - 1);
  std::uniform_int_distribution<int> few(0, 2);
  std::uniform_int_distribution<std::uint64_t> pos(0, 2 * n);
  std::vector<DagNode> nodes(n);
  for (DagNode& d : nodes) {
    d.position = pos(rng);
    for (int k = few(rng); k > 0; --k) d.read.emplace_back(id(rng));
    for (int k = few(rng); k > 0; --k) d.produced.emplace_back(id(rng));
    if (!d.read.empty() && few(rng) == 0) d.freed.push_back(d.read.front());
  }
  return nodes;
}

// A valid single-op stream: each op reads live ids, frees some on their last use and produces
// fresh ids. Every topological order of such a stream is a valid execution order.
std::vector<DagNode> random_stream(std::mt19937& rng, std::size_t n) {
  std::vector<TensorId> live;
  std::uint64_t next = 0;
  for (int k = 0; k < 4; ++k) live.emplace_back(next++);  // external inputs
  std::uniform_int_distribution<int> coin(0, 3);
  std::vector<DagNode> nodes;
  for (std::size_t p = 0; p < n; ++p) {
    DagNode d;
    d.position = p;
    std::shuffle(live.begin(), live.end(), rng);
    const std::size_t inputs = std::min<std::size_t>(live.size(), 1 + coin(rng) % 2);
    std::vector<TensorId> kept;
    for (std::size_t k = 0; k < live.size(); ++k) {
      if (k < inputs) {
        d.read.push_back(live[k]);
        if (coin(rng) == 0) {
          d.freed.push_back(live[k]);  // last use
          continue;
        }
      }
      kept.push_back(live[k]);
    }
    live = kept;
    d.produced.emplace_back(next);
    live.emplace_back(next++);
    nodes.push_back(d);
  }
  return nodes;
}

// Brute-force edges straight from §12.2.
bool depends_on(const DagNode& i, const DagNode& j) {
  for (TensorId id : i.read) {
    if (j.produces(id)) return true;
  }
  for (TensorId id : i.freed) {
    if (j.reads(id)) return true;
  }
  return false;
}

// Brute-force transitive closure: closure[i][j] iff j reaches i along dependency edges.
std::vector<std::vector<bool>> closure(const Dag& dag) {
  const std::size_t n = dag.dependencies().size();
  std::vector<std::vector<bool>> anc(n, std::vector<bool>(n, false));
  for (std::size_t i = 0; i < n; ++i) {
    std::vector<std::size_t> stack(dag.dependencies()[i].begin(), dag.dependencies()[i].end());
    while (!stack.empty()) {
      std::size_t j = stack.back();
      stack.pop_back();
      if (anc[i][j]) continue;
      anc[i][j] = true;
      for (std::size_t k : dag.dependencies()[j]) stack.push_back(k);
    }
  }
  return anc;
}

TEST(DagRandomTest, EdgesOrderAndReachabilityAgreeWithBruteForce) {
  std::mt19937 rng(2024);
  int acyclic = 0;
  int cyclic = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const std::size_t n = 1 + iter % 12 + (iter % 50 == 0 ? 70 : 0);
    std::vector<DagNode> nodes = random_nodes(rng, n, 3 * n);
    Dag dag(nodes);
    ASSERT_EQ(dag.dependencies().size(), n);
    for (std::size_t i = 0; i < n; ++i) {
      Indices expected;
      for (std::size_t j = 0; j < n; ++j) {
        if (i != j && depends_on(nodes[i], nodes[j])) expected.push_back(j);
      }
      EXPECT_EQ(dag.dependencies()[i], expected) << "node " << i;
    }

    auto anc = closure(dag);
    bool has_cycle = false;
    for (std::size_t i = 0; i < n; ++i) has_cycle = has_cycle || anc[i][i];

    Order order = dag.topological_order();
    EXPECT_EQ(order.has_value(), !has_cycle);
    if (order) {
      ++acyclic;
      Indices sorted = *order;
      std::sort(sorted.begin(), sorted.end());
      for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(sorted[i], i);
      Indices rank(n);
      for (std::size_t k = 0; k < n; ++k) rank[(*order)[k]] = k;
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t j : dag.dependencies()[i]) EXPECT_LT(rank[j], rank[i]);
      }
    } else {
      ++cyclic;
    }

    Reachability r = dag.reachability();
    for (std::size_t i = 0; i < n; ++i) {
      for (std::size_t j = 0; j < n; ++j) {
        EXPECT_EQ(r.ancestors(i).contains(j), anc[i][j]) << i << " " << j;
        EXPECT_EQ(r.descendants(j).contains(i), anc[i][j]) << i << " " << j;
      }
    }

    // can_contract: symmetric, and equal to the definition evaluated by brute force.
    std::uniform_int_distribution<std::size_t> pick(0, n - 1);
    for (int t = 0; t < 10; ++t) {
      SubGraph a;
      SubGraph b;
      for (int k = static_cast<int>(pick(rng) % 3); k > 0; --k) a.insert(pick(rng));
      for (int k = static_cast<int>(pick(rng) % 3); k > 0; --k) b.insert(pick(rng));
      const bool ab = r.can_contract(a, b);
      EXPECT_EQ(ab, r.can_contract(b, a));
      SubGraph u = a;
      u.union_with(b);
      bool expected = !a.empty() && !b.empty();
      for (std::size_t z = 0; expected && z < n; ++z) {
        if (u.contains(z)) continue;
        bool before = false;  // z is an ancestor of some member
        bool after = false;   // z is a descendant of some member
        for (std::size_t x : u.to_vector()) {
          before = before || anc[x][z];
          after = after || anc[z][x];
        }
        if (before && after) expected = false;
      }
      EXPECT_EQ(ab, expected);
    }
  }
  // The generator must exercise both paths of reachability().
  EXPECT_GT(acyclic, 50);
  EXPECT_GT(cyclic, 20);
}

TEST(DagRandomTest, NoEdgesReproducesPositionOrder) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::uint64_t> pos(0, 20);
  for (int iter = 0; iter < 100; ++iter) {
    std::vector<DagNode> nodes(1 + iter % 30);
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      nodes[i].position = pos(rng);
      nodes[i].produced.emplace_back(i);  // nobody reads it: no edges
    }
    Indices expected(nodes.size());
    for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = i;
    std::stable_sort(expected.begin(), expected.end(),
                     [&](std::size_t a, std::size_t b) { return nodes[a].position < nodes[b].position; });
    EXPECT_EQ(Dag(nodes).topological_order(), Order(expected));
  }
}

TEST(DagRandomTest, TopologicalOrdersOfValidStreamsAreValid) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    std::vector<DagNode> nodes = random_stream(rng, 2 + iter % 20);
    Indices identity(nodes.size());
    for (std::size_t i = 0; i < identity.size(); ++i) identity[i] = i;
    ASSERT_TRUE(valid_in_order(nodes, identity));

    // Shuffle positions so Kahn's tie-break picks an order other than the stream order.
    for (DagNode& d : nodes) d.position = rng() % 8;
    Dag dag(nodes);
    Order order = dag.topological_order();
    ASSERT_TRUE(order.has_value());
    EXPECT_TRUE(valid_in_order(nodes, *order));

    // Swapping two adjacent nodes joined by an edge breaks validity.
    for (std::size_t k = 0; k + 1 < order->size(); ++k) {
      std::size_t first = (*order)[k];
      std::size_t second = (*order)[k + 1];
      const auto& deps = dag.dependencies()[second];
      if (std::find(deps.begin(), deps.end(), first) == deps.end()) continue;
      Indices swapped = *order;
      std::swap(swapped[k], swapped[k + 1]);
      EXPECT_FALSE(valid_in_order(nodes, swapped));
      break;
    }
  }
}

}  // namespace
}  // namespace kiln::fusion

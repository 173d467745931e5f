// The rendezvous store: who may join, the key-value calls, the meeting, and hostile input.
#include "kiln/distributed/store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "kiln/testing/status.h"

namespace kiln::distributed {
namespace {

using namespace std::chrono_literals;
using ::kiln::testing::StatusIs;

const StoreIdentity kIdentity{"train", 3, "kiln test"};

std::unique_ptr<StoreServer> start_server(StoreIdentity identity = kIdentity) {
  Result<std::unique_ptr<StoreServer>> s = StoreServer::start(TcpAddress{"127.0.0.1", 0}, std::move(identity));
  EXPECT_TRUE(s.ok()) << s.error().to_string();
  return std::move(s).value();
}

TcpAddress at(const StoreServer& s) { return TcpAddress{"127.0.0.1", s.port()}; }

Result<std::unique_ptr<StoreClient>> connect(const StoreServer& s, std::uint32_t rank,
                                             StoreIdentity identity = kIdentity) {
  return StoreClient::connect(at(s), identity, rank, 2s);
}

TEST(StoreTest, RefusesWhatIsNotItsJob) {
  auto server = start_server();
  EXPECT_THAT(connect(*server, 0, {"other", 3, "kiln test"}).status(),
              StatusIs(ErrorCode::Execution, "serves job 'train', not 'other'"));
  EXPECT_THAT(connect(*server, 0, {"train", 4, "kiln test"}).status(), StatusIs(ErrorCode::Execution, "4"));
  EXPECT_THAT(connect(*server, 1, {"train", 3, "kiln 9.9"}).status(),
              StatusIs(ErrorCode::Execution, "rank 1 runs kiln 9.9, rank 0 runs kiln test"));
  EXPECT_THAT(connect(*server, 3).status(), StatusIs(ErrorCode::Execution, "rank 3 is not below world_size 3"));
  ASSERT_OK_AND_ASSIGN(auto first, connect(*server, 1));
  EXPECT_THAT(connect(*server, 1).status(),
              StatusIs(ErrorCode::Execution, "rank 1 of job 'train' is connected already"));
  EXPECT_EQ(server->live_ranks(), std::vector<std::uint32_t>{1});
}

TEST(StoreTest, SetGetAndWaitForAKey) {
  auto server = start_server();
  ASSERT_OK_AND_ASSIGN(auto a, connect(*server, 0));
  ASSERT_OK_AND_ASSIGN(auto b, connect(*server, 1));
  // b waits for a key a sets later.
  auto waiting = std::async(std::launch::async, [&b] { return b->get("0/rank_0", 5s); });
  std::this_thread::sleep_for(50ms);
  const std::vector<std::uint8_t> value{1, 2, 3};
  KILN_ASSERT_OK(a->set("0/rank_0", value));
  ASSERT_OK_AND_ASSIGN(std::vector<std::uint8_t> got, waiting.get());
  EXPECT_EQ(got, value);
  EXPECT_THAT(a->get("absent", 50ms).status(), StatusIs(ErrorCode::Execution, "key 'absent' was not set within 50 ms"));
  // The connection survives a refused request.
  ASSERT_OK_AND_ASSIGN(got, a->get("0/rank_0", 1s));
  EXPECT_EQ(got, value);
  EXPECT_THAT(a->set(std::string(kMaxStoreKeyBytes + 1, 'k'), value), StatusIs(ErrorCode::Invalid, "too large"));
  EXPECT_TRUE(a->connected());  // refusals keep the connection
  server.reset();               // the store goes away: the next call fails and ends it
  EXPECT_FALSE(a->set("k", value).ok());
  EXPECT_FALSE(a->connected());
}

TEST(StoreTest, JoinMeetsEveryRankOrNamesTheMissingOnes) {
  auto server = start_server();
  ASSERT_OK_AND_ASSIGN(auto r0, connect(*server, 0));
  ASSERT_OK_AND_ASSIGN(auto r1, connect(*server, 1));
  ASSERT_OK_AND_ASSIGN(auto r2, connect(*server, 2));
  // Rank 2 stays away: the others' join names it (and rank 0 too, if rank 1 joined first and
  // timed out before rank 0's join came: "rank(s) 0, 2 of ...").
  auto j0 = std::async(std::launch::async, [&] { return r0->join(300ms); });
  EXPECT_THAT(r1->join(300ms).status(), StatusIs(ErrorCode::Execution, "2 of job 'train' did not join within 300 ms"));
  EXPECT_FALSE(j0.get().ok());
  // All three: one generation, the same for all.
  auto a = std::async(std::launch::async, [&] { return r0->join(5s); });
  auto b = std::async(std::launch::async, [&] { return r1->join(5s); });
  ASSERT_OK_AND_ASSIGN(std::uint64_t g2, r2->join(5s));
  ASSERT_OK_AND_ASSIGN(std::uint64_t g0, a.get());
  ASSERT_OK_AND_ASSIGN(std::uint64_t g1, b.get());
  EXPECT_EQ(g0, g2);
  EXPECT_EQ(g1, g2);
  // The next meeting is a new generation.
  auto c = std::async(std::launch::async, [&] { return r0->join(5s); });
  auto d = std::async(std::launch::async, [&] { return r1->join(5s); });
  ASSERT_OK_AND_ASSIGN(std::uint64_t next, r2->join(5s));
  EXPECT_EQ(next, g2 + 1);
  EXPECT_TRUE(c.get().ok());
  EXPECT_TRUE(d.get().ok());
}

TEST(StoreTest, ADisconnectedRankIsNoLongerLive) {
  auto server = start_server();
  ASSERT_OK_AND_ASSIGN(auto r0, connect(*server, 0));
  {
    ASSERT_OK_AND_ASSIGN(auto r2, connect(*server, 2));
    ASSERT_OK_AND_ASSIGN(auto live, r0->live_ranks());
    EXPECT_EQ(live, (std::vector<std::uint32_t>{0, 2}));
  }
  for (int i = 0; i < 1000 && server->live_ranks().size() != 1; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_OK_AND_ASSIGN(auto live, r0->live_ranks());
  EXPECT_EQ(live, std::vector<std::uint32_t>{0});
  // The rank may come back (a restarted daemon).
  ASSERT_OK_AND_ASSIGN(auto again, connect(*server, 2));
}

// Raw bytes from a hostile peer: an oversized frame, garbage instead of hello, a hello with a
// length running past the frame. Each connection is closed; the store goes on serving.
TEST(StoreTest, MalformedInputClosesOnlyThatConnection) {
  auto server = start_server();
  const auto raw = [&](std::vector<std::uint8_t> bytes) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(server->port());
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    std::uint8_t buf[256];
    ssize_t n = 0, total = 0;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) total += n;  // until the store closes it
    ::close(fd);
    return total;
  };
  EXPECT_EQ(raw({0xff, 0xff, 0xff, 0x7f}), 0);              // a 2 GiB frame: closed, no answer
  EXPECT_GT(raw({5, 0, 0, 0, 2, 0, 0, 0, 0}), 0);           // set before hello: an error, then closed
  EXPECT_GT(raw({6, 0, 0, 0, 1, 0xff, 0xff, 0, 0, 0}), 0);  // a job name longer than its frame
  EXPECT_EQ(raw({1, 0, 0, 0, 99}), 0);                      // an unknown op: closed
  ASSERT_OK_AND_ASSIGN(auto ok, connect(*server, 0));
  KILN_EXPECT_OK(ok->set("k", std::vector<std::uint8_t>{1}));
}

TEST(StoreTest, ConnectWaitsForAStoreThatStartsLate) {
  // Reserve a port, free it, and start the server there after the client began connecting. The
  // port may be taken meanwhile by another program (tests run in parallel): then try another.
  bool served = false;
  for (int attempt = 0; attempt < 5 && !served; ++attempt) {
    std::uint16_t port = 0;
    {
      auto probe = start_server();
      port = probe->port();
    }
    auto client = std::async(std::launch::async, [port] {
      return StoreClient::connect(TcpAddress{"127.0.0.1", port}, kIdentity, 1, 5s);
    });
    std::this_thread::sleep_for(200ms);
    Result<std::unique_ptr<StoreServer>> late = StoreServer::start(TcpAddress{"127.0.0.1", port}, kIdentity);
    if (!late.ok()) {
      (void)client.get();
      continue;
    }
    ASSERT_OK_AND_ASSIGN(auto c, client.get());
    EXPECT_EQ((*late)->live_ranks(), std::vector<std::uint32_t>{1});
    served = true;
  }
  EXPECT_TRUE(served);
  EXPECT_THAT(StoreClient::connect(TcpAddress{"127.0.0.1", 1}, kIdentity, 1, 100ms).status(),
              StatusIs(ErrorCode::Execution, "could not be reached"));
}

TEST(StoreTest, AddressForms) {
  ASSERT_OK_AND_ASSIGN(TcpAddress v4, parse_tcp_address("tcp:10.0.0.1:29400"));
  EXPECT_EQ(v4.host, "10.0.0.1");
  EXPECT_EQ(v4.port, 29400);
  ASSERT_OK_AND_ASSIGN(TcpAddress v6, parse_tcp_address("tcp:[::1]:80"));
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.to_string(), "tcp:[::1]:80");
  EXPECT_THAT(parse_tcp_address("tcp:localhost:80").status(), StatusIs(ErrorCode::Config, "not a numeric"));
  EXPECT_THAT(parse_tcp_address("unix:/x").status(), StatusIs(ErrorCode::Config, "not a tcp: address"));
  EXPECT_THAT(parse_tcp_address("tcp:1.2.3.4:70000").status(), StatusIs(ErrorCode::Config, "port '70000'"));
  DistributedConfig c{"train", 2, 2, v4, "", 1000ms};
  EXPECT_THAT(validate(c), StatusIs(ErrorCode::Config, "distributed.rank 2 is not below world_size 2"));
  c.rank = 1;
  c.rendezvous.port = 0;
  EXPECT_THAT(validate(c), StatusIs(ErrorCode::Config, "port 0"));
  c.rendezvous.port = 1;
  c.timeout = 0ms;
  EXPECT_THAT(validate(c), StatusIs(ErrorCode::Config, "timeout_ms"));
}

}  // namespace
}  // namespace kiln::distributed

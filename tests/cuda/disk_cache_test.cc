// The on-disk kernel cache: round trip, directory ownership and mode, and corrupt or
// mismatched entries ignored (then rebuilt by the caller).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <functional>

#include "kiln/cuda/disk_cache.h"
#include "kiln/testing/status.h"

namespace kiln::cuda {
namespace {

namespace fs = std::filesystem;

class DiskCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("kiln-cuda-cache-test-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  CacheVersions versions() const { return CacheVersions{"0.1.0", 13000, 0}; }
  static CompiledCode code(int arch, std::size_t n) {
    CompiledCode c;
    c.arch = arch;
    c.is_cubin = true;
    for (std::size_t i = 0; i < n; ++i) c.bytes.push_back(static_cast<std::byte>(i * 7 + 1));
    return c;
  }
  fs::path root_;
};

TEST_F(DiskCacheTest, CreatesAPrivateDirectoryAndRoundTrips) {
  const fs::path dir = root_ / "kiln" / "cuda";
  Result<DiskCache> cache = DiskCache::open(dir, versions());
  ASSERT_TRUE(cache.ok()) << cache.error().message;
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());

  const CompileOptions opts{.arch = 90};
  const std::uint64_t key = code_key("extern \"C\" __global__ void k() {}", opts);
  EXPECT_FALSE(cache->load(key, opts).has_value());
  KILN_ASSERT_OK(cache->store(key, code(90, 1000)));
  std::optional<CompiledCode> hit = cache->load(key, opts);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->bytes, code(90, 1000).bytes);
  EXPECT_EQ(hit->arch, 90);
  EXPECT_TRUE(hit->is_cubin);
  const DiskCacheStats s = cache->stats();
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.stores, 1u);
  EXPECT_EQ(s.rejected, 0u);
  // Another architecture is another entry.
  EXPECT_FALSE(cache->load(key, CompileOptions{.arch = 75}).has_value());
}

TEST_F(DiskCacheTest, KeysFollowSourceAndOptions) {
  const CompileOptions a{.arch = 90}, b{.arch = 75}, c{.arch = 90, .cubin = false};
  EXPECT_EQ(code_key("x", a), code_key("x", a));
  EXPECT_NE(code_key("x", a), code_key("y", a));
  EXPECT_NE(code_key("x", a), code_key("x", b));
  EXPECT_NE(code_key("x", a), code_key("x", c));
}

// Every corruption is ignored (a miss), the file is removed, and a fresh store works again.
TEST_F(DiskCacheTest, CorruptEntriesAreIgnoredAndRebuilt) {
  Result<DiskCache> cache = DiskCache::open(root_, versions());
  ASSERT_TRUE(cache.ok()) << cache.error().message;
  const CompileOptions opts{.arch = 90};
  const std::uint64_t key = code_key("source", opts);
  const fs::path path = cache->entry_path(key, opts);

  auto corrupt = [&](auto&& edit) {
    KILN_ASSERT_OK(cache->store(key, code(90, 512)));
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    in.close();
    edit(bytes);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  };
  const std::vector<std::pair<std::string, std::function<void(std::string&)>>> cases = {
      {"flipped payload byte", [](std::string& b) { b[b.size() - 10] ^= 0x55; }},
      {"truncated payload", [](std::string& b) { b.resize(b.size() - 100); }},
      {"truncated header", [](std::string& b) { b.resize(20); }},
      {"bad magic", [](std::string& b) { b[0] = 'X'; }},
      {"empty file", [](std::string& b) { b.clear(); }},
      {"trailing garbage", [](std::string& b) { b += "garbage"; }},
  };
  std::uint64_t rejected = 0;
  for (const auto& [name, edit] : cases) {
    corrupt(edit);
    EXPECT_FALSE(cache->load(key, opts).has_value()) << name;
    EXPECT_FALSE(fs::exists(path)) << name << ": a rejected entry is removed";
    EXPECT_EQ(cache->stats().rejected, ++rejected) << name;
    ASSERT_TRUE(cache->store(key, code(90, 512)).ok()) << name << ": rebuilt";
    EXPECT_TRUE(cache->load(key, opts).has_value()) << name;
  }
}

TEST_F(DiskCacheTest, EntriesOfOtherVersionsAreIgnored) {
  const CompileOptions opts{.arch = 90};
  const std::uint64_t key = code_key("source", opts);
  {
    Result<DiskCache> old = DiskCache::open(root_, CacheVersions{"0.0.9", 13000, 0});
    KILN_ASSERT_OK(old);
    KILN_ASSERT_OK(old->store(key, code(90, 64)));
  }
  Result<DiskCache> now = DiskCache::open(root_, versions());
  KILN_ASSERT_OK(now);
  EXPECT_FALSE(now->load(key, opts).has_value()) << "another kiln version";
  {
    Result<DiskCache> other = DiskCache::open(root_, CacheVersions{"0.1.0", 12080, 0});
    KILN_ASSERT_OK(other->store(key, code(90, 64)));
  }
  EXPECT_FALSE(now->load(key, opts).has_value()) << "another NVRTC";
  {
    Result<DiskCache> other = DiskCache::open(root_, CacheVersions{"0.1.0", 13000, 12040});
    KILN_ASSERT_OK(other->store(key, code(90, 64)));
  }
  EXPECT_FALSE(now->load(key, opts).has_value()) << "another driver";
  EXPECT_EQ(now->stats().rejected, 3u);
}

TEST_F(DiskCacheTest, RefusesDirectoriesOthersCouldWrite) {
  fs::create_directories(root_);
  ASSERT_EQ(::chmod(root_.c_str(), 0777), 0);
  Result<DiskCache> cache = DiskCache::open(root_, versions());
  ASSERT_FALSE(cache.ok());
  EXPECT_EQ(cache.error().code, ErrorCode::Config);
  EXPECT_NE(cache.error().message.find("writable by group or others"), std::string::npos) << cache.error().message;
  ASSERT_EQ(::chmod(root_.c_str(), 0700), 0);
  KILN_EXPECT_OK(DiskCache::open(root_, versions()));
  // A file where the directory should be.
  const fs::path file = root_ / "file";
  std::ofstream(file) << "x";
  EXPECT_FALSE(DiskCache::open(file, versions()).ok());
}

TEST_F(DiskCacheTest, DefaultDirectoryFollowsTheEnvironment) {
  ::setenv("KILN_CUDA_CACHE_DIR", "/tmp/kiln-explicit", 1);
  EXPECT_EQ(DiskCache::default_dir(), fs::path("/tmp/kiln-explicit"));
  ::unsetenv("KILN_CUDA_CACHE_DIR");
  EXPECT_FALSE(DiskCache::default_dir().empty());
}

}  // namespace
}  // namespace kiln::cuda

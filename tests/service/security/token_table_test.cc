// TokenTable: the tokens file format, its errors, and reloads that keep the last good table.
#include "service/security/token_table.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace centroidkv::service {
namespace {

TEST(TokenTableTest, ParsesPairsCommentsAndBlankLines) {
  auto tokens = TokenTable::Parse("# tokens\n\n  t1 worker-a \nt2\tworker.b@ns:1\n", "f");
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_EQ(tokens->size(), 2u);
}

TEST(TokenTableTest, ErrorsNameTheLineAndNeverTheToken) {
  auto one_field = TokenTable::Parse("ok worker\nsecret-token\n", "tokens.txt");
  EXPECT_EQ(one_field.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(one_field.status().message().find("tokens.txt line 2"), std::string::npos);
  EXPECT_EQ(one_field.status().message().find("secret-token"), std::string::npos);
  auto duplicate = TokenTable::Parse("same a\nsame b\n", "f");
  EXPECT_NE(duplicate.status().message().find("duplicate token"), std::string::npos);
  auto bad_name = TokenTable::Parse("t1 wor\"ker\n", "f");
  EXPECT_NE(bad_name.status().message().find("caller name"), std::string::npos);
}

TEST(TokenTableTest, ReloadSwapsTheTableAndKeepsItOnError) {
  char pattern[] = "/tmp/ckv-token-table-XXXXXX";
  close(mkstemp(pattern));
  const std::string path = pattern;
  std::ofstream(path) << "t1 worker-a\nt2 worker-b\n";
  auto table = TokenTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ((*table)->Lookup("t1"), "worker-a");
  EXPECT_EQ((*table)->Lookup("t2"), "worker-b");
  EXPECT_FALSE((*table)->Lookup("t3").has_value());
  EXPECT_FALSE((*table)->Lookup("").has_value());
  std::ofstream(path) << "t2 worker-b\n";
  ASSERT_TRUE((*table)->Reload().ok());
  EXPECT_FALSE((*table)->Lookup("t1").has_value());
  EXPECT_EQ((*table)->Lookup("t2"), "worker-b");
  std::ofstream(path) << "broken\n";
  EXPECT_FALSE((*table)->Reload().ok());
  EXPECT_EQ((*table)->Lookup("t2"), "worker-b");
  std::remove(path.c_str());
  EXPECT_EQ((*table)->Reload().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenTable::Load(path).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace centroidkv::service

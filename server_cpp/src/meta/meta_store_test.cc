#include "meta/meta_store.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace tce {
namespace {

bool Built(const std::string& scheme) {
  const std::vector<std::string> schemes = MetaStoreSchemes();
  return std::find(schemes.begin(), schemes.end(), scheme) != schemes.end();
}

TEST(OpenMetaStore, BadUrls) {
  std::unique_ptr<MetaStore> s;
  EXPECT_TRUE(Built("sqlite"));
  EXPECT_EQ(OpenMetaStore("sqlite://relative.db", &s).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(OpenMetaStore("postgres://u@h/db", &s).code(), Status::Code::kUnimplemented);
  EXPECT_FALSE(OpenMetaStore("sqlite:///nonexistent-dir/x/tce.db", &s).ok());
  EXPECT_EQ(s, nullptr);
}

// A build without MariaDB's connector says what it lacks; one with it
// checks the URL before connecting.
TEST(OpenMetaStore, MysqlIsBuiltOrSaysSo) {
  std::unique_ptr<MetaStore> s;
  const Status st = OpenMetaStore("mysql://tce:secret@h/db", &s, "server");
  if (Built("mysql")) {
    EXPECT_EQ(OpenMetaStore("mysql://u@h", &s, "server").code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(OpenMetaStore("mysql://u@h/db", &s).code(), Status::Code::kInvalidArgument);  // no server id
  } else {
    EXPECT_EQ(st.code(), Status::Code::kUnimplemented);
    EXPECT_NE(st.message().find("built without MySQL support (cmake -DTCE_WITH_MYSQL=ON"), std::string::npos)
        << st.message();
    EXPECT_EQ(st.message().find("secret"), std::string::npos) << st.message();
  }
  EXPECT_EQ(s, nullptr);
}

TEST(RedactUrl, HidesThePassword) {
  EXPECT_EQ(RedactUrl("mysql://tce:p@ss:w@127.0.0.1:3307/ckpt"), "mysql://tce:***@127.0.0.1:3307/ckpt");
  EXPECT_EQ(RedactUrl("mysql://tce@h/db"), "mysql://tce@h/db");
  EXPECT_EQ(RedactUrl("sqlite:///var/lib/tce/tce.db"), "sqlite:///var/lib/tce/tce.db");
}

}  // namespace
}  // namespace tce

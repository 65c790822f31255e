// What needs no database: the URL. (tests/test_mysql.py runs the store
// against a real MariaDB server.)
#include "meta/mysql_store.h"

#include <gtest/gtest.h>

namespace tce {
namespace {

TEST(MysqlStore, ParsesItsUrl) {
  MysqlUrl u;
  ASSERT_TRUE(ParseMysqlUrl("mysql://tce:p@ss:w@127.0.0.1:3307/ckpt", &u).ok());
  EXPECT_EQ(u.user, "tce");
  EXPECT_EQ(u.password, "p@ss:w");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 3307u);
  EXPECT_EQ(u.database, "ckpt");
  EXPECT_EQ(ParseMysqlUrl("mysql://u@h", &u).code(), Status::Code::kInvalidArgument);  // no database
  EXPECT_EQ(ParseMysqlUrl("mysql://u@h:99999/db", &u).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(ParseMysqlUrl("sqlite:///x.db", &u).code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace tce

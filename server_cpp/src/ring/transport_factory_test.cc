// NewTransport's errors. Built twice: into tce_server_tests with the build's
// TCE_WITH_LIBFABRIC, and (where that is on) into
// tce_transport_factory_nofabric_tests with the factory compiled as if
// libfabric were missing, so the message such a build gives is checked too.
#include "ring/transport_factory.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

namespace tce {
namespace {

TEST(TransportFactory, UnknownNamesAreClearErrors) {
  std::unique_ptr<Transport> t;
  TransportOptions o;
  o.name = "carrier-pigeon";
  Status s = NewTransport(o, &t);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown ring transport 'carrier-pigeon' (tcp, ofi)"), std::string::npos)
      << s.message();
  o.name = "tcp";
  o.streams = kMaxLanes + 1;
  EXPECT_EQ(NewTransport(o, &t).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(t, nullptr);
  o.streams = 4;
  ASSERT_TRUE(NewTransport(o, &t).ok());
  EXPECT_STREQ(t->name(), "tcp");
  EXPECT_EQ(t->lanes(), 4);
}

#if TCE_WITH_LIBFABRIC

TEST(TransportFactory, OfiNamesTheDeviceOrProviderItCannotOpen) {
  std::unique_ptr<Transport> t;
  TransportOptions o;
  o.name = "ofi";
  o.ofi_provider = "tcp";
  o.ofi_devices = "=no_such_hca";
  Status s = NewTransport(o, &t);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("no fabric device matches '=no_such_hca' (devices: "), std::string::npos) << s.message();
  o.ofi_devices.clear();
  o.ofi_provider = "no-such-provider";
  s = NewTransport(o, &t);
  EXPECT_EQ(s.code(), Status::Code::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("(provider 'no-such-provider')"), std::string::npos) << s.message();
}

TEST(TransportFactory, FabricInfoListsLibfabric) {
  std::string json;
  ASSERT_TRUE(FabricInfo("", 2, &json).ok());
  EXPECT_EQ(json.rfind("{\"libfabric\": \"", 0), 0u) << json;
  EXPECT_NE(json.find("\"local_ranks\": [["), std::string::npos) << json;
}

#else

TEST(TransportFactory, WithoutLibfabricOfiNamesTheMissingLibrary) {
  std::unique_ptr<Transport> t;
  TransportOptions o;
  o.name = "ofi";
  Status s = NewTransport(o, &t);
  EXPECT_EQ(s.code(), Status::Code::kUnimplemented) << s.ToString();
  EXPECT_NE(s.message().find("the ofi transport needs libfabric, and this tce-server was built without it "
                             "(CMake option TCE_WITH_LIBFABRIC=OFF)"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(t, nullptr);
  std::string json = "untouched";
  s = FabricInfo("", 1, &json);
  EXPECT_EQ(s.code(), Status::Code::kUnimplemented) << s.ToString();
  EXPECT_NE(s.message().find("the fabric listing needs libfabric"), std::string::npos) << s.message();
  EXPECT_EQ(json, "");
}

#endif

}  // namespace
}  // namespace tce

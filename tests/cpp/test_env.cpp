// The K3_* switch parser (core/env.h): every spelling of on and off, the default when unset, empty or
// unrecognized.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/env.h"

namespace k3 {
namespace {

constexpr const char* kName = "K3_TEST_ENV_SWITCH";

struct Unset {
  ~Unset() { unsetenv(kName); }
};

TEST(EnvSwitch, UnsetAndEmptyKeepTheDefault) {
  Unset u;
  unsetenv(kName);
  EXPECT_TRUE(env_switch(kName, true));
  EXPECT_FALSE(env_switch(kName, false));
  setenv(kName, "", 1);
  EXPECT_TRUE(env_switch(kName, true));
  EXPECT_FALSE(env_switch(kName, false));
}

TEST(EnvSwitch, OnAndOffSpellings) {
  Unset u;
  for (const char* v : {"1", "on", "ON", "true", "True", "yes"}) {
    setenv(kName, v, 1);
    EXPECT_TRUE(env_switch(kName, false)) << v;
  }
  for (const char* v : {"0", "off", "OFF", "false", "No"}) {
    setenv(kName, v, 1);
    EXPECT_FALSE(env_switch(kName, true)) << v;
  }
}

TEST(EnvSwitch, UnrecognizedValueKeepsTheDefault) {
  Unset u;
  for (const char* v : {"2", "maybe", "00"}) {
    setenv(kName, v, 1);
    EXPECT_TRUE(env_switch(kName, true)) << v;
    EXPECT_FALSE(env_switch(kName, false)) << v;
  }
}

TEST(EnvValue, RawValueOrEmpty) {
  Unset u;
  unsetenv(kName);
  EXPECT_EQ(env_value(kName), "");
  setenv(kName, "wgmma", 1);
  EXPECT_EQ(env_value(kName), "wgmma");
}

}  // namespace
}  // namespace k3

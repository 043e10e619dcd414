#include "common/core/dynamic_library.h"

#include <dlfcn.h>
#include <stdlib.h>

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kVar[] = "BATON_DYNAMIC_LIBRARY_TEST_LIBRARY";

TEST(LibraryCandidatesTest, SonameThenHint) {
  unsetenv(kVar);
  EXPECT_THAT(LibraryCandidates(kVar, "libx.so.1", "/opt/x/libx.so.1"),
              ElementsAre("libx.so.1", "/opt/x/libx.so.1"));
  EXPECT_THAT(LibraryCandidates(kVar, "libx.so.1", nullptr), ElementsAre("libx.so.1"));
  EXPECT_THAT(LibraryCandidates(kVar, "libx.so.1", "libx.so.1"), ElementsAre("libx.so.1"));
}

TEST(LibraryCandidatesTest, EnvironmentAloneWhenSet) {
  setenv(kVar, "/mine/libx.so", 1);
  EXPECT_THAT(LibraryCandidates(kVar, "libx.so.1", "/opt/x/libx.so.1"),
              ElementsAre("/mine/libx.so"));
  setenv(kVar, "", 1);  // empty counts as unset
  EXPECT_THAT(LibraryCandidates(kVar, "libx.so.1", nullptr), ElementsAre("libx.so.1"));
  unsetenv(kVar);
}

TEST(OpenLibraryTest, MissingLibraryNamesItself) {
  std::string error;
  EXPECT_EQ(OpenLibrary("/nonexistent/libbaton_none.so", &error), nullptr);
  EXPECT_THAT(error, HasSubstr("libbaton_none.so"));
}

TEST(FindSymbolTest, ListsEveryMissingFunction) {
  std::string error;
  void* libc = OpenLibrary("libc.so.6", &error);
  ASSERT_NE(libc, nullptr) << error;
  decltype(&::strlen) found = nullptr;
  decltype(&::strlen) absent = nullptr;
  std::vector<std::string> missing;
  FindSymbol(libc, "strlen", &found, &missing);
  EXPECT_THAT(missing, IsEmpty());
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found("four"), 4u);
  FindSymbol(libc, "baton_no_such_function", &absent, &missing);
  FindSymbol(libc, "baton_nor_this_one", &absent, &missing);
  EXPECT_EQ(absent, nullptr);
  EXPECT_THAT(missing, ElementsAre("baton_no_such_function", "baton_nor_this_one"));
  dlclose(libc);
}

}  // namespace
}  // namespace baton

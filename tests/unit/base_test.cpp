// common/ (ddl_base, ddl_config): host:port, signal names, Fd, clocks, JSON settings files, Status.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "common/clock.h"
#include "common/fd.h"
#include "common/host_port.h"
#include "common/json_config.h"
#include "common/resources.h"
#include "common/signals.h"
#include "common/status.h"

namespace ddl {
namespace {

// --- resources

TEST(Resources, CpuListsParseAndFormatAsTheKernelWritesThem) {
  std::vector<int> cpus;
  EXPECT_EQ(parseCpuList("0-3,8,10-11\n", &cpus), "");
  EXPECT_EQ(cpus, (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(formatCpuList(cpus), "0-3,8,10-11");
  EXPECT_EQ(formatCpuList({9, 1, 2, 0, 2}), "0-2,9");
  EXPECT_EQ(parseCpuList("", &cpus), "");
  EXPECT_TRUE(cpus.empty());
  EXPECT_EQ(formatCpuList({}), "");
  for (const char* bad : {"a", "3-1", "0-", "-2", "1,,2", "1,", "70000", "0-99999999"}) {
    std::vector<int> untouched{42};
    EXPECT_NE(parseCpuList(bad, &untouched), "") << bad;
    EXPECT_EQ(untouched, (std::vector<int>{42})) << bad;
  }
}

TEST(Resources, ByteSizesAreBinaryAsSlurmsMem) {
  struct Case {
    const char* text;
    int64_t bytes;
  } cases[] = {{"512M", int64_t{512} << 20},
               {"8G", int64_t{8} << 30},
               {"8GiB", int64_t{8} << 30},
               {"8gb", int64_t{8} << 30},
               {"1.5T", int64_t{3} << 39},
               {"4096", 4096},
               {"2K", 2048},
               {"1 G", int64_t{1} << 30}};
  for (const Case& c : cases) {
    int64_t bytes = 0;
    EXPECT_EQ(parseByteSize(c.text, &bytes), "") << c.text;
    EXPECT_EQ(bytes, c.bytes) << c.text;
  }
  for (const char* bad : {"", "G", "8X", "1.5", "0", "0.0001K", "2P", "1.2.3G", "-1G"}) {
    int64_t bytes = 7;
    EXPECT_NE(parseByteSize(bad, &bytes), "") << bad;
    EXPECT_EQ(bytes, 7) << bad;
  }
  EXPECT_EQ(formatBytes(int64_t{8} << 30), "8 GiB");
  EXPECT_EQ(formatBytes(int64_t{3} << 29), "1.5 GiB");
  EXPECT_EQ(formatBytes(int64_t{512} << 20), "512 MiB");
  EXPECT_EQ(formatBytes(100), "100 B");
  EXPECT_EQ(formatBytes(0), "0 B");
}

// --- host_port

TEST(HostPort, ParsesNamesV4AndBracketedV6) {
  struct Case {
    const char* text;
    const char* host;
    int port;
  };
  for (Case c : {Case{"127.0.0.1:7070", "127.0.0.1", 7070}, Case{"head-node:1", "head-node", 1},
                 Case{"[::1]:7070", "::1", 7070}, Case{"[fd00::1]:65535", "fd00::1", 65535},
                 Case{"0.0.0.0:0", "0.0.0.0", 0}, Case{"[::]:0", "::", 0}}) {
    StatusOr<HostPort> hp = parseHostPort(c.text);
    ASSERT_TRUE(hp) << c.text << ": " << hp.status().message();
    EXPECT_EQ(hp->host, c.host) << c.text;
    EXPECT_EQ(hp->port, c.port) << c.text;
  }
}

TEST(HostPort, BadInputSaysWhy) {
  struct Case {
    const char* text;
    int min_port;
    const char* why;
  };
  for (Case c : {Case{"", 0, "it is empty"}, Case{"head", 0, "no port"}, Case{"head:", 0, "no port"},
                 Case{":7070", 0, "no host"}, Case{"[]:7070", 0, "no host"}, Case{"[::1]", 0, "no port"},
                 Case{"[::1]7070", 0, "expected ':' after ']'"}, Case{"[::1:7070", 0, "'[' without ']'"},
                 Case{"::1:7070", 0, "brackets"}, Case{"head:7o70", 0, "port '7o70' is not a number"},
                 Case{"head:-1", 0, "is not a number"}, Case{"head:123456", 0, "is not a number"},
                 Case{"head:70000", 0, "port 70000 is out of range 0-65535"},
                 Case{"head:0", 1, "port 0 is out of range 1-65535"}, Case{"http://head:7070", 0, "scheme"},
                 Case{"head :7070", 0, "space"}, Case{"a/b:1", 0, "'/'"}}) {
    StatusOr<HostPort> hp = parseHostPort(c.text, c.min_port);
    ASSERT_FALSE(hp) << c.text;
    EXPECT_EQ(hp.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(hp.status().message().find(c.why), std::string::npos)
        << c.text << " -> " << hp.status().message();
  }
}

TEST(HostPort, FormatsAndRoundTrips) {
  EXPECT_EQ(formatHostPort("node7", 1), "node7:1");
  EXPECT_EQ(formatHostPort("fd00::1", 29500), "[fd00::1]:29500");
  EXPECT_EQ(formatHostPort("[fd00::1]", 1), "[fd00::1]:1");
  for (const char* text : {"10.0.0.1:7070", "[fd00::1]:29500", "ctl.example.org:65535"}) {
    StatusOr<HostPort> hp = parseHostPort(text);
    ASSERT_TRUE(hp) << text;
    EXPECT_EQ(formatHostPort(hp->host, hp->port), text);
  }
}

TEST(HostPort, HostOfTakesAnyForm) {
  EXPECT_EQ(hostOf("127.0.0.1:7070"), "127.0.0.1");
  EXPECT_EQ(hostOf("[::1]:7070"), "::1");
  EXPECT_EQ(hostOf("[::1]"), "::1");
  EXPECT_EQ(hostOf("::1"), "::1");  // a bare IPv6 address is all host
  EXPECT_EQ(hostOf("localhost"), "localhost");
  EXPECT_EQ(hostOf("[::1"), "::1");
  EXPECT_EQ(hostOf(""), "");
}

TEST(HostPort, LoopbackIsLocalhost127AndV6One) {
  for (const char* yes :
       {"127.0.0.1:7070", "127.9.9.9:1", "localhost:7070", "[::1]:7070", "::1", "127.0.0.1", "localhost"}) {
    EXPECT_TRUE(isLoopback(yes)) << yes;
  }
  for (const char* no : {"0.0.0.0:7070", "10.0.0.1:7070", "[::]:7070", "[fd00::1]:1", "head:7070",
                         "128.0.0.1:1", "", "::1:7070", "localhost.example.org:1"}) {
    EXPECT_FALSE(isLoopback(no)) << no;
  }
}

// --- signals

TEST(Signals, NamesAndNumbers) {
  EXPECT_EQ(signalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(signalName(SIGKILL), "SIGKILL");
  EXPECT_EQ(signalName(SIGWINCH), "SIGWINCH");
  EXPECT_EQ(signalName(77), "signal 77");
  EXPECT_EQ(signalName(0), "signal 0");
  EXPECT_EQ(signalName(-3), "signal -3");
  EXPECT_EQ(signalAbbrev(77), nullptr);
  EXPECT_STREQ(signalAbbrev(SIGSEGV), "SIGSEGV");
  for (const char* text : {"SIGTERM", "TERM", "sigterm", "term", "15"}) {
    EXPECT_EQ(signalNumber(text), std::optional<int>(SIGTERM)) << text;
  }
  EXPECT_EQ(signalNumber("SIGKILL"), std::optional<int>(SIGKILL));
  for (const char* bad : {"", "SIG", "SIGFOO", "0", "65", "15x", "-9", "TERM ", "99999999999999999999"}) {
    EXPECT_EQ(signalNumber(bad), std::nullopt) << bad;
  }
  // Every name maps back to its number.
  for (int s = 1; s < 32; ++s) {
    if (const char* name = signalAbbrev(s)) {
      EXPECT_EQ(signalNumber(name), std::optional<int>(s)) << name;
    }
  }
}

// --- fd, clock

bool isOpen(int fd) { return fcntl(fd, F_GETFD) != -1; }

TEST(Fd, ClosesOnceAndMoves) {
  int raw = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(raw, 0);
  {
    Fd a(raw);
    EXPECT_TRUE(a.valid());
    Fd b(std::move(a));
    EXPECT_FALSE(a.valid());
    EXPECT_EQ(b.get(), raw);
    Fd c;
    EXPECT_FALSE(c);
    c = std::move(b);
    EXPECT_TRUE(isOpen(raw));
  }
  EXPECT_FALSE(isOpen(raw));
  Fd d(open("/dev/null", O_RDONLY | O_CLOEXEC));
  int kept = d.release();
  EXPECT_FALSE(d.valid());
  EXPECT_TRUE(isOpen(kept));
  close(kept);
  Fd e(open("/dev/null", O_RDONLY | O_CLOEXEC));
  int first = e.get();
  e.reset();
  EXPECT_FALSE(isOpen(first));
}

TEST(Clock, UnixIsWallTimeAndSteadyNeverGoesBack) {
  const int64_t unix_ms = unixNowMs();
  EXPECT_GT(unix_ms, int64_t{1600000000} * 1000);  // after September 2020
  EXPECT_EQ(unixNowS(), unixNowMs() / 1000);
  int64_t last = steadyNowMs();
  for (int i = 0; i < 1000; ++i) {
    const int64_t now = steadyNowMs();
    EXPECT_GE(now, last);
    last = now;
  }
}

// --- json_config

struct Sample {
  std::string name = "default";
  int port = 7070;
  double grace_s = 1.5;
  bool on = false;
  std::optional<bool> tls;
  std::map<std::string, std::string> labels;
};
DDL_JSON_CONFIG(Sample, name, port, grace_s, on, tls, labels)

TEST(JsonConfig, AppliesOverDefaultsAndKeepsWhatIsNotGiven) {
  Sample s;
  s.name = "set-before";
  Status st =
      parseJsonConfig(R"({"port": 80, "grace_s": 2, "tls": true, "labels": {"rack": "r1"}})", "t.json", &s);
  ASSERT_TRUE(st) << st.message();
  EXPECT_EQ(s.name, "set-before");
  EXPECT_EQ(s.port, 80);
  EXPECT_EQ(s.grace_s, 2.0);
  EXPECT_FALSE(s.on);
  EXPECT_EQ(s.tls, std::optional<bool>(true));
  EXPECT_EQ(s.labels.at("rack"), "r1");
  ASSERT_TRUE(parseJsonConfig(R"({"tls": null})", "t.json", &s));
  EXPECT_FALSE(s.tls.has_value());
  ASSERT_TRUE(parseJsonConfig("{}", "t.json", &s));
  EXPECT_EQ(s.port, 80);
}

TEST(JsonConfig, UnknownKeysAreRefusedNamingKeyFileAndTheKnownKeys) {
  Sample s;
  Status st = parseJsonConfig(R"({"port": 1, "prot": 2})", "/etc/x.json", &s);
  ASSERT_FALSE(st);
  EXPECT_EQ(st.message(), "/etc/x.json: unknown key 'prot' (known: name, port, grace_s, on, tls, labels)");
  EXPECT_EQ(s.port, 7070) << "nothing is applied from a bad file";
  EXPECT_FALSE(parseJsonConfig(R"({"nam": "x"})", "t.json", &s));  // a prefix of a key is not the key
  EXPECT_FALSE(parseJsonConfig(R"({"": 1})", "t.json", &s));
}

TEST(JsonConfig, WrongTypesNameTheKeyAndWhatItMustBe) {
  struct Case {
    const char* text;
    const char* message;
  };
  for (Case c : {Case{R"({"port": "80"})", "t.json: key 'port' must be an integer, not \"80\""},
                 Case{R"({"port": 1.5})", "key 'port' must be an integer, not 1.5"},
                 Case{R"({"port": 99999999999})", "key 'port' must be an integer"},
                 Case{R"({"port": true})", "key 'port' must be an integer"},
                 Case{R"({"name": 3})", "key 'name' must be a string, not 3"},
                 Case{R"({"grace_s": "soon"})", "key 'grace_s' must be a number"},
                 Case{R"({"on": 1})", "key 'on' must be true or false, not 1"},
                 Case{R"({"tls": "yes"})", "key 'tls' must be"},
                 Case{R"({"labels": {"rack": 1}})", "key 'labels' must be an object"},
                 Case{R"({"labels": ["a"]})", "key 'labels' must be an object"}}) {
    Sample s;
    Status st = parseJsonConfig(c.text, "t.json", &s);
    ASSERT_FALSE(st) << c.text;
    EXPECT_NE(st.message().find(c.message), std::string::npos) << c.text << " -> " << st.message();
  }
  Sample s;
  Status st = parseJsonConfig(R"({"grace_s": "soon"})", "t.json", &s, {{"grace_s", "a number of seconds"}});
  EXPECT_EQ(st.message(), "t.json: key 'grace_s' must be a number of seconds, not \"soon\"");
  EXPECT_EQ(parseJsonConfig(R"({"port": 7070.0})", "t.json", &s).message(), "")
      << "an integral number is an integer";
}

TEST(JsonConfig, NotJsonNotAnObjectTooLargeUnreadable) {
  Sample s;
  EXPECT_NE(parseJsonConfig("{", "t.json", &s).message().find("t.json: not valid JSON"), std::string::npos);
  EXPECT_NE(parseJsonConfig("", "t.json", &s).message().find("not valid JSON"), std::string::npos);
  EXPECT_EQ(parseJsonConfig("[1]", "t.json", &s).message(), "t.json: must hold a JSON object");
  EXPECT_EQ(parseJsonConfig("7", "t.json", &s).message(), "t.json: must hold a JSON object");

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ddl_base_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string good = (dir / "good.json").string(), big = (dir / "big.json").string();
  std::ofstream(good) << R"({"port": 81})";
  ASSERT_TRUE(loadJsonConfig(good, &s));
  EXPECT_EQ(s.port, 81);
  std::ofstream(big) << R"({"name": ")" << std::string(2000, 'x') << R"("})";
  Status st = loadJsonConfig(big, &s, {}, 1000);
  EXPECT_NE(st.message().find("config file " + big + " is larger than 1000 bytes"), std::string::npos)
      << st.message();
  EXPECT_TRUE(loadJsonConfig(big, &s, {}, 4000));
  st = loadJsonConfig((dir / "missing.json").string(), &s);
  EXPECT_NE(st.message().find("cannot read config file "), std::string::npos) << st.message();
  st = loadJsonConfig(dir.string(), &s);  // a directory
  EXPECT_FALSE(st);
  std::filesystem::remove_all(dir);
}

// --- status

TEST(Status, CodesMessagesAndTheCoordinatorsOldSpelling) {
  Status st = Status::notFound("job j-1 not found");
  EXPECT_EQ(st.toString(), "NOT_FOUND: job j-1 not found");
  StatusOr<int> v = 3;
  EXPECT_EQ(*v, 3);
  StatusOr<int> e = Status::internal("disk");
  EXPECT_FALSE(e);
  state::Status same = st;  // coordinator code says state::Status
  EXPECT_EQ(same.code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace ddl

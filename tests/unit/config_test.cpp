// The daemons' settings files: ddl-coordinator's (coordinator/daemon/config) and ddl-agent's
// (worker/agent_config), both loaded by common/json_config. Every key keeps its default and type; unknown
// keys, wrong types and bad addresses are refused with the key named.
#include "daemon/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "worker/agent_config.h"

namespace ddl {
namespace {

using coordinator::DaemonConfig;
using worker::AgentConfig;

std::string messageOf(const Status& st) { return st ? "" : st.message(); }

TEST(CoordinatorConfig, DefaultsAreValidAndEveryKeyIsRead) {
  DaemonConfig c;
  EXPECT_TRUE(coordinator::validateConfig(c));
  Status st = coordinator::parseConfig(R"({"listen": "0.0.0.0:7071", "http": "127.0.0.1:0", "data_dir": "/d",
      "heartbeat_grace_s": 20, "heartbeat_interval_s": 2.5, "stop_grace_s": 3, "port_first": 30000,
      "port_last": 30100, "log_level": "debug", "pki_dir": "/p", "insecure": true, "allow_root_jobs": true,
      "node_cert_days": 30, "tls_refresh_s": 5, "http_tls": true, "http_auth": true})",
                                       "c.json", &c);
  ASSERT_TRUE(st) << st.message();
  EXPECT_EQ(c.listen, "0.0.0.0:7071");
  EXPECT_EQ(c.http, "127.0.0.1:0");
  EXPECT_EQ(c.data_dir, "/d");
  EXPECT_EQ(c.heartbeat_grace_s, 20);
  EXPECT_EQ(c.heartbeat_interval_s, 2.5);
  EXPECT_EQ(c.stop_grace_s, 3);
  EXPECT_EQ(c.port_first, 30000);
  EXPECT_EQ(c.port_last, 30100);
  EXPECT_EQ(c.log_level, "debug");
  EXPECT_EQ(c.pki_dir, "/p");
  EXPECT_TRUE(c.insecure);
  EXPECT_TRUE(c.allow_root_jobs);
  EXPECT_EQ(c.node_cert_days, 30);
  EXPECT_EQ(c.tls_refresh_s, 5);
  EXPECT_EQ(c.http_tls, std::optional<bool>(true));
  EXPECT_EQ(c.http_auth, std::optional<bool>(true));
  EXPECT_TRUE(coordinator::validateConfig(c)) << messageOf(coordinator::validateConfig(c));
}

// Issue 30: the store setting and etcd's. Plaintext to etcd only when asked and only toward loopback.
TEST(CoordinatorConfig, StoreUrlsAndEtcdSettings) {
  auto url = coordinator::parseStoreUrl("etcd://127.0.0.1:2379,[::1]:2380,etcd-3:2379/team-a");
  ASSERT_TRUE(url) << url.status().message();
  EXPECT_TRUE(url->etcd);
  EXPECT_EQ(url->endpoints, (std::vector<std::string>{"127.0.0.1:2379", "[::1]:2380", "etcd-3:2379"}));
  EXPECT_EQ(url->prefix, "/team-a/");
  EXPECT_EQ(coordinator::parseStoreUrl("etcd://h:1")->prefix, "/ddl/");
  EXPECT_EQ(coordinator::parseStoreUrl("etcd://h:1/")->prefix, "/ddl/");
  EXPECT_FALSE(coordinator::parseStoreUrl("sqlite")->etcd);
  for (const char* bad :
       {"", "etcd://", "etcd://h", "etcd://h:1,,h:2", "etcd://h:0", "postgres://h:1", "SQLITE"}) {
    auto parsed = coordinator::parseStoreUrl(bad);
    EXPECT_FALSE(parsed) << bad;
    if (!parsed)
      EXPECT_NE(parsed.status().message().find("store '"), std::string::npos) << parsed.status().message();
  }

  DaemonConfig c;
  Status st = coordinator::parseConfig(R"({"store": "etcd://10.0.0.5:2379", "etcd_ca": "/e/ca.crt",
      "etcd_cert": "/e/c.crt", "etcd_key": "/e/c.key", "leader_lease_s": 5, "advertise": "10.0.0.9:7070"})",
                                       "c.json", &c);
  ASSERT_TRUE(st) << st.message();
  EXPECT_EQ(c.store, "etcd://10.0.0.5:2379");
  EXPECT_EQ(c.etcd_ca, "/e/ca.crt");
  EXPECT_EQ(c.etcd_cert, "/e/c.crt");
  EXPECT_EQ(c.etcd_key, "/e/c.key");
  EXPECT_EQ(c.leader_lease_s, 5);
  EXPECT_EQ(c.advertise, "10.0.0.9:7070");
  EXPECT_TRUE(coordinator::validateConfig(c)) << messageOf(coordinator::validateConfig(c));

  auto refusal = [](void (*change)(DaemonConfig&)) {
    DaemonConfig d;
    d.store = "etcd://127.0.0.1:2379";
    d.etcd_ca = "/ca";
    change(d);
    return messageOf(coordinator::validateConfig(d));
  };
  EXPECT_EQ(refusal([](DaemonConfig&) {}), "");
  EXPECT_NE(refusal([](DaemonConfig& d) { d.etcd_ca.clear(); }).find("needs etcd_ca"), std::string::npos);
  EXPECT_EQ(refusal([](DaemonConfig& d) { d.etcd_ca.clear(), d.etcd_insecure = true; }), "");
  EXPECT_NE(refusal([](DaemonConfig& d) {
              d.etcd_ca.clear(), d.etcd_insecure = true, d.store = "etcd://127.0.0.1:1,10.1.1.1:2";
            }).find("'10.1.1.1:2', which is not a loopback"),
            std::string::npos);
  EXPECT_NE(refusal([](DaemonConfig& d) { d.etcd_insecure = true; }).find("choose one"), std::string::npos);
  EXPECT_NE(refusal([](DaemonConfig& d) { d.etcd_cert = "/c"; }).find("go together"), std::string::npos);
  EXPECT_NE(refusal([](DaemonConfig& d) { d.leader_lease_s = 1; }).find("leader_lease_s"), std::string::npos);
  EXPECT_NE(refusal([](DaemonConfig& d) { d.advertise = "nohost"; }).find("advertise"), std::string::npos);
  EXPECT_NE(refusal([](DaemonConfig& d) { d.usage_retention_days = 0; }).find("usage_retention_days"),
            std::string::npos);
  EXPECT_NE(refusal([](DaemonConfig& d) { d.fairshare_half_life_days = 0; }).find("fairshare_half_life_days"),
            std::string::npos);
  EXPECT_NE(refusal([](DaemonConfig& d) { d.fairshare_cpu_weight = -1; }).find("fairshare_cpu_weight"),
            std::string::npos);
  EXPECT_EQ(refusal([](DaemonConfig& d) { d.fairshare_mem_weight = 0.25, d.fairshare_half_life_days = 0.5; }),
            "");
  DaemonConfig share;
  ASSERT_TRUE(coordinator::parseConfig(R"({"fairshare_preemption": true, "fairshare_cpu_weight": 0.05})",
                                       "c.json", &share));
  EXPECT_TRUE(share.fairshare_preemption);
  EXPECT_EQ(share.fairshare_cpu_weight, 0.05);
  EXPECT_NE(refusal([](DaemonConfig& d) { d.store = "sqlite"; }).find("store is \"sqlite\""),
            std::string::npos);
}

TEST(CoordinatorConfig, AnOutOfRangeNumberIsAnErrorNotACrash) {
  // Found by fuzzing (tests/fuzz/corpus/config/number_overflow): nlohmann/json throws out_of_range, not
  // parse_error, for a number too large for a double.
  DaemonConfig c;
  Status st = coordinator::parseConfig(R"({"heartbeat_grace_s": 2e9500})", "c.json", &c);
  EXPECT_NE(messageOf(st).find("c.json: not valid JSON"), std::string::npos) << messageOf(st);
  EXPECT_EQ(c.heartbeat_grace_s, DaemonConfig().heartbeat_grace_s);
}

TEST(CoordinatorConfig, UnknownKeysAndWrongTypesNameTheKey) {
  DaemonConfig c;
  Status st = coordinator::parseConfig(R"({"heartbeat_grace": 5})", "/etc/ddl/coordinator.json", &c);
  EXPECT_NE(
      messageOf(st).find("/etc/ddl/coordinator.json: unknown key 'heartbeat_grace' (known: listen, http, "),
      std::string::npos)
      << messageOf(st);
  struct Case {
    const char* text;
    const char* message;
  };
  for (Case k :
       {Case{R"({"listen": 7070})", "key 'listen' must be a string \"HOST:PORT\", not 7070"},
        Case{R"({"heartbeat_grace_s": "10s"})", "key 'heartbeat_grace_s' must be a number of seconds"},
        Case{R"({"port_first": 29500.5})", "key 'port_first' must be an integer port, not 29500.5"},
        // Found by fuzzing: a double far out of an int's range was converted (undefined behaviour).
        Case{R"({"port_last": 244444444444444444444444444444449999})", "key 'port_last' must be an integer port"},
        Case{R"({"node_cert_days": "365"})", "key 'node_cert_days' must be an integer number of days"},
        Case{R"({"insecure": "false"})", "key 'insecure' must be true or false"},
        Case{R"({"log_level": ["info"]})", "key 'log_level' must be a string"}}) {
    DaemonConfig d;
    EXPECT_NE(messageOf(coordinator::parseConfig(k.text, "c.json", &d)).find(k.message), std::string::npos)
        << k.text << " -> " << messageOf(coordinator::parseConfig(k.text, "c.json", &d));
    EXPECT_EQ(d.listen, DaemonConfig().listen) << "a bad file changes nothing";
  }
}

TEST(CoordinatorConfig, AddressesAreCheckedWithTheReason) {
  struct Case {
    const char* listen;
    const char* http;
    const char* message;
  };
  for (Case k :
       {Case{"7070", "127.0.0.1:7080", "listen '7070' is not HOST:PORT with PORT 0..65535: no port"},
        Case{"::1:7070", "127.0.0.1:7080", "in brackets"},
        Case{"127.0.0.1:70000", "127.0.0.1:7080", "port 70000 is out of range"},
        Case{"127.0.0.1:7070", "127.0.0.1", "http '127.0.0.1' is not HOST:PORT with PORT 0..65535: no port"},
        Case{"127.0.0.1:7070", "127.0.0.1:x", "port 'x' is not a number"}}) {
    DaemonConfig c;
    c.listen = k.listen;
    c.http = k.http;
    EXPECT_NE(messageOf(coordinator::validateConfig(c)).find(k.message), std::string::npos)
        << k.listen << " " << k.http << " -> " << messageOf(coordinator::validateConfig(c));
  }
  DaemonConfig ok;
  ok.listen = "[::1]:0";
  ok.http = "[::1]:0";
  EXPECT_TRUE(coordinator::validateConfig(ok)) << messageOf(coordinator::validateConfig(ok));
}

TEST(CoordinatorConfig, FilesAreReadWithABound) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ddl_config_test_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "coordinator.json").string();
  std::ofstream(path) << R"({"listen": "127.0.0.1:7171"})";
  DaemonConfig c;
  ASSERT_TRUE(coordinator::loadConfigFile(path, &c));
  EXPECT_EQ(c.listen, "127.0.0.1:7171");
  std::ofstream(path) << R"({"log_level": ")" << std::string(2 << 20, 'x') << R"("})";
  EXPECT_NE(messageOf(coordinator::loadConfigFile(path, &c)).find("is larger than"), std::string::npos);
  EXPECT_NE(messageOf(coordinator::loadConfigFile((dir / "none.json").string(), &c))
                .find("cannot read config file"),
            std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(AgentConfig, DefaultsAreValidAndEveryKeyIsRead) {
  AgentConfig c;
  EXPECT_TRUE(worker::validateAgentConfig(c));
  Status st =
      worker::parseAgentConfig(R"({"coordinator": "[fd00::1]:7070", "node": "n1", "address": "10.0.0.2",
      "labels": {"rack": "r1"}, "virtual_gpus": 4, "force_virtual": true, "data_dir": "/d", "log_retention_hours": 24, "log_max_mb": 500, "port_first": 30000,
      "port_last": 30010, "stop_grace_s": 2.5, "stop_ranks_on_exit": true, "log_level": "warn", "pki_dir": "/p",
      "insecure": false, "tls_refresh_s": 30, "rank_env": ["HTTPS_PROXY", "SLURM_*"]})",
                               "a.json", &c);
  ASSERT_TRUE(st) << st.message();
  EXPECT_EQ(c.rank_env, (std::vector<std::string>{"HTTPS_PROXY", "SLURM_*"}));
  EXPECT_EQ(c.coordinator, "[fd00::1]:7070");
  EXPECT_EQ(c.node, "n1");
  EXPECT_EQ(c.address, "10.0.0.2");
  EXPECT_EQ(c.labels.at("rack"), "r1");
  EXPECT_EQ(c.virtual_gpus, 4);
  EXPECT_TRUE(c.force_virtual);
  EXPECT_EQ(c.data_dir, "/d");
  EXPECT_EQ(c.log_retention_hours, 24);
  EXPECT_EQ(c.log_max_mb, 500);
  EXPECT_EQ(c.port_first, 30000);
  EXPECT_EQ(c.port_last, 30010);
  EXPECT_EQ(c.stop_grace_s, 2.5);
  EXPECT_TRUE(c.stop_ranks_on_exit);
  EXPECT_EQ(c.log_level, "warn");
  EXPECT_EQ(c.pki_dir, "/p");
  EXPECT_EQ(c.tls_refresh_s, 30);
  EXPECT_TRUE(worker::validateAgentConfig(c)) << messageOf(worker::validateAgentConfig(c));
}

TEST(AgentConfig, UnknownKeysWrongTypesAndBadCoordinatorAddresses) {
  AgentConfig c;
  Status st = worker::parseAgentConfig(R"({"stop_grace": 5})", "/etc/ddl/agent.json", &c);
  EXPECT_NE(messageOf(st).find(
                "/etc/ddl/agent.json: unknown key 'stop_grace' (known: coordinator, node, address, "),
            std::string::npos)
      << messageOf(st);
  st = worker::parseAgentConfig(R"({"labels": {"rack": 1}})", "a.json", &c);
  EXPECT_NE(messageOf(st).find("key 'labels' must be an object of strings"), std::string::npos)
      << messageOf(st);
  st = worker::parseAgentConfig(R"({"log_max_mb": 1.5})", "a.json", &c);
  EXPECT_NE(messageOf(st).find("key 'log_max_mb' must be an integer number of MiB, not 1.5"),
            std::string::npos)
      << messageOf(st);
  st = worker::parseAgentConfig(R"({"virtual_gpus": "4"})", "a.json", &c);
  EXPECT_NE(messageOf(st).find("key 'virtual_gpus' must be an integer, not \"4\""), std::string::npos)
      << messageOf(st);
  for (const char* bad : {"head", "head:0", "::1:7070", "http://head:7070"}) {
    AgentConfig a;
    a.coordinator = bad;
    EXPECT_NE(messageOf(worker::validateAgentConfig(a))
                  .find("coordinator '" + std::string(bad) + "' is not HOST:PORT: "),
              std::string::npos)
        << bad << " -> " << messageOf(worker::validateAgentConfig(a));
  }
  AgentConfig env;
  env.rank_env = {"GOOD", "BAD-NAME"};
  EXPECT_NE(messageOf(worker::validateAgentConfig(env)).find("rank_env: 'BAD-NAME' is not a variable name"),
            std::string::npos)
      << messageOf(worker::validateAgentConfig(env));
  AgentConfig several;
  several.coordinator = "ctl-1:7070,ctl-2:7070";
  EXPECT_TRUE(worker::validateAgentConfig(several)) << messageOf(worker::validateAgentConfig(several));
  several.coordinator = "ctl-1:7070,ctl-2";
  EXPECT_NE(messageOf(worker::validateAgentConfig(several)).find("coordinator 'ctl-2' is not HOST:PORT"),
            std::string::npos)
      << messageOf(worker::validateAgentConfig(several));
}

}  // namespace
}  // namespace ddl

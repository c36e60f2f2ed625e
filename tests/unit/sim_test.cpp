// ddl-sim's model (tools/ddl-sim/model.h) and calibration file, against hand calculation. No timing: every
// figure here follows from the formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "tools/ddl-sim/calibration.h"
#include "tools/ddl-sim/configs.h"
#include "tools/ddl-sim/hierarchy.h"
#include "tools/ddl-sim/model.h"

namespace ddl::sim {
namespace {

// Every link 1 us and 1 GB/s, free reduction, one rank per node unless said.
Machine uniform(int ranks_per_node = 1, int nodes_per_switch = 1 << 30, int nics = 0) {
  Machine m;
  m.name = "uniform";
  m.ranks_per_node = ranks_per_node;
  m.nodes_per_switch = nodes_per_switch;
  m.nics_per_node = nics;
  for (Link& l : m.links) l = {1e-6, 1e9};
  return m;
}

RingParams unsegmented() { return RingParams{1e18, 4}; }

Prediction mustPredict(const Machine& m, Algo a, int p, double n, RingParams r = unsegmented(),
                       std::vector<int> dims = {}) {
  StatusOr<Prediction> pr = predict(m, a, p, n, r, dims);
  EXPECT_TRUE(pr.isOk()) << pr.status().message();
  return pr.isOk() ? *pr : Prediction{};
}

TEST(SimModel, LinkClasses) {
  const Machine m = uniform(4, 2);
  EXPECT_EQ(linkBetween(m, 0, 3), LinkClass::kIntra);
  EXPECT_EQ(linkBetween(m, 3, 4), LinkClass::kNode);
  EXPECT_EQ(linkBetween(m, 0, 7), LinkClass::kNode);
  EXPECT_EQ(linkBetween(m, 7, 8), LinkClass::kSwitch);
}

TEST(SimModel, RingStepsAndBytes) {
  // p = 4, n = 4096: 2(p-1) = 6 steps of n/p = 1024 B, each 1 us + 1024 ns.
  const Prediction pr = mustPredict(uniform(), Algo::kRing, 4, 4096);
  EXPECT_EQ(pr.steps, 6);
  EXPECT_DOUBLE_EQ(pr.bytes_sent_max, 6 * 1024.0);
  ASSERT_EQ(pr.phases.size(), 2u);
  EXPECT_EQ(pr.phases[0].steps, 3);
  EXPECT_TRUE(pr.phases[0].reduce);
  EXPECT_FALSE(pr.phases[1].reduce);
  EXPECT_NEAR(pr.seconds, 6 * (1e-6 + 1024e-9), 1e-15);
}

TEST(SimModel, RingReductionAddsToEachReducingStep) {
  Machine m = uniform();
  m.reduce_Bps = 2e9;  // 1024 B: 512 ns per reduce-scatter step
  const Prediction pr = mustPredict(m, Algo::kRing, 4, 4096);
  EXPECT_NEAR(pr.seconds, 6 * (1e-6 + 1024e-9) + 3 * 512e-9, 1e-15);
}

TEST(SimModel, RingPipelineBySegments) {
  // 2 steps of 4 segments of 1000 B: wire 1 us, hop 2 us, unit max(1, (1+1)/4) = 1 us. A step keeps the link
  // busy 4 us (> hop); the last one 3 us of units then one hop: 4 + 5 = 9 us.
  const Link l{1e-6, 1e9};
  EXPECT_NEAR(ringStepsSeconds(2, false, 4000, l, 0, RingParams{1000, 4}), 9e-6, 1e-15);
  // One segment per step: every step is one hop.
  EXPECT_NEAR(ringStepsSeconds(3, false, 1000, l, 0, RingParams{4096, 4}), 3 * 2e-6, 1e-15);
  // Window 1: a unit is a whole hop (alpha not hidden).
  EXPECT_NEAR(ringStepsSeconds(1, false, 4000, l, 0, RingParams{1000, 1}), 4 * 2e-6, 1e-15);
  // Large messages tend to steps x block / beta.
  const double t = ringStepsSeconds(6, false, 64e6, l, 0, RingParams{256 * 1024, 4});
  EXPECT_NEAR(t / (6 * 64e6 / 1e9), 1.0, 1e-3);
}

TEST(SimModel, RingSlowestHopBoundsEveryStep) {
  // 2 ranks per node, fast inside (1 us, 10 GB/s), slow between (10 us, 1 GB/s): each of the 6 steps costs
  // the slow hop.
  Machine m = uniform(2, 1 << 30, 1);
  m.links[0] = {1e-6, 10e9};
  m.links[1] = m.links[2] = {10e-6, 1e9};
  const Prediction pr = mustPredict(m, Algo::kRing, 4, 4096);
  EXPECT_NEAR(pr.seconds, 6 * (10e-6 + 1024e-9), 1e-15);
  EXPECT_EQ(pr.phases[0].link, LinkClass::kNode);
  EXPECT_EQ(pr.phases[0].flows, 1);  // one rank per node sends off the node
}

TEST(SimModel, MdRing2x2) {
  // Same machine: dim 0 (in a node) on the whole message, 1 step of n/2 each way; dim 1 on the shard n/2,
  // 1 step of n/4, with both ranks of a node sending through its one port: 0.5 GB/s each.
  Machine m = uniform(2, 1 << 30, 1);
  m.links[0] = {1e-6, 10e9};
  m.links[1] = m.links[2] = {10e-6, 1e9};
  const Prediction pr = mustPredict(m, Algo::kMdRing, 4, 4096);
  ASSERT_EQ(pr.dims, (std::vector<int>{2, 2}));
  EXPECT_EQ(pr.steps, 4);
  EXPECT_DOUBLE_EQ(pr.bytes_sent_max, 2 * 2048.0 + 2 * 1024.0);  // 2(p-1)/p n, as the ring
  ASSERT_EQ(pr.phases.size(), 4u);
  EXPECT_EQ(pr.phases[0].link, LinkClass::kIntra);
  EXPECT_DOUBLE_EQ(pr.phases[0].bytes_per_step, 2048);
  EXPECT_EQ(pr.phases[1].link, LinkClass::kNode);
  EXPECT_DOUBLE_EQ(pr.phases[1].bytes_per_step, 1024);
  EXPECT_EQ(pr.phases[1].flows, 2);
  EXPECT_EQ(pr.phases[3].link, LinkClass::kIntra);  // allgathers in reverse order
  const double intra = 1e-6 + 2048 / 10e9, net = 10e-6 + 1024 / 0.5e9;
  EXPECT_NEAR(pr.seconds, 2 * intra + 2 * net, 1e-15);
}

TEST(SimModel, MdRingBytesEqualRingsAndStepsDrop) {
  // 4x8x2 = 64 ranks: 2·(3 + 7 + 1) = 22 steps against the ring's 126 (mdring.cpp's header), the same
  // 2(p-1)/p of the message sent per rank.
  const Machine m = uniform(4, 8, 1);
  const double n = 64.0 * 1024 * 1024;
  const Prediction md = mustPredict(m, Algo::kMdRing, 64, n);
  const Prediction ring = mustPredict(m, Algo::kRing, 64, n);
  EXPECT_EQ(md.dims, (std::vector<int>{4, 8, 2}));
  EXPECT_EQ(md.steps, 22);
  EXPECT_EQ(ring.steps, 126);
  EXPECT_NEAR(md.bytes_sent_max, 2.0 * 63 / 64 * n, 1e-6);
  EXPECT_NEAR(ring.bytes_sent_max, 2.0 * 63 / 64 * n, 1e-6);
  // The dims given explicitly win over the machine's layout.
  const Prediction flat2 = mustPredict(m, Algo::kMdRing, 64, n, unsegmented(), {8, 8});
  EXPECT_EQ(flat2.steps, 28);
}

TEST(SimModel, RhdPowerOfTwo) {
  // p = 8, 1 MiB: halving n/2, n/4, n/8 (with reduction) then doubling n/8, n/4, n/2: 6 rounds, 2(p-1)/p n.
  const double n = 1 << 20;
  const Prediction pr = mustPredict(uniform(), Algo::kRhd, 8, n);
  EXPECT_EQ(pr.steps, 6);
  EXPECT_DOUBLE_EQ(pr.bytes_sent_max, 2.0 * 7 / 8 * n);
  ASSERT_EQ(pr.phases.size(), 6u);
  EXPECT_DOUBLE_EQ(pr.phases[0].bytes_per_step, n / 2);
  EXPECT_DOUBLE_EQ(pr.phases[2].bytes_per_step, n / 8);
  EXPECT_DOUBLE_EQ(pr.phases[3].bytes_per_step, n / 8);
  EXPECT_DOUBLE_EQ(pr.phases[5].bytes_per_step, n / 2);
  EXPECT_TRUE(pr.phases[0].reduce);
  EXPECT_FALSE(pr.phases[5].reduce);
  EXPECT_NEAR(pr.seconds, 6 * 1e-6 + 2 * (n / 2 + n / 4 + n / 8) / 1e9, 1e-12);
}

TEST(SimModel, RhdSmallIsRecursiveDoubling) {
  // <= 4 KiB: log2 p rounds of the whole vector.
  const Prediction pr = mustPredict(uniform(), Algo::kRhd, 4, 4096);
  EXPECT_EQ(pr.steps, 2);
  EXPECT_DOUBLE_EQ(pr.bytes_sent_max, 2 * 4096.0);
}

TEST(SimModel, RhdNonPowerOfTwoFolds) {
  // p = 3: q = 2, one extra. Fold (rank 0 -> 1, n), one halving and one doubling exchange of n/2 between
  // ranks 1 and 2, unfold (1 -> 0, n): 4 rounds; rank 1 sends n/2 + n/2 + n.
  const double n = 8192;
  const Prediction pr = mustPredict(uniform(), Algo::kRhd, 3, n);
  EXPECT_EQ(pr.steps, 4);
  EXPECT_DOUBLE_EQ(pr.bytes_sent_max, 2 * n);
  EXPECT_EQ(pr.phases.front().what, "rhd fold");
  EXPECT_EQ(pr.phases.back().what, "rhd unfold");
  // p = 6: q = 4, 2 extra: 2 + 2·2 rounds.
  EXPECT_EQ(mustPredict(uniform(), Algo::kRhd, 6, n).steps, 6);
}

TEST(SimModel, RhdSharesTheNodePort) {
  // 2x2 with one port per node: the first halving round sends n/2 from both ranks of a node at once.
  Machine m = uniform(2, 1 << 30, 1);
  const Prediction pr = mustPredict(m, Algo::kRhd, 4, 1 << 20);
  EXPECT_EQ(pr.phases[0].link, LinkClass::kNode);
  EXPECT_EQ(pr.phases[0].flows, 2);
  EXPECT_NEAR(pr.phases[0].seconds, 1e-6 + (1 << 19) / 0.5e9, 1e-12);
  EXPECT_EQ(pr.phases[1].link, LinkClass::kIntra);
}

TEST(SimModel, DefaultGrid) {
  StatusOr<Config> c2017 = builtinConfig("2017");
  ASSERT_TRUE(c2017.isOk());
  EXPECT_EQ(*defaultGrid(c2017->machine, 256), (std::vector<int>{4, 8, 8}));
  EXPECT_EQ(*defaultGrid(c2017->machine, 64), (std::vector<int>{4, 8, 2}));
  EXPECT_EQ(*defaultGrid(c2017->machine, 16), (std::vector<int>{4, 4}));
  EXPECT_EQ(*defaultGrid(c2017->machine, 2), (std::vector<int>{2}));
  EXPECT_FALSE(defaultGrid(c2017->machine, 6).isOk());   // not whole nodes
  EXPECT_FALSE(defaultGrid(c2017->machine, 40).isOk());  // 10 nodes: not whole switches
}

TEST(SimModel, BadInputIsAnError) {
  EXPECT_FALSE(predict(uniform(), Algo::kRing, 0, 1024).isOk());
  EXPECT_FALSE(predict(uniform(), Algo::kRing, 4, -1).isOk());
  EXPECT_FALSE(predict(uniform(), Algo::kMdRing, 8, 1024, {}, {2, 2}).isOk());
  Machine m = uniform();
  m.links[1].beta_Bps = 0;
  StatusOr<Prediction> pr = predict(m, Algo::kRing, 4, 1024);
  ASSERT_FALSE(pr.isOk());
  EXPECT_NE(pr.status().message().find("node"), std::string::npos) << pr.status().message();
  EXPECT_FALSE(parseAlgo("tree").isOk());
  EXPECT_FALSE(builtinConfig("dgx-z").isOk());
  EXPECT_FALSE(builtinNetwork("vgg").isOk());
}

TEST(SimModel, ScalingEfficiency) {
  EXPECT_DOUBLE_EQ(scalingEfficiency(1.0, 1.0, 0), 0.5);
  // Overlap hides at most the backward pass (2/3 of compute).
  EXPECT_DOUBLE_EQ(scalingEfficiency(1.0, 1.0, 1), 1.0 / (1.0 + 1.0 / 3));
  EXPECT_DOUBLE_EQ(scalingEfficiency(1.0, 0.5, 1), 1.0);
  EXPECT_DOUBLE_EQ(scalingEfficiency(1.0, 0.5, 0.5), 1.0 / 1.25);
}

// ---- calibration
// ---------------------------------------------------------------------------------------------

TEST(SimCalibration, RoundTrip) {
  Calibration c;
  c.machine = uniform(2, 3, 1);
  c.machine.name = "test";
  c.machine.links[0] = {7.1e-6, 1.0861e10};
  c.machine.links[1] = {1.138e-5, 1.2073e8};
  c.machine.links[2] = {2e-5, 1e8};
  c.machine.reduce_Bps = 2.9e10;
  c.source = "hand";
  c.from[1] = "ucx_perftest";
  StatusOr<Calibration> back = calibrationFromJson(calibrationToJson(c), "mem");
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_EQ(back->machine.name, "test");
  EXPECT_EQ(back->machine.ranks_per_node, 2);
  EXPECT_EQ(back->machine.nodes_per_switch, 3);
  EXPECT_EQ(back->machine.nics_per_node, 1);
  for (int k = 0; k < kLinkClasses; ++k) {
    EXPECT_DOUBLE_EQ(back->machine.links[k].alpha_s, c.machine.links[k].alpha_s);
    EXPECT_DOUBLE_EQ(back->machine.links[k].beta_Bps, c.machine.links[k].beta_Bps);
  }
  EXPECT_NEAR(back->machine.reduce_Bps, 2.9e10, 1e-3);
  EXPECT_EQ(back->source, "hand");
  EXPECT_EQ(back->from[1], "ucx_perftest");
}

TEST(SimCalibration, SwitchDefaultsToNode) {
  const char* text = R"({"format": "ddl-sim-calibration", "version": 1, "ranks_per_node": 2, "reduce_GBps": 3,
    "links": {"intra": {"alpha_s": 1e-6, "beta_Bps": 1e10}, "node": {"alpha_s": 1e-5, "beta_Bps": 1e8}}})";
  StatusOr<Calibration> c = calibrationFromJson(text, "mem");
  ASSERT_TRUE(c.isOk()) << c.status().message();
  EXPECT_DOUBLE_EQ(c->machine.links[2].beta_Bps, 1e8);
  EXPECT_DOUBLE_EQ(c->machine.reduce_Bps, 3e9);
}

TEST(SimCalibration, RejectsBadFiles) {
  auto error = [](const std::string& text) {
    StatusOr<Calibration> c = calibrationFromJson(text, "cal.json");
    EXPECT_FALSE(c.isOk()) << text;
    return c.isOk() ? std::string() : c.status().message();
  };
  const std::string good_links =
      R"("links": {"intra": {"alpha_s": 1e-6, "beta_Bps": 1e10}, "node": {"alpha_s": 1e-5, "beta_Bps": 1e8}})";
  const std::string head = R"({"format": "ddl-sim-calibration", "version": 1, "ranks_per_node": 2, )";
  EXPECT_NE(error("{not json").find("cal.json: not valid JSON"), std::string::npos);
  EXPECT_NE(error("[1, 2]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error(R"({"version": 1})").find("not a ddl-sim calibration"), std::string::npos);
  EXPECT_NE(error(R"({"format": "ddl-sim-calibration", "version": 7})").find("version"), std::string::npos);
  EXPECT_NE(error(head + good_links + "}").find("reduce_GBps"), std::string::npos);
  EXPECT_NE(error(head + R"("reduce_GBps": "fast", )" + good_links + "}").find("finite number"),
            std::string::npos);
  EXPECT_NE(error(head + R"("reduce_GBps": 1})").find("links"), std::string::npos);
  EXPECT_NE(
      error(head + R"("reduce_GBps": 1, "links": {"node": {"alpha_s": 0, "beta_Bps": 1}}})").find("intra"),
      std::string::npos);
  EXPECT_NE(error(head + R"("reduce_GBps": 1, "links": {"intra": {"alpha_s": 0, "beta_Bps": -5},
                          "node": {"alpha_s": 0, "beta_Bps": 1}}})")
                .find("links.intra: beta_Bps must be > 0"),
            std::string::npos);
  EXPECT_NE(error(head + R"("reduce_GBps": 1, "links": {"intra": {"alpha_s": 0},
                          "node": {"alpha_s": 0, "beta_Bps": 1}}})")
                .find("missing \"beta_Bps\""),
            std::string::npos);
  // A misspelt class is an error, not a silent fall-back to "node" for the switch links.
  EXPECT_NE(error(head + R"("reduce_GBps": 1, "links": {"intra": {"alpha_s": 0, "beta_Bps": 1},
                          "node": {"alpha_s": 0, "beta_Bps": 1}, "swtich": {"alpha_s": 0, "beta_Bps": 1}}})")
                .find("unknown link class \"swtich\""),
            std::string::npos);
  EXPECT_NE(
      error(R"({"format": "ddl-sim-calibration", "version": 1, "ranks_per_node": 0, "reduce_GBps": 1, )" +
            good_links + "}")
          .find("ranks_per_node"),
      std::string::npos);
}

TEST(SimCalibration, Perftest) {
  const std::string out =
      "+----+\n"
      "Final:                  1000     11.363    11.961    11.961        0.64       0.64       83605       "
      "83605\n";
  StatusOr<Perftest> p = parsePerftest(out, "lat.txt");
  ASSERT_TRUE(p.isOk()) << p.status().message();
  EXPECT_DOUBLE_EQ(p->p50_us, 11.363);
  EXPECT_DOUBLE_EQ(p->mean_us, 11.961);
  EXPECT_DOUBLE_EQ(p->bw_Bps, 0.64 * (1 << 20));
  StatusOr<Perftest> none = parsePerftest("[error] connection refused\n", "bw.txt");
  ASSERT_FALSE(none.isOk());
  EXPECT_NE(none.status().message().find("bw.txt: no ucx_perftest \"Final:\" line"), std::string::npos);
  EXPECT_FALSE(parsePerftest("Final: 10 abc 1 1 1 1 1 1\n", "x").isOk());
  EXPECT_FALSE(parsePerftest("Final: 10 1 1\n", "x").isOk());
}

TEST(SimCalibration, BenchJson) {
  const char* text = R"({"ranks": 4, "topology": "2x2", "algo": "ring", "results": [
    {"bytes": 65536, "time_us": 800, "wrong": 0},
    {"bytes": 262144, "time_us": 3300, "wrong": 3},
    {"bytes": 1048576, "time_us": 13000}]})";
  StatusOr<BenchRun> r = parseBenchJson(text, "ring.json");
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r->ranks, 4);
  EXPECT_EQ(r->topology, "2x2");
  ASSERT_EQ(r->points.size(), 2u);  // the wrong one is not a time
  EXPECT_DOUBLE_EQ(r->points[1].seconds, 13000e-6);
  EXPECT_FALSE(parseBenchJson("", "e.json").isOk());
  EXPECT_FALSE(parseBenchJson(R"({"ranks": 4})", "e.json").isOk());
  EXPECT_FALSE(parseBenchJson(R"({"ranks": 4, "results": [{"bytes": 1}]})", "e.json").isOk());
  StatusOr<BenchRun> neg =
      parseBenchJson(R"({"ranks": 4, "results": [{"bytes": 1, "time_us": -2}]})", "n.json");
  ASSERT_FALSE(neg.isOk());
  EXPECT_NE(neg.status().message().find("n.json: results[0]"), std::string::npos);
}

TEST(SimCalibration, FitRecoversAlphaBeta) {
  // Times made by the fit's own model: it must find alpha and beta again.
  const double alpha = 12e-6, beta = 1.2e8;
  BenchRun run;
  run.ranks = 4;
  for (double n = 16384; n <= 64 << 20; n *= 4) run.points.push_back({n, 6 * alpha + 1.5 * n / beta});
  StatusOr<LinkFit> f = fitRing({run}, 0);
  ASSERT_TRUE(f.isOk()) << f.status().message();
  EXPECT_NEAR(f->link.alpha_s / alpha, 1, 1e-9);
  EXPECT_NEAR(f->link.beta_Bps / beta, 1, 1e-9);
  EXPECT_LT(f->rms_rel_error, 1e-9);
  EXPECT_EQ(f->points, static_cast<int>(run.points.size()));
  EXPECT_FALSE(fitRing({run}, 1e12).isOk());  // no points left
  BenchRun one;
  one.ranks = 1;
  one.points = run.points;
  EXPECT_FALSE(fitRing({one}, 0).isOk());
}

TEST(SimCalibration, MdringTelemetry) {
  double bytes = 0;
  std::vector<double> dims;
  ASSERT_TRUE(
      parseMdringTelemetry("ddl1 job=- attempt=0 rank=3 size=4 count=22 bytes=19923104 seconds=0.2 "
                           "last=allreduce last_bytes=1048576 last_us=11786.2 last_algo=mdring "
                           "dims_us=2476.5,9200",
                           &bytes, &dims));
  EXPECT_DOUBLE_EQ(bytes, 1048576);
  EXPECT_EQ(dims, (std::vector<double>{2476.5, 9200}));
  // A rank's first call (it includes connecting), other algorithms, no dims, garbage: not a sample.
  EXPECT_FALSE(
      parseMdringTelemetry("ddl1 count=1 last_bytes=64 last_algo=mdring dims_us=1,2", &bytes, &dims));
  EXPECT_FALSE(parseMdringTelemetry("ddl1 count=5 last_bytes=64 last_algo=ring dims_us=1,2", &bytes, &dims));
  EXPECT_FALSE(parseMdringTelemetry("ddl1 count=5 last_bytes=64 last_algo=mdring dims_us=", &bytes, &dims));
  EXPECT_FALSE(
      parseMdringTelemetry("ddl1 count=5 last_bytes=64 last_algo=mdring dims_us=1,x", &bytes, &dims));
  EXPECT_FALSE(
      parseMdringTelemetry("ddl1 count=5 last_bytes=abc last_algo=mdring dims_us=1,2", &bytes, &dims));
  EXPECT_FALSE(parseMdringTelemetry("", &bytes, &dims));
}

}  // namespace
}  // namespace ddl::sim

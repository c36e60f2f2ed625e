// The alpha-beta model of libddl's allreduce algorithms.
//
// Every algorithm is a sequence of rounds in which ranks send to each other at once. A round is as slow as
// its slowest flow: alpha of the flow's link class plus its bytes over the bandwidth it gets, which is the
// class's beta divided among the flows that leave the same node at once when the node has fewer network
// ports than flows (an EDR port shared by the 4 GPUs of a 2017 node; a host's one shaped veth in
// bench/hierarchy.sh). Rings (the flat one and each dimension of mdring) are costed by ringStepsSeconds, a
// first-order version of ring.cpp's segment pipeline; rhd's rounds are not pipelined (rhd.cpp waits for each
// exchange, then reduces), so each round costs alpha + bytes/beta + bytes/reduce.
//
// The cost of a ring is set by its slowest hop: in a flat ring over nodes the one rank per node whose right
// neighbour is on the next node (one flow per node, the port to itself); in mdring's dim 1 every rank of a
// node at once (d0 flows through the node's ports). Both put 2(p-1)/p of the message through each node's
// ports, so at large sizes they tie on bandwidth; mdring's gain is in steps: 2·Σ(dk-1) against 2(p-1).
#include "tools/ddl-sim/model.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace ddl::sim {

const char* linkClassName(LinkClass c) {
  switch (c) {
    case LinkClass::kIntra:
      return "intra";
    case LinkClass::kNode:
      return "node";
    case LinkClass::kSwitch:
      return "switch";
  }
  return "?";
}

const char* algoName(Algo a) {
  switch (a) {
    case Algo::kRing:
      return "ring";
    case Algo::kMdRing:
      return "mdring";
    case Algo::kRhd:
      return "rhd";
  }
  return "?";
}

StatusOr<Algo> parseAlgo(const std::string& name) {
  if (name == "ring") return Algo::kRing;
  if (name == "mdring") return Algo::kMdRing;
  if (name == "rhd") return Algo::kRhd;
  return Status::invalidArgument("unknown algorithm '" + name + "' (use ring, mdring or rhd)");
}

RingParams libddlRingParams(Algo a) {
  RingParams r;
  if (a == Algo::kMdRing) r.segment_bytes = 64 * 1024;
  return r;
}

LinkClass linkBetween(const Machine& m, int a, int b) {
  const int na = a / m.ranks_per_node, nb = b / m.ranks_per_node;
  if (na == nb) return LinkClass::kIntra;
  if (na / m.nodes_per_switch == nb / m.nodes_per_switch) return LinkClass::kNode;
  return LinkClass::kSwitch;
}

Status validate(const Machine& m) {
  if (m.ranks_per_node < 1 || m.nodes_per_switch < 1 || m.nics_per_node < 0) {
    return Status::invalidArgument("machine '" + m.name +
                                   "': ranks_per_node and nodes_per_switch must be >= 1, " +
                                   "nics_per_node >= 0");
  }
  for (int c = 0; c < kLinkClasses; ++c) {
    const Link& l = m.links[c];
    if (!(l.alpha_s >= 0) || !std::isfinite(l.alpha_s) || !(l.beta_Bps > 0) || !std::isfinite(l.beta_Bps)) {
      return Status::invalidArgument("machine '" + m.name + "': link class " +
                                     linkClassName(static_cast<LinkClass>(c)) +
                                     " needs alpha_s >= 0 and beta_Bps > 0 (finite)");
    }
  }
  if (!(m.reduce_Bps >= 0) || !std::isfinite(m.reduce_Bps)) {
    return Status::invalidArgument("machine '" + m.name + "': reduce_Bps must be >= 0 (0: free)");
  }
  return Status::ok();
}

StatusOr<std::vector<int>> defaultGrid(const Machine& m, int p) {
  if (p < 1) return Status::invalidArgument("rank count must be >= 1");
  std::vector<int> dims;
  if (p <= m.ranks_per_node) {
    dims = {p};
  } else if (p % m.ranks_per_node != 0) {
    return Status::invalidArgument(std::to_string(p) + " ranks do not fill whole nodes of " +
                                   std::to_string(m.ranks_per_node));
  } else {
    const int nodes = p / m.ranks_per_node;
    if (nodes <= m.nodes_per_switch) {
      dims = {m.ranks_per_node, nodes};
    } else if (nodes % m.nodes_per_switch != 0) {
      return Status::invalidArgument(std::to_string(nodes) + " nodes do not fill whole switches of " +
                                     std::to_string(m.nodes_per_switch));
    } else {
      dims = {m.ranks_per_node, m.nodes_per_switch, nodes / m.nodes_per_switch};
    }
  }
  std::vector<int> out;
  for (int d : dims)
    if (d > 1) out.push_back(d);
  if (out.empty()) out.push_back(1);
  return out;
}

double ringStepsSeconds(int steps, bool reduce, double block, const Link& link, double reduce_Bps,
                        const RingParams& ring) {
  if (steps <= 0) return 0;
  // ring.cpp's segments are segment_bytes with a shorter last one; the model spreads the block evenly over
  // as many, so that a step's units add up to the block.
  const double nseg = std::max(1.0, std::ceil(block / std::max(1.0, ring.segment_bytes)));
  const double s = block / nseg;
  const double wire = s / link.beta_Bps;
  const double red = (reduce && reduce_Bps > 0) ? s / reduce_Bps : 0;
  const double hop = link.alpha_s + wire + red;
  const double unit = std::max({wire, red, (link.alpha_s + wire) / std::max(1, ring.window)});
  return (steps - 1) * std::max(nseg * unit, hop) + (nseg - 1) * unit + hop;
}

double scalingEfficiency(double compute_s, double allreduce_s, double overlap, double backward_fraction) {
  const double o = std::clamp(overlap, 0.0, 1.0);
  const double hidden = std::min(o * allreduce_s, backward_fraction * compute_s);
  const double step = compute_s + allreduce_s - hidden;
  return step > 0 ? compute_s / step : 1.0;
}

namespace {

struct Flow {
  int src, dst;
};

// The slowest of flows that all send `bytes` at once: its class, the link it effectively gets (beta shared
// among the flows leaving its node, see Machine), and how many flows shared its node's ports.
struct Slowest {
  LinkClass cls = LinkClass::kIntra;
  Link eff;
  int flows = 1;
};

Slowest slowestFlow(const Machine& m, const std::vector<Flow>& flows, double bytes) {
  std::map<int, int> leaving;  // node -> flows leaving it
  for (const Flow& f : flows)
    if (linkBetween(m, f.src, f.dst) != LinkClass::kIntra) ++leaving[f.src / m.ranks_per_node];
  Slowest worst;
  double worst_t = -1;
  for (const Flow& f : flows) {
    const LinkClass c = linkBetween(m, f.src, f.dst);
    Link l = m.links[static_cast<int>(c)];
    int k = 1;
    if (c != LinkClass::kIntra) {
      k = leaving[f.src / m.ranks_per_node];
      if (m.nics_per_node > 0 && k > m.nics_per_node) l.beta_Bps *= static_cast<double>(m.nics_per_node) / k;
    }
    const double t = l.alpha_s + bytes / l.beta_Bps;
    if (t > worst_t) {
      worst_t = t;
      worst = {c, l, k};
    }
  }
  return worst;
}

Phase ringPhase(const Machine& m, const std::string& what, const std::vector<Flow>& flows, int steps,
                bool reduce, double block, const RingParams& ring) {
  const Slowest s = slowestFlow(m, flows, block);
  Phase ph{what, steps, block, s.cls, s.flows, reduce, 0};
  ph.seconds = ringStepsSeconds(steps, reduce, block, s.eff, m.reduce_Bps, ring);
  return ph;
}

Phase roundPhase(const Machine& m, const std::string& what, const std::vector<Flow>& flows, double bytes,
                 bool reduce) {
  const Slowest s = slowestFlow(m, flows, bytes);
  Phase ph{what, 1, bytes, s.cls, s.flows, reduce, 0};
  ph.seconds =
      s.eff.alpha_s + bytes / s.eff.beta_Bps + (reduce && m.reduce_Bps > 0 ? bytes / m.reduce_Bps : 0);
  return ph;
}

void finish(Prediction* pr, const std::vector<double>& sent) {
  pr->steps = 0;
  pr->seconds = 0;
  for (const Phase& ph : pr->phases) {
    pr->steps += ph.steps;
    pr->seconds += ph.seconds;
  }
  pr->bytes_sent_max = sent.empty() ? 0 : *std::max_element(sent.begin(), sent.end());
}

void predictRing(const Machine& m, Prediction* pr, const RingParams& ring) {
  const int p = pr->ranks;
  const double block = pr->bytes / p;
  std::vector<Flow> flows;
  for (int r = 0; r < p; ++r) flows.push_back({r, (r + 1) % p});
  pr->phases.push_back(ringPhase(m, "ring reduce-scatter", flows, p - 1, true, block, ring));
  pr->phases.push_back(ringPhase(m, "ring allgather", flows, p - 1, false, block, ring));
  finish(pr, std::vector<double>(p, 2.0 * (p - 1) * block));
}

void predictMdRing(const Machine& m, Prediction* pr, const RingParams& ring) {
  const int p = pr->ranks;
  std::vector<Phase> ag;
  double shard = pr->bytes, sent = 0;
  int stride = 1;
  for (size_t k = 0; k < pr->dims.size(); ++k) {
    const int dk = pr->dims[k];
    if (dk > 1) {
      std::vector<Flow> flows;
      for (int r = 0; r < p; ++r) {
        const int c = (r / stride) % dk;
        flows.push_back({r, r - c * stride + ((c + 1) % dk) * stride});
      }
      const double block = shard / dk;
      const std::string dim = "dim " + std::to_string(k) + " (" + std::to_string(dk) + ") ";
      pr->phases.push_back(ringPhase(m, dim + "reduce-scatter", flows, dk - 1, true, block, ring));
      ag.push_back(ringPhase(m, dim + "allgather", flows, dk - 1, false, block, ring));
      sent += 2.0 * (dk - 1) * block;
      shard = block;
    }
    stride *= dk;
  }
  pr->phases.insert(pr->phases.end(), ag.rbegin(), ag.rend());
  finish(pr, std::vector<double>(p, sent));
}

// rhd.cpp's schedule: fold the 2e lowest ranks in pairs, recursive doubling (<= 4 KiB) or halving then
// doubling over the q = 2^k remaining, unfold.
void predictRhd(const Machine& m, Prediction* pr) {
  constexpr double kDoublingMaxBytes = 4096;
  const int p = pr->ranks;
  const double n = pr->bytes;
  int q = 1;
  while (q <= p / 2) q *= 2;  // q * 2 would overflow near INT_MAX
  const int extra = p - q;
  auto real = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  std::vector<double> sent(p, 0.0);

  if (extra > 0) {
    std::vector<Flow> flows;
    for (int i = 0; i < extra; ++i) {
      flows.push_back({2 * i, 2 * i + 1});
      sent[2 * i] += n;
    }
    pr->phases.push_back(roundPhase(m, "rhd fold", flows, n, true));
  }
  auto exchange = [&](int mask) {
    std::vector<Flow> flows;
    for (int v = 0; v < q; ++v) flows.push_back({real(v), real(v ^ mask)});
    return flows;
  };
  if (n <= kDoublingMaxBytes) {
    for (int mask = 1; mask < q; mask <<= 1) {
      pr->phases.push_back(
          roundPhase(m, "rhd doubling mask " + std::to_string(mask), exchange(mask), n, true));
      for (int v = 0; v < q; ++v) sent[real(v)] += n;
    }
  } else {
    double part = n;
    for (int mask = q / 2; mask >= 1; mask >>= 1) {
      part /= 2;
      pr->phases.push_back(
          roundPhase(m, "rhd halving mask " + std::to_string(mask), exchange(mask), part, true));
      for (int v = 0; v < q; ++v) sent[real(v)] += part;
    }
    for (int mask = 1; mask < q; mask <<= 1) {
      pr->phases.push_back(
          roundPhase(m, "rhd doubling mask " + std::to_string(mask), exchange(mask), part, false));
      for (int v = 0; v < q; ++v) sent[real(v)] += part;
      part *= 2;
    }
  }
  if (extra > 0) {
    std::vector<Flow> flows;
    for (int i = 0; i < extra; ++i) {
      flows.push_back({2 * i + 1, 2 * i});
      sent[2 * i + 1] += n;
    }
    pr->phases.push_back(roundPhase(m, "rhd unfold", flows, n, false));
  }
  finish(pr, sent);
}

}  // namespace

StatusOr<Prediction> predict(const Machine& m, Algo algo, int p, double bytes, const RingParams& ring,
                             std::vector<int> dims) {
  if (Status st = validate(m); !st.isOk()) return st;
  if (p < 1) return Status::invalidArgument("rank count must be >= 1, not " + std::to_string(p));
  if (!(bytes >= 0) || !std::isfinite(bytes)) return Status::invalidArgument("message size must be >= 0");
  if (!(ring.segment_bytes >= 1) || ring.window < 1) {
    return Status::invalidArgument("ring segment must be >= 1 byte and window >= 1");
  }
  Prediction pr;
  pr.algo = algo;
  pr.ranks = p;
  pr.bytes = bytes;
  if (p == 1 || bytes == 0) return pr;
  switch (algo) {
    case Algo::kRing:
      predictRing(m, &pr, ring);
      break;
    case Algo::kMdRing: {
      if (dims.empty()) {
        StatusOr<std::vector<int>> g = defaultGrid(m, p);
        if (!g.isOk()) return g.status();
        dims = *g;
      }
      long prod = 1;
      for (int d : dims) {
        if (d < 1) return Status::invalidArgument("mdring dims must be >= 1");
        prod *= d;
        if (prod > p) break;
      }
      if (prod != p)
        return Status::invalidArgument("mdring dims do not multiply to " + std::to_string(p) + " ranks");
      pr.dims = dims;
      predictMdRing(m, &pr, ring);
      break;
    }
    case Algo::kRhd:
      predictRhd(m, &pr);
      break;
  }
  return pr;
}

}  // namespace ddl::sim

/*
 * mpi-allreduce-bench: the MPI peer of ddl-bench, for side-by-side figures on the same machines.
 *
 * It runs the same sweep the same way (per size: barrier, warmup, barrier, the mean of -n timed MPI_Allreduce
 * calls, the slowest rank's), float32 sum only, out-of-place and then in-place (MPI_IN_PLACE), checks the
 * result, and prints ddl-bench's nccl-tests table and, with --json, the same JSON with "algo": "openmpi". So
 * a plot of ddl-bench's JSON can take this program's as one more line, and a difference between the two is
 * the libraries', not the harnesses'. Plain C and MPI, nothing else, so it builds wherever MPI does.
 *
 * Run: mpirun --allow-run-as-root --oversubscribe -np 4 build/bin/mpi-allreduce-bench -b 8 -e 64M -f 2
 */
#define _GNU_SOURCE /* getopt_long, gethostname, clock_gettime */

#include <getopt.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h" /* tools/ddl-bench: the flags, table and JSON shared with ddl-bench */

enum { kExitOk = 0, kExitWrongValues = 1, kExitUsage = 2 };

struct options {
  struct bench_sweep sweep;
  const char* json_path;
};

static const char kUsage[] =
    "usage: mpirun -np N mpi-allreduce-bench [options]\n"
    "Times MPI_Allreduce (float32 sum) over a range of sizes and prints ddl-bench's nccl-tests table.\n"  //
    BENCH_USAGE_SWEEP_FLAGS
    "  -d, --datatype float     the only type (accepted for ddl-bench command lines)\n"
    "  -o, --op sum             the only op (likewise)\n"
    "      --json FILE          rank 0 also writes the results to FILE as JSON\n"
    "  -h, --help               this text\n"
    "Exit status: 0 all results right, 1 wrong values, 2 bad flags.\n";

static int g_rank = 0;

/* Bad flag: rank 0 says what is wrong (every rank parsed the same line), then every rank leaves with 2. */
_Noreturn static void bad_flag(const char* flag, const char* format, ...)
    __attribute__((format(printf, 2, 3)));
static void bad_flag(const char* flag, const char* format, ...) {
  if (g_rank == 0) {
    va_list args;
    va_start(args, format);
    bench_report_bad_flag("mpi-allreduce-bench", flag, format, args);
    va_end(args);
  }
  MPI_Finalize();
  exit(kExitUsage);
}

static struct options parse_options(int argc, char** argv) {
  enum { kJsonOption = 256 };
  static const struct option kLongOptions[] = {
      BENCH_SWEEP_LONG_OPTIONS,
      {"datatype", required_argument, NULL, 'd'},
      {"op", required_argument, NULL, 'o'},
      {"json", required_argument, NULL, kJsonOption},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  struct options o = {bench_sweep_defaults(), NULL};
  int factor_given = 0, step_given = 0, c;
  opterr = g_rank == 0; /* one complaint from getopt, not one per rank */
  while ((c = getopt_long(argc, argv, BENCH_SWEEP_SHORT_OPTIONS "d:o:h", kLongOptions, NULL)) != -1) {
    if (bench_parse_sweep_flag(c, optarg, &o.sweep, &factor_given, &step_given, bad_flag)) continue;
    switch (c) {
      case 'd':
        if (strcmp(optarg, "float") != 0 && strcmp(optarg, "float32") != 0) {
          bad_flag("-d", "datatype '%s' is not measured (float only)", optarg);
        }
        break;
      case 'o':
        if (strcmp(optarg, "sum") != 0) bad_flag("-o", "op '%s' is not measured (sum only)", optarg);
        break;
      case kJsonOption:
        if (*optarg == '\0') bad_flag("--json", "needs a file name");
        o.json_path = optarg;
        break;
      case 'h':
        if (g_rank == 0) fputs(kUsage, stdout);
        MPI_Finalize();
        exit(kExitOk);
      default: /* getopt_long has printed what is wrong */
        if (g_rank == 0) fputs("(mpi-allreduce-bench --help lists the flags)\n", stderr);
        MPI_Finalize();
        exit(kExitUsage);
    }
  }
  if (optind < argc) bad_flag(argv[optind], "unexpected argument (flags only)");
  bench_finish_sweep(&o.sweep, factor_given, step_given, bad_flag);
  return o;
}

/* Rank r's element i is 1 + (r + i) % 3, so the sum is a small integer, exact in float32 (up to millions of
 * ranks), and depends on i only through i % 3. */
static void fill_inputs(float* buf, size_t count, int rank) {
  for (size_t i = 0; i < count; ++i) buf[i] = (float)(1 + (rank + i) % 3);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* Barrier, warmup, barrier, then the mean time of `iters` calls, the slowest rank's. */
static double time_allreduce(const void* send, float* recv, size_t count, const struct bench_sweep* s) {
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < s->warmup_iters; ++i)
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  double start = now_us();
  for (int i = 0; i < s->iters; ++i)
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double us = (now_us() - start) / s->iters;
  MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return us;
}

/* The wrong elements over all ranks, from the first of `check` checks that finds any. */
static long long check_allreduce(float* sendbuf, float* recvbuf, size_t count, int in_place, int rank,
                                 int nranks, const struct bench_sweep* s) {
  float expected[3];
  for (int k = 0; k < 3; ++k) {
    expected[k] = 0;
    for (int r = 0; r < nranks; ++r) expected[k] += (float)(1 + (r + k) % 3);
  }
  long long wrong = 0;
  for (int c = 0; c < s->check; ++c) {
    if (in_place) {
      fill_inputs(recvbuf, count, rank);
    } else {
      fill_inputs(sendbuf, count, rank);
      memset(recvbuf, 0xff, count * sizeof(float)); /* NaN: a result never written counts as wrong */
    }
    MPI_Allreduce(in_place ? MPI_IN_PLACE : sendbuf, recvbuf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    wrong = 0;
    for (size_t i = 0; i < count; ++i) wrong += recvbuf[i] != expected[i % 3];
    MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    if (wrong > 0) break;
  }
  return wrong;
}

static struct bench_variant measure(float* sendbuf, float* recvbuf, size_t count, int in_place, int rank,
                                    int nranks, const struct bench_sweep* s) {
  struct bench_variant v;
  /* In place, each timed call reduces the previous result again; the check fills the buffer afresh. */
  fill_inputs(in_place ? recvbuf : sendbuf, count, rank);
  v.time_us = time_allreduce(in_place ? MPI_IN_PLACE : (const void*)sendbuf, recvbuf, count, s);
  bench_set_bandwidth(&v, (double)(count * sizeof(float)), nranks);
  v.wrong = s->check > 0 ? check_allreduce(sendbuf, recvbuf, count, in_place, rank, nranks, s) : -1;
  return v;
}

static void print_header(int rank, int nranks, const struct bench_sweep* s) {
  /* Every rank says where it runs; rank 0 prints the lines in rank order. */
  char line[BENCH_RANK_LINE];
  bench_rank_line(line, sizeof line, rank);
  char* lines = rank == 0 ? malloc((size_t)BENCH_RANK_LINE * nranks) : NULL;
  MPI_Gather(line, BENCH_RANK_LINE, MPI_CHAR, lines, BENCH_RANK_LINE, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank != 0) return;

  char library[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(library, &len);
  library[strcspn(library, ",\n")] = '\0'; /* "Open MPI v4.1.4" */
  printf("# mpi-allreduce-bench  ranks %d  topology %d  algo openmpi  %s\n", nranks, nranks, library);
  bench_print_sweep(s);
  printf("# algo: openmpi (Open MPI's own choice per message size)\n");
  bench_print_table_head(lines, nranks);
  free(lines);
}

/* The schema of ddl-bench --json. Returns 0 if the file could not be written (after saying so). */
static int write_json(const char* path, int nranks, const struct bench_row* rows, size_t nrows) {
  FILE* f = fopen(path, "w");
  if (f == NULL) {
    bench_json_cannot_write("mpi-allreduce-bench", path);
    return 0;
  }
  char topology[16];
  snprintf(topology, sizeof topology, "%d", nranks);
  return bench_write_json(f, "mpi-allreduce-bench", path, nranks, topology, "openmpi", "float32", "sum", rows,
                          nrows);
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  g_rank = rank;
  struct options o = parse_options(argc, argv);

  const struct bench_sweep* s = &o.sweep;
  size_t max_count = s->max_bytes / sizeof(float);
  if (max_count > (size_t)INT32_MAX) max_count = INT32_MAX; /* MPI_Allreduce takes an int count */
  size_t buffer_bytes = (max_count > 0 ? max_count : 1) * sizeof(float);
  float* sendbuf = malloc(buffer_bytes);
  float* recvbuf = malloc(buffer_bytes);
  if (sendbuf == NULL || recvbuf == NULL) {
    fprintf(stderr, "mpi-allreduce-bench: rank %d: cannot allocate %zu bytes (lower -e)\n", rank,
            buffer_bytes);
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  memset(sendbuf, 0, buffer_bytes); /* fault the pages in now, not inside the timed loop */
  memset(recvbuf, 0, buffer_bytes);

  print_header(rank, nranks, s);
  size_t cap = 16, nrows = 0;
  struct bench_row* rows = malloc(cap * sizeof *rows);
  for (size_t size = s->min_bytes; size <= s->max_bytes;) {
    size_t count = size / sizeof(float);
    if (count > 0 && count <= max_count && (nrows == 0 || rows[nrows - 1].count != count)) {
      if (nrows == cap) rows = realloc(rows, (cap *= 2) * sizeof *rows);
      struct bench_row* r = &rows[nrows++];
      r->count = count;
      r->bytes = count * sizeof(float);
      r->out_of_place = measure(sendbuf, recvbuf, count, 0, rank, nranks, s);
      r->in_place = measure(sendbuf, recvbuf, count, 1, rank, nranks, s);
      if (rank == 0) bench_print_row(r, "float", "sum");
    }
    if (!bench_next_size(s, &size)) break;
  }

  struct bench_summary summary = bench_summarize(rows, nrows);
  int status = summary.total_wrong > 0 ? kExitWrongValues : kExitOk;
  if (rank == 0) {
    bench_print_summary(&summary);
    if (o.json_path != NULL && !write_json(o.json_path, nranks, rows, nrows) && status == kExitOk) {
      status = kExitUsage;
    }
  }
  free(rows);
  free(sendbuf);
  free(recvbuf);
  MPI_Finalize();
  return status;
}

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

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kExitOk = 0, kExitWrongValues = 1, kExitUsage = 2 };

struct options {
  size_t min_bytes;
  size_t max_bytes;
  size_t step_factor;
  size_t step_bytes;
  int iters;
  int warmup_iters;
  int check; /* check iterations per size and variant; 0: no check ("N/A") */
  const char* json_path;
};

struct variant {
  double time_us;
  double algbw; /* GB/s, GB = 1e9 bytes */
  double busbw;
  long long wrong; /* -1 when not checked */
};

struct row {
  size_t bytes;
  size_t count;
  struct variant out_of_place;
  struct variant in_place;
};

static const char kUsage[] =
    "usage: mpirun -np N mpi-allreduce-bench [options]\n"
    "Times MPI_Allreduce (float32 sum) over a range of sizes and prints ddl-bench's nccl-tests table.\n"
    "  -b, --minbytes SIZE      smallest message, bytes; suffix K, M or G (default 8)\n"
    "  -e, --maxbytes SIZE      largest message (default 64M)\n"
    "  -f, --stepfactor N       multiply the size by N each step (default 2)\n"
    "  -i, --stepbytes SIZE     add SIZE each step instead; used when -f is not given or is 1 (default 1M)\n"
    "  -n, --iters N            timed iterations per size (default 20)\n"
    "  -w, --warmup_iters N     untimed iterations before them (default 5)\n"
    "  -c, --check N            check the result N times per size, 0 to skip (default 1)\n"
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
    fprintf(stderr, "mpi-allreduce-bench: %s: ", flag);
    vfprintf(stderr, format, args);
    fputs("\n(mpi-allreduce-bench --help lists the flags)\n", stderr);
    va_end(args);
  }
  MPI_Finalize();
  exit(kExitUsage);
}

/* "8", "64M", "1.5K", "1G", as nccl-tests and ddl-bench read them. */
static size_t parse_size(const char* flag, const char* text) {
  char* end = NULL;
  errno = 0;
  double v = strtod(text, &end);
  int ok = end != text && errno == 0 && isfinite(v) && v >= 0 && isdigit((unsigned char)text[0]);
  if (ok && *end != '\0') {
    switch (*end) {
      case 'k':
      case 'K':
        v *= 1 << 10;
        break;
      case 'm':
      case 'M':
        v *= 1 << 20;
        break;
      case 'g':
      case 'G':
        v *= 1 << 30;
        break;
      default:
        ok = 0;
    }
    ok = ok && end[1] == '\0';
  }
  if (!ok || v >= 0x1p62)
    bad_flag(flag, "invalid size '%s' (use bytes, optionally with K, M or G: 8, 64M)", text);
  return (size_t)v;
}

static long long parse_integer(const char* flag, const char* text, long long min, long long max) {
  char* end = NULL;
  errno = 0;
  long long v = strtoll(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < min || v > max) {
    bad_flag(flag, "invalid value '%s' (use an integer from %lld to %lld)", text, min, max);
  }
  return v;
}

static struct options parse_options(int argc, char** argv) {
  enum { kJsonOption = 256 };
  static const struct option kLongOptions[] = {
      {"minbytes", required_argument, NULL, 'b'},
      {"maxbytes", required_argument, NULL, 'e'},
      {"stepfactor", required_argument, NULL, 'f'},
      {"stepbytes", required_argument, NULL, 'i'},
      {"iters", required_argument, NULL, 'n'},
      {"warmup_iters", required_argument, NULL, 'w'},
      {"check", required_argument, NULL, 'c'},
      {"datatype", required_argument, NULL, 'd'},
      {"op", required_argument, NULL, 'o'},
      {"json", required_argument, NULL, kJsonOption},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  struct options o = {8, 64 << 20, 2, 1 << 20, 20, 5, 1, NULL};
  int factor_given = 0, step_given = 0, c;
  opterr = g_rank == 0; /* one complaint from getopt, not one per rank */
  while ((c = getopt_long(argc, argv, "b:e:f:i:n:w:c:d:o:h", kLongOptions, NULL)) != -1) {
    switch (c) {
      case 'b':
        o.min_bytes = parse_size("-b", optarg);
        break;
      case 'e':
        o.max_bytes = parse_size("-e", optarg);
        break;
      case 'f':
        o.step_factor = (size_t)parse_integer("-f", optarg, 1, 1 << 20);
        factor_given = 1;
        break;
      case 'i':
        o.step_bytes = parse_size("-i", optarg);
        step_given = 1;
        break;
      case 'n':
        o.iters = (int)parse_integer("-n", optarg, 1, 1 << 30);
        break;
      case 'w':
        o.warmup_iters = (int)parse_integer("-w", optarg, 0, 1 << 30);
        break;
      case 'c':
        o.check = (int)parse_integer("-c", optarg, 0, 1 << 20);
        break;
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
  if (step_given && !factor_given) o.step_factor = 1;
  if (o.step_factor == 1 && o.step_bytes == 0) bad_flag("-i", "must be above 0 when sizes grow linearly");
  if (o.step_factor > 1 && o.min_bytes == 0) bad_flag("-b", "must be above 0 when sizes grow by a factor");
  if (o.min_bytes > o.max_bytes)
    bad_flag("-b", "minbytes %zu is above maxbytes %zu", o.min_bytes, o.max_bytes);
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
static double time_allreduce(const void* send, float* recv, size_t count, const struct options* o) {
  MPI_Barrier(MPI_COMM_WORLD);
  for (int i = 0; i < o->warmup_iters; ++i)
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  double start = now_us();
  for (int i = 0; i < o->iters; ++i)
    MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double us = (now_us() - start) / o->iters;
  MPI_Allreduce(MPI_IN_PLACE, &us, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return us;
}

/* The wrong elements over all ranks, from the first of `check` checks that finds any. */
static long long check_allreduce(float* sendbuf, float* recvbuf, size_t count, int in_place, int rank,
                                 int nranks, const struct options* o) {
  float expected[3];
  for (int k = 0; k < 3; ++k) {
    expected[k] = 0;
    for (int r = 0; r < nranks; ++r) expected[k] += (float)(1 + (r + k) % 3);
  }
  long long wrong = 0;
  for (int c = 0; c < o->check; ++c) {
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

static struct variant measure(float* sendbuf, float* recvbuf, size_t count, int in_place, int rank,
                              int nranks, const struct options* o) {
  struct variant v;
  /* In place, each timed call reduces the previous result again; the check fills the buffer afresh. */
  fill_inputs(in_place ? recvbuf : sendbuf, count, rank);
  v.time_us = time_allreduce(in_place ? MPI_IN_PLACE : (const void*)sendbuf, recvbuf, count, o);
  v.algbw = (double)(count * sizeof(float)) / (v.time_us * 1e3);
  v.busbw = v.algbw * 2.0 * (nranks - 1) / nranks;
  v.wrong = o->check > 0 ? check_allreduce(sendbuf, recvbuf, count, in_place, rank, nranks, o) : -1;
  return v;
}

/* nccl-tests' time column: two decimals below 100 us, one below 10 ms, none above. */
static void format_time(char* buf, size_t len, double us) {
  snprintf(buf, len, us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
}

static void print_row(const struct row* r) {
  printf("%12zu  %12zu  %8s  %6s  %6d", r->bytes, r->count, "float", "sum", -1);
  const struct variant* vs[2] = {&r->out_of_place, &r->in_place};
  for (int k = 0; k < 2; ++k) {
    char time[32], wrong[32];
    format_time(time, sizeof time, vs[k]->time_us);
    if (vs[k]->wrong >= 0) {
      snprintf(wrong, sizeof wrong, "%5g", (double)vs[k]->wrong);
    } else {
      snprintf(wrong, sizeof wrong, "%5s", "N/A");
    }
    printf("  %7s  %6.2f  %6.2f  %5s", time, vs[k]->algbw, vs[k]->busbw, wrong);
  }
  printf("\n");
  fflush(stdout);
}

static void print_header(int rank, int nranks, const struct options* o) {
  /* Every rank says where it runs; rank 0 prints the lines in rank order. */
  enum { kLine = 160 };
  char line[kLine], host[64] = {0};
  gethostname(host, sizeof host - 1);
  memset(line, 0, sizeof line);
  snprintf(line, sizeof line, "#  Rank %2d Pid %6d on %10s", rank, (int)getpid(), host);
  char* lines = rank == 0 ? malloc((size_t)kLine * nranks) : NULL;
  MPI_Gather(line, kLine, MPI_CHAR, lines, kLine, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank != 0) return;

  char library[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
  int len = 0;
  MPI_Get_library_version(library, &len);
  library[strcspn(library, ",\n")] = '\0'; /* "Open MPI v4.1.4" */
  printf("# mpi-allreduce-bench  ranks %d  topology %d  algo openmpi  %s\n", nranks, nranks, library);
  printf("# minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d validation: %d\n",
         o->min_bytes, o->max_bytes, o->step_factor > 1 ? o->step_factor : o->step_bytes,
         o->step_factor > 1 ? "factor" : "bytes", o->warmup_iters, o->iters, o->check);
  printf("# algo: openmpi (Open MPI's own choice per message size)\n");
  printf("#\n# Using ranks\n");
  for (int r = 0; r < nranks; ++r) printf("%.*s\n", kLine - 1, lines + (size_t)r * kLine);
  free(lines);
  printf("#\n");
  printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "",
         "", "", "", "");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size", "count", "type",
         "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)", "(elements)", "", "",
         "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  fflush(stdout);
}

/* A number as JSON has it: no inf or nan. */
static void json_number(FILE* f, double v) {
  if (isfinite(v)) {
    fprintf(f, "%.6g", v);
  } else {
    fputs("null", f);
  }
}

static void json_wrong(FILE* f, long long wrong) {
  if (wrong >= 0) {
    fprintf(f, "%lld", wrong);
  } else {
    fputs("null", f);
  }
}

/* The schema of ddl-bench --json. Returns 0 if the file could not be written (after saying so). */
static int write_json(const char* path, int nranks, const struct row* rows, size_t nrows) {
  FILE* f = fopen(path, "w");
  if (f == NULL) {
    fprintf(stderr, "mpi-allreduce-bench: --json: cannot write '%s': %s\n", path, strerror(errno));
    return 0;
  }
  fprintf(f, "{\"ranks\": %d, \"topology\": \"%d\", \"algo\": \"openmpi\", \"results\": [", nranks, nranks);
  for (size_t i = 0; i < nrows; ++i) {
    const struct row* r = &rows[i];
    fprintf(
        f,
        "%s{\"bytes\": %zu, \"count\": %zu, \"type\": \"float32\", \"redop\": \"sum\", \"algo\": \"openmpi\"",
        i == 0 ? "\n  " : ",\n  ", r->bytes, r->count);
    fputs(", \"time_us\": ", f);
    json_number(f, r->out_of_place.time_us);
    fputs(", \"algbw_GBs\": ", f);
    json_number(f, r->out_of_place.algbw);
    fputs(", \"busbw_GBs\": ", f);
    json_number(f, r->out_of_place.busbw);
    fputs(", \"wrong\": ", f);
    json_wrong(f, r->out_of_place.wrong);
    fputs(", \"inplace_time_us\": ", f);
    json_number(f, r->in_place.time_us);
    fputs(", \"inplace_algbw_GBs\": ", f);
    json_number(f, r->in_place.algbw);
    fputs(", \"inplace_busbw_GBs\": ", f);
    json_number(f, r->in_place.busbw);
    fputs(", \"inplace_wrong\": ", f);
    json_wrong(f, r->in_place.wrong);
    fputs("}", f);
  }
  fputs(nrows == 0 ? "]}\n" : "\n]}\n", f);
  int failed = ferror(f);
  if (fclose(f) != 0 || failed) {
    fprintf(stderr, "mpi-allreduce-bench: --json: cannot write '%s': %s\n", path, strerror(errno));
    return 0;
  }
  return 1;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  MPI_Init(&argc, &argv);
  int rank = 0, nranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  g_rank = rank;
  struct options o = parse_options(argc, argv);

  size_t max_count = o.max_bytes / sizeof(float);
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

  print_header(rank, nranks, &o);
  size_t cap = 16, nrows = 0;
  struct row* rows = malloc(cap * sizeof *rows);
  for (size_t size = o.min_bytes; size <= o.max_bytes;) {
    size_t count = size / sizeof(float);
    if (count > 0 && count <= max_count && (nrows == 0 || rows[nrows - 1].count != count)) {
      if (nrows == cap) rows = realloc(rows, (cap *= 2) * sizeof *rows);
      struct row* r = &rows[nrows++];
      r->count = count;
      r->bytes = count * sizeof(float);
      r->out_of_place = measure(sendbuf, recvbuf, count, 0, rank, nranks, &o);
      r->in_place = measure(sendbuf, recvbuf, count, 1, rank, nranks, &o);
      if (rank == 0) print_row(r);
    }
    if (o.step_factor > 1) {
      if (size > o.max_bytes / o.step_factor) break;
      size *= o.step_factor;
    } else {
      if (size > o.max_bytes - o.step_bytes) break;
      size += o.step_bytes;
    }
  }

  long long total_wrong = 0;
  int failed_checks = 0; /* nccl-tests' "Out of bounds values": checks that found any wrong value */
  double busbw_sum = 0;
  for (size_t i = 0; i < nrows; ++i) {
    const struct variant* vs[2] = {&rows[i].out_of_place, &rows[i].in_place};
    for (int k = 0; k < 2; ++k) {
      if (vs[k]->wrong > 0) {
        total_wrong += vs[k]->wrong;
        ++failed_checks;
      }
      busbw_sum += vs[k]->busbw;
    }
  }
  int status = total_wrong > 0 ? kExitWrongValues : kExitOk;
  if (rank == 0) {
    printf("# Out of bounds values : %d %s\n", failed_checks, failed_checks ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g \n", nrows ? busbw_sum / (2.0 * nrows) : 0.0);
    printf("#\n");
    if (total_wrong > 0) printf("# FAILED: %lld wrong values\n", total_wrong);
    fflush(stdout);
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

/*
 * mooncake-bench: throughput of the transfer engine between two processes, in the spirit of
 * Mooncake's transfer_engine_bench.
 *
 *   mooncake-bench --mode local --operation write --block_size 1048576 --json
 *   mooncake-bench --mode target                     # prints "segment: <name>"
 *   mooncake-bench --mode initiator --segment_id 127.0.0.1:4000
 *   mooncake-bench --mode self --target_memory file:/mnt/nvme/x --operation read
 *
 * The target exposes one buffer of --buffer_size bytes; the initiator moves --block_size
 * requests, --batch_size per batch, from --threads threads, for --duration seconds; with
 * --reuse each thread resets and resubmits one batch instead of creating one per round.
 * --memory is the buffer of the side that runs it (the target's, or the initiator's local one):
 * engine memory, malloc'ed memory, file:PATH, a file or block device registered as a buffer
 * (created or extended to --buffer_size), or cuda:N, VRAM of GPU N. In local mode the spawned
 * target gets
 * --target_memory; in self mode one engine is both sides, its target buffer --target_memory:
 * file:PATH there measures the engine's own file <-> memory path. --operation msg measures
 * messages instead (bench_msg.c). With --json the last stdout line is the initiator's summary
 * object.
 */
#include <errno.h>
#include <fcntl.h>
#if MC_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include <mooncake/engine.h>

#include "mooncake_bench.h"

opts_t o = {
    .mode = "local",
    .operation = "write",
    .protocol = "auto",
    .memory = "engine",
    .target_memory = NULL,
    .pattern = "seq",
    .block_size = 65536,
    .batch_size = 128,
    .threads = 1,
    .buffer_size = 1ull << 30,
    .duration = 5,
    .progress_thread = -1,
};

static volatile sig_atomic_t stop_target;

void die(const char *what, int rc)
{
    fprintf(stderr, "mooncake-bench: %s: %s (%s)\n", what, mc_last_error(), mc_err_name(rc));
    exit(1);
}

double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(int code)
{
    fprintf(code ? stderr : stdout,
            "usage: mooncake-bench [--mode target|initiator|local|self] [--segment_id NAME]\n"
            "  [--operation read|write|msg] [--protocol tcp|shm|rdma|auto] [--block_size B]\n"
            "  [--batch_size N] [--threads N] [--duration S] [--buffer_size B]\n"
            "  [--memory engine|malloc|file:PATH|cuda:N] [--target_memory (the same)]\n"
            "  [--pattern seq|random] [--metadata URL]\n"
            "  [--progress thread|caller] [--interval S] [--reuse] [--verify] [--json]\n");
    exit(code);
}

static uint64_t parse_size(const char *s, const char *name)
{
    char *end;
    errno = 0;
    uint64_t v = strtoull(s, &end, 0);
    if (errno || end == s)
        goto bad;
    switch (*end) {
    case 'k':
    case 'K':
        v <<= 10;
        end++;
        break;
    case 'm':
    case 'M':
        v <<= 20;
        end++;
        break;
    case 'g':
    case 'G':
        v <<= 30;
        end++;
        break;
    }
    if (*end || v == 0)
        goto bad;
    return v;
bad:
    fprintf(stderr, "mooncake-bench: --%s=%s: expected a positive size\n", name, s);
    exit(2);
}

static bool memory_ok(const char *m)
{
    return !strcmp(m, "engine") || !strcmp(m, "malloc") || (!strncmp(m, "file:", 5) && m[5]) ||
           (!strncmp(m, "cuda:", 5) && m[5] >= '0' && m[5] <= '9');
}

static void parse_args(int argc, char **argv)
{
    static const struct option lo[] = {{"mode", 1, 0, 'm'},          {"segment_id", 1, 0, 's'},
                                       {"operation", 1, 0, 'o'},     {"protocol", 1, 0, 'p'},
                                       {"block_size", 1, 0, 'b'},    {"batch_size", 1, 0, 'n'},
                                       {"threads", 1, 0, 't'},       {"duration", 1, 0, 'd'},
                                       {"buffer_size", 1, 0, 'w'},   {"memory", 1, 0, 'M'},
                                       {"target_memory", 1, 0, 'T'}, {"pattern", 1, 0, 'P'},
                                       {"metadata", 1, 0, 'D'},      {"progress", 1, 0, 'g'},
                                       {"interval", 1, 0, 'i'},      {"verify", 0, 0, 'v'},
                                       {"json", 0, 0, 'j'},          {"reuse", 0, 0, 'r'},
                                       {"help", 0, 0, 'h'},          {0, 0, 0, 0}};
    int c;

    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'm':
            o.mode = optarg;
            break;
        case 's':
            o.segment_id = optarg;
            break;
        case 'o':
            o.operation = optarg;
            break;
        case 'p':
            o.protocol = optarg;
            break;
        case 'b':
            o.block_size = parse_size(optarg, "block_size");
            break;
        case 'n':
            o.batch_size = parse_size(optarg, "batch_size");
            break;
        case 't':
            o.threads = parse_size(optarg, "threads");
            break;
        case 'd':
            o.duration = atof(optarg);
            break;
        case 'w':
            o.buffer_size = parse_size(optarg, "buffer_size");
            break;
        case 'M':
            o.memory = optarg;
            break;
        case 'T':
            o.target_memory = optarg;
            break;
        case 'P':
            o.pattern = optarg;
            break;
        case 'D':
            o.metadata = optarg;
            break;
        case 'g':
            o.progress_thread = !strcmp(optarg, "thread");
            break;
        case 'i':
            o.interval = atof(optarg);
            break;
        case 'v':
            o.verify = 1;
            break;
        case 'j':
            o.json = 1;
            break;
        case 'r':
            o.reuse = 1;
            break;
        case 'h':
            usage(0);
            break;
        default:
            usage(2);
        }
    }
    if (strcmp(o.operation, "read") && strcmp(o.operation, "write") && strcmp(o.operation, "msg"))
        usage(2);
    if (!memory_ok(o.memory) || (o.target_memory && !memory_ok(o.target_memory))) {
        fprintf(stderr, "mooncake-bench: memory is engine, malloc, file:PATH or cuda:N\n");
        exit(2);
    }
    if (!o.target_memory) /* a file is one side's: the other gets engine memory */
        o.target_memory = strncmp(o.memory, "file:", 5) ? o.memory : "engine";
    if (strcmp(o.protocol, "tcp") && strcmp(o.protocol, "shm") && strcmp(o.protocol, "rdma") &&
        strcmp(o.protocol, "auto")) {
        fprintf(stderr, "mooncake-bench: unknown protocol %s (tcp, shm, rdma, auto)\n", o.protocol);
        exit(2);
    }
    if ((strcmp(o.operation, "msg") && o.block_size * o.threads > o.buffer_size) ||
        o.duration <= 0) {
        fprintf(stderr, "mooncake-bench: need block_size * threads <= buffer_size and a "
                        "positive duration\n");
        exit(2);
    }
}

mc_engine_t *make_engine(int progress_thread)
{
    mc_config_t *cfg;
    mc_engine_t *e;
    int rc = mc_config_create(&cfg);

    if (rc)
        die("configuration", rc);
    if (!rc && o.metadata)
        rc = mc_config_set(cfg, "METADATA", o.metadata);
    if (!rc && progress_thread >= 0)
        rc = mc_config_set(cfg, "PROGRESS_THREAD", progress_thread ? "1" : "0");
    if (!rc && !strcmp(o.protocol, "tcp"))
        rc = mc_config_set(cfg, "FORCE_TCP", "1");
    if (!rc && !strcmp(o.protocol, "rdma")) /* also to a target on this host */
        rc = mc_config_set(cfg, "PROTOCOL", "rdma");
    if (rc)
        die("configuration", rc);
    rc = mc_engine_create(cfg, &e);
    mc_config_destroy(cfg);
    if (rc)
        die("mc_engine_create", rc);
    return e;
}

/* One side's buffer. A file's address in the segment is no pointer, nor is VRAM's to the CPU:
 * their bytes are filled and checked through the file itself (fd) or the GPU's copies. */
typedef struct bench_buf {
    uint8_t *p; /* what requests use */
    const char *memory;
    int fd;   /* file:PATH, else -1 */
    int cuda; /* cuda:N: N, else -1 */
} bench_buf_t;

static bool buf_host(const bench_buf_t *b)
{
    return b->fd < 0 && b->cuda < 0;
}

#if MC_HAVE_CUDA
static void cuda_check(cudaError_t err, const char *what)
{
    if (err != cudaSuccess) {
        fprintf(stderr, "mooncake-bench: %s: %s\n", what, cudaGetErrorString(err));
        exit(1);
    }
}

static void *vram_alloc(int dev, uint64_t len)
{
    void *p = NULL;
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);

    if (err != cudaSuccess || dev >= n) {
        fprintf(stderr, "mooncake-bench: cuda:%d: no such CUDA device (%s)\n", dev,
                err != cudaSuccess ? cudaGetErrorString(err) : "fewer devices");
        exit(1);
    }
    cuda_check(cudaSetDevice(dev), "cudaSetDevice");
    cuda_check(cudaMalloc(&p, len), "cudaMalloc");
    return p;
}

static void vram_copy(void *dst, const void *src, uint64_t len)
{
    cuda_check(cudaMemcpy(dst, src, len, cudaMemcpyDefault), "cudaMemcpy");
}
#else
static void *vram_alloc(int dev, uint64_t len)
{
    (void)dev;
    (void)len;
    fprintf(stderr, "mooncake-bench: cuda memory: built without CUDA\n");
    exit(1);
}

static void vram_copy(void *dst, const void *src, uint64_t len)
{
    (void)dst;
    (void)src;
    (void)len;
}
#define cudaFree(p) ((void)(p))
#endif

static bench_buf_t buf_alloc(mc_engine_t *e, const char *memory, uint64_t len)
{
    bench_buf_t b = {.memory = memory, .fd = -1, .cuda = -1};
    void *p;
    int rc;

    if (!strncmp(memory, "cuda:", 5)) {
        b.cuda = atoi(memory + 5);
        b.p = vram_alloc(b.cuda, len);
        rc = mc_mem_register(e, b.p, len, memory);
        if (rc)
            die("mc_mem_register", rc);
        return b;
    }

    if (!strncmp(memory, "file:", 5)) {
        mc_file_opts_t fo = {.size = sizeof(fo), .length = len, .flags = MC_FILE_CREATE};
        uint64_t addr;
        rc = mc_file_register(e, memory + 5, &fo, &addr);
        if (rc)
            die("mc_file_register", rc);
        b.fd = open(memory + 5, O_RDWR | O_CLOEXEC);
        if (b.fd < 0) {
            perror(memory + 5);
            exit(1);
        }
        b.p = (uint8_t *)(uintptr_t)addr;
        return b;
    }
    if (!strcmp(memory, "engine")) {
        rc = mc_mem_alloc(e, len, "*", &p);
        if (rc)
            die("mc_mem_alloc", rc);
        b.p = p;
        return b;
    }
    p = aligned_alloc(4096, len);
    if (!p) {
        fprintf(stderr, "mooncake-bench: out of memory\n");
        exit(1);
    }
    memset(p, 0, len);
    rc = mc_mem_register(e, p, len, "*");
    if (rc)
        die("mc_mem_register", rc);
    b.p = p;
    return b;
}

static void buf_free(mc_engine_t *e, bench_buf_t *b)
{
    if (!b->p)
        return;
    if (b->fd >= 0) {
        mc_file_unregister(e, (uint64_t)(uintptr_t)b->p);
        close(b->fd);
    } else if (!strcmp(b->memory, "engine")) {
        mc_mem_free(e, b->p);
    } else if (b->cuda >= 0) {
        mc_mem_unregister(e, b->p);
        cudaFree(b->p);
    } else {
        mc_mem_unregister(e, b->p);
        free(b->p);
    }
    b->p = NULL;
}

/* Copy [off, off+len) of b out to dst, or in from src. */
static void buf_io(bench_buf_t *b, uint64_t off, void *mem, uint64_t len, bool in)
{
    if (b->cuda >= 0) {
        vram_copy(in ? b->p + off : mem, in ? mem : b->p + off, len);
        return;
    }
    if (b->fd < 0) {
        if (in)
            memcpy(b->p + off, mem, len);
        else
            memcpy(mem, b->p + off, len);
        return;
    }
    for (uint64_t done = 0; done < len;) {
        ssize_t n = in ? pwrite(b->fd, (uint8_t *)mem + done, len - done, (off_t)(off + done))
                       : pread(b->fd, (uint8_t *)mem + done, len - done, (off_t)(off + done));
        if (n <= 0) {
            perror("mooncake-bench: file buffer");
            exit(1);
        }
        done += (uint64_t)n;
    }
}

static void on_signal(int sig)
{
    (void)sig;
    stop_target = 1;
}

/* ---- target ---- */

static int run_target(void)
{
    mc_engine_t *e = make_engine(o.progress_thread < 0 ? 1 : o.progress_thread);
    bool msg = !strcmp(o.operation, "msg");
    bench_buf_t buf = {0};

    if (!msg)
        buf = buf_alloc(e, o.memory, o.buffer_size);

    if (msg)
        msg_target_setup(e);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    printf("segment: %s\n", mc_engine_segment_name(e));
    fflush(stdout);
    /* Serve until told to stop, or until our parent (local mode) goes away: looked at every
     * 100 ms sleep, or every 4096 passes when spinning on progress (no syscall per pass). */
    for (unsigned i = 0; !stop_target; i++) {
        if (o.progress_thread == 0)
            mc_engine_progress(e);
        else
            usleep(100 * 1000);
        if ((o.progress_thread != 0 || i % 4096 == 0) && getppid() == 1)
            break;
    }
    buf_free(e, &buf);
    mc_engine_destroy(e);
    return 0;
}

/* ---- initiator ---- */

typedef struct worker {
    pthread_t tid;
    mc_engine_t *e;
    mc_segment_id_t seg;
    uint8_t *local;
    uint64_t remote, region, nblocks; /* this worker's slice of the working set */
    uint64_t *order;                  /* block order */
    uint64_t bytes, requests;
    double end;
    int failed;
    uint8_t *touched;  /* per block: moved at least once (for --verify) */
    mc_batch_t *batch; /* --reuse: the one batch, reset after every round */
} worker_t;

static void fill_order(worker_t *w, unsigned seed)
{
    for (uint64_t i = 0; i < w->nblocks; i++)
        w->order[i] = i;
    if (strcmp(o.pattern, "random"))
        return;
    for (uint64_t i = w->nblocks - 1; i > 0; i--) { /* Fisher-Yates */
        uint64_t j = (uint64_t)rand_r(&seed) % (i + 1), t = w->order[i];
        w->order[i] = w->order[j];
        w->order[j] = t;
    }
}

static int run_batch(worker_t *w, mc_opcode_t op, uint64_t *next, mc_request_t *reqs)
{
    mc_batch_t *b = w->batch;
    mc_batch_status_t st;
    int rc = b ? 0 : mc_batch_create(w->e, o.batch_size, &b);

    if (rc)
        die("mc_batch_create", rc);
    for (uint64_t i = 0; i < o.batch_size; i++) {
        uint64_t blk = w->order[(*next)++ % w->nblocks];
        reqs[i] = (mc_request_t){.opcode = op,
                                 .local = w->local + blk * o.block_size,
                                 .target = w->seg,
                                 .target_offset = w->remote + blk * o.block_size,
                                 .length = o.block_size};
        if (w->touched)
            w->touched[blk] = 1;
    }
    rc = mc_batch_submit(b, reqs, o.batch_size, NULL);
    if (rc)
        die("mc_batch_submit", rc);
    mc_batch_wait(b, -1);
    mc_batch_status(b, &st);
    if (st.state != MC_TASK_COMPLETED) {
        for (uint64_t i = 0; i < o.batch_size; i++) {
            mc_task_status_t ts;
            mc_task_status(b, i, &ts);
            if (ts.state != MC_TASK_COMPLETED) {
                fprintf(stderr, "mooncake-bench: task failed: %s\n", ts.reason);
                break;
            }
        }
        w->failed = 1;
    }
    w->bytes += st.bytes;
    w->requests += st.completed;
    while ((w->batch ? mc_batch_reset(b) : mc_batch_destroy(b)) == -EBUSY)
        mc_engine_progress(w->e);
    return st.state == MC_TASK_COMPLETED ? 0 : -1;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    mc_opcode_t op = strcmp(o.operation, "read") ? MC_WRITE : MC_READ;
    mc_request_t *reqs = calloc(o.batch_size, sizeof(*reqs));
    uint64_t next = 0;
    int rc = o.reuse ? mc_batch_create(w->e, o.batch_size, &w->batch) : 0;

    if (rc)
        die("mc_batch_create", rc);
    while (now_s() < w->end && !w->failed)
        run_batch(w, op, &next, reqs);
    if (w->batch)
        mc_batch_release(w->batch);
    free(reqs);
    return NULL;
}

static void pattern_fill(uint8_t *p, uint64_t len, uint64_t salt)
{
    uint64_t *q = (uint64_t *)p;
    for (uint64_t i = 0; i < len / 8; i++)
        q[i] = (i * 0x9e3779b97f4a7c15ull) ^ salt;
}

/* One whole-buffer transfer, used to prepare and to check remote contents. */
static void transfer_all(mc_engine_t *e, mc_segment_id_t seg, mc_opcode_t op, uint8_t *local,
                         uint64_t remote)
{
    uint64_t chunk = 16 << 20, n = (o.buffer_size + chunk - 1) / chunk;
    mc_batch_t *b;
    mc_batch_status_t st;
    int rc = mc_batch_create(e, n, &b);

    if (rc)
        die("mc_batch_create", rc);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = o.buffer_size - i * chunk < chunk ? o.buffer_size - i * chunk : chunk;
        mc_request_t r = {.opcode = op,
                          .local = local + i * chunk,
                          .target = seg,
                          .target_offset = remote + i * chunk,
                          .length = len};
        rc = mc_batch_submit(b, &r, 1, NULL);
        if (rc)
            die("mc_batch_submit", rc);
    }
    mc_batch_wait(b, -1);
    mc_batch_status(b, &st);
    if (st.state != MC_TASK_COMPLETED) {
        fprintf(stderr, "mooncake-bench: %s of the working set failed\n",
                op == MC_READ ? "read-back" : "preparation");
        exit(1);
    }
    while (mc_batch_destroy(b) == -EBUSY)
        mc_engine_progress(e);
}

static uint64_t verify(worker_t *ws, bench_buf_t *local, uint8_t *expect, uint64_t *checked_p)
{
    uint64_t bad = 0, checked = 0;
    uint8_t *got = malloc(o.block_size);

    for (uint64_t t = 0; t < o.threads; t++) {
        worker_t *w = &ws[t];
        for (uint64_t blk = 0; blk < w->nblocks; blk++) {
            if (!w->touched[blk])
                continue;
            uint64_t off = (uint64_t)(w->local - local->p) + blk * o.block_size;
            checked++;
            buf_io(local, off, got, o.block_size, false);
            if (memcmp(got, expect + off, o.block_size))
                bad++;
        }
    }
    free(got);
    *checked_p = checked;
    return bad;
}

static pid_t spawn_target(const char *self, char *name, size_t size)
{
    int fds[2];
    char bs[32], ws[4096 + 8];
    pid_t pid;

    if (pipe(fds) < 0)
        exit(1);
    snprintf(bs, sizeof(bs), "%" PRIu64, o.buffer_size);
    pid = fork();
    if (pid == 0) {
        dup2(fds[1], 1);
        close(fds[0]);
        snprintf(ws, sizeof(ws), "%s", o.target_memory);
        if (!strcmp(o.operation, "msg")) /* it answers us: it hears us leave, as it should */
            setenv("MC_LOG_LEVEL", "error", 0);
        execl(self, self, "--mode", "target", "--buffer_size", bs, "--memory", ws, "--protocol",
              o.protocol, "--operation", o.operation, "--progress",
              o.progress_thread == 0 ? "caller" : "thread", o.metadata ? "--metadata" : NULL,
              o.metadata, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    char line[256];
    if (!f || !fgets(line, sizeof(line), f) || sscanf(line, "segment: %127s", name) != 1) {
        fprintf(stderr, "mooncake-bench: the target did not start\n");
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
        exit(1);
    }
    (void)size;
    return pid;
}

/* One compact JSON line on stdout (the --json summary). */
void print_json_line(const json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT);

    if (text)
        puts(text);
    free(text);
}

/* Per-rail counters: a table on stdout, and the JSON array for the summary line. */
static json_t *report_rails(mc_engine_t *e, mc_segment_id_t seg)
{
    mc_rail_stats_t rs[16];
    size_t n = 0;
    json_t *arr = json_array();

    mc_stats_rails(e, seg, rs, 16, &n);
    printf("%-44s %8s %14s %10s %8s %7s\n", "rail", "state", "bytes", "slices", "errors", "weight");
    for (size_t i = 0; i < n && i < 16; i++) {
        const char *state = rs[i].state ? "paused" : "active";
        printf("%-44s %8s %14" PRIu64 " %10" PRIu64 " %8" PRIu64 " %7.3f\n", rs[i].name, state,
               rs[i].bytes, rs[i].slices, rs[i].errors, rs[i].weight);
        json_array_append_new(arr, json_pack("{s:s,s:s,s:I,s:I,s:I,s:f}", "name", rs[i].name,
                                             "state", state, "bytes", (json_int_t)rs[i].bytes,
                                             "slices", (json_int_t)rs[i].slices, "errors",
                                             (json_int_t)rs[i].errors, "weight", rs[i].weight));
    }
    return arr;
}

/* The transport that carried the data: shm or rdma if it moved any byte; file when nothing
 * crossed to a peer (self mode, a file of ours). */
static const char *protocol_used(mc_engine_t *e)
{
    mc_counters_t c;

    if (mc_stats_transport(e, "shm", &c) == 0 && c.bytes_read + c.bytes_written > 0)
        return "shm";
    if (mc_stats_transport(e, "rdma", &c) == 0 && c.bytes_read + c.bytes_written > 0)
        return "rdma";
    if (mc_stats_transport(e, "tcp", &c) == 0 && c.bytes_read + c.bytes_written == 0 &&
        mc_stats_transport(e, "file", &c) == 0 && c.bytes_read + c.bytes_written > 0)
        return "file";
    return "tcp";
}

static void report(mc_engine_t *e, mc_segment_id_t seg, double secs, uint64_t bytes,
                   uint64_t requests, const char *verified)
{
    double gbps = bytes / secs / 1e9;
    const char *proto = protocol_used(e);
    json_t *rails;

    /* ns/request: the time one thread spends per request, all costs included. */
    double ns_per_req = requests ? secs * 1e9 * (double)o.threads / (double)requests : 0;

    printf("%-10s %-8s %10s %10s %8s %6s %14s %10s %10s %12s %12s\n", "operation", "protocol",
           "block_size", "batch_size", "threads", "reuse", "bytes", "seconds", "GB/s", "requests/s",
           "ns/request");
    printf("%-10s %-8s %10" PRIu64 " %10" PRIu64 " %8" PRIu64 " %6s %14" PRIu64
           " %10.3f %10.3f %12.0f %12.0f\n",
           o.operation, proto, o.block_size, o.batch_size, o.threads, o.reuse ? "yes" : "no", bytes,
           secs, gbps, requests / secs, ns_per_req);
    rails = report_rails(e, seg);
    if (o.json) {
        json_t *line = json_pack(
            "{s:s,s:s,s:I,s:I,s:I,s:I,s:s,s:s,s:b,s:I,s:I,s:f,s:f,s:f,s:s,s:b,s:o}", "operation",
            o.operation, "protocol", proto, "block_size", (json_int_t)o.block_size, "batch_size",
            (json_int_t)o.batch_size, "threads", (json_int_t)o.threads, "buffer_size",
            (json_int_t)o.buffer_size, "memory", o.memory, "pattern", o.pattern, "reuse", o.reuse,
            "bytes", (json_int_t)bytes, "requests", (json_int_t)requests, "seconds", secs, "gbps",
            gbps, "ns_per_request", ns_per_req, "verify", verified, "same_host",
            mc_segment_is_local_host(e, seg) == 1, "rails", rails);
        if (line && strcmp(o.mode, "initiator")) /* what the target side was, where we know */
            json_object_set_new(line, "target_memory", json_string(o.target_memory));
        print_json_line(line);
        json_decref(line);
    } else {
        json_decref(rails);
    }
}

/* --interval: "rails t=SECONDS BYTES,BYTES,..." on stderr, to watch rails leave and rejoin. */
static void print_rail_bytes(mc_engine_t *e, mc_segment_id_t seg, double t)
{
    mc_rail_stats_t rs[16];
    size_t n = 0;

    mc_stats_rails(e, seg, rs, 16, &n);
    fprintf(stderr, "rails t=%.2f ", t);
    for (size_t i = 0; i < n && i < 16; i++)
        fprintf(stderr, "%s%" PRIu64, i ? "," : "", rs[i].bytes);
    fprintf(stderr, "\n");
}

/* The remote buffer: the target's (one of --buffer_size bytes or more), or ours in self mode.
 * The target prints its name once its buffer is registered, but its descriptor may reach the
 * metadata store a moment later (registrations are published in bursts): open it again for a
 * while until it lists the buffer. */
static uint64_t pick_remote(mc_engine_t *e, mc_segment_id_t *seg, const char *target,
                            const bench_buf_t *self)
{
    mc_buffer_info_t bi[64];
    size_t nb;
    uint64_t remote = 0;
    int rc;

    if (self->p)
        return (uint64_t)(uintptr_t)self->p;
    for (int tries = 0; !remote && tries < 100; tries++) {
        if (tries) {
            mc_segment_close(e, *seg);
            usleep(20 * 1000);
            rc = mc_segment_open(e, target, seg);
            if (rc)
                die("mc_segment_open", rc);
        }
        rc = mc_segment_buffers(e, *seg, bi, 64, &nb);
        if (rc)
            die("mc_segment_buffers", rc);
        for (size_t i = 0; i < nb && i < 64; i++)
            if (bi[i].length >= o.buffer_size)
                remote = bi[i].addr;
    }
    if (!remote) {
        fprintf(stderr, "mooncake-bench: %s has no buffer of %" PRIu64 " bytes\n", target,
                o.buffer_size);
        exit(1);
    }
    return remote;
}

/* target NULL: self mode, our own segment with a buffer of --target_memory. */
static int run_initiator(const char *target)
{
    mc_engine_t *e = make_engine(o.progress_thread < 0 ? 1 : o.progress_thread);
    mc_segment_id_t seg;
    bench_buf_t self = {.fd = -1, .cuda = -1};
    uint64_t remote = 0, bytes = 0, requests = 0;
    int rc, failed = 0;

    if (!target) {
        self = buf_alloc(e, o.target_memory, o.buffer_size);
        target = mc_engine_segment_name(e);
    }
    rc = mc_segment_open(e, target, &seg);
    if (rc)
        die("mc_segment_open", rc);
    if (!strcmp(o.operation, "msg")) {
        rc = msg_run_initiator(e, seg);
        mc_segment_close(e, seg);
        mc_engine_destroy(e);
        return rc;
    }
    remote = pick_remote(e, &seg, target, &self);
    bench_buf_t lb = buf_alloc(e, o.memory, o.buffer_size);
    uint8_t *local = lb.p;
    uint8_t *expect = o.verify ? malloc(o.buffer_size) : NULL;
    if (buf_host(&lb)) /* a file's or VRAM's contents matter only to --verify */
        pattern_fill(local, o.buffer_size, (uint64_t)getpid());
    if (expect && buf_host(&lb)) {
        memcpy(expect, local, o.buffer_size);
    } else if (expect) {
        pattern_fill(expect, o.buffer_size, (uint64_t)getpid());
        buf_io(&lb, 0, expect, o.buffer_size, true);
    }
    if (o.verify) {
        transfer_all(e, seg, MC_WRITE, local, remote); /* remote := pattern */
        if (!strcmp(o.operation, "read")) {
            uint8_t *zero = calloc(1, o.buffer_size);
            buf_io(&lb, 0, zero, o.buffer_size, true);
            free(zero);
        }
    }

    worker_t *ws = calloc(o.threads, sizeof(*ws));
    uint64_t region = o.buffer_size / o.threads / o.block_size * o.block_size;
    double start = now_s();
    for (uint64_t t = 0; t < o.threads; t++) {
        worker_t *w = &ws[t];
        w->e = e;
        w->seg = seg;
        w->local = local + t * region;
        w->remote = remote + t * region;
        w->nblocks = region / o.block_size;
        w->order = malloc(w->nblocks * sizeof(*w->order));
        w->touched = o.verify ? calloc(w->nblocks, 1) : NULL;
        w->end = start + o.duration;
        fill_order(w, (unsigned)(t + 1));
        pthread_create(&w->tid, NULL, worker_main, w);
    }
    while (o.interval > 0 && now_s() + o.interval <= start + o.duration) {
        usleep((useconds_t)(o.interval * 1e6));
        print_rail_bytes(e, seg, now_s() - start);
    }
    for (uint64_t t = 0; t < o.threads; t++) {
        pthread_join(ws[t].tid, NULL);
        bytes += ws[t].bytes;
        requests += ws[t].requests;
        failed |= ws[t].failed;
    }
    double secs = now_s() - start;
    const char *verified = "off";
    if (o.verify && !failed) {
        uint64_t checked, bad;
        if (!strcmp(o.operation, "write")) /* read the remote back over our own buffer */
            transfer_all(e, seg, MC_READ, local, remote);
        bad = verify(ws, &lb, expect, &checked);
        verified = bad ? "FAILED" : "ok";
        fprintf(stderr,
                "mooncake-bench: verify: %" PRIu64 " blocks checked, %" PRIu64 " mismatched\n",
                checked, bad);
        failed |= bad != 0;
    }
    report(e, seg, secs, bytes, requests, failed ? "FAILED" : verified);
    /* (VRAM of a same-host peer opened with CUDA IPC is moved by the file transport alone) */
    if (!strcmp(o.protocol, "shm") && strcmp(protocol_used(e), "shm") &&
        strcmp(protocol_used(e), "file")) {
        fprintf(stderr, "mooncake-bench: --protocol shm, but no byte went through shm (target on "
                        "another host, or not engine memory)\n");
        failed = 1;
    }
    if (!strcmp(o.protocol, "rdma") && strcmp(protocol_used(e), "rdma")) {
        fprintf(stderr, "mooncake-bench: --protocol rdma, but no byte went through rdma (no RDMA "
                        "device on one side: see mooncake-info)\n");
        failed = 1;
    }
    for (uint64_t t = 0; t < o.threads; t++) {
        free(ws[t].order);
        free(ws[t].touched);
    }
    free(ws);
    free(expect);
    mc_segment_close(e, seg);
    buf_free(e, &lb);
    buf_free(e, &self);
    mc_engine_destroy(e);
    return failed ? 1 : 0;
}

int main(int argc, char **argv)
{
    char name[128];
    int rc, status;

    parse_args(argc, argv);
    if (!strcmp(o.mode, "target"))
        return run_target();
    if (!strcmp(o.mode, "initiator")) {
        if (!o.segment_id)
            usage(2);
        return run_initiator(o.segment_id);
    }
    if (!strcmp(o.mode, "self"))
        return run_initiator(NULL);
    if (strcmp(o.mode, "local"))
        usage(2);
    pid_t pid = spawn_target("/proc/self/exe", name, sizeof(name));
    rc = run_initiator(o.segment_id ? o.segment_id : name);
    kill(pid, SIGTERM);
    waitpid(pid, &status, 0);
    return rc;
}

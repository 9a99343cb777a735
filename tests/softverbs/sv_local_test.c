/* Single-process checks of the softverbs device, in the places where it must behave like the
 * kernel and hardware rather than merely work: memory registration limits (SOFTVERBS_MAX_MR_SIZE,
 * EINVAL) and the pinning check (EFAULT on unmapped or PROT_NONE pages), a completion channel
 * fd that wakes epoll, and a non-blocking async_fd that reports a port going down.
 *
 * Built against the system libibverbs and run with LD_LIBRARY_PATH pointing at the stand-in; it
 * sets its own softverbs environment. Without a softverbs device it exits 77 (skipped).
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_MR (8u << 20)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static int failures;
static char ctl_dir[] = "/tmp/sv_local_XXXXXX";

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

/* Registers and expects errno err (0: success, then deregisters). */
static void expect_reg(struct ibv_pd *pd, void *addr, size_t len, int err, const char *what)
{
    struct ibv_mr *mr;

    errno = 0;
    mr = ibv_reg_mr(pd, addr, len, ACCESS);
    if (!err) {
        CHECK(mr, "%s: registration failed: %s", what, strerror(errno));
    } else {
        CHECK(!mr && errno == err, "%s: %s, expected %s", what, mr ? "registered" : strerror(errno),
              strerror(err));
    }
    if (mr)
        ibv_dereg_mr(mr);
}

static void case_mr(struct ibv_context *ctx, struct ibv_pd *pd)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct ibv_device_attr da;
    struct ibv_mr *mr;
    char *big =
        mmap(NULL, MAX_MR + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *none = mmap(NULL, 16 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *small = malloc(1000), stack[100];

    printf("case: registration limits and pinning\n");
    if (big == MAP_FAILED || none == MAP_FAILED || !small) {
        CHECK(0, "mmap/malloc");
        return;
    }
    CHECK(ibv_query_device(ctx, &da) == 0 && da.max_mr_size == MAX_MR, "max_mr_size %llu",
          (unsigned long long)da.max_mr_size);
    expect_reg(pd, big, MAX_MR, 0, "max_mr_size bytes");
    expect_reg(pd, big, MAX_MR + 1, EINVAL, "max_mr_size + 1 bytes");
    expect_reg(pd, small + 3, 997, 0, "malloc'ed memory, unaligned");
    expect_reg(pd, stack, sizeof(stack), 0, "stack memory");
    expect_reg(pd, none, 16 * page, EFAULT, "PROT_NONE mapping");
    expect_reg(pd, none + 5, 1, EFAULT, "one byte of a PROT_NONE mapping");
    errno = 0;
    mr = ibv_reg_mr_iova(pd, none, page, 0x1000, ACCESS);
    CHECK(!mr && errno == EFAULT, "ibv_reg_mr_iova of PROT_NONE: %s", strerror(errno));
    /* The last page of a region past the first batch of the check (1024 pages). */
    mprotect(big + MAX_MR - page, page, PROT_NONE);
    expect_reg(pd, big, MAX_MR, EFAULT, "last page PROT_NONE");
    expect_reg(pd, big, MAX_MR - page, 0, "up to the PROT_NONE page");
    munmap(big + 2 * page, page);
    expect_reg(pd, big, 3 * page, EFAULT, "range over an unmapped hole");
    expect_reg(pd, big + page + 1, page, EFAULT, "range ending in an unmapped hole");
    expect_reg(pd, big, 2 * page, 0, "range before the hole");
    munmap(big, MAX_MR + page);
    munmap(none, 16 * page);
    free(small);
}

static int qp_connect(struct ibv_qp *qp, uint32_t dest_qpn, uint16_t lid)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};

    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return -1;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest_qpn;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = lid;
    a.ah_attr.port_num = 1;
    if (ibv_modify_qp(qp, &a,
                      IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return -1;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    return ibv_modify_qp(qp, &a,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static int post_write(struct ibv_qp *qp, struct ibv_mr *mr, uint64_t wr_id)
{
    struct ibv_sge sge = {.addr = (uintptr_t)mr->addr, .length = 64, .lkey = mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sge, .num_sge = 1};
    struct ibv_send_wr *bad;

    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = (uintptr_t)mr->addr + 4096;
    wr.wr.rdma.rkey = mr->rkey;
    return ibv_post_send(qp, &wr, &bad);
}

static bool poll_wc(struct ibv_cq *cq, struct ibv_wc *wc)
{
    for (int i = 0; i < 5000; i++) {
        if (ibv_poll_cq(cq, 1, wc) == 1)
            return true;
        usleep(1000);
    }
    return false;
}

/* An armed CQ's completion makes the channel fd readable; an unarmed one does not. */
static void comp_channel_rounds(struct ibv_comp_channel *ch, struct ibv_cq *cq, struct ibv_qp *qp,
                                struct ibv_mr *mr)
{
    struct epoll_event ev = {.events = EPOLLIN};
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct ibv_cq *ev_cq;
    struct ibv_wc wc;
    void *ev_ctx;

    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, ch->fd, &ev) == 0, "epoll_ctl(channel fd): %s",
          strerror(errno));
    CHECK(post_write(qp, mr, 1) == 0 && poll_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS,
          "WRITE on an unarmed CQ");
    CHECK(epoll_wait(ep, &ev, 1, 200) == 0, "channel readable without ibv_req_notify_cq");
    for (uint64_t round = 2; round <= 3; round++) {
        CHECK(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
        CHECK(epoll_wait(ep, &ev, 1, 0) == 0, "channel readable before the completion");
        CHECK(post_write(qp, mr, round) == 0, "post WRITE");
        CHECK(epoll_wait(ep, &ev, 1, 5000) == 1 && (ev.events & EPOLLIN),
              "channel fd not readable after a completion (round %llu)", (unsigned long long)round);
        CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq && ev_ctx == mr,
              "ibv_get_cq_event");
        ibv_ack_cq_events(cq, 1);
        CHECK(poll_wc(cq, &wc) && wc.status == IBV_WC_SUCCESS && wc.wr_id == round,
              "completion of round %llu", (unsigned long long)round);
        CHECK(epoll_wait(ep, &ev, 1, 0) == 0, "channel still readable after the event was read");
    }
    close(ep);
}

static void case_comp_channel(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_mr *mr)
{
    struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
    struct ibv_cq *cq = ch ? ibv_create_cq(ctx, 16, mr, ch, 0) : NULL;
    struct ibv_qp_init_attr ia = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    struct ibv_qp *qa = cq ? ibv_create_qp(pd, &ia) : NULL;
    struct ibv_qp *qb = cq ? ibv_create_qp(pd, &ia) : NULL;
    struct ibv_port_attr pa;

    printf("case: completion channel fd in epoll\n");
    CHECK(qa && qb && ibv_query_port(ctx, 1, &pa) == 0, "channel, CQ or QPs");
    /* Two QPs of one device connected to each other: the device loops back. */
    if (qa && qb && !qp_connect(qa, qb->qp_num, pa.lid) && !qp_connect(qb, qa->qp_num, pa.lid))
        comp_channel_rounds(ch, cq, qa, mr);
    else
        CHECK(0, "loopback QPs");
    if (qa)
        ibv_destroy_qp(qa);
    if (qb)
        ibv_destroy_qp(qb);
    if (cq)
        ibv_destroy_cq(cq);
    if (ch)
        ibv_destroy_comp_channel(ch);
}

static void ctl_write(const char *dev, const char *text)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", ctl_dir, dev);
    snprintf(tmp, sizeof(tmp), "%s/.tmp", ctl_dir);
    f = fopen(tmp, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0 && rename(tmp, path) == 0, "write %s", path);
}

/* Waits (epoll) for an async event of the given type; others (none expected) are skipped. */
static bool wait_async(struct ibv_context *ctx, int ep, enum ibv_event_type type)
{
    struct epoll_event ev;
    struct ibv_async_event ae;

    while (epoll_wait(ep, &ev, 1, 5000) == 1) {
        while (ibv_get_async_event(ctx, &ae) == 0) {
            ibv_ack_async_event(&ae);
            if (ae.event_type == type)
                return ae.element.port_num == 1;
        }
        if (errno != EAGAIN)
            return false;
    }
    return false;
}

static void case_async_fd(struct ibv_context *ctx)
{
    struct epoll_event ev = {.events = EPOLLIN};
    const char *dev = ibv_get_device_name(ctx->device);
    int ep = epoll_create1(EPOLL_CLOEXEC), fl = fcntl(ctx->async_fd, F_GETFL);
    struct ibv_async_event ae;
    struct ibv_port_attr pa;

    printf("case: non-blocking async_fd, port down and up\n");
    CHECK(fl >= 0 && fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0 &&
              (fcntl(ctx->async_fd, F_GETFL) & O_NONBLOCK),
          "O_NONBLOCK on async_fd");
    errno = 0;
    CHECK(ibv_get_async_event(ctx, &ae) == -1 && errno == EAGAIN,
          "ibv_get_async_event without events: errno %s, expected EAGAIN", strerror(errno));
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, ctx->async_fd, &ev) == 0, "epoll_ctl(async_fd)");
    CHECK(epoll_wait(ep, &ev, 1, 0) == 0, "async_fd readable with no event");
    ctl_write(dev, "port=down\n");
    CHECK(wait_async(ctx, ep, IBV_EVENT_PORT_ERR), "no IBV_EVENT_PORT_ERR on port 1");
    CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN, "port not DOWN");
    ctl_write(dev, "port=up\n");
    CHECK(wait_async(ctx, ep, IBV_EVENT_PORT_ACTIVE), "no IBV_EVENT_PORT_ACTIVE on port 1");
    CHECK(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE, "port not ACTIVE");
    close(ep);
}

static struct ibv_context *open_softverbs(void)
{
    struct ibv_context *ctx = NULL;
    struct ibv_device **list;
    int n;

    list = ibv_get_device_list(&n);
    if (list && n > 0 && !strncmp(ibv_get_device_name(list[0]), "softverbs", 9))
        ctx = ibv_open_device(list[0]);
    if (list)
        ibv_free_device_list(list);
    return ctx;
}

int main(void)
{
    char fabric[64], path[PATH_MAX];
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_mr *mr;
    void *buf;

    /* The stand-in reads these when the device list is first asked for. */
    snprintf(fabric, sizeof(fabric), "sv-local-%d", (int)getpid());
    if (!mkdtemp(ctl_dir))
        return 2;
    setenv("SOFTVERBS_DEVICES", "1", 1);
    setenv("SOFTVERBS_FABRIC", fabric, 1);
    setenv("SOFTVERBS_CTL_DIR", ctl_dir, 1);
    setenv("SOFTVERBS_MAX_MR_SIZE", "8388608", 1);
    unsetenv("SOFTVERBS_CONFIG");
    ctx = open_softverbs();
    if (!ctx) {
        printf("no softverbs device (is LD_LIBRARY_PATH set?): skipped\n");
        rmdir(ctl_dir);
        return 77;
    }
    pd = ibv_alloc_pd(ctx);
    buf = aligned_alloc(4096, 8192);
    mr = pd && buf ? ibv_reg_mr(pd, buf, 8192, ACCESS) : NULL;
    if (!mr) {
        fprintf(stderr, "FAIL: PD or MR\n");
        return 1;
    }
    case_mr(ctx, pd);
    case_comp_channel(ctx, pd, mr);
    case_async_fd(ctx);
    ibv_dereg_mr(mr);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    free(buf);
    snprintf(path, sizeof(path), "%s/%s", ctl_dir, "softverbs0");
    unlink(path);
    rmdir(ctl_dir);
    printf("%s\n", failures ? "FAILED" : "PASSED");
    return failures ? 1 : 0;
}

/* Shared declarations of the softverbs verbs test (sv_verbs_test.c, sv_verbs_cases.c). */
#ifndef SV_VERBS_TEST_H
#define SV_VERBS_TEST_H

#include <infiniband/verbs.h>
#include <stdbool.h>
#include <stdint.h>

#define BUF_SIZE   (16u << 20)
#define MAX_MSG    (16u << 20)
#define POLL_MS    30000
#define QP_TIMEOUT 14 /* 67 ms per try */
#define QP_RETRY   3

struct info {
    uint16_t lid;
    union ibv_gid gid;
    uint32_t qpn;
    uint32_t psn;
    uint64_t addr;
    uint32_t rkey;
};

struct ep {
    const char *role;
    int oob;
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    uint8_t *buf;
    struct ibv_qp *qp;
    struct info self, peer;
    bool eth;
};

extern int failures;

#define CHECK(e, cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail(e, __VA_ARGS__);                                                                  \
    } while (0)

void fail(struct ep *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
uint64_t now_ms(void);
void oob_xfer(struct ep *e, const void *out, void *in, size_t len);
void barrier(struct ep *e);
void fill(uint8_t *p, size_t len, unsigned seed);
bool verify(const uint8_t *p, size_t len, unsigned seed);
bool poll_one(struct ep *e, struct ibv_wc *wc, int timeout_ms);
struct ibv_qp *qp_create(struct ep *e);
int qp_to_init(struct ibv_qp *qp);
int qp_to_rtr(struct ep *e, struct ibv_qp *qp, const struct info *peer);
int qp_to_rts(struct ibv_qp *qp, uint32_t psn, int rnr_retry, int retry_cnt);
int pair_new(struct ep *e, int rnr_retry, int retry_cnt);
int post_rdma(struct ep *e, enum ibv_wr_opcode op, uint64_t loff, uint64_t roff, uint32_t len,
              uint32_t rkey, uint64_t wr_id, unsigned flags);
int post_recv(struct ep *e, uint64_t off, uint32_t len, uint64_t wr_id);
void expect_wc(struct ep *e, enum ibv_wc_status st, uint64_t wr_id, const char *what);

/* The cases: A and B run each one together, in the same order. */
void case_transitions(struct ep *e, bool is_a);
void case_data(struct ep *e, bool is_a);
void case_unsignaled_sge(struct ep *e, bool is_a);
void case_bad_rkey(struct ep *e, bool is_a);
void case_rnr(struct ep *e, bool is_a);
void case_err_qp_flush(struct ep *e, bool is_a);
void case_local_errors(struct ep *e, bool is_a);
void case_faults(struct ep *e, bool is_a);
void case_port_down(struct ep *e, bool is_a);

#endif

/*
 * hello_transfer: the smallest complete use of the Mooncake-C transfer engine.
 *
 * Two engines live in one process. Engine B allocates a buffer and exports its segment
 * descriptor; engine A opens that descriptor, WRITEs a pattern into B's buffer (with a
 * notification for B), READs it back into a second buffer and checks every byte. In a real
 * deployment A and B are different processes or hosts, and A opens B by name through the
 * metadata service (mc_segment_open) instead of passing the descriptor by hand.
 *
 * Build: see CMakeLists.txt (find_package) or Makefile (pkg-config) next to this file.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mooncake/engine.h>

#define LEN     (1 << 20) /* bytes moved each way */
#define MESSAGE "hello from A"

static int fail(const char *what, int rc)
{
    fprintf(stderr, "hello_transfer: %s: %s (%s)\n", what, mc_err_name(rc), mc_last_error());
    return rc < 0 ? rc : -1;
}

static void sleep_1ms(void)
{
    nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
}

static int create_engine(mc_engine_t **engine_p)
{
    mc_config_t *cfg;
    int rc = mc_config_create(&cfg); /* defaults, then MC_* from the environment */

    if (rc < 0)
        return fail("mc_config_create", rc);
    if ((rc = mc_config_set(cfg, "LISTEN", "127.0.0.1:0")) < 0 ||
        (rc = mc_config_set(cfg, "METADATA", "none")) < 0 || /* peers come from descriptors */
        (rc = mc_config_set(cfg, "PROGRESS_THREAD", "1")) < 0) {
        mc_config_destroy(cfg);
        return fail("mc_config_set", rc);
    }
    rc = mc_engine_create(cfg, engine_p);
    mc_config_destroy(cfg);
    return rc < 0 ? fail("mc_engine_create", rc) : 0;
}

/* Export b's descriptor and open it from a. The blob is what a real peer would receive over
 * any channel (a socket, a file, the serving stack's own control plane). */
static int connect_to(mc_engine_t *a, mc_engine_t *b, mc_segment_id_t *seg_p)
{
    size_t len = 0;
    void *blob;
    int rc = mc_segment_export(b, NULL, &len); /* asks for the size: -ENOSPC, len set */

    if (rc != -ENOSPC)
        return fail("mc_segment_export (size)", rc);
    blob = malloc(len);
    if (blob == NULL)
        return fail("malloc", -ENOMEM);
    rc = mc_segment_export(b, blob, &len);
    if (rc == 0)
        rc = mc_segment_open_blob(a, blob, len, seg_p);
    free(blob);
    return rc < 0 ? fail("exporting/opening segment B", rc) : 0;
}

/* Submit one request as task `index` of batch and wait until it is final. */
static int transfer(mc_batch_t *batch, size_t index, const mc_request_t *req,
                    const mc_notify_req_t *notify)
{
    const char *op = req->opcode == MC_WRITE ? "WRITE" : "READ";
    mc_task_status_t st;
    int rc = mc_batch_submit(batch, req, 1, notify);

    if (rc == 0)
        rc = mc_batch_wait(batch, -1);
    if (rc == 0)
        rc = mc_task_status(batch, index, &st);
    if (rc < 0)
        return fail(op, rc);
    if (st.state != MC_TASK_COMPLETED || st.bytes != req->length) {
        fprintf(stderr, "hello_transfer: %s failed: %s\n", op, st.reason ? st.reason : "?");
        return -1;
    }
    printf("%-5s %llu bytes: completed\n", op, (unsigned long long)st.bytes);
    return 0;
}

/* Notifications arrive after the data, asynchronously: poll for up to 5 seconds. */
static int receive_notification(mc_engine_t *b)
{
    static mc_notify_t note; /* large: MC_MSG_MAX bytes of payload */

    for (int i = 0; i < 5000; i++) {
        if (mc_notify_pop(b, &note) == 1) {
            printf("B got notification from %s: \"%.*s\"\n", note.sender, (int)note.len, note.msg);
            if (note.len == strlen(MESSAGE) && memcmp(note.msg, MESSAGE, note.len) == 0)
                return 0;
            fprintf(stderr, "hello_transfer: unexpected notification\n");
            return -1;
        }
        sleep_1ms();
    }
    fprintf(stderr, "hello_transfer: no notification after 5 s\n");
    return -1;
}

/* WRITE the first half of local to remote, READ it back into the second half, compare. */
static int write_read_verify(mc_engine_t *a, mc_engine_t *b, mc_segment_id_t seg,
                             unsigned char *local, void *remote)
{
    mc_request_t req = {MC_WRITE, local, seg, (uint64_t)(uintptr_t)remote, LEN, NULL, NULL};
    mc_notify_req_t note = {seg, MESSAGE, strlen(MESSAGE)};
    mc_batch_t *batch;
    int rc = mc_batch_create(a, 2, &batch);

    if (rc < 0)
        return fail("mc_batch_create", rc);
    for (size_t i = 0; i < LEN; i++)
        local[i] = (unsigned char)(i * 7 + i / 251);
    rc = transfer(batch, 0, &req, &note);
    if (rc == 0 && memcmp(remote, local, LEN) != 0) {
        fprintf(stderr, "hello_transfer: B's buffer does not hold what A wrote\n");
        rc = -1;
    }
    if (rc == 0) {
        req.opcode = MC_READ;
        req.local = local + LEN;
        rc = transfer(batch, 1, &req, NULL);
    }
    for (size_t i = 0; rc == 0 && i < LEN; i++) {
        if (local[LEN + i] != local[i]) {
            fprintf(stderr, "hello_transfer: byte %zu differs: %u != %u\n", i, local[LEN + i],
                    local[i]);
            rc = -1;
        }
    }
    if (rc == 0) {
        printf("verify: %d bytes read back match\n", LEN);
        rc = receive_notification(b);
    }
    /* The engine may hold a final task for a moment after the wait: retry while -EBUSY. */
    while (mc_batch_destroy(batch) == -EBUSY)
        sleep_1ms();
    return rc;
}

int main(void)
{
    mc_engine_t *a, *b;
    mc_segment_id_t seg;
    void *remote;
    unsigned char *local;
    int rc = -1;

    if (create_engine(&a) < 0)
        return 1;
    if (create_engine(&b) < 0)
        goto err_destroy_a;
    printf("engine A: %s\nengine B: %s\n", mc_engine_segment_name(a), mc_engine_segment_name(b));

    rc = mc_mem_alloc(b, LEN, "*", &remote);
    if (rc < 0) {
        fail("mc_mem_alloc", rc);
        goto err_destroy_b;
    }
    local = malloc(2 * LEN); /* first half: the pattern written, second: what is read back */
    if (local == NULL) {
        rc = fail("malloc", -ENOMEM);
        goto err_free_remote;
    }
    rc = mc_mem_register(a, local, 2 * LEN, "*");
    if (rc < 0) {
        fail("mc_mem_register", rc);
        goto err_free_local;
    }
    rc = connect_to(a, b, &seg);
    if (rc < 0)
        goto err_unregister;

    rc = write_read_verify(a, b, seg, local, remote);

    mc_segment_close(a, seg);
err_unregister:
    mc_mem_unregister(a, local);
err_free_local:
    free(local);
err_free_remote:
    mc_mem_free(b, remote);
err_destroy_b:
    mc_engine_destroy(b);
err_destroy_a:
    mc_engine_destroy(a);
    printf("%s\n", rc == 0 ? "hello_transfer: OK" : "hello_transfer: FAILED");
    return rc == 0 ? 0 : 1;
}

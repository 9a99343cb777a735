/* The etcd:// backend against an etcd with authentication (short-lived tokens) and one with TLS
 * and client certificates, made by this test with openssl. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <mooncake/engine.h>
#include <mooncake/error.h>

#include "etcd_proc.h"
#include "metadata/meta.h"

static etcd_proc_t etcd;

static void unset_all(void)
{
    unsetenv("MC_ETCD_USER");
    unsetenv("MC_ETCD_PASSWORD");
    unsetenv("MC_ETCD_CACERT");
    unsetenv("MC_ETCD_CERT");
    unsetenv("MC_ETCD_KEY");
}

static void roundtrip(mc_meta_t *m, const char *key)
{
    mc_meta_kv_t kv;

    assert_int_equal(mc__meta_put(m, key, strlen(key), "v", 1, 0, NULL), 0);
    assert_int_equal(mc__meta_get(m, key, strlen(key), &kv), 0);
    assert_memory_equal(kv.value, "v", 1);
    mc__meta_kv_free(&kv);
}

/* ---- authentication ---- */

static int auth_setup(void **state)
{
    (void)state;
    int rc = etcd_proc_start(&etcd, "--auth-token simple --auth-token-ttl 2");
    if (rc == 77)
        exit(77);
    assert_int_equal(rc, 0);
    if (etcd_proc_sh(&etcd, "command -v etcdctl >/dev/null") != 0)
        exit(77);
    assert_int_equal(etcd_proc_sh(&etcd, "export ETCDCTL_API=3 E=--endpoints=$ETCD_ENDPOINT; "
                                         "etcdctl $E user add root:s3cret >/dev/null && "
                                         "etcdctl $E auth enable >/dev/null 2>&1"),
                     0);
    return 0;
}

static int auth_teardown(void **state)
{
    (void)state;
    unset_all();
    etcd_proc_stop(&etcd);
    return 0;
}

static void test_auth_wrong_password(void **state)
{
    mc_meta_t *m;

    (void)state;
    setenv("MC_ETCD_USER", "root", 1);
    setenv("MC_ETCD_PASSWORD", "wrong", 1);
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), -MC_EAUTH);
    assert_non_null(strstr(mc_last_error(), "MC_ETCD_USER=root"));
    unset_all();
}

static void test_auth_missing(void **state)
{
    mc_meta_t *m;
    mc_meta_kv_t kv;

    (void)state;
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), 0);
    assert_int_equal(mc__meta_get(m, "k", 1, &kv), -MC_EAUTH);
    assert_non_null(strstr(mc_last_error(), "MC_ETCD_USER"));
    mc__meta_close(m);
}

/* Credentials are per engine: two engines of one process, one with the right password and one
 * with a wrong one, set through their configurations (the environment has none). */
static mc_engine_t *engine_with(const char *password, int *rc_p)
{
    mc_config_t *cfg;
    mc_engine_t *e = NULL;

    assert_int_equal(mc_config_create(&cfg), 0);
    assert_int_equal(mc_config_set(cfg, "METADATA", etcd.url), 0);
    assert_int_equal(mc_config_set(cfg, "ETCD_USER", "root"), 0);
    assert_int_equal(mc_config_set(cfg, "ETCD_PASSWORD", password), 0);
    assert_int_equal(mc_config_set(cfg, "LOG_LEVEL", "off"), 0);
    *rc_p = mc_engine_create(cfg, &e);
    mc_config_destroy(cfg);
    return e;
}

static void test_auth_per_engine(void **state)
{
    mc_meta_t *m;
    mc_meta_kv_t kv;
    char key[256];
    int rc;

    (void)state;
    unset_all();
    mc_engine_t *good = engine_with("s3cret", &rc);
    assert_int_equal(rc, 0);
    mc_engine_t *bad = engine_with("wrong", &rc);
    assert_null(bad);
    assert_int_equal(rc, -MC_EAUTH);
    /* The good one published its descriptor with its own credentials. */
    setenv("MC_ETCD_USER", "root", 1);
    setenv("MC_ETCD_PASSWORD", "s3cret", 1);
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), 0);
    snprintf(key, sizeof(key), "mooncake/ram/%s", mc_engine_segment_name(good));
    assert_int_equal(mc__meta_get(m, key, strlen(key), &kv), 0);
    mc__meta_kv_free(&kv);
    mc__meta_close(m);
    unset_all();
    mc_engine_destroy(good);
}

/* Tokens live 2 s here: every call after a pause needs a fresh one. */
static void test_auth_token_expiry(void **state)
{
    mc_meta_t *m;
    mc_meta_watch_t *w;
    mc_meta_event_t ev;
    int64_t lease;

    (void)state;
    setenv("MC_ETCD_USER", "root", 1);
    setenv("MC_ETCD_PASSWORD", "s3cret", 1);
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), 0);
    roundtrip(m, "auth/a");
    assert_int_equal(mc__meta_watch_create(m, "auth/", 5, 0, &w), 0);
    etcd_test_sleep_ms(3500);
    roundtrip(m, "auth/b");
    assert_int_equal(mc__meta_lease_grant(m, 10, &lease), 0);
    etcd_test_sleep_ms(3500);
    assert_int_equal(mc__meta_lease_keepalive(m, lease), 0);
    roundtrip(m, "auth/c");
    assert_int_equal(mc__meta_watch_next(w, 5000, &ev), 0);
    assert_memory_equal(ev.kv.key, "auth/b", 6);
    mc__meta_kv_free(&ev.kv);
    assert_int_equal(mc__meta_watch_next(w, 5000, &ev), 0);
    assert_memory_equal(ev.kv.key, "auth/c", 6);
    mc__meta_kv_free(&ev.kv);
    mc__meta_watch_destroy(w);
    assert_int_equal(mc__meta_lease_revoke(m, lease), 0);
    mc__meta_close(m);
    unset_all();
}

/* ---- TLS ---- */

static int tls_setup(void **state)
{
    char flags[1024];

    (void)state;
    int rc = etcd_proc_prepare(&etcd);
    if (rc == 77)
        exit(77);
    assert_int_equal(rc, 0);
    if (etcd_proc_sh(&etcd, "command -v openssl >/dev/null") != 0)
        exit(77);
    /* A CA, a server certificate for 127.0.0.1, a client certificate, and an unrelated CA. */
    assert_int_equal(
        etcd_proc_sh(
            &etcd,
            "(set -e; cd \"$ETCD_DIR\"; K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
            "-nodes'; "
            "openssl req -x509 $K -keyout ca.key -out ca.pem -days 2 -subj /CN=mc-test-ca; "
            "openssl req -x509 $K -keyout ca2.key -out ca2.pem -days 2 -subj /CN=mc-other-ca; "
            "openssl req $K -keyout server.key -out server.csr -subj /CN=127.0.0.1; "
            "echo subjectAltName=IP:127.0.0.1 > s.ext; "
            "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
            "-out server.pem -days 2 -extfile s.ext; "
            "openssl req $K -keyout client.key -out client.csr -subj /CN=root; "
            "echo extendedKeyUsage=clientAuth > c.ext; "
            "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
            "-out client.pem -days 2 -extfile c.ext) >/dev/null 2>&1; "
            "test -s \"$ETCD_DIR/client.pem\""),
        0);
    snprintf(flags, sizeof(flags),
             "--cert-file %s/server.pem --key-file %s/server.key --client-cert-auth "
             "--trusted-ca-file %s/ca.pem",
             etcd.dir, etcd.dir, etcd.dir);
    char curl_args[512];
    snprintf(curl_args, sizeof(curl_args),
             "--cacert %s/ca.pem --cert %s/client.pem --key %s/client.key", etcd.dir, etcd.dir,
             etcd.dir);
    setenv("ETCD_CURL_ARGS", curl_args, 1);
    assert_int_equal(etcd_proc_launch(&etcd, flags), 0);
    unsetenv("ETCD_CURL_ARGS");
    return 0;
}

static void set_tls(const char *ca, const char *cert, const char *key)
{
    char p[256];

    unset_all();
    snprintf(p, sizeof(p), "%s/%s", etcd.dir, ca);
    setenv("MC_ETCD_CACERT", p, 1);
    if (cert) {
        snprintf(p, sizeof(p), "%s/%s", etcd.dir, cert);
        setenv("MC_ETCD_CERT", p, 1);
        snprintf(p, sizeof(p), "%s/%s", etcd.dir, key);
        setenv("MC_ETCD_KEY", p, 1);
    }
}

static void test_tls_ok(void **state)
{
    mc_meta_t *m;
    mc_meta_watch_t *w;
    mc_meta_event_t ev;

    (void)state;
    set_tls("ca.pem", "client.pem", "client.key");
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), 0);
    assert_int_equal(mc__meta_watch_create(m, "tls/", 4, 0, &w), 0);
    roundtrip(m, "tls/a");
    assert_int_equal(mc__meta_watch_next(w, 5000, &ev), 0);
    assert_memory_equal(ev.kv.key, "tls/a", 5);
    mc__meta_kv_free(&ev.kv);
    mc__meta_watch_destroy(w);
    mc__meta_close(m);
    unset_all();
}

static void test_tls_wrong_ca(void **state)
{
    mc_meta_t *m;
    mc_meta_kv_t kv;

    (void)state;
    set_tls("ca2.pem", "client.pem", "client.key");
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), 0);
    assert_int_equal(mc__meta_get(m, "k", 1, &kv), -MC_EAUTH);
    printf("wrong CA: %s\n", mc_last_error());
    assert_non_null(strstr(mc_last_error(), "TLS"));
    assert_non_null(strstr(mc_last_error(), "MC_ETCD_CACERT"));
    mc__meta_close(m);
    unset_all();
}

static void test_tls_no_client_cert(void **state)
{
    mc_meta_t *m;
    mc_meta_kv_t kv;

    (void)state;
    set_tls("ca.pem", NULL, NULL);
    assert_int_equal(mc__meta_open(etcd.url, NULL, &m), 0);
    int rc = mc__meta_get(m, "k", 1, &kv);
    printf("no client certificate: %s\n", mc_last_error());
    assert_true(rc == -MC_EAUTH || rc == -MC_EMETA);
    mc__meta_close(m);
    unset_all();
}

int main(void)
{
    const struct CMUnitTest auth[] = {
        cmocka_unit_test(test_auth_wrong_password),
        cmocka_unit_test(test_auth_missing),
        cmocka_unit_test(test_auth_token_expiry),
        cmocka_unit_test(test_auth_per_engine),
    };
    const struct CMUnitTest tls[] = {
        cmocka_unit_test(test_tls_ok),
        cmocka_unit_test(test_tls_wrong_ca),
        cmocka_unit_test(test_tls_no_client_cert),
    };
    int rc = cmocka_run_group_tests_name("auth", auth, auth_setup, auth_teardown);

    rc |= cmocka_run_group_tests_name("tls", tls, tls_setup, auth_teardown);
    return rc;
}

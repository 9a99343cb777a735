/* softverbs: the stub failure path, enum-to-string helpers, rates and fork support. */
#include "sv_int.h"

#include <errno.h>
#include <stdio.h>

/* Called by every generated stub (sv_stubs.c): not-implemented entries fail loudly. */
SV_EXPORT int sv__stub_fail(const char *name);
int sv__stub_fail(const char *name)
{
    fprintf(stderr, "softverbs: %s is not implemented\n", name);
    errno = EOPNOTSUPP;
    return EOPNOTSUPP;
}

#define SV_STR(tab, v) ((unsigned)(v) < sizeof(tab) / sizeof(tab[0]) && tab[v] ? tab[v] : "unknown")

SV_EXPORT const char *ibv_node_type_str(enum ibv_node_type t)
{
    static const char *const s[] = {
        [IBV_NODE_CA] = "InfiniBand channel adapter",
        [IBV_NODE_SWITCH] = "InfiniBand switch",
        [IBV_NODE_ROUTER] = "InfiniBand router",
        [IBV_NODE_RNIC] = "iWARP NIC",
        [IBV_NODE_USNIC] = "usNIC",
        [IBV_NODE_USNIC_UDP] = "usNIC UDP",
        [IBV_NODE_UNSPECIFIED] = "unspecified",
    };
    return SV_STR(s, t);
}

SV_EXPORT const char *ibv_port_state_str(enum ibv_port_state st)
{
    static const char *const s[] = {
        [IBV_PORT_NOP] = "no state change (NOP)",
        [IBV_PORT_DOWN] = "down",
        [IBV_PORT_INIT] = "init",
        [IBV_PORT_ARMED] = "armed",
        [IBV_PORT_ACTIVE] = "active",
        [IBV_PORT_ACTIVE_DEFER] = "active defer",
    };
    return SV_STR(s, st);
}

SV_EXPORT const char *ibv_event_type_str(enum ibv_event_type ev)
{
    static const char *const s[] = {
        [IBV_EVENT_CQ_ERR] = "CQ error",
        [IBV_EVENT_QP_FATAL] = "local work queue catastrophic error",
        [IBV_EVENT_QP_REQ_ERR] = "invalid request local work queue error",
        [IBV_EVENT_QP_ACCESS_ERR] = "local access violation work queue error",
        [IBV_EVENT_COMM_EST] = "communication established",
        [IBV_EVENT_SQ_DRAINED] = "send queue drained",
        [IBV_EVENT_PATH_MIG] = "path migrated",
        [IBV_EVENT_PATH_MIG_ERR] = "path migration request error",
        [IBV_EVENT_DEVICE_FATAL] = "local catastrophic error",
        [IBV_EVENT_PORT_ACTIVE] = "port active",
        [IBV_EVENT_PORT_ERR] = "port error",
        [IBV_EVENT_LID_CHANGE] = "LID change",
        [IBV_EVENT_PKEY_CHANGE] = "P_Key change",
        [IBV_EVENT_SM_CHANGE] = "SM change",
        [IBV_EVENT_SRQ_ERR] = "SRQ catastrophic error",
        [IBV_EVENT_SRQ_LIMIT_REACHED] = "SRQ limit reached",
        [IBV_EVENT_QP_LAST_WQE_REACHED] = "last WQE reached",
        [IBV_EVENT_CLIENT_REREGISTER] = "client reregistration",
        [IBV_EVENT_GID_CHANGE] = "GID table change",
        [IBV_EVENT_WQ_FATAL] = "WQ fatal",
    };
    return SV_STR(s, ev);
}

SV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status st)
{
    static const char *const s[] = {
        [IBV_WC_SUCCESS] = "success",
        [IBV_WC_LOC_LEN_ERR] = "local length error",
        [IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
        [IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
        [IBV_WC_LOC_PROT_ERR] = "local protection error",
        [IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
        [IBV_WC_MW_BIND_ERR] = "memory management operation error",
        [IBV_WC_BAD_RESP_ERR] = "bad response error",
        [IBV_WC_LOC_ACCESS_ERR] = "local access error",
        [IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
        [IBV_WC_REM_ACCESS_ERR] = "remote access error",
        [IBV_WC_REM_OP_ERR] = "remote operation error",
        [IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
        [IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
        [IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
        [IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
        [IBV_WC_REM_ABORT_ERR] = "aborted error",
        [IBV_WC_INV_EECN_ERR] = "invalid EE context number",
        [IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
        [IBV_WC_FATAL_ERR] = "fatal error",
        [IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
        [IBV_WC_GENERAL_ERR] = "general error",
        [IBV_WC_TM_ERR] = "TM error",
        [IBV_WC_TM_RNDV_INCOMPLETE] = "TM software rendezvous",
    };
    return SV_STR(s, st);
}

/* Rates: (enum value, multiple of 2.5 Gb/s, Mb/s). */
static const struct {
    enum ibv_rate rate;
    int mult;
    int mbps;
} sv_rates[] = {
    {IBV_RATE_2_5_GBPS, 1, 2500},       {IBV_RATE_5_GBPS, 2, 5000},
    {IBV_RATE_10_GBPS, 4, 10000},       {IBV_RATE_20_GBPS, 8, 20000},
    {IBV_RATE_30_GBPS, 12, 30000},      {IBV_RATE_40_GBPS, 16, 40000},
    {IBV_RATE_60_GBPS, 24, 60000},      {IBV_RATE_80_GBPS, 32, 80000},
    {IBV_RATE_120_GBPS, 48, 120000},    {IBV_RATE_14_GBPS, 5, 14062},
    {IBV_RATE_56_GBPS, 22, 56250},      {IBV_RATE_112_GBPS, 45, 112500},
    {IBV_RATE_168_GBPS, 67, 168750},    {IBV_RATE_25_GBPS, 10, 25781},
    {IBV_RATE_100_GBPS, 40, 103125},    {IBV_RATE_200_GBPS, 80, 206250},
    {IBV_RATE_300_GBPS, 120, 309375},   {IBV_RATE_28_GBPS, 11, 28125},
    {IBV_RATE_50_GBPS, 20, 53125},      {IBV_RATE_400_GBPS, 160, 425000},
    {IBV_RATE_600_GBPS, 240, 637500},   {IBV_RATE_800_GBPS, 320, 850000},
    {IBV_RATE_1200_GBPS, 480, 1275000},
};
#define SV_NRATES (sizeof(sv_rates) / sizeof(sv_rates[0]))

SV_EXPORT int ibv_rate_to_mult(enum ibv_rate rate)
{
    for (size_t i = 0; i < SV_NRATES; i++)
        if (sv_rates[i].rate == rate)
            return sv_rates[i].mult;
    return -1;
}

SV_EXPORT enum ibv_rate mult_to_ibv_rate(int mult)
{
    for (size_t i = 0; i < SV_NRATES; i++)
        if (sv_rates[i].mult == mult)
            return sv_rates[i].rate;
    return IBV_RATE_MAX;
}

SV_EXPORT int ibv_rate_to_mbps(enum ibv_rate rate)
{
    for (size_t i = 0; i < SV_NRATES; i++)
        if (sv_rates[i].rate == rate)
            return sv_rates[i].mbps;
    return -1;
}

SV_EXPORT enum ibv_rate mbps_to_ibv_rate(int mbps)
{
    for (size_t i = 0; i < SV_NRATES; i++)
        if (sv_rates[i].mbps == mbps)
            return sv_rates[i].rate;
    return IBV_RATE_MAX;
}

/* Memory is never shared with a kernel, so fork needs no preparation. */
SV_EXPORT int ibv_fork_init(void)
{
    return 0;
}

SV_EXPORT enum ibv_fork_status ibv_is_fork_initialized(void)
{
    return IBV_FORK_UNNEEDED;
}

SV_EXPORT int ibv_dontfork_range(void *base, size_t size)
{
    (void)base;
    (void)size;
    return 0;
}

SV_EXPORT int ibv_dofork_range(void *base, size_t size)
{
    (void)base;
    (void)size;
    return 0;
}

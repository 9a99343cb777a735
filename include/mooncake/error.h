/*
 * Mooncake-C error convention.
 *
 * Every function returns int: 0 on success, a negative code on failure. Codes are negative
 * errno values (-EINVAL, -ENOMEM, ...) or the project-specific codes below, which sit above
 * errno's range. -EAGAIN always means "retry after progress".
 *
 * A failing call also leaves a human-readable reason in a thread-local buffer, read with
 * mc_last_error(); it names the variable, address, peer or file involved.
 */
#ifndef MOONCAKE_ERROR_H
#define MOONCAKE_ERROR_H

#ifdef __cplusplus
extern "C" {
#endif

#define MC_API __attribute__((visibility("default")))

/* X-macro: name, value, description. Values are positive here and returned negated. */
#define MC_ERRNO_MAP(X)                                                                            \
    X(MC_EPROTO, 4001, "malformed or unexpected frame from peer")                                  \
    X(MC_EVERSION, 4002, "peer speaks an incompatible protocol version")                           \
    X(MC_EAUTH, 4003, "peer authentication failed")                                                \
    X(MC_ENOSEGMENT, 4004, "segment not found")                                                    \
    X(MC_EACCESS, 4005, "remote range is not inside a registered buffer")                          \
    X(MC_EPEERDEAD, 4006, "peer closed the connection or died")                                    \
    X(MC_ETIMEOUT, 4007, "operation timed out")                                                    \
    X(MC_ECANCELED, 4008, "operation canceled")                                                    \
    X(MC_ECONFIG, 4009, "invalid configuration value")                                             \
    X(MC_EMETA, 4010, "metadata backend error")                                                    \
    X(MC_ENODEV, 4011, "no such device")                                                           \
    X(MC_ECONFLICT, 4012, "compare-and-swap lost: the value changed")

enum {
#define MC_ERR_ENUM(name, val, str) name = val,
    MC_ERRNO_MAP(MC_ERR_ENUM)
#undef MC_ERR_ENUM
};

/* Static description of an error code (either sign accepted). Never returns NULL. */
MC_API const char *mc_strerror(int err);

/* Symbolic name of an error code ("MC_EACCESS", "EINVAL"). Never returns NULL. */
MC_API const char *mc_err_name(int err);

/* Reason for the last failure on the calling thread; "" if none. Valid until the next call
 * on this thread that fails. */
MC_API const char *mc_last_error(void);

#ifdef __cplusplus
}
#endif
#endif

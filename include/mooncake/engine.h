/*
 * Mooncake-C transfer engine: public API.
 *
 * An engine exposes one segment (the memory this process registers) and moves data to and from
 * the segments of other engines. Work is submitted in batches of READ/WRITE requests; each
 * request becomes a task whose status is polled (or reported through a callback).
 *
 * Conventions (see error.h): functions return 0 or a negative code; output pointers come last
 * and are set only on success; mc_last_error() gives the reason of a failure.
 *
 * Threads: every function may be called from any thread unless its comment says otherwise.
 * Callbacks (completion, message and peer handlers) run in the progress context — the internal
 * progress thread, or whichever thread calls mc_engine_progress(). They may submit, poll,
 * cancel, release, send messages, pack and add buffer keys, and open segments without blocking
 * (mc_segment_open_nb, mc_segment_open_address, mc_segment_open_blob), but must not
 * unregister memory, close segments, open them blocking (those return -EDEADLK there) or
 * destroy anything.
 *
 * Progress: with MC_PROGRESS_THREAD=0 the host drives progress. Submit, status, send,
 * notify_pop and unregister then also run a pass themselves unless MC_PROGRESS_IMPLICIT=0, under
 * which callbacks run only inside mc_engine_progress and mc_batch_wait (unregister, which must
 * wait for I/O, moves bytes but keeps the callbacks for the next mc_engine_progress; a send
 * still moves out what is queued, its message with it: no pass, no callback). With implicit
 * progress a send's pass is a short one while the host also calls progress (it moves the
 * message out and leaves what came in to the host's next call), a whole one when no pass ran
 * for 100 microseconds.
 * Callbacks run at the end of a pass, never inside another engine call's work. Connections do
 * not depend on how often the host calls in: a host may compute for seconds between calls.
 */
#ifndef MOONCAKE_ENGINE_H
#define MOONCAKE_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include <mooncake/error.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mc_engine mc_engine_t;
typedef struct mc_batch mc_batch_t;
typedef uint32_t mc_segment_id_t;

#define MC_SEGMENT_INVALID  ((mc_segment_id_t)-1)
#define MC_NAME_MAX         128         /* segment names, including the terminating NUL */
#define MC_LOCATION_MAX     32          /* "cpu:0", "cuda:3", ... */
#define MC_MSG_MAX          (64 * 1024) /* largest message or notification payload */
#define MC_MSG_WINDOW       4096        /* messages per peer queued or unacknowledged, */
#define MC_MSG_WINDOW_BYTES (1 << 20)   /* and their payload bytes (one message always fits) */
#define MC_ADDRESS_MAX      64          /* largest mc_engine_address */
#define MC_BUFFER_KEY_SIZE  128         /* every mc_buffer_key_pack key */

/* ---- configuration ------------------------------------------------------------------------ */

/* Engine settings, opaque so that settings can be added without breaking callers. Every
 * setting has a name and a text value, as its environment variable has: "SLICE_SIZE" is
 * MC_SLICE_SIZE (README lists them all with their defaults; mc_config_setting enumerates them).
 * A configuration belongs to one thread at a time; mc_engine_create copies it. */
typedef struct mc_config mc_config_t;

/* Create a configuration: the defaults, then the MC_* environment variables. -MC_ECONFIG
 * naming the variable (mc_last_error) if one is invalid; nothing is created then. Free with
 * mc_config_destroy(). */
MC_API int mc_config_create(mc_config_t **config_p);

MC_API void mc_config_destroy(mc_config_t *config);

/* Set one setting, by name with or without the MC_ prefix ("SLICE_SIZE", "MC_SLICE_SIZE"), to
 * a value written as in the environment. -ENOENT for an unknown name, -MC_ECONFIG for an
 * invalid value (the setting keeps its previous value); the reason names the setting. */
MC_API int mc_config_set(mc_config_t *config, const char *name, const char *value);

/* The value of a setting as text, valid until it is set again or the configuration destroyed;
 * NULL for an unknown name. */
MC_API const char *mc_config_get(const mc_config_t *config, const char *name);

/* The index-th setting there is (0, 1, ...): its name (without MC_), default and a one-line
 * description; the strings are static. -ENOENT past the last one. */
MC_API int mc_config_setting(size_t index, const char **name_p, const char **default_p,
                             const char **help_p);

/* ---- engine ------------------------------------------------------------------------------- */

/* Create an engine: listen, publish the segment descriptor under a lease (unless metadata is
 * "none"), start the progress thread if configured. config is copied; NULL means defaults and
 * the environment (as mc_config_create). Free with mc_engine_destroy(). */
MC_API int mc_engine_create(const mc_config_t *config, mc_engine_t **engine_p);

/* Stop the progress thread, close every connection, fail outstanding tasks, unpublish the
 * segment, unregister all memory. Batches must have been destroyed first. */
MC_API void mc_engine_destroy(mc_engine_t *engine);

/* The segment name peers use to open this engine ("ip:port" by default). */
MC_API const char *mc_engine_segment_name(const mc_engine_t *engine);

/* Drive I/O once without blocking. Returns the number of events handled (>= 0). Safe to call
 * concurrently with the progress thread (one of them wins, the other returns 0). */
MC_API int mc_engine_progress(mc_engine_t *engine);

/* A file descriptor that becomes readable when mc_engine_progress() has work: poll it, then
 * call progress. Owned by the engine. */
MC_API int mc_engine_event_fd(const mc_engine_t *engine);

/* For a host that spins on mc_engine_progress and sleeps on the event fd only now and then
 * (UCX's worker arm, a poll loop with a busy phase): call this just before sleeping. 0: the
 * host may sleep, the fd becomes readable when there is work; -EAGAIN: there is work already,
 * call progress instead. Once a host has called it, passes no longer arm wake-ups by themselves
 * (which costs the peers a wake-up per message), so the host must call it before every sleep.
 * While armed, MC_PROGRESS_SERVE_US's thread leaves the work to the host it wakes up. Always 0
 * with a progress thread. */
MC_API int mc_engine_arm(mc_engine_t *engine);

/* ---- memory ------------------------------------------------------------------------------- */

/* Register [addr, addr+len) so that peers may read and write it. location is "cpu:N", "cuda:N"
 * or "*" (detected: NUMA node of the first page, or the CUDA device). Zero length is refused
 * (-EINVAL). Two layers of a host may register the same pages: registering exactly the same
 * range (and location) again counts one more registration of it; an overlapping range is a
 * registration of its own, and a peer's request is served while any registration holds it
 * whole. Peers learn of new buffers through the published descriptor (bursts of registrations
 * are published together) or at once through a buffer key. Memory mapped without write
 * permission (PROT_READ) is registered read-only: peers may only read it, and a request of
 * ours that would write into it (a READ landing there) is refused at submit; the permission is
 * read at registration, so it must not be taken away while the memory is registered. The
 * memory must stay valid until the last mc_mem_unregister() of it returns. */
MC_API int mc_mem_register(mc_engine_t *engine, void *addr, size_t len, const char *location);

/* Drop one registration of the buffer that starts at addr (the latest, when several start
 * there); with the last one the buffer goes. New remote accesses are refused at once; the call
 * then waits (bounded by the transfer timeout) until no request in flight still touches the
 * buffer, including copies that same-host peers make themselves (CMA, or through a mapping of
 * mc_mem_alloc memory, which they are told to unmap and must acknowledge within
 * MC_IO_TIMEOUT_MS or be disconnected). A peer's tcp connection that still holds the buffer
 * when the transfer timeout has passed (sending a WRITE into it, or leaving a READ's answer
 * unread) is dropped. After it returns 0 neither this engine nor any peer reads or writes the
 * buffer again. Returns -ENOENT if addr starts no buffer, -EDEADLK from a callback,
 * -MC_ETIMEOUT if references did not drain, or a same-host peer's copy on it (CMA) still ran
 * after MC_IO_TIMEOUT_MS, or (memory from mc_mem_alloc) the progress context did not revoke
 * same-host peers' mappings of it within MC_IO_TIMEOUT_MS + 1 s (the buffer stays unusable for
 * new requests, and
 * must not be freed yet: calling this again waits for them again, and returns 0 once they have
 * drained, and with them those of any earlier registration of the same range that timed out),
 * -EBUSY while another call waits for such a registration. */
MC_API int mc_mem_unregister(mc_engine_t *engine, void *addr);

/* mc_mem_unregister of the registration of exactly [addr, addr+len) (the latest such one),
 * for hosts that register several ranges starting at one address (a registration cache that
 * merges regions). -ENOENT if there is none. */
MC_API int mc_mem_unregister_range(mc_engine_t *engine, void *addr, size_t len);

/* Allocate len bytes of shared (memfd-backed) memory placed on location ("cpu:N" or "*" for the
 * caller's node), zero-filled, backed by pages at once, and registered with the engine. Free
 * with mc_mem_free(). */
MC_API int mc_mem_alloc(mc_engine_t *engine, size_t len, const char *location, void **addr_p);

/* Unregister (with the guarantees of mc_mem_unregister) and unmap memory from mc_mem_alloc().
 * If the unregister times out (logged), the memory stays mapped: call this again later (or it
 * goes with the engine). */
MC_API void mc_mem_free(mc_engine_t *engine, void *addr);

/* ---- files and block devices -------------------------------------------------------------- */

/* A file, or a block device (an NVMe namespace), or a range of one, registered as a buffer of
 * the segment: peers READ and WRITE it with the batch API as they do memory, and local requests
 * move data between it and registered memory (or another file buffer). It is not mapped: the
 * buffer gets an address of its own in the segment (at or above 0x4000000000000000, where no
 * memory is), and byte k of the range is at that address + k, both as a request's target
 * (target_offset) and as its local end (local = (void *)(uintptr_t)(addr + k)). Its location
 * is "file". I/O goes through io_uring (MC_FILE_IO), with O_DIRECT where the offset, length and
 * memory of a piece are aligned to the device's block size, through the page cache otherwise;
 * peers' requests are served through the owner's bounce buffers. */

/* Flags of mc_file_register. READONLY: open it read-only; WRITEs to it are refused
 * (-MC_EACCESS). DURABLE: a WRITE completes once its data is on stable storage (RWF_DSYNC);
 * without it, once it is in the file (the page cache, or the device for O_DIRECT pieces).
 * CREATE: create the file if missing and extend it to offset + length. BUFFERED: never O_DIRECT,
 * every piece through the page cache. */
#define MC_FILE_READONLY 0x1u
#define MC_FILE_DURABLE  0x2u
#define MC_FILE_CREATE   0x4u
#define MC_FILE_BUFFERED 0x8u

/* Options of mc_file_register. Zero-filled means: the whole file, read-write, not durable. */
typedef struct mc_file_opts {
    size_t size;     /* sizeof(mc_file_opts_t) */
    uint64_t offset; /* where the buffer starts in the file */
    uint64_t length; /* bytes from there; 0: to the end of the file or device */
    unsigned flags;  /* MC_FILE_* */
} mc_file_opts_t;

/* Register [offset, offset+length) of the file or block device at path as a buffer; *addr_p
 * gets its address in the segment. The range must lie inside the file (unless MC_FILE_CREATE)
 * and not be empty. Errors: -ENOENT, -EACCES, ... from opening it (the reason names the path),
 * -EINVAL for an empty or out-of-file range, -MC_ENODEV when MC_FILE_IO=uring and io_uring is
 * unavailable. The file is opened once here and closed by mc_file_unregister; a file truncated
 * meanwhile makes READs past its new end fail with -EIO and a reason. opts may be NULL. */
MC_API int mc_file_register(mc_engine_t *engine, const char *path, const mc_file_opts_t *opts,
                            uint64_t *addr_p);

/* Unregister a file buffer (with the guarantees of mc_mem_unregister: refused to peers at
 * once, then waits for the I/O in flight on it) and close the file. -ENOENT if addr starts no
 * file buffer. */
MC_API int mc_file_unregister(mc_engine_t *engine, uint64_t addr);

/* What a file buffer is, as its owner published it. */
typedef struct mc_file_info {
    uint64_t addr, length; /* the buffer in the segment */
    uint64_t offset;       /* where it starts in the file */
    unsigned flags;        /* MC_FILE_* it was registered with */
    unsigned direct_align; /* O_DIRECT pieces need offset, length and memory aligned to this;
                              0: the owner never uses O_DIRECT for it */
    char io[16];           /* how the owner does I/O: "io_uring" or "thread" */
    char path[4096];
} mc_file_info_t;

/* Describe the file buffer holding addr in open segment id, or in this engine when id is
 * MC_SEGMENT_INVALID. -ENOENT if addr is in no file buffer there. */
MC_API int mc_file_info(mc_engine_t *engine, mc_segment_id_t id, uint64_t addr,
                        mc_file_info_t *info_p);

/* ---- segments ----------------------------------------------------------------------------- */

/* Peers are opened by name, descriptor blob or compact address; opening one that is open
 * already (same name, or same engine instance for an address) returns the same id, reference
 * counted. Opening our own name or address works: the engine is then a peer of its own. */

/* Open a peer segment by name: looked up in metadata; if metadata is "none" or has no entry
 * and name is "ip:port", the descriptor is fetched from the peer itself by handshake. Blocks
 * up to MC_CONNECT_TIMEOUT_MS (metadata or the peer), so not from a callback (-EDEADLK). A
 * segment of that name that is open already, even still OPENING, is returned at once. */
MC_API int mc_segment_open(mc_engine_t *engine, const char *name, mc_segment_id_t *id_p);

/* Open a peer without blocking, from any thread including callbacks: the id comes at once, the
 * segment is OPENING (mc_segment_state) while its descriptor is fetched in progress (from the
 * metadata cache, or from the peer at "ip:port" over the control link). Work for it may be
 * submitted at once: it waits, and fails with the reason (-MC_EPEERDEAD, -MC_ENOSEGMENT) if
 * the peer does not answer within MC_CONNECT_TIMEOUT_MS. The peer handler hears
 * MC_PEER_CONNECTED when it is ready, MC_PEER_UNREACHABLE if it never is. */
MC_API int mc_segment_open_nb(mc_engine_t *engine, const char *name, mc_segment_id_t *id_p);

/* Open a peer from a descriptor blob produced by its mc_segment_export(). Never blocks. If a
 * segment of that name is open, its view is refreshed from the blob (buffers it registered
 * since become usable) and its id returned; -EEXIST if the open one is another instance of the
 * engine (a restarted process: close the old one first). */
MC_API int mc_segment_open_blob(mc_engine_t *engine, const void *blob, size_t len,
                                mc_segment_id_t *id_p);

/* This engine's compact address: at most MC_ADDRESS_MAX bytes (25 for IPv4) naming its host,
 * its instance and one endpoint, for hosts whose addresses have a size limit (UCX). Call with
 * *len_p = buffer size; on success *len_p is the length. -ENOSPC (with *len_p set) if too
 * small. */
MC_API int mc_engine_address(mc_engine_t *engine, void *buf, size_t *len_p);

/* Open the engine at an address from its mc_engine_address(), as mc_segment_open_nb: at once,
 * from any thread. The peer is the instance the address names: another engine answering at
 * that endpoint makes it fail. -MC_EPROTO for bytes that are not an address. */
MC_API int mc_segment_open_address(mc_engine_t *engine, const void *addr, size_t len,
                                   mc_segment_id_t *id_p);

/* Whether the engine at an address from its mc_engine_address() can be reached from here, without
 * connecting: 1 if it runs on this host (and network namespace), or if its endpoint is a
 * routable address that is not loopback or unspecified (another host's 127.0.0.1 is not this
 * one's); 0 if not; -MC_EPROTO for bytes that are not an address of this engine's kind. */
MC_API int mc_address_reachable(mc_engine_t *engine, const void *addr, size_t len);

typedef enum mc_segment_state {
    MC_SEGMENT_OPENING = 0, /* its descriptor is being fetched; submitted work waits */
    MC_SEGMENT_READY = 1,
    MC_SEGMENT_DEAD = 2, /* its process is gone or it never answered: work for it fails */
} mc_segment_state_t;

/* The state of an open segment (mc_segment_state_t), or -ENOENT. */
MC_API int mc_segment_state(mc_engine_t *engine, mc_segment_id_t id);

/* Peer events, reported once per change from progress (the same context as completion
 * callbacks). CONNECTED: the peer is ready and a link to it is up (again). UNREACHABLE: every
 * path to it failed, or it could not be opened; what was queued to it failed with `error`; new
 * work is tried again. DEAD: its process is known to be gone (it refused connections on every
 * endpoint, closed its same-host channel, or another engine answers at its address): every
 * queued and in-flight task failed with -MC_EPEERDEAD, and so does anything submitted to it
 * later; close it (and open it again by name to reach a new process). */
typedef enum mc_peer_event {
    MC_PEER_CONNECTED = 1,
    MC_PEER_UNREACHABLE = 2,
    MC_PEER_DEAD = 3,
} mc_peer_event_t;

typedef void (*mc_peer_cb)(void *arg, mc_segment_id_t id, mc_peer_event_t event, int error,
                           const char *reason);

/* Set (or clear with NULL) the peer handler. reason is valid during the call only. */
MC_API int mc_peer_handler_set(mc_engine_t *engine, mc_peer_cb cb, void *arg);

/* Drop one reference; the peer's connections close with the last one. Returns -EBUSY while
 * tasks to it are in flight, -ENOENT for an unknown id. */
MC_API int mc_segment_close(mc_engine_t *engine, mc_segment_id_t id);

/* Export the local segment descriptor. Call with *len_p = buffer size; on success *len_p is the
 * blob length. -ENOSPC (with *len_p set to the size needed) if buf is too small. */
MC_API int mc_segment_export(mc_engine_t *engine, void *buf, size_t *len_p);

/* A registered buffer of a peer, as its descriptor lists it. */
typedef struct mc_buffer_info {
    uint64_t addr;
    uint64_t length;
    char location[MC_LOCATION_MAX];
} mc_buffer_info_t;

/* Copy up to max of the buffers an open peer published into out; *count_p gets the total
 * number (which may exceed max). */
MC_API int mc_segment_buffers(mc_engine_t *engine, mc_segment_id_t id, mc_buffer_info_t *out,
                              size_t max, size_t *count_p);

/* Whether a peer runs on this host: same boot id and same network namespace. 1, 0 or <0. */
MC_API int mc_segment_is_local_host(mc_engine_t *engine, mc_segment_id_t id);

/* ---- buffer keys -------------------------------------------------------------------------- */

/* A buffer key: a fixed-size (MC_BUFFER_KEY_SIZE) token that makes one registered buffer of
 * this engine usable by a peer without its descriptor (hosts that carry remote keys of their
 * own, like UCX's packed rkeys). It names this engine's instance, the buffer's range and
 * location, and what the transports need (rdma: the rkeys of each device; -E2BIG when a buffer
 * has more memory regions than fit). A key stays valid until the buffer is unregistered.
 * Pack the key of the buffer holding addr into out (MC_BUFFER_KEY_SIZE bytes); -ENOENT if addr
 * is in no registered buffer. */
MC_API int mc_buffer_key_pack(mc_engine_t *engine, const void *addr, void *out);
/* The key of the registration of [addr, addr+len): where the same memory is registered more
 * than once (a registration cache's older one, not released yet), the one of exactly that
 * range, the newest first, else the newest that holds it. A host that packs the key of its own
 * registration this way hands out a key valid as long as that registration is (the one
 * mc_buffer_key_pack picks by address alone may be of an older registration that goes first:
 * a peer's rdma request with it then fails). -ENOENT if no registered buffer holds the range,
 * -EINVAL if len is 0. */
MC_API int mc_buffer_key_pack_range(mc_engine_t *engine, const void *addr, size_t len, void *out);

/* Make the buffer a key describes usable in the open segment id, whatever its descriptor says
 * (requests inside it are routed at once). Any thread, callbacks too. -MC_ENOSEGMENT if the
 * key is of another engine than id (or id is a segment opened by a name metadata has not
 * resolved yet, whose instance is unknown), -MC_EPROTO if it is not a key. A key of a range
 * the segment lists already replaces that entry when it says something else (the owner
 * registered that memory again: new rdma rkeys). A request into bytes that several keys hold
 * goes with the one added last (given again, a key counts as added last): a host that holds
 * keys of registrations that come and go adds the key of each request before submitting it
 * (the key added last, added again, costs a look under a read lock). A
 * descriptor of the segment that arrives later replaces what keys added (it lists what is
 * registered then). Its owner
 * still checks every request: a key of an unregistered buffer gets requests refused there, not
 * served. */
MC_API int mc_segment_add_buffer(mc_engine_t *engine, mc_segment_id_t id, const void *key,
                                 size_t len);

/* ---- batches and tasks -------------------------------------------------------------------- */

typedef enum mc_opcode { MC_READ = 0, MC_WRITE = 1 } mc_opcode_t;

/* TIMEOUT and CANCELED are final at once, while bytes of the task may still be in flight: until
 * the engine lets go of the task (its completion callback runs; mc_batch_destroy returns 0), a
 * READ's late answer may still land in its local range, and a WRITE's bytes at the target. */
typedef enum mc_task_state {
    MC_TASK_WAITING = 0, /* accepted, nothing sent yet */
    MC_TASK_PENDING,     /* data moving */
    MC_TASK_COMPLETED,
    MC_TASK_FAILED,
    MC_TASK_TIMEOUT,
    MC_TASK_CANCELED,
} mc_task_state_t;

typedef struct mc_task_status {
    mc_task_state_t state;
    uint64_t bytes;     /* bytes transferred and confirmed so far */
    const char *reason; /* why it failed; NULL unless FAILED/TIMEOUT/CANCELED. Owned by the
                           batch, valid until the batch is reset or destroyed. */
    int error;          /* 0, or what ended it otherwise, for hosts that map outcomes:
                           -MC_ETIMEOUT, -MC_ECANCELED, -MC_EPEERDEAD (peer gone or
                           unreachable), -MC_EACCESS (remote range not registered there),
                           -MC_EAUTH, -MC_ENOSEGMENT, -EIO, ... */
} mc_task_status_t;

/* Completion callback: called once per task when it reaches a final state, from progress. */
typedef void (*mc_completion_cb)(void *arg, const mc_task_status_t *status);

typedef struct mc_request {
    mc_opcode_t opcode;
    void *local; /* inside a buffer registered with this engine */
    mc_segment_id_t target;
    uint64_t target_offset; /* absolute address in the target's registered memory */
    uint64_t length;
    mc_completion_cb cb; /* optional */
    void *cb_arg;
} mc_request_t;

/* A notification delivered to `target` after every task of one submit call is remotely
 * complete (and only if all succeeded). */
typedef struct mc_notify_req {
    mc_segment_id_t target;
    const void *msg;
    size_t len; /* <= MC_MSG_MAX */
} mc_notify_req_t;

/* Create a batch that can hold up to max_tasks tasks. Free with mc_batch_destroy() or
 * mc_batch_release(); reuse it with mc_batch_reset(). */
MC_API int mc_batch_create(mc_engine_t *engine, size_t max_tasks, mc_batch_t **batch_p);

/* Destroy a batch. -EBUSY while any of its tasks is still referenced by the engine (poll or
 * progress, then retry); the batch is untouched then. */
MC_API int mc_batch_destroy(mc_batch_t *batch);

/* Make a batch empty again, keeping its memory: indices restart at 0 and the previous tasks'
 * statuses and reasons are gone. -EBUSY (nothing changes) while any of its tasks is still
 * referenced by the engine. Not to be called concurrently with a submit on the same batch. */
MC_API int mc_batch_reset(mc_batch_t *batch);

/* Give a batch back without waiting: every task not final is canceled, and the engine frees the
 * batch once it lets go of the last one (completion callbacks of the batch still run, with
 * CANCELED for those). Never blocks; the batch must not be used any more. */
MC_API void mc_batch_release(mc_batch_t *batch);

/* Submit flags.
 * MC_SUBMIT_ORDERED: overlapping tasks of ORDERED submits to one target take effect there in
 *   the order submitted where their transport keeps order: tcp carries a peer's ORDERED tasks
 *   on one connection, so a WRITE lands before every later task to that target (a READ after it
 *   sees it); a READ does not hold back a later WRITE; a file buffer's I/O completes in any
 *   order. While ORDERED tasks to a target are in flight over tcp, later ORDERED ones to it go
 *   over tcp too where tcp can carry them (host memory), even if another transport would be
 *   preferred, until none is in flight. Other transports do not order tasks in flight (shm
 *   moves them at submit), nor are tasks ordered that wait for the target's descriptor (a
 *   remote range it did not describe yet). */
#define MC_SUBMIT_ORDERED 0x1u

/* Options of one submit call. Zero-filled means the defaults; size makes room for more. */
typedef struct mc_submit_opts {
    size_t size;                   /* sizeof(mc_submit_opts_t) */
    const mc_notify_req_t *notify; /* NULL: no notification */
    unsigned timeout_ms;           /* per task, counted from when its first bytes are sent;
                                      0: MC_TRANSFER_TIMEOUT */
    unsigned flags;                /* MC_SUBMIT_* */
    /* WRITEs: called once per task, from progress, with its request's cb_arg, as soon as the
     * engine no longer reads its local bytes: tcp once they are all in the kernel (before the
     * target confirms them), other transports with the task's end, just before cb. The status
     * is the task's at that moment (PENDING, or final). From then on the host may reuse the
     * local range; a connection that fails afterwards fails the task rather than sending those
     * bytes again. NULL: none. */
    mc_completion_cb on_sent;
} mc_submit_opts_t;

/* Append count requests as tasks (indices continue from the previous submit). All requests are
 * validated first: on error nothing is submitted and nothing will ever complete for them.
 * Errors: -EINVAL (bad opcode, local range not registered, batch full, bad options),
 * -MC_ENOSEGMENT (target not open), -EAGAIN (the notification's target's message window is
 * full, as for mc_msg_send: the notification takes its place in that window at
 * submit, so that it is never refused once the data landed; try again once the target took
 * some). A zero-length request is a no-op that completes at once.
 * Never blocks: a task whose remote range is not inside one buffer of the descriptor we hold
 * (the target may have registered since) waits while progress asks the target for its current
 * one, then moves, or ends FAILED with -MC_EACCESS touching nothing; so does a task to a
 * segment still OPENING. The owner checks every slice again when it arrives (it may have
 * unregistered since). A task to a DEAD segment fails at once with -MC_EPEERDEAD.
 *
 * Timeouts: a task times out timeout_ms after its first bytes went out, so a submit queued
 * behind others is not penalised for waiting; a task that has not started times out only when
 * its peer has completed nothing for timeout_ms either. One doorbell per call. Not to be called
 * concurrently on the same batch. opts may be NULL. */
MC_API int mc_batch_submit_ex(mc_batch_t *batch, const mc_request_t *reqs, size_t count,
                              const mc_submit_opts_t *opts);

/* mc_batch_submit_ex with a notification (notify may be NULL) and the default timeout. */
MC_API int mc_batch_submit(mc_batch_t *batch, const mc_request_t *reqs, size_t count,
                           const mc_notify_req_t *notify);

/* Status of task `index`. Does not block. In caller-progress mode it also drives progress. */
MC_API int mc_task_status(mc_batch_t *batch, size_t index, mc_task_status_t *status_p);

/* Summary of the batch, in constant time: state is COMPLETED when every task completed,
 * FAILED/TIMEOUT/CANCELED when all are final and one is not COMPLETED (the first to end so),
 * PENDING otherwise. */
typedef struct mc_batch_status {
    mc_task_state_t state;
    size_t tasks, completed, failed; /* failed counts FAILED, TIMEOUT and CANCELED */
    uint64_t bytes;
} mc_batch_status_t;

MC_API int mc_batch_status(mc_batch_t *batch, mc_batch_status_t *status_p);

/* Cancel every task that is not final: they become CANCELED at once. Never blocks. Bytes
 * already in flight may still land; the batch is destroyable once the engine let go of it. */
MC_API int mc_batch_cancel(mc_batch_t *batch);

/* Wait until every task is final or timeout_ms passes (-1 = transfer timeout + margin).
 * Drives progress itself in caller-progress mode, without sleeping until 50 us pass without
 * an event, then sleeping on the event fd between passes. Returns 0 or -MC_ETIMEOUT, -EDEADLK
 * from a callback (the tasks end in passes of the engine, which wait for it). Completion
 * callbacks run when the engine lets go of a task, which may be just after it became final:
 * once mc_batch_destroy() returns 0, every callback of the batch has run. */
MC_API int mc_batch_wait(mc_batch_t *batch, int timeout_ms);

/* ---- messages and notifications ----------------------------------------------------------- */

/* Messages and notifications to one peer are delivered exactly once and in the order sent, as
 * long as the peer's process lives: each is acknowledged by the receiver once it is in its
 * handler queue (a receiver with MC_MSG_ACK_AFTER_HANDLER=1: once its handler ran, or, kept,
 * was released, what a UCT flush needs; over rdma still once queued; a peer closed or dead by
 * then completes such a message with 0: it was queued), resent over another connection after a
 * failure, and dropped by the receiver if it sees it twice. At most MC_MSG_WINDOW of them per
 * peer, and MC_MSG_WINDOW_BYTES of their payload (one is always let through), are queued or
 * unacknowledged; past that, sends return -EAGAIN (a receiver that does not keep up slows its
 * senders down, it never drops). If the peer dies, the ones it did not acknowledge fail: their
 * completion callbacks get -MC_EPEERDEAD and the peer event says how many. A peer that stays
 * unreachable (no connection to it succeeds, none is refused either: a host that lost power)
 * while messages wait for it is dead after 10 times MC_IO_TIMEOUT_MS (at least
 * MC_CONNECT_TIMEOUT_MS), as one whose metadata lease expired and that does not answer. */

/* Handler for messages with id 1..255, called from progress with the sender's segment name.
 * data and sender are valid during the call only (a same-host message is read where its sender
 * wrote it, in shared memory). */
typedef void (*mc_msg_cb)(void *arg, const char *sender, uint8_t id, const void *data, size_t len);

/* Set (or clear with cb == NULL) the handler of message id (1..255; 0 is notifications). */
MC_API int mc_msg_handler_set(mc_engine_t *engine, uint8_t id, mc_msg_cb cb, void *arg);

/* From a message handler that hands the message on, to be taken after the handler returned (UCX's
 * module queues it for UCP, which takes it in its own time): with MC_MSG_ACK_AFTER_HANDLER=1,
 * its sender hears of it (its send completes, a flush passes it) only once mc_msg_release is
 * called with the token returned, once, from any thread, before the engine is destroyed.
 * Returns 0 where there is nothing to keep (not in a handler; the setting off; the sender
 * heard already): then nothing is to be released. */
MC_API uint64_t mc_msg_keep(mc_engine_t *engine);
MC_API void mc_msg_release(mc_engine_t *engine, uint64_t token);

/* Completion of a send or a flush, from progress: 0, or why it failed (-MC_EPEERDEAD;
 * -MC_ECANCELED when the segment was closed or the engine destroyed before the receiver's
 * answer came: a message may have arrived all the same). */
typedef void (*mc_done_cb)(void *arg, int status);

/* Options of one send. Zero-filled means none; size makes room for more. */
typedef struct mc_msg_opts {
    size_t size;   /* sizeof(mc_msg_opts_t) */
    mc_done_cb cb; /* optional: the message is in the receiver's queue (0), or never will be */
    void *cb_arg;
} mc_msg_opts_t;

/* Send a message to a peer. The data is copied. -EAGAIN if the peer's window is full (see
 * above: MC_MSG_WINDOW messages, or MC_MSG_WINDOW_BYTES of payload); -EINVAL if len > MC_MSG_MAX;
 * -MC_EPEERDEAD if the peer is dead; -MC_ECANCELED from a callback that runs while the engine is
 * destroyed. opts may be NULL. */
MC_API int mc_msg_send_ex(mc_engine_t *engine, mc_segment_id_t target, uint8_t id, const void *data,
                          size_t len, const mc_msg_opts_t *opts);

/* mc_msg_send_ex without options. */
MC_API int mc_msg_send(mc_engine_t *engine, mc_segment_id_t target, uint8_t id, const void *data,
                       size_t len);

/* Send a notification on its own (a batch's comes with mc_batch_submit): delivered through the
 * peer's mc_notify_pop, exactly once and in order with its other messages. As mc_msg_send. */
MC_API int mc_notify_send(mc_engine_t *engine, mc_segment_id_t target, const void *msg, size_t len);

/* Flush everything issued to a peer before this call: cb(arg, 0) once every task submitted to
 * it is remotely complete (final, with nothing of it in flight any more) and every message sent
 * to it is in its queue, including the notification of every batch submitted before this call
 * with this peer as its target, wherever that batch's data went (it is sent once the batch's
 * tasks end, and the flush waits for that); cb(arg, error) if the peer dies or is closed first. cb
 * runs from progress, never inside this call. -MC_EPEERDEAD if the peer is dead already;
 * -MC_ECANCELED from a callback that runs while the engine is destroyed. */
MC_API int mc_peer_flush(mc_engine_t *engine, mc_segment_id_t target, mc_done_cb cb, void *arg);

typedef struct mc_notify {
    char sender[MC_NAME_MAX];
    size_t len;
    char msg[MC_MSG_MAX];
} mc_notify_t;

/* Pop one received notification. Returns 1 if *out was filled, 0 if none is queued. */
MC_API int mc_notify_pop(mc_engine_t *engine, mc_notify_t *out);

/* ---- keys on the engine's lease ------------------------------------------------------------ */

/* Put key = val (len bytes, copied) in the engine's metadata store (MC_METADATA) under the lease
 * the engine publishes its segment with, for hosts whose entries must live exactly as long as
 * their process: the key vanishes when the process dies (its lease expires) and is put again
 * when the lease is lost and granted anew (a store that restarted empty, an outage longer than
 * the lease). Publishing a key again replaces its value. Keys are full keys (see mc_meta_key in
 * meta.h). Blocks for one round trip to the store, so not from a callback (-EDEADLK). -ENOTSUP
 * with METADATA=none; the store's error if the put fails: a key the store refuses for good
 * (-ENAMETOOLONG, -EMSGSIZE: too long, too large) is not kept (one published before keeps its
 * previous value); after any other error (unreachable, busy) it is kept and put again once the
 * store answers (unpublish it to give up). */
MC_API int mc_engine_publish(mc_engine_t *engine, const char *key, const void *val, size_t len);

/* Delete a key this engine published and stop putting it again. -ENOENT if it did not publish
 * it; -EDEADLK from a callback; the store's error if the delete failed (unreachable): the
 * engine deletes it again until the store takes it (calling this again tries at once). */
MC_API int mc_engine_unpublish(mc_engine_t *engine, const char *key);

/* ---- statistics --------------------------------------------------------------------------- */

typedef struct mc_counters {
    uint64_t bytes_read;    /* initiated READ bytes completed */
    uint64_t bytes_written; /* initiated WRITE bytes completed */
    uint64_t bytes_served;  /* bytes moved on behalf of peers (as target) */
    uint64_t requests;      /* slices completed as initiator */
    uint64_t errors;        /* slice or connection failures */
    uint64_t retries;       /* slices resubmitted after a failure */
    uint64_t msgs_sent;     /* messages and notifications in the receiver's queue */
    uint64_t msgs_received; /* messages and notifications taken into our queue */
} mc_counters_t;

/* One path to a peer (for tcp: local interface address -> peer endpoint). */
typedef struct mc_rail_stats {
    char name[264]; /* "10.201.1.1->10.201.1.2:4000" ("*" = default route) */
    int state;      /* 0 active, 1 paused after repeated failures */
    unsigned conns; /* open connections (rdma rails: connected QPs) */
    uint64_t bytes, slices, errors;
    uint64_t rate; /* recent throughput, bytes/s (moving average) */
    double weight; /* this rail's share of the peer's recent throughput, 0..1 */
} mc_rail_stats_t;

/* Per-rail counters of an open peer: up to max into out; *count_p gets the number of rails. */
MC_API int mc_stats_rails(mc_engine_t *engine, mc_segment_id_t id, mc_rail_stats_t *out, size_t max,
                          size_t *count_p);

/* Counters of one transport ("tcp", ...) summed over peers. -ENOENT if unknown. */
MC_API int mc_stats_transport(mc_engine_t *engine, const char *transport, mc_counters_t *out);

/* Counters of traffic with one peer. */
MC_API int mc_stats_peer(mc_engine_t *engine, mc_segment_id_t id, mc_counters_t *out);

#ifdef __cplusplus
}
#endif
#endif

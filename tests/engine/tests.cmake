mc_unit_test(test_crypto SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_crypto.c)
mc_unit_test(test_meta_file SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_meta_file.c)
# The tcp wire codec's limits on what a peer's header may announce.
mc_unit_test(test_tcp_proto SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tcp_proto.c)
# The rdma QP info codec (what a QP's end tells the other, READs it takes as target included).
mc_unit_test(test_rdma_proto SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rdma_proto.c)
# Descriptors: the parts of buffers replaced by newer keys are packed away (engine/descriptor.c).
mc_unit_test(test_desc SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_desc.c)
# Whether registered memory is read-only: PROCMAP_QUERY and the maps file's text (sys/maps.h).
mc_unit_test(test_maps SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_maps.c)
# The message rings' records (engine/msg_ring.h): wrapped ones delivered, corrupt ones refused.
mc_unit_test(test_msg_ring SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_msg_ring.c)
# The epoll watch a spinning host asks instead of epoll_wait (engine/sys/epwatch.h).
mc_unit_test(test_epwatch SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_epwatch.c)
# Helper threads that run the pieces of a job next to its caller (engine/util/crew.h).
mc_unit_test(test_crew SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_crew.c)
mc_unit_test(test_lock SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_lock.c)
mc_unit_test(test_shm_wake SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shm_wake.c)
# An unregister waits for same-host peers' CMA calls on its memory, not for a dead one's.
mc_unit_test(test_shm_regtab SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shm_regtab.c)
# The receiver's memory of message streams: past its limit it forgets the older half only.
mc_unit_test(test_msg_streams SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_msg_streams.c)
# Integration suites: real engines in child processes on loopback (harness.c).
mc_unit_test(test_conformance SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_conformance.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS integration)
set_property(TEST test_conformance APPEND PROPERTY ENVIRONMENT "TH_TRANSPORT=tcp,tcp-engine-memory,shm,shm-cma")
# The same suite over rdma on the software RDMA device (two per side), in its own fabric.
if(TARGET softverbs)
  add_test(NAME test_conformance_rdma COMMAND test_conformance)
  set_tests_properties(test_conformance_rdma PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 400
    LABELS "integration;rdma" ENVIRONMENT
    "TH_TRANSPORT=rdma,rdma-engine-memory;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=conformance;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-conformance")
  # Devices whose largest memory region is 1 MiB: buffers are registered in pieces and slices
  # that straddle two pieces become two or three work requests, even with a window of one.
  add_test(NAME test_conformance_rdma_split COMMAND test_conformance)
  set_tests_properties(test_conformance_rdma_split PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
    LABELS "integration;rdma" ENVIRONMENT
    "TH_TRANSPORT=rdma;TH_CASE=sizes;SOFTVERBS_MAX_MR_SIZE=1048576;MC_RDMA_QP_DEPTH=1;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=conformance-split;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-split")
endif()
mc_script_test(test_netns_transfer COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_netns_transfer.sh
  TIMEOUT 180 LABELS netns)
# Messages across two namespaces over a link that drops (tc tbf) while connections are killed.
mc_script_test(test_netns_messages COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_netns_messages.sh
  TIMEOUT 180 LABELS netns)
mc_unit_test(test_engine_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_engine_api.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS integration)
# What hosts embedding the engine rely on (reusable batches, timeouts, progress control, opens
# that do not block, a flooded target).
mc_unit_test(test_host_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_host_api.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS integration)
# ... its rdma cases (messages answered once their handlers ran) on the software device.
if(TARGET softverbs)
  add_test(NAME test_host_api_rdma COMMAND test_host_api)
  set_tests_properties(test_host_api_rdma PROPERTIES TIMEOUT 300 LABELS "integration;softverbs"
    ENVIRONMENT "TH_FILTER=*_rdma;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=test_host_api;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-test_host_api")
endif()
# Completions of sends and flushes when every malloc fails (malloc wrapped at link time).
mc_unit_test(test_oom_callbacks SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_oom_callbacks.c
             LIBS -Wl,--wrap=malloc LABELS integration)
# Messages and notifications: exactly once across killed connections and stalls, a dead peer,
# flush, back-pressure; over tcp, and over the shared-memory ring between same-host peers.
mc_unit_test(test_messages SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_messages.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 600 LABELS integration)
add_test(NAME test_messages_shm COMMAND test_messages)
set_tests_properties(test_messages_shm PROPERTIES TIMEOUT 600 LABELS integration
  ENVIRONMENT "TH_TRANSPORT=shm")
# ... and over rdma on the software device, whose first port also goes down and drops packets.
if(TARGET softverbs)
  add_test(NAME test_messages_rdma COMMAND test_messages)
  set_tests_properties(test_messages_rdma PROPERTIES TIMEOUT 600 LABELS "integration;softverbs"
    ENVIRONMENT "TH_TRANSPORT=rdma;TH_MESSAGES=200000;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=test_messages;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-test_messages")
endif()
# The same-host ring and tcp with every engine answering a message once its handler ran
# (MC_MSG_ACK_AFTER_HANDLER, as the UCX module's; test_host_api checks the wait itself): tcp
# then answers MSG_ACK_LATER and MSG_DONE, and its connections are killed meanwhile.
add_test(NAME test_messages_shm_ack_after COMMAND test_messages)
set_tests_properties(test_messages_shm_ack_after PROPERTIES TIMEOUT 600 LABELS integration
  ENVIRONMENT "TH_TRANSPORT=shm;MC_MSG_ACK_AFTER_HANDLER=1")
add_test(NAME test_messages_tcp_ack_after COMMAND test_messages)
set_tests_properties(test_messages_tcp_ack_after PROPERTIES TIMEOUT 600 LABELS integration
  ENVIRONMENT "TH_MESSAGES=300000;MC_MSG_ACK_AFTER_HANDLER=1")
if(TARGET softverbs)
  add_test(NAME test_messages_rdma_ack_after COMMAND test_messages)
  set_tests_properties(test_messages_rdma_ack_after PROPERTIES TIMEOUT 600
    LABELS "integration;softverbs" ENVIRONMENT
    "TH_TRANSPORT=rdma;TH_MESSAGES=100000;MC_MSG_ACK_AFTER_HANDLER=1;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=test_messages_ack;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-test_messages_ack")
endif()
mc_unit_test(test_faults SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_faults.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS integration)
# A WRITE held in the network by a partition longer than the timeouts does not land over a
# newer one when it heals (a proxy in the test holds it; tcp's retired connections).
mc_unit_test(test_tcp_retire SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tcp_retire.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 120 LABELS integration)
mc_script_test(test_multirail COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_multirail.sh
  TIMEOUT 240 LABELS netns)
mc_unit_test(test_shm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shm.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS integration)
# rdma beyond conformance (striping, port down/up, refused keys and ranges, dead peer) on the
# software RDMA device, two per side, in its own fabric; the test sets its own control dirs.
if(TARGET softverbs)
  mc_unit_test(test_rdma SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rdma.c
               ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS "integration;rdma")
  set_property(TEST test_rdma APPEND PROPERTY ENVIRONMENT
    "LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=test_rdma;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-test_rdma")
endif()
# VRAM over rdma (GPUDirect or staged): needs a CUDA device, skipped (77) without one.
if(TARGET softverbs)
  mc_unit_test(test_rdma_vram SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_rdma_vram.c
               ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS "integration;rdma;gpu")
  target_compile_definitions(test_rdma_vram PRIVATE MC_HAVE_CUDA=${MC_HAVE_CUDA})
  if(MC_HAVE_CUDA)
    target_link_libraries(test_rdma_vram PRIVATE CUDA::cudart)
  endif()
  set_property(TEST test_rdma_vram APPEND PROPERTY ENVIRONMENT
    "LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=vram;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-vram")
endif()
# Transport choice and rdma settings (matrix, link layers, RoCE GID/MTU, bad port/GID, forced
# tcp) through mooncake-bench on the software device.
if(TARGET softverbs)
  mc_script_test(test_rdma_select COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/test_rdma_select.sh
    TIMEOUT 300 LABELS "integration;rdma")
endif()
# Static checks: the core names no transport (transports plug in through transport.h), and
# README's configuration table lists every setting with its default.
find_program(MC_PYTHON3 python3 REQUIRED)
mc_script_test(check_transport_seam COMMAND ${MC_PYTHON3}
  ${CMAKE_CURRENT_LIST_DIR}/check_transport_seam.py ${PROJECT_SOURCE_DIR}/engine TIMEOUT 30
  LABELS static)
mc_script_test(check_readme_settings COMMAND ${CMAKE_CURRENT_LIST_DIR}/check_readme_settings.sh
  TIMEOUT 30 LABELS static)

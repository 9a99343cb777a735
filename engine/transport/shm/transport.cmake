# shm: same-host peers, through mappings of engine memory or CMA, in the submitting thread.
list(APPEND MC_TRANSPORT_SOURCES
  transport/shm/shm.c
  transport/shm/shm_cma.c
  transport/shm/shm_desc.c
  transport/shm/shm_msg.c
  transport/shm/shm_regtab.c
  transport/shm/shm_wake.c)

# file: files and block devices as buffers of the segment, through io_uring (or pread/pwrite
# threads where it is missing). liburing is linked statically (its .a is PIC in Debian), so the
# library needs nothing more at load time and finds out at run time whether io_uring works.
list(APPEND MC_TRANSPORT_SOURCES
  transport/file/file.c
  transport/file/file_api.c
  transport/file/file_copy.c
  transport/file/file_desc.c
  transport/file/file_io.c
  transport/file/file_op.c
  transport/file/file_pool.c)
find_path(MC_URING_INCLUDE liburing.h REQUIRED)
find_library(MC_URING_LIB NAMES liburing.a uring REQUIRED)
list(APPEND MC_TRANSPORT_LIBS ${MC_URING_LIB})

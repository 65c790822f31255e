# A ctest check that test-only fault injection stays out of the shipped
# server: reads the printable strings of BINARY (as `strings` does) for the
# marks the corrupting transport and its setting leave (class name, memfd
# name, setting name or flag). EXPECT=none: tce-server must show none of them.
# EXPECT=all: tce-server-faulty must show every one, which proves the check
# can see them.
#   cmake -DBINARY=path -DEXPECT=none|all -P check_fault_strings.cmake
set(marks CorruptingTransport tce-corrupt ring_fault)
file(STRINGS "${BINARY}" lines REGEX "CorruptingTransport|tce-corrupt|ring-fault|ring_fault")
string(JOIN "\n" text ${lines})
if(EXPECT STREQUAL "none" AND lines)
  list(GET lines 0 first)
  message(FATAL_ERROR "${BINARY} holds test-only fault code: '${first}' is among its strings")
endif()
foreach(mark IN LISTS marks)
  string(FIND "${text}" "${mark}" at)
  if(EXPECT STREQUAL "all" AND at EQUAL -1)
    message(FATAL_ERROR "${BINARY} lacks '${mark}': the check cannot see the fault code it looks for")
  endif()
endforeach()
message(STATUS "${BINARY}: fault marks ${EXPECT}, as expected")
